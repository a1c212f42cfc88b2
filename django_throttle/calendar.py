"""Calendar windows for calendar quotas: "10,000 requests per month, reset on the 1st".

A window starts at local midnight (a day), Monday midnight (a week), the 1st at midnight (a
month) or 1 January (a year) in the quota's time zone, so it follows daylight saving time: the
day the clocks go forward is 23 hours long. Both backends take the same boundaries from here:
the Redis script receives them with the limit (it cannot read time zones), and picks the window
that holds the server's clock.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo


def windows(unit: str, tz: str, now_us: int) -> tuple[int, int, int, int]:
    """Boundaries ``b0 < b1 <= now_us < b2 < b3`` in Unix microseconds: the previous window's
    start, the current one's, the next one's and the one after (``tz`` empty means UTC)."""
    tz = tz or "UTC"
    start = _step(unit, datetime.fromtimestamp(now_us // 1_000_000, ZoneInfo(tz)).date(), 0)
    bounds = _bounds(unit, tz, start)
    if now_us < bounds[1]:  # the second is rounded down; the microseconds are not past b1
        bounds = _bounds(unit, tz, _step(unit, start, -1))
    elif now_us >= bounds[2]:
        bounds = _bounds(unit, tz, _step(unit, start, 1))
    return bounds


@lru_cache(maxsize=1024)
def _bounds(unit: str, tz: str, start: date) -> tuple[int, int, int, int]:
    zone = ZoneInfo(tz)
    b0, b1, b2, b3 = (_midnight_us(_step(unit, start, n), zone) for n in (-1, 0, 1, 2))
    return b0, b1, b2, b3


def _step(unit: str, day: date, n: int) -> date:
    """The first day of the window ``n`` windows after the one holding ``day`` (``n`` = 0:
    that window's own first day)."""
    if unit == "day":
        return day + timedelta(days=n)
    if unit == "week":
        return day - timedelta(days=day.weekday()) + timedelta(weeks=n)
    if unit == "month":
        months = day.year * 12 + day.month - 1 + n
        return date(months // 12, months % 12 + 1, 1)
    if unit == "year":
        return date(day.year + n, 1, 1)
    raise ValueError(f"unknown calendar window {unit!r}: day, week, month or year")


def _midnight_us(day: date, zone: ZoneInfo) -> int:
    """The first instant of ``day`` in ``zone``, in Unix microseconds. Where midnight does not
    exist (a zone that springs forward at 00:00), PEP 495 reads the gap with the offset from
    before the transition: that is the transition itself, the day's first real instant."""
    midnight = datetime(day.year, day.month, day.day, tzinfo=zone)
    return round(midnight.timestamp()) * 1_000_000  # whole seconds: the float is exact
