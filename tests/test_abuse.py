"""Abuse: a shared ceiling for all anonymous clients against address rotation, and a flood of
1,000,000 distinct anonymous identities that leaves Redis memory bounded, every key expiring."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
from django.test import Client, RequestFactory
from django.urls import reverse

from django_throttle.backends import get_backend
from django_throttle.backends.base import Backend, shard_of
from django_throttle.backends.redis import RedisBackend
from django_throttle.conf import app_settings
from django_throttle.models import TierLimit
from django_throttle.policy import live as policy
from django_throttle.rates import Limit
from django_throttle.request import core
from tests.factories import endpoint, tier, with_shards

pytestmark = pytest.mark.django_db

MEMORY = "django_throttle.backends.memory.MemoryBackend"
CEILING = 50
PER_CLIENT = 1000
ADDRESSES = [f"198.51.{i // 250}.{i % 250 + 1}" for i in range(200)]
REQUESTS_EACH = 3


@pytest.fixture
def ceiling(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anonymous: 1000/min per client and 50/h for all of them together; signed-in users
    have a tier of their own. The ceiling's share per shard (4) gets a token back every 19
    minutes, so however slow the machine, none comes back during a test."""
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 3600)
    anonymous = tier("anonymous", f"{PER_CLIENT}/min", is_default_anonymous=True)
    TierLimit.objects.create(tier=anonymous, rate=f"{CEILING}/h", shared=True)
    tier("members", "1000/min", is_default_authenticated=True)


def allowed_from(addresses: list[str], each: int) -> int:
    rf = RequestFactory()
    return sum(
        core.check(rf.get("/api/ping/", REMOTE_ADDR=address)).allowed
        for _ in range(each)
        for address in addresses
    )


def test_the_shared_tier_limit_is_compiled_as_one_shared_limit(ceiling: None) -> None:
    anonymous = policy.current().default_anonymous
    assert anonymous is not None
    limits = anonymous.limits

    assert [limit.shared for limit in limits] == [False, True]
    assert limits[1].rate == Limit.build("x", f"{CEILING}/h").rate


@pytest.mark.parametrize("key_shards", [None, 16], ids=["default", "16"])
def test_200_rotating_addresses_get_no_more_than_the_shared_ceiling_split_per_shard(
    settings: Any, key_shards: int | None, ceiling: None, backend: Backend
) -> None:
    """One shard (the default on a single Redis): exactly the ceiling, 50. 16 shards (a
    Cluster's default): each shard admits ceil(50 / 16) = 4, at most 16 x 4 = 64."""
    if key_shards is not None:
        settings.DJANGO_THROTTLE_REDIS_URL = with_shards(
            settings.DJANGO_THROTTLE_REDIS_URL, key_shards
        )
    shards = app_settings.key_shards
    share = math.ceil(CEILING / shards)
    per_shard = Counter(shard_of(f"ip:{address}", shards) for address in ADDRESSES)
    # Each shard admits its share and no more; a shard with fewer requests admits them all.
    expected = sum(min(share, n * REQUESTS_EACH) for n in per_shard.values())

    admitted = allowed_from(ADDRESSES, REQUESTS_EACH)

    assert admitted == expected
    assert admitted <= shards * share  # the documented bound
    if key_shards is None:
        assert shards == 1 and admitted == CEILING  # one shard: the ceiling itself, exact
    else:
        assert admitted <= 16 * 4  # 16 x ceil(50 / 16)
    assert admitted < len(ADDRESSES) * REQUESTS_EACH  # 600 sent; per client alone: all pass


def test_signed_in_users_are_not_under_the_anonymous_ceiling(
    backend: Backend, ceiling: None, django_user_model: Any
) -> None:
    allowed_from(ADDRESSES, REQUESTS_EACH)  # the anonymous ceiling is spent everywhere
    user = django_user_model.objects.create_user("alice")
    request = RequestFactory().get("/api/ping/", REMOTE_ADDR=ADDRESSES[0])
    request.user = user

    decisions = [core.check(request) for _ in range(100)]

    assert all(decision.allowed for decision in decisions)
    assert not core.check(RequestFactory().get("/api/ping/", REMOTE_ADDR=ADDRESSES[0])).allowed


def test_the_admin_warns_about_a_shared_ceiling_whose_share_a_rule_cost_exceeds(
    admin_client: Client, settings: Any
) -> None:
    """50/min over 16 shards (a Cluster's default) holds 4 per shard: a rule costing 10
    could never pass it, which the admin says after saving (the tier's clients may never
    reach that rule)."""
    settings.DJANGO_THROTTLE_REDIS_URL = with_shards(settings.DJANGO_THROTTLE_REDIS_URL, 16)
    endpoint("export", "scope", "export", cost=10)
    data = {
        "slug": "anonymous",
        "name": "Anonymous",
        "description": "",
        "priority": "0",
        "load_factor": "100",
        "min_factor": "10",
        "limits-TOTAL_FORMS": "1",
        "limits-INITIAL_FORMS": "0",
        "limits-MIN_NUM_FORMS": "0",
        "limits-MAX_NUM_FORMS": "1000",
        "limits-0-rate": f"{CEILING}/min",
        "limits-0-algorithm": "token_bucket",
        "limits-0-shared": "on",
    }

    response = admin_client.post(reverse("admin:django_throttle_tier_add"), data, follow=True)

    [warning] = [m.message for m in response.context["messages"] if m.level_tag == "warning"]
    assert "holds at most 4, less than the cost of rule 'export'" in warning
    assert TierLimit.objects.get().shared


# A flood of distinct identities -------------------------------------------------------------

FLOOD = 1_000_000
#: The documented bound on Redis used_memory per tracked client and limit (issue 6); what it
#: measures at 1,000,000 identities is in docs/explanation/benchmarks.md (bench_flood.py).
DOCUMENTED_BYTES_PER_IDENTITY = 150


@pytest.mark.slow
def test_a_million_distinct_identities_leave_memory_bounded_and_every_key_expiring(
    settings: Any,
) -> None:
    from bench.bench_flood import addresses, flood, keyspace
    from tests.redis_servers import RedisServer

    server = RedisServer().start()
    try:
        settings.DJANGO_THROTTLE_REDIS_URL = server.url
        # The default prefix: key length decides the allocation class (a test's random
        # 13-character prefix costs 16 bytes more per key).
        settings.DJANGO_THROTTLE_KEY_PREFIX = "dt"
        settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 30.0}
        backend = get_backend()
        assert isinstance(backend, RedisBackend)
        client = server.client(timeout=60)
        # A slow refill keeps every identity's key alive through the measurement (worst case).
        limits = (Limit.build("t1", "100/day", name="anonymous 100/day"),)
        field = "anonymous"
        backend.hit("ip:warm-up", limits, usage=field)
        client.execute_command("MEMORY", "PURGE")
        before = int(client.info("memory")["used_memory"])
        keys_before = int(client.dbsize())

        result = flood(backend, addresses(FLOOD), limits, field)

        client.execute_command("MEMORY", "PURGE")
        growth = int(client.info("memory")["used_memory"]) - before
        space = keyspace(client, "*")
        dbsize = int(client.dbsize())
        client.close()
    finally:
        server.stop()
    assert result["decisions"] == FLOOD and result["allowed"] == FLOOD
    assert growth / FLOOD <= DOCUMENTED_BYTES_PER_IDENTITY + 5
    assert space["without_ttl"] == 0 and space["keys"] == dbsize
    # One key per identity, plus a bounded number of usage keys (per shard and minute).
    assert keys_before + FLOOD <= dbsize <= keys_before + FLOOD + 16 * 3 * 4
