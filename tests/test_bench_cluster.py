"""bench/bench_cluster.py runs end to end on its own server and cluster, and counts what it
should: one round trip and one counting command per decision on both topologies, every
primary holding keys, an exact limit under racing threads. Its timings are never asserted."""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench_scripts import run_json

CLIENTS = 2000
SHARDS = (16, 64)
PATHS = ("ping_single", "hit_single", "ping_cluster", "hit_cluster")


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return run_json(
        "bench_cluster.py",
        *("--seconds", "0.3", "--clients", str(CLIENTS), "--accounting", "200"),
        *("--shards", ",".join(map(str, SHARDS)), "--by-slot", "16,64"),
    )


@pytest.mark.slow
def test_every_path_is_one_round_trip_per_decision(report: dict[str, Any]) -> None:
    paths = report["paths"]
    assert set(paths) == set(PATHS)
    for key, row in paths.items():
        assert row["decisions_per_s"] > 0 and row["vs_ping"] > 0, key
        # One round trip per call, plus the occasional reconnect.
        assert 1.0 <= row["round_trips"] <= 1.05, (key, row)
        assert row["client_cpu_us"] is not None and row["server_us"] >= 0, (key, row)
    for key in ("hit_single", "hit_cluster"):
        assert paths[key]["commands"] == {"fcall": pytest.approx(1.0)}, paths[key]
    assert set(report["cluster_vs_single"]) == {"hit_vs_ping", "hit", "ping"}


@pytest.mark.slow
def test_keys_and_counting_commands_reach_every_primary(report: dict[str, Any]) -> None:
    computed = {row["shards"]: row["clients_per_primary"] for row in report["by_slot"]}
    assert [row["shards"] for row in report["spread"]] == list(SHARDS)
    for row in report["spread"]:
        assert row["clients"] == CLIENTS
        assert len(row["primaries"]) == 3
        assert 1.0 <= row["round_trips"] <= 1.05, row
        assert 1.0 <= row["counting_commands_per_decision"] <= 1.05, row
        for primary in row["primaries"]:
            assert primary["keys"] > 0 and primary["counting_commands"] > 0, primary
            assert primary["slots"] != "-", primary
        assert sum(p["counting_commands"] for p in row["primaries"]) >= CLIENTS
        assert row["keys_max_min"] >= 1.0 and row["commands_max_min"] >= 1.0
        if row["expiry_paused"]:  # every key kept: two limits, one key each per client
            assert row["keys_per_decision"] == 2.0
            keys = [p["keys"] for p in row["primaries"]]
            assert keys == [2 * n for n in computed[row["shards"]]], (keys, computed)


@pytest.mark.slow
def test_racing_threads_are_admitted_exactly_the_limit(report: dict[str, Any]) -> None:
    rows = report["exactness"]
    assert {row["topology"] for row in rows} == {"single", "cluster"}
    for row in rows:
        assert row["errors"] == 0, row
        assert row["tries"] > row["limit"], row
        assert row["admitted"] == row["limit"], row
    assert report["targets"] and all(isinstance(t["met"], bool) for t in report["targets"])
