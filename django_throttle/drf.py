"""Django REST framework adapter: the only module that imports ``rest_framework``.

Use ``django_throttle.drf.PolicyThrottle`` in ``DEFAULT_THROTTLE_CLASSES`` or a view's
``throttle_classes``; a view's ``throttle_scope`` selects endpoint rules of type "scope".
``ApiKeyAuthentication`` lets an API key authenticate too (throttling by key works without it).
``ProtectedBasicAuthentication``, ``ProtectedTokenAuthentication``,
``ProtectedSessionAuthentication`` (or ``protect_authentication(AnyClass)``) count credential
attempts before the password or token is checked.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

try:
    import rest_framework  # noqa: F401  (without DRF: one line naming the install)
except ModuleNotFoundError as exc:
    if exc.name != "rest_framework":
        raise
    raise ModuleNotFoundError(
        "django_throttle.drf is imported, but Django REST framework is not installed: "
        "pip install 'django-throttle-policies[drf]' (or djangorestframework), or use "
        "@throttle from django_throttle.decorators on plain Django views.",
        name="rest_framework",
    ) from None

from rest_framework.authentication import (
    BasicAuthentication,
    SessionAuthentication,
    TokenAuthentication,
)
from rest_framework.exceptions import APIException, Throttled
from rest_framework.request import Request

from django_throttle.api_key_authentication import ApiKeyAuthentication
from django_throttle.conf import app_settings, require_installed
from django_throttle.exemptions import is_exempt_view
from django_throttle.policy import live
from django_throttle.policy.live import Policy
from django_throttle.rates import Decision
from django_throttle.request import core, leases
from django_throttle.request.core import (
    CheckOptions,
    retry_after_seconds,
    throttled_body,
    throttled_response,
    throttled_status,
)
from django_throttle.request.usernames import HEADER_ONLY, authorization

require_installed("django_throttle.drf")

#: Where a request keeps the reservations :func:`~django_throttle.request.core.settle` gives
#: back (a rule counting only successes or failures).
RESERVATIONS = "throttle_reservations"

__all__ = [
    "ApiKeyAuthentication",
    "AsyncPolicyThrottle",
    "LimiterUnavailable",
    "PolicyThrottle",
    "PolicyThrottled",
    "ProtectedBasicAuthentication",
    "ProtectedSessionAuthentication",
    "ProtectedTokenAuthentication",
    "exception_handler",
    "protect_authentication",
]

logger = logging.getLogger("django_throttle")


class PolicyThrottled(Throttled):
    """429 whose body names the limit; DRF adds ``Retry-After`` from ``wait``."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(wait=retry_after_seconds(decision.retry_after))
        self.detail = throttled_body(decision)
        self.decision = decision


class LimiterUnavailable(APIException):
    """503 (``conf.FAILURE_STATUS``) when the failure mode is closed and the backend
    could not answer, when the client cannot be identified, or when the service sheds the
    request to protect itself (``decision.shed``): not the client's fault, so not a 429.
    DRF's exception handler adds ``Retry-After`` from ``wait``."""

    status_code = 503
    default_code = "limiter_unavailable"

    def __init__(self, decision: Decision) -> None:
        super().__init__()
        self.decision = decision
        self.status_code = throttled_status(decision)
        self.wait = None if decision.unidentified else retry_after_seconds(decision.retry_after)
        self.detail = throttled_body(decision)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Any:
    """A DRF ``EXCEPTION_HANDLER`` that builds throttle refusals with
    ``DJANGO_THROTTLE_DENIED_RESPONSE`` and leaves every other exception to DRF's default
    handler. With your own handler, call this one first, or build the response yourself from
    ``exc.decision`` (set on :class:`PolicyThrottled` and :class:`LimiterUnavailable`)."""
    from rest_framework.views import exception_handler as drf_handler

    custom = app_settings.DENIED_RESPONSE is not None
    if custom and isinstance(exc, PolicyThrottled | LimiterUnavailable):
        request = context.get("request")
        return throttled_response(exc.decision, None if request is None else _wrapped(request))
    return drf_handler(exc, context)


