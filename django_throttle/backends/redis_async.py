"""The counting call for ``async def`` views: the same bytes as the sync path, on a
``redis.asyncio`` connection, so a decision never borrows a thread.

Each event loop gets one connection, pipelined: requests write their command in turn and one
reader task hands replies back in order, so a thousand concurrent requests share one socket
instead of queueing for a pool (Redis answers in order and runs one command at a time anyway).
A request waits at most the socket timeout for its reply; a reply that comes later is read and
dropped, so the stream stays in step. A broken connection fails every request waiting on it
(the failure mode applies) and the next request reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import weakref
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import connection as aio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse
from redis.exceptions import TimeoutError as RedisTimeoutError

from django_throttle.backends.wire import parse_error

__all__ = ["AsyncStacks"]

_CLASSES = {
    "Connection": aio.Connection,
    "SSLConnection": aio.SSLConnection,
    "UnixDomainSocketConnection": aio.UnixDomainSocketConnection,
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
#: Requests that may wait on one connection; beyond, Redis is too slow and they fail at once.
MAX_IN_FLIGHT = 10_000
#: Loop turns a timed-out request gives the reader task to hand over a reply already received.
CATCH_UP_TURNS = 3


class _Pipe:
    """One event loop's pipelined connection."""

    def __init__(self, factory: Any, timeout: float) -> None:
        self.factory = factory
        self.timeout = timeout
        self.conn: Any = None
        self.waiting: deque[asyncio.Future[bytes]] = deque()
        self.reader: asyncio.Task[None] | None = None
        self.connecting = asyncio.Lock()
        self.closer: AsyncIterator[None] | None = None

    async def call(self, command: bytes) -> bytes:
        if self.conn is None:
            async with self.connecting:
                if self.conn is None:
                    await self._connect()
        if len(self.waiting) >= MAX_IN_FLIGHT:
            raise RedisConnectionError(f"{MAX_IN_FLIGHT} calls already wait for Redis")
        reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiting.append(reply)
        self.conn._writer.write(command)
        try:
            return await asyncio.wait_for(asyncio.shield(reply), self.timeout)
        except TimeoutError:  # asyncio's (the builtin), not redis-py's
            pass
        # A loop too busy to run the reader task looks like a slow Redis: the timer and the
        # socket's data come due in the same loop turn, and the timer wins. Let the reader
        # catch up on what already arrived before calling it a timeout.
        for _ in range(CATCH_UP_TURNS):
            await asyncio.sleep(0)
            if reply.done():
                return reply.result()
        raise RedisTimeoutError("Timeout reading from Redis")

    async def _connect(self) -> None:
        conn = self.factory()
        await conn.connect()  # handshake (AUTH, SELECT, ...) through redis-py
        self.conn = conn
        self.reader = asyncio.get_running_loop().create_task(self._read(conn))

    async def _read(self, conn: Any) -> None:
        """Hand each reply to the oldest waiting request, until the stream breaks."""
        stream = conn._reader
        try:
            while True:
                head = await stream.readuntil(b"\r\n")
                kind = head[:1]
                result: bytes | BaseException
                if kind == b"$":
                    size = int(head[1:-2])
                    body = await stream.readexactly(size + 2)
                    result = body[:size]
                elif kind == b"-":
                    result = parse_error(head[1:-2])
                else:
                    raise InvalidResponse(f"unexpected reply {head[:80]!r}")
                waiter = self.waiting.popleft()
                if not waiter.done():
                    if isinstance(result, BaseException):
                        waiter.set_exception(result)
                    else:
                        waiter.set_result(result)
        except BaseException as exc:
            await self._broken(conn, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _broken(self, conn: Any, exc: BaseException) -> None:
        """Fail everyone waiting on ``conn`` and forget it; the next call reconnects."""
        if self.conn is conn:
            self.conn = None
        waiting, self.waiting = self.waiting, deque()
        error = RedisConnectionError(f"Redis connection lost: {type(exc).__name__}: {exc}")
        for waiter in waiting:
            if not waiter.done():
                waiter.set_exception(error)
        with contextlib.suppress(Exception):
            await conn.disconnect()

    async def close_with_loop(self) -> None:
        """Close the connection when its loop shuts down: ``asyncio.run`` (and so Django's
        ``async_to_sync``, which runs an async view under WSGI in a loop of its own per
        request) finalizes async generators before closing the loop."""

        async def closer() -> AsyncIterator[None]:
            try:
                yield
            finally:
                await self.close()

        self.closer = closer()  # kept: collecting it early would close the connection
        await self.closer.__anext__()

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(BaseException):
                await self.reader
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await self.conn.disconnect()
            self.conn = None


def _parameters(cls: type) -> set[str]:
    """Keyword parameters of a connection class and its bases' ``__init__``."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            names.update(inspect.signature(init).parameters)
    return names


class AsyncStacks:
    """One pipelined connection per running event loop, built from the sync pool's options."""

    def __init__(self, pool: Any) -> None:
        cls = _CLASSES.get(pool.connection_class.__name__, aio.Connection)
        accepted = _parameters(cls)
        # The sync pool also carries options of its own (retry objects, maintenance handlers):
        # keep only what the asyncio connection takes.
        kwargs = {
            k: v for k, v in pool.connection_kwargs.items() if k in accepted and k not in _SYNC_ONLY
        }
        kwargs["retry"] = Retry(NoBackoff(), 0)
        # CLIENT SETINFO reads package metadata on every new connection: milliseconds.
        if "driver_info" in accepted:  # redis-py 7.1+
            kwargs["driver_info"] = None
        else:
            kwargs["lib_name"] = kwargs["lib_version"] = None
        self._factory = lambda: cls(**kwargs)
        self._timeout = float(kwargs.get("socket_timeout") or 0.05)
        self._pipes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pipe] = (
            weakref.WeakKeyDictionary()
        )
        self._pid = os.getpid()

    async def call(self, command: bytes) -> bytes:
        """Send one packed command and await its bulk-string reply; server error replies
        raise redis-py's ``ResponseError`` subclasses, anything else ``ConnectionError``."""
        if self._pid != os.getpid():
            self._pipes = weakref.WeakKeyDictionary()
            self._pid = os.getpid()
        loop = asyncio.get_running_loop()
        pipe = self._pipes.get(loop)
        if pipe is None:
            pipe = self._pipes[loop] = _Pipe(self._factory, self._timeout)
            await pipe.close_with_loop()
        return await pipe.call(command)

    async def close(self) -> None:
        """Close the current loop's connection."""
        pipe = self._pipes.pop(asyncio.get_running_loop(), None)
        if pipe is not None:
            await pipe.close()
