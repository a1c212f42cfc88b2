"""Redis Cluster: the way a counting call finds the primary that owns its slot (the URL and
the client are :mod:`.redis_cluster_url`'s).

The client is redis-py's own ``RedisCluster`` (retries off): the policy version, resets,
retime, usage reports and pushes run through it, and it follows ``MOVED`` / ``ASK`` for them.
A counting call instead goes straight to the node :class:`ClusterRoute` names for its shard's
slot, on connections of ours made like that node's (:class:`.wire.Connections`, one round
trip, frames prepared once): every key of the call carries the shard's hash tag, so one slot
holds them all. Nothing that may have run is ever sent twice:

* ``MOVED`` / ``ASK`` (the node did not run the call) is followed once, to the node it names
  (``ASKING`` first, in the same write, for ``ASK``); ``MOVED`` also refreshes the slot map;
* ``NOSCRIPT`` (the node never saw the script: a failover, restart, resharding or
  ``SCRIPT FLUSH``) is answered with ``EVAL`` of the source on the same connection;
* ``TRYAGAIN``, ``CLUSTERDOWN``, a refused connection or a timeout after sending is a
  :class:`~.base.NodeUnavailable`: that request takes its failure mode, and the slot map is
  refreshed (at most every :data:`REFRESH_AFTER_FAILURE` seconds) so that a promoted replica is
  found.

Each primary has a circuit breaker of its own: a dead primary costs its clients a few timeouts,
then microseconds, while the other primaries' clients are counted as before. A refresh of the
slot map (which blocks on the nodes it asks, a dead one's socket timeout included) runs in a
daemon thread of its own, one at a time, and no request waits for it: the requests meanwhile
use the slot map as it was, and an open breaker answers at once. The one exception is a
redirection to a node the slot map has never listed, which waits (at most
:data:`UNLISTED_NODE_WAIT` seconds) for the refresh that lists it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from django_throttle.backends.base import ArgumentRefused, BackendError, NodeUnavailable
from django_throttle.backends.breaker import CircuitBreaker
from django_throttle.backends.redis_async import AsyncConnections
from django_throttle.backends.redis_cluster_scripts import by_slot, evalsha_across
from django_throttle.backends.scripts import Call, call_backend
from django_throttle.backends.wire import Connections, Redirected, Unsettled
from django_throttle.conf import is_cluster_url

__all__ = ["ClusterRoute", "PrimaryHealth", "is_cluster_url"]

logger = logging.getLogger("django_throttle.backends.redis_cluster")

#: Seconds between two slot-map refreshes while a node fails (a dead primary's replica is
#: promoted after the cluster's node timeout; a refresh finds it).
REFRESH_AFTER_FAILURE = 0.25
#: Seconds a ``MOVED`` refresh covers: the threads redirected together refresh once.
REFRESH_AFTER_MOVED = 0.05
#: Seconds a call redirected to a node the slot map does not list waits for the refresh that
#: may list it (a healthy node answered with that redirection: a resharding onto a new node).
UNLISTED_NODE_WAIT = 2.0
#: What a failed ``RedisCluster`` start says: no seed node answered, or the one asked for the
#: command table did not (redis-py asks the primary serving slot 0).
UNBUILT = (
    "could not start a cluster client "
    "(a seed node, or the node asked for the command table, did not answer)"
)
#: Seconds before a cluster that could not be reached at all is tried again.
RETRY_BUILD_AFTER = 0.5


class _NodeFailed(NodeUnavailable):
    """A primary did not answer (not a redirection or ``TRYAGAIN``): its slot map may be
    stale, so the caller refreshes it."""


@dataclass(frozen=True)
class PrimaryHealth:
    """One primary as the dashboard shows it: ``error`` empty when it answered ``PING``."""

    name: str
    error: str
    latency_ms: float | None
    breaker: CircuitBreaker


@dataclass(slots=True)
class _Node:
    """One primary's counting connections (sync and asyncio) and its breaker."""

    name: str
    connections: Connections
    async_connections: AsyncConnections
    breaker: CircuitBreaker


