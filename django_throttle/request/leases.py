"""Concurrency slots held by requests in flight: kept while the request runs, given back when
its response ends.

A request allowed through a concurrency limit (:attr:`~django_throttle.rates.Algorithm.
CONCURRENCY`) holds one slot per such limit under a lease id (``Decision.leases``), which the
request path keeps on the request (``throttle_leases``: :func:`hold`). Whoever sees the
response gives it back (:func:`finish`): the view decorator after its view, the
headers middleware after a DRF view; a streaming response only once its stream is closed
(read to the end, or the client gone), an exception at once. Giving back is idempotent, by
lease id, so two of them (the decorator inside the middleware) cost one call. A request
cancelled before its check took its slots (adrf checks in a worker thread, which runs on
when the client goes away) is marked ended (:func:`end`): what it takes then goes back at once.

While a slot is held, this process's keeper thread (``django-throttle-leases``) renews its
lease every third of the limit's period, so a request longer than the period keeps its slot
and a worker killed while holding one frees it within the period (renewal never revives a
lease that ended: see ``lua/lease.lua``). Should nothing give a slot back (no middleware
behind a DRF view), the request's garbage collection hands it to the keeper, which gives it
back: a slot is never held for longer than its request object lives.

A slot that cannot be given back (Redis down) ends with its lease, within the period; a
renewal that fails is tried again a third of the period later. A counting call that failed
or was cancelled once sent (a timeout, the client gone) may have taken slots under a lease id
only it knew: the keeper gives them back by id (:func:`abandon`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django_throttle import events
from django_throttle.backends import BackendError, get_backend, get_local_backend
from django_throttle.backends.redis_nodes import get_breaker
from django_throttle.rates import Algorithm, Decision, Limit
from django_throttle.redaction import log_text

logger = logging.getLogger("django_throttle")

#: The request attribute holding its :class:`Held` slots.
ATTRIBUTE = "throttle_leases"
#: The request attribute :func:`end` sets.
ENDED = "throttle_leases_ended"
#: Orders :func:`hold` and :func:`end` across threads: a slot is either kept on the request
#: (and given back with it) or, taken after its end, given back at once; never both.
_ending = threading.Lock()
#: Shortest wait between two renewals of a lease, in seconds (a lease of a second or less).
MIN_RENEW_EVERY = 0.1


@dataclass(frozen=True, slots=True)
class Held:
    """The slots one backend call took: ``client``'s ``limits`` (its concurrency limits)
    under ``lease``; ``local``: taken from the in-process fallback (failure mode
    ``local``), given back there."""

    client: str
    limits: tuple[Limit, ...]
    lease: str
    local: bool = False

    @property
    def renew_every(self) -> float:
        """Seconds between two renewals: a third of the shortest lease, so two may fail
        before it ends."""
        period = min(limit.rate.period for limit in self.limits)
        return max(MIN_RENEW_EVERY, period / 3)


def hold(
    request: Any,
    groups: Sequence[tuple[str, Sequence[Limit]]],
    decision: Decision,
    local: bool = False,
) -> None:
    """Keep the slots an allowed ``decision`` took (``groups``: the (client, limits) of its
    backend calls) on ``request`` and with the keeper, which renews them until
    :func:`finish` gives them back."""
    found = dict(groups)
    held = []
    for client, lease in decision.leases:
        limits = tuple(
            limit for limit in found.get(client, ()) if limit.algorithm == Algorithm.CONCURRENCY
        )
        if limits:
            held.append(Held(client, limits, lease, local))
    if not held:
        return
    with _ending:
        ended = getattr(request, ENDED, False)
        if not ended:
            setattr(request, ATTRIBUTE, [*getattr(request, ATTRIBUTE, ()), *held])
            keeper().keep(request, held)
    if ended:  # taken by a check that ran on after its request was cancelled
        for one in held:
            keeper().abandon(one)


def end(request: Any) -> None:
    """Say that ``request`` was cancelled (its client went away) and will run no view: a
    check still running for it (adrf decides in a worker thread, which a cancellation
    cannot stop) gives back the slots it takes at once, instead of keeping them until the
    request is collected. The slots it holds already are left for :func:`afinish`."""
    with _ending, contextlib.suppress(AttributeError):  # a request that takes no attributes
        setattr(request, ENDED, True)


def ended(request: Any) -> bool:
    """Whether ``request`` was cancelled before its check was done (see :func:`end`)."""
    return getattr(request, ENDED, False) is True


def abandon(found: Sequence[tuple[str, Sequence[Limit], str]]) -> None:
    """Give back, by id and off the request path (the keeper's thread does), the slots a
    counting call may have taken before it failed or was cancelled (``found``: its
    (client, limits, lease id), see :func:`~django_throttle.backends.base.note_lease`):
    nobody else knows their lease id, so they would stay taken until their lease ends.
    A lease the call never took releases nothing."""
    for client, limits, lease in found:
        held = tuple(limit for limit in limits if limit.algorithm == Algorithm.CONCURRENCY)
        if held:
            keeper().abandon(Held(client, held, lease))


def count(request: Any) -> int:
    """How many slots ``request`` holds now (a guard gives back only those it took)."""
    return len(getattr(request, ATTRIBUTE, ()))


def _taken(request: Any, first: int) -> list[Held]:
    held: list[Held] = getattr(request, ATTRIBUTE, None) or []
    if len(held) <= first:
        return []
    setattr(request, ATTRIBUTE, held[:first])
    return held[first:]


def release(request: Any, first: int = 0) -> None:
    """Give back the slots ``request`` took after its first ``first``, now."""
    for held in _taken(request, first):
        give_back(held)


async def arelease(request: Any, first: int = 0) -> None:
    """:func:`release` for async stacks: awaited on the event loop."""
    await _agive_back_all(_taken(request, first))


def finish(request: Any, response: Any, first: int = 0) -> None:
    """After the view answered: give back the slots ``request`` took (after its first
    ``first``) now, or, for a streaming response, when its stream is closed. ``response``
    is ``None`` when the view raised: given back now."""
    if count(request) <= first:
        return
    if getattr(response, "streaming", False):
        _release_when_closed(response, _taken(request, first))
    else:
        release(request, first)


async def afinish(request: Any, response: Any, first: int = 0) -> None:
    """:func:`finish` for async stacks."""
    if count(request) <= first:
        return
    if getattr(response, "streaming", False):
        _release_when_closed(response, _taken(request, first))
    else:
        await arelease(request, first)


def give_back(held: Held) -> None:
    """Release one :class:`Held` (blocking); a failure is logged: the slot ends with its
    lease."""
    keeper().forget(held)
    try:
        if held.local:
            get_local_backend().release(held.client, held.limits, held.lease)
        else:
            with get_breaker().guard():
                get_backend().release(held.client, held.limits, held.lease)
    except BackendError as exc:
        _not_given_back(held, exc)


async def agive_back(held: Held) -> None:
    """:func:`give_back` on the event loop. Cancelled (the client went away) before Redis
    answered, the release may never have reached it (waiting for a pooled connection, say):
    the keeper's thread gives the slot back by id, as nobody renews it any more."""
    keeper().forget(held)
    try:
        if held.local:
            get_local_backend().release(held.client, held.limits, held.lease)
        else:
            with get_breaker().guard():
                await get_backend().arelease(held.client, held.limits, held.lease)
    except BackendError as exc:
        _not_given_back(held, exc)
    except asyncio.CancelledError:
        keeper().abandon(held)  # released once: a lease already given back releases nothing
        raise


async def _agive_back_all(held: Sequence[Held]) -> None:
    """:func:`agive_back` each of ``held``; those after a cancelled one are left to the
    keeper's thread, as that one is."""
    for index, one in enumerate(held):
        try:
            await agive_back(one)
        except asyncio.CancelledError:
            for rest in held[index + 1 :]:
                keeper().abandon(rest)
            raise


def _not_given_back(held: Held, exc: Exception) -> None:
    logger.warning(
        "A concurrency slot of %s could not be given back; it is free again when its lease "
        "ends (within %s s): %s",
        log_text(held.client),
        min(limit.rate.period for limit in held.limits),
        exc,
    )


def _release_when_closed(response: Any, held: list[Held]) -> None:
    """Wrap ``response``'s stream so that closing it (read to its end, or closed early by
    the server when the client went away) gives ``held`` back."""
    if not held:
        return
    content = response.streaming_content
    stream: _Releasing | _AsyncReleasing
    if getattr(response, "is_async", False):
        stream = _AsyncReleasing(content, held)
    else:
        stream = _Releasing(content, held)
    response.streaming_content = stream
    # The slots now live as long as the stream, not the request (a view called directly
    # may drop its request while the stream still runs).
    keeper().keep(stream, held)


class _Releasing:
    """An iterator over a sync stream that gives its slots back when it ends or is closed
    (Django registers ``close`` with the response, which the server calls)."""

    def __init__(self, content: Any, held: list[Held]) -> None:
        self._content: Iterator[Any] = iter(content)
        self._held = held

    def __iter__(self) -> _Releasing:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._content)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        held, self._held = self._held, []
        for one in held:
            give_back(one)


