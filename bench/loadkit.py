"""What ``load_test.py``, ``load_concurrency.py``, ``load_delay.py`` and ``load_shedding.py``
share: the private ``redis-server`` and migrated SQLite file of one run, the wait for a quiet
machine, what is recorded around a run on a server, the common options and the JSON and plot
they write.

Each load test keeps its own workload, probe and report. Imported by the scripts, which run
from ``bench/`` (so ``bench/`` is first on ``sys.path``); this module puts the repository root
on it too, for ``example_project``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
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

from loadproject import cpu, report  # noqa: E402
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


def get(port: int, path: str, address: str, timeout: float) -> tuple[int, Any]:
    """Status and headers (an ``http.client.HTTPMessage``) of one GET on a new connection to
    ``127.0.0.1:port`` from client ``address`` (``X-Forwarded-For``); ``(0, None)`` on a
    socket error. The body is read and dropped."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"X-Forwarded-For": address})
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
