"""Script calls and key batches across a Redis Cluster's primaries, for the calls that are
not counting calls: retime's batches, usage reads and pushes (see :mod:`.redis_cluster`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, NoScriptError

from django_throttle.backends.base import BackendError
from django_throttle.backends.scripts import Call, call_backend, evalsha_all


def by_slot(keys: list[Any]) -> list[list[Any]]:
    """``keys`` grouped by slot: a script call's keys must share one."""
    groups: dict[int, list[Any]] = {}
    for key in keys:
        slot = key_slot(key if isinstance(key, bytes) else key.encode())
        groups.setdefault(slot, []).append(key)
    return list(groups.values())


def evalsha_across(client: RedisCluster, sha: str, source: str, calls: Sequence[Call]) -> list[Any]:
    """:func:`.scripts.evalsha_all` across a cluster (whose pipelines refuse ``EVALSHA``):
    the calls grouped by the node owning their slot, one pipeline per node; a call redirected
    meanwhile is sent again alone through ``RedisCluster``, which follows ``MOVED`` and
    ``ASK``. An error reply is a :class:`~.base.BackendError`, raised once every call has
    been sent."""
    by_node: dict[str, tuple[Any, list[int]]] = {}
    for index, (keys, _args) in enumerate(calls):
        slot = key_slot(keys[0] if isinstance(keys[0], bytes) else str(keys[0]).encode())
        node = call_backend(client.nodes_manager.get_node_from_slot, slot)
        by_node.setdefault(node.name, (node.redis_connection, []))[1].append(index)
    replies: list[Any] = [None] * len(calls)
    for node_client, indices in by_node.values():
        found = evalsha_all(node_client, sha, source, [calls[i] for i in indices], check=False)
        for index, reply in zip(indices, found, strict=True):
            replies[index] = reply
    for index, reply in enumerate(replies):
        if isinstance(reply, (MovedError, AskError)):
            replies[index] = _script_alone(client, sha, source, calls[index])
    failed = [reply for reply in replies if isinstance(reply, Exception)]
    if failed:
        raise BackendError(f"{type(failed[0]).__name__}: {failed[0]}")
    return replies


def _script_alone(client: RedisCluster, sha: str, source: str, call: Call) -> Any:
    """One script call through ``RedisCluster`` (which follows ``MOVED`` and ``ASK``), sent
    again with ``EVAL`` on ``NOSCRIPT``."""
    keys, args = call
    try:
        return call_backend(client.evalsha, sha, len(keys), *keys, *args)
    except BackendError as exc:
        if not isinstance(exc.__cause__, NoScriptError):
            raise
    return call_backend(client.eval, source, len(keys), *keys, *args)
