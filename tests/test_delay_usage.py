"""Delayed requests in usage: the dashboard, ``throttle_usage`` and the rollup say how many
requests a delaying limit served late and how long they waited (tier and endpoint totals),
counted once the wait is over, on both backends, through sync and async DRF views behind the
real middleware stack."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from adrf.views import APIView as AsyncAPIView
from asgiref.sync import async_to_sync
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.backends import get_backend
from django_throttle.drf import AsyncPolicyThrottle
from django_throttle.models import EndpointLimit, UsageCount
from django_throttle.policy import live as policy
from django_throttle.request import core
from django_throttle.usage import accounting as usage
from tests.clients import AddressedAsyncClient
from tests.factories import endpoint, own_connections, tier
from tests.test_usage import run

DASHBOARD = "/admin/django_throttle/usagecount/dashboard/"


class PacedApi(APIView):
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        return Response({"ok": True})


class PacedAsyncApi(AsyncAPIView):  # type: ignore[misc]
    permission_classes = [AllowAny]
    throttle_classes = [AsyncPolicyThrottle]

    async def get(self, request: Request) -> Response:
        return Response({"ok": True})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/paced/", PacedApi.as_view(), name="paced"),
    path("api/paced-async/", PacedAsyncApi.as_view(), name="paced-async"),
]


def paced_rule(route: str) -> None:
    """4/s for the anonymous tier, one at once, the next four paced 0.25 s apart."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint(route, "route", route)
    EndpointLimit.objects.create(
        rule=rule, tier=anonymous, rate="4/s", burst=5, algorithm="gcra", delay=0
    )


def operator(client: Any) -> None:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_usagecount"))
    client.force_login(user)


def by_endpoint() -> dict[str, dict[str, Any]]:
    rows = json.loads(run("--by", "endpoint", "--format", "json"))
    return {row["endpoint"]: row for row in rows}


def delays(answers: list[Any]) -> list[float]:
    """The waits the responses announced (``X-RateLimit-Delayed``: what each request's
    decision reserved), which the usage counts must report whatever the load. Four requests
    sent at once: the first is served at once, the others get the next turns (0.25, 0.5 and
    0.75 s away); one decided a whole interval late on a loaded machine waits less, or not
    at all, and is no delayed request: the counts follow the responses."""
    assert [a.status_code for a in answers] == [200] * 4
    waits = [float(a["X-RateLimit-Delayed"]) for a in answers if a.get("X-RateLimit-Delayed")]
    assert 1 <= len(waits) <= 3 and all(0 < wait <= 0.75 for wait in waits), waits
    return waits


