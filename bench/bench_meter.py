"""Timing for ``bench_throttle.py``: the items a path runs on, and interleaved slices.

Timing sums only the time inside each call of a path's ``step`` (``perf_counter_ns`` around
the call), and a path's ``settle`` at the end of each slice: building request objects,
fetching users and the loop itself are outside it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


class Source:
    """The items a path is called with, built on demand outside the timing.

    ``make(start, n)`` builds items ``start .. start + n - 1``. With ``total``, indices never
    repeat until ``total`` items were handed out (then they wrap, and ``wrapped`` says how
    often): a "never seen" client stays never seen. Items taken and not used go back.
    """

    def __init__(self, make: Callable[[int, int], list[Any]], total: int | None = None) -> None:
        self.make = make
        self.total = total
        self.next = 0
        self.wrapped = 0
        self.handed_out = 0
        self._back: list[Any] = []

    def take(self, n: int) -> list[Any]:
        items = self._back[:n]
        del self._back[:n]
        while len(items) < n:
            want = n - len(items)
            if self.total is not None:
                if self.next >= self.total:
                    self.next = 0
                    self.wrapped += 1
                want = min(want, self.total - self.next)
            items.extend(self.make(self.next, want))
            self.next += want
        self.handed_out += n
        return items

    def give_back(self, items: Sequence[Any]) -> None:
        self._back[:0] = items
        self.handed_out -= len(items)


def constant(item: Any) -> Source:
    """A source handing out one item again and again (one hot client)."""
    return Source(lambda start, n: [item] * n)


@dataclass
class Path:
    """One benchmarked path: ``step(item)`` is exactly what is timed."""

    key: str
    label: str
    step: Callable[[Any], object]
    source: Source
    #: Commands whose keys are this path's stored state (for MEMORY USAGE), or () for none.
    state_commands: tuple[str, ...] = ()
    #: One client again and again.
    hot: bool = False
    #: Whether each decision stores state for a new client (else no used_memory figure).
    fresh_keys: bool = True
    #: Called at the end of each slice, its time added to the slice's (not to a call's
    #: latency): work the path's calls leave to be done later, such as pushing their usage
    #: counts, so each path pays for its own.
    settle: Callable[[], object] | None = None
    rates: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    last_rate: float = 2000.0


def run_slice(path: Path, seconds: float) -> None:
    """Call the path for ``seconds`` of time inside its step; record the rate and latencies."""
    budget = int(seconds * 1e9)
    step = path.step
    clock = time.perf_counter_ns
    samples: list[int] = []
    spent = 0
    while spent < budget:
        items = path.source.take(max(16, int(path.last_rate * seconds * 1.2)))
        for used, item in enumerate(items, 1):
            start = clock()
            step(item)
            took = clock() - start
            samples.append(took)
            spent += took
            if spent >= budget:
                path.source.give_back(items[used:])
                break
    if path.settle is not None:
        start = clock()
        path.settle()
        spent += clock() - start
    rate = len(samples) / (spent / 1e9)
    path.last_rate = rate
    path.rates.append(rate)
    path.samples.extend(samples)


def interleave(paths: Sequence[Path], seconds: float, slice_seconds: float) -> int:
    """Run every path for ``seconds`` in slices of about ``slice_seconds``, round-robin with a
    rotating start, so drift on a shared machine hits all paths alike. Returns the rounds."""
    rounds = max(3, round(seconds / slice_seconds))
    for number in range(rounds):
        shift = number % len(paths)
        for path in [*paths[shift:], *paths[:shift]]:
            run_slice(path, seconds / rounds)
    return rounds


def percentile(values: Sequence[int], share: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(share * len(ordered)))])


def ratio_median(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median of per-round ratios: each round's paths ran back to back."""
    return statistics.median(a / b for a, b in zip(numerators, denominators, strict=True))
