"""The backend calls of the request path: one call made through the process's circuit
breaker, blocking or awaited, a :class:`~django_throttle.backends.BackendError` being a
reply like any other; and the runners that drive steps (generators yielding the calls they
need, as :mod:`~django_throttle.request.reservations` writes them) with those calls.

Counts kept while the backend was down are pushed once it answers again.
"""

from __future__ import annotations

from typing import Any, TypeVar

from asgiref.sync import sync_to_async

from django_throttle.backends import BackendError, get_backend
from django_throttle.backends.breaker import get_breaker
from django_throttle.request.reservations import Call, Steps
from django_throttle.usage import accounting as usage

__all__: list[str] = []

T = TypeVar("T")


def run(steps: Steps[T]) -> T:
    """Make the backend calls ``steps`` yield, blocking, through the process's circuit
    breaker; a :class:`BackendError` is raised into the steps at their ``yield``. Counts
    kept while the backend was down are pushed once it answers again."""
    try:
        call = next(steps)
        while True:
            reply = _called(call)  # an error is raised into the steps, anything else sent
            call = steps.throw(reply) if isinstance(reply, BackendError) else steps.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def arun(steps: Steps[T]) -> T:
    """:func:`run` on an event loop: each call is awaited (``redis.asyncio``), never made in
    a thread; only pushing kept counts, which is blocking, runs in a worker thread."""
    try:
        call = next(steps)
        while True:
            reply = await _acalled(call)
            call = steps.throw(reply) if isinstance(reply, BackendError) else steps.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _called(call: Call) -> Any:
    """The reply to one call: what the backend returned, or the :class:`BackendError`."""
    name, args, kwargs = call
    try:
        with get_breaker().guard():
            reply = getattr(get_backend(), name)(*args, **kwargs)
    except BackendError as exc:
        return exc
    if usage.pending:
        usage.flush_pending()
    return reply


async def _acalled(call: Call) -> Any:
    """:func:`_called`, awaited."""
    name, args, kwargs = call
    try:
        with get_breaker().guard():
            reply = await getattr(get_backend(), "a" + name)(*args, **kwargs)
    except BackendError as exc:
        return exc
    if usage.pending:
        await sync_to_async(usage.flush_pending, thread_sensitive=False)()
    return reply
