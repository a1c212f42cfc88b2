"""What a sick Redis costs each request: added latency with Redis healthy, killed and hung.

Run from the repository root::

    .venv/bin/python bench/bench_failures.py [--seconds 2] [--threads 4] [--json]

Starts its own ``redis-server`` on a free loopback port (it never uses or flushes any other
Redis), configures Django in-process with the backend's production client settings (50 ms
connect and read timeouts, no retries; ``FAILURE_MODE`` "open"), a file SQLite database and a
default anonymous tier whose one limit never denies, and builds requests from ``--clients``
distinct addresses. Then, for the circuit breaker on (``breaker.THRESHOLD`` 3,
``breaker.COOLDOWN`` 0.5 s, the package's) and effectively off (threshold 10**9), it measures
``PolicyThrottle().allow_request()`` per request:

healthy   Redis answering; next to it a PING round trip on a plain client (the floor).
killed    SIGKILL: connects are refused.
hung      SIGSTOP: connects and commands get no answer until the timeout.

Each fault phase breaks Redis while ``--threads`` threads (a threaded worker process) decide
for a quarter of ``--seconds`` (the onset), then one thread decides for ``--seconds`` (the
steady state; one thread, so latencies are not GIL waits behind the other threads). It reports
p50 / p99 / max latency per decision in the steady state, decisions that waited for a timeout
(>= 40 ms), backend calls that failed before the breaker opened (its ``failures`` counter minus
failed probes), half-open probes, calls refused at once, and WARNING+ log lines. Then Redis
comes back (SIGCONT, or a restart on the same port) while one thread keeps deciding, and the
script reports how long after Redis answered PING again the first request was counted in Redis.
Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: A rate no client reaches here: every decision is "allowed" and does the same work.
NEVER_DENY = "1000000/s"
#: A decision at least this slow waited for a socket timeout (0.8 x the 50 ms default): GIL
#: contention among the threads alone stalls decisions by up to tens of milliseconds.
SLOW = 0.040
BREAKERS = {"on": 3, "off": 10**9}
#: Give up waiting for Redis to be counted again after this long (and say so).
RECOVERY_LIMIT = 10.0


class LogCounter(logging.Handler):
    """WARNING-and-above lines the package logs (per request would be a flood)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def build_requests(clients: int) -> list[Any]:
    """One anonymous DRF request per distinct client address, built before anything is timed."""
    from django.contrib.auth.models import AnonymousUser
    from rest_framework.request import Request
    from rest_framework.test import APIRequestFactory

    factory = APIRequestFactory()
    requests = []
    for n in range(clients):
        address = f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"
        request = Request(factory.get("/bench/", REMOTE_ADDR=address))
        request.user = AnonymousUser()
        requests.append(request)
    return requests


class View:
    """Stands in for a DRF view with no ``throttle_scope``: the tier limit applies."""


