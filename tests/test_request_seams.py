"""The seams of the request path: every adapter (the ``@throttle`` decorator on sync and
``async def`` views, the DRF throttle class on a sync ``APIView`` and an adrf async one,
``protect_credentials`` on sync and async views) through the real middleware stack (sessions,
authentication, CSRF, messages, the headers middleware of tests/settings.py), driven by
Django's ``Client`` (WSGI) and ``AsyncClient`` (ASGI), for anonymous callers, signed-in users
of a tier of their own with odd usernames, and API key holders, with GET and HEAD.

The defects found outside all sat where two features meet: a lazy ``request.user`` on an
event loop, a credential rule looked up by the caller's tier, a GET rule and HEAD, a rule
whose counters deny one after another. Each test here crosses one such seam for every
adapter that has it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpResponseBase
from django.test import AsyncClient, Client

from django_throttle import backends
from django_throttle.backends.memory import MemoryBackend
from django_throttle.models import (
    ApiKey,
    EndpointLimit,
    EndpointRule,
    Exemption,
    Tier,
    TierAssignment,
)
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db


#: Views under the GET rule of scope "seam": the decorator and the DRF throttle class.
VIEWS = {
    "decorator": "/seams/view/",
    "decorator-async": "/seams/view-async/",
    "drf": "/seams/api/",
    "drf-async": "/seams/api-async/",
}
#: Views under the credential rule of scope "seam-login": protect_credentials, ``@throttle``
#: (no ``credential=True``: the rule's rows make it one), and the DRF throttle class on a
#: token view (``throttle_credential``).
LOGINS = {
    "protect_credentials": "/seams/login/",
    "protect_credentials-async": "/seams/login-async/",
    "decorator": "/seams/login-decorated/",
    "decorator-async": "/seams/login-decorated-async/",
    "drf-token": "/seams/token/",
    "drf-token-async": "/seams/token-async/",
}
#: Usernames of signed-in callers: the longest Django allows, unicode, rich markup.
USERNAMES = ["u" * 150, "ünïcødé-名前", "[markup]"]
#: Usernames presented at a login: longer than any label, unicode, rich markup.
PRESENTED = ["v" * 300, "ünïcødé-受害者", "[/x][link=https://example.com]victim"]

#: The "seam" rule's limits per tier (names GET only); tiers' own limits are far higher.
ANONYMOUS_LIMIT = 2
GOLD_LIMIT = 4
#: The credential rule's counters, given to the anonymous tier only (as the demo does).
IP_RATE = "3/min"  # a token every 20 s
USERNAME_RATE = "3/h"  # a token every 1,200 s
USERNAME_WAIT = 1200


@pytest.fixture(params=["redis", "memory"])
def backend_name(request: pytest.FixtureRequest, settings: Any) -> str:
    if request.param == "memory":
        settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    return str(request.param)


@pytest.fixture
def gold(db: Any) -> Tier:
    """The policy: anonymous (default), members (default for signed-in users) and gold, an
    assigned tier; rule "seam" limits GET per tier, rule "seam-login" counts failed logins
    by IP address and username for the anonymous tier only."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    tier("members", "1000/h", is_default_authenticated=True)
    gold = tier("gold", "1000/h")
    endpoint(
        "seam",
        "scope",
        "seam",
        methods="GET",
        limits={anonymous: f"{ANONYMOUS_LIMIT}/h", gold: f"{GOLD_LIMIT}/h"},
    )
    rule = EndpointRule.objects.create(
        name="seam-login", pattern="seam-login", counts=EndpointRule.Counts.FAILURES
    )
    for rate, counted_by in ((IP_RATE, "ip"), (USERNAME_RATE, "username")):
        EndpointLimit.objects.create(rule=rule, tier=anonymous, rate=rate, counted_by=counted_by)
    return gold


def gold_user(gold: Tier, username: str = "attacker", **flags: Any) -> AbstractBaseUser:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username, password="right", **flags)
    TierAssignment.objects.create(tier=gold, user=user)
    return user


