"""The counting call for ``async def`` views: the same frames as the sync path, on pooled
``redis.asyncio`` connections, so a decision never borrows a thread.

Each running event loop gets a ``redis.asyncio`` pool built from the sync pool's options (same
server, credentials, TLS, timeouts, ``max_connections``; retries off). A call takes one of its
connections, sends the frame with ``send_packed_command``, reads the reply with
``read_response`` (bounded by the socket timeout) and always releases the connection; one that
timed out, was cancelled or broke is disconnected first, so no late reply ever answers the
next call. Only the sending differs from :class:`.wire.Connections`: the frames, the NOSCRIPT
answer and the error mapping are the same code. For a Sentinel-managed primary the loop's pool
is a :class:`.redis_sentinel.AsyncSentinelPool` asking the same sentinels.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import weakref
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import redis
from redis.asyncio import connection as aio
from redis.asyncio import sentinel as aio_sentinel
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, ResponseError
from redis.sentinel import SentinelConnectionPool

from django_throttle.backends.redis_sentinel import AsyncSentinelPool, async_twin
from django_throttle.backends.wire import ASKING, connection_getter, failure

__all__ = ["AsyncConnections"]

_CLASSES = {
    "Connection": aio.Connection,
    "SSLConnection": aio.SSLConnection,
    "UnixDomainSocketConnection": aio.UnixDomainSocketConnection,
    "SentinelManagedConnection": aio_sentinel.SentinelManagedConnection,
    "SentinelManagedSSLConnection": aio_sentinel.SentinelManagedSSLConnection,
}
#: Options never copied from the sync pool (retries stay off: a replayed call may count twice).
_SYNC_ONLY = (
    "retry",
    "retry_on_error",
    "retry_on_timeout",
    # The sync pool's own helpers, bound to sync connections.
    "event_dispatcher",
    "maint_notifications_config",
    "maint_notifications_pool_handler",
    "oss_cluster_maint_notifications_handler",
    "redis_connect_func",
)


def _parameters(cls: type) -> set[str]:
    """Keyword parameters of a connection class and its bases' ``__init__``."""
    inits = (vars(klass)["__init__"] for klass in cls.__mro__ if "__init__" in vars(klass))
    return {name for init in inits for name in inspect.signature(init).parameters}


async def _asking(conn: Any, body: bytes) -> Any:
    """:func:`.wire._asking` on an asyncio connection."""
    await conn.send_packed_command((ASKING, body), False)
    try:
        await conn.read_response()  # OK
    except ResponseError:
        await conn.read_response(disable_decoding=True)  # the call's own reply
        raise
    return await conn.read_response(disable_decoding=True)


async def _close_with_loop(pool: Any) -> AsyncIterator[None]:
    """Close the pool's connections when its loop shuts down: ``asyncio.run`` (and so Django's
    ``async_to_sync``, which runs an async view under WSGI in a loop of its own per request)
    finalizes async generators before closing the loop."""
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await (
                pool.disconnect_all() if isinstance(pool, AsyncSentinelPool) else pool.disconnect()
            )


#: One event loop's pool, how to take a connection from it, and its closer.
LoopPool = tuple[Any, Callable[[], Any], AsyncIterator[None]]


class AsyncConnections:
    """Counting calls from ``async def`` code, on a ``redis.asyncio`` pool per running loop
    (connections belong to the loop that opened them)."""

    def __init__(self, pool: Any) -> None:
        cls = _CLASSES.get(pool.connection_class.__name__, aio.Connection)
        accepted = _parameters(cls)
        # The sync pool also carries options of its own (retry objects, maintenance handlers,
        # a Sentinel pool's proxy): keep only what the asyncio connection takes.
        kwargs = {
            k: v for k, v in pool.connection_kwargs.items() if k in accepted and k not in _SYNC_ONLY
        }
        kwargs["retry"] = Retry(NoBackoff(), 0)
        # CLIENT SETINFO reads package metadata on every new connection: milliseconds.
        if "driver_info" in accepted:  # redis-py 7.1+
            kwargs["driver_info"] = None
        else:
            kwargs["lib_name"] = kwargs["lib_version"] = None
        # A call waits for a free connection without a time bound of its own: a thousand
        # concurrent requests on one loop keep it busy longer than the sync pool's wait (tens
        # of ms), which would fail them while Redis is healthy. Each call holding a connection
        # is bounded by the socket timeouts, so the wait is bounded too.
        blocking = isinstance(pool, (redis.BlockingConnectionPool, SentinelConnectionPool))
        pool_class: Any = aio.BlockingConnectionPool if blocking else aio.ConnectionPool
        #: A Sentinel-managed primary, asked of the sentinels through asyncio clients.
        self._sentinel = isinstance(pool, SentinelConnectionPool)
        if self._sentinel:
            pool_class = partial(async_twin, pool)
        self._factory: Callable[[], Any] = partial(
            pool_class,
            connection_class=cls,
            max_connections=getattr(pool, "max_connections", None),
            **({"timeout": None} if blocking else {}),
            **kwargs,
        )
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopPool] = (
            weakref.WeakKeyDictionary()
        )
        self._pid = os.getpid()

    async def call(self, body: bytes, fallback: Callable[[], bytes], asking: bool = False) -> Any:
        """:meth:`.wire.Connections.call` on the running loop's pool."""
        try:
            pool, take, _ = await self._loop_pool()
            conn = await take()
            if self._sentinel and not pool.connected_to_primary(conn):
                # Still connected to a former primary: connect to the one named now.
                await conn.disconnect()
            try:
                try:
                    if asking:
                        return await _asking(conn, body)
                    await conn.send_packed_command((body,), False)
                    return await conn.read_response(disable_decoding=True)
                except NoScriptError:
                    if asking:
                        return await _asking(conn, fallback())
                    await conn.send_packed_command((fallback(),), False)
                    return await conn.read_response(disable_decoding=True)
            except ResponseError:
                raise  # the error reply was read: the stream is in step
            except BaseException:
                # Timed out, cancelled or broken: a reply may still be on its way.
                await conn.disconnect(nowait=True)
                raise
            finally:
                await pool.release(conn)
        except Exception as exc:
            raise failure(exc) from exc

    async def _loop_pool(self) -> LoopPool:
        if self._pid != os.getpid():  # the parent's connections are not ours
            self._pools = weakref.WeakKeyDictionary()
            self._pid = os.getpid()
        loop = asyncio.get_running_loop()
        found = self._pools.get(loop)
        if found is None:
            pool = self._factory()
            closer = _close_with_loop(pool)
            await closer.__anext__()
            # The closer is kept with the pool: collecting it early would close the connections.
            found = self._pools[loop] = (pool, connection_getter(pool), closer)
        return found
