"""The seams of the three modes that protect the service (load shedding by criticality,
limits per region, adaptive limits) with odd identities: admin rules met through the real
middleware stack of tests/settings.py by every adapter (``@throttle`` on a sync and an
``async def`` view, DRF's ``PolicyThrottle`` on a sync ``APIView`` and
``AsyncPolicyThrottle`` on an adrf one), driven by Django's ``Client`` (WSGI) and
``AsyncClient`` (ASGI), for signed-in users of an assigned tier (not a default one) whose
usernames are 300 characters long, unicode, or markup, and an anonymous client by IPv6
address; and the operator tools (``throttle_inspect``, ``throttle_explain``,
``throttle_reset``) asked about each of them.

- Shedding: while the fleet is saturated (a slot held by another client's streamed answer,
  as tests/test_seams_traffic.py holds slots), the identity's sheddable request gets 503
  with ``Retry-After`` and the "service is busy" body and charges none of its own counters,
  its critical request is served, and ``throttle_explain`` shows the fleet's line.
- Regions: the regional limit applies when the region header comes from a trusted proxy,
  never from the client itself; ``--region`` shows and resets the regional counter.
- Adaptive: a tier at 50 % admits half its limit, and the tools show the scaled limit;
  limits counted by IP address or username are never scaled.

The helpers (identities, clients, command runners) are tests/test_seams_traffic.py's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from adrf.views import APIView as AsyncAPIView
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import URLPattern, path, reverse
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.views import APIView

from django_throttle.decorators import throttle
from django_throttle.drf import AsyncPolicyThrottle
from django_throttle.models import EndpointLimit, EndpointRule, Protection, Tier
from django_throttle.policy import live as policy
from tests.factories import endpoint, tier
from tests.test_seams_traffic import (
    ADAPTERS,
    IDENTITIES,
    Adapter,
    Caller,
    achunks,
    as_json,
    chunks,
    is_user,
    label,
    long_username_fits,
    present,
    run,
    sign_up,
)

# -- each rule's views, one per adapter ---------------------------------------------------------


def adapter_views(scope: str, *, streams: bool = False) -> list[URLPattern]:
    """The views of the admin rule ``scope`` at ``/<scope>/<adapter suffix>/``: a streamed
    answer (its fleet slot held until the stream is read and closed) when ``streams``, else
    a JSON one."""

    def answer() -> HttpResponse:
        return StreamingHttpResponse(chunks()) if streams else JsonResponse({"scope": scope})

    def answer_async() -> HttpResponse:
        return StreamingHttpResponse(achunks()) if streams else JsonResponse({"scope": scope})

    @throttle(scope=scope)
    def view(request: HttpRequest) -> HttpResponse:
        return answer()

    @throttle(scope=scope)
    async def view_async(request: HttpRequest) -> HttpResponse:
        return answer_async()

    class Api(APIView):
        permission_classes = [AllowAny]
        throttle_scope = scope

        def get(self, request: Request) -> HttpResponse:
            return answer()

    class AsyncApi(AsyncAPIView):  # type: ignore[misc]
        permission_classes = [AllowAny]
        throttle_classes = [AsyncPolicyThrottle]
        throttle_scope = scope

        async def get(self, request: Request) -> HttpResponse:
            return answer_async()

    views = (view, view_async, Api.as_view(), AsyncApi.as_view())
    suffixes = [adapter.suffix for adapter in ADAPTERS.values()]
    return [path(f"{scope}/{suffix}/", v) for suffix, v in zip(suffixes, views, strict=True)]


urlpatterns = [
    *adapter_views("feed", streams=True),  # sheddable
    *adapter_views("checkout"),  # critical
    *adapter_views("local"),  # limits per region
    *adapter_views("scaled"),  # a tier at 50 %
    path("admin/", admin.site.urls),  # the inspector
    *adapter_views("guarded"),  # counted by IP address and by username: never scaled
]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]


def at(adapter: Adapter, scope: str) -> str:
    """The path of the adapter's view of the rule ``scope``."""
    return f"/{scope}/{adapter.suffix}/"


def tier_of(identity: str) -> str:
    return "gold" if is_user(identity) else "anonymous"


