"""The connections a counting call travels on, from sync code, made like a client's
(:mod:`.redis_clients` builds the clients).

A counting call, framed once (:mod:`.frames`), goes out on a pooled connection through
redis-py's public connection API (``send_packed_command`` / ``read_response``), skipping only
its per-command argument encoding and response callbacks. :class:`Connections` sends it from
sync code; :mod:`.redis_async` from ``async def`` code, with the same frames, the same
NOSCRIPT answer and the same error mapping (:func:`failure`). Everything else (policy
version, retime, usage reports) goes through the ordinary redis-py client.
"""

from __future__ import annotations

import inspect
import os
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

from redis.exceptions import AskError, MovedError, NoScriptError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.sentinel import SentinelConnectionPool

from django_throttle.backends.base import ArgumentRefused, BackendError

#: How the scripts' own error replies begin (``fail`` in lua/prelude.lua).
SCRIPT_ERROR_PREFIX = "django_throttle:"
#: The frame sent before a call to the node a Redis Cluster ``ASK`` reply named.
ASKING = b"*1\r\n$6\r\nASKING\r\n"


class Redirected(BackendError):
    """A Redis Cluster node answered ``MOVED`` or ``ASK``: the call did not run there, and
    ``host``:``port`` owns its slot now (``ask``: only for this call, while the slot
    migrates). :mod:`.redis_cluster` follows it once; anywhere else it is an outage."""

    def __init__(self, message: str, host: str, port: int, ask: bool) -> None:
        super().__init__(message)
        self.host, self.port, self.ask = host, int(port), ask


class Unsettled(BackendError):
    """A Redis Cluster node answered ``TRYAGAIN``: the call's slot is migrating and its keys
    are not all on one side, so nothing ran. The request takes its failure mode (the node
    is healthy: its breaker does not count it)."""


def failure(exc: BaseException) -> BackendError:
    """What a counting call's exception means to the request path: an error reply of our
    own script (it refused an argument we sent, and wrote nothing) is
    :class:`~.base.ArgumentRefused`; anything else out of redis-py, the socket or a garbled
    reply is a :class:`~.base.BackendError`, an outage the breaker counts."""
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (MovedError, AskError)):
        return Redirected(message, exc.host, exc.port, isinstance(exc, AskError))
    if isinstance(exc, TryAgainError):
        return Unsettled(message)
    if isinstance(exc, ResponseError):
        text = str(exc)
        # A parser without the cluster's error classes (redis-py 5.0's asyncio connections)
        # leaves "ASK <slot> <host>:<port>", "MOVED …" and "TRYAGAIN …" as plain errors.
        code, _, rest = text.partition(" ")
        if code in ("ASK", "MOVED") and ":" in rest:
            host, _, port = rest.partition(" ")[2].rpartition(":")
            if host and port.isdigit():
                return Redirected(message, host, int(port), code == "ASK")
        if code == "TRYAGAIN":
            return Unsettled(message)
        if text.startswith("ERR "):  # servers that prefix an error code of their own
            text = text[4:]
        if text.startswith(SCRIPT_ERROR_PREFIX):
            return ArgumentRefused(message)
    return BackendError(message)


def connection_getter(pool: Any) -> Callable[[], Any]:
    """``pool.get_connection`` as a call without arguments. redis-py 5.3 made the command
    name optional (and warns when one is passed); before, it was required. Works for the
    sync and the asyncio pools alike."""
    parameters = list(inspect.signature(pool.get_connection).parameters.values())
    if parameters and parameters[0].default is inspect.Parameter.empty:
        return partial(pool.get_connection, "EVALSHA")
    getter: Callable[[], Any] = pool.get_connection
    return getter


