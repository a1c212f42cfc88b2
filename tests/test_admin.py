"""Admin: bad input is a form error on the right field and saves nothing; lists render cheaply."""

from __future__ import annotations

import datetime as dt
import html
import re
import time
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_throttle.models import (
    EndpointLimit,
    EndpointRule,
    Tier,
    TierAssignment,
    TierLimit,
    UsageCount,
)
from django_throttle.rates import MAX_COUNT, MAX_WINDOW
from tests.factories import check_constraints_off

pytestmark = pytest.mark.django_db


def inline(rows: list[dict[str, str]], initial: int = 0) -> dict[str, str]:
    """Management form and rows of the ``limits`` inline, as the admin page posts them."""
    data = {
        "limits-TOTAL_FORMS": str(len(rows)),
        "limits-INITIAL_FORMS": str(initial),
        "limits-MIN_NUM_FORMS": "0",
        "limits-MAX_NUM_FORMS": "1000",
    }
    for i, row in enumerate(rows):
        data.update({f"limits-{i}-{key}": value for key, value in row.items()})
    return data


#: The load factor and floor fields as the tier form renders them (issue 33).
FACTORS = {"load_factor": "100", "min_factor": "10"}


def tier_form(**fields: str) -> dict[str, str]:
    return {"slug": "pro", "name": "Pro", "description": "", "priority": "0", **FACTORS, **fields}


def rule_form(**fields: str) -> dict[str, str]:
    return {
        "name": "export",
        "match_type": "scope",
        "pattern": "export",
        "methods": "",
        "cost": "1",
        "counts": "all",
        "criticality": "default",
        "enabled": "on",
        **fields,
    }


def limit_row(rate: str, burst: str = "", **extra: str) -> dict[str, str]:
    # A browser always posts a select's preselected value; the tier inline ignores counted_by.
    return {
        "rate": rate,
        "burst": burst,
        "algorithm": "token_bucket",
        "counted_by": "client",
        **extra,
    }


def form_errors(response: Any) -> dict[str, list[str]]:
    return {k: list(v) for k, v in response.context["adminform"].form.errors.items()}


def row_errors(response: Any) -> list[dict[str, list[str]]]:
    formset = response.context["inline_admin_formsets"][0].formset
    return [{k: list(v) for k, v in errors.items()} for errors in formset.errors]


def shows(response: Any, message: str) -> bool:
    return html.escape(message) in response.content.decode()


@pytest.fixture
def free() -> Tier:
    return Tier.objects.create(slug="free", name="Free", is_default_anonymous=True)


# Tier + tier limits -------------------------------------------------------------------------


def test_tier_with_limits_is_saved(admin_client: Client) -> None:
    data = tier_form(is_default_authenticated="on", failure_mode="local") | inline(
        [limit_row("100/min"), limit_row("5000/day", "200")]
    )
    response = admin_client.post(reverse("admin:django_throttle_tier_add"), data)
    assert response.status_code == 302
    tier = Tier.objects.get(slug="pro")
    assert tier.is_default_authenticated
    assert tier.failure_mode == "local"
    # Rates are stored in canonical form so that equal rates compare equal.
    assert [(row.rate, row.burst) for row in tier.limits.all()] == [
        ("100/m", None),
        ("5000/d", 200),
    ]


@pytest.mark.parametrize(
    ("url", "form"),
    [
        ("admin:django_throttle_tier_add", tier_form),
        ("admin:django_throttle_endpointrule_add", rule_form),
    ],
)
def test_a_tampered_row_count_draws_at_most_the_inlines_bound(
    admin_client: Client, url: str, form: Any
) -> None:
    """A form posting 99,999,999 limit rows: Django drew up to 1,000 of them, each with its
    time-zone list (a minute, 10 MB); now at most ``MAX_LIMIT_ROWS``, and nothing is saved."""
    from django_throttle.admin.base import MAX_LIMIT_ROWS

    data = form() | inline([limit_row("5/s")])
    data["limits-TOTAL_FORMS"] = "99999999"
    response = admin_client.post(reverse(url), data)

    assert response.status_code == 200
    assert f"Please submit at most {MAX_LIMIT_ROWS} forms." in response.content.decode()
    assert len(response.context["inline_admin_formsets"][0].formset.forms) <= MAX_LIMIT_ROWS
    assert not TierLimit.objects.exists() and not EndpointLimit.objects.exists()


@pytest.mark.parametrize(
    ("rate", "message"),
    [
        (
            "10/x",
            "'10/x': unknown period unit 'x': use s, m, h, d or w (or sec, min, hour, day, "
            "week), or month, year",
        ),
        ("-5/m", "'-5/m': the count must be a whole number of at least 1"),
        ("0/m", "'0/m': the count must be a whole number of at least 1"),
        ("100/2month", "'100/2month': a calendar rate counts per one month, with no multiplier"),
        (
            "\uff11\uff10/min",  # full-width digits: int() reads 10
            "'\uff11\uff10/min' is not a rate: write <count>/<period>, e.g. '100/min', "
            "'10/s', '5000/day' or '20/15m'",
        ),
    ],
)
def test_bad_rate_is_an_error_on_the_rate(admin_client: Client, rate: str, message: str) -> None:
    data = tier_form() | inline([limit_row(rate)])
    response = admin_client.post(reverse("admin:django_throttle_tier_add"), data)
    assert response.status_code == 200
    assert row_errors(response) == [{"rate": [message]}]
    assert shows(response, message)
    assert not Tier.objects.exists()
    assert not TierLimit.objects.exists()


@pytest.mark.parametrize("burst", ["0", "-3"])
def test_burst_below_one_is_one_error_on_the_burst(admin_client: Client, burst: str) -> None:
    """No '≥ 0' from the field type, and no second 'set the burst to at least 10' from the
    cost check while the burst itself is invalid."""
    EndpointRule.objects.create(name="export", pattern="export", cost=10)
    data = tier_form() | inline([limit_row("5/s", burst)])
    response = admin_client.post(reverse("admin:django_throttle_tier_add"), data)
    assert response.status_code == 200
    assert row_errors(response) == [{"burst": ["The burst must be at least 1."]}]
    assert shows(response, "The burst must be at least 1.")
    assert not Tier.objects.exists()


def test_huge_burst_is_refused_naming_the_bound(admin_client: Client) -> None:
    data = tier_form() | inline([limit_row("10/s", "9223372036854775807")])
    response = admin_client.post(reverse("admin:django_throttle_tier_add"), data)
    assert response.status_code == 200
    assert row_errors(response) == [{"burst": [f"The burst must be at most {MAX_COUNT}."]}]
    assert not Tier.objects.exists()


#: Numbers int() and float() read that the rate field refuses: Arabic-Indic, Persian and
#: full-width digits, and Python's digit separator.
OTHER_DIGITS = ["\u0661\u0660", "\u06f1\u06f0", "\uff11\uff10", "1_0"]


