"""The hash tags of the key shards, which decide the Redis Cluster slot of every key.

Every key of a client starts ``<prefix>:{<tag>}``: the tag alone picks its slot (a cluster
hashes only the text between the braces). On one server the slot means nothing and the tags
are the shard numbers, ``{0}`` to ``{count - 1}``. On a cluster, which primary serves a shard
is which primary owns its tag's slot, and the numbers' slots fall where CRC16 puts them:
``{0}``…``{15}`` land 6/6/4 on three primaries with the slot ranges split evenly. So there
the tags are chosen instead: shard ``n``'s slot lies within an eighth of a shard's width of
the middle of the ``n``-th of ``count`` equal parts of the 16,384 slots. Managed clusters and
``redis-cli --cluster create`` give each primary one contiguous range of about equal size, so
each primary then holds as many shards as ``count`` allows: 16 over 3 primaries 6/5/5, over
2, 4 or 8 primaries evenly.
"""

from __future__ import annotations

import functools
import itertools

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot


def number_tags(count: int) -> tuple[str, ...]:
    """The tags of one server: the shard numbers."""
    return tuple(str(n) for n in range(count))


@functools.cache
def spread_tags(count: int) -> tuple[str, ...]:
    """The tags of a cluster: the first of the decimal numbers whose slot lies near the middle
    of each shard's part of the slot range (the same on every worker; 1,024 shards take a
    few milliseconds, once per process)."""
    slots = REDIS_CLUSTER_HASH_SLOTS
    reach = slots // count // 8
    found: list[str | None] = [None] * count
    missing = count
    for number in itertools.count():
        tag = str(number)
        slot = key_slot(tag.encode())
        shard = slot * count // slots
        middle = (2 * shard + 1) * slots // (2 * count)
        if found[shard] is None and abs(slot - middle) <= reach:
            found[shard] = tag
            missing -= 1
            if not missing:
                return tuple(tag for tag in found if tag is not None)
    raise AssertionError("unreachable: itertools.count() does not end")
