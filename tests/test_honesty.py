"""What the headers, the usage report and the operator tools say is what happened: probes
through the real middleware stack (``@throttle`` on a sync and an ``async def`` view, Django's
``Client`` and ``AsyncClient``), each with a case the code once got wrong."""

from __future__ import annotations

import io
import json
import re
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib import admin
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import AsyncClient, Client
from django.urls import path, reverse
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle import backends, events
from django_throttle.decorators import throttle
from django_throttle.models import EndpointLimit
from django_throttle.policy import live as policy
from django_throttle.rates import Algorithm, Limit, Rate
from django_throttle.request import core
from django_throttle.usage import accounting as usage
from tests.clients import AddressedAsyncClient
from tests.factories import endpoint, push_kept, tier


@throttle(scope="honest")
def honest_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


@throttle(scope="honest")
async def honest_view_async(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


#: One request at once, then one a minute: a second request sent at once has a turn to wait
#: (for up to 5 minutes: unset, the longest wait is 10 s).
PACED = {"rate": "1/min", "algorithm": "gcra", "burst": 4, "delay": 0, "max_wait": 300}


@throttle(**PACED)
def paced_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


@throttle(**PACED)
async def paced_view_async(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


class PacedApi(APIView):
    permission_classes = [AllowAny]
    throttle_scope = "paced-api"

    def get(self, request: Request) -> Response:
        return Response({"ok": True})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("honest/", honest_view),
    path("honest-async/", honest_view_async),
    path("paced/", paced_view),
    path("paced-async/", paced_view_async),
    path("paced-api/", PacedApi.as_view()),
]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]

#: A port nothing listens on: every call to the backend is refused at once.
CLOSED = "redis://127.0.0.1:1/0"


def getter(asgi: bool) -> Callable[[], Any]:
    if asgi:
        client = AsyncClient()
        return lambda: async_to_sync(client.get)("/honest-async/")
    plain = Client()
    return lambda: plain.get("/honest/")


def usage_rows() -> list[dict[str, Any]]:
    out = io.StringIO()
    call_command("throttle_usage", "--format", "json", stdout=out)
    rows: list[dict[str, Any]] = json.loads(out.getvalue())
    return rows


@pytest.mark.parametrize("asgi", [False, True], ids=["sync", "async"])
def test_local_mode_counts_shadow_would_denials_as_redis_does(
    asgi: bool, settings: Any, redis_url: str
) -> None:
    """While Redis is down, failure mode ``local`` decides in process; a request a shadow rule
    would have denied is counted "shadow would-deny" in usage, as the backend counts it when
    it answers (it was counted plain "allowed")."""
    settings.DJANGO_THROTTLE_FAILURE_MODE = "local"
    anonymous = tier("anonymous", "10/h", is_default_anonymous=True)
    rule = endpoint("honest", "scope", "honest", shadow=True)
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="2/h")
    policy.current()
    settings.DJANGO_THROTTLE_REDIS_URL = CLOSED
    backends.reset_backend_cache()
    get = getter(asgi)
    responses = [get() for _ in range(5)]
    assert [r.status_code for r in responses] == [200] * 5
    assert {r["X-RateLimit-Degraded"] for r in responses} == {"local"}
    # Redis is back: the counts kept in process are pushed.
    settings.DJANGO_THROTTLE_REDIS_URL = redis_url
    backends.reset_backend_cache()
    push_kept()
    [row] = usage_rows()
    assert (row["allowed"], row["shadow_denied"], row["denied"]) == (2, 3, 0)


