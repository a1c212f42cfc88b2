"""The contract of a usage store: where a backend keeps per-minute usage counts, and the
:class:`Tally` each backend counts its decisions in before they reach the store.

A decision is counted in the process that made it (:class:`Tally`, no I/O), never in the
counting script, so the counting call touches the counters only. The tally is pushed to the
store in one pipelined call at most once per :data:`PUSH_EVERY` (``usage.accounting`` does it
on the next request once that second has passed, and a read of the store first pushes its own
backend's tally), so a worker that dies loses at most its last second's counts. The Redis and
memory backends push into the same keys (``lua/usage_push.lua``, read back by
:class:`~django_throttle.backends.redis_usage.RedisUsage`). Reports and the rollup
(:mod:`django_throttle.usage.reports`) read them through this contract.

Minutes are whole minutes since the Unix epoch. Counts per outcome are lists in
:data:`LETTERS` order (allowed, denied, shadow would-deny, failed open, failed closed).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

#: Prefix of a usage field counted only when the request is denied (see :meth:`Tally.add`):
#: the first calls of a request counted in several calls, whose outcome the last call counts.
IF_DENIED = "\x01"

#: One letter per outcome, in report column order: allowed, denied, shadow would-deny,
#: failed open, failed closed. The Lua scripts use the same letters.
LETTERS = "adsoc"
#: Position of each letter's count in a counts list.
SLOT = {letter: i for i, letter in enumerate(LETTERS)}
#: API keys whose last use a store remembers (per shard for Redis: ``lua/usage.lua``'s
#: ``KEYS_SEEN_MAX``); beyond it the least recently used are forgotten.
KEYS_SEEN_MAX = 10_000
#: Seconds a minute's usage counts live in the backend (3 hours): ``manage.py throttle_usage
#: --rollup`` copies them to the database and must run more often (it says when it did not).
#: Longer costs Redis memory for every minute kept, shorter loses minutes to a late cron job.
USAGE_TTL = 3 * 3600
#: Clients kept per minute and outcome (in Redis each key shard keeps its heaviest
#: ``ceil(TOP_CLIENTS / KEY_SHARDS)``). Beyond it a new client replaces the smallest and
#: inherits its count (Space-Saving): a minute's memory is bounded whatever the number of
#: clients, while every client with a noticeable share of the traffic is listed.
TOP_CLIENTS = 1000
#: Allowed requests stand in the per-client lists one in this many, each counting that many
#: (reports mark such figures as estimates). Decisions are counted in the process, where
#: every one costs the same, so every request is counted: 1.
CLIENT_SAMPLE = 1
#: Seconds between two pushes of a process's :class:`Tally`: what a worker that dies loses
#: at most, and how late another process's report may be.
PUSH_EVERY = 1.0
#: Most distinct counts a :class:`Tally` gathers between two pushes (beyond it new clients
#: count as ``(other)``; totals stay exact); a failed push's batch waits beside them.
MAX_KEPT = 10_000

#: (minute, usage field, client label, outcome letter, requests): one count kept in process
#: while the backend could not answer, pushed with :meth:`UsageStore.push`.
PendingCount = tuple[int, str, str, str, int]


@dataclass(slots=True)
class MinuteCounts:
    """One minute's counts. ``totals`` are exact, per usage field (tier and endpoint).
    ``clients`` are the top clients per outcome (heavy hitters, see ``lua/usage.lua``);
    ``full`` says a top list was full that minute, so clients beyond it were folded into the
    counts of those listed and per-client numbers are estimates."""

    totals: dict[str, list[int]] = field(default_factory=dict)
    clients: dict[str, list[int]] = field(default_factory=dict)
    full: bool = False


def add_to(table: dict[str, list[int]], key: str, slot: int, n: int) -> None:
    """Add ``n`` to ``table[key][slot]``, creating the row of zeros when missing."""
    row = table.get(key)
    if row is None:
        row = table[key] = [0] * len(LETTERS)
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
        next try (bounded: see :meth:`Tally.keep`) and the error propagates."""
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


#: (batch id, counts, API key clients' last second): one push of a :class:`Tally`.
Batch = tuple[str, list[PendingCount], dict[str, int]]


class Tally:
    """The decisions one backend made in this process, by minute, usage field, client and
    outcome, until they are pushed (:meth:`UsageStore.push_tally`).

    Thread safe; no I/O. ``clock`` (Unix seconds) names the minutes and says when a push is
    :meth:`due`. A forked child starts empty (its parent pushes what it counted)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, str, str, str], int] = {}
        self._seen: dict[str, int] = {}
        self._unsent: list[Batch] = []
        self._next = 0.0
        self._owner = os.getpid()
        #: Whether a push was due when the last decision was counted (:meth:`add`, on the
        #: clock it read anyway): what the request path tests after a call, without reading
        #: the clock again. :meth:`due` says for sure.
        self.waiting = False

    def add(self, field: str, client: str, allowed: bool, shadow: bool, now: float | None) -> None:
        """Count one decision under usage ``field`` (a field starting with :data:`IF_DENIED`
        only if it denied): allowed, denied, or ``shadow`` (allowed, a shadow limit would have
        denied). ``now`` (Unix seconds) stands for the clock, as the decision's did."""
        if field[:1] == IF_DENIED:
            if allowed:
                return
            field = field[1:]
        letter = ("s" if shadow else "a") if allowed else "d"
        when = self.clock() if now is None else now
        key = (int(when // 60), field, client, letter)
        self.waiting = when >= self._next
        with self._lock:
            if self._owner != os.getpid():
                self._forget()
            counts = self._counts
            if key not in counts and len(counts) >= MAX_KEPT:
                key = (key[0], field, "(other)", letter)
            counts[key] = counts.get(key, 0) + 1
            if client[:4] == "key:" and len(self._seen) < MAX_KEPT:
                second = int(when)
                if second > self._seen.get(client, -1):
                    self._seen[client] = second

    def due(self) -> bool:
        """Whether counts wait and :data:`PUSH_EVERY` has passed since the last push."""
        return bool(self._counts or self._unsent) and self.clock() >= self._next

    def take(self) -> Batch | None:
        """What to push now (a batch that failed before, first), or ``None``."""
        with self._lock:
            if self._owner != os.getpid():
                self._forget()
            self._next = self.clock() + PUSH_EVERY
            self.waiting = False
            if self._unsent:
                return self._unsent.pop(0)
            if not self._counts:
                return None
            counts = [(*key, n) for key, n in self._counts.items()]
            batch = (uuid.uuid4().hex, counts, self._seen)
            self._counts, self._seen = {}, {}
            return batch

    def keep(self, batch: Batch) -> None:
        """Keep a batch whose push failed, to try again first. A new batch is only made once
        none waits, so what is kept stays within twice :data:`MAX_KEPT` counts."""
        with self._lock:
            self._unsent.insert(0, batch)
            self.waiting = True

    def _forget(self) -> None:
        self._counts, self._seen, self._unsent = {}, {}, []
        self._owner = os.getpid()
