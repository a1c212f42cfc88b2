"""How a counting call is sent through redis-py's own clients (:func:`run_script`,
:func:`arun_script`), and its route to one server or to the primary a set of sentinels names:
every shard is on it (:mod:`.redis_cluster` is the route across a cluster's primaries).

A call is one ``EVALSHA`` through the client's own command path; ``NOSCRIPT`` (the script did
not run) is answered with ``EVAL`` of the source. Nothing else is ever sent twice: the clients
have retries off (a call that timed out may already have counted), and redis-py disconnects a
connection whose reply was lost, so no late reply answers the next call.

A thread counting on one server holds one connection of the client's bounded pool for its
life (:class:`ThreadConnections`), and sends the script call on it with the connection's own
``send_command`` and ``read_response``, so a decision skips the pool's checkout and return
and the client's per-command bookkeeping; at most half the pool is held so, the rest serving
every other thread and command. A thread's connection goes back to the pool when the thread
ends; a forked child drops its parent's and opens its own.

``async def`` views use a ``redis.asyncio.Redis`` per running event loop (connections belong to
the loop that opened them), built from the sync client's pool options: the same server,
credentials, TLS and timeouts, retries off; for a Sentinel-managed primary, a
``redis.asyncio.sentinel`` pool asking the same sentinels. No decision borrows a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import Any

import redis
from redis.asyncio import connection as aio
from redis.asyncio import sentinel as aio_sentinel
from redis.asyncio.client import Redis as AsyncRedis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, ResponseError
from redis.sentinel import SentinelConnectionPool

from django_throttle import events
from django_throttle.backends.frames import ScriptCall
from django_throttle.backends.redis_sentinel import async_twin
from django_throttle.backends.redis_usage import patient_client_like
from django_throttle.backends.scripts import Call, evalsha_all, failure

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


def run_script(client: Any, call: ScriptCall, sender: type | None = None) -> Any:
    """Send ``call`` as one ``EVALSHA`` through ``client``'s command path and return its reply
    untouched; on ``NOSCRIPT`` (nothing ran) send ``EVAL`` of its source, and tell
    :data:`~django_throttle.events.script_loaded` (``sender``). Any failure raises what
    :func:`.scripts.failure` makes of it."""
    try:
        try:
            return client.evalsha(call.sha, len(call.keys), *call.keys, *call.args)
        except NoScriptError:
            # Redis lost the script (restart, failover, SCRIPT FLUSH): EVAL loads it again.
            if sender is not None:
                events.send(events.script_loaded, sender)
            return client.eval(call.source, len(call.keys), *call.keys, *call.args)
    except Exception as exc:
        raise failure(exc) from exc


async def arun_script(client: Any, call: ScriptCall, sender: type | None = None) -> Any:
    """:func:`run_script` on a ``redis.asyncio`` client."""
    try:
        try:
            return await client.evalsha(call.sha, len(call.keys), *call.keys, *call.args)
        except NoScriptError:
            if sender is not None:
                events.send(events.script_loaded, sender)
            return await client.eval(call.source, len(call.keys), *call.keys, *call.args)
    except Exception as exc:
        raise failure(exc) from exc


def accepted_options(cls: Any) -> set[str]:
    """Keyword parameters of a class and its bases' ``__init__``."""
    inits = (vars(klass)["__init__"] for klass in cls.__mro__ if "__init__" in vars(klass))
    return {name for init in inits for name in inspect.signature(init).parameters}


def async_options(kwargs: dict[str, Any], cls: Any) -> dict[str, Any]:
    """Of a sync connection's ``kwargs``, those ``cls`` (a ``redis.asyncio`` connection or
    client class) takes, with retries off."""
    accepted = accepted_options(cls)
    options = {k: v for k, v in kwargs.items() if k in accepted and k not in _SYNC_ONLY}
    options["retry"] = AsyncRetry(NoBackoff(), 0)
    # CLIENT SETINFO reads package metadata on every new connection: skip it.
    if "driver_info" in accepted:  # redis-py 7.1+
        options["driver_info"] = None
    elif "lib_name" in accepted:
        options["lib_name"] = options["lib_version"] = None
    return options


