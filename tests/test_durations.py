"""Durations as the admin shows them: the one or two largest units, never a raw count of
seconds, and a wait never shown shorter than it is."""

from __future__ import annotations

import pytest

from django_throttle.rates import format_duration


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0 s"),
        (-3, "0 s"),
        (0.01, "0.1 s"),
        (0.25, "0.3 s"),
        (1, "1 s"),
        (9.95, "10 s"),
        (12.4, "13 s"),
        (12.0000001, "12 s"),
        (59.4, "1 min"),
        (89.99, "2 min"),
        (59.6, "1 min"),
        (3456.2, "58 min"),
        (3599, "1 h"),
        (3600 + 5 * 60, "1 h 5 min"),
        (86_399, "1 d"),
        (2 * 86_400, "2 d"),
        (2_614_036.723, "30 d 7 h"),
        (3600.0000001, "1 h"),
        (365 * 86_400, "365 d"),
    ],
)
def test_format_duration(seconds: float, shown: str) -> None:
    assert format_duration(seconds) == shown