@pytest.mark.parametrize("burst", OTHER_DIGITS)
def test_a_burst_in_other_digits_is_refused_as_the_rate_is(
    admin_client: Client, burst: str
) -> None:
    """int() read "\u0661\u0660" (Arabic-Indic 10) as a burst of 10, while the rate field
    beside it refuses "\u0661\u0660/min": numbers are written in 0-9 in every field."""
    data = tier_form() | inline([limit_row("10/s", burst)])
    response = admin_client.post(reverse("admin:django_throttle_tier_add"), data)
    assert response.status_code == 200
    assert row_errors(response) == [{"burst": ["Enter a whole number."]}]
    assert not Tier.objects.exists()


@pytest.mark.parametrize("value", OTHER_DIGITS)
def test_every_number_field_takes_the_digits_0_to_9_only(
    admin_client: Client, free: Tier, value: str
) -> None:
    """The tier's priority, the rule's cost, a limit's delay and longest wait (a float), the
    service protection's capacity: each refuses other digits on its own field."""
    response = admin_client.post(
        reverse("admin:django_throttle_tier_add"), tier_form(priority=value) | inline([])
    )
    assert form_errors(response) == {"priority": ["Enter a whole number."]}
    gcra = {"algorithm": "gcra", "tier": str(free.pk)}
    response = admin_client.post(
        reverse("admin:django_throttle_endpointrule_add"),
        rule_form(cost=value)
        | inline([limit_row("2/s", "5", **gcra, delay=value, max_wait=value)]),
    )
    assert form_errors(response) == {"cost": ["Enter a whole number."]}
    assert row_errors(response) == [
        {"delay": ["Enter a whole number."], "max_wait": ["Enter a number."]}
    ]
    response = admin_client.post(
        reverse("admin:django_throttle_protection_add"),
        {
            "enabled": "on",
            "in_flight": value,
            "default_share": "60",
            "sheddable_share": "50",
            "lease": "60",
            "worker_capacity": value,
            "worker_lag_ms": value,
        },
    )
    assert set(form_errors(response)) == {"in_flight", "worker_capacity", "worker_lag_ms"}
    assert not Tier.objects.exclude(pk=free.pk).exists()
    assert not EndpointRule.objects.exists()


def test_numbers_in_ascii_digits_with_spaces_and_a_sign_are_still_read(
    admin_client: Client,
) -> None:
    data = tier_form(priority=" -5 ") | inline([limit_row("10/s", " 20 ")])
    response = admin_client.post(reverse("admin:django_throttle_tier_add"), data)
    assert response.status_code == 302
    row = Tier.objects.get(slug="pro")
    assert (row.priority, row.limits.get().burst) == (-5, 20)


def test_burst_that_takes_too_long_to_refill_gets_the_limits_message(
    admin_client: Client,
) -> None:
    data = tier_form() | inline([limit_row("1/366d", "100")])
    response = admin_client.post(reverse("admin:django_throttle_tier_add"), data)
    assert response.status_code == 200
    [errors] = row_errors(response)
    assert list(errors) == ["burst"]
    assert errors["burst"][0].startswith("burst 100 at 1/366day takes 36,600 days to refill")
    assert f"the most is {MAX_WINDOW // 86400:,} days" in errors["burst"][0]
    assert not Tier.objects.exists()


@pytest.mark.parametrize(
    ("cost", "message"),
    [
        ("0", "The cost must be at least 1."),
        ("-3", "The cost must be at least 1."),
        ("9223372036854775807", f"The cost must be at most {MAX_COUNT}."),
    ],
)
def test_cost_out_of_range_is_one_error(
    admin_client: Client, free: Tier, cost: str, message: str
) -> None:
    TierLimit.objects.create(tier=free, rate="10/s")  # would also "never pass" a huge cost
    data = rule_form(cost=cost) | inline([limit_row("10/s", tier=str(free.pk))])
    response = admin_client.post(reverse("admin:django_throttle_endpointrule_add"), data)
    assert response.status_code == 200
    assert form_errors(response) == {"cost": [message]}
    assert row_errors(response) == [{}]
    assert not EndpointRule.objects.exists()


def test_second_default_tier_is_an_error_naming_the_first(admin_client: Client, free: Tier) -> None:
    data = tier_form(is_default_anonymous="on") | inline([])
    response = admin_client.post(reverse("admin:django_throttle_tier_add"), data)
    message = "'Free' is already the default tier for anonymous clients"
    assert response.status_code == 200
    assert form_errors(response) == {"is_default_anonymous": [message]}
    assert shows(response, message)
    assert list(Tier.objects.all()) == [free]


def messages_of(response: Any) -> list[tuple[str, str]]:
    return [(m.level_tag, m.message) for m in response.context["messages"]]


def test_tightening_a_tier_below_a_rules_cost_is_saved_with_a_warning(
    admin_client: Client,
) -> None:
    """Anonymous clients never reach a view that requires login: a burst below the cost of
    the signed-in export is the obvious tightening, saved, with a warning naming the rule and
    the tier (it was refused)."""
    EndpointRule.objects.create(name="export", pattern="export", cost=10)
    EndpointRule.objects.create(name="bulk", pattern="bulk", cost=50)
    EndpointRule.objects.create(name="old", pattern="old", cost=500, enabled=False)
    data = tier_form(name="Anonymous") | inline(
        [limit_row("5/min"), limit_row("100/h", "20"), limit_row("100/h", "50")]
    )
    response = admin_client.post(reverse("admin:django_throttle_tier_add"), data, follow=True)
    assert response.redirect_chain[-1][1] == 302
    tier = Tier.objects.get(slug="pro")
    assert [(row.rate, row.burst) for row in tier.limits.all()] == [
        ("5/m", None),
        ("100/h", 20),
        ("100/h", 50),
    ]
    warnings = [text for level, text in messages_of(response) if level == "warning"]
    assert warnings == [
        "Tier 'Anonymous': its limit 5/min holds at most 5, less than the cost of rule 'bulk' "
        "(cost 50), rule 'export' (cost 10): such a call is charged the whole limit (5) and "
        "passes only when the limit is full. Fine if the tier's clients cannot reach it anyway "
        "(e.g. it requires login); otherwise set the burst to at least 50.",
        "Tier 'Anonymous': its limit 100/h (burst 20) holds at most 20, less than the cost of "
        "rule 'bulk' (cost 50): such a call is charged the whole limit (20) and passes only "
        "when the limit is full. Fine if the tier's clients cannot reach it anyway (e.g. it "
        "requires login); otherwise set the burst to at least 50.",
    ]
    assert shows(response, warnings[0])


