"""A reference model of every algorithm, written from the spec's maths, not from the backends.

Exact arithmetic throughout (``Fraction`` and ``int``), plain data, one class per algorithm;
no binary encodings and no float tricks, so each rule can be read against the spec
(the headers of django_throttle/backends/lua/*.lua). Times are whole microseconds. The backends use
floats where the Lua does: where a float and the exact answer may round differently (a
comparison within 1e-12 of the tolerance edge), an :class:`Outcome` says ``ambiguous`` and the
tests accept either answer and follow the backend's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from fractions import Fraction
from typing import Any
from zoneinfo import ZoneInfo

from django_throttle.rates import Limit

TOL = Fraction(1, 10**9)
#: How close to a rounding edge an exact value must be for a float to fall either side.
_NOISE = Fraction(1, 10**12)
_MS = 1000


@dataclass
class Outcome:
    """One limit's answer: what the backend's decide returns, exactly."""

    allowed: bool
    remaining: int
    reset: Fraction
    retry: Fraction
    pending: Any = None  # the state to write if the call commits; None: no write
    ttl: Fraction = Fraction(0)
    ambiguous: bool = False  # allowed may go either way in floats
    fuzzy_remaining: bool = False  # remaining may be off by one in floats


def _floor_fuzzy(x: Fraction) -> tuple[int, bool]:
    n = math.floor(x)
    return n, abs(x - round(x)) < _NOISE


class TokenBucket:
    """Token bucket (and leaky bucket): U tokens used as of millisecond ts_ms."""

    def __init__(self, limit: Limit) -> None:
        self.C = limit.capacity
        self.T = Fraction(limit.rate.period * 10**6, limit.rate.count)

    def used(self, state: Any, now: int) -> Fraction:
        if state is None:
            return Fraction(0)
        u, ts_ms = state
        elapsed = max(now - ts_ms * _MS, -999)
        full = self.C + TOL
        return min(max(min(u, full) - elapsed / self.T, Fraction(0)), full)

    def decide(self, state: Any, now: int, c: int, force: bool | None = None) -> Outcome:
        used = self.used(state, now)
        after = used + c
        ambiguous = abs(after - (self.C + TOL)) < _NOISE * max(1, self.C)
        if (after <= self.C + TOL) if force is None else force:
            remaining, fuzzy = _floor_fuzzy(self.C - after + TOL)
            ts_ms = -(-now // _MS)
            pending = (after - Fraction(ts_ms * _MS - now) / self.T, ts_ms) if after > 0 else None
            return Outcome(
                True,
                max(0, remaining),
                min(self.C * self.T, max(Fraction(0), (after - TOL / 2) * self.T)),
                Fraction(0),
                pending,
                after * self.T,
                ambiguous,
                fuzzy,
            )
        remaining, fuzzy = _floor_fuzzy(self.C - used + TOL)
        return Outcome(
            False,
            max(0, remaining),
            min(self.C * self.T, max(Fraction(0), (used - TOL / 2) * self.T)),
            min(c * self.T, max(Fraction(0), (after - self.C - TOL / 2) * self.T)),
            ambiguous=ambiguous,
            fuzzy_remaining=fuzzy,
        )

    def retime(self, state: Any, now: int, old: Limit | None) -> tuple[Any, Fraction]:
        return state, self.used(state, now) * self.T

    def refund(
        self, state: Any, now: int, c: int, taken: int | None = None
    ) -> tuple[Any, Fraction | None]:
        after = min(self.used(state, now), Fraction(self.C)) - c
        if after <= TOL:
            return None, Fraction(0)
        ts_ms = -(-now // _MS)
        return (after - Fraction(ts_ms * _MS - now) / self.T, ts_ms), after * self.T

    def earliest(self, state: Any, now: int, c: int) -> int:
        """Whole µs to wait until ``c`` passes exactly (with the tolerance), nothing else
        happening: the best a retry-after can say."""
        after = self.used(state, now) + c
        return max(0, math.ceil((after - self.C - TOL) * self.T))


class Gcra:
    """GCRA: the theoretical arrival time, integers."""

    def __init__(self, limit: Limit) -> None:
        self.C = limit.capacity
        self.E = max(1, round(Fraction(limit.rate.period * 10**6, limit.rate.count)))

    def decide(self, state: Any, now: int, c: int, force: bool | None = None) -> Outcome:
        full = self.C * self.E
        tat = now if state is None else max(state, now)
        tat = min(tat, now + full)
        new = tat + c * self.E
        if new - now <= full:
            return Outcome(
                True,
                (full - (new - now)) // self.E,
                Fraction(new - now),
                Fraction(0),
                new if new > now else None,
                Fraction(new - now),
            )
        return Outcome(
            False, (full - (tat - now)) // self.E, Fraction(tat - now), Fraction(new - now - full)
        )

    def retime(self, state: Any, now: int, old: Limit | None) -> tuple[Any, Fraction]:
        if old is None or state <= now:
            return state, Fraction(state - now)
        old_e = Gcra(old).E
        owed = math.ceil(Fraction((state - now) * self.E, old_e))
        tat = now + min(owed, self.C * self.E)
        return tat, Fraction(tat - now)

    def refund(
        self, state: Any, now: int, c: int, taken: int | None = None
    ) -> tuple[Any, Fraction | None]:
        new = min(max(state, now), now + self.C * self.E) - c * self.E
        return (new, Fraction(new - now)) if new > now else (None, Fraction(0))


class FixedWindow:
    """Fixed window on the grid of multiples of P since the epoch: (count, start)."""

    def __init__(self, limit: Limit) -> None:
        self.C = limit.capacity
        self.P = limit.rate.period * 10**6

    def window(self, state: Any, now: int) -> tuple[int, int]:
        grid = (now // self.P) * self.P
        if state is None:
            return 0, grid
        count, start = state
        if start > now:
            return count, grid
        if now < start + self.P:
            return count, start
        return 0, max(grid, start + self.P)

    def decide(self, state: Any, now: int, c: int, force: bool | None = None) -> Outcome:
        count, start = self.window(state, now)
        return _window_outcome(count, start, start + self.P, now, self.C, c)

    def retime(self, state: Any, now: int, old: Limit | None) -> tuple[Any, Fraction]:
        return state, Fraction(min(state[1] + self.P - now, self.P))

    def refund(
        self, state: Any, now: int, c: int, taken: int | None = None
    ) -> tuple[Any, Fraction | None]:
        count, start = state
        if start > now:
            start = (now // self.P) * self.P
        elif now >= start + self.P:
            return state, None  # an earlier window: left as it is
        if taken is not None and taken < start:
            return state, None  # the hit was counted in an earlier window: already gone
        return _window_refund(count - c, start, start + self.P - now)


def _window_refund(left: int, start: int, ttl: int) -> tuple[Any, Fraction | None]:
    return ((left, start), Fraction(ttl)) if left > 0 else (None, Fraction(0))


def _window_outcome(count: int, start: int, end: int, now: int, C: int, c: int) -> Outcome:
    left = Fraction(end - now)
    if count + c <= C:
        pending = (count + c, start)
        return Outcome(True, C - count - c, left, Fraction(0), pending, left)
    return Outcome(False, max(0, C - count), left, left)


def calendar_bounds(unit: str, tz: str, now: int) -> tuple[int, int]:
    """[start, end) of the calendar window holding ``now``: local midnights from zoneinfo."""
    zone = ZoneInfo(tz or "UTC")
    today = datetime.fromtimestamp(now // 10**6, zone).date()
    if unit == "day":
        first, following = today, today + timedelta(days=1)
    elif unit == "week":
        first = today - timedelta(days=today.weekday())
        following = first + timedelta(days=7)
    elif unit == "month":
        first = today.replace(day=1)
        following = date(today.year + today.month // 12, today.month % 12 + 1, 1)
    else:
        first, following = date(today.year, 1, 1), date(today.year + 1, 1, 1)

    def midnight(day: date) -> int:
        return int(datetime(day.year, day.month, day.day, tzinfo=zone).timestamp()) * 10**6

    return midnight(first), midnight(following)


class CalendarQuota:
    """The fixed window over local calendar windows: (count, start)."""

    def __init__(self, limit: Limit) -> None:
        self.C = limit.capacity
        self.unit, self.tz = limit.calendar_unit, limit.timezone

    def decide(self, state: Any, now: int, c: int, force: bool | None = None) -> Outcome:
        begin, end = calendar_bounds(self.unit, self.tz, now)
        count, start = (0, begin) if state is None or state[1] < begin else state
        return _window_outcome(count, start, end, now, self.C, c)

    def retime(self, state: Any, now: int, old: Limit | None) -> tuple[Any, Fraction]:
        begin, end = calendar_bounds(self.unit, self.tz, now)
        return state, Fraction(end - now if state[1] >= begin else 0)

    def refund(
        self, state: Any, now: int, c: int, taken: int | None = None
    ) -> tuple[Any, Fraction | None]:
        begin, end = calendar_bounds(self.unit, self.tz, now)
        if state[1] < begin or (taken is not None and taken < begin):
            return state, None
        return _window_refund(state[0] - c, state[1], end - now)


class SlidingLog:
    """One timestamp per unit of cost; live while newer than now - P."""

    def __init__(self, limit: Limit) -> None:
        self.C = limit.capacity
        self.P = limit.rate.period * 10**6

    def decide(self, state: Any, now: int, c: int, force: bool | None = None) -> Outcome:
        live = sorted(t for t in (state or ()) if t > now - self.P)
        count = len(live)
        if count + c <= self.C:
            if not c and not live:
                return Outcome(True, self.C, Fraction(0), Fraction(0))
            newest = max(live + ([now] if c else []))
            reset = min(Fraction(newest + self.P - now), Fraction(self.P))
            pending = tuple(live + [now] * c)
            return Outcome(True, self.C - count - c, reset, Fraction(0), pending, reset)
        oldest_k = live[count + c - self.C - 1]
        return Outcome(
            False,
            max(0, self.C - count),
            min(Fraction(live[-1] + self.P - now), Fraction(self.P)),
            min(Fraction(oldest_k + self.P - now), Fraction(self.P)),
        )

    def retime(self, state: Any, now: int, old: Limit | None) -> tuple[Any, Fraction]:
        return state, Fraction(max(state) + self.P - now if state else 0)

    def refund(
        self, state: Any, now: int, c: int, taken: int | None = None
    ) -> tuple[Any, Fraction | None]:
        """The refunded hit's own entries go: up to ``c`` timestamps equal to ``taken``, the
        instant it was counted at (none left: nothing to give back); without ``taken``, the
        ``c`` newest live entries. The dead ones go too, as a write drops them."""
        live = sorted(t for t in state if t > now - self.P)
        if taken is None:
            kept = live[: max(0, len(live) - c)]
        else:
            own = live.count(taken)
            if not own:
                return state, None
            kept = [t for t in live if t != taken] + [taken] * max(0, own - c)
            kept.sort()
        if not kept:
            return None, Fraction(0)
        return tuple(kept), min(Fraction(kept[-1] + self.P - now), Fraction(self.P))


class SlidingCounter:
    """Current and previous grid window counts; the previous weighs by what is left of it."""

    def __init__(self, limit: Limit) -> None:
        self.C = limit.capacity
        self.P = limit.rate.period * 10**6

    def counts(self, state: Any, now: int) -> tuple[int, int, int]:
        w = (now // self.P) * self.P
        if state is None:
            return 0, 0, w
        cur, prev, start = state
        if start >= w:
            return cur, prev, w
        if start >= w - self.P:
            return 0, cur, w
        return 0, 0, w

    def decide(self, state: Any, now: int, c: int, force: bool | None = None) -> Outcome:
        cur, prev, w = self.counts(state, now)
        e = now - w
        estimate = Fraction(prev * (self.P - e), self.P) + cur
        ambiguous = abs(estimate + c - (self.C + TOL)) < _NOISE * max(1, self.C)

        def reset(cur: int) -> Fraction:
            if cur > 0:
                return Fraction(w + 2 * self.P - now)
            return Fraction(w + self.P - now) if prev > 0 else Fraction(0)

        if (estimate + c <= self.C + TOL) if force is None else force:
            remaining, fuzzy = _floor_fuzzy(self.C - estimate - c + TOL)
            r = reset(cur + c)
            pending = (cur + c, prev, w) if r > 0 else None  # (0, 0) is as good as no key
            return Outcome(True, max(0, remaining), r, Fraction(0), pending, r, ambiguous, fuzzy)
        remaining, fuzzy = _floor_fuzzy(self.C - estimate + TOL)
        if cur + c <= self.C:
            retry = (self.P - e) - Fraction((self.C - cur - c) * self.P, prev)
        else:
            retry = (self.P - e) + max(Fraction(0), self.P - Fraction((self.C - c) * self.P, cur))
        return Outcome(
            False,
            max(0, remaining),
            reset(cur),
            max(Fraction(0), retry),
            ambiguous=ambiguous,
            fuzzy_remaining=fuzzy,
        )

    def refund(
        self, state: Any, now: int, c: int, taken: int | None = None
    ) -> tuple[Any, Fraction | None]:
        """Only a state of now's window gives back (an older one's count now weighs as the
        previous window's), and only for a hit counted in now's window."""
        w = (now // self.P) * self.P
        cur, prev, start = state
        if start < w or (taken is not None and taken < w):
            return state, None
        cur = max(0, cur - c)
        r = w + 2 * self.P - now if cur > 0 else w + self.P - now if prev > 0 else 0
        return ((cur, prev, w), Fraction(r)) if r > 0 else (None, Fraction(0))

    def retime(self, state: Any, now: int, old: Limit | None) -> tuple[Any, Fraction]:
        return state, Fraction(state[2] + 2 * self.P - now)


ALGORITHMS: dict[str, type] = {
    "token_bucket": TokenBucket,
    "leaky_bucket": TokenBucket,
    "gcra": Gcra,
    "fixed_window": FixedWindow,
    "calendar_quota": CalendarQuota,
    "sliding_window_log": SlidingLog,
    "sliding_window_counter": SlidingCounter,
}
#: Algorithms whose retry-after is exact: one microsecond earlier is denied.
EXACT = {"gcra", "fixed_window", "calendar_quota", "sliding_window_log"}


def model_of(limit: Limit) -> Any:
    return ALGORITHMS[limit.algorithm](limit)


@dataclass
class Reply:
    """The driver's answer for one call, in whole µs as the backends report them."""

    allowed: bool
    index: int  # reported limit, -1 for none
    remaining: int
    reset_us: int
    retry_us: int
    shadow: bool
    outcomes: list[Outcome]


