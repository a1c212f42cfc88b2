"""The request path as clients see it: failure modes, unidentifiable clients, shadow limits and
honest ``Retry-After``, through real DRF and plain Django views on the suite's Redis."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.test import Client

from django_throttle.backends.memory import MemoryBackend
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db

DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1: connection refused at once


def redis_down(settings: Any, mode: str | None = None, **more: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = DEAD_REDIS
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}
    if mode is not None:
        settings.DJANGO_THROTTLE_FAILURE_MODE = mode
    for name, value in more.items():
        setattr(settings, f"DJANGO_THROTTLE_{name}", value)


# --- failure modes -------------------------------------------------------------------------


def test_fail_open_serves_and_says_the_limiter_was_bypassed(client: Client, settings: Any) -> None:
    tier("anonymous", "1/h", is_default_anonymous=True)
    redis_down(settings)

    responses = [client.get("/api/ping/") for _ in range(3)]

    assert [r.status_code for r in responses] == [200, 200, 200]
    assert all(r["X-RateLimit-Degraded"] == "open" for r in responses)
    assert all("X-RateLimit-Limit" not in r for r in responses)


@pytest.mark.parametrize("path", ["/api/ping/", "/hello/"])
def test_fail_closed_is_503_with_retry_after_not_an_invented_429(
    client: Client, settings: Any, path: str
) -> None:
    tier("anonymous", "1/h", is_default_anonymous=True)
    redis_down(settings, "closed")

    response = client.get(path)

    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    body = response.json()
    assert body["limit"] is None
    assert "unavailable" in body["detail"]
    assert body["retry_after"] == int(response["Retry-After"])
    assert "X-RateLimit-Remaining" not in response


def test_fail_closed_status_can_be_429(client: Client, settings: Any) -> None:
    tier("anonymous", "1/h", is_default_anonymous=True)
    redis_down(settings, "closed", FAILURE_STATUS=429)

    assert client.get("/api/ping/").status_code == 429


def test_fail_local_enforces_the_limit_in_process(client: Client, settings: Any) -> None:
    tier("anonymous", "1/h", burst=2, is_default_anonymous=True)
    redis_down(settings, "local")

    responses = [client.get("/api/ping/") for _ in range(3)]

    assert [r.status_code for r in responses] == [200, 200, 429]
    assert all(r["X-RateLimit-Degraded"] == "local" for r in responses)
    assert responses[0]["X-RateLimit-Limit"] == "2"


def test_decorator_failure_mode_beats_the_setting(client: Client, settings: Any) -> None:
    redis_down(settings, "open")

    # tests.views.login_closed is @throttle(rate="5/min", failure_mode="closed")
    assert client.get("/login-closed/").status_code == 503
    assert client.get("/hello/").status_code == 200


def test_an_outage_is_logged_by_the_breaker_not_per_request(
    client: Client, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tier("anonymous", "1/h", is_default_anonymous=True)
    redis_down(settings)
    with caplog.at_level(logging.INFO, logger="django_throttle"):
        for _ in range(50):
            assert client.get("/api/ping/").status_code == 200

    throttle_lines = [r for r in caplog.records if r.name.startswith("django_throttle")]
    assert len(throttle_lines) <= 5


def test_credential_endpoints_fail_closed_by_default(client: Client, settings: Any) -> None:
    tier("anonymous", "10/h", is_default_anonymous=True)
    redis_down(settings, "open")

    # Django's LoginView under @throttle, and a DRF view marked throttle_credential = True.
    assert client.get("/accounts/login/").status_code == 503
    assert client.post("/api/token/").status_code == 503
    # Everything else follows the setting.
    assert client.get("/api/ping/").status_code == 200


# --- clients with no usable address --------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_unidentified_log() -> None:
    from django_throttle import core

    core._last_unidentified_log = -core.UNIDENTIFIED_LOG_INTERVAL


@pytest.mark.parametrize("remote", ["", "unix:/run/gunicorn.sock", "garbage"])
def test_unidentifiable_clients_are_refused_by_default_not_pooled(
    client: Client, settings: Any, caplog: pytest.LogCaptureFixture, remote: str
) -> None:
    tier("anonymous", "100/h", is_default_anonymous=True)
    with caplog.at_level(logging.ERROR, logger="django_throttle"):
        response = client.get("/api/ping/", REMOTE_ADDR=remote)

    assert response.status_code == 503
    assert "client address" in response.json()["detail"]
    assert "TRUSTED_PROXY_COUNT" in caplog.text


def test_unidentifiable_clients_can_be_served_uncounted(client: Client, settings: Any) -> None:
    settings.DJANGO_THROTTLE_UNKNOWN_CLIENT = "allow"
    tier("anonymous", "1/h", is_default_anonymous=True)

    responses = [client.get("/api/ping/", REMOTE_ADDR="") for _ in range(3)]

    assert [r.status_code for r in responses] == [200, 200, 200]
    assert responses[0]["X-RateLimit-Degraded"] == "open"


def test_unidentifiable_clients_share_one_bucket_only_when_asked(
    client: Client, settings: Any
) -> None:
    settings.DJANGO_THROTTLE_UNKNOWN_CLIENT = "shared"
    tier("anonymous", "1/h", burst=2, is_default_anonymous=True)

    codes = [client.get("/api/ping/", REMOTE_ADDR=r).status_code for r in ("", "x", "", "x")]

    assert codes == [200, 200, 429, 429]


def test_unidentified_log_line_is_rate_limited(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    tier("anonymous", "100/h", is_default_anonymous=True)
    with caplog.at_level(logging.ERROR, logger="django_throttle"):
        for _ in range(20):
            client.get("/api/ping/", REMOTE_ADDR="")

    assert caplog.text.count("no usable client address") == 1


# --- shadow rules never show in headers ----------------------------------------------------


def test_shadow_only_limits_are_not_advertised(client: Client, settings: Any) -> None:
    settings.DJANGO_THROTTLE_IETF_HEADERS = True
    anonymous = tier("anonymous", is_default_anonymous=True)  # no enforced limits
    endpoint("trial", "route", "ping", shadow=True, limits={anonymous: "1/h"})

    responses = [client.get("/api/ping/") for _ in range(3)]

    assert [r.status_code for r in responses] == [200, 200, 200]
    for response in responses:
        assert not any(
            name.lower().startswith(("x-ratelimit", "ratelimit")) for name in response.headers
        )


def test_shadow_limits_are_left_out_of_the_policy_header(client: Client, settings: Any) -> None:
    settings.DJANGO_THROTTLE_IETF_HEADERS = True
    anonymous = tier("anonymous", "10/m", is_default_anonymous=True)
    endpoint("trial", "route", "ping", shadow=True, limits={anonymous: "1/h"})

    client.get("/api/ping/")
    response = client.get("/api/ping/")  # the shadow limit would deny now

    assert response.status_code == 200
    assert response["X-RateLimit-Limit"] == "10"
    assert response["X-RateLimit-Remaining"] == "8"
    assert response["RateLimit-Policy"].count(";q=") == 1
    assert ";q=10;" in response["RateLimit-Policy"]


# --- Retry-After is never short -------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "header"),
    [(0.0, 1), (0.3, 1), (1.0, 1), (1.000001, 2), (2.0, 2), (3599.999999, 3600), (3600.0, 3600)],
)
def test_retry_after_rounds_up_with_no_tolerance(seconds: float, header: int) -> None:
    from django_throttle.headers import retry_after_seconds

    assert retry_after_seconds(seconds) == header


class OldStyleBackend(MemoryBackend):
    """A custom backend written before ``hit`` took ``usage`` (the released signature)."""

    def hit(  # type: ignore[override]
        self, client: str, limits: Any, cost: int = 1, *, now: float | None = None
    ) -> Any:
        return super().hit(client, limits, cost, now=now)


def test_a_backend_without_the_usage_argument_still_decides(client: Client, settings: Any) -> None:
    """The core passes ``usage=`` to every backend; one that predates it is adapted, never a
    TypeError turned 500."""
    settings.DJANGO_THROTTLE_BACKEND = f"{__name__}.OldStyleBackend"
    tier("anonymous", "2/h", burst=2, is_default_anonymous=True)
    assert [client.get("/api/ping/").status_code for _ in range(3)] == [200, 200, 429]
