"""What each counting algorithm costs in Redis: decisions/s, script time and bytes per key.

Run from the repository root::

    .venv/bin/python bench/bench_algorithms.py [--seconds 3] [--clients 100000] [--json]

One run starts a private ``redis-server`` (the production key prefix ``dt`` and limit id
``t12``, so keys and bytes are as deployed), configures Django in-process, then measures:

- a PING on a plain redis-py client, and a minimal token bucket of the benchmark's own by
  ``execute_command("EVALSHA")`` (see ``bench_paths.MINIMAL_BUCKET``): the floors;
- ``RedisBackend.hit()`` with one limit of each algorithm, ``--clients`` distinct clients
  taken in turn (each new until all were used, then again);
- per path, an untimed pass of fresh clients (``bench_costs.account``): round trips, bytes on
  the wire, ``MEMORY USAGE`` of the keys written and ``used_memory`` growth per client; then
  the server's own time per ``EVALSHA`` (``INFO commandstats``, in laps taken in turn);
- the sliding window log at limits of 10 to 10,000: one log filled to its limit, then
  requests at the limit's own rate (each allowed, each trimming one expired entry) and at a
  full log (each denied), with ``now=`` so the log stays full: time per call and bytes.

Paths run in interleaved slices (``bench_meter.interleave``); decisions/s are medians over
rounds, ratios medians of each round's ratio. Targets are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT, ROOT / "bench"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from bench_meter import Path as BenchPath  # noqa: E402
from bench_meter import Source, constant, interleave, percentile, ratio_median, run_slice  # noqa: E402

#: The limit id of every key, short as the policy makes them.
LIMIT_ID = "t12"
#: The nominal limit of every algorithm; the calendar quota needs a whole calendar unit.
RATE = "1000/hour"
CALENDAR_RATE = "1000/day"
LOG = "sliding_window_log"
LOG_LIMITS = (10, 100, 1000, 10000)
#: Algorithms whose work per request grows with the limit: not held to the O(1) target.
NOT_CONSTANT = (LOG,)
MEMORY_TARGETS = {"token_bucket": 88, "gcra": 72}


def build_limit(algorithm: str, rate: str | None = None) -> Any:
    from django_throttle.rates import Limit

    default = CALENDAR_RATE if algorithm == "calendar_quota" else RATE
    return Limit.build(LIMIT_ID, rate or default, algorithm=algorithm)


def address(n: int, first: int) -> str:
    return f"{first}.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"


def build_paths(plain: Any, backend: Any, algorithms: Sequence[str], clients: int) -> list[Any]:
    """PING, the minimal EVALSHA and one ``hit()`` path per algorithm, each over its own
    ``clients`` distinct clients."""
    from bench_paths import MINIMAL_BUCKET

    sha = plain.execute_command("SCRIPT", "LOAD", MINIMAL_BUCKET)
    sha = sha.decode() if isinstance(sha, bytes) else sha
    interval = 3600 * 1e6 / 1000

    def ping(_: object) -> object:
        return plain.execute_command("PING")

    def evalsha(args: tuple[Any, ...]) -> object:
        return plain.execute_command(*args)

    def hit(args: tuple[str, Any]) -> object:
        return backend.hit(*args)

    def evalsha_args(start: int, n: int) -> list[Any]:
        return [
            ("EVALSHA", sha, 1, f"dt-mb:{i}", 1000, interval, 1) for i in range(start, n + start)
        ]

    state = ("evalsha", "eval", "fcall")
    paths = [
        BenchPath("ping", "PING (redis-py)", ping, constant(None)),
        BenchPath("evalsha", "minimal EVALSHA", evalsha, Source(evalsha_args, clients), state),
    ]
    for number, algorithm in enumerate(algorithms):
        limits = (build_limit(algorithm),)  # one tuple: the backend frames it once

        def make(start: int, n: int, first: int = 100 + number, limits: Any = limits) -> list[Any]:
            return [(f"ip:{address(i, first)}", limits) for i in range(start, start + n)]

        paths.append(BenchPath(algorithm, f"hit() {algorithm}", hit, Source(make, clients), state))
    return paths


class ScriptClock:
    """The server's own time per EVALSHA (the script and the commands it ran) from
    ``INFO commandstats``, read in laps: the median lap shrugs off one preempted on a shared
    machine. (SLOWLOG at threshold 0 would time every call, but Redis 7 logs each command a
    script runs too, which slows the very script being timed.)"""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.laps: list[tuple[float, int]] = []

    def start(self) -> None:
        self.laps = []
        self.client.config_resetstat()

    def lap(self) -> None:
        found = self.client.info("commandstats")
        self.client.config_resetstat()
        # The minimal bucket's EVALSHA, or the package's FCALL: one of them per lap.
        stats = found.get("cmdstat_fcall") or found.get("cmdstat_evalsha")
        if stats:
            self.laps.append((float(stats["usec"]), int(stats["calls"])))

    def read(self) -> dict[str, float | None]:
        """The laps so far: median µs per call over laps, and the mean over all calls."""
        laps = [(usec, calls) for usec, calls in self.laps if calls]
        calls = sum(calls for _, calls in laps)
        return {
            "script_us": statistics.median(usec / n for usec, n in laps) if laps else None,
            "script_us_mean": sum(usec for usec, _ in laps) / calls if calls else None,
            "script_calls": calls,
        }

    def interleaved(
        self, paths: Sequence[Any], calls: int, rounds: int = 10
    ) -> dict[str, dict[str, float | None]]:
        """``calls`` more decisions per path (fresh clients), timed by the server in
        ``rounds`` laps per path taken in turn, so drift in the machine's load hits all
        paths alike."""
        items = {path.key: path.source.take(calls) for path in paths}
        laps: dict[str, list[tuple[float, int]]] = {path.key: [] for path in paths}
        every = max(1, calls // rounds)
        for number in range(rounds):
            for path in paths:
                self.start()
                for item in items[path.key][number * every : (number + 1) * every]:
                    path.step(item)
                self.lap()
                laps[path.key].extend(self.laps)
        result = {}
        for key, taken in laps.items():
            self.laps = taken
            result[key] = self.read()
        return result


def log_costs(
    backend: Any, client: Any, clock: ScriptClock, limits: Sequence[int], requests: int
) -> list[dict[str, Any]]:
    """Per limit C, one log filled with C entries spread over the last period; then calls at
    the rate C/period (each allowed, each trimming one entry: the log stays at C), then calls
    at the instant of the last one (each denied). Each phase makes ``requests`` calls timed
    here, then as many timed by the server, in ten laps taking the limits in turn; a lap of
    token bucket calls (fresh clients) follows each log's client-timed lap, as a reference
    that saw the same load."""
    logs, rows = [], []
    for count in limits:
        limit = (build_limit(LOG, f"{count}/hour"),)
        who, step, start = f"log-{count}", 3600 / count, time.time()
        for i in range(count):  # the oldest entry expires with the first allowed call
            backend.hit(who, limit, now=start - 3600 + (i + 1) * step)
        key = backend.key(who, limit[0])
        size = int(client.memory_usage(key, samples=0))
        logs.append({"limit": limit, "who": who, "step": step, "start": start, "key": key, "j": 0})
        rows.append({"limit": count, "memory_usage": size, "bytes_per_entry": size / count})
    lap = max(1, requests // 10)
    bucket, made = (build_limit("token_bucket"),), 0
    for phase in ("allowed", "denied"):
        reference: list[int] = []
        samples: list[list[int]] = [[] for _ in logs]
        laps: list[list[tuple[float, int]]] = [[] for _ in logs]
        expected = [0] * len(logs)
        for server_timed in (False, True):
            for _ in range(10):
                for n, log in enumerate(logs):
                    clock.start()
                    for _ in range(lap):
                        log["j"] += phase == "allowed"
                        now = log["start"] + log["j"] * log["step"]
                        began = time.perf_counter_ns()
                        decision = backend.hit(log["who"], log["limit"], now=now)
                        if not server_timed:
                            samples[n].append(time.perf_counter_ns() - began)
                        expected[n] += decision.allowed == (phase == "allowed")
                    clock.lap()
                    if server_timed:
                        laps[n].extend(clock.laps)
                        continue
                    for _ in range(lap):
                        made += 1
                        began = time.perf_counter_ns()
                        backend.hit(f"reference-{made}", bucket, now=time.time())
                        reference.append(time.perf_counter_ns() - began)
        for n, row in enumerate(rows):
            clock.laps = laps[n]
            row.update({f"{phase}_{name}": value for name, value in clock.read().items()})
            row[f"{phase}_p50_us"] = percentile(samples[n], 0.5) / 1e3
            row[f"{phase}_vs_bucket"] = percentile(samples[n], 0.5) / percentile(reference, 0.5)
            row[f"{phase}_as_expected"] = expected[n] / (20 * lap)
    for log, row in zip(logs, rows, strict=True):
        row["entries_after"] = int(client.zcard(log["key"]))
    return rows


def run(args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    from bench_throttle import configure_django

    configure_django(redis_url, "dt", count_usage=False)
    import redis
    from bench_costs import Server, account
    from django.db import connection

    from django_throttle.backends.redis import RedisBackend
    from django_throttle.rates import Algorithm

    algorithms = [a.value for a in Algorithm if not args.only or a.value in args.only]
    plain = redis.Redis.from_url(redis_url)
    server = Server(redis.Redis.from_url(redis_url))
    server.calibrate()
    backend = RedisBackend(redis.Redis.from_url(redis_url, socket_timeout=5.0))
    paths = build_paths(plain, backend, algorithms, args.clients)
    for path in paths:  # script load, connections, limit framing
        run_slice(path, min(0.2, args.seconds / 5))
        path.rates.clear()
        path.samples.clear()
    clock = ScriptClock(server.client)
    accounting = {}
    for path in paths:
        accounting[path.key] = account(path, args.accounting, server, connection, 3.0)
    for key, timed in clock.interleaved(paths, args.accounting).items():
        accounting[key].update(timed)
    rounds = interleave(paths, args.seconds, args.slice)
    by_key = {path.key: path for path in paths}
    results: dict[str, Any] = {}
    for path in paths:
        results[path.key] = {
            "label": path.label,
            "decisions_per_s": statistics.median(path.rates),
            "vs_ping": ratio_median(path.rates, by_key["ping"].rates),
            "vs_evalsha": ratio_median(path.rates, by_key["evalsha"].rates),
            "p50_us": percentile(path.samples, 0.5) / 1e3,
            "p99_us": percentile(path.samples, 0.99) / 1e3,
            "timed_calls": len(path.samples),
            "clients_used": path.source.handed_out,
            "clients_wrapped": path.source.wrapped,
            **accounting[path.key],
        }
    log = (
        log_costs(backend, server.client, clock, args.log_limits, args.log_requests)
        if LOG in algorithms
        else []
    )
    targets = [
        target(f"{name}: hit() ÷ minimal EVALSHA", results[name]["vs_evalsha"], ">=", 0.8)
        for name in algorithms
        if name not in NOT_CONSTANT
    ] + [
        target(f"{name}: MEMORY USAGE B/key", results[name]["memory_usage_per_key"], "<=", goal)
        for name, goal in MEMORY_TARGETS.items()
        if name in algorithms
    ]
    version = server.client.info("server").get("redis_version")
    server.client.close()
    plain.close()
    return {
        "redis": {"version": version, "key_prefix": "dt", "limit_id": LIMIT_ID},
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
        "seconds_per_path": args.seconds,
        "rounds": rounds,
        "clients": args.clients,
        "rate": RATE,
        "calendar_rate": CALENDAR_RATE,
        "paths": results,
        "sliding_window_log": log,
        "targets": targets,
    }


def target(label: str, value: float | None, comparison: str, goal: float) -> dict[str, Any]:
    met = value is not None and (value >= goal if comparison == ">=" else value <= goal)
    return {"target": label, "value": value, "comparison": comparison, "goal": goal, "met": met}


def _number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def script(row: dict[str, Any], prefix: str) -> str:
    median, mean = row[f"{prefix}script_us"], row[f"{prefix}script_us_mean"]
    return "-" if median is None else f"{median:.0f} ({mean:.1f})"


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(150, Console().width))
    table = Table(
        title=(
            f"One run: {result['seconds_per_path']:g} s per path in {result['rounds']} "
            f"interleaved rounds, {result['clients']:,} distinct clients per path, Redis "
            f"{result['redis']['version']}, limit {result['rate']} (calendar quota "
            f"{result['calendar_rate']}); load average {result['load_average'][0]:.1f} on "
            f"{result['cpus']} CPUs"
        )
    )
    columns = (
        "path", "dec/s", "÷PING", "÷EVALSHA", "p50 µs", "p99 µs", "round trips", "bytes/dec",
        "script µs (mean)", "MEMORY USAGE B/key", "used_memory B/client",
    )  # fmt: skip
    for column in columns:
        table.add_column(
            column, justify="left" if column == "path" else "right", no_wrap=column == "path"
        )
    for row in result["paths"].values():
        table.add_row(
            row["label"],
            _number(row["decisions_per_s"]),
            f"{row['vs_ping']:.2f}",
            f"{row['vs_evalsha']:.2f}",
            _number(row["p50_us"], 1),
            _number(row["p99_us"], 1),
            f"{row['round_trips']:.3f}",
            _number(row["wire_bytes"]),
            script(row, ""),
            _number(row["memory_usage_per_key"]),
            _number(row["used_memory_marginal"]),
        )
    console.print(table)
    if result["sliding_window_log"]:
        log = Table(title="Sliding window log, one log at its limit (C/hour, C entries)")
        for column in (
            "limit C", "MEMORY USAGE B/key", "B/entry", "allowed p50 µs (÷ bucket)",
            "allowed script µs (mean)", "denied p50 µs (÷ bucket)", "denied script µs (mean)",
        ):  # fmt: skip
            log.add_column(column, justify="right")
        for row in result["sliding_window_log"]:
            log.add_row(
                f"{row['limit']:,}",
                _number(row["memory_usage"]),
                _number(row["bytes_per_entry"], 1),
                f"{row['allowed_p50_us']:.0f} ({row['allowed_vs_bucket']:.2f})",
                script(row, "allowed_"),
                f"{row['denied_p50_us']:.0f} ({row['denied_vs_bucket']:.2f})",
                script(row, "denied_"),
            )
        console.print(log)
    targets = Table(title="Targets (printed, never asserted)")
    for column in ("target", "measured", "goal", ""):
        targets.add_column(column, justify="left" if column == "target" else "right")
    for item in result["targets"]:
        value = item["value"]
        shown = "-" if value is None else f"{value:.2f}" if value < 10 else f"{value:,.0f}"
        verdict = "[green]met[/]" if item["met"] else "[red]not met[/]"
        targets.add_row(item["target"], shown, f"{item['comparison']} {item['goal']:g}", verdict)
    console.print(targets)
    console.print(
        "Timed: only the call (hit(), or execute_command for PING and the minimal bucket). "
        "÷PING and ÷EVALSHA: medians of each round's ratio. Round trips, bytes (server INFO "
        "net bytes), MEMORY USAGE (median of the newest keys, SAMPLES 0) and used_memory "
        "(median growth per client over ten chunks, expiry paused): an untimed pass of fresh "
        "clients. Script µs: the server's time per EVALSHA (INFO commandstats in ten laps: "
        "median lap (mean of all)) over another pass of fresh clients. The log's rows: now= "
        "keeps one log at C entries (allowed: trims one, adds one; denied: the log is full); "
        "÷ bucket: its p50 over that of token bucket calls in the same laps."
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per path")
    parser.add_argument("--slice", type=float, default=0.2, help="seconds per interleaved slice")
    parser.add_argument("--clients", type=int, default=100_000, help="distinct clients per path")
    parser.add_argument("--accounting", type=int, default=3000, help="untimed decisions per path")
    parser.add_argument(
        "--log-limits",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=LOG_LIMITS,
        help="sliding window log limits, comma-separated",
    )
    parser.add_argument("--log-requests", type=int, default=2000, help="timed calls per log phase")
    parser.add_argument("--only", nargs="*", default=(), help="algorithm values to run")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.clients < 1 or args.accounting < 1 or args.log_requests < 1:
        parser.error("--seconds, --clients, --accounting and --log-requests must be positive")

    from example_project.private_redis import PrivateRedis

    # Always a server of our own: DEBUG SET-ACTIVE-EXPIRE and CONFIG RESETSTAT touch it all.
    private = PrivateRedis(extra_args=("--enable-debug-command", "local")).start()
    try:
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
