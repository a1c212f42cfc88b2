"""Tier assignments compiled into the policy: zero SQL for users never seen before (through the
core and through DRF), who wins between own and group assignments, changes made around the
signals seen after ``policy.MAX_AGE``, group membership changes seen after the version bump,
and what the index costs in memory."""

from __future__ import annotations

import dataclasses
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.test import RequestFactory
from rest_framework.test import APIRequestFactory, force_authenticate

from django_throttle.backends import get_backend
from django_throttle.identity import Identity
from django_throttle.middleware import RateLimitHeadersMiddleware
from django_throttle.models import Tier, TierAssignment
from django_throttle.policy import live as policy
from django_throttle.policy.live import UserTiers, compile_user_tiers
from django_throttle.request import core
from tests import views
from tests.factories import tier

pytestmark = pytest.mark.django_db

#: Each tier's capacity: the X-RateLimit-Limit a client of that tier sees.
CAPACITY = {"free": 100, "pro": 200, "team": 300, "gold": 400}


@pytest.fixture
def tiers() -> dict[str, Tier]:
    tier("anonymous", "10/m", is_default_anonymous=True)
    return {
        "free": tier("free", "100/m", is_default_authenticated=True),
        "pro": tier("pro", "200/m", priority=1),
        "team": tier("team", "300/m", priority=5),
        "gold": tier("gold", "400/m", priority=0),
    }


@pytest.fixture
def population(django_user_model: Any, tiers: dict[str, Tier]) -> list[tuple[Any, str]]:
    """1,000 users, written around the signals as a bulk import would be, each with the tier
    they must get: own assignment, one or two tiered groups, own + group, or none."""
    users = django_user_model.objects.bulk_create(
        [django_user_model(username=f"user{i}") for i in range(1000)]
    )
    pro, team, plain = (Group.objects.create(name=name) for name in ("pro", "team", "plain"))
    TierAssignment.objects.bulk_create(
        [
            TierAssignment(group=pro, tier=tiers["pro"]),
            TierAssignment(group=team, tier=tiers["team"]),
        ]
    )
    memberships: list[tuple[Any, Group]] = []
    own: list[TierAssignment] = []
    expected: list[tuple[Any, str]] = []
    for i, user in enumerate(users):
        kind = i % 5
        if kind in (0, 3):
            own.append(TierAssignment(user=user, tier=tiers["gold"]))
        if kind in (1, 2):
            memberships.append((user, pro))
        if kind in (2, 3):
            memberships.append((user, team))
        if kind == 4 and i % 2:
            memberships.append((user, plain))
        expected.append((user, ("gold", "pro", "team", "gold", "free")[kind]))
    TierAssignment.objects.bulk_create(own)
    through = django_user_model.groups.through
    through.objects.bulk_create([through(user=user, group=group) for user, group in memberships])
    return expected


@pytest.fixture
def warm(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Callable[[], policy.Policy]:
    """Compile the policy once, then never check the version during the test."""
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 3600)

    def compile_once() -> policy.Policy:
        snapshot = policy.current()
        assert snapshot.loaded
        return snapshot

    return compile_once


def test_1000_new_users_get_their_tier_through_the_core_with_zero_queries(
    population: list[tuple[Any, str]], warm: Callable[[], object], django_assert_num_queries: Any
) -> None:
    warm()
    factory = RequestFactory()
    seen: list[tuple[int, int | None]] = []
    with django_assert_num_queries(0):
        for user, _ in population:
            request = factory.get("/api/ping/")
            request.user = user
            decision = core.check(request)
            assert decision.allowed
            seen.append((user.pk, None if decision.limit is None else decision.limit.capacity))
    assert seen == [(user.pk, CAPACITY[slug]) for user, slug in population]


