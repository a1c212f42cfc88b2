"""In-process backend with the same semantics as the Redis scripts, for development, tests and
the per-process fallback of failure mode ``"local"``.

State lives in this process only: use it with one process, or accept per-process limits. It is
thread-safe (one lock) and takes an injectable ``clock`` so tests can move time by hand.
``max_entries`` bounds memory: beyond it the least recently used (client, limit) states are
forgotten (those clients get a full bucket back).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from django_throttle.backends.base import Backend, BackendError, decision_from
from django_throttle.rates import MAX_COUNT, Algorithm, Decision, Limit

if TYPE_CHECKING:
    from django_throttle.backends.memory_usage import MemoryUsage

#: Same tolerance as the Lua prelude, in tokens.
TOLERANCE = 1e-9
_SWEEP_EVERY = 4096

State = tuple[float, float]


def _used(state: State | None, now: float, capacity: int, interval: float) -> float:
    """Tokens used as of ``now``, within [0, capacity]: the twin of ``token_bucket_used``."""
    if state is None:
        return 0.0
    used = min(state[0], capacity) - max(0.0, now - state[1]) / interval
    return 0.0 if used < 0 else used


def token_bucket(
    state: State | None, now: float, capacity: int, interval: float, cost: int
) -> tuple[bool, State | None, int, float, float]:
    """Python twin of ``lua/token_bucket.lua``: (allowed, new_state, remaining, reset, retry).

    Times are whole microseconds; ``state`` is (tokens used, timestamp). The state's expiry
    (the script's TTL) is ``new_state[0] * interval`` after ``now``. Like the script, it keeps
    16 significant digits of what was used and answers from that stored value.
    """
    used = 0.0
    if state is not None:  # _used, inlined: this is the hot path
        used, elapsed = state[0], now - state[1]
        if used > capacity:
            used = capacity
        if elapsed > 0:
            used -= elapsed / interval
            if used < 0:
                used = 0.0
    after = used + cost
    if after <= capacity + TOLERANCE:
        after = float(f"{after:.16g}")
        remaining = max(0, math.floor(capacity - after + TOLERANCE))
        reset = (after - TOLERANCE / 2) * interval
        return True, (after, now), remaining, reset if reset > 0 else 0.0, 0.0
    remaining = max(0, math.floor(capacity - used + TOLERANCE))
    reset = max(0.0, (used - TOLERANCE / 2) * interval)
    return False, None, remaining, reset, max(0.0, (after - capacity - TOLERANCE / 2) * interval)


def token_bucket_ttl(state: State, now: float, capacity: int, interval: float) -> float:
    """Microseconds until ``state`` no longer matters under this capacity and interval."""
    return _used(state, now, capacity, interval) * interval


_ALGORITHMS = {Algorithm.TOKEN_BUCKET.value: token_bucket}
_TTLS = {Algorithm.TOKEN_BUCKET.value: token_bucket_ttl}


class MemoryBackend(Backend):
    """Counts in an ordered dict guarded by a lock; expired state is swept as it is met."""

    def __init__(
        self, clock: Callable[[], float] = time.time, max_entries: int | None = None
    ) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.clock = clock
        self.max_entries = max_entries
        self._lock = threading.Lock()
        # (client, limit id) -> (state, expiry in µs). Bounded: an ordered dict kept least
        # recently used first; unbounded: a plain dict, cheaper per hit.
        self._lru: OrderedDict[tuple[str, str], tuple[State, float]] | None = (
            None if max_entries is None else OrderedDict()
        )
        self._state: dict[tuple[str, str], tuple[State, float]] = (
            {} if self._lru is None else self._lru
        )
        self._version = 0
        self._calls = itertools.count()
        self._usage: MemoryUsage | None = None

    def __len__(self) -> int:
        return len(self._state)

    @property
    def usage(self) -> MemoryUsage:
        """This backend's usage counters (the Redis script's usage keys' twin)."""
        if self._usage is None:
            from django_throttle.backends.memory_usage import MemoryUsage

            self._usage = MemoryUsage(clock=self.clock)
        return self._usage

    def hit(
        self,
        client: str,
        limits: Sequence[Limit],
        cost: int = 1,
        *,
        now: float | None = None,
        usage: str | None = None,
    ) -> Decision:
        return self._run(client, limits, cost, now, consume=True, usage=usage)

    async def ahit(
        self,
        client: str,
        limits: Sequence[Limit],
        cost: int = 1,
        *,
        now: float | None = None,
        usage: str | None = None,
    ) -> Decision:
        """In-process and lock-held for microseconds: no need for a thread."""
        return self._run(client, limits, cost, now, consume=True, usage=usage)

    def peek(self, client: str, limits: Sequence[Limit], *, now: float | None = None) -> Decision:
        return self._run(client, limits, 0, now, consume=False)

    def reset(self, client: str, limits: Sequence[Limit]) -> None:
        with self._lock:
            for limit in limits:
                self._state.pop((client, limit.id), None)

    def retime(self, limits: Sequence[Limit], *, now: float | None = None) -> int:
        now_us = float(round((self.clock() if now is None else now) * 1e6))
        by_id = {limit.id: limit for limit in limits}
        touched = 0
        with self._lock:
            for key, (state, expires) in list(self._state.items()):
                limit = by_id.get(key[1])
                if limit is None or expires <= now_us:  # gone, as its Redis key would be
                    continue
                ttl = _TTLS[limit.algorithm](state, now_us, limit.burst, limit.rate.interval * 1e6)
                self._state[key] = (state, now_us + ttl)  # PEXPIRE's twin
                touched += 1
        return touched

    def get_policy_version(self) -> str | None:
        return str(self._version)

    def bump_policy_version(self) -> None:
        with self._lock:
            self._version += 1

    def _run(
        self,
        client: str,
        limits: Sequence[Limit],
        cost: int,
        now: float | None,
        consume: bool,
        usage: str | None = None,
    ) -> Decision:
        if not 0 <= cost <= MAX_COUNT or cost % 1:
            raise BackendError(f"cost must be a whole number in [0, {MAX_COUNT}], not {cost!r}")
        # Whole microseconds, like the server clock the script reads.
        now_us = float(round((self.clock() if now is None else now) * 1e6))
        states, lru = self._state, self._lru
        with self._lock:
            if next(self._calls) % _SWEEP_EVERY == 0:
                self._sweep(now_us)
            allowed, shadow_denied = True, False
            pick, pick_remaining, pick_reset, pick_retry = -1, -1, 0.0, -1.0
            writes: list[tuple[tuple[str, str], tuple[State, float]]] = []
            for i, limit in enumerate(limits):
                key = (client, limit.id)
                entry = states.get(key)
                if lru is not None and entry is not None:
                    lru.move_to_end(key)
                ok, new_state, remaining, reset, retry = _ALGORITHMS[limit.algorithm](
                    None if entry is None or entry[1] <= now_us else entry[0],
                    now_us,
                    limit.burst,
                    limit.rate.interval * 1e6,
                    min(cost, limit.burst),
                )
                if ok:
                    assert new_state is not None
                    # The TTL's twin: reset is the time until full, to within the tolerance.
                    writes.append((key, (new_state, now_us + reset)))
                    if (
                        not limit.shadow
                        and allowed
                        and (pick_remaining < 0 or remaining < pick_remaining)
                    ):
                        pick, pick_remaining, pick_reset = i, remaining, reset
                elif limit.shadow:
                    shadow_denied = True
                else:
                    if allowed or retry > pick_retry:
                        pick, pick_remaining, pick_reset, pick_retry = i, remaining, reset, retry
                    allowed = False
            if allowed and consume:
                states.update(writes)
                if lru is not None:
                    bound = self.max_entries or 0
                    while len(lru) > bound:
                        lru.popitem(last=False)
            if consume and usage and limits:
                outcome = ("s" if shadow_denied else "a") if allowed else "d"
                self.usage.count(now_us, usage, client, outcome)
        return decision_from(
            limits,
            allowed,
            pick,
            max(pick_remaining, 0),
            math.ceil(pick_reset),
            0 if allowed else math.ceil(pick_retry),
            shadow_denied,
        )

    def _sweep(self, now_us: float) -> None:
        """Drop state past its expiry (the bucket is full again): the Redis TTL's twin."""
        expired = [key for key, (_, expires) in self._state.items() if expires <= now_us]
        for key in expired:
            del self._state[key]
