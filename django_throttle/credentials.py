"""Credential protection for plain Django views: ``@protect_credentials`` checks a login or
token request against the endpoint rules of a scope *before* the view checks the password, and
gives the tokens back unless the attempt failed.

Also, for plain views and DRF alike, the username a credential request presents (read in
:mod:`~django_throttle.request.usernames`; a limit counted by username keys on it) and whether
Django's ``user_login_failed`` signal fired for the request (kept by
:mod:`~django_throttle.request.core`: ``LoginView`` answers a wrong password with a 200
re-render, so the status alone does not tell a failure).

Only the rule's own limits are counted here, never the tier's: the view's own throttle (if
any) counts those. A refused attempt gets 429 before the view runs, so the password hasher
never runs for it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, overload

from django_throttle.decorators import guard

__all__ = ["protect_credentials"]

View = TypeVar("View", bound=Callable[..., Any])


@overload
def protect_credentials(
    view: View, *, scope: str = "login", username_field: str | None = None
) -> View: ...
@overload
def protect_credentials(
    view: None = None, *, scope: str = "login", username_field: str | None = None
) -> Callable[[View], View]: ...
def protect_credentials(
    view: Any = None, *, scope: str = "login", username_field: str | None = None
) -> Any:
    """Check requests to a login or token view that may present credentials (any method but
    GET, HEAD, OPTIONS and TRACE, and those with a body or an ``Authorization`` header)
    against the endpoint rules of ``scope`` before the view runs (429 with ``Retry-After``
    when a limit is reached: the password is never checked), and settle after it: an
    attempt that failed (the view answered 4xx, or ``user_login_failed`` fired) keeps its
    tokens under a rule counting failures; any other gives them back
    (``user_login_failed`` counts even when the view calls ``authenticate()`` without the
    request). The GET that shows the form passes unchecked.

    Works on function views, ``LoginView.as_view()``, the admin's login and DRF's
    ``obtain_auth_token``, sync or async. When the backend cannot answer, the attempt is
    counted in the process (``local``) unless the rule, the tier or the setting says
    ``closed``.

    A view that signs the user in (``django.contrib.auth.login``: ``LoginView``, the
    admin's login) also gives the browser a device cookie, which keeps it an allowance of
    its own while its username is under attack (:mod:`~django_throttle.request.usernames`).

    A limit counted by username reads the user model's ``USERNAME_FIELD``, ``username`` and
    ``email`` from the body; ``username_field`` names the view's own field when it is none of
    those (django-allauth's ``login``, say). A failed attempt whose username the check could
    not read is logged (``django_throttle``, once per path).
    """
    if username_field is not None and (not isinstance(username_field, str) or not username_field):
        raise TypeError(
            f"protect_credentials(username_field={username_field!r}): give the name of the "
            "form or JSON field the view reads the username from"
        )
    if view is None:
        return functools.partial(protect_credentials, scope=scope, username_field=username_field)
    options: dict[str, Any] = {"scope": scope, "credential": True, "rule_only": True}
    if _is_admin_login(view):
        # The operators' way in is never refused for an outage: a 'closed' rule, tier or
        # setting would lock them out of the admin while Redis is down. Counted in the
        # process instead, so password guessing stays limited.
        options["failure_mode"] = "local"
    fields = () if username_field is None else (username_field,)
    wrapper = guard(view, options, login=True, username_fields=fields)
    # The operator tools (throttle_explain) read them to know the check this view makes.
    wrapper.throttle_credential_scope = scope
    wrapper.throttle_credential_failure_mode = options.get("failure_mode")
    initkwargs = getattr(view, "initkwargs", None)
    if isinstance(initkwargs, dict) and isinstance(getattr(view, "cls", None), type):
        # A DRF view (obtain_auth_token): schema generators build an instance from the
        # callback's ``cls(**initkwargs)``, so a copy naming the scope tells the OpenAPI schema
        # (django_throttle.openapi) that this route answers 429. Requests still run the
        # wrapped view with its own initkwargs.
        wrapper.initkwargs = {**initkwargs, "throttle_credential_scope": scope}
    return wrapper


def _is_admin_login(view: Any) -> bool:
    """Whether ``view`` is an admin site's ``login`` (``admin.site.login``, bound)."""
    site = getattr(view, "__self__", None)
    if site is None or getattr(view, "__name__", None) != "login":
        return False
    try:
        from django.contrib.admin.sites import AdminSite
    except Exception:  # the admin not importable: no admin login to guard
        return False
    return isinstance(site, AdminSite)
