"""One Redis node: a counting call (:class:`ScriptCall`) sent to it through redis-py's own
clients (:func:`run_script`, :func:`arun_script`), the route of counting calls to one server or
to the primary a set of sentinels names (:class:`OneServer`; every shard is on it, and
:mod:`.redis_cluster` is the route across a cluster's primaries), and the circuit breaker that
wraps the calls to a node (:class:`CircuitBreaker`: the process's own around every backend call,
and one per cluster primary).

A call is one ``FCALL`` of the package's function through the client's own command path
(:class:`Functions`: "no such function", after a restart or a failover, is answered by loading
the library and calling once more), or one ``EVALSHA`` where the server has no functions;
``NOSCRIPT`` (the script did not run) is answered with ``EVAL`` of the source. Nothing else is
ever sent twice: the clients have retries off (a call that timed out may already have
counted), and redis-py disconnects a connection whose reply was lost, so no late reply answers
the next call.

A thread counting on one server holds one connection of the client's bounded pool for its
life (:class:`ThreadConnections`), and sends the script call on it with the connection's own
``send_command`` and ``read_response``, so a decision skips the pool's checkout and return
and the client's per-command bookkeeping (keeping the checkout's check that the server has
not closed the connection meanwhile for a connection idle :data:`POLL_IDLE_AFTER` or longer:
:meth:`OneServer.call`); at most half the pool is held so,
the rest serving every other thread and command. A thread's connection goes back to the pool
when the thread ends; a forked child drops its parent's and opens its own.

``async def`` views use a ``redis.asyncio.Redis`` per running event loop (connections belong to
the loop that opened them), built from the sync client's pool options: the same server,
credentials, TLS and timeouts, retries off; for a Sentinel-managed primary, a
``redis.asyncio.sentinel`` pool asking the same sentinels. No decision borrows a thread.

The breaker: after ``threshold`` consecutive :class:`~.base.BackendError` failures it opens:
calls fail at once with :class:`CircuitOpen` instead of each waiting for a timeout. After
``cooldown`` seconds it is half-open: exactly one caller probes the backend while the others
still fail at once; the probe's success closes the breaker, its failure opens it for another
cooldown. So a dead or hung Redis costs a process a handful of timeouts (at most the threshold
plus the calls already under way), then requests fail at once without waiting on Redis, and
exact limiting resumes within one cooldown of Redis answering again.

The breaker is thread-safe. A closed breaker costs a call a few attribute reads and no lock;
transitions take the lock and are logged once each (opening at WARNING with the error, recovery
at WARNING), never per request, on the ``django_throttle.backends.breaker`` logger. ``clock``
is injectable (monotonic seconds) so tests move time by hand.

An :class:`~django_throttle.backends.base.ArgumentRefused` (the backend answered, refusing an
argument this package sent) is no failure: it propagates for the caller to decide that one
request, counts as the backend answering (it closes a half-open breaker like any answer), and
is logged at ERROR, at most once per :data:`REFUSED_LOG_INTERVAL` (a client that can provoke
it must not flood the log either). A :class:`~django_throttle.backends.base.NodeUnavailable`
(one Cluster primary down, the others answering) counts as the backend answering too: that
node's own breaker fails its clients fast, and the rest of the process keeps counting.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, TypeVar

import redis
from redis.asyncio import connection as aio
from redis.asyncio import sentinel as aio_sentinel
from redis.asyncio.client import Redis as AsyncRedis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import NoPermissionError, NoScriptError, ResponseError
from redis.sentinel import SentinelConnectionPool

from django_throttle import events
from django_throttle.backends.base import ArgumentRefused, BackendError, NodeUnavailable
from django_throttle.backends.redis_clients import async_twin
from django_throttle.backends.scripts import (
    FUNCTION_DIGITS,
    FUNCTION_PREFIX,
    Call,
    evalsha_all,
    failure,
    library,
)

logger = logging.getLogger("django_throttle.backends.breaker")
#: Where a server without functions is said (once per route).
backends_logger = logging.getLogger("django_throttle.backends")

T = TypeVar("T")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"
#: Seconds a thread's connection may have been idle since its last answer and still be
#: sent a call without first polling it for the server having closed it (:meth:`OneServer.call`).
#: The server's ``timeout`` closes only connections idle a whole second or more, so the poll
#: finds every such closing; what closes a connection within this bound of its last answer
#: (``CLIENT KILL``, a restart, a failover) fails that one call, as it fails a call in flight.
#: A busy thread so skips the poll's system calls (measured in docs/explanation/benchmarks.md).
POLL_IDLE_AFTER = 0.05
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


class ScriptCall(NamedTuple):
    """One counting (or refund) script call: what ``FCALL`` (of :func:`.scripts.function_name`
    of ``sha``) or ``EVALSHA`` send. A named tuple,
    so that making one (once per decision) runs no Python of ours."""

    shard: int  # the client's shard (0..shards-1): which cluster slot / breaker
    sha: str  # the script's SHA1 hex digest
    source: str  # its source, for EVAL after NOSCRIPT (the script did not run)
    keys: Sequence[str | bytes]
    args: Sequence[str | bytes | int]


_CLASSES = {
    "Connection": aio.Connection,
    "SSLConnection": aio.SSLConnection,
    "UnixDomainSocketConnection": aio.UnixDomainSocketConnection,
    "SentinelManagedConnection": aio_sentinel.SentinelManagedConnection,
    "SentinelManagedSSLConnection": aio_sentinel.SentinelManagedSSLConnection,
}
#: Options never copied from the sync pool (retries stay off: a replayed call may count twice).
_SYNC_ONLY = (
    "retry",
    "retry_on_error",
    "retry_on_timeout",
    # The sync pool's own helpers, bound to sync connections.
    "event_dispatcher",
    "maint_notifications_config",
    "maint_notifications_pool_handler",
    "oss_cluster_maint_notifications_handler",
    "redis_connect_func",
)


#: Seconds a route that was refused functions sends ``EVALSHA`` before it tries them again:
#: an operator may grant ``+fcall +function|load`` or upgrade the server after reading the
#: warning, and a load refused for a while (a replica's ``READONLY`` during a failover, a
#: full server's ``OOM``) may succeed later. A retry still refused costs one ``FCALL``
#: answered at once.
RETRY_FUNCTIONS_AFTER = 60.0


class Functions:
    """Whether a route calls the package's scripts as Redis functions (``FCALL`` of the
    library :func:`.scripts.library` makes, loaded with ``FUNCTION LOAD`` where a server
    answers that it has no such function: after a restart, a failover, a new release). A
    function runs only the body of each call; ``EVALSHA`` builds every definition of the
    script again on every call, a sixth of the counting call's script time.

    Off, with a WARNING the first time, where the server has no functions (Redis before 7),
    the user may not call or load them (an ACL user of an earlier release's rules) or a load
    fails: the calls then go as ``EVALSHA``, which runs the same script, and functions are
    tried again after :data:`RETRY_FUNCTIONS_AFTER` seconds (:meth:`due`). Nothing is sent
    twice: a call answered "no such function" or refused did not run."""

    def __init__(self) -> None:
        self.on = True
        #: When (``time.monotonic()``) functions are tried again while off.
        self.again_at = 0.0
        self.warned = False

    def due(self) -> bool:
        """Whether functions, off, are to be tried again now (then they are on)."""
        if time.monotonic() < self.again_at:
            return False
        self.on = True
        return True

    def refused(self, exc: ResponseError, loading: bool = False) -> bool:
        """Whether ``exc``, an error reply to ``FCALL``, says this server or user has no
        functions, or (``loading``) ``FUNCTION LOAD`` failed at all (refused, unknown, a
        managed service's own error): then they are off until :data:`RETRY_FUNCTIONS_AFTER`
        seconds from now (said at WARNING the first time, later at DEBUG), and the call goes
        as ``EVALSHA``, which needs nothing loaded."""
        text = str(exc)
        lowered = text.lower()
        command = "fcall" in lowered or "function" in lowered  # not a key's permission
        unavailable = (isinstance(exc, NoPermissionError) and command) or (
            "unknown command" in lowered
        )
        if not (loading or unavailable):
            return False
        if self.on:
            self.on = False
            self.again_at = time.monotonic() + RETRY_FUNCTIONS_AFTER
            backends_logger.log(
                logging.DEBUG if self.warned else logging.WARNING,
                "Redis refused a function call or load (%s: %s): the throttle calls its "
                "scripts with EVALSHA, which takes Redis more time per decision, and tries "
                "functions again in %.0f s. Grant +fcall and +function|load (Redis 7 or "
                "later, Valkey) to call them as functions.",
                type(exc).__name__,
                text,
                RETRY_FUNCTIONS_AFTER,
            )
            self.warned = True
        return True


def _missing(exc: ResponseError) -> bool:
    """A server's answer that it holds no function of that name (nothing ran)."""
    return "function not found" in str(exc).lower()


#: One command of a script call, as ``execute_command`` and ``send_command`` take it.
Command = tuple[Any, ...]


def first_command(call: ScriptCall, functions: Functions | None) -> Command:
    """The command a call is sent as: ``FCALL`` of its function while ``functions`` are on,
    else ``EVALSHA`` of its script (made once per decision: no call of ours inside)."""
    if functions is not None and (functions.on or functions.due()):
        name = FUNCTION_PREFIX + call.sha[:FUNCTION_DIGITS]  # function_name, inline: per call
        return ("FCALL", name, len(call.keys), *call.keys, *call.args)
    return ("EVALSHA", call.sha, len(call.keys), *call.keys, *call.args)


def _loaded(sender: type | None) -> None:
    if sender is not None:
        events.send(events.script_loaded, sender)


def answering(
    refused: ResponseError,
    first: Command,
    call: ScriptCall,
    sender: type | None,
    functions: Functions | None,
) -> Generator[Command, Any, Any]:
    """The commands that send ``call`` again after the server refused its ``first`` command
    with ``refused`` (nothing ran), each yielded to the caller, which sends it and sends its
    reply back in (or throws its error reply in); returns the call's reply. Raises
    ``refused`` when it is no refusal to answer.

    - "Function not found" (a restart, a failover, a flush, a new release): the library is
      loaded (``FUNCTION LOAD REPLACE``, told to :data:`~django_throttle.events.script_loaded`)
      and the ``FCALL`` sent once more; flushed again in between, the call goes as ``EVAL``.
    - No functions on this server or for this user, or a load that failed
      (:meth:`Functions.refused`): the call goes as ``EVALSHA``.
    - ``NOSCRIPT`` to an ``EVALSHA``: ``EVAL`` of the source.

    One generator for the three ways a call is sent (a client, a ``redis.asyncio`` client,
    one held connection): each only sends what it is given."""
    script = (len(call.keys), *call.keys, *call.args)
    if first[0] == "FCALL" and functions is not None:
        if not _missing(refused):
            if not functions.refused(refused):
                raise refused
        else:
            try:
                yield ("FUNCTION LOAD", "REPLACE", library(call.sha, call.source))
            except ResponseError as denied:
                functions.refused(denied, loading=True)
            else:
                _loaded(sender)
                try:
                    return (yield first)
                except ResponseError as again:
                    if not _missing(again):  # else flushed since: EVAL below
                        raise
                return (yield ("EVAL", call.source, *script))
        try:
            return (yield ("EVALSHA", call.sha, *script))
        except NoScriptError:
            pass
    elif not isinstance(refused, NoScriptError):
        raise refused
    _loaded(sender)
    return (yield ("EVAL", call.source, *script))


def _answer(steps: Generator[Command, Any, Any], send: Callable[[Command], Any]) -> Any:
    """Send each command ``steps`` yields with ``send``; the reply ``steps`` returns."""
    try:
        command = next(steps)
        while True:
            try:
                reply = send(command)
            except ResponseError as exc:
                command = steps.throw(exc)
            else:
                command = steps.send(reply)
    except StopIteration as done:
        return done.value


def run_script(
    client: Any,
    call: ScriptCall,
    sender: type | None = None,
    functions: Functions | None = None,
    node: Callable[[], Any] | None = None,
) -> Any:
    """Send ``call`` through ``client``'s command path and return its reply untouched: one
    :func:`first_command`, and when the server refuses it, what :func:`answering` says (a
    function loaded, ``EVALSHA``, ``EVAL``). ``node`` names a cluster's primary of the call's
    slot, asked as each command is sent: the commands go to it by name (``RedisCluster``
    follows a ``MOVED`` reply as for any command; redis-py before 8 would ask a node
    ``COMMAND GETKEYS`` to route an ``FCALL``, a second round trip). Any failure raises what
    :func:`.scripts.failure` makes of it."""

    def send(command: Command) -> Any:
        if node is None:
            return client.execute_command(*command)
        return client.execute_command(*command, target_nodes=node())

    first = first_command(call, functions)
    try:
        try:
            return send(first)
        except ResponseError as refused:
            return _answer(answering(refused, first, call, sender, functions), send)
    except Exception as exc:
        raise failure(exc) from exc


async def arun_script(
    client: Any,
    call: ScriptCall,
    sender: type | None = None,
    functions: Functions | None = None,
    node: Callable[[], Any] | None = None,
) -> Any:
    """:func:`run_script` on a ``redis.asyncio`` client. On a cluster (``node``) the client is
    brought up to date first (``initialize()``, which does nothing unless a failure closed it
    since): redis-py's async cluster drops and rebuilds its nodes then, and a node asked of
    the slot map before that would be one it no longer closes."""

    async def send(command: Command) -> Any:
        if node is None:
            return await client.execute_command(*command)
        await client.initialize()
        return await client.execute_command(*command, target_nodes=node())

    first = first_command(call, functions)
    try:
        try:
            return await send(first)
        except ResponseError as refused:
            steps = answering(refused, first, call, sender, functions)
            try:
                command = next(steps)
                while True:
                    try:
                        reply = await send(command)
                    except ResponseError as exc:
                        command = steps.throw(exc)
                    else:
                        command = steps.send(reply)
            except StopIteration as done:
                return done.value
    except Exception as exc:
        raise failure(exc) from exc


def accepted_options(cls: Any) -> set[str]:
    """Keyword parameters of a class and its bases' ``__init__``."""
    inits = (vars(klass)["__init__"] for klass in cls.__mro__ if "__init__" in vars(klass))
    return {name for init in inits for name in inspect.signature(init).parameters}


def async_options(kwargs: dict[str, Any], cls: Any) -> dict[str, Any]:
    """Of a sync connection's ``kwargs``, those ``cls`` (a ``redis.asyncio`` connection or
    client class) takes, with retries off."""
    accepted = accepted_options(cls)
    options = {k: v for k, v in kwargs.items() if k in accepted and k not in _SYNC_ONLY}
    options["retry"] = AsyncRetry(NoBackoff(), 0)
    # CLIENT SETINFO reads package metadata on every new connection: skip it.
    if "driver_info" in accepted:  # redis-py 7.1+
        options["driver_info"] = None
    elif "lib_name" in accepted:
        options["lib_name"] = options["lib_version"] = None
    return options


def async_pool_factory(pool: Any) -> Callable[[], Any]:
    """How to make, on the running loop, a ``redis.asyncio`` pool like the sync ``pool``.

    A caller waits for a free connection without a time bound of its own: a thousand
    concurrent requests on one loop keep it busy longer than the sync pool's wait, which would
    fail them while Redis is healthy; each call holding a connection is bounded by the socket
    timeouts, so the wait is bounded too."""
    cls = _CLASSES.get(pool.connection_class.__name__, aio.Connection)
    kwargs = async_options(pool.connection_kwargs, cls)
    blocking = isinstance(pool, (redis.BlockingConnectionPool, SentinelConnectionPool))
    pool_class: Any = aio.BlockingConnectionPool if blocking else aio.ConnectionPool
    if isinstance(pool, SentinelConnectionPool):
        pool_class = partial(async_twin, pool)
    return partial(
        pool_class,
        connection_class=cls,
        max_connections=getattr(pool, "max_connections", None),
        **({"timeout": None} if blocking else {}),
        **kwargs,
    )


async def _close_with_loop(client: Any, forget: Callable[[], Any]) -> AsyncIterator[None]:
    """Close the client's connections when its loop shuts down: ``asyncio.run`` (and so
    Django's ``async_to_sync``, which runs an async view under WSGI in a loop of its own per
    request) finalizes async generators before closing the loop. ``forget`` then drops the
    client from its :class:`PerLoop`, whose entry (a task, which holds its loop) would keep
    the loop and the client alive for as long as the backend lives."""
    try:
        yield
    finally:
        forget()
        pool = getattr(client, "connection_pool", None)  # a cluster client has none
        with contextlib.suppress(Exception):
            if pool is not None:
                closer = getattr(pool, "disconnect_all", None)
                await (closer() if closer is not None else pool.disconnect())
        with contextlib.suppress(Exception):
            await (client.aclose() if hasattr(client, "aclose") else client.close())


class PerLoop:
    """One ``redis.asyncio`` client per running event loop, made by ``make`` (a coroutine
    function) on first use there, once however many calls ask at the same time; a forked
    child starts with none of its parent's."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[Any]] = (
            weakref.WeakKeyDictionary()
        )
        self._pid = os.getpid()

    async def client(self) -> Any:
        if self._pid != os.getpid():  # the parent's connections are not ours
            self._clients = weakref.WeakKeyDictionary()
            self._pid = os.getpid()
        loop = asyncio.get_running_loop()
        made = self._clients.get(loop)
        if made is None:
            made = self._clients[loop] = loop.create_task(self._made())
        try:
            # Shielded: one caller cancelled must not cancel the others' client.
            return (await asyncio.shield(made))[0]
        except Exception:
            if self._clients.get(loop) is made:
                del self._clients[loop]  # the next call tries again
            raise

    async def _made(self) -> tuple[Any, AsyncIterator[None]]:
        client = await self._make()
        loop = asyncio.get_running_loop()
        closer = _close_with_loop(client, partial(self._clients.pop, loop, None))
        await closer.__anext__()
        # The closer is kept with the client: collecting it early would close it.
        return client, closer


#: Every :class:`ThreadConnections` of this process, for a forked child to empty.
_THREAD_CONNECTIONS: weakref.WeakSet[ThreadConnections] = weakref.WeakSet()


@functools.cache
def _drop_after_fork() -> None:
    """Have a forked child forget the connections its parent's threads hold (once per
    process: the registration is inherited by the children)."""

    def forget() -> None:
        for connections in list(_THREAD_CONNECTIONS):
            connections.forget()

    os.register_at_fork(after_in_child=forget)


def connection_getter(pool: Any) -> Callable[[], Any]:
    """``pool.get_connection`` as a call without arguments: redis-py 5.3 made the command
    name optional (and warns when one is passed); before, it was required."""
    parameters = list(inspect.signature(pool.get_connection).parameters.values())
    if parameters and parameters[0].default is inspect.Parameter.empty:
        return partial(pool.get_connection, "EVALSHA")
    getter: Callable[[], Any] = pool.get_connection
    return getter


def _send_on(connection: Any, command: Command) -> Any:
    connection.send_command(*command)
    return connection.read_response()


def run_on(
    connection: Any,
    call: ScriptCall,
    sender: type | None = None,
    functions: Functions | None = None,
) -> Any:
    """:func:`run_script` on one connection of a redis-py pool, the command sent and its reply
    read by the connection's own ``send_command`` and ``read_response`` (what the client's
    command path does, without its per-command pool checkout). An error reply leaves the
    connection as it is; any other failure disconnects it (a timed-out call's late reply
    must never answer the next one)."""
    # first_command, inline: this is every sync decision's path on one server.
    if functions is not None and (functions.on or functions.due()):
        name = FUNCTION_PREFIX + call.sha[:FUNCTION_DIGITS]
        first: Command = ("FCALL", name, len(call.keys), *call.keys, *call.args)
    else:
        first = ("EVALSHA", call.sha, len(call.keys), *call.keys, *call.args)
    try:
        try:
            connection.send_command(*first)
            return connection.read_response()
        except ResponseError as refused:
            steps = answering(refused, first, call, sender, functions)
            return _answer(steps, partial(_send_on, connection))
    except ResponseError as exc:  # Redis answered: the connection is in step
        raise failure(exc) from exc
    except BaseException as exc:
        connection.disconnect()
        raise failure(exc) from exc


class _Held:
    """Stands for a thread's hold on a connection, in the thread's locals: collected with
    them when the thread ends, when the connection goes back to the pool."""

    __slots__ = ("__weakref__",)


class ThreadConnections:
    """One connection of ``pool`` held by each counting thread for its life, so a call skips
    the pool's checkout and return (:func:`run_on`); after a failed call it goes back to the
    pool (:meth:`drop`), so reconnecting is the pool's business, as for any client.

    At most half the pool's ``max_connections`` are held so (:meth:`get` answers ``None`` to
    the threads beyond, which count through the client and its pool): the rest serve the
    other threads and every other command (usage pushes, the admin's reads), and the pool
    keeps bounding the connections. A thread's connection goes back to the pool when the
    thread ends. A forked child starts with none (:meth:`forget`): the parent's sockets are
    not its own."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        most = getattr(pool, "max_connections", None)
        self.most = most // 2 if isinstance(most, int) else 0
        self._get = connection_getter(pool)
        self.forget()
        _THREAD_CONNECTIONS.add(self)
        _drop_after_fork()

    def forget(self) -> None:
        """Start afresh: no thread holds a connection."""
        #: ``connection``: this thread's connection; ``False`` when it counts through the pool.
        #: ``answered``: when it last answered (monotonic seconds; :meth:`OneServer.call`).
        self.mine = threading.local()
        self.held = 0
        self._lock = threading.Lock()

    def get(self) -> Any:
        """This thread's connection, taken from the pool on its first call; ``False`` once
        half the pool is held (for this thread's life: the pool is shared). Raise what the
        pool raises when no connection can be had (exhausted, server down): the call fails
        as it would through the client, and the next one tries again."""
        mine = self.mine
        with self._lock:
            if self.held >= self.most:
                mine.connection = False
                return False
            self.held += 1
        try:
            connection = self._get()
        except BaseException:
            with self._lock:
                self.held -= 1
            raise
        mine.answered = time.monotonic()  # the pool's checkout has just polled it
        mine.held = held = _Held()
        mine.release = weakref.finalize(held, self._released, self._lock, connection)
        mine.connection = connection
        return connection

    def drop(self) -> None:
        """Give this thread's connection back to the pool after a failed call: the next call
        takes one from the pool, whose checkout connects it as the client would (to the
        primary the sentinels name now, after a failover)."""
        mine = self.mine
        mine.connection = None
        release = getattr(mine, "release", None)
        if release is not None:
            release()

    def _released(self, lock: threading.Lock, connection: Any) -> None:
        """A thread holding ``connection`` ended (or :meth:`forget` dropped it)."""
        if lock is not self._lock:  # taken before forget(): in a forked child, the parent's
            with contextlib.suppress(Exception):
                connection.disconnect()  # closes this process's copy of the socket only
            return
        with lock:
            self.held -= 1
        with contextlib.suppress(Exception):
            self.pool.release(connection)


class OneServer:
    """The route of counting calls to one server (or a Sentinel-managed primary): every
    shard is on it. ``sender`` is the backend class :data:`~django_throttle.events.script_loaded`
    names. A sync call goes through the calling thread's own connection
    (:class:`ThreadConnections`) when ``client`` is a ``redis.Redis`` over a pool."""

    def __init__(self, client: redis.Redis, sender: type | None = None) -> None:
        self.client: Any = client
        self.sender = sender
        self.functions = Functions()
        self._threads = (
            ThreadConnections(client.connection_pool)
            if isinstance(client, redis.Redis) and client.connection is None
            else None
        )
        make_pool = async_pool_factory(client.connection_pool)

        async def make() -> Any:
            return AsyncRedis(connection_pool=make_pool())

        self._async = PerLoop(make)

    def call(self, call: ScriptCall) -> Any:
        threads = self._threads
        if threads is not None:
            mine = threads.mine
            connection = getattr(mine, "connection", None)
            stale = False
            now = time.monotonic()
            if connection is None:
                try:
                    connection = threads.get()
                except Exception as exc:
                    raise failure(exc) from exc
            elif connection and now - mine.answered >= POLL_IDLE_AFTER:
                # The check the pool's checkout makes of each connection it hands out, here
                # inline for a connection idle since its last answer: whether the server
                # closed it (or left unread bytes on it) meanwhile. The server's
                # ``timeout``, ``CLIENT KILL``, a restart or a failover close it between
                # two calls, and a call on it would fail though the server answers. One
                # non-blocking poll of the socket (:data:`POLL_IDLE_AFTER`: a busy thread
                # skips it).
                try:
                    stale = bool(connection.can_read())
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    stale = True
            if stale:
                # Back to the pool, whose checkout connects a fresh one (for a
                # Sentinel-managed pool, to the primary the sentinels name now: redis-py's
                # implicit reconnect on send would go back to the old address).
                connection.disconnect()
                threads.drop()
                try:
                    connection = threads.get()
                except Exception as exc:
                    raise failure(exc) from exc
            if connection:
                try:
                    answer = run_on(connection, call, self.sender, self.functions)
                except BaseException:
                    threads.drop()  # the next call takes one as the pool hands it out
                    raise
                mine.answered = now
                return answer
        return run_script(self.client, call, self.sender, self.functions)

    async def acall(self, call: ScriptCall) -> Any:
        try:
            client = await self._async.client()
        except Exception as exc:
            raise failure(exc) from exc
        return await arun_script(client, call, self.sender, self.functions)

    def evalsha_all(
        self, sha: str, source: str, calls: Sequence[Call], client: Any = None
    ) -> list[Any]:
        return evalsha_all(client or self.client, sha, source, calls)

    def patient_client(self, timeout: float) -> tuple[Any, bool]:
        return patient_client_like(self.client, timeout)

    def scanned_clients(self) -> list[redis.Redis]:
        """The clients whose keys together are every key: this one."""
        return [self.client]

    def by_slot(self, keys: list[Any]) -> list[list[Any]]:
        """``keys`` in groups a script call may take together: one."""
        return [keys]

    def close(self, client_too: bool) -> None:
        """Close the client's connections (only if the backend made the client)."""
        if client_too:
            self.client.connection_pool.disconnect()
        if self._threads is not None:
            self._threads.forget()


def patient_client_like(client: Any, timeout: float) -> tuple[Any, bool]:
    """A client like ``client`` (same server, credentials and pool class) whose reads may
    take ``timeout`` seconds (the backend's own times out in tens of milliseconds, right for
    a request and wrong for a report over many keys), and whether it is a new one to close.
    A client without such a pool is used as it is."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if pool is None or not isinstance(kwargs, dict):
        return client, False
    options = {**kwargs, "socket_timeout": timeout, "socket_connect_timeout": timeout}
    try:
        patient_pool = type(pool)(connection_class=pool.connection_class, **options)
        return type(client)(connection_pool=patient_pool), True
    except Exception:  # an unusual pool class: the backend's client still works
        return client, False
