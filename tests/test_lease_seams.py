"""Seams of the request path's give-backs, on real Redis servers: what a request took is
given back exactly once, whatever ends it.

- A counting call that Redis ran but whose reply never came (a timeout, the client gone while
  the call was awaited) took a concurrency slot under a lease id only that call knew: it is
  given back by id, not held until its lease ends, refusing the client meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client
from django.urls import path

from django_throttle.backends import redis_nodes as breaker_module
from django_throttle.decorators import throttle
from tests.faultproxy import FaultProxy
from tests.redis_servers import RedisServer

CLIENT = "203.0.113.77"


@throttle(rate="1/min", algorithm="concurrency", scope="lease-seams")
def one_at_a_time(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@throttle(rate="1/min", algorithm="concurrency", scope="lease-seams-async")
async def one_at_a_time_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("one/", one_at_a_time),
    path("one-async/", one_at_a_time_async),
]


# -- a counting call whose reply never came ----------------------------------------------------


@pytest.fixture(scope="module")
def redis_process() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


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
        return async_to_sync(AsyncClient(REMOTE_ADDR=CLIENT).get)(route)
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
    proxy: FaultProxy, redis_process: RedisServer
) -> None:
    """The client went away (Django's ASGI handler cancels the view) while the counting call
    was awaited: Redis took the slot, the lease id was lost with the await."""
    assert get("/one-async/").status_code == 200
    proxy.set_mode("delay", delay=0.2)  # within the timeout: only the cancellation ends it
    sent = proxy.scripts_forwarded()

    async def gone() -> None:
        request = asyncio.ensure_future(AsyncClient(REMOTE_ADDR=CLIENT).get("/one-async/"))
        deadline = time.monotonic() + 10
        while proxy.scripts_forwarded() == sent:  # the call reached Redis: it takes the slot
            assert time.monotonic() < deadline, "the counting call never reached Redis"
            await asyncio.sleep(0.005)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request

    async_to_sync(gone)()
    proxy.set_mode("pass")
    wait_for(lambda: held_slots(redis_process) == 0, "the slot the cancelled call took given back")
    assert get("/one-async/").status_code == 200
