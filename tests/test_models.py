"""Models: what the database and ``full_clean`` accept, and the limits rows turn into."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from django_throttle.models import (
    EndpointLimit,
    EndpointRule,
    Tier,
    TierAssignment,
    TierLimit,
    validate_rate,
)
from django_throttle.rates import MAX_COUNT, MAX_WINDOW, Algorithm, Limit, Rate


def errors_of(obj: object) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as info:
        obj.full_clean()  # type: ignore[attr-defined]
    return info.value.message_dict


@pytest.fixture
def free() -> Tier:
    return Tier.objects.create(slug="free", name="Free")


@pytest.fixture
def rule() -> EndpointRule:
    return EndpointRule.objects.create(name="search", pattern="search", cost=2)


@pytest.mark.parametrize(
    ("rate", "says"),
    [
        ("10/x", "unknown period unit 'x'"),
        ("-5/m", "the count must be a whole number of at least 1"),
        ("0/m", "the count must be a whole number of at least 1"),
        ("100/2month", "a calendar rate counts per one month, with no multiplier"),
        ("100/M", "did you mean 'm'?"),
        ("lots", "'lots' is not a rate"),
        ("", "'' is not a rate"),
    ],
)
def test_validate_rate_explains_what_is_wrong(rate: str, says: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_rate(rate)
    assert says in info.value.messages[0]


@pytest.mark.parametrize(
    "rate", ["100/min", "10/s", "5000/day", "20/15m", "1/h", "2000/week", "10000/month", "1/year"]
)
def test_validate_rate_accepts_what_rate_parse_accepts(rate: str) -> None:
    validate_rate(rate)


@pytest.mark.django_db
def test_full_clean_puts_rate_and_burst_errors_on_their_fields(free: Tier) -> None:
    errors = errors_of(TierLimit(tier=free, rate="100/x", burst=0))
    assert errors == {
        "rate": [
            "'100/x': unknown period unit 'x': use s, m, h, d or w (or sec, min, hour, day, "
            "week), or month, year"
        ],
        "burst": ["The burst must be at least 1."],
    }


@pytest.mark.django_db
def test_second_default_tier_is_a_field_error_naming_the_first(free: Tier) -> None:
    free.is_default_anonymous = True
    free.save()
    pro = Tier(slug="pro", name="Pro", is_default_anonymous=True, is_default_authenticated=True)
    errors = errors_of(pro)
    assert errors == {
        "is_default_anonymous": ["'Free' is already the default tier for anonymous clients"]
    }


@pytest.mark.django_db
def test_a_default_tier_can_be_saved_again(free: Tier) -> None:
    free.is_default_authenticated = True
    free.save()
    free.full_clean()


@pytest.mark.django_db
@pytest.mark.parametrize("field", ["is_default_anonymous", "is_default_authenticated"])
def test_database_refuses_two_defaults_of_a_kind(field: str) -> None:
    Tier.objects.create(slug="a", name="A", **{field: True})
    Tier.objects.create(slug="b", name="B")  # any number of non-defaults
    Tier.objects.create(slug="c", name="C")
    with pytest.raises(IntegrityError), transaction.atomic():
        Tier.objects.create(slug="d", name="D", **{field: True})


@pytest.mark.django_db
def test_tiers_order_by_priority_then_name() -> None:
    Tier.objects.create(slug="b", name="B")
    Tier.objects.create(slug="a", name="A")
    Tier.objects.create(slug="z", name="Z", priority=5)
    assert [str(t) for t in Tier.objects.all()] == ["Z", "A", "B"]


@pytest.mark.django_db
def test_assignment_needs_exactly_one_of_user_or_group(free: Tier) -> None:
    user = User.objects.create_user("ann")
    group = Group.objects.create(name="staff")
    both = errors_of(TierAssignment(tier=free, user=user, group=group))
    assert both["user"] == ["Choose a user or a group, not both"]
    assert both["group"] == ["Choose a user or a group, not both"]
    assert errors_of(TierAssignment(tier=free))["user"] == ["Choose a user or a group"]
    TierAssignment(tier=free, user=user).full_clean()
    TierAssignment(tier=free, group=group).full_clean()


@pytest.mark.django_db
def test_database_refuses_an_assignment_with_both_or_neither(free: Tier) -> None:
    user = User.objects.create_user("ann")
    group = Group.objects.create(name="staff")
    for kwargs in ({"user": user, "group": group}, {}):
        with pytest.raises(IntegrityError), transaction.atomic():
            TierAssignment.objects.create(tier=free, **kwargs)


@pytest.mark.django_db
def test_a_user_has_at_most_one_direct_assignment(free: Tier) -> None:
    user = User.objects.create_user("ann")
    TierAssignment.objects.create(tier=free, user=user)
    pro = Tier.objects.create(slug="pro", name="Pro")
    assert "user" in errors_of(TierAssignment(tier=pro, user=user))


def test_clean_is_safe_on_new_objects_without_relations() -> None:
    """No database access is allowed here: clean() must not follow unset relations."""
    with pytest.raises(ValidationError):
        TierAssignment().clean()
    EndpointRule(name="x", pattern="x").clean()
    Tier(slug="x", name="X").clean()
    TierLimit(rate="1/s").clean()
    EndpointLimit(rate="1/s").clean()


@pytest.mark.django_db
def test_tier_limit_to_limit_defaults_burst_to_the_rate_count(free: Tier) -> None:
    row = TierLimit.objects.create(tier=free, rate="100/min")
    limit = TierLimit.objects.select_related("tier").get().to_limit()
    assert limit == Limit(
        id=f"t{row.pk}",
        rate=Rate(100, 60),
        burst=100,
        algorithm=Algorithm.TOKEN_BUCKET,
        name="free 100/min",
    )
    assert row.capacity == 100


@pytest.mark.django_db
def test_endpoint_limit_to_limit_keeps_its_burst(free: Tier, rule: EndpointRule) -> None:
    row = EndpointLimit.objects.create(rule=rule, tier=free, rate="20/15m", burst=5)
    limit = row.to_limit()
    assert limit.id == f"e{row.pk}"
    assert limit.rate == Rate(20, 900)
    assert limit.burst == 5 == row.capacity
    assert limit.name == "search (free) 20/15min"


@pytest.mark.django_db
def test_a_calendar_quota_counts_in_the_site_time_zone_unless_it_names_one(
    free: Tier, settings: object
) -> None:
    settings.TIME_ZONE = "Europe/Berlin"  # type: ignore[attr-defined]
    row = TierLimit.objects.create(tier=free, rate="10000/month", algorithm="calendar_quota")
    limit = TierLimit.objects.select_related("tier").get().to_limit()
    assert (limit.algorithm, limit.rate, limit.timezone) == (
        Algorithm.CALENDAR,
        Rate(10000, 31 * 86400, "month"),
        "Europe/Berlin",
    )
    assert (limit.burst, row.capacity, limit.name) == (10000, 10000, "free 10000/month")
    row.timezone = "America/New_York"
    assert row.to_limit().timezone == "America/New_York"
    daily = TierLimit(tier=free, rate="500/d", algorithm="calendar_quota").to_limit()
    assert (daily.rate.calendar, daily.calendar_unit) == ("day", "day")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "algorithm", ["gcra", "leaky_bucket", "fixed_window", "sliding_window_log"]
)
def test_other_algorithms_have_no_time_zone(free: Tier, algorithm: str) -> None:
    limit = TierLimit(tier=free, rate="60/m", algorithm=algorithm).to_limit()
    assert (limit.algorithm, limit.timezone, limit.capacity) == (algorithm, "", 60)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("values", "field", "says"),
    [
        ({"algorithm": "fixed_window", "burst": 20}, "burst", "leave the burst empty"),
        ({"rate": "10000/month"}, "algorithm", "choose the calendar quota algorithm"),
        ({"algorithm": "calendar_quota", "rate": "10/h"}, "rate", "counts per day, week"),
        ({"algorithm": "calendar_quota", "timezone": "Mars/Base"}, "timezone", "unknown time"),
        ({"timezone": "UTC"}, "timezone", "only a calendar quota has a time zone"),
        (
            {"algorithm": "sliding_window_log", "rate": "20000/h"},
            "algorithm",
            "use the sliding window counter",
        ),
        ({"algorithm": "gcra", "rate": "15000/s"}, "algorithm", "use the token bucket"),
    ],
)
def test_full_clean_puts_each_refusal_on_the_field_to_change(
    free: Tier, values: dict[str, object], field: str, says: str
) -> None:
    row = TierLimit(tier=free, **{"rate": "100/d", **values})
    errors = errors_of(row)
    assert list(errors) == [field]
    [message] = errors[field]
    assert says in message


@pytest.mark.django_db
def test_a_window_algorithm_takes_a_burst_equal_to_its_count(free: Tier) -> None:
    TierLimit(tier=free, rate="100/m", algorithm="fixed_window", burst=100).full_clean()
    TierLimit(tier=free, rate="100/m", algorithm="fixed_window").full_clean()


@pytest.mark.django_db
def test_fields_a_form_refused_are_not_judged_together(free: Tier) -> None:
    """A model form excludes a field it refused (the instance keeps its old value), so the
    combination is not checked: the field has its one error from the form."""
    row = TierLimit(tier=free, rate="100/m", algorithm="fixed_window", burst=20)
    row.full_clean(exclude=["burst"])
    with pytest.raises(ValidationError):
        row.full_clean()


def test_limit_rows_describe_themselves() -> None:
    assert str(TierLimit(rate="10/s")) == "10/s"
    assert str(TierLimit(rate="10/s", burst=20)) == "10/s (burst 20)"
    assert str(TierLimit(rate="10/s", algorithm="gcra", burst=20)) == "10/s (GCRA, burst 20)"
    calendar = TierLimit(rate="1/month", algorithm="calendar_quota", timezone="Asia/Tokyo")
    assert str(calendar) == "1/month (calendar quota, Asia/Tokyo)"


@pytest.mark.django_db
def test_endpoint_limits_are_unique_per_rule_tier_and_rate(free: Tier, rule: EndpointRule) -> None:
    EndpointLimit.objects.create(rule=rule, tier=free, rate="10/m")
    EndpointLimit.objects.create(rule=rule, tier=free, rate="100/h")
    errors = errors_of(EndpointLimit(rule=rule, tier=free, rate="10/m"))
    assert errors["__all__"] == ["This rule already has this rate for this tier and these regions."]


@pytest.mark.parametrize(
    ("typed", "stored", "method_set"),
    [
        ("", "", frozenset()),
        ("post", "POST", {"POST"}),
        (" put , get,GET ", "GET,PUT", {"GET", "PUT"}),
        ("delete,patch,head", "HEAD,PATCH,DELETE", {"HEAD", "PATCH", "DELETE"}),
    ],
)
def test_rule_methods_are_normalised(typed: str, stored: str, method_set: set[str]) -> None:
    rule = EndpointRule(name="r", pattern="r", methods=typed)
    rule.clean()
    assert rule.methods == stored
    assert rule.method_set == method_set


def test_rule_rejects_unknown_methods_naming_the_field() -> None:
    with pytest.raises(ValidationError) as info:
        EndpointRule(name="r", pattern="r", methods="GET, FETCH").clean()
    assert "unknown HTTP method FETCH" in info.value.message_dict["methods"][0]


@pytest.mark.parametrize(
    ("match_type", "pattern", "ok"),
    [
        (EndpointRule.MatchType.PATH, "/api/", True),
        (EndpointRule.MatchType.PATH, "api/", False),
        # Spellings no request path (decoded, without query or host) can ever be.
        (EndpointRule.MatchType.PATH, "/caf%C3%A9/", False),
        (EndpointRule.MatchType.PATH, "/café/", True),
        (EndpointRule.MatchType.PATH, "/100%/", True),
        (EndpointRule.MatchType.PATH, "/x%FF/", True),  # not UTF-8: Django keeps it escaped
        (EndpointRule.MatchType.PATH, "/x%ff/", False),
        (EndpointRule.MatchType.PATH, "/search?q=1", False),
        (EndpointRule.MatchType.PATH, "/docs#top", False),
        (EndpointRule.MatchType.PATH, "https://example.com/api/", False),
        (EndpointRule.MatchType.PATH, "//example.com/api/", False),
        (EndpointRule.MatchType.PATH, "/api/*", False),
        (EndpointRule.MatchType.ROUTE, "v1:items", True),
        (EndpointRule.MatchType.ROUTE, "outer:v1:items", True),
        (EndpointRule.MatchType.ROUTE, "api:orders", True),
        (EndpointRule.MatchType.ROUTE, "api:", False),
        (EndpointRule.MatchType.SCOPE, "uploads", True),
        (EndpointRule.MatchType.SCOPE, "two words", False),
    ],
)
def test_rule_pattern_fits_its_match_type(match_type: str, pattern: str, ok: bool) -> None:
    rule = EndpointRule(name="r", match_type=match_type, pattern=pattern)
    if ok:
        rule.clean()
    else:
        with pytest.raises(ValidationError) as info:
            rule.clean()
        assert list(info.value.message_dict) == ["pattern"]


@pytest.mark.django_db
def test_rule_cost_below_one_is_refused() -> None:
    errors = errors_of(EndpointRule(name="r", pattern="r", cost=0))
    assert errors["cost"] == ["The cost must be at least 1."]


@pytest.mark.django_db
def test_rules_are_unique_per_match_type_pattern_and_methods() -> None:
    EndpointRule.objects.create(name="a", pattern="p", methods="GET,POST")
    errors = errors_of(EndpointRule(name="b", pattern="p", methods="post, get"))
    assert errors["__all__"] == ["Another rule has this match type, pattern and methods."]


@pytest.mark.django_db
def test_migrations_match_the_models() -> None:
    """A model change without its migration fails here, not in a user's deploy."""
    from io import StringIO

    from django.core.management import call_command

    call_command("makemigrations", "django_throttle", "--check", "--dry-run", stdout=StringIO())


