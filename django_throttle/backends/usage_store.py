"""Where a backend keeps its per-minute usage counts: the contract of a usage store
(:class:`UsageStore`), which reports and the rollup (:mod:`django_throttle.usage.reports`) read
through, and the store in Redis (:class:`RedisUsage`), which the memory backend keeps in its
in-process Redis too.

Decisions are counted in the process that made them (:class:`~.redis.Tally`) and pushed here in
one pipelined call at most once per :data:`~.redis.PUSH_EVERY`. A push (``lua/usage_push.lua``
over ``lua/usage.lua``) writes per shard and minute a hash of exact counts per
tier/endpoint/outcome and one top-clients sorted set per outcome, each with a TTL of
:data:`USAGE_TTL`; reads come back in pipelines (one round trip per :data:`BATCH` commands) for
the report and the rollup. This module never imports redis-py: it drives the backend's client.

Minutes are whole minutes since the Unix epoch. Counts are lists in :data:`LETTERS` order
(allowed, denied, shadow would-deny, failed open, failed closed), then the measures of
:data:`MEASURE_LETTERS` (requests delayed, their waits in milliseconds).
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
import math
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django_throttle.backends.base import BackendError, NodeUnavailable, shard_of
from django_throttle.backends.redis import PendingCount, Tally
from django_throttle.backends.redis_nodes import patient_client_like
from django_throttle.backends.scripts import Call, call_backend, evalsha_all, lua_file

#: One letter per outcome, in report column order: allowed, denied, shadow would-deny,
#: failed open, failed closed. The Lua scripts use the same letters.
LETTERS = "adsoc"
#: One letter per figure counted besides the outcome, after the outcomes in a counts list:
#: ``l`` requests served after waiting their turn (a delaying limit; also counted allowed),
#: ``w`` those waits summed, in milliseconds, ``h`` requests the load shedder refused (503;
#: also counted denied). Totals only: no top-client list.
MEASURE_LETTERS = "lwh"
#: Position of each letter's count in a counts list (outcomes, then measures).
SLOT = {letter: i for i, letter in enumerate(LETTERS + MEASURE_LETTERS)}
#: API keys whose last use a store remembers (per shard for Redis: ``lua/usage.lua``'s
#: ``KEYS_SEEN_MAX``); beyond it the least recently used are forgotten.
KEYS_SEEN_MAX = 10_000
#: Seconds a minute's usage counts live in the backend (3 hours): ``manage.py throttle_usage
#: --rollup`` copies them to the database and must run more often (it says when it did not).
#: Longer costs Redis memory for every minute kept, shorter loses minutes to a late cron job.
USAGE_TTL = 3 * 3600
#: Clients kept per minute and outcome (in Redis each key shard keeps its heaviest
#: ``ceil(TOP_CLIENTS / shards)``). Beyond it a new client replaces the smallest and
#: inherits its count (Space-Saving): a minute's memory is bounded whatever the number of
#: clients, while every client with a noticeable share of the traffic is listed.
TOP_CLIENTS = 1000


@dataclass(slots=True)
class MinuteCounts:
    """One minute's counts. ``totals`` are exact, per usage field (tier and endpoint).
    ``clients`` are the top clients per outcome (heavy hitters, see ``lua/usage.lua``);
    ``full`` says a top list was full that minute, so clients beyond it were folded into the
    counts of those listed or left out of a push (:meth:`RedisUsage.push`) and per-client
    numbers are estimates."""

    totals: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    clients: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    full: bool = False


def add_to(table: dict[str, list[int]], key: str, slot: int, n: int) -> None:
    """Add ``n`` to ``table[key][slot]``, creating the row of zeros when missing."""
    row = table.get(key)
    if row is None:
        row = table[key] = [0] * len(SLOT)
    row[slot] += n


class UsageStore(ABC):
    """Per-minute usage counts a backend keeps, plus the rollup's bookkeeping.

    ``top_size`` is how many clients one top list holds (per shard and outcome for Redis).
    """

    top_size: int

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections of the store's own (a Redis store may open a reading client)."""

    def keys_last_used(self, prefixes: Iterable[str] | None = None) -> dict[str, int]:
        """The last second (Unix) a decision counted each API key, by key prefix: those of
        ``prefixes`` that were seen (``None``: every key remembered). Kept only while usage
        counting is on. A store that keeps none (this default) knows of no use."""
        return {}

    @abstractmethod
    def now_minute(self) -> int:
        """The current minute on the clock the counts are written with."""

    @abstractmethod
    def read(
        self, minutes: Sequence[int], *, totals: bool = True, clients: bool = True
    ) -> dict[int, MinuteCounts]:
        """The counts of each of ``minutes`` that has any (the others are left out)."""

    @abstractmethod
    def push(
        self, batch: str, counts: Sequence[PendingCount], seen: Mapping[str, int] | None = None
    ) -> None:
        """Add counts kept in process to their minutes, at most once per ``batch`` id (a
        retry after a lost reply is a no-op), and for each API key client (``"key:<prefix>"``)
        in ``seen`` the last second (Unix) it was used (a later time wins). Raise
        ``BackendError`` when it cannot."""

    def push_tally(self, tally: Tally) -> None:
        """Push what ``tally`` holds in one call; on failure the counts stay in it for the
        next try (bounded: see :meth:`~.redis.Tally.keep`) and the error propagates. One push
        of a tally at a time (:attr:`~.redis.Tally.pushing`): a caller waits for the push in
        flight, so once this returns, every count the tally held when it was called is in."""
        with tally.pushing:
            batch = tally.take()
            if batch is None:
                return
            try:
                self.push(*batch)
            except BaseException:
                tally.keep(batch)
                raise

    @abstractmethod
    def watermark(self) -> int | None:
        """The last minute the rollup copied to the database, if known."""

    @abstractmethod
    def advance_watermark(self, minute: int) -> None:
        """Record that every minute up to ``minute`` is in the database (never moves back)."""

    @abstractmethod
    def take_late(self) -> set[int]:
        """Minutes that :meth:`push` wrote to since the last call, and forget them."""

    @abstractmethod
    def return_late(self, minutes: Iterable[int]) -> None:
        """Give back minutes from :meth:`take_late` that the rollup could not copy."""