def who(identity: str) -> tuple[str, str]:
    """The identity as ``throttle_explain`` takes it."""
    return ("--user", identity) if is_user(identity) else ("--ip", identity)


def every_pair() -> list[Any]:
    """Each identity with each adapter."""
    return [
        pytest.param(identity, adapter, id=f"{name}-{kind}")
        for name, identity in IDENTITIES.items()
        for kind, adapter in ADAPTERS.items()
    ]


def policy_of(*, load_factor: int = 100) -> tuple[dict[str, Tier], dict[str, Any]]:
    """The tiers anonymous and members (the defaults) and gold (assigned to the users), each
    with a generous limit of its own, anonymous and gold (the identities' tiers) at a load
    factor of ``load_factor`` percent; and the signed-in users of gold."""
    tiers = {
        "anonymous": tier("anonymous", "1000/h", is_default_anonymous=True),
        "members": tier("members", "1000/h", is_default_authenticated=True),
        "gold": tier("gold", "1000/h"),
    }
    Tier.objects.filter(slug__in=("anonymous", "gold")).update(load_factor=load_factor)
    return tiers, sign_up(tiers["gold"])


# -- load shedding ------------------------------------------------------------------------------

#: Another anonymous client, whose streamed answer holds the fleet's sheddable share.
HOLDER = "203.0.113.1"
#: What explain says of a concurrency limit whose slots are all taken.
NEXT_REFUSED = "the next request is refused until one ends (at most 1 s Retry-After)"


@pytest.fixture
def shedding() -> dict[str, Any]:
    """A fleet of 2 requests in flight, default and sheddable traffic 1 of them (critical
    traffic both); "feed" is sheddable and "checkout" critical, each with a limit of its own
    for the identities' tiers (5 and 7 a minute, so a row says whose counter it is)."""
    tiers, users = policy_of()
    own = {tiers["anonymous"]: "5/min", tiers["gold"]: "5/min", tiers["members"]: "50/min"}
    for name, criticality, rate in (
        ("feed", "sheddable", "5/min"),
        ("checkout", "critical", "7/min"),
    ):
        rule = endpoint(name, "scope", name, limits={t: rate for t in own})
        EndpointRule.objects.filter(pk=rule.pk).update(criticality=criticality)
    Protection.objects.create(in_flight=2, default_share=50, sheddable_share=50, lease=60)
    policy.current()
    return users


def own_rows(identity: str) -> list[dict[str, Any]]:
    """The identity's own counters as ``throttle_inspect`` shows them (not the fleet's, which
    is every client's)."""
    rows = as_json("throttle_inspect", label(identity))["rows"]
    assert any(row["shared"] and row["from"] == "service protection" for row in rows), rows
    return [row for row in rows if not row["shared"]]


@pytest.mark.parametrize("adapter", ADAPTERS.values(), ids=ADAPTERS.keys())
def test_a_saturated_fleet_sheds_each_identitys_sheddable_request_and_serves_its_critical_one(
    shedding: dict[str, Any], adapter: Adapter
) -> None:
    """While another client's streamed answer holds the sheddable share of the fleet, each
    identity's sheddable request is shed (503, ``Retry-After: 1``, "The service is busy")
    and charges none of its own counters, and its critical request is served (the reserve),
    charging its own; once the stream ends, the sheddable request is served again."""
    holder = Caller(adapter, HOLDER, shedding)
    callers = [Caller(adapter, identity, shedding) for identity in present()]
    inspect = sync_to_async(own_rows)

    async def scenario() -> None:
        held = await holder.get(at(adapter, "feed"))
        assert held.status_code == 200
        for caller in callers:
            identity = caller.identity
            shed = await caller.get(at(adapter, "feed"))
            assert shed.status_code == 503, identity
            assert shed["Retry-After"] == "1"
            body = json.loads(shed.content)
            assert body["detail"] == "The service is busy. Try again in 1 second.", identity
            rows = await inspect(identity)
            assert {(r["limit"], r["remaining"]) for r in rows} == {
                (r["limit"], r["capacity"]) for r in rows
            }, (identity, rows)
            served = await caller.get(at(adapter, "checkout"))
            assert served.status_code == 200, identity
            assert served["X-RateLimit-Limit"] == "7"  # its own limit, not the fleet's
            charged = {r["limit"]: r["capacity"] - r["remaining"] for r in await inspect(identity)}
            assert charged == {
                f"{tier_of(identity)} 1000/h": 1,
                f"checkout ({tier_of(identity)}) 7/min": 1,
                f"feed ({tier_of(identity)}) 5/min": 0,
            }, identity
        await holder.finish(held)
        for caller in callers:
            answered = await caller.get(at(adapter, "feed"))
            assert answered.status_code == 200, caller.identity
            await caller.finish(answered)

    async_to_sync(scenario)()


