"""Load shedding by criticality (issue 33): with a capacity of requests in flight set in the
admin (Service protection), every checked request also takes a slot of the fleet's capacity
in its one counting call; sheddable and default traffic may take only their share of it, so
critical traffic keeps the rest while the fleet is saturated. A shed request gets 503 with a
short Retry-After, through DRF (sync and async) and the decorator behind the real middleware
stack, and is counted as shed on the dashboard, in the usage report and in metrics."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
from adrf.views import APIView as AsyncAPIView
from asgiref.sync import async_to_sync
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.decorators import throttle
from django_throttle.drf import AsyncPolicyThrottle
from django_throttle.models import EndpointRule, Protection
from django_throttle.policy import live as policy
from django_throttle.policy.live import compile_shedding
from django_throttle.rates import FLEET, Algorithm
from tests.clients import AddressedAsyncClient
from tests.factories import endpoint, own_connections, tier
from tests.test_usage import run

gate = threading.Event()
entered = threading.Semaphore(0)


class HeldApi(APIView):
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        entered.release()
        gate.wait(10)
        return Response({"done": True})


class QuickApi(APIView):
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        return Response({"done": True})


class QuickAsyncApi(AsyncAPIView):  # type: ignore[misc]
    permission_classes = [AllowAny]
    throttle_classes = [AsyncPolicyThrottle]

    async def get(self, request: Request) -> Response:
        return Response({"done": True})


@throttle(rate="100/min")
def decorated(request: HttpRequest) -> HttpResponse:
    return HttpResponse("done")


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/report/", HeldApi.as_view(), name="report"),
    path("api/checkout/", QuickApi.as_view(), name="checkout"),
    path("api/feed/", QuickApi.as_view(), name="feed"),
    path("api/feed-async/", QuickAsyncApi.as_view(), name="feed-async"),
    path("decorated/", decorated),
]


@pytest.fixture
def closed_gate() -> Iterator[threading.Event]:
    gate.clear()
    while entered.acquire(blocking=False):
        pass
    yield gate
    gate.set()


@contextmanager
def reports_held(closed_gate: threading.Event, reports: int = 1) -> Iterator[None]:
    """While the block runs, ``reports`` requests to the report (each from a thread of its
    own) are inside the view, holding their slots; then the gate opens and every one of them
    must be served. The policy is loaded on this thread first: the threads read no database."""

    @own_connections
    def report(_: int) -> int:
        return Client(REMOTE_ADDR="203.0.113.1").get("/api/report/").status_code

    policy.current()
    with ThreadPoolExecutor(max_workers=reports) as pool:
        running = [pool.submit(report, n) for n in range(reports)]
        try:
            assert all(entered.acquire(timeout=10) for _ in range(reports))
            yield
        finally:
            closed_gate.set()
        assert [future.result() for future in running] == [200] * reports


def rules(capacity: int = 2, default: int = 50, sheddable: int = 50) -> None:
    """An anonymous tier with a generous limit; the report (sheddable, holds its slot while
    the gate is closed), feeds (sheddable), checkout (critical); the fleet's capacity."""
    anonymous = tier("anonymous", "1000/min", is_default_anonymous=True)
    for name, criticality in (
        ("report", "sheddable"),
        ("feed", "sheddable"),
        ("feed-async", "sheddable"),
        ("checkout", "critical"),
    ):
        rule = endpoint(name, "route", name, limits={anonymous: "1000/min"})
        EndpointRule.objects.filter(pk=rule.pk).update(criticality=criticality)
    Protection.objects.create(
        in_flight=capacity, default_share=default, sheddable_share=sheddable, lease=60
    )