def async_pool_factory(pool: Any) -> Callable[[], Any]:
    """How to make, on the running loop, a ``redis.asyncio`` pool like the sync ``pool``.

    A caller waits for a free connection without a time bound of its own: a thousand
    concurrent requests on one loop keep it busy longer than the sync pool's wait, which would
    fail them while Redis is healthy; each call holding a connection is bounded by the socket
    timeouts, so the wait is bounded too."""
    cls = _CLASSES.get(pool.connection_class.__name__, aio.Connection)
    kwargs = async_options(pool.connection_kwargs, cls)
    blocking = isinstance(pool, (redis.BlockingConnectionPool, SentinelConnectionPool))
    pool_class: Any = aio.BlockingConnectionPool if blocking else aio.ConnectionPool
    if isinstance(pool, SentinelConnectionPool):
        pool_class = partial(async_twin, pool)
    return partial(
        pool_class,
        connection_class=cls,
        max_connections=getattr(pool, "max_connections", None),
        **({"timeout": None} if blocking else {}),
        **kwargs,
    )


async def _close_with_loop(client: Any) -> AsyncIterator[None]:
    """Close the client's connections when its loop shuts down: ``asyncio.run`` (and so
    Django's ``async_to_sync``, which runs an async view under WSGI in a loop of its own per
    request) finalizes async generators before closing the loop."""
    try:
        yield
    finally:
        pool = getattr(client, "connection_pool", None)  # a cluster client has none
        with contextlib.suppress(Exception):
            if pool is not None:
                closer = getattr(pool, "disconnect_all", None)
                await (closer() if closer is not None else pool.disconnect())
        with contextlib.suppress(Exception):
            await (client.aclose() if hasattr(client, "aclose") else client.close())


