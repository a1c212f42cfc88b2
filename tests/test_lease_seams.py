"""Seams of the request path's give-backs, on real Redis servers: what a request took is
given back exactly once, whatever ends it.

- A counting call that Redis ran but whose reply never came (a timeout, the client gone while
  the call was awaited) took a concurrency slot under a lease id only that call knew: it is
  given back by id, not held until its lease ends, refusing the client meanwhile.
- Under ASGI a sync view runs on in its thread when its client goes away (Django cancels the
  request's task, but cannot stop a thread): its slot is held until the view ends, not given
  back at the hang-up, or a client that hangs up at once could run any number of them.
- Under ASGI an adrf view whose client went away while its throttle still decided (adrf runs
  authentication and throttles in a worker thread, which the cancellation cannot stop) gives
  back the slot that thread takes at once, not when the request is collected.
- A request refused because this process's places for waiting requests were taken gives back
  its tokens with its turn; under a rule counting only successes, the headers middleware does
  not give them back a second time for the 429 (another request's token).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from adrf.views import APIView as AsyncAPIView
from adrf.viewsets import ViewSet as AsyncViewSet
from asgiref.sync import async_to_sync, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.core.management import call_command
from django.core.signals import request_finished
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle import middleware
from django_throttle.backends import redis_nodes as breaker_module
from django_throttle.decorators import throttle
from django_throttle.drf import AsyncPolicyThrottle, PolicyThrottle
from django_throttle.models import EndpointLimit
from django_throttle.policy import live as policy
from django_throttle.request import core
from tests.clients import AddressedAsyncClient
from tests.factories import endpoint, tier
from tests.faultproxy import FaultProxy
from tests.redis_servers import RedisServer

CLIENT = "203.0.113.77"


@throttle(rate="1/min", algorithm="concurrency", scope="lease-seams")
def one_at_a_time(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@throttle(rate="1/min", algorithm="concurrency", scope="lease-seams-async")
async def one_at_a_time_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class SuccessesApi(APIView):
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        return Response({"ok": True})


@throttle(scope="successes")
def successes_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@throttle(scope="successes-async")
async def successes_view_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


gate = threading.Event()
entered = threading.Event()


@throttle(rate="1/min", algorithm="concurrency", scope="lease-seams-blocking")
def blocking_view(request: HttpRequest) -> HttpResponse:
    entered.set()
    gate.wait(10)
    return HttpResponse("done")


class BlockingApi(APIView):
    permission_classes = [AllowAny]
    throttle_scope = "blocking"

    def get(self, request: Request) -> Response:
        entered.set()
        gate.wait(10)
        return Response({"done": True})


class BlockingRefusingApi(APIView):
    """Answers 400 once the gate opens (a wrong one-time code, say)."""

    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []

    def get(self, request: Request) -> Response:
        entered.set()
        gate.wait(10)
        return Response({"code": "wrong"}, status=400)


#: The requests the adrf views' throttles saw, kept alive: a slot given back only when its
#: request is collected would stay held.
throttled: list[Any] = []


class SlowAuthentication(BaseAuthentication):
    """Authentication that waits for the gate: the client goes away before the throttle
    runs, while adrf's worker thread is still in ``initial()``."""

    def authenticate(self, request: Request) -> None:
        entered.set()
        gate.wait(10)


#: How many of those throttles returned (decided, and waited for any turn).
returned: list[bool] = []


class KeptAsyncThrottle(AsyncPolicyThrottle):
    async def allow_request(self, request: Request, view: Any) -> bool:  # type: ignore[override]
        throttled.append(request)
        try:
            return await super().allow_request(request, view)
        finally:
            returned.append(True)


class KeptThrottle(PolicyThrottle):
    def allow_request(self, request: Request, view: Any) -> bool:
        throttled.append(request)
        try:
            return super().allow_request(request, view)
        finally:
            returned.append(True)


class AsyncThrottledApi(AsyncAPIView):  # type: ignore[misc]
    permission_classes = [AllowAny]
    authentication_classes = [SlowAuthentication]
    throttle_classes = [KeptAsyncThrottle]

    async def get(self, request: Request) -> Response:
        return Response({"ok": True})


class ThrottledInThreadApi(AsyncAPIView):  # type: ignore[misc]
    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []
    throttle_classes = [KeptThrottle]

    async def get(self, request: Request) -> Response:
        return Response({"ok": True})


class RunningAsyncApi(AsyncAPIView):  # type: ignore[misc]
    """Runs until the test's client hangs up (it is cancelled then)."""

    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []
    throttle_classes = [AsyncPolicyThrottle]

    async def get(self, request: Request) -> Response:
        entered.set()
        await asyncio.sleep(10)
        return Response({"ok": True})


