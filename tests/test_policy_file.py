"""``manage.py throttle_policy``: export, import (idempotent, all-or-nothing, dry run) and
conversion of DRF's throttle settings, checked through the command as an operator runs it."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_throttle.models import (
    EndpointLimit,
    EndpointRule,
    Exemption,
    Protection,
    Tier,
    TierAssignment,
    TierLimit,
)
from django_throttle.policy import live as policy
from django_throttle.policy.files import MAX_BYTES
from django_throttle.rates import canonical_rate
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db


def run(*args: str, stdin: str | None = None) -> str:
    out = io.StringIO()
    if stdin is not None:
        import sys

        old, sys.stdin = sys.stdin, io.StringIO(stdin)
        try:
            call_command("throttle_policy", *args, stdout=out, stderr=io.StringIO())
        finally:
            sys.stdin = old
    else:
        call_command("throttle_policy", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def seed() -> None:
    """A policy with every kind of row: defaults, several algorithms, rules, assignments,
    exemptions."""
    anon = tier("anon", "20/min", is_default_anonymous=True)
    free = tier("free", "100/min", is_default_authenticated=True)
    pro = tier("pro", "600/min", burst=50, priority=10)
    TierLimit.objects.create(tier=pro, rate="100000/month", algorithm="calendar_quota")
    TierLimit.objects.create(tier=pro, rate="20/s", algorithm="gcra")
    endpoint("export", "path", "/api/export/", cost=5, methods="POST", limits={free: "10/min"})
    rule = endpoint("search", "scope", "search", shadow=True, limits={anon: "5/min", pro: "50/min"})
    EndpointLimit.objects.create(rule=rule, tier=free, rate="30/min", algorithm="fixed_window")
    alice = User.objects.create_user("alice")
    TierAssignment.objects.create(user=alice, tier=pro, note="paid")
    partners = Group.objects.create(name="partners")
    TierAssignment.objects.create(group=partners, tier=pro)
    Exemption.objects.create(network="203.0.113.0/24", note="office")
    Exemption.objects.create(user=User.objects.create_user("monitor"))
    Exemption.objects.create(group=Group.objects.create(name="staff"), note="ours")


def snapshot_shape() -> Any:
    """What the compiled snapshot enforces, without the row ids that name counters."""
    policy.invalidate()
    compiled = policy.compile_policy()
    slugs = {t.id: t.slug for t in compiled.tiers.values()}

    def limits(values: Any) -> list[tuple[Any, ...]]:
        return sorted(
            (
                lim.rate.count,
                lim.rate.period,
                lim.burst,
                str(lim.algorithm),
                lim.timezone,
                lim.shadow,
            )
            for lim in values
        )

    tiers = {
        t.slug: (t.name, t.priority, t.failure_mode, limits(t.limits))
        for t in compiled.tiers.values()
    }
    rules = [*compiled.by_path]
    for group in (*compiled.by_scope.values(), *compiled.by_route.values()):
        rules.extend(group)
    endpoints = {
        r.name: (
            r.match_type,
            r.pattern,
            sorted(r.methods),
            r.cost,
            r.shadow,
            r.failure_mode,
            {slugs[t]: limits(v) for t, v in r.limits_by_tier.items()},
        )
        for r in rules
    }
    defaults = (compiled.default_anonymous.slug, compiled.default_authenticated.slug)
    alice = User.objects.get(username="alice")
    exempt = compiled.exemptions
    exemptions = (sorted(exempt.users), sorted(exempt.addresses), [str(n) for n in exempt.networks])
    return tiers, endpoints, defaults, slugs[compiled.user_tiers.get(alice.pk)], exemptions


def test_export_import_round_trip_gives_an_identical_policy(tmp_path: Path) -> None:
    seed()
    exported = run("export")
    shape = snapshot_shape()
    path = tmp_path / "policy.json"
    path.write_text(exported)

    Tier.objects.all().delete()
    EndpointRule.objects.all().delete()
    Exemption.objects.all().delete()  # they were left out of the file
    assert not TierAssignment.objects.exists()
    output = run("import", str(path))

    assert "Imported:" in output
    assert run("export") == exported
    assert snapshot_shape() == shape


#: Rates as an operator may write them in a file, each with what the admin's form stores.
ODD_SPELLINGS = [
    ("5 / m", "5/m"),
    (" 5/min ", "5/m"),
    ("5/minute", "5/m"),
    ("+5/1m", "5/m"),
    ("005/60s", "5/m"),
    ("5/60 s", "5/m"),
    ("100/hour", "100/h"),
    ("3/86400s", "3/d"),
    ("7/1w", "7/7d"),
    ("20/15min", "20/15m"),
    ("10000/months", "10000/month"),
    ("10000/mo", "10000/month"),
]


def admin_stores(client: Any, rate: str, algorithm: str) -> str:
    """What the admin stores for ``rate`` typed in a new tier's limit row."""
    from django.urls import reverse

    from tests.test_admin import inline, limit_row, tier_form

    data = tier_form(slug="via-admin", name="Via admin")
    data |= inline([limit_row(rate, algorithm=algorithm)])
    response = client.post(reverse("admin:django_throttle_tier_add"), data)
    assert response.status_code == 302, response.content.decode()[:2000]
    stored = TierLimit.objects.get(tier__slug="via-admin")
    Tier.objects.filter(slug="via-admin").delete()
    return str(stored.rate)


@pytest.mark.parametrize(("written", "stored"), ODD_SPELLINGS)
def test_an_import_stores_a_rate_as_the_admin_stores_it(
    tmp_path: Path, admin_client: Any, written: str, stored: str
) -> None:
    """A rate is stored in one spelling, whichever way it came in: the import stored it as
    written ("5 / m"), the admin's form as it reads ("5/m")."""
    algorithm = "calendar_quota" if "mo" in written else "token_bucket"
    document = {
        "version": 1,
        "tiers": [
            {"slug": "odd", "name": "Odd", "limits": [{"rate": written, "algorithm": algorithm}]}
        ],
        "rules": [
            {
                "name": "odd-rule",
                "match_type": "scope",
                "pattern": "odd",
                "limits": [{"tier": "odd", "rate": written, "algorithm": algorithm}],
            }
        ],
    }
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document))

    run("import", str(path))

    assert admin_stores(admin_client, written, algorithm) == stored
    assert TierLimit.objects.get(tier__slug="odd").rate == stored
    assert EndpointLimit.objects.get(rule__name="odd-rule").rate == stored
    # import → export → import: the second import changes nothing, and the export writes
    # the stored spelling.
    exported = run("export")
    assert [lim["rate"] for t in json.loads(exported)["tiers"] for lim in t["limits"]] == [stored]
    path.write_text(exported)
    assert "No changes" in run("import", str(path))
    assert run("export") == exported
    # The file as first written, imported again: nothing to change either.
    path.write_text(json.dumps(document))
    assert "No changes" in run("import", str(path))


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_export_import_export_is_identical_with_rows_saved_in_other_spellings(
    tmp_path: Path, fmt: str
) -> None:
    """Rows saved before imports stored the admin's spelling (or through the ORM) hold
    '20/min', '5 / m': an export writes each as the admin stores it, and importing that
    export changes nothing (no '~ 20/min → 20/min', no row rewritten) and exports the same
    file again."""
    seed()
    odd = tier("odd", "5 / m")
    TierLimit.objects.create(tier=odd, rate=" 100/hour ", algorithm="gcra")
    rule = endpoint("odd-rule", "scope", "odd", limits={odd: "+3/60s"})
    first = run("export", "--format", fmt)
    rows = {row.pk: row.rate for row in TierLimit.objects.all()}
    rows |= {row.pk: row.rate for row in EndpointLimit.objects.filter(rule=rule)}
    path = tmp_path / f"policy.{fmt}"
    path.write_text(first)

    assert "No changes" in run("import", str(path))
    assert run("export", "--format", fmt) == first
    document = json.loads(run("export"))
    rates = [lim["rate"] for t in document["tiers"] for lim in t["limits"]]
    rates += [lim["rate"] for r in document["rules"] for lim in r["limits"]]
    assert {"5/m", "100/h", "3/m", "20/m"} <= set(rates)
    assert all(canonical_rate(rate) == rate for rate in rates)
    # Nothing rewritten: the rows (and so their counters) are the same, as saved.
    now = {row.pk: row.rate for row in TierLimit.objects.all()}
    now |= {row.pk: row.rate for row in EndpointLimit.objects.filter(rule=rule)}
    assert now == rows

    # Deleted and imported from the export: stored as the admin stores them, exported alike.
    Tier.objects.all().delete()
    EndpointRule.objects.all().delete()
    run("import", str(path))
    assert run("export", "--format", fmt) == first
    assert set(TierLimit.objects.values_list("rate", flat=True)) <= set(rates)


