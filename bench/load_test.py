"""Real-server load test: gunicorn (sync) and uvicorn (ASGI) serving one DRF endpoint with no
throttle, django_throttle's PolicyThrottle and DRF's AnonRateThrottle, driven by ``wrk``.

Run by hand from the repository root (never in CI)::

    .venv/bin/python bench/load_test.py            # about 8 minutes
    .venv/bin/python bench/load_test.py --quick    # about 1 minute, writes *_quick files
    .venv/bin/python bench/load_test.py --realistic --clients 2000   # 100/min, some 429s

Needs ``wrk`` (``apt-get install wrk``) and the ``bench`` extra (gunicorn, uvicorn,
matplotlib). One run starts a private ``redis-server`` on a free port, creates and migrates a
SQLite file with a default anonymous tier, starts one server per (server, variant) on free
ports, then for each repetition and concurrency runs every server in turn (the order rotates
between repetitions): a warm-up, then a measured ``wrk`` run with a random
``X-Forwarded-For`` per request (``loadproject/random_xff.lua``). Reported numbers are the
medians over repetitions. A run during which other processes used more than ``--max-foreign``
cores is rerun once the machine is quiet again (bounded by ``--retries`` and ``--patience``);
each run records that foreign CPU. Every process it started is stopped at the end, also on errors,
Ctrl-C and SIGTERM. Writes ``bench/results/<stem>.csv``, ``.png`` and ``.json`` (machine info
and every raw run).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from typing import Any

import loadkit
from loadkit import BENCH, RESULTS, ROOT
from loadproject import cpu, report
from loadproject.server import Server

LUA = BENCH / "loadproject" / "random_xff.lua"
SERVERS = ("gunicorn", "uvicorn")
VARIANTS = ("none", "policy", "drf")
#: Never reached, so every request is allowed: the runs measure overhead, not denials.
NEVER_DENY = loadkit.NEVER_DENY
REALISTIC = "100/min"


def run_wrk(url: str, connections: int, seconds: int, args: argparse.Namespace) -> dict[str, Any]:
    command = ["wrk", "-t", str(min(args.threads, connections)), "-c", str(connections)]
    command += ["-d", f"{seconds}s", "--latency", "--timeout", "10s", "-s", str(LUA), url]
    done = subprocess.run([*command, "--", str(args.clients)], capture_output=True, text=True)
    found = re.search(r"^LOADTEST_JSON (.*)$", done.stdout, re.MULTILINE)
    if done.returncode or not found:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}{done.stderr}")
    result: dict[str, Any] = json.loads(found[1])
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", done.stdout)
    result["non_2xx"] = int(non_2xx[1]) if non_2xx else 0
    result["socket_errors"] = sum(result[k] for k in ("connect", "read", "write", "timeout"))
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def check_variant(server: Server, address: str, redis: Any) -> None:
    """Fail early if a variant does not throttle the way it claims to."""
    headers = server.wait_ready(address)
    limited = "x-ratelimit-limit" in headers
    if limited != (server.variant == "policy"):
        raise RuntimeError(f"{server.name}/{server.variant}: X-RateLimit-Limit present={limited}")
    if server.variant == "drf" and not redis.exists(f"lt-drf:1:throttle_anon_{address}"):
        raise RuntimeError(f"{server.name}/drf: DRF did not count the probe in Redis")


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median over repetitions per (server, variant, concurrency), with throughput vs none."""
    cells: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for run in runs:
        cells.setdefault((run["server"], run["variant"], run["concurrency"]), []).append(run)
    rows = []
    for (server, variant, connections), group in cells.items():
        rates = [run["rps"] for run in group]
        row: dict[str, Any] = {"server": server, "variant": variant, "concurrency": connections}
        row.update(rps=statistics.median(rates), rps_min=min(rates), rps_max=max(rates))
        for key in ("p50", "p90", "p99", "max"):
            row[f"{key}_ms"] = round(statistics.median(r[f"{key}_us"] for r in group) / 1e3, 3)
        for key in ("foreign_cpu", "own_cpu", "server_cpu_us", "redis_cpu_us"):
            row[key] = statistics.median(run[key] for run in group)
        for key in ("requests", "non_2xx", "socket_errors", "server_log_problems"):
            row[key] = sum(run[key] for run in group)
        row["repetitions"] = len(group)
        rows.append(row)
    for row in rows:
        base = cells.get((row["server"], "none", row["concurrency"]))
        none = statistics.median(run["rps"] for run in base) if base else float("nan")
        row["vs_none"] = round(row["rps"] / none, 3)
        row["rps"], row["rps_min"], row["rps_max"] = (
            round(row[k], 1) for k in ("rps", "rps_min", "rps_max")
        )
    order = {name: i for i, name in enumerate(SERVERS + VARIANTS)}
    return sorted(rows, key=lambda r: (order[r["server"]], order[r["variant"]], r["concurrency"]))


def measured_run(server: Server, connections: int, args: argparse.Namespace) -> dict[str, Any]:
    """A warm-up, then a measured run; again (up to ``--retries``) while other processes used
    more than ``--max-foreign`` cores during it. Keeps the quietest attempt."""
    best: dict[str, Any] = {}
    for attempt in range(1, args.retries + 2):
        run_wrk(server.url, connections, args.warmup, args)
        with cpu.Meter(*args.ours, server.process.pid) as meter:
            run = run_wrk(server.url, connections, args.seconds, args)
        run.update(foreign_cpu=meter.foreign, own_cpu=meter.ours, attempts=attempt)
        served = max(run["requests"], 1)
        run["server_cpu_us"] = round(meter.server / served * 1e6, 1)
        run["redis_cpu_us"] = round(meter.redis_seconds / served * 1e6, 1)
        if not best or run["foreign_cpu"] < best["foreign_cpu"]:
            best = run
        if meter.foreign <= args.max_foreign:
            break
        redis_pid, groups = args.ours  # give the other work a chance to finish first
        loadkit.wait_for_quiet(redis_pid, args.max_foreign, args.patience, groups)
    return best


