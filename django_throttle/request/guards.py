"""The wrapper both plain Django view adapters build on (``@throttle`` and
``@protect_credentials``), sync or async: check before the view runs, refuse with 429 (or
the failure status), else run the view and settle the request's reservations once its
outcome is known. A view that raises is settled as a 500.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from django_throttle.rates import Decision
from django_throttle.request import core, leases
from django_throttle.request.core import (
    DEGRADED_HEADER,
    LOGGED_IN_ATTRIBUTE,
    add_headers,
    degraded_mode,
    login_failed,
    throttled_response,
    watch_login_failures,
)
from django_throttle.request.usernames import normalise_username, presented_username, remember

#: The keyword arguments of :func:`~django_throttle.request.core.check` for one request:
#: the same dict every time, or a function building it per request.
Options = dict[str, Any] | Callable[[], dict[str, Any]]
#: Where a request keeps the reservations :func:`~django_throttle.request.core.settle` gives back.
RESERVATIONS = "throttle_reservations"


def guard(view: Any, options: Options, *, login: bool = False) -> Any:
    """``view`` checked with ``options`` before it runs.

    A ``login`` guard (``@protect_credentials``) checks ``POST`` requests only, watches
    Django's sign-in signals, leaves no decision on the request (the view's own throttle
    reports its headers; the guard adds only ``X-RateLimit-Degraded``) and gives a browser
    that signed in its device cookie. Any other guard leaves the decision on
    ``request.throttle_decision`` and adds its headers to the view's response."""
    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def async_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            if login and request.method != "POST":
                return await view(request, *args, **kwargs)
            first = _started(request, login)
            held = len(getattr(request, leases.ATTRIBUTE, ()))
            decision = await core.acheck(request, **(options() if callable(options) else options))
            if decision.wait and decision.allowed:
                decision = await core.await_turn(request, decision)
            if not _allowed(request, decision, login):
                return throttled_response(decision, request)
            status = 500
            response = None
            try:
                response = await view(request, *args, **kwargs)
                status = response.status_code
                _served(request, response, decision, login)
            finally:
                await core.asettle(request, status, first=first)
                if len(getattr(request, leases.ATTRIBUTE, ())) > held:  # this check's slots
                    await leases.afinish(request, response, held)
            return response

        return markcoroutinefunction(async_wrapper)

    @functools.wraps(view)
    def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
        if login and request.method != "POST":
            return view(request, *args, **kwargs)
        first = _started(request, login) if login else len(getattr(request, RESERVATIONS, ()))
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
            response = view(request, *args, **kwargs)
            status = response.status_code
            if login:
                _served(request, response, decision, login)
            else:
                add_headers(response.headers, decision)
        finally:
            if len(getattr(request, RESERVATIONS, ())) > first:  # else settle has nothing to do
                core.settle(request, status, first=first)
            if len(getattr(request, leases.ATTRIBUTE, ())) > held:  # this check's slots
                leases.finish(request, response, held)
        return response

    return wrapper


def _started(request: Any, login: bool) -> int:
    """How many reservations the request holds before this check (a check inside another
    settles its own)."""
    if login:
        watch_login_failures()
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
    username it presented (see :mod:`~django_throttle.request.usernames`)."""
    if not login:
        add_headers(response.headers, decision)
        return
    degraded = degraded_mode(decision)
    if degraded is not None:
        response.headers.setdefault(DEGRADED_HEADER, degraded)
    if not getattr(request, LOGGED_IN_ATTRIBUTE, False) or login_failed(request):
        return
    username = presented_username(request)
    if username is None:
        user = getattr(request, "user", None)
        get_username = getattr(user, "get_username", None)
        username = normalise_username(str(get_username())) if get_username else None
    if username:
        remember(request, response, username)
