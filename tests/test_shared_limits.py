"""Shared limits (``Limit.shared``): one ceiling for all clients, kept per key shard.

Every shard enforces ``ceil(count / shards)`` (burst likewise) for the clients whose keys live
in it, so a decision stays in one Redis Cluster slot. The tests of the split run with 16
shards (a Cluster's default, pinned below); the default elsewhere, one shard, is one exact
ceiling. Both backends, same expectations; the Redis backend runs against the suite's private
redis-server; the ceiling is also driven through the real middleware and every adapter, sync
and async.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import defaultdict
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client

from django_throttle.backends import get_backend
from django_throttle.backends.base import Backend, per_shard, shard_of
from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.redis import RedisBackend
from django_throttle.conf import app_settings
from django_throttle.models import TierLimit
from django_throttle.rates import Algorithm, Limit
from tests.factories import tier, with_shards

T0 = 1_700_000_000.0
SHARDS = 16  # DJANGO_THROTTLE_KEY_SHARDS's default on a Redis Cluster, pinned here


@pytest.fixture(autouse=True)
def key_shards(request: pytest.FixtureRequest, settings: Any) -> int:
    """Split every shared limit over 16 shards, as on a Cluster: these tests are about the
    split. A test of the default parametrizes this fixture with ``None`` (setting unset)."""
    shards: int | None = getattr(request, "param", SHARDS)
    if shards is not None:
        settings.DJANGO_THROTTLE_REDIS_URL = with_shards(settings.DJANGO_THROTTLE_REDIS_URL, shards)
    return app_settings.key_shards


#: Leaves DJANGO_THROTTLE_KEY_SHARDS unset: the default (one shard on the suite's Redis).
DEFAULT_SHARDS = pytest.mark.parametrize("key_shards", [None], indirect=True, ids=["default"])


def shared_limit(algorithm: str = Algorithm.TOKEN_BUCKET, rate: str = "50/m") -> Limit:
    if algorithm == Algorithm.CALENDAR:
        rate = rate.replace("/m", "/day")
    return Limit.build("ceiling", rate, algorithm=algorithm, shared=True)


def clients_by_shard(count: int = 400) -> dict[int, list[str]]:
    found: dict[int, list[str]] = defaultdict(list)
    for n in range(count):
        client = f"ip:10.0.{n // 256}.{n % 256}"
        found[shard_of(client, SHARDS)].append(client)
    return found


def admitted(backend: Backend, client: str, limits: list[Limit], n: int) -> int:
    return sum(backend.hit(client, limits, now=T0).allowed for _ in range(n))


@pytest.mark.parametrize("algorithm", Algorithm.values)
def test_clients_of_one_shard_share_its_bucket(backend: Backend, algorithm: str) -> None:
    """50/min over 16 shards: each shard admits ceil(50 / 16) = 4, whoever asks."""
    limits = [shared_limit(algorithm)]
    first, second, third = clients_by_shard()[3][:3]
    assert admitted(backend, first, limits, 3) == 3
    assert admitted(backend, second, limits, 3) == 1
    assert not backend.hit(third, limits, now=T0).allowed


@pytest.mark.parametrize("algorithm", Algorithm.values)
def test_clients_of_other_shards_are_independent(backend: Backend, algorithm: str) -> None:
    limits = [shared_limit(algorithm)]
    shards = clients_by_shard()
    assert admitted(backend, shards[3][0], limits, 10) == 4
    for shard in (0, 7, 15):
        assert admitted(backend, shards[shard][0], limits, 10) == 4


def test_total_admitted_is_the_shards_times_their_share(backend: Backend) -> None:
    """400 distinct clients, 3 requests each, against a shared 50/min: every shard gives out
    its 4, so the whole admits 16 x 4 = 64 (the documented bound), not 50 and not 1,200."""
    limits = [shared_limit()]
    clients = [client for group in clients_by_shard().values() for client in group]
    total = sum(admitted(backend, client, limits, 3) for client in clients)
    assert total == SHARDS * 4


def test_share_is_rounded_up(backend: Backend) -> None:
    # 20/min: ceil(20 / 16) = 2 per shard; 16/min: exactly 1.
    for rate, share in (("20/m", 2), ("16/m", 1), ("1/m", 1), ("160/m", 10)):
        limits = [Limit.build(f"c{share}{rate[:-2]}", rate, shared=True)]
        assert admitted(backend, clients_by_shard()[5][0], limits, 20) == share, rate


@DEFAULT_SHARDS
def test_one_shard_means_one_exact_ceiling(key_shards: int) -> None:
    """One shard, the default on a single Redis and in memory: 30 clients get exactly 10."""
    assert key_shards == 1
    for backend in (get_backend(), MemoryBackend()):
        assert backend.shards == 1  # type: ignore[attr-defined]
        limits = [shared_limit(rate="10/m")]
        total = sum(admitted(backend, f"ip:192.0.2.{n}", limits, 1) for n in range(30))
        assert total == 10


def test_per_shard_splits_capacity_and_rate() -> None:
    limit = Limit.build("c", "50/m", burst=100, shared=True)
    split = per_shard(limit, SHARDS)
    assert (split.rate.count, split.rate.period, split.burst) == (4, 60, 7)
    assert split.id == limit.id and split.shared
    # A limit that is not shared, or one shard, is counted as it is.
    plain = Limit.build("c", "50/m")
    assert per_shard(plain, SHARDS) is plain
    assert per_shard(limit, 1) is limit
    # A window's burst is its count.
    window = per_shard(shared_limit(Algorithm.SLIDING_LOG), SHARDS)
    assert window.burst == window.rate.count == 4


def test_per_shard_keeps_gcra_valid() -> None:
    """GCRA counts whole microseconds: 40,035/s is fine (24.98 µs rounds off by 0.07%), but
    its share ceil(40,035 / 16) = 2,503/s would be 399.52 µs (0.12%): the next count GCRA
    can keep, 2,504/s (399.36 µs), is taken instead of failing the request."""
    limit = Limit.build("g", "40035/s", algorithm=Algorithm.GCRA, shared=True)
    with pytest.raises(ValueError):
        Limit.build("g", "2503/s", algorithm=Algorithm.GCRA)
    split = per_shard(limit, SHARDS)
    assert (split.rate.count, split.burst, split.algorithm) == (2504, 2503, Algorithm.GCRA)


def test_keys_carry_the_shard_and_no_client_digest(
    redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    limits = [
        Limit.build(f"s{n}", "50/day", algorithm=algorithm, shared=True)
        for n, algorithm in enumerate(Algorithm.values)
    ]
    shards = clients_by_shard()
    for client in shards[3][:2] + shards[9][:1]:
        assert backend.hit(client, limits).allowed
    keys = sorted(key.decode() for key in redis_client.keys(f"{_isolated_throttle}:*"))
    codes = dict(zip(Algorithm.values, "tglfwscn", strict=True))
    expected = sorted(
        f"{_isolated_throttle}:{{{shard}}}*{codes[limit.algorithm]}{limit.id}"
        for shard in (3, 9)
        for limit in limits
    )
    assert keys == expected
    assert backend.key(shards[3][0], limits[0]) == f"{_isolated_throttle}:{{3}}*ts0"
    assert all(redis_client.pttl(key) > 0 for key in keys)


def test_shared_and_per_client_limits_in_one_call(backend: Backend) -> None:
    """All-or-nothing across both kinds: a denial by the client's own limit takes nothing
    from the shard's ceiling."""
    own = Limit.build("own", "2/m")
    ceiling = shared_limit()
    first, second = clients_by_shard()[4][:2]
    assert admitted(backend, first, [own, ceiling], 5) == 2
    assert backend.peek(first, [ceiling], now=T0).remaining == 2
    assert admitted(backend, second, [own, ceiling], 5) == 2
    denied = backend.hit(clients_by_shard()[4][2], [own, ceiling], now=T0)
    assert not denied.allowed and denied.limit == ceiling


