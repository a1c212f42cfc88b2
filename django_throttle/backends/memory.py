"""In-process backend with the Redis backend's semantics, for development, tests and the
per-process fallback of failure mode ``"local"``, and the in-process Redis it counts in.

It is the Redis backend with its scripts run on a :class:`MemoryStore`
(:class:`InProcess`, the route it hands the backend) instead of a server: the same
keys, the same Lua scripts (run in this process on Redis's Lua), the same usage counts and
operator tools, so a process that falls back to memory makes the decisions Redis would have
made. State lives in this process only: use it with one process, or accept per-process limits.
It is thread-safe (a script runs under the store's lock) and takes an injectable ``clock`` so
tests can move time by hand. ``max_entries`` bounds memory: beyond it the least recently used
keys are forgotten (those clients start afresh).

:class:`MemoryStore` is the part of Redis the throttle uses, kept in this process: the
package's own Lua scripts run on Lua 5.1 (Redis's Lua, through ``lupa``) against the commands of
:mod:`.memory_commands`.

The memory backend counts with the very scripts Redis runs, so its decisions are Redis's by
construction rather than by a second implementation kept in step. The store answers
the redis-py client methods the backends and usage reports call (``get``, ``set``, ``delete``,
``scan``, ``time``, ``eval``/``evalsha``, ``pipeline`` and a few sorted-set commands), with
redis-py's reply shapes and error classes; :meth:`MemoryStore.execute_framed` takes a framed
command (the counting call's bytes). Each command, and each script as a whole, runs under one
lock: a script is atomic, as on Redis. Time is ``clock`` (Unix seconds): ``TIME`` and every
expiry read it, so a test can move it by hand. ``max_keys`` bounds memory: beyond it the least
recently used keys are dropped (Redis's ``allkeys-lru``). An expired key is gone when next
looked at, and all are swept every :data:`SWEEP_EVERY` commands.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from typing import Any

from lupa import lua51
from redis.exceptions import NoScriptError, ResponseError

from django_throttle.backends.memory_commands import OK, Keyspace, Status, encoded, readable
from django_throttle.backends.redis import RedisBackend
from django_throttle.backends.redis_nodes import ScriptCall, run_script
from django_throttle.backends.scripts import Call, evalsha_all
from django_throttle.backends.usage_store import RedisUsage

__all__ = ["MemoryBackend"]


class MemoryBackend(RedisBackend):
    """Counts in this process's memory, with the Redis backend's scripts.
    In-process under a short lock and never waiting on I/O, its async methods need no thread."""

    blocking = False

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        max_entries: int | None = None,
        shards: int | None = None,
    ) -> None:
        self.store = MemoryStore(clock, max_entries)
        super().__init__(shards=shards, route=InProcess(self.store, type(self)))

    @property
    def clock(self) -> Callable[[], float]:
        """The store's clock (Unix seconds): ``TIME`` and every expiry read it."""
        return self.store.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.store.clock = clock

    @property
    def max_entries(self) -> int | None:
        return self.store.max_keys

    def local_time(self) -> float:
        return self.store.clock()

    def __len__(self) -> int:
        """Keys held (counters and usage counts)."""
        return len(self.store)

    @cached_property
    def usage(self) -> RedisUsage:
        """This backend's usage counts, kept and read as on Redis."""
        return RedisUsage(self)


class InProcess:
    """The route of a backend's script calls to a :class:`MemoryStore`
    (a :class:`~.redis.Route`): every shard is in it, and every call runs there at once.

    The store answers the redis-py client methods the backend uses (``evalsha``, ``eval``,
    pipelines, ``GET``, ``SCAN``), so the calls go through :func:`.redis_nodes.run_script`
    as on a server: ``NOSCRIPT`` is answered with ``EVAL`` and tells
    :data:`~django_throttle.events.script_loaded` (``sender``), a script's error reply is
    what :func:`.scripts.failure` makes of it. A script runs under the store's lock and never
    waits on I/O, so :meth:`acall` runs it on the calling loop's thread."""

    def __init__(self, store: MemoryStore, sender: type | None = None) -> None:
        self.client: Any = store
        self.sender = sender

    def call(self, call: ScriptCall) -> Any:
        return run_script(self.client, call, self.sender)

    async def acall(self, call: ScriptCall) -> Any:
        return self.call(call)

    def evalsha_all(
        self, sha: str, source: str, calls: Sequence[Call], client: Any = None
    ) -> list[Any]:
        return evalsha_all(client or self.client, sha, source, calls)

    def patient_client(self, timeout: float) -> tuple[Any, bool]:
        """The store itself: no read of it waits on a socket."""
        return self.client, False

    def scanned_clients(self) -> list[Any]:
        """The store: it holds every key."""
        return [self.client]

    def by_slot(self, keys: list[Any]) -> list[list[Any]]:
        """``keys`` in one group: the store has no slots."""
        return [keys]

    def close(self, client_too: bool) -> None:
        """Nothing to close: the store is this process's memory."""


