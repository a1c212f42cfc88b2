"""The memory backend's twins of the Redis scripts' algorithms, one function each.

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
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable
from typing import Any, NamedTuple

from django_throttle.calendar import windows
from django_throttle.rates import MAX_WINDOW, Algorithm, Limit

#: Same tolerance as the Lua prelude, in tokens.
TOLERANCE = 1e-9
_HALF = TOLERANCE / 2
MAX_WINDOW_US = MAX_WINDOW * 1_000_000

Decide = Callable[[Any, int, int, Any, int], tuple[bool, int, Any, Any, Any, Any]]
Retime = Callable[[Any, int, int, Any, Any], tuple[Any, Any]]
Refund = Callable[[Any, int, int, Any, int, "int | None"], tuple[Any, Any]]


def _bucket_used(state: Any, now: int, capacity: int, interval: float) -> float:
    """Tokens used as of ``now``, within ``[0, capacity + TOLERANCE]`` (token_bucket.lua's
    ``bucket_used``: a hit the tolerance admitted leaves up to that much, and hiding it would
    make a slow rate's Retry-After early)."""
    if state is None:
        return 0.0
    elapsed = now - state[1] * 1000
    if elapsed < -999:  # a clock that stepped back: no time elapsed
        elapsed = -999
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
        return (
            True,
            remaining if remaining > 0 else 0,
            reset if reset > 0 else 0,
            0,
            pending,
            after * interval,
        )
    remaining = math.floor(capacity - used + TOLERANCE)
    reset = min(longest, (used - _HALF) * interval)
    retry = min(cost * interval, (after - capacity - _HALF) * interval)
    return (
        False,
        remaining if remaining > 0 else 0,
        reset if reset > 0 else 0,
        retry if retry > 0 else 0,
        None,
        0,
    )


def token_bucket_retime(
    state: Any, now: int, capacity: int, interval: float, old: Any
) -> tuple[Any, Any]:
    """The state is rate-independent (used is capped at the new capacity when read): only its
    expiry moves, to ``used x T_new``."""
    return state, _bucket_used(state, now, capacity, interval) * interval


def token_bucket_refund(
    state: Any, now: int, capacity: int, interval: float, cost: int, taken: int | None = None
) -> tuple[Any, Any]:
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
    tat = now if state is None or state < now else state
    full = capacity * emission
    if tat - now > full:
        tat = now + full
    new = tat + cost * emission
    if new - now <= full:
        return (
            True,
            (full - (new - now)) // emission,
            new - now,
            0,
            new if new > now else None,
            new - now,
        )
    return False, (full - (tat - now)) // emission, tat - now, new - now - full, None, 0


def gcra_retime(state: Any, now: int, capacity: int, emission: int, old: Any) -> tuple[Any, Any]:
    """Keep the tokens used: scale the time owed from the old emission interval to the new
    (exactly, as the script does with split products)."""
    if old is None or state <= now:
        return state, state - now
    ahead = min(state - now, MAX_WINDOW_US)
    moved = min(-(-ahead * emission // old), capacity * emission)
    return now + moved, moved


def gcra_refund(
    state: Any, now: int, capacity: int, emission: int, cost: int, taken: int | None = None
) -> tuple[Any, Any]:
    """TAT moves back by ``cost`` emission intervals, never before now (deleted at now)."""
    tat = now if state < now else state
    full = capacity * emission
    if tat - now > full:
        tat = now + full
    new = tat - cost * emission
    return (new, new - now) if new > now else (None, 0)


def fixed_window(state: Any, now: int, capacity: int, period: int, cost: int) -> Any:
    """``f``: state ``(count, start)`` of the window ``[start, start + P)``."""
    if state is None:
        count, start = 0, now - now % period
    else:
        count, start = state
        if start > now:
            start = now - now % period
        elif now >= start + period:
            count, grid = 0, now - now % period
            start = grid if grid > start + period else start + period
    left = start + period - now
    if count + cost <= capacity:
        return True, capacity - count - cost, left, 0, (count + cost, start), left
    return False, max(0, capacity - count), left, left, None, 0


def fixed_window_retime(
    state: Any, now: int, capacity: int, period: int, old: Any
) -> tuple[Any, Any]:
    ttl = state[1] + period - now
    return state, ttl if ttl < period else period


def fixed_window_refund(
    state: Any, now: int, capacity: int, period: int, cost: int, taken: int | None = None
) -> tuple[Any, Any]:
    """The current window's count less ``cost``; an earlier window is left alone, and so is
    the current one when the refunded hit (``taken``) was counted before it started."""
    count, start = state
    if start > now:
        start = now - now % period
    elif now >= start + period:
        return state, None
    if taken is not None and taken < start:
        return state, None
    return _window_refund(count - cost, start, start + period - now)


def _window_refund(left: int, start: int, ttl: int) -> tuple[Any, Any]:
    return ((left, start), ttl) if left > 0 else (None, 0)


#: The current window of each (unit, time zone), reused while ``now`` is inside it: the hot
#: path then skips the time zone arithmetic.
_WINDOWS: dict[tuple[str, str], tuple[int, int]] = {}


def _calendar_window(unit_tz: tuple[str, str], now: int) -> tuple[int, int]:
    found = _WINDOWS.get(unit_tz)
    if found is not None and found[0] <= now < found[1]:
        return found
    bounds = windows(unit_tz[0], unit_tz[1], now)
    if len(_WINDOWS) >= 1024:
        _WINDOWS.clear()
    found = _WINDOWS[unit_tz] = (bounds[1], bounds[2])
    return found


def calendar_quota(state: Any, now: int, capacity: int, unit_tz: Any, cost: int) -> Any:
    """``c``: the fixed window over calendar windows ``[b1, b2)`` (local midnight, the 1st…)."""
    begin, end = _calendar_window(unit_tz, now)
    count, start = (0, begin) if state is None or state[1] < begin else state
    left = end - now
    if count + cost <= capacity:
        return True, capacity - count - cost, left, 0, (count + cost, start), left
    return False, max(0, capacity - count), left, left, None, 0


def calendar_quota_retime(
    state: Any, now: int, capacity: int, unit_tz: Any, old: Any
) -> tuple[Any, Any]:
    begin, end = _calendar_window(unit_tz, now)
    return state, end - now if state[1] >= begin else 0


def calendar_quota_refund(
    state: Any, now: int, capacity: int, unit_tz: Any, cost: int, taken: int | None = None
) -> tuple[Any, Any]:
    begin, end = _calendar_window(unit_tz, now)
    if state[1] < begin or (taken is not None and taken < begin):
        return state, None
    return _window_refund(state[0] - cost, state[1], end - now)


class LogCommit(NamedTuple):
    """A sliding log's pending write: trim what ``now`` no longer sees, add ``cost`` entries."""

    now: int
    period: int
    cost: int


def sliding_log(state: Any, now: int, capacity: int, period: int, cost: int) -> Any:
    """``w``: state = a sorted list of µs timestamps, one per unit of cost."""
    if state:
        dead = bisect_right(state, now - period)
        count = len(state) - dead
    else:
        dead = count = 0
    if count + cost <= capacity:
        if cost:
            newest = now if not count or state[-1] < now else state[-1]
        elif count:
            newest = state[-1]
        else:
            return True, capacity, 0, 0, None, 0
        reset = newest + period - now
        if reset > period:  # an entry from a clock that ran ahead
            reset = period
        return True, capacity - count - cost, reset, 0, LogCommit(now, period, cost), reset
    retry = state[dead + count + cost - capacity - 1] + period - now
    reset = state[-1] + period - now
    return (
        False,
        max(0, capacity - count),
        reset if reset < period else period,
        retry if retry < period else period,
        None,
        0,
    )


def sliding_log_commit(state: Any, pending: LogCommit) -> list[int]:
    """Mutate the stored log in place: O(log n + cost) plus the trim."""
    log: list[int] = state if state is not None else []
    now = pending.now
    dead = bisect_right(log, now - pending.period)
    if dead:
        del log[:dead]
    if not log or log[-1] <= now:
        log.extend([now] * pending.cost)
    else:
        for _ in range(pending.cost):
            insort(log, now)
    return log


def sliding_log_retime(
    state: Any, now: int, capacity: int, period: int, old: Any
) -> tuple[Any, Any]:
    return state, state[-1] + period - now if state else 0


def sliding_log_refund(
    state: Any, now: int, capacity: int, period: int, cost: int, taken: int | None = None
) -> tuple[Any, Any]:
    """Drop up to ``cost`` entries of the refunded hit's instant ``taken`` (none left there:
    nothing to give back), or without it the ``cost`` newest live entries; and the dead
    ones, as a hit's write does."""
    dead = bisect_right(state, now - period)
    if taken is not None:
        if taken <= now - period:
            return state, None
        first, last = bisect_left(state, taken), bisect_right(state, taken)
        if first == last:
            return state, None
        del state[max(first, last - cost) : last]
    elif len(state) - dead <= cost:
        return None, 0
    else:
        del state[len(state) - cost :]
    del state[:dead]
    if not state:
        return None, 0
    reset = state[-1] + period - now
    return state, reset if reset < period else period


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


def sliding_counter_retime(
    state: Any, now: int, capacity: int, period: int, old: Any
) -> tuple[Any, Any]:
    return state, state[2] + 2 * period - now


def sliding_counter_refund(
    state: Any, now: int, capacity: int, period: int, cost: int, taken: int | None = None
) -> tuple[Any, Any]:
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
    """One algorithm: its spec code (also the key's tag), decide, commit, retime, refund."""

    code: str
    decide: Decide
    commit: Callable[[Any, Any], Any] | None
    retime: Retime
    param: Callable[[Limit], Any]
    refund: Refund


def _interval(limit: Limit) -> float:
    return limit.interval_us


def _period(limit: Limit) -> int:
    return limit.period_us


TWINS: dict[str, Twin] = {
    Algorithm.TOKEN_BUCKET.value: Twin(
        "t", token_bucket, None, token_bucket_retime, _interval, token_bucket_refund
    ),
    Algorithm.LEAKY_BUCKET.value: Twin(
        "l", token_bucket, None, token_bucket_retime, _interval, token_bucket_refund
    ),
    Algorithm.GCRA.value: Twin(
        "g", gcra, None, gcra_retime, lambda limit: limit.emission_us, gcra_refund
    ),
    Algorithm.FIXED_WINDOW.value: Twin(
        "f", fixed_window, None, fixed_window_retime, _period, fixed_window_refund
    ),
    Algorithm.SLIDING_LOG.value: Twin(
        "w", sliding_log, sliding_log_commit, sliding_log_retime, _period, sliding_log_refund
    ),
    Algorithm.SLIDING_COUNTER.value: Twin(
        "s", sliding_counter, None, sliding_counter_retime, _period, sliding_counter_refund
    ),
    Algorithm.CALENDAR.value: Twin(
        "c",
        calendar_quota,
        None,
        calendar_quota_retime,
        lambda limit: (limit.calendar_unit, limit.timezone),
        calendar_quota_refund,
    ),
}


class Compiled(NamedTuple):
    """What a hit needs of one limit, computed once per limit list."""

    id: str
    code: str
    decide: Decide
    commit: Callable[[Any, Any], Any] | None
    capacity: int
    param: Any
    shadow: bool
    refund: Refund
    shared: bool


def compile_limit(limit: Limit) -> Compiled:
    """``limit`` as counted: a shared limit's capacity is its per-shard share (the caller
    passes :func:`~django_throttle.backends.base.per_shard` of it)."""
    twin = TWINS[limit.algorithm]
    return Compiled(
        limit.id,
        twin.code,
        twin.decide,
        twin.commit,
        limit.capacity,
        twin.param(limit),
        limit.shadow,
        twin.refund,
        limit.shared,
    )


def expiry_ms(now: int, ttl_us: float) -> int:
    """The last millisecond a key written at ``now`` with this TTL lives, as Redis keeps it:
    ``PX = max(1, ceil(ttl / 1000))`` after the command's millisecond."""
    px = math.ceil(ttl_us / 1000)
    return now // 1000 + (px if px > 1 else 1)
