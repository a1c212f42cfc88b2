"""Delay instead of reject (nginx's ``limit_req`` with ``burst`` and ``delay``): a GCRA limit
with a ``delay`` reserves each admitted request's turn in the counting call and the adapter
waits for it. Known answers on both backends (a test clock), the spacing of concurrent
requests on the Redis clock, and the decorator, sync and async: requests released one
interval apart, a response saying how long it waited, the per-process cap, and a client that
goes away giving its turn back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from adrf.views import APIView as AsyncAPIView
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle import events
from django_throttle.backends.base import ArgumentRefused, Backend
from django_throttle.backends.redis import RedisBackend
from django_throttle.decorators import throttle
from django_throttle.drf import AsyncPolicyThrottle
from django_throttle.models import EndpointLimit
from django_throttle.policy import live as policy
from django_throttle.rates import DEFAULT_MAX_WAIT, Algorithm, Decision, InvalidRate, Limit
from django_throttle.request import core
from tests.clients import AddressedAsyncClient
from tests.factories import assert_turns_spaced, endpoint, own_connections, tier

T0 = 1_800_000_000.0


def paced(burst: int = 5, delay: int = 0, max_wait: float | None = None) -> Limit:
    return Limit.build(
        "paced", "2/s", burst=burst, algorithm=Algorithm.GCRA, delay=delay, max_wait=max_wait
    )


def seen(
    backend: Backend, limit: Limit, n: int, now: float = T0
) -> list[tuple[bool, float, float]]:
    decisions = [backend.hit("c", [limit], now=now) for _ in range(n)]
    return [(d.allowed, d.wait, d.retry_after) for d in decisions]


# -- the backends ---------------------------------------------------------------------------


def test_delay_0_paces_every_request_after_the_first(backend: Backend) -> None:
    # nginx: rate=2r/s burst=4 (delay=0 by default): one at once, four queued 0.5 s apart.
    assert seen(backend, paced(5), 7) == [
        (True, 0.0, 0.0),
        (True, 0.5, 0.0),
        (True, 1.0, 0.0),
        (True, 1.5, 0.0),
        (True, 2.0, 0.0),
        (False, 0.0, 0.5),  # beyond the burst: refused, nothing reserved
        (False, 0.0, 0.5),
    ]


def test_delay_n_serves_n_more_at_once_and_max_wait_caps_the_wait(backend: Backend) -> None:
    assert seen(backend, paced(5, delay=1, max_wait=1.0), 6) == [
        (True, 0.0, 0.0),
        (True, 0.0, 0.0),
        (True, 0.5, 0.0),
        (True, 1.0, 0.0),
        (False, 0.0, 0.5),  # would wait 1.5 s: refused until its wait would be 1 s
        (False, 0.0, 0.5),
    ]
    # Retry-After is honest: after it, the same request is admitted within the longest wait.
    assert backend.hit("c", [paced(5, delay=1, max_wait=1.0)], now=T0 + 0.5).wait == 1.0


@pytest.mark.parametrize(
    ("burst", "delay", "max_wait"), [(5, 0, 0.6), (5, 1, 1.0), (5, 0, None), (6, 2, 0.5)]
)
def test_remaining_is_what_the_longest_wait_still_admits(
    backend: Backend, burst: int, delay: int, max_wait: float | None
) -> None:
    """``X-RateLimit-Remaining`` counted the burst's free tokens, although a request that
    would wait longer than ``max_wait`` is refused however much of the burst is free: at 2/s,
    burst 5, no delay and a longest wait of 0.6 s the first request said 4 left, and of the
    next ones sent at once only one was admitted. Remaining is what the next requests sent
    now really get, on an allowed and on a refused decision."""
    limit = paced(burst, delay=delay, max_wait=max_wait)
    decisions = [backend.hit("c", [limit], now=T0) for _ in range(burst + 1)]
    admitted = [d.allowed for d in decisions].index(False)
    assert [d.remaining for d in decisions[:admitted]] == list(range(admitted - 1, -1, -1))
    assert decisions[admitted].remaining == 0


def test_a_delay_as_large_as_the_burst_allows_never_waits(backend: Backend) -> None:
    # nginx's nodelay: the plain GCRA's answers.
    assert seen(backend, paced(5, delay=4), 6) == [(True, 0.0, 0.0)] * 5 + [(False, 0.0, 0.5)]


def test_turns_free_up_at_the_rate(backend: Backend) -> None:
    limit = paced(3)
    seen(backend, limit, 3)  # waits 0, 0.5, 1.0
    later = backend.hit("c", [limit], now=T0 + 1.0)
    assert (later.allowed, later.wait) == (True, 0.5)  # the turn after the last one reserved


def test_a_peek_shows_the_wait_and_reserves_nothing(backend: Backend) -> None:
    limit = paced(5)
    seen(backend, limit, 2)
    for _ in range(3):
        assert backend.peek("c", [limit], now=T0, cost=1).wait == 1.0
    assert backend.hit("c", [limit], now=T0).wait == 1.0


def test_a_refund_gives_the_turn_back(backend: Backend) -> None:
    limit = paced(5)
    seen(backend, limit, 3)  # the third waits 1.0 s
    backend.refund("c", [limit], 1, now=T0)  # the third went away
    assert backend.hit("c", [limit], now=T0).wait == 1.0  # its turn is the next one's


def test_with_other_limits_the_longest_wait_counts(backend: Backend) -> None:
    slower = Limit.build("slower", "1/s", burst=4, algorithm=Algorithm.GCRA, delay=0)
    both = [paced(5), slower]
    waits = [backend.hit("c", both, now=T0).wait for _ in range(3)]
    assert waits == [0.0, 1.0, 2.0]


def test_without_a_longest_wait_no_request_waits_beyond_the_default(backend: Backend) -> None:
    """A delaying limit of 1/h with a burst of 10 and no ``max_wait`` made its second request
    wait an hour (what the burst implies), holding a thread until gunicorn killed the worker or
    nginx answered 504, the turn taken. Unset, the longest wait is at most
    ``DEFAULT_MAX_WAIT``: the request is refused with the time after which its wait is within
    it, and a retry then waits that long."""
    limit = Limit.build("slow", "1/h", burst=10, algorithm=Algorithm.GCRA, delay=0)
    assert limit.max_wait_us == DEFAULT_MAX_WAIT * 1_000_000
    assert seen(backend, limit, 2) == [(True, 0.0, 0.0), (False, 0.0, 3600.0 - DEFAULT_MAX_WAIT)]
    retry = backend.hit("c", [limit], now=T0 + 3600 - DEFAULT_MAX_WAIT)
    assert (retry.allowed, retry.wait) == (True, DEFAULT_MAX_WAIT)
    # A burst whose waits are all shorter keeps them; an explicit max_wait is what it says.
    assert paced(5).max_wait_us == 2_500_000
    assert (
        Limit.build(
            "x", "1/h", burst=10, algorithm=Algorithm.GCRA, delay=0, max_wait=7200
        ).max_wait_us
        == 7_200_000_000
    )


def test_a_request_costing_more_than_the_longest_wait_admits_passes_when_the_bucket_is_full(
    backend: Backend,
) -> None:
    """At 1/s, burst 10, no delay and a longest wait of 3 s, a request costing 8 waits 7 s for
    its last token's turn even with the bucket full: it was refused forever, each time with
    ``Retry-After: 4`` (when its wait would be within 3 s, which never came). It waits for
    the turn of the last of its tokens the longest wait admits and is charged its whole cost,
    as a cost above the capacity is charged the capacity: it passes when the bucket is full
    rather than never, and a retry after its ``Retry-After`` passes, not one sooner."""
    limit = Limit.build("costly", "1/s", burst=10, algorithm=Algorithm.GCRA, delay=0, max_wait=3)
    first = backend.hit("c", [limit], cost=8, now=T0)
    assert (first.allowed, first.wait, first.remaining) == (True, 3.0, 0)
    refused = backend.hit("c", [limit], cost=8, now=T0)
    assert (refused.allowed, refused.retry_after) == (False, 8.0)  # the 8 tokens come back
    assert not backend.peek("c", [limit], cost=8, now=T0 + 8 - 1e-6).allowed
    retry = backend.hit("c", [limit], cost=8, now=T0 + 8)
    assert (retry.allowed, retry.wait) == (True, 3.0)
    # Its whole cost was charged: a request of cost 1 sent with it waits for its turn after
    # all 8 tokens (the ninth turn, 8 s on), beyond the longest wait.
    assert backend.peek("c", [limit], cost=1, now=T0 + 8).retry_after == 5.0


def test_delay_is_refused_where_it_does_not_apply() -> None:
    with pytest.raises(InvalidRate, match="only a GCRA limit delays") as refused:
        Limit.build("x", "2/s", burst=5, algorithm=Algorithm.TOKEN_BUCKET, delay=1)
    assert refused.value.field == "delay"
    with pytest.raises(InvalidRate, match="between 0 and the burst less one"):
        paced(5, delay=5)
    with pytest.raises(InvalidRate, match="longest wait") as refused:
        paced(5, max_wait=0)
    assert refused.value.field == "max_wait"
    with pytest.raises(ValueError, match=r"throttle\(rate='2/s', delay=1\)"):
        throttle(rate="2/s", delay=1)
    with pytest.raises(TypeError, match="give rate="):
        throttle(scope="x", delay=1)


def test_the_script_refuses_a_bad_pacing(_isolated_throttle: str) -> None:
    backend = RedisBackend()
    call = backend._request("c", [paced(5)], 1, None, None)
    spec = call.args[2]
    assert spec == b"g5:5e5:1:25e5"  # at once 1 (delay 0 + 1), longest wait the burst's
    for bad, message in ((b"g5:5e5:0:1", "served at once"), (b"g5:5e5:1:0", "longest wait")):
        with pytest.raises(ArgumentRefused, match=message):
            backend._route.call(call._replace(args=(call.args[0], call.args[1], bad)))
    backend.close()


def test_concurrent_requests_are_spaced_one_interval_apart_on_the_redis_clock(
    redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    """Eight requests decided at once get turns exactly one interval apart on the Redis clock,
    and each is released at its turn (``assert_turns_spaced`` says how, whatever the load)."""
    backend = RedisBackend()
    limit = paced(8)

    def clock() -> float:
        seconds, micros = redis_client.time()
        return seconds + micros / 1e6

    assert_turns_spaced(lambda: backend.hit("c", [limit]), clock, count=8, interval=0.5)
    backend.close()


# -- the decorator ----------------------------------------------------------------------------

entered: list[float] = []
_entered_lock = threading.Lock()


def _now() -> float:
    from django_throttle.backends import get_backend

    seconds, micros = get_backend().client.time()  # type: ignore[attr-defined]
    return float(seconds) + micros / 1e6


@throttle(rate="2/s", algorithm="gcra", burst=4, delay=0)
def paced_view(request: HttpRequest) -> HttpResponse:
    with _entered_lock:
        entered.append(_now())
    return JsonResponse({"ok": True})


@throttle(rate="2/s", algorithm="gcra", burst=4, delay=0, scope="paced-async")
async def paced_view_async(request: HttpRequest) -> HttpResponse:
    entered.append(time.monotonic())
    return JsonResponse({"ok": True})


@throttle(rate="1/m", algorithm="gcra", burst=4, delay=0, max_wait=300, scope="slow")
def slow_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


@throttle(rate="1/m", algorithm="gcra", burst=4, delay=0, max_wait=300, scope="slow-async")
async def slow_view_async(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


@throttle(rate="2/s", algorithm="gcra", burst=4, delay=0, scope="served")
def served_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


@throttle(rate="2/s", algorithm="gcra", burst=4, delay=0, scope="served-async")
async def served_view_async(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


class PacedApi(APIView):
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        with _entered_lock:
            entered.append(_now())
        return Response({"ok": True})


class PacedAsyncApi(AsyncAPIView):  # type: ignore[misc]
    permission_classes = [AllowAny]
    throttle_classes = [AsyncPolicyThrottle]

    async def get(self, request: Request) -> Response:
        entered.append(time.monotonic())
        return Response({"ok": True})


urlpatterns = [
    path("api/paced/", PacedApi.as_view(), name="paced-api"),
    path("api/paced-async/", PacedAsyncApi.as_view(), name="paced-api-async"),
    path("paced/", paced_view),
    path("paced-async/", paced_view_async),
    path("slow/", slow_view),
    path("slow-async/", slow_view_async),
    path("served/", served_view),
    path("served-async/", served_view_async),
]


@pytest.fixture
def clear_entered() -> None:
    entered.clear()


def assert_paced(times: list[float], count: int, interval: float = 0.5) -> None:
    """``count`` entries on the schedule origin + k x interval, each at most a quarter second
    late: a thread or task woken on a loaded two-core machine can be late (CI saw 0.1 s), never
    early, so each entry is measured against the schedule through the least late one rather
    than against its neighbour."""
    assert len(times) == count, times
    offsets = [at - interval * k for k, at in enumerate(sorted(times))]
    origin = min(offsets)
    assert all(offset - origin <= 0.25 for offset in offsets), [at - origin for at in offsets]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_sync_view_is_entered_one_interval_apart(clear_entered: None) -> None:
    start = threading.Barrier(5)

    @own_connections
    def get(_: int) -> tuple[int, str]:
        start.wait()
        response = Client(REMOTE_ADDR="203.0.113.5").get("/paced/")
        return response.status_code, response.get("X-RateLimit-Delayed", "")

    policy.current()  # the policy loaded here: the threads read no database
    with ThreadPoolExecutor(max_workers=5) as pool:
        answers = list(pool.map(get, range(5)))
    assert sorted(status for status, _ in answers) == [200, 200, 200, 200, 429]
    delayed = sorted(float(header) for status, header in answers if status == 200 and header)
    assert len(delayed) == 3 and all(0 < wait <= 1.5 for wait in delayed)
    assert_paced(entered, 4)


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_async_views_await_their_turn(clear_entered: None) -> None:
    async def run() -> list[int]:
        client = AddressedAsyncClient("203.0.113.6")
        responses = await asyncio.gather(*(client.get("/paced-async/") for _ in range(3)))
        return sorted(response.status_code for response in responses)

    began = time.monotonic()
    assert async_to_sync(run)() == [200, 200, 200]
    assert time.monotonic() - began >= 0.95  # the third waited for its turn at 1 s
    assert_paced(entered, 3)


class NotedPlaces(threading.BoundedSemaphore):
    """The process's places for waiting requests (``core._waiting`` / ``core._awaiting``),
    saying when one is taken (``taken``); with ``held`` cleared, a request that took one
    keeps it once its wait is over until the test sets ``held``, so "while it waits" is
    a fact the test arranges, not a race against the sleep."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.taken = threading.Event()
        self.held = threading.Event()
        self.held.set()

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        got = super().acquire(blocking, timeout)
        if got:
            self.taken.set()
        return got

    def release(self, n: int = 1) -> None:
        assert self.held.wait(timeout=60), "the test never let the waiting request go"
        super().release(n)