def test_each_criticality_meets_its_share_of_one_fleet_limit() -> None:
    row = Protection(in_flight=200, default_share=90, sheddable_share=70, lease=30)
    shedding = compile_shedding(row)
    assert shedding is not None
    found = {c: (x.id, x.rate.count, x.rate.period) for c, x in shedding.fleet.items()}
    assert found == {
        "critical": (FLEET, 200, 30),
        "default": (FLEET, 180, 30),
        "sheddable": (FLEET, 140, 30),
    }
    assert all(
        limit.algorithm == Algorithm.CONCURRENCY and limit.shared
        for limit in shedding.fleet.values()
    )
    # A share's slots are rounded down, at least 1 (the shedding page's 70 % of 15 is 10).
    uneven = compile_shedding(Protection(in_flight=15, default_share=90, sheddable_share=70))
    assert uneven is not None
    assert {c: x.rate.count for c, x in uneven.fleet.items()} == {
        "critical": 15,
        "default": 13,
        "sheddable": 10,
    }
    assert compile_shedding(None) is None
    assert compile_shedding(Protection(in_flight=None)) is None
    assert compile_shedding(Protection(in_flight=5, enabled=False)) is None
    # A row written around the admin (sheddable above default) switches shedding off, logged.
    assert compile_shedding(Protection(in_flight=5, default_share=50, sheddable_share=80)) is None


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_saturated_fleet_sheds_sheddable_traffic_and_keeps_critical(
    closed_gate: threading.Event,
) -> None:
    rules(capacity=2, default=50, sheddable=50)  # sheddable and default: 1 slot; critical: 2

    with reports_held(closed_gate):  # the report holds the sheddable share
        shed = Client(REMOTE_ADDR="203.0.113.2").get("/api/feed/")
        kept = Client(REMOTE_ADDR="203.0.113.3").get("/api/checkout/")
    assert shed.status_code == 503
    assert shed["Retry-After"] == "1"
    assert shed.json()["detail"].startswith("The service is busy.")
    assert kept.status_code == 200  # critical traffic keeps the reserve
    after = Client(REMOTE_ADDR="203.0.113.2").get("/api/feed/")
    assert after.status_code == 200  # the report's slot was given back with its response

    found = {
        row["endpoint"]: row for row in json.loads(run("--by", "endpoint", "--format", "json"))
    }
    assert (found["feed"]["denied"], found["feed"]["shed"]) == (1, 1)
    assert found["checkout"]["shed"] == 0


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_async_drf_and_the_decorator_are_shed_too(closed_gate: threading.Event) -> None:
    rules(capacity=2, default=50, sheddable=50)

    async def feed() -> tuple[int, str]:
        response = await AddressedAsyncClient("2001:db8::9").get("/api/feed-async/")
        return response.status_code, response.get("Retry-After", "")

    with reports_held(closed_gate):
        shed_async = async_to_sync(feed)()
        # A decorated view matches no rule: default traffic, whose share (1) is taken too.
        shed_decorated = Client(REMOTE_ADDR="203.0.113.4").get("/decorated/")
    assert shed_async == (503, "1")
    assert shed_decorated.status_code == 503
    assert Client(REMOTE_ADDR="203.0.113.4").get("/decorated/").status_code == 200


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_the_dashboard_and_the_admin_show_shedding(admin_client: Any, closed_gate: Any) -> None:
    rules(capacity=1, default=100, sheddable=100)

    with reports_held(closed_gate):
        assert Client(REMOTE_ADDR="203.0.113.9").get("/api/feed/").status_code == 503

    html = admin_client.get("/admin/django_throttle/usagecount/dashboard/").content.decode()
    assert re.search(r'data-outcome="shed">1</strong>', html), html
    assert "1 shed (503)" in html  # the endpoint's chart heading
    # The protection row: the list goes straight to it; no second row can be added.
    listed = admin_client.get("/admin/django_throttle/protection/")
    assert listed.status_code == 302 and listed["Location"].endswith("/change/")
    assert admin_client.get("/admin/django_throttle/protection/add/").status_code == 403


