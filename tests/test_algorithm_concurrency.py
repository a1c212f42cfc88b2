"""Every algorithm admits exactly its limit when requests arrive together: 4 processes x 16
threads released by one barrier hit one key of a real Redis. Also runs the algorithm benchmark
and plot once, tiny, so they keep working (their counts, never their timings)."""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_throttle.rates import Algorithm, windows
from tests.bench_scripts import run_json

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = 4
THREADS = 16
LIMIT = 40
#: No window may start or end this close to now: the test takes a few seconds.
MARGIN_S = 120
#: Window lengths to choose from: when now is near a boundary of one, it is far from the next.
PERIODS_H = (24, 25, 26)
#: Time zones whose midnights are hours apart (UTC, +5:30, -3:30 or -2:30).
ZONES = ("UTC", "Asia/Kolkata", "America/St_Johns")


def quiet_limit(algorithm: str, now: float) -> dict[str, Any]:
    """``Limit.build`` arguments for ``LIMIT`` requests whose windows neither start nor end
    within ``MARGIN_S`` of ``now`` (token algorithms earn one token back in 36 minutes)."""
    if algorithm in (Algorithm.FIXED_WINDOW, Algorithm.SLIDING_COUNTER):
        for hours in PERIODS_H:
            into = now % (hours * 3600)
            if MARGIN_S < into < hours * 3600 - MARGIN_S:
                return {"rate": f"{LIMIT}/{hours}h", "algorithm": algorithm}
    if algorithm == Algorithm.CALENDAR:
        now_us = int(now * 1e6)
        for zone in ZONES:
            _, start, end, _ = windows("day", zone, now_us)
            if start + MARGIN_S * 1e6 < now_us < end - MARGIN_S * 1e6:
                return {"rate": f"{LIMIT}/day", "algorithm": algorithm, "timezone": zone}
    return {"rate": f"{LIMIT}/day", "algorithm": algorithm}


