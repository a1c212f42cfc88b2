"""Adds ``X-RateLimit-*`` headers to responses whose request was checked by a throttle, and
settles the counting policy of DRF views.

DRF throttle classes cannot touch responses, so :class:`~django_throttle.drf.PolicyThrottle`
leaves its decision on the request and this middleware writes the headers; a rule that counts
only successes or failures also leaves a reservation, which this middleware gives back once
the response shows an outcome the rule does not count, before it writes the headers (so
``X-RateLimit-Remaining`` counts the tokens given back) (a sync view whose client went away
under ASGI: once it ended, by what it answered; an async view cancelled while it ran: as
:data:`~django_throttle.request.core.CLIENT_GONE`, a failure; one cancelled before it
started: as nothing ran), without the middleware every request counts. A request that
holds concurrency slots (a concurrency limit) gives them back here once its response is
made, or, for a streaming response, once its stream is closed
(:mod:`~django_throttle.request.leases`). It also counts the requests this process is
serving, and under ASGI watches its event loop's lag, for the worker's own load shedder
(:func:`~django_throttle.request.core.worker_refusal`).
Works in sync and async stacks; a request without a reservation or a slot costs two
attribute lookups and the busy count.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest

from django_throttle.request import core, leases

__all__ = ["RateLimitHeadersMiddleware"]


class RateLimitHeadersMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        response = None
        busy = core.busy  # this worker's busy count (its own load shedder), inline
        with busy.lock:
            busy.count += 1
        try:
            response = self.get_response(request)
        finally:
            with busy.lock:
                busy.count -= 1
            if getattr(request, leases.ATTRIBUTE, None):
                leases.finish(request, response)
        decision = getattr(request, "throttle_decision", None)
        if getattr(request, "throttle_reservations", None):
            # Settled before the headers are written: they count the tokens given back.
            decision = core.settle(request, response.status_code, shown=decision)
        core.add_headers(response.headers, decision)
        if hasattr(request, core.DEGRADED_ATTRIBUTE):  # no call on the request path otherwise
            _add_degraded(request, response)
        return response

    async def _acall(self, request: HttpRequest) -> Any:
        response = None
        core.watch_loop()  # this loop's lag (the worker's own load shedder)
        busy = core.busy
        with busy.lock:
            busy.count += 1
        try:
            response = await self.get_response(request)
        except asyncio.CancelledError:
            runs_on = _runs_on(request)
            if runs_on:  # still served, its slots held, until the sync view ends
                await sync_to_async(_view_ended, thread_sensitive=True)()
            # No view runs for it now; a throttle still deciding in a worker thread (adrf's
            # initial()) gives back what it takes at once, not when the request is collected.
            # Said before its reservations are read: one that thread adds after they were
            # read is the thread's to settle.
            leases.end(request)
            if getattr(request, "throttle_reservations", None):
                await core.asettle(request, _cancelled_status(request, runs_on))
            raise
        finally:
            with busy.lock:
                busy.count -= 1
            if getattr(request, leases.ATTRIBUTE, None):
                await leases.afinish(request, response)
        decision = getattr(request, "throttle_decision", None)
        if getattr(request, "throttle_reservations", None):
            decision = await core.asettle(request, response.status_code, shown=decision)
        core.add_headers(response.headers, decision)
        if hasattr(request, core.DEGRADED_ATTRIBUTE):  # no call on the request path otherwise
            _add_degraded(request, response)
        return response


def _runs_on(request: HttpRequest) -> bool:
    """Whether the view of ``request``, whose task was just cancelled (its client went away),
    still runs: an ``async def`` view was cancelled with the task, but a sync view (or an
    async adrf view's sync handler, see :func:`~django_throttle.request.core.record_outcome`)
    runs on in its worker thread to its end (Django cannot stop a thread), doing the work its
    concurrency slots stand for. Given back while it runs, a client that hangs up at once
    could run any number of them."""
    if getattr(request, core.HANDLER_THREAD_ATTRIBUTE, False):
        return True  # an async (adrf) view's sync handler, run in a worker thread
    match = getattr(request, "resolver_match", None)
    return match is not None and not iscoroutinefunction(match.func)


def _cancelled_status(request: HttpRequest, runs_on: bool) -> int:
    """The status a request whose task was cancelled is settled with. A sync view ran to its
    end: what it answered (a DRF view left it, see
    :func:`~django_throttle.request.core.record_outcome`), as ``@throttle`` settles a sync
    view. An async view that answered before the cancellation reached it: what it answered.
    One cancelled while it ran: :data:`~django_throttle.request.core.CLIENT_GONE`, a failure,
    as ``@throttle`` settles it (what it awaited in a worker thread runs on: its work may be
    done). One cancelled before it started (adrf's throttle still deciding in its worker
    thread): a 500, neither a success nor a failure, since nothing ran."""
    outcome = getattr(request, core.OUTCOME_ATTRIBUTE, None)
    if isinstance(outcome, int):
        return outcome
    if runs_on:
        return 500
    return core.CLIENT_GONE if getattr(request, core.VIEW_STARTED_ATTRIBUTE, False) else 500


def _view_ended() -> None:
    """Nothing, run in the request's thread-sensitive thread (where Django runs a sync view
    under ASGI, one call after the other): it returns once the view that ran there ended."""


def _add_degraded(request: HttpRequest, response: Any) -> None:
    """``X-RateLimit-Degraded`` for a credential check made before the view (a DRF
    authentication class's) while the backend could not answer, whatever the response
    (the 401 of a wrong password too)."""
    degraded = getattr(request, core.DEGRADED_ATTRIBUTE, None)
    if degraded is not None:
        response.headers.setdefault(core.DEGRADED_HEADER, degraded)
