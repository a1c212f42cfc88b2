"""Every algorithm, alone and two at once on one request, with costs above 1, on Redis and in
memory: a denied request retried after its ``Retry-After`` (whole seconds, rounded up) is let
through; retried at 0.9 of that, or a millisecond before the exact wait, it is still refused
(the math promises it); so with shadow limits beside, a cost above a limit's capacity, and a
calendar quota over a clock change; ``Remaining`` after an allowed request is how many more
immediate requests pass; every key a request wrote has a TTL. Every call names its instant, so
the clock is the test's."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import math
import random
import re
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib import admin
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client
from django.urls import path

from django_throttle import backends
from django_throttle.backends.base import Backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.decorators import throttle
from django_throttle.models import EndpointLimit, TierLimit
from django_throttle.policy import live as policy
from django_throttle.rates import Algorithm, Limit, Rate
from django_throttle.request.core import retry_after_seconds
from tests.factories import endpoint, tier

#: A small epoch keeps float seconds exact to far below a microsecond (as the server's integer
#: clock is): at 1.7e9 s a float's step is 0.24 µs and a sum can round a microsecond short.
T0 = 200_000.0  # 1970-01-03 07:33:20 UTC: a calendar day before it too

COUNTING = [
    Algorithm.TOKEN_BUCKET,
    Algorithm.GCRA,
    Algorithm.LEAKY_BUCKET,
    Algorithm.FIXED_WINDOW,
    Algorithm.SLIDING_LOG,
    Algorithm.SLIDING_COUNTER,
    Algorithm.CALENDAR,
]
TOKENS = {Algorithm.TOKEN_BUCKET, Algorithm.GCRA, Algorithm.LEAKY_BUCKET}


def random_limit(rng: random.Random, algorithm: Algorithm, name: str) -> Limit:
    if algorithm == Algorithm.CALENDAR:
        return Limit.build(name, f"{rng.randint(1, 12)}/day", algorithm=algorithm)
    count = rng.randint(1, 12)
    period = rng.choice([1, 2, 3, 7, 10, 60, 90])
    burst = rng.randint(1, 2 * count) if algorithm in TOKENS else None
    return Limit.build(name, Rate(count, period), burst=burst, algorithm=algorithm)


def cases(single: bool) -> list[tuple[Algorithm, ...]]:
    if single:
        return [(algorithm,) for algorithm in COUNTING]
    return list(itertools.combinations(COUNTING, 2))


def drain(backend: Backend, client: str, limits: list[Limit], cost: int, at: float) -> Any:
    """Hit at ``at`` until refused (at most 50 times); the refusal."""
    for _ in range(50):
        decision = backend.hit(client, limits, cost=cost, now=at)
        if not decision.allowed:
            return decision
    raise AssertionError(f"never refused: {limits} cost {cost}")


def check_retry(backend: Backend, rng: random.Random, algorithms: tuple[Algorithm, ...]) -> None:
    tag = "-".join(algorithms)
    for case in range(12):
        limits = [random_limit(rng, a, f"{tag}{case}n{i}") for i, a in enumerate(algorithms)]
        smallest = min(limit.capacity for limit in limits)
        cost = rng.randint(1, smallest)
        start = T0 + rng.randint(0, 10**6) / 1e6
        # Some traffic before, then a full drain a little later.
        early = drain(backend, "a", limits, cost, start)
        at = start + rng.uniform(0, early.retry_after)
        for client in ("a", "b"):
            if client == "b":
                drain(backend, client, limits, cost, start)
            denied = drain(backend, client, limits, cost, at)
        what = (case, [str(limit) for limit in limits], [limit.burst for limit in limits], cost)
        header = retry_after_seconds(denied.retry_after)
        assert denied.retry_after > 0, what
        # The exact wait is the least: a retry sooner than it is refused (this also leaves
        # client "a" with a refused retry before its real one, as a client polling would).
        if denied.retry_after > 1e-3:
            soon = at + denied.retry_after - 1e-3
            assert not backend.peek("a", limits, cost=cost, now=soon).allowed, ("1 ms", what)
            soon = at + 0.9 * denied.retry_after
            assert not backend.hit("a", limits, cost=cost, now=soon).allowed, ("0.9 exact", what)
        if 0.9 * header < denied.retry_after:
            soon = at + 0.9 * header
            assert not backend.hit("a", limits, cost=cost, now=soon).allowed, ("0.9 header", what)
        assert backend.hit("a", limits, cost=cost, now=at + header).allowed, ("header a", what)
        assert backend.hit("b", limits, cost=cost, now=at + denied.retry_after).allowed, (
            "exact b",
            what,
        )


@pytest.mark.parametrize("single", [True, False], ids=["one", "two"])
def test_a_retry_after_retry_after_passes_and_one_sooner_does_not(
    backend: Backend, single: bool
) -> None:
    rng = random.Random(11)
    for algorithms in cases(single):
        check_retry(backend, rng, algorithms)


def delaying_limit(rng: random.Random, name: str) -> Limit:
    count, period = rng.randint(1, 10), rng.choice([1, 2, 7, 60])
    burst = rng.randint(1, 2 * count)
    return Limit.build(
        name,
        Rate(count, period),
        burst=burst,
        algorithm=Algorithm.GCRA,
        delay=rng.randint(0, burst - 1),
        max_wait=rng.choice([None, 0.5, 3, 100]),
    )


def test_a_delaying_limit_s_retry_after_passes_and_one_sooner_does_not(backend: Backend) -> None:
    """The same of a GCRA limit that delays (``delay``, ``max_wait``), alone and beside a
    limit of another algorithm, with costs up to the burst: a cost whose wait alone passes
    the longest wait was refused for good, with a ``Retry-After`` that never held."""
    rng = random.Random(13)
    for case in range(80):
        limits = [delaying_limit(rng, f"d{case}")]
        if rng.random() < 0.5:
            limits.append(random_limit(rng, rng.choice(COUNTING), f"o{case}"))
        cost = rng.randint(1, min(limit.capacity for limit in limits))
        at = T0 + rng.randint(0, 10**6) / 1e6
        denied = drain(backend, f"c{case}", limits, cost, at)
        what = (case, [str(limit) for limit in limits], limits[0].delay, cost)
        exact = denied.retry_after
        if exact > 1e-3:
            sooner = backend.peek(f"c{case}", limits, cost=cost, now=at + exact - 1e-3)
            assert not sooner.allowed, what
        later = backend.hit(f"c{case}", limits, cost=cost, now=at + exact)
        assert later.allowed, what
        assert later.wait <= limits[0].max_wait_us / 1e6, what


@pytest.mark.parametrize("enforced", COUNTING)
def test_a_shadow_limit_beside_changes_no_retry_after(
    backend: Backend, enforced: Algorithm
) -> None:
    """A shadow limit of every algorithm, tighter or not, beside an enforced one: the wait is
    the enforced limit's, exact to a millisecond, and the shadow limit is never reported."""
    rng = random.Random(f"shadow{enforced}")
    for case, shadowed in enumerate(COUNTING):
        shadow = dataclasses.replace(random_limit(rng, shadowed, f"s{case}"), shadow=True)
        limits = [random_limit(rng, enforced, f"e{case}"), shadow]
        cost = rng.randint(1, min(limit.capacity for limit in limits))
        at = T0 + rng.randint(0, 10**6) / 1e6
        denied = drain(backend, f"m{case}", limits, cost, at)
        what = (case, [str(limit) for limit in limits], cost)
        assert denied.limit is not None and not denied.limit.shadow, what
        if denied.retry_after > 1e-3:
            soon = at + denied.retry_after - 1e-3
            assert not backend.peek(f"m{case}", limits, cost=cost, now=soon).allowed, what
        later = backend.hit(f"m{case}", limits, cost=cost, now=at + denied.retry_after)
        assert later.allowed and not later.limit.shadow, what


