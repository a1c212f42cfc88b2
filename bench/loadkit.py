"""What ``load_test.py``, ``load_concurrency.py``, ``load_delay.py``, ``load_shedding.py`` and
``load_adaptive.py`` share: the private ``redis-server`` and migrated SQLite file of one run,
the wait for a quiet machine, the fresh server of each run and what is recorded around it, the
common options and the JSON and plot they write; and the slow endpoint beside a fast one that
``load_concurrency.py`` and ``load_shedding.py`` both drive (``SlowFast``).

Each load test keeps its own scenario: its workload, probe and report. Imported by the
scripts, which run from ``bench/`` (so ``bench/`` is first on ``sys.path``); this module puts
the repository root on it too, for ``example_project``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
# Appended, not prepended: a PYTHONPATH entry may hold another django_throttle to measure.
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from loadproject import IN_FLIGHT_KEY, cpu, report  # noqa: E402
from loadproject.server import Server  # noqa: E402

from example_project.private_redis import PrivateRedis  # noqa: E402

#: A limit never reached, so it never refuses: the runs measure overhead, not denials.
NEVER_DENY = "1000000/s"


def log(*parts: Any) -> None:
    """Print to stderr at once (stdout is kept for ``--json``)."""
    print(*parts, file=sys.stderr, flush=True)


def percentile(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile, or ``None`` without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))]


def round1(value: float | None) -> float | None:
    """``value`` rounded to one decimal, or ``None``."""
    return None if value is None else round(value, 1)


def get(port: int, path: str, address: str, timeout: float) -> tuple[int, Any]:
    """``fetch`` from client ``address`` (``X-Forwarded-For``)."""
    return fetch(port, path, {"X-Forwarded-For": address}, timeout)


def fetch(port: int, path: str, headers: dict[str, str], timeout: float) -> tuple[int, Any]:
    """Status and headers (an ``http.client.HTTPMessage``) of one GET with ``headers`` on a
    new connection to ``127.0.0.1:port``; ``(0, None)`` on a socket error or timeout. The body
    is read and dropped."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status, response.headers
    except OSError:
        return 0, None
    finally:
        connection.close()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP raise ``KeyboardInterrupt``, so the ``finally`` clauses that stop
    every process the script started run on them as on Ctrl-C."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)


def prepare_database(path: Path, redis_url: str, rate: str, logdir: Path) -> None:
    """Migrate the SQLite file and create the default anonymous tier limited to ``rate``, as
    an operator would. Sets the ``LOADTEST_*`` variables of ``loadproject.settings`` in
    ``os.environ`` (the servers inherit them) and sets Django up in this process."""
    os.environ.update(
        DJANGO_SETTINGS_MODULE="loadproject.settings",
        LOADTEST_VARIANT="policy",
        LOADTEST_REDIS_URL=redis_url,
        LOADTEST_DB=str(path),
        LOADTEST_LOGDIR=str(logdir),
    )
    import django
    from django.core.management import call_command

    django.setup()
    from django_throttle.models import Tier, TierLimit

    call_command("migrate", verbosity=0)
    tier = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    TierLimit.objects.create(tier=tier, rate=rate)


@dataclass
class Setup:
    """One run's private ``redis-server`` and the directory of its database and server logs."""

    redis: PrivateRedis
    logdir: Path

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a server: this process's (with the ``LOADTEST_*`` variables of
        ``prepare_database``), ``bench/`` first on ``PYTHONPATH``, and ``extra``."""
        path = os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")]))
        return {**os.environ, "PYTHONPATH": path, **extra}

    def machine(self) -> dict[str, Any]:
        """``report.machine_info``, with the version of this run's ``redis-server``."""
        import redis

        client = redis.Redis.from_url(self.redis.url)
        try:
            return report.machine_info(str(client.info("server")["redis_version"]), ROOT)
        finally:
            client.close()


@contextmanager
def private_setup(prefix: str, rate: str) -> Iterator[Setup]:
    """A private ``redis-server`` and a temporary directory holding the SQLite file migrated
    by ``prepare_database`` (tier limit ``rate``); both are gone on leaving, also on errors."""
    workdir = tempfile.TemporaryDirectory(prefix=prefix)
    redis_server = PrivateRedis()
    try:
        redis_server.start()
        logdir = Path(workdir.name)
        prepare_database(logdir / "db.sqlite3", redis_server.url, rate, logdir)
        yield Setup(redis_server, logdir)
    finally:
        redis_server.stop()
        workdir.cleanup()


