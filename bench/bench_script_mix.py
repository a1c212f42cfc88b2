"""What defining every algorithm in the counting script costs each decision, in server time.

Run from the repository root::

    .venv/bin/python bench/bench_script_mix.py [--calls 2000] [--laps 15] [--json]

Redis runs a script's whole body on each ``EVALSHA``: every ``local function`` and algorithm
table it defines is built again per call. The backend therefore sends, per limit list, a
script holding only that list's algorithms (``RedisBackend._calls``). This benchmark sends
the same decisions through two framings of the same backend on one private
``redis-server``: the script the backend uses ("own mix") and the script holding all seven
algorithms (as every decision ran before), in alternating laps of ``--calls`` fresh clients,
one limit of each algorithm in turn (usage is counted in the process, never by this call).
Each lap's server time per call comes from ``INFO commandstats`` (``usec`` of ``evalsha``,
which includes the commands the script ran); the table gives the median lap, and the same
for two baselines in the same laps: a ``PING`` and a minimal token bucket of the benchmark's
own (see ``bench_paths.MINIMAL_BUCKET``, 15 lines of Lua), each sent by redis-py's
``execute_command``. For the token bucket, a third framing in the same laps: the same decision
written flat for that one algorithm and one limit (``bench/flat_token_bucket.lua``: the same
arguments, checks, state and placeholder ``SET``, no functions or tables), which shows what
the shared driver costs; and on servers with functions, the package's own mix as the package
calls it, a function library (``FUNCTION LOAD``, called with ``FCALL``: "defined once").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT, ROOT / "bench"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

ALGORITHMS = (
    "token_bucket",
    "gcra",
    "leaky_bucket",
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "calendar_quota",
)


def run(args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    from bench_throttle import configure_django

    configure_django(redis_url, "dt")
    from functools import partial

    import redis
    from bench_paths import MINIMAL_BUCKET

    from django_throttle.backends import get_backend
    from django_throttle.backends.redis import Calls
    from django_throttle.backends.scripts import (
        ALGORITHM_FILES,
        SCRIPT_FILES,
        load_script,
    )
    from django_throttle.rates import Limit

    plain = redis.Redis.from_url(redis_url)
    backend = get_backend()
    every = load_script(SCRIPT_FILES)
    framings = {
        "own mix": backend._calls,
        "all seven": Calls(partial(lambda source, codes: source, every), backend.shards),
    }
    minimal = plain.script_load(MINIMAL_BUCKET)
    flat = plain.script_load((ROOT / "bench" / "flat_token_bucket.lua").read_text("utf-8"))
    functions = has_functions(plain)
    rate = "1000/hour"
    counter = iter(range(10**9))

    def lap(send: Any) -> float:
        plain.config_resetstat()
        for _ in range(args.calls):
            send(next(counter))
        stats = plain.info("commandstats")
        row = (
            stats.get("cmdstat_evalsha") or stats.get("cmdstat_fcall") or stats.get("cmdstat_ping")
        )
        return float(row["usec"]) / int(row["calls"])

    results: dict[str, Any] = {}
    for algorithm in ALGORITHMS:
        chosen = "10000/month" if algorithm == "calendar_quota" else rate
        limits = (Limit.build("t12", chosen, algorithm=algorithm),)
        once = functions and define_once(plain, backend._calls, limits)
        written_flat = algorithm == "token_bucket"
        names = (
            *framings,
            *(["defined once"] if once else []),
            *(["flat"] if written_flat else []),
            "ping",
            "minimal",
        )
        laps: dict[str, list[float]] = {name: [] for name in names}

        def decide(
            calls: Any,
            n: int,
            limits: Any = limits,
            send: Any = plain.evalsha,
            script: str | None = None,
        ) -> None:
            """One decision for client ``n``, its keys and arguments framed by ``calls``,
            sent as ``send(script, ...)``: the framing's own script by default."""
            encoded = calls.encoded(limits)
            tag = backend._client_tag(f"ip:10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}")[1]
            keys = calls.keys(encoded, tag)
            send(script or encoded.sha, len(keys), *keys, b"1", b"0", *encoded.specs)

        for calls in framings.values():  # load each script once, outside the laps
            plain.script_load(calls.script(limits)[1])
            decide(calls, next(counter))
        for _ in range(args.laps):
            for name, calls in framings.items():
                laps[name].append(lap(partial(decide, calls)))
            if once:
                laps["defined once"].append(
                    lap(partial(decide, backend._calls, send=plain.fcall, script=once))
                )
            if written_flat:
                laps["flat"].append(lap(partial(decide, backend._calls, script=flat)))
            laps["ping"].append(lap(lambda n: plain.execute_command("PING")))
            laps["minimal"].append(
                lap(
                    lambda n: plain.execute_command(
                        "EVALSHA", minimal, 1, f"dt-mb:{n}", 1000, 3.6e6, 1
                    )
                )
            )
        medians = {name: statistics.median(values) for name, values in laps.items()}
        medians["saved_us"] = medians["all seven"] - medians["own mix"]
        medians["saved_share"] = medians["saved_us"] / medians["all seven"]
        medians["own mix / minimal"] = medians["own mix"] / medians["minimal"]
        if once:
            medians["defined once / minimal"] = medians["defined once"] / medians["minimal"]
        if written_flat:
            medians["flat / minimal"] = medians["flat"] / medians["minimal"]
        results[algorithm] = medians
    version = plain.info("server").get("redis_version")
    plain.close()
    if functions:
        plain.function_flush()
    return {
        "redis": version,
        "functions": functions,
        "calls_per_lap": args.calls,
        "laps": args.laps,
        "realtime": args.realtime,
        "algorithm_files": len(ALGORITHM_FILES),
        "server_us_per_call": results,
    }


