"""Credential protection: login and token attempts counted before the password is checked,
failures kept, successes given back; limits counted by IP address and by username."""

from __future__ import annotations

import base64
import hashlib
import io
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.hashers import MD5PasswordHasher
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.credentials import protect_credentials
from django_throttle.drf import ProtectedBasicAuthentication, protect_authentication
from django_throttle.models import EndpointLimit, EndpointRule, Tier
from django_throttle.policy import live as policy
from django_throttle.request.usernames import presented_username
from tests.factories import own_connections

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.test_credentials")]


class CountingHasher(MD5PasswordHasher):
    """MD5, counting every hash it computes (what a password guess costs the server)."""

    algorithm = "counting_md5"
    runs = 0

    def encode(self, password: str, salt: str) -> str:
        type(self).runs += 1
        return super().encode(password, salt)


class Protected(APIView):
    authentication_classes = [ProtectedBasicAuthentication]
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        return Response({"user": str(request.user)})


class Bearer:
    """A third-party scheme: ``Bearer good`` authenticates, any other bearer fails."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = request._request.META.get("HTTP_AUTHORIZATION", "")
        if not header.startswith("Bearer "):
            return None
        if header != "Bearer good":
            raise AuthenticationFailed("bad token")
        from django.contrib.auth.models import AnonymousUser

        return AnonymousUser(), "good"

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class ProtectedBearerView(APIView):
    authentication_classes = [protect_authentication(Bearer)]
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        return Response({"auth": request.auth})


class FormLogin(LoginView):
    """Django's LoginView, answering without a template: a bad password re-renders (200)."""

    def render_to_response(self, context: dict[str, Any], **kwargs: Any) -> HttpResponse:
        return HttpResponse("login form")


entered = 0
entered_lock = threading.Lock()


@protect_credentials
def always_wrong(request: HttpRequest) -> HttpResponse:
    """A login whose every attempt fails: counts the attempts that got past the check."""
    global entered
    with entered_lock:
        entered += 1
    return HttpResponse("wrong password", status=401)


def token(request: HttpRequest) -> HttpResponse:
    from rest_framework.authtoken.views import obtain_auth_token

    return obtain_auth_token(request)  # type: ignore[no-any-return]


urlpatterns = [
    path("api/basic/", Protected.as_view()),
    path("api/bearer/", ProtectedBearerView.as_view()),
    path("login/", protect_credentials(FormLogin.as_view())),
    path("wrong/", always_wrong),
    path("token/", protect_credentials(token)),
]


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest, settings: Any) -> str:
    if request.param == "memory":
        settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    return str(request.param)


@pytest.fixture
def hasher(settings: Any) -> Iterator[type[CountingHasher]]:
    settings.PASSWORD_HASHERS = ["tests.test_credentials.CountingHasher"]
    CountingHasher.runs = 0
    yield CountingHasher


@pytest.fixture
def anonymous() -> Tier:
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    anonymous.limits.create(rate="1000/min")
    return anonymous


def credential_rule(
    anonymous: Tier, scope: str, counts: str = "failures", **limits: str
) -> EndpointRule:
    """A rule for ``scope``: ``ip="5/min"``, ``username="10/h"``, ``client="…"``."""
    rule = EndpointRule.objects.create(name=scope, pattern=scope, counts=counts)
    for counted_by, rate in limits.items():
        EndpointLimit.objects.create(rule=rule, tier=anonymous, rate=rate, counted_by=counted_by)
    return rule


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def test_wrong_basic_passwords_get_429_before_the_hasher_runs(
    backend: str, hasher: type[CountingHasher], anonymous: Tier, django_user_model: Any
) -> None:
    django_user_model.objects.create_user("alice", password="right")
    credential_rule(anonymous, "authentication", ip="5/min")
    client = Client()
    hasher.runs = 0
    statuses = [
        client.get("/api/basic/", HTTP_AUTHORIZATION=basic("alice", "wrong")).status_code
        for _ in range(12)
    ]
    assert statuses == [401] * 5 + [429] * 7
    assert hasher.runs == 5


