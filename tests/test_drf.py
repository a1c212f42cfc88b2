"""PolicyThrottle on real DRF views, counted in the suite's Redis: what clients see."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from django.test import Client

from django_throttle.backends import get_backend
from django_throttle.backends.redis import Tally
from django_throttle.drf import PolicyThrottle
from django_throttle.policy import live as policy
from django_throttle.usage import accounting as usage
from tests.factories import endpoint, tier
from tests.redis_servers import script_calls_of

pytestmark = pytest.mark.django_db


def statuses(client: Client, path: str, n: int, method: str = "get", **extra: str) -> list[int]:
    return [getattr(client, method)(path, **extra).status_code for _ in range(n)]


def test_anonymous_tier_admits_its_burst_then_429(client: Client) -> None:
    # A refill of one token per half hour: however slow the requests, none comes back.
    tier("anonymous", "2/h", burst=10, is_default_anonymous=True)
    assert statuses(client, "/api/ping/", 12) == [200] * 10 + [429] * 2


def test_headers_on_allowed_and_denied(client: Client) -> None:
    tier("anonymous", "1/m", burst=3, is_default_anonymous=True)
    first = client.get("/api/ping/")
    assert first.status_code == 200
    assert first["X-RateLimit-Limit"] == "3"
    assert first["X-RateLimit-Remaining"] == "2"
    assert first["X-RateLimit-Reset"] == "60"
    assert "Retry-After" not in first
    client.get("/api/ping/")
    client.get("/api/ping/")
    denied = client.get("/api/ping/")
    assert denied.status_code == 429
    assert denied["X-RateLimit-Remaining"] == "0"
    assert 1 <= int(denied["Retry-After"]) <= 60
    body = denied.json()
    assert body["limit"] == "anonymous 1/min"
    assert body["retry_after"] == int(denied["Retry-After"])
    assert "throttled" in body["detail"]


def test_ietf_headers_on_request(client: Client, settings: object) -> None:
    settings.DJANGO_THROTTLE_IETF_HEADERS = True  # type: ignore[attr-defined]
    row = tier("anonymous", "10/m", is_default_anonymous=True)
    response = client.get("/api/ping/")
    limit_id = f"t{row.limits.get().pk}"
    assert response["RateLimit-Policy"] == f'"{limit_id}";q=10;w=60'
    assert response["RateLimit"] == f'"{limit_id}";r=9;t=6'


def test_authenticated_users_get_their_own_generous_bucket(
    client: Client, django_user_model: type
) -> None:
    tier("anonymous", "1/m", is_default_anonymous=True)
    tier("free", "100/m", is_default_authenticated=True)
    alice = django_user_model.objects.create_user("alice", password="pw")
    assert statuses(client, "/api/ping/", 2) == [200, 429]
    client.force_login(alice)
    assert statuses(client, "/api/ping/", 5) == [200] * 5
    assert client.get("/api/ping/")["X-RateLimit-Limit"] == "100"


def test_endpoint_rule_by_scope_costs_tokens_and_adds_limits(client: Client) -> None:
    anon = tier("anonymous", "1/m", burst=30, is_default_anonymous=True)
    endpoint("export", "scope", "export", cost=10, methods="POST", limits={anon: "20/h"})
    assert statuses(client, "/api/export/", 3, "post") == [202, 202, 429]
    # The two exports took 20 of the tier's 30 tokens: 10 pings remain.
    assert statuses(client, "/api/ping/", 11) == [200] * 10 + [429]


def test_endpoint_rule_by_route_name_and_path(client: Client) -> None:
    anon = tier("anonymous", "100/m", is_default_anonymous=True)
    endpoint("reports", "route", "report", limits={anon: "1/m"})
    assert statuses(client, "/api/reports/1/", 2) == [200, 429]
    assert client.get("/api/ping/").status_code == 200
    endpoint("pings", "path", "/api/ping", limits={anon: "1/h"})
    # The rule edit reloaded this process's policy at once.
    assert statuses(client, "/api/ping/", 2) == [200, 429]


def test_shadow_rule_counts_but_lets_requests_pass(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    anon = tier("anonymous", "100/m", is_default_anonymous=True)
    endpoint("pings", "route", "ping", shadow=True, limits={anon: "1/h"})
    with caplog.at_level(logging.INFO, logger="django_throttle"):
        assert statuses(client, "/api/ping/", 3) == [200, 200, 200]
    assert caplog.text.count("shadow rule 'pings' would deny") == 2


def test_shadow_rule_still_enforces_the_tier(client: Client) -> None:
    anon = tier("anonymous", "2/h", is_default_anonymous=True)
    endpoint("pings", "route", "ping", shadow=True, limits={anon: "100/h"})
    assert statuses(client, "/api/ping/", 3) == [200, 200, 429]


def test_no_tier_means_no_limit(client: Client) -> None:
    response = client.get("/api/ping/")
    assert response.status_code == 200
    assert "X-RateLimit-Limit" not in response


def test_retry_after_is_honest(client: Client, settings: Any) -> None:
    """Wait Retry-After seconds and the retry succeeds; a moment less and it is still refused.
    On a clock moved by hand (the memory backend's), so exact whatever the machine's speed."""
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    now = [1_700_000_000.0]
    get_backend().clock = lambda: now[0]  # type: ignore[attr-defined]
    tier("anonymous", "1/s", burst=1, is_default_anonymous=True)
    assert client.get("/api/ping/").status_code == 200
    denied = client.get("/api/ping/")
    assert denied.status_code == 429
    assert denied["Retry-After"] == "1"
    now[0] += int(denied["Retry-After"]) - 0.001
    assert client.get("/api/ping/").status_code == 429
    now[0] += 0.001
    assert client.get("/api/ping/").status_code == 200


def test_retry_after_is_honest_on_the_redis_server_clock(client: Client) -> None:
    """The same on Redis's own clock: a real wait of Retry-After seconds (a longer one on a
    loaded machine only makes the retry surer). The refusal is asserted only when the two
    requests came within the second that could refill the bucket."""
    import time

    tier("anonymous", "1/s", burst=1, is_default_anonymous=True)
    started = time.monotonic()
    assert client.get("/api/ping/").status_code == 200
    denied = client.get("/api/ping/")
    if time.monotonic() - started < 1:
        assert denied.status_code == 429
        assert denied["Retry-After"] == "1"
        time.sleep(int(denied["Retry-After"]))
    assert client.get("/api/ping/").status_code == 200


def test_wait_matches_the_decision(rf: object) -> None:
    from rest_framework.exceptions import Throttled
    from rest_framework.request import Request

    tier("anonymous", "1/h", is_default_anonymous=True)
    throttle = PolicyThrottle()
    request = Request(rf.get("/api/ping/"))  # type: ignore[attr-defined]
    assert throttle.allow_request(request, view=object()) is True
    assert throttle.wait() is None
    with pytest.raises(Throttled) as excinfo:
        throttle.allow_request(Request(rf.get("/api/ping/")), view=object())  # type: ignore[attr-defined]
    assert throttle.wait() == pytest.approx(3600, abs=5)
    assert excinfo.value.wait == 3600 or excinfo.value.wait == pytest.approx(3600, abs=5)


def test_redis_outage_counts_in_the_process_by_default(client: Client, settings: object) -> None:
    """An outage never switches limiting off: with no failure mode set, the process counts
    the client itself (afresh: what Redis counted is out of reach)."""
    tier("anonymous", "1/h", is_default_anonymous=True)
    client.get("/api/ping/")  # load the policy while Redis is reachable
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # type: ignore[attr-defined]
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}  # type: ignore[attr-defined]
    responses = [client.get("/api/ping/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 429, 429]
    assert all(r["X-RateLimit-Degraded"] == "local" for r in responses)


def test_redis_outage_fails_open_when_asked(client: Client, settings: object) -> None:
    tier("anonymous", "1/h", is_default_anonymous=True)
    client.get("/api/ping/")  # load the policy while Redis is reachable
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # type: ignore[attr-defined]
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}  # type: ignore[attr-defined]
    settings.DJANGO_THROTTLE_FAILURE_MODE = "open"  # type: ignore[attr-defined]
    assert statuses(client, "/api/ping/", 3) == [200, 200, 200]


def test_redis_outage_fails_closed_when_asked(client: Client, settings: object) -> None:
    tier("anonymous", "10/h", is_default_anonymous=True)
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # type: ignore[attr-defined]
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}  # type: ignore[attr-defined]
    settings.DJANGO_THROTTLE_FAILURE_MODE = "closed"  # type: ignore[attr-defined]
    response = client.get("/api/ping/")
    # An outage is not the client's fault: 503, and no limit is named or invented.
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    assert "unavailable" in response.json()["detail"]
    assert response.json()["limit"] is None
    assert "X-RateLimit-Remaining" not in response


def test_malformed_forwarded_header_is_not_an_error(client: Client, settings: object) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1  # type: ignore[attr-defined]
    tier("anonymous", "10/m", is_default_anonymous=True)
    for junk in ["", "garbage", "1.2.3.999", "[::1", "a" * 5000, ",,,"]:
        assert client.get("/api/ping/", HTTP_X_FORWARDED_FOR=junk).status_code == 200


def test_disabled_switch_lets_everything_through(client: Client, settings: object) -> None:
    tier("anonymous", "1/h", is_default_anonymous=True)
    settings.DJANGO_THROTTLE_ENABLED = False  # type: ignore[attr-defined]
    assert statuses(client, "/api/ping/", 3) == [200, 200, 200]


def test_one_redis_round_trip_per_request_however_many_limits(
    client: Client, settings: object, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted at both ways out: redis-py's command sending and the backend's own lean
    counting call (one packed command each), against the real Redis."""
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 3600)
    anon = tier("anonymous", "100/s", "1000/m", "10000/h", "100000/d", is_default_anonymous=True)
    endpoint("pings", "route", "ping", limits={anon: "500/s"})
    client.get("/api/ping/")  # warm: loads the policy and the script
    assert usage.wait_pushed()  # the first usage push of the process is due at once
    # The usage pusher thread pushes at most once a second on its own connection, which is
    # no request's round trip: none is due while the requests are counted, however slowly
    # they run (tests/test_usage_tally.py measures the pushes).
    monkeypatch.setattr(Tally, "due", lambda self: False)
    evalsha_before = script_calls_of(redis_client)
    sent: list[object] = []
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self: object, command: object, check_health: bool = True) -> None:
        sent.append(command)
        original(self, command, check_health)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as sending:
        sending.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
        for _ in range(25):
            response = client.get("/api/ping/")
            assert response.status_code == 200
            assert response["X-RateLimit-Limit"] == "100"
    assert len(sent) == 25
    assert script_calls_of(redis_client) - evalsha_before == 25


