"""The spread over a cluster's primaries, from ``bench_cluster.py``'s report: the docs' figure.

Run from the repository root, after ``bench_cluster.py --out-dir bench/results``::

    .venv/bin/python bench/plot_cluster.py [--report bench/results/cluster.json]
        [--out docs/explanation/cluster-spread.png]

Two panels, one bar per primary and spread pass (``--shards`` count): the keys each primary
held after the pass (``DBSIZE``) and the counting commands it served (``evalsha`` + ``eval``),
with a dashed line at an even share (the pass's total over the primaries). The legend gives
each pass's max/min. A small PNG (6 x 3 in at 100 dpi).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")
PANELS = (
    ("keys", "keys_max_min", "keys held (DBSIZE)"),
    ("counting_commands", "commands_max_min", "counting commands served"),
)


def plot(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spreads = report["spread"]
    names = [primary["primary"] for primary in spreads[0]["primaries"]]
    width = 0.8 / len(spreads)
    figure, axes = plt.subplots(1, len(PANELS), figsize=(6, 3), dpi=100)
    for axis, (field, ratio, title) in zip(axes, PANELS, strict=True):
        top = 0.0
        for number, row in enumerate(spreads):
            values = [primary[field] / 1000 for primary in row["primaries"]]
            offsets = [i + (number - (len(spreads) - 1) / 2) * width for i in range(len(names))]
            colour = COLOURS[number % len(COLOURS)]
            axis.bar(
                offsets,
                values,
                width,
                color=colour,
                label=f"{row['shards']} shards: max/min {row[ratio]:.2f}",
            )
            top = max(top, *values)
            even = sum(values) / len(values)
            axis.hlines(even, -0.5, len(names) - 0.5, colors="grey", linestyles="dashed", lw=0.8)
        axis.set_title(title, fontsize=9)
        axis.set_xticks(range(len(names)))
        axis.set_xticklabels(
            [
                f"{name}\n{p['slots']}"
                for name, p in zip(names, spreads[0]["primaries"], strict=True)
            ],
            fontsize=7,
        )
        axis.set_ylabel("thousands", fontsize=8)
        axis.tick_params(axis="y", labelsize=7)
        axis.set_ylim(0, top * 1.4)
        axis.legend(fontsize=6.5, loc="upper center", frameon=False)
    figure.suptitle(
        f"{spreads[0]['clients']:,} new clients on 3 primaries (dashed: an even share)",
        fontsize=9,
    )
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=ROOT / "bench" / "results" / "cluster.json")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "docs" / "explanation" / "cluster-spread.png"
    )
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text())
    if not report.get("spread"):
        parser.error(f"{args.report} has no spread passes")
    plot(report, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