@pytest.mark.django_db
def test_the_admin_names_the_field_of_a_bad_share(admin_client: Any) -> None:
    response = admin_client.post(
        "/admin/django_throttle/protection/add/",
        {
            "enabled": "on",
            "in_flight": "100",
            "default_share": "60",
            "sheddable_share": "80",
            "lease": "60",
        },
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "sheddable_share" in errors and "cannot exceed the default share" in str(errors)
    response = admin_client.post(
        "/admin/django_throttle/protection/add/",
        {
            "enabled": "on",
            "in_flight": "0",
            "default_share": "101",
            "sheddable_share": "50",
            "lease": "0",
        },
    )
    errors = response.context["adminform"].form.errors
    assert set(errors) == {"in_flight", "default_share", "lease"}
    assert not Protection.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_share_below_one_is_one_error_on_its_own_field(admin_client: Any, value: str) -> None:
    """-1 was answered "at least 0" (the column type's bound, which 0 breaks as well), and a
    default share of 0 or -1 also blamed the sheddable share for exceeding it: one mistake
    is one message, on its field, with the real bound."""
    response = admin_client.post(
        "/admin/django_throttle/protection/add/",
        {"enabled": "on", "default_share": value, "sheddable_share": "70", "lease": "60"},
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors == {"default_share": ["A share is at least 1%."]}
    assert not Protection.objects.exists()


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_an_edit_of_the_protection_reaches_the_request_path() -> None:
    rules(capacity=1, default=100, sheddable=100)
    assert policy.current().shedding is not None
    Protection.objects.update(enabled=False)
    Protection.objects.first().save()  # a save bumps the policy version (the admin saves)
    policy.invalidate()
    assert policy.current().shedding is None
    assert Client(REMOTE_ADDR="203.0.113.9").get("/api/feed/").status_code == 200


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_shed_requests_count_in_metrics(settings: Any, closed_gate: Any) -> None:
    from prometheus_client import REGISTRY

    from django_throttle import metrics

    settings.DJANGO_THROTTLE_METRICS = True
    assert metrics.connect()
    rules(capacity=1, default=100, sheddable=100)
    labels = {"tier": "anonymous", "endpoint": "feed", "criticality": "sheddable"}
    before = REGISTRY.get_sample_value("django_throttle_shed_total", labels) or 0.0

    with reports_held(closed_gate):
        assert Client(REMOTE_ADDR="203.0.113.9").get("/api/feed/").status_code == 503
    assert (REGISTRY.get_sample_value("django_throttle_shed_total", labels) or 0.0) - before == 1


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_explain_names_the_fleet_share_a_request_meets() -> None:
    import io

    from django.core.management import call_command

    rules(capacity=10, default=90, sheddable=70)
    out = io.StringIO()
    call_command("throttle_explain", "--ip", "203.0.113.5", "--path", "/api/feed/", stdout=out)
    text = out.getvalue()
    assert "sheddable: 0 of 7 in flight" in text  # 70 % of 10
    fleet = next(line for line in text.splitlines() if "│ fleet" in line)
    assert "service" in fleet and "every" in fleet  # service protection, every client


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("command", "free"),
    [
        (["throttle_explain", "--ip", "203.0.113.5", "--path", "/api/feed/"], "7"),
        (["throttle_inspect", "203.0.113.5"], "9"),
    ],
)
def test_the_operator_tools_show_the_fleet_slots_left(command: list[str], free: str) -> None:
    """The counting script never reports the fleet limit (no client's headers show it), so
    the tools read its peek as 0 left while no request was in flight."""
    import io

    from django.core.management import call_command

    rules(capacity=10, default=90, sheddable=70)
    out = io.StringIO()
    call_command(*command, stdout=out)
    fleet = next(line for line in out.getvalue().splitlines() if "│ fleet" in line)
    cells = [cell.strip() for cell in fleet.split("│")[1:-1]]
    capacity, remaining = cells[5], cells[6]
    assert (capacity, remaining) == (free, free), fleet


@pytest.mark.django_db(transaction=True)
def test_the_admin_inspector_shows_the_fleet_slots_left(admin_client: Any) -> None:
    rules(capacity=10, default=90, sheddable=70)

    html = admin_client.get(
        "/admin/django_throttle/usagecount/inspect/", {"client": "203.0.113.5"}
    ).content.decode()

    row = re.search(r'<tr class="dt-bucket" data-limit="fleet" data-remaining="(\d+)"', html)
    assert row is not None and row[1] == "9"  # 90 % of 10, none in flight


@pytest.mark.django_db
def test_shedding_without_the_middleware_is_warned(settings: Any) -> None:
    from django.core import checks

    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "RateLimitHeaders" not in m]
    Protection.objects.create(in_flight=10)
    found = [m for m in checks.run_checks() if m.id == "django_throttle.W006"]
    assert len(found) == 1 and "service protection" in found[0].msg


# -- the worker shedder ------------------------------------------------------------------------