class ClusterRoute:
    """Counting calls to the primary owning each shard's slot (see the module docstring).

    ``make`` builds the ``RedisCluster``; it is called on first use (and again, at most every
    :data:`RETRY_BUILD_AFTER` seconds, while that fails), so that a cluster that is
    down when a worker starts costs requests their failure mode, never an exception.
    ``patience``: how long a call waits for a free connection of a node's pool.
    ``make_patient(timeout)`` builds a client like ``make``'s whose reads may take
    ``timeout`` (for usage reports); without it, reports use the client itself.
    """

    def __init__(
        self,
        make: Callable[[], RedisCluster],
        shard_tags: Sequence[str],
        patience: float,
        make_patient: Callable[[float], Any] | None = None,
    ) -> None:
        self._make = make
        self._make_patient = make_patient
        self._client: RedisCluster | None = None
        self._failed_build: tuple[float, str] | None = None
        self._slots = tuple(key_slot(tag.encode()) for tag in shard_tags)
        self._patience = patience
        self._nodes: dict[str, _Node] = {}
        self._lock = threading.Lock()
        # Held from a refresh's start to its end, by the thread that starts it until the
        # refresh's own thread releases it: taken without waiting, so one refresh runs at a time
        # and no request queues behind it.
        self._refreshing = threading.Lock()
        self._refreshed_at = -float("inf")

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

    def _primary(self, shard: int) -> _Node:
        """The node the slot map names for ``shard``'s slot (no network: a slot the map does
        not cover starts a refresh, and this call fails)."""
        try:
            found = self.client.nodes_manager.get_node_from_slot(self._slots[shard])
        except BackendError:
            raise
        except Exception as exc:  # the slot is not covered (its primary failed, no replica)
            self._refresh(REFRESH_AFTER_FAILURE)
            raise NodeUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return self._nodes.get(found.name) or self._add(found)

    def _add(self, found: ClusterNode) -> _Node:
        with self._lock:
            node = self._nodes.get(found.name)
            if node is None:
                pool = found.redis_connection.connection_pool
                node = _Node(
                    found.name,
                    Connections(pool, self._patience),
                    AsyncConnections(pool),
                    CircuitBreaker(node=found.name),
                )
                self._nodes[found.name] = node
            return node

    def _target(self, redirect: Redirected) -> _Node:
        """The node a ``MOVED`` / ``ASK`` names (refreshing the slot map for ``MOVED``, and
        for a node the map does not know yet)."""
        if not redirect.ask:
            self._refresh(REFRESH_AFTER_MOVED)
        found = self.client.get_node(host=redirect.host, port=redirect.port)  # type: ignore[no-untyped-call]
        if found is None:
            self._refreshed(UNLISTED_NODE_WAIT)
            found = self.client.get_node(host=redirect.host, port=redirect.port)  # type: ignore[no-untyped-call]
        if found is None:
            raise NodeUnavailable(f"{redirect}: a node the slot map does not list")
        return self._nodes.get(found.name) or self._add(found)

    def _refresh(self, interval: float) -> bool:
        """Start asking the cluster for its slot map again, in a daemon thread, unless a
        refresh runs or ended less than ``interval`` seconds ago; never wait for it (True if
        this call started one). A failure is logged, never raised (the next one retries)."""
        if time.monotonic() - self._refreshed_at < interval:
            return False
        if not self._refreshing.acquire(blocking=False):
            return False
        try:
            client = self.client
            threading.Thread(
                target=self._refresh_in_background,
                args=(client,),
                name="django-throttle-cluster-refresh",
                daemon=True,
            ).start()
        except BaseException:
            self._refreshing.release()
            raise
        return True

    def _refresh_in_background(self, client: RedisCluster) -> None:
        try:
            client.nodes_manager.initialize()
        except Exception as exc:
            logger.debug("cluster slot map refresh failed: %s", exc)
        finally:
            self._refreshed_at = time.monotonic()
            self._refreshing.release()

    def _refreshed(self, patience: float) -> None:
        """Refresh the slot map and wait (at most ``patience`` seconds) until it is done (or
        until the refresh running already is): for a redirection to a node it does not list."""
        self._refresh(0.0)
        if self._refreshing.acquire(timeout=patience):
            self._refreshing.release()

    @contextlib.contextmanager
    def _answering(self, node: _Node, follow: bool) -> Iterator[None]:
        """Around one call on ``node``: ``MOVED`` / ``ASK`` and ``TRYAGAIN`` are answers to
        its breaker, raised again after it (a redirection, when ``follow``, as itself, to be
        followed; else as :class:`~.base.NodeUnavailable`); any other failure is a
        :class:`_NodeFailed`, whose caller refreshes the slot map."""
        answered: BackendError | None = None
        try:
            with node.breaker.guard():
                try:
                    yield
                except (Redirected, Unsettled) as exc:
                    answered = exc
        except ArgumentRefused:
            raise
        except BackendError as exc:
            raise _NodeFailed(f"{node.name}: {exc}", node.breaker.retry_after()) from exc
        if follow and type(answered) is Redirected:
            raise answered
        if answered is not None:
            raise NodeUnavailable(f"{node.name}: {answered}") from answered

    def call(self, shard: int, body: bytes, fallback: Callable[[], bytes]) -> Any:
        """Send a counting call for ``shard`` and return its reply (see the module
        docstring for what is followed and what fails)."""
        try:
            return self._sent(self._primary(shard), body, fallback, asking=False, follow=True)
        except Redirected as redirect:
            target = self._target(redirect)
            return self._sent(target, body, fallback, asking=redirect.ask, follow=False)

    def _sent(
        self, node: _Node, body: bytes, fallback: Callable[[], bytes], asking: bool, follow: bool
    ) -> Any:
        try:
            with self._answering(node, follow):
                return node.connections.call(body, fallback, asking)
        except _NodeFailed:
            self._refresh(REFRESH_AFTER_FAILURE)
            raise

    async def acall(self, shard: int, body: bytes, fallback: Callable[[], bytes]) -> Any:
        """:meth:`call` from ``async def`` code; building the client, which blocks, runs in a
        worker thread (a slot-map refresh runs in its own, unawaited)."""
        if self._client is None:
            await asyncio.to_thread(self._build)
        node = self._primary(shard)
        try:
            return await self._asent(node, body, fallback, asking=False, follow=True)
        except Redirected as redirect:
            target = await asyncio.to_thread(self._target, redirect)
            return await self._asent(target, body, fallback, asking=redirect.ask, follow=False)

    async def _asent(
        self, node: _Node, body: bytes, fallback: Callable[[], bytes], asking: bool, follow: bool
    ) -> Any:
        try:
            with self._answering(node, follow):
                return await node.async_connections.call(body, fallback, asking)
        except _NodeFailed:
            self._refresh(REFRESH_AFTER_FAILURE)
            raise

    def health(self) -> list[PrimaryHealth]:
        """Each primary's answer to ``PING`` (and how fast) and its breaker, for the admin
        dashboard: one failed primary shows here while the others keep counting."""
        found = []
        for primary in self.client.get_primaries():  # type: ignore[no-untyped-call]
            node = self._nodes.get(primary.name) or self._add(primary)
            started, error = time.perf_counter(), ""
            try:
                call_backend(primary.redis_connection.ping)
            except BackendError as exc:
                error = str(exc)
            latency = None if error else (time.perf_counter() - started) * 1e3
            found.append(PrimaryHealth(node.name, error, latency, node.breaker))
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
        """Close every node's counting connections (and, with ``client_too``, the
        client's)."""
        for node in list(self._nodes.values()):
            node.connections.disconnect()
        if client_too and self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
