"""Long identities and the circuit breaker: a client label is bounded for every kind of
identity (a digest for a long value, still distinct), and an argument the counting script
refuses is our bug, never an outage: it does not open the breaker, so limiting stays on for
every other client."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path

from django_throttle import conf
from django_throttle.backends import ArgumentRefused, BackendError, get_backend
from django_throttle.backends import redis_nodes as breaker_module
from django_throttle.backends.redis import RedisBackend
from django_throttle.backends.redis_nodes import get_breaker
from django_throttle.credentials import protect_credentials
from django_throttle.decorators import throttle
from django_throttle.identity import MAX_KEY_BYTES, Identity
from django_throttle.models import EndpointLimit, EndpointRule, Tier
from django_throttle.policy import live as policy
from django_throttle.rates import Decision, Limit
from tests.factories import own_connections

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.test_long_identities")]


class FormLogin(LoginView):
    """Django's LoginView, answering without a template: a bad password re-renders (200)."""

    def render_to_response(self, context: dict[str, Any], **kwargs: Any) -> HttpResponse:
        return HttpResponse("login form")


@protect_credentials
def always_wrong(request: HttpRequest) -> HttpResponse:
    """A login whose every attempt fails, without a query (threads share no database)."""
    return HttpResponse("wrong password", status=401)


@throttle(rate="3/min")
def limited(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@throttle(scope="anything")
def by_policy(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("login/", protect_credentials(FormLogin.as_view())),
    path("wrong/", always_wrong),
    path("limited/", limited),
    path("by-policy/", by_policy),
]


def long_value_resolver(request: HttpRequest) -> Identity:
    """A custom resolver whose identities are long (a signed token, say)."""
    return Identity("token", request.headers.get("X-Token", "") * 100)


#: A cost beyond any capacity the script accepts (rates.MAX_COUNT): refused, nothing written.
REFUSED_COST = 10**10


class PaddedLabels(RedisBackend):
    """A real Redis backend that sends a cost the script refuses (a bug of a custom
    backend, or of ours): what the request path does about a refused argument."""

    def hit(
        self,
        client: str,
        limits: Sequence[Limit],
        cost: int = 1,
        *,
        now: float | None = None,
        usage: str | None = None,
    ) -> Decision:
        return super().hit(client, limits, REFUSED_COST, now=now, usage=usage or "u")


@pytest.fixture
def login_rule(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Tier:
    """The demo's login rule (by IP address and by username, failures counted); a breaker
    that would stay open for an hour once opened."""
    monkeypatch.setattr(breaker_module, "COOLDOWN", 3600)
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 3600)
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    anonymous.limits.create(rate="1000/min")
    rule = EndpointRule.objects.create(name="login", pattern="login", counts="failures")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="100/min", counted_by="ip")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="3/h", counted_by="username")
    policy.current()  # compiled here: threads only read the snapshot
    return anonymous