def send(
    kind: str,
    requests: list[tuple[str, str, dict[str, Any]]],
    user: AbstractBaseUser | None = None,
    headers: dict[str, str] | None = None,
) -> list[HttpResponseBase]:
    """Send ``(method, path, data)`` requests in order through the whole stack: Django's
    ``Client`` (WSGI) for ``kind`` "wsgi", ``AsyncClient`` (ASGI) for "asgi"; signed in as
    ``user`` when given (a real session cookie)."""
    client: Client | AsyncClient = Client() if kind == "wsgi" else AsyncClient()
    if user is not None:
        client.force_login(user)

    def call(method: str, path: str, data: dict[str, Any]) -> Any:
        handler: Callable[..., Any] = getattr(client, method.lower())
        if method == "POST":
            return handler(path, data, headers=headers)
        return handler(path, headers=headers)

    if kind == "wsgi":
        return [call(*request) for request in requests]

    async def run() -> list[HttpResponseBase]:
        return [await call(*request) for request in requests]

    return async_to_sync(run)()


def statuses(responses: list[HttpResponseBase]) -> list[int]:
    return [response.status_code for response in responses]


def methods(sequence: str, count: int) -> list[str]:
    if sequence == "mixed":
        return ["GET" if n % 2 == 0 else "HEAD" for n in range(count)]
    return [sequence] * count


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("sequence", ["GET", "HEAD", "mixed"])
@pytest.mark.parametrize("view", VIEWS)
def test_every_adapter_limits_each_caller_by_its_tier(
    gold: Tier, view: str, sequence: str, kind: str
) -> None:
    """Anonymous callers meet the anonymous tier's share of the GET rule, each signed-in
    user (odd usernames) the share of the tier assigned to them, and HEAD (answered by the
    GET handler) counts against the same rule: never a 500, never a free pass."""
    for username in [None, *USERNAMES]:
        user = None if username is None else gold_user(gold, username)
        limit = ANONYMOUS_LIMIT if user is None else GOLD_LIMIT
        requests = [(method, VIEWS[view], {}) for method in methods(sequence, limit + 1)]
        responses = send(kind, requests, user)
        assert statuses(responses) == [200] * limit + [429], username
        assert [r["X-RateLimit-Limit"] for r in responses] == [str(limit)] * (limit + 1)
        assert int(responses[-1]["Retry-After"]) > 1
        if requests[0][0] == "GET":
            assert responses[0].json() == {"user": username or ""}  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("view", VIEWS)
def test_an_exempt_group_passes_every_adapter_uncounted(gold: Tier, view: str, kind: str) -> None:
    """Staff exempted the admin's way, through a group: the exemption is read from the
    snapshot by the identity's user id, on an event loop too."""
    from django.contrib.auth.models import Group

    user = gold_user(gold, "[staff]", is_staff=True)
    staff = Group.objects.create(name="staff")
    user.groups.add(staff)  # type: ignore[attr-defined]
    Exemption.objects.create(group=staff)
    responses = send(kind, [("GET", VIEWS[view], {})] * (GOLD_LIMIT + 2), user)
    assert statuses(responses) == [200] * (GOLD_LIMIT + 2)
    assert all("X-RateLimit-Limit" not in r for r in responses)
    # Nobody else is exempt.
    anonymous = send(kind, [("GET", VIEWS[view], {})] * (ANONYMOUS_LIMIT + 1))
    assert statuses(anonymous)[-1] == 429


