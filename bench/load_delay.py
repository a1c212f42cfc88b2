"""Delay instead of reject under load: bursty, well-behaved clients against the same GCRA
limit, refusing beyond the burst in one run and delaying in the other, at the same server
throughput.

Run by hand from the repository root (never in CI)::

    .venv/bin/python bench/load_delay.py            # about a minute and a half
    .venv/bin/python bench/load_delay.py --quick    # a few seconds per run, *_quick files

Needs the ``bench`` extra (uvicorn, matplotlib). One run starts a private ``redis-server``,
migrates a SQLite file as ``load_concurrency.py`` does, and for each of the two runs starts a
fresh uvicorn (``--workers`` workers) serving ``loadproject``'s two ``async def`` views, both
``@throttle(rate=--rate, algorithm="gcra", burst=--burst)`` per client address:
``/burst/reject/`` refuses beyond the burst, ``/burst/delay/`` adds ``delay=--delay,
max_wait=--max-wait``. uvicorn, because a delayed request then waits on the event loop: a
sync worker would sleep through the wait, and its sleeping would cap the served rate (at most
``core.MAX_WAITING`` waiting per process, beyond which a request is refused), which is not
what is compared here.

The load, from threads of this process (the same machine as the server, so it takes CPU from
it too): ``--clients`` client addresses, each given a batch of ``--batch`` jobs every
``--period`` seconds (each period drawn uniformly within ``--jitter`` of it, the first at a
random phase), sent on ``--connections`` connections of its own, one job after the other (a
new job once the previous answer came back). A 429 is retried after its ``Retry-After``, as a
well-behaved client does, so every job is served in the end and both runs serve what the
clients ask for: the same throughput, set by the clients, not by the limit. Recorded per
request: when it was sent and answered, its status, ``X-RateLimit-Delayed``; per job: when it
was given and served.

Before each run it waits (up to ``--patience`` s) for other processes to use at most
``--max-foreign`` cores. Reports per second and per run, with the load average sampled every
second and the CPU other processes used. Writes ``<out-dir>/<stem>.json`` and ``.png``. Every
process it started is stopped at the end, also on errors, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import loadkit
from loadkit import get, log, percentile, round1

RUNS = {"reject": "/burst/reject/", "delay": "/burst/delay/"}
#: Client addresses of each run: fresh keys, whatever the other run left in Redis.
NETWORKS = {"reject": "10.2", "delay": "10.3"}


def send(port: int, path: str, address: str, timeout: float) -> tuple[int, float, float]:
    """Status, ``Retry-After`` and ``X-RateLimit-Delayed`` (0 when absent) of one GET from
    client ``address``; status 0 on a socket error."""
    status, headers = get(port, path, address, timeout)
    if headers is None:
        return 0, 0.0, 0.0
    retry = float(headers.get("Retry-After") or 0)
    return status, retry, float(headers.get("X-RateLimit-Delayed") or 0)


def probe(port: int, run: str, args: argparse.Namespace) -> None:
    """Fail early unless the view does what the run says: a burst of one client beyond the
    limit's burst is partly refused on ``reject`` (nothing delayed), partly delayed on
    ``delay``."""
    sent = args.burst + 2
    with ThreadPoolExecutor(sent) as pool:
        for attempt in range(3):
            addresses = [f"192.0.2.{attempt + 1}"] * sent
            answers = list(pool.map(lambda a: send(port, RUNS[run], a, 30), addresses))
            statuses = [status for status, _, _ in answers]
            delayed = sum(1 for status, _, wait in answers if status == 200 and wait > 0)
            refused = statuses.count(429)
            full = statuses.count(200) + refused == sent and refused > 0
            if full and (delayed > 0) == (run == "delay"):
                return
    raise RuntimeError(f"probe of run {run}: answers {answers}")


class Load:
    """The clients and the load-average sampler, for one run."""

    def __init__(self, port: int, run: str, args: argparse.Namespace) -> None:
        self.port, self.run, self.args = port, run, args
        self.path = RUNS[run]
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.random = random.Random(args.seed)
        # (client, sent, answered, status, X-RateLimit-Delayed)
        self.requests: list[tuple[int, float, float, int, float]] = []
        self.jobs: list[tuple[float, float | None, int]] = []  # (given, served, attempts)
        self.load_average: list[tuple[float, float]] = []  # (time, 1-minute load average)

    def address(self, client: int) -> str:
        return f"{NETWORKS[self.run]}.{client // 250}.{client % 250 + 1}"

    def batches(self, client: int, jobs: queue.Queue[float | None], phase: float) -> None:
        """Give ``client`` a batch every period (jittered), starting ``phase`` in."""
        args = self.args
        with self.lock:
            rng = random.Random(self.random.random())
        due = time.monotonic() + phase
        while not self.stop.wait(max(0.0, due - time.monotonic())):
            now = time.monotonic()
            for _ in range(args.batch):
                jobs.put(now)
            due += args.period * rng.uniform(1 - args.jitter, 1 + args.jitter)

    def connection(self, client: int, jobs: queue.Queue[float | None]) -> None:
        """Send ``client``'s jobs one after the other, each until it is served; after a 429,
        wait its ``Retry-After``."""
        address = self.address(client)
        while not self.stop.is_set():
            try:
                given = jobs.get(timeout=0.1)
            except queue.Empty:
                continue
            attempts = 0
            served = None
            while not self.stop.is_set():
                sent = time.monotonic()
                status, retry, waited = send(self.port, self.path, address, self.args.timeout)
                answered = time.monotonic()
                attempts += 1
                with self.lock:
                    self.requests.append((client, sent, answered, status, waited))
                if status == 200:
                    served = answered
                    break
                self.stop.wait(retry if status == 429 else self.args.error_wait)
            with self.lock:
                self.jobs.append((given, served, attempts))

    def sampler(self) -> None:
        while not self.stop.is_set():
            self.load_average.append((time.monotonic(), os.getloadavg()[0]))
            self.stop.wait(1.0)

    def run_for(self, seconds: float) -> tuple[float, float]:
        """Drive the load for ``seconds`` (warm-up included); returns the measured window."""
        args = self.args
        threads = [threading.Thread(target=self.sampler)]
        for client in range(args.clients):
            jobs: queue.Queue[float | None] = queue.Queue()
            phase = self.random.uniform(0, args.period)
            threads.append(threading.Thread(target=self.batches, args=(client, jobs, phase)))
            threads += [
                threading.Thread(target=self.connection, args=(client, jobs))
                for _ in range(args.connections)
            ]
        began = time.monotonic()
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        self.stop.set()
        for thread in threads:
            thread.join()
        return began + args.warmup, began + seconds


def latency_ms(requests: list[tuple[int, float, float, int, float]]) -> list[float]:
    return [(answered - sent) * 1e3 for _, sent, answered, status, _ in requests if status == 200]


def per_second(load: Load, window: tuple[float, float]) -> list[dict[str, Any]]:
    """One row per measured second, by the second a request was answered: served, refused,
    delayed (served with ``X-RateLimit-Delayed``), latency of the served ones, and the load
    average sampled in that second."""
    start, end = window
    rows = []
    for second in range(int(end - start)):
        low, high = start + second, start + second + 1
        ended = [r for r in load.requests if low <= r[2] < high]
        statuses = [r[3] for r in ended]
        served = latency_ms(ended)
        sampled = [value for t, value in load.load_average if low <= t < high]
        rows.append(
            {
                "second": second,
                "served": statuses.count(200),
                "refused": statuses.count(429),
                "delayed": sum(1 for r in ended if r[3] == 200 and r[4] > 0),
                "served_p50_ms": round1(percentile(served, 0.5)),
                "served_p99_ms": round1(percentile(served, 0.99)),
                "load_average": sampled[0] if sampled else None,
            }
        )
    return rows


def summary(load: Load, window: tuple[float, float]) -> dict[str, Any]:
    """The measured window of one run in a few numbers: requests by when they were answered,
    jobs by when they were given (``jobs_unfinished``: taken by a connection but not served
    when the run stopped, most waiting out a ``Retry-After``)."""
    start, end = window
    seconds = end - start
    ended = [r for r in load.requests if start <= r[2] < end]
    statuses = [r[3] for r in ended]
    served, refused = statuses.count(200), statuses.count(429)
    latency = latency_ms(ended)
    waits = [r[4] for r in ended if r[3] == 200]
    given = [job for job in load.jobs if start <= job[0] < end]
    done = [(s - g) * 1e3 for g, s, _ in given if s is not None]
    return {
        "seconds": round(seconds, 2),
        "served_per_s": round(served / seconds, 1),
        "refused_per_s": round(refused / seconds, 1),
        "refused_share": round(refused / (served + refused), 3) if served + refused else None,
        "other_statuses": len(statuses) - served - refused,
        "delayed_share": round(sum(1 for w in waits if w > 0) / len(waits), 3) if waits else None,
        "served_p50_ms": round1(percentile(latency, 0.5)),
        "served_p90_ms": round1(percentile(latency, 0.9)),
        "served_p99_ms": round1(percentile(latency, 0.99)),
        "served_max_ms": round1(max(latency, default=None)),
        "jobs_given_per_s": round(len(given) / seconds, 1),
        "jobs_unfinished": sum(1 for job in given if job[1] is None),
        "job_p50_ms": round1(percentile(done, 0.5)),
        "job_p99_ms": round1(percentile(done, 0.99)),
        "attempts_per_job": round(sum(a for *_, a in given) / len(given), 2) if given else None,
    }


def one_run(name: str, env: dict[str, str], args: argparse.Namespace, ours: int | None) -> Any:
    """A fresh server, the probe, then the load."""
    with loadkit.fresh_server("uvicorn", env, args, ours) as (server, waited):
        probe(server.port, name, args)
        load = Load(server.port, name, args)
        window, watched = loadkit.watch(
            server, ours, lambda: load.run_for(args.warmup + args.seconds)
        )
        logged = loadkit.log_record(server)
    s = summary(load, window)
    rows = per_second(load, window)
    cpu = round(watched.meter.server, 2)
    result = loadkit.run_record(name, s, rows, watched, waited, logged, server_cpu_s=cpu)
    log(
        f"{name:6}  served {s['served_per_s']}/s, refused {s['refused_per_s']}/s "
        f"(share {s['refused_share']}), delayed share {s['delayed_share']} | served p50 "
        f"{s['served_p50_ms']} ms p99 {s['served_p99_ms']} ms | job p50 {s['job_p50_ms']} ms "
        f"p99 {s['job_p99_ms']} ms | {watched.summary()}"
    )
    return result


def plot(payload: dict[str, Any], path: Path) -> None:
    """Both runs on the same axes, per second: served and refused, latency of the served
    requests, load average."""
    plt = loadkit.pyplot()
    settings, runs = payload["settings"], payload["runs"]
    colours = {"reject": "tab:orange", "delay": "tab:blue"}
    figure, (rates, latency, load) = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    for run in runs:
        rows, name, colour = run["per_second"], run["run"], colours[run["run"]]
        xs = [row["second"] for row in rows]
        rates.plot(xs, [r["served"] for r in rows], "o-", color=colour, label=f"{name}: served")
        rates.plot(xs, [r["refused"] for r in rows], "x--", color=colour, label=f"{name}: 429")
        latency.plot(
            xs, [r["served_p50_ms"] for r in rows], "o-", color=colour, label=f"{name}: p50"
        )
        latency.plot(
            xs, [r["served_p99_ms"] for r in rows], "^--", color=colour, label=f"{name}: p99"
        )
        load.plot(xs, [r["load_average"] for r in rows], "o-", color=colour, label=name)
    rates.axhline(settings["offered_per_s"], color="black", lw=1, ls=":", label="jobs given")
    rates.set_ylabel("requests per s")
    rates.set_ylim(bottom=0)
    latency.set_ylabel("latency of served requests, ms")
    latency.set_yscale("log")
    load.set_ylabel("load average (1 min)")
    load.set_ylim(bottom=0)
    load.set_xlabel("second of the measured window")
    for axis, place in ((rates, "center right"), (latency, "center right"), (load, "lower right")):
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8, loc=place, ncol=2)
    title = (
        f"uvicorn, {settings['workers']} workers: @throttle(rate={settings['rate']!r}, gcra, "
        f"burst={settings['burst']}), reject vs delay={settings['delay']} max_wait="
        f"{settings['max_wait']:g}\n{settings['clients']} clients, each {settings['batch']} "
        f"jobs every {settings['period']:g} s (±{settings['jitter']:.0%}) on "
        f"{settings['connections']} connections, 429s retried after Retry-After"
    )
    loadkit.save_figure(figure, path, title, payload["machine"], fontsize=9, rect=(0, 0, 1, 0.95))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    quick = "4 s per run, 1 s warm-up, no wait for quiet"
    parser = loadkit.parser(__doc__, quick, seconds=30, warmup=5)
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    parser.add_argument("--rate", default="2/s", help="the limit per client")
    parser.add_argument("--burst", type=int, default=4, help="the limit's burst")
    parser.add_argument("--delay", type=int, default=0, help="served at once beyond the first")
    parser.add_argument("--max-wait", type=float, default=2.0, help="longest wait, s")
    parser.add_argument("--clients", type=int, default=60, help="client addresses")
    parser.add_argument("--batch", type=int, default=6, help="jobs per batch")
    parser.add_argument("--period", type=float, default=4.0, help="s between batches")
    parser.add_argument("--jitter", type=float, default=0.25, help="of the period, either way")
    parser.add_argument("--connections", type=int, default=3, help="per client")
    parser.add_argument("--seed", type=int, default=1, help="of the phases and periods")
    parser.add_argument("--error-wait", type=float, default=0.5, help="s after a non-429 error")
    return loadkit.parse(parser, argv, "load_delay", quick_seconds=4)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def runs(setup: loadkit.Setup) -> list[dict[str, Any]]:
        env = setup.env(
            LOADTEST_USAGE="1",
            LOADTEST_BURST_RATE=args.rate,
            LOADTEST_BURST=str(args.burst),
            LOADTEST_DELAY=str(args.delay),
            LOADTEST_MAX_WAIT=str(args.max_wait),
        )
        return [one_run(name, env, args, setup.redis.pid) for name in RUNS]

    offered = round(args.clients * args.batch / args.period, 1)
    prefix = "django-throttle-delay-"
    return loadkit.run_all(args, prefix, loadkit.NEVER_DENY, runs, plot, offered_per_s=offered)


if __name__ == "__main__":
    sys.exit(main())