def test_a_429_before_authentication_says_when_to_retry(backend: str, anonymous: Tier) -> None:
    credential_rule(anonymous, "authentication", ip="1/min")
    client = Client()
    client.get("/api/basic/", HTTP_AUTHORIZATION=basic("nobody", "x"))
    denied = client.get("/api/basic/", HTTP_AUTHORIZATION=basic("nobody", "x"))
    assert denied.status_code == 429
    assert 1 <= int(denied["Retry-After"]) <= 60
    assert denied.json()["limit"] == "authentication (anonymous) 1/min"


def test_a_delaying_credential_limit_makes_basic_attempts_wait_their_turn(
    backend: str, anonymous: Tier
) -> None:
    """A delaying limit on the rule DRF's protected authentication checks: the second
    attempt sent at once waits its turn, as at a ``protect_credentials`` view, and each
    attempt is announced once (the second was served at once, never counted delayed, and
    with announcements made when the wait is taken it was never announced)."""
    from django_throttle import events

    rule = EndpointRule.objects.create(name="authentication", pattern="authentication")
    EndpointLimit.objects.create(
        rule=rule, tier=anonymous, rate="10/s", algorithm="gcra", burst=3, delay=0
    )
    outcomes: list[str] = []

    def decided(sender: Any, outcome: str, **kwargs: Any) -> None:
        outcomes.append(outcome)

    events.request_decided.connect(decided)
    try:
        client = Client(REMOTE_ADDR="203.0.113.50")
        client.get("/api/basic/", HTTP_AUTHORIZATION=basic("nobody", "x"))
        started = time.monotonic()
        second = client.get("/api/basic/", HTTP_AUTHORIZATION=basic("nobody", "x"))
        waited = time.monotonic() - started
    finally:
        events.request_decided.disconnect(decided)
    assert second.status_code == 401
    assert waited >= 0.05  # its turn, about 0.1 s after the first
    assert outcomes == ["allowed", "allowed"]


def test_a_successful_login_neither_counts_nor_resets_the_ip_bucket(
    backend: str, anonymous: Tier, django_user_model: Any
) -> None:
    django_user_model.objects.create_user("alice", password="right")
    credential_rule(anonymous, "authentication", ip="5/min")
    client = Client()

    def attempt(password: str) -> int:
        return client.get("/api/basic/", HTTP_AUTHORIZATION=basic("alice", password)).status_code

    assert [attempt("wrong") for _ in range(3)] == [401] * 3
    assert [attempt("right") for _ in range(3)] == [200] * 3
    assert [attempt("wrong") for _ in range(3)] == [401, 401, 429]


def test_requests_without_credentials_are_not_counted(backend: str, anonymous: Tier) -> None:
    credential_rule(anonymous, "authentication", counts="all", ip="1/min")
    client = Client()
    assert [client.get("/api/basic/").status_code for _ in range(5)] == [200] * 5
    assert client.get("/api/basic/", HTTP_AUTHORIZATION=basic("a", "b")).status_code == 401
    assert client.get("/api/basic/", HTTP_AUTHORIZATION=basic("a", "b")).status_code == 429
    assert client.get("/api/basic/").status_code == 200


def test_wrong_passwords_for_one_username_from_many_addresses(
    backend: str, anonymous: Tier, django_user_model: Any
) -> None:
    for name in ("alice", "bob"):
        django_user_model.objects.create_user(name, password="right")
    credential_rule(anonymous, "authentication", ip="5/min", username="10/h")
    client = Client()

    def attempt(username: str, address: str) -> int:
        return client.get(
            "/api/basic/", HTTP_AUTHORIZATION=basic(username, "wrong"), REMOTE_ADDR=address
        ).status_code

    assert [attempt("alice", f"198.51.100.{i}") for i in range(10)] == [401] * 10
    assert attempt("alice", "198.51.100.77") == 429
    assert attempt("Alice", "198.51.100.78") == 429  # the same username, however written
    assert attempt("bob", "198.51.100.79") == 401


def test_a_request_refused_by_its_username_limit_takes_nothing_from_its_ip_limit(
    backend: str, anonymous: Tier
) -> None:
    credential_rule(anonymous, "authentication", ip="5/min", username="2/h")
    client = Client()

    def attempt(username: str) -> int:
        return client.get("/api/basic/", HTTP_AUTHORIZATION=basic(username, "x")).status_code

    assert [attempt("alice") for _ in range(4)] == [401, 401, 429, 429]
    # Two of the IP's five went to alice's failures; her refused attempts took none.
    assert [attempt(f"user{i}") for i in range(4)] == [401, 401, 401, 429]


