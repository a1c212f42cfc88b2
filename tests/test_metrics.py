"""Signals and Prometheus metrics: every counter and signal is caused by a test, including
across several processes (prometheus_client's multiprocess mode)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import RequestFactory
from prometheus_client import REGISTRY

from django_throttle import events, metrics
from django_throttle.backends import BackendError, get_backend
from django_throttle.backends import redis_nodes as breaker_module
from django_throttle.backends.redis_nodes import CircuitBreaker
from django_throttle.models import EndpointLimit
from django_throttle.policy import live as policy
from django_throttle.rates import Algorithm, Limit
from django_throttle.request import core, leases
from tests.factories import endpoint, tier
from tests.redis_servers import forget_code

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def metrics_on(settings: Any) -> None:
    """Metrics are opt-in (DJANGO_THROTTLE_METRICS); this module turns them on."""
    settings.DJANGO_THROTTLE_METRICS = True


@pytest.fixture
def received() -> Any:
    """Connect a receiver to every signal; yields {signal name: [kwargs, ...]}."""
    names = [
        "request_decided",
        "request_throttled",
        "backend_error",
        "backend_unavailable",
        "backend_available",
        "policy_reloaded",
        "script_loaded",
    ]
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    receivers = {}
    for name in names:

        def receiver(sender: Any, _name: str = name, **kwargs: Any) -> None:
            found[_name].append(kwargs)

        receivers[name] = receiver
        getattr(events, name).connect(receiver)
    yield found
    for name, receiver in receivers.items():
        getattr(events, name).disconnect(receiver)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_decisions_send_signals_and_count_in_metrics(client: Any, received: Any) -> None:
    assert metrics.connect()
    anon = tier("anonymous", "100/h", is_default_anonymous=True)
    endpoint("ping", "route", "ping", limits={anon: "2/h"})
    labels = {"tier": "anonymous", "endpoint": "ping"}
    before = {
        o: sample("django_throttle_decisions_total", **labels, outcome=o)
        for o in ("allowed", "denied")
    }
    seconds_before = sample("django_throttle_decision_seconds_count")

    statuses = [client.get("/api/ping/", REMOTE_ADDR="198.51.100.1").status_code for _ in range(3)]

    assert statuses == [200, 200, 429]
    assert [d["outcome"] for d in received["request_decided"]] == ["allowed", "allowed", "denied"]
    assert all(d["seconds"] > 0 for d in received["request_decided"])
    [throttled] = received["request_throttled"]
    assert (throttled["tier"], throttled["endpoint"], throttled["shadow"]) == (
        "anonymous",
        "ping",
        False,
    )
    assert throttled["decision"].retry_after > 0
    assert (
        sample("django_throttle_decisions_total", **labels, outcome="allowed") - before["allowed"]
        == 2
    )
    assert (
        sample("django_throttle_decisions_total", **labels, outcome="denied") - before["denied"]
        == 1
    )
    assert sample("django_throttle_decision_seconds_count") - seconds_before == 3


def test_delayed_requests_count_in_metrics_with_their_wait(client: Any, received: Any) -> None:
    assert metrics.connect()
    anon = tier("anonymous", "100/h", is_default_anonymous=True)
    rule = endpoint("ping", "route", "ping")
    EndpointLimit.objects.create(
        rule=rule, tier=anon, rate="2/s", burst=3, algorithm="gcra", delay=0
    )
    labels = {"tier": "anonymous", "endpoint": "ping"}
    before = sample("django_throttle_delays_total", **labels)
    waited = sample("django_throttle_delay_seconds_sum")

    statuses = [client.get("/api/ping/", REMOTE_ADDR="198.51.100.9").status_code for _ in range(3)]

    assert statuses == [200, 200, 200]  # the second and third waited for their turn
    assert sample("django_throttle_delays_total", **labels) - before == 2
    assert 0 < sample("django_throttle_delay_seconds_sum") - waited <= 1.0 + 1e-9
    assert [bool(d["decision"].wait) for d in received["request_decided"]] == [False, True, True]


def test_shadow_would_denies_are_their_own_outcome(client: Any, received: Any) -> None:
    anon = tier("anonymous", "100/h", is_default_anonymous=True)
    rule = endpoint("ping", "route", "ping", shadow=True, limits={anon: "1/h"})
    assert rule.shadow
    for _ in range(2):
        assert client.get("/api/ping/").status_code == 200
    assert [d["outcome"] for d in received["request_decided"]] == ["allowed", "shadow_denied"]
    assert received["request_throttled"][0]["shadow"] is True


def test_a_dead_backend_counts_errors_and_failed_open(
    settings: Any, received: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    settings.DJANGO_THROTTLE_FAILURE_MODE = "open"
    monkeypatch.setattr(breaker_module, "THRESHOLD", 2)
    metrics.connect()
    errors_before = sample("django_throttle_backend_errors_total", reason="connection")
    request = RequestFactory().get("/")
    limits = (Limit.build("dead", "5/h"),)

    outcomes = [core.check(request, limits=limits) for _ in range(3)]

    assert all(d.failed_open for d in outcomes)
    assert [d["outcome"] for d in received["request_decided"]] == ["failed_open"] * 3
    assert [e["reason"] for e in received["backend_error"]] == ["connection", "connection"]
    assert len(received["backend_unavailable"]) == 1  # the breaker opened after 2
    assert sample("django_throttle_backend_errors_total", reason="connection") - errors_before == 2
    assert sample("django_throttle_circuit_breaker_open") == 1


def test_the_breaker_announces_recovery(received: Any) -> None:
    metrics.connect()
    now = [0.0]
    breaker = CircuitBreaker(threshold=1, cooldown=1.0, clock=lambda: now[0])

    def fail() -> None:
        raise BackendError("Timeout reading from socket")

    with pytest.raises(BackendError):
        breaker.call(fail)
    now[0] = 2.0
    assert breaker.call(lambda: "ok") == "ok"

    assert [e["reason"] for e in received["backend_error"]] == ["timeout"]
    assert len(received["backend_unavailable"]) == 1
    assert len(received["backend_available"]) == 1
    assert received["backend_available"][0]["down_seconds"] == 2.0
    assert sample("django_throttle_circuit_breaker_open") == 0


def test_policy_reloads_are_announced(received: Any) -> None:
    metrics.connect()
    before = sample("django_throttle_policy_reloads_total")
    tier("anonymous", "5/h", is_default_anonymous=True)
    policy.reset()

    snapshot = policy.current()

    assert received["policy_reloaded"][-1]["policy"] is snapshot
    assert sample("django_throttle_policy_reloads_total") - before >= 1


def test_each_tiers_load_factor_is_a_gauge(received: Any) -> None:
    metrics.connect()
    tier("free", "10/m", load_factor=40)
    policy.reset()
    policy.current()
    assert sample("django_throttle_tier_load_factor", tier="free") == 0.4


def test_a_receiver_that_raises_never_fails_a_request(client: Any) -> None:
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("exporter bug")

    events.request_decided.connect(broken)
    try:
        tier("anonymous", "5/h", is_default_anonymous=True)
        assert client.get("/api/ping/").status_code == 200
    finally:
        events.request_decided.disconnect(broken)


def test_the_metrics_view_serves_the_exposition(client: Any, settings: Any) -> None:
    from django.urls import path

    metrics.connect()
    urls = type("urls", (), {"urlpatterns": [path("metrics", metrics.metrics_view)]})
    settings.ROOT_URLCONF = urls
    tier("anonymous", "5/h", is_default_anonymous=True)

    response = client.get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert b"django_throttle_decisions_total" in response.content


@pytest.mark.parametrize("metrics_setting", [False, None])
def test_the_metrics_view_serves_nothing_while_metrics_are_off(
    client: Any, settings: Any, metrics_setting: bool | None
) -> None:
    """Off (False, or unset: the default) means 404, though this process connected metrics
    earlier and the registry is full of them."""
    from django.urls import path

    metrics.connect()
    urls = type("urls", (), {"urlpatterns": [path("metrics", metrics.metrics_view)]})
    settings.ROOT_URLCONF = urls
    if metrics_setting is None:
        del settings.DJANGO_THROTTLE_METRICS
    else:
        settings.DJANGO_THROTTLE_METRICS = metrics_setting
    tier("anonymous", "5/h", is_default_anonymous=True)
    client.get("/api/ping/")

    response = client.get("/metrics")

    assert response.status_code == 404
    assert b"django_throttle_" not in response.content
    assert b"python_gc" not in response.content


def test_the_documented_staff_only_metrics_url(
    client: Any, admin_client: Any, settings: Any
) -> None:
    """The README's way to restrict the view: staff_member_required around it."""
    from django.contrib import admin
    from django.contrib.admin.views.decorators import staff_member_required
    from django.urls import path

    metrics.connect()
    patterns = [
        path("admin/", admin.site.urls),
        path("metrics", staff_member_required(metrics.metrics_view)),
    ]
    urls = type("urls", (), {"urlpatterns": patterns})
    settings.ROOT_URLCONF = urls

    assert client.get("/metrics").status_code == 302  # to the admin login
    response = admin_client.get("/metrics")
    assert response.status_code == 200
    assert b"django_throttle_decisions_total" in response.content


