"""API keys' last use: recorded by the decision's own backend call (no database write per
request), shown live in the admin, and copied to ``ApiKey.last_used`` by the usage rollup."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from django.contrib.admin.utils import display_for_value
from django.core.management import call_command
from django.test import Client, RequestFactory
from django.urls import reverse

from django_throttle.backends import get_backend
from django_throttle.backends.base import Backend
from django_throttle.backends.redis import RedisBackend
from django_throttle.models import ApiKey, Tier
from django_throttle.policy import live as policy
from django_throttle.rates import Limit
from django_throttle.request import core
from django_throttle.usage import accounting as usage
from tests.factories import tier, with_shards

pytestmark = pytest.mark.django_db

LIMITS = (Limit.build("seen", "1000000/s"),)


@pytest.fixture
def partner(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Tier:
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 3600)
    tier("anonymous", "1000/m", is_default_anonymous=True)
    return tier("partner", "1000/m")


@pytest.fixture
def warm() -> Callable[[], None]:
    def compile_once() -> None:
        assert policy.current().loaded

    return compile_once


def request_with(key: str) -> Any:
    return RequestFactory().get("/api/ping/", HTTP_AUTHORIZATION=f"Api-Key {key}")


def shown(value: datetime | None) -> str:
    """How the admin list prints a time."""
    return str(display_for_value(value, ""))


def test_100_requests_with_a_key_write_nothing_to_the_database_and_the_rollup_copies_the_last_use(
    backend: Backend,
    partner: Tier,
    warm: Callable[[], None],
    django_assert_num_queries: Any,
) -> None:
    row, full_key = ApiKey.objects.create_key(name="ci", tier=partner)
    warm()
    before = int(time.time())
    with django_assert_num_queries(0):
        for _ in range(100):
            assert core.check(request_with(full_key)).allowed
    after = int(time.time())
    row.refresh_from_db()
    assert row.last_used is None  # nothing written on the request path

    out = io.StringIO()
    call_command("throttle_usage", "--rollup", stdout=out)

    row.refresh_from_db()
    assert row.last_used is not None
    assert before <= row.last_used.timestamp() <= after + 1
    assert "API keys with a newer last use: 1." in out.getvalue()


def test_the_admin_shows_the_live_last_use_before_any_rollup(
    backend: Backend,
    partner: Tier,
    warm: Callable[[], None],
    admin_client: Client,
    open_store: Callable[..., Any],
) -> None:
    used, used_key = ApiKey.objects.create_key(name="used", tier=partner)
    ApiKey.objects.create_key(name="idle", tier=partner)
    warm()
    assert core.check(request_with(used_key)).allowed
    second = open_store().keys_last_used([used.prefix])[used.prefix]

    response = admin_client.get(reverse("admin:django_throttle_apikey_changelist"))
    page = response.content.decode()
    detail = admin_client.get(reverse("admin:django_throttle_apikey_change", args=[used.pk]))

    assert response.status_code == 200
    assert shown(datetime.fromtimestamp(second, tz=UTC)) in page
    assert "never (since the last rollup)" in page  # the idle key
    assert shown(datetime.fromtimestamp(second, tz=UTC)) in detail.content.decode()


def test_the_admin_falls_back_to_the_rolled_up_time_when_the_backend_cannot_answer(
    partner: Tier, admin_client: Client, settings: Any
) -> None:
    row, _ = ApiKey.objects.create_key(name="ci", tier=partner)
    stored = datetime(2026, 5, 4, 3, 2, 1, tzinfo=UTC)
    ApiKey.objects.filter(pk=row.pk).update(last_used=stored)
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens

    response = admin_client.get(reverse("admin:django_throttle_apikey_changelist"))

    assert response.status_code == 200
    assert shown(stored) in response.content.decode()


@pytest.mark.parametrize("outage", ["down", "hung"])
def test_with_redis_unavailable_the_admin_never_says_a_key_was_never_used(
    partner: Tier, admin_client: Client, settings: Any, outage: str, request: Any
) -> None:
    """Redis down or hung: the list and the change page said "never (since the last
    rollup)" of a key Redis alone knew to be in use, and an operator cleaning up idle keys
    revoked it. They say Redis is unavailable now, and of a key the rollup saw, that time
    "or later"."""
    idle, _ = ApiKey.objects.create_key(name="idle", tier=partner)
    rolled, _ = ApiKey.objects.create_key(name="rolled", tier=partner)
    stored = datetime(2026, 5, 4, 3, 2, 1, tzinfo=UTC)
    ApiKey.objects.filter(pk=rolled.pk).update(last_used=stored)
    if outage == "down":
        settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    else:
        request.getfixturevalue("hung_redis")

    started = time.monotonic()
    page = admin_client.get(reverse("admin:django_throttle_apikey_changelist"))
    detail = admin_client.get(reverse("admin:django_throttle_apikey_change", args=[idle.pk]))
    elapsed = time.monotonic() - started

    assert page.status_code == detail.status_code == 200
    for html in (page.content.decode(), detail.content.decode()):
        assert "never (since the last rollup)" not in html
        assert "unknown: Redis is unavailable (none before the last rollup)" in html
    assert f"{shown(stored)} or later: Redis is unavailable" in page.content.decode()
    assert elapsed < 5, f"{elapsed:.1f} s"


def test_the_rollup_never_moves_last_used_back(backend: Backend, partner: Tier) -> None:
    row, _ = ApiKey.objects.create_key(name="ci", tier=partner)
    later = datetime(2100, 1, 1, tzinfo=UTC)
    ApiKey.objects.filter(pk=row.pk).update(last_used=later)
    backend.hit(f"key:{row.prefix}", LIMITS, usage=usage.field_for("partner", ""))

    call_command("throttle_usage", "--rollup", stdout=io.StringIO())

    row.refresh_from_db()
    assert row.last_used == later


def test_only_key_clients_are_recorded_and_a_later_time_wins(
    backend: Backend, open_store: Callable[..., Any]
) -> None:
    field = usage.field_for("t", "")
    backend.hit("ip:203.0.113.7", LIMITS, usage=field)
    backend.hit("user:42", LIMITS, usage=field)
    backend.hit("key:abcd1234", LIMITS, usage=field, now=2_000_000_000.5)
    backend.hit("key:abcd1234", LIMITS, usage=field, now=1_900_000_000.0)  # late: ignored

    assert open_store().keys_last_used() == {"abcd1234": 2_000_000_000}


def test_without_usage_counting_nothing_is_recorded(
    backend: Backend, open_store: Callable[..., Any]
) -> None:
    backend.hit("key:abcd1234", LIMITS, usage=None)

    assert open_store().keys_last_used() == {}


def test_the_redis_set_gets_its_ttl_when_a_member_is_new(
    redis_client: redis.Redis,
    settings: Any,
    open_store: Callable[..., Any],
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = with_shards(settings.DJANGO_THROTTLE_REDIS_URL, 1)
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    field = usage.field_for("t", "")
    seen = f"{backend.prefix}:{{0}}k"
    store = open_store(backend)

    def hit_and_push(client: str) -> None:
        backend.hit(client, LIMITS, usage=field)
        store.push_tally(backend.usage_tally)

    hit_and_push("key:abcd1234")
    assert redis_client.ttl(seen) > 0
    redis_client.persist(seen)

    hit_and_push("key:abcd1234")
    assert redis_client.ttl(seen) == -1  # a known member: one ZADD, the TTL left alone
    hit_and_push("key:abcd1235")
    assert redis_client.ttl(seen) > 0  # a new member arms it again


def test_the_set_is_bounded_per_shard(
    backend: Backend, settings: Any, open_store: Callable[..., Any]
) -> None:
    from django_throttle.backends.usage_store import KEYS_SEEN_MAX

    settings.DJANGO_THROTTLE_REDIS_URL = with_shards(settings.DJANGO_THROTTLE_REDIS_URL, 1)
    backend = get_backend()
    field = usage.field_for("t", "")
    start = 1_800_000_000.0
    store = open_store(backend)
    for i in range(KEYS_SEEN_MAX + 5):
        backend.hit(f"key:k{i:05d}", LIMITS, usage=field, now=start + i)
        if i % 1000 == 999:  # a process pushes what it counted every second
            store.push_tally(backend.usage_tally)  # type: ignore[attr-defined]

    seen = open_store().keys_last_used()

    assert len(seen) == KEYS_SEEN_MAX
    assert "k00000" not in seen  # the least recently used went first
    assert seen[f"k{KEYS_SEEN_MAX + 4:05d}"] == start + KEYS_SEEN_MAX + 4


def test_the_change_page_writes_last_used_as_django_writes_dates(
    partner: Tier, admin_client: Client, settings: Any
) -> None:
    """The key page's "last used", beside "created", reads as Django writes a date and time
    ("May 4, 2026, 3:02 a.m."), not in ISO form."""
    row, _ = ApiKey.objects.create_key(name="ci", tier=partner)
    stored = datetime(2026, 5, 4, 3, 2, 1, tzinfo=UTC)
    ApiKey.objects.filter(pk=row.pk).update(last_used=stored)
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # the rolled-up time only

    page = admin_client.get(reverse("admin:django_throttle_apikey_change", args=[row.pk]))

    assert page.status_code == 200
    content = page.content.decode()
    assert shown(stored) in content
    assert "2026-05-04" not in content
