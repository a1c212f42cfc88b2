"""A per-process circuit breaker around backend calls.

After ``threshold`` consecutive :class:`BackendError` failures the breaker opens: calls fail at
once with :class:`CircuitOpen` instead of each waiting for a timeout. After ``cooldown``
seconds it is half-open: exactly one caller probes the backend while the others still fail at
once; the probe's success closes the breaker, its failure opens it for another cooldown. So a
dead or hung Redis costs a process a handful of timeouts (at most the threshold plus the calls
already under way), then requests fail at once without waiting on Redis, and exact limiting
resumes within one cooldown of Redis answering again.

Thread-safe. A closed breaker costs a call a few attribute reads and no lock; transitions take
the lock and are logged once each (opening at WARNING with the error, recovery at WARNING),
never per request. ``clock`` is injectable (monotonic seconds) so tests move time by hand.

An :class:`~django_throttle.backends.base.ArgumentRefused` (the backend answered, refusing an
argument this package sent) is no failure: it propagates for the caller to decide that one
request, counts as the backend answering (it closes a half-open breaker like any answer), and
is logged at ERROR, at most once per :data:`REFUSED_LOG_INTERVAL` (a client that can provoke
it must not flood the log either). A :class:`~django_throttle.backends.base.NodeUnavailable`
(one Cluster primary down, the others answering) counts as the backend answering too: that
node's own breaker fails its clients fast, and the rest of the process keeps counting.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django_throttle import events
from django_throttle.backends.base import ArgumentRefused, BackendError, NodeUnavailable

logger = logging.getLogger("django_throttle.backends.breaker")

T = TypeVar("T")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"
#: Seconds between two error lines about refused arguments, per breaker.
REFUSED_LOG_INTERVAL = 60.0
#: Consecutive failures that open the process's breaker: one timeout is noise, three in a row
#: is an outage, and each costs a request its socket timeout.
THRESHOLD = 3
#: Seconds the process's breaker stays open before one request probes the backend: exact
#: limiting resumes within half a second of Redis answering again.
COOLDOWN = 0.5


class CircuitOpen(BackendError):
    """The breaker is open: the backend was not called."""

    #: What :func:`django_throttle.events.error_reason` calls it.
    reason = "circuit_open"


class CircuitBreaker:
    """Closed / open / half-open state around one backend, shared by a process's threads.

    Counters for metrics: ``failures`` (backend errors seen), ``opened`` (times it opened,
    re-opening after a failed probe included), ``short_circuited`` (calls refused at once)
    and ``refused`` (calls whose arguments the backend refused: not failures).
    """

    def __init__(
        self,
        threshold: int = THRESHOLD,
        cooldown: float = COOLDOWN,
        clock: Callable[[], float] = time.monotonic,
        node: str | None = None,
    ) -> None:
        if threshold < 1:
            raise ValueError(f"threshold must be at least 1, not {threshold}")
        if cooldown < 0:
            raise ValueError(f"cooldown must be at least 0, not {cooldown}")
        self.threshold = threshold
        self.cooldown = cooldown
        self.clock = clock
        #: ``host:port`` of the Redis Cluster primary this breaker guards; None for the
        #: process's breaker (every backend call). Logs and signals say which it is.
        self.node = node
        self._what = "throttle backend" if node is None else f"throttle cluster primary {node}"
        self.failures = 0
        self.opened = 0
        self.short_circuited = 0
        self.refused = 0
        #: Consecutive failures while closed (each call's guard reads it on the way out).
        self.streak = 0
        self._refused_logged: float | None = None  # when the last refusal was logged
        self._refused_quiet = 0  # refusals not logged since
        self._lock = threading.Lock()
        self._opened_at: float | None = None  # None while closed
        self._probing = False
        self._down_since = 0.0  # when it opened from closed
        self._refused_before = 0  # short_circuited when it opened from closed
        # Bumped on every open and close: a call that started before a transition does not
        # move the streak of the state that followed it.
        self._epoch = 0
        self._closed = _Passage(self, self._passed, 0, False)
        #: The last backend failure, for the admin dashboard: its message and when (Unix).
        self.last_error = ""
        self.last_error_at: float | None = None

    @property
    def state(self) -> str:
        opened_at = self._opened_at
        if opened_at is None:
            return CLOSED
        if self._probing or self.clock() - opened_at >= self.cooldown:
            return HALF_OPEN
        return OPEN

    def retry_after(self) -> float:
        """Seconds until a call may reach the backend again (0 while closed or due a probe)."""
        with self._lock:
            if self._opened_at is None:
                return 0.0
            if self._probing:
                return self.cooldown
            return max(0.0, self._opened_at + self.cooldown - self.clock())

    def guard(self) -> _Passage:
        """A context manager around one backend call, sync or awaited alike (``with
        breaker.guard(): ...``). Asking for it raises :class:`CircuitOpen` while the breaker
        is open (the call must not be made); leaving it with a :class:`BackendError` counts a
        failure, leaving it with an answer closes a half-open breaker.

        While closed, every call of an epoch shares one guard: a healthy request allocates
        nothing here."""
        passage = self._closed  # read before the state: a transition since is seen by epoch
        if self._opened_at is None:
            return passage
        if self._admit():
            return _Passage(self, self._passed, self._epoch, True)
        return self._closed  # closed meanwhile

    def call(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``func`` unless the breaker is open; a :class:`BackendError` it raises counts
        as a failure and propagates. Other exceptions propagate and count as nothing."""
        with self.guard():
            return func(*args, **kwargs)

    async def acall(self, func: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """:meth:`call` for a coroutine function: the same states, shared with sync callers."""
        with self.guard():
            return await func(*args, **kwargs)

    def _passed(self, epoch: int, probe: bool, exc: BaseException | None) -> None:
        """Count how a guarded call ended: ``exc`` is what it raised, ``None`` if nothing."""
        if exc is None or isinstance(exc, (ArgumentRefused, NodeUnavailable)):  # it answered
            if probe:
                self._probe_succeeded()
            elif self.streak:
                with self._lock:
                    if self._epoch == epoch:
                        self.streak = 0
            if isinstance(exc, ArgumentRefused):
                self._refused(exc)
        elif probe:
            self._probe_failed(exc)
        elif isinstance(exc, BackendError):
            self._failed(exc, epoch)

    def _next_epoch(self) -> None:
        """Move to the next epoch (under the lock), with the closed state's guard of it."""
        self._epoch += 1
        self._closed = _Passage(self, self._passed, self._epoch, False)

    def _refused(self, exc: ArgumentRefused) -> None:
        """Log a refused argument (a bug of this package, or of a custom resolver or backend)
        at ERROR, at most once per interval, with how many went unlogged since."""
        with self._lock:
            self.refused += 1
            now = self.clock()
            last = self._refused_logged
            if last is not None and now - last < REFUSED_LOG_INTERVAL:
                self._refused_quiet += 1
                return
            quiet, self._refused_quiet = self._refused_quiet, 0
            self._refused_logged = now
        logger.error(
            "the throttle backend refused an argument of a counting call (a bug, not an "
            "outage: the breaker stays as it is; that request got its failure mode): %r%s",
            str(exc)[:500],  # quoted: the arguments may hold a client's CR, LF or ESC
            f" ({quiet} more since the last such line)" if quiet else "",
        )

    def _admit(self) -> bool:
        """True if this caller is the half-open probe; False if the breaker closed meanwhile;
        raise :class:`CircuitOpen` otherwise."""
        with self._lock:
            if self._opened_at is None:
                return False
            wait = self._opened_at + self.cooldown - self.clock()
            if self._probing or wait > 0:
                self.short_circuited += 1
                raise CircuitOpen(
                    f"circuit open after {self.threshold} consecutive backend failures; "
                    f"next probe in {max(wait, 0.0):.3f} s"
                )
            self._probing = True
            return True

    def _probe_failed(self, exc: BaseException) -> None:
        """A backend error re-opens the breaker; anything else leaves the probe undecided, so
        the next caller probes."""
        with self._lock:
            self._probing = False
            if not isinstance(exc, BackendError):
                return
            self.failures += 1
            self.opened += 1
            self._next_epoch()
            self._opened_at = self.clock()
        logger.debug("%s probe failed; breaker open again: %s", self._what, exc)
        self._note(exc)

    def _probe_succeeded(self) -> None:
        with self._lock:
            self._next_epoch()
            self._opened_at = None
            self._probing = False
            self.streak = 0
            down = self.clock() - self._down_since
            refused = self.short_circuited - self._refused_before
        logger.warning(
            "%s answering again; circuit breaker closed after %.1f s open "
            "(%d calls refused at once meanwhile)",
            self._what,
            down,
            refused,
        )
        events.send(events.backend_available, CircuitBreaker, down_seconds=down, node=self.node)

    def _note(self, exc: BaseException) -> None:
        """Remember a backend failure for the dashboard and send ``backend_error``."""
        self.last_error = f"{type(exc).__name__}: {exc}"[:500]
        self.last_error_at = time.time()
        events.send(
            events.backend_error, CircuitBreaker, error=exc, reason=events.error_reason(exc)
        )

    def _failed(self, exc: BackendError, epoch: int) -> None:
        self._note(exc)
        with self._lock:
            self.failures += 1
            if epoch != self._epoch or self._opened_at is not None:
                return
            self.streak += 1
            if self.streak < self.threshold:
                return
            self.opened += 1
            self._next_epoch()
            self._opened_at = self._down_since = self.clock()
            self._refused_before = self.short_circuited
            self.streak = 0
        logger.warning(
            "%s failed %d times in a row; circuit breaker open, calls fail at once for "
            "%.3g s before one probes again: %s",
            self._what,
            self.threshold,
            self.cooldown,
            exc,
        )
        events.send(events.backend_unavailable, CircuitBreaker, error=exc, node=self.node)


@dataclass(slots=True)
class _Passage:
    """One call's way through a breaker (:meth:`CircuitBreaker.guard`): the epoch it
    started in and whether it is the half-open probe; ``done`` counts how it ended, unless
    it ended as nearly every call does (answered, closed, no failure streak to reset)."""

    breaker: CircuitBreaker
    done: Callable[[int, bool, BaseException | None], None]
    epoch: int
    probe: bool

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        if exc is None and not self.probe and not self.breaker.streak:
            return  # the healthy path: nothing to count
        self.done(self.epoch, self.probe, exc)


@functools.cache
def get_breaker() -> CircuitBreaker:
    """The process's breaker, built on first use with :data:`THRESHOLD` and :data:`COOLDOWN`."""
    return CircuitBreaker(threshold=THRESHOLD, cooldown=COOLDOWN)


def reset_breaker() -> None:
    """Forget the process's breaker (``backends.reset_backend_cache`` calls this)."""
    get_breaker.cache_clear()
