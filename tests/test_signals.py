"""Signal receivers: what bumps the shared policy version (and what must not), group changes,
and re-timing stored counters when a limit is edited."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import transaction
from django.test import Client

from django_throttle.backends import get_backend
from django_throttle.identity import Identity
from django_throttle.models import EndpointLimit, TierAssignment, TierLimit
from django_throttle.policy import live as policy
from django_throttle.rates import Limit
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db


def version() -> int:
    return int(get_backend().get_policy_version() or 0)


@pytest.fixture
def bumps(
    django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> Callable[[Callable[[], object]], int]:
    """Run an action as a committed transaction and count the version bumps it caused: the
    backend's real bumps, counted as they are made (each moves the version by a random step,
    so the difference of two versions says a bump happened, not how many)."""
    backend = get_backend()
    real = backend.bump_policy_version
    made: list[None] = []

    def bump() -> None:
        real()
        made.append(None)

    monkeypatch.setattr(backend, "bump_policy_version", bump)

    def count(action: Callable[[], object]) -> int:
        before, changed = len(made), version()
        with django_capture_on_commit_callbacks(execute=True):
            action()
        assert (version() != changed) == (len(made) > before)  # each bump reached Redis
        return len(made) - before

    return count


@pytest.fixture
def user(django_user_model: type) -> Any:
    return django_user_model.objects.create_user("u")


@pytest.fixture
def tiered_group() -> Group:
    group = Group.objects.create(name="team")
    TierAssignment.objects.create(group=group, tier=tier("team", "50/m", priority=5))
    return group


def tier_of(user: Any) -> str | None:
    found = policy.current().tier_for(Identity("user", str(user.pk), user_id=user.pk))
    return None if found is None else found.slug


# Group membership (defect 8) ---------------------------------------------------------------


def test_adding_a_user_to_a_tiered_group_bumps_once(
    bumps: Callable[..., int], user: Any, tiered_group: Group
) -> None:
    tier("free", "10/m", is_default_authenticated=True)
    assert tier_of(user) == "free"
    assert bumps(lambda: user.groups.add(tiered_group)) == 1
    assert tier_of(user) == "team"
    assert bumps(lambda: user.groups.remove(tiered_group)) == 1
    assert tier_of(user) == "free"


def test_reverse_add_and_clear_bump_once(
    bumps: Callable[..., int], user: Any, tiered_group: Group
) -> None:
    tier("free", "10/m", is_default_authenticated=True)
    assert bumps(lambda: tiered_group.user_set.add(user)) == 1
    assert tier_of(user) == "team"
    assert bumps(lambda: user.groups.clear()) == 1
    assert tier_of(user) == "free"
    user.groups.add(tiered_group)
    assert bumps(lambda: tiered_group.user_set.clear()) == 1
    assert tier_of(user) == "free"


def test_group_changes_without_a_tier_bump_nothing(
    bumps: Callable[..., int], user: Any, tiered_group: Group
) -> None:
    """Groups used for permissions elsewhere on the site cost the workers no reload."""
    other = Group.objects.create(name="editors")
    assert bumps(lambda: user.groups.add(other)) == 0
    assert bumps(lambda: other.user_set.add(user)) == 0
    assert bumps(lambda: user.groups.remove(other)) == 0
    assert bumps(lambda: user.groups.clear()) == 0  # only untiered groups to clear
    assert bumps(lambda: other.user_set.clear()) == 0
    assert bumps(lambda: Group.objects.create(name="x")) == 0


def test_deleting_a_tiered_group_moves_its_members(
    bumps: Callable[..., int], user: Any, tiered_group: Group
) -> None:
    tier("free", "10/m", is_default_authenticated=True)
    user.groups.add(tiered_group)
    assert tier_of(user) == "team"
    assert bumps(tiered_group.delete) == 1
    assert tier_of(user) == "free"


def test_deleting_an_untiered_group_bumps_nothing_and_keeps_tiers(
    bumps: Callable[..., int], user: Any, tiered_group: Group
) -> None:
    tier("free", "10/m", is_default_authenticated=True)
    other = Group.objects.create(name="editors")
    user.groups.add(tiered_group, other)
    assert tier_of(user) == "team"
    assert bumps(other.delete) == 0
    assert tier_of(user) == "team"


def test_deleting_a_user_of_a_tiered_group_bumps_once(
    bumps: Callable[..., int], user: Any, tiered_group: Group, django_user_model: Any
) -> None:
    """The database drops a deleted user's memberships without an m2m signal."""
    user.groups.add(tiered_group)
    assert bumps(user.delete) == 1
    bystander = django_user_model.objects.create_user("b")
    bystander.groups.add(Group.objects.create(name="editors"))
    assert bumps(bystander.delete) == 0