def adrf_sync_handler(base: type, throttle_class: type, status: int) -> Any:
    """An adrf view (an ``APIView``, or a ``ViewSet`` with an ``async def`` action beside)
    whose GET handler is a plain ``def``: it waits for the gate, then answers ``status``."""

    def handler(self: Any, request: Request) -> Response:
        entered.set()
        gate.wait(10)
        return Response({"status": status}, status=status)

    attributes: dict[str, Any] = {
        "permission_classes": [AllowAny],
        "authentication_classes": [],
        "throttle_classes": [throttle_class],
    }
    if base is AsyncViewSet:

        async def other(self: Any, request: Request) -> Response:
            return Response({"ok": True})

        attributes.update(answer=handler, other=other)
        return type("SyncActionViewSet", (base,), attributes).as_view({"get": "answer"})
    attributes["get"] = handler
    return type("SyncHandlerApi", (base,), attributes).as_view()


ADRF_SYNC_HANDLERS = [
    path(
        f"api/adrf-sync-handler/{shape}/{kind}/{status}/",
        adrf_sync_handler(base, throttle_class, status),
    )
    for shape, base in (("api-view", AsyncAPIView), ("viewset", AsyncViewSet))
    for kind, throttle_class in (("sync", PolicyThrottle), ("async", AsyncPolicyThrottle))
    for status in (200, 400)
]


@throttle(scope="successes-running")
async def running_view(request: HttpRequest) -> HttpResponse:
    entered.set()
    await asyncio.sleep(10)
    return HttpResponse("ok")


#: The one-time codes the reset views checked, each once its check ended (in a worker thread).
CHECKED: list[str] = []
RESET_CODE = "731904"


def consume_code(code: str) -> bool:
    """A password reset's check of its one-time code, blocking (a query, say), run with
    ``sync_to_async``: it waits for the gate, then the code is checked (and a right one used
    up), whether or not anybody still waits for the answer."""
    entered.set()
    gate.wait(10)
    CHECKED.append(code)
    return code == RESET_CODE


@csrf_exempt
@throttle(scope="reset")
async def reset_view(request: HttpRequest) -> HttpResponse:
    """``POST {code, new_password}``: 400 for a wrong code."""
    done = await sync_to_async(consume_code)(request.POST.get("code", ""))
    return HttpResponse("reset" if done else "wrong code", status=200 if done else 400)


async def reset_handler(self: Any, request: Request) -> Response:
    done = await sync_to_async(consume_code)(request.data.get("code", ""))
    return Response({"reset": done}, status=200 if done else 400)


class GateThrottle:
    """A throttle after the policy's that waits for the gate: the client goes away once
    ``PolicyThrottle`` counted, before the view's handler started."""

    def allow_request(self, request: Request, view: Any) -> bool:
        entered.set()
        gate.wait(10)
        return True

    def wait(self) -> None:
        return None


def adrf_reset(base: type, throttle_class: type, *, gated: bool = False) -> Any:
    """An adrf view (an ``APIView``, or a ``ViewSet``'s action) whose ``async def`` POST
    handler is :func:`reset_handler`."""
    attributes: dict[str, Any] = {
        "permission_classes": [AllowAny],
        "authentication_classes": [],
        "throttle_classes": [throttle_class, GateThrottle] if gated else [throttle_class],
    }
    if base is AsyncViewSet:
        attributes["reset"] = reset_handler
        return type("ResetViewSet", (base,), attributes).as_view({"post": "reset"})
    attributes["post"] = reset_handler
    return type("ResetApi", (base,), attributes).as_view()


ADRF_RESETS = [
    path(f"api/reset/{shape}/{kind}/", adrf_reset(base, throttle_class))
    for shape, base in (("api-view", AsyncAPIView), ("viewset", AsyncViewSet))
    for kind, throttle_class in (("sync", PolicyThrottle), ("async", AsyncPolicyThrottle))
]


urlpatterns = [
    *ADRF_SYNC_HANDLERS,
    *ADRF_RESETS,
    path("api/reset-gated/", adrf_reset(AsyncAPIView, PolicyThrottle, gated=True)),
    path("reset/", reset_view),
    path("api/successes-running/", RunningAsyncApi.as_view(), name="successes-running-api"),
    path("successes-running/", running_view),
    path("api/adrf-async-throttle/", AsyncThrottledApi.as_view()),
    path("api/adrf-sync-throttle/", ThrottledInThreadApi.as_view()),
    path("api/adrf-async-paced/", AsyncThrottledApi.as_view()),
    path("api/adrf-sync-paced/", ThrottledInThreadApi.as_view()),
    path("blocking/", blocking_view),
    path("api/blocking/", BlockingApi.as_view()),
    path("api/blocking-refusing/", BlockingRefusingApi.as_view()),
    path("one/", one_at_a_time),
    path("one-async/", one_at_a_time_async),
    path("api/successes/", SuccessesApi.as_view(), name="successes-api"),
    path("successes/", successes_view),
    path("successes-async/", successes_view_async),
]


