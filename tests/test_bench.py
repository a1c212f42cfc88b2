"""The benchmark script runs end to end and counts what it should: one Redis round trip and no
SQL per decision. Its timings are for people reading them, never asserted here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from django_throttle.rates import Limit
from tests.bench_scripts import ROOT, run_json
from tests.redis_servers import RedisServer

RACE = ROOT / "bench" / "race.py"


#: Paths whose every decision is one Redis round trip.
ONE_ROUND_TRIP = (
    "ping", "ping_raw", "evalsha", "evalsha_hot", "hit", "hit_hot",
    "full_anon", "full_user_new", "full_hot",
)  # fmt: skip


@pytest.mark.slow
def test_bench_counts_one_round_trip_and_no_sql_per_decision(redis_url: str) -> None:
    report = run_json(
        "bench_throttle.py",
        *("--seconds", "0.3", "--users", "300", "--drf-clients", "50", "--accounting", "200"),
        *("--latency-pairs", "20", "--latency-repetitions", "1"),
        redis_url=redis_url,
    )
    paths = report["paths"]
    for key in (*ONE_ROUND_TRIP, "drf"):
        assert paths[key]["decisions_per_s"] > 0, key
        assert paths[key]["p50_us"] > 0, key
    # One round trip per decision, plus the occasional policy version check or reconnect.
    for key in ONE_ROUND_TRIP:
        assert 1.0 <= paths[key]["round_trips"] <= 1.05, (key, paths[key])
    assert paths["full_anon"]["commands"]["fcall"] == pytest.approx(1.0)
    assert paths["drf"]["round_trips"] == pytest.approx(2.0)  # its GET and its SET
    for key in ("full_anon", "full_hot", "hit", "drf"):
        assert paths[key]["sql_queries"] == 0, (key, paths[key])
    assert paths["full_user_new"]["sql_queries"] <= 1
    for key in ("evalsha", "hit", "full_anon", "drf"):
        assert paths[key]["wire_bytes"] > 0, key
        assert paths[key]["memory_usage_per_key"] > 0, key
    assert paths["latency"]["bad_status"] == 0
    assert paths["latency"]["missing_headers"] == 0
    assert paths["latency"]["ping_added_p50_us"] is not None
    assert [row["value"] is not None for row in report["floor"]] == [True] * 4
    assert report["backend_errors_logged"] == 0
    assert report["drf"]["denied"] == 0
    assert report["targets"] and all(isinstance(t["met"], bool) for t in report["targets"])


@pytest.mark.slow
def test_async_bench_serves_every_request_of_a_burst(redis_url: str) -> None:
    """bench_async.py runs uvicorn end to end; its counts, not its timings."""
    requests = 40
    report = run_json(
        "bench_async.py",
        *("--requests", str(requests), "--repetitions", "1"),
        # Patient timeouts: a loaded test machine must not turn decisions into fail-opens.
        *("--redis-options", '{"socket_timeout": 5, "socket_connect_timeout": 5}'),
        redis_url=redis_url,
    )
    assert set(report["views"]) == {"/plain/", "/throttled/"}
    for view, row in report["views"].items():
        assert row["ok"] == requests and row["failed"] == 0, (view, row)
        assert row["degraded"] == 0, (view, row)
        assert row["proc_threads_peak"] >= 1
        assert row["jobs_per_request"] >= 0


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


@pytest.mark.slow
def test_python_overhead_bench_runs() -> None:
    """bench_python.py decides with a backend that answers at once: it must not need Redis."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_python.py")],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "µs per decision, no Redis:" in result.stdout


@pytest.mark.slow
def test_script_mix_bench_times_both_framings_of_every_algorithm() -> None:
    """bench_script_mix.py runs end to end on its own server: every algorithm, both framings
    (and the code defined once as a function library, on a server with functions) and both
    baselines timed by the server (the numbers themselves are never asserted)."""
    report = run_json("bench_script_mix.py", "--calls", "30", "--laps", "1")
    rows = report["server_us_per_call"]
    assert len(rows) == 7
    framings = (
        "own mix",
        "all seven",
        "minimal",
        *(["defined once"] if report["functions"] else []),
    )
    for row in rows.values():
        for name in framings:
            assert row[name] > 0, (name, row)
        assert row["ping"] >= 0, row  # 30 PINGs can add up to under a microsecond
    assert rows["token_bucket"]["flat"] > 0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_instructions_bench_counts_the_calls_of_the_package_and_both_baselines() -> None:
    """bench_instructions.py counts inside evalShaCommand under callgrind: a figure for the
    package's script, the minimal bucket and the flat one (the numbers are never asserted
    beyond being counted)."""
    report = run_json("bench_instructions.py", "--calls", "20", "--algorithms", "token_bucket")
    row = report["instructions_per_call"]["token_bucket"]
    assert report["minimal"] > 0 and row["package"] > 0 and row["flat"] > 0
    assert row["function"] > 0  # the package's FCALL


