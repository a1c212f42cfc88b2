"""The key shards' hash tags (:mod:`django_throttle.backends.redis_cluster`): the shard
numbers on one server; on a cluster, tags whose slots spread evenly, so that primaries owning
equal slot ranges (as every managed cluster and ``redis-cli --cluster create`` split them)
hold as many shards each as the count allows. Nothing here connects."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from redis.crc import key_slot

from django_throttle.backends.redis import RedisBackend
from django_throttle.backends.redis_cluster import number_tags, spread_tags
from tests.factories import with_shards

SLOTS = 16384


def even_layout(primaries: int) -> list[int]:
    """The first slot of each primary as ``redis-cli --cluster create`` splits them."""
    per = SLOTS / primaries
    return [round(n * per) for n in range(primaries)]


def shards_per_primary(tags: tuple[str, ...], primaries: int) -> list[int]:
    firsts = even_layout(primaries)
    owners = Counter(
        max(n for n, first in enumerate(firsts) if first <= key_slot(tag.encode())) for tag in tags
    )
    return sorted((owners[n] for n in range(primaries)), reverse=True)


def test_one_server_keeps_the_shard_numbers(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = with_shards(settings.DJANGO_THROTTLE_REDIS_URL, 4)
    backend = RedisBackend()
    try:
        assert backend.shard_tags() == tuple(f"{backend.prefix}:{{{n}}}" for n in range(4))
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("shards", "primaries", "split"),
    [
        (16, 3, [6, 5, 5]),
        (16, 2, [8, 8]),
        (16, 4, [4, 4, 4, 4]),
        (16, 6, [3, 3, 3, 3, 2, 2]),
        (24, 3, [8, 8, 8]),
        (64, 3, [22, 21, 21]),
    ],
)
def test_a_cluster_backend_spreads_its_shards_evenly_over_the_primaries(
    settings: Any, shards: int, primaries: int, split: list[int]
) -> None:
    """The best split ``shards`` allow. With the shard numbers as tags, 16 shards over three
    primaries split 6/6/4: 1.5 times the clients on one primary as on another."""
    settings.DJANGO_THROTTLE_REDIS_URL = f"redis+cluster://127.0.0.1:1,127.0.0.1:2?shards={shards}"
    backend = RedisBackend()  # a cluster client is made on first use: nothing connects
    tags = tuple(tag.split("{")[1].rstrip("}") for tag in backend.shard_tags())
    assert shards_per_primary(tags, primaries) == split
    assert shards_per_primary(number_tags(16), 3) == [6, 6, 4]


@pytest.mark.parametrize("count", [1, 2, 3, 7, 16, 100, 1000, 1024])
def test_every_tag_is_distinct_and_near_the_middle_of_its_part(count: int) -> None:
    tags = spread_tags(count)
    assert len(tags) == len(set(tags)) == count
    width = SLOTS // count
    for shard, tag in enumerate(tags):
        assert "{" not in tag and "}" not in tag
        middle = (2 * shard + 1) * SLOTS // (2 * count)
        assert abs(key_slot(tag.encode()) - middle) <= width // 8


def test_the_most_shards_are_found_at_once() -> None:
    spread_tags.cache_clear()
    started = time.process_time()
    spread_tags(1024)
    # Against a floor taken here: hashing 16,384 tags is the least any search could do.
    floor_started = time.process_time()
    for number in range(16384):
        key_slot(str(number).encode())
    floor = time.process_time() - floor_started
    assert floor_started - started < 20 * max(floor, 1e-3)
