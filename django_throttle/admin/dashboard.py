"""What the admin dashboard shows, read from the usage counts: requests per time bucket by
outcome, overall, per tier and per endpoint, over the last hour or day, drawn as stacked bars.

Each request is counted once in the overall, tier and endpoint charts, under the tier that
served it. Checks made before authentication (a credential rule's check of a login or an
``Authorization`` header, which the request's tier then checks again) are a series of their
own, charted per rule in :attr:`Timeline.before_authentication`.

Minutes the rollup copied come from ``UsageCount`` total rows; later minutes come from the
backend's live counts (the same split as ``manage.py throttle_usage``). Nothing is written.

The charts are inline SVG drawn on the server (:func:`stacked_bars`): no JavaScript, no CDN,
nothing to download. Colours come from CSS classes (``dt-allowed`` ...) and the axes use the
admin's own colour variables, so a chart follows the admin's light and dark themes. Every bar
carries a ``<title>`` (the browser's tooltip: the time and each count) and every chart its
totals as ``data-*`` attributes, so people and tests read the same numbers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape
from itertools import count

from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext

from django_throttle.admin.base import stored_time
from django_throttle.backends import BackendError
from django_throttle.models import UsageCount
from django_throttle.plain import plain_text
from django_throttle.usage import accounting
from django_throttle.usage.reports import NO_ENDPOINT, NO_TIER

#: Window name → (minutes shown, minutes per bar).
WINDOWS = {"hour": (60, 1), "day": (1440, 15)}
#: Outcomes drawn, bottom to top (the others are rare and in the usage report).
CHARTED = ("allowed", "denied", "shadow_denied")
#: What each outcome is called in the legend and tooltips.
LABELS = {"allowed": "allowed", "denied": "denied", "shadow_denied": "shadow would-deny"}
#: Charts drawn per tier or endpoint; the quieter ones are summed into one "(other)" chart.
MAX_CHARTS = 12
OTHER = "(other)"

#: (tier, endpoint) -> outcome -> per-bar counts
_Cells = dict[tuple[str, str], dict[str, list[int]]]

WIDTH, HEIGHT = 720, 170
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 8, 22


@dataclass
class Chart:
    """Counts per bar (starting at ``starts``) for each charted outcome, their totals, and
    the chart drawn."""

    title: str
    starts: list[datetime]
    bars: dict[str, list[int]]

    @property
    def totals(self) -> dict[str, int]:
        return {outcome: sum(series) for outcome, series in self.bars.items()}

    @property
    def svg(self) -> SafeString:
        return stacked_bars(self.title, self.starts, self.bars)


@dataclass
class Timeline:
    """The window's charts. ``partial``: some minute of the window could not be read
    (backend down), so counts are partial. ``before_authentication``: checks before
    authentication, per endpoint rule (not in the other charts)."""

    overall: Chart
    by_tier: list[Chart]
    by_endpoint: list[Chart]
    partial: bool
    before_authentication: list[Chart]


def timeline(window: str) -> Timeline:
    """Per-bar counts for ``window`` (a key of :data:`WINDOWS`) ending with the current minute."""
    span, step = WINDOWS[window]
    store = accounting.get_store()
    partial = False
    try:
        now = store.now_minute()
    except BackendError:
        now, partial = math.floor(time.time() / 60), True
    first = now - span + 1
    first -= first % step  # bars start on whole steps (xx:00, xx:15 ...)
    bars = (now - first) // step + 1
    cells: _Cells = {}

    def add(minute: int, tier: str, endpoint: str, values: Iterable[int]) -> None:
        index = (minute - first) // step
        if 0 <= index < bars:
            row = cells.setdefault((tier, endpoint), {o: [0] * bars for o in CHARTED})
            for outcome, n in zip(accounting.OUTCOMES, values, strict=False):
                if outcome in row:
                    row[outcome][index] += n

    watermark = None
    try:
        watermark = store.watermark()
    except BackendError:
        partial = True
    if watermark is not None and watermark >= first:
        # One row per minute, tier and endpoint (the table's unique constraint): nothing to sum.
        rows = UsageCount.objects.filter(
            client=accounting.ALL,
            window_start__gte=stored_time(first * 60),
            window_start__lte=stored_time(watermark * 60),
        ).values_list("window_start", "tier", "endpoint", *accounting.OUTCOMES)
        for start, tier, endpoint, *values in rows:
            add(_minute(start), tier, endpoint, values)
    live_from = first if watermark is None else max(first, watermark + 1)
    try:
        live = store.read(range(live_from, now + 1), totals=True, clients=False)
    except BackendError:
        live, partial = {}, True
    for minute, counts in live.items():
        for usage_field, values in counts.totals.items():
            add(minute, *accounting.split_field(usage_field), values)

    served = {key: row for key, row in cells.items() if key[0] != accounting.BEFORE_AUTHENTICATION}
    checks = {key: row for key, row in cells.items() if key[0] == accounting.BEFORE_AUTHENTICATION}
    starts = [stored_time((first + i * step) * 60) for i in range(bars)]
    return Timeline(
        overall=_sum(gettext("All requests"), served.values(), starts),
        by_tier=_charts(served, 0, starts, NO_TIER),
        by_endpoint=_charts(served, 1, starts, NO_ENDPOINT),
        partial=partial,
        before_authentication=_charts(checks, 1, starts, NO_ENDPOINT),
    )


def _charts(cells: _Cells, part: int, starts: list[datetime], blank: str) -> list[Chart]:
    """One chart per tier (``part`` 0) or endpoint (1), busiest first, the quietest summed."""
    grouped: dict[str, list[dict[str, list[int]]]] = {}
    for key, row in cells.items():
        grouped.setdefault(plain_text(key[part]) or blank, []).append(row)
    charts = sorted(
        (_sum(name, rows, starts) for name, rows in grouped.items()),
        key=lambda chart: (-sum(chart.totals.values()), chart.title),
    )
    if len(charts) > MAX_CHARTS:
        rest = charts[MAX_CHARTS - 1 :]
        merged = _sum(f"{OTHER}: {len(rest)} more", [chart.bars for chart in rest], starts)
        charts = [*charts[: MAX_CHARTS - 1], merged]
    return charts


def _sum(title: str, rows: Iterable[dict[str, list[int]]], starts: list[datetime]) -> Chart:
    """One chart of ``rows`` added up bar by bar (zero bars when there are none)."""
    rows, zero = list(rows), [0] * len(starts)
    bars = {o: list(map(sum, zip(zero, *(row[o] for row in rows), strict=True))) for o in CHARTED}
    return Chart(title, starts, bars)


def _minute(value: datetime) -> int:
    value = timezone.make_aware(value) if timezone.is_naive(value) else value
    return math.floor(value.timestamp() / 60)


# --- drawing ----------------------------------------------------------------------------------


def stacked_bars(title: str, starts: Sequence[datetime], bars: dict[str, list[int]]) -> SafeString:
    """One chart: a bar per start time (labelled hours and minutes), the outcomes stacked in
    ``bars`` order."""
    top = _nice_ceiling(max(map(sum, zip(*bars.values(), strict=True)), default=0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(len(starts), 1)
    bar_w = max(slot * 0.8, 1.0)
    data = " ".join(f'data-{name.replace("_", "-")}="{sum(n)}"' for name, n in bars.items())
    parts = [
        f'<svg class="dt-chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" data-title="{escape(title)}" {data} '
        f'preserveAspectRatio="none" xmlns="http://www.w3.org/2000/svg">'
    ]
    for tick in (0, top // 2, top):
        y = TOP + plot_h - plot_h * tick / top
        parts.append(
            f'<line class="dt-grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="dt-axis" x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">'
            f"{tick:,}</text>"
        )
    label_every = max(1, len(starts) // 6)
    for i, start in enumerate(starts):
        x = LEFT + i * slot + (slot - bar_w) / 2
        y = TOP + plot_h
        tip = [start.strftime("%H:%M")]
        for name, series in bars.items():
            tip.append(f"{LABELS.get(name, name)} {series[i]:,}")
            if series[i]:
                h = plot_h * series[i] / top
                y -= h
                parts.append(
                    f'<rect class="dt-{name.replace("_", "-")}" x="{x:.1f}" y="{y:.1f}" '
                    f'width="{bar_w:.1f}" height="{h:.1f}"/>'
                )
        # A transparent full-height target so every bar, even an empty one, has a tooltip.
        parts.append(
            f'<rect class="dt-hit" x="{LEFT + i * slot:.1f}" y="{TOP}" width="{slot:.1f}" '
            f'height="{plot_h}"><title>{escape(", ".join(tip))}</title></rect>'
        )
        if i % label_every == 0:
            parts.append(
                f'<text class="dt-axis" x="{LEFT + (i + 0.5) * slot:.1f}" y="{HEIGHT - 6}" '
                f'text-anchor="middle">{escape(tip[0])}</text>'
            )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # numbers and escaped text only


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2 or 5 times a power of ten that is at least ``value`` (at least 2,
    so the middle tick is a whole number)."""
    steps: Iterator[int] = (step * 10**power for power in count() for step in (1, 2, 5))
    return max(2, next(step for step in steps if step >= value))
