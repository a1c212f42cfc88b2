"""Every name, label and identity the admin accepts, at its longest, in every script
(issue 30 item 3): a wrong login answers as a wrong login, never 503.

The usage field (tier slug and rule name) was cut to 200 bytes, then the request path put
its "count only if denied" mark in front of it, and the counting script refused the 201-byte
argument: a credential rule failed closed (503 to every login), any other rule degraded to
``local``. Realistic names reach it: a Russian rule name of 98 characters is 196 bytes.

Here the longest tier slug, tier and rule names (ASCII, Cyrillic, CJK, emoji) and the
longest username Django allows meet every script of a login: the counting call of each
counter (``driver.lua``), the refund of a successful login under a rule counting failures
(``refund.lua``), the look at the other counters after a denial (a peek), and the
dashboard's reading of the usage counts (``usage_read.lua``); sync and async, on Redis and
in memory.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import AsyncClient, Client
from rest_framework.authtoken.models import Token

from django_throttle.models import EndpointLimit, EndpointRule, Tier
from django_throttle.usage import accounting

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.seams_urls")]

DASHBOARD = "/admin/django_throttle/usagecount/dashboard/"

#: The issue's realistic rule name (98 characters, 180 bytes in UTF-8).
RUSSIAN = (
    "Авторизация в личном кабинете клиента: ограничение попыток входа по имени "
    "пользователя и IP-адресу"
)
#: One character of each script, repeated to a field's maximum length.
LETTERS = {"ascii": "a", "cyrillic": "Ж", "cjk": "漢", "emoji": "🦊"}


def longest(letter: str, length: int) -> str:
    return (letter * length)[:length]


@pytest.fixture(params=["redis", "memory"])
def backend_name(request: pytest.FixtureRequest, settings: Any) -> str:
    if request.param == "memory":
        settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    return str(request.param)


def policy(rule_name: str, tier_name: str, offset: int) -> Tier:
    """An anonymous tier with the longest slug, and the rules of the two login views in
    tests/seams_urls.py (scopes "login" and "seam-login") named ``rule_name`` after
    ``offset`` ASCII letters (so that a cut at any byte lands inside or after a
    character), counting failures by IP address (10/min) and by username (3/h)."""
    slug_length = Tier._meta.get_field("slug").max_length
    anonymous = Tier.objects.create(
        slug=longest("s", slug_length), name=tier_name, is_default_anonymous=True
    )
    name_length = EndpointRule._meta.get_field("name").max_length
    for pad, scope in (("x", "login"), ("y", "seam-login")):
        name = (pad + "_" * offset + rule_name)[:name_length]
        rule = EndpointRule.objects.create(name=name, pattern=scope, counts="failures")
        for rate, counted_by in (("10/min", "ip"), ("3/h", "username")):
            EndpointLimit.objects.create(
                rule=rule, tier=anonymous, rate=rate, counted_by=counted_by
            )
    return anonymous


def names(script: str) -> list[str]:
    rule_length = EndpointRule._meta.get_field("name").max_length
    names = [longest(LETTERS[script], rule_length)]
    if script == "cyrillic":
        names.append(RUSSIAN)
    return names


@pytest.mark.parametrize("script", LETTERS)
@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_a_wrong_login_under_the_longest_names_is_a_wrong_login(
    backend_name: str, script: str, kind: str, admin_client: Client
) -> None:
    cases = [(name, offset) for name in names(script) for offset in range(4)]
    for n, (rule_name, offset) in enumerate(cases):
        Tier.objects.all().delete()
        EndpointRule.objects.all().delete()
        tier_name = longest(LETTERS[script], Tier._meta.get_field("name").max_length)
        policy(rule_name, tier_name, offset)
        field = accounting.field_for("", "x" + "_" * offset + rule_name, before_authentication=True)
        assert field is not None and len(field.encode()) <= accounting.MAX_FIELD_BYTES
        username_length = get_user_model()._meta.get_field("username").max_length
        username = longest(LETTERS[script], username_length - 3) + f"{n:03}"
        user = get_user_model().objects.create_user(username, password="right")
        Token.objects.get_or_create(user=user)
        statuses = logins(kind, username)
        # Right passwords are given back (refund.lua), then three wrong ones are counted
        # under the username (3/h) and the fourth is refused after a look at the others.
        assert statuses == [200] * 5 + [400] * 3 + [429], (script, rule_name)
        basic = basic_attempts(kind, "Z" + username)
        assert basic == [401] * 3 + [429], (script, rule_name)
        assert admin_client.get(DASHBOARD).status_code == 200  # usage_read.lua
        user.delete()


def logins(kind: str, username: str) -> list[int]:
    """Five right and four wrong attempts at DRF's ``obtain_auth_token`` behind
    ``protect_credentials`` (rule "login"), through the whole middleware stack."""
    attempts = [("right", 5), ("wrong", 4)]
    sequence = [password for password, times in attempts for _ in range(times)]
    client: Client | AsyncClient = Client() if kind == "wsgi" else AsyncClient()

    def post(password: str) -> Any:
        body = {"username": username, "password": password}
        return client.post("/api/login-token/", body, content_type="application/json")

    if kind == "wsgi":
        return [post(password).status_code for password in sequence]

    from asgiref.sync import async_to_sync

    async def run() -> list[int]:
        return [(await post(password)).status_code for password in sequence]

    return async_to_sync(run)()


def basic_attempts(kind: str, username: str) -> list[int]:
    """Four wrong Basic attempts at a DRF view (rule "seam-login": scope of its protected
    authentication class): the username counter refuses the fourth."""
    token = base64.b64encode(f"{username}:wrong".encode()).decode()
    headers = {"Authorization": f"Basic {token}"}
    client: Client | AsyncClient = Client() if kind == "wsgi" else AsyncClient()
    if kind == "wsgi":
        return [client.get("/seams/basic/", headers=headers).status_code for _ in range(4)]

    from asgiref.sync import async_to_sync

    async def run() -> list[int]:
        return [(await client.get("/seams/basic/", headers=headers)).status_code for _ in range(4)]

    return async_to_sync(run)()
