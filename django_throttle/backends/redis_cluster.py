"""Redis Cluster: counting calls through redis-py's own ``RedisCluster`` (the URL and the
client are :mod:`.redis_clients`'), each primary behind a circuit breaker of its own.

Every key of a counting call carries its shard's hash tag, so one slot holds them all, and
``RedisCluster`` sends the ``EVALSHA`` to the primary owning that slot. It follows ``MOVED`` /
``ASK`` and waits out ``TRYAGAIN`` (the node did not run the call); nothing that may have run
is ever sent twice: the client's retries on connection errors and timeouts are off
(``cluster_error_retry_attempts`` and the ``Retry`` of every node, see
:func:`.redis_clients.cluster_client`), and ``NOSCRIPT`` is answered with ``EVAL`` of the
source. A failure (a refused connection, a timeout, ``CLUSTERDOWN``, an uncovered slot) is a
:class:`~.base.NodeUnavailable`: that request takes its failure mode, and ``RedisCluster``
refreshes its slot map so that a promoted replica is found.

Each primary has a circuit breaker of its own: a dead primary costs its clients a few timeouts,
then they fail at once without waiting on it, while the other primaries' clients are counted
as before. ``async def``
views use a ``redis.asyncio.cluster.RedisCluster`` per running event loop, with the same nodes
and options.

The hash tags of the key shards (:func:`spread_tags`) decide the Redis Cluster slot of every
key. Every key of a client starts ``<prefix>:{<tag>}``: the tag alone picks its slot (a cluster
hashes only the text between the braces). On one server the slot means nothing and the tags
are the shard numbers, ``{0}`` to ``{count - 1}``. On a cluster, which primary serves a shard
is which primary owns its tag's slot, and the numbers' slots fall where CRC16 puts them:
``{0}``…``{15}`` land 6/6/4 on three primaries with the slot ranges split evenly. So there
the tags are chosen instead: shard ``n``'s slot lies within an eighth of a shard's width of
the middle of the ``n``-th of ``count`` equal parts of the 16,384 slots. Managed clusters and
``redis-cli --cluster create`` give each primary one contiguous range of about equal size, so
each primary then holds as many shards as ``count`` allows: 16 over 3 primaries 6/5/5, over
2, 4 or 8 primaries evenly.

The script calls that are not counting calls (retime's batches, usage reads and pushes) go
across the primaries too: grouped by the node owning their slot, one pipeline per node
(:func:`evalsha_across`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.connection import Connection, SSLConnection
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import AskError, MovedError, NoScriptError

from django_throttle.backends.base import ArgumentRefused, BackendError, NodeUnavailable
from django_throttle.backends.redis_clients import no_cluster_retries
from django_throttle.backends.redis_nodes import (
    CircuitBreaker,
    Functions,
    PerLoop,
    ScriptCall,
    arun_script,
    async_options,
    run_script,
)
from django_throttle.backends.scripts import Call, call_backend, evalsha_all


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


#: What a failed ``RedisCluster`` start says: no seed node answered, or the one asked for the
#: command table did not (redis-py asks the primary serving slot 0).
UNBUILT = (
    "could not start a cluster client "
    "(a seed node, or the node asked for the command table, did not answer)"
)
#: Seconds before a cluster that could not be reached at all is tried again.
RETRY_BUILD_AFTER = 0.5


@dataclass(frozen=True)
class PrimaryHealth:
    """One primary as the dashboard shows it: ``error`` empty when it answered ``PING``."""

    name: str
    error: str
    latency_ms: float | None
    breaker: CircuitBreaker


def async_cluster(client: RedisCluster) -> AsyncRedisCluster:
    """A ``redis.asyncio`` ``RedisCluster`` like ``client``: its known nodes as seeds, its
    nodes' connection options, retries off (it connects on its first command)."""
    given = client.nodes_manager.connection_kwargs
    kwargs = async_options(given, AsyncRedisCluster)
    for name in ("host", "port", "startup_nodes", "url", "connection_class"):
        kwargs.pop(name, None)
    if issubclass(given.get("connection_class", Connection), SSLConnection):
        kwargs["ssl"] = True
    seeds = [AsyncClusterNode(node.host, node.port) for node in client.get_nodes()]  # type: ignore[no-untyped-call]
    return AsyncRedisCluster(
        startup_nodes=seeds,
        require_full_coverage=False,
        **no_cluster_retries(),
        **kwargs,
    )


