"""The counting call's connections: taken from the client's pool (a thread keeps one while it
lives, at most half the pool: django_throttle/backends/redis_nodes.py), always given back,
never reused with a reply pending, sync and async alike. Real redis-servers; faults through
:class:`tests.faultproxy.FaultProxy`."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from django_throttle.backends import get_backend, redis_nodes
from django_throttle.backends.base import BackendError
from django_throttle.backends.redis import RedisBackend
from django_throttle.rates import Limit
from tests.faultproxy import FaultProxy
from tests.redis_servers import RedisServer, connection_getter

#: Slow to refill (one token per 86 s): counts stay exact for the length of a test.
CAPACITY = 1000
LIMITS = (Limit.build("pool", "1000/d", burst=CAPACITY),)
THREADS = 8
PER_THREAD = 50


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    process = RedisServer().start()
    yield process
    process.stop()


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(server.port) as fault_proxy:
        yield fault_proxy


#: The socket timeouts of the tests that make calls time out: every call before the fault
#: must be answered within it, also on a loaded machine (where 0.2 s was not always enough).
FAULT_TIMEOUT = 1.0
#: How long the proxy's ``delay`` mode holds a reply: well beyond :data:`FAULT_TIMEOUT`.
LATE_REPLY = 3.0


def small_pool_backend(settings: Any, url: str, timeout: float = 2.0) -> RedisBackend:
    settings.DJANGO_THROTTLE_REDIS_URL = url
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {
        "max_connections": 4,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "timeout": 2.0,  # a thread waits this long for a free connection
    }
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    return backend


def test_counting_gives_its_connections_back_to_the_pool(settings: Any, redis_url: str) -> None:
    """Eight threads counting on a pool of four: every hit is counted, and afterwards the
    client's other commands (policy version, reset, retime) still find a connection."""
    backend = small_pool_backend(settings, redis_url)
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def work(n: int) -> None:
        barrier.wait()
        try:
            for _ in range(PER_THREAD):
                backend.hit("shared-client", LIMITS)
        except BaseException as exc:  # shown in the assertion
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert errors == []
    assert backend.peek("shared-client", LIMITS).remaining == CAPACITY - THREADS * PER_THREAD

    backend.bump_policy_version()
    assert backend.get_policy_version() is not None
    assert backend.retime(LIMITS) == 1
    backend.reset("shared-client", LIMITS)
    assert backend.peek("shared-client", LIMITS).remaining == CAPACITY


def test_async_counting_gives_its_connections_back_to_the_pool(
    settings: Any, redis_url: str
) -> None:
    """Forty concurrent async calls on a pool of four, twice: all counted, none waits in vain."""
    backend = small_pool_backend(settings, redis_url)

    async def burst() -> list[int]:
        calls = [backend.ahit("async-client", LIMITS) for _ in range(40)]
        first = [decision.remaining for decision in await asyncio.gather(*calls)]
        calls = [backend.ahit("async-client", LIMITS) for _ in range(40)]
        return first + [decision.remaining for decision in await asyncio.gather(*calls)]

    remaining = asyncio.run(burst())
    assert sorted(remaining) == list(range(CAPACITY - 80, CAPACITY))
    backend.bump_policy_version()
    assert backend.get_policy_version() is not None


def test_a_loop_that_served_async_calls_is_freed_when_it_ends(
    settings: Any, redis_url: str
) -> None:
    """Under WSGI, Django runs each async view in an event loop of its own (``async_to_sync``):
    the loop's client (and the loop's lag watch of the middleware) must go with the loop, or
    every request would leave a loop, a client and its pool behind for the life of the
    worker."""
    import weakref

    from django_throttle.request import core

    backend = small_pool_backend(settings, redis_url)
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def request() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        core.watch_loop()
        assert (await backend.ahit("loop-client", LIMITS)).allowed

    for _ in range(5):
        asyncio.run(request())
    gc.collect()
    assert [ref() for ref in loops] == [None] * 5
    assert backend.hit("loop-client", LIMITS).remaining == CAPACITY - 6


