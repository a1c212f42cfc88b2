"""Stacked bar charts as inline SVG, drawn on the server: no JavaScript, no CDN, nothing to
download. Colours come from CSS classes (``dt-allowed`` ...) and the axes use the admin's own
colour variables, so a chart follows the admin's light and dark themes.

Every bar carries a ``<title>`` (the browser's tooltip: the time and each count) and every chart
its totals as ``data-*`` attributes, so people and tests read the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from html import escape

from django.utils.safestring import SafeString, mark_safe

__all__ = ["LABELS", "stacked_bars"]

#: What each outcome is called in the legend and tooltips.
LABELS = {"allowed": "allowed", "denied": "denied", "shadow_denied": "shadow would-deny"}

WIDTH, HEIGHT = 720, 170
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 8, 22


def stacked_bars(
    title: str,
    starts: Sequence[datetime],
    bars: dict[str, list[int]],
    *,
    time_format: str = "%H:%M",
) -> SafeString:
    """One chart: a bar per start time, the outcomes stacked in ``bars`` order."""
    count = len(starts)
    heights = [sum(series[i] for series in bars.values()) for i in range(count)]
    top = _nice_ceiling(max(heights, default=0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(count, 1)
    bar_w = max(slot * 0.8, 1.0)
    totals = {name: sum(series) for name, series in bars.items()}
    data = " ".join(f'data-{name.replace("_", "-")}="{n}"' for name, n in totals.items())
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
    label_every = max(1, count // 6)
    for i, start in enumerate(starts):
        x = LEFT + i * slot + (slot - bar_w) / 2
        y = TOP + plot_h
        tip = [start.strftime(time_format)]
        for name, series in bars.items():
            n = series[i]
            tip.append(f"{LABELS.get(name, name)} {n:,}")
            if not n:
                continue
            h = plot_h * n / top
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
                f'text-anchor="middle">{escape(start.strftime(time_format))}</text>'
            )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # numbers and escaped text only


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2 or 5 times a power of ten that is at least ``value`` (at least 2,
    so the middle tick is a whole number)."""
    if value <= 2:
        return 2
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale >= value:
                return step * scale
        scale *= 10
