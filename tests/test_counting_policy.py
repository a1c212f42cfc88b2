"""Counting policy: a rule that counts only successes or only failures reserves at entry and
gives the reservation back after the response; limits counted by IP address."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.checks import check_settling_middleware
from django_throttle.decorators import throttle
from django_throttle.models import EndpointLimit, EndpointRule, Tier
from django_throttle.policy import live as policy

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.test_counting_policy")]


def _status(request: HttpRequest) -> int:
    return int(request.GET.get("status", "200"))


@throttle(scope="search")
def search(request: HttpRequest) -> HttpResponse:
    if request.GET.get("raise"):
        raise RuntimeError("boom")
    return HttpResponse("results", status=_status(request))


@throttle(scope="search")
async def search_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("results", status=_status(request))


class Search(APIView):
    permission_classes = [AllowAny]
    throttle_scope = "search"

    def get(self, request: Request) -> Response:
        return Response({}, status=_status(request._request))


urlpatterns = [
    path("search/", search),
    path("search-async/", search_async),
    path("api/search/", Search.as_view()),
]


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest, settings: Any) -> str:
    if request.param == "memory":
        settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    return str(request.param)


@pytest.fixture
def anonymous() -> Tier:
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    anonymous.limits.create(rate="1000/min")
    return anonymous


def rule(tier: Tier, counts: str, rate: str = "2/min", counted_by: str = "client") -> EndpointRule:
    row = EndpointRule.objects.create(name="search", pattern="search", counts=counts)
    EndpointLimit.objects.create(rule=row, tier=tier, rate=rate, counted_by=counted_by)
    return row


def statuses(client: Client, url: str, *codes: int) -> list[int]:
    return [client.get(url, {"status": code}).status_code for code in codes]


@pytest.mark.parametrize("url", ["/search/", "/api/search/"])
def test_counting_successes_gives_4xx_back(backend: str, anonymous: Tier, url: str) -> None:
    rule(anonymous, "success")
    client = Client()
    assert statuses(client, url, *[404] * 10) == [404] * 10
    assert statuses(client, url, 200, 200, 200) == [200, 200, 429]


@pytest.mark.parametrize("url", ["/search/", "/api/search/"])
def test_counting_failures_gives_successes_back(backend: str, anonymous: Tier, url: str) -> None:
    rule(anonymous, "failures")
    client = Client()
    assert statuses(client, url, *[200] * 10) == [200] * 10
    assert statuses(client, url, 403, 400, 403) == [403, 400, 429]


def test_server_errors_count_neither_as_success_nor_failure(backend: str, anonymous: Tier) -> None:
    rule(anonymous, "failures")
    client = Client()
    assert statuses(client, "/search/", 500, 503, 500) == [500, 503, 500]
    assert statuses(client, "/search/", 400, 400, 400) == [400, 400, 429]


def test_counting_all_keeps_every_request(backend: str, anonymous: Tier) -> None:
    rule(anonymous, "all")
    assert statuses(Client(), "/search/", 404, 200, 200) == [404, 200, 429]


def test_a_view_that_raises_is_settled_as_a_server_error(backend: str, anonymous: Tier) -> None:
    rule(anonymous, "success")
    client = Client(raise_request_exception=False)
    for _ in range(4):
        assert client.get("/search/", {"raise": 1}).status_code == 500
    assert statuses(client, "/search/", 200, 200, 200) == [200, 200, 429]


def test_counting_policy_on_an_async_view(
    backend: str, anonymous: Tier, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settled on the event loop: the sync refund is never called."""
    from asgiref.sync import async_to_sync

    from django_throttle.backends.redis import RedisBackend

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the async path called the sync refund")

    monkeypatch.setattr(RedisBackend, "refund", refuse)
    rule(anonymous, "success")
    policy.current()

    async def run() -> list[int]:
        client = AsyncClient()
        return [
            (await client.get("/search-async/", {"status": code})).status_code
            for code in (404, 404, 404, 200, 200, 200)
        ]

    assert async_to_sync(run)() == [404, 404, 404, 200, 200, 429]


