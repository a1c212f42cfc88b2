"""Durations as an operator reads them: "30 d 6 h", "58 min", "12 s", "0.3 s".

Float seconds go in (the unit every value of this app uses); at most two units come out, the
larger first, each rounded at the smaller unit shown. Waits under ten seconds keep a tenth and
round up, so a wait is never shown shorter than it is ("0 s" only for none at all).
"""

from __future__ import annotations

import math

_MINUTE = 60
_HOUR = 60 * _MINUTE
_DAY = 24 * _HOUR


def format_duration(seconds: float) -> str:
    """``seconds`` in the one or two largest units that fit (negative counts as none)."""
    seconds = max(0.0, float(seconds))
    if seconds < 10:
        tenths = math.ceil(round(seconds * 10, 6))
        return f"{tenths // 10} s" if tenths % 10 == 0 else f"{tenths / 10:.1f} s"
    if round(seconds) < _MINUTE:
        return f"{round(seconds)} s"
    if round(seconds / _MINUTE) < 60:
        return f"{round(seconds / _MINUTE)} min"
    if round(seconds / _MINUTE) < 24 * 60:
        hours, minutes = divmod(round(seconds / _MINUTE), 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(round(seconds / _HOUR), 24)
    return f"{days} d {hours} h" if hours else f"{days} d"