def wait_for_quiet(
    redis: int | None, max_foreign: float, patience: int, servers: set[int] | None = None
) -> int:
    """Wait, a second at a time and at most ``patience`` seconds, until processes other than
    this one, Redis (pid ``redis``) and the process groups ``servers`` use at most
    ``max_foreign`` cores; returns how many of those seconds were busier than that."""
    waited = 0
    while waited < patience:
        with cpu.Meter(redis, servers or set(), 0) as idle:
            time.sleep(1)
        if idle.foreign <= max_foreign:
            break
        waited += 1
    return waited


@dataclass
class Watched:
    """What ``watch`` saw around a run: the load average before and after, and the CPU of
    ``server``'s process group, of ``ours`` and of every other process."""

    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    meter: cpu.Meter

    def record(self) -> dict[str, Any]:
        """The run's ``load_average_before``/``_after``, ``cores_ours`` and ``cores_others``."""
        return {
            "load_average_before": [round(v, 2) for v in self.load_before],
            "load_average_after": [round(v, 2) for v in self.load_after],
            "cores_ours": self.meter.ours,
            "cores_others": self.meter.foreign,
        }

    def summary(self) -> str:
        """The log line's end: load average and cores."""
        return (
            f"load avg {self.load_before[0]:.2f}->{self.load_after[0]:.2f}, cores ours "
            f"{self.meter.ours:.2f} others {self.meter.foreign:.2f}"
        )


def watch(server: Server, ours: int | None, drive: Callable[[], Any]) -> tuple[Any, Watched]:
    """``drive()``'s result, and the load average and CPU around it."""
    load_before = os.getloadavg()
    with cpu.Meter(ours, {server.process.pid}, server.process.pid) as meter:
        result = drive()
    return result, Watched(load_before, os.getloadavg(), meter)


def log_record(server: Server) -> dict[str, Any]:
    """The run's ``server_log_problems`` (lines with ERROR, WARNING, ... in the server's
    whole log) and ``server_log_first`` (the first such line, or "")."""
    problems, _, first = server.log_problems(0)
    return {"server_log_problems": problems, "server_log_first": first}


@contextmanager
def fresh_server(
    kind: str, env: dict[str, str], args: argparse.Namespace, ours: int | None
) -> Iterator[tuple[Server, int]]:
    """A fresh ``kind`` server (``args.workers`` workers; it loads the policy as it is now),
    started once the machine is quiet and ready to serve, and the seconds waited for quiet;
    stopped on leaving, also on errors."""
    waited = wait_for_quiet(ours, args.max_foreign, args.patience)
    server = Server(kind, "policy", args.workers, env)
    try:
        server.wait_ready("192.0.2.200")
        yield server, waited
    finally:
        server.stop()


