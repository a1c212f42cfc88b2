"""The Redis commands the throttle's scripts and backends send, on values kept in this
process: strings, hashes and sorted sets in a keyspace with millisecond expiries and a bound
on its keys (the least recently used dropped first, as Redis's ``allkeys-lru``).

:class:`Keyspace` is what :class:`~.memory.MemoryStore` runs commands on; it answers
each as Redis 7 does in RESP2 (the replies a script receives), and is not thread-safe: the
store's lock guards it. An expired key is gone when next looked at.
"""

from __future__ import annotations

import bisect
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from redis.exceptions import ResponseError

_WRONG_TYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
_NOT_INTEGER = "ERR value is not an integer or out of range"
_INT64 = range(-(2**63), 2**63)
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
        size, first, last = len(self.order), _integer(start), _integer(stop)
        first = max(first + size if first < 0 else first, 0)
        last = last + size if last < 0 else last
        if first > last or first >= size:
            return []  # Redis's rule: a negative end past the start is an empty range
        order = self.order[::-1] if reverse else self.order
        return order[first : last + 1]


class Keyspace:
    """Keys, their expiry and every command the scripts call, as ``cmd_<name>`` methods."""

    def __init__(self, clock: Callable[[], float] = time.time, max_keys: int | None = None):
        if max_keys is not None and max_keys < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_keys}")
        self.clock = clock
        self.max_keys = max_keys
        self._data: OrderedDict[bytes, Any] = OrderedDict()
        self._expires: dict[bytes, int] = {}
        #: The millisecond the running command (or script) sees: read once per command.
        self._now = 0

    def command(self, name: bytes, args: tuple[Any, ...]) -> Any:
        """A command's reply, an error reply returned as a ``ResponseError`` (a script's
        ``pcall`` receives it)."""
        handler = getattr(self, "cmd_" + name.decode("ascii", "replace").lower(), None)
        if handler is None:
            return ResponseError(f"ERR unknown command '{readable(name)}'")
        try:
            return handler(*args)
        except _Refused as refused:
            return ResponseError(str(refused))
        except (IndexError, TypeError):
            return ResponseError(f"ERR wrong number of arguments for '{readable(name)}' command")
        except Exception as exc:  # never a Python error out of a command: Redis replies with one
            return ResponseError(f"ERR {readable(name)}: {type(exc).__name__}: {exc}")

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
                raise _Refused(_WRONG_TYPE)
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

    # Commands: ``cmd_<name>`` takes the command's arguments (bytes, a script's numbers as
    # the ``%.17g`` text Redis sends) and returns its reply; a refusal is Redis's error.
    def cmd_keys(self, pattern: bytes) -> list[bytes]:
        match = _glob(encoded(pattern)).fullmatch
        return [key for key in list(self._data) if match(key) and self._live(key) is not None]

    def cmd_time(self) -> list[bytes]:
        micros = round(self.clock() * 1e6)
        return [b"%d" % (micros // 1_000_000), b"%d" % (micros % 1_000_000)]

    def cmd_get(self, key: bytes) -> Any:
        return self._live(key, bytes)

    def cmd_set(self, key: bytes, value: Any, *options: Any) -> Any:
        flags = [encoded(option).upper() for option in options]
        expires = None
        for i, flag in enumerate(flags):
            if flag in (b"PX", b"EX"):
                amount = _integer(options[i + 1])
                if amount <= 0:
                    raise _Refused("ERR invalid expire time in 'set' command")
                expires = self._deadline(amount, 1 if flag == b"PX" else 1000, "set")
        exists = self._live(key) is not None
        if (b"NX" in flags and exists) or (b"XX" in flags and not exists):
            return None
        self._put(key, encoded(value), expires)
        return OK

    def cmd_del(self, *keys: bytes) -> int:
        return sum(self._live(key) is not None and self._drop(key) for key in keys)

    def cmd_incrby(self, key: bytes, by: Any) -> int:
        increment = _integer(by)
        value = _added(_integer(self._live(key, bytes) or b"0"), increment)
        self._put(key, b"%d" % value, self._expires.get(key))
        return value

    def cmd_expire(self, key: bytes, seconds: Any) -> int:
        return self._expire(key, self._deadline(_integer(seconds), 1000, "expire"))

    def cmd_pexpire(self, key: bytes, milliseconds: Any) -> int:
        return self._expire(key, self._deadline(_integer(milliseconds), 1, "pexpire"))

    def _deadline(self, amount: int, unit: int, name: str) -> int:
        """The millisecond ``amount`` units from now; past int64 is Redis's error."""
        at = amount * unit + self._now
        if at not in _INT64 or amount * unit not in _INT64:
            raise _Refused(f"ERR invalid expire time in '{name}' command")
        return at

    def _expire(self, key: bytes, at: int) -> int:
        """Expire ``key`` at millisecond ``at``: a time already past deletes it, as Redis."""
        if self._live(key) is None:
            return 0
        if at <= self._now:
            self._drop(key)
        else:
            self._expires[key] = at
        return 1

    def cmd_pttl(self, key: bytes) -> int:
        if self._live(key) is None:
            return -2
        return self._expires[key] - self._now if key in self._expires else -1

    def cmd_hincrby(self, key: bytes, field: Any, by: Any) -> int:
        increment = _integer(by)
        table = self._live(key, dict)
        table = self._put(key, {}) if table is None else table
        name = encoded(field)
        table[name] = value = _added(table.get(name, 0), increment)
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
        flags, items = set(), [encoded(item) for item in rest]
        while items and items[0].upper() in _ZADD_FLAGS:
            flags.add(items.pop(0).upper())
        incr = b"INCR" in flags
        if not items or len(items) % 2:
            raise _Refused("ERR syntax error")
        if {b"NX", b"XX"} <= flags:
            raise _Refused("ERR XX and NX options at the same time are not compatible")
        if len(flags & {b"GT", b"LT", b"NX"}) > 1:
            raise _Refused("ERR GT, LT, and/or NX options at the same time are not compatible")
        if incr and len(items) > 2:
            raise _Refused("ERR INCR option supports a single increment-element pair")
        pairs = list(zip(map(_score_arg, items[0::2]), items[1::2], strict=True))
        found, added, changed, score = self._zset(key), 0, 0, 0.0
        for score, member in pairs:
            old = found.scores.get(member)
            skipped = (b"XX" in flags) if old is None else (b"NX" in flags)
            if old is not None and not skipped:
                score += old if incr else 0
                if math.isnan(score):
                    raise _Refused("ERR resulting score is not a number (NaN)")
                skipped = (b"GT" in flags and score <= old) or (b"LT" in flags and score >= old)
            if skipped:
                if incr:
                    return None
                continue
            added += old is None
            changed += old is not None and score != old
            found.add(member, score)
        self._zkeep(key, found)
        return _score(score) if incr else added + (changed if b"CH" in flags else 0)

    def cmd_zrem(self, key: bytes, *members: Any) -> int:
        found = self._zset(key)
        removed = sum(found.remove(encoded(member)) for member in members)
        self._zkeep(key, found)
        return removed

    def cmd_zcard(self, key: bytes) -> int:
        return len(self._zset(key).scores)

    def cmd_zcount(self, key: bytes, low: Any, high: Any) -> int:
        return len(self._zset(key).between(low, high))

    def cmd_zmscore(self, key: bytes, *members: Any) -> list[Any]:
        scores = self._zset(key).scores
        return [None if scores.get(m) is None else _score(scores[m]) for m in members]

    def cmd_zscore(self, key: bytes, member: Any) -> Any:
        return self.cmd_zmscore(key, encoded(member))[0]

    def cmd_zrange(self, key: bytes, start: Any, stop: Any, *options: Any) -> list[bytes]:
        return _flat(self._zset(key).ranks(start, stop), options)

    def cmd_zrevrange(self, key: bytes, start: Any, stop: Any, *options: Any) -> list[bytes]:
        return _flat(self._zset(key).ranks(start, stop, reverse=True), options)

    def cmd_zrangebyscore(self, key: bytes, low: Any, high: Any, *options: Any) -> list[bytes]:
        pairs = self._zset(key).between(low, high)
        flags = [encoded(option).upper() for option in options]
        if b"LIMIT" in flags:
            at = flags.index(b"LIMIT")
            offset, count = _integer(options[at + 1]), _integer(options[at + 2])
            pairs = pairs[offset:] if count < 0 else pairs[offset : offset + count]
            pairs = [] if offset < 0 else pairs
        return _flat(pairs, options)

    def cmd_zremrangebyscore(self, key: bytes, low: Any, high: Any) -> int:
        found = self._zset(key)
        return self._zremove(key, found, found.between(low, high))

    def cmd_zremrangebyrank(self, key: bytes, start: Any, stop: Any) -> int:
        found = self._zset(key)
        return self._zremove(key, found, found.ranks(start, stop))

    def cmd_zpopmin(self, key: bytes, count: Any = 1) -> list[bytes]:
        try:
            size = _integer(count)
        except _Refused:
            size = -1
        if size < 0:
            raise _Refused("ERR value is out of range, must be positive")
        found = self._zset(key)
        pairs = found.order[:size]
        self._zremove(key, found, pairs)
        return _flat(pairs, [b"WITHSCORES"])

    def _zremove(self, key: bytes, found: SortedSet, pairs: list[tuple[float, bytes]]) -> int:
        for _, member in pairs:
            found.remove(member)
        self._zkeep(key, found)
        return len(pairs)


class _Refused(Exception):
    """A command's error reply (its message, Redis's own words)."""


def encoded(value: Any) -> bytes:
    """An argument as Redis receives it: bytes (text as UTF-8, numbers as their digits)."""
    if isinstance(value, bytes):
        return value
    return repr(value).encode() if isinstance(value, float) else str(value).encode()


def _integer(text: Any) -> int:
    """An integer argument as Redis's ``string2ll`` reads it: digits with an optional ``-``,
    no sign ``+``, spaces or leading zeros, within int64; anything else is Redis's error."""
    digits = encoded(text)
    if not _INTEGER.fullmatch(digits) or int(digits) not in _INT64:
        raise _Refused(_NOT_INTEGER)
    return int(digits)


def _added(value: int, increment: int) -> int:
    """``value + increment``, refused as Redis does when it leaves int64."""
    if value + increment not in _INT64:
        raise _Refused("ERR increment or decrement would overflow")
    return value + increment


_INTEGER = re.compile(rb"0|-?[1-9][0-9]*")
_SPACES = b" \t\n\v\f\r"  # C's isspace
#: What C's ``strtod`` reads whole: decimal or hexadecimal numbers, ``inf``/``infinity``, ``nan``.
_FLOAT = re.compile(
    rb"[+-]?(?:(?P<hex>0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?)"
    rb"|(?P<digits>[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
    rb"|(?P<inf>inf(?:inity)?)|(?P<nan>nan(?:\([0-9A-Za-z_]*\))?))",
    re.IGNORECASE,
)


def _strtod(text: bytes) -> tuple[float, bool]:
    """``text`` read as C's ``strtod`` reads it (leading spaces skipped), and whether it was out
    of a double's range (``ERANGE``); text it does not read whole is refused."""
    form = _FLOAT.fullmatch(text.lstrip(_SPACES))
    if form is None:
        raise _Refused("ERR value is not a valid float")
    if form["nan"]:
        return math.nan, False
    if form["inf"]:
        return float(form[0]), False
    try:
        value = float.fromhex(form[0].decode()) if form["hex"] else float(form[0])
    except OverflowError:
        return math.copysign(math.inf, -1.0 if form[0][:1] == b"-" else 1.0), True
    mantissa = form["hex"][2:].lower().partition(b"p")[0] if form["hex"] else form["digits"]
    return value, math.isinf(value) or (value == 0 and mantissa.strip(b"0.") != b"")


def readable(value: Any) -> str:
    """Bytes as text, for messages."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _score(score: float) -> bytes:
    """A score as Redis replies with it."""
    return (b"inf" if score > 0 else b"-inf") if abs(score) == float("inf") else b"%.17g" % score


def _score_arg(text: bytes) -> float:
    """A score as Redis reads one (``getDoubleFromObject``): no leading space, not NaN, and
    within a double's range (``1e400`` is refused, ``inf`` is not)."""
    value, out_of_range = _strtod(text) if text and text[0] not in _SPACES else (0.0, True)
    if out_of_range or math.isnan(value):
        raise _Refused("ERR value is not a valid float")
    return value


def _bound(text: Any) -> tuple[float, bool]:
    """A ``ZRANGEBYSCORE`` bound: its score and whether it is exclusive (``(``), read as
    Redis's ``zslParseRange`` does (``strtod``: leading spaces and ``1e400`` pass, NaN not)."""
    text = encoded(text)
    exclusive = text[:1] == b"("
    text = text[1:] if exclusive else text
    try:
        value, _ = _strtod(text) if text else (0.0, False)  # strtod reads "" as 0, whole
    except _Refused:
        value = math.nan
    if math.isnan(value):
        raise _Refused("ERR min or max is not a float")
    return value, exclusive


def _flat(pairs: list[tuple[float, bytes]], options: Any) -> list[bytes]:
    if b"WITHSCORES" not in (encoded(option).upper() for option in options):
        return [member for _, member in pairs]
    return [part for score, member in pairs for part in (member, _score(score))]


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