def test_metrics_add_up_across_processes(
    tmp_path: Path, settings: Any, monkeypatch: Any, redis_url: str
) -> None:
    """Three worker processes share one Redis bucket of 3 per hour, 4 requests each: the
    metrics view, reading every process's files, shows exactly 3 allowed and 9 denied."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(directory),
        "DJANGO_THROTTLE_TEST_REDIS_URL": redis_url,
        "WORKER_KEY_PREFIX": settings.DJANGO_THROTTLE_KEY_PREFIX,
        "PYTHONPATH": str(ROOT),
    }
    workers = [
        subprocess.Popen([sys.executable, "-m", "tests.metrics_worker", "4"], cwd=ROOT, env=env)
        for _ in range(3)
    ]
    assert [w.wait(timeout=60) for w in workers] == [0, 0, 0]
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))

    text = metrics.metrics_view(RequestFactory().get("/metrics")).content.decode()

    lines = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert lines['django_throttle_decisions_total{endpoint="",outcome="allowed",tier=""}'] == 3
    assert lines['django_throttle_decisions_total{endpoint="",outcome="denied",tier=""}'] == 9
    assert lines["django_throttle_decision_seconds_count"] == 12


def test_a_flushed_script_cache_is_reloaded_and_counted(redis_client: Any, received: Any) -> None:
    """SCRIPT FLUSH on the suite's own private Redis (never a shared one)."""
    from django_throttle.backends import get_backend
    from tests import conftest

    if conftest._private is None:
        pytest.skip("flushes scripts: only on the redis-server the suite started itself")

    metrics.connect()
    backend = get_backend()
    limits = (Limit.build("flush", "5/h"),)
    assert backend.hit("ip:198.51.100.9", limits).allowed
    before = sample("django_throttle_script_loads_total")
    forget_code(redis_client)

    assert backend.hit("ip:198.51.100.9", limits).remaining == 3

    assert len(received["script_loaded"]) == 1
    assert sample("django_throttle_script_loads_total") - before == 1


