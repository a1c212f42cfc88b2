"""The compiled policy: tiers, assignments, zero queries when warm, edits seen within 2 s."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from django_throttle import policy
from django_throttle.backends import get_backend
from django_throttle.identity import Identity
from django_throttle.models import TierAssignment, TierLimit
from tests.factories import tier

pytestmark = pytest.mark.django_db


def test_user_assignment_beats_group_beats_default(django_user_model: type) -> None:
    free = tier("free", "10/m", is_default_authenticated=True)
    pro = tier("pro", "100/m", priority=1)
    team = tier("team", "50/m", priority=5)
    user = django_user_model.objects.create_user("u")
    ident = Identity("user", str(user.pk), user_id=user.pk)
    assert policy.current().tier_for(ident) == policy.current().tiers[free.pk]
    group_a, group_b = Group.objects.create(name="a"), Group.objects.create(name="b")
    TierAssignment.objects.create(group=group_a, tier=pro)
    TierAssignment.objects.create(group=group_b, tier=team)
    user.groups.add(group_a, group_b)
    assert policy.current().tier_for(ident).slug == "team"
    TierAssignment.objects.create(user=user, tier=pro)
    assert policy.current().tier_for(ident).slug == "pro"


def test_anonymous_gets_default_anonymous_tier() -> None:
    anon = tier("anonymous", "1/s", is_default_anonymous=True)
    assert policy.current().tier_for(Identity("ip", "1.2.3.4")).id == anon.pk


def test_zero_queries_per_request_once_warm(
    client: Client, django_user_model: type, django_assert_num_queries: object, settings: object
) -> None:
    settings.DJANGO_THROTTLE_POLICY_REFRESH_INTERVAL = 3600  # type: ignore[attr-defined]
    tier("anonymous", "100/s", is_default_anonymous=True)
    tier("free", "100/s", "1000/d", is_default_authenticated=True)
    user = django_user_model.objects.create_user("u", password="pw")
    client.get("/api/ping/")  # warm the policy
    with django_assert_num_queries(0):  # type: ignore[operator]
        for _ in range(20):
            assert client.get("/api/ping/").status_code == 200
    # Authenticated: the first request looks the user's tier up once, then never again.
    basic = {"HTTP_AUTHORIZATION": "Basic dTpwdw=="}  # u:pw
    assert client.get("/api/ping/", **basic).status_code == 200
    with CaptureQueriesContext(connection) as ctx:
        for _ in range(20):
            assert client.get("/api/ping/", **basic)["X-RateLimit-Limit"] == "100"
    # Basic authentication itself loads the user (1 query per request); the throttle adds 0.
    assert len(ctx.captured_queries) == 20
    assert user.pk


def test_admin_edit_reaches_another_process_within_refresh_interval(
    client: Client, settings: object
) -> None:
    """A worker that did not make the edit sees it once the shared version moves."""
    settings.DJANGO_THROTTLE_POLICY_REFRESH_INTERVAL = 0.5  # type: ignore[attr-defined]
    anon = tier("anonymous", "1/h", is_default_anonymous=True)
    assert [client.get("/api/ping/").status_code for _ in range(2)] == [200, 429]
    # Simulate another process's edit: change the row without this process's signals...
    TierLimit.objects.filter(tier=anon).update(rate="100/h")
    assert client.get("/api/ping/").status_code == 429
    # ...then publish it the way the admin's save does.
    get_backend().bump_policy_version()
    deadline = time.monotonic() + 2
    while client.get("/api/ping/").status_code == 429:
        assert time.monotonic() < deadline, "edit not seen within 2 s"
        time.sleep(0.05)
    assert client.get("/api/ping/")["X-RateLimit-Limit"] == "100"


def test_admin_save_bumps_the_shared_version(
    admin_client: Client, django_capture_on_commit_callbacks: object
) -> None:
    before = get_backend().get_policy_version()
    with django_capture_on_commit_callbacks(execute=True):  # type: ignore[operator]
        response = admin_client.post(
            "/admin/django_throttle/tier/add/",
            {
                "slug": "gold",
                "name": "Gold",
                "priority": 0,
                "limits-TOTAL_FORMS": "1",
                "limits-INITIAL_FORMS": "0",
                "limits-MIN_NUM_FORMS": "0",
                "limits-MAX_NUM_FORMS": "1000",
                "limits-0-rate": "10/s",
                "limits-0-algorithm": "token_bucket",
            },
        )
    assert response.status_code == 302
    assert get_backend().get_policy_version() != before


def test_policy_load_failure_does_not_break_requests(
    client: Client, monkeypatch: pytest.MonkeyPatch, settings: object
) -> None:
    """An unreadable database lets requests through, and is retried once per refresh
    interval, not on every request."""
    from django.db import DatabaseError

    settings.DJANGO_THROTTLE_POLICY_REFRESH_INTERVAL = 3600  # type: ignore[attr-defined]
    tier("anonymous", "1/h", is_default_anonymous=True)
    attempts: list[object] = []
    real_compile = policy.compile_policy

    def broken(version: object = None) -> object:
        attempts.append(version)
        raise DatabaseError("no such table")

    monkeypatch.setattr(policy, "compile_policy", broken)
    assert [client.get("/api/ping/").status_code for _ in range(3)] == [200, 200, 200]
    assert len(attempts) == 1
    # The database is back: the next refresh loads the real policy.
    monkeypatch.setattr(policy, "compile_policy", real_compile)
    settings.DJANGO_THROTTLE_POLICY_REFRESH_INTERVAL = 0.001  # type: ignore[attr-defined]
    time.sleep(0.01)
    assert [client.get("/api/ping/").status_code for _ in range(2)] == [200, 429]


def test_last_good_policy_survives_a_failed_reload(
    client: Client, monkeypatch: pytest.MonkeyPatch, settings: object
) -> None:
    from django.db import DatabaseError

    settings.DJANGO_THROTTLE_POLICY_REFRESH_INTERVAL = 0.001  # type: ignore[attr-defined]
    tier("anonymous", "1/h", is_default_anonymous=True)
    assert client.get("/api/ping/").status_code == 200

    def broken(version: object = None) -> object:
        raise DatabaseError("server closed the connection")

    monkeypatch.setattr(policy, "compile_policy", broken)
    get_backend().bump_policy_version()
    time.sleep(0.01)
    assert client.get("/api/ping/").status_code == 429


def test_tier_lookup_failure_falls_back_to_the_default_tier(
    django_user_model: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import DatabaseError

    free = tier("free", "10/m", is_default_authenticated=True)
    user = django_user_model.objects.create_user("u")
    snapshot = policy.current()

    def broken(user_id: object, tiers: object) -> object:
        raise DatabaseError("connection refused")

    monkeypatch.setattr(policy, "_assigned_tier", broken)
    ident = Identity("user", str(user.pk), user_id=user.pk)
    assert snapshot.tier_for(ident).id == free.pk
    monkeypatch.undo()
    assert snapshot.tier_for(ident).id == free.pk