def _serve(url: str, barrier: Any, tasks: Any, results: Any) -> None:
    """One worker process: for each task, ``THREADS`` threads wait at the shared barrier, then
    each makes one decision on the same client; the process reports how many were allowed."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    import redis
    from django.conf import settings

    from django_throttle.backends.redis import RedisBackend
    from django_throttle.rates import Limit

    while (task := tasks.get()) is not None:
        prefix, arguments = task
        settings.DJANGO_THROTTLE_KEY_PREFIX = prefix
        if url.startswith("redis+cluster://"):  # tests/test_cluster.py: the backend's own client
            settings.DJANGO_THROTTLE_REDIS_URL = url
            settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 10, "timeout": 10}
            settings.DJANGO_THROTTLE_REDIS_URL = f"{url}?shards=16"
            backend = RedisBackend()
            client: Any = backend.client
        elif url.startswith("redis+sentinel://"):  # tests/test_sentinel.py: the backend's own
            settings.DJANGO_THROTTLE_REDIS_URL = url
            settings.DJANGO_THROTTLE_REDIS_OPTIONS = {
                "socket_timeout": 10, "socket_connect_timeout": 10, "timeout": 10
            }  # fmt: skip
            backend = RedisBackend()
            client = backend.client
        else:
            client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=10)
            backend = RedisBackend(client)
        limits = (Limit.build("c1", **arguments),)
        outcomes: list[object] = []

        def one(backend: Any = backend, limits: Any = limits, outcomes: Any = outcomes) -> None:
            try:
                backend.peek("warm-up", limits)  # script loaded, a connection each
                barrier.wait(timeout=30)
                outcomes.append(backend.hit("hot", limits).allowed)
            except Exception as error:
                outcomes.append(repr(error))

        threads = [threading.Thread(target=one) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        client.close()
        results.put(outcomes)


@pytest.fixture(scope="module")
def workers(redis_url: str) -> Iterator[tuple[Any, Any]]:
    """``PROCESSES`` spawned workers (no fork of the test process), started once."""
    with spawned_workers(redis_url) as queues:
        yield queues


@contextlib.contextmanager
def spawned_workers(url: str) -> Iterator[tuple[Any, Any]]:
    """``PROCESSES`` workers counting on ``url``, as their task and result queues; stopped and
    joined on leaving, however the block ends."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES * THREADS)
    tasks, results = context.Queue(), context.Queue()
    processes = [
        context.Process(target=_serve, args=(url, barrier, tasks, results), daemon=True)
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    try:
        yield tasks, results
    finally:
        for _ in processes:
            tasks.put(None)
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


def race(queues: tuple[Any, Any], prefix: str, algorithm: str) -> None:
    """One race of ``PROCESSES`` x ``THREADS`` requests at one client of a ``LIMIT`` of
    ``algorithm`` (keys under ``prefix``): exactly ``LIMIT`` admitted, and no errors."""
    tasks, results = queues
    arguments = quiet_limit(algorithm, time.time())
    for _ in range(PROCESSES):
        tasks.put((prefix, arguments))
    outcomes = [outcome for _ in range(PROCESSES) for outcome in results.get(timeout=120)]
    errors = [outcome for outcome in outcomes if not isinstance(outcome, bool)]
    assert not errors, errors
    assert len(outcomes) == PROCESSES * THREADS
    assert sum(outcomes) == LIMIT, (arguments, sum(outcomes))


def race_on(url: str, prefix: str, algorithm: str) -> None:
    """:func:`race` with workers of its own on ``url`` (a cluster, Sentinel or TLS URL)."""
    with spawned_workers(url) as queues:
        race(queues, prefix, algorithm)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", Algorithm.values)
def test_exactly_the_limit_is_admitted_from_64_concurrent_requests(
    algorithm: str, workers: tuple[Any, Any], _isolated_throttle: str
) -> None:
    race(workers, _isolated_throttle, algorithm)


def test_quiet_limits_keep_every_window_boundary_away() -> None:
    """At a UTC midnight every window algorithm picks a window that does not end there."""
    midnight = 1_772_409_600  # 2026-03-02 00:00 UTC
    for algorithm in Algorithm.values:
        arguments = quiet_limit(algorithm, midnight + 30)
        assert arguments["rate"] != f"{LIMIT}/day" or algorithm not in (
            Algorithm.FIXED_WINDOW,
            Algorithm.SLIDING_COUNTER,
        )
        assert arguments.get("timezone", "UTC") != "UTC" or algorithm != Algorithm.CALENDAR


@pytest.mark.slow
def test_algorithm_benchmark_runs_and_counts_one_round_trip_per_decision() -> None:
    report = run_json(
        "bench_algorithms.py",
        *("--seconds", "0.2", "--clients", "300", "--accounting", "100"),
        *("--log-limits", "10,200", "--log-requests", "30"),
    )
    paths = report["paths"]
    assert set(paths) == {"ping", "evalsha", *Algorithm.values}
    for algorithm in Algorithm.values:
        row = paths[algorithm]
        assert row["decisions_per_s"] > 0, algorithm
        assert 1.0 <= row["round_trips"] <= 1.05, (algorithm, row)
        assert row["memory_usage_per_key"] > 0, algorithm
        assert row["script_us"] > 0, algorithm
    log = report["sliding_window_log"]
    assert [row["limit"] for row in log] == [10, 200]
    for row in log:
        assert row["allowed_as_expected"] == row["denied_as_expected"] == 1.0, row
        assert row["entries_after"] == row["limit"], row
    assert report["targets"] and all(isinstance(t["met"], bool) for t in report["targets"])


@pytest.mark.slow
def test_algorithm_plot_writes_its_files_and_the_log_is_exact(tmp_path: Path) -> None:
    # matplotlib comes with the bench extra; without it the data files are still checked.
    png = importlib.util.find_spec("matplotlib") is not None
    args = ("--limit", "20", "--days", "1.5", "--out-dir", str(tmp_path))
    report = run_json("plot_algorithms.py", *args, *(() if png else ("--no-png",)))
    for name in ("algorithms.png",) * png + ("algorithms.csv", "algorithms.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    summary = report["summary"]
    assert set(summary) == set(Algorithm.values)
    assert summary[Algorithm.SLIDING_LOG]["most_in_any_24h"] == 20  # exact by design
    assert summary[Algorithm.FIXED_WINDOW]["most_in_any_24h"] <= 40  # the boundary burst
    for stats in summary.values():
        assert 0 < stats["allowed"] <= report["requests"]