class PerLoop:
    """One ``redis.asyncio`` client per running event loop, made by ``make`` (a coroutine
    function) on first use there, once however many calls ask at the same time; a forked
    child starts with none of its parent's."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[Any]] = (
            weakref.WeakKeyDictionary()
        )
        self._pid = os.getpid()

    async def client(self) -> Any:
        if self._pid != os.getpid():  # the parent's connections are not ours
            self._clients = weakref.WeakKeyDictionary()
            self._pid = os.getpid()
        loop = asyncio.get_running_loop()
        made = self._clients.get(loop)
        if made is None:
            made = self._clients[loop] = loop.create_task(self._made())
        try:
            # Shielded: one caller cancelled must not cancel the others' client.
            return (await asyncio.shield(made))[0]
        except Exception:
            if self._clients.get(loop) is made:
                del self._clients[loop]  # the next call tries again
            raise

    async def _made(self) -> tuple[Any, AsyncIterator[None]]:
        client = await self._make()
        closer = _close_with_loop(client)
        await closer.__anext__()
        # The closer is kept with the client: collecting it early would close it.
        return client, closer


#: Every :class:`ThreadConnections` of this process, for a forked child to empty.
_THREAD_CONNECTIONS: weakref.WeakSet[ThreadConnections] = weakref.WeakSet()


@functools.cache
def _drop_after_fork() -> None:
    """Have a forked child forget the connections its parent's threads hold (once per
    process: the registration is inherited by the children)."""

    def forget() -> None:
        for connections in list(_THREAD_CONNECTIONS):
            connections.forget()

    os.register_at_fork(after_in_child=forget)


def connection_getter(pool: Any) -> Callable[[], Any]:
    """``pool.get_connection`` as a call without arguments: redis-py 5.3 made the command
    name optional (and warns when one is passed); before, it was required."""
    parameters = list(inspect.signature(pool.get_connection).parameters.values())
    if parameters and parameters[0].default is inspect.Parameter.empty:
        return partial(pool.get_connection, "EVALSHA")
    getter: Callable[[], Any] = pool.get_connection
    return getter


def run_on(connection: Any, call: ScriptCall, sender: type | None = None) -> Any:
    """:func:`run_script` on one connection of a redis-py pool, the command sent and its reply
    read by the connection's own ``send_command`` and ``read_response`` (what the client's
    command path does, without its per-command pool checkout). An error reply leaves the
    connection as it is; any other failure disconnects it (a timed-out call's late reply
    must never answer the next one)."""
    try:
        try:
            connection.send_command("EVALSHA", call.sha, len(call.keys), *call.keys, *call.args)
            return connection.read_response()
        except NoScriptError:
            if sender is not None:
                events.send(events.script_loaded, sender)
            connection.send_command("EVAL", call.source, len(call.keys), *call.keys, *call.args)
            return connection.read_response()
    except ResponseError as exc:  # Redis answered: the connection is in step
        raise failure(exc) from exc
    except BaseException as exc:
        connection.disconnect()
        raise failure(exc) from exc


class _Held:
    """Stands for a thread's hold on a connection, in the thread's locals: collected with
    them when the thread ends, when the connection goes back to the pool."""

    __slots__ = ("__weakref__",)


class ThreadConnections:
    """One connection of ``pool`` held by each counting thread for its life, so a call skips
    the pool's checkout and return (:func:`run_on`); after a failed call it goes back to the
    pool (:meth:`drop`), so reconnecting is the pool's business, as for any client.

    At most half the pool's ``max_connections`` are held so (:meth:`get` answers ``None`` to
    the threads beyond, which count through the client and its pool): the rest serve the
    other threads and every other command (usage pushes, the admin's reads), and the pool
    keeps bounding the connections. A thread's connection goes back to the pool when the
    thread ends. A forked child starts with none (:meth:`forget`): the parent's sockets are
    not its own."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        most = getattr(pool, "max_connections", None)
        self.most = most // 2 if isinstance(most, int) else 0
        self._get = connection_getter(pool)
        self.forget()
        _THREAD_CONNECTIONS.add(self)
        _drop_after_fork()

    def forget(self) -> None:
        """Start afresh: no thread holds a connection."""
        #: ``connection``: this thread's connection; ``False`` when it counts through the pool.
        self.mine = threading.local()
        self.held = 0
        self._lock = threading.Lock()

    def get(self) -> Any:
        """This thread's connection, taken from the pool on its first call; ``False`` once
        half the pool is held (for this thread's life: the pool is shared). Raise what the
        pool raises when no connection can be had (exhausted, server down): the call fails
        as it would through the client, and the next one tries again."""
        mine = self.mine
        with self._lock:
            if self.held >= self.most:
                mine.connection = False
                return False
            self.held += 1
        try:
            connection = self._get()
        except BaseException:
            with self._lock:
                self.held -= 1
            raise
        mine.held = held = _Held()
        mine.release = weakref.finalize(held, self._released, self._lock, connection)
        mine.connection = connection
        return connection

    def drop(self) -> None:
        """Give this thread's connection back to the pool after a failed call: the next call
        takes one from the pool, whose checkout connects it as the client would (to the
        primary the sentinels name now, after a failover)."""
        mine = self.mine
        mine.connection = None
        release = getattr(mine, "release", None)
        if release is not None:
            release()

    def _released(self, lock: threading.Lock, connection: Any) -> None:
        """A thread holding ``connection`` ended (or :meth:`forget` dropped it)."""
        if lock is not self._lock:  # taken before forget(): in a forked child, the parent's
            with contextlib.suppress(Exception):
                connection.disconnect()  # closes this process's copy of the socket only
            return
        with lock:
            self.held -= 1
        with contextlib.suppress(Exception):
            self.pool.release(connection)


class OneServer:
    """The route of counting calls to one server (or a Sentinel-managed primary): every
    shard is on it. ``sender`` is the backend class :data:`~django_throttle.events.script_loaded`
    names. A sync call goes through the calling thread's own connection
    (:class:`ThreadConnections`) when ``client`` is a ``redis.Redis`` over a pool."""

    def __init__(self, client: redis.Redis, sender: type | None = None) -> None:
        self.client: Any = client
        self.sender = sender
        self._threads = (
            ThreadConnections(client.connection_pool)
            if isinstance(client, redis.Redis) and client.connection is None
            else None
        )
        make_pool = async_pool_factory(client.connection_pool)

        async def make() -> Any:
            return AsyncRedis(connection_pool=make_pool())

        self._async = PerLoop(make)

    def call(self, call: ScriptCall) -> Any:
        threads = self._threads
        if threads is not None:
            connection = getattr(threads.mine, "connection", None)
            if connection is None:
                try:
                    connection = threads.get()
                except Exception as exc:
                    raise failure(exc) from exc
            if connection:
                try:
                    return run_on(connection, call, self.sender)
                except BaseException:
                    threads.drop()  # the next call takes one as the pool hands it out
                    raise
        return run_script(self.client, call, self.sender)

    async def acall(self, call: ScriptCall) -> Any:
        try:
            client = await self._async.client()
        except Exception as exc:
            raise failure(exc) from exc
        return await arun_script(client, call, self.sender)

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
        """Close the client's connections (only if the backend made the client)."""
        if client_too:
            self.client.connection_pool.disconnect()
        if self._threads is not None:
            self._threads.forget()
