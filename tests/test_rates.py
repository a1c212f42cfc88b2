"""Rates, limits and decisions: the text users write and the numbers it turns into."""

from __future__ import annotations

from typing import Any

import pytest

from django_throttle.rates import Algorithm, InvalidRate, Limit, Rate


@pytest.mark.parametrize(
    ("text", "count", "period"),
    [
        ("100/min", 100, 60),
        ("10/s", 10, 1),
        ("5000/day", 5000, 86400),
        ("20/15m", 20, 900),
        ("1/2h", 1, 7200),
        ("3/d", 3, 86400),
        (" 5 / m ", 5, 60),
        ("60/minute", 60, 60),
        ("2/hours", 2, 3600),
        ("7/30sec", 7, 30),
        ("1000000000/s", 1_000_000_000, 1),
        ("1/366d", 1, 366 * 86400),
    ],
)
def test_parse_accepts(text: str, count: int, period: int) -> None:
    rate = Rate.parse(text)

    assert (rate.count, rate.period) == (count, period)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("100/min", "100/m"),
        ("20/15m", "20/15m"),
        ("5000/day", "5000/d"),
        ("10/seconds", "10/s"),
        ("1/2h", "1/2h"),
        ("10/60s", "10/m"),
        ("1/90s", "1/90s"),
        ("3/120m", "3/2h"),
        ("1/24h", "1/d"),
        (" 5 / m ", "5/m"),
    ],
)
def test_str_is_canonical_and_round_trips(text: str, canonical: str) -> None:
    rate = Rate.parse(text)

    assert str(rate) == canonical
    assert Rate.parse(str(rate)) == rate


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("10/x", "unknown period unit 'x'"),
        ("-5/m", "at least 1"),
        ("0/m", "at least 1"),
        ("100/month", "in days"),
        ("3/year", "in days"),
        ("10/M", "lowercase"),
        ("10/Min", "lowercase"),
        ("", "e.g. '100/min'"),
        ("abc", "e.g. '100/min'"),
        ("10", "<count>/<period>"),
        ("/m", "<count>/<period>"),
        ("10/0m", "multiplier must be at least 1"),
        ("1.5/s", "e.g. '100/min'"),
        ("10/367d", "366 days"),
        ("2000000000/s", "between 1 and 1000000000"),
    ],
)
def test_parse_rejects_with_a_hint(text: str, hint: str) -> None:
    with pytest.raises(InvalidRate) as excinfo:
        Rate.parse(text)

    assert hint in str(excinfo.value)


@pytest.mark.parametrize("value", [100, None, 1.5, b"100/m", ["100/m"]])
def test_parse_rejects_non_text(value: Any) -> None:
    with pytest.raises(InvalidRate, match=f"not {type(value).__name__}"):
        Rate.parse(value)


def test_invalid_rate_is_a_value_error() -> None:
    """Code that already catches ``ValueError`` (forms, admin) sees bad rates too."""
    with pytest.raises(ValueError):
        Rate.parse("nonsense")


@pytest.mark.parametrize(
    ("rate", "burst", "capacity", "window"),
    [
        ("100/min", None, 100, 60.0),
        ("100/min", 10, 10, 6.0),
        ("10/s", 50, 50, 5.0),
        ("20/15m", 5, 5, 225.0),
        ("5000/day", None, 5000, 86400.0),
    ],
)
def test_limit_capacity_and_window(
    rate: str, burst: int | None, capacity: int, window: float
) -> None:
    limit = Limit.build("api", rate, burst=burst)

    assert limit.burst == capacity
    assert limit.capacity == capacity
    assert limit.window == pytest.approx(window)


def test_limit_burst_defaults_to_count() -> None:
    assert Limit.build("api", "100/min").burst == 100


@pytest.mark.parametrize("burst", [0, -1])
def test_limit_rejects_burst_below_one(burst: int) -> None:
    with pytest.raises(InvalidRate, match="burst must be between 1 and"):
        Limit.build("api", "100/min", burst=burst)


def test_limit_rejects_a_bad_rate() -> None:
    with pytest.raises(InvalidRate, match="lowercase"):
        Limit.build("api", "100/MIN")


def test_limit_defaults() -> None:
    limit = Limit.build("api", Rate(20, 900))

    assert limit.name == "20/15m"
    assert limit.algorithm is Algorithm.TOKEN_BUCKET


def test_limit_keeps_given_name_and_algorithm_text() -> None:
    limit = Limit.build("login", "5/m", name="Login attempts", algorithm="token_bucket")

    assert limit.name == "Login attempts"
    assert limit.algorithm is Algorithm.TOKEN_BUCKET


def test_limit_rejects_unknown_algorithm() -> None:
    with pytest.raises(ValueError):
        Limit.build("api", "5/m", algorithm="leaky_bucket")


@pytest.mark.parametrize("burst", [10**9 + 1, 9223372036854775807])
def test_limit_rejects_a_burst_beyond_what_a_double_holds_exactly(burst: int) -> None:
    with pytest.raises(InvalidRate, match="between 1 and 1,000,000,000"):
        Limit.build("api", "100/min", burst=burst)


def test_limit_rejects_a_bucket_that_takes_over_ten_years_to_refill() -> None:
    assert Limit.build("api", "1/366d", burst=10).window == 3660 * 86400
    with pytest.raises(InvalidRate, match="lower the burst"):
        Limit.build("api", "1/366d", burst=11)