class SlowAsyncApi(AsyncAPIView):  # type: ignore[misc]
    """Blocks its event loop for 0.8 s: what a saturated ASGI worker looks like. The lag
    the watch notes (0.75 s) stays above the test's 100 ms for about 0.7 s while it decays,
    time enough on a loaded machine for the next request to be decided within it."""

    permission_classes = [AllowAny]
    throttle_classes = [AsyncPolicyThrottle]

    async def get(self, request: Request) -> Response:
        time.sleep(0.8)
        return Response({"done": True})


urlpatterns.append(path("api/slow-async/", SlowAsyncApi.as_view(), name="slow-async"))


def worker_rules(**protection: Any) -> None:
    anonymous = tier("anonymous", "1000/min", is_default_anonymous=True)
    for name, criticality in (
        ("report", "sheddable"),
        ("feed", "sheddable"),
        ("feed-async", "sheddable"),
        ("slow-async", "critical"),
        ("checkout", "critical"),
    ):
        rule = endpoint(name, "route", name, limits={anonymous: "1000/min"})
        EndpointRule.objects.filter(pk=rule.pk).update(criticality=criticality)
    Protection.objects.create(**protection)


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_worker_with_its_threads_busy_sheds_sheddable_requests_on_its_own(
    closed_gate: threading.Event,
) -> None:
    # 4 threads a worker, sheddable requests may take half: 2 busy, a third sheddable is shed.
    worker_rules(worker_capacity=4, default_share=75, sheddable_share=50)
    assert policy.current().shedding is not None

    from django_throttle import events

    decided: list[Any] = []

    def on_decided(sender: Any, decision: Any, **kwargs: Any) -> None:
        decided.append(decision)

    events.request_decided.connect(on_decided)
    with reports_held(closed_gate, reports=2):
        shed = Client(REMOTE_ADDR="203.0.113.2").get("/api/feed/")
        events.request_decided.disconnect(on_decided)
        kept = Client(REMOTE_ADDR="203.0.113.3").get("/api/checkout/")
    assert (shed.status_code, shed["Retry-After"]) == (503, "1")
    assert shed.json()["detail"].startswith("The service is busy.")
    # The worker's own refusal: decided in process, nothing taken in Redis.
    [shed_decision] = [d for d in decided if not d.allowed]
    assert (shed_decision.limit.id, shed_decision.limit.name) == ("worker", "sheddable")
    assert shed_decision.taken == () and shed_decision.leases == ()
    assert kept.status_code == 200  # critical requests are never shed by a worker
    # The saturation ended: the worker serves sheddable requests again.
    assert Client(REMOTE_ADDR="203.0.113.2").get("/api/feed/").status_code == 200
    found = {
        row["endpoint"]: row for row in json.loads(run("--by", "endpoint", "--format", "json"))
    }
    assert (found["feed"]["denied"], found["feed"]["shed"], found["feed"]["allowed"]) == (1, 1, 1)


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_late_event_loop_sheds_sheddable_requests_and_recovers() -> None:
    worker_rules(worker_lag_ms=100)
    policy.current()

    async def run_requests() -> tuple[int, int, int]:
        client = AsyncClient()
        first = (await client.get("/api/feed-async/")).status_code  # starts the lag watch
        deadline = time.monotonic() + 30
        while first != 200 and time.monotonic() < deadline:  # a loop late already (CI saw
            await asyncio.sleep(0.1)  # it once on a loaded machine): served once it is quiet
            first = (await client.get("/api/feed-async/")).status_code
        await asyncio.sleep(0.1)
        await client.get("/api/slow-async/")  # critical, blocks the loop for 0.8 s
        await asyncio.sleep(0.06)  # the watch wakes and notes how late it ran
        during = (await client.get("/api/feed-async/")).status_code
        deadline = time.monotonic() + 30  # about a second when the machine is quiet
        after = during
        while after != 200 and time.monotonic() < deadline:  # the lag decays: recovered
            await asyncio.sleep(0.1)
            after = (await client.get("/api/feed-async/")).status_code
        return first, during, after

    assert async_to_sync(run_requests)() == (200, 503, 200)