def test_leases_held_and_lost_are_counted() -> None:
    assert metrics.connect()
    lost: list[dict[str, Any]] = []

    def on_lost(sender: Any, **kwargs: Any) -> None:
        lost.append(kwargs)

    events.lease_lost.connect(on_lost)
    try:
        limit = Limit.build("exports", "1/s", algorithm=Algorithm.CONCURRENCY)
        lost_before = sample("django_throttle_leases_lost_total")
        request = RequestFactory().get("/", REMOTE_ADDR="198.51.100.77")
        assert core.check(request, limits=(limit,)).allowed
        assert sample("django_throttle_leases_held") == 1  # held while the request runs
        leases.release(request)
        assert sample("django_throttle_leases_held") == 0

        other = RequestFactory().get("/", REMOTE_ADDR="198.51.100.78")
        assert core.check(other, limits=(limit,)).allowed
        [held] = leases.keeper().held()
        # The lease ends behind the keeper's back (as when renewals failed for a whole lease).
        get_backend().release(held.client, held.limits, held.lease)
        deadline = time.monotonic() + 5
        while not lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [found["client"] for found in lost] == [held.client]
        assert sample("django_throttle_leases_lost_total") - lost_before == 1
        assert sample("django_throttle_leases_held") == 0
    finally:
        events.lease_lost.disconnect(on_lost)


def test_the_metrics_view_without_prometheus_client_says_so(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On, but the package missing: the 404 named the setting (which was on) as the reason."""
    from django.http import Http404

    settings.DJANGO_THROTTLE_METRICS = True
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed

    with pytest.raises(Http404, match="prometheus_client is not installed"):
        metrics.metrics_view(RequestFactory().get("/metrics"))