def test_usage_report_counts_what_clients_saw(client: Client) -> None:
    import json
    from io import StringIO

    from django.core.management import call_command

    tier("anonymous", "1/m", burst=10, is_default_anonymous=True)
    assert statuses(client, "/api/ping/", 12) == [200] * 10 + [429] * 2
    out = StringIO()
    call_command("throttle_usage", "--by", "client", "--format", "json", stdout=out)
    rows = json.loads(out.getvalue())
    assert [(r["client"], r["allowed"], r["denied"]) for r in rows] == [("ip:127.0.0.1", 10, 2)]
    out = StringIO()
    call_command("throttle_usage", "--by", "tier", "--format", "json", stdout=out)
    assert [(r["tier"], r["total"]) for r in json.loads(out.getvalue())] == [("anonymous", 12)]


def test_an_unknown_view_failure_mode_is_logged_and_ignored(
    rf: object, settings: object, caplog: pytest.LogCaptureFixture
) -> None:
    from rest_framework.request import Request

    from django_throttle.drf import LimiterUnavailable

    tier("anonymous", "10/h", is_default_anonymous=True)
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # type: ignore[attr-defined]
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}  # type: ignore[attr-defined]
    settings.DJANGO_THROTTLE_FAILURE_MODE = "closed"  # type: ignore[attr-defined]

    class Sideways:
        throttle_failure_mode = "sideways"

    throttle = PolicyThrottle()
    with caplog.at_level(logging.ERROR, logger="django_throttle"):
        for _ in range(3):
            request = Request(rf.get("/api/ping/"))  # type: ignore[attr-defined]
            with pytest.raises(LimiterUnavailable):  # the setting's "closed" applies
                throttle.allow_request(request, view=Sideways())

    assert caplog.text.count("throttle_failure_mode = 'sideways'") == 1