@pytest.mark.parametrize("mode", ["blackhole", "delay"])
def test_a_timed_out_connection_is_never_reused_sync(
    mode: str, settings: Any, proxy: FaultProxy
) -> None:
    """A call that timed out leaves its connection disconnected: the late reply (``delay``)
    never answers the next call, and after a partition the next call works at once."""
    backend = small_pool_backend(settings, proxy.url, timeout=FAULT_TIMEOUT)
    assert backend.hit("late", LIMITS).remaining == CAPACITY - 1
    proxy.set_mode(mode, delay=LATE_REPLY)
    with pytest.raises(BackendError, match="Timeout"):
        backend.hit("late", LIMITS)
    proxy.set_mode("pass")
    # With "delay" Redis ran the timed-out call: it counted, and its reply was never read.
    expected = CAPACITY - 3 if mode == "delay" else CAPACITY - 2
    assert [backend.hit("late", LIMITS).remaining for _ in range(3)] == [
        expected,
        expected - 1,
        expected - 2,
    ]


@pytest.mark.parametrize("mode", ["blackhole", "delay"])
def test_a_timed_out_connection_is_never_reused_async(
    mode: str, settings: Any, proxy: FaultProxy
) -> None:
    backend = small_pool_backend(settings, proxy.url, timeout=FAULT_TIMEOUT)

    async def run() -> list[int]:
        assert (await backend.ahit("late", LIMITS)).remaining == CAPACITY - 1
        proxy.set_mode(mode, delay=LATE_REPLY)
        with pytest.raises(BackendError, match="Timeout"):
            await backend.ahit("late", LIMITS)
        proxy.set_mode("pass")
        return [(await backend.ahit("late", LIMITS)).remaining for _ in range(3)]

    expected = CAPACITY - 3 if mode == "delay" else CAPACITY - 2
    assert asyncio.run(run()) == [expected, expected - 1, expected - 2]


def test_timed_out_async_calls_leave_nothing_for_asyncio_to_log(
    settings: Any, proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """No "Future exception was never retrieved" (or any other loop error) after async calls
    that timed out, however their connections end afterwards."""
    backend = small_pool_backend(settings, proxy.url, timeout=FAULT_TIMEOUT / 2)
    reported: list[dict[str, Any]] = []

    async def run() -> int:
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: reported.append(context)
        )
        await backend.ahit("quiet", LIMITS)
        proxy.set_mode("blackhole")
        failed = 0
        for _ in range(5):
            calls = [backend.ahit("quiet", LIMITS) for _ in range(4)]
            for outcome in await asyncio.gather(*calls, return_exceptions=True):
                failed += isinstance(outcome, BackendError)
        proxy.set_mode("refuse")  # resets every open connection
        proxy.set_mode("pass")
        await asyncio.sleep(0.05)  # the resets arrive
        return failed

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        assert asyncio.run(run()) == 20
        gc.collect()
    assert reported == []
    assert [record.getMessage() for record in caplog.records if record.name == "asyncio"] == []