# Bounds: one message per mistake, and the database refuses what the admin refuses ----------


@pytest.mark.django_db
@pytest.mark.parametrize("burst", [0, -3])
def test_burst_below_one_is_one_error(free: Tier, burst: int) -> None:
    assert errors_of(TierLimit(tier=free, rate="10/s", burst=burst)) == {
        "burst": ["The burst must be at least 1."]
    }


@pytest.mark.django_db
def test_burst_above_max_count_is_one_error_naming_the_bound(free: Tier) -> None:
    errors = errors_of(TierLimit(tier=free, rate="10/s", burst=9223372036854775807))
    assert errors == {"burst": [f"The burst must be at most {MAX_COUNT}."]}


@pytest.mark.django_db
def test_burst_whose_window_is_too_long_gets_the_limits_message(free: Tier) -> None:
    burst = MAX_WINDOW // 86400 + 1  # at 1/d: one day per token, one day too many
    errors = errors_of(TierLimit(tier=free, rate="1/d", burst=burst))
    assert list(errors) == ["burst"]
    assert errors["burst"][0].startswith(f"burst {burst} at 1/day takes")
    assert "lower the burst" in errors["burst"][0]
    TierLimit(tier=free, rate="1/d", burst=burst - 1).full_clean()


@pytest.mark.django_db
def test_cost_above_max_count_is_one_error() -> None:
    errors = errors_of(EndpointRule(name="r", pattern="r", cost=MAX_COUNT + 1))
    assert errors == {"cost": [f"The cost must be at most {MAX_COUNT}."]}


