"""Usage counts in Redis: the pushes of what a process counted, and the reads back.

A push (``lua/usage_push.lua`` over ``lua/usage.lua``) writes per shard and minute a hash of
exact counts per tier/endpoint/outcome and one top-clients sorted set per outcome, each with a
TTL of :data:`~.usage_base.USAGE_TTL`. :class:`RedisUsage` pushes what a process counted (its
backend's :class:`~.usage_base.Tally`, and what it kept while Redis was away) and reads the
counts in pipelines (one round trip per :data:`BATCH` commands) for the report and the rollup.

It never imports redis-py: it drives the backend's client.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django_throttle.backends import scripts, usage_base
from django_throttle.backends.base import shard_of
from django_throttle.backends.scripts import call_backend, lua_file, lua_source, top_per_shard
from django_throttle.backends.usage_base import SLOT, MinuteCounts, add_to

#: Read script calls per pipeline round trip.
BATCH = 64
#: Minutes one read script call covers: bounds how long it holds the server.
MINUTES_PER_CALL = 10
#: Counts per push script call (bounds how long one call holds the server).
PUSH_CHUNK = 200
#: Seconds a rollup watermark is kept (a rollup that stopped for longer starts afresh).
WATERMARK_TTL = 30 * 86400
#: Read timeout for reports and rollups: a report may wait longer than a request.
READ_TIMEOUT = 10.0
_ADVANCE = (
    "local old = tonumber(redis.call('GET', KEYS[1]) or '-1') "
    "if tonumber(ARGV[1]) > old then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end"
)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class RedisUsage(usage_base.UsageStore):
    """Reads and pushes the usage counts a :class:`~django_throttle.backends.redis.RedisBackend`
    keeps. Pushes use the backend's client; reads a client with longer timeouts, built on first
    use: call :meth:`close` when done reading."""

    def __init__(self, backend: Any) -> None:
        self.tags: tuple[str, ...] = tuple(backend.shard_tags())
        self.top_size = top_per_shard(len(self.tags))
        self._backend = backend
        #: On a cluster, how script calls run across its primaries (and how reads get a
        #: client with a longer timeout); ``None`` on one server.
        self._cluster: Any = backend if getattr(backend, "on_cluster", False) else None
        self._reader: Any = None
        self._own = False
        self._watermark_key = f"{backend.prefix}:usage-rolled"
        self._push_source = lua_source(len(self.tags)) + "\n" + lua_file("usage_push.lua")
        self._push_sha = hashlib.sha1(self._push_source.encode()).hexdigest()
        self._read_source = lua_file("usage_read.lua")
        self._read_sha = hashlib.sha1(self._read_source.encode()).hexdigest()

    @property
    def push_client(self) -> Any:
        """The backend's own client (short timeouts), for pushes and small reads."""
        return self._backend.client

    @property
    def client(self) -> Any:
        """The client for reads, with :data:`READ_TIMEOUT`; built on first use."""
        if self._reader is None:
            make = getattr(self._backend, "patient_client", None)
            if callable(make):
                self._reader, self._own = make(READ_TIMEOUT)
            else:
                self._reader, self._own = patient_client_like(self.push_client, READ_TIMEOUT)
        return self._reader

    def close(self) -> None:
        if self._own:
            pool = getattr(self._reader, "connection_pool", None)  # a cluster client has none
            if pool is not None:
                pool.disconnect()  # close() leaves a pool it was given open
            else:
                self._reader.close()

    def keys_last_used(self, prefixes: Iterable[str] | None = None) -> dict[str, int]:
        """Every shard's ``<tag>k`` set (see ``lua/usage.lua``) in one pipeline: ZMSCORE of
        ``prefixes`` in each, on the backend's own client (an admin page's small read must
        not wait :data:`READ_TIMEOUT` on a stalled Redis), or the whole set (at most
        ``KEYS_SEEN_MAX`` members a shard, for the rollup)."""
        names = None if prefixes is None else sorted(set(prefixes))
        if names == []:
            return {}
        self.push_own()
        client = self.client if names is None else self.push_client
        pipe = client.pipeline(transaction=False)
        for tag in self.tags:
            if names is None:
                pipe.zrange(f"{tag}k", 0, -1, withscores=True)
            else:
                pipe.zmscore(f"{tag}k", names)
        found: dict[str, int] = {}
        for reply in call_backend(pipe.execute):
            pairs = reply if names is None else zip(names, reply, strict=True)
            for name, score in pairs:
                if score is not None:
                    prefix, second = _text(name), int(score)
                    found[prefix] = max(second, found.get(prefix, second))
        return found

    def now_minute(self) -> int:
        seconds, _ = call_backend(self.client.time)
        return int(seconds) // 60

    def read(
        self, minutes: Sequence[int], *, totals: bool = True, clients: bool = True
    ) -> dict[int, MinuteCounts]:
        """One read script call per shard and run of up to :data:`MINUTES_PER_CALL`
        minutes, pipelined :data:`BATCH` calls per round trip; this process's own counts
        are pushed first, so they are in the figures."""
        self.push_own()
        calls = [
            (tag, first, last, "1" if totals else "0", "1" if clients else "0")
            for first, last in _runs(sorted(set(minutes)))
            for tag in self.tags
        ]
        found: dict[int, MinuteCounts] = {}
        for start in range(0, len(calls), BATCH):
            batch = calls[start : start + BATCH]
            for reply in self._read_batch(batch):
                for entry in reply:
                    if isinstance(entry, list):  # a name holds a NUL byte: parts apart
                        parts = [_text(part) for part in entry]
                    else:
                        parts = _text(entry).split("\0")
                    _merge(found, parts, self.top_size)
        return found

    def push_own(self) -> None:
        """Push the backend's :class:`~.usage_base.Tally` now (a report read in this process
        sees its own decisions; other processes' arrive within
        :data:`~.usage_base.PUSH_EVERY`)."""
        tally = getattr(self._backend, "usage_tally", None)
        if tally is not None:
            for _ in range(2):  # a batch kept from a failed push, then the newer counts
                self.push_tally(tally)

    def _read_batch(self, calls: list[tuple[str, int, int, str, str]]) -> list[Any]:
        framed = [_read_call(*call) for call in calls]
        return self._evalsha_all(self.client, self._read_sha, self._read_source, framed)

    def push(
        self,
        batch: str,
        counts: Sequence[usage_base.PendingCount],
        seen: Mapping[str, int] | None = None,
    ) -> None:
        """One ``usage_push.lua`` call per shard and :data:`PUSH_CHUNK` counts, pipelined."""
        seen = seen or {}
        by_tag: dict[str, list[usage_base.PendingCount]] = {}
        for count in counts:
            # The client's own shard, where its counters live: one slot per client.
            tag = self.tags[shard_of(count[2], len(self.tags))]
            by_tag.setdefault(tag, []).append(count)
        calls: list[scripts.Call] = []
        for tag, items in sorted(by_tag.items()):
            for start in range(0, len(items), PUSH_CHUNK):
                keys = [f"{tag}p{batch}:{start}", f"{tag}l", f"{tag}k"]
                args: list[Any] = []
                for minute, field, client, letter, n in items[start : start + PUSH_CHUNK]:
                    keys += (f"{tag}u{minute}", f"{tag}t{letter}{minute}")
                    args += (minute, field, client, letter, n, seen.get(client, 0))
                calls.append((keys, args))
        self._evalsha_all(self.push_client, self._push_sha, self._push_source, calls)

    def _evalsha_all(
        self, client: Any, sha: str, source: str, calls: Sequence[scripts.Call]
    ) -> list[Any]:
        if self._cluster is not None:
            return list(self._cluster.evalsha_all(sha, source, calls, client))
        return scripts.evalsha_all(client, sha, source, calls)

    def watermark(self) -> int | None:
        value = call_backend(self.client.get, self._watermark_key)
        return None if value is None else int(value)

    def advance_watermark(self, minute: int) -> None:
        call_backend(self.client.eval, _ADVANCE, 1, self._watermark_key, minute, WATERMARK_TTL)

    def take_late(self) -> set[int]:
        """Every shard's ``<tag>l`` minutes (those pushed to within ``USAGE_TTL``:
        the push trims older ones), popped; this process's own counts are pushed first."""
        self.push_own()
        pipe = self.client.pipeline(transaction=False)
        for tag in self.tags:
            pipe.zpopmin(f"{tag}l", 1_000_000)
        return {int(m) for popped in call_backend(pipe.execute) for m, _score in popped or ()}

    def return_late(self, minutes: Iterable[int]) -> None:
        minutes = list(minutes)
        if minutes:
            late = f"{self.tags[0]}l"
            pipe = self.client.pipeline(transaction=False)
            second = int(time.time())  # as the push scores them: when pushed
            pipe.zadd(late, dict.fromkeys(map(str, minutes), second))
            pipe.expire(late, usage_base.USAGE_TTL)
            call_backend(pipe.execute)


