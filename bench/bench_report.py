"""The table ``bench_throttle.py`` prints (``--json`` prints the same numbers unformatted)."""

from __future__ import annotations

from typing import Any


def _number(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(140, Console().width))
    paths = result["paths"]
    fixtures = result["fixtures"]
    table = Table(
        title=(
            f"One run: {result['seconds_per_path']:g} s per path in {result['rounds']} "
            f"interleaved rounds, Redis {result['redis']['version']}, {fixtures['users']:,} "
            f"users ({fixtures['direct_assignments']:,} assigned directly, "
            f"{fixtures['group_members']:,} through a group); load average "
            f"{result['load_average'][0]:.1f} on {result['cpus']} CPUs"
            + ("; this process and redis-server pinned to CPU 0" if result.get("one_cpu") else "")
        )
    )
    for column in (
        "path", "dec/s", "÷PING", "p50 µs", "p99 µs", "round trips", "SQL",
        "bytes/dec", "server µs/dec", "MEMORY USAGE B/key", "used_memory B/(client x limit)",
    ):  # fmt: skip
        table.add_column(column, justify="left" if column == "path" else "right")
    for key, row in paths.items():
        if key == "latency":
            continue
        table.add_row(
            row["label"],
            _number(row["decisions_per_s"]),
            f"{row['vs_ping']:.2f}",
            _number(row["p50_us"], 1),
            _number(row["p99_us"], 1),
            f"{row['round_trips']:.3f}",
            f"{row['sql_queries']:.3f}",
            _number(row["wire_bytes"]),
            _number(row["server_us"], 1),
            _number(row["memory_usage_per_key"]),
            _number(row["used_memory_marginal"]),
        )
    console.print(table)
    latency = paths["latency"]
    console.print(
        f"5   whole DRF request (test client, {latency['pairs']:,} rounds of 3 views x "
        f"{latency['repetitions']}): without throttle p50 {latency['plain_p50_us']:.0f} / "
        f"p99 {latency['plain_p99_us']:.0f} µs, with p50 {latency['throttled_p50_us']:.0f} / "
        f"p99 {latency['throttled_p99_us']:.0f} µs: added p50 {latency['added_p50_us']:+.0f} "
        f"µs, p99 {latency['added_p99_us']:+.0f} µs"
        f" (non-200: {latency['bad_status']}, missing headers: {latency['missing_headers']})\n"
        f"5f  the floor, one PING round trip in the same request instead of the throttle: "
        f"added p50 {latency['ping_added_p50_us']:+.0f} µs, p99 "
        f"{latency['ping_added_p99_us']:+.0f} µs; the throttle beyond it: p50 "
        f"{latency['above_ping_p50_us']:+.0f} µs, p99 {latency['above_ping_p99_us']:+.0f} µs"
    )
    targets = Table(title="Targets (printed, never asserted)")
    for column in ("target", "measured", "goal", ""):
        targets.add_column(column, justify="left" if column == "target" else "right")
    for target in result["targets"]:
        value = target["value"]
        shown = "-" if value is None else f"{value:.2f}" if value < 10 else f"{value:,.0f}"
        verdict = "[green]met[/]" if target["met"] else "[red]not met[/]"
        targets.add_row(
            target["target"], shown, f"{target['comparison']} {target['goal']:g}", verdict
        )
    for row in result.get("floor", ()):
        value = row["value"]
        targets.add_row(
            f"[dim]{row['context']}[/]", "-" if value is None else f"{value:,.0f}", "", "context"
        )
    console.print(targets)
    drf, users = result["drf"], result["never_seen_users"]
    console.print(
        "Timed: only the step (3: PolicyThrottle().allow_request + add_headers on a "
        "prebuilt response; requests prebuilt and already authenticated). Round trips: "
        "counted at the socket in this process. Bytes: the server's INFO net input + output per "
        "decision, minus the INFO calls' own. MEMORY USAGE: median of sampled keys. "
        "used_memory: median growth per key written over ten chunks of fresh clients, "
        "expiry paused (hash-table doublings excluded: they add 8-16 B per key per table, "
        "amortised; the whole-pass figure is used_memory_per_key in --json)."
    )
    console.print(
        f"4: {drf['clients']:,} users with {drf['history']} timestamps each "
        f"({drf['memory_usage_per_key']:,} B per key, {drf['used_memory_per_client']:,.0f} B "
        f"used_memory per client), {drf['denied']} denied. 3b used {users['used']:,} users, "
        f"wrapped around {users['wrapped']} times. Backend errors logged: "
        f"{result['backend_errors_logged']}."
    )
    if result["profile"]:
        print(result["profile"])  # unwrapped: pstats lines are wider than a terminal
