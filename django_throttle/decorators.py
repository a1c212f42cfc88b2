"""``@throttle`` for plain Django views, sync and async; a thin wrapper over :func:`core.check`.

``@throttle(scope="login")`` applies the admin rules for that scope (plus the client's tier
limits); ``@throttle(rate="5/min")`` an inline limit keyed by client identity, shared by every
view that uses the same ``scope``, else private to the view; ``algorithm=`` picks how it
counts (``@throttle(rate="10000/month", algorithm="calendar_quota")``). Class-based views take
it through ``method_decorator``; each class gets its own bucket even though they share
``View.dispatch``.

A rule that counts only successes or only failures is settled when the view returns: the
request's reservation is given back when the response's status (or a failed login during
the request) is an outcome the rule does not count, before the headers are written (so
``X-RateLimit-Remaining`` counts the tokens given back). A view that raises is settled with the
status Django answers the exception with (403 for ``PermissionDenied``…; 500 for others); an
``async def`` view cancelled while it ran (its client went away under ASGI) as 499, a failure
(:data:`~django_throttle.request.core.CLIENT_GONE`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from django_throttle.conf import require_installed
from django_throttle.rates import (
    MAX_COUNT,
    WINDOW_ALGORITHMS,
    Algorithm,
    Decision,
    InvalidRate,
    Limit,
    Rate,
    limit_text,
)
from django_throttle.request import core, leases
from django_throttle.request.core import (
    CLIENT_GONE,
    DEGRADED_HEADER,
    LOGGED_IN_ATTRIBUTE,
    add_headers,
    degraded_mode,
    guarding,
    login_failed,
    throttled_response,
    watch_login_failures,
)
from django_throttle.request.usernames import USERNAME_FIELDS, may_present_credentials, remember

require_installed("django_throttle.decorators")

__all__ = ["throttle"]

View = TypeVar("View", bound=Callable[..., Any])


def _is_rate(scope: object) -> bool:
    """Whether ``scope`` reads as a rate (``"5/min"``), not as the name of a scope."""
    try:
        Rate.parse(scope)  # type: ignore[arg-type]
    except InvalidRate:
        return False
    return True


def throttle(
    scope: str | None = None,
    rate: str | None = None,
    burst: int | None = None,
    cost: int | None = None,
    failure_mode: str | None = None,
    credential: bool | None = None,
    algorithm: Algorithm | str = Algorithm.TOKEN_BUCKET,
    timezone: str = "",
    delay: int | None = None,
    max_wait: float | None = None,
) -> Callable[[View], View]:
    """Limit a view; a denied request gets 429 with ``Retry-After`` and a JSON body.

    ``scope``, ``rate``, ``burst``, ``algorithm``, ``timezone``, ``cost`` and
    ``failure_mode`` are checked here, so a bad value fails at import time with a message
    saying what is wrong, not on the first request. ``algorithm`` (an
    :class:`~django_throttle.rates.Algorithm` value such as ``"gcra"`` or ``"calendar_quota"``)
    and ``timezone`` (a calendar quota's; empty = the ``TIME_ZONE`` setting) shape the inline
    limit. ``failure_mode`` ("open", "closed" or "local") overrides the policy's choice for
    when the backend cannot answer.
    ``credential=True`` marks a login or token view: unless a mode is given here or in the
    admin, it is counted in the process while the backend is down (never uncounted), or
    refused when the setting says ``closed``. Django's ``LoginView`` (and subclasses)
    decorated through ``method_decorator`` is recognised as one without the flag.

    ``delay`` (with ``algorithm="gcra"``) holds a request back instead of refusing it, as
    nginx's ``limit_req`` does: of the ``burst`` requests admitted at once, ``delay + 1`` are
    served at once and the rest wait their turn, one interval apart, at most ``max_wait``
    seconds (unset: what the burst implies, at most 10 s; see
    :class:`~django_throttle.rates.Limit`). The response then says how long in
    ``X-RateLimit-Delayed``.
    """
    if callable(scope):  # @throttle without its parentheses: the view came as the scope
        raise TypeError(
            "throttle needs its arguments: write @throttle(rate='…') (an inline limit) or "
            "@throttle(scope='…') (admin rules), with the parentheses"
        )
    if scope is None and rate is None:
        raise TypeError("throttle() needs scope='…' (admin rules) or rate='…' (inline limit)")
    if scope is not None and (not isinstance(scope, str) or not scope.strip()):
        # Taken, it failed every request to the view (a 500), or matched no rule ever.
        raise TypeError(
            f"throttle(scope={scope!r}): a scope is the name of endpoint rules of type "
            "'DRF throttle scope' in the admin, such as scope='login'"
        )
    if rate is None and _is_rate(scope):  # @throttle("5/min"): a scope that limits nothing
        raise TypeError(
            f"throttle({scope!r}): the first argument is a scope name (admin rules); for an "
            f"inline limit write throttle(rate={scope!r})"
        )
    shaped = delay is not None or max_wait is not None
    if rate is None and (
        algorithm != Algorithm.TOKEN_BUCKET or timezone or burst is not None or shaped
    ):
        raise TypeError(
            "throttle(): burst, algorithm, timezone, delay and max_wait shape an inline limit: "
            "give rate='…' "
            "too, or set them on the scope's limits in the admin"
        )
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int)):
        # Taken, Redis refused it on every request: the view answered by its failure mode.
        raise TypeError(f"throttle(cost={cost!r}): cost is a whole number of tokens, e.g. cost=10")
    if cost is not None and not 1 <= cost <= MAX_COUNT:
        raise ValueError(f"throttle(cost={cost}): cost must be between 1 and {MAX_COUNT:,}")
    if failure_mode is not None and failure_mode not in core.FAILURE_MODES:
        raise ValueError(
            f"throttle(failure_mode={failure_mode!r}): use one of "
            + ", ".join(repr(mode) for mode in core.FAILURE_MODES)
        )
    probe = None if rate is None else _probe(rate, burst, algorithm, timezone, delay, max_wait)
    if (
        probe is not None
        and probe.algorithm != Algorithm.CONCURRENCY  # one slot per request, whatever its cost
        and cost is not None
        and cost > probe.capacity
    ):
        fix = "the rate's count" if probe.algorithm in WINDOW_ALGORITHMS else "the burst"
        raise ValueError(
            f"throttle(cost={cost}): a request costing {cost} could never pass a limit "
            f"holding {probe.capacity}; raise {fix} or lower the cost"
        )

    def decorator(view: View) -> View:
        if _is_method(view):  # its first argument would be the view instance, not a request
            name = getattr(view, "__name__", "dispatch")
            raise TypeError(
                f"throttle() decorates a view function; on the method {name}() of a "
                "class-based view write @method_decorator(throttle(…)) above it (from "
                f"django.utils.decorators), or @method_decorator(throttle(…), name={name!r}) "
                "on the class"
            )
        owner = scope or _owner(view)
        is_credential = _is_login_view(view) if credential is None else credential

        def options(view_owner: str | None = None) -> dict[str, Any]:
            """The check's arguments; ``view_owner`` (the operator tools) names the class-based
            view whose method ``method_decorator`` decorated, as :func:`_owner` would."""
            limits = None
            if probe is not None:
                # A calendar quota's empty time zone is the setting's, read per request.
                zone = timezone or (_site_zone() if probe.algorithm == Algorithm.CALENDAR else "")
                name = scope or view_owner or owner
                limits = _inline_limits(name, probe, burst, scope, zone)
            return {
                "scope": scope,
                "limits": limits,
                "cost": cost,
                "failure_mode": failure_mode,
                "credential": is_credential,
            }

        # Built once unless they depend on the TIME_ZONE setting.
        site_zoned = probe is not None and probe.algorithm == Algorithm.CALENDAR and not timezone
        wrapper = guard(view, options if site_zoned else options())
        if probe is None:
            # The operator tools (throttle_explain) read them to know the rules this view
            # meets, and what it meets while the backend cannot answer.
            wrapper.throttle_policy_scope = scope
            wrapper.throttle_failure_mode = failure_mode
        else:  # and the inline limit it meets instead of the tier's
            wrapper.throttle_options = options
        return wrapper  # type: ignore[no-any-return]

    return decorator


def _is_method(view: Callable[..., Any]) -> bool:
    """Whether ``view`` is a method written in a class body (its first parameter ``self``),
    not a view function or the bound method ``method_decorator`` hands over."""
    if isinstance(view, functools.partial):  # method_decorator's bound method
        return False
    try:
        first = next(iter(inspect.signature(view, follow_wrapped=False).parameters), None)
    except (TypeError, ValueError):  # no signature to read: a callable we cannot judge
        return False
    return first == "self"


def _instance(view: Callable[..., Any]) -> Any:
    """The view instance behind a ``method_decorator`` partial, else ``None``."""
    func: Any = view.func if isinstance(view, functools.partial) else view
    instance = getattr(func, "__self__", None)
    return None if isinstance(instance, type) else instance


def _is_login_view(view: Callable[..., Any]) -> bool:
    instance = _instance(view)
    if instance is None:
        return False
    from django.contrib.auth.views import LoginView

    return isinstance(instance, LoginView)


def _owner(view: Callable[..., Any]) -> str:
    """The name that gives an unscoped inline limit its own bucket.

    ``method_decorator`` hands the decorator a ``functools.partial`` of the bound method on
    every call, named after the method's defining class (``View.dispatch`` for every
    class-based view); the instance's own class is what tells one view from another.
    """
    instance = _instance(view)
    if instance is not None:
        cls = type(instance)
        return f"{cls.__module__}.{cls.__qualname__}.{getattr(view, '__name__', '')}"
    return f"{getattr(view, '__module__', '')}.{getattr(view, '__qualname__', repr(view))}"


def _probe(
    rate: str,
    burst: int | None,
    algorithm: Algorithm | str,
    timezone: str,
    delay: int | None = None,
    max_wait: float | None = None,
) -> Limit:
    """The inline limit without id or name: every value judged now, by the limit itself."""
    try:
        return Limit.build(
            "probe", rate, burst, algorithm, timezone=timezone, delay=delay, max_wait=max_wait
        )
    except InvalidRate as exc:
        given = ", ".join(
            f"{name}={value!r}"
            for name, value, default in (
                ("rate", rate, None),
                ("burst", burst, None),
                ("algorithm", str(algorithm), Algorithm.TOKEN_BUCKET),
                ("timezone", timezone, ""),
                ("delay", delay, None),
                ("max_wait", max_wait, None),
            )
            if value != default
        )
        raise InvalidRate(f"throttle({given}): {exc}") from exc


def _site_zone() -> str:
    from django.conf import settings

    return settings.TIME_ZONE or ""


@functools.lru_cache(maxsize=1024)
def _inline_limits(
    owner: str, probe: Limit, burst: int | None, scope: str | None, zone: str
) -> tuple[Limit, ...]:
    """The inline limit of one view (or scope), built once: ``method_decorator`` decorates on
    every request. Its public name is the scope or the rate, never a module path; its id
    names the owner, the rate, the burst and the algorithm (a new algorithm, a new counter)."""
    key = f"{owner}|{probe.rate}|{burst}|{probe.algorithm.value}"
    digest = hashlib.blake2b(key.encode(), digest_size=6).hexdigest()
    name = scope or limit_text(probe.rate, probe.algorithm)
    return (dataclasses.replace(probe, id=f"i{digest}", name=name, timezone=zone),)


# -- the view wrapper ------------------------------------------------------------------------
# What both plain Django view adapters build on (``@throttle`` here and ``@protect_credentials``
# in :mod:`django_throttle.credentials`), sync or async: check before the view runs, refuse with
# 429 (or the failure status), else run the view and settle the request's reservations once its
# outcome is known. A view that raises is settled with the status Django answers it with.

#: The keyword arguments of :func:`~django_throttle.request.core.check` for one request:
#: the same dict every time, or a function building it per request.
Options = dict[str, Any] | Callable[[], dict[str, Any]]
#: Where a request keeps the reservations :func:`~django_throttle.request.core.settle` gives back.
RESERVATIONS = "throttle_reservations"


def guard(
    view: Any, options: Options, *, login: bool = False, username_fields: tuple[str, ...] = ()
) -> Any:
    """``view`` checked with ``options`` before it runs.

    A ``login`` guard (``@protect_credentials``) checks only the requests that may present
    credentials (``usernames.may_present_credentials``), watches Django's sign-in signals,
    leaves no decision on the request (the view's own throttle reports its headers; the
    guard adds only ``X-RateLimit-Degraded``) and gives a browser that signed in its device
    cookie. Any other guard leaves the decision on
    ``request.throttle_decision`` and adds its headers to the view's response."""
    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def async_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            if login and not may_present_credentials(request):
                return await view(request, *args, **kwargs)
            first = _started(request, login, username_fields)
            held = len(getattr(request, leases.ATTRIBUTE, ()))
            decision = await core.acheck(request, **(options() if callable(options) else options))
            if decision.wait and decision.allowed:
                decision = await core.await_turn(request, decision)
            if not _allowed(request, decision, login):
                return throttled_response(decision, request)
            status = 500
            response = None
            try:
                if login:
                    with guarding(request):
                        response = await view(request, *args, **kwargs)
                else:
                    response = await view(request, *args, **kwargs)
                status = response.status_code
            except BaseException as exc:
                # Cancelled while it ran (its client went away): its work may have run on
                # in a worker thread, so a failure (CLIENT_GONE), not a 500 (neither).
                cancelled = isinstance(exc, asyncio.CancelledError)
                status = CLIENT_GONE if cancelled else core.raised_status(exc)
                raise
            finally:
                # Settled before the headers are written: they count the tokens given back.
                shown = await core.asettle(request, status, first=first, shown=decision)
                if len(getattr(request, leases.ATTRIBUTE, ())) > held:  # this check's slots
                    await leases.afinish(request, response, held)
            if shown is not None and shown is not decision:
                decision = shown
                if not login:
                    request.throttle_decision = decision
            _served(request, response, decision, login)
            return response

        return markcoroutinefunction(async_wrapper)

    @functools.wraps(view)
    def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
        if login and not may_present_credentials(request):
            return view(request, *args, **kwargs)
        if login:
            first = _started(request, login, username_fields)
        else:
            first = len(getattr(request, RESERVATIONS, ()))
        held = len(getattr(request, leases.ATTRIBUTE, ()))
        decision = core.check(request, **(options() if callable(options) else options))
        if decision.wait and decision.allowed:
            decision = core.wait_turn(request, decision)
        if not login:
            request.throttle_decision = decision  # _allowed, without a call per request
        if not decision.allowed:
            return throttled_response(decision, request)
        status = 500
        response = None
        try:
            if login:
                with guarding(request):
                    response = view(request, *args, **kwargs)
            else:
                response = view(request, *args, **kwargs)
            status = response.status_code
        except BaseException as exc:
            status = core.raised_status(exc)
            raise
        finally:
            if len(getattr(request, RESERVATIONS, ())) > first:  # else settle has nothing to do
                # Settled before the headers are written: they count the tokens given back.
                decision = core.settle(request, status, first=first, shown=decision) or decision
                if not login:
                    request.throttle_decision = decision
            if len(getattr(request, leases.ATTRIBUTE, ())) > held:  # this check's slots
                leases.finish(request, response, held)
        if login:
            _served(request, response, decision, login)
        else:
            add_headers(response.headers, decision)
        return response

    return wrapper