@pytest.mark.django_db(transaction=True)  # the change is published when it commits
def test_a_change_saved_while_redis_is_down_says_it_reaches_the_workers_late(
    admin_client: Client, settings: Any
) -> None:
    """Saved, and one warning that the other processes apply it late (Redis could not be
    told); with Redis up, no such warning."""
    add = reverse("admin:django_throttle_tier_add")
    response = admin_client.post(add, tier_form() | inline([limit_row("5/min")]), follow=True)
    assert [text for level, text in messages_of(response) if level == "warning"] == []
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    tier = Tier.objects.get(slug="pro")
    change = reverse("admin:django_throttle_tier_change", args=[tier.pk])
    data = tier_form(name="Pro 2") | inline(
        [limit_row("6/min") | {"id": str(tier.limits.get().pk), "tier": str(tier.pk)}],
        initial=1,
    )
    response = admin_client.post(change, data, follow=True)
    assert response.status_code == 200 and Tier.objects.get(pk=tier.pk).name == "Pro 2"
    warnings = [text for level, text in messages_of(response) if level == "warning"]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith("The change is saved, but Redis is unreachable (")
    assert warnings[0].endswith(
        "): the other processes apply it within 5 minutes, not within a second."
    )
    delete = reverse("admin:django_throttle_tier_delete", args=[tier.pk])
    response = admin_client.post(delete, {"post": "yes"}, follow=True)
    assert not Tier.objects.filter(pk=tier.pk).exists()
    warnings = [text for level, text in messages_of(response) if level == "warning"]
    assert [text[:46] for text in warnings] == ["The change is saved, but Redis is unreachable "]


@pytest.mark.parametrize("outage", ["refuse", "blackhole"])
@pytest.mark.django_db(transaction=True)  # the change is published when it commits
def test_a_change_saved_while_redis_was_out_reaches_the_workers_once_it_answers(
    admin_client: Client, settings: Any, _pausable_redis: Any, outage: str
) -> None:
    """Saved while Redis was unreachable (down, or cut off), the change could not be
    published; Redis came back with the version it had, so the other processes kept the old
    policy until their snapshots were five minutes old. Now the process that saved it publishes
    it at its first version check that Redis answers: the shared version moves within a second
    or so of Redis answering."""
    from django_throttle.backends import get_backend
    from django_throttle.backends.redis_nodes import reset_breaker
    from tests.faultproxy import FaultProxy

    with FaultProxy(_pausable_redis.port) as proxy:
        settings.DJANGO_THROTTLE_REDIS_URL = proxy.url
        settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}
        add = reverse("admin:django_throttle_tier_add")
        admin_client.post(add, tier_form(is_default_anonymous="on") | inline([limit_row("50/m")]))
        tier = Tier.objects.get(slug="pro")
        before = get_backend().get_policy_version()
        assert before is not None
        change = reverse("admin:django_throttle_tier_change", args=[tier.pk])
        data = tier_form(name="Pro 2", is_default_anonymous="on") | inline(
            [limit_row("60/min") | {"id": str(tier.limits.get().pk), "tier": str(tier.pk)}],
            initial=1,
        )
        proxy.set_mode(outage)
        response = admin_client.post(change, data, follow=True)
        proxy.set_mode("pass")
        warnings = [text for level, text in messages_of(response) if level == "warning"]
        assert [text[:46] for text in warnings] == [
            "The change is saved, but Redis is unreachable "
        ]
        reset_breaker()  # its cooldown passed
        assert get_backend().get_policy_version() == before

        deadline = time.monotonic() + 3
        while get_backend().get_policy_version() == before and time.monotonic() < deadline:
            assert admin_client.get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code == 200
            time.sleep(0.1)

        assert get_backend().get_policy_version() != before


def test_a_warning_never_hides_an_error(admin_client: Client) -> None:
    EndpointRule.objects.create(name="export", pattern="export", cost=10)
    data = tier_form() | inline([limit_row("5/min"), limit_row("lots")])
    response = admin_client.post(reverse("admin:django_throttle_tier_add"), data)
    assert response.status_code == 200
    assert list(row_errors(response)[1]) == ["rate"]
    assert messages_of(response) == []
    assert not Tier.objects.exists()


def test_a_limit_written_twice_in_a_tier_is_an_error_on_its_rate(
    admin_client: Client, free: Tier
) -> None:
    """The admin accepted 200 copies of one limit, and each request then counted 200
    buckets. Rates compare as parsed, so '100/min' repeats '100/m'."""
    kept = TierLimit.objects.create(tier=free, rate="100/m")
    data = tier_form(slug="free", name="Free", is_default_anonymous="on") | inline(
        [
            limit_row("100/m", id=str(kept.pk), tier=str(free.pk)),
            limit_row("100/min"),
            limit_row("100/min", shared="on"),  # a shared ceiling is another counter
            limit_row("100/min", "5"),  # and so is another burst
        ],
        initial=1,
    )
    url = reverse("admin:django_throttle_tier_change", args=[free.pk])
    response = admin_client.post(url, data)
    assert response.status_code == 200
    message = (
        "the same limit as another row (100/min): every request would count it twice; "
        "remove one of them"
    )
    assert row_errors(response) == [{}, {"rate": [message]}, {}, {}]
    assert shows(response, message)
    assert list(free.limits.all()) == [kept]


def test_tier_change_page_and_deleting_a_limit(admin_client: Client, free: Tier) -> None:
    limit = TierLimit.objects.create(tier=free, rate="10/s")
    url = reverse("admin:django_throttle_tier_change", args=[free.pk])
    assert admin_client.get(url).status_code == 200
    data = tier_form(slug="free", name="Free", is_default_anonymous="on") | inline(
        [limit_row("10/s", id=str(limit.pk), tier=str(free.pk), DELETE="on")], initial=1
    )
    assert admin_client.post(url, data).status_code == 302
    assert not TierLimit.objects.exists()


def test_a_refused_rate_leaves_the_rows_caption_as_saved(admin_client: Client, free: Tier) -> None:
    """The caption above a limit row's fields is the row as stored: after "10/minn" is
    refused, it still reads "10/s", not the refused text."""
    limit = TierLimit.objects.create(tier=free, rate="10/s")
    url = reverse("admin:django_throttle_tier_change", args=[free.pk])
    data = tier_form(slug="free", name="Free", is_default_anonymous="on") | inline(
        [limit_row("10/minn", id=str(limit.pk), tier=str(free.pk))], initial=1
    )
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "rate" in row_errors(response)[0]
    row = next(iter(response.context["inline_admin_formsets"][0]))
    assert str(row.original) == "10/s"
    assert 'value="10/minn"' in response.content.decode()  # the input keeps what was typed
    assert TierLimit.objects.get().rate == "10/s"


def test_the_tier_list_and_a_rows_caption_write_rates_one_way(
    admin_client: Client, free: Tier
) -> None:
    """A rate stored in its short form ("60/m", "5000/d") reads as everywhere else in the
    app: "60/min", "5000/day"."""
    TierLimit.objects.create(tier=free, rate="60/m")
    TierLimit.objects.create(tier=free, rate="5000/d", algorithm="calendar_quota")
    listed = admin_client.get(reverse("admin:django_throttle_tier_changelist"))
    assert "60/min, 5000/day (calendar quota)" in listed.content.decode()
    page = admin_client.get(reverse("admin:django_throttle_tier_change", args=[free.pk]))
    captions = [str(row.original) for row in page.context["inline_admin_formsets"][0]][:2]
    assert captions == ["60/min", "5000/day (calendar quota)"]