class PolicyThrottle:
    """Apply the admin-managed policy (tier limits + endpoint rules) to a DRF view.

    View attributes it reads: ``throttle_scope`` (selects endpoint rules of type "scope"),
    ``throttle_failure_mode`` ("open", "closed" or "local": beats the admin's and the
    setting's) and ``throttle_credential`` (a login/token view: never served uncounted
    while the backend is down, see :meth:`~django_throttle.policy.live.Policy.failure_mode_for`;
    DRF's ``ObtainAuthToken`` counts as one, once given this throttle in its own
    ``throttle_classes``: DRF sets them to ``()``, so wrap it in ``protect_credentials``).

    It implements DRF's throttle interface (``allow_request`` and ``wait``) without subclassing
    ``rest_framework.throttling.BaseThrottle``: importing that module reads DRF's settings at
    class definition (DRF #6030), and this module must import before settings are configured.

    A denial raises :class:`PolicyThrottled` directly so the 429 body can name the limit;
    :meth:`wait` still returns the seconds to wait, as DRF's throttles do. The decision is left
    on the Django request for :class:`~django_throttle.middleware.RateLimitHeadersMiddleware`.
    """

    decision: Decision | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        # Each thing is decided once here and passed down: enabled, the view's exemption,
        # the policy snapshot and the view's options (kept in the snapshot's store).
        # is_exempt_view, read inline: on a view instance, throttle_exempt is its class's.
        if not app_settings.ENABLED or getattr(view, "throttle_exempt", False) is True:
            return True
        http_request: Any = request._request  # noqa: SLF001 (see _wrapped, _django_request)
        if getattr(http_request, "user", None) is not request.user:
            http_request.user = request.user
        policy = live.current()
        # _view_options's store, read here without a call on the path every request takes.
        said = (
            type(view),
            getattr(view, "throttle_scope", None),
            getattr(view, "throttle_failure_mode", None),
            getattr(view, "throttle_credential", None),
        )
        try:
            options = policy.compiled.get(said) or _view_options(view, policy)
        except TypeError:  # an unhashable value: worked out, never stored (see there)
            options = _view_options(view, policy)
        first = len(getattr(http_request, RESERVATIONS, ()))
        decision = core.decide(http_request, policy, options)
        if decision.wait and decision.allowed:
            decision = core.wait_turn(http_request, decision)
        self.decision = http_request.throttle_decision = decision
        if len(getattr(http_request, RESERVATIONS, ())) > first:
            if leases.ended(http_request):  # decided after the client went away (adrf)
                core.settle(http_request, 500)
            else:
                core.record_outcome(view, http_request)
        if decision.allowed:
            return True
        raise _refusal(decision)

    def _decided(self, http_request: Any, decision: Decision) -> bool:
        """Leave ``decision`` for ``wait`` and the headers middleware; raise a refusal."""
        self.decision = decision
        http_request.throttle_decision = decision
        if decision.allowed:
            return True
        raise _refusal(decision)

    def wait(self) -> float | None:
        if self.decision is None or self.decision.allowed:
            return None
        return self.decision.retry_after


class AsyncPolicyThrottle(PolicyThrottle):
    """:class:`PolicyThrottle` with ``async def allow_request``, for async DRF views (adrf's
    ``APIView`` awaits such throttles): the decision is awaited on the event loop through
    ``redis.asyncio``, like the ``@throttle`` decorator on an ``async def`` view."""

    async def allow_request(self, request: Request, view: Any) -> bool:  # type: ignore[override]
        if is_exempt_view(view):
            return True
        http_request = _django_request(request)
        first = len(getattr(http_request, RESERVATIONS, ()))
        # DRF authenticated the request (in adrf's worker thread): its user is loaded.
        decision = await core.acheck(http_request, user_loaded=True, **_view_options(view))
        if decision.wait and decision.allowed:
            # adrf awaits this from initial() in a worker thread, blocked while it waits.
            decision = await core.await_turn(http_request, decision, holds_a_thread=True)
        if leases.ended(http_request) and getattr(http_request, RESERVATIONS, None):
            await core.asettle(http_request, 500)  # see PolicyThrottle.allow_request
        elif len(getattr(http_request, RESERVATIONS, ())) > first:
            core.record_outcome(view, http_request)  # a sync handler runs on (see there)
        return self._decided(http_request, decision)