def test_1000_new_users_get_their_tier_through_drf_with_zero_queries(
    population: list[tuple[Any, str]], warm: Callable[[], object], django_assert_num_queries: Any
) -> None:
    warm()
    factory = APIRequestFactory()
    view = RateLimitHeadersMiddleware(views.Ping.as_view())
    seen: list[tuple[int, int, str]] = []
    with django_assert_num_queries(0):
        for user, _ in population:
            request = factory.get("/api/ping/")
            force_authenticate(request, user=user)
            response = view(request)
            seen.append((user.pk, response.status_code, response["X-RateLimit-Limit"]))
    assert seen == [(user.pk, 200, str(CAPACITY[slug])) for user, slug in population]


def test_compiling_takes_the_same_queries_for_any_number_of_users(
    tiers: dict[str, Tier], request: pytest.FixtureRequest
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as empty:
        policy.compile_policy()
    request.getfixturevalue("population")
    with CaptureQueriesContext(connection) as full:
        compiled = policy.compile_policy()
    assert len(full.captured_queries) == len(empty.captured_queries)
    assert len(compiled.user_tiers) == 800  # everyone but the unassigned fifth


# Who wins -----------------------------------------------------------------------------------


def tier_of(snapshot: policy.Policy, user: Any) -> str | None:
    found = snapshot.tier_for(Identity("user", str(user.pk), user_id=user.pk))
    return None if found is None else found.slug


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("u")


def in_tiered_group(user: Any, name: str, owner: Tier) -> Group:
    group = Group.objects.create(name=name)
    TierAssignment.objects.create(group=group, tier=owner)
    user.groups.add(group)
    return group


def test_own_assignment_beats_a_higher_priority_group(user: Any, tiers: dict[str, Tier]) -> None:
    in_tiered_group(user, "team", tiers["team"])
    TierAssignment.objects.create(user=user, tier=tiers["gold"])
    assert tier_of(policy.compile_policy(), user) == "gold"


def test_the_highest_priority_group_wins(user: Any, tiers: dict[str, Tier]) -> None:
    in_tiered_group(user, "pro", tiers["pro"])
    in_tiered_group(user, "team", tiers["team"])
    in_tiered_group(user, "gold", tiers["gold"])
    assert tier_of(policy.compile_policy(), user) == "team"


def test_equal_priorities_pick_the_oldest_tier_every_time(user: Any) -> None:
    first, second = tier("first", "1/s", priority=3), tier("second", "2/s", priority=3)
    in_tiered_group(user, "b", second)
    in_tiered_group(user, "a", first)
    assert tier_of(policy.compile_policy(), user) == "first"


def test_no_assignment_gets_the_default_tier(user: Any, tiers: dict[str, Tier]) -> None:
    Group.objects.create(name="plain").user_set.add(user)
    assert tier_of(policy.compile_policy(), user) == "free"


def test_a_tier_missing_from_the_snapshot_means_the_default(
    user: Any, django_user_model: Any, tiers: dict[str, Tier]
) -> None:
    """A tier created while the policy compiles is not in the snapshot: its users get the
    default tier until the next compile, and it ranks below every known group tier."""
    other = django_user_model.objects.create_user("other")
    TierAssignment.objects.create(user=user, tier=tiers["gold"])
    in_tiered_group(user, "team", tiers["team"])
    in_tiered_group(other, "gold", tiers["gold"])
    in_tiered_group(other, "pro", tiers["pro"])
    compiled = policy.compile_policy()
    without_gold = {pk: t for pk, t in compiled.tiers.items() if t.slug != "gold"}
    priorities = {pk: t.priority for pk, t in without_gold.items()}
    snapshot = dataclasses.replace(
        compiled, tiers=without_gold, user_tiers=compile_user_tiers(priorities)
    )
    assert tier_of(snapshot, user) == "free"  # own assignment still beats the group
    assert tier_of(snapshot, other) == "pro"


def test_more_than_256_assigned_tiers(django_user_model: Any) -> None:
    """Tier slots widen past one byte."""
    users = django_user_model.objects.bulk_create(
        [django_user_model(username=f"t{i}") for i in range(300)]
    )
    rows = Tier.objects.bulk_create([Tier(slug=f"t{i}", name=f"T{i}") for i in range(300)])
    TierAssignment.objects.bulk_create(
        [TierAssignment(user=u, tier=t) for u, t in zip(users, rows, strict=True)]
    )
    index = compile_user_tiers({t.pk: 0 for t in rows})
    assert [index.get(u.pk) for u in users] == [t.pk for t in rows]


def test_a_custom_resolver_may_pass_the_user_id_as_text(user: Any, tiers: dict[str, Tier]) -> None:
    TierAssignment.objects.create(user=user, tier=tiers["pro"])
    compiled = policy.compile_policy()
    assert compiled.tier_for(Identity("user", "x", user_id=str(user.pk))).slug == "pro"
    assert compiled.tier_for(Identity("user", "x", user_id="nope")).slug == "free"


def test_non_integer_user_ids_use_a_dict() -> None:
    """UUID primary keys: looked up by value, also when given as text."""
    key = uuid.uuid4()
    index = UserTiers(by_key={key: 7}, coerce=uuid.UUID)
    assert index.get(key) == 7
    assert index.get(str(key)) == 7
    assert index.get(uuid.uuid4()) is None
    assert index.get("not-a-uuid") is None
    assert len(index) == 1


# Changes made around the signals, and through them ------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(policy, "clock", fake)
    yield fake


def test_queryset_update_is_seen_after_the_max_age(
    user: Any,
    tiers: dict[str, Tier],
    clock: FakeClock,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 1)
    monkeypatch.setattr(policy, "MAX_AGE", 60)
    TierAssignment.objects.create(user=user, tier=tiers["pro"])
    assert tier_of(policy.current(), user) == "pro"

    TierAssignment.objects.filter(user=user).update(tier=tiers["gold"])  # no signal
    clock.now += 59
    assert tier_of(policy.current(), user) == "pro"
    clock.now += 1
    assert tier_of(policy.current(), user) == "gold"


def test_bulk_created_memberships_are_seen_after_the_max_age(
    user: Any,
    tiers: dict[str, Tier],
    clock: FakeClock,
    settings: Any,
    django_user_model: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(policy, "MAX_AGE", 30)
    group = Group.objects.create(name="team")
    TierAssignment.objects.create(group=group, tier=tiers["team"])
    assert tier_of(policy.current(), user) == "free"

    through = django_user_model.groups.through
    through.objects.bulk_create([through(user=user, group=group)])  # no signal
    clock.now += 30
    assert tier_of(policy.current(), user) == "team"


def test_adding_a_user_to_a_group_reaches_another_process_after_the_bump(
    user: Any,
    tiers: dict[str, Tier],
    clock: FakeClock,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """``user.groups.add`` as the admin does it, seen by a process that only learns of it
    through the shared version (its local reload is switched off here)."""
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 1)
    group = Group.objects.create(name="team")
    TierAssignment.objects.create(group=group, tier=tiers["team"])
    assert tier_of(policy.current(), user) == "free"
    monkeypatch.setattr(policy, "invalidate", lambda: None)
    before = get_backend().get_policy_version()

    with django_capture_on_commit_callbacks(execute=True):
        user.groups.add(group)

    assert get_backend().get_policy_version() != before
    assert tier_of(policy.current(), user) == "free"  # not checked again yet
    clock.now += 1
    assert tier_of(policy.current(), user) == "team"


# Memory -------------------------------------------------------------------------------------


def test_an_assigned_user_costs_about_ten_bytes(django_user_model: Any) -> None:
    users = django_user_model.objects.bulk_create(
        [django_user_model(username=f"m{i}") for i in range(5000)]
    )
    paid = tier("paid", "10/s")
    TierAssignment.objects.bulk_create([TierAssignment(user=u, tier=paid) for u in users])
    tracemalloc.start()
    try:
        index = compile_user_tiers({paid.pk: 0})
        held = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, policy.__file__)]
        )
    finally:
        tracemalloc.stop()
    assert len(index) == 5000
    assert index.get(users[1234].pk) == paid.pk
    size = sum(stat.size for stat in held.statistics("filename"))
    assert size / 5000 < 12