# Endpoint rules + endpoint limits ----------------------------------------------------------


def test_rule_with_endpoint_limits_is_saved(admin_client: Client, free: Tier) -> None:
    data = rule_form(methods="post, get", cost="5", failure_mode="closed") | inline(
        [limit_row("10/min", tier=str(free.pk)), limit_row("1/s", "5", tier=str(free.pk))]
    )
    response = admin_client.post(reverse("admin:django_throttle_endpointrule_add"), data)
    assert response.status_code == 302
    rule = EndpointRule.objects.get()
    assert (rule.methods, rule.cost, rule.enabled, rule.shadow) == ("GET,POST", 5, True, False)
    assert rule.failure_mode == "closed"
    assert sorted(rule.limits.values_list("rate", flat=True)) == ["1/s", "10/m"]


def test_endpoint_limit_below_the_cost_is_an_error_on_that_row(
    admin_client: Client, free: Tier
) -> None:
    data = rule_form(cost="10") | inline(
        [
            limit_row("100/min", tier=str(free.pk)),
            limit_row("200/min", "4", tier=str(free.pk)),
            limit_row("6/min", tier=str(free.pk)),
        ]
    )
    response = admin_client.post(reverse("admin:django_throttle_endpointrule_add"), data)
    assert response.status_code == 200
    errors = row_errors(response)
    assert errors[0] == {}
    assert errors[1]["burst"][0].startswith("a request costing 10 could never pass")
    assert "holds at most 4" in errors[1]["burst"][0]
    assert "holds at most 6" in errors[2]["rate"][0]
    assert shows(response, errors[1]["burst"][0])
    assert not EndpointRule.objects.exists()
    assert not EndpointLimit.objects.exists()


def test_a_concurrency_limit_takes_a_rule_of_any_cost(admin_client: Client, free: Tier) -> None:
    """A request takes one slot whatever its cost: a costly export may hold two at a time."""
    data = rule_form(cost="10") | inline(
        [limit_row("2/min", tier=str(free.pk), algorithm="concurrency")]
    )
    response = admin_client.post(reverse("admin:django_throttle_endpointrule_add"), data)
    assert response.status_code == 302, row_errors(response)
    assert EndpointLimit.objects.get().algorithm == "concurrency"


def test_a_gcra_limit_takes_a_delay_and_a_longest_wait(admin_client: Client, free: Tier) -> None:
    data = rule_form() | inline(
        [
            limit_row("2/s", "5", tier=str(free.pk), algorithm="gcra", delay="1", max_wait="1.5"),
            limit_row("2/s", "5", tier=str(free.pk), delay="1"),  # a token bucket: no delay
            limit_row("2/s", "5", tier=str(free.pk), algorithm="gcra", delay="5"),
        ]
    )
    response = admin_client.post(reverse("admin:django_throttle_endpointrule_add"), data)
    assert response.status_code == 200
    errors = row_errors(response)
    assert errors[0] == {}
    assert errors[1]["delay"][0].startswith("only a GCRA limit delays")
    assert "between 0 and the burst less one (4)" in errors[2]["delay"][0]
    data = rule_form() | inline(
        [limit_row("2/s", "5", tier=str(free.pk), algorithm="gcra", delay="1", max_wait="1.5")]
    )
    response = admin_client.post(reverse("admin:django_throttle_endpointrule_add"), data)
    assert response.status_code == 302
    limit = EndpointLimit.objects.get().to_limit()
    assert (limit.delay, limit.max_wait, limit.burst) == (1, 1.5, 5)


def test_raising_the_cost_above_existing_endpoint_limits_is_refused(
    admin_client: Client, free: Tier
) -> None:
    rule = EndpointRule.objects.create(name="export", pattern="export", cost=1)
    limit = EndpointLimit.objects.create(rule=rule, tier=free, rate="5/min")
    data = rule_form(cost="8") | inline(
        [limit_row("5/min", id=str(limit.pk), rule=str(rule.pk), tier=str(free.pk))], initial=1
    )
    url = reverse("admin:django_throttle_endpointrule_change", args=[rule.pk])
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "a request costing 8 could never pass" in row_errors(response)[0]["rate"][0]
    rule.refresh_from_db()
    assert rule.cost == 1


def test_a_limit_saved_elsewhere_between_validation_and_save_is_a_form_error(
    admin_client: Client, free: Tier
) -> None:
    """Another operator commits the limit this page sets (same rule, tier, rate and regions)
    after the page's form passed validation, before its rows are saved: the unique constraint
    refused the save, an IntegrityError and a 500. Now nothing is saved and the page is drawn
    again with what was posted and an error saying why."""
    from django.db.models.signals import pre_save

    rule = EndpointRule.objects.create(name="export", pattern="export", cost=1)
    limit = EndpointLimit.objects.create(rule=rule, tier=free, rate="5/min")
    data = rule_form(cost="2") | inline(
        [limit_row("10/min", id=str(limit.pk), rule=str(rule.pk), tier=str(free.pk))], initial=1
    )
    raced = []

    def meanwhile(sender: Any, instance: EndpointLimit, **kwargs: Any) -> None:
        if instance.pk == limit.pk and not raced:  # the other operator's commit, just before
            clash = EndpointLimit(rule=rule, tier=free, rate=instance.rate)  # as the form wrote it
            raced.append(EndpointLimit.objects.bulk_create([clash]))  # (no signal: no recursion)

    pre_save.connect(meanwhile, sender=EndpointLimit)
    try:
        url = reverse("admin:django_throttle_endpointrule_change", args=[rule.pk])
        response = admin_client.post(url, data)
    finally:
        pre_save.disconnect(meanwhile, sender=EndpointLimit)

    assert raced and response.status_code == 200
    assert "Nothing was saved" in form_errors(response)["__all__"][0]
    assert 'value="10/min"' in response.content.decode()  # what was posted, drawn again
    rule.refresh_from_db()
    limit.refresh_from_db()
    assert (rule.cost, limit.rate) == (1, "5/min")


