"""Every figure the operator reads is what happened: a known mix of traffic through the real
middleware stack (``@throttle`` and DRF, sync and async), with Redis up and down in each
failure mode, API keys and a login guard, compared request for request with the Prometheus
metrics, the signals and the usage report (``throttle_usage --format json``)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.test import Client
from prometheus_client import REGISTRY

from django_throttle import events, metrics
from django_throttle.models import ApiKey, EndpointLimit, EndpointRule, Exemption
from django_throttle.usage import accounting as usage
from tests.clients import AddressedAsyncClient
from tests.factories import endpoint, push_kept, tier

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent
OUTCOMES = ("allowed", "denied", "shadow_denied", "failed_open", "failed_closed")
#: The views of rule "seam": every adapter.
VIEWS = {
    "decorator": "/seams/view/",
    "decorator-async": "/seams/view-async/",
    "drf": "/seams/api/",
    "drf-async": "/seams/api-async/",
}


@pytest.fixture(autouse=True)
def metrics_on(settings: Any) -> None:
    settings.DJANGO_THROTTLE_METRICS = True
    assert metrics.connect()


@pytest.fixture
def received() -> Any:
    """{"decided": [(tier, endpoint, outcome)], "throttled": [(tier, endpoint, shadow)]}."""
    found: dict[str, list[tuple[str, str, Any]]] = {"decided": [], "throttled": []}

    def decided(sender: Any, tier: str, endpoint: str, outcome: str, **kwargs: Any) -> None:
        found["decided"].append((tier, endpoint, outcome))

    def throttled(sender: Any, tier: str, endpoint: str, shadow: bool, **kwargs: Any) -> None:
        found["throttled"].append((tier, endpoint, shadow))

    events.request_decided.connect(decided)
    events.request_throttled.connect(throttled)
    yield found
    events.request_decided.disconnect(decided)
    events.request_throttled.disconnect(throttled)


def decisions(tier_slug: str, endpoint_name: str) -> dict[str, float]:
    return {
        outcome: REGISTRY.get_sample_value(
            "django_throttle_decisions_total",
            {"tier": tier_slug, "endpoint": endpoint_name, "outcome": outcome},
        )
        or 0.0
        for outcome in OUTCOMES
    }


def counted(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    return {k: int(after[k] - before[k]) for k in after if after[k] != before[k]}


def send(view: str, address: str, method: str = "get", **headers: str) -> int:
    """One request from ``address``: WSGI for a sync view, ASGI for an async one."""
    if "async" in view:
        client: Any = AddressedAsyncClient(address)
        return int(async_to_sync(getattr(client, method))(view, headers=headers).status_code)
    return int(getattr(Client(REMOTE_ADDR=address), method)(view, headers=headers).status_code)


def report(by: str) -> dict[str, dict[str, int]]:
    """The usage report's outcome columns, by ``by``, rows without a request left out."""
    out = io.StringIO()
    call_command(
        "throttle_usage", "--by", by, "--format", "json", "--top", "1000", stdout=out,
        skip_checks=True,
    )  # fmt: skip
    rows = {row[by]: {k: row[k] for k in OUTCOMES if row[k]} for row in json.loads(out.getvalue())}
    return {key: columns for key, columns in rows.items() if columns}


@pytest.mark.parametrize("view", VIEWS)
def test_allowed_denied_and_exempt_requests_in_every_figure(view: str, received: Any) -> None:
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    endpoint("seam", "scope", "seam", limits={anonymous: "2/h"})
    Exemption.objects.create(network="203.0.113.0/24")
    before = decisions("anonymous", "seam")

    statuses = [send(VIEWS[view], "198.51.100.7") for _ in range(3)]
    statuses += [send(VIEWS[view], "203.0.113.5") for _ in range(2)]  # exempt: not counted

    assert statuses == [200, 200, 429, 200, 200]
    assert counted(before, decisions("anonymous", "seam")) == {"allowed": 2, "denied": 1}
    assert received["decided"] == [("anonymous", "seam", o) for o in ("allowed",) * 2 + ("denied",)]
    assert received["throttled"] == [("anonymous", "seam", False)]
    assert report("endpoint") == {"seam": {"allowed": 2, "denied": 1}}
    assert report("client") == {"ip:198.51.100.7": {"allowed": 2, "denied": 1}}


