"""Prometheus metrics, from :mod:`django_throttle.events` (``pip install
"django-throttle-policies[metrics]"``, set ``DJANGO_THROTTLE_METRICS = True`` and add
``path("metrics", metrics_view)`` to your URLs, protected: the view answers 404 while metrics
are off, and checks no one's rights while they are on).

Under gunicorn, uWSGI or any server with several processes, set ``PROMETHEUS_MULTIPROC_DIR``
to an empty directory writable by every worker before they start (and empty it on each
deploy): each process then writes its values there and :func:`metrics_view` adds them up, so
a scrape sees the whole server whichever worker answers it. See prometheus_client's
"multiprocess mode" documentation.

Metrics (all prefixed ``django_throttle_``):

- ``decisions_total{tier, endpoint, outcome}``: outcome is ``allowed``, ``denied``,
  ``shadow_denied``, ``failed_open`` or ``failed_closed``;
- ``decision_seconds``: a histogram of the time a decision took, backend call included;
- ``delays_total{tier, endpoint}``: requests a delaying limit gave a turn to wait for
  (counted when the wait begins), and ``delay_seconds``, a histogram of those waits;
- ``shed_total{tier, endpoint, criticality}``: requests the load shedder refused with 503
  (also in ``decisions_total`` as ``denied``);
- ``leases_held``: concurrency leases this process's requests hold now (summed over the live
  processes in multiprocess mode: the requests in flight under concurrency limits), and
  ``leases_lost_total``: leases found already ended when renewed (their slots may have gone
  to other requests: alert on it);
- ``backend_errors_total{reason}``: ``timeout``, ``connection``, ``script`` or ``other``;
- ``circuit_breaker_open``: 1 while a process's breaker is open (the highest of the live
  processes in multiprocess mode); ``circuit_breaker_transitions_total{to}``;
- ``cluster_primary_breaker_open{primary}``: 1 while the breaker of that Redis Cluster
  primary is open (its clients take their failure mode; the others are counted);
- ``script_loads_total``: Lua scripts loaded into Redis after NOSCRIPT;
- ``policy_reloads_total``: policy snapshots compiled;
- ``tier_load_factor{tier}``: what each tier's limits are scaled by in the process's policy
  snapshot (its load factor times the adaptive controller's, 0 to 1; the lowest of the live
  processes in multiprocess mode), set when a snapshot is compiled.

Tier and endpoint labels come from the admin's policy, so their number is bounded by it.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse

from django_throttle import events

__all__ = ["metrics_view"]

_metrics: dict[str, Any] = {}


def available() -> bool:
    """Whether prometheus_client is installed (found without importing it)."""
    return importlib.util.find_spec("prometheus_client") is not None


def _build() -> dict[str, Any]:
    from prometheus_client import Counter, Gauge, Histogram

    return {
        "decisions": Counter(
            "django_throttle_decisions",
            "Rate limit decisions by tier, endpoint and outcome.",
            ["tier", "endpoint", "outcome"],
        ),
        "seconds": Histogram(
            "django_throttle_decision_seconds",
            "Time to decide one request, backend call included.",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
        ),
        "delays": Counter(
            "django_throttle_delays",
            "Requests given a turn to wait for by a delaying limit, by tier and endpoint.",
            ["tier", "endpoint"],
        ),
        "delay_seconds": Histogram(
            "django_throttle_delay_seconds",
            "The wait for its turn a delaying limit gave a request.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0),
        ),
        "shed": Counter(
            "django_throttle_shed",
            "Requests refused with 503 to protect the service, by tier, endpoint and criticality.",
            ["tier", "endpoint", "criticality"],
        ),
        "leases": Gauge(
            "django_throttle_leases_held",
            "Concurrency leases this process's requests hold now.",
            multiprocess_mode="livesum",
        ),
        "lost": Counter(
            "django_throttle_leases_lost",
            "Concurrency leases found already ended when renewed.",
        ),
        "errors": Counter(
            "django_throttle_backend_errors", "Failed backend calls by reason.", ["reason"]
        ),
        "open": Gauge(
            "django_throttle_circuit_breaker_open",
            "1 while the circuit breaker is open.",
            multiprocess_mode="livemax",
        ),
        "primary_open": Gauge(
            "django_throttle_cluster_primary_breaker_open",
            "1 while the circuit breaker of this Redis Cluster primary is open.",
            ["primary"],
            multiprocess_mode="livemax",
        ),
        "transitions": Counter(
            "django_throttle_circuit_breaker_transitions",
            "Circuit breaker openings and closings.",
            ["to"],
        ),
        "scripts": Counter("django_throttle_script_loads", "Lua scripts loaded into Redis."),
        "reloads": Counter("django_throttle_policy_reloads", "Policy snapshots compiled."),
        "load_factor": Gauge(
            "django_throttle_tier_load_factor",
            "What the tier's limits are scaled by (load factor times the adaptive factor).",
            ["tier"],
            multiprocess_mode="livemin",
        ),
    }


def connect() -> bool:
    """Create the metrics and connect them to the signals, once per process. Returns whether
    metrics are on (``DJANGO_THROTTLE_METRICS`` and prometheus_client installed)."""
    from django_throttle.conf import app_settings

    if _metrics:
        return True
    if not app_settings.METRICS or not available():
        return False
    _metrics.update(_build())
    events.request_decided.connect(_decided, dispatch_uid="dt-metrics-decided")
    events.backend_error.connect(_error, dispatch_uid="dt-metrics-error")
    events.backend_unavailable.connect(_breaker, dispatch_uid="dt-metrics-open")
    events.backend_available.connect(_breaker, dispatch_uid="dt-metrics-closed")
    events.script_loaded.connect(_script, dispatch_uid="dt-metrics-script")
    events.policy_reloaded.connect(_reloaded, dispatch_uid="dt-metrics-reloaded")
    events.leases_held.connect(_leases, dispatch_uid="dt-metrics-leases")
    events.lease_lost.connect(_lost, dispatch_uid="dt-metrics-lost")
    return True


def _decided(
    *, tier: str, endpoint: str, outcome: str, seconds: float, decision: Any = None, **_: Any
) -> None:
    _metrics["decisions"].labels(tier, endpoint, outcome).inc()
    _metrics["seconds"].observe(seconds)
    if getattr(decision, "shed", False):
        _metrics["shed"].labels(tier, endpoint, decision.limit.name).inc()
    wait = getattr(decision, "wait", 0.0)
    if wait and outcome == "allowed":
        _metrics["delays"].labels(tier, endpoint).inc()
        _metrics["delay_seconds"].observe(wait)


def _leases(*, held: int, **_: Any) -> None:
    _metrics["leases"].set(held)


def _lost(**_: Any) -> None:
    _metrics["lost"].inc()


def _error(*, reason: str, **_: Any) -> None:
    _metrics["errors"].labels(reason).inc()


def _breaker(*, signal: Any, node: str | None = None, **_: Any) -> None:
    """A breaker opened (``backend_unavailable``) or closed (``backend_available``): the
    process's, or (``node``) one cluster primary's, which is not the process's state."""
    opened = signal is events.backend_unavailable
    if node is not None:
        _metrics["primary_open"].labels(node).set(int(opened))
        return
    _metrics["open"].set(int(opened))
    _metrics["transitions"].labels("open" if opened else "closed").inc()


def _script(**_: Any) -> None:
    _metrics["scripts"].inc()


def _reloaded(*, policy: Any = None, **_: Any) -> None:
    _metrics["reloads"].inc()
    for tier in getattr(policy, "tiers", {}).values():
        _metrics["load_factor"].labels(tier.slug).set(tier.factor)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition of every metric of this process (or, in multiprocess mode,
    of all processes), the default registry's whole content.

    Served only while metrics are on (``DJANGO_THROTTLE_METRICS = True`` and prometheus_client
    installed): otherwise 404, whatever else the registry holds, so mounting the URL does not
    publish anything by itself. The view checks no one's rights: protect it as you would any
    internal endpoint (wrap it with ``staff_member_required``, an IP allow-list of your
    scrapers, or serve it on an internal port only).
    """
    from django_throttle.conf import app_settings

    if not app_settings.METRICS:
        raise Http404("Metrics are off (DJANGO_THROTTLE_METRICS).")
    if not available():
        raise Http404("Metrics are off: prometheus_client is not installed.")
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    registry = REGISTRY
    if directory:
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
