"""The benchmark script runs end to end and counts what it should: one Redis round trip and no
SQL per decision. Its timings are for people reading them, never asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "bench_throttle.py"
RACE = ROOT / "bench" / "race.py"


@pytest.mark.slow
def test_bench_counts_one_round_trip_and_no_sql_per_decision(redis_url: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url}
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the script configures Django itself
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "0.3", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)

    policy = report["policy_throttle"]
    # One EVALSHA per decision, plus the occasional policy version check.
    assert policy["evalsha_per_decision"] == pytest.approx(1.0)
    assert 1.0 <= policy["round_trips_per_decision"] <= 1.05, policy
    assert policy["sql_queries_per_decision"] == 0, policy
    assert policy["backend_errors_logged"] == 0, result.stderr
    assert report["drf_user_rate_throttle"]["denied"] == 0
    for path in ("ping", "raw_evalsha", "policy_throttle", "drf_user_rate_throttle"):
        assert report["decisions_per_second"][path]["median"] > 0
    assert set(report["targets"]) == {"policy_vs_raw_evalsha", "policy_vs_drf"}


@pytest.mark.slow
def test_race_on_a_shared_redis_deletes_only_its_own_keys() -> None:
    """``REDIS_URL`` names a Redis that holds someone else's data: race.py must leave every
    foreign key alone (no FLUSHDB) and take all of its own keys away."""
    server = RedisServer().start()
    try:
        client = server.client()
        foreign = {
            b"someone:else": b"precious",
            b"dt:{abc}:t1": b"1 2",  # looks like a throttle key of another deployment
            b"dtrace-not-ours": b"x",  # shares race.py's prefix stem, not its random prefix
        }
        client.mset(foreign)
        env = {**os.environ, "REDIS_URL": server.url}
        env.pop("DJANGO_SETTINGS_MODULE", None)  # the script configures Django itself
        result = subprocess.run(
            [sys.executable, str(RACE), "--requests", "12", "--rounds", "1"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert result.returncode == 0, result.stderr
        assert "PolicyThrottle admitted  10" in result.stdout, result.stdout
        assert {key: client.get(key) for key in client.scan_iter()} == foreign
        client.close()
    finally:
        server.stop()


@pytest.mark.slow
def test_failure_benchmark_counts_a_handful_of_failures_then_recovers() -> None:
    """bench_failures.py runs end to end on its own server; its counts, not its timings."""
    threads = 2
    env = {**os.environ}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("REDIS_URL", None)
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_failures.py"),
            *("--seconds", "0.3", "--threads", str(threads), "--clients", "100", "--json"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["healthy"]["counted"] == report["healthy"]["decisions"] > 0
    rows = {(row["fault"], row["breaker"]): row for row in report["faults"]}
    assert set(rows) == {(f, b) for f in ("killed", "hung") for b in ("on", "off")}
    for fault in ("killed", "hung"):
        on = rows[fault, "on"]
        assert 3 <= on["failures_before_open"] <= 3 + threads, on
        assert on["short_circuited"] > 0, on
        assert on["counted"] == 0, on
        assert on["recovery_s"] is not None, on
    # Without a breaker every request of a hung Redis waits for its timeout.
    hung_off = rows["hung", "off"]
    assert hung_off["failures_before_open"] is None
    assert hung_off["backend_failures"] >= hung_off["decisions"]
