"""Load shedding under load: one gunicorn server overloaded by a slow sheddable endpoint,
with a steady trickle of requests to a critical endpoint beside it; run without and with the
fleet shedder (Service protection).

Run by hand from the repository root (never in CI)::

    .venv/bin/python bench/load_shedding.py            # about a minute
    .venv/bin/python bench/load_shedding.py --quick    # a few seconds per run, *_quick files

Needs the ``bench`` extra (gunicorn, matplotlib). One run starts a private ``redis-server``,
migrates a SQLite file with a default anonymous tier whose limit never denies, and two endpoint
rules: scope ``export`` (``/api/export/``, sleeps ``--slow-seconds``) *sheddable* and scope
``checkout`` (``/api/checkout/``, answers at once) *critical*. Both runs pay the same throttle;
run "shedding" adds the Service protection row: ``--capacity`` requests in flight (default:
the workers), sheddable share ``--sheddable-share`` percent. Each run starts a fresh
gunicorn (``--workers`` sync workers).

The load, from threads of this process (the same machine as the server, so it takes CPU
from it too): ``--slow-clients`` threads, each a client address of its own, that request the
export back to back (one new connection each), waiting ``--refused-wait`` after a 503 (a
client that retries soon: overload, not politeness); and the checkout at ``--fast-rate`` per
second, sent on schedule whatever came back (open loop), its latency counted from the time
it was due, so time spent waiting for a worker counts. The export view counts itself in and
out of a Redis counter, sampled every ``--sample-every`` seconds: the workers the sheddable
endpoint holds.

Before each run it waits (up to ``--patience`` s) for other processes to use at most
``--max-foreign`` cores. Reports per second and per run; records the load average and the
CPU other processes used during each run.
Writes ``<out-dir>/<stem>.json`` and ``.png`` (the two runs side by side). Every process it
started is stopped at the end, also on errors, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import loadkit
from loadkit import get, log, percentile
from loadproject import IN_FLIGHT_KEY
from loadproject.server import Server

SLOW_PATH = "/api/export/"
FAST_PATH = "/api/checkout/"
#: The anonymous tier's own limit: never reached, so only the shedder ever refuses.
NEVER_DENY = loadkit.NEVER_DENY
RUNS = ("off", "shedding")


def add_rules() -> None:
    """The two endpoint rules both runs count: export sheddable, checkout critical (no limit
    of their own: the tier's applies)."""
    from django_throttle.models import EndpointRule

    for name, criticality in (("export", "sheddable"), ("checkout", "critical")):
        EndpointRule.objects.create(
            name=name, match_type="scope", pattern=name, criticality=criticality
        )


def add_protection(args: argparse.Namespace) -> None:
    """Run "shedding": the Service protection row, as an operator saves it in the admin."""
    from django_throttle.models import Protection

    row = Protection(
        in_flight=args.capacity,
        default_share=args.sheddable_share,
        sheddable_share=args.sheddable_share,
        lease=60,
    )
    row.full_clean()
    row.save()


def probe(port: int, shedding: bool, args: argparse.Namespace) -> None:
    """Fail early unless the server sheds what the run says: a few exports more than the
    sheddable share at once get 503s with shedding, none without. Every worker answers a
    checkout first (each loads the policy on its first request), so the exports overlap; on
    a busy machine they may still not, hence a few tries."""
    with ThreadPoolExecutor(args.workers * 2) as pool:
        list(
            pool.map(
                lambda n: get(port, FAST_PATH, f"192.0.2.{n + 2}", 10), range(args.workers * 4)
            )
        )
        sent = args.share + 2
        for _ in range(3):
            statuses = [
                status
                for status, _ in pool.map(
                    lambda n: get(port, SLOW_PATH, f"192.0.3.{n + 1}", 10), range(sent)
                )
            ]
            shed = statuses.count(503)
            if statuses.count(200) + shed == sent and (shed > 0) == shedding:
                return
    raise RuntimeError(f"probe of run shedding={shedding}: statuses {statuses}")


class Load:
    """The two kinds of client and the in-flight sampler, for one run."""

    def __init__(self, port: int, counter: Any, args: argparse.Namespace) -> None:
        self.port, self.counter, self.args = port, counter, args
        self.stop = threading.Event()
        self.slow: list[tuple[float, float, int]] = []  # (start, end, status)
        self.fast: list[tuple[float, float, int]] = []  # (due, end, status)
        self.samples: list[tuple[float, int]] = []  # (time, exports inside the view)
        self.lock = threading.Lock()

    def slow_client(self, address: str) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            status, _ = get(self.port, SLOW_PATH, address, self.args.timeout)
            with self.lock:
                self.slow.append((start, time.monotonic(), status))
            if status != 200:
                self.stop.wait(self.args.refused_wait)

    def fast_request(self, due: float) -> None:
        address = f"10.9.{int(due * 1000) % 250}.1"
        status, _ = get(self.port, FAST_PATH, address, self.args.timeout)
        with self.lock:
            self.fast.append((due, time.monotonic(), status))

    def fast_schedule(self, pool: ThreadPoolExecutor) -> None:
        start, sent = time.monotonic(), 0
        while not self.stop.is_set():
            due = start + sent / self.args.fast_rate
            if self.stop.wait(max(0.0, due - time.monotonic())):
                break
            pool.submit(self.fast_request, due)
            sent += 1

    def sampler(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), int(self.counter.get(IN_FLIGHT_KEY) or 0)))
            self.stop.wait(self.args.sample_every)

    def run(self, seconds: float) -> tuple[float, float]:
        """Drive the load for ``seconds`` (warm-up included); returns the measured window."""
        args = self.args
        threads = [
            threading.Thread(target=self.slow_client, args=(f"10.1.{n // 250}.{n % 250 + 1}",))
            for n in range(args.slow_clients)
        ]
        threads.append(threading.Thread(target=self.sampler))
        began = time.monotonic()
        with ThreadPoolExecutor(args.fast_threads) as pool:
            scheduler = threading.Thread(target=self.fast_schedule, args=(pool,))
            for thread in [*threads, scheduler]:
                thread.start()
            time.sleep(seconds)
            self.stop.set()
            for thread in [*threads, scheduler]:
                thread.join()
        return began + args.warmup, began + seconds


