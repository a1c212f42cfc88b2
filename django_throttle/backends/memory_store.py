"""The part of Redis the throttle uses, kept in this process: strings, hashes and sorted sets
with millisecond expiries, and the package's own Lua scripts run on Lua 5.1 (Redis's Lua,
through ``lupa``).

The memory backend counts with the very scripts Redis runs, so its decisions are Redis's by
construction rather than by a second implementation kept in step. :class:`MemoryStore` answers
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

import bisect
import hashlib
import itertools
import re
import struct
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from functools import partial
from operator import itemgetter
from typing import Any

from lupa import lua51
from redis.exceptions import NoScriptError, ResponseError

__all__ = ["MemoryStore"]

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
"""
_WRONG_TYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
_ZADD_FLAGS = frozenset((b"NX", b"XX", b"GT", b"LT", b"CH", b"INCR"))
_score_of = itemgetter(0)


class Status(bytes):
    """A status reply (``+OK``), which a script sees as ``{ok = …}``."""


OK = Status(b"OK")


class SortedSet:
    """Members by score, and (score, member) pairs in Redis's order for ranges."""

    __slots__ = ("order", "scores")

    def __init__(self) -> None:
        self.scores: dict[bytes, float] = {}
        self.order: list[tuple[float, bytes]] = []

    def add(self, member: bytes, score: float) -> None:
        self.remove(member)
        self.scores[member] = score
        bisect.insort(self.order, (score, member))

    def remove(self, member: bytes) -> bool:
        score = self.scores.pop(member, None)
        if score is not None:
            del self.order[bisect.bisect_left(self.order, (score, member))]
        return score is not None

    def between(self, low: Any, high: Any) -> list[tuple[float, bytes]]:
        """The pairs within ``ZRANGEBYSCORE`` bounds (``(`` excludes, ``-inf``/``+inf``)."""
        (lo, lo_open), (hi, hi_open) = _bound(low), _bound(high)
        first = (bisect.bisect_right if lo_open else bisect.bisect_left)(
            self.order, lo, key=_score_of
        )
        last = (bisect.bisect_left if hi_open else bisect.bisect_right)(
            self.order, hi, key=_score_of
        )
        return self.order[first:last]

    def ranks(self, start: Any, stop: Any, reverse: bool = False) -> list[tuple[float, bytes]]:
        """The pairs from rank ``start`` to ``stop`` included (negative: from the end),
        ``reverse`` counting from the highest score."""
        size, first, last = len(self.order), int(start), int(stop)
        first, last = (
            max(first + size if first < 0 else first, 0),
            last + size if last < 0 else last,
        )
        order = self.order[::-1] if reverse else self.order
        return order[first : last + 1]