def test_deleting_a_user_with_an_own_assignment_bumps(
    bumps: Callable[..., int], user: Any, tiered_group: Group
) -> None:
    TierAssignment.objects.create(user=user, tier=tier("gold", "1/s"))
    assert bumps(user.delete) >= 1
    assert not TierAssignment.objects.filter(group=None).exists()


def test_assignment_saves_and_deletes_bump(
    bumps: Callable[..., int], user: Any, tiered_group: Group
) -> None:
    tier("free", "10/m", is_default_authenticated=True)
    gold = tier("gold", "1/s")
    assignment = TierAssignment(user=user, tier=gold)
    assert bumps(assignment.save) == 1
    assert tier_of(user) == "gold"
    assignment.tier = TierAssignment.objects.get(group=tiered_group).tier
    assert bumps(assignment.save) == 1
    assert tier_of(user) == "team"
    assert bumps(assignment.delete) == 1
    assert tier_of(user) == "free"


# Editing a limit re-times stored counters (defect 3) --------------------------------------


@pytest.mark.django_db(transaction=True)
def test_tightening_a_drained_limit_hands_out_no_free_burst(
    client: Client, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drain 10/s, edit it to 10/h, wait past the old refill time: still drained.

    Time is a clock moved by hand (the memory backend's and the policy's), so a slow machine
    cannot refill the bucket between requests; tests/test_backends.py's
    test_lowering_a_limit_hands_out_no_burst runs the same on Redis, whose key TTL it checks."""
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    now = [1_700_000_000.0]
    backend = get_backend()
    backend.clock = lambda: now[0]  # type: ignore[attr-defined]
    monkeypatch.setattr(policy, "clock", lambda: now[0])
    anon = tier("anonymous", "10/s", is_default_anonymous=True)
    assert [client.get("/api/ping/").status_code for _ in range(10)] == [200] * 10
    assert client.get("/api/ping/").status_code == 429
    with transaction.atomic():
        limit = TierLimit.objects.get(tier=anon)
        limit.rate = "10/h"
        limit.save()
    now[0] += 1.1  # the old bucket (1 s to refill under 10/s) would be full again
    assert [client.get("/api/ping/").status_code for _ in range(12)] == [429] * 12


def test_saving_a_limit_bumps_then_retimes(
    bumps: Callable[..., int], monkeypatch: pytest.MonkeyPatch
) -> None:
    free = tier("free", "10/s")
    limit = TierLimit.objects.get(tier=free)
    calls: list[tuple[str, list[str]]] = []
    backend = get_backend()
    real_retime = backend.retime

    def retime(limits: Any, *, previous: Any = None) -> int:
        calls.append((get_backend().get_policy_version() or "", [lim.id for lim in limits]))
        return real_retime(limits, previous=previous)

    monkeypatch.setattr(backend, "retime", retime)
    before = version()
    limit.rate = "10/h"
    assert bumps(limit.save) == 1
    assert calls == [(str(version()), [f"t{limit.pk}"])]  # after the bump
    assert version() != before
    assert bumps(lambda: TierLimit.objects.create(tier=free, rate="1/d")) == 1
    assert len(calls) == 1  # a new limit has no stored counters to re-time


def test_a_retime_failure_is_a_warning_not_an_error(
    bumps: Callable[..., int], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from django_throttle.backends import BackendError

    limit = TierLimit.objects.get(tier=tier("free", "10/s"))

    def broken(limits: Any, *, previous: Any = None) -> int:
        raise BackendError("connection refused")

    monkeypatch.setattr(get_backend(), "retime", broken)
    limit.burst = 20
    assert bumps(limit.save) == 1
    assert "could not re-time stored counters of free 10/s" in caplog.text


@pytest.fixture
def retimed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[Limit], list[Limit] | None]]:
    """What each re-time call received: the limits and the limits before the edit."""
    calls: list[tuple[list[Limit], list[Limit] | None]] = []

    def retime(limits: Any, *, previous: Any = None, now: Any = None) -> int:
        calls.append((list(limits), None if previous is None else list(previous)))
        return 0

    monkeypatch.setattr(get_backend(), "retime", retime)
    return calls


def test_retime_gets_the_limit_as_it_was_before_the_edit(
    bumps: Callable[..., int], retimed: list[Any]
) -> None:
    free = tier("free")
    row = TierLimit.objects.create(tier=free, rate="10/s", burst=20, algorithm="gcra")
    row.rate = "1/s"
    assert bumps(row.save) == 1
    [(limits, previous)] = retimed
    assert [(lim.id, str(lim.rate), lim.burst) for lim in limits] == [(f"t{row.pk}", "1/s", 20)]
    assert [(lim.id, str(lim.rate), lim.algorithm) for lim in previous] == [
        (f"t{row.pk}", "10/s", "gcra")
    ]


def test_an_endpoint_limit_edit_passes_the_old_limit_too(
    bumps: Callable[..., int], retimed: list[Any]
) -> None:
    free = tier("free")
    rule = endpoint("export", "scope", "export", limits={free: "10/m"})
    row = EndpointLimit.objects.get(rule=rule)
    row.burst = 5
    assert bumps(row.save) == 1
    [(limits, previous)] = retimed
    assert [(lim.burst, lim.name) for lim in limits] == [(5, "export (free) 10/min")]
    assert [(lim.burst, lim.name) for lim in previous] == [(10, "export (free) 10/min")]


def test_a_new_algorithm_starts_afresh_without_retime(
    bumps: Callable[..., int], retimed: list[Any]
) -> None:
    row = TierLimit.objects.get(tier=tier("free", "100/h"))
    row.algorithm = "fixed_window"
    assert bumps(row.save) == 1
    assert retimed == []


def test_an_edit_through_the_admin_passes_the_old_limit(
    admin_client: Client, django_capture_on_commit_callbacks: Any, retimed: list[Any]
) -> None:
    free = tier("free")
    row = TierLimit.objects.create(tier=free, rate="500/d", algorithm="calendar_quota")
    data = {
        "slug": "free",
        "name": "Free",
        "priority": "0",
        "load_factor": "100",
        "min_factor": "10",
        "limits-TOTAL_FORMS": "1",
        "limits-INITIAL_FORMS": "1",
        "limits-MIN_NUM_FORMS": "0",
        "limits-MAX_NUM_FORMS": "1000",
        "limits-0-id": str(row.pk),
        "limits-0-tier": str(free.pk),
        "limits-0-rate": "500/d",
        "limits-0-algorithm": "calendar_quota",
        "limits-0-timezone": "Asia/Tokyo",
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(f"/admin/django_throttle/tier/{free.pk}/change/", data)
    assert response.status_code == 302
    [(limits, previous)] = retimed
    assert [lim.timezone for lim in limits] == ["Asia/Tokyo"]
    assert [lim.timezone for lim in previous] == ["America/Chicago"]  # the TIME_ZONE default


def test_a_row_that_could_not_be_compiled_is_retimed_without_a_previous_limit(
    bumps: Callable[..., int], retimed: list[Any]
) -> None:
    row = TierLimit.objects.get(tier=tier("free", "10/s"))
    TierLimit.objects.filter(pk=row.pk).update(rate="10/x")
    row.rate = "5/s"
    assert bumps(row.save) == 1
    [(limits, previous)] = retimed
    assert [str(lim.rate) for lim in limits] == ["5/s"]
    assert previous is None


def test_rule_rows_passing_on_their_rates_in_one_admin_save_retime_from_the_old_rates(
    admin_client: Client, bumps: Callable[..., int], retimed: list[Any]
) -> None:
    """The admin moves a row whose rate another row takes out of the way first (a
    placeholder rate: no unique-constraint 500, see test_bad_input.py); each row's counters
    are still re-timed from its rate before the save, not from the placeholder (which is no
    limit: the counters would be re-timed without the old rate)."""
    from django.urls import reverse

    from tests.test_bad_input import change_page_data

    free = tier("free")
    rule = endpoint("export", "scope", "export", limits={free: "5/m"})
    rule.limits.create(tier=free, rate="10/m")
    url = reverse("admin:django_throttle_endpointrule_change", args=[rule.pk])
    data = change_page_data(admin_client, url)
    for index in range(2):
        data[f"limits-{index}-rate"] = {"5/m": "10/m", "10/m": "20/m"}[data[f"limits-{index}-rate"]]

    assert bumps(lambda: admin_client.post(url, data)) >= 1

    assert sorted((str(new[0].rate), str(old[0].rate)) for new, old in retimed) == [
        ("10/m", "5/m"),
        ("20/m", "10/m"),
    ]
