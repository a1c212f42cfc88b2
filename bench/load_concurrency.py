"""A concurrency limit under load: one gunicorn server, a slow endpoint driven by more
connections than it has workers, and a fast one beside it at a steady rate; run without and
with a concurrency limit on the slow endpoint.

Run by hand from the repository root (never in CI)::

    .venv/bin/python bench/load_concurrency.py            # about a minute
    .venv/bin/python bench/load_concurrency.py --quick    # a few seconds per run, *_quick files

Needs the ``bench`` extra (gunicorn, matplotlib). One run starts a private ``redis-server``,
migrates a SQLite file with a default anonymous tier whose limit never denies (both runs pay
the same throttle), and for each of the two runs starts a fresh gunicorn (``--workers`` sync
workers) serving ``loadproject``: ``/api/export/`` (``throttle_scope = "export"``, sleeps
``--slow-seconds``) and ``/api/ping/``. Run "limited" first adds an endpoint rule on the
scope ``export`` with a concurrency limit of ``--limit`` for the anonymous tier, counted per
client.

The load, from threads of this process (the same machine as the server, so it takes CPU
from it too): ``--slow-clients`` client addresses, each with ``--slow-connections`` threads
that request the export back to back (one new connection each, as a sync worker closes it),
waiting ``--refused-wait`` after a 429; and the ping at ``--fast-rate`` per second, sent on
schedule whatever came back (open loop), its latency counted from the time it was due, so
time spent waiting for a worker counts. The export view counts itself in and out of a Redis
counter, sampled every ``--sample-every`` seconds: the workers the slow endpoint holds.

Before each run it waits (up to ``--patience`` s) for other processes to use at most
``--max-foreign`` cores. Reports per second and per run; records the load average and the
CPU other processes used during each run.
Writes ``<out-dir>/<stem>.json`` and ``.png`` (the two runs side by side). Every process it
started is stopped at the end, also on errors, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import loadkit
from loadkit import log

#: The ping beside the export; an export over the concurrency limit gets 429.
SCENARIO = loadkit.SlowFast(fast_path="/api/ping/", fast="ping", refused="refused", status=429)
#: The anonymous tier's own limit: never reached, so only the endpoint rule ever refuses.
NEVER_DENY = loadkit.NEVER_DENY
RUNS = ("unlimited", "limited")


def add_concurrency_rule(rate: str) -> None:
    """The endpoint rule of run "limited": scope ``export``, ``rate`` in flight per client."""
    from django_throttle.models import EndpointLimit, EndpointRule, Tier
    from django_throttle.rates import Algorithm

    rule = EndpointRule.objects.create(name="export", match_type="scope", pattern="export")
    tier = Tier.objects.get(slug="anonymous")
    EndpointLimit.objects.create(rule=rule, tier=tier, rate=rate, algorithm=Algorithm.CONCURRENCY)


def one_run(name: str, setup: loadkit.Setup, args: argparse.Namespace) -> dict[str, Any]:
    """A fresh server (it loads the policy as it is now), the probe, then the load: one
    client sending a few exports more than its limit at once is refused with the limit,
    never without."""

    def probe(port: int) -> None:
        limited = name == "limited"
        sent, address = args.limit_count + 2, lambda _: "192.0.2.1"
        SCENARIO.probe(port, args, sent, address, limited, f"limited={limited}")

    addresses = [
        f"10.1.0.{client + 1}"
        for client in range(args.slow_clients)
        for _ in range(args.slow_connections)
    ]
    result, watched = SCENARIO.run(name, setup, args, probe, addresses)
    s = result["summary"]
    log(
        f"{name:9}  exports in flight mean {s['slow_in_flight_mean']} max "
        f"{s['slow_in_flight_max']}, served {s['slow_served_per_s']}/s refused "
        f"{s['slow_refused_per_s']}/s | ping p50 {s['fast_p50_ms']} ms p99 {s['fast_p99_ms']}"
        f" ms, {s['fast_answered_per_s']}/s answered, {s['fast_unanswered']} unanswered | "
        f"{watched.summary()}"
    )
    return result


def plot(payload: dict[str, Any], path: Path) -> None:
    """The two runs side by side, per second: exports in flight, exports served and refused,
    ping latency, pings answered."""
    settings = payload["settings"]
    titles = {
        "unlimited": "no concurrency limit",
        "limited": f"concurrency limit {settings['limit']} per client "
        f"({settings['slow_clients']} clients: at most {settings['share']} exports)",
    }
    title = (
        f"gunicorn, {settings['workers']} sync workers: /api/export/ (sleeps "
        f"{settings['slow_seconds'] * 1e3:.0f} ms) from {settings['slow_clients']} clients x "
        f"{settings['slow_connections']} connections, /api/ping/ at {settings['fast_rate']}/s"
    )
    SCENARIO.plot(payload, path, titles, ("limited", "limit x clients"), title)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = SCENARIO.parser(__doc__)
    parser.add_argument("--slow-clients", type=int, default=2, help="export client addresses")
    parser.add_argument("--slow-connections", type=int, default=12, help="threads per client")
    parser.add_argument("--refused-wait", type=float, default=0.2, help="s after a 429")
    parser.add_argument("--limit", default="2/min", help="concurrency limit per client")
    parser.add_argument("--fast-rate", type=float, default=40, help="pings per second")
    args = SCENARIO.parse(parser, argv, "load_concurrency")
    args.limit_count = int(args.limit.split("/")[0])
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def runs(setup: loadkit.Setup) -> list[dict[str, Any]]:
        unlimited = one_run("unlimited", setup, args)
        add_concurrency_rule(args.limit)
        return [unlimited, one_run("limited", setup, args)]

    share = args.limit_count * args.slow_clients
    prefix = "django-throttle-concurrency-"
    return loadkit.run_all(args, prefix, NEVER_DENY, runs, plot, share=share, tier_limit=NEVER_DENY)


if __name__ == "__main__":
    sys.exit(main())