def test_the_inspector_never_shows_a_retry_after_shorter_than_the_header(
    admin_client: Client,
) -> None:
    """The inspector's explain showed a denial's wait rounded to the nearest unit: at 2 per
    3 minutes the second token is 90 s away (``Retry-After: 90``), shown as "Retry-After
    1 min", a retry half a minute too early. Waits are rounded up in every unit."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("honest", "scope", "honest")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="2/3m")
    policy.current()
    client = Client(REMOTE_ADDR="203.0.113.9")
    assert [client.get("/honest/").status_code for _ in range(2)] == [200, 200]
    assert client.get("/honest/")["Retry-After"] == "90"

    url = reverse("admin:django_throttle_usagecount_inspect")
    page = admin_client.get(url, {"client": "203.0.113.9", "path": "/honest/"})
    verdict = re.search(r'id="dt-verdict">(.*?)</td>', page.content.decode(), re.S)
    assert verdict is not None
    assert "Retry-After 2 min</span>" in verdict.group(1)


def test_a_shadow_limit_shows_what_it_holds_in_the_inspector(admin_client: Client) -> None:
    """A shadow limit's row in the inspector and ``throttle_inspect`` said 0 remaining, whole
    again in 0 s, whatever it held: a client that had never met it looked spent, one that
    had spent it looked whole at once. A shadow limit is never reported to clients, so its
    peek said nothing of it; it is read as the limit it would be if enforced."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("honest", "scope", "honest", shadow=True)
    shadow = EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="3/min")
    policy.current()
    client = Client(REMOTE_ADDR="203.0.113.9")
    assert [client.get("/honest/").status_code for _ in range(5)] == [200] * 5
    shadow_id = f"e{shadow.pk}"
    url = reverse("admin:django_throttle_usagecount_inspect")

    def row(address: str) -> tuple[str, str]:
        page = admin_client.get(url, {"client": address}).content.decode()
        found = re.search(rf'<tr class="dt-bucket" data-limit="{shadow_id}".*?</tr>', page, re.S)
        assert found is not None, page
        cells = [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td>(.*?)</td>", found[0])]
        return cells[5], cells[6]  # Remaining, Whole again in

    # Spent: 3 taken (the would-denies took nothing); the third token is a minute away.
    assert row("203.0.113.9") == ("0", "1 min")
    assert row("203.0.113.10") == ("3", "0 s")  # never met it: whole
    out = io.StringIO()
    call_command("throttle_inspect", "203.0.113.9", "--format", "json", stdout=out)
    [listed] = [b for b in json.loads(out.getvalue())["rows"] if b["id"] == shadow_id]
    assert (listed["remaining"], listed["shadow"]) == (0, True)
    assert 59 < listed["reset_seconds"] <= 60


def test_a_refused_turn_of_a_shadow_would_deny_is_counted_denied_in_local_mode(
    settings: Any,
) -> None:
    """Failure mode ``local`` counts a served request a shadow rule would have denied as
    "shadow would-deny"; when this process then refuses its turn (too many requests
    waiting), it moves to "denied", as the backend's tally moves it (the in-process counts
    looked for an "allowed" count only, and the refusal was lost)."""
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    field = usage.field_for("anonymous", "honest")
    usage.record_degraded(field, "ip:203.0.113.9", usage.SHADOW_DENIED)
    usage.record_refused_turn(field, "ip:203.0.113.9", local=True)
    usage.flush_pending()
    [row] = usage_rows()
    assert (row["allowed"], row["shadow_denied"], row["denied"]) == (0, 0, 1)


def metric_totals(name: str) -> Counter[str]:
    """A Prometheus counter's samples summed by their ``outcome`` label ("" without one)."""
    from prometheus_client import REGISTRY

    found: Counter[str] = Counter()
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name == name:
                found[sample.labels.get("outcome", "")] += sample.value
    return found


@pytest.mark.parametrize("route", ["/paced/", "/paced-async/", "/paced-api/"])
def test_a_refused_turn_is_a_denial_in_signals_and_metrics(
    route: str, backend: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request given a turn that its process will not wait for (every place for waiting
    requests taken) is answered 429; the signals and the metrics announced it "allowed"
    and delayed when its turn was given, and sent no ``request_throttled``. It is announced
    once its process took the turn or refused it."""
    from django_throttle import metrics

    settings.DJANGO_THROTTLE_METRICS = True
    assert metrics.connect()
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("paced-api", "scope", "paced-api")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, **PACED)
    policy.current()
    full = threading.BoundedSemaphore(1)
    full.acquire()  # every place for waiting requests of this process taken
    monkeypatch.setattr(core, "_awaiting" if "async" in route else "_waiting", full)
    heard: list[str] = []

    def decided(sender: Any, outcome: str, **kwargs: Any) -> None:
        heard.append(outcome)

    def throttled(sender: Any, shadow: bool = False, **kwargs: Any) -> None:
        heard.append("throttled")

    events.request_decided.connect(decided)
    events.request_throttled.connect(throttled)
    decisions, delays = (
        metric_totals("django_throttle_decisions_total"),
        metric_totals("django_throttle_delays_total"),
    )
    try:
        if "async" in route:
            client = AddressedAsyncClient("203.0.113.21")
            statuses = [async_to_sync(client.get)(route).status_code for _ in range(2)]
        else:
            plain = Client(REMOTE_ADDR="203.0.113.21")
            statuses = [plain.get(route).status_code for _ in range(2)]
    finally:
        events.request_decided.disconnect(decided)
        events.request_throttled.disconnect(throttled)
    assert statuses == [200, 429]
    assert heard == ["allowed", "denied", "throttled"]
    counted = metric_totals("django_throttle_decisions_total") - decisions
    assert (counted["allowed"], counted["denied"]) == (1, 1)
    assert metric_totals("django_throttle_delays_total") == delays  # nobody waited


def test_every_key_the_newer_features_write_expires(
    settings: Any, redis_client: Any, _isolated_throttle: str
) -> None:
    """Regional rows, a delaying limit, a concurrency limit with a slot held, the fleet
    shedder, an adaptive controller step and the usage push, on the suite's Redis: every key
    under the test's prefix has a TTL."""
    from django_throttle.models import Protection, TierLimit

    settings.DJANGO_THROTTLE_REGION_SOURCE = "header:CF-IPCountry"
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = ["10.0.0.0/8"]
    anonymous = tier("anonymous", "50/m", is_default_anonymous=True)
    TierLimit.objects.create(tier=anonymous, rate="2/m", regions="FR")
    TierLimit.objects.create(tier=anonymous, rate="10/s", algorithm="gcra", burst=3, delay=0)
    rule = endpoint("paced-api", "scope", "paced-api")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="2/min", algorithm="concurrency")
    Protection.objects.create(in_flight=10)
    policy.current()
    client = Client()
    edge = {"REMOTE_ADDR": "10.0.0.5", "HTTP_X_FORWARDED_FOR": "203.0.113.9"}
    assert [
        client.get("/honest/", **edge, HTTP_CF_IPCOUNTRY="FR").status_code for _ in range(3)
    ] == [200, 200, 429]
    assert [client.get("/paced-api/", **edge).status_code for _ in range(2)] == [200, 200]
    # A slot still held, as by a request in flight (the view's was given back).
    slots = Limit(id="held", rate=Rate.parse("2/min"), burst=2, algorithm=Algorithm.CONCURRENCY)
    assert backends.get_backend().hit("ip:203.0.113.9", [slots]).leases
    call_command("throttle_adapt", "--signal", "tests.test_adaptive.overloaded", "--once")
    usage.flush_pending()
    usage.wait_pushed()
    keys = list(redis_client.scan_iter(match=_isolated_throttle + "*", count=1000))
    assert len(keys) >= 6
    assert [
        key for key in keys if redis_client.pttl(key) == -1
    ] == []  # -1: no TTL; -2: expired since the scan
