"""The bytes of one counting call and the connections they travel on.

A decision is one ``EVALSHA`` whose constant parts (script digest, limit specs) are framed once
per limit list and reused, so a request only frames its keys, cost, usage field and client.
It is sent on a connection taken from a per-process stack without redis-py's per-command work
(pool bookkeeping, argument encoding, response callbacks): those cost more than the Lua script
itself. Everything else (policy version, retime, usage reports) goes through the ordinary
redis-py client.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError

try:
    from redis._parsers.base import BaseParser
except ImportError:  # pragma: no cover - older or newer layouts of redis-py

    class BaseParser:  # type: ignore[no-redef]
        @staticmethod
        def parse_error(message: str) -> ResponseError:
            return ResponseError(message)


from django_throttle.backends.base import (
    DIGEST_SIZE,
    ArgumentRefused,
    BackendError,
    LimitsCache,
    per_shard,
)
from django_throttle.calendar import windows
from django_throttle.rates import Algorithm, Limit

__all__ = [
    "ALGORITHM_CODES",
    "FOREVER",
    "Calls",
    "Encoded",
    "Stack",
    "failure",
    "frame",
    "key_suffix",
    "limit_spec",
]

#: Each algorithm's code in a limit spec and its keys (see lua/prelude.lua ``limit_spec``).
ALGORITHM_CODES = {
    Algorithm.TOKEN_BUCKET: "t",
    Algorithm.GCRA: "g",
    Algorithm.LEAKY_BUCKET: "l",
    Algorithm.FIXED_WINDOW: "f",
    Algorithm.SLIDING_LOG: "w",
    Algorithm.SLIDING_COUNTER: "s",
    Algorithm.CALENDAR: "c",
}
#: ``Encoded.valid_until`` of a limit list without calendar quotas (compared by identity).
FOREVER = math.inf
#: A pooled connection idle longer than this is checked before use: the server may have
#: closed it, and a command sent on it would fail a request for nothing.
IDLE_CHECK_SECONDS = 1.0
#: Bytes asked of one recv: a decision's reply is a few dozen.
RECV_SIZE = 4096
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
            if not cost:
                text = b"p"
            else:
                text = b"p%d" % cost if type(cost) is int else b"p" + str(cost).encode()
        elif cost == 1 and type(cost) is int:
            text = b""
        else:
            text = b"%d" % cost if type(cost) is int else str(cost).encode()
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


def parse_error(message: bytes) -> ResponseError:
    """An error reply as redis-py's own exception: NOSCRIPT, OOM, READONLY, CLUSTERDOWN,
    LOADING, ... each get their class."""
    error: ResponseError = BaseParser.parse_error(message.decode(errors="replace"))  # type: ignore[no-untyped-call]
    return error


def read_bulk(sock: Any) -> bytes:
    """One reply that must be a bulk string (``$<n>\\r\\n<bytes>\\r\\n``) or an error
    (``-...``, raised as redis-py's ``ResponseError`` / ``NoScriptError``). Anything else, or
    bytes beyond the reply, means the stream is out of step: raise, and the caller closes the
    connection."""
    data = sock.recv(RECV_SIZE)
    while True:
        if not data:
            raise RedisConnectionError("Connection closed by server.")
        end = data.find(b"\r\n")
        if end >= 0:
            break
        data += sock.recv(RECV_SIZE)
    kind, head, rest = data[:1], data[1:end], data[end + 2 :]
    if kind == b"$":
        size = int(head)
        while len(rest) < size + 2:
            more = sock.recv(RECV_SIZE)
            if not more:
                raise RedisConnectionError("Connection closed by server.")
            rest += more
        if size < 0 or len(rest) != size + 2 or rest[size:] != b"\r\n":
            raise InvalidResponse(f"unexpected reply {data[:80]!r}")
        reply: bytes = rest[:size]
        return reply
    if kind == b"-" and not rest:
        raise parse_error(head)
    raise InvalidResponse(f"unexpected reply {data[:80]!r}")


class Stack:
    """This process's connections for counting calls: last in, first out, no lock on the fast
    path (list pop and append are atomic). Connections are checked out of the client's pool
    once and kept, so the pool's ``max_connections`` and wait ``timeout`` still bound them;
    none is used across a fork.

    A connection that raised anything but a server error reply is closed and handed back to
    the pool: its stream may hold a late reply that would answer the next request.
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._idle: list[tuple[Any, float]] = []
        self._pid = os.getpid()

    def call(self, command: bytes) -> bytes:
        """Send one packed command and read its bulk-string reply straight off the socket
        (server error replies raise ``ResponseError`` and keep the connection)."""
        conn = self._take()
        try:
            sock = conn._sock
            if sock is None:
                conn.connect()  # handshake (AUTH, SELECT, ...) through redis-py
                sock = conn._sock
            sock.sendall(command)
            reply = read_bulk(sock)
        except ResponseError:
            self._idle.append((conn, time.monotonic()))
            raise
        except BaseException:
            self._discard(conn)
            raise
        self._idle.append((conn, time.monotonic()))
        return reply

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            self._discard(conn)

    def _take(self) -> Any:
        if self._pid != os.getpid():
            # The parent's sockets are not ours: forget them without closing them.
            self._idle = []
            self._pid = os.getpid()
        try:
            conn, since = self._idle.pop()
        except IndexError:
            return self.pool.get_connection()
        if time.monotonic() - since > IDLE_CHECK_SECONDS:
            self._check(conn)
        return conn

    @staticmethod
    def _check(conn: Any) -> None:
        """Drop the socket of an idle connection the server closed (reconnects on send)."""
        try:
            if conn._sock is not None and conn.can_read(timeout=0):
                conn.disconnect()
        except Exception:
            conn.disconnect()

    def _discard(self, conn: Any) -> None:
        try:
            conn.disconnect()
        finally:
            self.pool.release(conn)
