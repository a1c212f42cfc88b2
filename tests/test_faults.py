"""Fault injection against real redis-servers: what clients see when Redis misbehaves.

Every test runs twice (the ``app`` fixture): the DRF view ``/api/ping/`` (``PolicyThrottle``,
admin policy rows) through the Django test client from several threads at once, and its adrf
twin (``AsyncPolicyThrottle``, ``redis.asyncio``) through Django's ASGI handler as concurrent
tasks on one long-lived event loop. Both run against a private ``redis-server`` this module
starts (never the suite's or the system's Redis), usually through :class:`FaultProxy`, which can
refuse, black-hole, delay, drop replies and reset connections. The server itself can be paused
(SIGSTOP), killed (SIGKILL) and restarted on the same port.

Assertions are on counts: statuses, headers, commands the proxy saw, breaker counters, tokens
left in Redis. Never on wall time; waits poll with generous deadlines.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from adrf.views import APIView as AsyncAPIView
from django.core.handlers.asgi import ASGIHandler
from django.test import Client
from django.urls import path
from redis.backoff import NoBackoff
from redis.retry import Retry
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from django_throttle.backends import redis_nodes as breaker_module
from django_throttle.drf import AsyncPolicyThrottle
from django_throttle.policy import live as policy
from django_throttle.usage import accounting as usage
from tests.bucket_state import pack_bucket, stored_used
from tests.factories import own_connections, tier
from tests.faultproxy import FaultProxy
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.django_db

#: Backend timeouts for the app under test: short, as in production, so faults cost little,
#: yet long enough that the calls of a test's healthy phases (before the fault, after it
#: healed) are answered within them on a loaded two-core machine (0.2 s was not always).
FAULT_TIMEOUT = 0.5
#: For tests whose healthy phase must never time out on a loaded machine.
HEALTHY_TIMEOUT = 2.0
#: How long ``delay`` holds each reply: well beyond FAULT_TIMEOUT.
DELAY = 1.5
THRESHOLD = 3
THREADS = 6
PER_THREAD = 15
#: Backend calls that may fail before the breaker opens: the threshold, plus every thread
#: that was already inside a call when the threshold was reached.
MAX_FAILURES = THRESHOLD + THREADS
PROXY_FAULTS = ("refuse", "blackhole", "delay", "drop_reply", "reset")
SERVER_FAULTS = ("sigkill", "sigstop")
PATH = "/api/ping/"
ASYNC_PATH = "/api/ping-async/"


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def server(redis_process: RedisServer) -> Iterator[RedisServer]:
    """The module's server, running, answering, empty and with default limits, before and
    after each test (a test may pause, kill or reconfigure it)."""
    redis_process.ensure_healthy()
    yield redis_process
    redis_process.ensure_healthy()


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(server.port) as fault_proxy:
        yield fault_proxy


@pytest.fixture
def admin_client(server: RedisServer) -> Iterator[redis.Redis]:
    """Our own connection to the server, with generous timeouts, for setup and inspection."""
    client = server.client()
    yield client
    client.close()


@pytest.fixture(params=["sync", "async"])
def app(request: pytest.FixtureRequest, settings: Any) -> Iterator[App]:
    """Every scenario runs twice: on the sync path (WSGI, DRF) and on the async path (ASGI,
    adrf, ``redis.asyncio``)."""
    if request.param == "sync":
        instance = App()
    else:
        settings.ROOT_URLCONF = __name__
        instance = AsyncApp()
    yield instance
    instance.close()


@pytest.fixture(autouse=True)
def _restore_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`configure` sets the breaker's and the policy cache's constants; each test gets
    them back as they were."""
    for module, name in (
        (breaker_module, "THRESHOLD"),
        (breaker_module, "COOLDOWN"),
        (policy, "REFRESH_INTERVAL"),
    ):
        monkeypatch.setattr(module, name, getattr(module, name))


