"""The memory backend's twins of the exact window scripts: fixed window, calendar quota and
sliding log (the contract they keep: :mod:`.memory_algorithms`)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Any, NamedTuple

from django_throttle.calendar import windows

#: ``(state, ttl_us)`` after a retime or a refund (the contract: :mod:`.memory_algorithms`).
Stored = tuple[Any, Any]


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
    return _window_decide(count, start, start + period - now, capacity, cost)


def _window_decide(count: int, start: int, left: int, capacity: int, cost: int) -> Any:
    """A window's decision: ``count`` used since ``start``, ``left`` µs until it ends."""
    if count + cost <= capacity:
        return True, capacity - count - cost, left, 0, (count + cost, start), left
    return False, max(0, capacity - count), left, left, None, 0


def fixed_window_retime(state: Any, now: int, capacity: int, period: int, old: Any) -> Stored:
    ttl = state[1] + period - now
    return state, ttl if ttl < period else period


def fixed_window_refund(
    state: Any, now: int, capacity: int, period: int, cost: int, taken: int | None = None
) -> Stored:
    """The current window's count less ``cost``; an earlier window is left alone, and so is
    the current one when the refunded hit (``taken``) was counted before it started."""
    count, start = state
    if start > now:
        start = now - now % period
    if now >= start + period or (taken is not None and taken < start):
        return state, None
    return _window_refund(count - cost, start, start + period - now)


def _window_refund(left: int, start: int, ttl: int) -> Stored:
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
    return _window_decide(count, start, end - now, capacity, cost)


def calendar_quota_retime(state: Any, now: int, capacity: int, unit_tz: Any, old: Any) -> Stored:
    begin, end = _calendar_window(unit_tz, now)
    return state, end - now if state[1] >= begin else 0


def calendar_quota_refund(
    state: Any, now: int, capacity: int, unit_tz: Any, cost: int, taken: int | None = None
) -> Stored:
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
    dead = bisect_right(state or (), now - period)
    count = len(state or ()) - dead
    if count + cost <= capacity:
        if cost:
            newest = now if not count or state[-1] < now else state[-1]
        elif count:
            newest = state[-1]
        else:
            return True, capacity, 0, 0, None, 0
        reset = min(newest + period - now, period)  # an entry from a clock that ran ahead
        return True, capacity - count - cost, reset, 0, LogCommit(now, period, cost), reset
    retry = state[dead + count + cost - capacity - 1] + period - now
    reset = state[-1] + period - now
    return False, max(0, capacity - count), min(reset, period), min(retry, period), None, 0


def sliding_log_commit(state: Any, pending: LogCommit) -> list[int]:
    """Mutate the stored log in place: O(log n + cost) plus the trim."""
    log: list[int] = state if state is not None else []
    now = pending.now
    del log[: bisect_right(log, now - pending.period)]
    if not log or log[-1] <= now:
        log.extend([now] * pending.cost)
    else:
        for _ in range(pending.cost):
            insort(log, now)
    return log


def sliding_log_retime(state: Any, now: int, capacity: int, period: int, old: Any) -> Stored:
    return state, state[-1] + period - now if state else 0


def sliding_log_refund(
    state: Any, now: int, capacity: int, period: int, cost: int, taken: int | None = None
) -> Stored:
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
