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
import sys
from pathlib import Path
from typing import Any

import loadkit
from loadkit import SLOW_PATH, log
from loadproject.server import Server

#: The checkout beside the export; an export refused by the shedder gets 503.
SCENARIO = loadkit.SlowFast(
    fast_path="/api/checkout/", fast="checkout", refused="shed", status=503, counted=True
)
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


def one_run(name: str, setup: loadkit.Setup, args: argparse.Namespace) -> dict[str, Any]:
    """A fresh server (it loads the policy as it is now), the probe, then the load: a few
    exports more than the sheddable share at once, each from a client of its own, are shed
    with shedding, never without."""

    def probe(port: int) -> None:
        shedding = name == "shedding"
        sent, address = args.share + 2, lambda n: f"192.0.3.{n + 1}"
        SCENARIO.probe(port, args, sent, address, shedding, f"shedding={shedding}")

    addresses = [f"10.1.{n // 250}.{n % 250 + 1}" for n in range(args.slow_clients)]
    result, watched = SCENARIO.run(name, setup, args, probe, addresses, log_record)
    s = result["summary"]
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
    settings = payload["settings"]
    titles = {
        "off": "no load shedding",
        "shedding": f"load shedding: capacity {settings['capacity']}, sheddable share "
        f"{settings['sheddable_share']} % ({settings['share']} exports)",
    }
    title = (
        f"gunicorn, {settings['workers']} sync workers: /api/export/ (sheddable, sleeps "
        f"{settings['slow_seconds'] * 1e3:.0f} ms) from {settings['slow_clients']} clients back "
        f"to back, /api/checkout/ (critical) at {settings['fast_rate']}/s"
    )
    SCENARIO.plot(payload, path, titles, ("shedding", "sheddable share"), title)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = SCENARIO.parser(__doc__)
    parser.add_argument("--capacity", type=int, help="requests in flight (default: workers)")
    parser.add_argument("--sheddable-share", type=int, default=50, help="percent of capacity")
    parser.add_argument("--slow-clients", type=int, default=24, help="export threads")
    parser.add_argument("--refused-wait", type=float, default=0.05, help="s after a 503")
    parser.add_argument("--fast-rate", type=float, default=20, help="checkouts per second")
    args = SCENARIO.parse(parser, argv, "load_shedding")
    args.capacity = args.capacity or args.workers
    # What compile_shedding gives the sheddable share of the capacity.
    args.share = max(1, args.capacity * args.sheddable_share // 100)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def runs(setup: loadkit.Setup) -> list[dict[str, Any]]:
        add_rules()
        off = one_run("off", setup, args)
        add_protection(args)
        return [off, one_run("shedding", setup, args)]

    prefix = "django-throttle-shedding-"
    return loadkit.run_all(args, prefix, NEVER_DENY, runs, plot, tier_limit=NEVER_DENY)


if __name__ == "__main__":
    sys.exit(main())
