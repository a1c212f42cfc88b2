"""In-process backend with the Redis backend's semantics, for development, tests and the
per-process fallback of failure mode ``"local"``, and the in-process Redis it counts in.

It is the Redis backend with its scripts run on a :class:`MemoryStore`
(:class:`InProcess`, the route it hands the backend) instead of a server: the same
keys, the same Lua scripts (run in this process on Redis's Lua), the same usage counts and
operator tools, so a process that falls back to memory makes the decisions Redis would have
made. State lives in this process only: use it with one process, or accept per-process limits.
It is thread-safe (a script runs under the store's lock) and takes an injectable ``clock`` so
tests can move time by hand. ``max_entries`` (unset: :data:`MAX_ENTRIES`) bounds memory:
beyond it a key is forgotten (its client starts afresh), of the least recently used the one
nearest its expiry (see :meth:`Keyspace._evictee`), never a kept one (a counter that denied, a
credential check's: :meth:`MemoryBackend.keep`); when every key is kept, new clients are
counted in shared overflow counters instead (:meth:`MemoryStore.admitting`).

:class:`MemoryStore` is the part of Redis the throttle uses, kept in this process: the
package's own Lua scripts run on Lua 5.1 (Redis's Lua, through ``lupa``) against the commands of
:class:`Keyspace`.

The memory backend counts with the very scripts Redis runs, so its decisions are Redis's by
construction rather than by a second implementation kept in step. The store answers
the redis-py client methods the backends and usage reports call (``get``, ``set``, ``delete``,
``scan``, ``time``, ``eval``/``evalsha``, ``pipeline`` and a few sorted-set commands), with
redis-py's reply shapes and error classes; :meth:`MemoryStore.execute_framed` takes a framed
command (the counting call's bytes). Each command, and each script as a whole, runs under one
lock: a script is atomic, as on Redis. Time is ``clock`` (Unix seconds): ``TIME`` and every
expiry read it, so a test can move it by hand. ``max_keys`` bounds memory: beyond it, of the
:data:`EVICTION_CANDIDATES` least recently used keys not kept the one expiring first is
dropped. An expired key is gone when next looked at, and all are swept every
:data:`SWEEP_EVERY` commands.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import itertools
import math
import re
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from operator import itemgetter
from typing import Any

from lupa import lua51
from redis.exceptions import NoScriptError, ResponseError

from django_throttle.backends.base import Limits, Now, Usage
from django_throttle.backends.redis import DIGEST_KEY_CHARS, SHARED_MARK, RedisBackend
from django_throttle.backends.redis_nodes import ScriptCall, run_script
from django_throttle.backends.scripts import Call, evalsha_all
from django_throttle.backends.usage_store import RedisUsage
from django_throttle.rates import Decision

__all__ = ["MemoryBackend"]


#: Most keys a memory backend keeps when not told otherwise (``memory://`` included). A key
#: lives as long as its state is worth something (a day for a daily limit, a month for a
#: monthly quota), so without a bound every fresh address a client sends would stay in the
#: worker's memory that long.
MAX_ENTRIES = 100_000


class MemoryBackend(RedisBackend):
    """Counts in this process's memory, with the Redis backend's scripts.
    In-process under a short lock and never waiting on I/O, its async methods need no thread.
    Keeps at most ``max_entries`` keys (unset: :data:`MAX_ENTRIES`)."""

    blocking = False

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        max_entries: int | None = None,
        shards: int | None = None,
    ) -> None:
        self.store = MemoryStore(clock, MAX_ENTRIES if max_entries is None else max_entries)
        route = InProcess(self.store, type(self))
        super().__init__(shards=shards, route=route)
        route.tags = self._tags

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

    def hit(
        self, client: str, limits: Limits, cost: int = 1, *, now: Now = None, usage: Usage = None
    ) -> Decision:
        """:meth:`.RedisBackend.hit`; a counter that denies is kept (:meth:`keep`)."""
        decision = super().hit(client, limits, cost, now=now, usage=usage)
        if not decision.allowed:
            self.keep(client, limits)
        return decision

    def count(
        self, client: str, limits: Limits, cost: int, now: Now, usage: Usage, peek: bool = False
    ) -> Decision:
        decision = super().count(client, limits, cost, now, usage, peek)
        if not decision.allowed:
            self.keep(client, limits)
        return decision

    async def acount(
        self, client: str, limits: Limits, cost: int, now: Now, usage: Usage, peek: bool = False
    ) -> Decision:
        decision = await super().acount(client, limits, cost, now, usage, peek)
        if not decision.allowed:
            self.keep(client, limits)
        return decision

    def keep(self, client: str, limits: Limits) -> None:
        """Never forget ``client``'s counters of ``limits`` for a fresh key while they live
        (see :meth:`Keyspace.keep`): what forgetting them would give back is what a bounded
        store must not give. Counters that denied are kept by :meth:`hit` itself; the request
        path keeps a credential check's counters too, whatever they decided."""
        if self.store.max_keys is not None:
            self.store.keep([self.key(client, limit).encode() for limit in limits])

    @cached_property
    def usage(self) -> RedisUsage:
        """This backend's usage counts, kept and read as on Redis."""
        return RedisUsage(self)


