"""Delayed requests in usage: the dashboard, ``throttle_usage`` and the rollup say how many
requests a delaying limit served late and how long they waited (tier and endpoint totals),
counted once the wait is over, on both backends, through sync and async DRF views behind the
real middleware stack."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from adrf.views import APIView as AsyncAPIView
from asgiref.sync import async_to_sync
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.test import AsyncClient, Client
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.backends import get_backend
from django_throttle.drf import AsyncPolicyThrottle
from django_throttle.models import EndpointLimit, UsageCount
from django_throttle.request import core
from django_throttle.usage import accounting as usage
from tests.factories import endpoint, tier
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
    """4/s for the anonymous tier, one at once, the next four paced 0.25 s apart: requests
    sent one after the other each wait for their turn as long as each takes less than a
    quarter second, a wide margin on a loaded machine."""
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


def mean_wait(answers: list[Any]) -> float:
    """The mean of the waits the responses announced (``X-RateLimit-Delayed``, what each
    request's decision reserved), which the usage counts must report whatever the load."""
    waits = [float(a["X-RateLimit-Delayed"]) for a in answers if a.get("X-RateLimit-Delayed")]
    return sum(waits) / len(waits)


def assert_delays(found: dict[str, Any], delayed: int, waited: float) -> None:
    """``delayed`` requests waited, ``waited`` seconds on average (the responses' own
    account, to the millisecond each is counted in), at most one interval each (sequential
    requests: each its own turn)."""
    assert found["allowed"] == 4 and found["delayed"] == delayed, found
    assert abs(found["mean_wait_s"] - waited) <= 0.0015, (found, waited)
    assert 0 < found["mean_wait_s"] <= 0.25, found


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_delays_of_sync_views_reach_the_report_and_the_dashboard(backend: Any) -> None:
    paced_rule("paced")
    client = Client(REMOTE_ADDR="203.0.113.40")
    answers = [client.get("/api/paced/") for _ in range(4)]
    assert [a.status_code for a in answers] == [200] * 4
    assert [bool(a.get("X-RateLimit-Delayed")) for a in answers] == [False, True, True, True]

    waited = mean_wait(answers)
    assert_delays(by_endpoint()["paced"], delayed=3, waited=waited)
    assert by_endpoint()["paced"]["total"] == 4  # the waits are no requests of their own
    table = run("--by", "tier")
    assert "Delayed" in table and "Mean wait (s)" in table, table
    anonymous = next(line for line in table.splitlines() if "anonymous" in line)
    assert [cell.strip() for cell in anonymous.split("│")[1:-1]][-2] == "3"

    operator(client)
    html = client.get(DASHBOARD).content.decode()
    assert re.search(r'data-outcome="delayed">3</strong>', html), html
    mean = float(re.search(r"<span data-mean-wait>([\d.]+)</span>", html)[1])  # type: ignore[index]
    assert abs(mean - waited) <= 0.007, (mean, waited)  # shown to 2 decimals
    assert "3 delayed, mean wait" in html  # the tier's and the endpoint's charts
    assert re.search(r'data-title="paced"[^>]*data-delayed="3"', html)


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_delays_of_async_views_are_counted_too(backend: Any) -> None:
    paced_rule("paced-async")

    async def run_requests() -> list[Any]:
        client = AsyncClient(REMOTE_ADDR="203.0.113.41")
        return [await client.get("/api/paced-async/") for _ in range(4)]

    answers = async_to_sync(run_requests)()
    assert [a.status_code for a in answers] == [200] * 4
    assert [bool(a.get("X-RateLimit-Delayed")) for a in answers] == [False, True, True, True]
    assert_delays(by_endpoint()["paced-async"], delayed=3, waited=mean_wait(answers))


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