@pytest.fixture
def decided() -> Iterator[list[tuple[float, float]]]:
    """For each request decided: (its wait, a reading of the server's clock taken just after
    the decision), as ``events.request_decided`` announces it, before any wait."""
    found: list[tuple[float, float]] = []

    def on_decided(sender: object, decision: Decision, **kwargs: object) -> None:
        found.append((decision.wait, _now()))

    events.request_decided.connect(on_decided)
    yield found
    events.request_decided.disconnect(on_decided)


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_client_gone_while_waiting_gives_its_turn_back(
    monkeypatch: pytest.MonkeyPatch, clear_entered: None, decided: list[tuple[float, float]]
) -> None:
    places = NotedPlaces(core.MAX_AWAITING)
    monkeypatch.setattr(core, "_awaiting", places)
    sent: list[float] = []  # the server's clock read just before each request was sent

    async def run() -> int:
        client = AddressedAsyncClient("203.0.113.7")
        sent.append(_now())
        await client.get("/paced-async/")  # served at once
        sent.append(_now())
        waiting = asyncio.ensure_future(client.get("/paced-async/"))  # its turn: 0.5 s later
        while not places.taken.is_set():  # it waits for its turn now (however late it got there)
            await asyncio.sleep(0.01)
        waiting.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await waiting
        sent.append(_now())
        response = await client.get("/paced-async/")
        return response.status_code

    assert async_to_sync(run)() == 200
    # On the server's clock, whatever the load: each decision happened between the reading
    # before its request and the one just after it, so each turn (decision + wait) lies in a
    # known bracket. The second's turn is 0.5 s after the first's decision; cancelled, it
    # goes to the third, which would otherwise have had the next one, 1 s after the first.
    # One instant of the first's decision must fit them all (to the clock's microsecond).
    (first_wait, first_at), (second_wait, second_at), (third_wait, third_at) = decided
    assert first_wait == 0 and second_wait > 0
    origin = [(sent[0], first_at), (sent[1] + second_wait - 0.5, second_at + second_wait - 0.5)]
    if third_wait:
        origin.append((sent[2] + third_wait - 0.5, third_at + third_wait - 0.5))
    else:  # decided after the given-back turn: not before 0.5 s after the first
        assert third_at >= sent[0] + 0.5 - 2e-6, (decided, sent)
    assert max(lo for lo, _ in origin) <= min(hi for _, hi in origin) + 2e-6, (decided, sent)


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_beyond_the_cap_of_waiting_requests_a_request_is_refused_at_once(
    monkeypatch: pytest.MonkeyPatch, clear_entered: None
) -> None:
    places = NotedPlaces(1)
    places.held.clear()  # the waiting request keeps its place until the refusal was seen
    monkeypatch.setattr(core, "_waiting", places)
    client = Client(REMOTE_ADDR="203.0.113.8")
    assert client.get("/paced/").status_code == 200  # at once
    policy.current()  # the policy loaded here: the threads read no database
    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(
            own_connections(client.get), "/paced/"
        )  # waits 0.5 s, holding the one place
        try:
            assert places.taken.wait(timeout=30)
            refused = Client(REMOTE_ADDR="203.0.113.8").get("/paced/")
        finally:
            places.held.set()
        assert refused.status_code == 429
        assert refused["Retry-After"] == "1"  # the wait it would have had (1 s), rounded up
        assert waiting.result().status_code == 200
    # The refused request gave its turn back: the next one waits for the second's successor
    # (at most 0.5 s: less, or not at all, the later it comes).
    answered = Client(REMOTE_ADDR="203.0.113.8").get("/paced/")
    assert answered.status_code == 200
    assert float(answered.get("X-RateLimit-Delayed", "0")) <= 0.5


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_request_refused_by_the_cap_shows_the_limit_as_it_gave_it_back(
    monkeypatch: pytest.MonkeyPatch, settings: object, asynchronous: bool
) -> None:
    """A request refused because the process's places for waiting requests were all taken
    gives back what it took; its headers said what held before: 1 per minute, burst 4, the
    first request served at once left 3, and the refused second said 2 left and 120 s to
    reset, as if it had kept its turn. They say what holds once it was given back: the
    first's 3 and 60 s (Retry-After is still the wait it would have had)."""
    settings.DJANGO_THROTTLE_IETF_HEADERS = True  # type: ignore[attr-defined]
    places = threading.BoundedSemaphore(1)
    places.acquire()  # every place taken: a request that would wait is refused at once
    monkeypatch.setattr(core, "_awaiting" if asynchronous else "_waiting", places)
    route = "/slow-async/" if asynchronous else "/slow/"

    async def two() -> list[HttpResponse]:
        client = AddressedAsyncClient("203.0.113.9")
        return [await client.get(route), await client.get(route)]

    if asynchronous:
        first, refused = async_to_sync(two)()
    else:
        client = Client(REMOTE_ADDR="203.0.113.9")
        first, refused = client.get(route), client.get(route)
    assert (first.status_code, first["X-RateLimit-Remaining"]) == (200, "3")
    assert refused.status_code == 429
    assert refused["Retry-After"] == "60"  # the wait it would have had
    assert refused["X-RateLimit-Remaining"] == "3"
    assert refused["X-RateLimit-Reset"] == "60"
    assert refused["RateLimit"].endswith(";r=3;t=60")