@pytest.mark.parametrize("algorithm", COUNTING)
def test_a_cost_above_the_capacity_is_admitted_when_the_limit_is_whole(
    backend: Backend, algorithm: Algorithm
) -> None:
    """A request costing more than a limit holds is charged its capacity (docs: reference/
    policies): refused while the limit is not whole, ``Retry-After`` says when it is, and
    a retry then passes, a millisecond sooner not; beside a larger limit that takes it all."""
    for capacity in (1, 2, 5):
        if algorithm == Algorithm.CALENDAR:
            small = Limit.build(f"q{capacity}", f"{capacity}/day", algorithm=algorithm)
        else:
            burst = capacity if algorithm in TOKENS else None
            small = Limit.build(
                f"q{capacity}", Rate(capacity, 10), burst=burst, algorithm=algorithm
            )
        limits = [small, Limit.build(f"big{capacity}", Rate(100, 10), burst=100)]
        for cost in (capacity + 1, 3 * capacity):
            client = f"x{capacity}-{cost}"
            assert backend.hit(client, limits, cost=cost, now=T0).allowed
            denied = drain(backend, client, limits, cost, T0)
            soon = T0 + denied.retry_after - 1e-3
            assert not backend.peek(client, limits, cost=cost, now=soon).allowed, (capacity, cost)
            later = backend.hit(client, limits, cost=cost, now=T0 + denied.retry_after)
            assert later.allowed, (capacity, cost)