def test_import_twice_changes_nothing_and_keeps_every_limit_row(tmp_path: Path) -> None:
    seed()
    path = tmp_path / "policy.json"
    path.write_text(run("export"))
    ids = sorted(TierLimit.objects.values_list("pk", flat=True))
    endpoint_ids = sorted(EndpointLimit.objects.values_list("pk", flat=True))

    output = run("import", str(path))

    assert "No changes" in output
    assert sorted(TierLimit.objects.values_list("pk", flat=True)) == ids
    assert sorted(EndpointLimit.objects.values_list("pk", flat=True)) == endpoint_ids


def test_a_changed_rate_edits_the_row_in_place_so_counters_are_kept(tmp_path: Path) -> None:
    seed()
    document = json.loads(run("export"))
    free = next(t for t in document["tiers"] if t["slug"] == "free")
    free["limits"][0]["rate"] = "120/min"
    free["priority"] = 5
    row = TierLimit.objects.get(tier__slug="free")
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document))

    output = run("import", str(path))

    assert "~ tier 'free': priority: 0 → 5" in output
    assert "~ tier 'free' limit: 100/min → 120/min" in output
    row.refresh_from_db()
    assert row.rate == "120/m"  # same row, same counter id; stored as the admin stores it


def test_dry_run_prints_the_diff_and_writes_nothing(tmp_path: Path) -> None:
    seed()
    document = json.loads(run("export"))
    document["tiers"].append({"slug": "gold", "name": "Gold", "limits": [{"rate": "5000/min"}]})
    document["rules"] = [r for r in document["rules"] if r["name"] != "export"]
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document))

    output = run("import", str(path), "--dry-run", "--prune")

    assert "+ tier 'gold'" in output
    assert "+ tier 'gold' limit: 5000/min" in output
    assert "- rule 'export'" in output
    assert "Dry run:" in output
    assert not Tier.objects.filter(slug="gold").exists()
    assert EndpointRule.objects.filter(name="export").exists()


def test_without_prune_rows_missing_from_the_file_are_kept(tmp_path: Path) -> None:
    seed()
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"version": 1, "tiers": [], "rules": []}))

    assert "No changes" in run("import", str(path))
    assert Tier.objects.count() == 3


def test_an_invalid_file_is_refused_whole_naming_entry_and_field(tmp_path: Path) -> None:
    seed()
    document = json.loads(run("export"))
    document["tiers"].append({"slug": "gold", "name": "Gold", "limits": [{"rate": "5000/min"}]})
    pro = next(t for t in document["tiers"] if t["slug"] == "pro")
    pro["limits"][0]["rate"] = "lots"
    document["rules"][0]["cost"] = 0
    document["rules"][0]["limits"][0]["tier"] = "platinum"
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document))
    before = run("export")

    with pytest.raises(CommandError) as error:
        run("import", str(path))

    message = str(error.value)
    assert "Nothing was imported" in message
    assert "tiers[2] 'pro'.limits[0].rate:" in message
    assert "rules[0] 'export'.cost:" in message
    assert "rules[0] 'export'.limits[0].tier: no tier 'platinum'" in message
    assert run("export") == before  # gold was valid, but nothing was written


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("/caf%C3%A9/", "requests are matched by their decoded path: write '/café/'"),
        ("/search?q=1", "a path prefix never holds a query string ('?'): the path is '/search'"),
        (
            "https://example.com/api/",
            "a path prefix is the path alone, without scheme or host: '/api/'",
        ),
    ],
)
def test_a_path_rule_no_request_can_meet_is_refused(
    tmp_path: Path, pattern: str, says: str
) -> None:
    """The admin's rule holds for a file: a pattern no decoded request path can be is a
    problem naming the rule's pattern, not a rule saved dead."""
    rule = {"name": "cafe", "match_type": "path", "pattern": pattern, "limits": []}
    document = {"version": 1, "rules": [rule]}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(CommandError) as error:
        run("import", str(path))
    assert f"rules[0] 'cafe'.pattern: {says}" in str(error.value)
    assert not EndpointRule.objects.exists()


def test_every_problem_of_an_entry_is_listed_in_file_order(tmp_path: Path) -> None:
    """A tier with bad fields of its own had its limits left unchecked (fix the slug, import
    again, only then hear of the bad rate), an unknown field hid every other problem, a limit
    written twice hid the others' problems, and a tier's problems came in alphabetical order.
    Each problem is listed now, naming entry and field, in the order the file writes them."""
    tiers = [
        {
            "slug": "bad slug!",
            "colour": "red",
            "name": "",
            "limits": [
                {"rate": "lots", "burst": 0},
                {"rat": "1/s"},
                {"rate": "5/m"},
                {"rate": "5/min"},
                {"algorithm": "magic", "rate": "1/s"},
            ],
            "priority": "high",
        }
    ]
    rules = [
        {
            "name": "export",
            "limits": [{"tier": "platinum", "rate": "1/s"}, {"tier": "bad slug!", "rate": "x"}],
            "cost": 0,
            "pattern": "export",
        }
    ]
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"version": 1, "tiers": tiers, "rules": rules}))

    with pytest.raises(CommandError) as error:
        run("import", str(path))

    tier, rule = "tiers[0] 'bad slug!'", "rules[0] 'export'"
    lines = [line.strip() for line in str(error.value).splitlines()[1:]]
    assert [line.split(":")[0] for line in lines] == [
        f"{tier}",  # unknown field 'colour'
        f"{tier}.slug",
        f"{tier}.name",
        f"{tier}.limits[0].rate",
        f"{tier}.limits[0].burst",
        f"{tier}.limits[1]",  # unknown field 'rat'
        f"{tier}.limits[3]",  # the same limit as limits[2]
        f"{tier}.limits[4].algorithm",
        f"{tier}.priority",
        f"{rule}.limits[0].tier",
        f"{rule}.limits[1].tier",  # its tier was refused
        f"{rule}.limits[1].rate",
        f"{rule}.cost",
    ], lines
    assert "unknown field 'colour'" in lines[0]
    assert "'lots' is not a rate" in lines[3]
    assert lines[10].endswith(": tier 'bad slug!' is refused for its own problems (above)")
    assert not Tier.objects.exists() and not EndpointRule.objects.exists()


def test_a_limit_written_twice_is_listed_with_the_other_limits_problems(tmp_path: Path) -> None:
    limits = [{"rate": "lots"}, {"rate": "5/m"}, {"rate": "5/min"}]
    document = {"version": 1, "tiers": [{"slug": "t", "name": "T", "limits": limits}]}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document))
    with pytest.raises(CommandError) as error:
        run("import", str(path))
    lines = [line.strip() for line in str(error.value).splitlines()[1:]]
    assert [line.split(":")[0] for line in lines] == [
        "tiers[0] 't'.limits[0].rate",
        "tiers[0] 't'.limits[2]",
    ]
    assert "the same limit as limits[1]" in lines[1]


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"tiers": []}, "version: must be 1"),
        ({"version": 1, "tier": []}, "unknown section 'tier'"),
        ({"version": 1, "tiers": {}}, "tiers: must be a list"),
        ({"version": 1, "tiers": [{"slug": "x", "colour": "red"}]}, "unknown field 'colour'"),
        (
            {"version": 1, "tiers": [{"slug": "x", "name": "X", "limits": [{"rat": "1/s"}]}]},
            "tiers[0] 'x'.limits[0]: unknown field 'rat'",
        ),
        ({"version": 1, "assignments": [{"tier": "x", "user": "nobody"}]}, "no tier 'x'"),
        (
            {"version": 1, "tiers": [{"slug": "bad slug!", "name": "X"}]},
            "tiers[0] 'bad slug!'.slug:",
        ),
        (
            {
                "version": 1,
                "tiers": [
                    {"slug": "t", "name": "T", "limits": [{"rate": "1/s", "algorithm": "magic"}]}
                ],
            },
            "tiers[0] 't'.limits[0].algorithm:",
        ),
        (
            {
                "version": 1,
                "tiers": [{"slug": "t", "name": "T", "limits": [{"rate": "\u0661\u0660/s"}]}],
            },
            "tiers[0] 't'.limits[0].rate: '\u0661\u0660/s' is not a rate",  # Arabic-Indic 10
        ),
    ],
)
def test_bad_documents_get_a_message(tmp_path: Path, document: Any, expected: str) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document))
    with pytest.raises(CommandError, match=r"(?s)Nothing was imported.*" + _re(expected)):
        run("import", str(path))