def decide(request: Any) -> bool:
    """One decision; True if Redis counted it (False: served because the limiter failed)."""
    from django_throttle.drf import PolicyThrottle

    throttle = PolicyThrottle()
    throttle.allow_request(request, View())
    return throttle.decision is not None and not throttle.decision.failed_open


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max in milliseconds."""
    if not samples:
        return {"p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "p50_ms": statistics.median(ordered) * 1e3,
        "p99_ms": p99 * 1e3,
        "max_ms": ordered[-1] * 1e3,
    }


def run_threads(
    requests: Sequence[Any], threads: int, seconds: float
) -> tuple[list[float], int, int]:
    """Decide from ``threads`` threads for ``seconds``: (latencies, decisions, counted)."""
    latencies: list[float] = []
    counted = 0
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def work(offset: int) -> None:
        nonlocal counted
        mine: list[float] = []
        ok = 0
        n = offset
        while time.perf_counter() < stop:
            start = time.perf_counter()
            ok += decide(requests[n % len(requests)])
            mine.append(time.perf_counter() - start)
            n += threads
        with lock:
            latencies.extend(mine)
            counted += ok

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return latencies, len(latencies), counted


def ping_baseline(redis_url: str, seconds: float) -> dict[str, float]:
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=1.0)
    client.ping()
    samples = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        start = time.perf_counter()
        client.ping()
        samples.append(time.perf_counter() - start)
    client.close()
    return {**percentiles(samples), "calls": len(samples)}


def healthy(requests: Sequence[Any], seconds: float) -> dict[str, Any]:
    for request in requests[:200]:
        decide(request)
    latencies, decisions, counted = run_threads(requests, 1, seconds)
    return {**percentiles(latencies), "decisions": decisions, "counted": counted}


def fault_phase(
    fault: str,
    breaker: str,
    server: Any,
    requests: Sequence[Any],
    threads: int,
    seconds: float,
    logs: LogCounter,
) -> dict[str, Any]:
    """Break Redis under load, then bring it back; what did it cost?"""
    from unittest.mock import patch

    from django_throttle.backends import redis_nodes as breaker_module
    from django_throttle.backends import reset_backend_cache
    from django_throttle.backends.redis_nodes import get_breaker

    with patch.object(breaker_module, "THRESHOLD", BREAKERS[breaker]):
        reset_backend_cache()  # a fresh backend and a breaker built with this threshold
        for request in requests[:50]:
            decide(request)  # connections pooled, script loaded
        logs.count = 0
        if fault == "killed":
            server.kill()
        else:
            server.pause()
        # Onset: a threaded worker meets the outage (how many calls fail before the breaker
        # opens). Steady state: one thread, so latencies are not GIL waits behind the others.
        onset, onset_decisions, onset_counted = run_threads(requests, threads, seconds / 4)
        latencies, decisions, counted = run_threads(requests, 1, seconds)
        state = get_breaker()
        failures, opened, refused = state.failures, state.opened, state.short_circuited
        log_lines = logs.count
        # Failures after the first opening are failed half-open probes, one per re-opening.
        before_open = failures - max(0, opened - 1) if opened else failures

        if fault == "killed":
            server.start()  # returns once the new server answers PING
        else:
            server.resume()
        healed = time.perf_counter()
        recovered = None
        n = 0
        while time.perf_counter() - healed < RECOVERY_LIMIT:
            if decide(requests[n % len(requests)]):
                recovered = time.perf_counter() - healed
                break
            n += 1
            time.sleep(0.001)  # a trickle of traffic, not a spin
    return {
        "fault": fault,
        "breaker": breaker,
        **percentiles(latencies),
        "decisions": decisions,
        "counted": counted + onset_counted,
        "onset_decisions": onset_decisions,
        "onset_max_ms": max(onset, default=0.0) * 1e3,
        "waited_for_timeout": sum(1 for t in onset + latencies if t >= SLOW),
        "failures_before_open": before_open if opened else None,
        "backend_failures": failures,
        "probes": max(0, opened - 1),
        "short_circuited": refused,
        "log_lines": log_lines,
        "recovery_s": recovered,
    }


def run(seconds: float, threads: int, clients: int) -> dict[str, Any]:
    from tests.redis_servers import RedisServer

    server = RedisServer().start()
    workdir = tempfile.TemporaryDirectory(prefix="django-throttle-bench-failures-")
    try:
        # The production client options (50 ms timeouts): what an outage costs is the point.
        from bench_throttle import configure_django

        configure_django(
            server.url,
            f"dtfail{uuid.uuid4().hex[:8]}",
            database=os.path.join(workdir.name, "bench.sqlite3"),
            count_usage=False,
            redis_options={},
            # Served uncounted while Redis fails, as the published figures were measured
            # (``decide`` tells a counted decision by ``failed_open``); the default, "local",
            # would count each decision in the process instead.
            extra_settings={"DJANGO_THROTTLE_FAILURE_MODE": "open"},
        )
        from django.core.management import call_command

        from django_throttle.backends.redis_clients import DEFAULT_CLIENT_OPTIONS
        from django_throttle.models import Tier, TierLimit
        from django_throttle.policy import live as policy

        call_command("migrate", verbosity=0)
        tier = Tier.objects.create(slug="anon", name="Anonymous", is_default_anonymous=True)
        TierLimit.objects.create(tier=tier, rate=NEVER_DENY)
        policy.reset()
        requests = build_requests(clients)
        logs = LogCounter()
        logging.getLogger("django_throttle").addHandler(logs)

        result: dict[str, Any] = {
            "redis_version": server.client().info("server")["redis_version"],
            "threads": threads,
            "clients": clients,
            "seconds": seconds,
            "socket_timeout_ms": DEFAULT_CLIENT_OPTIONS["socket_timeout"] * 1e3,
            "ping": ping_baseline(server.url, min(seconds, 1.0)),
            "healthy": healthy(requests, seconds),
            "faults": [],
        }
        for fault in ("killed", "hung"):
            for breaker in BREAKERS:
                phase = fault_phase(fault, breaker, server, requests, threads, seconds, logs)
                result["faults"].append(phase)
        return result
    finally:
        server.stop()
        workdir.cleanup()


def print_report(result: dict[str, Any]) -> None:
    def ms(row: dict[str, Any]) -> str:
        return f"{row['p50_ms']:8.3f} {row['p99_ms']:8.3f} {row['max_ms']:8.1f}"

    print(
        f"Redis {result['redis_version']}, {result['threads']} threads, {result['clients']:,} "
        f"clients, {result['seconds']:g} s per phase, socket timeout "
        f"{result['socket_timeout_ms']:g} ms"
    )
    print("latency per decision (fault rows: one thread, after a threaded onset)")
    print(f"{'phase':<24} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'decisions':>9}")
    ping, ok = result["ping"], result["healthy"]
    print(f"{'PING round trip':<24} {ms(ping)} {ping['calls']:>9}")
    print(f"{'healthy (1 thread)':<24} {ms(ok)} {ok['decisions']:>9}")
    for row in result["faults"]:
        label = f"{row['fault']}, breaker {row['breaker']}"
        print(f"{label:<24} {ms(row)} {row['decisions']:>9}")
    print()
    header = (
        f"{'phase':<24} {'timeouts':>8} {'failed before open':>18} {'probes':>6} "
        f"{'refused at once':>15} {'log lines':>9} {'counted again after':>19}"
    )
    print(header)
    for row in result["faults"]:
        label = f"{row['fault']}, breaker {row['breaker']}"
        before = "-" if row["failures_before_open"] is None else row["failures_before_open"]
        recovery = f"{row['recovery_s'] * 1e3:.0f} ms" if row["recovery_s"] is not None else "never"
        print(
            f"{label:<24} {row['waited_for_timeout']:>8} {before!s:>18} {row['probes']:>6} "
            f"{row['short_circuited']:>15} {row['log_lines']:>9} {recovery:>19}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per phase (default 2)")
    parser.add_argument("--threads", type=int, default=4, help="during faults (default 4)")
    parser.add_argument("--clients", type=int, default=10_000, help="distinct addresses")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.threads < 1 or args.clients < 1:
        parser.error("--seconds, --threads and --clients must be positive")
    result = run(args.seconds, args.threads, args.clients)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