# -- a counting call whose reply never came ----------------------------------------------------


@pytest.fixture
def proxy(
    redis_process: RedisServer, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FaultProxy]:
    """A proxy in front of a private server the app talks to, with short timeouts and a
    breaker that stays closed (each request meets Redis)."""
    redis_process.ensure_healthy()
    with FaultProxy(redis_process.port) as fault_proxy:
        settings.DJANGO_THROTTLE_REDIS_URL = fault_proxy.url
        settings.DJANGO_THROTTLE_REDIS_OPTIONS = {
            "socket_timeout": 0.3,
            "socket_connect_timeout": 1,
        }
        settings.DJANGO_THROTTLE_FAILURE_MODE = "open"
        monkeypatch.setattr(breaker_module, "THRESHOLD", 1000)
        yield fault_proxy
    redis_process.ensure_healthy()


def held_slots(server: RedisServer) -> int:
    """The live leases on ``server``: members of the concurrency limits' sorted sets whose
    end (their score, in microseconds) is still ahead on the server's clock."""
    client = server.client()
    try:
        seconds, micros = client.time()
        now = seconds * 1_000_000 + micros
        return sum(
            client.zcount(key, f"({now}", "+inf")
            for key in client.scan_iter(count=1000)
            if client.type(key) == b"zset"
        )
    finally:
        client.close()


def get(route: str) -> HttpResponse:
    if "async" in route:
        return async_to_sync(AddressedAsyncClient(CLIENT).get)(route)
    return Client(REMOTE_ADDR=CLIENT).get(route)


def wait_for(condition: Callable[[], bool], what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", ["/one/", "/one-async/"], ids=["sync", "async"])
def test_a_counting_call_that_timed_out_gives_its_slot_back(
    proxy: FaultProxy, redis_process: RedisServer, route: str
) -> None:
    """Redis ran the call (took the slot) but its reply came after the timeout: the request
    was served in the failure mode, and the slot was held for the whole lease (a minute),
    refusing the client's next request although it had none in flight."""
    assert get(route).status_code == 200  # the script loaded, the slot given back
    assert held_slots(redis_process) == 0
    proxy.set_mode("delay", delay=0.8)  # Redis runs each command, its reply comes too late
    served = get(route)
    assert (served.status_code, served["X-RateLimit-Degraded"]) == (200, "open")
    proxy.set_mode("pass")
    wait_for(lambda: held_slots(redis_process) == 0, "the slot the lost call took given back")
    assert get(route).status_code == 200


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_request_cancelled_while_redis_counts_gives_its_slot_back(
    proxy: FaultProxy, redis_process: RedisServer, settings: Any
) -> None:
    """The client went away (Django's ASGI handler cancels the view) while the counting call
    was awaited: Redis took the slot, the lease id was lost with the await."""
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 5, "socket_connect_timeout": 5}
    assert get("/one-async/").status_code == 200

    async def gone() -> bool:
        """Whether the cancellation reached the request while Redis held its slot: on a
        loaded machine the cancellation may land once the request is over, and Django's
        stack then answers it."""
        request = asyncio.ensure_future(AddressedAsyncClient(CLIENT).get("/one-async/"))
        # The first request of a loaded process compiles its policy before it counts (seen
        # over 0.8 s in CI's oldest pass); a slot seen late is a retry below, not a failure.
        deadline = time.monotonic() + 5
        while not held_slots(redis_process):  # Redis ran the call; its reply is held back
            assert time.monotonic() < deadline, "the counting call never took its slot"
            await asyncio.sleep(0.005)
        request.cancel()
        try:
            await request
        except asyncio.CancelledError:
            return True
        return False

    for _ in range(5):
        proxy.set_mode("delay", delay=1.0)  # within the timeout: only the cancellation ends it
        cancelled = async_to_sync(gone)()
        proxy.set_mode("pass")
        wait_for(lambda: held_slots(redis_process) == 0, "the slot the call took given back")
        if cancelled:
            break
    assert cancelled, "no request was cancelled while Redis held its slot"
    assert get("/one-async/").status_code == 200


# -- a turn refused by the cap of waiting requests, under a rule counting successes -----------