#: Days the clocks change (23- and 25-hour days), in zones either side of UTC.
CLOCK_CHANGES = [
    ("America/New_York", (2026, 3, 8)),
    ("America/New_York", (2026, 11, 1)),
    ("Europe/Berlin", (2026, 3, 29)),
    ("Europe/Berlin", (2026, 10, 25)),
    ("Australia/Lord_Howe", (2026, 4, 5)),  # half an hour back
]


@pytest.mark.parametrize(("zone", "day"), CLOCK_CHANGES)
def test_a_calendar_quota_s_retry_after_over_a_clock_change(
    backend: Backend, zone: str, day: tuple[int, int, int]
) -> None:
    """A quota per day, week and month in a zone whose clocks change that day, spent at
    hours before and after the change: ``Retry-After`` and the reset are the real time to
    the next window's local midnight (not 24 h), exact to a millisecond."""
    tz = ZoneInfo(zone)
    for unit in ("day", "week", "month"):
        limit = Limit.build(f"q{unit}", f"3/{unit}", algorithm=Algorithm.CALENDAR, timezone=zone)
        for hour in (0, 1, 3, 12, 23):
            at = datetime(*day, hour, 30, tzinfo=tz).timestamp() + 0.25
            client = f"{unit}{hour}"
            first = backend.hit(client, [limit], now=at)
            denied = drain(backend, client, [limit], 1, at)
            end = datetime.fromtimestamp(at + denied.retry_after, tz)
            what = (unit, hour, end.isoformat())
            assert (end.hour, end.minute, end.second, end.microsecond) == (0, 0, 0, 0), what
            assert abs(first.reset_after - denied.retry_after) < 1e-6, what
            soon = at + denied.retry_after - 1e-3
            assert not backend.peek(client, [limit], cost=1, now=soon).allowed, what
            assert backend.hit(client, [limit], now=at + denied.retry_after).allowed, what


def check_remaining(
    backend: Backend, rng: random.Random, algorithms: tuple[Algorithm, ...]
) -> None:
    tag = "-".join(algorithms)
    for case in range(12):
        limits = [random_limit(rng, a, f"{tag}{case}r{i}") for i, a in enumerate(algorithms)]
        cost = rng.randint(1, min(limit.capacity for limit in limits))
        at = T0 + rng.randint(0, 10**6) / 1e6
        # Some earlier traffic, a while ago.
        for _ in range(rng.randint(0, 3)):
            backend.hit("c", limits, cost=1, now=at - rng.uniform(0, 5))
        first = backend.hit("c", limits, cost=cost, now=at)
        what = (case, [str(limit) for limit in limits], cost, first)
        if not first.allowed:
            continue
        assert first.remaining >= 0, what
        # Reset: the reported limit is whole again then (peeked, nothing taken), not before.
        reported = first.limit
        assert reported is not None, what
        reset = math.ceil(round(first.reset_after, 6))
        full = backend.peek("c", [reported], now=at + reset)
        assert full.remaining == reported.capacity, ("reset", reset, full, what)
        passed = 0
        while backend.hit("c", limits, cost=cost, now=at).allowed:
            passed += 1
            assert passed <= 60, what
        assert passed == first.remaining // cost, what


@pytest.mark.parametrize("single", [True, False], ids=["one", "two"])
def test_remaining_is_how_many_more_requests_pass_at_once(backend: Backend, single: bool) -> None:
    rng = random.Random(7)
    for algorithms in cases(single):
        check_remaining(backend, rng, algorithms)