def caller(who: str, gold: Tier) -> tuple[AbstractBaseUser | None, dict[str, str] | None]:
    """An anonymous caller, a signed-in user of the gold tier, or an API key of that tier."""
    if who == "signed-in":
        return gold_user(gold), None
    if who == "api-key":
        _, key = ApiKey.objects.create_key(name="partner", tier=gold)
        return None, {"X-API-Key": key}
    return None, None


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("login", LOGINS)
@pytest.mark.parametrize("who", ["anonymous", "signed-in", "api-key"])
@pytest.mark.parametrize("presented", PRESENTED, ids=["300", "unicode", "markup"])
def test_credential_counters_hold_whatever_the_callers_tier(
    gold: Tier, login: str, who: str, kind: str, presented: str
) -> None:
    """The credential rule's counters by IP address and username protect the account and
    the server, so a signed-in attacker or an API key holder guessing someone else's
    password meets them like an anonymous one, though the rule gives them to the anonymous
    tier only. ``Retry-After`` names the longest wait of the counters that refuse (the
    username's 1,200 s, not the address's 20 s), so the retry really passes."""
    user, headers = caller(who, gold)
    attempt = ("POST", LOGINS[login], {"username": presented, "password": "guess"})
    responses = send(kind, [attempt] * 4, user, headers)
    assert statuses(responses) == [401, 401, 401, 429]
    assert USERNAME_WAIT - 60 < int(responses[-1]["Retry-After"]) <= USERNAME_WAIT


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("login", LOGINS)
@pytest.mark.parametrize("who", ["anonymous", "signed-in", "api-key"])
@pytest.mark.parametrize("presented", PRESENTED, ids=["300", "unicode", "markup"])
def test_every_credential_guard_counts_what_redis_counts_while_the_backend_is_down(
    gold: Tier, settings: Any, login: str, who: str, kind: str, presented: str
) -> None:
    """Issue 30 items 2 and 4. An outage must neither open the door to password guessing
    nor lock everyone out, whichever adapter guards the login: while Redis is down the
    attempt is counted in the process against exactly what Redis counts: the rule's
    counters by username (guesses spread over 20 addresses meet the username's 3) and by
    IP address (one address guessing 20 names meets its 3). ``local`` used to count the
    client's own limits only: 20 of 20 guesses passed. A view under an ordinary rule is
    served meanwhile."""
    user, headers = caller(who, gold)
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1
    attempt = ("POST", LOGINS[login], {"username": presented, "password": "guess"})
    spread = [
        send(kind, [attempt], user, {**(headers or {}), "X-Forwarded-For": f"198.51.100.{n}"})[0]
        for n in range(20)
    ]
    assert statuses(spread) == [401] * 3 + [429] * 17
    assert all(int(response["Retry-After"]) >= 1 for response in spread[3:])
    one_address = [
        send(
            kind,
            [("POST", LOGINS[login], {"username": f"{n}{presented}", "password": "x"})],
            user,
            {**(headers or {}), "X-Forwarded-For": "203.0.113.9"},
        )[0]
        for n in range(20)
    ]
    assert statuses(one_address) == [401] * 3 + [429] * 17
    assert statuses(send(kind, [("GET", VIEWS["decorator"], {})], user, headers)) == [200]


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("who", ["anonymous", "signed-in"])
def test_every_adapter_keeps_limiting_by_default_while_the_backend_is_down(
    gold: Tier, settings: Any, view: str, who: str, kind: str
) -> None:
    """The product's promise: a Redis outage never switches limiting off. With no failure
    mode set anywhere, each adapter (DRF and the decorator, sync and async) keeps serving
    and counts the caller in the process under its tier's limit: the (limit + 1)-th request
    of a burst is refused, and every answer says the count is the process's."""
    from django.conf import settings as django_settings

    assert not hasattr(django_settings, "DJANGO_THROTTLE_FAILURE_MODE")
    user, _ = caller(who, gold)
    limit = ANONYMOUS_LIMIT if user is None else GOLD_LIMIT
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    responses = send(kind, [("GET", VIEWS[view], {})] * (limit + 1), user)
    assert statuses(responses) == [200] * limit + [429]
    assert [r["X-RateLimit-Degraded"] for r in responses] == ["local"] * (limit + 1)
    assert int(responses[-1]["Retry-After"]) > 1


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("login", LOGINS)
def test_every_credential_guard_fails_closed_when_the_operator_chose_closed(
    gold: Tier, settings: Any, login: str, kind: str
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    settings.DJANGO_THROTTLE_FAILURE_MODE = "closed"
    attempt = ("POST", LOGINS[login], {"username": "victim", "password": "guess"})
    responses = send(kind, [attempt] * 2)
    assert statuses(responses) == [503, 503]
    assert all(int(response["Retry-After"]) >= 1 for response in responses)


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("who", ["anonymous", "signed-in"])
@pytest.mark.parametrize("presented", PRESENTED, ids=["300", "unicode", "markup"])
def test_basic_credentials_meet_the_counters_whatever_the_callers_tier(
    gold: Tier, who: str, kind: str, presented: str
) -> None:
    """DRF's protected Basic authentication counts the attempt before the password is
    checked, also when the request carries the session of a user of another tier."""
    import base64

    user, _ = caller(who, gold)
    token = base64.b64encode(f"{presented}:guess".encode()).decode()
    attempt = ("GET", "/seams/basic/", {})
    responses = send(kind, [attempt] * 4, user, {"Authorization": f"Basic {token}"})
    assert statuses(responses) == [401, 401, 401, 429]
    assert USERNAME_WAIT - 60 < int(responses[-1]["Retry-After"]) <= USERNAME_WAIT


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("login", LOGINS)
def test_a_retry_once_retry_after_has_passed_gets_through(
    settings: Any, gold: Tier, login: str, kind: str
) -> None:
    """On the memory backend's injected clock: one second before ``Retry-After`` the login
    is still refused, at ``Retry-After`` it is let through to the password check."""
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    counting = backends.get_backend()
    assert isinstance(counting, MemoryBackend)
    now = [1_800_000_000.0]
    counting.clock = lambda: now[0]
    attempt = ("POST", LOGINS[login], {"username": "victim", "password": "guess"})
    responses = send(kind, [attempt] * 4)
    assert statuses(responses) == [401, 401, 401, 429]
    wait = int(responses[-1]["Retry-After"])
    now[0] += wait - 1
    assert statuses(send(kind, [attempt])) == [429]
    now[0] += 1
    assert statuses(send(kind, [attempt])) == [401]


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("view", VIEWS)
def test_retry_after_of_a_rule_with_several_limits_is_the_longest(
    backend_name: str, db: Any, view: str, kind: str
) -> None:
    """Several limits of one counter, denied in one backend call: the longest wait."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = endpoint("seam", "scope", "seam", methods="GET", limits={anonymous: "2/min"})
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="2/h")
    responses = send(kind, [("GET", VIEWS[view], {})] * 3)
    assert statuses(responses) == [200, 200, 429]
    assert 1740 < int(responses[-1]["Retry-After"]) <= 1800  # 2/h: a token every 1,800 s


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("slower", ["ip", "username"])
def test_retry_after_is_the_longest_whichever_counter_refuses_first(
    backend_name: str, db: Any, kind: str, slower: str
) -> None:
    """Counters by IP address and by username are separate backend calls: whichever one
    refuses first, the others are looked at (sync and async, on Redis and in memory) and
    ``Retry-After`` is the longest wait."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = EndpointRule.objects.create(
        name="seam-login", pattern="seam-login", counts=EndpointRule.Counts.FAILURES
    )
    for counted_by in ("ip", "username"):
        rate = "3/h" if counted_by == slower else "3/min"
        EndpointLimit.objects.create(rule=rule, tier=anonymous, rate=rate, counted_by=counted_by)
    attempt = ("POST", LOGINS["protect_credentials-async"], {"username": "victim", "password": "x"})
    responses = send(kind, [attempt] * 4)
    assert statuses(responses) == [401, 401, 401, 429]
    assert USERNAME_WAIT - 60 < int(responses[-1]["Retry-After"]) <= USERNAME_WAIT
