"""The request path as clients see it: failure modes, unidentifiable clients, shadow limits and
honest ``Retry-After``, through real DRF and plain Django views on the suite's Redis."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest
from django.test import Client

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
    redis_down(settings, "open")

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


def test_fail_closed_status_is_503_whatever_a_removed_setting_says(
    client: Client, settings: Any
) -> None:
    """``FAILURE_STATUS`` is gone (system check W004): a 429 would tell the client it
    exceeded a limit it never met."""
    tier("anonymous", "1/h", is_default_anonymous=True)
    redis_down(settings, "closed", FAILURE_STATUS=429)

    assert client.get("/api/ping/").status_code == 503


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


@pytest.mark.parametrize("mode", [None, "open"])
def test_an_outage_is_logged_by_the_breaker_not_per_request(
    client: Client, settings: Any, caplog: pytest.LogCaptureFixture, mode: str | None
) -> None:
    tier("anonymous", "100/h", is_default_anonymous=True)
    redis_down(settings, mode)
    with caplog.at_level(logging.INFO, logger="django_throttle"):
        for _ in range(50):
            assert client.get("/api/ping/").status_code == 200

    throttle_lines = [r for r in caplog.records if r.name.startswith("django_throttle")]
    assert len(throttle_lines) <= 5


def test_credential_endpoints_count_locally_where_the_setting_opens(
    client: Client, settings: Any
) -> None:
    """Issue 30 item 4: under the setting's "open", a login or token endpoint is neither served
    uncounted nor refused to everyone while the backend is down: it is counted in the
    process, and its answers say so."""
    tier("anonymous", "3/h", is_default_anonymous=True)
    redis_down(settings, "open")

    # A DRF view marked throttle_credential = True: three attempts, then 429.
    answers = [client.post("/api/token/") for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert all(a["X-RateLimit-Degraded"] == "local" for a in answers)
    # Everything else follows the setting.
    assert client.get("/api/ping/").status_code == 200


def test_credential_endpoints_fail_closed_when_the_setting_says_so(
    client: Client, settings: Any
) -> None:
    tier("anonymous", "10/h", is_default_anonymous=True)
    redis_down(settings, "closed")

    # Django's LoginView under @throttle, and a DRF view marked throttle_credential = True.
    assert client.get("/accounts/login/").status_code == 503
    assert client.post("/api/token/").status_code == 503


#: Redis URLs no client can be built from: a system check reports each (E002, E040), but
#: checks are skipped in some deploys (``runserver --skip-checks``, a WSGI server).
MALFORMED_URLS = [
    "redis://:notaport",
    "redis://host:99999",
    "foo://x",
    "redis+sentinel://",
    "redis+cluster://",
]
#: What three requests meet with such a URL, by failure mode: as with Redis down.
MALFORMED_ANSWERS = {"open": [200, 200, 200], "closed": [503, 503, 503], "local": [200, 200, 429]}


@pytest.mark.parametrize("url", MALFORMED_URLS)
@pytest.mark.parametrize("mode", list(MALFORMED_ANSWERS))
@pytest.mark.parametrize("path", ["/api/ping/", "/hello/"])
def test_a_malformed_redis_url_meets_the_failure_mode_never_a_500(
    client: Client, settings: Any, caplog: pytest.LogCaptureFixture, url: str, mode: str, path: str
) -> None:
    """The DRF throttle and @throttle: served and marked (open), 503 with Retry-After
    (closed), counted in the process (local), and one error line naming the setting."""
    tier("anonymous", "1/h", burst=2, is_default_anonymous=True)
    redis_down(settings, mode)
    settings.DJANGO_THROTTLE_REDIS_URL = url
    first = 5 if path == "/hello/" else 2  # @throttle(rate="5/min"); the tier's burst
    with caplog.at_level(logging.INFO, logger="django_throttle"):
        answers = [client.get(path) for _ in range(first + 1)]

    statuses = [answer.status_code for answer in answers]
    assert statuses == (MALFORMED_ANSWERS[mode][:1] * first + MALFORMED_ANSWERS[mode][-1:])
    if mode == "closed":
        assert all(int(answer["Retry-After"]) >= 1 for answer in answers)
    else:
        assert all(answer["X-RateLimit-Degraded"] == mode for answer in answers)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.name for r in errors] == ["django_throttle.backends"]
    assert errors[0].getMessage().startswith(f"DJANGO_THROTTLE_REDIS_URL = {url!r} cannot be used")


@pytest.mark.parametrize("url", MALFORMED_URLS)
def test_a_malformed_redis_url_is_still_a_check_error(settings: Any, url: str) -> None:
    from django_throttle.checks import check_settings

    settings.DJANGO_THROTTLE_REDIS_URL = url
    found = [error.id for error in check_settings()]
    assert found in (["django_throttle.E002"], ["django_throttle.E040"])


# --- clients with no usable address --------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_unidentified_log() -> None:
    from django_throttle.request import core

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
    assert "TRUSTED_PROXIES" in caplog.text


@pytest.mark.parametrize("choice", ["allow", "shared"])
def test_unidentifiable_clients_are_refused_whatever_a_removed_setting_says(
    client: Client, settings: Any, choice: str
) -> None:
    """``UNKNOWN_CLIENT`` is gone (system check W004): serving such requests uncounted or in
    one shared bucket let a misconfigured proxy lift every limit or starve every client."""
    settings.DJANGO_THROTTLE_UNKNOWN_CLIENT = choice
    tier("anonymous", "1/h", burst=2, is_default_anonymous=True)

    codes = [client.get("/api/ping/", REMOTE_ADDR=r).status_code for r in ("", "x", "", "x")]

    assert codes == [503, 503, 503, 503]


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
    from django_throttle.request.core import retry_after_seconds

    assert retry_after_seconds(seconds) == header


# --- HEAD meets the GET rules ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("match_type", "pattern", "path"),
    [
        ("path", "/api/ping/", "/api/ping/"),
        ("route", "report", "/api/reports/7/"),
    ],
)
def test_a_get_rule_covers_head(client: Client, match_type: str, pattern: str, path: str) -> None:
    """Django and DRF answer HEAD with the GET handler: ten HEADs must not pass a 2/min GET
    rule, and GET and HEAD share its counter (scopes: tests/test_request_seams.py)."""
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    endpoint("ping", match_type, pattern, methods="GET", limits={anonymous: "2/min"})

    assert [client.head(path).status_code for _ in range(3)] == [200, 200, 429]
    assert client.get(path).status_code == 429


def test_head_prefers_a_rule_naming_head_then_one_naming_get_then_one_for_all() -> None:
    from django_throttle.policy.live import compile_policy

    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    endpoint("every", "path", "/api/", limits={anonymous: "9/min"})
    get = endpoint("get", "path", "/api/", methods="GET", limits={anonymous: "2/min"})
    policy = compile_policy()

    assert policy.match("HEAD", path="/api/ping/").name == "get"  # type: ignore[union-attr]
    assert policy.match("POST", path="/api/ping/").name == "every"  # type: ignore[union-attr]
    longer = endpoint("longer", "path", "/api/ping/", limits={anonymous: "5/min"})
    head = endpoint("head", "path", "/api/", methods="HEAD", limits={anonymous: "1/min"})
    policy = compile_policy()
    assert policy.match("HEAD", path="/api/ping/").name == longer.name  # type: ignore[union-attr]
    assert policy.match("HEAD", path="/api/other/").name == head.name  # type: ignore[union-attr]
    assert policy.match("GET", path="/api/other/").name == get.name  # type: ignore[union-attr]


# --- Retry-After: the longest wait of every limit that refuses -------------------------------


@pytest.mark.parametrize(
    "algorithm",
    [
        "token_bucket",
        "gcra",
        "leaky_bucket",
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
    ],
)
@pytest.mark.parametrize("order", ["short-first", "long-first"])
def test_several_limits_denied_in_one_call_report_the_longest_wait(
    backend: Any, algorithm: str, order: str
) -> None:
    """Redis (driver.lua) and memory agree: whichever order the limits come in, the denial
    reported is the one whose wait is longest."""
    from django_throttle.rates import Limit

    short = Limit.build("short", "2/min", algorithm=algorithm)
    long = Limit.build("long", "2/h", algorithm=algorithm)
    limits = (short, long) if order == "short-first" else (long, short)
    now = 1_800_000_000.0
    assert all(backend.hit("ip:198.51.100.1", limits, now=now).allowed for _ in range(2))

    denied = backend.hit("ip:198.51.100.1", limits, now=now)

    assert not denied.allowed
    assert denied.limit.id == "long"
    assert denied.retry_after >= 1800
    assert backend.hit("ip:198.51.100.1", limits, now=now + denied.retry_after).allowed


# --- the request path sits below its adapters ----------------------------------------------


@pytest.mark.parametrize(
    "module",
    [
        "django_throttle.request.core",
        "django_throttle.request.core",
        "django_throttle.request.core",
    ],
)
def test_the_request_path_does_not_import_the_credential_guard(module: str) -> None:
    """``credentials.protect_credentials`` calls the request path; the request path must not
    import it back (no circle): what both need lives below, in the request path."""
    script = f"import sys, {module}; print('django_throttle.credentials' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"