def paced_rule(route: str) -> None:
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint(route, "route", route)
    EndpointLimit.objects.create(
        rule=rule, tier=anonymous, rate="2/s", burst=3, algorithm="gcra", delay=0
    )


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_drf_views_under_an_admin_rule_are_entered_one_interval_apart(clear_entered: None) -> None:
    paced_rule("paced-api")
    start = threading.Barrier(4)

    @own_connections
    def get(_: int) -> tuple[int, str]:
        start.wait()
        response = Client(REMOTE_ADDR="2001:db8::5").get("/api/paced/")
        return response.status_code, response.get("X-RateLimit-Delayed", "")

    policy.current()  # the policy loaded here: the threads read no database
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(get, range(4)))
    assert sorted(status for status, _ in answers) == [200, 200, 200, 429]
    assert len([header for status, header in answers if status == 200 and header]) == 2
    assert_paced(entered, 3)


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_async_drf_views_await_their_turn(clear_entered: None) -> None:
    paced_rule("paced-api-async")

    async def run() -> list[int]:
        client = AddressedAsyncClient("203.0.113.66")
        responses = await asyncio.gather(*(client.get("/api/paced-async/") for _ in range(3)))
        return sorted(response.status_code for response in responses)

    assert async_to_sync(run)() == [200, 200, 200]
    assert_paced(entered, 3)


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", ["/paced/", "/paced-async/"], ids=["sync", "async"])
def test_a_delayed_response_says_when_the_limit_is_full_again_from_when_it_is_sent(
    clear_entered: None, route: str
) -> None:
    """``X-RateLimit-Reset`` was worked out when the request was decided, not when it was
    served: a request that waited its turn said the limit would be full its wait later than
    it would. Each of three sent at once is served one interval (0.5 s) after the one
    before, so the limit is full again 0.5 s after each is served: ``1`` for each."""
    policy.current()  # the policy loaded here: the threads read no database
    if route == "/paced-async/":

        async def run() -> list[Any]:
            client = AddressedAsyncClient("203.0.113.8")
            return list(await asyncio.gather(*(client.get(route) for _ in range(3))))

        responses = async_to_sync(run)()
    else:
        start = threading.Barrier(3)

        @own_connections
        def get(_: int) -> Any:
            start.wait()
            return Client(REMOTE_ADDR="203.0.113.8").get(route)

        with ThreadPoolExecutor(max_workers=3) as pool:
            responses = list(pool.map(get, range(3)))
    assert [response.status_code for response in responses] == [200, 200, 200]
    waits = sorted(float(response.get("X-RateLimit-Delayed", "0")) for response in responses)
    assert waits[0] == 0 and waits[2] > 0.5  # the third waited for its turn at 1 s
    assert [response["X-RateLimit-Reset"] for response in responses] == ["1", "1", "1"]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", ["/served/", "/served-async/"], ids=["sync", "async"])
