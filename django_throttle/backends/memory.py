"""In-process backend with the same semantics as the Redis scripts, for development, tests and
the per-process fallback of failure mode ``"local"``.

Every algorithm's decision is its script's twin, bit for bit (memory_algorithms), and every
state expires at the millisecond its Redis key would. State lives in this process only: use it
with one process, or accept per-process limits. It is thread-safe (one lock) and takes an
injectable ``clock`` so tests can move time by hand. ``max_entries`` bounds memory: beyond it
the least recently used (client, limit) states are forgotten (those clients start afresh).
A shared limit keeps one state per (key shard, limit), as the Redis keys do, so both backends
admit the same requests.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django_throttle.backends.base import (
    ALGORITHM_CODES,
    ArgumentRefused,
    Backend,
    Limits,
    LimitsCache,
    Now,
    Taken,
    Usage,
    decision_from,
    per_shard,
    shard_of,
)
from django_throttle.backends.memory_algorithms import Compiled, compile_limit, expiry_ms
from django_throttle.backends.usage_base import IF_DENIED
from django_throttle.rates import MAX_COUNT, Decision, Limit

__all__ = ["MemoryBackend"]

if TYPE_CHECKING:
    from django_throttle.backends.memory_usage import MemoryUsage

_SWEEP_EVERY = 4096

#: (client, limit id, algorithm code): like the Redis key, a limit's algorithm is part of its
#: counter's name, so changing it starts the counter afresh. A shared limit's state has the
#: key shard (an int, never equal to a client's text) in place of the client.
Key = tuple[str | int, str, str]
#: (algorithm state, last millisecond it lives): the Redis key and its PX expiry.
Entry = tuple[Any, int]


class MemoryBackend(Backend):
    """Counts in an ordered dict guarded by a lock; expired state is swept as it is met.
    In-process and lock-held for microseconds, its async methods need no thread."""

    blocking = False

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        max_entries: int | None = None,
        shards: int | None = None,
    ) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.clock = clock
        self.max_entries = max_entries
        # Key shards of shared limits: DJANGO_THROTTLE_KEY_SHARDS, read when first needed.
        self._shards = shards
        self._lock = threading.Lock()
        # Key -> Entry. Bounded: an ordered dict kept least recently used first; unbounded: a
        # plain dict, cheaper per hit.
        self._lru: OrderedDict[Key, Entry] | None = None if max_entries is None else OrderedDict()
        self._state: dict[Key, Entry] = {} if self._lru is None else self._lru
        # Limit lists compiled once, by identity (the policy snapshot reuses its tuples).
        self._compiled: LimitsCache[tuple[Compiled, ...]] = LimitsCache()
        self._version = 0
        self._calls = itertools.count()

    def __len__(self) -> int:
        return len(self._state)

    @cached_property
    def usage(self) -> MemoryUsage:
        """This backend's usage counters (the Redis script's usage keys' twin)."""
        from django_throttle.backends.memory_usage import MemoryUsage

        return MemoryUsage(clock=self.clock)

    def refund(
        self, client: str, limits: Limits, cost: int = 1, *, now: Now = None, taken_at: Taken = None
    ) -> None:
        """Give ``cost`` back to every limit, each by its algorithm's rule (refund.lua's
        twin, see memory_algorithms), under the lock: one atomic step. ``taken_at``: see
        :meth:`Backend.refund`."""
        cost = _whole(cost)
        now_us = self._now_us(now)
        now_ms = now_us // 1000
        states = self._state
        with self._lock:
            for spec in self._specs(limits):
                key = self._key(client, spec)
                entry = states.get(key)
                if entry is None or not cost:
                    continue
                if entry[1] < now_ms:  # expired: missing, as its Redis key would be
                    del states[key]
                    continue
                taken = min(cost, spec.capacity)
                state, ttl = spec.twin.refund(
                    entry[0], now_us, spec.capacity, spec.param, taken, taken_at
                )
                self._store(key, state, ttl, now_us)

    def _store(self, key: Key, state: Any, ttl: float | None, now_us: int) -> None:
        """Keep what a refund or a retime made of a state: nothing to write (a TTL of
        ``None``: left as it is), or deleted when it no longer matters (no state, or a TTL of
        0 or less: the scripts delete the key), else written with its new expiry."""
        if ttl is None:
            return
        if state is None or ttl <= 0:
            del self._state[key]
        else:
            self._state[key] = (state, expiry_ms(now_us, ttl))

    def reset(self, client: str, limits: Limits) -> None:
        """Forget the client's states; for a shared limit, its shard's (everyone's there)."""
        with self._lock:
            for limit in limits:
                owner = shard_of(client, self.shards) if limit.shared else client
                self._state.pop((owner, limit.id, ALGORITHM_CODES[limit.algorithm]), None)

    def reset_shared(self, limits: Limits) -> None:
        """Forget every shard's state of these shared limits."""
        with self._lock:
            for limit in limits:
                for shard in range(self.shards) if limit.shared else ():
                    self._state.pop((shard, limit.id, ALGORITHM_CODES[limit.algorithm]), None)

    @property
    def shards(self) -> int:
        if self._shards is None:
            from django_throttle.conf import app_settings

            self._shards = app_settings.KEY_SHARDS
        return self._shards

    def _key(self, client: str, spec: Compiled) -> Key:
        if spec.shared:
            return (shard_of(client, self.shards), spec.id, spec.twin.code)
        return (client, spec.id, spec.twin.code)

    def _now_us(self, now: Now) -> int:
        """Whole microseconds, like the server clock the scripts read."""
        return round((self.clock() if now is None else now) * 1e6)

    def retime(self, limits: Limits, *, now: Now = None, previous: Limits | None = None) -> int:
        """Re-time every live state of these limits (retime.lua's twin): each algorithm's edit
        rule from the state and, for GCRA, the limit before the edit (``previous[i]``)."""
        now_us = self._now_us(now)
        touched = 0
        with self._lock:
            olds: Sequence[Limit | None] = previous or [None] * len(limits)
            for limit, old in zip(limits, olds, strict=True):
                spec = compile_limit(per_shard(limit, self.shards) if limit.shared else limit)
                twin, old_param = spec.twin, None
                if old is not None and old.algorithm == limit.algorithm:
                    old_param = twin.param(per_shard(old, self.shards))
                # A shared limit's states are keyed by shard (int), the others by client.
                owner = int if limit.shared else str
                for key, (state, expires) in list(self._state.items()):
                    if key[1] != limit.id or key[2] != twin.code or type(key[0]) is not owner:
                        continue
                    if expires < now_us // 1000:  # gone, as its Redis key would be
                        del self._state[key]
                        continue
                    touched += 1
                    state, ttl = twin.retime(state, now_us, spec.capacity, spec.param, old_param)
                    self._store(key, state, ttl, now_us)
        return touched

    def get_policy_version(self) -> str | None:
        return str(self._version)

    def bump_policy_version(self) -> None:
        with self._lock:
            self._version += 1

    def _specs(self, limits: Limits) -> tuple[Compiled, ...]:
        found = self._compiled.get(limits)
        if found is None:
            found = tuple(
                compile_limit(per_shard(limit, self.shards) if limit.shared else limit)
                for limit in limits
            )
            self._compiled.put(limits, found)
        return found

    def count(
        self, client: str, limits: Limits, cost: int, now: Now, usage: Usage, peek: bool = False
    ) -> Decision:
        cost = _whole(cost)
        now_us = self._now_us(now)
        now_ms = now_us // 1000
        states, lru = self._state, self._lru
        with self._lock:
            specs = self._specs(limits)
            if next(self._calls) % _SWEEP_EVERY == 0:
                self._sweep(now_ms)
            allowed, shadow_denied = True, False
            pick, pick_remaining, pick_reset, pick_retry = -1, -1, 0.0, -1.0
            writes: list[tuple[Key, Any, float, Any]] = []
            for i, spec in enumerate(specs):
                twin = spec.twin
                key = (client, spec.id, twin.code) if not spec.shared else self._key(client, spec)
                entry = states.get(key)
                if entry is not None and lru is not None:
                    lru.move_to_end(key)
                state = entry[0] if entry is not None and entry[1] >= now_ms else None
                capacity = spec.capacity
                ok, remaining, reset, retry, pending, ttl = twin.decide(
                    state, now_us, capacity, spec.param, cost if cost < capacity else capacity
                )
                if ok:
                    if pending is not None:
                        writes.append((key, pending, ttl, twin.commit))
                    # The enforced limit with the fewest tokens left (none picked yet: -1).
                    if not spec.shadow and allowed and not 0 <= pick_remaining <= remaining:
                        pick, pick_remaining, pick_reset = i, remaining, reset
                elif spec.shadow:
                    shadow_denied = True
                else:
                    if allowed or retry > pick_retry:
                        pick, pick_remaining, pick_reset, pick_retry = i, remaining, reset, retry
                    allowed = False
            if allowed and not peek:
                for key, pending, ttl, commit in writes:
                    if commit is not None:
                        entry = states.get(key)
                        live = entry is not None and entry[1] >= now_ms
                        pending = commit(entry[0] if live else None, pending)  # type: ignore[index]
                    states[key] = (pending, expiry_ms(now_us, ttl))
                while lru is not None and len(lru) > (self.max_entries or 0):
                    lru.popitem(last=False)
            if usage and limits and not peek:
                if usage[0] == IF_DENIED:  # lua/driver.lua: counted only when denied
                    usage = usage[1:] if not allowed else ""
                if usage:
                    outcome = ("s" if shadow_denied else "a") if allowed else "d"
                    self.usage.count(now_us, usage, client, outcome)
        stamped = allowed and not peek and any(spec.twin.code in STAMPED_CODES for spec in specs)
        return decision_from(
            limits,
            allowed,
            pick,
            max(pick_remaining, 0),
            math.ceil(pick_reset),
            0 if allowed else math.ceil(pick_retry),
            shadow_denied,
            ((client, now_us),) if stamped else (),
        )

    def _sweep(self, now_ms: int) -> None:
        """Drop state past its expiry: the Redis TTL's twin."""
        for key in [key for key, (_, expires) in self._state.items() if expires < now_ms]:
            del self._state[key]


#: Spec codes whose refund depends on when the hit was made (lua/prelude.lua ``STAMPED``):
#: only a hit with such a limit names its instant (``Decision.taken``), as the script does.
STAMPED_CODES = frozenset("wfcs")


def _whole(cost: int) -> int:
    """``cost`` as the scripts take it: a whole number in ``[0, MAX_COUNT]``."""
    if not 0 <= cost <= MAX_COUNT or cost % 1:
        raise ArgumentRefused(f"cost must be a whole number in [0, {MAX_COUNT}], not {cost!r}")
    return int(cost)
