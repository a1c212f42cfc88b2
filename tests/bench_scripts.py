"""Run one of ``bench/``'s scripts once with ``--json`` and read its report: the smoke tests
that keep the benchmarks from rotting (their counts are checked, never their timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_json(script: str, *args: str, redis_url: str | None = None) -> dict[str, Any]:
    """``bench/<script> <args> --json`` in a fresh interpreter; without ``redis_url`` the
    script starts its own ``redis-server``."""
    env = {**os.environ}
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the scripts configure Django themselves
    env.pop("REDIS_URL", None)
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args, "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))
