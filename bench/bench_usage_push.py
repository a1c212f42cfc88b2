"""What pushing a process's usage counts costs Redis, per pushed decision.

Run from the repository root::

    .venv/bin/python bench/bench_usage_push.py [--clients 10000] [--laps 7] [--json]

Each lap pushes one batch as a process's :class:`~django_throttle.backends.redis.Tally` would
hand it over after a second of traffic: ``--clients`` decisions, each of a distinct client
(``ip:`` labels spread over the key shards), all allowed under one usage field in one minute,
through ``UsageStore.push`` (one pipelined round trip of ``usage_push.lua`` calls). The server's
time comes from ``INFO commandstats`` (``usec`` of ``evalsha``, which includes the commands the
script ran) and the bytes from ``INFO stats`` (``total_net_input_bytes`` +
``total_net_output_bytes``), each divided by the decisions pushed; the table gives the median
lap. It only drives ``UsageStore.push``, so the same file copied into an older tree's
``bench/`` measures that tree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT, ROOT / "bench"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def run(args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    from bench_throttle import configure_django

    configure_django(redis_url, "dt")
    import redis

    from django_throttle.backends import get_backend
    from django_throttle.usage import accounting as usage

    plain = redis.Redis.from_url(redis_url)
    store = usage.get_store(get_backend())
    minute = int(time.time() // 60)
    laps: dict[str, list[float]] = {"server_us": [], "bytes": [], "seconds": []}
    for lap in range(args.laps + 1):  # the first lap loads the script, untimed
        counts = [
            (minute, "anonymous|api", f"ip:10.{lap}.{n >> 8 & 255}.{n & 255}", "a", 1)
            for n in range(args.clients)
        ]
        plain.config_resetstat()
        before = plain.info("stats")
        started = time.perf_counter()
        store.push(uuid.uuid4().hex, counts)
        elapsed = time.perf_counter() - started
        after = plain.info("stats")
        row = plain.info("commandstats").get("cmdstat_evalsha", {"usec": 0})
        if lap == 0:
            continue
        moved = sum(
            after[name] - before[name]
            for name in ("total_net_input_bytes", "total_net_output_bytes")
        )
        laps["server_us"].append(float(row["usec"]) / args.clients)
        laps["bytes"].append(moved / args.clients)
        laps["seconds"].append(elapsed)
    version = plain.info("server").get("redis_version")
    plain.close()
    return {
        "redis": version,
        "clients_per_push": args.clients,
        "laps": args.laps,
        "server_us_per_pushed_decision": statistics.median(laps["server_us"]),
        "bytes_per_pushed_decision": statistics.median(laps["bytes"]),
        "push_seconds": statistics.median(laps["seconds"]),
        "each_lap": laps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10_000, help="decisions per push")
    parser.add_argument("--laps", type=int, default=7, help="pushes timed")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.laps < 1:
        parser.error("--clients and --laps must be at least 1")
    from example_project.private_redis import PrivateRedis

    # CONFIG RESETSTAT clears the server's statistics: only on a server of our own.
    private = PrivateRedis().start()
    try:
        result = run(args, private.url)
    finally:
        private.stop()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['clients_per_push']:,} distinct clients per push, median of "
            f"{result['laps']} pushes (Redis {result['redis']}): "
            f"{result['server_us_per_pushed_decision']:.2f} µs of script time and "
            f"{result['bytes_per_pushed_decision']:.1f} bytes per pushed decision, "
            f"{result['push_seconds'] * 1000:.0f} ms per push"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