def per_second(load: Load, window: tuple[float, float]) -> list[dict[str, Any]]:
    """One row per measured second: exports in flight (mean, max of the samples), exports
    served and shed (by the second they ended), checkout latency (by the second it was due)
    and checkouts answered."""
    start, end = window
    rows = []
    for second in range(int(end - start)):
        low, high = start + second, start + second + 1
        inside = [n for t, n in load.samples if low <= t < high]
        slow_ended = [status for _, t, status in load.slow if low <= t < high]
        due = [(t - d) * 1e3 for d, t, s in load.fast if low <= d < high and s == 200]
        answered = [s for _, t, s in load.fast if low <= t < high]
        rows.append(
            {
                "second": second,
                "slow_in_flight_mean": round(statistics.fmean(inside), 2) if inside else None,
                "slow_in_flight_max": max(inside, default=None),
                "slow_served": slow_ended.count(200),
                "slow_shed": slow_ended.count(503),
                "fast_p50_ms": percentile(due, 0.5),
                "fast_p99_ms": percentile(due, 0.99),
                "fast_answered": answered.count(200),
            }
        )
    return rows


def summary(load: Load, window: tuple[float, float]) -> dict[str, Any]:
    """The measured window of one run in a few numbers."""
    start, end = window
    seconds = end - start
    inside = [n for t, n in load.samples if start <= t < end]
    slow = [status for _, t, status in load.slow if start <= t < end]
    fast = [(t - d) * 1e3 for d, t, s in load.fast if start <= d < end and s == 200]
    fast_all = [s for d, _, s in load.fast if start <= d < end]
    due = sum(1 for d, _, _ in load.fast if start <= d < end)
    rounded = {
        "fast_p50_ms": percentile(fast, 0.5),
        "fast_p90_ms": percentile(fast, 0.9),
        "fast_p99_ms": percentile(fast, 0.99),
        "fast_max_ms": max(fast, default=None),
    }
    return {
        "seconds": round(seconds, 2),
        "slow_in_flight_mean": round(statistics.fmean(inside), 2) if inside else None,
        "slow_in_flight_max": max(inside, default=None),
        "slow_samples": len(inside),
        "slow_served_per_s": round(slow.count(200) / seconds, 1),
        "slow_shed": slow.count(503),
        "slow_shed_per_s": round(slow.count(503) / seconds, 1),
        "slow_other": len(slow) - slow.count(200) - slow.count(503),
        **{k: None if v is None else round(v, 2) for k, v in rounded.items()},
        "fast_due": due,
        "fast_answered_per_s": round(len(fast) / seconds, 1),
        "fast_not_200": len(fast_all) - len(fast),
        # Checkouts due in the window but not back before the run ended (waiting for a worker).
        "fast_unanswered": due - len(fast_all),
    }