def test_long_usernames_leave_limiting_on_and_long_e_mail_addresses_log_in(
    login_rule: Tier, django_user_model: Any
) -> None:
    statuses: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(20)

    def attempt(i: int) -> None:
        client = Client()
        barrier.wait()
        response = client.post(
            "/wrong/",
            {"username": f"{i:03d}" + "x" * 297, "password": "wrong"},
            REMOTE_ADDR=f"198.51.100.{i + 1}",
        )
        with lock:
            statuses.append(response.status_code)

    threads = [threading.Thread(target=own_connections(attempt), args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert statuses == [401] * 20  # each a wrong password, checked and counted
    assert get_breaker().state == "closed"
    assert get_breaker().failures == 0
    # Anonymous requests are still limited.
    anonymous = Client()
    assert [anonymous.get("/limited/").status_code for _ in range(4)] == [200, 200, 200, 429]

    email = "a" * 138 + "@example.com"
    assert len(email) == 150
    django_user_model.objects.create_user(email, password="right")
    client = Client()

    def login(password: str) -> int:
        return client.post("/login/", {"username": email, "password": password}).status_code

    assert login("right") == 302
    client.logout()
    # Its username counter counts (3/h), under a digest of its own.
    assert [login("wrong") for _ in range(4)] == [200, 200, 200, 429]
    other = Client().post("/login/", {"username": "b" + email[1:], "password": "x"})
    assert other.status_code == 200


def test_a_username_of_the_same_long_prefix_has_its_own_counter(login_rule: Tier) -> None:
    first, second = "x" * 200 + "1", "x" * 200 + "2"

    def attempt(username: str) -> int:
        return Client().post("/login/", {"username": username, "password": "x"}).status_code

    assert [attempt(first) for _ in range(4)] == [200, 200, 200, 429]
    assert attempt(second) == 200


@pytest.mark.parametrize(
    "identity",
    [
        Identity("username", "x" * 500),
        Identity("username", "é" * 100),  # 200 UTF-8 bytes in 100 characters
        Identity("token", "t" * 10_000),
        Identity("key", b"\xff".decode("utf-8", "surrogateescape") * 300),
        Identity("ip", "2001:db8::" + "1" * 200),
    ],
)
def test_every_kind_of_identity_gets_a_bounded_distinct_label(identity: Identity) -> None:
    key = identity.key
    assert len(key.encode()) <= MAX_KEY_BYTES
    other = Identity(identity.kind, identity.value + "y")
    assert other.key != key
    assert Identity(identity.kind, "short").key == f"{identity.kind}:short"
    # No short key of any value equals the digest form.
    assert Identity(identity.kind, key.partition("#")[2]).key != key


def test_a_custom_resolver_with_long_identities_is_counted(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DJANGO_THROTTLE_IDENTITY_RESOLVER = "tests.test_long_identities.long_value_resolver"
    monkeypatch.setattr(breaker_module, "COOLDOWN", 3600)
    client = Client()

    def get(token: str) -> int:
        return client.get("/limited/", HTTP_X_TOKEN=token).status_code

    assert [get("alpha") for _ in range(4)] == [200, 200, 200, 429]
    assert get("bravo") == 200
    assert get_breaker().failures == 0


def test_an_argument_the_script_refuses_never_opens_the_breaker(
    settings: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The Redis URL's backend is this one (read again after the settings change below).
    monkeypatch.setattr(conf, "REDIS_BACKEND", "tests.test_long_identities.PaddedLabels")
    monkeypatch.setattr(breaker_module, "COOLDOWN", 3600)
    settings.DJANGO_THROTTLE_FAILURE_MODE = "open"
    client = Client()
    with caplog.at_level(logging.ERROR, logger="django_throttle.backends.breaker"):
        statuses = [client.get("/limited/").status_code for _ in range(10)]

    breaker = get_breaker()
    assert breaker.state == "closed"
    assert (breaker.failures, breaker.refused) == (0, 10)
    # Counted in-process rather than served uncounted: the limit still holds.
    assert statuses == [200, 200, 200] + [429] * 7
    refused = [r for r in caplog.records if "refused an argument" in r.getMessage()]
    assert len(refused) == 1  # logged, but not once per request


def test_the_redis_backend_reports_a_refused_argument_as_no_outage() -> None:
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    limit = Limit.build("l", "5/min")
    with pytest.raises(ArgumentRefused, match="django_throttle: ARGV"):
        backend.hit("c", [limit], REFUSED_COST, usage="field")
    breaker = get_breaker()
    for _ in range(5):
        with pytest.raises(ArgumentRefused):
            breaker.call(backend.hit, "c", [limit], REFUSED_COST, usage="field")
    assert breaker.state == "closed"
    assert breaker.failures == 0
    assert backend.hit("user:1", [limit], usage="field").allowed


def test_a_refused_argument_closes_a_half_open_breaker(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend answered: the probe proves it is back."""
    monkeypatch.setattr(breaker_module, "COOLDOWN", 0)
    backend = get_backend()
    breaker = get_breaker()

    def down() -> None:
        raise BackendError("connection refused")

    for _ in range(breaker.threshold):
        with pytest.raises(BackendError):
            breaker.call(down)
    assert breaker.state != "closed"
    with pytest.raises(ArgumentRefused):
        breaker.call(backend.hit, "c", [Limit.build("l", "5/min")], REFUSED_COST, usage="field")
    assert breaker.state == "closed"


def test_async_calls_report_a_refused_argument_as_no_outage() -> None:
    from asgiref.sync import async_to_sync

    backend = get_backend()
    breaker = get_breaker()
    limit = Limit.build("l", "5/min")

    async def refused() -> None:
        for _ in range(5):
            with pytest.raises(ArgumentRefused):
                await breaker.acall(backend.ahit, "c", [limit], REFUSED_COST, usage="field")

    async_to_sync(refused)()
    assert breaker.state == "closed"
    assert (breaker.failures, breaker.refused) == (0, 5)