def _re(text: str) -> str:
    import re

    return re.escape(text)


def _limit_with(**fields: Any) -> dict[str, Any]:
    return {"slug": "t", "name": "T", "limits": [{"rate": "1/s", **fields}]}


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        # Django's validation skips an empty value of a blank column: each of these passed it
        # and then failed the save (a NOT NULL constraint, int('')) or, for a list in a limit
        # row, the check for a limit written twice (unhashable type), with a traceback.
        ({"tiers": [{"slug": "t", "name": "T", "description": None}]}, "'t'.description: must"),
        ({"tiers": [_limit_with(timezone=None)]}, "'t'.limits[0].timezone: must not be null"),
        ({"tiers": [_limit_with(timezone=[])]}, "'t'.limits[0].timezone: must be one value"),
        ({"tiers": [_limit_with(shared={})]}, "'t'.limits[0].shared: must be one value"),
        (
            {"rules": [{"name": "r", "pattern": "r", "methods": None}]},
            "rules[0] 'r'.methods: must not be null",
        ),
        ({"protection": {"in_flight": ""}}, "protection.in_flight: must not be empty"),
        ({"protection": {"worker_lag_ms": ""}}, "protection.worker_lag_ms: must not be empty"),
    ],
)
def test_an_empty_or_list_value_is_a_problem_naming_the_field_not_a_traceback(
    tmp_path: Path, document: Any, expected: str
) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"version": 1, **document}))
    with pytest.raises(CommandError, match=r"(?s)Nothing was imported.*" + _re(expected)):
        run("import", str(path))
    assert not Tier.objects.exists() and not EndpointRule.objects.exists()


@pytest.mark.parametrize("blank", [" ", "   \t", "\n"])
@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"tiers": [{"slug": "t", "name": "{}"}]}, "tiers[0] 't'.name: must not be empty"),
        ({"rules": [{"name": "{}", "pattern": "r"}]}, "rules[0] {!r}.name: must not be empty"),
    ],
)
def test_a_name_of_only_whitespace_is_refused_as_the_admin_refuses_it(
    tmp_path: Path, admin_client: Any, blank: str, document: Any, expected: str
) -> None:
    """The admin strips a name before checking it is given ("This field is required." for
    a tier or rule named " "); the file's same value was imported as the name."""
    from django.urls import reverse

    filled = json.loads(json.dumps(document).replace("{}", json.dumps(blank)[1:-1]))
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"version": 1, **filled}))
    with pytest.raises(
        CommandError,
        match=r"(?s)Nothing was imported.*" + _re(expected.replace("{!r}", repr(blank))),
    ):
        run("import", str(path))
    assert not Tier.objects.exists() and not EndpointRule.objects.exists()

    # The admin's refusal of the same value.
    model = "tier" if "tiers" in document else "endpointrule"
    data = {
        "slug": "t",
        "name": blank,
        "priority": "0",
        "load_factor": "100",
        "min_factor": "10",
        "match_type": "scope",
        "pattern": "r",
        "cost": "1",
        "counts": "all",
        "criticality": "default",
        "limits-TOTAL_FORMS": "0",
        "limits-INITIAL_FORMS": "0",
    }
    response = admin_client.post(reverse(f"admin:django_throttle_{model}_add"), data)
    assert response.status_code == 200
    assert list(response.context["adminform"].form.errors) == ["name"]


def test_an_endpoint_limit_with_a_list_for_its_count_is_a_problem(tmp_path: Path) -> None:
    tier("free", "10/s")
    rule = {"name": "r", "pattern": "r", "limits": [{"tier": "free", "rate": "1/s"}]}
    rule["limits"][0]["counted_by"] = ["ip"]
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"version": 1, "rules": [rule]}))
    with pytest.raises(CommandError, match=_re("'r'.limits[0].counted_by: must be one value")):
        run("import", str(path))
    assert not EndpointRule.objects.exists()


def test_unknown_user_in_an_assignment_is_refused(tmp_path: Path) -> None:
    tier("pro", "1/s")
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"version": 1, "assignments": [{"tier": "pro", "user": "ghost"}]}))
    with pytest.raises(CommandError, match=r"assignments\[0\]\.user: no user 'ghost'"):
        run("import", str(path))


def test_syntax_errors_and_missing_files_are_clear(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text("{not json")
    with pytest.raises(CommandError, match="not valid JSON"):
        run("import", str(path))
    with pytest.raises(CommandError, match="Cannot read"):
        run("import", str(tmp_path / "missing.json"))


def test_yaml_round_trip_and_stdin(tmp_path: Path) -> None:
    seed()
    exported = run("export", "--format", "yaml")
    assert yaml.safe_load(exported)["version"] == 1
    Tier.objects.all().delete()
    EndpointRule.objects.all().delete()
    path = tmp_path / "policy.yaml"
    path.write_text(exported)

    run("import", str(path))

    assert run("export", "--format", "yaml") == exported
    assert "No changes" in run("import", "-", "--format", "yaml", stdin=exported)


def test_moving_the_default_tier_is_not_refused_as_a_second_default(tmp_path: Path) -> None:
    tier("old", "1/s", is_default_anonymous=True)
    path = tmp_path / "policy.json"
    path.write_text(
        json.dumps(
            {"version": 1, "tiers": [{"slug": "new", "name": "New", "is_default_anonymous": True}]}
        )
    )

    output = run("import", str(path))

    assert "~ tier 'old': is_default_anonymous: True → False" in output
    assert Tier.objects.get(is_default_anonymous=True).slug == "new"


def test_import_bumps_the_policy_so_workers_reload() -> None:
    tier("free", "100/min", is_default_authenticated=True)
    before = policy.current()
    document = {
        "version": 1,
        "tiers": [{"slug": "free", "name": "Free", "limits": [{"rate": "5/min"}]}],
    }
    from django_throttle.policy.files import import_policy

    import_policy(document)

    after = policy.current()
    assert after is not before
    free = next(t for t in after.tiers.values() if t.slug == "free")
    assert [str(limit.rate) for limit in free.limits] == ["5/m"]


@override_settings(
    REST_FRAMEWORK={
        "DEFAULT_THROTTLE_CLASSES": [
            "rest_framework.throttling.AnonRateThrottle",
            "rest_framework.throttling.UserRateThrottle",
            "rest_framework.throttling.ScopedRateThrottle",
        ],
        "DEFAULT_THROTTLE_RATES": {
            "anon": "100/day",
            "user": "1000/hour",
            "uploads": "20/minute",
            "burst": "60000/min",
            "off": None,
        },
    }
)
def test_from_drf_converts_rates_to_tiers_and_scope_rules() -> None:
    document = json.loads(run("from-drf"))

    tiers = {t["slug"]: t for t in document["tiers"]}
    assert tiers["anonymous"]["is_default_anonymous"] is True
    # DRF's UserRateThrottle also counts anonymous clients (by IP) at the user rate.
    assert tiers["anonymous"]["limits"] == [
        {"rate": "100/d", "algorithm": "sliding_window_log"},
        {"rate": "1000/h", "algorithm": "sliding_window_log"},
    ]
    assert tiers["authenticated"]["limits"] == [
        {"rate": "1000/h", "algorithm": "sliding_window_log"}
    ]
    rules = {r["name"]: r for r in document["rules"]}
    assert set(rules) == {"uploads", "burst"}
    assert rules["uploads"]["pattern"] == "uploads"
    assert rules["burst"]["limits"][0]["algorithm"] == "sliding_window_counter"

    output = run("from-drf", "--apply")

    assert "+ tier 'anonymous'" in output
    assert EndpointRule.objects.get(name="uploads").limits.count() == 2


@override_settings(
    REST_FRAMEWORK={
        "DEFAULT_THROTTLE_CLASSES": [
            "rest_framework.throttling.AnonRateThrottle",
            "rest_framework.throttling.UserRateThrottle",
        ],
        "DEFAULT_THROTTLE_RATES": {"anon": "3/min", "user": "5/min"},
    }
)
def test_from_drf_as_yaml_writes_a_shared_limit_out_in_full() -> None:
    """The ``user`` rate is a limit of both tiers: the YAML printed an ``&id001`` anchor in
    one and a ``*id001`` alias in the other, which a reader editing the file must untangle."""
    text = run("from-drf", "--format", "yaml")

    assert "&id" not in text and "*id" not in text
    assert text.count("rate: 5/m") == 2


@override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"anon": "many/day"}})
def test_from_drf_names_a_rate_drf_could_not_read() -> None:
    with pytest.raises(CommandError, match="DEFAULT_THROTTLE_RATES\\['anon'\\]: 'many/day'"):
        run("from-drf")