#: What Django's request logger says of each shed export (ERROR, as of every 5xx): expected.
SHED_LINE = f"Service Unavailable: {SLOW_PATH}"


def log_record(server: Server) -> dict[str, Any]:
    """``loadkit.log_record`` without the lines Django logs for the exports shed (counted in
    ``server_log_shed_lines``): any other problem line still counts."""
    lines = server.log.read_text(errors="replace").splitlines()
    bad = [line for line in lines if re.search(r"ERROR|CRITICAL|WARNING|Traceback", line)]
    shed = [line for line in bad if line.endswith(SHED_LINE)]
    others = [line for line in bad if not line.endswith(SHED_LINE)]
    return {
        "server_log_problems": len(others),
        "server_log_first": others[0] if others else "",
        "server_log_shed_lines": len(shed),
    }


def one_run(
    name: str, env: dict[str, str], redis_url: str, args: argparse.Namespace, ours: int | None
) -> dict[str, Any]:
    """A fresh server (it loads the policy as it is now), the probe, then the load."""
    import redis

    waited = loadkit.wait_for_quiet(ours, args.max_foreign, args.patience)
    server = Server("gunicorn", "policy", args.workers, env)
    counter = redis.Redis.from_url(redis_url)
    try:
        server.wait_ready("192.0.2.200")
        probe(server.port, name == "shedding", args)
        counter.delete(IN_FLIGHT_KEY)
        load = Load(server.port, counter, args)
        window, watched = loadkit.watch(server, ours, lambda: load.run(args.warmup + args.seconds))
        logged = log_record(server)
    finally:
        server.stop()
        counter.close()
    s = summary(load, window)
    result: dict[str, Any] = {
        "run": name,
        "summary": s,
        "per_second": per_second(load, window),
        **watched.record(),
        "waited_for_quiet_s": waited,
        **logged,
    }
    log(
        f"{name:9}  exports in flight mean {s['slow_in_flight_mean']} max "
        f"{s['slow_in_flight_max']}, served {s['slow_served_per_s']}/s shed "
        f"{s['slow_shed_per_s']}/s ({s['slow_shed']}) | checkout p50 {s['fast_p50_ms']} ms "
        f"p99 {s['fast_p99_ms']} ms, {s['fast_answered_per_s']}/s answered, "
        f"{s['fast_not_200']} not 200, {s['fast_unanswered']} unanswered | {watched.summary()}"
    )
    return result


