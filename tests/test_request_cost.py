"""What an attacker's choice of values costs a worker: CPU per request as a ratio to plain
requests in the same run (never wall time), queries per request (none, for the millionth
client as for the first) and the compiled store (bounded)."""

from __future__ import annotations

import base64
import gc
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext

from django_throttle.models import EndpointLimit, EndpointRule, Tier
from django_throttle.policy import live as policy
from django_throttle.request import core
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db


@pytest.fixture
def rules(monkeypatch: pytest.MonkeyPatch) -> Tier:
    """Limits no test reaches: path rules, and the seams' login rule counted by IP address
    and by username."""
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 3600)
    anonymous = tier("anonymous", "10000000/min", is_default_anonymous=True)
    tier("members", "10000000/min", is_default_authenticated=True)
    endpoint("reports", "path", "/api/reports/", limits={anonymous: "10000000/min"})
    rule = EndpointRule.objects.create(name="seam-login", pattern="seam-login", counts="failures")
    for counted_by, rate in (("ip", "10000000/min"), ("username", "10000001/min")):
        EndpointLimit.objects.create(rule=rule, tier=anonymous, rate=rate, counted_by=counted_by)
    return anonymous


def cpu(requests: int, send: Callable[[int], Any]) -> float:
    """CPU seconds per call of ``send``, the least of three runs (the others share the core)."""
    best = float("inf")
    for _ in range(3):
        gc.collect()
        start = time.process_time()
        for i in range(requests):
            send(i)
        best = min(best, (time.process_time() - start) / requests)
    return best


def heavy(char: str, count: int, end: str) -> str:
    return char * count + end


@pytest.mark.parametrize(
    ("char", "count"),
    [("\u0f75", 1000), ("\ufdfa", 1000), ("\ufdfa", 56), ("\u3353", 1000), ("\u3353", 255)],
)
def test_a_login_naming_costly_names_costs_a_few_plain_logins(
    rules: Tier, char: str, count: int
) -> None:
    """A login naming five names designed to be slow to fold (a Basic header, a JSON body's
    two fields and the form hidden in it): 1,000 U+0F75 (NFKC sorts a run of marks in time
    growing with its square) cost 70 ms, 1,000 U+FDFA (18 characters each once normalised)
    20 ms, 1,000 U+3353 8 ms, 15 to 100 plain logins. Now a few."""
    client = Client()
    plain = {"username": "bob", "password": "x"}
    body = json.dumps(
        {
            "username": heavy(char, count, "a"),
            "email": heavy(char, count, "b"),
            "x": f"&username={heavy(char, count, 'c')}&email={heavy(char, count, 'd')}&",
        }
    ).encode()
    header = "Basic " + base64.b64encode(f"{heavy(char, count, 'e')}:p".encode()).decode()
    form = "application/x-www-form-urlencoded"
    for _ in range(20):
        client.post("/seams/login/", plain)
        client.post("/seams/login/", body, content_type=form, HTTP_AUTHORIZATION=header)

    baseline = cpu(60, lambda i: client.post("/seams/login/", plain))
    costly = cpu(
        20,
        lambda i: client.post("/seams/login/", body, content_type=form, HTTP_AUTHORIZATION=header),
    )

    assert costly / baseline < 6


def test_fresh_clients_cost_no_query_and_a_bounded_store(rules: Tier, settings: Any) -> None:
    """Fresh addresses (direct and forwarded), users, API keys, usernames, paths and methods:
    no query per request, and the compiled store stops at MAX_COMPILED entries."""
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1
    factory = RequestFactory()
    users = [User(id=10_000 + i, username=f"u{i}") for i in range(1000)]

    def address(i: int) -> str:
        return f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"

    def signed_in(i: int) -> Any:
        request = factory.get("/api/ping/")
        request.user = users[i % len(users)]
        return request

    fresh: list[Callable[[int], tuple[Any, dict[str, Any]]]] = [
        lambda i: (factory.get("/api/ping/", REMOTE_ADDR=address(i)), {}),
        lambda i: (factory.get("/api/ping/", HTTP_X_FORWARDED_FOR=f"{address(i)}, 1.1.1.1"), {}),
        lambda i: (signed_in(i), {}),
        lambda i: (factory.get("/", HTTP_AUTHORIZATION=f"Api-Key dt_{i:08x}_{'s' * 40}"), {}),
        lambda i: (
            factory.post("/seams/login/", {"username": f"user{i}"}, REMOTE_ADDR=address(i)),
            {"scope": "seam-login", "credential": True},
        ),
        lambda i: (factory.get(f"/api/reports/{i}/"), {}),
        lambda i: (factory.generic(f"M{i}", "/api/ping/"), {}),
    ]
    core.check(factory.get("/api/ping/"))  # compiled
    with CaptureQueriesContext(connection) as queries:
        for make in fresh:
            for i in range(core.MAX_COMPILED // 2 + 100):
                request, options = make(i)
                core.check(request, **options)

    assert queries.captured_queries == []
    assert len(policy.current().compiled) <= core.MAX_COMPILED