@pytest.mark.parametrize(
    ("rest_framework", "says"),
    [
        ("anon", "REST_FRAMEWORK must be a dict, not str"),
        ({"DEFAULT_THROTTLE_RATES": "100/day"}, "['DEFAULT_THROTTLE_RATES'] must be a dict"),
        ({"DEFAULT_THROTTLE_RATES": [("anon", "1/s"), 2]}, "must be a dict of scope to rate"),
    ],
)
def test_from_drf_with_a_setting_of_the_wrong_type_is_one_line(
    rest_framework: Any, says: str
) -> None:
    """A ``REST_FRAMEWORK`` or ``DEFAULT_THROTTLE_RATES`` that is no dict is a one-line
    CommandError naming the setting (it was an AttributeError or ValueError traceback)."""
    with (
        override_settings(REST_FRAMEWORK=rest_framework),
        pytest.raises(CommandError, match=_re(says)) as refused,
    ):
        run("from-drf")
    assert "\n" not in str(refused.value)
    assert not Tier.objects.exists()


@pytest.mark.parametrize("rest_framework", [{}, {"DEFAULT_THROTTLE_RATES": {"anon": None}}])
def test_from_drf_without_rates_is_refused_and_changes_nothing(rest_framework: Any) -> None:
    """Applying a conversion of no rates would delete the anonymous tier's only limit and
    move the authenticated default to an unlimited tier; it is refused, printed or applied."""
    tier("anonymous", "20/min", is_default_anonymous=True)
    tier("free", "100/min", is_default_authenticated=True)
    before = run("export")

    with override_settings(REST_FRAMEWORK=rest_framework):
        for args in (("from-drf", "--apply"), ("from-drf",)):
            with pytest.raises(CommandError) as error:
                run(*args)
            assert str(error.value) == (
                "Nothing was imported: REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'] holds no "
                "rates, so there is nothing to convert (applied, it would remove every limit "
                "of the default tiers)"
            )

    assert run("export") == before
    assert Tier.objects.get(slug="free").is_default_authenticated


def _nested(depth: int, fmt: str) -> str:
    lists = "[" * depth + "]" * depth  # JSON, and YAML's flow style
    return (
        '{"version": 1, "tiers": ' + lists + "}"
        if fmt == "json"
        else f"version: 1\ntiers: {lists}\n"
    )


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_a_deeply_nested_file_is_refused_in_one_line(tmp_path: Path, fmt: str) -> None:
    """100,000 levels ended in a RecursionError traceback; a file is refused when it nests
    deeper than any policy could, before its values are built."""
    path = tmp_path / f"policy.{fmt}"
    path.write_text(_nested(100_000, fmt))
    with pytest.raises(CommandError) as error:
        run("import", str(path))
    assert str(error.value) == (
        f"Nothing was imported: {path}: "
        "the file nests deeper than 20 levels; a policy file needs 5 at most"
    )


def test_a_file_nested_as_deep_as_allowed_still_gets_its_own_message(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(_nested(19, "json"))
    with pytest.raises(CommandError, match="tiers\\[0\\]: must be a mapping, not list"):
        run("import", str(path))


def _alias_bomb(levels: int) -> str:
    """A few hundred bytes of YAML standing for 10**levels entries: each anchor holds the one
    before it ten times (the "billion laughs"), all in a tier's description (which used to be
    written out as text, the whole expansion)."""
    value = "&l0 x"
    for level in range(1, levels + 1):
        value = f"&l{level} [{value}, {', '.join([f'*l{level - 1}'] * 9)}]"
    return f"version: 1\ntiers:\n- slug: anon\n  name: Anon\n  description: {value}\n"


@pytest.mark.parametrize("levels", [6, 12])
def test_a_yaml_alias_bomb_is_refused_before_it_is_built(tmp_path: Path, levels: int) -> None:
    """Aliases expanding to millions (or a trillion) of entries kept the import and its
    transaction busy for minutes; the expanded size is measured on the node graph, so the
    refusal costs as much as reading the few hundred bytes."""
    tier("anon", "20/min", is_default_anonymous=True)
    path = tmp_path / "policy.yaml"
    path.write_text(_alias_bomb(levels))
    before = run("export")
    with pytest.raises(CommandError) as error:
        run("import", str(path))
    assert str(error.value) == (
        f"Nothing was imported: {path}: the file holds more than 200,000 values (aliases "
        "counted as what they expand to); split the policy or write it without repeated aliases"
    )
    assert run("export") == before


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_a_file_above_the_size_bound_is_refused_before_it_is_read(tmp_path: Path, fmt: str) -> None:
    """A 50 MB file took seconds and hundreds of MB to be refused for its contents; a file
    above MAX_BYTES is refused by its size in one line naming both (a sparse file here: its
    bytes are never read)."""
    tier("anon", "20/min", is_default_anonymous=True)
    path = tmp_path / f"policy.{fmt}"
    with path.open("wb") as file:
        file.write(b"version: 1\n" if fmt == "yaml" else b'{"version": 1}')
        file.truncate(MAX_BYTES + 1)
    before = run("export")
    with pytest.raises(CommandError) as error:
        run("import", str(path))
    assert str(error.value) == (
        f"Nothing was imported: {path} is 16,777,217 bytes, over the 16,777,216 bytes "
        "(16 MiB) a policy file may weigh."
    )
    assert run("export") == before


def test_a_file_of_exactly_the_size_bound_is_read(tmp_path: Path) -> None:
    document = json.dumps({"version": 1, "tiers": []})
    path = tmp_path / "policy.json"
    path.write_text(document + " " * (MAX_BYTES - len(document)))
    assert path.stat().st_size == MAX_BYTES
    assert "No changes" in run("import", str(path), "--dry-run")


@pytest.mark.parametrize("stream", ["bytes", "text"])
def test_standard_input_above_the_size_bound_is_refused(
    monkeypatch: pytest.MonkeyPatch, stream: str
) -> None:
    """Standard input has no size to look at: it is read up to the bound and one byte more."""
    data = b'{"version": 1}' + b" " * MAX_BYTES
    stdin = (
        io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
        if stream == "bytes"
        else io.StringIO(data.decode())
    )
    monkeypatch.setattr("sys.stdin", stdin)
    with pytest.raises(CommandError) as error:
        call_command("throttle_policy", "import", "-", stdout=io.StringIO())
    assert str(error.value) == (
        "Nothing was imported: standard input is more than the 16,777,216 bytes (16 MiB) "
        "a policy file may weigh."
    )


def test_yaml_aliases_within_bounds_and_a_loop_of_aliases(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: 1\nlimit: &limit {rate: 5/s}\n"
        "tiers: [{slug: a, name: A, limits: [*limit]}, {slug: b, name: B, limits: [*limit]}]\n"
    )
    with pytest.raises(CommandError, match="unknown section 'limit'"):
        run("import", str(path))
    path.write_text("version: 1\ntiers: &loop [*loop]\n")
    with pytest.raises(CommandError, match="an alias names a value that contains it"):
        run("import", str(path))


def test_a_limit_written_twice_for_one_tier_is_refused(tmp_path: Path) -> None:
    """200 copies of one limit were imported, and each request then counted 200 buckets.
    Rates compare as parsed: '100/m' is '100/min'."""
    path = tmp_path / "policy.json"
    limits = [{"rate": "100/min"}, {"rate": "100/m"}, {"rate": "100/min", "burst": 5}]
    document = {"version": 1, "tiers": [{"slug": "free", "name": "Free", "limits": limits}]}
    path.write_text(json.dumps(document))
    with pytest.raises(CommandError) as error:
        run("import", str(path))
    assert str(error.value) == (
        "Nothing was imported: tiers[0] 'free'.limits[1]: the same limit as limits[0] "
        "(100/min); every request would count it twice: remove one"
    )
    assert not Tier.objects.exists()

    # A shared ceiling and a per-client limit of the same rate are two limits.
    limits[1:] = [{"rate": "100/min", "shared": True}]
    path.write_text(json.dumps(document))
    assert "Imported" in run("import", str(path))
    assert TierLimit.objects.count() == 2


def test_an_endpoint_limit_written_twice_is_refused(tmp_path: Path) -> None:
    tier("free", "100/min")
    limit = {"tier": "free", "rate": "5/min", "counted_by": "ip"}
    rule = {"name": "login", "match_type": "path", "pattern": "/login/", "limits": [limit] * 2}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"version": 1, "rules": [rule]}))
    with pytest.raises(CommandError, match=r"rules\[0\] 'login'\.limits\[1\]: the same limit"):
        run("import", str(path))