@pytest.mark.parametrize(("identity", "adapter"), every_pair())
def test_explain_shows_the_fleet_line_for_the_identity(
    shedding: dict[str, Any], identity: str, adapter: Adapter
) -> None:
    """``throttle_explain`` for the identity on the adapter's sheddable path, while the fleet
    is saturated, names the identity as typed (markup, unicode and all), lists the fleet's
    counter (service protection, every client) with its share taken, and says the next
    request is shed with 503, as the server answers it; on the critical path, allowed."""
    long_username_fits(identity)
    holder = Caller(adapter, HOLDER, shedding)
    held = async_to_sync(holder.get)(at(adapter, "feed"))
    assert held.status_code == 200
    found = as_json("throttle_explain", *who(identity), "--path", at(adapter, "feed"))
    named = f"user {identity}" if is_user(identity) else "IP 2001:db8:7:1::/64"
    assert found["label"] == named
    assert (found["scope"], found["rule"], found["tier"]) == ("feed", "feed", tier_of(identity))
    assert found["next_request"].startswith("denied (503) by sheddable"), found["next_request"]
    assert found["retry_after"] == 1
    assert found["in_flight"] == ["sheddable: 1 of 1 in flight; " + NEXT_REFUSED]
    (fleet,) = (row for row in found["rows"] if row["id"] == "fleet")
    assert (fleet["from"], fleet["counted_by"], fleet["in_flight"]) == (
        "service protection",
        "every client",
        1,
    )
    text = run("throttle_explain", *who(identity), "--path", at(adapter, "feed"))
    assert "Traceback" not in text
    assert f"Label: {named}\n" in text
    assert "denied (503) by sheddable" in text
    fleet_line = next(line for line in text.splitlines() if "│ fleet" in line)
    assert "│ service" in fleet_line and "│ every" in fleet_line  # a cell of two lines each
    found = as_json("throttle_explain", *who(identity), "--path", at(adapter, "checkout"))
    assert found["next_request"] == "allowed"
    assert found["in_flight"] == ["critical: 1 of 2 in flight"]
    async_to_sync(holder.finish)(held)


def test_the_admin_inspector_says_a_shed_request_is_denied_with_503(
    shedding: dict[str, Any], admin_client: Any
) -> None:
    """The admin inspector's explanation, for a sheddable path while the fleet is saturated,
    names the status the server answers with (503), not a client's 429."""
    adapter = ADAPTERS["decorator"]
    holder = Caller(adapter, HOLDER, shedding)
    held = async_to_sync(holder.get)(at(adapter, "feed"))
    assert held.status_code == 200
    url = reverse("admin:django_throttle_usagecount_inspect")
    page = admin_client.get(url, {"client": "203.0.113.9", "path": at(adapter, "feed")})
    text = page.content.decode()
    assert page.status_code == 200
    assert "denied (503) by sheddable" in text and "denied (429)" not in text, text
    async_to_sync(holder.finish)(held)


def test_the_admin_inspector_explains_a_path_no_check_meets(admin_client: Any) -> None:
    """A path that resolves to no throttled view has no decision to give a status to: the
    inspector still answers (it was a 500 once the status joined the explanation)."""
    url = reverse("admin:django_throttle_usagecount_inspect")
    page = admin_client.get(url, {"client": "203.0.113.9", "method": "POST", "path": "/nowhere/"})
    assert page.status_code == 200
    assert "denied (" not in page.content.decode()


# -- regions ------------------------------------------------------------------------------------

EDGE = "10.0.0.5"  # the trusted proxy
OUTSIDE = "198.51.100.7"  # a user's own address, talking to Django directly
#: The rule "local": 4 a minute, 2 from Brazil (the identities' tiers).
LOCAL = {"": "4/min", "BR": "2/min"}


