"""How fast is one throttle decision? PolicyThrottle against one raw EVALSHA and DRF's own.

Run from the repository root::

    .venv/bin/python bench/bench_throttle.py [--seconds 3] [--json] [--profile]

One run starts a private ``redis-server`` (or uses ``REDIS_URL``; keys then live under a random
prefix and are deleted at the end), configures Django in-process (in-memory SQLite, a
django-redis default cache on the same Redis, usage counting on with manual flushes), creates a
default tier whose one limit never denies, then measures decisions per second for

(a) the EVALSHA the Redis backend sends for one limit, called in a loop: one round trip;
(b) ``PolicyThrottle().allow_request()``: identity, policy snapshot, backend call, usage;
(c) DRF's ``UserRateThrottle().allow_request()`` on the django-redis cache (GET + SET).

Each path runs ``--seconds`` in total after a warm-up, in short interleaved rounds (a, b, c,
a, b, c, ...); decisions/s is the median round, a ratio the median of the ratios of rounds run
back to back. Round trips per decision of (b) come from Redis's ``INFO commandstats`` around
the (b) rounds, minus the commands the script itself issues (measured on the (a) rounds); they
are server-wide, so a ``REDIS_URL`` that other clients use inflates them. SQL queries per
decision come from a separate steady-state run. Timings are printed, never asserted: the exit
status is 0 whether or not the targets are met.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import os
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: PolicyThrottle must reach this share of the raw EVALSHA rate...
TARGET_VS_RAW = 0.7
#: ...and be this many times faster than DRF's UserRateThrottle.
TARGET_VS_DRF = 1.5
#: A rate no path ever reaches, so every decision is "allowed" and does the same work.
NEVER_DENY = "1000000/s"
USERS = 8
#: Rounds per path: short ones interleave finely (drift on a shared machine hits all paths
#: alike), within these bounds.
MIN_ROUNDS, MAX_ROUNDS, ROUND_SECONDS = 5, 15, 0.3
#: Decisions of (b) counted for SQL queries, after warm-up.
ACCOUNTING_DECISIONS = 500

PATHS = ("ping", "raw_evalsha", "policy_throttle", "drf_user_rate_throttle")
LABELS = {
    "ping": "(0) PING round trip, plain redis-py client",
    "raw_evalsha": "(a) raw EVALSHA, 1 round trip",
    "policy_throttle": "(b) PolicyThrottle",
    "drf_user_rate_throttle": "(c) DRF UserRateThrottle",
}


class _ErrorCounter(logging.Handler):
    """Counts errors the package logs (a backend failure is logged, then fails open)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def configure_django(
    redis_url: str,
    prefix: str,
    *,
    database: str = ":memory:",
    drf_rate: str = NEVER_DENY,
    count_usage: bool = True,
    redis_options: dict[str, Any] | None = None,
) -> None:
    """Configure Django in-process for a benchmark (also used by ``race.py`` and
    ``bench_failures.py``, which passes ``redis_options={}`` for the production timeouts)."""
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-only-not-secret",
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": database}},
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "rest_framework",
            "django_throttle",
        ],
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        CACHES={
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": redis_url,
                "KEY_PREFIX": f"{prefix}-cache",
            }
        },
        REST_FRAMEWORK={
            "DEFAULT_AUTHENTICATION_CLASSES": [],
            "DEFAULT_THROTTLE_RATES": {"user": drf_rate, "anon": drf_rate},
        },
        DJANGO_THROTTLE_REDIS_URL=redis_url,
        DJANGO_THROTTLE_KEY_PREFIX=prefix,
        # A loaded machine (CI, this benchmark's own Redis on the same cores) can stall for
        # more than the 50 ms production default; a timeout would fail open and skew numbers.
        DJANGO_THROTTLE_REDIS_OPTIONS=(
            {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}
            if redis_options is None
            else redis_options
        ),
        DJANGO_THROTTLE_USAGE_ENABLED=count_usage,
        DJANGO_THROTTLE_USAGE_FLUSH_INTERVAL=0,
    )
    django.setup()


