"""How fast and how lean is one throttle decision, next to a PING round trip in the same run?

Run from the repository root::

    .venv/bin/python bench/bench_throttle.py [--seconds 3] [--users 100000] [--json] [--profile]
                                             [--no-usage]

One run starts a private ``redis-server`` (or uses ``REDIS_URL``; keys then live under a random
prefix and are deleted at the end), configures Django in-process (in-memory SQLite, a
django-redis default cache on the same Redis), creates the policy and ``--users`` users (see
``bench_paths.py``), then measures:

0   PING on a plain redis-py client (``execute_command``): the floor (and, for scale, PING
    written to a raw socket: redis-py's own cost per command);
1   a minimal token bucket of its own (GET, refill, SET PX) by ``execute_command("EVALSHA")``,
    distinct keys (a) and one hot key (b);
2   ``RedisBackend.hit()`` alone, distinct clients (a) and one hot client (b);
3   ``PolicyThrottle().allow_request(request, view)`` plus the X-RateLimit headers the
    middleware writes (``add_headers``): anonymous distinct IPs (a), users never seen before
    (b), one hot user (c), policy from the database;
4   DRF's ``UserRateThrottle`` on django-redis, distinct users with histories of a few hundred
    timestamps;
5   a whole DRF request through Django's test client, with and without ``PolicyThrottle``.

Paths 3a-3c push their usage counts at the end of each slice, that time counted in their rate
(not in a call's latency): each pays for its own clients, as a worker's requests share its
pusher thread's CPU. Paths 0-4 run in short interleaved slices; decisions/s and ÷PING are
medians over the rounds, p50/p99 over every timed call. Request objects (authenticated as DRF
would have) are built outside the timing: only the step is timed. Round trips, SQL, bytes and
memory come from a separate untimed pass per path (see ``bench_meter.py``). Targets are
printed, never asserted.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT, ROOT / "bench"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

#: A rate no path ever reaches (``race.py`` and ``bench_failures.py`` rely on the default).
NEVER_DENY = "1000000/s"
#: (label, path key, field, comparison, target) — printed with "met" or "not met".
TARGETS = (
    ("3a full path, anonymous ÷ PING", "full_anon", "vs_ping", ">=", 0.75),
    ("3b full path, users never seen ÷ PING", "full_user_new", "vs_ping", ">=", 0.75),
    ("2a RedisBackend.hit() ÷ PING", "hit", "vs_ping", ">=", 0.85),
    ("3b ÷ 3a (users within 10% of anonymous)", "full_user_new", "vs_anon", ">=", 0.90),
    ("3b SQL queries per decision", "full_user_new", "sql_queries", "<=", 0),
    ("3a bytes on the wire per decision", "full_anon", "wire_bytes", "<=", 180),
    ("3b bytes on the wire per decision", "full_user_new", "wire_bytes", "<=", 180),
    ("3a MEMORY USAGE bytes per key", "full_anon", "memory_usage_per_key", "<=", 88),
    ("3a used_memory per client x limit", "full_anon", "used_memory_marginal", "<=", 150),
    ("5 added latency p50 µs", "latency", "added_p50_us", "<=", 60),
    ("5 added latency p99 µs", "latency", "added_p99_us", "<=", 250),
)
#: Printed beside the targets as context (not targets): the same request with one PING
#: round trip in place of the throttle, the floor any Redis-backed throttle pays.
FLOOR = (
    ("5f one PING round trip in the request, added p50 µs", "latency", "ping_added_p50_us"),
    ("5f one PING round trip in the request, added p99 µs", "latency", "ping_added_p99_us"),
    ("5f throttle beyond that round trip, p50 µs", "latency", "above_ping_p50_us"),
    ("5f throttle beyond that round trip, p99 µs", "latency", "above_ping_p99_us"),
)


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
    extra_settings: dict[str, Any] | None = None,
) -> None:
    """Configure Django in-process for a benchmark (also used by ``race.py``,
    ``bench_failures.py`` (``redis_options={}``: the production timeouts) and
    ``bench_async.py``); ``extra_settings`` adds or overrides settings."""
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
        # more than the 50 ms production default; a timeout would take the failure mode and
        # skew numbers.
        DJANGO_THROTTLE_REDIS_OPTIONS=(
            {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}
            if redis_options is None
            else redis_options
        ),
        DJANGO_THROTTLE_USAGE_RETENTION_DAYS=7 if count_usage else 0,
        **(extra_settings or {}),
    )
    django.setup()


def run(args: argparse.Namespace, redis_url: str, prefix: str) -> dict[str, Any]:
    from bench_paths import DRF_RATE, URLCONF

    configure_django(
        redis_url,
        prefix,
        count_usage=not args.no_usage,
        drf_rate=DRF_RATE,
        extra_settings={
            "ROOT_URLCONF": URLCONF,
            "MIDDLEWARE": ["django_throttle.middleware.RateLimitHeadersMiddleware"],
            "ALLOWED_HOSTS": ["*"],
        },
    )
    import redis
    from bench_costs import Server, account
    from bench_latency import added_latency
    from bench_meter import interleave, percentile, ratio_median, run_slice
    from bench_paths import build_paths, create_policy, prefill_drf
    from django.db import connection

    from django_throttle.backends import get_backend, reset_backend_cache
    from django_throttle.policy import live as policy_module

    errors = _ErrorCounter()
    logging.getLogger("django_throttle").addHandler(errors)
    phases: dict[str, float] = {}
    clock = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal clock
        phases[name] = time.perf_counter() - clock
        clock = time.perf_counter()

    fixtures = create_policy(args.users)
    phase("fixtures")
    policy_module.reset()
    plain = redis.Redis.from_url(redis_url)
    server = Server(redis.Redis.from_url(redis_url))
    server.calibrate()
    ctx: dict[str, Any] = {
        "plain": plain,
        "backend": get_backend(),
        "fixtures": fixtures,
        "prefix": prefix,
        "server": server,
    }
    drf_prefill = prefill_drf(ctx, min(args.drf_clients, args.users))
    paths = build_paths(ctx)
    phase("drf_prefill")
    for path in paths:  # warm-up: script load, policy compile, connections, caches
        run_slice(path, min(0.3, args.seconds / 5))
        path.rates.clear()
        path.samples.clear()
    phase("warm_up")
    accounting = {
        path.key: account(path, args.accounting, server, connection, max_seconds=3.0)
        for path in paths
    }
    phase("accounting")
    rounds = interleave(paths, args.seconds, args.slice)
    phase("timed")
    latency = added_latency(args.latency_pairs, args.latency_repetitions)
    phase("latency")

    by_key = {path.key: path for path in paths}
    ping = by_key["ping"]
    results: dict[str, Any] = {}
    for path in paths:
        results[path.key] = {
            "label": path.label,
            "decisions_per_s": statistics.median(path.rates),
            "rounds": path.rates,
            "vs_ping": ratio_median(path.rates, ping.rates),
            "p50_us": percentile(path.samples, 0.5) / 1e3,
            "p99_us": percentile(path.samples, 0.99) / 1e3,
            "timed_calls": len(path.samples),
            **accounting[path.key],
        }
    results["full_user_new"]["vs_anon"] = ratio_median(
        by_key["full_user_new"].rates, by_key["full_anon"].rates
    )
    results["latency"] = latency
    targets = []
    for label, key, name, comparison, target in TARGETS:
        value = results[key].get(name)
        met = value is not None and (value >= target if comparison == ">=" else value <= target)
        targets.append(
            {"target": label, "value": value, "comparison": comparison, "goal": target, "met": met}
        )
    floor = [{"context": label, "value": results[key].get(name)} for label, key, name in FLOOR]

    profile_text = profile(by_key["full_anon"], args.seconds) if args.profile else None
    phase("profile")
    users_source = by_key["full_user_new"].source
    version = server.client.info("server").get("redis_version")
    reset_backend_cache()
    ctx["raw_socket"].close()
    server.client.close()
    plain.close()
    return {
        "redis": {"version": version, "url": redis_url, "key_prefix": prefix},
        "load_average": os.getloadavg(),
        "one_cpu": args.one_cpu,
        "cpus": os.cpu_count(),
        "seconds_per_path": args.seconds,
        "rounds": rounds,
        "fixtures": fixtures,
        "never_seen_users": {
            "used": users_source.handed_out,
            "wrapped": users_source.wrapped,
        },
        "drf": {**drf_prefill, "denied": ctx["drf_denied"][0]},
        "paths": results,
        "targets": targets,
        "floor": floor,
        "backend_errors_logged": errors.count,
        "phase_seconds": phases,
        "profile": profile_text,
    }


def profile(path: Any, seconds: float) -> str:
    """cProfile the steps of one path (items built first, outside the profile)."""
    items = path.source.take(max(100, int(path.last_rate * min(seconds, 3.0))))
    profiler = cProfile.Profile()
    profiler.enable()
    for item in items:
        path.step(item)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    return f"{len(items)} decisions of {path.label}\n{out.getvalue()}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per path")
    parser.add_argument("--users", type=int, default=100_000, help="users in the database")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument("--profile", action="store_true", help="cProfile path 3a, top 25")
    parser.add_argument("--slice", type=float, default=0.2, help="seconds per interleaved slice")
    parser.add_argument(
        "--accounting", type=int, default=3000, help="decisions per path counted for bytes etc."
    )
    parser.add_argument("--drf-clients", type=int, default=10_000, help="DRF users prefilled")
    parser.add_argument("--latency-pairs", type=int, default=2000, help="path 5 request pairs")
    parser.add_argument("--latency-repetitions", type=int, default=3)
    parser.add_argument(
        "--no-usage",
        action="store_true",
        help="count no usage (DJANGO_THROTTLE_USAGE_RETENTION_DAYS = 0): what usage costs",
    )
    parser.add_argument(
        "--one-cpu",
        action="store_true",
        help="pin this process and its own redis-server to CPU 0 (no cross-CPU wake-ups)",
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.users < 10 or args.accounting < 1:
        parser.error("--seconds must be positive, --users at least 10, --accounting at least 1")
    if args.one_cpu and not hasattr(os, "sched_setaffinity"):
        parser.error("--one-cpu needs os.sched_setaffinity (Linux)")

    # Our own server gets the production prefix (bytes and key sizes as deployed); a shared
    # REDIS_URL a random one, deleted afterwards.
    prefix = f"dtbench{uuid.uuid4().hex[:10]}"
    private = None
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        prefix = "dt"
        from example_project.private_redis import PrivateRedis

        # DEBUG SET-ACTIVE-EXPIRE holds expiry while memory is measured (see bench_meter).
        private = PrivateRedis(extra_args=("--enable-debug-command", "local")).start()
        redis_url = private.url
        if args.one_cpu and private.pid is not None:
            os.sched_setaffinity(private.pid, {0})
            os.sched_setaffinity(0, {0})
    elif args.one_cpu:
        parser.error("--one-cpu pins the benchmark's own redis-server: not with REDIS_URL")
    try:
        result = run(args, redis_url, prefix)
    finally:
        if private is not None:
            private.stop()
        else:
            _delete_keys(redis_url, prefix)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        from bench_report import print_table

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
