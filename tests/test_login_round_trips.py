"""One Redis round trip per login check, however many counters apply: a login counted by IP
address and by username is one script call on a single server (before: one call per counter,
so a login counted by both made two before the password was checked), and a successful one
gives its tokens back in one more."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.contrib.auth import aauthenticate, authenticate
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path

from django_throttle.credentials import protect_credentials
from django_throttle.models import EndpointLimit, EndpointRule, Tier
from tests.clients import AddressedAsyncClient

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.test_login_round_trips")]


@protect_credentials
def sign_in(request: HttpRequest) -> HttpResponse:
    user = authenticate(
        request, username=request.POST.get("username"), password=request.POST.get("password")
    )
    return HttpResponse("in" if user is not None else "wrong", status=200 if user else 401)


@protect_credentials
async def async_sign_in(request: HttpRequest) -> HttpResponse:
    user = await aauthenticate(
        request, username=request.POST.get("username"), password=request.POST.get("password")
    )
    return HttpResponse("in" if user is not None else "wrong", status=200 if user else 401)


urlpatterns = [path("login/", sign_in), path("async-login/", async_sign_in)]

#: The commands a login makes that reach the counters (every other command the server saw,
#: the policy version's GET, is no request's).
SCRIPT_COMMANDS = ("evalsha", "eval")


def scripts_run(admin: redis.Redis) -> int:
    stats = admin.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in SCRIPT_COMMANDS)


def login(url: str, password: str, address: str) -> int:
    form = {"username": "bf1", "password": password}
    if url.startswith("/async"):
        response = async_to_sync(AddressedAsyncClient(address).post)(url, form)
    else:
        response = Client().post(url, form, REMOTE_ADDR=address)
    return int(response.status_code)


@pytest.mark.parametrize("url", ["/login/", "/async-login/"])
@pytest.mark.parametrize(
    ("counted_by", "failed", "successful"),
    [
        # Failed: the check's one call, the tokens kept. Successful: the check's call and
        # one refund of every counter's tokens.
        (("ip",), 1, 2),
        (("username",), 1, 2),
        (("ip", "username"), 1, 2),
    ],
)
def test_a_login_is_one_script_call(
    redis_client: redis.Redis,
    django_user_model: Any,
    settings: Any,
    url: str,
    counted_by: tuple[str, ...],
    failed: int,
    successful: int,
) -> None:
    settings.DJANGO_THROTTLE_USAGE_RETENTION_DAYS = 0  # no usage pushes: the login's calls only
    django_user_model.objects.create_user("bf1", password="right")
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    rule = EndpointRule.objects.create(name="login", pattern="login", counts="failures")
    for n, kind in enumerate(counted_by):
        EndpointLimit.objects.create(
            rule=rule, tier=anonymous, rate=f"{100 + n}/h", counted_by=kind
        )
    # Warm: the policy read, the scripts loaded (a script's first call is EVALSHA, then EVAL).
    assert login(url, "wrong", "192.0.2.1") == 401
    assert login(url, "right", "192.0.2.1") == 200
    before = scripts_run(redis_client)
    assert login(url, "wrong", "192.0.2.2") == 401
    after_failure = scripts_run(redis_client)
    assert login(url, "right", "192.0.2.3") == 200
    after_success = scripts_run(redis_client)
    assert (after_failure - before, after_success - after_failure) == (failed, successful)