class CredentialProtection:
    """Mixed in before a DRF authentication class: when the request presents that scheme's
    credentials, count them against the limits of the endpoint rules of scope
    :attr:`protection_scope` ("authentication") *before* the wrapped class
    checks them, so a refused attempt (429) never reaches the password hasher or the token
    table. Only the rule's limits are counted (the view's :class:`PolicyThrottle` counts the
    tier's later). Under a rule counting failures, an ``AuthenticationFailed`` keeps the
    tokens and a success gives them back. When the backend cannot answer, the attempt is
    counted in the process (``local``) unless the rule, the tier or the setting says
    ``closed``.

    Set ``protection_scope`` on a subclass to count the rules of another scope.
    """

    protection_scope: str = "authentication"

    def presents_credentials(self, request: Request) -> bool:
        """Whether the request carries this scheme's credentials: by default an
        ``Authorization`` header whose scheme is the one ``authenticate_header`` names
        (every request when it names none)."""
        header = self.authenticate_header(request)  # type: ignore[attr-defined]
        if not header:
            return True
        scheme = str(header).split(maxsplit=1)[0].lower()
        # Split off as DRF's own classes split it (see ``authorization``): a tab after
        # ``Basic`` must not hide the credentials from the check.
        parts = authorization(request.META)
        return bool(parts) and parts[0].decode("latin-1").lower() == scheme

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        wrapped = super().authenticate  # type: ignore[misc]
        if not self.presents_credentials(request):
            return wrapped(request)  # type: ignore[no-any-return]
        http_request = _wrapped(request)
        first = len(getattr(http_request, "throttle_reservations", ()))
        # Only the header is checked here: its username is the header's, not the body's.
        setattr(http_request, HEADER_ONLY, True)
        try:
            decision = core.check(
                http_request, scope=self.protection_scope, credential=True, rule_only=True
            )
        finally:
            setattr(http_request, HEADER_ONLY, False)
        if decision.wait and decision.allowed:  # a delaying limit: its turn, as every check's
            decision = core.wait_turn(http_request, decision)
        degraded = core.degraded_mode(decision)
        if degraded is not None:  # said by the headers middleware, whatever the response
            setattr(http_request, core.DEGRADED_ATTRIBUTE, degraded)
        if not decision.allowed:
            raise _refusal(decision)
        status = 500
        try:
            result = wrapped(request)
            status = 200
            return result  # type: ignore[no-any-return]
        except APIException as exc:
            status = exc.status_code
            raise
        except BaseException as exc:  # Django's PermissionDenied, Http404: DRF's 403, 404
            status = core.raised_status(exc)
            raise
        finally:
            core.settle(http_request, status, first=first)


def protect_authentication(cls: type) -> type:
    """``cls`` (a DRF authentication class) with :class:`CredentialProtection` in front.
    Override ``presents_credentials`` on the result when the scheme is not an
    ``Authorization`` header named by ``authenticate_header``."""
    return type(
        f"Protected{cls.__name__}",
        (CredentialProtection, cls),
        {"__module__": cls.__module__, "__doc__": f"{cls.__name__}, protected."},
    )


class ProtectedBasicAuthentication(CredentialProtection, BasicAuthentication):
    """``BasicAuthentication`` that counts ``Authorization: Basic`` attempts before the
    password hash runs (a limit counted by username keys on the user part)."""