def test_one_view_class_mounted_with_two_scopes_counts_each_under_its_own(
    client: Client,
) -> None:
    """``as_view(throttle_scope=...)`` sets the scope on the instance: each mount of the class
    is counted under its own rule, however many requests the other mount served first (the
    view's options were kept by class alone, so every mount took the first one's scope)."""
    anon = tier("anonymous", "1000/s", is_default_anonymous=True)
    endpoint("a", "scope", "scoped-a", limits={anon: "1/h"})
    endpoint("b", "scope", "scoped-b", limits={anon: "3/h"})
    assert statuses(client, "/api/scoped-a/", 2) == [200, 429]
    assert statuses(client, "/api/scoped-b/", 4) == [200, 200, 200, 429]
    assert client.get("/api/scoped-b/")["X-RateLimit-Limit"] == "3"


@pytest.mark.django_db(transaction=True)
def test_one_async_view_class_mounted_with_two_scopes_counts_each_under_its_own() -> None:
    """The same through adrf's async APIView and AsyncPolicyThrottle, from one address."""
    from asgiref.sync import async_to_sync

    from tests.clients import AddressedAsyncClient

    anon = tier("anonymous", "1000/s", is_default_anonymous=True)
    endpoint("a", "scope", "scoped-a", limits={anon: "1/h"})
    endpoint("b", "scope", "scoped-b", limits={anon: "3/h"})

    async def run() -> list[int]:
        client = AddressedAsyncClient("10.9.8.7")
        codes = [(await client.get("/api/scoped-async-a/")).status_code for _ in range(2)]
        return codes + [(await client.get("/api/scoped-async-b/")).status_code for _ in range(4)]

    assert async_to_sync(run)() == [200, 429, 200, 200, 200, 429]