@pytest.mark.django_db
def test_worker_shedding_without_a_fleet_capacity_adds_no_fleet_limit() -> None:
    shedding = compile_shedding(Protection(worker_capacity=8))
    assert shedding is not None and shedding.fleet == {} and shedding.worker_capacity == 8
    assert shedding.fleet_limit(None) is None


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_explain_counts_the_fleets_free_slots_as_its_in_flight_says(
    closed_gate: threading.Event,
) -> None:
    """Explain showed the fleet's share with 0 remaining (and whole again in 0 s) however
    few of its slots were held: "1 of 7 in flight", remaining 0, next request allowed. Its
    remaining is the share's free slots and its reset the end of the last lease held."""
    import io

    from django.core.management import call_command

    rules(capacity=10, default=90, sheddable=70)
    with reports_held(closed_gate):  # the report (sheddable) holds one slot of 7
        out = io.StringIO()
        call_command(
            "throttle_explain",
            "--ip",
            "203.0.113.5",
            "--path",
            "/api/feed/",
            "--format",
            "json",
            stdout=out,
        )
    [fleet] = [row for row in json.loads(out.getvalue())["rows"] if row["id"] == "fleet"]
    assert (fleet["capacity"], fleet["in_flight"], fleet["remaining"]) == (7, 1, 6)
    assert 0 < fleet["reset_seconds"] <= 60  # the report's lease


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_the_headers_show_the_clients_own_limits_not_the_fleets() -> None:
    """The fleet's capacity is no client's limit: an allowed request's X-RateLimit-* headers
    show its own limits however few fleet slots are free (the fleet limit is 'quiet')."""
    rules(capacity=4, default=50, sheddable=50)  # sheddable: 2 slots, fewer than 1000/min
    response = Client(REMOTE_ADDR="203.0.113.7").get("/api/feed/")
    assert response.status_code == 200
    assert response["X-RateLimit-Limit"] == "1000"
    assert int(response["X-RateLimit-Remaining"]) >= 998


@pytest.mark.django_db
def test_policy_files_carry_the_service_protection() -> None:
    from django_throttle.policy.files import PolicyFileError, export_policy, import_policy

    Protection.objects.create(in_flight=50, default_share=80, sheddable_share=60, worker_lag_ms=150)
    document = export_policy()
    assert document["protection"]["in_flight"] == 50
    assert document["protection"]["worker_lag_ms"] == 150
    Protection.objects.all().delete()
    changes = import_policy(document)
    assert [str(change) for change in changes if "protection" in str(change)]
    row = Protection.objects.get()
    assert (row.in_flight, row.default_share, row.sheddable_share) == (50, 80, 60)
    import_policy({"version": 1, "protection": {"in_flight": 70}})  # the rest kept
    assert Protection.objects.get().in_flight == 70 and Protection.objects.count() == 1
    with pytest.raises(PolicyFileError) as refused:
        import_policy({"version": 1, "protection": {"sheddable_share": 95, "default_share": 90}})
    assert "protection.sheddable_share" in str(refused.value)
    with pytest.raises(PolicyFileError) as refused:
        import_policy({"version": 1, "protection": {"capacity": 1}})
    assert "unknown field 'capacity'" in str(refused.value)
    assert Protection.objects.get().in_flight == 70  # nothing written by a refused file


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("column", "value"), [("in_flight", [100]), ("worker_lag_ms", []), ("worker_capacity", {})]
)
def test_a_policy_file_with_a_list_for_a_protection_number_names_the_field(
    column: str, value: Any
) -> None:
    """A list or mapping where the protection takes a number is a problem naming the field
    (``throttle_policy import`` prints it on one line), not a TypeError traceback: an empty
    one passed the validation of a blank column and failed the save, any other failed the
    capacity's check constraint inside the validation."""
    from django_throttle.policy.files import PolicyFileError, import_policy

    Protection.objects.create(in_flight=70)
    with pytest.raises(PolicyFileError) as refused:
        import_policy({"version": 1, "protection": {"in_flight": 50, column: value}})
    assert f"protection.{column}: must be one value" in str(refused.value)
    assert Protection.objects.get().in_flight == 70


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_a_shed_request_is_logged_as_a_warning_not_an_error(
    closed_gate: threading.Event, caplog: Any
) -> None:
    """Django logs a 5xx at ERROR (and its default logging mails the ADMINS each one): an
    overload's thousands of shed requests are logged at WARNING, as a 429 is."""
    rules(capacity=1, default=100, sheddable=100)

    with reports_held(closed_gate), caplog.at_level("WARNING", logger="django.request"):
        assert Client(REMOTE_ADDR="203.0.113.9").get("/api/feed/").status_code == 503
        assert Client(REMOTE_ADDR="203.0.113.9").get("/decorated/").status_code == 503
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "django.request"]
    assert logged == [
        ("WARNING", "Service Unavailable: /api/feed/"),
        ("WARNING", "Service Unavailable: /decorated/"),
    ]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_the_ietf_policy_header_leaves_the_fleet_out(settings: Any) -> None:
    settings.DJANGO_THROTTLE_IETF_HEADERS = True
    rules(capacity=4, default=50, sheddable=50)
    response = Client(REMOTE_ADDR="203.0.113.8").get("/api/feed/")
    assert response.status_code == 200
    assert "fleet" not in response["RateLimit-Policy"]
    assert response["RateLimit-Policy"].count(";q=1000;") == 2  # the tier's and the rule's


