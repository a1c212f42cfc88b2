"""The memory backend's twins of the Redis scripts' algorithms, one function each (the exact
windows' in :mod:`.memory_windows`), and the table of them.

Each ``decide`` answers what its Lua twin answers for the same state, ``now`` and limit: the
same float operations in the same order (each script file's header states its rules), so a
process that falls back to memory makes the decisions Redis would have made. Integer products
that may pass 2**53 are rounded to a float first, as Lua's doubles round them.

Times are whole microseconds (``int``). ``decide(state, now, capacity, param, cost)`` returns
``(allowed, remaining, reset_us, retry_us, pending, ttl_us)``: ``pending`` is the state to
store if the whole call commits (``None``: write nothing) and ``ttl_us`` the time it matters,
from which the backend derives the key's expiry as Redis does (``PX = max(1, ceil(ttl/1000))``).
``retime(state, now, capacity, param, old_param)`` returns ``(state, ttl_us)`` after a limit
edit; a TTL of 0 or less means the state no longer matters (the key is deleted).
``refund(state, now, capacity, param, cost)`` gives ``cost`` back to a live state (never past
"nothing used") and returns ``(state, ttl_us)`` the same way, or a TTL of ``None`` when the
state is left as it is (a window that is no longer the current one).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import attrgetter
from typing import Any, NamedTuple

from django_throttle.backends.base import ALGORITHM_CODES
from django_throttle.backends.memory_windows import (
    Stored,
    calendar_quota,
    calendar_quota_refund,
    calendar_quota_retime,
    fixed_window,
    fixed_window_refund,
    fixed_window_retime,
    sliding_log,
    sliding_log_commit,
    sliding_log_refund,
    sliding_log_retime,
)
from django_throttle.rates import MAX_WINDOW, Algorithm, Limit

#: Same tolerance as the Lua prelude, in tokens.
TOLERANCE = 1e-9
_HALF = TOLERANCE / 2
MAX_WINDOW_US = MAX_WINDOW * 1_000_000

Decide = Callable[[Any, int, int, Any, int], tuple[bool, int, Any, Any, Any, Any]]
Retime = Callable[[Any, int, int, Any, Any], Stored]
Refund = Callable[[Any, int, int, Any, int, "int | None"], Stored]


def _bucket_used(state: Any, now: int, capacity: int, interval: float) -> float:
    """Tokens used as of ``now``, within ``[0, capacity + TOLERANCE]`` (token_bucket.lua's
    ``bucket_used``: a hit the tolerance admitted leaves up to that much, and hiding it would
    make a slow rate's Retry-After early)."""
    if state is None:
        return 0.0
    elapsed = max(now - state[1] * 1000, -999)  # a clock that stepped back: no time elapsed
    full = capacity + TOLERANCE
    u = state[0]
    used = (u if u < full else full) - elapsed / interval
    return 0.0 if used < 0 else full if used > full else used


def token_bucket(state: Any, now: int, capacity: int, interval: float, cost: int) -> Any:
    """``t`` and ``l``: state ``(U, ts_ms)``, U tokens used as of ``ts_ms`` milliseconds."""
    used = _bucket_used(state, now, capacity, interval)
    after = used + cost
    longest = capacity * interval
    if after <= capacity + TOLERANCE:
        remaining = math.floor(capacity - after + TOLERANCE)
        reset = min(longest, (after - _HALF) * interval)
        if after > 0:
            ts_ms = -(-now // 1000)
            pending: Any = (after - (ts_ms * 1000 - now) / interval, ts_ms)
        else:
            pending = None
        return True, max(remaining, 0), max(reset, 0), 0, pending, after * interval
    remaining = math.floor(capacity - used + TOLERANCE)
    reset = min(longest, (used - _HALF) * interval)
    retry = min(cost * interval, (after - capacity - _HALF) * interval)
    return False, max(remaining, 0), max(reset, 0), max(retry, 0), None, 0


def token_bucket_retime(state: Any, now: int, capacity: int, interval: float, old: Any) -> Stored:
    """The state is rate-independent (used is capped at the new capacity when read): only its
    expiry moves, to ``used x T_new``."""
    return state, _bucket_used(state, now, capacity, interval) * interval


def token_bucket_refund(
    state: Any, now: int, capacity: int, interval: float, cost: int, taken: int | None = None
) -> Stored:
    """Used as of now (at most the capacity: a full refund leaves no crumb of what the
    tolerance overfilled), less ``cost``, written as a hit writes it; under the tolerance the
    bucket is full again and the state is deleted (float noise leaves no crumbs)."""
    after = min(_bucket_used(state, now, capacity, interval), capacity) - cost
    if after <= TOLERANCE:
        return None, 0
    ts_ms = -(-now // 1000)
    return (after - (ts_ms * 1000 - now) / interval, ts_ms), after * interval


def gcra(state: Any, now: int, capacity: int, emission: int, cost: int) -> Any:
    """``g``: state = the theoretical arrival time (µs); integers only, exact."""
    full = capacity * emission
    tat = now if state is None else min(max(state, now), now + full)
    new = tat + cost * emission
    ahead = new - now
    if ahead <= full:
        return True, (full - ahead) // emission, ahead, 0, new if ahead > 0 else None, ahead
    return False, (full - (tat - now)) // emission, tat - now, ahead - full, None, 0


def gcra_retime(state: Any, now: int, capacity: int, emission: int, old: Any) -> Stored:
    """Keep the tokens used: scale the time owed from the old emission interval to the new
    (exactly, as the script does with split products)."""
    if old is None or state <= now:
        return state, state - now
    ahead = min(state - now, MAX_WINDOW_US)
    moved = min(-(-ahead * emission // old), capacity * emission)
    return now + moved, moved


def gcra_refund(
    state: Any, now: int, capacity: int, emission: int, cost: int, taken: int | None = None
) -> Stored:
    """TAT moves back by ``cost`` emission intervals, never before now (deleted at now)."""
    full = capacity * emission
    tat = min(max(state, now), now + full)
    new = tat - cost * emission
    return (new, new - now) if new > now else (None, 0)


def sliding_counter(state: Any, now: int, capacity: int, period: int, cost: int) -> Any:
    """``s``: state ``(cur, prev, start)``; the previous window weighs by what is left of it."""
    grid = now - now % period
    cur = prev = 0
    if state is not None:
        start = state[2]
        if start >= grid:
            cur, prev = state[0], state[1]
        elif start >= grid - period:
            prev = state[0]
    e = now - grid
    estimate = float(prev * (period - e)) / period + cur
    if estimate + cost <= capacity + TOLERANCE:
        after = cur + cost
        remaining = math.floor(capacity - estimate - cost + TOLERANCE)
        reset = grid + 2 * period - now if after > 0 else grid + period - now if prev > 0 else 0
        # (0, 0) reads exactly as a missing key: nothing worth writing.
        pending = (after, prev, grid) if reset > 0 else None
        return True, remaining if remaining > 0 else 0, reset, 0, pending, reset
    remaining = math.floor(capacity - estimate + TOLERANCE)
    reset = grid + 2 * period - now if cur > 0 else grid + period - now if prev > 0 else 0
    if cur + cost <= capacity:
        retry = (period - e) - float((capacity - cur - cost) * period) / prev
    else:
        wait = period - float((capacity - cost) * period) / cur
        retry = (period - e) + (wait if wait > 0 else 0)
    return False, remaining if remaining > 0 else 0, reset, retry if retry > 0 else 0, None, 0


def sliding_counter_retime(state: Any, now: int, capacity: int, period: int, old: Any) -> Stored:
    return state, state[2] + 2 * period - now


def sliding_counter_refund(
    state: Any, now: int, capacity: int, period: int, cost: int, taken: int | None = None
) -> Stored:
    """The current window's count less ``cost``; a state of an earlier window is left, and
    so is the current one when the refunded hit (``taken``) was counted in an earlier one."""
    grid = now - now % period
    cur, prev, start = state
    if start < grid or (taken is not None and taken < grid):
        return state, None
    cur = cur - cost if cur > cost else 0
    reset = grid + 2 * period - now if cur > 0 else grid + period - now if prev > 0 else 0
    return ((cur, prev, grid), reset) if reset > 0 else (None, 0)


class Twin(NamedTuple):
    """One algorithm: its spec code (also the key's tag), its parameter from a limit, and its
    decide, retime, refund and (a sliding log's) commit."""

    code: str
    param: Callable[[Limit], Any]
    decide: Decide
    retime: Retime
    refund: Refund
    commit: Callable[[Any, Any], Any] | None = None


_interval = attrgetter("interval_us")
_period = attrgetter("period_us")
#: Each algorithm's parameter, decide, retime, refund (and commit): see :class:`Twin`.
_FUNCTIONS: dict[Algorithm, tuple[Any, ...]] = {
    Algorithm.TOKEN_BUCKET: (_interval, token_bucket, token_bucket_retime, token_bucket_refund),
    Algorithm.LEAKY_BUCKET: (_interval, token_bucket, token_bucket_retime, token_bucket_refund),
    Algorithm.GCRA: (attrgetter("emission_us"), gcra, gcra_retime, gcra_refund),
    Algorithm.FIXED_WINDOW: (_period, fixed_window, fixed_window_retime, fixed_window_refund),
    Algorithm.SLIDING_LOG: (
        _period,
        sliding_log,
        sliding_log_retime,
        sliding_log_refund,
        sliding_log_commit,
    ),
    Algorithm.SLIDING_COUNTER: (
        _period,
        sliding_counter,
        sliding_counter_retime,
        sliding_counter_refund,
    ),
    Algorithm.CALENDAR: (
        attrgetter("calendar_unit", "timezone"),
        calendar_quota,
        calendar_quota_retime,
        calendar_quota_refund,
    ),
}
TWINS: dict[str, Twin] = {
    algorithm: Twin(ALGORITHM_CODES[algorithm], *f) for algorithm, f in _FUNCTIONS.items()
}


class Compiled(NamedTuple):
    """What a hit needs of one limit, computed once per limit list: its id, capacity,
    parameter and flags as counted, and its algorithm's :class:`Twin`."""

    id: str
    capacity: int
    param: Any
    shadow: bool
    shared: bool
    twin: Twin


def compile_limit(limit: Limit) -> Compiled:
    """``limit`` as counted: a shared limit's capacity is its per-shard share (the caller
    passes :func:`~django_throttle.backends.base.per_shard` of it)."""
    twin = TWINS[limit.algorithm]
    return Compiled(limit.id, limit.capacity, twin.param(limit), limit.shadow, limit.shared, twin)


def expiry_ms(now: int, ttl_us: float) -> int:
    """The last millisecond a key written at ``now`` with this TTL lives, as Redis keeps it:
    ``PX = max(1, ceil(ttl / 1000))`` after the command's millisecond."""
    px = math.ceil(ttl_us / 1000)
    return now // 1000 + (px if px > 1 else 1)
