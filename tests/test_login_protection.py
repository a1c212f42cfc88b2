"""Login protection that holds: the limiter reads the username exactly as the authenticator
will; a browser that signed in before keeps its own allowance while its username is under
attack (device cookies); and a worker's memory stays flat whatever clients send."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import logging
import time
import tracemalloc
import unicodedata
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.hashers import MD5PasswordHasher
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client
from django.urls import path
from rest_framework.authentication import BasicAuthentication
from rest_framework.authtoken.views import obtain_auth_token
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.credentials import protect_credentials
from django_throttle.decorators import throttle
from django_throttle.drf import ProtectedBasicAuthentication, protect_authentication
from django_throttle.models import EndpointLimit, EndpointRule, Tier
from django_throttle.policy import live as policy
from django_throttle.request import usernames
from tests.clients import AddressedAsyncClient
from tests.faultproxy import FaultProxy
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.test_login_protection")]


class FormLogin(LoginView):
    """Django's LoginView, answering without a template: a bad password re-renders (200)."""

    def render_to_response(self, context: dict[str, Any], **kwargs: Any) -> HttpResponse:
        return HttpResponse("login form")


class BasicProtected(APIView):
    authentication_classes = [ProtectedBasicAuthentication]
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        return Response({"user": str(request.user)})

    def post(self, request: Request) -> Response:
        return Response({"created": request.data.get("username")}, status=201)


class StrictBasic(BasicAuthentication):
    """Basic authentication checking the password itself and refusing a wrong one with
    Django's ``PermissionDenied`` (DRF's 403), no ``user_login_failed``."""

    def authenticate_credentials(self, userid: str, password: str, request: Any = None) -> Any:
        from django.core.exceptions import PermissionDenied

        user = get_user_model()._default_manager.filter(username=userid).first()
        if user is None or not user.check_password(password):
            raise PermissionDenied("wrong username or password")
        return (user, None)


class StrictBasicProtected(BasicProtected):
    authentication_classes = [protect_authentication(StrictBasic)]


async def sign_in(request: HttpRequest) -> HttpResponse:
    """An ``async def`` login view: ``aauthenticate`` and ``alogin``."""
    from django.contrib.auth import aauthenticate, alogin

    user = await aauthenticate(
        request, username=request.POST.get("username"), password=request.POST.get("password")
    )
    if user is None:
        return HttpResponse("wrong", status=401)
    await alogin(request, user)
    return HttpResponse("in", status=302)


async_login = protect_credentials(sign_in)


@protect_credentials
def requestless_login(request: HttpRequest) -> HttpResponse:
    """A login view calling ``authenticate()`` without the request, as many tutorials do, and
    answering a wrong password with its form again (200)."""
    from django.contrib.auth import authenticate

    username, password = request.POST.get("username"), request.POST.get("password")
    user = authenticate(username=username, password=password)
    return HttpResponse("in" if user is not None else "wrong password, try again")


@protect_credentials
async def async_requestless_login(request: HttpRequest) -> HttpResponse:
    from django.contrib.auth import aauthenticate

    user = await aauthenticate(
        username=request.POST.get("username"), password=request.POST.get("password")
    )
    return HttpResponse("in" if user is not None else "wrong password, try again")


def field_login(request: HttpRequest) -> HttpResponse:
    """A login view whose username field is ``login`` (as django-allauth's form)."""
    from django.contrib.auth import authenticate

    username, password = request.POST.get("login"), request.POST.get("password")
    user = authenticate(request, username=username, password=password)
    return HttpResponse("in" if user is not None else "wrong", status=200 if user else 401)


async def async_field_login(request: HttpRequest) -> HttpResponse:
    from django.contrib.auth import aauthenticate

    username, password = request.POST.get("login"), request.POST.get("password")
    user = await aauthenticate(request, username=username, password=password)
    return HttpResponse("in" if user is not None else "wrong", status=200 if user else 401)


@protect_credentials
def json_login(request: HttpRequest) -> HttpResponse:
    """A login view of a single-page app: the credentials come as a JSON body."""
    from django.contrib.auth import authenticate

    data = json.loads(request.body)
    user = authenticate(request, username=data.get("username"), password=data.get("password"))
    return HttpResponse("in" if user is not None else "wrong", status=200 if user else 401)


@protect_credentials
async def async_json_login(request: HttpRequest) -> HttpResponse:
    """An ``async def`` JSON login view, answering whatever the method."""
    from django.contrib.auth import aauthenticate

    data = json.loads(request.body)
    user = await aauthenticate(
        request, username=data.get("username"), password=data.get("password")
    )
    return HttpResponse("in" if user is not None else "wrong", status=200 if user else 401)


@protect_credentials
def query_login(request: HttpRequest) -> HttpResponse:
    """A login view taking the credentials from the query string, whatever the method."""
    from django.contrib.auth import authenticate

    username, password = request.GET.get("username"), request.GET.get("password")
    user = authenticate(request, username=username, password=password)
    return HttpResponse("in" if user is not None else "wrong", status=200 if user else 401)


@protect_credentials
async def async_query_login(request: HttpRequest) -> HttpResponse:
    from django.contrib.auth import aauthenticate

    username, password = request.GET.get("username"), request.GET.get("password")
    user = await aauthenticate(request, username=username, password=password)
    return HttpResponse("in" if user is not None else "wrong", status=200 if user else 401)


def _refuse_wrong_password(request: HttpRequest) -> HttpResponse:
    """Checks the password itself (no ``authenticate()``, so no ``user_login_failed``) and
    answers a wrong one by raising ``PermissionDenied`` (Django's 403)."""
    from django.core.exceptions import PermissionDenied

    user = get_user_model()._default_manager.filter(username=request.POST.get("username")).first()
    if user is None or not user.check_password(request.POST.get("password")):
        raise PermissionDenied("wrong username or password")
    return HttpResponse("in")


raising_login = protect_credentials(_refuse_wrong_password)


@protect_credentials
async def async_raising_login(request: HttpRequest) -> HttpResponse:
    return await sync_to_async(_refuse_wrong_password)(request)


urlpatterns = [
    path("field-login/", protect_credentials(field_login)),
    path("named-field-login/", protect_credentials(field_login, username_field="login")),
    path(
        "throttled-named-field-login/",
        throttle(scope="login")(protect_credentials(field_login, username_field="login")),
    ),
    path(
        "async-named-field-login/",
        protect_credentials(async_field_login, username_field="login"),
    ),
    path("requestless-login/", requestless_login),
    path("query-login/", query_login),
    path("async-query-login/", async_query_login),
    path("raising-login/", raising_login),
    path("json-login/", json_login),
    path("async-json-login/", async_json_login),
    path("async-raising-login/", async_raising_login),
    path("async-requestless-login/", async_requestless_login),
    path("login/", protect_credentials(FormLogin.as_view())),
    path("async-login/", async_login),
    path("token/", protect_credentials(obtain_auth_token)),
    path("basic/", BasicProtected.as_view()),
    path("strict-basic/", StrictBasicProtected.as_view()),
    path("admin/login/", protect_credentials(admin.site.login)),
    # The same credentials checked under other rules (scopes "token" and "admin-login").
    path("api/token/", protect_credentials(obtain_auth_token, scope="token")),
    path("api/async-login/", protect_credentials(sign_in, scope="token")),
    path("staff/login/", protect_credentials(admin.site.login, scope="admin-login")),
    path("admin/", admin.site.urls),
]


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest, settings: Any) -> str:
    if request.param == "memory":
        settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    return str(request.param)


@pytest.fixture
def rules(backend: str) -> Tier:
    """The demo's rules: 100/min by IP address, 3/h by username, failures counted, for the
    login forms ("login") and for DRF's authentication classes ("authentication")."""
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    anonymous.limits.create(rate="1000/min")
    for scope in ("login", "authentication"):
        rule = EndpointRule.objects.create(name=scope, pattern=scope, counts="failures")
        for counted_by, rate in (("ip", "100/min"), ("username", "3/h")):
            EndpointLimit.objects.create(
                rule=rule, tier=anonymous, rate=rate, counted_by=counted_by
            )
    return anonymous