@pytest.mark.django_db
@pytest.mark.parametrize("burst", [0, -3, MAX_COUNT + 1])
def test_database_refuses_a_burst_out_of_range(free: Tier, rule: EndpointRule, burst: int) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        TierLimit.objects.create(tier=free, rate="10/s", burst=burst)
    with pytest.raises(IntegrityError), transaction.atomic():
        EndpointLimit.objects.create(rule=rule, tier=free, rate="10/s", burst=burst)
    limit = TierLimit.objects.create(tier=free, rate="10/s", burst=5)
    with pytest.raises(IntegrityError), transaction.atomic():
        TierLimit.objects.filter(pk=limit.pk).update(burst=burst)


@pytest.mark.django_db
@pytest.mark.parametrize("cost", [0, -1, MAX_COUNT + 1])
def test_database_refuses_a_cost_out_of_range(cost: int) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        EndpointRule.objects.create(name="r", pattern="r", cost=cost)


@pytest.mark.django_db
def test_row_problems_name_the_field(free: Tier, rule: EndpointRule) -> None:
    """What the policy compiler, the system check and the admin list all rely on."""
    assert TierLimit(tier=free, rate="10/s").row_problems() == {}
    assert list(TierLimit(tier=free, rate="10/x").row_problems()) == ["rate"]
    assert list(TierLimit(tier=free, rate="10/month").row_problems()) == ["algorithm"]
    calendar = {"algorithm": "calendar_quota"}
    assert list(TierLimit(tier=free, rate="10/h", **calendar).row_problems()) == ["rate"]
    assert list(
        TierLimit(tier=free, rate="10/d", timezone="Nowhere", **calendar).row_problems()
    ) == ["timezone"]
    assert list(TierLimit(tier=free, rate="10/d", timezone="UTC").row_problems()) == ["timezone"]
    assert list(TierLimit(tier=free, rate="10/s", algorithm="magic").row_problems()) == [
        "algorithm"
    ]
    assert list(TierLimit(tier=free, rate="1/d", burst=MAX_COUNT).row_problems()) == ["burst"]
    assert EndpointRule(name="r", pattern="r").row_problems() == {}
    bad = EndpointRule(
        name="r", match_type="regex", pattern="r", methods="FETCH", cost=0, failure_mode="x"
    )
    assert sorted(bad.row_problems()) == ["cost", "failure_mode", "match_type", "methods"]
    assert list(Tier(slug="t", name="T", failure_mode="sideways").row_problems()) == [
        "failure_mode"
    ]