def test_the_flat_bucket_of_the_benchmark_decides_as_the_package_does(
    redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    """bench/flat_token_bucket.lua, the benchmark's measure of what the shared driver costs,
    does the package's work for one token bucket: the same replies to the same calls (cost,
    peek, denial, a cost above the capacity) and states of the same size."""
    from django_throttle.backends.redis import RedisBackend

    backend = RedisBackend()
    calls = backend._calls
    flat = redis_client.script_load((ROOT / "bench" / "flat_token_bucket.lua").read_text())
    limits = (Limit.build("flat", "3/hour"),)
    encoded = calls.encoded(limits)
    sha, source = calls.script(limits)
    redis_client.script_load(source)
    ours, theirs = (calls.keys(encoded, backend._client_tag(name)[1])[0] for name in "ab")
    assert ours != theirs
    for cost, peek in ((1, 0), (1, 1), (2, 0), (1, 0), (5, 0), (0, 0), (1, 1)):
        args = (str(cost), str(peek), *encoded.specs)
        package = redis_client.evalsha(sha, 1, ours, *args)
        written = redis_client.evalsha(flat, 1, theirs, *args)
        assert len(package) == len(written) and package[:3] == written[:3], (package, written)
        assert abs(package[3] - written[3]) < 50_000, (package, written)  # reset: µs apart
        assert redis_client.strlen(ours) == redis_client.strlen(theirs)
    backend.close()


@pytest.mark.slow
def test_reply_bench_times_every_shape_on_its_own_server() -> None:
    """bench_reply.py runs end to end on its own server: PING and every reply shape timed in
    every round (the numbers themselves are never asserted)."""
    report = run_json("bench_reply.py", "--calls", "50", "--rounds", "2")
    assert set(report["us_per_call"]) == {"PING", "seven integers", "four integers", "one integer"}
    assert all(len(figures) == 2 and min(figures) > 0 for figures in report["us_per_call"].values())
    assert report["parser"]


@pytest.mark.slow
def test_concurrency_load_test_keeps_the_slow_endpoint_to_its_slots(tmp_path: Path) -> None:
    """load_concurrency.py --quick runs gunicorn end to end, twice: without the limit nothing
    is refused; with it the slow endpoint is refused and never holds more workers than its
    clients' slots. Counts and bounds only, never the latencies."""
    pytest.importorskip("gunicorn")
    report = run_json("load_concurrency.py", "--quick", "--out-dir", str(tmp_path))
    runs = {run["run"]: run for run in report["runs"]}
    share = report["settings"]["share"]
    unlimited, limited = runs["unlimited"]["summary"], runs["limited"]["summary"]
    for summary in (unlimited, limited):
        assert summary["slow_samples"] > 0 and summary["slow_served_per_s"] > 0, summary
        assert summary["fast_due"] > 0 and summary["fast_not_200"] == 0, summary
        assert summary["slow_other"] == 0, summary
    assert unlimited["slow_refused_per_s"] == 0
    assert limited["slow_refused_per_s"] > 0
    assert 1 <= limited["slow_in_flight_max"] <= share < report["settings"]["workers"]
    assert all(run["server_log_problems"] == 0 for run in report["runs"])
    assert (tmp_path / "load_concurrency_quick.json").exists()


@pytest.mark.slow
def test_delay_load_test_serves_bursty_clients_without_429s(tmp_path: Path) -> None:
    """load_delay.py --quick runs uvicorn end to end, twice: clients that keep fewer requests
    open than the burst are refused by the rejecting limit and never by the delaying one,
    which holds some of them back instead. Counts only, never the latencies."""
    pytest.importorskip("uvicorn")
    report = run_json("load_delay.py", "--quick", "--out-dir", str(tmp_path))
    runs = {run["run"]: run["summary"] for run in report["runs"]}
    reject, delay = runs["reject"], runs["delay"]
    for summary in (reject, delay):
        assert summary["served_per_s"] > 0 and summary["other_statuses"] == 0, summary
    assert reject["refused_per_s"] > 0 and reject["delayed_share"] == 0, reject
    assert delay["refused_per_s"] == 0 and delay["delayed_share"] > 0, delay
    assert report["settings"]["connections"] < report["settings"]["burst"]
    assert all(run["server_log_problems"] == 0 for run in report["runs"])
    assert (tmp_path / "load_delay_quick.json").exists()


@pytest.mark.slow
def test_shedding_load_test_keeps_critical_requests_answered(tmp_path: Path) -> None:
    """load_shedding.py --quick runs gunicorn end to end, twice, with a sheddable export
    saturating every worker and a critical checkout beside it: without shedding nothing is
    shed; with it exports are shed (503), never hold more workers than the sheddable share,
    and every critical checkout is answered 200. Counts and bounds only, never the latencies."""
    pytest.importorskip("gunicorn")
    report = run_json("load_shedding.py", "--quick", "--out-dir", str(tmp_path))
    runs = {run["run"]: run for run in report["runs"]}
    settings = report["settings"]
    off, shedding = runs["off"]["summary"], runs["shedding"]["summary"]
    for summary in (off, shedding):
        assert summary["slow_samples"] > 0 and summary["slow_served_per_s"] > 0, summary
        assert summary["fast_due"] > 0 and summary["fast_not_200"] == 0, summary
        assert summary["slow_other"] == 0, summary
    assert off["slow_shed"] == 0
    assert off["slow_in_flight_max"] > settings["share"]  # unshed, exports took more workers
    assert shedding["slow_shed"] > 0
    assert 1 <= shedding["slow_in_flight_max"] <= settings["share"] < settings["workers"]
    assert all(run["server_log_problems"] == 0 for run in report["runs"])
    assert runs["off"]["server_log_shed_lines"] == 0
    assert runs["shedding"]["server_log_shed_lines"] > 0
    assert (tmp_path / "load_shedding_quick.json").exists()


@pytest.mark.slow
def test_adaptive_load_test_shrinks_the_free_tier_in_a_surge(tmp_path: Path) -> None:
    """load_adaptive.py --quick runs uvicorn and ``throttle_adapt`` end to end, twice: without
    the controller the surge is hardly refused (it stays under the free tier's own limit);
    with it, the controller shrinks the free tier first and the free clients get 429s. Counts
    and factors only, never the latencies."""
    pytest.importorskip("uvicorn")
    report = run_json("load_adaptive.py", "--quick", "--out-dir", str(tmp_path))
    runs = {run["run"]: run for run in report["runs"]}
    static, adaptive = runs["static"], runs["adaptive"]
    for run in (static, adaptive):
        assert run["summary"]["timeouts_or_errors"] == 0, run["summary"]
        assert run["server_log_problems"] == 0, run["server_log_first"]
        rows = run["per_second"]
        assert sum(r["free_served"] for r in rows) > 0 and sum(r["pro_served"] for r in rows) > 0
    # The surge stays under the free limit; only a Poisson client's rare run beyond its burst
    # is refused without the controller (0.5 a second of 64 served in the full run).
    free = [(r["free_served"], r["free_refused"]) for r in static["per_second"]]
    assert sum(refused for _, refused in free) <= 0.02 * sum(served for served, _ in free)
    assert all(r["pro_refused"] == 0 for r in static["per_second"])
    assert static["summary"]["min_factor"] == {"free": 1.0, "pro": 1.0}
    assert static["controller_moves"] == []
    moves = adaptive["controller_moves"]
    assert moves and "tier free now at 70%" in moves[0]["line"], moves
    assert adaptive["summary"]["min_factor"]["free"] < 1.0
    surge = adaptive["summary"]["phases"]["surge"]
    assert surge["free_refused_per_s"] > surge["pro_refused_per_s"], surge
    assert (tmp_path / "load_adaptive_quick.json").exists()
