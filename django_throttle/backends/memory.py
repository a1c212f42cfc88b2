"""In-process backend with the same semantics as the Redis scripts, for development and tests.

State lives in this process only: use it with one process, or accept per-process limits. It is
thread-safe (one lock) and takes an injectable ``clock`` so tests can move time by hand.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence

from django_throttle.backends.base import Backend, decision_from
from django_throttle.rates import Algorithm, Decision, Limit

#: Same tolerance as the Lua prelude, in tokens.
TOLERANCE = 1e-9
_SWEEP_EVERY = 4096

State = tuple[float, float]


def token_bucket(
    state: State | None, now: float, capacity: int, interval: float, cost: int
) -> tuple[bool, State | None, int, float, float]:
    """Python twin of ``lua/token_bucket.lua``: (allowed, new_state, remaining, reset, retry).

    Times are microseconds; ``state`` is (tokens used, timestamp).
    """
    used = 0.0
    if state is not None:
        used = max(0.0, state[0] - max(0.0, now - state[1]) / interval)
    after = used + cost
    if after <= capacity + TOLERANCE:
        refill = after * interval
        remaining = max(0, math.floor(capacity - after + TOLERANCE))
        return True, (after, now), remaining, refill, 0.0
    remaining = max(0, math.floor(capacity - used + TOLERANCE))
    return False, None, remaining, used * interval, (after - capacity) * interval


_ALGORITHMS = {Algorithm.TOKEN_BUCKET.value: token_bucket}


class MemoryBackend(Backend):
    """Counts in a dict guarded by a lock; expired state is swept as it is met."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._state: dict[tuple[str, str], tuple[State, float]] = {}
        self._version = 0
        self._calls = itertools.count()

    def hit(
        self, client: str, limits: Sequence[Limit], cost: int = 1, *, now: float | None = None
    ) -> Decision:
        return self._run(client, limits, cost, now, consume=True)

    def peek(self, client: str, limits: Sequence[Limit], *, now: float | None = None) -> Decision:
        return self._run(client, limits, 0, now, consume=False)

    def reset(self, client: str, limits: Sequence[Limit]) -> None:
        with self._lock:
            for limit in limits:
                self._state.pop((client, limit.id), None)

    def get_policy_version(self) -> str | None:
        return str(self._version)

    def bump_policy_version(self) -> None:
        with self._lock:
            self._version += 1

    def _run(
        self, client: str, limits: Sequence[Limit], cost: int, now: float | None, consume: bool
    ) -> Decision:
        now_us = (self.clock() if now is None else now) * 1e6
        with self._lock:
            if next(self._calls) % _SWEEP_EVERY == 0:
                self._sweep(now_us)
            allowed, shadow_denied = True, False
            pick, pick_remaining, pick_reset, pick_retry = 0, -1, 0.0, -1.0
            spick, spick_remaining, spick_reset = 0, -1, 0.0  # when only shadow limits apply
            writes: list[tuple[tuple[str, str], tuple[State, float]]] = []
            for i, limit in enumerate(limits):
                key = (client, limit.id)
                entry = self._state.get(key)
                ok, new_state, remaining, reset, retry = _ALGORITHMS[limit.algorithm](
                    None if entry is None or entry[1] <= now_us else entry[0],
                    now_us,
                    limit.burst,
                    limit.rate.interval * 1e6,
                    min(cost, limit.burst),
                )
                if ok:
                    assert new_state is not None
                    writes.append((key, (new_state, now_us + reset)))
                    if limit.shadow:
                        if spick_remaining < 0 or remaining < spick_remaining:
                            spick, spick_remaining, spick_reset = i, remaining, reset
                    elif allowed and (pick_remaining < 0 or remaining < pick_remaining):
                        pick, pick_remaining, pick_reset = i, remaining, reset
                elif limit.shadow:
                    shadow_denied = True
                else:
                    if allowed or retry > pick_retry:
                        pick, pick_remaining, pick_reset, pick_retry = i, remaining, reset, retry
                    allowed = False
            if allowed and consume:
                self._state.update(writes)
            if allowed and pick_remaining < 0 <= spick_remaining:
                pick, pick_remaining, pick_reset = spick, spick_remaining, spick_reset
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
