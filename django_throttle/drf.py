"""Django REST framework adapter: the only module that imports ``rest_framework``.

Use ``django_throttle.drf.PolicyThrottle`` in ``DEFAULT_THROTTLE_CLASSES`` or a view's
``throttle_classes``; a view's ``throttle_scope`` selects endpoint rules of type "scope".
``ApiKeyAuthentication`` lets an API key authenticate too (throttling by key works without it).
"""

from __future__ import annotations

import logging
import sys
from functools import partial
from typing import Any

from django.utils.functional import SimpleLazyObject
from rest_framework.exceptions import APIException, Throttled
from rest_framework.request import Request

from django_throttle import core
from django_throttle.headers import retry_after_seconds, throttled_body, throttled_status
from django_throttle.identity import verified_api_key
from django_throttle.rates import Decision

__all__ = [
    "ApiKeyAuthentication",
    "AsyncPolicyThrottle",
    "LimiterUnavailable",
    "PolicyThrottle",
    "PolicyThrottled",
]

logger = logging.getLogger("django_throttle")


class PolicyThrottled(Throttled):
    """429 whose body names the limit; DRF adds ``Retry-After`` from ``wait``."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(wait=retry_after_seconds(decision.retry_after))
        self.detail = throttled_body(decision)


class LimiterUnavailable(APIException):
    """503 (``DJANGO_THROTTLE_FAILURE_STATUS``) when the failure mode is closed and the backend
    could not answer, or when the client cannot be identified: not the client's fault, so not
    a 429. DRF's exception handler adds ``Retry-After`` from ``wait``."""

    status_code = 503
    default_code = "limiter_unavailable"

    def __init__(self, decision: Decision) -> None:
        super().__init__()
        self.status_code = throttled_status(decision)
        self.wait = None if decision.unidentified else retry_after_seconds(decision.retry_after)
        self.detail = throttled_body(decision)


class PolicyThrottle:
    """Apply the admin-managed policy (tier limits + endpoint rules) to a DRF view.

    View attributes it reads: ``throttle_scope`` (selects endpoint rules of type "scope"),
    ``throttle_failure_mode`` ("open", "closed" or "local": beats the admin's and the
    setting's) and ``throttle_credential`` (a login/token view: fails closed unless a mode
    is set; DRF's ``ObtainAuthToken`` counts as one).

    It implements DRF's throttle interface (``allow_request`` and ``wait``) without subclassing
    ``rest_framework.throttling.BaseThrottle``: importing that module reads DRF's settings at
    class definition (DRF #6030), and this module must import before settings are configured.

    A denial raises :class:`PolicyThrottled` directly so the 429 body can name the limit;
    :meth:`wait` still returns the seconds to wait, as DRF's throttles do. The decision is left
    on the Django request for :class:`~django_throttle.middleware.RateLimitHeadersMiddleware`.
    """

    decision: Decision | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        http_request = _django_request(request)
        decision = core.check(
            http_request,
            scope=getattr(view, "throttle_scope", None),
            failure_mode=_failure_mode(view),
            credential=_is_credential_view(view),
        )
        return self._decided(http_request, decision)

    def _decided(self, http_request: Any, decision: Decision) -> bool:
        self.decision = decision
        http_request.throttle_decision = decision
        if decision.allowed:
            return True
        if decision.unavailable:
            raise LimiterUnavailable(decision)
        raise PolicyThrottled(decision)

    def wait(self) -> float | None:
        if self.decision is None or self.decision.allowed:
            return None
        return self.decision.retry_after


class AsyncPolicyThrottle(PolicyThrottle):
    """:class:`PolicyThrottle` with ``async def allow_request``, for async DRF views (adrf's
    ``APIView`` awaits such throttles): the decision is awaited on the event loop through
    ``redis.asyncio``, like the ``@throttle`` decorator on an ``async def`` view."""

    async def allow_request(self, request: Request, view: Any) -> bool:  # type: ignore[override]
        http_request = _django_request(request)
        decision = await core.acheck(
            http_request,
            scope=getattr(view, "throttle_scope", None),
            failure_mode=_failure_mode(view),
            credential=_is_credential_view(view),
        )
        return self._decided(http_request, decision)


class ApiKeyAuthentication:
    """DRF authentication by API key (``Authorization: Api-Key <key>`` or ``X-API-Key``).

    A valid key sets ``request.user`` to its owner (loaded from the database only when the
    view reads it) or ``AnonymousUser`` when it has none, and ``request.auth`` to the key as
    the policy snapshot holds it (:class:`~django_throttle.snapshot.ApiKeyPolicy`). A missing,
    unknown, wrong, revoked or expired key authenticates no one (``None``: the next class
    tries, else the request is anonymous) rather than a 401, so such requests are throttled
    under their IP like any anonymous client; permission classes decide what they may do.

    Like :class:`PolicyThrottle`, it implements DRF's interface without subclassing
    ``BaseAuthentication``.
    """

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        from django.contrib.auth.models import AnonymousUser

        api_key = verified_api_key(request._request)
        if api_key is None:
            return None
        if api_key.owner_id is None:
            return AnonymousUser(), api_key
        return SimpleLazyObject(partial(_owner, api_key.owner_id)), api_key

    def authenticate_header(self, request: Request) -> str:
        return "Api-Key"


def _owner(pk: Any) -> Any:
    """The key's owner, or ``AnonymousUser`` when they were deleted or deactivated."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import AnonymousUser

    user = get_user_model()._default_manager.filter(pk=pk).first()
    if user is None or not getattr(user, "is_active", True):
        return AnonymousUser()
    return user


def _django_request(request: Request) -> Any:
    """DRF has authenticated by now; copy the user onto the Django request, which is read
    directly to skip DRF's attribute proxy on every lookup."""
    http_request = request._request
    if getattr(http_request, "user", None) is not request.user:
        http_request.user = request.user
    return http_request


def _failure_mode(view: Any) -> str | None:
    """The view's ``throttle_failure_mode``; an unknown value is logged (once per view class)
    and ignored, so the admin's or the setting's mode applies instead of a guess."""
    mode = getattr(view, "throttle_failure_mode", None)
    if mode is None or mode in core.FAILURE_MODES:
        return mode
    name = f"{type(view).__module__}.{type(view).__qualname__}"
    if name not in _warned:
        _warned.add(name)
        logger.error(
            "%s.throttle_failure_mode = %r is not one of %s; ignoring it.",
            name,
            mode,
            ", ".join(core.FAILURE_MODES),
        )
    return None


_warned: set[str] = set()


def _is_credential_view(view: Any) -> bool:
    """A login or token view fails closed unless told otherwise: ``throttle_credential`` on
    the view, else whether it is DRF's ``ObtainAuthToken`` (looked up only when that module
    was imported, so this adapter never imports the authtoken app itself)."""
    flag = getattr(view, "throttle_credential", None)
    if flag is not None:
        return bool(flag)
    authtoken = sys.modules.get("rest_framework.authtoken.views")
    return authtoken is not None and isinstance(view, authtoken.ObtainAuthToken)
