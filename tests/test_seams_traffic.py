"""The seams of the two traffic-shaping modes (limits on requests in flight, and delay instead
of reject) with odd identities: admin rules (an endpoint rule's ``concurrency`` limit, and a
GCRA limit with a ``delay`` and a longest wait) met through the real middleware stack of
tests/settings.py by every adapter (``@throttle`` on a sync and an ``async def`` view, DRF's
``PolicyThrottle`` on a sync ``APIView`` and ``AsyncPolicyThrottle`` on an adrf one), driven
by Django's ``Client`` (WSGI) and ``AsyncClient`` (ASGI), for signed-in users of an assigned
tier whose usernames are 300 characters long, unicode, or markup, and an anonymous client by
IPv6 address. Each is counted on its own counter, its refusals carry ``Retry-After`` and
``X-RateLimit-*``, and the operator tools see its slots and waits and free them.

The views stream their answer: a slot stays held until the stream is read and closed, so a
slot is held with no thread and no timing. The delaying limit paces one request a second:
the tests allow a stall of most of a second between requests that go together.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any

import pytest
from adrf.views import APIView as AsyncAPIView
from asgiref.sync import ThreadSensitiveContext, async_to_sync, sync_to_async
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.test import AsyncClient, Client
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.decorators import throttle
from django_throttle.drf import AsyncPolicyThrottle
from django_throttle.models import EndpointLimit, Tier, TierAssignment
from django_throttle.policy import live as policy
from tests.clients import AddressedAsyncClient
from tests.factories import endpoint, own_connections, tier

# -- views under the admin rules "flight" (requests in flight) and "paced" (delay) -----------


def chunks() -> Iterator[bytes]:
    yield b"id,name\n"
    yield b"1,Teapot\n"


async def achunks() -> AsyncIterator[bytes]:
    for chunk in chunks():
        yield chunk


@throttle(scope="flight")
def flight_view(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(chunks())


@throttle(scope="flight")
async def flight_view_async(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(achunks())


class FlightApi(APIView):
    permission_classes = [AllowAny]
    throttle_scope = "flight"

    def get(self, request: Request) -> StreamingHttpResponse:
        return StreamingHttpResponse(chunks())


class FlightAsyncApi(AsyncAPIView):  # type: ignore[misc]
    permission_classes = [AllowAny]
    throttle_classes = [AsyncPolicyThrottle]
    throttle_scope = "flight"

    async def get(self, request: Request) -> StreamingHttpResponse:
        return StreamingHttpResponse(achunks())


@throttle(scope="paced")
def paced_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"user": request.user.get_username()})


@throttle(scope="paced")
async def paced_view_async(request: HttpRequest) -> HttpResponse:
    user = await request.auser()
    return JsonResponse({"user": user.get_username()})


class PacedApi(APIView):
    permission_classes = [AllowAny]
    throttle_scope = "paced"

    def get(self, request: Request) -> Response:
        return Response({"user": request.user.get_username()})


class PacedAsyncApi(AsyncAPIView):  # type: ignore[misc]
    permission_classes = [AllowAny]
    throttle_classes = [AsyncPolicyThrottle]
    throttle_scope = "paced"

    async def get(self, request: Request) -> Response:
        return Response({"user": request.user.get_username()})


urlpatterns = [
    path("flight/view/", flight_view),
    path("flight/view-async/", flight_view_async),
    path("flight/api/", FlightApi.as_view()),
    path("flight/api-async/", FlightAsyncApi.as_view()),
    path("paced/view/", paced_view),
    path("paced/view-async/", paced_view_async),
    path("paced/api/", PacedApi.as_view()),
    path("paced/api-async/", PacedAsyncApi.as_view()),
]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]


@dataclass(frozen=True)
class Adapter:
    """One adapter: its views' path suffix, and whether it is an ``async def`` view (driven
    through ``AsyncClient``) or a sync one (through ``Client``)."""

    suffix: str
    asgi: bool

    @property
    def flight(self) -> str:
        return f"/flight/{self.suffix}/"

    @property
    def paced(self) -> str:
        return f"/paced/{self.suffix}/"


ADAPTERS = {
    "decorator": Adapter("view", asgi=False),
    "decorator-async": Adapter("view-async", asgi=True),
    "drf": Adapter("api", asgi=False),
    "drf-async": Adapter("api-async", asgi=True),
}

#: The identities: signed-in users of the assigned tier "gold" (by username), and an
#: anonymous client by IPv6 address (a client is its /64 network).
LONG = "u" * 299 + "Z"
UNICODE = "Zoë-用户-🚀"
MARKUP = "<script>[markup]</script>&amp;"
IPV6 = "2001:db8:7:1::5"
IDENTITIES = {"300": LONG, "unicode": UNICODE, "markup": MARKUP, "ipv6": IPV6}

#: Slots of the "flight" rule per tier: the assigned tier's differ from both defaults', so
#: the headers say which tier a request met.
SLOTS = {"anonymous": 1, "members": 5, "gold": 2}
#: The "paced" rule: one request a second, three at once at most, the first served at once
#: and the others waiting their turn, none longer than a second (the third of three sent
#: together would wait two: refused). Members (a default tier) are not paced at all.
PACE = {"rate": "1/s", "burst": 3, "algorithm": "gcra", "delay": 0, "max_wait": 1.0}


def is_user(identity: str) -> bool:
    """A signed-in user's username, not an anonymous client's address."""
    return identity in (LONG, UNICODE, MARKUP)


def slots(identity: str) -> int:
    return SLOTS["gold" if is_user(identity) else "anonymous"]


@pytest.fixture
def users(db: Any) -> dict[str, Any]:
    """The policy (tiers anonymous and members, the defaults, and gold, assigned; rules
    "flight" and "paced") and the signed-in users of gold, by username."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    members = tier("members", "1000/h", is_default_authenticated=True)
    gold = tier("gold", "1000/h")
    flight = endpoint("flight", "scope", "flight")
    paced = endpoint("paced", "scope", "paced", limits={members: "1000/h"})
    for row in (anonymous, members, gold):
        rate = f"{SLOTS[row.slug]}/min"
        EndpointLimit.objects.create(rule=flight, tier=row, rate=rate, algorithm="concurrency")
    for row in (anonymous, gold):
        EndpointLimit.objects.create(rule=paced, tier=row, **PACE)
    found = sign_up(gold)
    policy.current()  # the policy loaded here: a thread making a request reads none of it
    return found


