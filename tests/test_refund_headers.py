"""The rate limit headers of a request whose tokens are given back count them as given back.

A rule that counts only failures (or only successes) takes a request's tokens when it is
checked and gives them back once its response shows an outcome the rule does not count. The
headers were worked out when the request was checked, so a successful login under a rule
counting failures said ``X-RateLimit-Remaining: 3`` where the client had 4 left: every figure
shown must be what happened. The refund's own call now also looks at the decision's limits
(the tier's too) once the tokens are back, and the headers are written after it: no round
trip more.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.backends.base import Backend
from django_throttle.backends.redis import RedisBackend
from django_throttle.decorators import throttle
from django_throttle.models import EndpointLimit, EndpointRule, Tier
from django_throttle.policy import live as policy

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.test_refund_headers")]


def _status(request: HttpRequest) -> int:
    """401 for a wrong password, 200 for the right one."""
    return 200 if request.POST.get("password") == "right" else 401


@throttle(scope="login")
def login(request: HttpRequest) -> HttpResponse:
    return HttpResponse("", status=_status(request))


@throttle(scope="login")
async def async_login(request: HttpRequest) -> HttpResponse:
    return HttpResponse("", status=_status(request))


class Login(APIView):
    """Under ``PolicyThrottle``: settled, and its headers written, by the middleware."""

    permission_classes = [AllowAny]
    throttle_scope = "login"

    def post(self, request: Request) -> Response:
        return Response({}, status=_status(request._request))


urlpatterns = [
    path("login/", login),
    path("async-login/", async_login),
    path("api/login/", Login.as_view()),
]

#: (url, whether it is sent over ASGI): @throttle sync and async, and the DRF throttle
#: settled by the headers middleware in its sync and its async path.
PATHS = [("/login/", False), ("/async-login/", True), ("/api/login/", False), ("/api/login/", True)]


def attempts(url: str, asgi: bool, *passwords: str) -> list[dict[str, str]]:
    """Each attempt's rate limit headers."""
    seen = []
    for password in passwords:
        form = {"username": "ann", "password": password}
        if asgi:
            response = async_to_sync(AsyncClient().post)(url, form)
        else:
            response = Client().post(url, form)
        assert response.status_code == (200 if password == "right" else 401)
        seen.append({k: v for k, v in response.headers.items() if "ratelimit" in k.lower()})
    return seen


def remaining(seen: list[dict[str, str]]) -> list[int]:
    return [int(headers["X-RateLimit-Remaining"]) for headers in seen]


def login_rule(tier_rate: str, counted_by: str = "client") -> None:
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    anonymous.limits.create(rate=tier_rate)
    rule = EndpointRule.objects.create(name="login", pattern="login", counts="failures")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="5/h", counted_by=counted_by)
    policy.current()


@pytest.mark.parametrize(("url", "asgi"), PATHS)
@pytest.mark.parametrize("counted_by", ["client", "username"])
def test_a_successful_login_shows_its_token_given_back(
    backend: Backend, settings: Any, url: str, asgi: bool, counted_by: str
) -> None:
    """5 failures an hour: a failed login leaves 4, a successful one gives its token back
    and says so (4, not 3), in the IETF fields too. Counted by username, the tier's limits
    (counted by client, not given back) are looked at in the same refund call."""
    settings.DJANGO_THROTTLE_IETF_HEADERS = True
    login_rule("1000/min", counted_by)
    seen = attempts(url, asgi, "wrong", "right", "wrong", "right")
    assert remaining(seen) == [4, 4, 3, 3]
    assert {headers["X-RateLimit-Limit"] for headers in seen} == {"5"}
    for headers, left in zip(seen, [4, 4, 3, 3], strict=True):
        assert headers["RateLimit"].endswith(f";r={left};t={headers['X-RateLimit-Reset']}")


@pytest.mark.parametrize(("url", "asgi"), PATHS)
def test_the_tier_limit_is_reported_once_it_has_fewer_left(
    backend: Backend, url: str, asgi: bool
) -> None:
    """The tier's limit (7 an hour, every request counted) overtakes the rule's (5
    failures) as successes keep coming: once the rule's token is back the tier's has fewer
    left, and the headers report it, never the rule's higher count."""
    login_rule("7/h")
    seen = attempts(url, asgi, "wrong", "wrong", "right", "right", "right")
    assert remaining(seen) == [4, 3, 3, 3, 2]
    assert seen[-1]["X-RateLimit-Limit"] == "7"


@pytest.mark.parametrize(("url", "asgi"), [PATHS[0], PATHS[3]])
def test_counters_given_back_one_call_each_keep_the_decided_figure(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, url: str, asgi: bool
) -> None:
    """Where the counters are refunded one call each (a Redis Cluster whose slots differ),
    the tier's limits share no call with a refund when the rule counts by username: looking
    at them would take one round trip more, so the headers keep the figure decided with the
    request (fewer than there are, never more)."""
    for name in ("refund_together", "arefund_together"):
        monkeypatch.setattr(RedisBackend, name, getattr(Backend, name))
    login_rule("1000/min", "username")
    assert remaining(attempts(url, asgi, "wrong", "right")) == [4, 3]