def run_record(
    name: str,
    summary: dict[str, Any],
    per_second: list[dict[str, Any]],
    watched: Watched,
    waited: int,
    logged: dict[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """A run as the JSON records it: its name, summary and rows, what ``watch`` saw, ``extra``,
    the seconds waited for quiet and the server log's problems (``log_record``)."""
    return {
        "run": name,
        "summary": summary,
        "per_second": per_second,
        **watched.record(),
        **extra,
        "waited_for_quiet_s": waited,
        **logged,
    }


def parser(doc: str, quick: str, seconds: float, warmup: float) -> argparse.ArgumentParser:
    """The parser of a two-run load test, with ``--quick`` (help ``quick``), ``--seconds``
    and ``--warmup``; the script adds its own options, then calls ``parse``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--seconds", type=float, default=seconds, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=warmup, help="seconds before measuring")
    return parser


def parse(
    parser: argparse.ArgumentParser, argv: list[str] | None, stem: str, quick_seconds: float
) -> argparse.Namespace:
    """Adds ``--timeout``, ``--max-foreign``, ``--patience``, ``--out-dir``, ``--stem`` and
    ``--json`` and parses ``argv``. ``--quick`` means ``quick_seconds`` per run, 1 s of
    warm-up, no wait for quiet and the stem ``<stem>_quick``."""
    parser.add_argument("--timeout", type=float, default=30, help="socket timeout, s")
    parser.add_argument("--max-foreign", type=float, default=0.2, help="cores; else wait")
    parser.add_argument("--patience", type=int, default=30, help="s to wait for quiet, per run")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--stem", help="output file stem")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup, args.patience = quick_seconds, 1, 0
    args.stem = args.stem or (f"{stem}_quick" if args.quick else stem)
    return args


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The options of a run as its JSON records them (without where and how it writes)."""
    return {k: v for k, v in vars(args).items() if k not in {"out_dir", "json", "stem"}}


def pyplot() -> Any:
    """``matplotlib.pyplot``, drawing without a display (``ImportError`` without
    matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure: Any, path: Path, title: str, machine: dict[str, Any], **how: Any) -> None:
    """Title ``figure`` with ``title`` and a last line naming the machine and the code measured,
    lay it out within ``how["rect"]``, save it as ``path`` (100 dpi) and close it. ``how``
    also takes the title's ``fontsize``."""
    import matplotlib.pyplot as plt

    figure.suptitle(
        f"{title}\n{machine['cpu']}, {machine['logical_cpus']} CPUs shared by server, Redis "
        f"and the load generator; code: {machine['code']}",
        fontsize=how["fontsize"],
    )
    figure.tight_layout(rect=how["rect"])
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_json(payload: dict[str, Any], out: Path) -> None:
    """``payload`` as ``<out>.json``, indented by one."""
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")


def write(
    payload: dict[str, Any], args: argparse.Namespace, plot: Callable[[dict[str, Any], Path], None]
) -> None:
    """``<out-dir>/<stem>.json`` and the ``.png`` ``plot`` draws (none without matplotlib);
    with ``--json`` the payload on stdout too."""
    out = args.out_dir / args.stem
    write_json(payload, out)
    try:
        plot(payload, out.with_suffix(".png"))
    except ImportError:
        log("matplotlib is not installed: no plot")
    log(f"wrote {out}.json, .png")
    if args.json:
        print(json.dumps(payload))


def run_all(
    args: argparse.Namespace,
    prefix: str,
    rate: str,
    runs: Callable[[Setup], list[dict[str, Any]]],
    plot: Callable[[dict[str, Any], Path], None],
    **recorded: Any,
) -> int:
    """A load test's main, once its options are parsed: every process it starts is stopped on
    SIGTERM and SIGHUP too; ``runs`` in a ``private_setup`` (``prefix``, tier limit ``rate``);
    then ``write`` with the options and ``recorded`` as the settings. Returns 0."""
    stop_on_signals()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with private_setup(prefix, rate) as setup:
        done = runs(setup)
        machine = setup.machine()
    write(
        {"machine": machine, "settings": {**settings(args), **recorded}, "runs": done}, args, plot
    )
    return 0


# -- a slow endpoint beside a fast one: load_concurrency.py and load_shedding.py --------------

#: The slow endpoint (``throttle_scope = "export"``, sleeps ``LOADTEST_SLOW_SECONDS``); the view
#: counts itself in and out of ``IN_FLIGHT_KEY``.
SLOW_PATH = "/api/export/"


@dataclass(frozen=True)
class SlowFast:
    """What a slow/fast load test sets: the fast endpoint (``fast_path``, called ``fast`` in
    the plot and help), and how the server refuses an export: ``status``, named ``refused``
    in the records (``slow_<refused>``), its count in the summary too if ``counted``."""

    fast_path: str
    fast: str
    refused: str
    status: int
    counted: bool = False

    def parser(self, doc: str) -> argparse.ArgumentParser:
        """``parser`` with 20 s runs, 3 s warm-up, ``--workers`` and ``--slow-seconds``."""
        made = parser(doc, "3 s per run, 1 s warm-up, no wait for quiet", seconds=20, warmup=3)
        made.add_argument("--workers", type=int, default=8, help="gunicorn sync workers")
        made.add_argument("--slow-seconds", type=float, default=0.2, help="an export's sleep")
        return made

    def parse(
        self, made: argparse.ArgumentParser, argv: list[str] | None, stem: str
    ) -> argparse.Namespace:
        """``parse`` (3 s per quick run), after ``--fast-threads`` and ``--sample-every``."""
        made.add_argument(
            "--fast-threads", type=int, default=200, help=f"{self.fast}s at once, at most"
        )
        made.add_argument("--sample-every", type=float, default=0.01, help="s between samples")
        return parse(made, argv, stem, quick_seconds=3)

    def probe(
        self,
        port: int,
        args: argparse.Namespace,
        sent: int,
        address: Callable[[int], str],
        refusing: bool,
        run: str,
    ) -> None:
        """Fail early unless the server refuses what the run says: ``sent`` exports at once
        (the n-th from ``address(n)``) get refusals if ``refusing``, none if not, and 200
        otherwise. Every worker answers a fast request first (each loads the policy on its
        first request), so the exports overlap; on a busy machine they may still not, hence a
        few tries."""
        with ThreadPoolExecutor(args.workers * 2) as pool:
            list(
                pool.map(
                    lambda n: get(port, self.fast_path, f"192.0.2.{n + 2}", 10),
                    range(args.workers * 4),
                )
            )
            for _ in range(3):
                statuses = [
                    status
                    for status, _ in pool.map(
                        lambda n: get(port, SLOW_PATH, address(n), 10), range(sent)
                    )
                ]
                refused = statuses.count(self.status)
                if statuses.count(200) + refused == sent and (refused > 0) == refusing:
                    return
        raise RuntimeError(f"probe of run {run}: statuses {statuses}")

    def run(
        self,
        name: str,
        setup: Setup,
        args: argparse.Namespace,
        probe: Callable[[int], None],
        slow_addresses: list[str],
        logged: Callable[[Server], dict[str, Any]] = log_record,
    ) -> tuple[dict[str, Any], Watched]:
        """One run: a fresh gunicorn, ``probe(port)``, then ``SlowFastLoad`` with a thread per
        slow address. Its record (with the ``logged`` problems of the server's log) and what
        ``watch`` saw."""
        import redis

        env = setup.env(LOADTEST_USAGE="1", LOADTEST_SLOW_SECONDS=str(args.slow_seconds))
        counter = redis.Redis.from_url(setup.redis.url)
        ours = setup.redis.pid
        try:
            with fresh_server("gunicorn", env, args, ours) as (server, waited):
                probe(server.port)
                counter.delete(IN_FLIGHT_KEY)
                load = SlowFastLoad(self, server.port, counter, slow_addresses, args)
                seconds = args.warmup + args.seconds
                window, watched = watch(server, ours, lambda: load.run(seconds))
                problems = logged(server)
        finally:
            counter.close()
        rows = self.per_second(load, window)
        return run_record(
            name, self.summary(load, window), rows, watched, waited, problems
        ), watched

    def per_second(self, load: SlowFastLoad, window: tuple[float, float]) -> list[dict[str, Any]]:
        """One row per measured second: exports in flight (mean, max of the samples), exports
        served and refused (by the second they ended), fast latency (by the second it was due)
        and fast requests answered."""
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
                    f"slow_{self.refused}": slow_ended.count(self.status),
                    "fast_p50_ms": percentile(due, 0.5),
                    "fast_p99_ms": percentile(due, 0.99),
                    "fast_answered": answered.count(200),
                }
            )
        return rows

    def summary(self, load: SlowFastLoad, window: tuple[float, float]) -> dict[str, Any]:
        """The measured window of one run in a few numbers."""
        start, end = window
        seconds = end - start
        inside = [n for t, n in load.samples if start <= t < end]
        slow = [status for _, t, status in load.slow if start <= t < end]
        fast = [(t - d) * 1e3 for d, t, s in load.fast if start <= d < end and s == 200]
        fast_all = [s for d, _, s in load.fast if start <= d < end]
        due = sum(1 for d, _, _ in load.fast if start <= d < end)
        refused = slow.count(self.status)
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
            **({f"slow_{self.refused}": refused} if self.counted else {}),
            f"slow_{self.refused}_per_s": round(refused / seconds, 1),
            "slow_other": len(slow) - slow.count(200) - refused,
            **{k: None if v is None else round(v, 2) for k, v in rounded.items()},
            "fast_due": due,
            "fast_answered_per_s": round(len(fast) / seconds, 1),
            "fast_not_200": len(fast_all) - len(fast),
            # Fast requests due in the window but not back before the run ended (waiting for a
            # worker).
            "fast_unanswered": due - len(fast_all),
        }

    def plot(
        self,
        payload: dict[str, Any],
        path: Path,
        titles: dict[str, str],
        share: tuple[str, str],
        title: str,
    ) -> None:
        """The two runs side by side, per second: exports in flight, exports served and
        refused, fast latency, fast requests answered. ``titles``: of each run's column;
        ``share``: the run that draws ``settings["share"]`` and its label."""
        plt = pyplot()
        settings, runs = payload["settings"], payload["runs"]
        figure, axes = plt.subplots(4, 2, figsize=(12, 11), sharex=True, sharey="row")
        for column, run in enumerate(runs):
            rows = run["per_second"]
            xs = [row["second"] for row in rows]
            inside, exports, latency, answered = (axes[row][column] for row in range(4))
            inside.plot(xs, [row["slow_in_flight_mean"] for row in rows], "o-", label="mean")
            inside.plot(xs, [row["slow_in_flight_max"] for row in rows], "^--", label="max")
            inside.axhline(settings["workers"], color="black", lw=1, label="workers")
            if run["run"] == share[0]:
                inside.axhline(settings["share"], color="tab:red", lw=1, ls=":", label=share[1])
            inside.set_title(titles[run["run"]], fontsize=10)
            exports.plot(xs, [row["slow_served"] for row in rows], "o-", label="served (200)")
            exports.plot(
                xs,
                [row[f"slow_{self.refused}"] for row in rows],
                "x--",
                color="tab:red",
                label=f"{self.refused} ({self.status})",
            )
            latency.plot(xs, [row["fast_p50_ms"] for row in rows], "o-", label="p50")
            latency.plot(xs, [row["fast_p99_ms"] for row in rows], "^--", label="p99")
            latency.set_yscale("log")
            answered.plot(xs, [row["fast_answered"] for row in rows], "o-", color="tab:green")
            answered.axhline(settings["fast_rate"], color="black", lw=1, ls=":", label="rate sent")
            answered.set_xlabel("second of the measured window")
            for axis in (inside, exports, latency, answered):
                axis.grid(True, alpha=0.3)
        axes[0][0].set_ylabel("exports inside the view\n(workers they hold)")
        axes[1][0].set_ylabel("exports per s")
        axes[2][0].set_ylabel(f"{self.fast} latency, ms\n(from when it was due)")
        axes[3][0].set_ylabel(f"{self.fast}s answered per s")
        axes[0][0].set_ylim(bottom=0, top=settings["workers"] + 1)
        axes[1][0].set_ylim(bottom=0)
        axes[3][0].set_ylim(bottom=0)
        places = ("lower right", "center right", "upper right", "lower right")
        for row, place in zip(axes, places, strict=True):
            row[1].legend(fontsize=8, loc=place)
        save_figure(figure, path, title, payload["machine"], fontsize=10, rect=(0, 0, 1, 0.94))