@pytest.mark.parametrize(
    ("encoding", "fmt"),
    [("utf-16", "json"), ("utf-16-be", "json"), ("utf-8-sig", "json"), ("utf-16", "yaml")],
)
def test_a_file_with_a_byte_order_mark_is_read(tmp_path: Path, encoding: str, fmt: str) -> None:
    """What Windows PowerShell's ``>`` writes (UTF-16 with a BOM), and UTF-8 with a BOM."""
    seed()
    exported = run("export", "--format", fmt)
    Tier.objects.all().delete()
    EndpointRule.objects.all().delete()
    path = tmp_path / f"policy.{fmt}"
    data = exported.encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data  # the codec writes no BOM of its own
    path.write_bytes(data)

    run("import", str(path))

    assert run("export", "--format", fmt) == exported


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", r"not UTF-8 text \(byte b'\\x89' at offset 0\)"),
        (b"\xff\xfe{\x00\x00\xd8", "not UTF-16 text"),
        (b'\xef\xbb\xbf{"version": 1,', "not valid JSON"),
        (b"\x00\x01\x02", "not valid JSON"),
    ],
)
def test_an_unreadable_file_is_one_line_naming_it(
    tmp_path: Path, data: bytes, expected: str
) -> None:
    path = tmp_path / "policy.json"
    path.write_bytes(data)
    with pytest.raises(CommandError, match=expected) as caught:
        run("import", str(path))
    assert str(caught.value).startswith(f"Nothing was imported: {path}: ")
    assert "\n" not in str(caught.value)


@pytest.mark.django_db(transaction=True)  # the change is published when it commits
def test_an_import_redis_cannot_publish_says_the_workers_apply_it_late(
    settings: Any, tmp_path: Path
) -> None:
    """With Redis down the import was saved and said "Imported: 1 change." with status 0, as if
    every worker had it within a second; they apply it only when their snapshots are next
    recompiled. It says so, in one line, with status 3 (saved, not published)."""
    tier("free", "100/min", is_default_authenticated=True)
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    document = {
        "version": 1,
        "tiers": [{"slug": "free", "name": "Free", "limits": [{"rate": "5/min"}]}],
    }
    out = io.StringIO()

    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document))

    with pytest.raises(CommandError) as raised:
        call_command("throttle_policy", "import", str(path), stdout=out, stderr=io.StringIO())

    assert raised.value.returncode == 3
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("Redis is unreachable (")
    assert message.endswith(
        "): the running processes apply the import within 5 minutes, not within a second."
    )
    assert out.getvalue().splitlines()[-1] == "Imported: 1 change."
    # Stored as the admin stores it (the file says 5/min).
    assert [limit.rate for limit in TierLimit.objects.filter(tier__slug="free")] == ["5/m"]


def _import_text(tmp_path: Path, text: str, fmt: str = "json") -> None:
    path = tmp_path / f"policy.{fmt}"
    path.write_text(text, encoding="utf-8")
    run("import", str(path))


_TIER = '{"version": 1, "tiers": [{"slug": "t", "name": "T", %s"limits": [{"rate": "1/s"%s}]}]}'


@pytest.mark.parametrize(
    ("text", "fmt", "expected"),
    [
        # Django's to_python truncated 1.5 to a burst of 1 and read true as 1, silently.
        (_TIER % ("", ', "burst": 1.5'), "json", "'t'.limits[0].burst: must be a whole number"),
        (_TIER % ("", ', "burst": true'), "json", "'t'.limits[0].burst: must be a number, not"),
        # int(inf): an OverflowError traceback.
        (_TIER % ('"priority": 1e400, ', ""), "json", "'t'.priority: must be a finite number"),
        # int() read Arabic-Indic, full-width digits and "1_0" as 10; the admin refuses them.
        (
            _TIER % ("", ', "burst": "\u0661\u0660"'),
            "json",
            "'t'.limits[0].burst: must be a number written in the digits 0-9, not \"\u0661\u0660\"",
        ),
        (
            _TIER % ('"priority": "\uff11", ', ""),
            "json",
            "'t'.priority: must be a number written in the digits 0-9, not \"\uff11\"",
        ),
        (
            "version: 1\ntiers:\n- {slug: t, name: T, limits: [{rate: 1/s, max_wait: '1_0'}]}\n",
            "yaml",
            "'t'.limits[0].max_wait: must be a number written in the digits 0-9, not \"1_0\"",
        ),
        # YAML reads an unquoted NO (Norway) as false: it became the region 'FALSE'.
        (
            "version: 1\ntiers:\n- slug: t\n  name: T\n  limits:\n  - rate: 1/s\n    regions: NO\n",
            "yaml",
            "'t'.limits[0].regions: must be text, not false (in YAML, quote it)",
        ),
        # Django read 1, 0 and "no" as flags: a file says true or false.
        (
            _TIER % ("", ', "shared": 1'),
            "json",
            "'t'.limits[0].shared: must be true or false, not 1",
        ),
        (
            _TIER % ("", ', "shared": "no"'),
            "json",
            "'t'.limits[0].shared: must be true or false, not \"no\"",
        ),
        (
            "version: 1\ntiers:\n- slug: t\n  name: 2026-01-01\n",
            "yaml",
            "'t'.name: must be text, not date 2026-01-01",
        ),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused_not_converted(
    tmp_path: Path, text: str, fmt: str, expected: str
) -> None:
    with pytest.raises(CommandError, match=r"Nothing was imported: tiers\[0\] " + _re(expected)):
        _import_text(tmp_path, text, fmt)
    assert not Tier.objects.exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A lone surrogate failed the slug's lookup (not UTF-8) with a traceback; a NUL is
        # text PostgreSQL refuses in any query.
        (
            '{"version": 1, "tiers": [{"slug": "\\ud800", "name": "T"}]}',
            "tiers[0].slug: '\\ud800' holds a lone UTF-16 surrogate",
        ),
        (
            '{"version": 1, "tiers": [{"slug": "t", "name": "A\\u0000B"}]}',
            "tiers[0].name: 'A\\x00B' holds a NUL character",
        ),
        (
            '{"version": 1, "assignments": [{"tier": "t", "user": "\\udfff"}]}',
            "assignments[0].user: '\\udfff' holds a lone UTF-16 surrogate",
        ),
    ],
)
def test_text_no_database_stores_is_a_problem_not_a_traceback(
    tmp_path: Path, text: str, expected: str
) -> None:
    with pytest.raises(CommandError, match="Nothing was imported: " + _re(expected)):
        _import_text(tmp_path, text)
    assert not Tier.objects.exists()


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            {"tiers": [{"slug": "t", "name": "One"}, {"slug": "t", "name": "Two"}]},
            "tiers[1] 't'.slug: tiers[0] has this slug too; write each tier once",
        ),
        (
            {
                "rules": [
                    {"name": "r", "match_type": "scope", "pattern": "a"},
                    {"name": "r", "match_type": "scope", "pattern": "b"},
                ]
            },
            "rules[1] 'r'.name: rules[0] has this name too; write each rule once",
        ),
        (
            {
                "assignments": [
                    {"tier": "free", "user": "alice"},
                    {"tier": "pro", "user": "alice"},
                ]
            },
            "assignments[1].user: assignments[0] assigns this user too",
        ),
    ],
)
def test_an_entry_written_twice_is_refused_not_overwritten(
    tmp_path: Path, document: Any, expected: str
) -> None:
    """The second entry with a slug, name or user silently overwrote the first (the dry run
    listed it as a change of the first)."""
    tier("free", "1/s")
    tier("pro", "2/s")
    User.objects.create_user("alice")
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"version": 1, **document}))
    for args in (("--dry-run",), ()):
        with pytest.raises(CommandError, match="Nothing was imported: " + _re(expected)):
            run("import", *args, str(path))
    assert sorted(Tier.objects.values_list("slug", flat=True)) == ["free", "pro"]
    assert not EndpointRule.objects.exists() and not TierAssignment.objects.exists()