def test_a_cost_above_a_tier_limit_is_saved_with_a_warning(
    admin_client: Client, free: Tier
) -> None:
    TierLimit.objects.create(tier=free, rate="100/min", burst=3)
    data = rule_form(cost="4") | inline([])
    url = reverse("admin:django_throttle_endpointrule_add")
    response = admin_client.post(url, data, follow=True)
    assert EndpointRule.objects.get().cost == 4
    message = (
        "Tier 'Free': its limit 100/min (burst 3) holds at most 3, less than the cost of rule "
        "'export' (cost 4): such a call is charged the whole limit (3) and passes only when the "
        "limit is full. Fine if the tier's clients cannot reach it anyway (e.g. it requires "
        "login); otherwise lower the cost or raise that limit."
    )
    assert ("warning", message) in messages_of(response)


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"methods": "GET, FETCH"}, "methods", "unknown HTTP method FETCH"),
        ({"match_type": "path", "pattern": "api/"}, "pattern", "starts with '/'"),
        ({"match_type": "path", "pattern": "/caf%C3%A9/"}, "pattern", "write '/café/'"),
        ({"match_type": "path", "pattern": "/search/?q=x"}, "pattern", "the path is '/search/'"),
        ({"match_type": "path", "pattern": "/docs/#top"}, "pattern", "the path is '/docs/'"),
        (
            {"match_type": "path", "pattern": "https://example.com/api/"},
            "pattern",
            "without scheme or host: '/api/'",
        ),
        ({"match_type": "path", "pattern": "/api/*"}, "pattern", "'*' is no wildcard: '/api/'"),
        ({"match_type": "route", "pattern": "api:"}, "pattern", "'namespace:name'"),
    ],
)
def test_rule_field_errors(
    admin_client: Client, fields: dict[str, str], field: str, says: str
) -> None:
    data = rule_form(**fields) | inline([])
    response = admin_client.post(reverse("admin:django_throttle_endpointrule_add"), data)
    assert response.status_code == 200
    errors = form_errors(response)
    assert list(errors) == [field]
    assert says in errors[field][0]
    assert not EndpointRule.objects.exists()


def test_duplicate_endpoint_limit_rows_are_refused(admin_client: Client, free: Tier) -> None:
    rows = [limit_row("10/min", tier=str(free.pk)), limit_row("10/m", tier=str(free.pk))]
    data = rule_form() | inline(rows)
    response = admin_client.post(reverse("admin:django_throttle_endpointrule_add"), data)
    assert response.status_code == 200
    formset = response.context["inline_admin_formsets"][0].formset
    assert formset.non_form_errors() == [
        "Please correct the duplicate data for tier, rate and regions, which must be unique."
    ]
    assert not EndpointRule.objects.exists()


# Tier assignments --------------------------------------------------------------------------


def test_assignment_add_page_uses_autocomplete(admin_client: Client) -> None:
    response = admin_client.get(reverse("admin:django_throttle_tierassignment_add"))
    assert response.status_code == 200
    assert response.content.decode().count("admin-autocomplete") >= 2


def test_assignment_with_user_and_group_is_refused(admin_client: Client, free: Tier) -> None:
    user = User.objects.create_user("ann")
    group = Group.objects.create(name="staff")
    data = {"tier": str(free.pk), "user": str(user.pk), "group": str(group.pk), "note": ""}
    url = reverse("admin:django_throttle_tierassignment_add")
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert form_errors(response) == {
        "user": ["Choose a user or a group, not both"],
        "group": ["Choose a user or a group, not both"],
    }
    assert admin_client.post(url, {**data, "group": ""}).status_code == 302
    assert TierAssignment.objects.get().user == user


# Usage counts ------------------------------------------------------------------------------


def test_usage_counts_are_read_only(admin_client: Client) -> None:
    row = UsageCount.objects.create(
        window_start=dt.datetime(2025, 1, 1, 12, 0, tzinfo=dt.UTC), client="user:1", allowed=3
    )
    assert admin_client.get(reverse("admin:django_throttle_usagecount_add")).status_code == 403
    change = admin_client.get(reverse("admin:django_throttle_usagecount_change", args=[row.pk]))
    assert change.status_code == 200
    assert b'name="_save"' not in change.content


# Change lists ------------------------------------------------------------------------------


#: A recent noon: rows the rollup's retention keeps (opening the usage list runs the rollup).
RECENT = dt.datetime.now(dt.UTC).replace(hour=12, minute=0, second=0, microsecond=0) - dt.timedelta(
    days=2
)


def make_rows(n: int) -> None:
    for i in range(n):
        tier = Tier.objects.create(slug=f"t{i}", name=f"Tier {i}", priority=i)
        TierLimit.objects.create(tier=tier, rate="100/min")
        TierLimit.objects.create(tier=tier, rate="1000/h", burst=100)
        rule = EndpointRule.objects.create(name=f"rule {i}", pattern=f"scope{i}")
        EndpointLimit.objects.create(rule=rule, tier=tier, rate="10/s")
        TierAssignment.objects.create(tier=tier, user=User.objects.create_user(f"u{i}"))
        TierAssignment.objects.create(tier=tier, group=Group.objects.create(name=f"g{i}"))
        minute = RECENT + dt.timedelta(minutes=i)
        # A tier and endpoint total and a per-client row, as the rollup writes them.
        UsageCount.objects.create(
            window_start=minute,
            client="*",
            tier=tier.slug,
            endpoint=rule.name,
            allowed=10,
            denied=i,
        )
        UsageCount.objects.create(
            window_start=minute, client=f"user:{i}", tier="*", endpoint="*", allowed=10, denied=i
        )


CHANGELISTS = ["tier", "endpointrule", "tierassignment", "usagecount"]


@pytest.mark.parametrize("model", CHANGELISTS)
def test_changelists_render_with_rows_and_filters(admin_client: Client, model: str) -> None:
    make_rows(3)
    url = reverse(f"admin:django_throttle_{model}_changelist")
    response = admin_client.get(url)
    assert response.status_code == 200
    assert response.context["cl"].result_count == (6 if model == "tierassignment" else 3)
    assert admin_client.get(url, {"q": "1"}).status_code == 200


def test_usage_changelist_filters(admin_client: Client) -> None:
    make_rows(3)
    url = reverse("admin:django_throttle_usagecount_changelist")
    assert admin_client.get(url, {"denied": "yes"}).context["cl"].result_count == 2
    assert admin_client.get(url, {"tier": "t0"}).context["cl"].result_count == 1
    month = {"window_start__year": RECENT.year, "window_start__month": RECENT.month}
    by_day = admin_client.get(url, month)
    assert by_day.context["cl"].result_count == 3


def test_tier_changelist_summarises_limits(admin_client: Client) -> None:
    make_rows(1)
    response = admin_client.get(reverse("admin:django_throttle_tier_changelist"))
    assert "100/min, 1000/h (burst 100)" in response.content.decode()


@pytest.mark.parametrize("model", CHANGELISTS)
def test_changelist_queries_do_not_grow_with_rows(admin_client: Client, model: str) -> None:
    url = reverse(f"admin:django_throttle_{model}_changelist")
    make_rows(1)
    admin_client.get(url)  # warm caches (content types, session)
    with CaptureQueriesContext(connection) as few:
        admin_client.get(url)
    make_rows_from = Tier.objects.count()
    for i in range(make_rows_from, make_rows_from + 4):
        tier = Tier.objects.create(slug=f"x{i}", name=f"X {i}")
        TierLimit.objects.create(tier=tier, rate="1/s")
        rule = EndpointRule.objects.create(name=f"x{i}", pattern=f"x{i}")
        EndpointLimit.objects.create(rule=rule, tier=tier, rate="1/s")
        TierAssignment.objects.create(tier=tier, user=User.objects.create_user(f"x{i}"))
        UsageCount.objects.create(
            window_start=RECENT + dt.timedelta(days=1, minutes=i), client="*", tier=f"x{i}"
        )
    with CaptureQueriesContext(connection) as many:
        admin_client.get(url)
    assert len(many) == len(few)


