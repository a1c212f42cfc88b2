"""Which requests each algorithm lets through, for the same bursty client and nominal limit.

Run from the repository root::

    .venv/bin/python bench/plot_algorithms.py [--limit 100] [--days 3] [--out-dir DIR] [--no-png]

One client sends a steady trickle (one request every 10 minutes) plus bursts (40 requests,
one a second, every 6 hours) for ``--days`` days from 12:00 UTC, under one limit of
``--limit`` per day for every algorithm (the calendar quota counts Europe/Berlin days). The
decisions come from ``MemoryBackend`` with ``now=`` (the Redis scripts' twin), so the run is
deterministic and needs no server. It writes ``algorithms.png`` (allowed and attempted
requests per hour, one panel per algorithm, and every algorithm's running total),
``algorithms.csv`` (every decision) and ``algorithms.json`` (settings and totals, among them
the most any 24 hours admitted: the nominal limit is exact only where that equals it).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from bisect import bisect_left
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

START = datetime(2026, 3, 2, 12, tzinfo=UTC).timestamp()
DAY = 86400
TRICKLE_EVERY = 600
BURST_EVERY = 6 * 3600
BURST_FIRST = 9 * 3600  # 21:00 UTC: three hours before the first window boundary
BURST_SIZE = 40
TIMEZONE = "Europe/Berlin"
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def traffic(days: float) -> list[float]:
    """Offsets in seconds from START of every request, sorted."""
    end = days * DAY
    trickle = [float(t) for t in range(0, int(end), TRICKLE_EVERY)]
    bursts = [
        float(at + i)
        for at in range(BURST_FIRST, int(end), BURST_EVERY)
        for i in range(BURST_SIZE)
        if at + i < end
    ]
    return sorted(trickle + bursts)


def decide(algorithms: Sequence[str], limit: int, offsets: Sequence[float]) -> list[dict[str, Any]]:
    """Every request under every algorithm, each on a fresh MemoryBackend."""
    from django.conf import settings

    if not settings.configured:  # the backend reads its key prefix and shards from them
        settings.configure()
    from django_throttle.backends.memory import MemoryBackend
    from django_throttle.rates import Limit

    rows = []
    for algorithm in algorithms:
        zone = TIMEZONE if algorithm == "calendar_quota" else ""
        limits = (Limit.build("p1", f"{limit}/day", algorithm=algorithm, timezone=zone),)
        backend = MemoryBackend(clock=lambda: START)
        for offset in offsets:
            decision = backend.hit("client", limits, now=START + offset)
            rows.append(
                {
                    "algorithm": algorithm,
                    "t_s": offset,
                    "allowed": int(decision.allowed),
                    "remaining": decision.remaining,
                    "retry_after_s": decision.retry_after,
                }
            )
    return rows


def most_in_a_day(times: Sequence[float]) -> int:
    """The most requests among ``times`` (sorted) inside any 24 hours."""
    return max((bisect_left(times, t + DAY) - i for i, t in enumerate(times)), default=0)


def summarise(algorithms: Sequence[str], rows: Sequence[dict[str, Any]], days: float) -> dict:
    hours = int(days * 24)
    summary = {}
    for algorithm in algorithms:
        allowed = [r["t_s"] for r in rows if r["algorithm"] == algorithm and r["allowed"]]
        per_hour = [0] * hours
        for t in allowed:
            per_hour[min(hours - 1, int(t // 3600))] += 1
        summary[algorithm] = {
            "allowed": len(allowed),
            "most_in_any_24h": most_in_a_day(allowed),
            "allowed_per_hour": per_hour,
        }
    return summary


def same_decisions(algorithms: Sequence[str], rows: Sequence[dict[str, Any]]) -> list[str]:
    """The largest group of algorithms that allowed exactly the same requests."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for algorithm in algorithms:
        decisions = tuple(r["allowed"] for r in rows if r["algorithm"] == algorithm)
        groups.setdefault(decisions, []).append(algorithm)
    largest = max(groups.values(), key=len, default=[])
    return [name.replace("_", " ") for name in largest] if len(largest) > 1 else []