class InProcess:
    """The route of a backend's script calls to a :class:`MemoryStore`
    (a :class:`~.redis.Route`): every shard is in it, and every call runs there at once.

    The store answers the redis-py client methods the backend uses (``execute_command``,
    ``evalsha``, ``eval``, pipelines, ``GET``, ``SCAN``), so the calls go through
    :func:`.redis_nodes.run_script` as on a server: ``NOSCRIPT`` is answered with ``EVAL`` and
    tells :data:`~django_throttle.events.script_loaded` (``sender``), a script's error reply is
    what :func:`.scripts.failure` makes of it. A script runs under the store's lock and never
    waits on I/O, so :meth:`acall` runs it on the calling loop's thread."""

    def __init__(self, store: MemoryStore, sender: type | None = None) -> None:
        self.client: Any = store
        self.store = store
        self.sender = sender
        #: Each shard's key prefix (``<prefix>:{<shard>}``), the client's digest after it.
        self.tags: tuple[bytes, ...] = ()

    def call(self, call: ScriptCall) -> Any:
        """Run ``call``; on a bounded store, its new keys counted in the overflow counters
        when the store has no room for them (:meth:`MemoryStore.admitting`)."""
        if self.store.max_keys is None:
            return run_script(self.client, call, self.sender)
        tag = self.tags[call.shard] if call.shard < len(self.tags) else None
        with self.store.admitting(call.keys, lambda key: overflow_key(tag, key)) as keys:
            return run_script(self.client, call._replace(keys=keys), self.sender)

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
#: Seconds between two sweeps a full store makes before it counts a call's new keys in the
#: overflow counters: expired keys still held must not make room look scarce for long.
FULL_SWEEP_EVERY = 1.0
#: What stands in an overflow counter's key for the client digest (never a base64url
#: character, nor :data:`~.redis.SHARED_MARK`).
OVERFLOW_MARK = b"+"


def overflow_key(tag: bytes | None, key: bytes) -> bytes:
    """The overflow counter that stands for ``key`` (``<tag><digest><limit>``) when a full
    store has no room for it: the same limit's, with :data:`OVERFLOW_MARK` for the client's
    digest, so every client without room shares it. A shared limit's key (or one of
    another shape) is its own."""
    if tag is None or not key.startswith(tag) or key[len(tag) : len(tag) + 1] == SHARED_MARK:
        return key
    return tag + OVERFLOW_MARK + key[len(tag) + DIGEST_KEY_CHARS :]


#: Least recently used keys a full keyspace compares, forgetting the one expiring first
#: (see :meth:`Keyspace._evictee`): as many as Redis's eviction samples at most.
EVICTION_CANDIDATES = 16
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


# -- the keyspace ----------------------------------------------------------------------------
# The Redis commands the throttle's scripts and backends send, on values kept in this process:
# strings, hashes and sorted sets in a keyspace with millisecond expiries and a bound on its keys
# (of the least recently used, the one expiring first dropped). :class:`Keyspace` is what
# :class:`MemoryStore` runs commands on; it answers each as Redis 7 does in RESP2 (the replies a
# script receives), and is not thread-safe: the store's lock guards it. An expired key is gone
# when next looked at.

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
        #: The keys a full keyspace may forget, least recently used first.
        self._data: OrderedDict[bytes, Any] = OrderedDict()
        #: The keys it never forgets for another (:meth:`keep`); they go when they expire.
        self._kept: dict[bytes, Any] = {}
        self._expires: dict[bytes, int] = {}
        #: The millisecond the running command (or script) sees: read once per command.
        self._now = 0
        #: The keys of the call running (:meth:`MemoryStore.admitting`): never the one forgotten.
        self._using: frozenset[bytes] = frozenset()

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
            self._data.move_to_end(key)
        else:
            value = self._kept.get(key)
        if value is not None:
            if self._expires.get(key, self._now) < self._now:
                self._drop(key)
                return None
            if kind is not None and not isinstance(value, kind):
                raise _Refused(_WRONG_TYPE)
        return value

    def _drop(self, key: bytes) -> bool:
        self._expires.pop(key, None)
        return self._data.pop(key, None) is not None or self._kept.pop(key, None) is not None

    def _put(self, key: bytes, value: Any, expires: int | None = None) -> Any:
        if key in self._kept:
            self._kept[key] = value
        else:
            self._data[key] = value
            self._data.move_to_end(key)
        if expires is None:
            self._expires.pop(key, None)
        else:
            self._expires[key] = expires
        if self.max_keys is not None:
            # Only keys that may be forgotten are; a call that found no room for its new
            # keys counts in the overflow counters instead (:meth:`MemoryStore.admitting`).
            while len(self._data) + len(self._kept) > self.max_keys and len(self._data) > 1:
                evictee = self._evictee()
                if evictee is None:
                    break
                self._drop(evictee)
        return value

    def keep(self, keys: Sequence[bytes]) -> None:
        """Never forget those of ``keys`` that are held in favour of another key: each stays
        until it expires or is deleted. Kept keys are what a client would gain by losing (a
        counter that denied, a credential check's counter), so a full keyspace counts new
        keys in the overflow counters rather than forget them."""
        for key in keys:
            value = self._data.pop(key, None)
            if value is not None:
                self._kept[key] = value

    def _sweep(self) -> None:
        """Drop every expired key."""
        for key in [key for key, at in self._expires.items() if at < self._now]:
            self._drop(key)

    def _evictee(self) -> bytes | None:
        """The key a full keyspace forgets: of the :data:`EVICTION_CANDIDATES` least recently
        used that it may forget (never a kept key, the key just written or a key of the call
        running), the one whose expiry is nearest (no expiry: last), the least recently used
        of those expiring together; ``None`` when there is none.

        A counter's TTL is the time until its state is worth nothing (a bucket refilled, a
        window over), so of old keys the one expiring first is the one whose loss gives its
        client least. Recency comes first because expiry alone is not safe: a store filled
        with long-lived keys would forget a counter one request after each request started
        it. Recency alone is what let fresh identities flush a spent counter; with both, a
        key goes only after ``max_keys`` others were used since it was, and only once as
        many keys as it is compared with, all used after it, outlive it."""
        data, expires, never, using = self._data, self._expires, math.inf, self._using
        head = itertools.islice(data, min(EVICTION_CANDIDATES + len(using), len(data) - 1))
        candidates = [key for key in head if key not in using][:EVICTION_CANDIDATES]
        return min(candidates, key=lambda key: expires.get(key, never), default=None)

    # Commands: ``cmd_<name>`` takes the command's arguments (bytes, a script's numbers as
    # the ``%.17g`` text Redis sends) and returns its reply; a refusal is Redis's error.
    def cmd_keys(self, pattern: bytes) -> list[bytes]:
        match = _glob(encoded(pattern)).fullmatch
        held = [*self._data, *self._kept]
        return [key for key in held if match(key) and self._live(key) is not None]

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
        elif key not in self._data and key not in self._kept:
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