def plot(payload: dict[str, Any], path: Path) -> None:
    """The two runs side by side, per second: exports in flight, exports served and shed,
    checkout latency, checkouts answered."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings, runs = payload["settings"], payload["runs"]
    figure, axes = plt.subplots(4, 2, figsize=(12, 11), sharex=True, sharey="row")
    titles = {
        "off": "no load shedding",
        "shedding": f"load shedding: capacity {settings['capacity']}, sheddable share "
        f"{settings['sheddable_share']} % ({settings['share']} exports)",
    }
    for column, run in enumerate(runs):
        rows = run["per_second"]
        xs = [row["second"] for row in rows]
        inside, exports, latency, checkouts = (axes[row][column] for row in range(4))
        inside.plot(xs, [row["slow_in_flight_mean"] for row in rows], "o-", label="mean")
        inside.plot(xs, [row["slow_in_flight_max"] for row in rows], "^--", label="max")
        inside.axhline(settings["workers"], color="black", lw=1, label="workers")
        if run["run"] == "shedding":
            inside.axhline(
                settings["share"], color="tab:red", lw=1, ls=":", label="sheddable share"
            )
        inside.set_title(titles[run["run"]], fontsize=10)
        exports.plot(xs, [row["slow_served"] for row in rows], "o-", label="served (200)")
        exports.plot(
            xs, [row["slow_shed"] for row in rows], "x--", color="tab:red", label="shed (503)"
        )
        latency.plot(xs, [row["fast_p50_ms"] for row in rows], "o-", label="p50")
        latency.plot(xs, [row["fast_p99_ms"] for row in rows], "^--", label="p99")
        latency.set_yscale("log")
        checkouts.plot(xs, [row["fast_answered"] for row in rows], "o-", color="tab:green")
        checkouts.axhline(settings["fast_rate"], color="black", lw=1, ls=":", label="rate sent")
        checkouts.set_xlabel("second of the measured window")
        for axis in (inside, exports, latency, checkouts):
            axis.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("exports inside the view\n(workers they hold)")
    axes[1][0].set_ylabel("exports per s")
    axes[2][0].set_ylabel("checkout latency, ms\n(from when it was due)")
    axes[3][0].set_ylabel("checkouts answered per s")
    axes[0][0].set_ylim(bottom=0, top=settings["workers"] + 1)
    axes[1][0].set_ylim(bottom=0)
    axes[3][0].set_ylim(bottom=0)
    places = ("lower right", "center right", "upper right", "lower right")
    for row, place in zip(axes, places, strict=True):
        row[1].legend(fontsize=8, loc=place)
    title = (
        f"gunicorn, {settings['workers']} sync workers: /api/export/ (sheddable, sleeps "
        f"{settings['slow_seconds'] * 1e3:.0f} ms) from {settings['slow_clients']} clients back "
        f"to back, /api/checkout/ (critical) at {settings['fast_rate']}/s"
    )
    loadkit.save_figure(figure, path, title, payload["machine"], fontsize=10, rect=(0, 0, 1, 0.94))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    quick = "3 s per run, 1 s warm-up, no wait for quiet"
    parser = loadkit.parser(__doc__, quick, seconds=20, warmup=3)
    parser.add_argument("--workers", type=int, default=8, help="gunicorn sync workers")
    parser.add_argument("--capacity", type=int, help="requests in flight (default: workers)")
    parser.add_argument("--sheddable-share", type=int, default=50, help="percent of capacity")
    parser.add_argument("--slow-seconds", type=float, default=0.2, help="an export's sleep")
    parser.add_argument("--slow-clients", type=int, default=24, help="export threads")
    parser.add_argument("--refused-wait", type=float, default=0.05, help="s after a 503")
    parser.add_argument("--fast-rate", type=float, default=20, help="checkouts per second")
    parser.add_argument("--fast-threads", type=int, default=200, help="checkouts at once, most")
    parser.add_argument("--sample-every", type=float, default=0.01, help="s between samples")
    args = loadkit.parse(parser, argv, "load_shedding", quick_seconds=3)
    args.capacity = args.capacity or args.workers
    # What compile_shedding gives the sheddable share of the capacity.
    args.share = max(1, args.capacity * args.sheddable_share // 100)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    loadkit.stop_on_signals()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with loadkit.private_setup("django-throttle-shedding-", NEVER_DENY) as setup:
        url, pid = setup.redis.url, setup.redis.pid
        env = setup.env(LOADTEST_USAGE="1", LOADTEST_SLOW_SECONDS=str(args.slow_seconds))
        add_rules()
        runs = [one_run("off", env, url, args, pid)]
        add_protection(args)
        runs.append(one_run("shedding", env, url, args, pid))
        machine = setup.machine()
    settings = loadkit.settings(args)
    settings.update(tier_limit=NEVER_DENY)
    loadkit.write({"machine": machine, "settings": settings, "runs": runs}, args, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