def test_a_delayed_response_says_what_remains_when_it_is_sent(backend: Backend, route: str) -> None:
    """``X-RateLimit-Remaining`` was worked out when the request was decided, not when it
    was served, while ``X-RateLimit-Reset`` is said from when it is sent: at 2/s, burst 4,
    no delay, a second request sent right after the first waited 0.5 s for its turn and said
    2 left, though by then the limit had earned a token back and 3 sent at once were
    admitted (a fourth refused). It says 3, and a full limit half a second away."""
    policy.current()  # the policy loaded here: the threads read no database
    client = AddressedAsyncClient("203.0.113.10")

    async def one() -> Any:
        return await client.get(route)

    async def burst() -> list[int]:
        responses = await asyncio.gather(*(client.get(route) for _ in range(4)))
        return sorted(response.status_code for response in responses)

    start = threading.Barrier(4)

    @own_connections
    def get(_: int) -> int:
        start.wait()
        return int(Client(REMOTE_ADDR="203.0.113.10").get(route).status_code)

    if route == "/served/":
        sync_client = Client(REMOTE_ADDR="203.0.113.10")
        first, second = sync_client.get(route), sync_client.get(route)
    else:
        first, second = async_to_sync(one)(), async_to_sync(one)()
    assert (first.status_code, first["X-RateLimit-Remaining"]) == (200, "3")
    # Its turn is 0.5 s after the first's: it waits what is left of that once it is decided
    # (a loaded machine sent it 0.36 s after the first: it waited 0.14 s; one that sent it
    # half a second or more after the first found its turn come and sent it at once).
    assert second.status_code == 200
    assert 0 <= float(second.headers.get("X-RateLimit-Delayed", "0")) <= 0.5
    assert (second["X-RateLimit-Remaining"], second["X-RateLimit-Reset"]) == ("3", "1")
    began = time.monotonic()  # 3 left as the second was sent, a token back each 0.5 s
    if route == "/served/":
        with ThreadPoolExecutor(max_workers=4) as pool:
            statuses = sorted(pool.map(get, range(4)))
    else:
        statuses = async_to_sync(burst)()
    earned = int((time.monotonic() - began) / 0.5)
    if earned == 0:
        assert statuses == [200, 200, 200, 429]  # what the following requests get
    else:  # a loaded machine spread the four over a refill (AsyncClient serialises its
        # requests' sync parts on one thread): what they get is what remained then
        assert statuses.count(200) in range(3, 4 + earned), statuses


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("full", ["_waiting", "_awaiting"])
def test_an_adrf_view_waits_in_a_place_of_the_blocking_views(
    monkeypatch: pytest.MonkeyPatch, clear_entered: None, full: str
) -> None:
    """adrf awaits ``AsyncPolicyThrottle`` from a worker thread that stays blocked for the
    whole wait, so its waits take the blocking views' places (``MAX_WAITING``, which bound
    the threads a process holds asleep), not the async views' 1,000: a burst of adrf
    requests could hold a thousand threads of one process."""
    paced_rule("paced-api-async")
    places = threading.BoundedSemaphore(1)
    places.acquire()  # the one place taken
    monkeypatch.setattr(core, full, places)

    async def run() -> list[int]:
        client = AddressedAsyncClient("203.0.113.67")
        return [(await client.get("/api/paced-async/")).status_code for _ in range(2)]

    assert async_to_sync(run)() == ([200, 429] if full == "_waiting" else [200, 200])