#: Commands between two sweeps of expired keys.
SWEEP_EVERY = 4096
#: What a script sees besides Lua's own libraries: the ``redis`` table (``call`` raises a
#: command's error, ``pcall`` returns it as ``{err = …}``) and Redis's ``struct``.
_PRELUDE = """
local run, pack, unpack = ...
struct = {pack = pack, unpack = unpack}
redis = {}
function redis.pcall(...) return run(...) end
function redis.call(...)
  local reply = run(...)
  if type(reply) == 'table' and reply.err then error(reply.err, 0) end
  return reply
end
function redis.error_reply(message) return {err = message} end
function redis.status_reply(message) return {ok = message} end
python = nil
-- Redis's globals are read-only and reading an undefined one is an error, not nil.
setmetatable(_G, {
  __newindex = function() error('Attempt to modify a readonly table', 2) end,
  __index = function(_, name)
    error("Script attempted to access nonexistent global variable '" .. tostring(name) .. "'", 2)
  end,
})
"""


class MemoryStore(Keyspace):
    """An in-process store answering the commands and scripts the throttle sends to Redis."""

    def __init__(self, clock: Callable[[], float] = time.time, max_keys: int | None = None):
        super().__init__(clock, max_keys)
        self._lock = threading.Lock()
        self._commands = itertools.count(1)
        self._lua = lua51.LuaRuntime(encoding=None, unpack_returned_tuples=True)
        self._lua.execute(_PRELUDE, self.script_call, _pack, _unpack)
        self._table = self._lua.table_from
        self._scripts: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.execute(b"KEYS", b"*"))

    # What redis-py's client offers (the part the throttle calls), in its reply shapes.
    def pipeline(self, transaction: bool = False) -> Pipeline:
        return Pipeline(self)

    def get(self, key: Any) -> Any:
        return self.execute(b"GET", key)

    def set(
        self, key: Any, value: Any, px: int | None = None, ex: int | None = None, nx: bool = False
    ) -> bool | None:
        options = (*((b"PX", px) if px else ()), *((b"EX", ex) if ex else ()), *((b"NX",) * nx))
        reply = self.execute(b"SET", key, value, *options)
        return True if reply is OK else None

    def delete(self, *keys: Any) -> int:
        return int(self.execute(b"DEL", *keys)) if keys else 0

    def incr(self, key: Any) -> int:
        return int(self.execute(b"INCRBY", key, 1))

    def expire(self, key: Any, seconds: int) -> bool:
        return bool(self.execute(b"EXPIRE", key, seconds))

    def pttl(self, key: Any) -> int:
        return int(self.execute(b"PTTL", key))

    def time(self) -> tuple[int, int]:
        seconds, micros = self.execute(b"TIME")
        return int(seconds), int(micros)

    def zadd(self, key: Any, mapping: dict[Any, float]) -> int:
        return int(self.execute(b"ZADD", key, *(x for item in mapping.items() for x in item[::-1])))

    def zrange(self, key: Any, start: int, end: int, withscores: bool = False) -> list[Any]:
        if not withscores:
            return list(self.execute(b"ZRANGE", key, start, end))
        return _pairs(self.execute(b"ZRANGE", key, start, end, b"WITHSCORES"))

    def zrangebyscore(self, key: Any, low: Any, high: Any, withscores: bool = False) -> list[Any]:
        if not withscores:
            return list(self.execute(b"ZRANGEBYSCORE", key, low, high))
        return _pairs(self.execute(b"ZRANGEBYSCORE", key, low, high, b"WITHSCORES"))

    def zremrangebyscore(self, key: Any, low: Any, high: Any) -> int:
        return int(self.execute(b"ZREMRANGEBYSCORE", key, low, high))

    def zmscore(self, key: Any, members: list[Any]) -> list[float | None]:
        return [None if s is None else float(s) for s in self.execute(b"ZMSCORE", key, *members)]

    def zpopmin(self, key: Any, count: int = 1) -> list[tuple[bytes, float]]:
        return _pairs(self.execute(b"ZPOPMIN", key, count))

    def scan(self, cursor: int = 0, match: str | None = None, count: int = 10) -> Any:
        """Every matching key in one step (next cursor 0: done)."""
        return 0, self.execute(b"KEYS", match or b"*")

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return self.execute(b"EVALSHA", sha, numkeys, *keys_and_args)

    def eval(self, source: str, numkeys: int, *keys_and_args: Any) -> Any:
        return self.execute(b"EVAL", source, numkeys, *keys_and_args)

    def close(self) -> None:
        """Nothing to close: the store is this process's memory."""

    def execute_framed(self, body: bytes) -> Any:
        """Run a command framed as RESP (an array of bulk strings, as a counting call is)."""
        return self.execute(*_unframe(body))

    def execute(self, name: Any, *args: Any) -> Any:
        """Run one command (a script as a whole) atomically. An error reply raises
        redis-py's :class:`~redis.exceptions.ResponseError` (``NoScriptError`` for a script
        digest the store has not seen)."""
        command = encoded(name).upper()
        args = tuple(arg if type(arg) is bytes else encoded(arg) for arg in args)
        with self._lock:
            self._now = round(self.clock() * 1e6) // 1000  # as Redis: whole µs, then ms
            if next(self._commands) % SWEEP_EVERY == 0:
                for key in [key for key, at in self._expires.items() if at < self._now]:
                    self._drop(key)
            if command in (b"EVAL", b"EVALSHA"):
                return self._script(command == b"EVAL", *args)
            reply = self.command(command, args)
        if isinstance(reply, ResponseError):
            raise _raised(str(reply))
        return reply

    def _script(self, source: bool, text: bytes, numkeys: bytes, *args: bytes) -> Any:
        sha = hashlib.sha1(text).hexdigest() if source else text.decode().lower()
        function = self._scripts.get(sha)
        if function is None:
            if not source:
                raise NoScriptError("No matching script. Please use EVAL.")
            # Redis too runs a script as the body of a function of its own (on its first line,
            # so errors name the script's own line numbers, as Redis's do).
            body = b"function(KEYS, ARGV) %s\nend" % text
            try:
                function = self._lua.eval(body, name="@user_script")
            except lua51.LuaSyntaxError as exc:
                raise _raised("ERR Error compiling script " + _lua_message(exc)) from None
            self._scripts[sha] = function
        keys = int(numkeys)
        try:
            reply = function(self._table(args[:keys]), self._table(args[keys:]))
        except lua51.LuaError as exc:  # a redis.call's error, or the script's own
            raise _raised(_lua_message(exc)) from None
        except Exception as exc:  # a Python error from within (struct): Redis replies an error
            raise _raised(f"ERR {type(exc).__name__}: {exc}") from None
        return _from_lua(reply)

    def script_call(self, *command: Any) -> Any:
        """A script's ``redis.call``: the reply as Redis hands it to Lua (nil is false, an
        array a table, a status ``{ok = …}``, an error ``{err = …}``). Whatever goes wrong
        is an error reply, never a Python exception through the script."""
        reply: Any
        if not command:
            reply = ResponseError(
                "ERR Please specify at least one argument for this redis lib call"
            )
        elif not all(type(arg) in (bytes, int, float) for arg in command):
            reply = ResponseError("ERR Lua redis lib command arguments must be strings or integers")
        else:
            name, *args = map(_script_arg, command)
            reply = self.command(name.upper(), tuple(args))
        if isinstance(reply, ResponseError):
            reply = ResponseError(_SCRIPT_ERRORS.get(str(reply).split("'")[0], str(reply)))
        if type(reply) is bytes or type(reply) is int:
            return reply
        if reply is None:
            return False
        if isinstance(reply, list):
            return self._table([False if item is None else item for item in reply])
        return self._table({b"err": str(reply).encode()} if reply is not OK else {b"ok": b"OK"})