@pytest.mark.parametrize(
    ("mode", "statuses", "outcomes"),
    [
        ("local", [200, 200, 429], {"allowed": 2, "denied": 1}),
        ("open", [200, 200, 200], {"failed_open": 3}),
        ("closed", [503, 503, 503], {"failed_closed": 3}),
    ],
)
@pytest.mark.parametrize("view", VIEWS)
def test_requests_served_while_redis_is_down_in_every_figure(
    view: str, mode: str, statuses: list[int], outcomes: dict[str, int], received: Any,
    settings: Any,
) -> None:  # fmt: skip
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    endpoint("seam", "scope", "seam", limits={anonymous: "2/h"})
    settings.DJANGO_THROTTLE_FAILURE_MODE = mode
    reachable = settings.DJANGO_THROTTLE_REDIS_URL
    assert send(VIEWS[view], "198.51.100.7") == 200  # the policy loaded while Redis is up
    # Pushed now: the backend built for the unreachable URL below keeps a tally of its own.
    usage.flush_pending()
    received["decided"].clear()
    before = decisions("anonymous", "seam")

    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    assert [send(VIEWS[view], "198.51.100.8") for _ in range(3)] == statuses
    settings.DJANGO_THROTTLE_REDIS_URL = reachable
    push_kept()  # what the pusher does once Redis answers

    assert counted(before, decisions("anonymous", "seam")) == outcomes
    expected = [("anonymous", "seam", o) for o, n in outcomes.items() for _ in range(n)]
    assert sorted(received["decided"]) == sorted(expected)
    assert report("client") == {"ip:198.51.100.8": outcomes, "ip:198.51.100.7": {"allowed": 1}}


@pytest.mark.parametrize("is_async", [False, True])
def test_api_key_clients_and_login_checks_in_every_figure(is_async: bool, received: Any) -> None:
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    partner = tier("partner", "1000/h")
    endpoint("seam", "scope", "seam", limits={partner: "2/h"})
    rule = EndpointRule.objects.create(name="seam-login", pattern="seam-login", counts="failures")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="2/h", counted_by="ip")
    _, key = ApiKey.objects.create_key(name="ci", tier=partner)
    suffix = "-async/" if is_async else "/"
    keyed = decisions("partner", "seam")
    logins = decisions("anonymous", "seam-login")

    api = [send(f"/seams/api{suffix}", "198.51.100.3", Authorization=f"Api-Key {key}")]
    api += [send(f"/seams/api{suffix}", "198.51.100.3", Authorization=f"Api-Key {key}")]
    api += [send(f"/seams/api{suffix}", "198.51.100.3", Authorization=f"Api-Key {key}")]
    attempts = [send(f"/seams/login{suffix}", "198.51.100.4", "post") for _ in range(3)]

    assert (api, attempts) == ([200, 200, 429], [401, 401, 429])
    assert counted(keyed, decisions("partner", "seam")) == {"allowed": 2, "denied": 1}
    # The login check is made before authentication: labelled with the tier it met then.
    assert counted(logins, decisions("anonymous", "seam-login")) == {"allowed": 2, "denied": 1}
    assert received["throttled"] == [("partner", "seam", False), ("anonymous", "seam-login", False)]
    by_client = report("client")
    assert by_client.pop("ip:198.51.100.4") == {"allowed": 2, "denied": 1}
    [(client, columns)] = by_client.items()
    assert client.startswith("key:") and columns == {"allowed": 2, "denied": 1}
    # The usage report puts the login checks in a series of their own, no tier's.
    assert report("tier") == {
        "partner": {"allowed": 2, "denied": 1},
        usage.BEFORE_AUTHENTICATION: {"allowed": 2, "denied": 1},
    }


def test_two_worker_processes_pushing_one_clients_counts_add_up(
    settings: Any, redis_url: str
) -> None:
    env = {
        **os.environ,
        "DJANGO_THROTTLE_TEST_REDIS_URL": redis_url,
        "WORKER_KEY_PREFIX": settings.DJANGO_THROTTLE_KEY_PREFIX,
        "PYTHONPATH": str(ROOT),
    }
    workers = [
        subprocess.Popen([sys.executable, "-m", "tests.usage_worker", "4"], cwd=ROOT, env=env)
        for _ in range(2)
    ]
    assert [w.wait(timeout=60) for w in workers] == [0, 0]

    # One bucket of 5 shared by both: 5 allowed and 3 denied, whichever process counted them.
    assert report("client") == {"ip:203.0.113.50": {"allowed": 5, "denied": 3}}
    assert report("endpoint") == {"seam": {"allowed": 5, "denied": 3}}
    assert report("tier") == {"anonymous": {"allowed": 5, "denied": 3}}
