"""Concurrency limits: requests in flight, each holding a slot under a lease until its response
ends. The backends' semantics (both backends, a test clock), exactness under concurrent
requests, and the request path: the decorator (sync and async) and DRF behind the headers
middleware give the slot back when the response is made, when a stream closes, when the view
raises; the keeper renews a long request's lease and gives back the slots of a request that
was collected while still holding them."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from adrf.views import APIView as AsyncAPIView
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.test import AsyncClient, Client, RequestFactory
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle import backends
from django_throttle.backends import get_backend
from django_throttle.backends.base import ArgumentRefused, Backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.redis import RedisBackend
from django_throttle.decorators import throttle
from django_throttle.drf import AsyncPolicyThrottle
from django_throttle.models import EndpointLimit
from django_throttle.policy import live as policy
from django_throttle.rates import Algorithm, InvalidRate, Limit
from django_throttle.request import core, leases
from tests.clients import AddressedAsyncClient
from tests.factories import endpoint, own_connections, tier

T0 = 1_800_000_000.0


def in_flight(count: int = 2, period: str = "min", name: str = "exports") -> Limit:
    return Limit.build(name, f"{count}/{period}", algorithm=Algorithm.CONCURRENCY)


def live(backend: Backend, client: str, limit: Limit) -> int:
    """Live leases of ``client`` under ``limit``: the capacity less what a peek says is free."""
    return limit.capacity - backend.peek(client, [limit]).remaining


# -- the backends ---------------------------------------------------------------------------


def test_a_concurrency_limit_admits_its_count_in_flight(backend: Backend) -> None:
    limit = in_flight(3)
    held = [backend.hit("c", [limit], now=T0) for _ in range(3)]
    assert [(d.allowed, d.remaining) for d in held] == [(True, 2), (True, 1), (True, 0)]
    assert len({d.leases[0][1] for d in held}) == 3  # one lease per request
    assert all(d.leases[0][0] == "c" and d.reset_after == 60 for d in held)
    refused = backend.hit("c", [limit], now=T0 + 10)
    assert not refused.allowed and refused.leases == ()
    # A slot frees when a request ends, which no clock tells: come back soon, at most in 1 s.
    assert refused.retry_after == 1.0 and refused.remaining == 0
    assert refused.reset_after == 50


def test_a_refusal_near_a_lease_end_says_when_it_ends(backend: Backend) -> None:
    limit = in_flight(1, "10s")
    backend.hit("c", [limit], now=T0)
    refused = backend.hit("c", [limit], now=T0 + 9.75)
    assert not refused.allowed and refused.retry_after == pytest.approx(0.25)
    assert backend.hit("c", [limit], now=T0 + 10).allowed  # the lease ended


def test_release_gives_a_slot_back_once_by_its_lease_id(backend: Backend) -> None:
    limit = in_flight(2)
    first, second = (backend.hit("c", [limit], now=T0) for _ in range(2))
    lease = first.leases[0][1]
    assert backend.release("c", [limit], lease, now=T0 + 1) == 1
    assert backend.release("c", [limit], lease, now=T0 + 1) == 0  # idempotent
    assert backend.release("c", [limit], "never-taken", now=T0 + 1) == 0
    assert backend.hit("c", [limit], now=T0 + 2).allowed
    assert not backend.hit("c", [limit], now=T0 + 2).allowed  # the second still holds its slot
    assert backend.release("c", [limit], second.leases[0][1], now=T0 + 3) == 1


def test_a_renewed_lease_outlives_its_period_and_an_ended_one_is_never_revived(
    backend: Backend,
) -> None:
    limit = in_flight(2, "10s")
    kept, ended = (backend.hit("c", [limit], now=T0).leases[0][1] for _ in range(2))
    assert backend.renew("c", [limit], kept, now=T0 + 9) == 1  # now ends at T0 + 19
    # At T0 + 11 the other lease has ended: its slot is free, and renewing it revives nothing.
    assert backend.renew("c", [limit], ended, now=T0 + 11) == 0
    taken = backend.hit("c", [limit], now=T0 + 11)
    assert taken.allowed and taken.remaining == 0
    assert not backend.hit("c", [limit], now=T0 + 12).allowed
    assert backend.renew("c", [limit], "never-taken", now=T0 + 12) == 0
    # The renewed lease ends at T0 + 19; the one taken at T0 + 11 at T0 + 21.
    assert backend.hit("c", [limit], now=T0 + 19).allowed
    assert not backend.hit("c", [limit], now=T0 + 19).allowed


def test_a_peek_takes_no_slot(backend: Backend) -> None:
    limit = in_flight(1)
    for _ in range(3):
        looked = backend.peek("c", [limit], now=T0, cost=1)
        assert looked.allowed and looked.remaining == 0 and looked.leases == ()
    assert backend.hit("c", [limit], now=T0).allowed


def test_a_rate_and_a_concurrency_limit_count_in_one_call(backend: Backend) -> None:
    """All or nothing: a request the rate refuses takes no slot, and one the concurrency
    limit refuses takes no token."""
    rate = Limit.build("rate", "3/min")
    limit = in_flight(2)
    both = [rate, limit]
    first = backend.hit("c", both, now=T0)
    assert first.allowed and first.leases
    backend.hit("c", both, now=T0)
    refused = backend.hit("c", both, now=T0)
    assert not refused.allowed and refused.limit == limit
    assert backend.peek("c", [rate], now=T0).remaining == 1  # the refused request took no token
    backend.release("c", both, first.leases[0][1], now=T0)
    assert backend.hit("c", both, now=T0).allowed
    refused = backend.hit("c", [rate, in_flight(5, name="wide")], now=T0)
    assert not refused.allowed and refused.limit == rate
    assert live(backend, "c", in_flight(5, name="wide")) == 0  # no slot taken by the refusal


def test_a_key_expires_with_its_latest_lease(
    redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    backend = RedisBackend()
    limit = in_flight(2, "30s")
    lease = backend.hit("c", [limit]).leases[0][1]
    key = backend.key("c", limit)
    assert 29_000 < redis_client.pttl(key) <= 30_000
    assert backend.renew("c", [limit], lease) == 1
    assert 29_000 < redis_client.pttl(key) <= 30_000
    assert backend.release("c", [limit], lease) == 1
    assert not redis_client.exists(key)  # nothing held: nothing kept


def test_the_script_refuses_a_concurrency_limit_without_a_lease(
    _isolated_throttle: str,
) -> None:
    backend = RedisBackend()
    call = backend._request("c", [in_flight()], 1, None, None)
    bare = call._replace(args=call.args[:-2])  # no clock, no lease
    with pytest.raises(ArgumentRefused, match="needs a lease id"):
        backend._route.call(bare)
    odd = call._replace(args=(*call.args[:-1], b"no spaces allowed"))
    with pytest.raises(ArgumentRefused, match="lease id must be"):
        backend._route.call(odd)


@pytest.mark.parametrize("kind", ["redis", "memory"])
def test_200_concurrent_requests_take_exactly_the_limit(kind: str, _isolated_throttle: str) -> None:
    backend: Backend = RedisBackend() if kind == "redis" else MemoryBackend()
    limit = in_flight(7)
    with ThreadPoolExecutor(max_workers=32) as pool:
        decisions = list(pool.map(lambda _: backend.hit("c", [limit]), range(200)))
    held = [d.leases[0][1] for d in decisions if d.allowed]
    assert len(held) == 7
    assert sum(backend.release("c", [limit], lease) for lease in held) == 7
    assert live(backend, "c", limit) == 0
    backend.close()


@pytest.mark.parametrize("kind", ["redis", "memory"])
def test_async_requests_take_exactly_the_limit_and_give_it_back(
    kind: str, _isolated_throttle: str
) -> None:
    backend: Backend = RedisBackend() if kind == "redis" else MemoryBackend()
    limit = in_flight(4)

    async def burst() -> int:
        decisions = await asyncio.gather(*(backend.ahit("c", [limit]) for _ in range(50)))
        held = [d.leases[0][1] for d in decisions if d.allowed]
        released = await asyncio.gather(*(backend.arelease("c", [limit], h) for h in held))
        return len(held) * 100 + sum(released)

    assert asyncio.run(burst()) == 404
    assert live(backend, "c", limit) == 0
    backend.close()


def test_a_concurrency_limit_has_no_burst() -> None:
    with pytest.raises(InvalidRate, match="no burst") as refused:
        Limit.build("x", "2/min", burst=5, algorithm=Algorithm.CONCURRENCY)
    assert refused.value.field == "burst"
    assert in_flight(2, "30s").window == 30  # the lease


# -- the request path -----------------------------------------------------------------------

gate = threading.Event()
entered = threading.Semaphore(0)


@throttle(rate="2/min", algorithm="concurrency")
def held_view(request: HttpRequest) -> HttpResponse:
    entered.release()
    gate.wait(10)
    return HttpResponse("done")


@throttle(rate="2/min", algorithm="concurrency")
async def held_view_async(request: HttpRequest) -> HttpResponse:
    entered.release()
    while not gate.is_set():
        await asyncio.sleep(0.01)
    return HttpResponse("done")


@throttle(rate="1/min", algorithm="concurrency", scope="raising")
def raising_view(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("the view failed")


@throttle(rate="1/min", algorithm="concurrency", scope="streaming")
def streaming_view(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(iter([b"a", b"b", b"c"]))


async def _chunks() -> Any:
    for part in (b"a", b"b"):
        yield part


@throttle(rate="1/min", algorithm="concurrency", scope="streaming-async")
async def streaming_view_async(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(_chunks())


class HeldApi(APIView):
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        entered.release()
        gate.wait(10)
        return Response({"done": True})


class HeldAsyncApi(AsyncAPIView):  # type: ignore[misc]
    permission_classes = [AllowAny]
    throttle_classes = [AsyncPolicyThrottle]

    async def get(self, request: Request) -> Response:
        entered.release()
        while not gate.is_set():
            await asyncio.sleep(0.01)
        return Response({"done": True})


urlpatterns = [
    path("api/held-async/", HeldAsyncApi.as_view(), name="held-api-async"),
    path("held/", held_view),
    path("held-async/", held_view_async),
    path("raising/", raising_view),
    path("streaming/", streaming_view),
    path("streaming-async/", streaming_view_async),
    path("api/held/", HeldApi.as_view(), name="held-api"),
]


async def _entered(count: int, within: float = 10.0) -> None:
    """Wait until ``count`` views have entered, each counted once (they may enter apart)."""
    deadline = time.monotonic() + within
    while count:
        if entered.acquire(blocking=False):
            count -= 1
            continue
        assert time.monotonic() < deadline, f"{count} view(s) never entered"
        await asyncio.sleep(0.01)


@pytest.fixture
def closed_gate() -> Iterator[threading.Event]:
    gate.clear()
    while entered.acquire(blocking=False):
        pass
    yield gate
    gate.set()


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_the_decorator_holds_slots_while_views_run_and_gives_them_back(
    closed_gate: threading.Event,
) -> None:
    @own_connections
    def get(_: int) -> tuple[int, str]:
        response = Client().get("/held/")
        return response.status_code, response.get("Retry-After", "")

    policy.current()  # the policy loaded here: the threads read no database
    with ThreadPoolExecutor(max_workers=5) as pool:
        running = [pool.submit(get, n) for n in range(2)]
        assert entered.acquire(timeout=10) and entered.acquire(timeout=10)
        refused = list(pool.map(get, range(3)))
        assert refused == [(429, "1")] * 3
        closed_gate.set()
        assert [future.result()[0] for future in running] == [200, 200]
    assert [Client().get("/held/").status_code for _ in range(3)] == [200] * 3


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_an_async_view_holds_its_slots_and_gives_them_back(closed_gate: threading.Event) -> None:
    async def run() -> list[int]:
        client = AsyncClient()
        running = [asyncio.ensure_future(client.get("/held-async/")) for _ in range(2)]
        await _entered(2)
        refused = [(await client.get("/held-async/")).status_code for _ in range(2)]
        closed_gate.set()
        done = [response.status_code for response in await asyncio.gather(*running)]
        after = [(await client.get("/held-async/")).status_code for _ in range(3)]
        return refused + done + after

    assert async_to_sync(run)() == [429, 429, 200, 200, 200, 200, 200]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_view_that_raises_gives_its_slot_back() -> None:
    client = Client(raise_request_exception=False)
    assert [client.get("/raising/").status_code for _ in range(3)] == [500, 500, 500]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_stream_holds_its_slot_until_it_is_closed() -> None:
    client = Client()
    streaming = client.get("/streaming/")
    assert streaming.status_code == 200
    assert client.get("/streaming/").status_code == 429  # the first stream is still open
    assert b"".join(streaming.streaming_content) == b"abc"
    streaming.close()
    read_to_the_end = client.get("/streaming/")
    assert read_to_the_end.status_code == 200
    read_to_the_end.close()  # closed unread: the client went away
    assert client.get("/streaming/").status_code == 200


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_an_async_stream_holds_its_slot_until_it_ends() -> None:
    async def run() -> list[int]:
        client = AsyncClient()
        first = await client.get("/streaming-async/")
        during = (await client.get("/streaming-async/")).status_code
        assert b"".join([part async for part in first.streaming_content]) == b"ab"
        after = await client.get("/streaming-async/")
        # Read to its end too: a stream left open holds its slot until it is collected.
        assert b"".join([part async for part in after.streaming_content]) == b"ab"
        return [first.status_code, during, after.status_code]

    assert async_to_sync(run)() == [200, 429, 200]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("identity", ["203.0.113.9", "2001:db8::7"])
def test_drf_behind_the_middleware_holds_slots_per_client(
    closed_gate: threading.Event, identity: str
) -> None:
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("held", "route", "held-api")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="1/min", algorithm="concurrency")

    @own_connections
    def get(address: str) -> int:
        return Client(REMOTE_ADDR=address).get("/api/held/").status_code

    policy.current()  # the policy loaded here: the threads read no database
    with ThreadPoolExecutor(max_workers=3) as pool:
        running = pool.submit(get, identity)
        assert entered.acquire(timeout=10)
        assert get(identity) == 429  # this client's one slot is held
        other = pool.submit(get, "198.51.100.1")  # another client has its own slot
        assert entered.acquire(timeout=10)
        closed_gate.set()
        assert (running.result(), other.result()) == (200, 200)
    assert get(identity) == 200


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_async_drf_behind_the_middleware_holds_and_gives_back(closed_gate: threading.Event) -> None:
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("held-async", "route", "held-api-async")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="1/min", algorithm="concurrency")

    async def run() -> list[int]:
        client = AddressedAsyncClient("203.0.113.77")
        running = asyncio.ensure_future(client.get("/api/held-async/"))
        await _entered(1)
        during = await client.get("/api/held-async/")
        closed_gate.set()
        done = await running
        after = await client.get("/api/held-async/")
        return [done.status_code, during.status_code, int(during["Retry-After"]), after.status_code]

    assert async_to_sync(run)() == [200, 429, 1, 200]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_while_redis_is_down_failure_mode_local_holds_slots_in_the_process(
    settings: Any, closed_gate: threading.Event
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    settings.DJANGO_THROTTLE_FAILURE_MODE = "local"
    backends.reset_backend_cache()

    @own_connections
    def get(_: int) -> tuple[int, str]:
        response = Client().get("/held/")
        return response.status_code, response.get("X-RateLimit-Degraded", "")

    policy.current()  # the policy loaded here: the threads read no database
    with ThreadPoolExecutor(max_workers=3) as pool:
        running = [pool.submit(get, n) for n in range(2)]
        assert entered.acquire(timeout=10) and entered.acquire(timeout=10)
        assert get(0) == (429, "local")
        closed_gate.set()
        assert [future.result() for future in running] == [(200, "local")] * 2
    assert [get(n)[0] for n in range(3)] == [200] * 3  # given back in the process
    # This test's slots (the in-process ones); another test's stream may still be collected.
    assert [held for held in leases.keeper().held() if held.local] == []


# -- the keeper -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_keeper_renews_a_long_requests_lease(_isolated_throttle: str) -> None:
    limit = in_flight(1, "s")  # a lease of one second, renewed every third of it
    request = RequestFactory().get("/")
    assert core.check(request, limits=(limit,)).allowed
    time.sleep(2.5)  # two and a half leases
    other = RequestFactory().get("/")
    assert not core.check(other, limits=(limit,)).allowed  # still held
    leases.release(request)
    assert core.check(other, limits=(limit,)).allowed
    leases.release(other)
    assert leases.keeper().held() == []


@pytest.mark.django_db
def test_a_request_collected_while_holding_slots_gives_them_back(_isolated_throttle: str) -> None:
    limit = in_flight(1, "min")
    request = RequestFactory().get("/")
    assert core.check(request, limits=(limit,)).allowed
    assert not core.check(RequestFactory().get("/"), limits=(limit,)).allowed
    del request  # nothing gave the slot back: no middleware, no decorator
    gc.collect()
    deadline = time.monotonic() + 5
    while live(get_backend(), "ip:127.0.0.1", limit) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live(get_backend(), "ip:127.0.0.1", limit) == 0


@pytest.mark.django_db
def test_warning_when_a_concurrency_limit_has_no_middleware(settings: Any) -> None:
    from django.core import checks

    from django_throttle.checks import check_concurrency_middleware

    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("exports <b>", "route", "held-api")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="2/min", algorithm="concurrency")
    assert check_concurrency_middleware() == []
    settings.MIDDLEWARE = [
        m for m in settings.MIDDLEWARE if not m.endswith("RateLimitHeadersMiddleware")
    ]
    (warning,) = check_concurrency_middleware()
    assert warning.id == "django_throttle.W006" and warning.level == checks.WARNING
    assert "rule exports <b>" in warning.msg


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_the_ietf_policy_header_names_requests_in_flight(settings: Any) -> None:
    settings.DJANGO_THROTTLE_IETF_HEADERS = True
    response = Client().get("/streaming/")
    assert response["RateLimit-Policy"].endswith(';q=1;w=60;qu="concurrent-requests"')
    assert response["RateLimit"].endswith(";r=0;t=60")
    assert (response["X-RateLimit-Limit"], response["X-RateLimit-Remaining"]) == ("1", "0")
    response.close()


def test_threads_that_ask_together_share_one_fallback_limiter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first requests of an outage arrive together: were each to build its own fallback
    limiter, each would hold its own slots (and tokens), and the limit would not hold."""

    class Slow(MemoryBackend):
        def __init__(self, **kwargs: Any) -> None:
            time.sleep(0.05)
            super().__init__(**kwargs)

    monkeypatch.setattr(backends, "MemoryBackend", Slow)
    backends.reset_backend_cache()
    with ThreadPoolExecutor(max_workers=4) as pool:
        built = list(pool.map(lambda _: backends.get_local_backend(), range(4)))
    assert len({id(backend) for backend in built}) == 1


@pytest.mark.django_db(transaction=True)  # closing a response closes old DB connections
def test_an_open_stream_keeps_its_slot_after_its_request_is_collected() -> None:
    """A view called directly may drop its request while its stream still runs: the slot
    follows the stream, not the request."""

    @throttle(rate="1/min", algorithm="concurrency", scope="direct-stream")
    def export(request: HttpRequest) -> StreamingHttpResponse:
        return StreamingHttpResponse(iter([b"id\n", b"1\n"]))

    def get() -> Any:
        return export(RequestFactory().get("/", REMOTE_ADDR="203.0.113.9"))

    get().close()
    streaming = get()  # open: its slot is held until the stream is closed
    gc.collect()
    leases.keeper().renew_due()  # gives back the slots of whatever was collected
    assert get().status_code == 429
    streaming.close()
    assert get().status_code == 200


def test_a_costly_decorated_view_may_have_a_concurrency_limit() -> None:
    limited = throttle(rate="2/min", algorithm="concurrency", cost=5)(lambda request: None)
    assert callable(limited)
    with pytest.raises(ValueError, match="could never pass"):
        throttle(rate="2/min", cost=5)