class ClusterRoute:
    """Counting calls to the primary owning each shard's slot (see the module docstring).

    ``make`` builds the ``RedisCluster``; it is called on first use (and again, at most every
    :data:`RETRY_BUILD_AFTER` seconds, while that fails), so that a cluster that is
    down when a worker starts costs requests their failure mode, never an exception.
    ``make_patient(timeout)`` builds a client like ``make``'s whose reads may take
    ``timeout`` (for usage reports); without it, reports use the client itself.
    """

    def __init__(
        self,
        make: Callable[[], RedisCluster],
        shard_tags: Sequence[str],
        make_patient: Callable[[float], Any] | None = None,
        sender: type | None = None,
    ) -> None:
        self._make = make
        self._make_patient = make_patient
        self.sender = sender
        self._client: RedisCluster | None = None
        self._failed_build: tuple[float, str] | None = None
        self._slots = tuple(key_slot(tag.encode()) for tag in shard_tags)
        self._breakers: dict[str, CircuitBreaker] = {}
        self._lock = threading.Lock()
        self._async = PerLoop(self._make_async)
        self.functions = Functions()

    @property
    def client(self) -> RedisCluster:
        """The ``RedisCluster``, built on first use; a :class:`~.base.BackendError` while it
        cannot be built."""
        client = self._client
        return client if client is not None else self._build()

    def _build(self) -> RedisCluster:
        with self._lock:
            if self._client is not None:
                return self._client
            failed = self._failed_build
            if failed is not None and time.monotonic() - failed[0] < RETRY_BUILD_AFTER:
                raise BackendError(failed[1])
            try:
                self._client = self._make()
            except Exception as exc:
                message = f"{UNBUILT}: {type(exc).__name__}: {exc}"
                self._failed_build = (time.monotonic(), message)
                raise BackendError(message) from exc
            self._failed_build = None
            return self._client

    async def _make_async(self) -> AsyncRedisCluster:
        client = async_cluster(self.client)
        try:
            await client.initialize()
        except BaseException:
            with contextlib.suppress(Exception):
                await client.aclose()
            raise
        return client

    def breaker(self, name: str) -> CircuitBreaker:
        """The breaker of the primary ``name`` (``host:port``)."""
        found = self._breakers.get(name)
        if found is None:
            with self._lock:
                found = self._breakers.setdefault(name, CircuitBreaker(node=name))
        return found

    def _primary(self, client: Any, shard: int) -> str:
        """The name of the node the slot map names for ``shard``'s slot (no network)."""
        try:
            return str(client.nodes_manager.get_node_from_slot(self._slots[shard]).name)
        except Exception as exc:  # the slot is not covered (its primary failed, no replica)
            raise NodeUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def _node_of(self, client: Any, shard: int) -> Callable[[], Any]:
        """The primary the slot map names for ``shard``'s slot, asked when a call is sent: an
        ``FCALL`` goes to it by name (redis-py before 8 would ask a node ``COMMAND GETKEYS``
        first, a second round trip per decision), and ``RedisCluster`` follows a ``MOVED``
        reply as for any command."""
        slot = self._slots[shard]
        return lambda: client.nodes_manager.get_node_from_slot(slot)

    def call(self, call: ScriptCall) -> Any:
        """Send a counting call for its shard and return its reply."""
        client = self.client
        name = self._primary(client, call.shard)
        breaker = self.breaker(name)
        try:
            with breaker.guard():
                return run_script(
                    client, call, self.sender, self.functions, self._node_of(client, call.shard)
                )
        except ArgumentRefused:
            raise
        except BackendError as exc:
            raise NodeUnavailable(f"{name}: {exc}", breaker.retry_after()) from exc

    async def acall(self, call: ScriptCall) -> Any:
        """:meth:`call` from ``async def`` code, on this loop's ``redis.asyncio`` cluster
        client (its first use asks a node for the slot map)."""
        try:
            client = await self._async.client()
        except BackendError as exc:
            raise NodeUnavailable(str(exc)) from exc
        except Exception as exc:
            raise NodeUnavailable(f"{UNBUILT}: {type(exc).__name__}: {exc}") from exc
        name = self._primary(client, call.shard)
        breaker = self.breaker(name)
        try:
            with breaker.guard():
                return await arun_script(
                    client, call, self.sender, self.functions, self._node_of(client, call.shard)
                )
        except ArgumentRefused:
            raise
        except BackendError as exc:
            raise NodeUnavailable(f"{name}: {exc}", breaker.retry_after()) from exc

    def health(self) -> list[PrimaryHealth]:
        """Each primary's answer to ``PING`` (and how fast) and its breaker, for the admin
        dashboard: one failed primary shows here while the others keep counting."""
        found = []
        for primary in self.client.get_primaries():  # type: ignore[no-untyped-call]
            breaker = self.breaker(primary.name)
            started, error = time.perf_counter(), ""
            try:
                call_backend(primary.redis_connection.ping)
            except BackendError as exc:
                error = str(exc)
            latency = None if error else (time.perf_counter() - started) * 1e3
            found.append(PrimaryHealth(primary.name, error, latency, breaker))
        return sorted(found, key=lambda health: health.name)

    def scanned_clients(self) -> list[Any]:
        """A client on each primary (their keys together are every key)."""
        return [node.redis_connection for node in self.client.get_primaries()]  # type: ignore[no-untyped-call]

    by_slot = staticmethod(by_slot)

    def patient_client(self, timeout: float) -> tuple[Any, bool]:
        """A new cluster client whose reads may take ``timeout`` seconds (see ``__init__``),
        and True: the caller closes it; without a way to make one, the client and False."""
        if self._make_patient is None:
            return self.client, False
        # Such a read needs every primary: ask each (short timeouts) first, so that a dead one
        # is named at once rather than after ``timeout`` seconds (or two, if a start asks it).
        down = [f"{health.name} ({health.error})" for health in self.health() if health.error]
        if down:
            raise BackendError(f"every primary must answer this read; {', '.join(down)} did not")
        try:
            return self._make_patient(timeout), True
        except Exception as exc:
            raise BackendError(f"{UNBUILT}: {type(exc).__name__}: {exc}") from exc

    def evalsha_all(
        self, sha: str, source: str, calls: Sequence[Call], client: Any = None
    ) -> list[Any]:
        """:func:`.scripts.evalsha_all` across the cluster (whose pipelines refuse
        ``EVALSHA``): the calls grouped by the node owning their slot, one pipeline per node;
        a call redirected meanwhile is sent again alone through ``RedisCluster``, which follows
        ``MOVED`` and ``ASK``. An error reply is a :class:`~.base.BackendError`, raised once
        every call has been sent."""
        try:
            return evalsha_across(client or self.client, sha, source, calls)
        except NodeUnavailable:
            raise
        except BackendError as exc:  # a push must not open the process's breaker either
            raise NodeUnavailable(str(exc)) from exc

    def close(self, client_too: bool = True) -> None:
        """Close the client (only if the backend made it)."""
        if client_too and self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
