"""What a request refused by a concurrency limit is told: its requests in flight, not a rate.

A concurrency limit "2/min" holds two requests at a time on leases of a minute: the period is
no window a client meets. Its refusal names it "2 in flight" (never "2/min", which reads as two
a minute), says the client has too many requests in progress (never that the request is
"expected available" at some time: a slot frees when a request ends, which no clock tells),
and a browser's page says the same in words. Checked through DRF (sync, and adrf's async
view) behind the headers middleware and through ``@throttle`` (sync and ``async def``), with
requests really in flight; and on the operator tools that name the limit."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from adrf.views import APIView as AsyncAPIView
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.decorators import throttle
from django_throttle.drf import AsyncPolicyThrottle
from django_throttle.models import EndpointLimit, TierLimit
from django_throttle.policy import live as policy
from django_throttle.policy.scaling import scaled
from django_throttle.rates import Algorithm, Limit
from tests.clients import AddressedAsyncClient
from tests.factories import endpoint, own_connections, tier

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.test_concurrency_refusals"),
]

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
IN_PROGRESS = "Too many requests in progress at once. Try again in 1 second"

gate = threading.Event()
entered = threading.Semaphore(0)


def _hold() -> None:
    entered.release()
    gate.wait(10)


async def _ahold() -> None:
    entered.release()
    while not gate.is_set():
        await asyncio.sleep(0.01)


@throttle(rate="2/min", algorithm="concurrency")
def held(request: HttpRequest) -> HttpResponse:
    _hold()
    return HttpResponse("done")


@throttle(rate="2/min", algorithm="concurrency")
async def held_async(request: HttpRequest) -> HttpResponse:
    await _ahold()
    return HttpResponse("done")


class HeldApi(APIView):
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        _hold()
        return Response({"done": True})


class HeldAsyncApi(AsyncAPIView):  # type: ignore[misc]
    permission_classes = [AllowAny]
    throttle_classes = [AsyncPolicyThrottle]

    async def get(self, request: Request) -> Response:
        await _ahold()
        return Response({"done": True})


urlpatterns = [
    path("held/", held),
    path("held-async/", held_async),
    path("api/held/", HeldApi.as_view(), name="refusals-held"),
    path("api/held-async/", HeldAsyncApi.as_view(), name="refusals-held-async"),
]


@pytest.fixture
def closed_gate() -> Any:
    gate.clear()
    while entered.acquire(blocking=False):
        pass
    yield gate
    gate.set()


def in_flight_rule(route: str, *rates: str) -> None:
    """Anonymous clients: 2 requests in flight on ``route``'s rule (leases of a minute), and
    the rule's other ``rates``."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("held", "route", route)
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="2/min", algorithm="concurrency")
    for rate in rates:
        EndpointLimit.objects.create(rule=rule, tier=anonymous, rate=rate)
    policy.current()  # loaded here: the threads read no database


def third_while_two_run(url: str, address: str, **extra: Any) -> tuple[Any, Any]:
    """Two requests of ``address`` held in ``url``'s view, a third sent meanwhile; the
    third's response and one sent once the two ended."""

    @own_connections
    def get(headers: dict[str, Any]) -> Any:
        return Client(REMOTE_ADDR=address, **headers).get(url)

    with ThreadPoolExecutor(max_workers=2) as pool:
        running = [pool.submit(get, {}) for _ in range(2)]
        for _ in running:
            assert entered.acquire(timeout=10)
        third = get(extra)
        gate.set()
        assert [r.result().status_code for r in running] == [200, 200]
    return third, get({})


def assert_in_flight_refusal(response: Any, name: str) -> None:
    assert response.status_code == 429
    body = json.loads(response.content)
    assert body["limit"] == name  # not "… 2/min": that reads as two a minute
    assert body["detail"].startswith(IN_PROGRESS), body["detail"]
    assert "Expected available" not in body["detail"]
    assert body["retry_after"] == 1 and response["Retry-After"] == "1"
    assert (response["X-RateLimit-Limit"], response["X-RateLimit-Remaining"]) == ("2", "0")


def test_a_drf_refusal_for_want_of_a_slot_names_the_requests_in_flight(
    closed_gate: threading.Event,
) -> None:
    in_flight_rule("refusals-held")
    third, after = third_while_two_run("/api/held/", "203.0.113.21")
    assert_in_flight_refusal(third, "held (anonymous) 2 in flight")
    assert after.status_code == 200  # the two ended: a slot is free


