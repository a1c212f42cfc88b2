"""``manage.py check`` flags every stored policy row the compiler would skip."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_throttle.checks import check_rows
from django_throttle.models import EndpointLimit, EndpointRule, Tier, TierLimit
from tests.factories import check_constraints_off, endpoint, tier


@pytest.mark.django_db
def test_good_rows_pass() -> None:
    free = tier("free", "10/s", "1000/d")
    endpoint("export", "scope", "export", cost=5, limits={free: "10/m"})
    assert check_rows() == []
    call_command("check")


@pytest.mark.django_db
def test_each_bad_row_is_an_error_naming_row_field_and_problem() -> None:
    free = tier("free", "10/s")
    rule = endpoint("export", "scope", "export", limits={free: "10/m"})
    with check_constraints_off():
        Tier.objects.filter(pk=free.pk).update(failure_mode="sideways")
        TierLimit.objects.filter(tier=free).update(rate="10/month")
        EndpointRule.objects.filter(pk=rule.pk).update(cost=0)
        EndpointLimit.objects.filter(rule=rule).update(
            rate="1/d", algorithm="calendar_quota", timezone="Moon"
        )
    limit, endpoint_limit = TierLimit.objects.get(), EndpointLimit.objects.get()

    errors = check_rows()

    assert [(e.id, e.obj.pk) for e in errors] == [
        ("django_throttle.E101", free.pk),
        ("django_throttle.E102", limit.pk),
        ("django_throttle.E103", rule.pk),
        ("django_throttle.E104", endpoint_limit.pk),
    ]
    assert errors[1].msg.startswith(f"TierLimit pk={limit.pk} cannot be used")
    assert "algorithm: '10/month': months vary in length; choose the calendar quota" in (
        errors[1].msg
    )
    assert "cost: the cost must be between 1 and" in errors[2].msg
    assert "timezone: unknown time zone 'Moon'" in errors[3].msg
    with pytest.raises(SystemCheckError) as info:
        call_command("check")
    assert "django_throttle.E102" in str(info.value)


def test_no_database_means_nothing_to_report() -> None:
    """Without the django_db mark the test runner refuses database access, as a missing
    database or table would: the check stays silent rather than crash ``check``."""
    assert check_rows() == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"algorithm": "leaky"}, "algorithm: unknown algorithm 'leaky'"),
        ({"algorithm": "sliding_window_log", "rate": "20000/h"}, "algorithm: a sliding window"),
        ({"algorithm": "calendar_quota", "rate": "10/h"}, "rate: '10/h': a calendar quota"),
        ({"algorithm": "fixed_window", "burst": 3}, "burst: the fixed window has no burst"),
        ({"timezone": "Europe/Berlin"}, "timezone: only a calendar quota has a time zone"),
    ],
)
def test_bad_algorithm_and_time_zone_rows_are_reported(
    values: dict[str, object], says: str
) -> None:
    free = tier("free", "10/s")
    rule = endpoint("export", "scope", "export", limits={free: "10/m"})
    TierLimit.objects.filter(tier=free).update(**values)
    EndpointLimit.objects.filter(rule=rule).update(**values)
    errors = check_rows()
    assert [e.id for e in errors] == ["django_throttle.E102", "django_throttle.E104"]
    assert all(says in e.msg for e in errors)


@pytest.mark.django_db
def test_missing_tables_mean_nothing_to_report() -> None:
    """As before ``migrate``; the drop is rolled back with the test's transaction."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE django_throttle_endpointlimit")
    assert check_rows() == []
    assert Tier.objects.count() == 0  # the surrounding transaction is still usable


@pytest.mark.django_db
def test_a_limit_repeated_around_the_admin_is_listed_and_counted_once() -> None:
    """Rows written around the admin (fixtures, SQL) can repeat a limit; ``check`` names the
    copy, and the policy counts that limit once: a request does not take its cost twice."""
    from django_throttle.policy import live as policy

    free = tier("free", "100/m")
    copy = TierLimit.objects.create(tier=free, rate="100/min")
    TierLimit.objects.create(tier=free, rate="100/m", shared=True)  # another counter
    original = TierLimit.objects.get(tier=free, shared=False, pk__lt=copy.pk)

    warnings = [e for e in check_rows() if e.id == "django_throttle.W106"]

    assert [(w.obj.pk, w.msg) for w in warnings] == [
        (
            copy.pk,
            f"TierLimit pk={copy.pk} repeats TierLimit pk={original.pk} of tier 'free' "
            "(100/min): the policy counts that limit once and ignores the copy.",
        )
    ]
    assert warnings[0].hint == "Delete one of them in the admin (tier 'free')."
    policy.invalidate()
    compiled = policy.compile_policy().tiers[free.pk]
    assert [(limit.id, limit.shared) for limit in compiled.limits] == [
        (f"t{original.pk}", False),
        (f"t{original.pk + 2}", True),
    ]


@pytest.mark.django_db
def test_a_path_rule_saved_with_an_escape_before_the_admin_refused_it_is_reported() -> None:
    """A pattern no decoded request path can be (saved before the admin refused it, or
    around it) never matched: ``check`` names it with the spelling that would."""
    rule = endpoint("cafe", "path", "/caf%C3%A9/")
    errors = check_rows()
    assert [(e.id, e.obj.pk) for e in errors] == [("django_throttle.E103", rule.pk)]
    assert "pattern: requests are matched by their decoded path: write '/café/'" in errors[0].msg
