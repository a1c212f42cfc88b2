"""The route of counting calls to one server, or to the primary a set of sentinels names: every
shard is on it (:mod:`.redis_cluster` is the route across a cluster's primaries)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis

from django_throttle.backends.redis_async import AsyncConnections
from django_throttle.backends.redis_usage import patient_client_like
from django_throttle.backends.scripts import Call, evalsha_all
from django_throttle.backends.wire import Connections

__all__ = ["OneServer"]


class OneServer:
    """The route of counting calls to one server (or a Sentinel-managed primary): every
    shard is on it."""

    def __init__(self, client: redis.Redis) -> None:
        self.client: Any = client
        pool = client.connection_pool
        self._connections = Connections(pool)
        self._async_connections = AsyncConnections(pool)

    def call(self, shard: int, body: bytes, fallback: Callable[[], bytes]) -> Any:
        return self._connections.call(body, fallback)

    async def acall(self, shard: int, body: bytes, fallback: Callable[[], bytes]) -> Any:
        return await self._async_connections.call(body, fallback)

    def evalsha_all(
        self, sha: str, source: str, calls: Sequence[Call], client: Any = None
    ) -> list[Any]:
        return evalsha_all(client or self.client, sha, source, calls)

    def patient_client(self, timeout: float) -> tuple[Any, bool]:
        return patient_client_like(self.client, timeout)

    def scanned_clients(self) -> list[redis.Redis]:
        """The clients whose keys together are every key: this one."""
        return [self.client]

    def by_slot(self, keys: list[Any]) -> list[list[Any]]:
        """``keys`` in groups a script call may take together: one."""
        return [keys]

    def close(self, client_too: bool) -> None:
        """Close the counting connections (and, with ``client_too``, the client's)."""
        self._connections.disconnect()
        if client_too:
            self.client.connection_pool.disconnect()