def test_refund_gives_back_to_the_shared_bucket(backend: Backend) -> None:
    limits = [shared_limit()]
    first, second = clients_by_shard()[6][:2]
    assert admitted(backend, first, limits, 4) == 4
    backend.refund(first, limits, 2, now=T0)
    assert admitted(backend, second, limits, 4) == 2


def test_reset_empties_the_shard_bucket(backend: Backend) -> None:
    limits = [shared_limit()]
    first, second = clients_by_shard()[2][:2]
    assert admitted(backend, first, limits, 4) == 4
    backend.reset(second, limits)
    assert admitted(backend, first, limits, 4) == 4


def test_retime_reaches_shared_states(backend: Backend) -> None:
    old = shared_limit(Algorithm.GCRA)
    shards = clients_by_shard()
    for shard in (1, 2):
        assert admitted(backend, shards[shard][0], [old], 2) == 2
    new = Limit.build("ceiling", "25/m", algorithm=Algorithm.GCRA, shared=True)
    assert backend.retime([new], now=T0, previous=[old]) == 2


def test_async_hit_on_shared_limits(backend: Backend) -> None:
    limits = [shared_limit()]
    first, second = clients_by_shard()[8][:2]

    async def scenario() -> list[bool]:
        return [(await backend.ahit(c, limits, now=T0)).allowed for c in [first, second] * 3]

    assert asyncio.run(scenario()) == [True] * 4 + [False] * 2