def successes_rule(match_type: str, pattern: str) -> None:
    """At most one request a minute, four queued (for up to 5 minutes); only successes count."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("successes", match_type, pattern)
    rule.counts = "success"
    rule.save()
    EndpointLimit.objects.create(
        rule=rule, tier=anonymous, rate="1/m", burst=4, algorithm="gcra", delay=0, max_wait=300
    )
    policy.reset()


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("route", "match_type", "pattern"),
    [
        ("/api/successes/", "route", "successes-api"),
        ("/successes/", "scope", "successes"),
        ("/successes-async/", "scope", "successes-async"),
    ],
    ids=["drf", "decorator", "decorator-async"],
)
def test_a_turn_refused_by_the_cap_gives_its_tokens_back_once(
    monkeypatch: pytest.MonkeyPatch, route: str, match_type: str, pattern: str
) -> None:
    """The refused request gave back its turn, and the headers middleware then gave its
    reservation back again for the 429 (not a success): another request's token. Every
    second request was then served at once, however far above its one a minute."""
    successes_rule(match_type, pattern)
    places = threading.BoundedSemaphore(1)
    places.acquire()  # every place taken: a request that would wait is refused at once
    monkeypatch.setattr(core, "_awaiting" if "async" in route else "_waiting", places)

    async def send(count: int) -> list[int]:
        client = AddressedAsyncClient("203.0.113.78")
        return [(await client.get(route)).status_code for _ in range(count)]

    if "async" in route:
        statuses = async_to_sync(send)(5)
    else:
        client = Client(REMOTE_ADDR="203.0.113.78")
        statuses = [client.get(route).status_code for _ in range(5)]
    assert statuses == [200, 429, 429, 429, 429]


# -- a sync view under ASGI whose client went away -------------------------------------------


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", ["/blocking/", "/api/blocking/"], ids=["decorator", "drf"])
def test_a_sync_view_whose_client_went_away_holds_its_slot_until_it_ends(
    proxy: FaultProxy, redis_process: RedisServer, route: str
) -> None:
    """The headers middleware gave the slot back when the task was cancelled, while the
    view still ran in its thread: the client could start another at once."""
    if route.startswith("/api/"):
        anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
        endpoint("blocking", "scope", "blocking", limits={anonymous: "1/min"})
        EndpointLimit.objects.filter(rule__name="blocking").update(algorithm="concurrency")
        policy.reset()
        policy.current()  # loaded here: the view's thread reads no database
    gate.clear()
    entered.clear()

    async def gone() -> list[int]:
        request = asyncio.ensure_future(AddressedAsyncClient(CLIENT).get(route))
        while not entered.is_set():
            await asyncio.sleep(0.01)
        request.cancel()  # the client went away; the view runs on in its thread
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(asyncio.shield(request), 0.3)
        during = await sync_to_async(held_slots, thread_sensitive=False)(redis_process)
        gate.set()  # the view ends
        with contextlib.suppress(asyncio.CancelledError):
            await request
        return [during]

    try:
        (during,) = async_to_sync(gone)()
    finally:
        gate.set()
    assert during == 1  # held while the view ran
    wait_for(lambda: held_slots(redis_process) == 0, "the slot given back once the view ended")


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("counts", "route", "kept"),
    [
        ("failures", "/api/blocking/", False),
        ("success", "/api/blocking-refusing/", False),
        ("failures", "/api/blocking-refusing/", True),
        ("success", "/api/blocking/", True),
    ],
    ids=[
        "failures-answered-200",
        "success-answered-400",
        "failures-answered-400",
        "success-answered-200",
    ],
)
def test_a_sync_drf_view_whose_client_went_away_is_settled_with_what_it_answered(
    monkeypatch: pytest.MonkeyPatch, counts: str, route: str, kept: bool
) -> None:
    """Under ASGI a sync DRF view runs on in its thread when its client hangs up; the headers
    middleware, cancelled, left its reservation counted whatever the view answered: a view
    that answered 200 under a rule counting failures refused the client's next request.
    Settled as ``@throttle`` settles a sync view (its thread ends with the view's own
    outcome): with what the view answered. Settling it as a 500 instead would give back a
    wrong one-time code whose client hung up at once: guessing without limit."""
    after = hang_up_then_ask_again(monkeypatch, route, counts)
    assert after[0]["status"] == (429 if kept else 200 if "refusing" not in route else 400)


def hang_up_then_ask_again(
    monkeypatch: pytest.MonkeyPatch, route: str, counts: str
) -> list[dict[str, Any]]:
    """Under a 1/min rule counting ``counts`` on ``route``: a client hangs up once the view
    started (its handler runs on in its thread and answers, to nobody, once the headers
    middleware saw the cancellation); what the client's next request gets."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("hung-up", "path", route, limits={anonymous: "1/min"})
    rule.counts = counts
    rule.save()
    policy.reset()
    policy.current()  # loaded here: the view's thread reads no database
    gate.clear()
    entered.clear()

    async def hung_up() -> list[dict[str, Any]]:
        gone = asyncio.Event()
        request = asyncio.ensure_future(asgi_get(route, gone))
        deadline = time.monotonic() + 5
        while not entered.is_set():
            assert time.monotonic() < deadline, "the view never started"
            await asyncio.sleep(0.005)
        gone.set()  # the client hangs up; the handler runs on in its thread
        return await request

    def runs_on(request: HttpRequest) -> bool:
        """Asked by the headers middleware once the request was cancelled."""
        gate.set()  # the handler answers, to nobody
        return runs_on_before(request)

    async def again() -> list[dict[str, Any]]:
        return await asgi_get(route, asyncio.Event())

    runs_on_before = middleware._runs_on
    monkeypatch.setattr(middleware, "_runs_on", runs_on)
    try:
        assert async_to_sync(hung_up)() == []  # nothing was answered
    finally:
        gate.set()
    return async_to_sync(again)()


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("counts", "status", "kept"),
    [
        ("failures", 200, False),
        ("success", 400, False),
        ("failures", 400, True),
        ("success", 200, True),
    ],
    ids=[
        "failures-answered-200",
        "success-answered-400",
        "failures-answered-400",
        "success-answered-200",
    ],
)
@pytest.mark.parametrize("kind", ["sync", "async"], ids=["PolicyThrottle", "AsyncPolicyThrottle"])
@pytest.mark.parametrize("shape", ["api-view", "viewset"])
def test_an_adrf_sync_handler_whose_client_went_away_is_settled_with_what_it_answered(
    monkeypatch: pytest.MonkeyPatch, counts: str, status: int, kept: bool, kind: str, shape: str
) -> None:
    """An adrf view whose handler is a plain ``def`` runs it in a worker thread, which runs
    on when the client hangs up: settled as a sync DRF view is, with what it answered. An
    ``APIView`` with only sync handlers is a sync view; a ``ViewSet`` with an ``async def``
    action beside is an async view that runs its sync action with ``sync_to_async``: it was
    settled as a cancelled async view (a 500) at the hang-up, so a wrong one-time code (400)
    under a rule counting failures was given back (guessing without limit by hanging up),
    and a success under a rule counting successes was never counted."""
    route = f"/api/adrf-sync-handler/{shape}/{kind}/{status}/"
    after = hang_up_then_ask_again(monkeypatch, route, counts)
    assert after[0]["status"] == (429 if kept else status)


