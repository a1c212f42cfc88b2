"""Rates, limits and decisions: the text users write and the numbers it turns into."""

from __future__ import annotations

from typing import Any

import pytest

from django_throttle.rates import Algorithm, InvalidRate, Limit, Rate, rate_text


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
        ("2000/week", 2000, 7 * 86400),
        ("10/2w", 10, 14 * 86400),
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
        ("100/2month", "a calendar rate counts per one month, with no multiplier"),
        ("3/10y", "per one year"),
        ("3/Year", "lowercase"),
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
        # Digits other than ASCII ones, which int() reads: stored, they would show otherwise.
        ("\uff11\uff10/m", "e.g. '100/min'"),  # full-width
        ("\u0661\u0660/m", "e.g. '100/min'"),  # Arabic-Indic
        ("10/\uff11\uff15m", "e.g. '100/min'"),
        ("1\u09e6/h", "e.g. '100/min'"),  # Bengali zero
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
    with pytest.raises(InvalidRate, match="unknown algorithm 'leaky'; use one of 'token_bucket'"):
        Limit.build("api", "5/m", algorithm="leaky")


@pytest.mark.parametrize("burst", [10**9 + 1, 9223372036854775807])
def test_limit_rejects_a_burst_beyond_what_a_double_holds_exactly(burst: int) -> None:
    with pytest.raises(InvalidRate, match="between 1 and 1,000,000,000"):
        Limit.build("api", "100/min", burst=burst)


def test_limit_rejects_a_bucket_that_takes_over_ten_years_to_refill() -> None:
    assert Limit.build("api", "1/366d", burst=10).window == 3660 * 86400
    with pytest.raises(InvalidRate, match="lower the burst"):
        Limit.build("api", "1/366d", burst=11)


# Calendar rates and the algorithms ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "count", "unit"),
    [
        ("10000/month", 10000, "month"),
        ("5/mo", 5, "month"),
        ("1/year", 1, "year"),
        ("7/y", 7, "year"),
    ],
)
def test_month_and_year_parse_as_calendar_rates(text: str, count: int, unit: str) -> None:
    rate = Rate.parse(text)
    assert (rate.count, rate.calendar) == (count, unit)
    assert str(rate) == f"{count}/{unit}"
    assert Rate.parse(str(rate)) == rate


@pytest.mark.parametrize(
    ("rate", "unit"),
    [("500/day", "day"), ("500/24h", "day"), ("2000/week", "week"), ("9/month", "month")],
)
def test_a_calendar_quota_aligns_days_and_weeks(rate: str, unit: str) -> None:
    limit = Limit.build("q", rate, algorithm="calendar_quota", timezone="Europe/Berlin")
    assert (limit.calendar_unit, limit.capacity, limit.timezone) == (
        unit,
        limit.rate.count,
        "Europe/Berlin",
    )
    assert Limit.build("q", rate.replace("month", "31d")).calendar_unit == ""


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"rate": "10/month"}, "choose the calendar quota algorithm"),
        ({"rate": "10/month", "algorithm": "gcra"}, "choose the calendar quota algorithm"),
        ({"rate": "10/h", "algorithm": "calendar_quota"}, "a calendar quota counts per day"),
        ({"rate": "10/2d", "algorithm": "calendar_quota"}, "a calendar quota counts per day"),
        (
            {"rate": "10/d", "algorithm": "calendar_quota", "timezone": "Nowhere/Land"},
            "unknown time zone",
        ),
        ({"rate": "10/d", "timezone": "UTC"}, "only a calendar quota has a time zone"),
        ({"rate": "10/m", "burst": 5, "algorithm": "fixed_window"}, "has no burst"),
        ({"rate": "10/m", "burst": 11, "algorithm": "sliding_window_counter"}, "has no burst"),
        ({"rate": "10001/h", "algorithm": "sliding_window_log"}, "use the sliding window counter"),
        ({"rate": "15000/s", "algorithm": "gcra"}, "use the token bucket"),
    ],
)
def test_limit_refuses_what_its_algorithm_cannot_do(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidRate, match=says):
        Limit.build("x", **kwargs)


@pytest.mark.parametrize(
    ("algorithm", "burst", "capacity", "window"),
    [
        ("token_bucket", 20, 20, 20 * 6.0),
        ("gcra", 20, 20, 20 * 6.0),
        ("leaky_bucket", None, 10, 60.0),
        ("fixed_window", None, 10, 60.0),
        ("fixed_window", 10, 10, 60.0),
        ("sliding_window_log", None, 10, 60.0),
        ("sliding_window_counter", None, 10, 60.0),
    ],
)
def test_capacity_is_the_burst_for_buckets_and_the_count_for_windows(
    algorithm: str, burst: int | None, capacity: int, window: float
) -> None:
    limit = Limit.build("x", "10/m", burst=burst, algorithm=algorithm)
    assert (limit.capacity, limit.window) == (capacity, pytest.approx(window))


def test_gcra_keeps_whole_microseconds() -> None:
    limit = Limit.build("x", "3/s", algorithm="gcra")
    assert (limit.interval_us, limit.emission_us) == (pytest.approx(333333.333), 333333)
    assert Limit.build("x", "10000/s", algorithm="gcra").emission_us == 100


@pytest.mark.parametrize(
    ("rate", "shown"),
    [
        ("100/m", "100/min"),
        ("100/minute", "100/min"),
        ("60/60s", "60/min"),
        ("10/s", "10/s"),
        ("1000/h", "1000/h"),
        ("5000/d", "5000/day"),
        ("20/15m", "20/15min"),
        ("90/90s", "90/90s"),
        ("7/w", "7/week"),
        ("10000/month", "10000/month"),
        ("1/yr", "1/year"),
        (Rate(5, 60), "5/min"),
        ("10/minn", "10/minn"),  # not a rate: shown as written
    ],
)
def test_a_rate_is_shown_one_way_everywhere(rate: Rate | str, shown: str) -> None:
    """One way to write a rate for people: the units of the admin's rate field help text; the
    text parses back to the same rate."""
    assert rate_text(rate) == shown
    if shown != "10/minn":
        assert Rate.parse(shown) == (rate if isinstance(rate, Rate) else Rate.parse(rate))