@pytest.fixture
def victim(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("bf1", password="right", is_staff=True)


_addresses = iter(range(1, 10_000))


def elsewhere() -> str:
    """A fresh address each time: the attack is spread, only the username counter holds."""
    n = next(_addresses)
    return f"203.0.{n // 250}.{n % 250 + 1}"


def basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


def lock(url: str) -> None:
    """Three wrong guesses for ``bf1`` from three addresses: its 3/h counter is spent."""
    for _ in range(3):
        if url == "/basic/":
            response = Client().get(
                url, HTTP_AUTHORIZATION=basic("bf1:wrong"), REMOTE_ADDR=elsewhere()
            )
            assert response.status_code == 401
        else:
            response = Client().post(
                url, {"username": "bf1", "password": "wrong"}, REMOTE_ADDR=elsewhere()
            )
            assert response.status_code in (200, 400)
    if url == "/basic/":
        right = Client().get(url, HTTP_AUTHORIZATION=basic("bf1:right"))
    else:
        right = Client().post(url, {"username": "bf1", "password": "right"})
    assert right.status_code == 429


def json_post(url: str, data: dict[str, Any], content_type: str = "application/json") -> int:
    body = json.dumps(data)
    return int(
        Client().post(url, body, content_type=content_type, REMOTE_ADDR=elsewhere()).status_code
    )


def stray(credentials: str) -> str:
    """Basic credentials with a character base64 does not have, which DRF drops."""
    encoded = base64.b64encode(credentials.encode()).decode()
    return f"Basic {encoded[:4]}!{encoded[4:]}"


def test_a_json_body_over_64_kib_is_read(rules: Tier, victim: Any) -> None:
    lock("/token/")
    big = {"username": "bf1", "password": "right", "padding": "x" * 70_000}
    assert json_post("/token/", big) == 429


@pytest.mark.parametrize(
    "content_type", ["Application/JSON", "application/json; charset=UTF-8", "*/*", "text/plain"]
)
def test_a_json_body_under_any_content_type_is_read(
    rules: Tier, victim: Any, content_type: str
) -> None:
    lock("/token/")
    assert json_post("/token/", {"username": "bf1", "password": "right"}, content_type) == 429


def test_a_form_body_under_a_wildcard_content_type_is_read(rules: Tier, victim: Any) -> None:
    lock("/token/")
    response = Client().post(
        "/token/", "username=bf1&password=right", content_type="*/*", REMOTE_ADDR=elsewhere()
    )
    assert response.status_code == 429


def test_a_number_is_read_as_drf_reads_it(rules: Tier, django_user_model: Any) -> None:
    django_user_model.objects.create_user("42", password="right")
    for _ in range(3):
        assert json_post("/token/", {"username": 42, "password": "wrong"}) == 400
    assert json_post("/token/", {"username": "42", "password": "right"}) == 429


def test_basic_credentials_with_a_stray_character_are_read(rules: Tier, victim: Any) -> None:
    lock("/basic/")
    response = Client().get("/basic/", HTTP_AUTHORIZATION=stray("bf1:right"))
    assert response.status_code == 429
    # The same stray character on an unlocked user: DRF reads it, and so it signs in.
    response = Client().get("/basic/", HTTP_AUTHORIZATION=stray("bf1:right"), REMOTE_ADDR="::1")
    assert response.status_code == 429


def test_basic_credentials_after_a_tab_are_counted(rules: Tier, victim: Any) -> None:
    """DRF splits the header on any whitespace: so does the check that decides whether a
    request presents Basic credentials at all."""
    lock("/basic/")
    encoded = base64.b64encode(b"bf1:right").decode()
    for header in (f"Basic\t{encoded}", f"  basic   {encoded}  "):
        assert Client().get("/basic/", HTTP_AUTHORIZATION=header).status_code == 429


@pytest.mark.parametrize("spelling", ["ｂｆ１", "𝐛𝐟𝟏", "BF1", " bf1 "])  # noqa: RUF001
def test_every_spelling_the_login_form_accepts_shares_one_counter(
    rules: Tier, victim: Any, spelling: str
) -> None:
    lock("/login/")
    response = Client().post(
        "/login/", {"username": spelling, "password": "right"}, REMOTE_ADDR=elsewhere()
    )
    assert response.status_code == 429


@pytest.mark.parametrize("url", ["/requestless-login/", "/async-requestless-login/"])
def test_a_view_authenticating_without_the_request_is_counted(
    rules: Tier, victim: Any, url: str
) -> None:
    """``authenticate()`` called without the request still tells the guard the attempt
    failed, though the view answers 200: ``bf1``'s 3/h holds, from any address."""
    data = {"username": "bf1", "password": "wrong"}
    statuses = [Client().post(url, data, REMOTE_ADDR=elsewhere()).status_code for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429]
    right = {"username": "bf1", "password": "right"}
    assert Client().post(url, right, REMOTE_ADDR=elsewhere()).status_code == 429


@pytest.mark.django_db(transaction=True)
def test_an_async_view_authenticating_without_the_request_is_counted(
    rules: Tier, victim: Any
) -> None:
    """The same through an ASGI client, the view on the event loop."""
    from asgiref.sync import async_to_sync

    async def attempts() -> list[int]:
        data = {"username": "bf1", "password": "wrong"}
        return [
            (
                await AddressedAsyncClient(elsewhere()).post("/async-requestless-login/", data)
            ).status_code
            for _ in range(5)
        ]

    assert async_to_sync(attempts)() == [200, 200, 200, 429, 429]


@pytest.mark.parametrize("exempt", ["user", "network"])
@pytest.mark.parametrize("url", ["/login/", "/async-login/", "/token/", "/basic/"])
def test_an_exempt_caller_meets_the_login_counters(
    rules: Tier, victim: Any, django_user_model: Any, url: str, exempt: str
) -> None:
    """An exemption lifts the caller's own limits, not the counters that protect the account
    named: a signed-in exempt user, or a client in an exempt network, guessing ``bf1``'s
    password meets its 3/h like anyone."""
    from django_throttle.models import Exemption

    insider = django_user_model.objects.create_user("insider", password="pw")
    client = Client()
    if exempt == "user":
        Exemption.objects.create(user=insider, note="partner")
        client.force_login(insider)
    else:
        Exemption.objects.create(network="198.51.100.0/24", note="office")
    address = "198.51.100.7"
    statuses = []
    for _ in range(5):
        if url == "/basic/":
            response = client.get(url, HTTP_AUTHORIZATION=basic("bf1:wrong"), REMOTE_ADDR=address)
        else:
            data = {"username": "bf1", "password": "wrong"}
            response = client.post(url, data, REMOTE_ADDR=address)
        statuses.append(response.status_code)
    assert 429 not in statuses[:3]
    assert statuses[3:] == [429, 429]
    # Its own requests stay unlimited: the insider's right password is never refused.
    if url == "/basic/":
        own = client.get(url, HTTP_AUTHORIZATION=basic("insider:pw"), REMOTE_ADDR=address)
        assert own.status_code == 200
    else:
        own = client.post(url, {"username": "insider", "password": "pw"}, REMOTE_ADDR=address)
        assert own.status_code in (200, 302)


@pytest.mark.parametrize("url", ["/named-field-login/", "/async-named-field-login/"])
def test_a_view_names_its_own_username_field(rules: Tier, victim: Any, url: str) -> None:
    """``username_field="login"``: the field the view reads is the one counted."""
    data = {"login": "BF1", "password": "wrong"}
    statuses = [Client().post(url, data, REMOTE_ADDR=elsewhere()).status_code for _ in range(5)]
    assert statuses == [401, 401, 401, 429, 429]


def test_a_username_the_limiter_cannot_read_is_logged(
    rules: Tier, victim: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A view reading its username from another field meets no limit by username: the
    first failure there says so, naming the way out; later ones stay quiet."""
    from django_throttle.request import core

    core._unread_paths.clear()
    data = {"login": "bf1", "password": "wrong"}
    with caplog.at_level(logging.WARNING, logger="django_throttle"):
        for _ in range(3):
            Client().post("/field-login/", data, REMOTE_ADDR=elsewhere())
    warnings = [r.getMessage() for r in caplog.records if "username_field" in r.getMessage()]
    assert len(warnings) == 1
    assert "/field-login/" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="django_throttle"):
        Client().post("/named-field-login/", data, REMOTE_ADDR=elsewhere())
    assert not [r for r in caplog.records if "username_field" in r.getMessage()]


def test_a_padded_username_the_limiter_cannot_read_is_logged(
    rules: Tier, victim: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The same, for a name behind more than 1,024 characters of padding (once cut to them
    before it was stripped: nothing left, no warning)."""
    from django_throttle.request import core

    core._unread_paths.clear()
    data = {"login": " " * 1_100 + "bf1", "password": "wrong"}
    with caplog.at_level(logging.WARNING, logger="django_throttle"):
        Client().post("/field-login/", data, REMOTE_ADDR=elsewhere())
    assert [r for r in caplog.records if "username_field" in r.getMessage()]


def test_username_field_must_name_a_field() -> None:
    with pytest.raises(TypeError, match="username_field"):
        protect_credentials(field_login, username_field="")


def test_basic_attempts_counted_locally_say_so(rules: Tier, victim: Any, settings: Any) -> None:
    """While Redis is down, a DRF authentication class counts in the process, and every
    answer says so, the 401 of a wrong password and the 429 included."""
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    responses = [
        Client().get("/basic/", HTTP_AUTHORIZATION=basic("bf1:wrong"), REMOTE_ADDR=elsewhere())
        for _ in range(4)
    ]
    assert [r.status_code for r in responses] == [401, 401, 401, 429]
    assert [r.headers.get("X-RateLimit-Degraded") for r in responses] == ["local"] * 4


@pytest.mark.parametrize("backend", ["down"])
@pytest.mark.parametrize("url", ["/login/", "/async-login/", "/basic/"])
def test_fresh_names_never_flush_a_spent_counter_while_redis_is_down(
    rules: Tier, victim: Any, settings: Any, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    """While Redis is down the attempts count in the process's bounded store. Guessing
    ``bf1`` until its 3/h is spent, then trying one fresh username after another from fresh
    addresses (each a new counter by IP address and by username) filled the store, and the
    least recently used key went first: ``bf1``'s spent counter, so the right password passed
    again. A spent counter outlives every counter one failure started, and stays."""
    from asgiref.sync import async_to_sync

    from django_throttle import backends

    monkeypatch.setattr(backends, "LOCAL_FALLBACK_MAX_CLIENTS", 60)
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1  # the address: X-Forwarded-For, ASGI too

    def attempt(username: str, password: str) -> int:
        headers = {"X-Forwarded-For": elsewhere()}
        data = {"username": username, "password": password}
        if url == "/basic/":
            headers["Authorization"] = basic(f"{username}:{password}")
            response = Client().get(url, headers=headers)
        elif url == "/async-login/":
            response = async_to_sync(AsyncClient().post)(url, data, headers=headers)
        else:
            response = Client().post(url, data, headers=headers)
        assert response.headers.get("X-RateLimit-Degraded") == "local"
        return int(response.status_code)

    assert [attempt("bf1", "wrong") != 429 for _ in range(3)] == [True] * 3
    assert attempt("bf1", "right") == 429
    fresh = [attempt(f"stranger{n}", "wrong") for n in range(200)]
    assert fresh[0] != 429  # a fresh name has a counter of its own while there is room
    # Beyond the bound, fresh names share one overflow counter per limit (3 here).
    assert len(backends.get_local_backend()) <= 60 + 3
    assert attempt("bf1", "right") == 429


@pytest.mark.parametrize("backend", ["down"])
@pytest.mark.parametrize("url", ["/login/", "/async-login/"])
def test_long_lived_counters_never_flush_a_login_counter_while_redis_is_down(
    rules: Tier, victim: Any, settings: Any, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    """``bf1`` guessed twice (one attempt left of its 3/h); then 16 fresh usernames spent
    whole (their counters live an hour, longer than ``bf1``'s) and fresh names after them
    filled the bounded store, and ``bf1``'s counter, the oldest and nearest its expiry, was
    forgotten: three more guesses. A credential check's counters are kept: a full store
    counts new names in its overflow counters instead."""
    from asgiref.sync import async_to_sync

    from django_throttle import backends

    monkeypatch.setattr(backends, "LOCAL_FALLBACK_MAX_CLIENTS", 60)
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1

    def attempt(username: str, password: str, address: str | None = None) -> int:
        headers = {"X-Forwarded-For": address or elsewhere()}
        data = {"username": username, "password": password}
        if url == "/async-login/":
            response = async_to_sync(AsyncClient().post)(url, data, headers=headers)
        else:
            response = Client().post(url, data, headers=headers)
        assert response.headers.get("X-RateLimit-Degraded") == "local"
        return int(response.status_code)

    home = elsewhere()
    assert [attempt("bf1", "wrong", home) != 429 for _ in range(2)] == [True, True]
    for n in range(16):
        assert [attempt(f"spent{n}", "wrong") for _ in range(4)][-1] == 429
    for n in range(100):
        attempt(f"fresh{n}", "wrong")
    assert attempt("bf1", "wrong", home) != 429  # its last attempt
    assert attempt("bf1", "right", home) == 429


#: Letters with a stroke or a bar: no decomposition, but the DUCET (the Unicode Collation
#: Algorithm's table behind MySQL's ``utf8mb4_0900_ai_ci``) weighs each as its base letter
#: with a secondary (accent) difference, so an accent-insensitive collation matches them.
STROKED = str.maketrans(
    {"ł": "l", "ø": "o", "đ": "d", "ħ": "h", "ŧ": "t", "ɨ": "i", "ƀ": "b", "ƶ": "z", "ǥ": "g"}
)


def collated(name: str) -> str:
    """``name`` as a case- and accent-insensitive collation compares it (MySQL's default
    ``utf8mb4_0900_ai_ci``; PostgreSQL's ``iexact`` for the case): accents, zero-width and
    format characters ignored, stroked letters as their base letter, letters upper-cased."""
    decomposed = unicodedata.normalize("NFKD", name.lower()).translate(STROKED)
    return "".join(c for c in decomposed if unicodedata.category(c) not in ("Mn", "Cf")).upper()


class CollatedBackend(ModelBackend):
    """``ModelBackend`` on a database that matches usernames as :func:`collated` does."""

    def authenticate(
        self, request: Any, username: str | None = None, password: str | None = None, **kw: Any
    ) -> Any:
        model = get_user_model()
        username = kw.get(model.USERNAME_FIELD) if username is None else username
        if username is None or password is None:
            return None
        for user in model._default_manager.all():
            if collated(user.get_username()) == collated(username):
                ok = user.check_password(password) and self.user_can_authenticate(user)
                return user if ok else None
        return None

    async def aauthenticate(self, request: Any, **credentials: Any) -> Any:
        return await sync_to_async(self.authenticate)(request, **credentials)


#: Spellings of ``alice`` such a database signs in as ``alice``: the Turkish dotless i
#: (``UPPER``: ``I``), a zero-width space, a combining accent, a soft hyphen, a direction mark.
COLLATED_SPELLINGS = ["al\u0131ce", "ali\u200bce", "a\u0301lice", "alice\u00ad", "\u200ealice"]


def collated_attempt(url: str, username: str, password: str) -> int:
    if url == "/basic/":
        header = basic(f"{username}:{password}")
        response = Client().get(url, HTTP_AUTHORIZATION=header, REMOTE_ADDR=elsewhere())
    else:
        data = {"username": username, "password": password}
        response = Client().post(url, data, REMOTE_ADDR=elsewhere())
    return int(response.status_code)


@pytest.mark.parametrize("url", ["/login/", "/async-login/", "/admin/login/", "/token/", "/basic/"])
def test_spellings_a_collation_matches_share_one_counter(
    rules: Tier, django_user_model: Any, settings: Any, url: str
) -> None:
    """Where the database matches usernames without regard to case, accents or invisible
    characters, every spelling it signs in as ``alice`` is counted as ``alice``: three wrong
    guesses under three spellings spend her 3/h, from three addresses."""
    settings.AUTHENTICATION_BACKENDS = ["tests.test_login_protection.CollatedBackend"]
    django_user_model.objects.create_user("alice", password="right", is_staff=True)
    signed_in = {"/token/": 200, "/basic/": 200}.get(url, 302)
    for spelling in COLLATED_SPELLINGS:  # the database does sign these in as alice
        assert collated_attempt(url, spelling, "right") == signed_in
    wrong = [collated_attempt(url, spelling, "wrong") for spelling in COLLATED_SPELLINGS[:3]]
    assert 429 not in wrong
    assert collated_attempt(url, "alice", "right") == 429
    assert collated_attempt(url, COLLATED_SPELLINGS[4], "right") == 429


#: Accounts, and spellings of them a collation ignoring accents signs in as them whose
#: letters have a stroke or a bar (no decomposition: once each counted apart).
STROKED_SPELLINGS = {
    "lukasz": ["łukasz", "ŁUKASZ", "Łukasz"],
    "soren": ["søren", "SØREN", "Søren"],
    "dorde": ["đorđe", "ĐORĐE", "Đorđe"],
    "htibzg": ["ħŧɨƀƶǥ", "ĦŦƗɃƵǤ", "ħtɨbzǥ"],
}


@pytest.mark.parametrize("account", STROKED_SPELLINGS)
@pytest.mark.parametrize("url", ["/login/", "/async-login/", "/basic/"])
def test_stroked_letters_share_their_base_letters_counter(
    rules: Tier, django_user_model: Any, settings: Any, url: str, account: str
) -> None:
    """``łukasz`` signs in as ``lukasz`` where the collation ignores accents (``ł`` is ``l``
    with a secondary difference), so its wrong guesses spend ``lukasz``'s 3/h."""
    settings.AUTHENTICATION_BACKENDS = ["tests.test_login_protection.CollatedBackend"]
    django_user_model.objects.create_user(account, password="right", is_staff=True)
    spellings = STROKED_SPELLINGS[account]
    signed_in = {"/basic/": 200}.get(url, 302)
    assert collated_attempt(url, spellings[0], "right") == signed_in  # the database's view
    wrong = [collated_attempt(url, spelling, "wrong") for spelling in spellings]
    assert 429 not in wrong
    assert collated_attempt(url, account, "right") == 429


#: Whitespace ``str.strip`` removes, as Django's and DRF's ``CharField`` do before they
#: authenticate: ASCII, Latin-1's no-break space, the ideographic, em and ogham spaces, and the
#: information separators U+001C-U+001F.
PADDINGS = [" ", "\t", "\u3000", "\u00a0", "\u2003", "\u1680", "\x1c\x1d\x1e\x1f"]


def padded(padding: str) -> str:
    """``bf1`` behind more than 1,024 characters of ``padding`` (once cut before stripping,
    to nothing: no username counter at all), and some after."""
    return padding * (1_100 // len(padding)) + "bf1" + padding * 3


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("url", ["/login/", "/admin/login/", "/token/"])
def test_a_username_behind_any_padding_is_still_counted_in_a_form(
    rules: Tier, victim: Any, url: str, padding: str
) -> None:
    """The form strips the padding and would sign ``bf1`` in: the padded spelling is refused
    once the username's counter is spent, from any address."""
    lock(url)
    data = {"username": padded(padding), "password": "right"}
    assert Client().post(url, data, REMOTE_ADDR=elsewhere()).status_code == 429


@pytest.mark.parametrize("padding", PADDINGS)
def test_a_username_behind_any_padding_is_still_counted_in_json(
    rules: Tier, victim: Any, padding: str
) -> None:
    lock("/token/")
    assert json_post("/token/", {"username": padded(padding), "password": "right"}) == 429


@pytest.mark.parametrize("padding", PADDINGS)
def test_a_username_behind_any_padding_is_still_counted_in_basic(
    rules: Tier, victim: Any, padding: str
) -> None:
    lock("/basic/")
    header = basic(f"{padded(padding)}:right")
    assert (
        Client().get("/basic/", HTTP_AUTHORIZATION=header, REMOTE_ADDR=elsewhere()).status_code
        == 429
    )


@pytest.mark.parametrize(
    "data",
    [
        {"username": "\u00a0" * 1_100 + "bf1", "password": "right"},
        {"username": "bf1", "password": "right", "note": "caf\u00e9"},
    ],
)
def test_a_json_body_is_decoded_with_the_charset_it_declares(
    rules: Tier, victim: Any, data: dict[str, str]
) -> None:
    """DRF decodes a JSON body with the Content-Type's charset: a Latin-1 body is read by
    it (and the right password signs in), so it is read for the counter too."""
    body = json.dumps(data, ensure_ascii=False)  # the test client encodes it as declared
    content_type = "application/json; charset=latin-1"

    def post() -> int:
        response = Client().post(
            "/token/", body, content_type=content_type, REMOTE_ADDR=elsewhere()
        )
        return int(response.status_code)

    assert post() == 200  # DRF reads it: the right password gets a token
    lock("/token/")
    assert post() == 429


def test_a_header_and_a_body_naming_two_users_count_for_both(rules: Tier, victim: Any) -> None:
    lock("/token/")
    response = Client().post(
        "/token/",
        {"username": "bf1", "password": "right"},
        HTTP_AUTHORIZATION=basic("someone-else:x"),
        REMOTE_ADDR=elsewhere(),
    )
    assert response.status_code == 429
    both = {"username": "bf1", "email": "other@example.com", "password": "right"}
    assert json_post("/token/", both) == 429


def test_an_authentication_class_counts_the_header_only(rules: Tier, victim: Any) -> None:
    """An API call authenticated by Basic whose body names someone else (a user it creates)
    is counted under the Basic user only: the body is not what that class checks."""
    for _ in range(3):
        response = Client().post(
            "/basic/",
            {"username": "newbie"},
            content_type="application/json",
            HTTP_AUTHORIZATION=basic("bf1:wrong"),
            REMOTE_ADDR=elsewhere(),
        )
        assert response.status_code == 401
    assert Client().get("/basic/", HTTP_AUTHORIZATION=basic("bf1:right")).status_code == 429
    assert Client().get("/basic/", HTTP_AUTHORIZATION=basic("newbie:x")).status_code == 401


def test_credentials_that_cannot_be_read_share_one_counter(rules: Tier, victim: Any) -> None:
    """Neither JSON nor a form: counted, all such requests together wherever they are sent
    (the token view, DRF's authentication), never skipped."""
    for _ in range(3):
        response = Client().post(
            "/token/", "<xml/>", content_type="application/xml", REMOTE_ADDR=elsewhere()
        )
        assert response.status_code == 415  # DRF has no parser for it: nothing checked
    response = Client().post(
        "/token/", "username: bf1", content_type="application/yaml", REMOTE_ADDR=elsewhere()
    )
    assert response.status_code == 429
    statuses = [
        Client().get("/basic/", HTTP_AUTHORIZATION=header, REMOTE_ADDR=elsewhere()).status_code
        for header in ("Basic", "Basic a b", "Basic " + base64.b64encode(b"no colon").decode())
    ]
    assert statuses == [429] * 3  # the token view's failures spent the one counter


def test_a_signed_in_browser_keeps_its_own_allowance_under_attack(rules: Tier, victim: Any) -> None:
    browser = Client()
    response = browser.post("/login/", {"username": "bf1", "password": "right"})
    assert response.status_code == 302
    cookie = response.cookies[usernames.COOKIE_NAME]
    assert cookie["httponly"] and cookie["samesite"] == "Lax"
    assert len(cookie.value) <= usernames.MAX_COOKIE_CHARS
    assert "bf1" not in cookie.value  # the cookie names the user by a digest
    browser.post("/admin/logout/")

    lock("/login/")  # an attacker spends the username's allowance
    assert Client().post("/login/", {"username": "bf1", "password": "right"}).status_code == 429
    # The browser that signed in before still gets in, with the right password.
    assert browser.post("/login/", {"username": "bf1", "password": "right"}).status_code == 302


@pytest.mark.django_db(transaction=True)
def test_an_async_login_view_gives_a_device_cookie_too(rules: Tier, victim: Any) -> None:
    from asgiref.sync import async_to_sync

    async def scenario() -> list[int]:
        browser = AsyncClient()
        signed_in = await browser.post("/async-login/", {"username": "bf1", "password": "right"})
        assert usernames.COOKIE_NAME in signed_in.cookies
        await browser.post("/admin/logout/")
        statuses = [signed_in.status_code]
        for _ in range(4):  # an attacker, from anywhere
            attempt = await AddressedAsyncClient(elsewhere()).post(
                "/async-login/", {"username": "bf1", "password": "wrong"}
            )
            statuses.append(attempt.status_code)
        again = await browser.post("/async-login/", {"username": "bf1", "password": "right"})
        return [*statuses, again.status_code]

    assert async_to_sync(scenario)() == [302, 401, 401, 401, 429, 302]


def test_a_device_cookie_that_keeps_failing_is_locked_out_on_its_own(
    rules: Tier, victim: Any, django_user_model: Any
) -> None:
    stolen = Client()
    assert stolen.post("/login/", {"username": "bf1", "password": "right"}).status_code == 302
    stolen.post("/admin/logout/")
    value = stolen.cookies[usernames.COOKIE_NAME].value
    attacker = Client()
    attacker.cookies[usernames.COOKIE_NAME] = value

    def guess(client: Client, username: str = "bf1") -> int:
        data = {"username": username, "password": "wrong"}
        return client.post("/login/", data, REMOTE_ADDR=elsewhere()).status_code

    assert [guess(attacker) for _ in range(4)] == [200, 200, 200, 429]
    # The shared counter was not touched: another browser still has its three guesses.
    assert [guess(Client()) for _ in range(4)] == [200, 200, 200, 429]
    # A cookie for bf1 is worth nothing for another user.
    django_user_model.objects.create_user("carol", password="right")
    for _ in range(3):
        guess(Client(), "carol")
    assert guess(attacker, "carol") == 429


@pytest.mark.parametrize(
    "value",
    [
        "forged:cookie:value",
        "x" * 5000,
        "",
    ],
)
def test_an_invalid_device_cookie_counts_in_the_shared_counter(
    rules: Tier, victim: Any, value: str
) -> None:
    lock("/login/")
    client = Client()
    client.cookies[usernames.COOKIE_NAME] = value
    assert client.post("/login/", {"username": "bf1", "password": "right"}).status_code == 429


def test_an_expired_device_cookie_counts_in_the_shared_counter(
    rules: Tier, victim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    browser = Client()
    assert browser.post("/login/", {"username": "bf1", "password": "right"}).status_code == 302
    browser.post("/admin/logout/")
    lock("/login/")
    monkeypatch.setattr(usernames, "MAX_AGE", -1)
    assert browser.post("/login/", {"username": "bf1", "password": "right"}).status_code == 429


def test_the_admin_login_gives_a_device_cookie(rules: Tier, victim: Any) -> None:
    browser = Client()
    response = browser.post("/admin/login/?next=/admin/", {"username": "bf1", "password": "right"})
    assert response.status_code == 302
    assert usernames.COOKIE_NAME in response.cookies
    browser.post("/admin/logout/")
    lock("/admin/login/")
    assert (
        Client().post("/admin/login/", {"username": "bf1", "password": "right"}).status_code == 429
    )
    again = browser.post("/admin/login/?next=/admin/", {"username": "bf1", "password": "right"})
    assert again.status_code == 302


def test_a_failed_login_gives_no_device_cookie(rules: Tier, victim: Any) -> None:
    response = Client().post("/login/", {"username": "bf1", "password": "wrong"})
    assert usernames.COOKIE_NAME not in response.cookies
    response = Client().post("/login/", {"username": "bf1"})  # no password: nothing checked
    assert usernames.COOKIE_NAME not in response.cookies


@pytest.mark.slow
def test_memory_stays_flat_whatever_clients_send(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused Basic requests with a new username each: before, each kept ~24 KB in the
    worker (a frame cache entry holding the whole script), ~100 MB at its 4,096-entry bound.
    Measured with tracemalloc from after a warm-up (allocator noise stays out): what the
    next 1,000 requests keep alive, ~48 MB before, must stay far below that."""
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 3600)
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    anonymous.limits.create(rate="1000/min")
    rule = EndpointRule.objects.create(
        name="authentication", pattern="authentication", counts="failures"
    )
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="1/h", counted_by="ip")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="3/h", counted_by="username")
    policy.current()
    client = Client()
    n = 0

    def refused(count: int) -> None:
        nonlocal n
        for _ in range(count):
            n += 1
            header = basic(f"user{n}:wrong")
            assert client.get("/basic/", HTTP_AUTHORIZATION=header).status_code in (401, 429)

    refused(100)
    # Django logs every 401 and 429 with its request, and pytest keeps the records.
    logging.disable(logging.WARNING)
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        refused(1_000)
        gc.collect()
        end, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        logging.disable(logging.NOTSET)
    assert peak - start < 8_000_000, f"peak grew by {peak - start:,} bytes"
    assert end - start < 4_000_000, f"kept {end - start:,} bytes"


def test_limits_built_anew_for_every_call_keep_memory_flat(backend: str) -> None:
    """Equal limits built for each call (inline limits, per-request groups) share one cache
    entry: what 2,000 calls keep alive stays far below one script copy per call."""
    from django_throttle.backends import get_backend
    from django_throttle.rates import Limit

    counting = get_backend()

    def calls(count: int) -> None:
        for i in range(count):
            limits = (Limit.build("a", "5/min"), Limit.build("b", "100/h"))
            counting.hit(f"ip:198.51.100.{i % 250}", limits)

    calls(100)
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        calls(2_000)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert kept < 1_000_000, f"kept {kept:,} bytes"


# --- one budget per account, wherever its password is tried ----------------------------------


def guard(scope: str, tier: Tier, by_username: str = "3/h", by_ip: str = "100/min") -> None:
    """A rule for ``scope`` counting failures, by IP address and by username."""
    rule = EndpointRule.objects.create(name=scope, pattern=scope, counts="failures")
    for counted_by, rate in (("ip", by_ip), ("username", by_username)):
        EndpointLimit.objects.create(rule=rule, tier=tier, rate=rate, counted_by=counted_by)


def wrong(url: str, address: str | None = None, username: str = "bf1") -> int:
    """A wrong password for ``username`` at ``url`` (fresh address unless one is given)."""
    address = address or elsewhere()
    if url == "/basic/":
        credentials = basic(f"{username}:wrong")
        return Client().get(url, HTTP_AUTHORIZATION=credentials, REMOTE_ADDR=address).status_code
    data = {"username": username, "password": "wrong"}
    return Client().post(url, data, REMOTE_ADDR=address).status_code


def right(url: str) -> int:
    if url == "/basic/":
        return Client().get(url, HTTP_AUTHORIZATION=basic("bf1:right")).status_code
    return Client().post(url, {"username": "bf1", "password": "right"}).status_code


GUARDED = ["/login/", "/basic/", "/api/token/", "/staff/login/"]


@pytest.mark.parametrize("last", GUARDED)
def test_failures_at_every_guarded_endpoint_share_the_accounts_budget(
    rules: Tier, victim: Any, last: str
) -> None:
    """Four rules of 3/h by username (the web login, DRF's authentication, the token view,
    the admin's login) are 3 guesses per account an hour, not 12: one failure at each of
    three endpoints spends it, and the right password is refused at any of them."""
    guard("token", rules)
    guard("admin-login", rules)
    spent = [wrong(url) for url in GUARDED if url != last]
    assert 429 not in spent
    assert right(last) == 429


def test_an_async_view_and_a_sync_one_share_the_budget(rules: Tier, victim: Any) -> None:
    from asgiref.sync import async_to_sync

    guard("token", rules)

    async def scenario() -> list[int]:
        statuses = []
        for url in ("/api/async-login/", "/async-login/", "/api/async-login/"):
            attempt = await AddressedAsyncClient(elsewhere()).post(
                url, {"username": "bf1", "password": "wrong"}
            )
            statuses.append(attempt.status_code)
        again = await AsyncClient().post("/async-login/", {"username": "bf1", "password": "right"})
        return [*statuses, again.status_code]

    assert async_to_sync(scenario)() == [401, 401, 401, 429]
    assert right("/login/") == 429  # the sync view meets the same counter


def test_the_strictest_limit_written_holds_at_every_endpoint(rules: Tier, victim: Any) -> None:
    """The admin's login allows 2 failures an hour, the others 3: the account's budget is 2
    wherever they are tried (a guess at the loosest endpoint tries the same password)."""
    guard("admin-login", rules, by_username="2/h")
    assert [wrong("/login/"), wrong("/basic/")] == [200, 401]
    assert right("/login/") == 429
    assert right("/staff/login/") == 429


def test_one_address_guessing_many_accounts_meets_one_budget(
    backend: str, django_user_model: Any
) -> None:
    """Per IP address too: 3 failures a minute from one address over two endpoints."""
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    anonymous.limits.create(rate="1000/min")
    for scope in ("login", "token"):
        guard(scope, anonymous, by_username="100/h", by_ip="3/min")
    address = "198.51.100.7"
    statuses = [
        wrong(url, address, f"user{n}") for n, url in enumerate(["/login/", "/api/token/"] * 2)
    ]
    assert statuses == [200, 400, 200, 429]


def test_operator_tools_see_and_reset_the_shared_counter(rules: Tier, victim: Any) -> None:
    """After failures at two endpoints, inspect shows one counter by username with what is
    left of the account's budget, explain says a login is refused, and reset lets it in."""
    import io

    from django.core.management import call_command

    def command(*args: str) -> Any:
        out = io.StringIO()
        call_command(*args, "--format", "json", stdout=out, stderr=io.StringIO())
        return json.loads(out.getvalue())

    guard("token", rules)
    guard("admin-login", rules, by_username="5/h")  # written apart: a counter of its own
    assert [wrong("/login/"), wrong("/api/token/")] == [200, 400]

    inspected = command("throttle_inspect", "username:bf1")
    by_name = {
        (row["from"], row["remaining"])
        for row in inspected["rows"]
        if row["counted_by"] == "username bf1"
    }
    assert by_name == {("rule 'login'", 1), ("rule 'admin-login'", 3)}
    wrong("/basic/")
    explained = command(
        "throttle_explain",
        "--ip",
        "198.51.100.99",
        "--username",
        "bf1",
        *("--method", "POST", "--path", "/api/token/"),
    )
    assert explained["next_request"].startswith("denied (429)")

    reset = command("throttle_reset", "username:bf1")
    assert "username bf1" in {row["counted_by"] for row in reset["rows"]}
    assert right("/login/") == 302
    assert right("/api/token/") == 200


@pytest.mark.parametrize("url, wrong", [("/login/", 200), ("/async-login/", 401)])
@pytest.mark.parametrize("own", ["BF1", "b\u1e1f1", "\u0180f1"])
def test_a_device_cookie_of_a_look_alike_account_counts_in_the_shared_counter(
    rules: Tier, victim: Any, django_user_model: Any, own: str, url: str, wrong: int
) -> None:
    """An attacker who owns an account whose name folds to the victim's (``BF1``, ``bḟ1``,
    ``ƀf1``: accounts of their own where names are compared as they are) signs in to it as
    often as they like, each time without a cookie: each sign-in gives a new device. Before,
    every such cookie was a fresh allowance of guesses at the victim's password, so the one
    counter per username held nothing back."""
    django_user_model.objects.create_user(own, password="mine")
    cookies = []
    for _ in range(3):
        response = Client().post(url, {"username": own, "password": "mine"})
        assert response.status_code == 302
        cookies.append(response.cookies[usernames.COOKIE_NAME].value)
    statuses = []
    for value in cookies:
        attacker = Client()
        attacker.cookies[usernames.COOKIE_NAME] = value
        for _ in range(2):
            data = {"username": "bf1", "password": "wrong"}
            statuses.append(attacker.post(url, data, REMOTE_ADDR=elsewhere()).status_code)
    assert statuses == [wrong] * 3 + [429] * 3


@pytest.mark.parametrize("own", ["bf1 ", "\u00a0bf1", "\uff42\uff46\uff11"])
def test_an_account_named_as_no_form_reads_a_name_gets_no_device_cookie(
    rules: Tier, victim: Any, django_user_model: Any, own: str
) -> None:
    """An account of the attacker's own saved as ``bf1`` with a space, or fullwidth (a
    signup that neither strips nor normalises; the database keeps it apart from ``bf1``),
    signed in to through a view that does neither either: its cookie compared names as the
    login form reads them, ``bf1``, so each sign-in was a fresh allowance of guesses at
    ``bf1``'s password at the login form, locked or not (before: 3 per cookie here, any
    number of cookies). Such an account gets no cookie."""
    mine = django_user_model(username=own)
    mine.set_password("mine")
    mine.save()
    attackers = []
    for _ in range(3):
        attacker = Client()
        response = attacker.post("/async-login/", {"username": own, "password": "mine"})
        assert response.status_code == 302
        assert usernames.COOKIE_NAME not in response.cookies
        attackers.append(attacker)
    statuses = []
    for attacker in attackers:
        for _ in range(2):
            data = {"username": "bf1", "password": "wrong"}
            statuses.append(attacker.post("/login/", data, REMOTE_ADDR=elsewhere()).status_code)
    assert statuses == [200] * 3 + [429] * 3


def test_a_device_cookie_holds_only_when_every_spelling_presented_is_its_accounts(
    rules: Tier, victim: Any
) -> None:
    """The victim's own cookie, with the victim's name in one field and a look-alike in
    another (both folding to its counter): the request may sign in as either account where
    names are compared as they are, so it is counted in the shared counter."""
    browser = Client()
    assert browser.post("/login/", {"username": "bf1", "password": "right"}).status_code == 302
    browser.post("/admin/logout/")
    lock("/login/")
    two = {"username": "bf1", "email": "BF1", "password": "right"}
    assert browser.post("/login/", two).status_code == 429
    assert browser.post("/login/", {"username": " bf1 ", "password": "right"}).status_code == 302


@pytest.mark.parametrize("url", ["/login/", "/async-login/", "/token/", "/basic/"])
def test_guesses_spelled_as_a_collation_reads_them_share_the_accounts_counter(
    rules: Tier, victim: Any, url: str
) -> None:
    """Where usernames are compared as MySQL's default collation compares them, ``bf\u0661``
    (an Arabic-Indic one) and ``b\u0640f1`` (a tatweel inside) sign in as ``bf1``: guesses
    spelled so, from anywhere, spend ``bf1``'s allowance (before: each spelling had one of
    its own, and tatweels can be added without end)."""
    for spelling in ("bf\u0661", "b\u0640f1", "b\u0640\u0640f\u0967"):
        if url == "/basic/":
            response = Client().get(
                url, HTTP_AUTHORIZATION=basic(f"{spelling}:wrong"), REMOTE_ADDR=elsewhere()
            )
        else:
            data = {"username": spelling, "password": "wrong"}
            response = Client().post(url, data, REMOTE_ADDR=elsewhere())
        assert response.status_code in (200, 400, 401)
    if url == "/basic/":
        right = Client().get(url, HTTP_AUTHORIZATION=basic("bf1:right"), REMOTE_ADDR=elsewhere())
    else:
        data = {"username": "bf1", "password": "right"}
        right = Client().post(url, data, REMOTE_ADDR=elsewhere())
    assert right.status_code == 429


def test_an_account_known_by_a_number_is_remembered_by_its_text() -> None:
    """A user model whose ``USERNAME_FIELD`` holds a number: the sign-in is marked with the
    number's text (what a form presents), so the browser still earns its device cookie."""
    from django_throttle.request import core

    class Numbered:
        def get_username(self) -> int:
            return 4711

    request = HttpRequest()
    core._logged_in(None, request=request, user=Numbered())
    assert getattr(request, core.LOGGED_IN_ATTRIBUTE) == "4711"


#: Spellings of ``carl`` the DUCET weighs as ``carl`` at the first level: combining letters
#: written below or with an accent of their own, ``\u0140`` (``l`` and a middle dot), as a
#: DRF view hands it on unnormalised and as NFKC writes it, and a crossed squared letter.
DUCET_SPELLINGS = ["ca\u1dcal", "\u1dd7arl", "car\u0140", "carl\u00b7", "CAR\u013f"]


def spelled_attempt(url: str, username: str, password: str) -> int:
    if url == "/basic/":
        header = basic(f"{username}:{password}")
        response = Client().get(url, HTTP_AUTHORIZATION=header, REMOTE_ADDR=elsewhere())
        return int(response.status_code)
    if url == "json":
        return json_post("/token/", {"username": username, "password": password})
    data = {"username": username, "password": password}
    return int(Client().post(url, data, REMOTE_ADDR=elsewhere()).status_code)


@pytest.mark.parametrize("url", ["/login/", "/async-login/", "/token/", "json", "/basic/"])
def test_letters_the_collation_weighs_as_the_accounts_share_its_counter(
    rules: Tier, django_user_model: Any, url: str
) -> None:
    """Three wrong guesses at ``carl`` spelled with letters the collation takes for his
    (before: each spelling a fresh 3/h, ``\u0140`` on every path) spend his allowance."""
    django_user_model.objects.create_user("carl", password="right")
    for spelling in DUCET_SPELLINGS[:3]:
        assert spelled_attempt(url, spelling, "wrong") in (200, 400, 401)
    assert spelled_attempt(url, "carl", "right") == 429
    assert spelled_attempt(url, DUCET_SPELLINGS[3], "right") == 429
    assert spelled_attempt(url, "\U0001f18aat", "wrong") != 429  # pat: another account


@pytest.fixture
def slow_redis(redis_process: RedisServer, settings: Any) -> Iterator[FaultProxy]:
    """A private Redis behind a proxy that can hold its replies back."""
    redis_process.ensure_healthy()
    with FaultProxy(redis_process.port) as proxy:
        settings.DJANGO_THROTTLE_REDIS_URL = proxy.url
        settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 5, "socket_connect_timeout": 5}
        yield proxy
    redis_process.ensure_healthy()


@pytest.mark.django_db(transaction=True)
def test_a_check_cancelled_between_its_calls_gives_the_first_calls_tokens_back(
    slow_redis: FaultProxy,
    redis_process: RedisServer,
    victim: Any,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client went away (Django's ASGI handler cancels the view) after the check counted
    the address and while it counted the username: the view never ran, so no guess was
    made, and the address keeps its whole allowance (before: the first call's token stayed
    taken, an allowance drained by requests that guessed nothing).

    Counted one call per counter, as on a Redis Cluster where the address's and the
    username's slots differ (on one server both are one call: there is no "between")."""
    from django_throttle.backends.base import Backend
    from django_throttle.backends.redis import RedisBackend

    monkeypatch.setattr(RedisBackend, "ahit_together", Backend.ahit_together)
    settings.DJANGO_THROTTLE_USAGE_RETENTION_DAYS = 0  # no usage pushes: the check's calls only
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    rule = EndpointRule.objects.create(name="login", pattern="login", counts="failures")
    for counted_by, rate in (("ip", "2/h"), ("username", "100/h")):
        EndpointLimit.objects.create(rule=rule, tier=anonymous, rate=rate, counted_by=counted_by)
    warm_up = {"username": "x", "password": "x"}  # the script loaded, the connections made
    assert Client().post("/async-login/", warm_up, REMOTE_ADDR=elsewhere()).status_code == 401

    async def gone(address: str, username: str) -> bool:
        """Whether the cancellation landed while the username's call was held (on a loaded
        machine the attempt may be over first: then it is tried again, elsewhere)."""
        before = len(direct.keys(pattern))
        attempt = asyncio.ensure_future(
            AddressedAsyncClient(address).post(
                "/async-login/", {"username": username, "password": "wrong"}
            )
        )
        # On a loaded machine (CI ran four suites at once) the first call's held reply took
        # longer than 5 s to come back: such an attempt is cancelled and tried again.
        deadline = time.monotonic() + 15
        while len(direct.keys(pattern)) <= before:  # the username's call ran; its reply is held
            if time.monotonic() > deadline or attempt.done():
                attempt.cancel()
                await asyncio.gather(attempt, return_exceptions=True)
                return False
            await asyncio.sleep(0.005)
        attempt.cancel()
        try:
            await attempt
        except asyncio.CancelledError:
            return True
        return False

    direct = redis_process.client()
    username_limit = EndpointLimit.objects.get(counted_by="username").pk
    # The counters of the username limit: one more once an attempt's second call ran.
    pattern = f"{settings.DJANGO_THROTTLE_KEY_PREFIX}:*e{username_limit}"
    try:
        for n in range(5):
            address = elsewhere()
            slow_redis.set_mode("delay", delay=2.0)
            try:
                if async_to_sync(gone)(address, f"bf1-{n}"):
                    break
            finally:
                slow_redis.set_mode("pass")
        else:
            pytest.fail("no attempt was cancelled while its second call was held, in 5 tries")
    finally:
        direct.close()
    wrong = {"username": "bf1", "password": "wrong"}
    outcomes = [
        Client().post("/async-login/", wrong, REMOTE_ADDR=address).status_code for _ in "123"
    ]
    assert outcomes == [401, 401, 429]


#: Passwords the hasher below was asked to check, in the order asked.
HASHED: list[str] = []


class SlowHasher(MD5PasswordHasher):
    """A hasher as slow as a real one (PBKDF2's 0.3 s), that says when it starts."""

    def verify(self, password: str, encoded: str) -> bool:
        HASHED.append(password)
        time.sleep(0.3)
        return super().verify(password, encoded)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("url", ["/async-login/", "/async-json-login/"])
def test_an_async_login_view_whose_client_hangs_up_while_it_hashes_is_counted(
    backend: str, victim: Any, settings: Any, url: str
) -> None:
    """The client hangs up (Django's ASGI handler cancels the view) while ``aauthenticate``
    hashes its guess in a worker thread, which runs on: the guess was made and the hash paid,
    and the attempt is counted as a failure (before: settled as a 500, neither, its tokens
    came back: any number of hashes, at no cost to the address's 2/h)."""
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    rule = EndpointRule.objects.create(name="login", pattern="login", counts="failures")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="2/h", counted_by="ip")
    settings.PASSWORD_HASHERS = ["tests.test_login_protection.SlowHasher"]
    HASHED.clear()
    body = json.dumps({"username": "bf1", "password": "wrong"})
    address = elsewhere()

    async def hang_up() -> str:
        attempt = asyncio.ensure_future(
            AddressedAsyncClient(address).post(url, body, content_type="application/json")
            if "json" in url
            else AddressedAsyncClient(address).post(url, json.loads(body))
        )
        asked = len(HASHED)
        deadline = time.monotonic() + 10
        while len(HASHED) == asked and not attempt.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if attempt.done():
            return str((await attempt).status_code)
        attempt.cancel()
        try:
            return str((await attempt).status_code)
        except asyncio.CancelledError:
            return "gone"

    async def attempts() -> list[str]:
        outcomes = [await hang_up() for _ in range(3)]
        await asyncio.sleep(0.4)  # the last hash ends in its thread
        return outcomes

    assert async_to_sync(attempts)() == ["gone", "gone", "429"]
    assert len(HASHED) == 2


@pytest.mark.parametrize("url", ["/login/", "/async-login/", "/token/", "/basic/"])
def test_a_tier_that_fails_open_leaves_the_login_counted_while_redis_is_down(
    rules: Tier, victim: Any, settings: Any, url: str
) -> None:
    """A tier set to fail open (its API stays up through an outage) does not open the login
    counters to its callers: they protect the account named, whatever the caller's tier, so
    its guesses are counted in the process (before: served uncounted, any number of them)."""
    rules.failure_mode = "open"
    rules.save()
    policy.reset()
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    assert [collated_attempt(url, "bf1", "wrong") for _ in range(4)][-1] == 429


def test_a_rule_that_fails_open_is_served_uncounted_while_redis_is_down(
    rules: Tier, victim: Any, settings: Any
) -> None:
    """The login rule's own mode is the operator's choice for that rule, and holds."""
    EndpointRule.objects.filter(name="login").update(failure_mode="open")
    policy.reset()
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    assert 429 not in [collated_attempt("/login/", "bf1", "wrong") for _ in range(5)]


@pytest.mark.parametrize("url", ["/login/", "/async-login/", "/token/", "json", "/basic/"])
def test_a_username_of_characters_a_collation_passes_over_is_counted(
    rules: Tier, django_user_model: Any, url: str
) -> None:
    """``ـ`` (the Arabic tatweel, a letter to Django's username validator) names an account;
    a collation that passes over it takes ``ــ``, a zero-width space or a lone accent for
    it too. Guesses at it spend one counter (before: none at all, unlimited guesses)."""
    django_user_model.objects.create_user("\u0640", password="right")
    for spelling in ("\u0640", "\u0640\u0640", "\u200b"):
        assert spelled_attempt(url, spelling, "wrong") in (200, 400, 401)
    assert spelled_attempt(url, "\u0640", "right") == 429


def test_a_view_naming_its_username_field_is_counted_under_another_check_too(
    rules: Tier, victim: Any
) -> None:
    """A login view whose guard names its field (``login``) inside a check made before it
    (``@throttle`` under the same rule): the username the outer check read without that
    field is not the one the guard counts (before: the guard met the outer check's reading,
    no username, and guesses spread over addresses were never limited)."""
    url = "/throttled-named-field-login/"
    for _ in range(3):
        data = {"login": "bf1", "password": "wrong"}
        assert Client().post(url, data, REMOTE_ADDR=elsewhere()).status_code == 401
    right = {"login": "bf1", "password": "right"}
    assert Client().post(url, right, REMOTE_ADDR=elsewhere()).status_code == 429


def chunked_json_login(username: str, password: str) -> int:
    """A JSON login over ASGI with ``Transfer-Encoding: chunked``: no ``Content-Length``,
    yet Django reads the whole body."""
    from io import BytesIO

    from django.core.handlers.asgi import ASGIRequest

    body = json.dumps({"username": username, "password": password}).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/json-login/",
        "query_string": b"",
        "client": (elsewhere(), 40000),
        "server": ("testserver", 80),
        "headers": [
            (b"content-type", b"application/json"),
            (b"transfer-encoding", b"chunked"),
        ],
    }
    return int(json_login(ASGIRequest(scope, BytesIO(body))).status_code)


def test_a_json_body_without_a_content_length_is_read(rules: Tier, victim: Any) -> None:
    """Under ASGI a chunked body has no ``Content-Length``, and Django reads it whole: its
    username is counted (before: taken for no body, so no username limit held)."""
    assert [chunked_json_login("bf1", "wrong") for _ in range(3)] == [401] * 3
    assert chunked_json_login("bf1", "right") == 429


@pytest.mark.parametrize("url", ["/raising-login/", "/async-raising-login/"])
def test_a_view_refusing_a_wrong_password_by_raising_counts_it_as_a_failure(
    rules: Tier, victim: Any, url: str
) -> None:
    """``PermissionDenied`` is Django's 403: a failure under a rule counting failures
    (before: settled as a 500, the tokens given back, and guesses were never limited)."""
    wrong = {"username": "bf1", "password": "wrong"}
    assert [Client().post(url, wrong, REMOTE_ADDR=elsewhere()).status_code for _ in "123"] == [
        403
    ] * 3
    right = {"username": "bf1", "password": "right"}
    assert Client().post(url, right, REMOTE_ADDR=elsewhere()).status_code == 429


@pytest.mark.parametrize(
    "content_type",
    ["application/x-www-form-urlencoded", "application/x-www-form-urlencoded; charset=utf-8"],
)
def test_a_json_body_sent_as_a_form_is_read(rules: Tier, victim: Any, content_type: str) -> None:
    """A JSON login view reads ``request.body`` whatever the ``Content-Type``; sent under a
    form's, the body has no form fields but a JSON username, and it is counted (before: no
    username, so guesses spread over addresses were never limited)."""
    for _ in range(3):
        assert (
            json_post("/json-login/", {"username": "bf1", "password": "wrong"}, content_type) == 401
        )
    assert json_post("/json-login/", {"username": "bf1", "password": "right"}, content_type) == 429


def test_an_authentication_class_refusing_by_raising_counts_it_as_a_failure(
    rules: Tier, victim: Any
) -> None:
    """A protected authentication class whose check raises Django's ``PermissionDenied``
    (DRF's 403) failed (before: settled as a 500, its tokens given back)."""
    wrong = [
        Client().get(
            "/strict-basic/", HTTP_AUTHORIZATION=basic("bf1:wrong"), REMOTE_ADDR=elsewhere()
        )
        for _ in "123"
    ]
    assert [r.status_code for r in wrong] == [403] * 3
    right = Client().get("/strict-basic/", HTTP_AUTHORIZATION=basic("bf1:right"))
    assert right.status_code == 429


def lock_json(url: str = "/json-login/") -> None:
    """``lock`` for a JSON login view (a form body would leave it no ``request.body``)."""
    for _ in range(3):
        assert json_post(url, {"username": "bf1", "password": "wrong"}) == 401
    assert json_post(url, {"username": "bf1", "password": "right"}) == 429


def raw_post(url: str, body: bytes, content_type: str, method: str = "POST") -> int:
    """``body`` sent as it is (the test client re-encodes a body to a charset it names)."""
    response = Client().generic(
        method, url, body, content_type=content_type, REMOTE_ADDR=elsewhere()
    )
    return int(response.status_code)


def test_a_form_field_never_hides_the_json_username(rules: Tier, victim: Any) -> None:
    """A body that is JSON and, under a form's ``Content-Type``, a form too: the JSON login
    view reads the JSON's ``bf1`` (before: only the form's field, a fresh name each time,
    was counted, so guesses at ``bf1`` were never limited)."""
    lock_json()
    body = json.dumps({"username": "bf1", "password": "right", "x": "&username=fresh1&"})
    assert raw_post("/json-login/", body.encode(), "application/x-www-form-urlencoded") == 429


@pytest.mark.parametrize("content_type", ["*/*", "application/*", "text/plain"])
def test_a_json_field_never_hides_the_form_username(
    rules: Tier, victim: Any, content_type: str
) -> None:
    """Under ``*/*`` DRF's token view parses with its first parser, the form parser: a JSON
    body hiding a form gives it the form's ``bf1`` (before: only the JSON's field, a fresh
    name each time, was counted, and a locked account's token was handed out)."""
    lock("/token/")
    body = json.dumps({"username": "fresh2", "x": "&username=bf1&password=right&"})
    assert raw_post("/token/", body.encode(), content_type) == 429


@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE", "GET", "OPTIONS"])
def test_credentials_sent_with_any_method_are_checked(
    rules: Tier, victim: Any, method: str
) -> None:
    """A JSON login view reads ``request.body`` whatever the method (before: only a POST was
    checked, so a PUT, or a GET with a body, guessed without limit)."""
    lock_json()
    body = json.dumps({"username": "bf1", "password": "right"}).encode()
    assert raw_post("/json-login/", body, "application/json", method) == 429


def test_the_login_form_shown_by_get_is_not_checked(rules: Tier, victim: Any) -> None:
    """A GET without a body presents no credentials: the form is shown even to a client
    whose counters are spent."""
    lock("/login/")
    assert Client().get("/login/").status_code == 200


@pytest.mark.parametrize("method", ["get", "head", "options"])
def test_basic_credentials_sent_with_a_safe_method_are_checked(
    rules: Tier, victim: Any, method: str
) -> None:
    """DRF authenticates a GET, a HEAD or an OPTIONS of the token view before it answers 405
    or its metadata: the password is checked (403 when wrong, 405 or 200 when right). Such
    a request is counted as a POST is (before: never, so any number of guesses, and the
    right password told apart while the account was locked)."""
    send = getattr(Client(), method)
    statuses = [
        send("/token/", HTTP_AUTHORIZATION=basic("bf1:wrong"), REMOTE_ADDR=elsewhere()).status_code
        for _ in range(4)
    ]
    assert statuses == [403, 403, 403, 429]
    right = send("/token/", HTTP_AUTHORIZATION=basic("bf1:right"), REMOTE_ADDR=elsewhere())
    assert right.status_code == 429


@pytest.mark.parametrize("method", ["get", "post"])
@pytest.mark.parametrize("url", ["/query-login/", "/async-query-login/"])
def test_credentials_in_the_query_string_are_checked(
    rules: Tier, victim: Any, url: str, method: str
) -> None:
    """A view taking the credentials from ``request.GET``: a GET naming them is checked and
    counted under the name it presents, a POST too (before: a GET was never checked, and a
    POST's username never read, so no limit by username held; nor was a warning logged)."""
    send = getattr(Client(), method)
    statuses = [
        send(f"{url}?username=BF1&password=wrong", REMOTE_ADDR=elsewhere()).status_code
        for _ in range(4)
    ]
    assert statuses == [401, 401, 401, 429]
    right = send(f"{url}?username=bf1&password=right", REMOTE_ADDR=elsewhere())
    assert right.status_code == 429


def test_a_query_string_naming_no_credentials_is_not_checked(rules: Tier, victim: Any) -> None:
    """``?next=…`` on the GET that shows the login form presents nothing: shown even to a
    client whose counters are spent."""
    lock("/login/")
    assert Client().get("/login/?next=/admin/").status_code == 200


@pytest.mark.parametrize("codec", ["utf-8-sig", "utf-16", "utf-16-be", "utf-32"])
def test_json_the_view_decodes_from_its_bytes_is_read(rules: Tier, victim: Any, codec: str) -> None:
    """``json.loads(request.body)`` tells UTF-16, UTF-32 and a BOM from the bytes (before:
    such a body was decoded as UTF-8 only, unreadable, and counted in the shared counter
    instead of the account's)."""
    lock_json()
    body = json.dumps({"username": "bf1", "password": "right"}).encode(codec)
    assert raw_post("/json-login/", body, "application/json") == 429


def test_a_charset_that_reads_another_username_is_no_fresh_counter(
    rules: Tier, victim: Any
) -> None:
    """Declared UTF-7, the body reads as ``fresh3`` (a duplicate key hidden in a base64
    run); ``json.loads(request.body)`` reads it as UTF-8: ``bf1`` (before: only the declared
    charset was read, a fresh counter for every guess)."""
    lock_json()
    hidden = base64.b64encode('","username":"fresh3'.encode("utf-16-be")).rstrip(b"=")
    body = b'{"username":"bf1","password":"right","a":"+' + hidden + b'-"}'
    assert json.loads(body)["username"] == "bf1"
    assert json.loads(body.decode("utf-7"))["username"] == "fresh3"
    assert raw_post("/json-login/", body, "application/json; charset=utf-7") == 429


def test_a_json_true_is_read_as_the_name_django_looks_up(
    rules: Tier, django_user_model: Any
) -> None:
    """``authenticate(username=True)`` finds the account ``True`` (the model field takes
    it as its text): counted under it (before: no username, never limited)."""
    django_user_model.objects.create_user("True", password="right")
    for _ in range(3):
        assert json_post("/json-login/", {"username": True, "password": "wrong"}) == 401
    assert json_post("/json-login/", {"username": "True", "password": "right"}) == 429


def test_a_form_too_big_to_read_never_hides_the_json_username(rules: Tier, victim: Any) -> None:
    """Over ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` as a form, ``request.POST`` fails, yet the
    JSON login view reads the body (before: counted as unreadable in the shared counter,
    never the account's)."""
    lock_json()
    body = json.dumps({"username": "bf1", "password": "right", "x": "&a" * 1200})
    assert raw_post("/json-login/", body.encode(), "application/x-www-form-urlencoded") == 429


def test_an_unreadable_header_never_hides_the_forms_username(rules: Tier, victim: Any) -> None:
    """A Basic header that does not decode, which the login form ignores, beside the form's
    ``bf1`` (before: the whole request was unreadable, counted in the shared counter only)."""
    lock("/login/")
    right = {"username": "bf1", "password": "right"}
    response = Client().post(
        "/login/", right, HTTP_AUTHORIZATION="Basic !!!", REMOTE_ADDR=elsewhere()
    )
    assert response.status_code == 429


def test_an_unreadable_body_never_hides_the_headers_username(rules: Tier, victim: Any) -> None:
    """DRF's token view checks a Basic header (its authentication runs before the body is
    parsed: 400 for a right password, 401 for a wrong one) beside a body that does not
    parse (before: counted in the shared counter only, never ``bf1``'s)."""
    lock("/token/")
    response = Client().post(
        "/token/",
        "<xml/>",
        content_type="application/xml",
        HTTP_AUTHORIZATION=basic("bf1:right"),
        REMOTE_ADDR=elsewhere(),
    )
    assert response.status_code == 429


@pytest.mark.parametrize("method", ["PUT", "GET"])
def test_an_async_view_checks_credentials_sent_with_any_method(
    rules: Tier, victim: Any, method: str
) -> None:
    """The async guard checks a PUT, and a GET with a body, as the sync one does (before:
    only a POST)."""
    lock_json("/async-json-login/")
    body = json.dumps({"username": "bf1", "password": "right"}).encode()

    async def attempt() -> Any:
        client = AsyncClient()
        return await client.generic(method, "/async-json-login/", body, "application/json")

    assert async_to_sync(attempt)().status_code == 429


def test_json_nested_too_deep_to_parse_is_unreadable_not_an_error() -> None:
    """JSON nested deeper than Python's parser goes is no JSON to the limiter: one shared
    counter (before: ``RecursionError`` escaped the check, which promises never to raise)."""
    from django.test import RequestFactory

    body = b'{"username":"bf1","pad":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    request = RequestFactory().post("/json-login/", body, content_type="application/json")
    assert usernames.username_counters(request) == (usernames.UNREADABLE_COUNTER,)