def test_failure_mode_choices_and_credential_hint_are_on_the_rule_page(
    admin_client: Client,
) -> None:
    response = admin_client.get(reverse("admin:django_throttle_endpointrule_add"))
    page = response.content.decode()
    assert 'name="failure_mode"' in page
    assert "Credential endpoints (login, token) are counted in each process" in html.unescape(page)
    data = rule_form(failure_mode="sideways") | inline([])
    response = admin_client.post(reverse("admin:django_throttle_endpointrule_add"), data)
    assert list(form_errors(response)) == ["failure_mode"]


# Rows written around the admin are flagged on the lists -------------------------------------


def test_changelists_flag_rows_the_policy_skips(admin_client: Client, free: Tier) -> None:
    good = TierLimit.objects.create(tier=free, rate="10/s")
    bad = TierLimit.objects.create(tier=free, rate="5/s")
    TierLimit.objects.filter(pk=bad.pk).update(rate="10/month")
    rule = EndpointRule.objects.create(name="export", pattern="export")
    EndpointLimit.objects.create(rule=rule, tier=free, rate="1/s")
    with check_constraints_off():
        EndpointRule.objects.filter(pk=rule.pk).update(cost=0)
        EndpointLimit.objects.filter(rule=rule).update(algorithm="leaky")

    tiers = admin_client.get(reverse("admin:django_throttle_tier_changelist"))
    rules = admin_client.get(reverse("admin:django_throttle_endpointrule_changelist"))

    assert shows(tiers, f"tier limit {bad.pk}: algorithm: '10/month': months vary in length")
    assert f"tier limit {good.pk}:" not in tiers.content.decode()
    assert shows(rules, f"endpoint rule {rule.pk}: cost: the cost must be between 1 and")
    assert shows(rules, "algorithm: unknown algorithm 'leaky'")


# Algorithms: each row picks one, sees only its parameters, and gets field errors -----------


def uses_by_option(html_text: str) -> dict[str, str]:
    """``data-uses`` of the first algorithm select's options in ``html_text``."""
    select = html_text[: html_text.index("</select>", html_text.index("django-throttle-algorithm"))]
    options = re.findall(r'<option value="(\w+)"[^>]*? data-uses="([^"]*)"', select)
    return dict(options)


def test_limit_rows_carry_what_each_algorithm_uses(admin_client: Client, settings: Any) -> None:
    """The select's options tell the page script which fields to show and what the rate
    means, on the saved rows and on the template "Add another" copies."""
    settings.TIME_ZONE = "Europe/Berlin"
    response = admin_client.get(reverse("admin:django_throttle_tier_add"))
    page = response.content.decode()
    assert "django_throttle/limit_fields.js" in page
    assert 'placeholder="Europe/Berlin"' in page
    empty_row = page[page.index('id="limits-empty"') :]
    assert uses_by_option(empty_row) == {
        "token_bucket": "burst",
        "gcra": "burst delay max_wait",
        "leaky_bucket": "burst",
        "fixed_window": "",
        "sliding_window_log": "",
        "sliding_window_counter": "",
        "calendar_quota": "timezone",
        "concurrency": "",
    }
    assert shows(response, "resets at midnight in the time zone (empty = the site's TIME_ZONE)")
    assert shows(response, "the period is the lease")


def test_the_page_script_ships_with_the_package() -> None:
    from pathlib import Path

    import django_throttle

    script = Path(django_throttle.__file__).parent / "static/django_throttle/limit_fields.js"
    text = script.read_text()
    assert "formset:added" in text  # rows added with "Add another"
    assert "http" not in text  # nothing downloaded


@pytest.mark.parametrize(
    ("row", "stored"),
    [
        (limit_row("10/s", "50", algorithm="gcra"), ("10/s", "gcra", 50, "")),
        (limit_row("2/s", "20", algorithm="leaky_bucket"), ("2/s", "leaky_bucket", 20, "")),
        (limit_row("100/min", algorithm="fixed_window"), ("100/m", "fixed_window", None, "")),
        (
            limit_row("100/h", algorithm="sliding_window_log"),
            ("100/h", "sliding_window_log", None, ""),
        ),
        (
            limit_row("50000/h", algorithm="sliding_window_counter"),
            ("50000/h", "sliding_window_counter", None, ""),
        ),
        (
            limit_row("10000/month", algorithm="calendar_quota", timezone="Europe/Berlin"),
            ("10000/month", "calendar_quota", None, "Europe/Berlin"),
        ),
        (limit_row("500/day", algorithm="calendar_quota"), ("500/d", "calendar_quota", None, "")),
    ],
)
def test_each_algorithm_is_saved_with_its_parameters(
    admin_client: Client, row: dict[str, str], stored: tuple[object, ...]
) -> None:
    response = admin_client.post(
        reverse("admin:django_throttle_tier_add"), tier_form() | inline([row])
    )
    assert response.status_code == 302, row_errors(response)
    limit = TierLimit.objects.get()
    assert (limit.rate, limit.algorithm, limit.burst, limit.timezone) == stored
    assert limit.row_problems() == {}


ALGORITHM_MISTAKES = [
    (
        limit_row("100/min", "20", algorithm="fixed_window"),
        "burst",
        "the fixed window has no burst: it admits 100 per window; leave the burst empty",
    ),
    (
        limit_row("10000/month"),
        "algorithm",
        "'10000/month': months vary in length; choose the calendar quota algorithm (it resets "
        "on the calendar), or give the period in days",
    ),
    (
        limit_row("1/year", algorithm="sliding_window_counter"),
        "algorithm",
        "'1/year': years vary in length; choose the calendar quota algorithm",
    ),
    (
        limit_row("100/h", algorithm="calendar_quota"),
        "rate",
        "'100/h': a calendar quota counts per day, week, month or year, e.g. '10000/month' or "
        "'500/day'",
    ),
    (
        limit_row("10000/month", algorithm="calendar_quota", timezone="Europe/Berlinn"),
        "timezone",
        "unknown time zone 'Europe/Berlinn': use an IANA name such as 'Europe/Berlin' or 'UTC'",
    ),
    (
        limit_row("100/min", timezone="Europe/Berlin"),
        "timezone",
        "only a calendar quota has a time zone; leave it empty",
    ),
    (
        limit_row("20000/h", algorithm="sliding_window_log"),
        "algorithm",
        "a sliding window log keeps every request of its window, so it takes at most 10,000 per "
        "window, not 20,000; use the sliding window counter for larger limits",
    ),
    (limit_row("15000/s", algorithm="gcra"), "algorithm", "use the token bucket for this rate"),
]


