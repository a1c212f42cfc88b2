"""What the admin dashboard shows, read from the usage counts: requests per time bucket by
outcome, overall, per tier and per endpoint, over the last hour or day.

Each request is counted once in the overall, tier and endpoint charts, under the tier that
served it. Checks made before authentication (a credential rule's check of a login or an
``Authorization`` header, which the request's tier then checks again) are a series of their
own, charted per rule in :attr:`Timeline.before_authentication`.

Minutes the rollup copied come from ``UsageCount`` total rows; later minutes come from the
backend's live counts (the same split as ``manage.py throttle_usage``). Nothing is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db.models import Sum

from django_throttle.backends import BackendError
from django_throttle.backends.usage_base import UsageStore
from django_throttle.plain import plain_text
from django_throttle.usage.accounting import (
    ALL,
    BEFORE_AUTHENTICATION,
    OUTCOMES,
    get_store,
    split_field,
)
from django_throttle.usage.reports import NO_ENDPOINT, NO_TIER

__all__ = ["CHARTED", "WINDOWS", "Chart", "Timeline", "timeline"]

#: Window name → (minutes shown, minutes per bar).
WINDOWS = {"hour": (60, 1), "day": (1440, 15)}
#: Outcomes drawn, bottom to top (the others are rare and in the usage report).
CHARTED = ("allowed", "denied", "shadow_denied")
#: Charts drawn per tier or endpoint; the quieter ones are summed into one "(other)" chart.
MAX_CHARTS = 12
OTHER = "(other)"


@dataclass
class Chart:
    """Counts per bar for each charted outcome, and their totals."""

    title: str
    bars: dict[str, list[int]]
    totals: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.totals.values())


@dataclass
class Timeline:
    """The window's bar start times (UTC) and its charts."""

    window: str
    starts: list[datetime]
    overall: Chart
    by_tier: list[Chart]
    by_endpoint: list[Chart]
    #: Whether any minute of the window could not be read (backend down): counts are partial.
    partial: bool = False
    #: Checks before authentication, per endpoint rule (not in the charts above).
    before_authentication: list[Chart] = field(default_factory=list)


def timeline(window: str = "hour", store: UsageStore | None = None) -> Timeline:
    """Per-bar counts for ``window`` ("hour" or "day") ending with the current minute."""
    from django_throttle.models import UsageCount

    if window not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}, not {window!r}")
    span, step = WINDOWS[window]
    store = get_store() if store is None else store
    partial = False
    try:
        now = store.now_minute()
    except BackendError:
        now, partial = math.floor(datetime.now(tz=UTC).timestamp() / 60), True
    first = now - span + 1
    first -= first % step  # bars start on whole steps (xx:00, xx:15 ...)
    bars = (now - first) // step + 1
    # (tier, endpoint) -> outcome -> per-bar counts
    cells: dict[tuple[str, str], dict[str, list[int]]] = {}

    def add(minute: int, tier: str, endpoint: str, values: list[int]) -> None:
        index = (minute - first) // step
        if not 0 <= index < bars:
            return
        row = cells.setdefault((tier, endpoint), {o: [0] * bars for o in CHARTED})
        for outcome, n in zip(OUTCOMES, values, strict=False):
            if outcome in row and n:
                row[outcome][index] += n

    watermark = None
    try:
        watermark = store.watermark()
    except BackendError:
        partial = True
    if watermark is not None and watermark >= first:
        rows = (
            UsageCount.objects.filter(
                client=ALL,
                window_start__gte=_start(first),
                window_start__lte=_start(watermark),
            )
            .values("window_start", "tier", "endpoint")
            .annotate(**{o: Sum(o) for o in OUTCOMES})
        )
        for row in rows:
            found: dict[str, Any] = dict(row)
            minute = math.floor(_aware(found["window_start"]).timestamp() / 60)
            add(minute, found["tier"], found["endpoint"], [int(found[o] or 0) for o in OUTCOMES])
    live_from = first if watermark is None else max(first, watermark + 1)
    try:
        live = store.read(range(live_from, now + 1), totals=True, clients=False)
    except BackendError:
        live, partial = {}, True
    for minute, counts in live.items():
        for usage_field, values in counts.totals.items():
            tier, endpoint = split_field(usage_field)
            add(minute, tier, endpoint, values)

    starts = [_start(first + i * step) for i in range(bars)]
    served = {key: row for key, row in cells.items() if key[0] != BEFORE_AUTHENTICATION}
    checks = {key: row for key, row in cells.items() if key[0] == BEFORE_AUTHENTICATION}
    return Timeline(
        window=window,
        starts=starts,
        overall=_sum("all requests", served.values(), bars),
        by_tier=_charts(served, 0, bars, NO_TIER),
        by_endpoint=_charts(served, 1, bars, NO_ENDPOINT),
        partial=partial,
        before_authentication=_charts(checks, 1, bars, NO_ENDPOINT),
    )


def _charts(
    cells: dict[tuple[str, str], dict[str, list[int]]], part: int, bars: int, blank: str
) -> list[Chart]:
    grouped: dict[str, list[dict[str, list[int]]]] = {}
    for key, row in cells.items():
        grouped.setdefault(plain_text(key[part]) or blank, []).append(row)
    charts = [_sum(name, rows, bars) for name, rows in grouped.items()]
    charts.sort(key=lambda c: (-c.total, c.title))
    if len(charts) > MAX_CHARTS:
        rest = charts[MAX_CHARTS - 1 :]
        merged = _sum(OTHER, [c.bars for c in rest], bars)
        merged.title = f"{OTHER}: {len(rest)} more"
        charts = [*charts[: MAX_CHARTS - 1], merged]
    return charts


def _sum(title: str, rows: object, bars: int) -> Chart:
    total = {o: [0] * bars for o in CHARTED}
    for row in rows:  # type: ignore[attr-defined]
        for outcome in CHARTED:
            for i, n in enumerate(row[outcome]):
                total[outcome][i] += n
    return Chart(title=title, bars=total, totals={o: sum(v) for o, v in total.items()})


def _start(minute: int) -> datetime:
    from django.conf import settings
    from django.utils import timezone

    value = datetime.fromtimestamp(minute * 60, tz=UTC)
    return value if settings.USE_TZ else timezone.make_naive(value)


def _aware(value: datetime) -> datetime:
    from django.utils import timezone

    return timezone.make_aware(value) if timezone.is_naive(value) else value
