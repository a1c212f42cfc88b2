"""Usage counts of the memory backend: the in-process twin of ``lua/usage.lua``.

Same shape and rules as the Redis keys, without shards: per minute, exact counts per usage
field and outcome, and per outcome a top list of at most :data:`~.usage_base.TOP_CLIENTS`
clients kept with the Space-Saving rule (a new client in a full list replaces the smallest and
inherits its count). Minutes older than :data:`~.usage_base.USAGE_TTL` are dropped.

Counts live in this process only: ``manage.py throttle_usage`` in another process sees none.
Thread-safe (one lock); the memory backend calls :meth:`MemoryUsage.count` inside its own.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from django_throttle.backends import usage_base
from django_throttle.backends.usage_base import SLOT, MinuteCounts, add_to

__all__ = ["MemoryUsage"]


class MemoryUsage(usage_base.UsageStore):
    """Per-minute usage counts in process; ``clock`` (Unix seconds) gives the current minute
    for reports. Reads its settings when built (the backend is rebuilt when they change)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        # minute -> (totals: "<letter><field>" -> n, tops: letter -> client -> n,
        #            heaps: letter -> (n, client) entries, some stale, to find the smallest)
        self._minutes: dict[
            int,
            tuple[dict[str, int], dict[str, dict[str, int]], dict[str, list[tuple[int, str]]]],
        ] = {}
        self._full: set[int] = set()
        self._watermark: int | None = None
        self._late: set[int] = set()
        self._applied: set[str] = set()
        self._keys_seen: dict[str, int] = {}  # API key prefix -> last second used
        self.top_size = usage_base.TOP_CLIENTS
        self.sample = usage_base.CLIENT_SAMPLE
        self._keep = usage_base.USAGE_TTL // 60

    def count(
        self, now_us: float, field: str, client: str, outcome: str, n: int | None = None
    ) -> None:
        """Count ``n`` (default 1) requests of ``client`` under ``field`` and outcome letter
        ``outcome`` in the minute of ``now_us`` (whole microseconds). A single allowed request
        enters the top list one time in ``CLIENT_SAMPLE``, like the script, and the
        decision's own count (no ``n``) records an API key client's last use."""
        if n is None and client.startswith("key:"):
            self._note_key_use(client[4:], int(now_us // 1_000_000))
        sampled = n is None and outcome == "a" and self.sample > 1
        n = 1 if n is None else n
        minute = int(now_us // 60_000_000)
        top_size = self.top_size
        with self._lock:
            entry = self._minutes.get(minute)
            if entry is None:
                entry = self._minutes[minute] = ({}, {}, {})
                self._expire(minute)
            totals, tops, heaps = entry
            key = outcome + field
            totals[key] = totals.get(key, 0) + n
            if sampled:
                if int(now_us) % self.sample:
                    return
                n = self.sample
            top = tops.get(outcome)
            if top is None:
                top = tops[outcome] = {}
                heaps[outcome] = []
            heap = heaps[outcome]
            if client in top:
                top[client] += n
            elif len(top) < top_size:
                top[client] = n
            else:
                # ZPOPMIN's choice: the smallest count, ties to the lowest label. A heap with
                # stale entries skipped on the way finds it in O(log K), not a scan of K.
                while True:
                    smallest, label = heapq.heappop(heap)
                    if top.get(label) == smallest:
                        break
                del top[label]
                top[client] = smallest + n
                self._full.add(minute)
            heapq.heappush(heap, (top[client], client))
            if len(heap) > 4 * top_size + 64:  # stale entries: rebuild from the counts
                heap[:] = [(count, name) for name, count in top.items()]
                heapq.heapify(heap)

    def _note_key_use(self, prefix: str, second: int) -> None:
        """The script's ``note_key_use``: never moves back; the least recently used key is
        forgotten beyond :data:`~.usage_base.KEYS_SEEN_MAX`."""
        with self._lock:
            seen = self._keys_seen
            if prefix in seen:
                seen[prefix] = max(seen[prefix], second)
                return
            seen[prefix] = second
            # Rare: only when a new key arrives at the bound.
            if len(seen) > usage_base.KEYS_SEEN_MAX:
                del seen[min(seen, key=lambda name: (seen[name], name))]

    def keys_last_used(self, prefixes: Iterable[str] | None = None) -> dict[str, int]:
        with self._lock:
            seen = dict(self._keys_seen)
        if prefixes is None:
            return seen
        return {prefix: seen[prefix] for prefix in prefixes if prefix in seen}

    def _expire(self, minute: int) -> None:
        oldest = minute - self._keep
        for old in [m for m in self._minutes if m < oldest]:
            del self._minutes[old]
            self._full.discard(old)

    def now_minute(self) -> int:
        return int(self.clock() // 60)

    def read(
        self, minutes: Sequence[int], *, totals: bool = True, clients: bool = True
    ) -> dict[int, MinuteCounts]:
        found: dict[int, MinuteCounts] = {}
        with self._lock:
            for minute in minutes:
                entry = self._minutes.get(minute)
                if entry is None:
                    continue
                counts = found[minute] = MinuteCounts(full=minute in self._full and clients)
                if totals:
                    for key, n in entry[0].items():
                        add_to(counts.totals, key[1:], SLOT[key[0]], n)
                if clients:
                    for letter, top in entry[1].items():
                        for client, n in top.items():
                            add_to(counts.clients, client, SLOT[letter], n)
        return found

    def push(self, batch: str, counts: Sequence[usage_base.PendingCount]) -> None:
        with self._lock:
            if batch in self._applied:
                return
            if len(self._applied) >= 10_000:  # bounded; a retry comes soon after its batch
                self._applied.clear()
            self._applied.add(batch)
        for minute, field, client, letter, n in counts:
            if letter in usage_base.LETTERS and n >= 1:
                self.count(minute * 60_000_000.0, field, client, letter, n)
                with self._lock:
                    self._late.add(minute)
        with self._lock:
            # Bounded like the script's <tag>l: a minute whose counts have expired has nothing
            # left to copy.
            self._late.intersection_update(self._minutes)

    def watermark(self) -> int | None:
        return self._watermark

    def advance_watermark(self, minute: int) -> None:
        with self._lock:
            if self._watermark is None or minute > self._watermark:
                self._watermark = minute

    def take_late(self) -> set[int]:
        with self._lock:
            late, self._late = self._late, set()
        return late

    def return_late(self, minutes: Iterable[int]) -> None:
        with self._lock:
            self._late.update(minutes)