def test_an_async_drf_refusal_names_the_requests_in_flight(closed_gate: threading.Event) -> None:
    in_flight_rule("refusals-held-async")

    async def run() -> tuple[Any, Any]:
        client = AddressedAsyncClient("203.0.113.22")
        running = [asyncio.ensure_future(client.get("/api/held-async/")) for _ in range(2)]
        deadline = time.monotonic() + 10
        for _ in running:
            while not entered.acquire(blocking=False):
                assert time.monotonic() < deadline, "a view never entered"
                await asyncio.sleep(0.01)
        third = await client.get("/api/held-async/")
        gate.set()
        assert [(await r).status_code for r in running] == [200, 200]
        return third, await client.get("/api/held-async/")

    third, after = async_to_sync(run)()
    assert_in_flight_refusal(third, "held (anonymous) 2 in flight")
    assert after.status_code == 200


def test_a_decorated_views_refusal_names_the_requests_in_flight(
    closed_gate: threading.Event,
) -> None:
    third, after = third_while_two_run("/held/", "203.0.113.23")
    assert_in_flight_refusal(third, "2 in flight")
    assert after.status_code == 200


def test_an_async_decorated_views_refusal_names_the_requests_in_flight(
    closed_gate: threading.Event,
) -> None:
    async def run() -> Any:
        client = AddressedAsyncClient("203.0.113.24")
        running = [asyncio.ensure_future(client.get("/held-async/")) for _ in range(2)]
        deadline = time.monotonic() + 10
        for _ in running:
            while not entered.acquire(blocking=False):
                assert time.monotonic() < deadline, "a view never entered"
                await asyncio.sleep(0.01)
        third = await client.get("/held-async/")
        gate.set()
        for r in running:
            await r
        return third

    assert_in_flight_refusal(async_to_sync(run)(), "2 in flight")


def test_a_browser_refused_a_slot_is_told_its_requests_are_in_progress(
    closed_gate: threading.Event,
) -> None:
    third, _after = third_while_two_run("/held/", "203.0.113.25", HTTP_ACCEPT=BROWSER)
    assert third.status_code == 429 and third["Content-Type"].startswith("text/html")
    page = third.content.decode()
    assert "too many requests in progress at once" in page
    assert "too many requests or attempts in a short time" not in page


def test_when_a_rate_and_the_slots_both_refuse_the_rate_is_reported(
    closed_gate: threading.Event,
) -> None:
    """Its wait is the longer: a retry after the slots' 1 s would still be refused."""
    in_flight_rule("refusals-held", "2/h")
    # The two held spent the hour's two tokens and hold both slots: the third meets both.
    third, after = third_while_two_run("/api/held/", "203.0.113.26")
    for refused in (third, after):  # after: the slots are free, the tokens are not
        assert refused.status_code == 429
        body = json.loads(refused.content)
        assert body["limit"] == "held (anonymous) 2/h"
        assert body["detail"].startswith("Request was throttled. Expected available in")
        assert refused["Retry-After"] == str(body["retry_after"]) and body["retry_after"] > 1700
        assert refused["X-RateLimit-Limit"] == "2" and refused["X-RateLimit-Reset"] == "3600"


def test_the_operator_tools_name_a_concurrency_limit_by_its_slots(db: Any) -> None:
    """The name every tool shows (explain, the inspector, the usage tools) is the row's."""
    free = tier("free", "1000/h")
    row = TierLimit.objects.create(tier=free, rate="4/min", algorithm=Algorithm.CONCURRENCY)
    rule = endpoint("exports", "scope", "exports")
    rule_row = EndpointLimit.objects.create(
        rule=rule, tier=free, rate="3/5min", algorithm=Algorithm.CONCURRENCY
    )
    assert row.to_limit().name == "free 4 in flight"
    assert rule_row.to_limit().name == "exports (free) 3 in flight"
    # A tier scaled to half keeps the name saying what it holds now.
    assert scaled(row.to_limit(), 0.5).name == "free 2 in flight"
    from django_throttle.rates import limit_text  # a rate limit's name says its rate

    rate_limit = Limit.build("x", "4/min")
    assert limit_text(rate_limit.rate, rate_limit.algorithm) == "4/min"