def create_fixtures() -> list[Any]:
    """Migrate, then a default tier with one never-denying limit and ``USERS`` users."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from django_throttle.models import Tier, TierLimit

    call_command("migrate", verbosity=0)
    tier = Tier.objects.create(slug="bench", name="Bench", is_default_authenticated=True)
    TierLimit.objects.create(tier=tier, rate=NEVER_DENY)
    user_model = get_user_model()
    return [user_model.objects.create_user(f"bench{i}") for i in range(USERS)]


def build_requests(users: Sequence[Any]) -> list[Any]:
    """One authenticated DRF request per user, built before anything is timed."""
    from rest_framework.request import Request
    from rest_framework.test import APIRequestFactory

    factory = APIRequestFactory()
    requests = []
    for user in users:
        request = Request(factory.get("/bench/"))
        request.user = user
        requests.append(request)
    return requests


class BenchView:
    """Stands in for a DRF view: no ``throttle_scope``, so only the tier limits apply."""


def timed(
    step: Callable[[Any], object], items: Sequence[Any], seconds: float
) -> tuple[int, float, float]:
    """Call ``step`` on ``items`` round-robin for about ``seconds``.

    Returns (calls, wall seconds, CPU seconds of this process, which includes the kernel's
    socket work but not the time spent waiting for Redis)."""
    count = 0
    cpu_start = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for item in items:
            step(item)
        count += len(items)
        now = time.perf_counter()
        if now >= deadline:
            return count, now - start, time.process_time() - cpu_start


def captured_call(backend: Any, client: str, limits: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """The (keys, args) ``backend.hit(client, limits)`` passes to its script, taken from a
    real call so the baseline follows any change to the argument layout."""
    seen: list[tuple[list[Any], list[Any]]] = []
    script = backend._script

    def spy(keys: Sequence[Any], args: Sequence[Any]) -> Any:
        seen.append((list(keys), list(args)))
        return script(keys, args)

    backend._script = spy
    try:
        backend.hit(client, limits)
    finally:
        backend._script = script
    if len(seen) != 1:
        raise RuntimeError(f"expected RedisBackend.hit to run its script once, saw {len(seen)}")
    return seen[0]


class CommandStats:
    """Commands Redis executed, from ``INFO commandstats`` (our own INFO calls left out)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def snapshot(self) -> dict[str, int]:
        stats = self.client.info("commandstats")
        return {
            name.removeprefix("cmdstat_"): int(value["calls"])
            for name, value in stats.items()
            if name != "cmdstat_info"
        }

    @staticmethod
    def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
        return {
            name: after[name] - before.get(name, 0)
            for name in after
            if after[name] != before.get(name, 0)
        }


def add_into(total: dict[str, int], part: dict[str, int]) -> None:
    for name, calls in part.items():
        total[name] = total.get(name, 0) + calls


