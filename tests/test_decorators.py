"""``@throttle`` on plain Django views: sync, async and class-based."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client

from django_throttle.decorators import throttle
from django_throttle.rates import InvalidRate
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db


def test_inline_rate_on_a_sync_view(client: Client) -> None:
    codes = [client.get("/hello/").status_code for _ in range(6)]
    assert codes == [200] * 5 + [429]
    response = client.get("/hello/")
    assert response["Content-Type"] == "application/json"
    # The public name is the rate, not the view's module path.
    assert response.json()["limit"] == "5/m"
    assert int(response["Retry-After"]) >= 1
    assert response["X-RateLimit-Limit"] == "5"


def test_headers_on_allowed_responses(client: Client) -> None:
    response = client.get("/hello/")
    assert response["X-RateLimit-Limit"] == "5"
    assert response["X-RateLimit-Remaining"] == "4"
    assert response["X-RateLimit-Reset"] == "12"


def test_inline_rate_on_an_async_view(async_client: AsyncClient) -> None:
    async def three_requests() -> list[int]:
        return [(await async_client.get("/hello-async/")).status_code for _ in range(3)]

    assert async_to_sync(three_requests)() == [200, 200, 429]


def test_class_based_view_through_method_decorator(client: Client) -> None:
    assert [client.get("/cbv/").status_code for _ in range(2)] == [200, 429]


def test_scope_applies_admin_rules(client: Client) -> None:
    anon = tier("anonymous", "100/m", is_default_anonymous=True)
    endpoint("login", "scope", "login", limits={anon: "2/m"})
    assert [client.get("/login/").status_code for _ in range(3)] == [200, 200, 429]


def test_bad_rate_fails_at_decoration_time() -> None:
    with pytest.raises(InvalidRate, match="month"):
        throttle(rate="100/month")


def test_decorator_needs_a_scope_or_a_rate() -> None:
    with pytest.raises(TypeError):
        throttle()


def test_unscoped_class_based_views_each_get_their_own_bucket(client: Client) -> None:
    # Both classes inherit View.dispatch: under method_decorator they used to share one bucket.
    assert client.get("/cbv-a/").status_code == 200
    assert client.get("/cbv-b/").status_code == 200
    assert client.get("/cbv-a/").status_code == 429
    denied = client.get("/cbv-b/")
    assert denied.status_code == 429
    assert denied.json()["limit"] == "1/m"
    assert "django.views" not in denied.content.decode()


def test_one_class_based_view_keeps_one_bucket_across_requests(client: Client) -> None:
    # method_decorator decorates on every request; the bucket must not change with it.
    assert [client.get("/cbv-a/").status_code for _ in range(3)] == [200, 429, 429]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": "5/m", "cost": 0}, "cost must be between 1"),
        ({"rate": "5/m", "cost": 6}, "could never pass"),
        ({"rate": "5/m", "burst": 0}, "burst must be between 1"),
        ({"rate": "5/m", "failure_mode": "sideways"}, "failure_mode"),
    ],
)
def test_bad_arguments_fail_at_decoration_time(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        throttle(**kwargs)  # type: ignore[arg-type]