# -- the store -------------------------------------------------------------------------------


class MemoryStore(Keyspace):
    """An in-process store answering the commands and scripts the throttle sends to Redis."""

    def __init__(self, clock: Callable[[], float] = time.time, max_keys: int | None = None):
        super().__init__(clock, max_keys)
        self._lock = threading.RLock()  # re-entered by a call under :meth:`admitting`
        self._swept_at = -math.inf
        self._commands = itertools.count(1)
        self._lua = lua51.LuaRuntime(encoding=None, unpack_returned_tuples=True)
        self._lua.execute(_PRELUDE, self.script_call, _pack, _unpack)
        self._table = self._lua.table_from
        self._scripts: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.execute(b"KEYS", b"*"))

    def keep(self, keys: Sequence[bytes]) -> None:
        """:meth:`Keyspace.keep`, under the store's lock (requests keep counters from any
        thread)."""
        with self._lock:
            super().keep(keys)

    @contextlib.contextmanager
    def admitting(
        self, keys: Sequence[str | bytes], overflow: Callable[[bytes], bytes]
    ) -> Iterator[list[bytes]]:
        """Hold the store for one call over ``keys`` (a script's, run within) and give the
        keys it is to use: ``keys`` themselves while the store has room for those it does not
        hold (keys it may forget make room), else those replaced by ``overflow(key)``, shared
        counters, kept: a full store keeps counting every new client, more strictly (they
        share one counter per limit), and never forgets a kept key to make room. Memory stays
        within ``max_keys`` keys plus one overflow counter per limit (and shard)."""
        with self._lock:
            self._now = round(self.clock() * 1e6) // 1000
            held = [encoded(key) for key in keys]
            missing = [key for key in held if self._live(key) is None]
            overflowed = {}
            if missing and not self._room_for(len(missing), held):
                overflowed = {key: overflow(key) for key in missing}
                held = [overflowed.get(key, key) for key in held]
            self._using = frozenset(held)
            try:
                yield held
            finally:
                self._using = frozenset()
                self.keep(list(overflowed.values()))

    def _room_for(self, new: int, held: list[bytes]) -> bool:
        """Whether ``new`` keys fit beside ``held`` (a call's keys), forgetting keys that may
        be forgotten, other than ``held``; a store that seems full sweeps its expired keys
        first, at most every :data:`FULL_SWEEP_EVERY` seconds."""
        assert self.max_keys is not None
        for attempt in (0, 1):
            over = len(self._data) + len(self._kept) + new - self.max_keys
            if over <= 0 or len(self._data) - sum(key in self._data for key in held) >= over:
                return True
            if attempt or self._now - self._swept_at < FULL_SWEEP_EVERY * 1000:
                break
            self._swept_at = self._now
            self._sweep()
        return False

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

    def incrby(self, key: Any, amount: int = 1) -> int:
        return int(self.execute(b"INCRBY", key, amount))

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

    def execute_command(self, *args: Any) -> Any:
        """:meth:`execute` by redis-py's name for it: :func:`.redis_nodes.run_script` sends
        a call's commands so, as to a server."""
        return self.execute(*args)

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
                self._sweep()
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