def test_the_usage_report_counts_each_attempt_once_with_its_real_outcome(
    backend: str, anonymous: Tier
) -> None:
    """Regression: a request refused by its username limit (the second call) was reported as
    allowed, because the first call (the IP limit) had counted it before the refusal."""
    import json

    from django.core.management import call_command

    credential_rule(anonymous, "authentication", ip="5/min", username="2/h")
    client = Client()
    for _ in range(4):
        client.get("/api/basic/", HTTP_AUTHORIZATION=basic("alice", "x"))
    out = io.StringIO()
    call_command("throttle_usage", "--by", "endpoint", "--format", "json", stdout=out)

    [row] = [r for r in json.loads(out.getvalue()) if r["endpoint"] == "authentication"]
    assert (row["allowed"], row["denied"], row["total"]) == (2, 2, 4)


@pytest.mark.parametrize(
    "limits",
    [
        {"ip": "5/min"},
        # Counted by address and by username in one call: the username's 5 hold.
        {"ip": "1000/min", "username": "5/h"},
        {"ip": "5/min", "username": "1000/h"},
    ],
)
def test_many_concurrent_bad_logins_let_exactly_the_limit_through(
    anonymous: Tier, settings: Any, limits: dict[str, str]
) -> None:
    """100 threads at once against real Redis (a pool as large as the crowd, so none waits
    for a connection and fails closed): exactly 5 reach the view, the rest get 429."""
    global entered
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {
        **settings.DJANGO_THROTTLE_REDIS_OPTIONS,
        "max_connections": 100,
    }
    credential_rule(anonymous, "login", **limits)
    policy.current()  # compiled here: the threads only read the snapshot
    entered = 0
    barrier = threading.Barrier(100)
    statuses: list[int] = []

    def attempt() -> None:
        client = Client()
        barrier.wait()
        response = client.post("/wrong/", {"username": "alice", "password": "x"})
        with entered_lock:
            statuses.append(response.status_code)

    threads = [threading.Thread(target=own_connections(attempt)) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert entered == 5
    assert sorted(statuses) == [401] * 5 + [429] * 95


def test_login_view_re_rendering_a_bad_password_counts_as_a_failure(
    backend: str, anonymous: Tier, django_user_model: Any
) -> None:
    django_user_model.objects.create_user("alice", password="right")
    credential_rule(anonymous, "login", ip="3/min")
    client = Client()

    def attempt(password: str) -> int:
        return client.post("/login/", {"username": "alice", "password": password}).status_code

    assert [attempt("wrong") for _ in range(2)] == [200, 200]
    assert attempt("right") == 302  # a success: given back
    client.logout()
    assert [attempt("wrong") for _ in range(2)] == [200, 429]


def test_the_login_form_itself_is_not_counted(backend: str, anonymous: Tier) -> None:
    credential_rule(anonymous, "login", counts="all", ip="1/min")
    client = Client()
    assert [client.get("/login/").status_code for _ in range(3)] == [200] * 3


def test_login_view_counts_by_the_posted_username(backend: str, anonymous: Tier) -> None:
    credential_rule(anonymous, "login", username="2/h")
    client = Client()

    def attempt(username: str, address: str) -> int:
        return client.post(
            "/login/", {"username": username, "password": "x"}, REMOTE_ADDR=address
        ).status_code

    assert [attempt("carol", f"203.0.113.{i}") for i in range(3)] == [200, 200, 429]
    assert attempt("dave", "203.0.113.9") == 200


def test_obtain_auth_token_bad_credentials_are_counted(
    backend: str, anonymous: Tier, settings: Any
) -> None:
    if "rest_framework.authtoken" not in settings.INSTALLED_APPS:
        pytest.skip("needs rest_framework.authtoken in tests/settings.py (REQUESTS.md)")
    credential_rule(anonymous, "login", ip="2/min", username="10/h")
    client = Client()
    statuses = [
        client.post(
            "/token/", {"username": "alice", "password": "x"}, content_type="application/json"
        ).status_code
        for _ in range(3)
    ]
    assert statuses == [400, 400, 429]


def test_any_authentication_class_can_be_protected(backend: str, anonymous: Tier) -> None:
    credential_rule(anonymous, "authentication", ip="2/min")
    client = Client()

    def attempt(token: str) -> int:
        return client.get("/api/bearer/", HTTP_AUTHORIZATION=f"Bearer {token}").status_code

    assert [attempt("good") for _ in range(3)] == [200] * 3
    assert [attempt("bad") for _ in range(3)] == [401, 401, 429]
    assert client.get("/api/bearer/").status_code == 200


def test_credential_checks_count_locally_when_the_backend_is_down(
    anonymous: Tier, settings: Any
) -> None:
    """Issue 30 items 2 and 4: under the default failure mode a credential rule is counted in
    the process while Redis is down, by IP address as on Redis (it was served uncounted by
    its client's limits only, or refused to everyone)."""
    credential_rule(anonymous, "authentication", ip="5/min")
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    statuses = [
        Client().get("/api/basic/", HTTP_AUTHORIZATION=basic("alice", "x")).status_code
        for _ in range(7)
    ]
    assert statuses == [401] * 5 + [429] * 2


def test_credential_checks_fail_closed_when_the_operator_chose_closed(
    anonymous: Tier, settings: Any
) -> None:
    credential_rule(anonymous, "authentication", ip="5/min")
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    settings.DJANGO_THROTTLE_FAILURE_MODE = "closed"
    response = Client().get("/api/basic/", HTTP_AUTHORIZATION=basic("alice", "x"))
    assert response.status_code == 503
    assert "Retry-After" in response


@pytest.mark.parametrize(
    ("meta", "post", "expected"),
    [
        ({"HTTP_AUTHORIZATION": basic(" Alice ", "pw:with:colons")}, {}, "alice"),
        ({"HTTP_AUTHORIZATION": "Basic !!!not-base64"}, {}, None),
        ({"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(b"\xff\xfe").decode()}, {}, None),
        ({"HTTP_AUTHORIZATION": "Token abc"}, {}, None),
        ({}, {"username": "Bob"}, "bob"),
        ({}, {"email": "Eve@Example.com"}, "eve@example.com"),
        ({}, {"username": "   "}, None),
        ({}, {"password": "only"}, None),
        # Never cut: a digest of the whole name (two long names never share a counter)...
        (
            {},
            {"username": "x" * 1_000},
            "#" + hashlib.blake2b(b"x" * 1_000, digest_size=16).hexdigest(),
        ),
        # ... up to a length no account has: then one counter for every such name.
        ({}, {"username": "x" * 10_000}, "#overlong"),
    ],
)
def test_presented_username(meta: dict[str, str], post: dict[str, str], expected: str) -> None:
    from django.test import RequestFactory

    request = RequestFactory().post("/login/", post, **meta)
    assert presented_username(request) == expected


@pytest.mark.parametrize("charset", ["latin-1", "us-ascii", "utf-8", "cp1252"])
def test_a_json_body_both_readings_read_alike_is_parsed_once(
    charset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JSON body is read with its declared charset and from its bytes; when both give the
    same text (an ASCII body under any ASCII-compatible charset) it is parsed once (before:
    twice under any charset but UTF-8, 140 ms of a 2.4 MB body of many keys, 200 plain
    requests' CPU, where one parse took half that)."""
    import json

    from django.test import RequestFactory

    parsed: list[int] = []
    loads = json.loads

    def counted(text: Any, *args: Any, **kwargs: Any) -> Any:
        parsed.append(len(text))
        return loads(text, *args, **kwargs)

    body = json.dumps({"username": "Ann", **{f"k{i}": i for i in range(1000)}})
    request = RequestFactory().post(
        "/t/", body, content_type=f"application/json; charset={charset}"
    )
    monkeypatch.setattr(json, "loads", counted)
    assert presented_username(request) == "ann"
    assert len([n for n in parsed if n >= len(body)]) == 1


def test_presented_username_from_json_and_garbage_bodies() -> None:
    from django.test import RequestFactory

    factory = RequestFactory()
    good = factory.post("/t/", {"username": "Ann"}, content_type="application/json")
    assert presented_username(good) == "ann"
    # DRF's CharField takes a number as its text: so does the limiter.
    number = factory.post("/t/", '{"username": 5}', content_type="application/json")
    assert presented_username(number) == "5"
    for body in ("{not json", "[1, 2]", '{"username": null}'):
        bad = factory.post("/t/", body, content_type="application/json")
        assert presented_username(bad) is None