def _read_call(
    tag: str, first: int, last: int, totals: str, clients: str
) -> tuple[list[str], tuple[int, int, str, str]]:
    """The KEYS and ARGV of one ``usage_read.lua`` call: every key it reads, in its order."""
    keys: list[str] = []
    for minute in range(first, last + 1):
        if totals == "1":
            keys.append(f"{tag}u{minute}")
        if clients == "1":
            keys += (f"{tag}t{letter}{minute}" for letter in usage_base.LETTERS)
    return keys, (first, last, totals, clients)


def _runs(minutes: list[int]) -> Iterable[tuple[int, int]]:
    """(first, last) runs of consecutive minutes, at most MINUTES_PER_CALL long."""
    for _, run in itertools.groupby(enumerate(minutes), lambda pair: pair[1] - pair[0]):
        consecutive = [minute for _, minute in run]
        for start in range(0, len(consecutive), MINUTES_PER_CALL):
            piece = consecutive[start : start + MINUTES_PER_CALL]
            yield piece[0], piece[-1]


def _merge(found: dict[int, MinuteCounts], parts: list[str], top_size: int) -> None:
    """Add one key's contents (minute, kind, then name/count pairs) to ``found``."""
    minute, kind, *items = parts
    counts = found.setdefault(int(minute), MinuteCounts())
    pairs = zip(items[0::2], items[1::2], strict=False)  # a dangling name is ignored
    if kind == "u":
        for name, total in pairs:
            if name[:1] in SLOT:
                add_to(counts.totals, name[1:], SLOT[name[:1]], int(total))
        return
    for name, score in pairs:
        n = int(score) if score.isdigit() else round(float(score))
        add_to(counts.clients, name, SLOT[kind[1:]], n)
    if len(items) // 2 >= top_size:
        counts.full = True


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