def _started(request: Any, login: bool, username_fields: tuple[str, ...] = ()) -> int:
    """How many reservations the request holds before this check (a check inside another
    settles its own). A login guard watches the sign-in signals, and names the view's own
    username fields for the check to read (``protect_credentials(username_field=…)``)."""
    if login:
        watch_login_failures()
        if username_fields:
            with contextlib.suppress(AttributeError):  # a request that takes no attributes
                setattr(request, USERNAME_FIELDS, username_fields)
    return len(getattr(request, "throttle_reservations", ()))


def _allowed(request: Any, decision: Decision, login: bool) -> bool:
    if not login:
        request.throttle_decision = decision
    return decision.allowed


def _served(request: Any, response: Any, decision: Decision, login: bool) -> None:
    """After the view answered: the decision's headers; for a login, only
    ``X-RateLimit-Degraded`` when the backend could not answer (the rule's counts are not
    advertised: the view's own throttle reports its headers), so an attempt served while
    Redis is down says so as other endpoints do, and, after a real sign-in
    (``user_logged_in`` fired for this request), the browser's device cookie for the
    account signed in to (see :mod:`~django_throttle.request.usernames`)."""
    if not login:
        add_headers(response.headers, decision)
        return
    degraded = degraded_mode(decision)
    if degraded is not None:
        response.headers.setdefault(DEGRADED_HEADER, degraded)
    account = getattr(request, LOGGED_IN_ATTRIBUTE, None)
    if isinstance(account, str) and account and not login_failed(request):
        remember(request, response, account)