@pytest.mark.parametrize(("row", "field", "message"), ALGORITHM_MISTAKES)
def test_algorithm_mistakes_are_one_error_on_the_field_to_change(
    admin_client: Client, row: dict[str, str], field: str, message: str
) -> None:
    response = admin_client.post(
        reverse("admin:django_throttle_tier_add"), tier_form() | inline([row])
    )
    assert response.status_code == 200
    [errors] = row_errors(response)
    assert list(errors) == [field]
    [shown] = errors[field]
    assert message in shown
    assert shows(response, shown)
    assert not Tier.objects.exists()


@pytest.mark.parametrize(("row", "field", "message"), ALGORITHM_MISTAKES)
def test_endpoint_limit_rows_get_the_same_errors(
    admin_client: Client, free: Tier, row: dict[str, str], field: str, message: str
) -> None:
    data = rule_form() | inline([{**row, "tier": str(free.pk)}])
    response = admin_client.post(reverse("admin:django_throttle_endpointrule_add"), data)
    assert response.status_code == 200
    [errors] = row_errors(response)
    assert list(errors) == [field]
    assert message in errors[field][0]
    assert not EndpointRule.objects.exists()


def test_an_unknown_algorithm_is_one_error_on_the_select(admin_client: Client) -> None:
    """The form refuses the choice; the row's other values are not judged with the old one."""
    row = limit_row("10000/month", algorithm="leaky")
    response = admin_client.post(
        reverse("admin:django_throttle_tier_add"), tier_form() | inline([row])
    )
    assert row_errors(response) == [
        {"algorithm": ["Select a valid choice. leaky is not one of the available choices."]}
    ]


def test_a_window_limit_below_the_cost_asks_for_a_larger_count(
    admin_client: Client, free: Tier
) -> None:
    data = rule_form(cost="10") | inline(
        [limit_row("5/min", algorithm="fixed_window", tier=str(free.pk))]
    )
    response = admin_client.post(reverse("admin:django_throttle_endpointrule_add"), data)
    assert row_errors(response) == [
        {
            "rate": [
                "a request costing 10 could never pass: this limit holds at most 5; raise the "
                "rate's count to at least 10 or lower the cost"
            ]
        }
    ]


def test_a_window_limit_holds_its_count_whatever_the_cost_check(admin_client: Client) -> None:
    """Capacity is the count for window algorithms: 100/h holds a request costing 50."""
    EndpointRule.objects.create(name="export", pattern="export", cost=50)
    data = tier_form() | inline(
        [
            limit_row("100/h", algorithm="sliding_window_counter"),
            limit_row("10/d", algorithm="calendar_quota"),
        ]
    )
    response = admin_client.post(reverse("admin:django_throttle_tier_add"), data, follow=True)
    assert Tier.objects.get().limits.count() == 2
    assert messages_of(response)[0] == (
        "warning",
        "Tier 'Pro': its limit 10/day (calendar quota) holds at most 10, less than the cost of "
        "rule 'export' (cost 50): such a call is charged the whole limit (10) and passes only "
        "when the limit is full. Fine if the tier's clients cannot reach it anyway (e.g. it "
        "requires login); otherwise raise the rate's count to at least 50.",
    )


def test_a_calendar_quota_saved_in_the_admin_is_in_the_policy(
    admin_client: Client, settings: Any
) -> None:
    from django_throttle.policy import live as policy
    from django_throttle.rates import Algorithm, Rate

    settings.TIME_ZONE = "Europe/Berlin"
    data = tier_form() | inline(
        [
            limit_row("10000/month", algorithm="calendar_quota"),
            limit_row("500/day", algorithm="calendar_quota", timezone="Asia/Tokyo"),
            limit_row("10/s", "20", algorithm="gcra"),
        ]
    )
    assert admin_client.post(reverse("admin:django_throttle_tier_add"), data).status_code == 302
    tier = Tier.objects.get()
    limits = policy.compile_policy().tiers[tier.pk].limits
    assert [(lim.algorithm, lim.rate, lim.burst, lim.timezone, lim.name) for lim in limits] == [
        (
            Algorithm.CALENDAR,
            Rate(10000, 31 * 86400, "month"),
            10000,
            "Europe/Berlin",
            "pro 10000/month",
        ),
        (Algorithm.CALENDAR, Rate(500, 86400, "day"), 500, "Asia/Tokyo", "pro 500/day"),
        (Algorithm.GCRA, Rate(10, 1), 20, "", "pro 10/s"),
    ]


def test_changing_a_limits_algorithm_on_the_change_page(admin_client: Client, free: Tier) -> None:
    limit = TierLimit.objects.create(tier=free, rate="100/min", burst=20)
    url = reverse("admin:django_throttle_tier_change", args=[free.pk])
    page = admin_client.get(url).content.decode()
    assert re.search(r'<option value="token_bucket" selected data-uses="burst"', page)
    assert 'data-help="The rate is the refill speed' in page
    base = {"id": str(limit.pk), "tier": str(free.pk)}
    data = tier_form(slug="free", name="Free") | inline(
        [limit_row("100/min", "20", algorithm="sliding_window_log", **base)], initial=1
    )
    response = admin_client.post(url, data)
    message = "the sliding window log has no burst: it admits 100 per window; leave the burst empty"
    assert row_errors(response) == [{"burst": [message]}]
    data = tier_form(slug="free", name="Free") | inline(
        [limit_row("100/min", algorithm="sliding_window_log", **base)], initial=1
    )
    assert admin_client.post(url, data).status_code == 302
    limit.refresh_from_db()
    assert (limit.algorithm, limit.burst) == ("sliding_window_log", None)


def test_the_list_summarises_algorithms(admin_client: Client, free: Tier) -> None:
    TierLimit.objects.create(tier=free, rate="10/s", burst=20, algorithm="gcra")
    TierLimit.objects.create(tier=free, rate="1000/month", algorithm="calendar_quota")
    response = admin_client.get(reverse("admin:django_throttle_tier_changelist"))
    assert "10/s (GCRA, burst 20), 1000/month (calendar quota)" in response.content.decode()


# Words: algorithms by name, durations in units ---------------------------------------------


def test_the_inspector_names_algorithms_and_writes_durations_in_units(
    admin_client: Client,
) -> None:
    """Algorithms showed as raw ids ('calendar_quota') and durations as raw seconds
    ('2,614,036.723', '3456.2 s'): the inspector and explain say 'Token bucket', '3 d'."""
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    TierLimit.objects.create(tier=anonymous, rate="1/3d", algorithm="token_bucket")
    TierLimit.objects.create(tier=anonymous, rate="100/h", algorithm="sliding_window_counter")
    assert Client().get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code == 200

    url = reverse("admin:django_throttle_usagecount_inspect")
    response = admin_client.get(url, {"client": "203.0.113.9", "path": "/api/ping/"})

    page = response.content.decode()
    rows = re.findall(r'<tr class="dt-bucket".*?</tr>', page, re.S)
    cells = [re.findall(r"<td>(.*?)</td>", row, re.S) for row in rows]
    # Limit, From, Counted by, Algorithm, Capacity, Remaining, Whole again in.
    assert {(cell[3], cell[6]) for cell in cells} >= {("Token bucket", "3 d")}
    assert "Sliding window counter" in {cell[3] for cell in cells}
    assert "token_bucket" not in page and "sliding_window_counter" not in page
    verdict = re.search(r'id="dt-verdict">(.*?)</td>', page, re.S)
    assert verdict is not None
    assert "Retry-After 3 d</span>" in verdict.group(1)


