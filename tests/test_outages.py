"""Outages met by every adapter: Redis killed, hung (SIGSTOP) and restarted empty while
requests arrive through ``@throttle`` on a sync and an ``async def`` view and DRF's throttle
on a sync ``APIView`` and an adrf one, under failure modes ``local`` and ``closed``.

What must hold: no request is a 500; limiting never switches off (``local`` keeps counting
in the process, ``closed`` refuses with ``Retry-After``); and once Redis answers again the
circuit breaker closes and requests are counted on Redis again. Runs on a private
``redis-server`` of this module (never the suite's or the system's). Assertions are on
statuses and headers; waits poll with deadlines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client

from django_throttle.backends import redis_nodes as breaker_module
from django_throttle.models import EndpointLimit, EndpointRule
from django_throttle.policy import live as policy
from tests.factories import endpoint, tier
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.django_db

#: The views of rule "seam" (GET, 3/h for anonymous clients): every adapter.
VIEWS = {
    "decorator": "/seams/view/",
    "decorator-async": "/seams/view-async/",
    "drf": "/seams/api/",
    "drf-async": "/seams/api-async/",
}
#: Seconds the breaker waits before it lets one call probe: short, so recovery is quick.
COOLDOWN = 0.2
TIMEOUT = 0.3


@pytest.fixture
def server(redis_process: RedisServer, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    redis_process.ensure_healthy()
    settings.DJANGO_THROTTLE_REDIS_URL = redis_process.url
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {
        "socket_timeout": TIMEOUT,
        "socket_connect_timeout": TIMEOUT,
    }
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1
    monkeypatch.setattr(breaker_module, "COOLDOWN", COOLDOWN)
    yield redis_process
    redis_process.ensure_healthy()


def send(view: str, address: str) -> Any:
    """One GET of ``view`` from ``address``: WSGI for a sync view, ASGI for an async one."""
    url, headers = VIEWS[view], {"X-Forwarded-For": address}  # ASGI: no REMOTE_ADDR
    if view.endswith("async"):
        client = AsyncClient(raise_request_exception=False)
        return async_to_sync(client.get)(url, headers=headers)
    return Client(raise_request_exception=False).get(url, headers=headers)


def counted_on_redis(view: str, address: str) -> bool:
    """Whether a request from ``address`` was counted on Redis (neither degraded nor 503)."""
    response = send(view, address)
    return response.status_code != 503 and "X-RateLimit-Degraded" not in response


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


FAULTS = ("kill", "hang")


def inject(fault: str, server: RedisServer) -> None:
    if fault == "hang":
        server.pause()  # SIGSTOP: connections open, nothing answered
    else:
        server.kill()


def heal(fault: str, server: RedisServer) -> None:
    if fault == "hang":
        server.resume()
    else:
        server.start()  # empty: it keeps nothing on disk


@pytest.mark.parametrize("mode", ["local", "closed"])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("view", VIEWS)
def test_an_outage_never_500s_keeps_limiting_and_recovers(
    server: RedisServer, settings: Any, view: str, fault: str, mode: str
) -> None:
    settings.DJANGO_THROTTLE_FAILURE_MODE = mode
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    endpoint("seam", "scope", "seam", methods="GET", limits={anonymous: "3/h"})
    policy.reset()
    before = [send(view, "10.1.0.1") for _ in range(2)]
    assert [r.status_code for r in before] == [200, 200]
    assert [r.headers.get("X-RateLimit-Degraded") for r in before] == [None, None]

    inject(fault, server)
    try:
        during = [send(view, "10.1.0.2") for _ in range(5)]
    finally:
        heal(fault, server)
    codes = [r.status_code for r in during]
    if mode == "local":
        assert codes == [200, 200, 200, 429, 429]
        assert [r.headers.get("X-RateLimit-Degraded") for r in during] == ["local"] * 5
        assert all(int(r["Retry-After"]) > 0 for r in during[3:])
    else:
        assert codes == [503] * 5
        assert all(int(r["Retry-After"]) >= 1 for r in during)

    # The breaker closes at the first probe Redis answers: requests are counted there again.
    wait_until(
        lambda: counted_on_redis(view, "10.1.0.3"),
        "requests counted on Redis again",
    )
    assert breaker_module.get_breaker().state == "closed"
    after = [send(view, "10.1.0.4") for _ in range(4)]
    assert [r.status_code for r in after] == [200, 200, 200, 429]
    assert [r.headers.get("X-RateLimit-Degraded") for r in after] == [None] * 4
    if fault == "hang":  # Redis kept what it counted before: the first client is spent soon
        assert [send(view, "10.1.0.1").status_code for _ in range(2)] == [200, 429]


@pytest.mark.parametrize("mode", ["local", "closed"])
@pytest.mark.parametrize("view", VIEWS)
def test_redis_restarted_empty_between_requests_never_500s_and_keeps_limiting(
    server: RedisServer, settings: Any, view: str, mode: str
) -> None:
    """The pooled connections die and the new server has no script and no counter: a
    request meets its failure mode or is counted on the new server, never a 500, and the
    client is limited throughout (its counters start afresh on the new server)."""
    settings.DJANGO_THROTTLE_FAILURE_MODE = mode
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    endpoint("seam", "scope", "seam", methods="GET", limits={anonymous: "3/h"})
    policy.reset()
    assert [send(view, "10.2.0.1").status_code for _ in range(3)] == [200] * 3
    server.restart()
    codes = [send(view, "10.2.0.1").status_code for _ in range(8)]
    assert set(codes) <= ({200, 429} if mode == "local" else {200, 429, 503}), codes
    # Counted afresh on the new server, except a call that met a dead pooled connection: that
    # request was counted in the process, whose counter is its own.
    assert codes.count(200) <= 3 + 3 and codes[-2:] == [429, 429], codes
    wait_until(
        lambda: counted_on_redis(view, "10.2.0.9"),
        "requests counted on Redis again",
    )
    assert [send(view, "10.2.0.1").status_code for _ in range(4)][-1] == 429


LOGINS = {
    "protect_credentials": "/seams/login/",
    "protect_credentials-async": "/seams/login-async/",
    "decorator": "/seams/login-decorated/",
    "decorator-async": "/seams/login-decorated-async/",
}


@pytest.mark.parametrize("setting", ["open", "local"])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("login", LOGINS)
def test_an_outage_keeps_counting_failed_logins(
    server: RedisServer, settings: Any, login: str, fault: str, setting: str
) -> None:
    """Failed logins against one username from fresh addresses, Redis killed or hung: the
    username counter (3/h) holds in the process, even where the setting says ``open``."""
    settings.DJANGO_THROTTLE_FAILURE_MODE = setting
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = EndpointRule.objects.create(
        name="seam-login", pattern="seam-login", counts=EndpointRule.Counts.FAILURES
    )
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="3/h", counted_by="username")
    policy.reset()
    url = LOGINS[login]

    def attempt(n: int) -> Any:
        data = {"username": "victim", "password": "wrong"}
        headers = {"X-Forwarded-For": f"10.3.0.{n}"}
        if login.endswith("async"):
            client = AsyncClient(raise_request_exception=False)
            return async_to_sync(client.post)(url, data, headers=headers)
        return Client(raise_request_exception=False).post(url, data, headers=headers)

    inject(fault, server)
    try:
        during = [attempt(n) for n in range(1, 6)]
    finally:
        heal(fault, server)
    assert [r.status_code for r in during] == [401, 401, 401, 429, 429]
    assert [r.headers.get("X-RateLimit-Degraded") for r in during] == ["local"] * 5
    wait_until(lambda: attempt(9).headers.get("X-RateLimit-Degraded") is None, "Redis again")