class Connections:
    """Sends counting calls through redis-py's public connection API (``send_packed_command``
    / ``read_response``) on connections of their own, made as the client's pool makes its
    connections (``pool.connection_class(**pool.connection_kwargs)``: the same server, TLS,
    credentials and timeouts) and kept in a pool of ours: a LIFO of idle connections, at most
    ``pool.max_connections`` of them in use at once, a caller waiting up to the client pool's
    ``timeout`` for one beyond that.

    Counting never takes the client's own connections, so no burst of requests can starve the
    client's other commands (policy versions, admin edits reaching other workers, resets,
    usage pushes); and taking or giving back one of ours is a list pop and append, where the
    client pool's checkout would cost a third of the counting call. A connection always goes
    back; one that raised anything but a server error reply is disconnected first (its stream
    may still hold the reply, which would answer the next call). On a Sentinel pool
    (:mod:`.redis_sentinel`) a connection is connected before each call by its own
    ``connect`` (which asks the sentinels), and dropped first if it is on a former primary.
    Thread safe; a forked child starts with none of its parent's connections.
    """

    def __init__(self, pool: Any, patience: float | None = None) -> None:
        self.pool = pool
        self._make = partial(pool.connection_class, **pool.connection_kwargs)
        self._room = int(getattr(pool, "max_connections", 0) or 2**31)
        #: How long a caller waits for a connection when all are in use (None: as long as it
        #: takes): ``patience`` if given, else as the client's BlockingConnectionPool would
        #: (its ``timeout``); 0 for a plain pool.
        self._patience: float | None = (
            patience if patience is not None else getattr(pool, "timeout", 0)
        )
        #: A Sentinel pool's ``owns_connection`` (False for a connection to a former
        #: primary); None for a pool of one server, whose connections are always its own.
        self._owns: Callable[[Any], bool] | None = (
            pool.owns_connection if isinstance(pool, SentinelConnectionPool) else None
        )
        self._forget()
        forget = weakref.WeakMethod(self._forget)
        os.register_at_fork(after_in_child=lambda: _call_if_alive(forget))

    def _forget(self) -> None:
        """Start with no connections (at creation, and in a forked child: the parent's
        sockets are not the child's to use)."""
        self._idle: list[Any] = []
        self._made = 0
        self._waiting = 0
        self._freed = threading.Condition(threading.Lock())

    def _take_slowly(self) -> Any:
        """No idle connection: make one while fewer than ``max_connections`` exist, else wait
        for one to come back. The waiter is counted before it looks, so a connection given
        back meanwhile is either seen or announced."""
        with self._freed:
            self._waiting += 1
            try:
                deadline = None if self._patience is None else time.monotonic() + self._patience
                while not self._idle:
                    if self._made < self._room:
                        self._made += 1
                        break
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise RedisConnectionError("No connection available.")
                    self._freed.wait(left)
                else:
                    return self._idle.pop()
            finally:
                self._waiting -= 1
        try:
            return self._make()
        except BaseException:
            with self._freed:
                self._made -= 1
            raise

    def _give(self, conn: Any) -> None:
        self._idle.append(conn)
        if self._waiting:
            with self._freed:
                self._freed.notify()

    def call(self, body: bytes, fallback: Callable[[], bytes], asking: bool = False) -> Any:
        """Send ``body`` and return its reply (bytes, undecoded); on NOSCRIPT (nothing ran)
        send ``fallback()`` on the same connection. ``asking``: each goes out behind an
        ``ASKING`` in the same write (a Cluster ``ASK`` redirection). Any failure raises what
        :func:`failure` makes of it."""
        try:
            try:
                conn = self._idle.pop()
            except IndexError:
                conn = self._take_slowly()
            try:
                if self._owns is not None:
                    _to_primary(conn, self._owns)
                try:
                    if asking:
                        return _asking(conn, body)
                    conn.send_packed_command((body,), False)
                    return conn.read_response(disable_decoding=True)
                except NoScriptError:
                    if asking:
                        return _asking(conn, fallback())
                    conn.send_packed_command((fallback(),), False)
                    return conn.read_response(disable_decoding=True)
            except ResponseError:
                raise  # the error reply was read: the stream is in step
            except BaseException:
                conn.disconnect()
                raise
            finally:
                self._give(conn)
        except Exception as exc:
            raise failure(exc) from exc

    def disconnect(self) -> None:
        """Close the idle connections; one in use still goes back, and reconnects when used
        again."""
        with self._freed:
            idle, self._idle = self._idle, []
            self._made -= len(idle)
        for conn in idle:
            conn.disconnect()


def _asking(conn: Any, body: bytes) -> Any:
    """``ASKING`` and ``body`` in one write, and the reply to ``body``."""
    conn.send_packed_command((ASKING, body), False)
    try:
        conn.read_response()  # OK
    except ResponseError:
        conn.read_response(disable_decoding=True)  # the call's own reply: keep the stream in step
        raise
    return conn.read_response(disable_decoding=True)


def _to_primary(conn: Any, owns: Callable[[Any], bool]) -> None:
    """Connect a Sentinel-managed connection to the primary the sentinels name (``owns``: its
    pool's ``owns_connection``), disconnecting it first from a former primary. Explicitly, by
    its own ``connect``, which asks the sentinels: redis-py 8's ``send_packed_command``
    connects an unconnected one as a plain ``Connection``, to its default address."""
    if not owns(conn):
        conn.disconnect()
    conn.connect()


def _call_if_alive(method: weakref.WeakMethod[Callable[[], None]]) -> None:
    bound = method()
    if bound is not None:
        bound()
