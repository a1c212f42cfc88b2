"""How fast is ``manage.py throttle_usage`` over 100,000 distinct clients, and what does usage
counting cost in Redis memory per tier x endpoint x minute?

Run from the repository root::

    .venv/bin/python bench/bench_usage.py [--clients 100000] [--minutes 60] [--json]
    .venv/bin/python bench/bench_usage.py --top-clients 100000   # keep every client
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/bench_usage.py

One run starts a private ``redis-server`` (never any other Redis), configures Django with a
throwaway database (a SQLite file, or a new ``dt_bench_<random>`` database on the
``DATABASE_URL`` PostgreSQL server, dropped at the end), and drives ``--clients`` distinct
clients through ``RedisBackend.hit(..., usage=field)`` (the real counting script) spread over
the last ``--minutes`` minutes (the test-only ``now`` argument places each decision in its
minute) and ``--tiers`` x ``--endpoints`` usage fields; every tenth client is also denied once.

Then it times (median of ``--repeat`` runs) the report read from Redis (``--since 1h`` by
client, tier and endpoint), the rollup (``--rollup``) and the same reports read from the
database after it, checks that the totals match the decisions made, and measures memory:
``used_memory`` before and after, ``MEMORY USAGE`` of every usage key, and, in a separate pass
per shape, bytes per tier x endpoint x minute of the exact counters (clients spread over all
shards, the worst case) and bytes per minute of full top-client lists.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_assignments import throwaway_database  # noqa: E402  (after the path setup)

ALLOW_RATE = "1000000/s"
DENY_RATE = "1/h"


def configure(database: dict[str, Any], redis_url: str, top_clients: int) -> None:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-only-not-secret",
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        DATABASES={"default": database},
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "django_throttle"],
        DJANGO_THROTTLE_REDIS_URL=redis_url,
        DJANGO_THROTTLE_KEY_PREFIX="dtb",
        DJANGO_THROTTLE_REDIS_OPTIONS={"socket_timeout": 2.0, "socket_connect_timeout": 2.0},
    )
    django.setup()
    from django_throttle.backends import usage_store

    usage_store.TOP_CLIENTS = top_clients  # a knob of the package, turned for this run
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def drive(clients: int, minutes: int, fields: list[str], now_minute: int) -> dict[str, Any]:
    """One decision per client (two for every tenth: allowed, then denied) in its minute."""
    from django_throttle.backends import get_backend
    from django_throttle.rates import Limit

    backend = get_backend()
    allow = (Limit.build("allow", ALLOW_RATE),)
    deny = (Limit.build("deny", DENY_RATE),)
    allowed = denied = 0
    started = time.perf_counter()
    for i in range(clients):
        client = f"ip:10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
        field = fields[i % len(fields)]
        at = (now_minute - minutes + i % minutes) * 60 + 30.0
        if i % 10:
            allowed += backend.hit(client, allow, usage=field, now=at).allowed
        else:
            allowed += backend.hit(client, deny, usage=field, now=at).allowed
            denied += not backend.hit(client, deny, usage=field, now=at).allowed
    seconds = time.perf_counter() - started
    decisions = allowed + denied
    return {"decisions": decisions, "allowed": allowed, "denied": denied, "seconds": seconds}


def timed(args: list[str], repeat: int) -> tuple[float, str]:
    """Median seconds of ``throttle_usage *args`` and its last output."""
    from django.core.management import call_command

    times, out = [], ""
    for _ in range(repeat):
        buffer = io.StringIO()
        started = time.perf_counter()
        call_command("throttle_usage", *args, stdout=buffer, stderr=io.StringIO())
        times.append(time.perf_counter() - started)
        out = buffer.getvalue()
    return statistics.median(times), out


def usage_keys(client: Any, pattern: str) -> list[bytes]:
    """Usage keys matching ``pattern`` (not limit keys: those hold a ':' after the tag)."""
    keys = client.scan_iter(match=pattern, count=1000)
    return [key for key in keys if b":" not in key.partition(b"}")[2]]


def memory_of(client: Any, keys: list[bytes]) -> int:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
    return sum(n or 0 for n in pipe.execute())


def shapes(client: Any) -> list[dict[str, Any]]:
    """Bytes of the exact counters per tier x endpoint x minute, per shape, and of the
    top-client lists: each shape under its own prefix, one minute, every shard."""
    from unittest.mock import patch

    from django.test.utils import override_settings

    from django_throttle.backends import usage_store
    from django_throttle.backends.redis import RedisBackend
    from django_throttle.rates import Limit

    allow = (Limit.build("allow", ALLOW_RATE),)
    deny = (Limit.build("deny", DENY_RATE),)
    results = []
    # (pairs, outcomes, clients per pair, TOP_CLIENTS): 48 clients per pair put every
    # pair in every shard (the worst case for the hashes); 300 x 2 outgrows a listpack hash
    # (hash-max-listpack-entries); 10,000 clients with a top of 10,000 outgrow listpack lists.
    for pairs, outcomes, per_pair, top in (
        (1, 1, 48, 1000),
        (8, 2, 48, 1000),
        (32, 2, 48, 1000),
        (32, 5, 48, 1000),
        (100, 2, 48, 1000),
        (300, 2, 48, 1000),
        (1, 1, 10_000, 10_000),
    ):
        with (
            override_settings(DJANGO_THROTTLE_KEY_PREFIX=f"dtm{pairs}x{outcomes}x{per_pair}"),
            patch.object(usage_store, "TOP_CLIENTS", top),
        ):
            backend = RedisBackend(client)
        tags = backend.shard_tags()
        at = (time.time() // 60) * 60 + 30.0
        for pair in range(pairs):
            field = f"tier{pair % 4}|endpoint-{pair}"
            for c in range(per_pair):
                who = f"ip:192.{pair}.{c >> 8}.{c & 255}"
                if outcomes == 1:
                    backend.hit(who, allow, usage=field, now=at)
                else:
                    backend.hit(who, deny, usage=field, now=at)
                    backend.hit(who, deny, usage=field, now=at)
        hashes = [k for tag in tags for k in usage_keys(client, f"{tag}u*")]
        if outcomes == 5:  # the other letters, as a push of degraded counts writes them
            for key in hashes:
                for pair in range(pairs):
                    for letter in "soc":
                        client.hincrby(key, f"{letter}tier{pair % 4}|endpoint-{pair}", 1)
        tops = [k for tag in tags for k in usage_keys(client, f"{tag}t*")]
        members = sum(client.zcard(k) for k in tops)
        hash_bytes = memory_of(client, hashes)
        top_bytes = memory_of(client, tops)
        results.append(
            {
                "pairs": pairs,
                "outcomes": outcomes,
                "clients": pairs * per_pair,
                "top_clients": top,
                "shards": len(tags),
                "hash_bytes": hash_bytes,
                "bytes_per_pair_minute": round(hash_bytes / pairs),
                "encoding": client.object("encoding", hashes[0]).decode(),
                "top_encoding": client.object("encoding", tops[0]).decode(),
                "top_lists": len(tops),
                "top_members": members,
                "top_bytes": top_bytes,
                "bytes_per_top_member": round(top_bytes / members),
            }
        )
        backend.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--tiers", type=int, default=4)
    parser.add_argument("--endpoints", type=int, default=8)
    parser.add_argument("--top-clients", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.minutes <= 170:
        parser.error("--minutes must be within 1-170 (the counters live 3 hours)")

    import redis

    from example_project.private_redis import PrivateRedis

    server = PrivateRedis().start()
    try:
        with throwaway_database(os.environ.get("DATABASE_URL")) as database:
            configure(database, server.url, args.top_clients)
            result = run(args, redis.Redis.from_url(server.url))
    finally:
        server.stop()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        show(result)
    return 0


def run(args: argparse.Namespace, client: Any) -> dict[str, Any]:
    from django.db import connection

    fields = [f"tier{t}|endpoint-{e}" for t in range(args.tiers) for e in range(args.endpoints)]
    now_minute = int(client.time()[0]) // 60
    before = client.info("memory")["used_memory"]
    driven = drive(args.clients, args.minutes, fields, now_minute)
    after = client.info("memory")["used_memory"]
    keys = usage_keys(client, "dtb:{*}[ut]*")
    result: dict[str, Any] = {
        "redis": client.info("server")["redis_version"],
        "database": connection.vendor,
        "clients": args.clients,
        "minutes": args.minutes,
        "fields": len(fields),
        "top_clients": args.top_clients,
        "drive": driven,
        "usage_keys": len(keys),
        "usage_key_bytes": memory_of(client, keys),
        "used_memory_delta": after - before,
        "timings": {},
    }
    expected = driven["decisions"]
    for phase in ("redis", "database"):
        if phase == "database":
            seconds, out = timed(["--rollup"], 1)
            result["timings"]["rollup"] = seconds
            result["rollup"] = out.strip()
        for group in ("client", "tier", "endpoint"):
            cmd = ["--since", "1h", "--by", group, "--format", "json", "--top", "20"]
            seconds, out = timed(cmd, args.repeat)
            result["timings"][f"{phase} --by {group}"] = seconds
        # Untimed: every decision is there (2h: the clock moved on while this ran).
        _, out = timed(["--since", "2h", "--by", "tier", "--format", "json"], 1)
        total = sum(row["total"] for row in json.loads(out))
        assert total == expected, f"{phase}: tier totals {total} != {expected}"
        result[f"{phase}_total"] = total
    result["shapes"] = shapes(client)
    return result


def show(result: dict[str, Any]) -> None:
    drive = result["drive"]
    print(
        f"Redis {result['redis']}, {result['database']}; {result['clients']:,} distinct clients "
        f"over {result['minutes']} minutes, {result['fields']} tier x endpoint fields, "
        f"TOP_CLIENTS={result['top_clients']:,}"
    )
    print(
        f"driven: {drive['decisions']:,} decisions ({drive['denied']:,} denied) in "
        f"{drive['seconds']:.1f} s ({drive['decisions'] / drive['seconds']:,.0f}/s, one process)"
    )
    print(
        f"usage keys: {result['usage_keys']:,}, MEMORY USAGE {result['usage_key_bytes']:,} B; "
        f"used_memory grew {result['used_memory_delta']:,} B (limit keys included)"
    )
    print(result.get("rollup", ""))
    print("throttle_usage --since 1h (median seconds):")
    for name, seconds in result["timings"].items():
        print(f"  {name:<24} {seconds:8.3f}")
    print("memory of one minute, every shard seeing every tier x endpoint pair:")
    print(
        "  pairs outc. clients   top | hashes      B  B/pair/min | lists members       B  B/member"
    )
    for s in result["shapes"]:
        print(
            f"  {s['pairs']:>5} {s['outcomes']:>5} {s['clients']:>7,} {s['top_clients']:>5,} |"
            f" {s['encoding']:>8} {s['hash_bytes']:>7,} {s['bytes_per_pair_minute']:>10,} |"
            f" {s['top_lists']:>5} {s['top_members']:>7,} {s['top_bytes']:>8,}"
            f" {s['bytes_per_top_member']:>4,} {s['top_encoding']}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