@pytest.mark.parametrize(
    ("text", "fmt", "expected"),
    [
        (
            '{"version": 1, "tiers": [{"slug": "free", "name": "F", "slug": "pro"}]}',
            "json",
            "the key 'slug' is written twice in one object: keep one",
        ),
        (
            "version: 1\ntiers:\n- slug: free\n  name: F\n  slug: pro\n",
            "yaml",
            "line 5: the key 'slug' is written twice in one mapping: keep one",
        ),
    ],
)
def test_a_key_written_twice_in_one_entry_is_refused(
    tmp_path: Path, text: str, fmt: str, expected: str
) -> None:
    """JSON and PyYAML keep a repeated key's last value: the file made tier 'pro' and never
    said so."""
    with pytest.raises(CommandError, match=_re(expected)):
        _import_text(tmp_path, text, fmt)
    assert not Tier.objects.exists()


def test_yaml_merge_keys_still_repeat_fields(tmp_path: Path) -> None:
    _import_text(
        tmp_path,
        "version: 1\ntiers:\n- &base\n  slug: a\n  name: Same\n- <<: *base\n  slug: b\n",
        "yaml",
    )
    assert sorted(Tier.objects.values_list("slug", "name")) == [("a", "Same"), ("b", "Same")]


@pytest.mark.parametrize(
    ("note", "expected"),
    [
        ("x" * 256, "assignments[0].note: Ensure this value has at most 255 characters"),
        (None, "assignments[0].note: must not be null"),
    ],
)
def test_an_assignment_is_validated_as_the_admin_validates_it(
    tmp_path: Path, note: Any, expected: str
) -> None:
    """An assignment's note was saved unchecked: too long for its column (a database error
    on PostgreSQL) or ``null`` saved as the text 'None'."""
    tier("pro", "1/s")
    User.objects.create_user("alice")
    path = tmp_path / "policy.json"
    assignment = {"tier": "pro", "user": "alice", "note": note}
    path.write_text(json.dumps({"version": 1, "assignments": [assignment]}))
    with pytest.raises(CommandError, match="Nothing was imported: " + _re(expected)):
        run("import", str(path))
    assert not TierAssignment.objects.exists()


def test_a_change_of_whom_an_endpoint_limit_counts_is_shown(tmp_path: Path) -> None:
    """The dry run showed ``5/min → 5/min`` for a limit moved from counting by IP address
    to counting by username: it now says what changes, as the import then does."""
    anonymous = tier("anonymous", "1/s")
    rule = endpoint("login", "scope", "login")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="5/min", counted_by="ip")
    document = json.loads(run("export"))
    document["rules"][0]["limits"][0]["counted_by"] = "username"
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document))

    change = "~ rule 'login' limit (anonymous): 5/min, counted by ip → 5/min, counted by username"
    assert run("import", "--dry-run", str(path)).splitlines()[0] == change
    assert run("import", str(path)).splitlines()[0] == change
    assert EndpointLimit.objects.get().counted_by == "username"


_DRF_RATES = {"anon": "3/min", "user": "5/minute", "export": "2/m", "unused": None}
_DRF_CLASSES = [
    "rest_framework.throttling.AnonRateThrottle",
    "rest_framework.throttling.UserRateThrottle",
    "rest_framework.throttling.ScopedRateThrottle",
]


def _through_drf_views(monkeypatch: pytest.MonkeyPatch, classes: list[Any]) -> Any:
    """A function sending a list of (method, path) requests, as an anonymous client or as
    a signed-in user (a new address and user each call), through the suite's DRF views
    throttled by ``classes``; it returns each one's statuses."""
    from django.core.cache import cache
    from django.test import Client
    from rest_framework.throttling import SimpleRateThrottle
    from rest_framework.views import APIView

    # DRF binds both when it is imported; the views read them on each request.
    monkeypatch.setattr(APIView, "throttle_classes", classes)
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", _DRF_RATES)
    cache.clear()
    calls = iter(range(1, 100))

    def send(requests: list[tuple[str, str]], signed_in: bool) -> list[int]:
        call = next(calls)
        client = Client(REMOTE_ADDR=f"198.51.100.{call}")
        if signed_in:
            client.force_login(User.objects.get_or_create(username=f"drf-{call}")[0])
        return [getattr(client, method)(path).status_code for method, path in requests]

    return send


def test_a_policy_from_drf_limits_as_drf_did(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """The same requests through DRF's own throttles and through ``PolicyThrottle`` with the
    converted policy get the same answers (anonymous: 3/min, and 5/min from
    UserRateThrottle; users 5/min; the ``export`` scope 2/min for both), but for the one
    difference the migration guide names: a request one limit refuses uses up no other (DRF
    counts it against every throttle that let it through)."""
    # Imported before the settings change: APIView reads its throttle classes on import.
    from rest_framework.throttling import AnonRateThrottle, ScopedRateThrottle, UserRateThrottle

    import tests.urls  # noqa: F401  (the views, and so APIView)
    from django_throttle.drf import PolicyThrottle

    settings.REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": _DRF_CLASSES,
        "DEFAULT_THROTTLE_RATES": _DRF_RATES,
    }

    export, ping = ("post", "/api/export/"), ("get", "/api/ping/")
    anonymous = [export, export, ping, ping, export]
    signed_in = [export, export, ping, ping, ping, ping]
    refused_export_then_pings = [export, export, export, ping, ping, ping]

    send = _through_drf_views(monkeypatch, [AnonRateThrottle, UserRateThrottle, ScopedRateThrottle])
    drf = (send(anonymous, False), send(signed_in, True), send(refused_export_then_pings, True))

    run("from-drf", "--apply")
    send = _through_drf_views(monkeypatch, [PolicyThrottle])
    ours = (send(anonymous, False), send(signed_in, True), send(refused_export_then_pings, True))

    assert drf[:2] == ours[:2] == ([202, 202, 200, 429, 429], [202, 202, 200, 200, 200, 429])
    assert drf[2] == [202, 202, 429, 200, 200, 429]  # the refused export used up a request
    assert ours[2] == [202, 202, 429, 200, 200, 200]


def test_exemptions_are_in_the_file_and_pruned_like_assignments(tmp_path: Path) -> None:
    """Exemptions were never exported: a policy moved to another site lost its office
    network and uptime monitor, and ``--prune`` left exemptions the file did not list."""
    seed()
    exported = json.loads(run("export"))
    assert exported["exemptions"] == [
        {"network": "203.0.113.0/24", "note": "office"},
        {"user": "monitor"},
        {"group": "staff", "note": "ours"},
    ]
    assert "exemptions" not in json.loads(run("export", "--no-assignments"))

    exported["exemptions"][0] = {"network": "203.0.113.7/24", "note": "HQ"}  # the same network
    del exported["exemptions"][1]
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(exported))
    changes = [
        "~ exemption of network '203.0.113.0/24': note: 'office' → 'HQ'",
        "- exemption of user 'monitor'",
    ]
    assert run("import", "--prune", "--dry-run", str(path)).splitlines()[:-1] == changes
    assert run("import", "--prune", str(path)).splitlines()[:-1] == changes
    assert sorted(map(str, Exemption.objects.all())) == ["group staff", "network 203.0.113.0/24"]
    assert "No changes" in run("import", "--prune", str(path))


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"network": "203.0.113.999"}, "exemptions[1].network: '203.0.113.999' is not an IP"),
        ({"user": "ghost"}, "exemptions[1].user: no user 'ghost' in the database"),
        ({"group": "staff", "user": "alice"}, "exemptions[1]: give exactly one of network, user"),
        ({"network": "198.51.100.0/24", "why": "x"}, "exemptions[1]: unknown field 'why'"),
        ({"network": "198.51.100.9/24"}, "exemptions[1].network: exemptions[0] exempts this"),
        ({"network": ["198.51.100.0/24"]}, "exemptions[1].network: must be one value"),
        # 10.0.0.0/0, a slip for /8, is every IPv4 address: limiting off for all of them.
        ({"network": "10.0.0.0/0"}, "exemptions[1].network: 0.0.0.0/0 is wider than /8"),
    ],
)
def test_a_bad_exemption_is_refused_naming_its_field(
    tmp_path: Path, entry: Any, expected: str
) -> None:
    User.objects.create_user("alice")
    Group.objects.create(name="staff")
    document = {"version": 1, "exemptions": [{"network": "198.51.100.0/24"}, entry]}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document))
    with pytest.raises(CommandError, match="Nothing was imported: " + _re(expected)):
        run("import", str(path))
    assert not Exemption.objects.exists()