@pytest.mark.parametrize("single", [True, False], ids=["one", "two"])
def test_every_key_a_request_wrote_expires(
    settings: Any, redis_client: Any, _isolated_throttle: str, single: bool
) -> None:
    """On the suite's private redis-server, on its own clock: allowed and refused requests
    of every algorithm and every pair, with costs above 1; every key has a TTL."""
    from django_throttle.backends import get_backend

    backend = get_backend()
    rng = random.Random(3)
    for algorithms in cases(single):
        tag = "-".join(algorithms)
        limits = [random_limit(rng, a, f"{tag}t{i}") for i, a in enumerate(algorithms)]
        cost = rng.randint(1, min(limit.capacity for limit in limits))
        for client in ("x", "y"):
            for _ in range(math.ceil(max(limit.capacity for limit in limits) / cost) + 1):
                backend.hit(client, limits, cost=cost)
    keys = list(redis_client.scan_iter(match=_isolated_throttle + "*", count=1000))
    assert len(keys) >= 7
    assert [
        key for key in keys if redis_client.pttl(key) == -1
    ] == []  # -1: no TTL; -2: expired since the scan


# --- Through the middleware: a tier's limit and an endpoint rule's, cost above 1 ----------


@throttle(scope="retry-honest")
def priced_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


@throttle(scope="retry-plain")
def plain_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


@throttle(scope="retry-failing")
def failing_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True}, status=int(request.GET.get("status", "200")))


urlpatterns = [
    path("admin/", admin.site.urls),
    path("priced/", priced_view),
    path("plain/", plain_view),
    path("failing/", failing_view),
]


def row_rate(rng: random.Random, algorithm: Algorithm) -> dict[str, Any]:
    if algorithm == Algorithm.CALENDAR:
        return {"rate": f"{rng.randint(3, 12)}/day", "algorithm": algorithm}
    count = rng.randint(3, 12)
    burst = rng.randint(count, 2 * count) if algorithm in TOKENS else None
    return {
        "rate": f"{count}/{rng.choice(['2s', '7s', 'm', '90s'])}",
        "algorithm": algorithm,
        "burst": burst,
    }


@pytest.mark.urls(__name__)
@pytest.mark.django_db
@pytest.mark.parametrize(("tiered", "ruled"), list(itertools.permutations(COUNTING, 2))[::3])
def test_the_headers_of_a_priced_rule_say_what_the_next_request_gets(
    settings: Any, tiered: Algorithm, ruled: Algorithm
) -> None:
    """In memory, on the backend's injected clock: a tier's limit of one algorithm and an
    endpoint rule's of another, the rule costing 2 or 3. After each allowed response,
    ``X-RateLimit-Remaining // cost`` more requests pass at once (``RateLimit`` says the
    same); after the 429, a retry ``Retry-After`` later passes, one at 0.9 of it (when the
    exact wait is longer) is refused."""
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    settings.DJANGO_THROTTLE_IETF_HEADERS = True
    counting = backends.get_backend()
    assert isinstance(counting, MemoryBackend)
    now = [T0 + 0.123456]
    counting.clock = lambda: now[0]
    rng = random.Random(f"{tiered}{ruled}")
    anonymous = tier("anonymous", is_default_anonymous=True)
    TierLimit.objects.create(tier=anonymous, **row_rate(rng, tiered))
    cost = rng.choice([2, 3])
    rule = endpoint("retry-honest", "scope", "retry-honest", cost=cost)
    EndpointLimit.objects.create(rule=rule, tier=anonymous, **row_rate(rng, ruled))
    policy.current()
    client = Client(REMOTE_ADDR="203.0.113.40")

    first = client.get("/priced/")
    assert first.status_code == 200, first
    remaining = int(first["X-RateLimit-Remaining"])
    assert f";r={remaining};" in first["RateLimit"]
    more = 0
    while (response := client.get("/priced/")).status_code == 200:
        more += 1
        assert more < 60
    assert more == remaining // cost, (more, remaining, cost, dict(first.headers))
    assert response.status_code == 429
    header = int(response["Retry-After"])

    start = now[0]
    if 0.9 * header < header - 1:
        now[0] = start + 0.9 * header
        assert client.get("/priced/").status_code == 429
    now[0] = start + header
    assert client.get("/priced/").status_code == 200, (header, dict(response.headers))