def test_shared_is_part_of_a_limits_identity() -> None:
    plain = Limit.build("x", "10/m")
    shared = Limit.build("x", "10/m", shared=True)
    assert plain != shared
    assert len({plain, shared}) == 2
    assert not plain.shared and shared.shared


def test_shard_matches_the_redis_key(_isolated_throttle: str) -> None:
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    plain = Limit.build("p", "10/m")
    for client in itertools.islice((f"user:{n}" for n in itertools.count()), 50):
        assert backend.key(client, plain).startswith(
            f"{_isolated_throttle}:{{{shard_of(client, SHARDS)}}}"
        )


# Through the real middleware and every adapter ---------------------------------------------

#: The throttled views of tests/urls.py: ``@throttle`` on a sync and an ``async def`` view,
#: the DRF throttle class on a sync ``APIView`` and an adrf async one.
VIEWS = ["/seams/view/", "/seams/view-async/", "/seams/api/", "/seams/api-async/"]
CEILING = 10


def one_address_per_shard(shards: int) -> list[str]:
    """Anonymous addresses, the first of each key shard (so every shard is asked)."""
    found: dict[int, str] = {}
    for n in range(10_000):
        address = f"198.51.{n // 250}.{n % 250 + 1}"
        found.setdefault(shard_of(f"ip:{address}", shards), address)
        if len(found) == shards:
            return [found[shard] for shard in range(shards)]
    raise AssertionError(f"no address in some of {shards} shards")


def another_in_shard(address: str) -> str:
    """Another address in the same key shard as ``address``."""
    shard = shard_of(f"ip:{address}", SHARDS)
    for n in range(10_000):
        other = f"192.0.{n // 250}.{n % 250 + 1}"
        if shard_of(f"ip:{other}", SHARDS) == shard:
            return other
    raise AssertionError(f"no other address in shard {shard}")


def from_addresses(kind: str, path: str, addresses: list[str]) -> list[Any]:
    """One GET from each address through the whole stack: Django's ``Client`` (WSGI) for
    ``kind`` "wsgi", ``AsyncClient`` (ASGI) for "asgi". The address comes as one trusted
    proxy's ``X-Forwarded-For`` (see :func:`anonymous_ceiling`): ``AsyncClient`` takes
    ``REMOTE_ADDR`` from its scope, which a request cannot change."""
    if kind == "wsgi":
        client = Client()
        return [client.get(path, headers={"X-Forwarded-For": a}) for a in addresses]

    async def run() -> list[Any]:
        client = AsyncClient()
        return [await client.get(path, headers={"X-Forwarded-For": a}) for a in addresses]

    return async_to_sync(run)()


@pytest.fixture
def anonymous_ceiling(db: Any, backend: Backend, settings: Any) -> None:
    """Anonymous: 1000/h per address and a shared 10/h for all of them together (a token
    back every 6 minutes at the least, so none comes back during a test), behind one
    trusted proxy."""
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    TierLimit.objects.create(tier=anonymous, rate=f"{CEILING}/h", shared=True)


@DEFAULT_SHARDS
@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("path", VIEWS)
def test_one_shard_admits_exactly_the_shared_ceiling(
    key_shards: int, anonymous_ceiling: None, path: str, kind: str
) -> None:
    """The default on a single Redis (and in memory): one shard, so a shared 10/h admits
    exactly 10 of 40 anonymous addresses, whichever adapter and handler they go through."""
    assert key_shards == 1
    addresses = [f"203.0.113.{n}" for n in range(1, 41)]

    responses = from_addresses(kind, path, addresses)

    assert [r.status_code for r in responses] == [200] * CEILING + [429] * 30
    assert {r["X-RateLimit-Limit"] for r in responses} == {str(CEILING)}
    assert [r["X-RateLimit-Remaining"] for r in responses[:CEILING]] == [
        str(CEILING - n) for n in range(1, CEILING + 1)
    ]


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("path", VIEWS)
def test_sixteen_shards_admit_up_to_shards_times_the_share(
    anonymous_ceiling: None, path: str, kind: str
) -> None:
    """A Cluster's default, 16 shards: each admits ceil(10 / 16) = 1, so a shared 10/h
    admits up to 16 x 1 = 16 (the documented bound), reached here by asking every shard
    twice: one address of each shard gets through, a second address of the shard does not."""
    first = one_address_per_shard(SHARDS)
    second = [another_in_shard(address) for address in first]
    share = math.ceil(CEILING / SHARDS)

    responses = from_addresses(kind, path, first + second)

    allowed = sum(r.status_code == 200 for r in responses)
    assert allowed == SHARDS * share == 16
    assert [r.status_code for r in responses] == [200] * SHARDS + [429] * SHARDS
    assert {r["X-RateLimit-Limit"] for r in responses} == {str(share)}