def in_thread(action: Any) -> Any:
    """``action()`` run in a thread of its own, which ends before this returns."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(action())
        except BaseException as exc:  # returned, for the caller to assert on
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(timeout=30)
    return outcome[0]


def test_a_thread_holds_a_connection_of_the_pool_until_it_ends(
    settings: Any, redis_url: str
) -> None:
    """A counting thread keeps one connection of the bounded pool for its life (so a decision
    skips the pool's checkout), at most half the pool is held so, and the connection goes
    back to the pool when the thread ends: the pool still bounds every connection."""
    backend = small_pool_backend(settings, redis_url)
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {
        **settings.DJANGO_THROTTLE_REDIS_OPTIONS,
        "max_connections": 2,
        "timeout": 0.05,
    }
    backend = get_backend()
    pool = backend.client.connection_pool
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        backend.hit("thread", LIMITS)  # this thread's own connection, one of the two
        holding.set()
        release.wait(timeout=30)

    first = threading.Thread(target=holder)
    first.start()
    assert holding.wait(timeout=30)
    # Half the pool is held: another thread counts through the pool's other connection.
    assert in_thread(lambda: backend.hit("thread", LIMITS).remaining) == CAPACITY - 2
    held = connection_getter(pool)()  # now every connection is in use
    try:
        failed = in_thread(lambda: backend.hit("thread", LIMITS))
        assert isinstance(failed, BackendError)
        assert "no connection available" in str(failed).lower()
        release.set()
        first.join(timeout=30)
        gc.collect()
        # The ended thread's connection is back in the pool: a new thread counts on it.
        assert in_thread(lambda: backend.hit("thread", LIMITS).remaining) == CAPACITY - 3
    finally:
        release.set()
        pool.release(held)


def _reads() -> dict[str, Callable[[], object]]:
    from django_throttle.admin.views import timeline
    from django_throttle.inspection.subjects import presented_username
    from django_throttle.usage.reports import report, rollup

    return {
        "report": lambda: report(datetime.now(tz=UTC) - timedelta(minutes=5), "client", None),
        "rollup": rollup,
        "timeline": lambda: timeline("hour"),
        "presented_username": lambda: presented_username("username:#abc"),
    }


@pytest.mark.django_db
@pytest.mark.parametrize("read", ["report", "rollup", "timeline", "presented_username"])
def test_a_usage_read_closes_the_client_it_read_on(
    read: str, settings: Any, server: RedisServer
) -> None:
    """What reads the configured backend's usage counts itself (the admin's dashboard, the
    usage list's rollup, the operator tools) closes the client with longer timeouts the read
    builds: its connection is not left open until the garbage collector finds it (redis-py's
    clients sit in reference cycles), nor collected with a warning of an unclosed socket."""
    settings.DJANGO_THROTTLE_REDIS_URL = server.url
    call = _reads()[read]
    admin = server.client()
    gc.disable()  # the collector, run meanwhile, would close what a read left open
    try:
        call()  # the backend's own connections, open from now on
        before = len(admin.client_list())
        for _ in range(3):
            call()
        after = len(admin.client_list())
    finally:
        gc.enable()
        admin.close()
    assert after == before


@pytest.mark.parametrize("how", ["closed by the server", "server restarted"])
def test_a_held_connection_the_server_closed_is_not_a_failed_call(
    settings: Any, server: RedisServer, how: str
) -> None:
    """A thread's own connection that the server closed while the thread was idle (the
    server's ``timeout``, ``CLIENT KILL``, a restart, a Sentinel failover) is found closed
    before the next call, as the pool's checkout finds it, and that call goes on a fresh
    connection: answered, not a failure. (It used to fail: the next decision took the failure
    mode, and a slot given back then stayed taken until its lease ended.)"""
    server.ensure_healthy()
    backend = small_pool_backend(settings, server.url)
    slots = (Limit.build("slots", "1/h", algorithm="concurrency"),)
    taken = backend.hit("held", slots)
    [(client, lease)] = taken.leases
    assert not backend.hit("held", slots).allowed
    if how == "server restarted":
        server.kill(keep_data=True)
        server.restart()
    else:
        with server.client() as admin:
            assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    time.sleep(redis_nodes.POLL_IDLE_AFTER)  # the thread idle since
    assert backend.release(client, slots, lease) == 1  # on this thread's connection
    assert backend.hit("held", slots).allowed
    assert backend.hit("more", LIMITS).remaining == CAPACITY - 1


def test_a_busy_threads_connection_closed_since_its_last_answer_fails_one_call(
    settings: Any, server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection that answered under :data:`~.redis_nodes.POLL_IDLE_AFTER` ago is sent
    the next call unpolled (a busy thread saves the poll's system calls): when the server
    closed it in that time (here: the bound made long, so the ``CLIENT KILL`` surely falls in
    it), that one call fails, as a call in flight does, and the next goes on a fresh
    connection with nothing lost."""
    monkeypatch.setattr(redis_nodes, "POLL_IDLE_AFTER", 3600.0)
    server.ensure_healthy()
    backend = small_pool_backend(settings, server.url)
    assert backend.hit("busy", LIMITS).remaining == CAPACITY - 1
    with server.client() as admin:
        assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    with pytest.raises(BackendError):
        backend.hit("busy", LIMITS)
    assert backend.hit("busy", LIMITS).remaining == CAPACITY - 2