@pytest.mark.django_db
@pytest.mark.parametrize(
    "values",
    [
        {"default_share": 0},
        {"sheddable_share": 95},  # above the default share
        {"lease": 0},
        {"worker_capacity": -5},
        {"worker_lag_ms": 10**9},
    ],
)
def test_a_protection_written_around_the_admin_leaves_the_clients_limits_on(
    admin_client: Any, values: dict[str, int], caplog: Any
) -> None:
    """A Service protection row holding a value the admin refuses (``QuerySet.update``, SQL)
    turns shedding off, logged, and nothing else: every client's own limits still apply,
    and its admin page answers with the values to correct."""
    tier("anonymous", "3/min", is_default_anonymous=True)
    row = Protection.objects.create(in_flight=100, worker_capacity=8)
    Protection.objects.filter(pk=row.pk).update(**values)
    with caplog.at_level("ERROR", logger="django_throttle.policy"):
        client = Client(REMOTE_ADDR="203.0.113.9")
        assert [client.get("/api/ping/").status_code for _ in range(4)] == [200, 200, 200, 429]
    assert policy.current().shedding is None
    assert "Service protection is off" in caplog.text and next(iter(values)) in caplog.text
    assert (
        admin_client.get(f"/admin/django_throttle/protection/{row.pk}/change/").status_code == 200
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("mode", "expected"),
    [("open", [200] * 5), ("closed", [503] * 5), ("local", [200, 200, 200, 429, 429])],
)
def test_with_redis_down_a_request_under_shedding_meets_its_failure_mode(
    settings: Any, mode: str, expected: list[int]
) -> None:
    """The fleet slot is taken in the request's one counting call: with Redis down the
    request meets its failure mode as any other (open serves, closed refuses with 503, local
    counts in process), never a 500; a worker's own shedding needs no Redis at all."""
    tier("anonymous", "3/min", is_default_anonymous=True)
    Protection.objects.create(in_flight=1, worker_capacity=4)
    settings.DJANGO_THROTTLE_FAILURE_MODE = mode
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    client = Client(REMOTE_ADDR="203.0.113.9")
    assert [client.get("/api/ping/").status_code for _ in range(5)] == expected


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("url", ["/api/feed/", "/decorated/"], ids=["drf", "decorator"])
def test_a_shed_requests_ietf_headers_list_the_fleet_they_name(
    closed_gate: threading.Event, settings: Any, url: str
) -> None:
    """A request the fleet refuses is told so in ``RateLimit`` ("fleet", nothing left): the
    policy it names is then listed in ``RateLimit-Policy`` too, with the capacity
    ``X-RateLimit-Limit`` shows (it named a policy the list left out)."""
    settings.DJANGO_THROTTLE_IETF_HEADERS = True
    rules(capacity=2, default=50, sheddable=50)  # sheddable: 1 slot
    with reports_held(closed_gate):
        shed = Client(REMOTE_ADDR="203.0.113.2").get(url)
    assert shed.status_code == 503
    assert shed["RateLimit"].startswith('"fleet";r=0;')
    listed = dict(item.split(";", 1) for item in shed["RateLimit-Policy"].split(", "))
    assert listed['"fleet"'] == f'q={shed["X-RateLimit-Limit"]};w=60;qu="concurrent-requests"'