def configure(
    settings: Any,
    url: str,
    *,
    timeout: float = FAULT_TIMEOUT,
    threshold: int = THRESHOLD,
    cooldown: float = 3600.0,
    mode: str = "open",
    **extra: Any,
) -> None:
    """Point the app at ``url`` with short timeouts and the given breaker and failure mode.

    The default cooldown is long so no half-open probe happens unless a test asks for one; the
    policy refresh interval is long so the only Redis calls are the counting ones.
    """
    settings.DJANGO_THROTTLE_REDIS_URL = url
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
    }
    # Constants, not settings: _restore_constants puts them back after the test.
    breaker_module.THRESHOLD = threshold
    breaker_module.COOLDOWN = cooldown
    settings.DJANGO_THROTTLE_FAILURE_MODE = mode
    policy.REFRESH_INTERVAL = 3600.0
    for name, value in extra.items():
        setattr(settings, f"DJANGO_THROTTLE_{name}", value)


def anonymous_tier(rate: str, burst: int | None = None, **flags: Any) -> None:
    """The default anonymous tier, compiled here: worker threads then never touch the DB."""
    tier("anonymous", rate, burst=burst, is_default_anonymous=True, **flags)
    policy.reset()
    policy.current()


def get_breaker() -> Any:
    from django_throttle.backends.redis_nodes import get_breaker

    return get_breaker()


# -- load -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """What one client saw."""

    status: int | str
    degraded: str | None = None
    retry_after: str | None = None
    remaining: str | None = None