def measure(servers: list[Server], args: argparse.Namespace) -> list[dict[str, Any]]:
    offsets = {id(server): 0 for server in servers}
    for server in servers:  # load the policy, open connections, fill caches
        run_wrk(server.url, 16, args.warmup + 1, args)
        offsets[id(server)] = server.log_problems(0)[1]
    runs = []
    for repetition in range(args.repeat):
        shift = repetition % len(servers)
        for connections in args.concurrency:
            for server in servers[shift:] + servers[:shift]:
                run = measured_run(server, connections, args)
                problems, offsets[id(server)], first = server.log_problems(offsets[id(server)])
                run.update(server=server.name, variant=server.variant, concurrency=connections)
                run.update(repetition=repetition, server_log_problems=problems, log_line=first)
                runs.append(run)
                flag = " NON-2XX" if run["non_2xx"] else ""
                flag += f" SOCKET ERRORS {run['socket_errors']}" if run["socket_errors"] else ""
                flag += f" LOG: {first}" if problems else ""
                print(
                    f"rep {repetition + 1}/{args.repeat} c={connections:<3} {server.name:8} "
                    f"{server.variant:6} {run['rps']:6.0f} req/s  p50 {run['p50_us'] / 1e3:6.2f}"
                    f" ms  p99 {run['p99_us'] / 1e3:7.2f} ms  CPU/req {run['server_cpu_us']:4.0f}"
                    f"+{run['redis_cpu_us']:3.0f} us  cores ours {run['own_cpu']:.2f}"
                    f" others {run['foreign_cpu']:.2f} (x{run['attempts']}){flag}",
                    flush=True,
                )
    return runs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 repetition, c=1,16, 2 s runs")
    parser.add_argument("--realistic", action="store_true", help=f"limit both to {REALISTIC}")
    parser.add_argument("--seconds", type=int, default=4, help="measured seconds per run")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up seconds before each run")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (median reported)")
    parser.add_argument("--concurrency", default="1,4,16,64", help="wrk -c values")
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--workers", type=int, default=2, help="server worker processes")
    parser.add_argument("--threads", type=int, default=1, help="wrk threads (it shares CPUs)")
    parser.add_argument("--clients", type=int, default=2**24, help="distinct client addresses")
    parser.add_argument("--no-usage", action="store_true", help="django_throttle usage off")
    parser.add_argument("--max-foreign", type=float, default=0.2, help="cores; else rerun")
    parser.add_argument("--retries", type=int, default=2, help="reruns of a noisy run")
    parser.add_argument("--patience", type=int, default=15, help="s to wait for quiet, per rerun")
    parser.add_argument("--stem", help="output file stem in bench/results/")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup, args.repeat, args.concurrency = 2, 1, 1, "1,16"
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.servers = [s for s in args.servers.split(",") if s in SERVERS]
    args.variants = [v for v in args.variants.split(",") if v in VARIANTS]
    suffix = ("_realistic" if args.realistic else "") + ("_quick" if args.quick else "")
    args.stem = args.stem or f"load_test{suffix}"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    loadkit.stop_on_signals()
    rate = REALISTIC if args.realistic else NEVER_DENY
    RESULTS.mkdir(exist_ok=True)
    servers: list[Server] = []
    with loadkit.private_setup("django-throttle-load-", rate) as setup:
        env = setup.env(LOADTEST_DRF_RATE=rate, LOADTEST_USAGE="0" if args.no_usage else "1")
        import redis

        client = redis.Redis.from_url(setup.redis.url)
        try:
            for name in args.servers:
                for variant in args.variants:
                    servers.append(Server(name, variant, args.workers, env))
            for number, server in enumerate(servers, start=1):
                check_variant(server, f"192.0.2.{number}", client)
            print(f"servers up; rate {rate}; {args.clients} client addresses", flush=True)
            args.ours = (setup.redis.pid, {server.process.pid for server in servers})
            runs = measure(servers, args)
            machine = setup.machine()
        except BaseException:
            for server in servers:  # the logs go with the temporary directory
                tail = server.log.read_text(errors="replace").splitlines()[-15:]
                print(f"--- {server.log.name}:", *tail, sep="\n", file=sys.stderr)
            raise
        finally:
            for server in servers:
                server.stop()
            client.close()
    rows = summarise(runs)
    settings = {k: v for k, v in vars(args).items() if k != "ours"}
    settings.update(rate=rate, wrk_script=str(LUA.relative_to(ROOT)))
    out = RESULTS / args.stem
    report.write_csv(rows, out.with_suffix(".csv"))
    payload = {"machine": machine, "settings": settings, "summary": rows, "runs": runs}
    loadkit.write_json(payload, out)
    note = f", limit {rate}" + (", usage off" if args.no_usage else "")
    report.plot(rows, out.with_suffix(".png"), machine, note)
    print(report.markdown_table(rows))
    print(f"wrote {out}.csv, .png, .json")
    bad = [row for row in rows if row["non_2xx"] or row["socket_errors"]]
    if bad and not args.realistic:
        print(f"WARNING: {len(bad)} cells had non-2xx responses or socket errors", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