class SlowFastLoad:
    """One run's load of a ``SlowFast`` test, from threads of this process (the same machine
    as the server): a thread per slow address requesting the export back to back (one new
    connection each), waiting ``args.refused_wait`` after a refusal; the fast endpoint at
    ``args.fast_rate`` per second, sent on schedule whatever came back (open loop); and the
    sampler of the exports in flight."""

    def __init__(
        self,
        scenario: SlowFast,
        port: int,
        counter: Any,
        slow_addresses: list[str],
        args: argparse.Namespace,
    ) -> None:
        self.scenario, self.port, self.counter, self.args = scenario, port, counter, args
        self.slow_addresses = slow_addresses
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
        status, _ = get(self.port, self.scenario.fast_path, address, self.args.timeout)
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
        threads = [
            threading.Thread(target=self.slow_client, args=(address,))
            for address in self.slow_addresses
        ]
        threads.append(threading.Thread(target=self.sampler))
        began = time.monotonic()
        with ThreadPoolExecutor(self.args.fast_threads) as pool:
            scheduler = threading.Thread(target=self.fast_schedule, args=(pool,))
            for thread in [*threads, scheduler]:
                thread.start()
            time.sleep(seconds)
            self.stop.set()
            for thread in [*threads, scheduler]:
                thread.join()
        return began + self.args.warmup, began + seconds
