"""A refund gives back what the refunded request took, never what a later request took.

A rule counting only successes or only failures reserves at entry and gives the reservation
back once the response shows an outcome it does not count. Requests overlap: when a request
that started first is refunded after a later one was counted, the sliding log removed the
newest entry (the later, counted request's) and kept the refunded one's older entry, which
then left the window early: three counted requests passed a 2/min limit within 60 s. The
hit now names the instant it took its tokens at (``Decision.taken``) and the refund gives
back exactly that (``Backend.refund(..., taken_at=)``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient
from django.urls import path

from django_throttle.backends import get_backend
from django_throttle.backends.base import Backend
from django_throttle.credentials import protect_credentials
from django_throttle.decorators import throttle
from django_throttle.inspection.clients import inspect
from django_throttle.inspection.subjects import parse_client
from django_throttle.models import EndpointLimit, EndpointRule, Tier, TierAssignment
from django_throttle.policy import live as policy
from django_throttle.rates import Algorithm, Limit

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.test_refund_seams")]

T0 = 1_700_000_000.0
#: Set by the view once a request with ``?hold`` is past its check; the test then lets it go.
ENTERED: dict[str, asyncio.Event] = {}
RELEASE: dict[str, asyncio.Event] = {}


@throttle(scope="login")
async def login(request: HttpRequest) -> HttpResponse:
    hold = request.GET.get("hold")
    if hold:
        ENTERED[hold].set()
        await RELEASE[hold].wait()
    return HttpResponse("", status=int(request.GET.get("status", "200")))


def answer(request: HttpRequest) -> HttpResponse:
    """A sign-in form (a signed-in user confirming their password, say): answers ``?status``."""
    return HttpResponse("", status=int(request.GET.get("status", "200")))


async def aanswer(request: HttpRequest) -> HttpResponse:
    return HttpResponse("", status=int(request.GET.get("status", "200")))


# Two checks per request: the view's throttle under the rules of scope "login" (the tier's
# limits and the rule's), then the credential check of scope "guard" (its rule's alone).
urlpatterns = [
    path("login/", login),
    path("confirm/", throttle(scope="login")(protect_credentials(answer, scope="guard"))),
    path("async-confirm/", throttle(scope="login")(protect_credentials(aanswer, scope="guard"))),
]


@pytest.mark.parametrize("counts", ["failures", "success"])
def test_an_overlapping_refund_keeps_the_later_request_counted(settings: Any, counts: str) -> None:
    """A starts at 0 s and holds; B starts at 30 s and is counted; A then ends with an
    outcome the rule does not count. At 61 s, B (30 s) is still in the last minute, so of C
    and D only one more may pass: the later request, not the refunded one, stays counted."""
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    anonymous.limits.create(rate="1000/min")
    rule = EndpointRule.objects.create(name="login", pattern="login", counts=counts)
    EndpointLimit.objects.create(
        rule=rule, tier=anonymous, rate="2/min", algorithm=Algorithm.SLIDING_LOG
    )
    policy.current()
    now = [T0]
    get_backend().clock = lambda: now[0]  # type: ignore[attr-defined]
    counted, uncounted = (401, 200) if counts == "failures" else (200, 401)

    async def run() -> list[int]:
        client = AsyncClient()
        ENTERED["a"], RELEASE["a"] = asyncio.Event(), asyncio.Event()
        first = asyncio.ensure_future(client.get("/login/", {"hold": "a", "status": uncounted}))
        await ENTERED["a"].wait()  # A took its token at T0
        now[0] = T0 + 30
        second = (await client.get("/login/", {"status": counted})).status_code
        RELEASE["a"].set()
        a = (await first).status_code  # A ends uncounted: its reservation goes back
        now[0] = T0 + 61
        c = (await client.get("/login/", {"status": counted})).status_code
        now[0] = T0 + 62
        d = (await client.get("/login/", {"status": counted})).status_code
        return [a, second, c, d]

    assert async_to_sync(run)() == [uncounted, counted, counted, 429]


def log_limit(rate: str = "2/min") -> Limit:
    return Limit.build("seam-log", rate, algorithm=Algorithm.SLIDING_LOG)


def test_a_refund_of_an_earlier_hit_removes_that_hits_entry(backend: Backend) -> None:
    """Backend level, Redis and memory: hits at 0 s and 30 s, the first refunded at 31 s;
    at 61 s one more passes (the 30 s entry is live), at 62 s none."""
    limits = [log_limit()]
    first = backend.hit("c", limits, now=T0)
    assert backend.hit("c", limits, now=T0 + 30).allowed
    ((client, taken),) = first.taken
    assert client == "c" and taken == round(T0 * 1e6)
    backend.refund("c", limits, now=T0 + 31, taken_at=taken)
    assert backend.hit("c", limits, now=T0 + 61).allowed
    decision = backend.hit("c", limits, now=T0 + 62)
    assert not decision.allowed
    assert round(decision.retry_after) == 28  # when the 30 s entry leaves


def test_a_refund_of_a_hit_that_left_the_window_gives_nothing(backend: Backend) -> None:
    limits = [log_limit()]
    first = backend.hit("c", limits, now=T0)
    backend.hit("c", limits, now=T0 + 50)
    backend.hit("c", limits, now=T0 + 70)  # the 0 s entry has left: 50 s and 70 s are live
    backend.refund("c", limits, now=T0 + 71, taken_at=first.taken[0][1])
    assert not backend.hit("c", limits, now=T0 + 72).allowed


@pytest.mark.parametrize(
    "algorithm", [Algorithm.FIXED_WINDOW, Algorithm.SLIDING_COUNTER, Algorithm.CALENDAR]
)
def test_a_refund_of_a_hit_from_an_earlier_window_keeps_this_windows_count(
    backend: Backend, algorithm: str
) -> None:
    """A hit late in one window, refunded after a hit of the next window: the next window's
    count stays (the refunded hit was counted in a window that is over)."""
    period, rate = (86_400, "1/day") if algorithm == Algorithm.CALENDAR else (60, "1/min")
    if algorithm == Algorithm.SLIDING_COUNTER:
        rate = "2/min"  # the early hit still weighs 59/60 in the next window
    limit = Limit.build("seam-w", rate, algorithm=algorithm)  # type: ignore[arg-type]
    start = (T0 // period + 1) * period  # a window boundary
    early = backend.hit("c", [limit], now=start - 1)
    assert early.allowed
    assert backend.hit("c", [limit], now=start + 1).allowed  # counted in the new window
    backend.refund("c", [limit], now=start + 2, taken_at=early.taken[0][1])
    assert not backend.hit("c", [limit], now=start + 3).allowed


def test_a_peek_or_a_denial_takes_nothing(backend: Backend) -> None:
    limits = [log_limit("1/min")]
    assert backend.peek("c", limits, now=T0).taken == ()
    assert backend.hit("c", limits, now=T0).taken == (("c", round(T0 * 1e6)),)
    assert backend.hit("c", limits, now=T0).taken == ()


def test_an_awaited_refund_removes_that_hits_entry(backend: Backend) -> None:
    """``arefund`` (async views) gives back the same as ``refund``, on ``redis.asyncio`` too."""
    limits = [log_limit()]
    first = backend.hit("c", limits, now=T0)
    assert backend.hit("c", limits, now=T0 + 30).allowed
    async_to_sync(backend.arefund)("c", limits, now=T0 + 31, taken_at=first.taken[0][1])
    assert backend.hit("c", limits, now=T0 + 61).allowed
    assert not backend.hit("c", limits, now=T0 + 62).allowed


@pytest.mark.parametrize("where", ["redis", "memory"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_refund_leaves_out_the_shadow_limit_its_hit_never_charged(
    settings: Any, redis_url: str, where: str, kind: str
) -> None:
    """A shadow rule that would deny leaves its counter unchanged (the request passes), so
    giving that request's tokens back must leave the shadow counter out: credited a token it
    never took, a spent 1/min shadow limit reported the next request as passing it (one
    would-deny where two happened)."""
    from django.test import Client

    from django_throttle import events

    settings.DJANGO_THROTTLE_REDIS_URL = "memory://" if where == "memory" else redis_url
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    anonymous.limits.create(rate="1000/min")
    rule = EndpointRule.objects.create(name="login", pattern="login", counts="success", shadow=True)
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="1/min")
    policy.current()
    would_deny: list[bool] = []

    def seen(sender: Any, decision: Any, **kwargs: Any) -> None:
        would_deny.append(decision.shadow)

    events.request_decided.connect(seen)
    try:
        if kind == "sync":
            client = Client()
            statuses = [client.get("/login/", {"status": s}).status_code for s in (200, 500, 200)]
        else:

            async def run() -> list[int]:
                client = AsyncClient()
                return [
                    (await client.get("/login/", {"status": s})).status_code
                    for s in (200, 500, 200)
                ]

            statuses = async_to_sync(run)()
    finally:
        events.request_decided.disconnect(seen)
    # The first is counted; the second would be denied and is given back (500 is not a
    # success); the third would still be denied: the second took nothing to give back.
    assert statuses == [200, 500, 200]
    assert would_deny == [False, True, True]


#: Usernames an attacker or a user may choose: over the 256 characters a counter keeps as they
#: are (a digest then), unicode, markup.
ODD_USERNAMES = [
    "long-" + "\u00fc" * 295,
    "\u00dcn\u00efc\u00f8d\u00e9-\u7528\u6237",
    "<script>alert(1)</script>",
]


def remaining(user: Any) -> dict[tuple[str, str], int | None]:
    """What the inspector reads of every counter ``user``'s requests from 127.0.0.1 presenting
    their own username meet: (where the limit comes from, whose counter) -> tokens left."""
    found = inspect(parse_client(f"user:{user.pk}"), address="127.0.0.1")
    return {
        (bucket.where, bucket.counted_by.split(" ", 1)[0]): bucket.remaining
        for bucket in found.buckets
    }


@pytest.mark.parametrize("where", ["redis", "memory"])
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("counts", ["failures", "success"])
@pytest.mark.parametrize("username", ODD_USERNAMES, ids=["300-chars", "unicode", "markup"])
def test_a_signed_in_users_refund_leaves_out_the_shadow_limits_its_hit_spared(
    settings: Any,
    redis_url: str,
    django_user_model: Any,
    where: str,
    kind: str,
    counts: str,
    username: str,
) -> None:
    """A signed-in user of a tier that is no default, whose username is long, unicode or
    markup, presents it at a view under a shadow rule (one request by client, by IP address
    and by username) counting ``counts``, and under an enforced credential rule counting failures.
    The second request would be denied by every shadow limit, which leave it unchanged; its
    outcome is one the shadow rule does not count, so its reservation is given back: every
    shadow counter stays spent (credited a token it never took, it would let the third
    request pass unreported). The enforced counters are what their rules say: the tier's
    keeps every request, the credential rule's keeps the failures."""
    from django.db import connection
    from django.test import Client

    from django_throttle import events

    if connection.vendor != "sqlite" and len(username) > 150:
        pytest.skip("this database enforces auth_user.username's 150 characters")
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://" if where == "memory" else redis_url
    Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    Tier.objects.create(slug="free", name="Free", is_default_authenticated=True)
    gold = Tier.objects.create(slug="gold", name="Gold")
    gold.limits.create(rate="100/d")  # no token refills while the test runs
    user = django_user_model.objects.create_user(username, password="right")
    TierAssignment.objects.create(tier=gold, user=user)
    shadow = EndpointRule.objects.create(name="login", pattern="login", counts=counts, shadow=True)
    guard = EndpointRule.objects.create(name="guard", pattern="guard", counts="failures")
    # One row per rate (a rule holds a rate once per tier).
    for counted_by, rate in (("client", "1/w"), ("ip", "1/h"), ("username", "1/d")):
        EndpointLimit.objects.create(rule=shadow, tier=gold, rate=rate, counted_by=counted_by)
    for counted_by, rate in (("ip", "10/d"), ("username", "10/h")):
        EndpointLimit.objects.create(rule=guard, tier=gold, rate=rate, counted_by=counted_by)
    policy.current()
    counted, uncounted = (401, 200) if counts == "failures" else (200, 401)
    statuses = [counted, uncounted, counted]
    would_deny: list[bool] = []
    seen: list[dict[tuple[str, str], int | None]] = []

    def decided(sender: Any, decision: Any, **kwargs: Any) -> None:
        if decision.limits and any(limit.shadow for limit in decision.limits):
            would_deny.append(decision.shadow)

    form = {"username": username, "password": "wrong"}
    events.request_decided.connect(decided)
    try:
        if kind == "sync":
            client = Client()
            client.force_login(user)
            for status in statuses:
                answered = client.post(f"/confirm/?status={status}", form)
                assert answered.status_code == status
                seen.append(remaining(user))
        else:

            async def run() -> None:
                client = AsyncClient()
                await client.aforce_login(user)
                for status in statuses:
                    answered = await client.post(f"/async-confirm/?status={status}", form)
                    assert answered.status_code == status
                    seen.append(await sync_to_async(remaining)(user))

            async_to_sync(run)()
    finally:
        events.request_decided.disconnect(decided)
    # The first is counted; the second would be denied and is given back; the third would
    # still be denied: the second took nothing to give back.
    assert would_deny == [False, True, True]
    shadow_counters = {
        (key, left) for state in seen for key, left in state.items() if key[0] == "rule 'login'"
    }
    assert shadow_counters == {
        (("rule 'login'", "this"), 0),
        (("rule 'login'", "IP"), 0),
        (("rule 'login'", "username"), 0),
    }
    failures = [sum(400 <= s < 500 for s in statuses[: n + 1]) for n in range(len(statuses))]
    for n, state in enumerate(seen):
        assert state[("tier 'gold'", "this")] == 100 - (n + 1)  # a tier's limit is never refunded
        assert state[("rule 'guard'", "IP")] == 10 - failures[n]
        assert state[("rule 'guard'", "username")] == 10 - failures[n]
