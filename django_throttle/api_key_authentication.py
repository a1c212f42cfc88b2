"""DRF authentication by API key: :class:`ApiKeyAuthentication`, imported as
``django_throttle.drf.ApiKeyAuthentication``.

It implements DRF's interface without subclassing ``BaseAuthentication`` and reads the
request only through the attributes DRF's ``Request`` proxies (``META``), so it imports no
``rest_framework`` (that stays in :mod:`django_throttle.drf`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.utils.functional import SimpleLazyObject

from django_throttle.policy.live import verified_api_key


class ApiKeyAuthentication:
    """DRF authentication by API key (``Authorization: Api-Key <key>`` or ``X-API-Key``).

    **A valid key logs in as its owner**, with every permission the owner has: ``request.user``
    is the owner (loaded from the database only when the view reads it; ``AnonymousUser`` when
    the key has none, or the owner was deleted or deactivated) and ``request.auth`` the key as
    the policy snapshot holds it (:class:`~django_throttle.policy.live.ApiKeyPolicy`). So a key
    owned by a staff user or a superuser is a staff or superuser login for whoever holds the
    key: give keys owners with only the permissions their holders need, or none
    (``manage.py check --database default`` warns about such keys, W020).

    The choice is :attr:`acts_as_owner`. A subclass that sets it to ``False`` lets a key select
    its tier and bucket and be read as ``request.auth``, while ``request.user`` stays
    ``AnonymousUser`` whoever owns the key; permission classes then decide on ``request.auth``.

    A missing, unknown, wrong, revoked or expired key authenticates no one (``None``: the next
    class tries, else the request is anonymous) rather than a 401, so such requests are
    throttled under their IP like any anonymous client; permission classes decide what they
    may do.

    Like :class:`~django_throttle.drf.PolicyThrottle`, it implements DRF's interface without
    subclassing ``BaseAuthentication``.
    """

    #: Whether a key logs in as its owner (``request.user``), with all the owner's permissions.
    acts_as_owner: bool = True

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        from django.contrib.auth.models import AnonymousUser

        api_key = verified_api_key(request)  # reads ``request.META``, which DRF proxies
        if api_key is None:
            return None
        if api_key.owner_id is None or not self.acts_as_owner:
            return AnonymousUser(), api_key
        return SimpleLazyObject(partial(_owner, api_key.owner_id)), api_key

    def authenticate_header(self, request: Any) -> str:
        return "Api-Key"


def _owner(pk: Any) -> Any:
    """The key's owner, or ``AnonymousUser`` when they were deleted or deactivated."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import AnonymousUser

    user = get_user_model()._default_manager.filter(pk=pk).first()
    if user is None or not getattr(user, "is_active", True):
        return AnonymousUser()
    return user