# -- an adrf view whose client went away while its throttle decided ----------------------------


async def asgi_get(
    route: str, gone: asyncio.Event, form: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """``GET route`` (``POST`` of ``form``) through Django's ASGI handler, as a server calls
    it, from a client that hangs up (``http.disconnect``) once ``gone`` is set: the handler
    cancels the request."""
    body = b"" if form is None else urlencode(form).encode()
    headers = [(b"host", b"testserver")]
    if form is not None:
        headers.append((b"content-type", b"application/x-www-form-urlencoded"))
        headers.append((b"content-length", str(len(body)).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET" if form is None else "POST",
        "scheme": "http",
        "path": route,
        "raw_path": route.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": (CLIENT, 50000),
        "server": ("testserver", 80),
    }
    sent: list[dict[str, Any]] = []
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await ASGIHandler()(scope, receive, send)
    return sent


def cancelled_while_deciding(proxy: FaultProxy | None, throttle_class: str, route: str) -> None:
    """Send ``GET route`` and hang up while adrf's thread still decides: ``async``, during a
    slow authentication, before ``AsyncPolicyThrottle`` ran; ``sync``, while
    ``PolicyThrottle``'s counting call is in Redis. Returns once the throttle has run."""
    gate.clear()
    entered.clear()
    if throttle_class == "sync":
        gate.set()  # no authentication to wait for

    async def cancelled() -> list[dict[str, Any]]:
        gone = asyncio.Event()
        if proxy is not None:
            proxy.set_mode("delay", delay=1.0)  # the throttle's call waits for its reply
        request = asyncio.ensure_future(asgi_get(route, gone))
        deadline = time.monotonic() + 5
        if throttle_class == "sync":
            while not throttled:  # deciding: its counting call's reply is held back
                assert time.monotonic() < deadline, "the throttle never ran"
                await asyncio.sleep(0.005)
        else:
            while not entered.is_set():
                assert time.monotonic() < deadline, "the view never started"
                await asyncio.sleep(0.005)
        gone.set()  # the client hangs up; Django cancels the request
        return await request

    async def over(**kwargs: Any) -> None:
        gate.set()  # the request was cancelled and is over: authentication ends

    # Sent once the cancelled request is over, before Django waits for its worker thread.
    request_finished.connect(over, dispatch_uid="adrf-cancelled")
    try:
        sent = async_to_sync(cancelled)()
        assert sent == []  # nothing was answered: the request was cancelled
        wait_for(lambda: len(throttled) == 1, "the throttle ran after the cancellation")
    finally:
        request_finished.disconnect(dispatch_uid="adrf-cancelled")
        gate.set()
        if proxy is not None:
            proxy.set_mode("pass")


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("throttle_class", ["async", "sync"])
def test_an_adrf_view_cancelled_while_its_throttle_decides_gives_its_slot_back(
    proxy: FaultProxy, redis_process: RedisServer, settings: Any, throttle_class: str
) -> None:
    """adrf runs ``initial()`` (authentication, throttles) in a worker thread, which runs on
    when the client goes away: the headers middleware gave back what the request held then
    (nothing yet), and the slot the throttle took afterwards stayed held until the request
    was collected, refusing the client meanwhile. ``async``: the client left during a slow
    authentication, before ``AsyncPolicyThrottle`` ran; ``sync``: while ``PolicyThrottle``'s
    counting call was in Redis."""
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 5, "socket_connect_timeout": 5}
    route = f"/api/adrf-{throttle_class}-throttle/"
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    endpoint("adrf", "path", route, limits={anonymous: "1/min"})
    EndpointLimit.objects.filter(rule__name="adrf").update(algorithm="concurrency")
    policy.reset()
    policy.current()  # loaded here: adrf's thread reads no database
    try:
        cancelled_while_deciding(proxy if throttle_class == "sync" else None, throttle_class, route)
        # Its request is still alive (``throttled``): collecting it gives nothing back.
        wait_for(lambda: held_slots(redis_process) == 0, "the slot given back", within=3.0)
    finally:
        throttled.clear()


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("throttle_class", ["async", "sync"])
def test_an_adrf_view_cancelled_before_its_turn_gives_the_turn_back(
    proxy: FaultProxy, redis_process: RedisServer, settings: Any, throttle_class: str
) -> None:
    """A delaying limit gave the cancelled request a turn a minute away; no view would run
    for it, yet its throttle (run on in adrf's thread) waited for the turn, and the next
    request was told to wait two minutes instead of one."""
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 5, "socket_connect_timeout": 5}
    route = f"/api/adrf-{throttle_class}-paced/"
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("adrf-paced", "path", route)
    EndpointLimit.objects.create(  # one at once, two more queued a minute apart
        rule=rule, tier=anonymous, rate="1/min", burst=3, algorithm="gcra", delay=0, max_wait=300
    )
    policy.reset()
    policy.current()  # loaded here: adrf's thread reads no database

    async def first() -> list[dict[str, Any]]:
        return await asgi_get(route, asyncio.Event())

    gate.set()
    assert async_to_sync(first)()[0]["status"] == 200  # served at once
    served = time.monotonic()  # after the first's decision: its next turn is a minute on
    throttled.clear()
    returned.clear()
    try:
        cancelled_while_deciding(proxy if throttle_class == "sync" else None, throttle_class, route)
        wait_for(lambda: bool(returned), "the throttle returned, not waiting for its turn")
        out = io.StringIO()
        asked = time.monotonic()
        call_command(
            "throttle_explain", "--ip", CLIENT, "--path", route, "--format", "json", stdout=out
        )
    finally:
        throttled.clear()
        returned.clear()
    next_request = json.loads(out.getvalue())["next_request"]
    wait = float(next_request.split("waiting ")[1].split()[0])
    # The cancelled request's turn (a minute after the first), not the one after it.
    assert 0 < wait <= 60 - (asked - served) + 0.01, next_request


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("route", "match_type", "pattern"),
    [
        ("/api/successes-running/", "route", "successes-running-api"),
        ("/successes-running/", "scope", "successes-running"),
    ],
    ids=["adrf", "decorator-async"],
)
def test_an_async_view_cancelled_under_a_rule_counting_successes_is_not_one(
    route: str, match_type: str, pattern: str
) -> None:
    """An ``async def`` view cancelled while it ran (its client went away) made no
    response: ``@throttle`` gives its token back under a rule counting only successes, but
    behind the headers middleware a DRF view's token stayed taken, as if it had succeeded,
    refusing the client's next request."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("successes-running", match_type, pattern, limits={anonymous: "1/min"})
    rule.counts = "success"
    rule.save()
    policy.reset()
    entered.clear()

    async def send() -> int:
        gone = asyncio.Event()
        request = asyncio.ensure_future(asgi_get(route, gone))
        deadline = time.monotonic() + 5
        while not entered.is_set():
            assert time.monotonic() < deadline, "the view never started"
            await asyncio.sleep(0.005)
        gone.set()  # the client hangs up: Django cancels the view
        assert await request == []
        entered.clear()
        gone = asyncio.Event()
        after = asyncio.ensure_future(asgi_get(route, gone))
        while not entered.is_set() and not after.done():
            await asyncio.sleep(0.005)
        if after.done():  # refused
            return int((await after)[0]["status"])
        gone.set()  # admitted: the view runs
        await after
        return 200

    assert async_to_sync(send)() == 200


# -- an async view cancelled while it ran, under a rule counting failures ---------------------


def guess_then_hang_up(route: str, match_type: str, pattern: str, counts: str) -> int:
    """Under a 1/min rule counting ``counts``: a client posts a wrong reset code and hangs up
    while the view awaits its check (``sync_to_async``, which runs on in its worker thread
    and checks the code, to nobody); then it posts the right code. What that second request
    gets."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("reset", match_type, pattern, limits={anonymous: "1/min"})
    rule.counts = counts
    rule.save()
    policy.reset()
    policy.current()  # loaded here: adrf's thread reads no database
    gate.clear()
    entered.clear()
    CHECKED.clear()

    async def hung_up() -> list[dict[str, Any]]:
        gone = asyncio.Event()
        guess = {"code": "000000", "new_password": "attacker's"}
        request = asyncio.ensure_future(asgi_get(route, gone, guess))
        deadline = time.monotonic() + 5
        while not entered.is_set():
            assert time.monotonic() < deadline, "the view never started"
            await asyncio.sleep(0.005)
        gone.set()  # the client hangs up: Django cancels the view, the check runs on
        return await request

    async def over(**kwargs: Any) -> None:
        gate.set()  # the cancelled request is over: its check ends, answering nobody

    # Sent once the cancelled request is over, before Django waits for its worker thread.
    request_finished.connect(over, dispatch_uid="reset-hung-up")
    try:
        assert async_to_sync(hung_up)() == []  # nothing was answered
    finally:
        request_finished.disconnect(dispatch_uid="reset-hung-up")
        gate.set()
    wait_for(lambda: CHECKED == ["000000"], "the guess was checked after the hang-up")

    async def again() -> int:
        right = {"code": RESET_CODE, "new_password": "attacker's"}
        return int((await asgi_get(route, asyncio.Event(), right))[0]["status"])

    return async_to_sync(again)()