class Pipeline:
    """Client calls queued, then run in order by :meth:`execute`, as redis-py's pipeline."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._queued: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Callable[..., Pipeline]:
        method = getattr(self._store, name)  # an unknown command fails as it is queued

        def queue(*args: Any, **kwargs: Any) -> Pipeline:
            self._queued.append((method, args, kwargs))
            return self

        return queue

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        replies: list[Any] = []
        for method, args, kwargs in self._queued:
            try:
                replies.append(method(*args, **kwargs))
            except ResponseError as exc:
                if raise_on_error:
                    raise
                replies.append(exc)
        self._queued = []
        return replies


#: Errors Redis words its own way when a script's ``redis.call`` makes them.
_SCRIPT_ERRORS = {
    "ERR unknown command ": "ERR Unknown Redis command called from script",
    "ERR wrong number of arguments for ": (
        "ERR Wrong number of args calling Redis command from script"
    ),
}


def _script_arg(value: bytes | float) -> bytes:
    """A ``redis.call`` argument as Redis sends it: a Lua number (lupa: ``int`` or ``float``)
    written ``%.17g`` (``2^62`` is ``4.6116860184273879e+18``, ``math.huge`` ``inf``)."""
    return value if isinstance(value, bytes) else b"%.17g" % value


def _lua_message(error: Exception) -> str:
    """A Lua error's message without the traceback lupa adds."""
    return str(error).split("\nstack traceback:", 1)[0]