@pytest.fixture
def regional(settings: Any) -> dict[str, Any]:
    settings.DJANGO_THROTTLE_REGION_SOURCE = "header:CF-IPCountry"
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = ["10.0.0.0/8"]
    tiers, users = policy_of()
    rule = endpoint("local", "scope", "local")
    for owner in (tiers["anonymous"], tiers["gold"]):
        for regions, rate in LOCAL.items():
            EndpointLimit.objects.create(rule=rule, tier=owner, rate=rate, regions=regions)
    policy.current()
    return users


def via_edge(adapter: Adapter, identity: str, users: dict[str, Any], region: str) -> Caller:
    """The identity's client behind the trusted edge, which says where it is."""
    headers = {"CF-IPCountry": region}
    if not is_user(identity):
        headers["X-Forwarded-For"] = identity
    return Caller(adapter, identity, users, address=EDGE, headers=headers)


def direct(adapter: Adapter, identity: str, users: dict[str, Any], region: str) -> Caller:
    """The identity's client talking to Django itself, claiming a region."""
    address = OUTSIDE if is_user(identity) else identity
    return Caller(adapter, identity, users, address=address, headers={"CF-IPCountry": region})


def regional_row(identity: str) -> dict[str, Any]:
    found = as_json("throttle_inspect", label(identity), "--region", "br")
    assert (found["region"], found["regional_limits"]) == ("BR", True)
    return next(row for row in found["rows"] if row["limit"].endswith(" [BR]"))


@pytest.mark.parametrize(("identity", "adapter"), every_pair())
def test_the_regional_limit_applies_from_a_trusted_proxy_only_and_the_tools_see_it(
    regional: dict[str, Any], identity: str, adapter: Adapter
) -> None:
    """From the trusted edge saying BR, the identity meets the rule's 2 a minute of BR (the
    third request is refused); claiming BR itself, it meets the default 4 (its third request
    is served). ``throttle_inspect --region BR`` and ``throttle_explain --region BR`` show
    the regional counter used up; ``throttle_reset --region BR`` frees it."""
    long_username_fits(identity)
    edge = via_edge(adapter, identity, regional, "br")
    claimed = direct(adapter, identity, regional, "BR")

    async def send(caller: Caller, count: int) -> list[Any]:
        return [await caller.get(at(adapter, "local")) for _ in range(count)]

    served = async_to_sync(send)(edge, 3)
    assert [r.status_code for r in served] == [200, 200, 429], identity
    assert [r["X-RateLimit-Limit"] for r in served] == ["2"] * 3
    assert int(served[-1]["Retry-After"]) >= 1
    assert json.loads(served[-1].content)["limit"] == f"local ({tier_of(identity)}) 2/min [BR]"
    untrusted = async_to_sync(send)(claimed, 3)
    assert [r.status_code for r in untrusted] == [200, 200, 200], identity
    assert [r["X-RateLimit-Limit"] for r in untrusted] == ["4"] * 3

    row = regional_row(identity)
    assert (row["capacity"], row["remaining"], row["counted_by"]) == (2, 0, "this client")
    found = as_json(
        "throttle_explain", *who(identity), "--path", at(adapter, "local"), "--region", "BR"
    )
    assert found["region"] == "BR (its regional limits)"
    assert found["next_request"].startswith(
        f"denied (429) by local ({tier_of(identity)}) 2/min [BR]"
    ), found["next_request"]
    text = run("throttle_explain", *who(identity), "--path", at(adapter, "local"), "--region", "BR")
    assert "BR (its regional limits)" in text and "Traceback" not in text
    # Without --region: the default counter, 3 of its 4 used.
    found = as_json("throttle_explain", *who(identity), "--path", at(adapter, "local"))
    assert (found["region"], found["next_request"]) == ("none (the default limits)", "allowed")

    done = as_json("throttle_reset", label(identity), "--region", "BR")
    assert done["reset"] >= 1
    assert regional_row(identity)["remaining"] == 2
    again = async_to_sync(send)(edge, 1)
    assert again[0].status_code == 200 and again[0]["X-RateLimit-Remaining"] == "1"


# -- adaptive limits ----------------------------------------------------------------------------