_SETTINGS_LINE = re.compile(r"^local USAGE_TTL, USAGE_TOP\b.*-- @settings.*$", re.MULTILINE)


def top_per_shard(shards: int) -> int:
    """Clients one shard's top list holds per minute and outcome: :data:`~.TOP_CLIENTS`
    spread over the shards (clients spread evenly over shards by their digest)."""
    return max(1, math.ceil(TOP_CLIENTS / max(1, shards)))


def lua_source(shards: int) -> str:
    """``usage.lua`` with :data:`~.USAGE_TTL` and the per-shard top size written
    in."""
    line = f"local USAGE_TTL, USAGE_TOP = {USAGE_TTL}, {top_per_shard(shards)} -- @settings"
    text, found = _SETTINGS_LINE.subn(line, lua_file("usage.lua"), count=1)
    if not found:  # pragma: no cover - the file ships with the line
        raise RuntimeError("usage.lua lost its '-- @settings' line")
    return text


#: Read script calls per pipeline round trip.
BATCH = 64
#: Minutes one read script call covers: bounds how long it holds the server.
MINUTES_PER_CALL = 10
#: Entries (totals and client counts, see :meth:`RedisUsage.push`) per push script call
#: (bounds how long one call holds the server).
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


class RedisUsage(UsageStore):
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
        """On the backend's own client (short timeouts): the first call of every report,
        rollup and dashboard, so a Redis that accepts connections and answers nothing fails
        them within the request path's timeout, not :data:`READ_TIMEOUT` per call."""
        seconds, _ = self._short_read(self.push_client.time)
        return int(seconds) // 60

    def _short_read(self, func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)`` on the backend's own client. On a cluster a failure names the
        primaries that do not answer: the call went to one node (the key's, or any for
        ``TIME``) and redis-py before 5.1 leaves the node out of its timeout messages, while
        the operator needs to know which one to look at."""
        try:
            return call_backend(func, *args)
        except BackendError as exc:
            if self._cluster is None:
                raise
            down = [f"{h.name} ({h.error})" for h in self._cluster.primaries_health() if h.error]
            if not down:
                raise
            named = f"{exc}; {', '.join(down)} did not answer"
            if isinstance(exc, NodeUnavailable):
                raise NodeUnavailable(named, exc.retry_after) from exc
            raise BackendError(named) from exc

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
        """Push the backend's :class:`~.redis.Tally` now (a report read in this process
        sees its own decisions; other processes' arrive within
        :data:`~.redis.PUSH_EVERY`)."""
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
        counts: Sequence[PendingCount],
        seen: Mapping[str, int] | None = None,
    ) -> None:
        """One ``usage_push.lua`` call per shard and :data:`PUSH_CHUNK` entries, pipelined.
        The counts are summed here first: each shard gets each exact total (minute, outcome,
        usage field) once, and each client once per minute and outcome, so the script's work
        grows with the distinct totals and clients, not with the counts.

        Per shard, minute and outcome at most :attr:`top_size` clients are sent: those with the
        most requests in this batch (:func:`_heaviest`). The last use of every API key client in
        ``seen`` is sent apart from the counts, so it stays exact whether or not the key's count
        is sent. Why that loses nothing that was exact: a batch with more distinct clients for
        one shard, minute and outcome than a top list holds fills that minute's list whatever it
        held before (each client sent is added, the smallest making room once it is full), so
        the minute is read as full and reported as an estimate either way
        (:attr:`MinuteCounts.full`, and for rolled-up minutes the rollup's own count of
        clients). Dropping the batch's smallest client counts changes only those per-client
        figures: the totals per tier, endpoint and outcome are sent whole, and the batch's
        heaviest clients always are. What is lost: the per-client counts no longer add up to the
        total in such a minute, and a client dropped from a batch misses those requests. Each
        count dropped is at most the smallest of the :attr:`top_size` (K) counts sent beside it,
        so a client loses at most 1/K of its shard's requests of that minute and outcome, and
        every client above 2/K of them is still listed (above 1/K when nothing is dropped). A
        batch with room sends every client."""
        shards = len(self.tags)
        # Per shard tag: totals by (minute, "<letter><field>"), clients by (minute, letter,
        # client), requests summed; dicts keep the order counts came in.
        by_tag: dict[str, tuple[dict[tuple[int, str], int], dict[tuple[int, str, str], int]]] = {}
        tag_of: dict[str, str] = {}
        for minute, field, client, letter, n in counts:
            if not n or minute < 0:  # nothing to add (the script skips such counts too)
                continue
            tag = tag_of.get(client)
            if tag is None:
                # The client's own shard, where its counters live: one slot per client.
                tag = tag_of[client] = self.tags[shard_of(client, shards)]
            found = by_tag.get(tag)
            if found is None:
                found = by_tag[tag] = ({}, {})
            totals, clients = found
            total = (minute, letter + field)
            totals[total] = totals.get(total, 0) + n
            if letter in MEASURE_LETTERS:  # a measure has totals only
                continue
            listed = (minute, letter, client)
            clients[listed] = clients.get(listed, 0) + n
        # API keys' last use, in their own shard's first call (whether their counts are sent).
        used: dict[str, list[tuple[str, int]]] = {}
        for client, second in (seen or {}).items():
            if client[:4] == "key:" and second > 0:
                tag = tag_of.get(client) or self.tags[shard_of(client, shards)]
                used.setdefault(tag, []).append((client, second))
                by_tag.setdefault(tag, ({}, {}))
        calls: list[Call] = []
        for tag, (totals, clients) in sorted(by_tag.items()):
            # A total may be negative (a correction: Tally.refuse); a top list only grows.
            entries: list[tuple[bool, int, str, str, int]] = [
                (True, minute, "", field, n) for (minute, field), n in totals.items() if n
            ]
            sent = [(key, n) for key, n in clients.items() if n > 0]
            if len(sent) > self.top_size:
                sent = _heaviest(sent, self.top_size)
            entries += [(False, minute, letter, client, n) for (minute, letter, client), n in sent]
            keys_used = used.get(tag, ())
            if not entries and not keys_used:  # counts that cancelled out
                continue
            for start in range(0, max(1, len(entries)), PUSH_CHUNK):
                piece = entries[start : start + PUSH_CHUNK]
                calls.append(_push_call(tag, f"{batch}:{start}", piece, keys_used))
                keys_used = ()
        self._evalsha_all(self.push_client, self._push_sha, self._push_source, calls)

    def _evalsha_all(self, client: Any, sha: str, source: str, calls: Sequence[Call]) -> list[Any]:
        if self._cluster is not None:
            return list(self._cluster.evalsha_all(sha, source, calls, client))
        return evalsha_all(client, sha, source, calls)

    def watermark(self) -> int | None:
        value = self._short_read(self.push_client.get, self._watermark_key)  # a small read
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
            pipe.expire(late, USAGE_TTL)
            call_backend(pipe.execute)


def _heaviest(
    listed: list[tuple[tuple[int, str, str], int]], size: int
) -> list[tuple[tuple[int, str, str], int]]:
    """Of ``listed`` client counts (``((minute, letter, client), n)``, in the order they
    came in), per minute and outcome letter the ``size`` with the largest ``n`` (an earlier
    one first among equals), kept in their order."""
    groups: dict[tuple[int, str], list[int]] = {}
    for at, ((minute, letter, _), _n) in enumerate(listed):
        groups.setdefault((minute, letter), []).append(at)
    keep: list[int] = []
    for group in groups.values():
        if len(group) <= size:
            keep += group
        else:
            keep += heapq.nsmallest(size, group, key=lambda at: (-listed[at][1], at))
    keep.sort()
    return [listed[at] for at in keep]


def _push_call(
    tag: str,
    mark: str,
    entries: Sequence[tuple[bool, int, str, str, int]],
    seen: Iterable[tuple[str, int]] = (),
) -> Call:
    """The ``usage_push.lua`` call of one shard ``tag`` for ``entries``: totals ``(True,
    minute, "", "<letter><field>", n)`` and client counts ``(False, minute, letter, client,
    n)``, grouped per top list (in the order they came in), and the API key clients' last
    ``seen`` seconds; each key once in KEYS, named by its index."""
    keys: list[Any] = [f"{tag}p{mark}", f"{tag}l", f"{tag}k"]
    index: dict[str, int] = {}
    head: list[Any] = []
    lists: dict[int, list[Any]] = {}
    for is_total, minute, letter, name, n in entries:
        key = f"{tag}u{minute}" if is_total else f"{tag}t{letter}{minute}"
        at = index.get(key)
        if at is None:
            keys.append(key)
            at = index[key] = len(keys)
        if is_total:
            head += (at, minute, name, n)
        else:
            lists.setdefault(at, []).extend((name, n))
    argv: list[Any] = [len(head) // 4, *head, len(lists)]
    for at, pairs in lists.items():
        argv += (at, len(pairs) // 2, *pairs)
    for client, second in seen:
        argv += (client, second)
    return keys, argv


def _read_call(
    tag: str, first: int, last: int, totals: str, clients: str
) -> tuple[list[str], tuple[int, int, str, str]]:
    """The KEYS and ARGV of one ``usage_read.lua`` call: every key it reads, in its order."""
    keys: list[str] = []
    for minute in range(first, last + 1):
        if totals == "1":
            keys.append(f"{tag}u{minute}")
        if clients == "1":
            keys += (f"{tag}t{letter}{minute}" for letter in LETTERS)
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