def test_failure_mode_defaults_to_inherit() -> None:
    assert Tier(slug="t", name="T").failure_mode == ""
    assert EndpointRule(name="r", pattern="r").failure_mode == ""


@pytest.mark.django_db
def test_duplicate_keys_say_when_two_rows_count_the_same(free: Tier, settings: object) -> None:
    """Two limit rows with one key would count the same thing twice: rates compare as parsed
    and an empty time zone as the zone it stands for; anything that counts apart differs."""
    settings.TIME_ZONE = "Europe/Berlin"  # type: ignore[attr-defined]
    pro = Tier.objects.create(slug="pro", name="Pro")
    rule = EndpointRule.objects.create(name="login", pattern="login")

    def key(**fields: object) -> object:
        model = EndpointLimit if "counted_by" in fields else TierLimit
        parent = {"rule": rule, "tier": free} if model is EndpointLimit else {"tier": free}
        return model(**{**parent, **fields}).duplicate_key()  # type: ignore[arg-type]

    assert key(rate="10/m") == key(rate="10/min") == key(rate="10/60s")
    assert key(rate="5/d", algorithm="calendar_quota") == key(
        rate="5/d", algorithm="calendar_quota", timezone="Europe/Berlin"
    )
    assert key(rate="10/m") != key(rate="10/m", burst=5)
    assert key(rate="10/m") != key(rate="10/m", shared=True)
    assert key(rate="10/m") != key(rate="10/m", algorithm="gcra")
    assert key(rate="10/m") != TierLimit(tier=pro, rate="10/m").duplicate_key()
    assert key(rate="10/m", counted_by="ip") != key(rate="10/m", counted_by="username")
    assert key(rate="10/m", counted_by="client") != key(rate="10/m")
    assert key(rate="lots") is None