def test_the_inspector_explains_the_path_of_a_url_without_its_query(
    admin_client: Client,
) -> None:
    """A URL pasted into the explain form ('https://example.com/api/ping/?page=2') was
    explained as the path '/https://example.com/api/ping/?page=2', which no view answers."""
    url = reverse("admin:django_throttle_usagecount_inspect")
    pasted = "https://example.com/api/ping/?page=2#top"

    page = admin_client.get(url, {"client": "203.0.113.9", "path": pasted}).content.decode()
    plain = admin_client.get(url, {"client": "203.0.113.9", "path": "/api/ping/"})

    explained = re.sub(r'value="[^"]*"', "", page)  # the form shows the path as typed
    assert explained == re.sub(r'value="[^"]*"', "", plain.content.decode())
    assert "/api/ping/" in page and "?page=2</" not in page


def test_lists_show_failure_modes_and_counting_in_a_word(admin_client: Client) -> None:
    """The tier list repeated the long failure-mode text on every row, pushing the limits
    off screen; a tier's own page offered "inherit (tier, else …)" though a tier inherits
    from the setting only."""
    Tier.objects.create(slug="free", name="Free")
    EndpointRule.objects.create(
        name="login",
        pattern="/login/",
        match_type="path",
        counts="failures",
        failure_mode="closed",
        methods="GET,POST",
    )
    tiers = admin_client.get(reverse("admin:django_throttle_tier_changelist")).content.decode()
    assert '<td class="field-failure_mode_word">inherit</td>' in tiers
    assert "DJANGO_THROTTLE_FAILURE_MODE" not in tiers
    rules = admin_client.get(reverse("admin:django_throttle_endpointrule_changelist"))
    text = rules.content.decode()
    assert '<td class="field-matches">path /login/</td>' in text
    assert '<td class="field-method_list">GET, POST</td>' in text
    assert '<td class="field-counts_word">failures</td>' in text
    assert '<td class="field-failure_mode_word">closed</td>' in text
    add = admin_client.get(reverse("admin:django_throttle_tier_add")).content.decode()
    assert "inherit (the DJANGO_THROTTLE_FAILURE_MODE setting)" in add
    assert "inherit (tier, else" not in add
    rule_page = admin_client.get(reverse("admin:django_throttle_endpointrule_add"))
    assert '<option value="ip">IP address</option>' in rule_page.content.decode()


def test_usage_rows_name_users_and_keys_with_a_link(admin_client: Client) -> None:
    """Clients showed as 'user:2'; each is now what it is, in words ("User alice", "API key
    <prefix>… (<name>)", "Address …"), a user or an API key linked to its admin page, the
    recorded label in the tooltip and an inspect link. Names are escaped."""
    from django_throttle.models import ApiKey

    free = Tier.objects.create(slug="free", name="Free")
    alice = User.objects.create_user("alice")
    api_key, _full = ApiKey.objects.create_key(name="partner <b>feed</b>", tier=free)
    minute = RECENT
    for client in (f"user:{alice.pk}", f"key:{api_key.prefix}", "ip:203.0.113.9", "user:999"):
        UsageCount.objects.create(window_start=minute, client=client, tier="*", endpoint="*")

    url = reverse("admin:django_throttle_usagecount_changelist")
    page = admin_client.get(url, {"kind": "clients"})
    text = page.content.decode()
    user_url = reverse("admin:auth_user_change", args=[alice.pk])
    key_url = reverse("admin:django_throttle_apikey_change", args=[api_key.pk])
    inspect = reverse("admin:django_throttle_usagecount_inspect")
    assert (
        f'<span title="user:{alice.pk}"><a href="{user_url}">User alice</a></span> '
        f'<a class="dt-inspect" href="{inspect}?client=user%3A{alice.pk}">inspect</a>'
    ) in text
    assert (
        f'<a href="{key_url}">API key {api_key.prefix}… (partner &lt;b&gt;feed&lt;/b&gt;)</a>'
    ) in text
    assert '<span title="ip:203.0.113.9">Address 203.0.113.9</span>' in text
    assert '<span title="user:999">User 999 (no such user)</span>' in text


def test_deleting_a_tier_that_leaves_clients_unlimited_says_so_before_it_is_confirmed(
    admin_client: Client, django_user_model: Any
) -> None:
    """Clients with no tier are not limited. The confirmation page listed only the rows to be
    deleted, so deleting the default tier for anonymous clients (with the login limits it
    carries) switched limiting off for them without a word: now the page says so, for each
    default and for the users assigned, on the delete page and the "delete selected" action."""
    from tests.factories import tier

    anonymous = tier("anonymous", "5/min", is_default_anonymous=True)
    free = tier("free", "60/min", is_default_authenticated=True)
    pro = tier("pro", "600/min")
    TierAssignment.objects.create(tier=pro, user=django_user_model.objects.create(username="a"))

    def warnings_deleting(*tiers: Tier) -> list[str]:
        if len(tiers) == 1:
            url = reverse("admin:django_throttle_tier_delete", args=[tiers[0].pk])
            response = admin_client.get(url)
        else:
            selected = [str(t.pk) for t in tiers]
            changelist = reverse("admin:django_throttle_tier_changelist")
            data = {"action": "delete_selected", "_selected_action": selected}
            response = admin_client.post(changelist, data)
        assert response.status_code == 200
        return [text for level, text in messages_of(response) if level == "warning"]

    assert warnings_deleting(anonymous) == [
        "Tier “Anonymous” is the default tier for anonymous clients: without it they are not "
        "limited at all, until another tier is made their default."
    ]
    assert warnings_deleting(pro) == [
        "The users and groups assigned to tier “Pro” (1) are moved to the default tier for "
        "authenticated users, “Free”."
    ]
    assert warnings_deleting(free, pro) == [
        "Tier “Free” is the default tier for authenticated users: without it, users in no "
        "other tier are not limited at all, until another tier is made their default.",
        "The users and groups assigned to tier “Pro” (1) are not limited at all once it is "
        "deleted: no other tier is the default for authenticated users.",
    ]
    assert Tier.objects.count() == 3  # nothing deleted yet

    url = reverse("admin:django_throttle_tier_delete", args=[anonymous.pk])
    response = admin_client.post(url, {"post": "yes"}, follow=True)
    assert not Tier.objects.filter(pk=anonymous.pk).exists()
    assert [text for level, text in messages_of(response) if level == "warning"] == []