def sign_up(assigned: Tier) -> dict[str, Any]:
    """The signed-in users this database can hold, each assigned to the tier ``assigned``,
    by username."""
    found = {}
    for username in filter(is_user, present()):
        user = get_user_model().objects.create_user(username, password="pw")
        TierAssignment.objects.create(tier=assigned, user=user)
        found[username] = user
    return found


def present() -> list[str]:
    """The identities this database can hold: SQLite keeps a username of 300 characters,
    a database that enforces ``auth_user.username``'s 150 does not."""
    return [i for i in IDENTITIES.values() if i != LONG or connection.vendor == "sqlite"]


def long_username_fits(identity: str) -> None:
    if identity not in present():
        pytest.skip("this database enforces auth_user.username's 150 characters")


class Caller:
    """One identity's client of one adapter: ``Client`` for a sync view, ``AsyncClient`` for
    an ``async def`` one, signed in by a real session cookie (a user) or sending from its
    address (anonymous). Its methods are awaited, so one scenario serves both: a sync
    client's request runs in the test's thread, or in threads of its own for requests sent
    together. ``address`` is where its requests come from (by default an anonymous client's
    own, a user's loopback: a proxy's, forwarding for it, when given), with ``headers`` on
    each."""

    def __init__(
        self,
        adapter: Adapter,
        identity: str,
        users: dict[str, Any],
        *,
        address: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.adapter = adapter
        self.identity = identity
        self.headers = dict(headers or {})
        if address is None and not is_user(identity):
            address = identity
        self.environ: dict[str, Any] = {} if address is None else {"REMOTE_ADDR": address}
        self.client: Client | AsyncClient = (
            AddressedAsyncClient(address or "127.0.0.1") if adapter.asgi else Client(**self.environ)
        )
        if is_user(identity):
            self.client.force_login(users[identity])

    async def get(self, path: str) -> Any:
        if isinstance(self.client, AsyncClient):
            return await self.client.get(path, headers=self.headers)
        return await sync_to_async(self.client.get)(path, headers=self.headers)

    async def together(self, path: str, count: int) -> list[Any]:
        """``count`` requests sent at once: on the event loop (ASGI), or each from a thread
        of its own (WSGI), with the same session cookie."""
        if isinstance(self.client, AsyncClient):
            client = self.client
            return list(
                await _gather(*(client.get(path, headers=self.headers) for _ in range(count)))
            )
        clones = []
        for _ in range(count):
            clone = Client(**self.environ)
            clone.cookies = SimpleCookie(self.client.cookies)
            clones.append(sync_to_async(own_connections(clone.get), thread_sensitive=False))
        return list(await _gather(*(get(path, headers=self.headers) for get in clones)))

    async def finish(self, response: Any) -> bytes:
        """Read a streamed answer to its end and close it: its slot is given back."""
        if self.adapter.asgi:
            return b"".join([chunk async for chunk in response.streaming_content])

        def read() -> bytes:
            body = b"".join(response.streaming_content)
            response.close()
            return body

        return await sync_to_async(read)()


async def _gather(*calls: Any) -> list[Any]:
    return list(await asyncio.gather(*calls))


def run(command: str, *args: str) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def as_json(command: str, *args: str) -> Any:
    return json.loads(run(command, *args, "--format", "json"))


def label(identity: str) -> str:
    """The client as an operator types it."""
    return f"user:{identity}" if is_user(identity) else identity


def in_flight_row(identity: str) -> dict[str, Any]:
    found = as_json("throttle_inspect", label(identity))
    return next(row for row in found["rows"] if row["algorithm"] == "concurrency")


def assert_refused(response: Any, limit: int, remaining: int = 0) -> None:
    """A refusal as the docs promise: 429, ``Retry-After`` at most a second away (a slot
    frees when a request ends; a turn comes one interval later), and ``X-RateLimit-*``."""
    assert response.status_code == 429
    assert response["Retry-After"] == "1"
    assert response["X-RateLimit-Limit"] == str(limit)
    assert response["X-RateLimit-Remaining"] == str(remaining)
    assert int(response["X-RateLimit-Reset"]) >= 0
    assert "X-RateLimit-Delayed" not in response


def pairs() -> list[Any]:
    """Each identity with an adapter of its own, every adapter once."""
    return [
        pytest.param(identity, adapter, id=f"{name}-{kind}")
        for (name, identity), (kind, adapter) in zip(
            IDENTITIES.items(), ADAPTERS.items(), strict=True
        )
    ]


# -- requests in flight ----------------------------------------------------------------------


@pytest.mark.parametrize("adapter", ADAPTERS.values(), ids=ADAPTERS.keys())
def test_each_identity_holds_slots_of_its_own_in_its_tier(
    users: dict[str, Any], adapter: Adapter
) -> None:
    """Every identity takes all its tier's slots while the identities before it hold theirs
    (a user of 300 characters, unicode or markup, the anonymous IPv6 client), each of them
    is then refused its next request, and one giving its slots back gets a slot again while
    the others are still refused."""
    callers = [Caller(adapter, identity, users) for identity in present()]

    async def scenario() -> None:
        held: dict[str, list[Any]] = {}
        for caller in callers:
            taken = [await caller.get(adapter.flight) for _ in range(slots(caller.identity))]
            assert [r.status_code for r in taken] == [200] * len(taken), caller.identity
            assert [r["X-RateLimit-Limit"] for r in taken] == [str(len(taken))] * len(taken)
            assert taken[-1]["X-RateLimit-Remaining"] == "0"
            held[caller.identity] = taken
        for caller in callers:
            assert_refused(await caller.get(adapter.flight), slots(caller.identity))
        first, *others = callers
        for response in held.pop(first.identity):
            assert await first.finish(response) == b"id,name\n1,Teapot\n"
        again = await first.get(adapter.flight)
        assert again.status_code == 200
        await first.finish(again)
        for caller in others:
            assert_refused(await caller.get(adapter.flight), slots(caller.identity))
            for response in held.pop(caller.identity):
                await caller.finish(response)
            answered = await caller.get(adapter.flight)
            assert answered.status_code == 200, caller.identity
            await caller.finish(answered)

    async_to_sync(scenario)()


def test_ipv6_clients_are_counted_by_their_64_network(users: dict[str, Any]) -> None:
    """Two addresses of one /64 are one client (one slot between them); an address of the
    next /64 is another."""
    adapter = ADAPTERS["drf"]
    neighbour = "2001:db8:7:1:ffff::9"
    elsewhere = "2001:db8:7:2::5"

    async def scenario() -> list[int]:
        holder = Caller(adapter, IPV6, users)
        held = await holder.get(adapter.flight)
        statuses = [held.status_code]
        for address in (neighbour, elsewhere):
            other = Caller(adapter, address, users)
            response = await other.get(adapter.flight)
            statuses.append(response.status_code)
            if response.status_code == 200:
                await other.finish(response)
        await holder.finish(held)
        return statuses

    assert async_to_sync(scenario)() == [200, 429, 200]


@pytest.mark.parametrize(("identity", "adapter"), pairs())
def test_inspect_shows_the_held_slots_and_reset_frees_them(
    users: dict[str, Any], identity: str, adapter: Adapter
) -> None:
    """``throttle_inspect`` names the odd identity as an operator types it and shows its
    slots in flight; ``throttle_reset`` frees them, so the next request gets a slot though
    the requests holding them still run; their slots given back later free nothing more."""
    long_username_fits(identity)
    caller = Caller(adapter, identity, users)
    count = slots(identity)
    inspect = sync_to_async(in_flight_row)
    reset = sync_to_async(as_json)

    async def scenario() -> None:
        held = [await caller.get(adapter.flight) for _ in range(count)]
        assert [r.status_code for r in held] == [200] * count
        row = await inspect(identity)
        assert (row["capacity"], row["in_flight"], row["remaining"]) == (count, count, 0)
        assert len(row["leases"]) == count
        assert all(0 < lease["ends_in_seconds"] <= 60 for lease in row["leases"])
        shown = await sync_to_async(as_json)("throttle_inspect", label(identity))
        named = f"user {identity}" if is_user(identity) else "IP 2001:db8:7:1::/64"
        assert shown["label"] == named
        if identity != LONG:  # a title that fits a line: the label as typed, markup and all
            assert f"{named} (" in await sync_to_async(run)("throttle_inspect", label(identity))
        assert_refused(await caller.get(adapter.flight), count)

        done = await reset("throttle_reset", label(identity))
        assert done["reset"] >= 1
        assert (await inspect(identity))["in_flight"] == 0
        fresh = await caller.get(adapter.flight)
        assert fresh.status_code == 200
        assert (await inspect(identity))["in_flight"] == 1
        for response in held:  # released by lease id: the reset's free slots stay free
            await caller.finish(response)
        assert (await inspect(identity))["in_flight"] == 1
        await caller.finish(fresh)
        assert (await inspect(identity))["in_flight"] == 0

    async_to_sync(scenario)()


@pytest.mark.parametrize(("identity", "adapter"), pairs())
def test_explain_shows_the_full_slots_of_the_identity(
    users: dict[str, Any], identity: str, adapter: Adapter
) -> None:
    """``throttle_explain`` for the identity (``--user`` with the odd username, or
    ``--ip``) and the adapter's path says every slot is taken and the next request is
    refused, with the ``Retry-After`` the server gives."""
    long_username_fits(identity)
    caller = Caller(adapter, identity, users)
    count = slots(identity)
    who = ("--user", identity) if is_user(identity) else ("--ip", identity)
    explain = sync_to_async(as_json)

    async def scenario() -> None:
        held = [await caller.get(adapter.flight) for _ in range(count)]
        found = await explain("throttle_explain", *who, "--path", adapter.flight)
        assert found["next_request"].startswith("denied (429)"), found["next_request"]
        assert (found["scope"], found["rule"]) == ("flight", "flight")
        assert found["tier"] == ("gold" if is_user(identity) else "anonymous")
        assert found["retry_after"] == 1
        (line,) = found["in_flight"]
        assert f"{count} of {count} in flight" in line
        for response in held:
            await caller.finish(response)
        found = await explain("throttle_explain", *who, "--path", adapter.flight)
        assert found["next_request"] == "allowed"

    async_to_sync(scenario)()


# -- delay instead of reject -----------------------------------------------------------------


#: Every adrf release this package supports (0.1.9 to 0.1.14, the latest) runs
#: ``APIView.initial()`` (authentication, permissions, throttles) through ``sync_to_async``
#: (``adrf/views.py`` ``async_dispatch``), and its ``check_throttles`` awaits an async
#: throttle through ``async_to_sync``: the throttle's coroutine runs on the event loop while
#: the worker thread blocks on it. adrf offers no public way to await a throttle outside
#: that thread, so this package does not work around it (docs/howto/delay.md says so).
ADRF_HOLDS_A_THREAD = (
    "adrf (0.1.9 to 0.1.14) awaits AsyncPolicyThrottle from initial(), which it runs in a "
    "worker thread (sync_to_async, then async_to_sync), and offers no public way to await a "
    "throttle outside it: that thread blocks for the whole wait for a turn"
)
#: Why requests sent together to an adrf view are decided one after another in this test.
ADRF_ONE_THREAD_HERE = ADRF_HOLDS_A_THREAD + (
    ". Here, outside Django's ASGI handler (AsyncClient enters no ThreadSensitiveContext, "
    "and the scenario runs under async_to_sync), the initial() of every request runs in the "
    "test's one thread, so requests sent together are decided one after another: the third "
    "only after the second's wait, and served"
)
#: Every adapter; the adrf one fails here the promise that requests sent together wait
#: together (under Django's ASGI handler it keeps it, holding a thread a request: see
#: test_adrf_views_sent_together_wait_together_each_holding_a_thread).
DELAY_ADAPTERS = [
    pytest.param(
        adapter,
        id=kind,
        marks=[pytest.mark.xfail(strict=True, reason=ADRF_ONE_THREAD_HERE)]
        if kind == "drf-async"
        else [],
    )
    for kind, adapter in ADAPTERS.items()
]


@pytest.mark.parametrize("adapter", DELAY_ADAPTERS)
def test_each_identity_waits_its_own_turns(users: dict[str, Any], adapter: Adapter) -> None:
    """Each identity sends three requests at once, right after the one before it: one is
    served at once, one after waiting its turn (``X-RateLimit-Delayed``), and the third,
    which would wait longer than a second, is refused with ``Retry-After`` and
    ``X-RateLimit-*``. The turns an identity reserved delay no other."""
    callers = [Caller(adapter, identity, users) for identity in present()]

    async def scenario() -> None:
        for caller in callers:
            responses = await caller.together(adapter.paced, 3)
            seen = [(r.status_code, r.get("X-RateLimit-Delayed")) for r in responses]
            statuses = sorted(r.status_code for r in responses)
            assert statuses == [200, 200, 429], (caller.identity, seen)
            served = [r for r in responses if r.status_code == 200]
            waits = sorted(float(r.get("X-RateLimit-Delayed", "0")) for r in served)
            assert waits[0] == 0 and 0 < waits[1] <= 1.0, (caller.identity, waits)
            assert all(r["X-RateLimit-Limit"] == "3" for r in served)
            expected = caller.identity if is_user(caller.identity) else ""
            assert all(r.json() == {"user": expected} for r in served)
            (refused,) = (r for r in responses if r.status_code == 429)
            # Refused for its wait, not for the burst: one of the burst's three is left, but
            # no request sent now is admitted (it would wait too long), so none remains.
            assert_refused(refused, 3, remaining=0)

    async_to_sync(scenario)()


@pytest.mark.parametrize(("identity", "adapter"), pairs())
def test_a_delayed_response_says_so_and_explain_says_the_next_would_wait(
    users: dict[str, Any], identity: str, adapter: Adapter
) -> None:
    """One request after the other, as a client that waits for its answers: the second waits
    its turn and says how long; ``throttle_explain`` then says the next request would wait
    for its turn too, and ``throttle_reset`` gives the identity its turns back."""
    long_username_fits(identity)
    caller = Caller(adapter, identity, users)
    who = ("--user", identity) if is_user(identity) else ("--ip", identity)

    async def send() -> list[Any]:
        return [await caller.get(adapter.paced) for _ in range(2)]

    first, second = async_to_sync(send)()
    assert (first.status_code, second.status_code) == (200, 200)
    assert "X-RateLimit-Delayed" not in first
    assert 0 < float(second["X-RateLimit-Delayed"]) <= 1.0
    found = as_json("throttle_explain", *who, "--path", adapter.paced)
    assert found["next_request"].startswith("allowed after waiting "), found["next_request"]
    assert (found["scope"], found["rule"]) == ("paced", "paced")
    assert found["tier"] == ("gold" if is_user(identity) else "anonymous")
    assert "for its turn (a delaying limit)" in found["next_request"]

    run("throttle_reset", label(identity))
    found = as_json("throttle_explain", *who, "--path", adapter.paced)
    assert found["next_request"] == "allowed"


def test_adrf_views_sent_together_wait_together_each_holding_a_thread(
    users: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an adrf view does instead, as docs/howto/delay.md says: under Django's ASGI
    handler, which gives each request a thread of its own for its sync code
    (``ThreadSensitiveContext``), adrf views sent together are decided together (one served at
    once, one after waiting its turn, the third refused), each in its own thread, and the
    delayed one's ``initial()`` lasts its wait: its thread is held meanwhile."""
    held: dict[str, float] = {}  # by thread name (unique, unlike an ident)
    initial = PacedAsyncApi.initial

    def timed(self: PacedAsyncApi, request: Request, *args: Any, **kwargs: Any) -> None:
        began = time.monotonic()
        try:
            initial(self, request, *args, **kwargs)
        finally:
            held[threading.current_thread().name] = time.monotonic() - began

    monkeypatch.setattr(PacedAsyncApi, "initial", timed)
    adapter = ADAPTERS["drf-async"]
    caller = Caller(adapter, IPV6, users)

    async def one() -> Any:
        async with ThreadSensitiveContext():  # as ASGIHandler.__call__ enters for a request
            return await caller.get(adapter.paced)

    async def send() -> list[Any]:
        return list(await asyncio.gather(*(one() for _ in range(3))))

    # Run as a server runs it: from no sync thread (under async_to_sync, every thread-
    # sensitive call would run in the test's own thread, one after another).
    responses = asyncio.run(send())
    assert sorted(r.status_code for r in responses) == [200, 200, 429]
    waits = sorted(float(r.get("X-RateLimit-Delayed", "0")) for r in responses)
    waited = waits[-1]
    assert waits[:2] == [0.0, 0.0] and waited > 0.5, waits
    assert len(held) == 3, held  # three threads, one a request
    assert max(held.values()) > waited - 0.01, (held, waited)  # the header is rounded


@pytest.mark.xfail(strict=True, reason=ADRF_HOLDS_A_THREAD)
def test_an_adrf_view_waits_its_turn_without_holding_a_thread(
    users: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait for a turn on an adrf view happens on the event loop, not in the worker
    thread adrf runs ``initial()`` in: ``initial()`` returns long before the wait ends."""
    held: list[float] = []
    initial = PacedAsyncApi.initial

    def timed(self: PacedAsyncApi, request: Request, *args: Any, **kwargs: Any) -> None:
        began = time.monotonic()
        try:
            initial(self, request, *args, **kwargs)
        finally:
            held.append(time.monotonic() - began)

    monkeypatch.setattr(PacedAsyncApi, "initial", timed)
    adapter = ADAPTERS["drf-async"]
    caller = Caller(adapter, IPV6, users)

    async def send() -> list[Any]:
        return [await caller.get(adapter.paced) for _ in range(2)]

    first, second = async_to_sync(send)()
    assert "X-RateLimit-Delayed" not in first
    waited = float(second["X-RateLimit-Delayed"])
    assert waited > 0.5  # sent right after the first: its turn is most of a second away
    assert held[1] < waited / 2, (held, waited)
