"""The bytes of one counting call and the connections they travel on.

A decision is one ``EVALSHA`` whose constant parts (script digest, limit specs) are framed once
per limit list and reused, so a request only frames its keys, cost, usage field and client.
The framed command goes out on a pooled connection through redis-py's public connection API
(``send_packed_command`` / ``read_response``), skipping only its per-command argument encoding
and response callbacks. :class:`Connections` sends it from sync code; :mod:`.redis_async`
from ``async def`` code, with the same frames, the same NOSCRIPT answer and the same error
mapping (:func:`failure`). Everything else (policy version, retime, usage reports) goes through
the ordinary redis-py client.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from django_throttle.backends.base import (
    ALGORITHM_CODES,
    DIGEST_SIZE,
    ArgumentRefused,
    BackendError,
    LimitsCache,
    per_shard,
)
from django_throttle.calendar import windows
from django_throttle.rates import Algorithm, Limit

#: ``Encoded.valid_until`` of a limit list without calendar quotas (compared by identity).
FOREVER = math.inf
#: Characters of the client digest in a key (base64url of DIGEST_SIZE bytes).
DIGEST_KEY_CHARS = 4 * DIGEST_SIZE // 3
#: What stands in a shared limit's key for the client digest (never a base64url character).
SHARED_MARK = b"*"


def frame(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def compact(n: int) -> str:
    """A whole number in its shortest form Lua's ``tonumber`` reads exactly: trailing zeros
    as an exponent when that is shorter (3600000 as ``36e5``). Round rates give round
    intervals, and the spec crosses the wire on every decision."""
    text = str(n)
    digits = text.rstrip("0")
    zeros = len(text) - len(digits)
    return f"{digits}e{zeros}" if zeros >= 3 and digits else text


def limit_spec(limit: Limit, now_us: int | None = None) -> str:
    """``<code>[!]<capacity>:<parameters>``, ``!`` for a shadow limit: the interval in
    microseconds per token (token and leaky bucket, a float; GCRA, whole), the period in whole
    microseconds (windows), or a calendar quota's four window boundaries around ``now_us``
    (Unix microseconds, default now). Whole numbers are written :func:`compact`."""
    code = ALGORITHM_CODES[limit.algorithm]
    if code in "tl":
        interval = limit.interval_us
        text = compact(int(interval)) if interval.is_integer() else repr(interval)
    elif code == "g":
        text = compact(limit.emission_us)
    elif code == "c":
        when = round(time.time() * 1e6) if now_us is None else now_us
        text = ":".join(map(str, windows(limit.calendar_unit, limit.timezone, when)))
    else:
        text = compact(limit.period_us)
    return f"{code}{'!' if limit.shadow else ''}{limit.burst}:{text}"


def key_suffix(limit: Limit) -> str:
    """What follows the client digest in a limit's key: ``<code letter><id>``. The digest has
    a fixed length, so keys never collide, and a limit whose algorithm changes starts afresh."""
    return ALGORITHM_CODES[limit.algorithm] + limit.id


@dataclass(frozen=True, slots=True)
class Encoded:
    """What one limit list adds to every call: key suffixes and the framed tail of specs.

    ``valid_until`` (Unix seconds) is when a calendar quota's window ends and the specs must
    be encoded again; :data:`FOREVER` when the list has none. ``shared`` marks the shared
    limits (empty when there are none, the usual case): their keys carry the shard's tag and
    :data:`SHARED_MARK` instead of the client's tag. ``source`` is the script's source, the
    one object every list of that mix of algorithms shares (only an EVAL, after NOSCRIPT,
    frames it): an entry costs a few hundred bytes, not a copy of the script.
    """

    suffixes: tuple[bytes, ...]
    evalsha_head: bytes
    tail: bytes
    source: bytes
    valid_until: float = FOREVER
    shared: tuple[bool, ...] = ()

    @property
    def eval_head(self) -> bytes:
        """The head of the EVAL twin of the call, framing the script's source."""
        count = len(self.suffixes)
        return (
            b"*%d\r\n$4\r\nEVAL\r\n" % (4 + 2 * count)
            + frame(self.source)
            + frame(str(count).encode())
        )