@pytest.mark.urls(__name__)
@pytest.mark.django_db
@pytest.mark.parametrize(("zone", "day"), CLOCK_CHANGES[:2])
def test_a_tier_calendar_quota_s_headers_over_a_clock_change(
    settings: Any, zone: str, day: tuple[int, int, int]
) -> None:
    """A tier's quota of 2 a day in New York, spent at 01:30 on the days the clocks change
    (a 23- and a 25-hour day): ``Retry-After``, ``X-RateLimit-Reset`` and ``RateLimit``'s
    ``t`` are the seconds to the real local midnight; a request a millisecond before it is
    refused, one at ``Retry-After`` passes."""
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    settings.DJANGO_THROTTLE_IETF_HEADERS = True
    counting = backends.get_backend()
    assert isinstance(counting, MemoryBackend)
    tz = ZoneInfo(zone)
    now = [datetime(*day, 1, 30, tzinfo=tz).timestamp() + 0.25]
    counting.clock = lambda: now[0]
    anonymous = tier("anonymous", is_default_anonymous=True)
    TierLimit.objects.create(
        tier=anonymous, rate="2/day", algorithm=Algorithm.CALENDAR, timezone=zone
    )
    policy.current()
    client = Client(REMOTE_ADDR="203.0.113.81")
    assert [client.get("/plain/").status_code for _ in range(2)] == [200, 200]
    refused = client.get("/plain/")
    assert refused.status_code == 429
    midnight = datetime.combine(date(*day) + timedelta(days=1), time(), tzinfo=tz).timestamp()
    wait = math.ceil(midnight - now[0])
    assert wait != 86400 - 5400  # the day is not 24 hours long
    assert int(refused["Retry-After"]) == int(refused["X-RateLimit-Reset"]) == wait
    assert refused["RateLimit"].endswith(f";r=0;t={wait}")
    assert refused["RateLimit-Policy"].endswith(";q=2;w=86400")  # the nominal day
    start = now[0]
    now[0] = midnight - 1e-3
    assert client.get("/plain/").status_code == 429
    now[0] = start + wait
    assert client.get("/plain/").status_code == 200


# --- What the operator tools say after a known sequence ---------------------------------------


def usage_by(what: str) -> dict[str, dict[str, Any]]:
    out = io.StringIO()
    call_command("throttle_usage", "--by", what, "--format", "json", stdout=out)
    return {row[what]: row for row in json.loads(out.getvalue())}


