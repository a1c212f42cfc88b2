"""The benchmark script runs end to end and counts what it should: one Redis round trip and no
SQL per decision. Its timings are for people reading them, never asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "bench_throttle.py"


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
    for path in ("raw_evalsha", "policy_throttle", "drf_user_rate_throttle"):
        assert report["decisions_per_second"][path]["median"] > 0
    assert set(report["targets"]) == {"policy_vs_raw_evalsha", "policy_vs_drf"}