@dataclass(frozen=True)
class Reply:
    """One response: status, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def seen(self) -> Seen:
        get = self.headers.get
        return Seen(
            self.status,
            get("x-ratelimit-degraded"),
            get("retry-after"),
            get("x-ratelimit-remaining"),
        )


class App:
    """The throttled ping view, called as WSGI calls it: DRF's ``PolicyThrottle`` through the
    Django test client, concurrent requests from threads."""

    def get(self, address: str) -> Reply:
        response = Client(raise_request_exception=False).get(PATH, REMOTE_ADDR=address)
        headers = {name.lower(): value for name, value in response.headers.items()}
        return Reply(response.status_code, headers, response.content)

    def request(self, address: str) -> Seen:
        seen = self.get(address).seen()
        if threading.current_thread() is threading.main_thread():
            # A test's single request: the usage push it woke (a process's first is due at
            # once) ends before the test injects its next fault, which then meets requests.
            usage.wait_pushed()
        return seen

    def hammer(
        self,
        address: Callable[[int, int], str],
        threads: int = THREADS,
        per_thread: int = PER_THREAD,
        between: Callable[[], None] | None = None,
    ) -> list[Seen]:
        """``threads`` x ``per_thread`` requests, threads released together; an exception is
        recorded as what the client saw, never lost in a thread."""
        seen: list[Seen] = []
        lock = threading.Lock()
        barrier = threading.Barrier(threads)

        def work(thread: int) -> None:
            barrier.wait()
            for index in range(per_thread):
                try:
                    result = self.request(address(thread, index))
                except BaseException as exc:  # shown in the assertion instead
                    result = Seen(f"exception {exc!r}")
                with lock:
                    seen.append(result)
                if between is not None:
                    between()

        run = own_connections(work)
        workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=120)
        assert not any(worker.is_alive() for worker in workers), "a request hung"
        return seen

    def close(self) -> None:
        pass


class AsyncPing(AsyncAPIView):  # type: ignore[misc]
    permission_classes = [AllowAny]
    throttle_classes = [AsyncPolicyThrottle]

    async def get(self, request: Request) -> Response:
        return Response({"pong": True})


urlpatterns = [path(ASYNC_PATH.lstrip("/"), AsyncPing.as_view())]


class AsyncApp(App):
    """The same view on adrf with ``AsyncPolicyThrottle``, called as an ASGI server calls
    Django: one event loop for the whole test (its connection pool lives as long),
    concurrent requests as tasks on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.handler = ASGIHandler()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=120)

    async def aget(self, address: str) -> Reply:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": ASYNC_PATH,
            "raw_path": ASYNC_PATH.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"testserver")],
            "client": (address, 50000),
            "server": ("testserver", 80),
        }
        sent: list[dict[str, Any]] = []
        requested = False

        async def receive() -> dict[str, Any]:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()  # the client never disconnects
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.handler(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        headers = {name.decode().lower(): value.decode() for name, value in start["headers"]}
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return Reply(start["status"], headers, body)

    def get(self, address: str) -> Reply:
        reply: Reply = self.run(self.aget(address))
        return reply

    def hammer(
        self,
        address: Callable[[int, int], str],
        threads: int = THREADS,
        per_thread: int = PER_THREAD,
        between: Callable[[], None] | None = None,
    ) -> list[Seen]:
        """``threads`` tasks of ``per_thread`` requests each, started together."""
        seen: list[Seen] = []

        async def work(thread: int) -> None:
            for index in range(per_thread):
                try:
                    result = (await self.aget(address(thread, index))).seen()
                except Exception as exc:  # shown in the assertion instead
                    result = Seen(f"exception {exc!r}")
                seen.append(result)
                if between is not None:
                    between()

        async def every() -> None:
            await asyncio.gather(*(work(n) for n in range(threads)))

        self.run(every())
        return seen

    def close(self) -> None:
        # Closes the backend's pools of this loop (see backends/redis_async.py), then the loop.
        self.run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


def distinct(thread: int, index: int) -> str:
    return f"10.{thread}.{index // 250}.{index % 250 + 1}"


def statuses(seen: list[Seen]) -> collections.Counter[int | str]:
    return collections.Counter(item.status for item in seen)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def used_tokens(client: redis.Redis, prefix: str) -> dict[str, float]:
    """Tokens used per bucket key under ``prefix``, read from the token-bucket state."""
    found = {}
    # Token buckets only: the 16-character client digest, then their code letter "t".
    for key in client.scan_iter(match=f"{prefix}:{{*}}{'?' * 16}t*", count=1000):
        used = stored_used(client.get(key))
        if used is not None:
            found[key.decode()] = used
    return found


def inject(fault: str, proxy: FaultProxy, server: RedisServer) -> None:
    if fault == "sigkill":
        server.kill()
    elif fault == "sigstop":
        server.pause()
    else:
        proxy.set_mode(fault, delay=DELAY)


def heal(fault: str, proxy: FaultProxy, server: RedisServer) -> None:
    proxy.set_mode("pass")
    if fault == "sigkill":
        server.start()
    elif fault == "sigstop":
        server.resume()


# -- the proxy itself ---------------------------------------------------------------------------


def test_fault_proxy_modes_do_what_they_say(proxy: FaultProxy, admin_client: redis.Redis) -> None:
    """The instrument first: each mode fails a client the way it claims, and says whether the
    command reached Redis."""

    def incr(mode: str) -> str:
        """INCR on a connection opened before the fault, as the app's pooled ones are."""
        client = redis.Redis.from_url(
            proxy.url,
            socket_timeout=FAULT_TIMEOUT,
            socket_connect_timeout=FAULT_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            client.ping()
            proxy.set_mode(mode, delay=DELAY)
            return str(client.incr("counter"))
        except redis.TimeoutError:
            return "timeout"
        except redis.ConnectionError:
            return "connection error"
        finally:
            client.close()
            proxy.set_mode("pass")

    outcomes = {}
    for mode in ("pass", "refuse", "blackhole", "delay", "drop_reply", "reset"):
        before = proxy.counts()["forwarded"].get("INCRBY", 0)
        outcome = incr(mode)
        outcomes[mode] = (outcome, proxy.counts()["forwarded"].get("INCRBY", 0) - before)
    assert outcomes == {
        "pass": ("1", 1),
        "refuse": ("connection error", 0),
        "blackhole": ("timeout", 0),
        "delay": ("timeout", 1),
        "drop_reply": ("connection error", 1),
        "reset": ("connection error", 1),
    }
    # delay, drop_reply and reset forwarded the command: Redis counted it.
    wait_until(lambda: admin_client.get("counter") == b"4", "the delayed INCR to land")


# -- 0 x 500, a handful of backend calls, then none ---------------------------------------------


def _sent(counts: dict[str, Any]) -> dict[str, Any]:
    """What the app sent towards Redis. A reply Redis gives to a call sent before the breaker
    opened can still reach the proxy (and be dropped) after the snapshot: that count is not
    traffic of the later requests."""
    return {name: value for name, value in counts.items() if name != "replies_dropped"}


@pytest.mark.parametrize("fault", PROXY_FAULTS + SERVER_FAULTS)
def test_fault_costs_a_handful_of_backend_calls_then_none_and_never_500(
    app: App, fault: str, settings: Any, proxy: FaultProxy, server: RedisServer
) -> None:
    configure(settings, proxy.url)
    anonymous_tier("1000/d", burst=1000)
    assert app.request("10.255.0.1") == Seen(200, None, None, "999")
    assert usage.wait_pushed()  # the first usage push (due at once) is not the fault's

    inject(fault, proxy, server)
    proxy.reset_counts()
    seen = app.hammer(distinct)

    assert statuses(seen) == {200: THREADS * PER_THREAD}, statuses(seen)
    assert {item.degraded for item in seen} == {"open"}
    breaker = get_breaker()
    assert breaker.state == "open"
    assert 1 <= breaker.failures <= MAX_FAILURES
    # Independent of the breaker's own account: what reached the proxy.
    counts = proxy.counts()
    assert proxy.scripts_seen() <= MAX_FAILURES, counts
    if fault == "refuse":
        assert counts["connections"] == 0, counts
    if fault == "sigkill":
        assert counts["upstream_failures"] + proxy.scripts_seen() <= MAX_FAILURES, counts

    # While open, requests do not touch Redis at all.
    before = proxy.counts()
    more = app.hammer(distinct, threads=2, per_thread=10)
    assert statuses(more) == {200: 20}
    assert {item.degraded for item in more} == {"open"}
    assert _sent(proxy.counts()) == _sent(before)
    assert breaker.failures <= MAX_FAILURES
    assert breaker.short_circuited >= 20


def test_redis_restarted_under_load_never_500_and_counts_again(
    app: App, settings: Any, proxy: FaultProxy, server: RedisServer
) -> None:
    """SIGKILL and restart on the same port while threads send requests: pooled connections
    die, the new server has no script and no data; clients see 200s throughout, then exact
    counting on the new server."""
    configure(settings, proxy.url, cooldown=0.3)
    anonymous_tier("1000/d", burst=1000)
    finished = itertools.count(1)
    restarts = []

    def restart_after_the_20th_request() -> None:
        if next(finished) == 20:
            server.restart()
            restarts.append(server.pid)

    seen = app.hammer(distinct, between=restart_after_the_20th_request)
    assert statuses(seen) == {200: THREADS * PER_THREAD}, statuses(seen)
    assert len(restarts) == 1
    breaker = get_breaker()
    wait_until(lambda: breaker.retry_after() == 0, "the cooldown to end")
    # The breaker's probe may itself time out on a loaded machine (the new server loads the
    # script first): wait, by another client, until requests are counted again.
    wait_until(lambda: app.request("10.9.0.2").degraded is None, "requests counted again", 60.0)
    fresh = [app.request("10.9.0.1") for _ in range(3)]
    assert fresh == [Seen(200, None, None, str(n)) for n in (999, 998, 997)]


# -- the failure mode decides what clients see --------------------------------------------------


def test_failure_mode_open_serves_and_says_the_limiter_was_bypassed(
    app: App, settings: Any, proxy: FaultProxy
) -> None:
    configure(settings, proxy.url, mode="open")
    anonymous_tier("2/h", burst=2)
    proxy.set_mode("refuse")
    seen = [app.request("10.6.0.1") for _ in range(2 * MAX_FAILURES)]
    assert seen == [Seen(200, "open")] * len(seen)


def test_failure_mode_closed_refuses_with_retry_after_and_says_why(
    app: App, settings: Any, proxy: FaultProxy
) -> None:
    status = 503
    cooldown = 30.0
    configure(settings, proxy.url, mode="closed", cooldown=cooldown)
    anonymous_tier("1000/h", burst=1000)
    proxy.set_mode("refuse")
    responses = [app.get("10.6.0.2") for _ in range(2 * MAX_FAILURES)]

    assert [response.status for response in responses] == [status] * len(responses)
    waits = [int(response.headers["retry-after"]) for response in responses]
    assert all(1 <= wait <= cooldown for wait in waits), waits
    # Once the breaker is open, Retry-After is the time until it probes again.
    assert get_breaker().state == "open"
    assert waits[-1] > 1
    body = json.loads(responses[-1].body)
    assert "unavailable" in body["detail"], body
    assert body["retry_after"] == waits[-1]
    assert "x-ratelimit-remaining" not in responses[-1].headers  # no invented limit


def test_failure_mode_local_enforces_the_limit_in_process(
    app: App, settings: Any, proxy: FaultProxy
) -> None:
    configure(settings, proxy.url, mode="local")
    anonymous_tier("3/h", burst=3)
    proxy.set_mode("refuse")
    seen = [app.request("10.6.0.3") for _ in range(5)]
    assert [item.status for item in seen] == [200, 200, 200, 429, 429]
    assert [item.degraded for item in seen] == ["local"] * 5
    assert [item.remaining for item in seen[:3]] == ["2", "1", "0"]
    assert all(item.retry_after is not None and int(item.retry_after) >= 1 for item in seen[3:])
    # Per client, as in Redis: another client has its own local bucket.
    assert app.request("10.6.0.4") == Seen(200, "local", None, "2")


def test_a_tier_failure_mode_overrides_the_setting(
    app: App, settings: Any, proxy: FaultProxy
) -> None:
    configure(settings, proxy.url, mode="open")
    anonymous_tier("1000/h", burst=1000, failure_mode="closed")
    proxy.set_mode("refuse")
    assert app.request("10.6.0.5").status == 503


# -- lost replies: at most one charge per request --------------------------------------------------


@pytest.mark.parametrize("fault", ["drop_reply", "reset", "delay"])
def test_a_lost_reply_charges_once_and_is_never_replayed(
    app: App,
    fault: str,
    settings: Any,
    proxy: FaultProxy,
    admin_client: redis.Redis,
    _isolated_throttle: str,
) -> None:
    """Redis executed the script but the reply never arrived: the request fails open, and it
    cost exactly one script call and one token, never a second attempt."""
    requests = 12
    # The breaker effectively off, so every request reaches the proxy; no usage counted, so
    # the pusher thread sends no script call of its own while the requests are timed.
    configure(settings, proxy.url, threshold=1000)
    settings.DJANGO_THROTTLE_USAGE_RETENTION_DAYS = 0
    anonymous_tier("1000/d", burst=1000)
    assert app.request("10.0.0.1").status == 200  # loads the script, charges 1

    proxy.set_mode(fault, delay=DELAY)
    proxy.reset_counts()
    seen = [app.request("10.0.0.1") for _ in range(requests)]
    proxy.set_mode("pass")

    # At most one script call per request reached Redis (none replayed; a request whose new
    # connection timed out while connecting on a loaded machine sends none), and Redis ran
    # each once: a delayed reply's script ran when the command was forwarded, before the
    # reply was held back. Every token charged is one a forwarded call took.
    forwarded = proxy.scripts_forwarded()
    assert requests - 2 <= forwarded <= requests, proxy.counts()
    used = used_tokens(admin_client, _isolated_throttle)
    assert len(used) == 1
    assert round(next(iter(used.values()))) == 1 + forwarded, used
    assert seen == [Seen(200, "open")] * requests


def test_lost_replies_under_threads_never_charge_more_than_requests(
    app: App, settings: Any, proxy: FaultProxy, admin_client: redis.Redis, _isolated_throttle: str
) -> None:
    configure(settings, proxy.url, threshold=1000)
    anonymous_tier("1000/d", burst=1000)
    assert app.request("10.0.0.1").status == 200
    assert usage.wait_pushed()  # the first usage push (due at once) is not the fault's
    proxy.set_mode("drop_reply")
    proxy.reset_counts()
    seen = app.hammer(lambda thread, index: "10.0.0.1", per_thread=5)
    proxy.set_mode("pass")
    # Each call reached Redis at most once (a request whose new connection timed out while
    # connecting on a loaded machine sends none), and Redis charged exactly what reached it:
    # never more than the requests.
    forwarded = proxy.scripts_forwarded()
    assert THREADS * 5 // 2 <= forwarded <= THREADS * 5, proxy.counts()
    used = used_tokens(admin_client, _isolated_throttle)
    assert round(next(iter(used.values()))) == 1 + forwarded
    assert statuses(seen) == {200: THREADS * 5}
    assert {item.degraded for item in seen} == {"open"}


# -- recovery ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["blackhole", "delay"])
def test_after_a_silent_partition_the_next_request_is_counted_again(
    app: App, fault: str, settings: Any, proxy: FaultProxy, server: RedisServer
) -> None:
    """Replies stop coming on open connections (a partition, or replies held back):
    one request times out and fails open; once traffic flows again the next one is counted,
    on a fresh connection, never answered by the lost call's late reply."""
    configure(settings, proxy.url, threshold=1000)  # the breaker effectively off
    anonymous_tier("1000/d", burst=1000)
    assert app.request("10.8.0.1") == Seen(200, None, None, "999")

    inject(fault, proxy, server)
    assert app.request("10.8.0.1") == Seen(200, "open")
    heal(fault, proxy, server)

    # blackhole swallowed the call; delay forwarded it (Redis counted it) and held the reply.
    left = 998 if fault == "blackhole" else 997
    fresh = [app.request("10.8.0.1") for _ in range(3)]
    assert fresh == [Seen(200, None, None, str(n)) for n in (left, left - 1, left - 2)]


@pytest.mark.parametrize("fault", ["refuse", "blackhole", "sigkill", "sigstop"])
def test_limiting_is_exact_again_at_the_first_request_after_the_cooldown(
    app: App, fault: str, settings: Any, proxy: FaultProxy, server: RedisServer
) -> None:
    configure(settings, proxy.url, cooldown=0.3)
    anonymous_tier("5/h", burst=5)
    assert app.request("10.1.0.1") == Seen(200, None, None, "4")

    inject(fault, proxy, server)
    breaker = get_breaker()
    outage = []
    while breaker.state != "open" and len(outage) < 3 * MAX_FAILURES:
        outage.append(app.request("10.1.0.2"))
    assert breaker.state == "open"
    assert {item.status for item in outage} == {200}
    heal(fault, proxy, server)

    # The first request once the cooldown is over probes Redis, succeeds and closes the breaker.
    wait_until(lambda: breaker.retry_after() == 0, "the cooldown to end")
    fresh = [app.request("10.1.0.3") for _ in range(7)]
    assert [item.status for item in fresh] == [200] * 5 + [429] * 2
    assert [item.remaining for item in fresh[:5]] == ["4", "3", "2", "1", "0"]
    assert {item.degraded for item in fresh} == {None}
    assert breaker.state == "closed"
    if fault != "sigkill":  # the server kept its data: the earlier client's bucket is intact
        assert [app.request("10.1.0.1").status for _ in range(5)] == [200] * 4 + [429]


# -- SCRIPT FLUSH under load ---------------------------------------------------------------------


@pytest.mark.parametrize(("burst", "admitted"), [(1000, 6 * 25), (50, 50)])
def test_script_flush_every_20ms_costs_no_error_and_no_double_charge(
    app: App,
    burst: int,
    admitted: int,
    settings: Any,
    server: RedisServer,
    admin_client: redis.Redis,
    _isolated_throttle: str,
) -> None:
    requests = THREADS * 25
    configure(settings, server.url, timeout=HEALTHY_TIMEOUT)
    anonymous_tier(f"{burst}/d", burst=burst)
    stop = threading.Event()
    flushes = 0

    def flusher() -> None:
        nonlocal flushes
        client = server.client()
        while not stop.is_set():
            client.script_flush()
            client.function_flush()
            flushes += 1
            stop.wait(0.02)
        client.close()

    noscript_before = _noscript_errors(admin_client)
    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        seen = app.hammer(lambda thread, index: "10.2.0.1", per_thread=25)
    finally:
        stop.set()
        thread.join()

    assert {item.degraded for item in seen} == {None}, collections.Counter(seen)
    assert statuses(seen) == collections.Counter({200: admitted, 429: requests - admitted})
    assert flushes >= 2
    assert _noscript_errors(admin_client) > noscript_before  # the flushes did bite
    used = used_tokens(admin_client, _isolated_throttle)
    assert round(next(iter(used.values()))) == admitted
    assert get_breaker().failures == 0


def _noscript_errors(client: redis.Redis) -> int:
    """The server's ``NOSCRIPT`` replies and libraries loaded (the package's code sent again)."""
    stats = client.info("errorstats")
    loads = client.info("commandstats").get("cmdstat_function|load", {}).get("calls", 0)
    return int(stats.get("errorstat_NOSCRIPT", {}).get("count", 0)) + int(loads)


# -- OOM and BUSY take the failure mode ----------------------------------------------------------


def _assert_failure_mode(mode: str, seen: Seen) -> None:
    if mode == "open":
        assert seen == Seen(200, "open"), seen
    else:
        assert seen.status == 503, seen
        assert seen.retry_after is not None and int(seen.retry_after) >= 1, seen


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_out_of_memory_takes_the_failure_mode(
    app: App, mode: str, settings: Any, server: RedisServer, admin_client: redis.Redis
) -> None:
    configure(settings, server.url, timeout=HEALTHY_TIMEOUT, mode=mode)
    anonymous_tier("1000/d", burst=1000)
    assert app.request("10.3.0.1").status == 200  # keys exist; the script is loaded
    admin_client.config_set("maxmemory-policy", "noeviction")
    admin_client.config_set("maxmemory", 1)
    with pytest.raises(redis.ResponseError, match="maxmemory"):
        admin_client.set("probe", "x")

    _assert_failure_mode(mode, app.request("10.3.0.2"))
    _assert_failure_mode(mode, app.request("10.3.0.1"))

    admin_client.config_set("maxmemory", 0)
    assert app.request("10.3.0.1") == Seen(200, None, None, "998")


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_busy_script_takes_the_failure_mode(
    app: App, mode: str, settings: Any, server: RedisServer, admin_client: redis.Redis
) -> None:
    configure(settings, server.url, timeout=HEALTHY_TIMEOUT, mode=mode)
    anonymous_tier("1000/d", burst=1000)
    assert app.request("10.4.0.1").status == 200
    admin_client.config_set("busy-reply-threshold", 10)  # BUSY after 10 ms, not 5 s

    def busy_loop() -> None:
        client = server.client(timeout=60)
        try:
            client.eval("while true do end", 0)
        except redis.ResponseError:
            pass  # killed by SCRIPT KILL below
        finally:
            client.close()

    looper = threading.Thread(target=busy_loop)
    looper.start()
    try:
        wait_until(lambda: _is_busy(admin_client), "Redis to answer BUSY")
        _assert_failure_mode(mode, app.request("10.4.0.2"))
        _assert_failure_mode(mode, app.request("10.4.0.1"))
    finally:
        wait_until(lambda: _script_killed(admin_client), "SCRIPT KILL to succeed")
        looper.join(timeout=30)
    assert app.request("10.4.0.1") == Seen(200, None, None, "998")


def _is_busy(client: redis.Redis) -> bool:
    try:
        client.ping()
    except redis.ResponseError as exc:
        return "BUSY" in str(exc)
    return False


def _script_killed(client: redis.Redis) -> bool:
    try:
        client.script_kill()
    except redis.ResponseError as exc:
        return "NOTBUSY" in str(exc)
    return True


# -- a clock in the future ----------------------------------------------------------------------


@pytest.mark.parametrize("used", ["5", "4.5", "1e9"])
def test_state_from_a_future_clock_never_yields_a_negative_or_huge_retry_after(
    app: App,
    used: str,
    settings: Any,
    server: RedisServer,
    admin_client: redis.Redis,
    _isolated_throttle: str,
) -> None:
    """A state written when the server's clock was ten years ahead (then stepped back)."""
    configure(settings, server.url, timeout=HEALTHY_TIMEOUT)
    anonymous_tier("1/m", burst=5)  # window: 5 tokens x 60 s
    window = 300
    assert app.request("10.5.0.1").status == 200
    (key,) = used_tokens(admin_client, _isolated_throttle)
    seconds, micros = admin_client.time()
    future = (seconds + 10 * 366 * 86400) * 1_000_000 + micros
    state = pack_bucket(float(used), future // 1000, compact=False)  # the full stamp: 10 years on
    admin_client.set(key, state, px=window * 1000)

    seen = [app.request("10.5.0.1") for _ in range(3)]
    for item in seen:
        assert item.status in (200, 429), item
        assert item.remaining is not None and 0 <= int(item.remaining) <= 5, item
        if item.status == 429:
            assert item.retry_after is not None and 1 <= int(item.retry_after) <= window, item
    assert seen[-1].status == 429
