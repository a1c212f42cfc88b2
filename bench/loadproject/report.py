"""What ``bench/load_test.py`` writes: the machine it ran on, the CSV and the plot."""

from __future__ import annotations

import csv
import os
import platform
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

COLUMNS = (
    "server",
    "variant",
    "concurrency",
    "rps",
    "rps_min",
    "rps_max",
    "vs_none",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "max_ms",
    "requests",
    "non_2xx",
    "socket_errors",
    "server_log_problems",
    "server_cpu_us",
    "redis_cpu_us",
    "own_cpu",
    "foreign_cpu",
    "repetitions",
)
PACKAGES = (
    "Django",
    "djangorestframework",
    "django-redis",
    "redis",
    "gunicorn",
    "uvicorn",
    "uvloop",
    "httptools",
)


def _first_line(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip() if lines else "unknown"


def machine_info(redis_version: str, root: Path) -> dict[str, Any]:
    """CPU, memory, OS, versions and the commit measured."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        memory = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        memory_gb: float | None = round(int(memory) / 1024**2, 1)
    except OSError:
        memory_gb = None
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    import django_throttle

    package = Path(django_throttle.__file__).resolve().parent
    if package.is_relative_to(root):
        code = _first_line(["git", "-C", str(root), "rev-parse", "--short", "HEAD"])
        status = ["git", "-C", str(root), "status", "--porcelain", "--", "django_throttle"]
        if subprocess.run(status, capture_output=True, text=True).stdout.strip():
            code += " + uncommitted django_throttle changes"
    else:
        code = f"django_throttle from {package}"
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "memory_gb": memory_gb,
        "os": platform.platform(),
        "python": platform.python_version(),
        "redis_server": redis_version,
        "wrk": _first_line(["wrk", "-v"]),
        "packages": versions,
        "code": code,
    }


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The table printed at the end (and pasted into bench/README.md)."""
    lines = [
        "| server | variant | conc. | req/s | vs none | p50 ms | p99 ms | server CPU µs/req "
        "| Redis CPU µs/req | non-2xx | errors |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        errors = row["socket_errors"] + row["server_log_problems"]
        lines.append(
            f"| {row['server']} | {row['variant']} | {row['concurrency']} | {row['rps']:.0f} "
            f"| {row['vs_none']:.2f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} "
            f"| {row['server_cpu_us']:.0f} | {row['redis_cpu_us']:.0f} "
            f"| {row['non_2xx']} | {errors} |"
        )
    return "\n".join(lines)


COLORS = {"none": "tab:gray", "policy": "tab:blue", "drf": "tab:orange"}
STYLES = {"gunicorn": "-", "uvicorn": "--"}
LABELS = {
    "none": "no throttle",
    "policy": "django_throttle PolicyThrottle",
    "drf": "DRF AnonRateThrottle (django-redis)",
}


def plot(rows: list[dict[str, Any]], path: Path, machine: dict[str, Any], note: str) -> None:
    """Two panels against concurrency: median throughput and median p99 latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 6.2))
    order = {name: i for i, name in enumerate((*STYLES, *COLORS))}
    lines = sorted(
        {(row["server"], row["variant"]) for row in rows},
        key=lambda line: (order.get(line[0], 99), order.get(line[1], 99)),
    )
    for server, variant in lines:
        cells = sorted(
            (row for row in rows if (row["server"], row["variant"]) == (server, variant)),
            key=lambda row: row["concurrency"],
        )
        xs = [row["concurrency"] for row in cells]
        style = {
            "color": COLORS.get(variant),
            "linestyle": STYLES.get(server, ":"),
            "marker": "o",
            "label": f"{server}: {LABELS.get(variant, variant)}",
        }
        left.plot(xs, [row["rps"] for row in cells], **style)
        right.plot(xs, [row["p99_ms"] for row in cells], **style)
        bad = [row for row in cells if row["non_2xx"] or row["socket_errors"]]
        for axis, key in ((left, "rps"), (right, "p99_ms")):
            axis.scatter(
                [row["concurrency"] for row in bad],
                [row[key] for row in bad],
                marker="x",
                s=90,
                color="red",
                zorder=3,
            )
    for axis, label in ((left, "requests/s (median)"), (right, "p99 latency, ms (median)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent connections (wrk -c)")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
        axis.set_xticks(sorted({row["concurrency"] for row in rows}))
        axis.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    left.set_ylim(bottom=0)
    right.set_yscale("log")
    handles, labels = left.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    figure.suptitle(
        f"One DRF JSON endpoint, 2 workers, random X-Forwarded-For per request{note}\n"
        f"{machine['cpu']}, {machine['logical_cpus']} CPUs shared by server, Redis "
        f"{machine['redis_server']} and wrk; Python {machine['python']}, "
        f"Django {machine['packages'].get('Django')}, code: {machine['code']}",
        fontsize=10,
    )
    right.set_title("red x: non-2xx responses or socket errors", fontsize=8, loc="right")
    figure.tight_layout(rect=(0, 0.13, 1, 0.93))
    figure.savefig(path, dpi=110)
    plt.close(figure)