@pytest.mark.parametrize("action", ["export", "from-drf"])
def test_an_output_file_that_cannot_be_written_is_one_line(tmp_path: Path, action: str) -> None:
    """``-o`` into a missing folder or onto a directory was a FileNotFoundError or
    IsADirectoryError traceback."""
    tier("free", "1/s")
    rest_framework = {"DEFAULT_THROTTLE_RATES": {"anon": "1/s"}}
    for output in (tmp_path / "missing" / "policy.json", tmp_path):
        with (
            override_settings(REST_FRAMEWORK=rest_framework),
            pytest.raises(CommandError, match=f"^Cannot write {_re(str(output))}: ") as caught,
        ):
            run(action, "-o", str(output))
        assert "\n" not in str(caught.value)


def test_pruning_a_tier_lists_the_rows_deleted_with_it(tmp_path: Path) -> None:
    """``--prune`` listed only ``- tier 'pro'``: its endpoint limits in the rules the file
    keeps, and the users and groups assigned to it, went without a line (a file exported
    with ``--no-assignments`` has no assignments to compare)."""
    seed()
    document = json.loads(run("export", "--no-assignments"))
    document["tiers"] = [t for t in document["tiers"] if t["slug"] != "pro"]
    for rule in document["rules"]:
        rule["limits"] = [limit for limit in rule["limits"] if limit["tier"] != "pro"]
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document))
    changes = [
        "- tier 'pro'",
        "- rule 'search' limit (pro): 50/min",
        "- assignment of user 'alice'",
        "- assignment of group 'partners'",
    ]

    assert run("import", "--prune", "--dry-run", str(path)).splitlines()[:-1] == changes
    assert run("import", "--prune", str(path)).splitlines()[:-1] == changes
    assert not TierAssignment.objects.exists()
    assert not EndpointLimit.objects.filter(tier__slug="pro").exists()


def test_a_field_of_the_wrong_shape_hides_no_other_problem_of_its_entry(tmp_path: Path) -> None:
    """Once one column of an entry held a list or a null, the entry's other columns went
    unchecked: the next import found them, one round at a time."""
    entry = {
        "slug": "t",
        "name": ["T"],
        "priority": "high",
        "limits": [{"rate": "1/s", "timezone": None, "burst": "x"}],
    }
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"version": 1, "tiers": [entry]}))
    with pytest.raises(CommandError) as caught:
        run("import", str(path))
    assert str(caught.value).splitlines()[1:] == [
        "  tiers[0] 't'.name: must be one value, not a list",
        "  tiers[0] 't'.priority: “high” value must be an integer.",
        "  tiers[0] 't'.limits[0].timezone: must not be null (write \"\" for none)",
        "  tiers[0] 't'.limits[0].burst: “x” value must be an integer.",
    ]


