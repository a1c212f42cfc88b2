"""Redis Cluster: counting calls through redis-py's own ``RedisCluster`` (the URL and the
client are :mod:`.redis_cluster_url`'s), each primary behind a circuit breaker of its own.

Every key of a counting call carries its shard's hash tag, so one slot holds them all, and
``RedisCluster`` sends the ``EVALSHA`` to the primary owning that slot. It follows ``MOVED`` /
``ASK`` and waits out ``TRYAGAIN`` (the node did not run the call); nothing that may have run
is ever sent twice: the client's retries on connection errors and timeouts are off
(``cluster_error_retry_attempts`` and the ``Retry`` of every node, see
:func:`.redis_cluster_url.cluster_client`), and ``NOSCRIPT`` is answered with ``EVAL`` of the
source. A failure (a refused connection, a timeout, ``CLUSTERDOWN``, an uncovered slot) is a
:class:`~.base.NodeUnavailable`: that request takes its failure mode, and ``RedisCluster``
refreshes its slot map so that a promoted replica is found.

Each primary has a circuit breaker of its own: a dead primary costs its clients a few timeouts,
then they fail at once without waiting on it, while the other primaries' clients are counted
as before. ``async def``
views use a ``redis.asyncio.cluster.RedisCluster`` per running event loop, with the same nodes
and options.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.connection import Connection, SSLConnection
from redis.crc import key_slot

from django_throttle.backends.base import ArgumentRefused, BackendError, NodeUnavailable
from django_throttle.backends.breaker import CircuitBreaker
from django_throttle.backends.frames import ScriptCall
from django_throttle.backends.redis_cluster_scripts import by_slot, evalsha_across
from django_throttle.backends.redis_cluster_url import no_cluster_retries
from django_throttle.backends.redis_single import PerLoop, arun_script, async_options, run_script
from django_throttle.backends.scripts import Call, call_backend

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

    def call(self, call: ScriptCall) -> Any:
        """Send a counting call for its shard and return its reply."""
        client = self.client
        name = self._primary(client, call.shard)
        breaker = self.breaker(name)
        try:
            with breaker.guard():
                return run_script(client, call, self.sender)
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
                return await arun_script(client, call, self.sender)
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