def assert_delays(endpoint_name: str, waits: list[float]) -> None:
    """The requests that ``waits`` says waited are counted delayed, and their mean wait
    (each counted to the millisecond) reported. The process's pusher thread pushes the
    counts (at most once a second): the report is read until it has all four requests."""
    deadline = time.monotonic() + 30
    while (found := by_endpoint().get(endpoint_name, {})).get("delayed") != len(
        waits
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert found["allowed"] == 4 and found["delayed"] == len(waits), (found, waits)
    assert abs(found["mean_wait_s"] - sum(waits) / len(waits)) <= 0.0015, (found, waits)


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_delays_of_sync_views_reach_the_report_and_the_dashboard(backend: Any) -> None:
    paced_rule("paced")
    client = Client(REMOTE_ADDR="203.0.113.40")
    start = threading.Barrier(4)

    @own_connections
    def get(_: int) -> Any:
        start.wait()
        return Client(REMOTE_ADDR="203.0.113.40").get("/api/paced/")

    policy.current()  # the policy loaded here: the threads read no database
    with ThreadPoolExecutor(max_workers=4) as pool:
        waits = delays(list(pool.map(get, range(4))))

    assert_delays("paced", waits)
    n = len(waits)
    assert by_endpoint()["paced"]["total"] == 4  # the waits are no requests of their own
    table = run("--by", "tier")
    assert "Delayed" in table and "Mean wait (s)" in table, table
    anonymous = next(line for line in table.splitlines() if "anonymous" in line)
    assert [cell.strip() for cell in anonymous.split("│")[1:-1]][-2] == str(n)

    operator(client)
    html = client.get(DASHBOARD).content.decode()
    assert re.search(rf'data-outcome="delayed">{n}</strong>', html), html
    mean = float(re.search(r"<span data-mean-wait>([\d.]+)</span>", html)[1])  # type: ignore[index]
    assert abs(mean - sum(waits) / n) <= 0.007, (mean, waits)  # shown to 2 decimals
    assert f"{n} delayed, mean wait" in html  # the tier's and the endpoint's charts
    assert re.search(rf'data-title="paced"[^>]*data-delayed="{n}"', html)


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_delays_of_async_views_are_counted_too(backend: Any) -> None:
    paced_rule("paced-async")

    async def run_requests() -> list[Any]:
        client = AddressedAsyncClient("203.0.113.41")
        return list(await asyncio.gather(*(client.get("/api/paced-async/") for _ in range(4))))

    answers = async_to_sync(run_requests)()
    assert_delays("paced-async", delays(answers))


def assert_refused_turn_counted_denied(monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    """Two requests from ``address`` to the paced rule with every seat of this process's
    waiting requests taken: the first is served, the second (which would wait its turn) is
    refused, and the endpoint's usage counts it denied, never delayed."""
    paced_rule("paced")
    full = core.threading.BoundedSemaphore(1)
    full.acquire()  # every seat of this process's waiting requests taken
    monkeypatch.setattr(core, "_waiting", full)
    client = Client(REMOTE_ADDR=address)
    assert [client.get("/api/paced/").status_code for _ in range(2)] == [200, 429]
    found = by_endpoint()["paced"]
    assert (found["allowed"], found["denied"], found["delayed"]) == (1, 1, 0), found


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_request_refused_by_the_waiting_cap_is_counted_denied_not_delayed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert_refused_turn_counted_denied(monkeypatch, "203.0.113.42")


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_refused_turn_is_counted_denied_even_when_its_count_was_pushed_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The pusher thread may push the decision's "allowed" between the decision and the
    # refusal (it did on a loaded CI machine): the refusal then sends a correction.
    refuse = usage.record_refused_turn

    def pushed_first(field: str | None, client: str, *, local: bool = False) -> None:
        backend = get_backend()
        usage.get_store(backend).push_tally(backend.usage_tally)  # type: ignore[attr-defined]
        refuse(field, client, local=local)

    monkeypatch.setattr(usage, "record_refused_turn", pushed_first)
    assert_refused_turn_counted_denied(monkeypatch, "203.0.113.43")


@pytest.mark.django_db
def test_the_rollup_copies_the_delays_and_reports_read_them_back(
    monkeypatch: pytest.MonkeyPatch, admin_client: Any
) -> None:
    field = usage.field_for("pro", "export")
    ten_minutes_ago = (int(time.time()) // 60 - 10) * 60 + 30.0
    monkeypatch.setattr(usage, "_clock", lambda: ten_minutes_ago)
    # Kept in process (failure mode local, Redis down), pushed once it answers: the clock
    # that names the minute is the one patched here.
    usage.record_delay(field, 0.25, local=True)
    usage.record_delay(field, 0.5, local=True)
    usage.flush_pending()
    monkeypatch.undo()

    assert run("--rollup").startswith("Rolled up ")

    row = UsageCount.objects.get(client=UsageCount.ALL, tier="pro", endpoint="export")
    assert (row.delayed, row.waited_ms) == (2, 750)
    assert not UsageCount.objects.exclude(client=UsageCount.ALL).filter(delayed__gt=0).exists()
    found = by_endpoint()["export"]
    assert (found["delayed"], found["mean_wait_s"]) == (2, 0.375)
    assert found["total"] == 0  # a measure, no request of its own (its outcome came apart)
    listed = admin_client.get("/admin/django_throttle/usagecount/").content.decode()
    assert "2 (0.38 s) / -" in listed  # the totals list's "delayed (wait) / shed" column