class _AsyncReleasing:
    """:class:`_Releasing` for an async stream: given back, awaited, when the stream ends,
    or by ``close`` (blocking, as Django calls it) when the response is closed first."""

    def __init__(self, content: Any, held: list[Held]) -> None:
        self._content: AsyncIterator[Any] = aiter(content)
        self._held = held

    def __aiter__(self) -> _AsyncReleasing:
        return self

    async def __anext__(self) -> Any:
        try:
            return await anext(self._content)
        except BaseException:
            held, self._held = self._held, []
            await _agive_back_all(held)
            raise

    def close(self) -> None:
        held, self._held = self._held, []
        for one in held:
            give_back(one)


class Keeper:
    """This process's renewals: every held slot's lease is renewed each
    :attr:`Held.renew_every` by a daemon thread, until it is given back; the slots of a
    request collected while still holding them are given back by the thread too."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.pid = os.getpid()
        self.clock = clock
        self._lock = threading.Lock()
        self._due: dict[Held, float] = {}
        self._finalizers: dict[Held, weakref.finalize[Any, Any]] = {}
        # Slots of requests collected while holding them: appended by a finalizer (no lock:
        # a finalizer may run on any thread, inside any code), given back by the thread.
        self._orphans: deque[Held] = deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def keep(self, owner: Any, held: Sequence[Held]) -> None:
        """Renew ``held`` from now on, until :meth:`forget`; give them back should ``owner``
        (the request holding them, or the stream they were handed to) be collected first.
        Called again with a new owner, the slots follow it."""
        now = self.clock()
        with self._lock:
            for one in held:
                self._due.setdefault(one, now + one.renew_every)
                earlier = self._finalizers.get(one)
                if earlier is not None:
                    earlier.detach()
                finalizer = weakref.finalize(owner, self._orphans.append, one)
                finalizer.atexit = False  # at exit the process's leases end by themselves
                self._finalizers[one] = finalizer
            self._start()
            count = len(self._due)
        self._wake.set()
        self._announce(count)

    def abandon(self, held: Held) -> None:
        """Give ``held`` back from this thread, soon (see :func:`abandon`)."""
        self._orphans.append(held)
        with self._lock:
            self._start()
        self._wake.set()

    def _start(self) -> None:
        """Start this process's thread unless it runs (called under the lock)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="django-throttle-leases", daemon=True
            )
            self._thread.start()

    def forget(self, held: Held) -> None:
        """Stop renewing ``held`` (given back, or its lease ended)."""
        with self._lock:
            known = self._due.pop(held, None) is not None
            finalizer = self._finalizers.pop(held, None)
            count = len(self._due)
        if finalizer is not None:
            finalizer.detach()
        if known:
            self._announce(count)

    def _announce(self, count: int) -> None:
        if events.leases_held.receivers:  # nothing to do unless someone listens (metrics)
            events.send(events.leases_held, Keeper, held=count)

    def held(self) -> list[Held]:
        """The slots this process renews now."""
        with self._lock:
            return list(self._due)

    def _run(self) -> None:
        while True:
            with self._lock:
                soonest = min(self._due.values(), default=None)
            # Nothing held: asleep until :meth:`keep` wakes it. Else up to the next renewal,
            # and at most a second, so a collected request's slots wait no longer.
            timeout = None if soonest is None else min(max(0.0, soonest - self.clock()), 1.0)
            if self._orphans:
                timeout = 0.0
            self._wake.wait(timeout)
            self._wake.clear()
            self.renew_due()

    def renew_due(self) -> None:
        """Give back the orphans' slots, and renew every lease whose renewal is due."""
        while self._orphans:
            give_back(self._orphans.popleft())
        now = self.clock()
        with self._lock:
            due = [held for held, at in self._due.items() if at <= now]
            for held in due:
                self._due[held] = now + held.renew_every
        for held in due:
            self._renew(held)

    def _renew(self, held: Held) -> None:
        try:
            if held.local:
                renewed = get_local_backend().renew(held.client, held.limits, held.lease)
            else:
                with get_breaker().guard():
                    renewed = get_backend().renew(held.client, held.limits, held.lease)
        except BackendError as exc:
            logger.warning(
                "The concurrency lease of %s could not be renewed (tried again in %.1f s): %s",
                log_text(held.client),
                held.renew_every,
                exc,
            )
            return
        if not renewed:
            with self._lock:
                given_back = held not in self._due  # while it was being renewed: all is well
            self.forget(held)
            if given_back:
                return
            events.send(events.lease_lost, Keeper, client=held.client)
            logger.warning(
                "The concurrency lease of %s ended before it was renewed: its slot may have "
                "been taken by another request (a renewal failed for a whole lease).",
                log_text(held.client),
            )


_keeper: Keeper | None = None
_keeper_lock = threading.Lock()


def keeper() -> Keeper:
    """This process's :class:`Keeper` (a new one in a forked child: the parent's thread
    is not there, nor are its requests)."""
    global _keeper
    found = _keeper
    if found is None or found.pid != os.getpid():
        with _keeper_lock:
            found = _keeper
            if found is None or found.pid != os.getpid():
                found = _keeper = Keeper()
    return found