class ProtectedTokenAuthentication(CredentialProtection, TokenAuthentication):
    """``TokenAuthentication`` that counts ``Authorization: Token …`` attempts (its
    ``keyword``, which its ``authenticate_header`` names) before the token is looked up."""


class ProtectedSessionAuthentication(CredentialProtection, SessionAuthentication):
    """``SessionAuthentication`` counted when the request sends a session cookie."""

    def presents_credentials(self, request: Request) -> bool:
        from django.conf import settings

        return settings.SESSION_COOKIE_NAME in request.COOKIES


def _wrapped(request: Request) -> Any:
    """The Django ``HttpRequest`` a DRF ``Request`` wraps (DRF's documented ``_request``; its
    own ``SessionAuthentication`` reads it too). Reading through DRF's attribute proxy is not
    the same: attributes set on the ``Request`` (the decision, the reservations) never reach
    the Django request the middleware sees, and ``request.user`` would run authentication
    again from inside it. There is no public accessor: this is the one place that reads it."""
    return request._request  # noqa: SLF001


def _django_request(request: Request) -> Any:
    """DRF has authenticated by now; copy the user onto the Django request, which is read
    directly to skip DRF's attribute proxy on every lookup."""
    http_request = request._request  # noqa: SLF001 (see _wrapped)
    if getattr(http_request, "user", None) is not request.user:
        http_request.user = request.user
    return http_request


def _view_options(view: Any, policy: Policy | None = None) -> CheckOptions:
    """The check's keyword arguments the view's attributes give; kept in ``policy``'s store
    (read once per policy version) by view class *and* the values the instance holds: a view
    may set ``throttle_scope`` per instance (``as_view(throttle_scope=...)``, or per action in
    ``get_throttles``), and each instance is then counted under its own scope."""
    said = (
        type(view),
        getattr(view, "throttle_scope", None),
        getattr(view, "throttle_failure_mode", None),
        getattr(view, "throttle_credential", None),
    )
    try:
        found: CheckOptions | None = None if policy is None else policy.compiled.get(said)
    except TypeError:  # an unhashable value (a list for a mode): worked out, never stored
        found, policy = None, None
    if found is not None:
        return found
    options: CheckOptions = {
        "scope": said[1],
        "failure_mode": _failure_mode(view),
        "credential": _is_credential_view(view),
    }
    if policy is not None and len(policy.compiled) < core.MAX_COMPILED:
        policy.compiled[said] = options
    return options


def _refusal(decision: Decision) -> APIException:
    """The exception DRF answers a refusal with: 503 when the limiter could not decide."""
    if decision.unavailable or decision.shed:
        return LimiterUnavailable(decision)
    return PolicyThrottled(decision)


def _failure_mode(view: Any) -> str | None:
    """The view's ``throttle_failure_mode``; an unknown value is logged (once per view class)
    and ignored, so the admin's or the setting's mode applies instead of a guess."""
    mode = getattr(view, "throttle_failure_mode", None)
    if mode is None or mode in core.FAILURE_MODES:
        return mode
    _warn_unknown_mode(f"{type(view).__module__}.{type(view).__qualname__}", repr(mode))
    return None


@functools.cache  # once per view class
def _warn_unknown_mode(name: str, mode: str) -> None:
    modes = ", ".join(core.FAILURE_MODES)
    logger.error("%s.throttle_failure_mode = %s is not one of %s; ignoring it.", name, mode, modes)


def _is_credential_view(view: Any) -> bool:
    """A login or token view is never served uncounted: ``throttle_credential`` on
    the view, else whether it is DRF's ``ObtainAuthToken`` (looked up only when that module
    was imported, so this adapter never imports the authtoken app itself)."""
    flag = getattr(view, "throttle_credential", None)
    if flag is not None:
        return bool(flag)
    authtoken = sys.modules.get("rest_framework.authtoken.views")
    return authtoken is not None and isinstance(view, authtoken.ObtainAuthToken)
