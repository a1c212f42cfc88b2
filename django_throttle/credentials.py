"""Credential protection for plain Django views: ``@protect_credentials`` checks a login or
token request against the endpoint rules of a scope *before* the view checks the password, and
gives the tokens back unless the attempt failed.

Also the two request facts the counting policy needs: the username a credential request
presents (a limit counted by username keys on it) and whether Django's ``user_login_failed``
signal fired for the request (``LoginView`` answers a wrong password with a 200 re-render, so
the status alone does not tell a failure).

Only the rule's own limits are counted here, never the tier's: the view's own throttle (if
any) counts those. A refused attempt gets 429 before the view runs, so the password hasher
never runs for it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar, overload

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

__all__ = [
    "login_failed",
    "presented_username",
    "protect_credentials",
    "watch_login_failures",
]

View = TypeVar("View", bound=Callable[..., Any])

#: Longest username kept: a longer one is cut (its counter is shared by whatever starts alike).
MAX_USERNAME = 256
#: Largest JSON body read for a username; a bigger one is not a login.
MAX_JSON_BODY = 64 * 1024
#: Set on the (Django) request when ``user_login_failed`` fires for it.
FAILED_ATTRIBUTE = "throttle_login_failed"

_watching = False


def watch_login_failures() -> None:
    """Connect the ``user_login_failed`` receiver (once per process). Called on first need
    rather than in ``AppConfig.ready()``, so a site that counts no failures pays nothing."""
    global _watching
    if _watching:
        return
    from django.contrib.auth.signals import user_login_failed

    user_login_failed.connect(_login_failed, dispatch_uid="django_throttle.login_failed")
    _watching = True


def _login_failed(sender: Any, credentials: Any = None, request: Any = None, **kwargs: Any) -> None:
    if request is None:
        return
    # DRF's serializers pass DRF's Request; the flag belongs on the Django request.
    target = getattr(request, "_request", request)
    with contextlib.suppress(AttributeError):  # a request object that takes no attributes
        setattr(target, FAILED_ATTRIBUTE, True)


def login_failed(request: Any) -> bool:
    """Whether ``user_login_failed`` fired for ``request`` (once watching started)."""
    return bool(getattr(request, FAILED_ATTRIBUTE, False))


def presented_username(request: Any) -> str | None:
    """The username a credential request presents, normalised (stripped, case-folded, at
    most :data:`MAX_USERNAME` characters), or ``None`` when it presents none.

    Looked for in the user part of ``Authorization: Basic``, then the POST form field named
    by the user model's ``USERNAME_FIELD``, then ``username`` and ``email``; the same fields
    of a JSON body when the request is JSON. Never raises: a garbled header or body just
    presents no username.
    """
    name = _basic_username(request.META.get("HTTP_AUTHORIZATION"))
    if name is None and request.method == "POST":
        name = _posted_username(request)
    if name is None:
        return None
    name = name.strip().casefold()[:MAX_USERNAME]
    return name or None


def _basic_username(header: Any) -> str | None:
    if not isinstance(header, str):
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    return decoded.partition(":")[0]


def _field_names() -> tuple[str, ...]:
    from django.contrib.auth import get_user_model

    field = getattr(get_user_model(), "USERNAME_FIELD", "username")
    return tuple(dict.fromkeys((field, "username", "email")))


def _posted_username(request: Any) -> str | None:
    content_type = request.META.get("CONTENT_TYPE", "")
    try:
        if content_type.startswith("application/json"):
            length = int(request.META.get("CONTENT_LENGTH") or 0)
            if not 0 < length <= MAX_JSON_BODY:
                return None
            data = json.loads(request.body)
        else:
            data = request.POST
    except Exception:  # unreadable body, bad JSON, body already read by a parser: none
        return None
    if not hasattr(data, "get"):
        return None
    for field in _field_names():
        value = data.get(field)
        if isinstance(value, str) and value.strip():
            return value
    return None


@overload
def protect_credentials(view: View, *, scope: str = "login") -> View: ...
@overload
def protect_credentials(view: None = None, *, scope: str = "login") -> Callable[[View], View]: ...
def protect_credentials(view: Any = None, *, scope: str = "login") -> Any:
    """Check POST requests to a login or token view against the endpoint rules of ``scope``
    before the view runs (429 with ``Retry-After`` when a limit is reached: the password is
    never checked), and settle after it: an attempt that failed (the view answered 4xx, or
    ``user_login_failed`` fired) keeps its tokens under a rule counting failures; any other
    gives them back. Other methods (the GET that shows the form) pass unchecked.

    Works on function views, ``LoginView.as_view()``, the admin's login and DRF's
    ``obtain_auth_token``, sync or async. Fails closed when the backend cannot answer,
    unless the rule or tier names another failure mode.
    """
    if view is None:
        return functools.partial(protect_credentials, scope=scope)
    from django_throttle import core
    from django_throttle.headers import throttled_response

    options: dict[str, Any] = {"scope": scope, "credential": True, "rule_only": True}
    watch = watch_login_failures

    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def async_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            if request.method != "POST":
                return await view(request, *args, **kwargs)
            watch()
            first = len(getattr(request, "throttle_reservations", ()))
            decision = await core.acheck(request, **options)
            if not decision.allowed:
                return throttled_response(decision, request)
            status = 500
            try:
                response = await view(request, *args, **kwargs)
                status = response.status_code
                return response
            finally:
                await core.asettle(request, status, first=first)

        async_wrapper.throttle_credential_scope = scope  # type: ignore[attr-defined]
        return markcoroutinefunction(async_wrapper)

    @functools.wraps(view)
    def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
        if request.method != "POST":
            return view(request, *args, **kwargs)
        watch()
        first = len(getattr(request, "throttle_reservations", ()))
        decision = core.check(request, **options)
        if not decision.allowed:
            return throttled_response(decision, request)
        status = 500
        try:
            response = view(request, *args, **kwargs)
            status = response.status_code
            return response
        finally:
            core.settle(request, status, first=first)

    # The operator tools (throttle_explain) read it to know the check this view makes.
    wrapper.throttle_credential_scope = scope  # type: ignore[attr-defined]
    return wrapper