@dataclass
class Model:
    """One client's counters: (limit id, algorithm) -> (state, last millisecond alive)."""

    store: dict[tuple[str, str], tuple[Any, int]] = field(default_factory=dict)

    def state(self, limit: Limit, now: int) -> Any:
        entry = self.store.get((limit.id, limit.algorithm))
        if entry is None or now // _MS > entry[1]:  # Redis: expired once past its last ms
            return None
        return entry[0]

    def call(
        self,
        limits: list[Limit],
        cost: int,
        now: int,
        peek: bool = False,
        prefer: bool | None = None,
    ) -> Reply:
        """Decide every limit, commit all or nothing. ``prefer`` (what the backend answered)
        settles limits whose exact answer sits on a float's rounding edge."""
        outcomes = []
        for limit in limits:
            c = 0 if peek else min(cost, limit.capacity)
            algorithm = model_of(limit)
            out = algorithm.decide(self.state(limit, now), now, c)
            if out.ambiguous and prefer is not None and prefer != out.allowed:
                out = algorithm.decide(self.state(limit, now), now, c, force=prefer)
                out.ambiguous = True
            outcomes.append(out)
        pairs = list(zip(outcomes, limits, strict=True))
        allowed = all(out.allowed for out, limit in pairs if not limit.shadow)
        shadow = any(not out.allowed for out, limit in pairs if limit.shadow)
        index, pick = -1, None
        for i, (out, limit) in enumerate(pairs):
            if limit.shadow:
                continue
            if allowed:
                if pick is None or out.remaining < pick.remaining:
                    index, pick = i, out
            elif not out.allowed and (pick is None or out.retry > pick.retry):
                index, pick = i, out
        if allowed and not peek:
            for out, limit in pairs:
                if out.allowed and out.pending is not None:
                    self.store[(limit.id, limit.algorithm)] = (out.pending, expiry(now, out.ttl))
        return Reply(
            allowed,
            index,
            pick.remaining if pick else 0,
            math.ceil(pick.reset) if pick else 0,
            0 if allowed or pick is None else math.ceil(pick.retry),
            shadow,
            outcomes,
        )

    def refund(self, limits: list[Limit], cost: int, now: int, taken: int | None = None) -> None:
        """Give ``cost`` back to each limit (Backend.refund) for the hit made at ``taken``
        (``None``: the newest): missing stays missing, an earlier window is left as it is,
        nothing used is no state; a cost of 0 touches nothing."""
        if not cost:
            return
        for limit in limits:
            state = self.state(limit, now)
            key = (limit.id, limit.algorithm)
            if state is None:
                self.store.pop(key, None)
                continue
            state, ttl = model_of(limit).refund(state, now, min(cost, limit.capacity), taken)
            if ttl is None:
                continue
            if state is None or ttl <= 0:
                del self.store[key]
            else:
                self.store[key] = (state, expiry(now, ttl))

    def retime(self, limit: Limit, now: int, old: Limit | None) -> int:
        state = self.state(limit, now)
        if state is None:
            self.store.pop((limit.id, limit.algorithm), None)
            return 0
        same = old if old is not None and old.algorithm == limit.algorithm else None
        state, ttl = model_of(limit).retime(state, now, same)
        if ttl <= 0:
            del self.store[(limit.id, limit.algorithm)]
        else:
            self.store[(limit.id, limit.algorithm)] = (state, expiry(now, ttl))
        return 1


def expiry(now: int, ttl: Fraction) -> int:
    """The last millisecond a key lives: written in ms ``now // 1000`` with
    ``PX = max(1, ceil(ttl / 1000))``."""
    return now // _MS + max(1, math.ceil(ttl / _MS))
