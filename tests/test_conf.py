"""The typed settings object: ``KEY_SHARDS``, the one answer to "how many key shards", is the
value set, else 1 (one exact shared ceiling) except on a Redis Cluster URL, where it is 16."""

from __future__ import annotations

from typing import Any

import pytest

from django_throttle.backends import get_backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.redis import RedisBackend
from django_throttle.conf import CLUSTER_SCHEMES, app_settings, is_cluster_url

SINGLE = [
    "redis://127.0.0.1:6379/0",
    "rediss://:secret@redis.example.com:6380/1",
    "unix:///run/redis.sock?db=2",
    "valkey://127.0.0.1:6379/0",
    "valkeys://valkey.example.com:6380/0",
]
SENTINEL = [
    "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster",
    "valkey+sentinel://user:pw@10.0.0.1:26379/mymaster/2",
]
CLUSTER = [
    "redis+cluster://10.0.0.1:7000,10.0.0.2:7000",
    "rediss+cluster://:secret@cluster.example.com:6379",
    "valkey+cluster://10.0.0.1:7000",
    "valkeys+cluster://cluster.example.com:6379",
    "REDIS+CLUSTER://10.0.0.1:7000",  # schemes are case-insensitive
]


@pytest.mark.parametrize("url", [*SINGLE, *SENTINEL, None, ""], ids=str)
def test_key_shards_default_to_one_off_a_cluster(settings: Any, url: str | None) -> None:
    """A single Redis, Sentinel's primary, the django-redis cache's Redis (no URL): one
    shard, so a shared limit is one exact ceiling."""
    settings.DJANGO_THROTTLE_REDIS_URL = url

    assert app_settings.KEY_SHARDS == 1


@pytest.mark.parametrize("url", CLUSTER)
def test_key_shards_default_to_sixteen_on_a_cluster(settings: Any, url: str) -> None:
    """16 shards, one slot each, spread over a Cluster's primaries."""
    settings.DJANGO_THROTTLE_REDIS_URL = url

    assert is_cluster_url(url)
    assert app_settings.KEY_SHARDS == 16


def test_every_cluster_scheme_is_tested() -> None:
    assert {url.partition("://")[0].lower() for url in CLUSTER} == CLUSTER_SCHEMES


@pytest.mark.parametrize(
    ("url", "shards"),
    [(SINGLE[0], 16), (SINGLE[0], 1), (SENTINEL[0], 4), (CLUSTER[0], 1), (CLUSTER[0], 64)],
)
def test_a_value_set_wins_over_the_default(settings: Any, url: str, shards: int) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = url
    settings.DJANGO_THROTTLE_KEY_SHARDS = shards

    assert shards == app_settings.KEY_SHARDS


def test_the_default_follows_a_changed_url(settings: Any) -> None:
    """Both settings are read again after any ``DJANGO_THROTTLE_*`` change."""
    settings.DJANGO_THROTTLE_REDIS_URL = CLUSTER[0]
    assert app_settings.KEY_SHARDS == 16
    settings.DJANGO_THROTTLE_REDIS_URL = SINGLE[0]
    assert app_settings.KEY_SHARDS == 1


def test_the_memory_backend_has_one_shard_by_default(settings: Any) -> None:
    settings.DJANGO_THROTTLE_BACKEND = "django_throttle.backends.memory.MemoryBackend"

    backend = get_backend()

    assert isinstance(backend, MemoryBackend)
    assert backend.shards == MemoryBackend().shards == 1


def test_the_redis_backend_keys_one_shard_by_default(redis_url: str) -> None:
    """On the suite's own (single) Redis: every key under the one hash tag ``{0}``."""
    backend = get_backend()

    assert isinstance(backend, RedisBackend)
    assert backend.shards == 1
    assert backend.shard_tags() == (f"{backend.prefix}:{{0}}",)


@pytest.mark.parametrize("shards", [1, 16])
def test_every_reader_sees_the_same_count(settings: Any, shards: int) -> None:
    """The backends build their keys and scripts from ``app_settings.KEY_SHARDS``."""
    settings.DJANGO_THROTTLE_KEY_SHARDS = shards
    redis_backend = get_backend()
    settings.DJANGO_THROTTLE_BACKEND = "django_throttle.backends.memory.MemoryBackend"
    memory_backend = get_backend()

    assert isinstance(redis_backend, RedisBackend) and isinstance(memory_backend, MemoryBackend)
    assert redis_backend.shards == memory_backend.shards == app_settings.KEY_SHARDS == shards
    assert len(redis_backend.shard_tags()) == shards