def run(seconds: float, redis_url: str, prefix: str, profile: bool) -> dict[str, Any]:
    configure_django(redis_url, prefix)

    import redis
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.throttling import UserRateThrottle

    from django_throttle import policy as policy_module
    from django_throttle.backends import get_backend, reset_backend_cache
    from django_throttle.backends.redis import RedisBackend, load_script
    from django_throttle.drf import PolicyThrottle

    errors = _ErrorCounter()
    logging.getLogger("django_throttle").addHandler(errors)

    users = create_fixtures()
    requests = build_requests(users)
    view = BenchView()

    backend = get_backend()
    assert isinstance(backend, RedisBackend), type(backend)
    limits = policy_module.current().default_authenticated.limits  # type: ignore[union-attr]
    # Exactly the keys and arguments RedisBackend._call sends for each user's one limit,
    # captured from a real call and prebuilt: the floor for one round trip.
    script = backend.client.register_script(load_script())
    raw_calls = [captured_call(backend, f"user:{user.pk}", limits) for user in users]

    denied = {"drf": 0}
    # The floor every path pays: one round trip on a client that shares none of our code.
    ping_client = redis.Redis.from_url(redis_url)

    def ping_step(item: object) -> object:
        return ping_client.ping()

    def raw_step(call: tuple[list[str], list[Any]]) -> object:
        return script(*call)

    def policy_step(request: Any) -> object:
        return PolicyThrottle().allow_request(request, view)  # raises when denied

    def drf_step(request: Any) -> object:
        if not UserRateThrottle().allow_request(request, view):
            denied["drf"] += 1
        return None

    steps: dict[str, tuple[Callable[[Any], object], Sequence[Any]]] = {
        "ping": (ping_step, raw_calls),
        "raw_evalsha": (raw_step, raw_calls),
        "policy_throttle": (policy_step, requests),
        "drf_user_rate_throttle": (drf_step, requests),
    }

    warmup = min(1.0, max(0.1, seconds / 5))
    for name in PATHS:
        step, items = steps[name]
        timed(step, items, warmup)

    stats_client = redis.Redis.from_url(redis_url)
    stats = CommandStats(stats_client)
    server = stats_client.info("server")
    rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, round(seconds / ROUND_SECONDS)))
    round_seconds = seconds / rounds
    rates: dict[str, list[float]] = {name: [] for name in PATHS}
    cpu: dict[str, list[float]] = {name: [] for name in PATHS}
    commands: dict[str, dict[str, int]] = {"raw_evalsha": {}, "policy_throttle": {}}
    decisions = {"raw_evalsha": 0, "policy_throttle": 0}
    for _ in range(rounds):
        for name in PATHS:
            step, items = steps[name]
            before = stats.snapshot() if name in commands else {}
            count, elapsed, cpu_seconds = timed(step, items, round_seconds)
            rates[name].append(count / elapsed)
            cpu[name].append(cpu_seconds / count * 1e6)
            if name in commands:
                add_into(commands[name], stats.delta(before, stats.snapshot()))
                decisions[name] += count

    # The script's own GET/SET/TIME show up in commandstats too: learn how many it issues per
    # EVALSHA from (a), where every call is exactly one EVALSHA, and take them out of (b).
    raw_cmds = commands["raw_evalsha"]
    per_script = round((sum(raw_cmds.values()) - raw_cmds["evalsha"]) / raw_cmds["evalsha"])
    policy_cmds = commands["policy_throttle"]
    evalshas = policy_cmds.get("evalsha", 0)
    round_trips = sum(policy_cmds.values()) - per_script * evalshas
    n_policy = decisions["policy_throttle"]

    # Steady-state SQL: the policy snapshot and the user -> tier cache are warm by now.
    with CaptureQueriesContext(connection) as queries:
        for i in range(ACCOUNTING_DECISIONS):
            policy_step(requests[i % len(requests)])
    sql_per_decision = len(queries.captured_queries) / ACCOUNTING_DECISIONS

    profile_text = None
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        timed(policy_step, requests, seconds)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
        profile_text = out.getvalue()

    drf_history = [
        len(UserRateThrottle.cache.get(f"throttle_user_{user.pk}", [])) for user in users
    ]

    reset_backend_cache()
    stats_client.close()
    ping_client.close()
    medians = {name: statistics.median(rates[name]) for name in PATHS}
    # Ratios of rounds run back to back, then their median: drift between rounds cancels.
    policy = rates["policy_throttle"]
    vs_raw = statistics.median(b / a for b, a in zip(policy, rates["raw_evalsha"], strict=True))
    vs_drf = statistics.median(
        b / c for b, c in zip(policy, rates["drf_user_rate_throttle"], strict=True)
    )
    vs_ping = statistics.median(b / p for b, p in zip(policy, rates["ping"], strict=True))
    return {
        "redis": {"version": server.get("redis_version"), "url": redis_url},
        "seconds_per_path": seconds,
        "rounds": rounds,
        "users": USERS,
        "decisions_per_second": {
            name: {
                "median": medians[name],
                "rounds": rates[name],
                "client_cpu_us_per_decision": statistics.median(cpu[name]),
            }
            for name in PATHS
        },
        "ratios": {
            "policy_vs_ping": vs_ping,
            "policy_vs_raw_evalsha": vs_raw,
            "policy_vs_drf": vs_drf,
        },
        "targets": {
            "policy_vs_raw_evalsha": {"target": TARGET_VS_RAW, "pass": vs_raw >= TARGET_VS_RAW},
            "policy_vs_drf": {"target": TARGET_VS_DRF, "pass": vs_drf >= TARGET_VS_DRF},
        },
        "policy_throttle": {
            "decisions_counted": n_policy,
            "round_trips_per_decision": round_trips / n_policy,
            "evalsha_per_decision": evalshas / n_policy,
            "redis_commands": policy_cmds,
            "script_commands_per_evalsha": per_script,
            "sql_queries_per_decision": sql_per_decision,
            "sql_decisions_counted": ACCOUNTING_DECISIONS,
            "backend_errors_logged": errors.count,
        },
        "drf_user_rate_throttle": {
            "denied": denied["drf"],
            "mean_history_length": statistics.mean(drf_history),
        },
        "profile": profile_text,
    }


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=max(100, Console().width))
    rates = result["decisions_per_second"]
    table = Table(
        title=(
            f"decisions/s, median of {result['rounds']} interleaved rounds, "
            f"{result['seconds_per_path']:g} s per path, {result['users']} users, "
            f"Redis {result['redis']['version']}"
        )
    )
    table.add_column("path")
    table.add_column("decisions/s", justify="right")
    table.add_column("µs/decision", justify="right")
    table.add_column("client CPU µs", justify="right")
    table.add_column("rounds min-max", justify="right")
    for name in PATHS:
        median = rates[name]["median"]
        rounds = rates[name]["rounds"]
        table.add_row(
            LABELS[name],
            f"{median:,.0f}",
            f"{1e6 / median:.1f}",
            f"{rates[name]['client_cpu_us_per_decision']:.1f}",
            f"{min(rounds):,.0f}-{max(rounds):,.0f}",
        )
    console.print(table)

    targets = Table(title="(b) PolicyThrottle against its targets")
    targets.add_column("ratio")
    targets.add_column("measured", justify="right")
    targets.add_column("target", justify="right")
    targets.add_column("result")
    names = {"policy_vs_raw_evalsha": "(b) / (a) raw EVALSHA", "policy_vs_drf": "(b) / (c) DRF"}
    for key, label in names.items():
        target = result["targets"][key]
        verdict = "[green]PASS[/]" if target["pass"] else "[red]MISS[/]"
        targets.add_row(
            label, f"{result['ratios'][key]:.2f}x", f">= {target['target']:.1f}x", verdict
        )
    console.print(targets)
    console.print(f"(b) / (0) PING: {result['ratios']['policy_vs_ping']:.2f}x")

    policy = result["policy_throttle"]
    commands = ", ".join(f"{k} {v}" for k, v in sorted(policy["redis_commands"].items()))
    console.print(
        f"(b) per decision: {policy['round_trips_per_decision']:.4f} Redis round trips "
        f"({policy['evalsha_per_decision']:.4f} EVALSHA) over {policy['decisions_counted']:,} "
        + escape(
            f"decisions [commandstats: {commands}; {policy['script_commands_per_evalsha']} "
            "per EVALSHA issued by the script itself]"
        )
    )
    console.print(
        f"(b) per decision: {policy['sql_queries_per_decision']:g} SQL queries over "
        f"{policy['sql_decisions_counted']} steady-state decisions; "
        f"backend errors logged: {policy['backend_errors_logged']}"
    )
    drf = result["drf_user_rate_throttle"]
    console.print(
        f"(c) DRF on the django-redis cache: {drf['denied']} denied; its per-user history "
        f"held {drf['mean_history_length']:.0f} timestamps on average at the end (pickled on "
        "every GET and SET)"
    )
    if result["profile"]:
        print(result["profile"])  # unwrapped: pstats lines are wider than a terminal


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="measured time per path (default 3)"
    )
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument(
        "--profile", action="store_true", help="also cProfile (b) for --seconds and print it"
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be positive")

    prefix = f"dtbench{uuid.uuid4().hex[:10]}"
    private = None
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        from example_project.private_redis import PrivateRedis

        private = PrivateRedis().start()
        redis_url = private.url
    try:
        result = run(args.seconds, redis_url, prefix, args.profile)
    finally:
        if private is not None:
            private.stop()
        else:
            _delete_keys(redis_url, prefix)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


def _delete_keys(redis_url: str, prefix: str) -> None:
    """Remove this run's keys from a Redis we do not own (all under the random prefix)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