def test_the_tier_limits_count_every_request(backend: str, anonymous: Tier) -> None:
    """The rule's counting policy is the rule's: the tier's own limits count everything."""
    anonymous.limits.update(rate="3/min")
    policy.invalidate()
    rule(anonymous, "success", rate="100/min")
    assert statuses(Client(), "/search/", 404, 404, 404, 404) == [404, 404, 404, 429]


def test_headers_report_the_reservation(backend: str, anonymous: Tier) -> None:
    rule(anonymous, "success", rate="5/min")
    client = Client()
    # Given back before the headers are written: they show the bucket full again.
    assert client.get("/api/search/", {"status": 404})["X-RateLimit-Remaining"] == "5"
    assert client.get("/api/search/", {"status": 404})["X-RateLimit-Remaining"] == "5"
    assert client.get("/api/search/", {"status": 200})["X-RateLimit-Remaining"] == "4"


def test_without_the_middleware_drf_views_count_every_request(
    backend: str, anonymous: Tier, settings: Any
) -> None:
    settings.MIDDLEWARE = [
        m for m in settings.MIDDLEWARE if not m.endswith("RateLimitHeadersMiddleware")
    ]
    rule(anonymous, "success")
    assert statuses(Client(), "/api/search/", 404, 404, 404) == [404, 404, 429]


def test_a_limit_counted_by_ip_is_shared_by_the_users_behind_it(
    backend: str, anonymous: Tier, django_user_model: Any
) -> None:
    users = Tier.objects.create(slug="users", name="Users", is_default_authenticated=True)
    users.limits.create(rate="1000/min")
    rule(users, "all", rate="3/min", counted_by="ip")
    seen = []
    for name in ("ann", "ben"):
        client = Client()
        client.force_login(django_user_model.objects.create_user(name))
        seen += [client.get("/search/").status_code for _ in range(2)]
    assert seen == [200, 200, 200, 429]
    other = Client(REMOTE_ADDR="192.0.2.10")
    other.force_login(django_user_model.objects.get(username="ann"))
    assert other.get("/search/").status_code == 200


def test_compiled_rules_keep_requests_free_of_sql(
    backend: str, anonymous: Tier, django_assert_num_queries: Any
) -> None:
    rule(anonymous, "failures", counted_by="ip")
    row = EndpointRule.objects.get()
    EndpointLimit.objects.create(rule=row, tier=anonymous, rate="10/h", counted_by="username")
    client = Client()
    client.get("/search/", {"status": 200})  # compiles the snapshot
    with django_assert_num_queries(0):
        for _ in range(3):
            client.get("/search/", {"status": 200, "username": "x"})


def test_bad_counting_values_are_named_by_field(anonymous: Tier) -> None:
    row = rule(anonymous, "all")
    EndpointRule.objects.filter(pk=row.pk).update(counts="sometimes")
    EndpointLimit.objects.filter(rule=row).update(counted_by="moon")
    assert "counts" in EndpointRule.objects.get().row_problems()
    assert "counted_by" in EndpointLimit.objects.get().row_problems()
    # Skipped by the compiler rather than guessed at.
    snapshot = policy.compile_policy()
    assert snapshot.by_scope == {}


def test_warning_when_a_rule_counts_some_outcomes_without_the_middleware(
    anonymous: Tier, settings: Any
) -> None:
    rule(anonymous, "failures")
    assert check_settling_middleware() == []
    settings.MIDDLEWARE = [
        m for m in settings.MIDDLEWARE if not m.endswith("RateLimitHeadersMiddleware")
    ]
    (warning,) = check_settling_middleware()
    assert warning.id == "django_throttle.W003"
    assert warning.level == checks.WARNING
    assert "search" in warning.msg