def has_functions(client: Any) -> bool:
    """Whether the server has Redis functions (``FUNCTION LOAD`` / ``FCALL``: Redis 7, Valkey)."""
    try:
        client.function_list()
    except Exception:
        return False
    return True


def define_once(client: Any, calls: Any, limits: Any) -> str:
    """Load the counting script of ``limits``' algorithms as the package loads it, a function
    library (``scripts.library``: the prelude and the algorithm files run once, at load; the
    driver is the function's body). Returns the function's name."""
    from django_throttle.backends.scripts import function_name, library

    sha, source = calls.script(limits)
    client.function_load(library(sha, source), replace=True)
    return function_name(sha)


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=(
            "Server time per decision (µs, median of "
            f"{result['laps']} laps x {result['calls_per_lap']:,} calls, INFO commandstats"
            + ("; redis-server real-time)" if result.get("realtime") else ")")
        )
    )
    once = result["functions"]
    columns = ["algorithm", "own mix", "all seven", "saved", "minimal bucket", "PING"]
    columns += ["own mix ÷ minimal"] + (["defined once", "defined once ÷ minimal"] if once else [])
    for column in columns:
        table.add_column(column, justify="left" if column == "algorithm" else "right")
    for algorithm, row in result["server_us_per_call"].items():
        cells = [
            algorithm,
            f"{row['own mix']:.1f}",
            f"{row['all seven']:.1f}",
            f"{row['saved_us']:.1f} ({row['saved_share']:.0%})",
            f"{row['minimal']:.1f}",
            f"{row['ping']:.2f}",
            f"{row['own mix / minimal']:.2f}",
        ]
        if once:
            cells += [f"{row['defined once']:.1f}", f"{row['defined once / minimal']:.2f}"]
        table.add_row(*cells)
    Console().print(table)
    bucket = result["server_us_per_call"].get("token_bucket", {})
    if "flat" in bucket:
        Console().print(
            f"token bucket written flat (bench/flat_token_bucket.lua: the same work, no "
            f"functions or tables): {bucket['flat']:.1f} µs, "
            f"{bucket['flat / minimal']:.2f}x the minimal bucket; the package's script "
            f"{bucket['own mix / minimal']:.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="decisions per lap")
    parser.add_argument("--laps", type=int, default=15, help="laps per framing and algorithm")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--realtime",
        action="store_true",
        help=(
            "run the private redis-server under SCHED_FIFO (needs root or CAP_SYS_NICE): "
            "its command times then leave out the time other processes held its CPU"
        ),
    )
    args = parser.parse_args(argv)
    if args.calls < 1 or args.laps < 1:
        parser.error("--calls and --laps must be at least 1")
    if args.realtime and not hasattr(os, "sched_setscheduler"):
        parser.error("--realtime needs os.sched_setscheduler (Linux)")
    from example_project.private_redis import PrivateRedis

    # CONFIG RESETSTAT clears the server's statistics: only on a server of our own.
    private = PrivateRedis().start()
    try:
        if args.realtime:
            try:
                os.sched_setscheduler(private.pid, os.SCHED_FIFO, os.sched_param(50))
            except (OSError, TypeError) as exc:
                parser.error(f"--realtime: cannot make redis-server real-time ({exc})")
        result = run(args, private.url)
    finally:
        private.stop()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