@pytest.mark.urls(__name__)
@pytest.mark.django_db
def test_usage_dashboard_and_inspector_say_what_happened(
    backend: Backend, admin_client: Client
) -> None:
    """Two clients, a plain rule (2 a minute) and a priced one (cost 3 of 7 a minute): the
    report by endpoint, tier and client, the dashboard's totals and the inspector's verdict
    for the next request are exactly the sequence's, none marked an estimate."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    plain = endpoint("retry-plain", "scope", "retry-plain")
    EndpointLimit.objects.create(rule=plain, tier=anonymous, rate="2/min")
    priced = endpoint("retry-honest", "scope", "retry-honest", cost=3)
    EndpointLimit.objects.create(rule=priced, tier=anonymous, rate="7/min")
    policy.current()
    first, second = Client(REMOTE_ADDR="203.0.113.50"), Client(REMOTE_ADDR="203.0.113.51")
    statuses = [first.get("/plain/").status_code for _ in range(5)]
    statuses += [second.get("/plain/").status_code for _ in range(3)]
    assert statuses == [200, 200, 429, 429, 429, 200, 200, 429]
    priced_statuses = [first.get("/priced/").status_code for _ in range(4)]
    assert priced_statuses == [200, 200, 429, 429]  # 7 tokens: two of cost 3, 1 left
    from django_throttle.usage import accounting as usage

    usage.flush_pending()
    endpoints = usage_by("endpoint")
    assert (endpoints["retry-plain"]["allowed"], endpoints["retry-plain"]["denied"]) == (4, 4)
    assert (endpoints["retry-honest"]["allowed"], endpoints["retry-honest"]["denied"]) == (2, 2)
    assert {row["delayed"] for row in endpoints.values()} == {0}
    assert all(not row["estimated"] for row in endpoints.values())
    tiers = usage_by("tier")
    assert (tiers["anonymous"]["allowed"], tiers["anonymous"]["denied"]) == (6, 6)
    clients = usage_by("client")
    assert (clients["ip:203.0.113.50"]["allowed"], clients["ip:203.0.113.50"]["denied"]) == (4, 5)
    assert (clients["ip:203.0.113.51"]["allowed"], clients["ip:203.0.113.51"]["denied"]) == (2, 1)

    html = admin_client.get("/admin/django_throttle/usagecount/dashboard/").content.decode()
    totals = dict(re.findall(r'data-outcome="(\w+)">(\d+)</strong>', html))
    assert (totals["allowed"], totals["denied"]) == ("6", "6"), totals
    assert "dt-estimate" not in html

    # One token left of the priced rule's 7: the next request (cost 3) is refused.
    page = admin_client.get(
        "/admin/django_throttle/usagecount/inspect/",
        {"client": "203.0.113.50", "path": "/priced/"},
    ).content.decode()
    verdict = re.search(r'id="dt-verdict">(.*?)</td>', page, re.S)
    assert verdict is not None and "denied (429)" in verdict.group(1), verdict


@pytest.mark.urls(__name__)
@pytest.mark.django_db
def test_shadow_would_denies_and_refunds_are_counted_as_they_happened(
    backend: Backend, admin_client: Client
) -> None:
    """A rule counting failures only (3 a minute) and a shadow rule (2 a minute): successes
    given their tokens back are still served (allowed), would-denies of the shadow rule are
    served and counted apart. The report by endpoint, tier and client, the dashboard and the
    inspector say exactly that; the inspector shows the shadow rule's counter as it stands."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    failures = endpoint("retry-failing", "scope", "retry-failing")
    failures.counts = failures.Counts.FAILURES
    failures.save()
    limit = EndpointLimit.objects.create(rule=failures, tier=anonymous, rate="3/min")
    shadow_rule = endpoint("retry-plain", "scope", "retry-plain", shadow=True)
    shadow = EndpointLimit.objects.create(rule=shadow_rule, tier=anonymous, rate="2/min")
    policy.current()
    first, second = Client(REMOTE_ADDR="203.0.113.52"), Client(REMOTE_ADDR="203.0.113.53")
    statuses = [first.get("/failing/").status_code for _ in range(4)]  # given back
    statuses += [first.get("/failing/", {"status": 404}).status_code for _ in range(5)]
    statuses += [first.get("/failing/").status_code for _ in range(2)]
    assert statuses == [200] * 4 + [404] * 3 + [429] * 4
    assert [second.get("/plain/").status_code for _ in range(5)] == [200] * 5
    from django_throttle.usage import accounting as usage

    usage.flush_pending()
    figures = ("allowed", "denied", "shadow_denied")
    endpoints = usage_by("endpoint")
    assert [endpoints["retry-failing"][f] for f in figures] == [7, 4, 0]
    assert [endpoints["retry-plain"][f] for f in figures] == [2, 0, 3]
    assert [usage_by("tier")["anonymous"][f] for f in figures] == [9, 4, 3]
    clients = usage_by("client")
    assert [clients["ip:203.0.113.52"][f] for f in figures] == [7, 4, 0]
    assert [clients["ip:203.0.113.53"][f] for f in figures] == [2, 0, 3]
    assert all(not row["estimated"] for row in [*endpoints.values(), *clients.values()])

    html = admin_client.get("/admin/django_throttle/usagecount/dashboard/").content.decode()
    totals = dict(re.findall(r'data-outcome="(\w+)">(\d+)</strong>', html))
    assert [totals[f] for f in figures] == ["9", "4", "3"]
    assert "retry-failing <small>(7 allowed, 4 denied, 0 shadow)" in html
    assert "retry-plain <small>(2 allowed, 0 denied, 3 shadow)" in html
    assert "dt-estimate" not in html

    def bucket(address: str, row: EndpointLimit) -> list[str]:
        page = admin_client.get(
            "/admin/django_throttle/usagecount/inspect/", {"client": address}
        ).content.decode()
        found = re.search(rf'<tr class="dt-bucket" data-limit="e{row.pk}".*?</tr>', page, re.S)
        assert found is not None, page
        return [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td>(.*?)</td>", found[0])]

    # Remaining and whole again in: the 3 failures took the rule's 3 tokens, 20 s apart each;
    # the shadow rule's 2 were taken by the first two requests, its would-denies took none.
    # (whole again in a minute less the seconds this test has run since: 59 s on a slow
    # machine)
    for address, row in (("203.0.113.52", limit), ("203.0.113.53", shadow)):
        remaining, whole_in = bucket(address, row)[5:7]
        assert remaining == "0" and re.fullmatch(r"1 min|5\d s", whole_in), whole_in
    assert bucket("203.0.113.52", shadow)[5:7] == ["2", "0 s"]