RESET_ROUTES = [
    pytest.param("/reset/", "scope", "reset", id="decorator"),
    *(
        pytest.param(f"/api/reset/{shape}/{kind}/", "path", f"/api/reset/{shape}/{kind}/", id=name)
        for shape in ("api-view", "viewset")
        for kind, name in (("sync", "PolicyThrottle"), ("async", "AsyncPolicyThrottle"))
        for name in (f"adrf-{shape}-{name}",)
    ),
]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("counts", "next_status"), [("failures", 429), ("success", 200)])
@pytest.mark.parametrize(("route", "match_type", "pattern"), RESET_ROUTES)
def test_an_async_view_cancelled_while_it_ran_is_counted_as_a_failure(
    route: str, match_type: str, pattern: str, counts: str, next_status: int
) -> None:
    """An ``async def`` view cancelled while it ran (its client hung up under ASGI) was
    settled as a 500, neither a success nor a failure, so under a rule counting failures its
    token came back, though what it awaited in a worker thread ran on: a password reset by
    one-time code checked every guess of a client that hung up at once, at no cost, and the
    right one silently reset the password (the next request, the right code, was served).
    Now settled as 499 (a client that went away), a failure: the guess keeps its token,
    through ``@throttle`` and through adrf's throttles behind the headers middleware alike.
    Under a rule counting successes it is still given back (499 is no success)."""
    assert guess_then_hang_up(route, match_type, pattern, counts) == next_status


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_an_adrf_view_cancelled_before_its_handler_started_gives_its_token_back() -> None:
    """The client went away once ``PolicyThrottle`` had counted, while a later throttle still
    decided in adrf's worker thread: the handler never ran (nothing was guessed), so under
    a rule counting failures the token is given back, not counted as a client gone (499)."""
    route = "/api/reset-gated/"
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("reset", "path", route, limits={anonymous: "1/min"})
    rule.counts = "failures"
    rule.save()
    policy.reset()
    policy.current()  # loaded here: adrf's thread reads no database
    gate.clear()
    entered.clear()
    CHECKED.clear()

    async def hung_up() -> list[dict[str, Any]]:
        gone = asyncio.Event()
        request = asyncio.ensure_future(asgi_get(route, gone, {"code": "000000"}))
        deadline = time.monotonic() + 5
        while not entered.is_set():  # the policy counted; the gate throttle waits
            assert time.monotonic() < deadline, "the throttles never ran"
            await asyncio.sleep(0.005)
        gone.set()
        return await request

    async def over(**kwargs: Any) -> None:
        gate.set()

    request_finished.connect(over, dispatch_uid="reset-gated")
    try:
        assert async_to_sync(hung_up)() == []
    finally:
        request_finished.disconnect(dispatch_uid="reset-gated")
        gate.set()
    assert CHECKED == []  # the handler never ran

    async def again() -> int:
        right = {"code": RESET_CODE}
        return int((await asgi_get(route, asyncio.Event(), right))[0]["status"])

    assert async_to_sync(again)() == 200
    assert CHECKED == [RESET_CODE]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_an_adrf_slot_taken_after_the_cancellation_goes_back_on_both_backends(
    backend: Any,
) -> None:
    """The same on the suite's Redis and on ``memory://``: the client's next request is
    served, though the cancelled request is still alive."""
    route = "/api/adrf-async-throttle/"
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    endpoint("adrf", "path", route, limits={anonymous: "1/min"})
    EndpointLimit.objects.filter(rule__name="adrf").update(algorithm="concurrency")
    policy.reset()
    policy.current()  # loaded here: adrf's thread reads no database
    try:
        cancelled_while_deciding(None, "async", route)

        async def next_request() -> int:
            return int((await asgi_get(route, asyncio.Event()))[0]["status"])

        def served() -> bool:  # the slot goes back from the keeper's thread: soon, not now
            return async_to_sync(next_request)() == 200

        wait_for(served, "the next request served", within=3.0)
    finally:
        throttled.clear()


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("counts", ["success", "failures"])
@pytest.mark.parametrize("throttle_class", ["async", "sync"])
def test_an_adrf_token_taken_after_the_cancellation_is_given_back(
    proxy: FaultProxy, settings: Any, throttle_class: str, counts: str
) -> None:
    """Under a rule counting only successes (or only failures) the adrf throttle, run on in
    its worker thread after the client went away, left its reservation on the request once
    the headers middleware had settled it: no view would run, yet the token stayed taken
    and the client's next request was refused for a minute."""
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 5, "socket_connect_timeout": 5}
    route = f"/api/adrf-{throttle_class}-throttle/"
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("adrf", "path", route, limits={anonymous: "1/min"})
    rule.counts = counts
    rule.save()
    policy.reset()
    policy.current()  # loaded here: adrf's thread reads no database
    try:
        cancelled_while_deciding(proxy if throttle_class == "sync" else None, throttle_class, route)
        wait_for(lambda: bool(returned), "the throttle returned")

        async def next_request() -> int:
            return int((await asgi_get(route, asyncio.Event()))[0]["status"])

        gate.set()
        assert async_to_sync(next_request)() == 200
    finally:
        throttled.clear()
        returned.clear()


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_release_cancelled_before_it_reached_redis_still_gives_the_slot_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The view answered; giving its slot back waited (for a pooled connection, say) when
    the client went away, so the release never reached Redis. The keeper had already
    stopped renewing the slot, and nobody else knew its lease id: it stayed taken until its
    lease ended, refusing the client for a minute."""
    from django_throttle.backends.redis import RedisBackend

    release = RedisBackend.arelease
    releasing = threading.Event()

    async def waits_first(self: RedisBackend, *args: Any, **kwargs: Any) -> int:
        releasing.set()
        await asyncio.sleep(10)  # a connection of a bounded pool, busy
        return await release(self, *args, **kwargs)

    monkeypatch.setattr(RedisBackend, "arelease", waits_first)

    async def cancelled() -> list[dict[str, Any]]:
        gone = asyncio.Event()
        request = asyncio.ensure_future(asgi_get("/one-async/", gone))
        deadline = time.monotonic() + 5
        while not releasing.is_set():
            assert time.monotonic() < deadline, "the slot was never given back"
            await asyncio.sleep(0.005)
        gone.set()  # the client hangs up while the release waits
        return await request

    async_to_sync(cancelled)()
    monkeypatch.setattr(RedisBackend, "arelease", release)

    async def next_request() -> int:
        return int((await asgi_get("/one-async/", asyncio.Event()))[0]["status"])

    def served() -> bool:  # given back from the keeper's thread: soon, not now
        return async_to_sync(next_request)() == 200

    wait_for(served, "the next request served", within=3.0)