class MemoryStore:
    """An in-process store answering the commands and scripts the throttle sends to Redis."""

    def __init__(self, clock: Callable[[], float] = time.time, max_keys: int | None = None):
        if max_keys is not None and max_keys < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_keys}")
        self.clock = clock
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._data: OrderedDict[bytes, Any] = OrderedDict()
        self._expires: dict[bytes, int] = {}
        self._commands = itertools.count(1)
        #: The millisecond the running command (or script) sees: read once per command.
        self._now = 0
        self._lua = lua51.LuaRuntime(encoding=None, unpack_returned_tuples=True)
        # Lua holds the store only weakly: a reference cycle through the Lua state is one
        # Python's collector cannot see, and would keep every dropped store alive.
        self._lua.execute(_PRELUDE, partial(_script_call, weakref.ref(self)), _pack, _unpack)
        self._table = self._lua.table_from
        self._scripts: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.execute(b"KEYS", b"*"))

    # What redis-py's client offers (the part the throttle calls), in its reply shapes.
    def pipeline(self, transaction: bool = False) -> Pipeline:
        return Pipeline(self)

    def get(self, key: Any) -> Any:
        return self.execute(b"GET", key)

    def set(self, key: Any, value: Any, px: int | None = None) -> bool:
        return self.execute(b"SET", key, value, *((b"PX", px) if px else ())) is OK

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
        command = _b(name).upper()
        args = tuple(arg if type(arg) is bytes else _b(arg) for arg in args)
        with self._lock:
            self._now = round(self.clock() * 1e6) // 1000  # as Redis: whole µs, then ms
            if next(self._commands) % SWEEP_EVERY == 0:
                for key in [key for key, at in self._expires.items() if at < self._now]:
                    self._drop(key)
            if command in (b"EVAL", b"EVALSHA"):
                return self._script(command == b"EVAL", *args)
            reply = self._command(command, args)
        if isinstance(reply, ResponseError):
            raise _raised(str(reply))
        return reply

    def _command(self, name: bytes, args: tuple[Any, ...]) -> Any:
        """A command's reply, an error reply returned as a ``ResponseError`` (a script's
        ``pcall`` receives it)."""
        handler = getattr(self, "cmd_" + name.decode("ascii", "replace").lower(), None)
        if handler is None:
            return ResponseError(f"ERR unknown command '{_text(name)}'")
        try:
            return handler(*args)
        except _WrongType:
            return ResponseError(_WRONG_TYPE)
        except ValueError:
            return ResponseError("ERR value is not an integer or out of range")
        except (IndexError, TypeError):
            return ResponseError(f"ERR wrong number of arguments for '{_text(name)}' command")

    def _script(self, source: bool, text: bytes, numkeys: bytes, *args: bytes) -> Any:
        sha = hashlib.sha1(text).hexdigest() if source else text.decode().lower()
        function = self._scripts.get(sha)
        if function is None:
            if not source:
                raise NoScriptError("No matching script. Please use EVAL.")
            # Redis too runs a script as the body of a function of its own.
            function = self._scripts[sha] = self._lua.eval(b"function(KEYS, ARGV)\n%s\nend" % text)
        keys = int(numkeys)
        try:
            reply = function(self._table(args[:keys]), self._table(args[keys:]))
        except lua51.LuaError as exc:  # a redis.call's error, or the script's own
            raise _raised(str(exc)) from None
        return _from_lua(reply)

    def script_call(self, name: bytes, *args: Any) -> Any:
        """A script's ``redis.call``: the reply as Redis hands it to Lua (nil is false, an
        array a table, a status ``{ok = …}``, an error ``{err = …}``)."""
        reply = self._command(bytes(name).upper(), args)
        if type(reply) is bytes or type(reply) is int:
            return reply
        if reply is None:
            return False
        if isinstance(reply, list):
            return self._table([False if item is None else item for item in reply])
        return self._table({b"err": str(reply).encode()} if reply is not OK else {b"ok": b"OK"})

    # Keys, their expiry and the LRU bound.
    def _live(self, key: bytes, kind: type | None = None) -> Any:
        """The key's value, ``None`` when missing or expired (then dropped); a value of
        another type than ``kind`` is Redis's WRONGTYPE error."""
        value = self._data.get(key)
        if value is not None:
            if self._expires.get(key, self._now) < self._now:
                self._drop(key)
                return None
            self._data.move_to_end(key)
            if kind is not None and not isinstance(value, kind):
                raise _WrongType
        return value

    def _drop(self, key: bytes) -> bool:
        self._expires.pop(key, None)
        return self._data.pop(key, None) is not None

    def _put(self, key: bytes, value: Any, expires: int | None = None) -> Any:
        self._data[key] = value
        self._data.move_to_end(key)
        if expires is None:
            self._expires.pop(key, None)
        else:
            self._expires[key] = expires
        while self.max_keys is not None and len(self._data) > self.max_keys:
            self._drop(next(iter(self._data)))
        return value

    # Commands: ``cmd_<name>`` takes the command's arguments (bytes; a script's numbers as
    # Lua passes them) and returns its reply.
    def cmd_keys(self, pattern: bytes) -> list[bytes]:
        match = _glob(_b(pattern)).fullmatch
        return [key for key in list(self._data) if match(key) and self._live(key) is not None]

    def cmd_time(self) -> list[bytes]:
        micros = round(self.clock() * 1e6)
        return [b"%d" % (micros // 1_000_000), b"%d" % (micros % 1_000_000)]

    def cmd_get(self, key: bytes) -> Any:
        return self._live(key, bytes)

    def cmd_set(self, key: bytes, value: Any, *options: Any) -> Any:
        flags = [_b(option).upper() for option in options]
        expires = None
        for i, flag in enumerate(flags):
            if flag in (b"PX", b"EX"):
                expires = self._now + int(options[i + 1]) * (1 if flag == b"PX" else 1000)
        exists = self._live(key) is not None
        if (b"NX" in flags and exists) or (b"XX" in flags and not exists):
            return None
        self._put(key, _lua_arg(value), expires)
        return OK

    def cmd_del(self, *keys: bytes) -> int:
        return sum(self._live(key) is not None and self._drop(key) for key in keys)

    def cmd_incrby(self, key: bytes, by: Any) -> int:
        value = int(self._live(key, bytes) or 0) + int(by)
        self._put(key, b"%d" % value, self._expires.get(key))
        return value

    def cmd_expire(self, key: bytes, seconds: Any, unit: int = 1000) -> int:
        if self._live(key) is None:
            return 0
        self._expires[key] = self._now + int(seconds) * unit
        return 1

    def cmd_pexpire(self, key: bytes, milliseconds: Any) -> int:
        return self.cmd_expire(key, milliseconds, 1)

    def cmd_pttl(self, key: bytes) -> int:
        if self._live(key) is None:
            return -2
        return self._expires[key] - self._now if key in self._expires else -1

    def cmd_hincrby(self, key: bytes, field: Any, by: Any) -> int:
        table = self._live(key, dict)
        table = self._put(key, {}) if table is None else table
        name = _lua_arg(field)
        table[name] = value = int(table.get(name, 0)) + int(by)
        return value

    def cmd_hgetall(self, key: bytes) -> list[bytes]:
        table = self._live(key, dict) or {}
        return [part for field, n in table.items() for part in (field, b"%d" % n)]

    def _zset(self, key: bytes) -> SortedSet:
        """The key's sorted set, an empty one (not stored) when missing."""
        return self._live(key, SortedSet) or SortedSet()

    def _zkeep(self, key: bytes, found: SortedSet) -> None:
        """Store ``found``, or drop the key when it is empty, as Redis does."""
        if not found.scores:
            self._drop(key)
        elif key not in self._data:
            self._put(key, found)

    def cmd_zadd(self, key: bytes, *rest: Any) -> Any:
        flags, items = set(), list(rest)
        while items and type(items[0]) is bytes and items[0].upper() in _ZADD_FLAGS:
            flags.add(items.pop(0).upper())
        found, added, incr = self._zset(key), 0, b"INCR" in flags
        for score, member in zip(map(float, items[0::2]), map(_lua_arg, items[1::2]), strict=True):
            old = found.scores.get(member)
            score += (old or 0) if incr else 0
            if (old is None and b"XX" in flags) or (old is not None and b"NX" in flags):
                if incr:
                    return None
                continue
            if old is not None and (
                (b"GT" in flags and score <= old) or (b"LT" in flags and score >= old)
            ):
                continue
            added += old is None
            found.add(member, score)
        self._zkeep(key, found)
        return _score(score) if incr else added

    def cmd_zrem(self, key: bytes, *members: Any) -> int:
        found = self._zset(key)
        removed = sum(found.remove(_lua_arg(member)) for member in members)
        self._zkeep(key, found)
        return removed

    def cmd_zcard(self, key: bytes) -> int:
        return len(self._zset(key).scores)

    def cmd_zcount(self, key: bytes, low: Any, high: Any) -> int:
        return len(self._zset(key).between(low, high))

    def cmd_zmscore(self, key: bytes, *members: Any) -> list[Any]:
        scores = self._zset(key).scores
        return [None if scores.get(m) is None else _score(scores[m]) for m in members]

    def cmd_zrange(self, key: bytes, start: Any, stop: Any, *options: Any) -> list[bytes]:
        return _flat(self._zset(key).ranks(start, stop), options)

    def cmd_zrevrange(self, key: bytes, start: Any, stop: Any, *options: Any) -> list[bytes]:
        return _flat(self._zset(key).ranks(start, stop, reverse=True), options)

    def cmd_zrangebyscore(self, key: bytes, low: Any, high: Any, *options: Any) -> list[bytes]:
        pairs = self._zset(key).between(low, high)
        flags = [_b(option).upper() for option in options]
        if b"LIMIT" in flags:
            at = flags.index(b"LIMIT")
            offset, count = int(options[at + 1]), int(options[at + 2])
            pairs = pairs[offset:] if count < 0 else pairs[offset : offset + count]
        return _flat(pairs, options)

    def cmd_zremrangebyscore(self, key: bytes, low: Any, high: Any) -> int:
        found = self._zset(key)
        return self._zremove(key, found, found.between(low, high))

    def cmd_zremrangebyrank(self, key: bytes, start: Any, stop: Any) -> int:
        found = self._zset(key)
        return self._zremove(key, found, found.ranks(start, stop))

    def cmd_zpopmin(self, key: bytes, count: Any = 1) -> list[bytes]:
        found = self._zset(key)
        pairs = found.order[: int(count)]
        self._zremove(key, found, pairs)
        return _flat(pairs, [b"WITHSCORES"])

    def _zremove(self, key: bytes, found: SortedSet, pairs: list[tuple[float, bytes]]) -> int:
        for _, member in pairs:
            found.remove(member)
        self._zkeep(key, found)
        return len(pairs)


def _script_call(store: weakref.ref[MemoryStore], name: bytes, *args: Any) -> Any:
    """A script's ``redis.call`` on the store it runs in (alive while its script runs)."""
    found = store()
    assert found is not None
    return found.script_call(name, *args)


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


class _WrongType(Exception):
    """A command met a key holding another kind of value."""


def _b(value: Any) -> bytes:
    """An argument as Redis receives it: bytes (text as UTF-8, numbers as their digits)."""
    if isinstance(value, bytes):
        return value
    return repr(value).encode() if isinstance(value, float) else str(value).encode()


def _lua_arg(value: Any) -> bytes:
    """A value as stored: a Lua number as Redis's Lua sends it (``%.17g``)."""
    if isinstance(value, float):
        return b"%d" % value if value.is_integer() and abs(value) < 2**63 else _score(value)
    return _b(value)


def _raised(message: str) -> ResponseError:
    """An error reply as redis-py raises it (``ERR`` is left out of the message)."""
    return ResponseError(message[4:] if message.startswith("ERR ") else message)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _score(score: float) -> bytes:
    """A score as Redis replies with it."""
    return (b"inf" if score > 0 else b"-inf") if abs(score) == float("inf") else b"%.17g" % score


def _bound(text: Any) -> tuple[float, bool]:
    """A ``ZRANGEBYSCORE`` bound: its score and whether it is exclusive (``(``)."""
    if type(text) is not bytes:
        return float(text), False
    exclusive = text[:1] == b"("
    return float(text[1:] if exclusive else text), exclusive


def _flat(pairs: list[tuple[float, bytes]], options: Any) -> list[bytes]:
    if b"WITHSCORES" not in (_b(option).upper() for option in options):
        return [member for _, member in pairs]
    return [part for score, member in pairs for part in (member, _score(score))]


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
        return int(value)
    if lua51.lua_type(value) != "table":
        return value
    if value[b"err"] is not None:
        error = _raised(_text(value[b"err"]))
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


def _glob(pattern: bytes) -> re.Pattern[bytes]:
    """A ``KEYS``/``SCAN MATCH`` glob as a regular expression: ``*``, ``?``, ``[…]`` and
    ``\\`` escapes, as Redis reads them."""
    parts = re.findall(rb"\\.|\[[^\]]+\]|.", pattern, re.DOTALL)
    return re.compile(b"".join(map(_glob_part, parts)), re.DOTALL)


def _glob_part(part: bytes) -> bytes:
    if part in (b"*", b"?"):
        return b".*" if part == b"*" else b"."
    if part[:1] == b"[" and len(part) > 2:
        return b"[" + part[1:-1].replace(b"\\", b"\\\\") + b"]"
    return re.escape(part[1:] if part[:1] == b"\\" else part)