def test_an_export_an_import_would_refuse_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site with many users assigned one by one exported a file above the values an import
    takes: the operator learnt it only when importing it elsewhere. The export now refuses,
    naming ``--no-assignments``, and what it does write the import takes (one count)."""
    from django_throttle.policy import files

    monkeypatch.setattr(files, "MAX_VALUES", 400)
    seed()
    pro = Tier.objects.get(slug="pro")
    users = User.objects.bulk_create(User(username=f"u{n}") for n in range(60))
    TierAssignment.objects.bulk_create(TierAssignment(user=user, tier=pro) for user in users)
    out = tmp_path / "policy.json"
    with pytest.raises(
        CommandError,
        match=r"Nothing was written: it holds [\d,]+ values, more "
        r"than the 400 an import takes; write it with --no-assignments$",
    ):
        run("export", "--output", str(out))
    assert not out.exists()
    with pytest.raises(files.PolicyFileError, match="the file holds more than"):
        files.load(files.dump(files.export_policy(), "json"), "json")  # as the import would

    out.write_text(run("export", "--no-assignments"))
    assert "No changes" in run("import", str(out))  # what it wrote, the import takes


def seed_every_kind() -> None:
    """A policy with every kind of row and value, as the admin stores them: each algorithm,
    bursts, delays, calendar quotas in time zones, shared and regional limits, every match
    type, counting policy, failure mode and counter, assignments, exemptions of every kind
    (IPv6, an IPv4-mapped range stored as IPv4) and service protection."""
    anon = Tier.objects.create(slug="anon", name="Anon", is_default_anonymous=True)
    anon.failure_mode = "open"
    anon.save()
    free = Tier.objects.create(
        slug="free", name="Frée", is_default_authenticated=True, failure_mode="closed"
    )
    pro = Tier.objects.create(
        slug="pro", name="Pro", priority=10, failure_mode="local", load_factor=80, min_factor=20
    )
    for owner, fields in [
        (anon, {"rate": "10/s", "burst": 20}),
        (anon, {"rate": "1000/m", "shared": True}),
        (free, {"rate": "5/s", "algorithm": "gcra", "burst": 10, "delay": 2, "max_wait": 1.5}),
        (free, {"rate": "5/s", "algorithm": "leaky_bucket", "burst": 7}),
        (free, {"rate": "100/m", "algorithm": "fixed_window"}),
        (free, {"rate": "100/h", "algorithm": "sliding_window_log"}),
        (free, {"rate": "1000/d", "algorithm": "sliding_window_counter", "regions": "DE,FR"}),
        (pro, {"rate": "100000/month", "algorithm": "calendar_quota", "timezone": "Asia/Kolkata"}),
        (pro, {"rate": "500/d", "algorithm": "calendar_quota"}),
        (pro, {"rate": "3/m", "algorithm": "concurrency"}),
    ]:
        TierLimit.objects.create(tier=owner, **fields)
    login = EndpointRule.objects.create(
        name="login", match_type="path", pattern="/login/", methods="POST", counts="failures",
        failure_mode="closed", criticality="critical",
    )  # fmt: skip
    EndpointLimit.objects.create(rule=login, tier=anon, rate="5/m", counted_by="ip")
    EndpointLimit.objects.create(rule=login, tier=anon, rate="10/h", counted_by="username")
    orders = EndpointRule.objects.create(
        name="orders", match_type="route", pattern="api:orders", methods="GET,POST", cost=3,
        counts="success", shadow=True, criticality="sheddable",
    )  # fmt: skip
    EndpointLimit.objects.create(rule=orders, tier=pro, rate="2/m", algorithm="concurrency")
    EndpointLimit.objects.create(
        rule=orders, tier=free, rate="100/month", algorithm="calendar_quota", timezone="UTC"
    )
    search = endpoint("search", "scope", "search", cost=100)
    EndpointLimit.objects.create(rule=search, tier=free, rate="20/m", algorithm="gcra", burst=5)
    TierAssignment.objects.create(user=User.objects.create_user("alice"), tier=pro, note="paid")
    TierAssignment.objects.create(group=Group.objects.create(name="partners"), tier=pro)
    Exemption.objects.create(network="203.0.113.0/24", note="office")
    Exemption.objects.create(network="2001:db8::/48")
    Exemption.objects.create(network="198.51.100.0/24")  # the admin's ::ffff:198.51.100.0/120
    Exemption.objects.create(user=User.objects.create_user("bøb"))
    Exemption.objects.create(group=Group.objects.create(name="staff"), note="ours")
    Protection.objects.create(in_flight=100, default_share=80, sheddable_share=50)


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_every_kind_of_row_survives_export_import_export_byte_for_byte(
    tmp_path: Path, fmt: str
) -> None:
    """Imported into a database holding none of the policy (its users and groups only),
    an export gives back the file it came from, byte for byte, and enforces the same."""
    seed_every_kind()
    exported = run("export", "--format", fmt)
    shape = snapshot_shape()
    path = tmp_path / f"policy.{fmt}"
    path.write_text(exported, encoding="utf-8")
    for model in (Tier, EndpointRule, Exemption, Protection):
        model.objects.all().delete()

    assert "Imported: " in run("import", str(path))
    assert run("export", "--format", fmt) == exported
    assert snapshot_shape() == shape
    assert "No changes" in run("import", str(path))


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_rows_saved_in_other_spellings_export_as_stored_and_import_as_no_change(
    tmp_path: Path, fmt: str
) -> None:
    """Rows saved around the admin (the ORM, a data migration) may hold 'fr, de' for
    regions, 'post, get' for methods, '192.0.2.1' for a network: the export wrote them so
    (an import then stored another spelling, and export → import → export differed), and
    importing the site's own export edited the limit (re-timing its counters) and added a
    second exemption of each such network."""
    pro = tier("pro")
    TierLimit.objects.create(tier=pro, rate="5/min", regions="fr, de")
    rule = endpoint("orders", "scope", "orders", methods="post, get", limits={pro: "5/m"})
    EndpointLimit.objects.filter(rule=rule).update(regions=" no")
    Exemption.objects.create(network="192.0.2.1")
    Exemption.objects.create(network="::ffff:198.51.100.0/120")
    rows = sorted(TierLimit.objects.values_list()) + sorted(EndpointLimit.objects.values_list())
    exported = run("export", "--format", fmt)
    document = yaml.safe_load(exported)
    assert document["tiers"][0]["limits"][0]["regions"] == "DE,FR"
    assert document["rules"][0]["methods"] == "GET,POST"
    assert document["rules"][0]["limits"][0]["regions"] == "NO"
    assert document["exemptions"] == [{"network": "192.0.2.1/32"}, {"network": "198.51.100.0/24"}]
    path = tmp_path / f"policy.{fmt}"
    path.write_text(exported, encoding="utf-8")

    assert "No changes" in run("import", str(path))
    assert run("import", str(path), "--prune").startswith("No changes")
    after = sorted(TierLimit.objects.values_list()) + sorted(EndpointLimit.objects.values_list())
    assert after == rows  # the rows (and their counters) kept as they were
    assert Exemption.objects.count() == 2
    assert run("export", "--format", fmt) == exported


def test_a_network_saved_twice_in_two_spellings_is_exported_once(tmp_path: Path) -> None:
    """Rows saved around the admin as '192.0.2.1' and '192.0.2.1/32' were exported as two
    identical entries, and importing that file was refused ("exempts this network too"):
    what an export writes, an import must take."""
    Exemption.objects.create(network="192.0.2.1", note="office")
    Exemption.objects.create(network="192.0.2.1/32", note="again")
    Exemption.objects.create(network="198.51.100.0/24")
    exported = run("export")
    assert json.loads(exported)["exemptions"] == [
        {"network": "192.0.2.1/32", "note": "office"},  # the first row, as an import matches
        {"network": "198.51.100.0/24"},
    ]
    path = tmp_path / "policy.json"
    path.write_text(exported)

    assert "No changes" in run("import", str(path))
    assert run("export") == exported
    assert run("import", "--prune", str(path)).splitlines()[:-1] == [
        "- exemption of network '192.0.2.1/32'"  # the repeat, not the row the file names
    ]
    assert sorted(Exemption.objects.values_list("network", "note")) == [
        ("192.0.2.1", "office"),
        ("198.51.100.0/24", ""),
    ]
    assert run("export") == exported


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: 1\ntiers:\n- slug: t\n  name: T\n  1: x\n  '1': y\n", "unknown field '1', 1"),
        ("version: 1\n1: x\nx: 1\n", "unknown section 'x', 1"),
        ("version: 1\nassignments:\n- {tier: t, 1: x, x: 1}\n", "unknown field 'x', 1"),
        ("version: 1\nexemptions:\n- {1: x, x: 1}\n", "unknown field 'x', 1"),
        ("version: 1\nprotection: {1: x, x: 1}\n", "unknown field 'x', 1"),
    ],
)
def test_unknown_keys_of_mixed_kinds_are_listed_not_a_traceback(
    tmp_path: Path, text: str, expected: str
) -> None:
    """A YAML mapping with a number key and a text key was a TypeError traceback: the
    unknown keys were sorted, and 1 and '1' do not compare."""
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(CommandError, match=f"^Nothing was imported: .*{_re(expected)}"):
        run("import", str(path))
    assert not Tier.objects.exists()


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bad-date.yaml", "version: 1\ntiers:\n- {slug: 2024-02-30, name: T}\n", "day is out"),
        ("long.yaml", f"version: 1\ntiers:\n- {{slug: t, priority: 1{'0' * 5000}}}\n", ""),
        ("long.json", f'{{"version": 1, "tiers": [{{"priority": 1{"0" * 5000}}}]}}', ""),
    ],
)  # fmt: skip
def test_a_value_the_parser_cannot_build_is_one_line(
    tmp_path: Path, name: str, text: str, expected: str
) -> None:
    """A YAML date that is no date, or a number of 5,000 digits (Python reads at most 4,300
    into an int), was a ValueError traceback: PyYAML raises no YAMLError there, nor json a
    JSONDecodeError."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(CommandError) as caught:
        run("import", str(path))
    message = str(caught.value)
    assert message.startswith(f"Nothing was imported: {path}: not valid "), message
    assert expected in message
    assert "\n" not in message
    assert "set_int_max_str_digits" not in message  # advice for programmers, not operators


def test_pruning_a_tier_api_keys_are_in_is_refused_naming_them(tmp_path: Path) -> None:
    """An API key's tier is protected (a key is never in a file, so an import cannot move
    it): ``--prune`` of a tier holding keys was a ProtectedError traceback, dry run too."""
    from django_throttle.models import ApiKey

    tier("free")
    pro = tier("pro", "10/s")
    ApiKey.objects.create_key(name="ci", tier=pro)
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"version": 1, "tiers": [{"slug": "free", "name": "Free"}]}))

    for dry_run in (["--dry-run"], []):
        with pytest.raises(CommandError) as caught:
            run("import", str(path), "--prune", *dry_run)
        message = str(caught.value)
        assert message.startswith(
            "Nothing was imported: tier 'pro': not in the file, so --prune would delete it, "
            "but 1 API key is in it (ci ("
        ), message
        assert message.endswith(
            "move it to another tier in the admin, or keep the tier in the file"
        )
    assert sorted(Tier.objects.values_list("slug", flat=True)) == ["free", "pro"]
    assert "No changes" in run("import", str(path))  # without --prune: nothing to delete


def test_a_tier_with_problems_is_said_to_be_refused_where_the_file_names_it(
    tmp_path: Path,
) -> None:
    """A new tier refused for its own fields was "no tier 'x' in the file or the database"
    in every rule limit and assignment naming it: its author went looking for a tier the
    file has. They say it is refused now."""
    Group.objects.create(name="partners")
    document = {
        "version": 1,
        "tiers": [{"slug": "x", "name": "X", "priority": "high"}],
        "rules": [{"name": "r", "pattern": "r", "limits": [{"tier": "x", "rate": "5/m"}]}],
        "assignments": [{"tier": "x", "group": "partners"}, {"tier": "y", "group": "partners"}],
    }
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document))
    with pytest.raises(CommandError) as caught:
        run("import", str(path))
    assert str(caught.value).splitlines()[1:] == [
        "  tiers[0] 'x'.priority: “high” value must be an integer.",
        "  rules[0] 'r'.limits[0].tier: tier 'x' is refused for its own problems (above)",
        "  assignments[0].tier: tier 'x' is refused for its own problems (above)",
        "  assignments[1].tier: no tier 'y' in the file or the database",
    ]
    assert not Tier.objects.exists()


@pytest.mark.parametrize("fmt", ["json", "yaml"])
@pytest.mark.parametrize(
    "text",
    ["NO", "007", "null", "a: b", "#x", "  lead", "line\nbreak", "a\x85b", "a\u2028b", "ünï 🎉"],
)
def test_text_of_any_kind_survives_export_and_import(tmp_path: Path, fmt: str, text: str) -> None:
    """A description holding U+0085 (NEXT LINE) came back from a YAML file with a space in
    its place: PyYAML wrote it raw in single quotes and read it as a line break."""
    Tier.objects.create(slug="t", name=text, description=text)
    exported = run("export", "--format", fmt)
    path = tmp_path / f"policy.{fmt}"
    path.write_text(exported, encoding="utf-8")
    Tier.objects.all().delete()

    run("import", str(path))

    assert Tier.objects.get().description == text
    assert run("export", "--format", fmt) == exported