def plot(
    algorithms: Sequence[str], rows: Sequence[dict[str, Any]], settings: dict, path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = int(settings["days"] * 24)
    figure, axes = plt.subplots(
        len(algorithms) + 1, 1, figsize=(11, 2 * len(algorithms) + 3.5), sharex=True
    )
    attempted = [0] * hours
    for offset in settings["offsets"]:
        attempted[min(hours - 1, int(offset // 3600))] += 1
    edges = list(range(hours))
    midnights = [h for h in range(hours) if (START / 3600 + h) % 24 == 0]
    total = axes[-1]
    for number, algorithm in enumerate(algorithms):
        colour = COLOURS[number % len(COLOURS)]
        mine = [r for r in rows if r["algorithm"] == algorithm]
        allowed = [0] * hours
        for row in mine:
            allowed[min(hours - 1, int(row["t_s"] // 3600))] += row["allowed"]
        axis = axes[number]
        axis.bar(edges, attempted, width=1, align="edge", color="#dddddd", label="attempted")
        axis.bar(edges, allowed, width=1, align="edge", color=colour, label="allowed")
        for hour in midnights:
            axis.axvline(hour, color="grey", linestyle=":", linewidth=0.8)
        stats = settings["summary"][algorithm]
        axis.set_title(
            f"{algorithm.replace('_', ' ')}: {stats['allowed']} of {len(mine)} allowed, "
            f"at most {stats['most_in_any_24h']} in any 24 h",
            fontsize=10,
            loc="left",
        )
        axis.set_ylabel("requests / hour")
        axis.set_ylim(0, max(attempted) * 1.1)
        running, count = [], 0
        for row in mine:
            count += row["allowed"]
            running.append(count)
        total.step(
            [r["t_s"] / 3600 for r in mine], running, where="post", color=colour, label=algorithm
        )
    axes[0].legend(loc="upper right", fontsize=8)
    limit, days = settings["limit"], settings["days"]
    total.plot([0, days * 24], [0, limit * days], color="black", linestyle="--", linewidth=0.8)
    total.set_ylabel("allowed so far")
    total.set_xlabel("hours since 12:00 UTC (dotted: UTC midnight)")
    same = same_decisions(algorithms, rows)
    total.set_title(
        f"running total; dashed: {limit}/day spread evenly"
        + (f"; {', '.join(same)}: the same requests (lines coincide)" if same else ""),
        fontsize=10,
        loc="left",
    )
    total.legend(loc="upper left", fontsize=8, ncol=2)
    figure.suptitle(
        f"Same client, same nominal limit for every algorithm: {limit}/day (burst {limit})\n"
        f"traffic: one request every {TRICKLE_EVERY // 60} min plus {BURST_SIZE}-request "
        f"bursts every {BURST_EVERY // 3600} h; the calendar quota counts {TIMEZONE} days",
        fontsize=11,
    )
    figure.tight_layout(rect=(0, 0, 1, 0.98))
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=100, help="requests per day")
    parser.add_argument("--days", type=float, default=3.0, help="days of traffic")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--only", nargs="*", default=(), help="algorithm values to plot")
    parser.add_argument("--json", action="store_true", help="print the totals as JSON")
    parser.add_argument("--no-png", action="store_true", help="only the CSV and JSON")
    args = parser.parse_args(argv)
    if args.limit < 1 or args.days <= 0 or args.days * 24 < 1:
        parser.error("--limit must be positive and --days at least an hour")

    from django_throttle.rates import Algorithm

    algorithms = [a.value for a in Algorithm if not args.only or a.value in args.only]
    offsets = traffic(args.days)
    rows = decide(algorithms, args.limit, offsets)
    summary = summarise(algorithms, rows, args.days)
    meta = {
        "limit": args.limit,
        "days": args.days,
        "start_utc": datetime.fromtimestamp(START, UTC).isoformat(),
        "trickle_every_s": TRICKLE_EVERY,
        "burst_every_s": BURST_EVERY,
        "burst_size": BURST_SIZE,
        "calendar_timezone": TIMEZONE,
        "requests": len(offsets),
        "summary": summary,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if not args.no_png:
        plot(algorithms, rows, {**meta, "offsets": offsets}, args.out_dir / "algorithms.png")
    with open(args.out_dir / "algorithms.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (args.out_dir / "algorithms.json").write_text(json.dumps(meta, indent=2) + "\n")
    if args.json:
        print(json.dumps(meta, indent=2))
    else:
        for algorithm, stats in summary.items():
            print(
                f"{algorithm:24} allowed {stats['allowed']:4} of {len(offsets)}, "
                f"at most {stats['most_in_any_24h']} in any 24 h"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