@pytest.fixture
def halved() -> dict[str, Any]:
    """anonymous and gold at 50 %: the rule "scaled" gives them 4 a minute, 2 at 50 %; the
    rule "guarded" counts 3 a minute by IP address and 6 by username, never scaled."""
    tiers, users = policy_of(load_factor=50)
    scaled_rule = endpoint("scaled", "scope", "scaled")
    guarded = endpoint("guarded", "scope", "guarded")
    for owner in (tiers["anonymous"], tiers["gold"]):
        EndpointLimit.objects.create(rule=scaled_rule, tier=owner, rate="4/min")
        for counted_by, rate in (("ip", "3/min"), ("username", "6/min")):
            EndpointLimit.objects.create(rule=guarded, tier=owner, rate=rate, counted_by=counted_by)
    policy.current()
    return users


@pytest.mark.parametrize(("identity", "adapter"), every_pair())
def test_a_tier_at_half_admits_half_its_limit_and_the_tools_say_so(
    halved: dict[str, Any], identity: str, adapter: Adapter
) -> None:
    """At a load factor of 50 %, the rule's 4 a minute admits exactly 2 of the identity's
    requests, then 429 with ``Retry-After`` and the scaled limit in ``X-RateLimit-Limit``;
    ``throttle_inspect`` and ``throttle_explain`` show the limit of 2 used up."""
    long_username_fits(identity)
    caller = Caller(adapter, identity, halved)

    async def send() -> list[Any]:
        return [await caller.get(at(adapter, "scaled")) for _ in range(3)]

    responses = async_to_sync(send)()
    assert [r.status_code for r in responses] == [200, 200, 429], identity
    assert [r["X-RateLimit-Limit"] for r in responses] == ["2"] * 3
    assert [r["X-RateLimit-Remaining"] for r in responses] == ["1", "0", "0"]
    assert 1 <= int(responses[-1]["Retry-After"]) <= 30

    rows = as_json("throttle_inspect", label(identity))["rows"]
    (row,) = (r for r in rows if r["limit"].startswith("scaled "))
    assert (row["capacity"], row["remaining"]) == (2, 0)
    (whole,) = (r for r in rows if r["from"] == f"tier '{tier_of(identity)}'")
    assert whole["capacity"] == 500  # the tier's own 1000 an hour, halved too
    found = as_json("throttle_explain", *who(identity), "--path", at(adapter, "scaled"))
    assert found["next_request"].startswith("denied (429)"), found["next_request"]
    (met,) = (r for r in found["rows"] if r["limit"].startswith("scaled "))
    assert (met["capacity"], met["remaining"]) == (2, 0)


def test_limits_counted_by_ip_address_or_username_are_never_scaled(
    halved: dict[str, Any],
) -> None:
    """Login protection protects accounts, not capacity: the rule "guarded" (a credential
    rule, having a row counted by username) admits 3 of each identity's requests by its
    address though the identity's tier is at 50 %, and ``throttle_inspect`` shows the rows
    by IP address and by username unscaled (3 and 6)."""
    adapter = ADAPTERS["drf"]
    for n, identity in enumerate(present()):
        address = f"198.51.100.{n + 1}" if is_user(identity) else identity  # an IP counter each
        caller = Caller(adapter, identity, halved, address=address)

        async def send(caller: Caller = caller) -> list[int]:
            return [(await caller.get(at(adapter, "guarded"))).status_code for _ in range(4)]

        assert async_to_sync(send)() == [200, 200, 200, 429], identity
        rows = as_json("throttle_inspect", label(identity), "--ip", address)["rows"]
        guarded = [r for r in rows if r["limit"].startswith("guarded ")]
        by_ip = [r for r in guarded if r["counter"].startswith("ip:")]
        assert by_ip and {r["capacity"] for r in by_ip} == {3}, (identity, by_ip)
        (own,) = (r for r in by_ip if r["limit"] == f"guarded ({tier_of(identity)}) 3/min")
        assert own["remaining"] == 0, identity
        by_name = [r for r in guarded if r["counter"].startswith("username:")]
        if is_user(identity):  # an anonymous client presents no username
            assert by_name and {r["capacity"] for r in by_name} == {6}, (identity, by_name)