class Calls:
    """Frames calls of one script; limit lists are encoded once and cached by the limits they
    hold (:class:`~.base.LimitsCache`: a list built per request from the policy's limits
    finds its entry).

    ``source_for(codes)`` gives the script's source defining just the algorithms of those
    spec codes: each distinct mix of algorithms is its own script (its own digest), and most
    policies use one or two mixes. ``shards`` splits a shared limit's capacity (see
    :func:`~.base.per_shard`).
    """

    def __init__(self, source_for: Callable[[frozenset[str]], str], shards: int = 1) -> None:
        self.source_for = source_for
        self.shards = shards
        self._cache: LimitsCache[Encoded] = LimitsCache()
        self._fields: dict[str, bytes] = {}
        self._scripts: dict[frozenset[str], tuple[bytes, bytes]] = {}

    def script(self, limits: Sequence[Limit]) -> tuple[bytes, bytes]:
        """The digest and source of the script for ``limits``' mix of algorithms."""
        codes = frozenset(ALGORITHM_CODES[limit.algorithm] for limit in limits)
        found = self._scripts.get(codes)
        if found is None:
            source = self.source_for(codes).encode()
            found = self._scripts[codes] = (hashlib.sha1(source).hexdigest().encode(), source)
        return found

    def encoded(self, limits: Sequence[Limit], now_us: int | None = None) -> Encoded:
        """The list's encoding, cached. One with calendar quotas is made again once its
        window has passed, and for a test's ``now_us`` (then not cached: real time keeps its
        own)."""
        found = self._cache.get(limits)
        if found is not None:
            if found.valid_until is FOREVER:
                return found
            if now_us is None and time.time() < found.valid_until:
                return found
        encoded = self._encode(limits, now_us)
        if now_us is None or encoded.valid_until is FOREVER:
            self._cache.put(limits, encoded)
        return encoded

    def _encode(self, limits: Sequence[Limit], now_us: int | None) -> Encoded:
        if now_us is None:
            now_us = round(time.time() * 1e6)
        until = FOREVER
        for limit in limits:
            if limit.algorithm == Algorithm.CALENDAR:
                ends = windows(limit.calendar_unit, limit.timezone, now_us)[2] / 1e6
                until = min(until, ends)
        count = len(limits)
        rest = b"%s" % frame(str(count).encode())
        elements = b"*%d\r\n" % (4 + 2 * count)
        shared = tuple(limit.shared for limit in limits)
        sha, source = self.script(limits)
        return Encoded(
            suffixes=tuple(key_suffix(limit).encode() for limit in limits),
            evalsha_head=elements + b"$7\r\nEVALSHA\r\n" + frame(sha) + rest,
            source=source,
            tail=b"".join(
                frame(limit_spec(per_shard(limit, self.shards), now_us).encode())
                for limit in limits
            ),
            valid_until=until,
            shared=shared if any(shared) else (),
        )

    @staticmethod
    def op(cost: int | None, now_us: int | None, peek: bool = False) -> bytes:
        """The cost (1, the usual cost, is sent as nothing), or for a peek ``p`` and the cost
        it asks about (``None`` or 0: none); ``@now`` in tests."""
        if peek or cost is None:
            text = b"p" + str(cost).encode() if cost else b"p"
        else:
            text = b"" if cost == 1 and type(cost) is int else str(cost).encode()
        return text if now_us is None else b"%s@%d" % (text, now_us)

    def field(self, field: str | None) -> bytes:
        """``\n<field>\n`` to put between the op and the client, ``b""`` for none."""
        if not field:
            return b""
        framed = self._fields.get(field)
        if framed is None:
            if len(self._fields) >= 4096:
                self._fields.clear()
            framed = self._fields[field] = b"\n" + field.replace("\n", " ").encode() + b"\n"
        return framed

    @staticmethod
    def body(
        encoded: Encoded, tag: bytes, op: bytes, field: bytes, client: bytes, evalsha: bool = True
    ) -> bytes:
        """The whole command: head, one key per limit (``tag + suffix``), ARGV[1] (op, and
        with a usage field the field and the client), specs."""
        head = encoded.evalsha_head if evalsha else encoded.eval_head
        if encoded.shared:
            shard = tag[:-DIGEST_KEY_CHARS] + SHARED_MARK
            keys = b"".join(
                frame((shard if shared else tag) + suffix)
                for suffix, shared in zip(encoded.suffixes, encoded.shared, strict=True)
            )
        else:
            keys = b"".join(
                b"$%d\r\n%s%s\r\n" % (len(tag) + len(suffix), tag, suffix)
                for suffix in encoded.suffixes
            )
        first = op + field + client.replace(b"\n", b" ") if field else op
        return b"".join((head, keys, frame(first), encoded.tail))


#: How the scripts' own error replies begin (``fail`` in lua/prelude.lua).
SCRIPT_ERROR_PREFIX = "django_throttle:"


def failure(exc: BaseException) -> BackendError:
    """What a counting call's exception means to the request path: an error reply of our
    own script (it refused an argument we sent, and wrote nothing) is
    :class:`~.base.ArgumentRefused`; anything else out of redis-py, the socket or a garbled
    reply is a :class:`~.base.BackendError`, an outage the breaker counts."""
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ResponseError):
        text = str(exc)
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
    may still hold the reply, which would answer the next call). Thread safe; a forked child
    starts with none of its parent's connections.
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._make = partial(pool.connection_class, **pool.connection_kwargs)
        self._room = int(getattr(pool, "max_connections", 0) or 2**31)
        #: How long a caller waits for a connection when all are in use (None: as long as it
        #: takes), as the client's BlockingConnectionPool would; 0 for a plain pool.
        self._patience: float | None = getattr(pool, "timeout", 0)
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

    def _take(self) -> Any:
        try:
            conn = self._idle.pop()
        except IndexError:
            return self._take_slowly()
        return conn

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

    def call(self, body: bytes, fallback: Callable[[], bytes]) -> Any:
        """Send ``body`` and return its reply (bytes, undecoded); on NOSCRIPT (nothing ran)
        send ``fallback()`` on the same connection. Any failure raises what :func:`failure`
        makes of it."""
        try:
            conn = self._take()
            try:
                try:
                    conn.send_packed_command((body,), False)
                    return conn.read_response(disable_decoding=True)
                except NoScriptError:
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


def _call_if_alive(method: weakref.WeakMethod[Callable[[], None]]) -> None:
    bound = method()
    if bound is not None:
        bound()
