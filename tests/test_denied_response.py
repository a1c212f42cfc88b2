"""A project-wide callable for the 429 (and fail-closed 503): used by plain views, by DRF views
through ``django_throttle.drf.exception_handler``, never able to turn a refusal into a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from tests.factories import tier

pytestmark = pytest.mark.django_db

PLAIN = "tests.denied_responses.plain_text"


def exhaust(client: Any, url: str, n: int) -> Any:
    for _ in range(n):
        response = client.get(url)
    return response


def test_plain_views_use_the_callable_and_keep_the_headers(client: Any, settings: Any) -> None:
    settings.DJANGO_THROTTLE_DENIED_RESPONSE = PLAIN

    response = exhaust(client, "/hello/", 6)  # @throttle(rate="5/min")

    assert response.status_code == 429
    assert response.content.decode() == "slow down (5/min) on /hello/"
    assert response["Retry-After"] == "12"
    assert response["X-RateLimit-Remaining"] == "0"


def test_drf_views_use_it_through_the_exception_handler(client: Any, settings: Any) -> None:
    settings.DJANGO_THROTTLE_DENIED_RESPONSE = PLAIN
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "EXCEPTION_HANDLER": "django_throttle.drf.exception_handler",
    }
    tier("anonymous", "1/h", is_default_anonymous=True)

    response = exhaust(client, "/api/ping/", 2)

    assert response.status_code == 429
    assert response.content.decode() == "slow down (anonymous 1/h) on /api/ping/"
    assert int(response["Retry-After"]) > 3000
    assert client.get("/api/nowhere/").status_code == 404  # other errors: DRF's handler


def test_without_the_setting_drf_keeps_its_json(client: Any, settings: Any) -> None:
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "EXCEPTION_HANDLER": "django_throttle.drf.exception_handler",
    }
    tier("anonymous", "1/h", is_default_anonymous=True)
    response = exhaust(client, "/api/ping/", 2)
    assert response.status_code == 429
    assert response.json()["limit"] == "anonymous 1/h"


def test_fail_closed_503_uses_it_too(client: Any, settings: Any) -> None:
    settings.DJANGO_THROTTLE_DENIED_RESPONSE = PLAIN
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    settings.DJANGO_THROTTLE_FAILURE_MODE = "closed"

    response = client.get("/hello/")

    assert response.status_code == 503
    assert response.content.decode().startswith("slow down (none)")


@pytest.mark.parametrize(
    "factory", ["tests.denied_responses.broken", "tests.denied_responses.not_a_response"]
)
def test_a_broken_callable_falls_back_to_the_default(
    client: Any, settings: Any, factory: str, caplog: Any
) -> None:
    settings.DJANGO_THROTTLE_DENIED_RESPONSE = factory

    response = exhaust(client, "/hello/", 6)

    assert response.status_code == 429
    assert response.json()["limit"] == "5/min"
    assert "DJANGO_THROTTLE_DENIED_RESPONSE" in caplog.text


def test_a_path_that_does_not_import_is_a_system_check_error(settings: Any) -> None:
    settings.DJANGO_THROTTLE_DENIED_RESPONSE = "myproject.nowhere.respond"
    with pytest.raises(SystemCheckError, match=r"django_throttle\.E036"):
        call_command("check")


def test_plain_and_drf_views_send_the_same_429_body(client: Any) -> None:
    """One format for every 429: the bytes DRF's JSON renderer writes (compact, UTF-8)."""
    tier("anonymous", "1/h", is_default_anonymous=True)
    drf = exhaust(client, "/api/ping/", 2)
    plain = exhaust(client, "/hello/", 6)  # @throttle(rate="5/min")

    assert drf.status_code == plain.status_code == 429
    assert drf.content.startswith(b'{"detail":"Request was throttled.')
    assert plain.content == (
        b'{"detail":"Request was throttled. Expected available in 12 seconds.",'
        b'"limit":"5/min","retry_after":12}'
    )