def _raised(message: str) -> ResponseError:
    """An error reply as redis-py raises it (``ERR`` is left out of the message)."""
    return ResponseError(message[4:] if message.startswith("ERR ") else message)


def _pairs(reply: list[bytes]) -> list[tuple[bytes, float]]:
    """A flat member/score reply as redis-py's ``withscores`` lists it."""
    return [(member, float(score)) for member, score in zip(reply[0::2], reply[1::2], strict=True)]


def _from_lua(value: Any, top: bool = True) -> Any:
    """A script's return value as Redis replies with it: a number truncated to an integer,
    false nil, true 1, a table an array (up to its first nil) or its ``err``/``ok``: an error
    raised, or within an array an error element."""
    if value is None or value is False:
        return None
    if value is True or isinstance(value, float):
        return int(value) if -(2**63) <= value < 2**63 else -(2**63)  # C's cast, as on x86
    if lua51.lua_type(value) != "table":
        return value
    if value[b"err"] is not None:
        error = _raised(readable(value[b"err"]))
        if top:
            raise error
        return error
    if value[b"ok"] is not None:
        return Status(value[b"ok"])
    items = itertools.takewhile(
        lambda item: item is not None, map(value.__getitem__, itertools.count(1))
    )
    return [_from_lua(item, False) for item in items]


#: Redis's Lua ``struct`` formats the scripts use, as Python's.
_STRUCT = {b"d": "d", b"I4": "I", b"I2": "H", b"i4": "i", b"i2": "h"}


def _struct_format(format: bytes) -> tuple[str, list[str]]:
    order = {b">": ">", b"<": "<", b"!": "="}.get(format[:1], "")
    codes = re.findall(rb"[a-zA-Z]\d*", format[1:] if order else format)
    return order or "=", [_STRUCT[code] for code in codes]


def _pack(format: bytes, *values: Any) -> bytes:
    """Redis's ``struct.pack`` for :data:`_STRUCT`'s formats (integers cut as C casts them)."""
    order, codes = _struct_format(format)
    whole = [
        value if code == "d" else int(value) & (1 << 8 * struct.calcsize(code)) - 1
        for code, value in zip(codes, values, strict=True)
    ]
    return struct.pack(order + "".join(codes), *whole)


def _unpack(format: bytes, data: bytes, position: int = 1) -> tuple[Any, ...]:
    """Redis's ``struct.unpack``: the values, then the position after them."""
    order, codes = _struct_format(format)
    layout, start = order + "".join(codes), int(position) - 1
    return (*struct.unpack_from(layout, data, start), start + struct.calcsize(layout) + 1)


def _unframe(body: bytes) -> Iterator[bytes]:
    """The bulk strings of a RESP array."""
    at = body.index(b"\r\n") + 2
    for _ in range(int(body[1 : at - 2])):
        end = body.index(b"\r\n", at)
        size = int(body[at + 1 : end])
        yield body[end + 2 : end + 2 + size]
        at = end + 4 + size
