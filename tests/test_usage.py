"""Usage counting: buffered records, batched flushes, reports and ``manage.py throttle_usage``."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError
from django.db.models import QuerySet

from django_throttle import usage
from django_throttle.models import UsageCount
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db

NOW = (int(time.time()) // 60) * 60 + 30  # mid-minute, so no test straddles a window
OUTCOMES = ["allowed", "denied", "shadow_denied", "failed_open", "failed_closed"]
#: The outcomes the ``traffic`` fixture never records.
NONE = {
    "shadow_denied": 0,
    "failed_open": 0,
    "failed_closed": 0,
}  # mid-minute, so no test straddles a window


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> float:
    """Pin the clock ``record`` reads to one minute; leave the real ``time`` module alone."""
    clock = types.SimpleNamespace(time=lambda: float(NOW), monotonic=time.monotonic)
    monkeypatch.setattr(usage, "time", clock)
    return float(NOW)


ALLOWED_OR_DENIED = (usage.ALLOWED, usage.DENIED)


def window() -> datetime:
    return datetime.fromtimestamp(NOW // 60 * 60, tz=UTC)


def counts() -> dict[tuple[str, str, str], tuple[int, int]]:
    return {
        (row.client, row.tier, row.endpoint): (row.allowed, row.denied)
        for row in UsageCount.objects.all()
    }


def record_many(client: str, tier: str, endpoint: str, allowed: int, denied: int) -> None:
    for _ in range(allowed):
        usage.record(client, tier, endpoint, usage.ALLOWED)
    for _ in range(denied):
        usage.record(client, tier, endpoint, usage.DENIED)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("throttle_usage", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def traffic() -> None:
    """Three clients over two tiers and three endpoints, flushed."""
    record_many("user:1", "pro", "search", allowed=5, denied=0)
    record_many("user:1", "pro", "export", allowed=1, denied=3)
    record_many("user:2", "free", "search", allowed=2, denied=4)
    record_many("ip:203.0.113.7", "free", "", allowed=1, denied=1)
    usage.flush()


# Recording and flushing


def test_flush_writes_one_row_per_window_client_tier_endpoint() -> None:
    record_many("user:42", "pro", "search", allowed=3, denied=2)
    record_many("ip:203.0.113.7", "", "", allowed=1, denied=0)

    assert usage.flush() == 2

    assert counts() == {
        ("user:42", "pro", "search"): (3, 2),
        ("ip:203.0.113.7", "", ""): (1, 0),
    }
    assert set(UsageCount.objects.values_list("window_start", flat=True)) == {window()}


def test_flush_empties_the_buffer() -> None:
    usage.record("user:1", "", "", usage.ALLOWED)
    assert usage.flush() == 1
    assert usage.flush() == 0
    assert counts() == {("user:1", "", ""): (1, 0)}


def test_flushes_add_up() -> None:
    record_many("user:1", "pro", "search", allowed=2, denied=1)
    usage.flush()
    record_many("user:1", "pro", "search", allowed=3, denied=4)
    assert usage.flush() == 1

    assert counts() == {("user:1", "pro", "search"): (5, 5)}
    assert UsageCount.objects.count() == 1


def test_each_minute_gets_its_own_row(monkeypatch: pytest.MonkeyPatch) -> None:
    usage.record("user:1", "", "", usage.ALLOWED)
    monkeypatch.setattr(usage.time, "time", lambda: float(NOW + 60))
    usage.record("user:1", "", "", usage.DENIED)
    usage.flush()

    rows = list(UsageCount.objects.order_by("window_start").values_list("window_start", "denied"))
    assert rows == [(window(), 0), (window() + timedelta(minutes=1), 1)]


def test_record_makes_no_queries(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    with django_assert_num_queries(0):
        for n in range(100):
            usage.record(f"ip:198.51.100.{n}", "free", "search", ALLOWED_OR_DENIED[n % 2])


def test_flush_of_nothing_makes_no_queries(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    with django_assert_num_queries(0):
        assert usage.flush() == 0


def test_record_is_a_no_op_when_disabled(settings) -> None:  # type: ignore[no-untyped-def]
    settings.DJANGO_THROTTLE_USAGE_ENABLED = False
    usage.record("user:1", "", "", usage.ALLOWED)
    assert usage.flush() == 0
    assert not UsageCount.objects.exists()


def test_reset_forgets_buffered_counts() -> None:
    usage.record("user:1", "", "", usage.ALLOWED)
    usage.reset()
    assert usage.flush() == 0


def test_long_names_are_truncated_to_the_columns() -> None:
    usage.record("user:" + "x" * 300, "t" * 150, "e" * 150, usage.ALLOWED)
    usage.flush()
    row = UsageCount.objects.get()
    assert (len(row.client), len(row.tier), len(row.endpoint)) == (200, 100, 100)


# Outcomes: each request in exactly one column


def test_each_outcome_has_its_own_column_and_total_is_their_sum() -> None:
    for outcome, n in zip(usage.OUTCOMES, (5, 4, 3, 2, 1), strict=True):
        for _ in range(n):
            usage.record("user:1", "pro", "search", outcome)
    usage.flush()

    row = UsageCount.objects.get()
    assert (row.allowed, row.denied, row.shadow_denied, row.failed_open, row.failed_closed) == (
        5,
        4,
        3,
        2,
        1,
    )
    [summed] = usage.report(window() - timedelta(hours=1), "client", top=None)
    assert summed == usage.UsageRow(
        "user:1", allowed=5, denied=4, shadow_denied=3, failed_open=2, failed_closed=1, total=15
    )


@pytest.mark.parametrize("outcome", [True, False, "ok", None])
def test_record_refuses_anything_but_an_outcome(outcome: object) -> None:
    with pytest.raises(ValueError, match="outcome must be one of allowed, denied"):
        usage.record("user:1", "", "", outcome)  # type: ignore[arg-type]


def test_shadow_would_denies_are_not_denied() -> None:
    """Defect 5: the client got 200, 200, 200; a shadow rule would have denied two."""
    usage.record("ip:203.0.113.7", "anonymous", "ping", usage.ALLOWED)
    usage.record("ip:203.0.113.7", "anonymous", "ping", usage.SHADOW_DENIED)
    usage.record("ip:203.0.113.7", "anonymous", "ping", usage.SHADOW_DENIED)

    [item] = json.loads(run("--by", "endpoint", "--format", "json"))
    assert item == {
        "endpoint": "ping",
        "allowed": 1,
        "denied": 0,
        "shadow_denied": 2,
        "failed_open": 0,
        "failed_closed": 0,
        "total": 3,
        "denied_percent": 0.0,
    }


def test_shadow_would_denies_through_requests(client: object) -> None:
    """The same through the API: needs core to record outcomes (``usage.SHADOW_DENIED``)."""
    anon = tier("anonymous", "100/h", is_default_anonymous=True)
    endpoint("ping", "route", "ping", shadow=True, limits={anon: "1/h"})

    statuses = [client.get("/api/ping/").status_code for _ in range(3)]  # type: ignore[attr-defined]

    assert statuses == [200, 200, 200]
    [item] = json.loads(run("--by", "endpoint", "--format", "json"))
    assert (item["allowed"], item["shadow_denied"], item["denied"]) == (1, 2, 0)


# Bounds and failures


def test_buffer_is_bounded_and_folds_new_clients_into_other(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(usage, "MAX_KEYS", 3)
    for n in range(10):
        usage.record(f"ip:198.51.100.{n}", "free", "search", ALLOWED_OR_DENIED[n % 2])
    usage.record(
        "ip:198.51.100.0", "free", "search", usage.ALLOWED
    )  # known client keeps its own key

    assert len(usage._buffer) == 4  # three clients + one "(other)" for this tier and endpoint
    with caplog.at_level(logging.WARNING, logger="django_throttle.usage"):
        usage.flush()

    assert counts() == {
        ("ip:198.51.100.0", "free", "search"): (2, 0),
        ("ip:198.51.100.1", "free", "search"): (0, 1),
        ("ip:198.51.100.2", "free", "search"): (1, 0),
        (usage.OTHER, "free", "search"): (3, 4),
    }
    assert "counted 7 requests from new clients as '(other)'" in caplog.text


def test_database_error_keeps_counts_for_the_next_flush(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    record_many("user:1", "", "", allowed=2, denied=1)

    def broken(*args: object) -> None:
        raise DatabaseError("database is down")

    with monkeypatch.context() as patch:
        patch.setattr(usage, "_add", broken)
        assert usage.flush() == 0
    assert "Could not write 1 usage rows" in caplog.text
    assert not UsageCount.objects.exists()

    assert usage.flush() == 1
    assert counts() == {("user:1", "", ""): (2, 1)}


def test_row_created_by_another_process_is_updated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The insert loses the race (IntegrityError) and the flush retries as an update."""
    UsageCount.objects.create(window_start=window(), client="user:1", allowed=10, denied=1)
    record_many("user:1", "", "", allowed=2, denied=3)

    real_update = QuerySet.update
    calls = []

    def update_missing_the_row_once(self: QuerySet, **kwargs: object) -> int:
        calls.append(kwargs)
        if len(calls) == 1:
            return 0  # as if the other process had not committed yet
        return real_update(self, **kwargs)

    monkeypatch.setattr(QuerySet, "update", update_missing_the_row_once)
    assert usage.flush() == 1

    assert len(calls) == 2
    assert counts() == {("user:1", "", ""): (12, 4)}


def test_flush_deletes_rows_past_retention(settings) -> None:  # type: ignore[no-untyped-def]
    settings.DJANGO_THROTTLE_USAGE_RETENTION_DAYS = 7
    UsageCount.objects.create(window_start=window() - timedelta(days=8), client="old")
    UsageCount.objects.create(window_start=window() - timedelta(days=6), client="recent")
    usage.record("user:1", "", "", usage.ALLOWED)
    usage.flush()

    assert sorted(UsageCount.objects.values_list("client", flat=True)) == ["recent", "user:1"]


def test_retention_runs_at_most_once_an_hour() -> None:
    usage.record("user:1", "", "", usage.ALLOWED)
    usage.flush()
    UsageCount.objects.create(window_start=window() - timedelta(days=30), client="old")
    usage.record("user:1", "", "", usage.ALLOWED)
    usage.flush()

    assert UsageCount.objects.filter(client="old").exists()


# The flusher thread


def test_no_flusher_thread_when_interval_is_zero() -> None:
    usage.record("user:1", "", "", usage.ALLOWED)
    assert usage._stop is None


def test_flusher_thread_starts_once_and_stops_on_reset(settings) -> None:  # type: ignore[no-untyped-def]
    import threading

    settings.DJANGO_THROTTLE_USAGE_FLUSH_INTERVAL = 3600
    usage.record("user:1", "", "", usage.ALLOWED)
    usage.record("user:2", "", "", usage.ALLOWED)

    flushers = [t for t in threading.enumerate() if t.name == "django-throttle-usage"]
    assert len(flushers) == 1
    assert flushers[0].daemon

    usage.reset()
    flushers[0].join(timeout=5)
    assert not flushers[0].is_alive()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_starts_with_an_empty_buffer() -> None:
    """A real fork (gunicorn's preload): the parent's counts stay the parent's to flush."""
    usage.record("user:parent", "", "", usage.ALLOWED)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never return into pytest
        try:
            usage.record("user:child", "", "", usage.ALLOWED)
            os._exit(0 if {key[1] for key in usage._buffer} == {"user:child"} else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert {key[1] for key in usage._buffer} == {"user:parent"}


# Reports


def test_report_orders_by_total_then_denied(traffic: None) -> None:
    record_many("user:3", "free", "search", allowed=6, denied=0)  # same total as user:2
    usage.flush()

    rows = usage.report(since=window() - timedelta(hours=1), by="client", top=None)

    assert rows == [
        usage.UsageRow("user:1", allowed=6, denied=3, total=9),
        usage.UsageRow("user:2", allowed=2, denied=4, total=6),
        usage.UsageRow("user:3", allowed=6, denied=0, total=6),
        usage.UsageRow("ip:203.0.113.7", allowed=1, denied=1, total=2),
    ]
    assert rows[1].denied_percent == pytest.approx(66.666, rel=1e-3)


def test_report_top_and_bad_arguments(traffic: None) -> None:
    since = window() - timedelta(hours=1)
    assert [row.key for row in usage.report(since, "tier", top=1)] == ["pro"]
    with pytest.raises(ValueError, match="by must be one of client, tier, endpoint"):
        usage.report(since, "user", top=None)
    with pytest.raises(ValueError, match="top must be at least 1"):
        usage.report(since, "client", top=0)


# manage.py throttle_usage


def test_command_json_by_client(traffic: None) -> None:
    assert json.loads(run("--format", "json")) == [
        {
            "client": "user:1",
            **NONE,
            "allowed": 6,
            "denied": 3,
            "total": 9,
            "denied_percent": 33.33,
        },
        {
            "client": "user:2",
            **NONE,
            "allowed": 2,
            "denied": 4,
            "total": 6,
            "denied_percent": 66.67,
        },
        {
            "client": "ip:203.0.113.7",
            **NONE,
            "allowed": 1,
            "denied": 1,
            "total": 2,
            "denied_percent": 50.0,
        },
    ]


@pytest.mark.parametrize(
    ("by", "expected"),
    [
        ("client", [["user:1", 6, 3, 9], ["user:2", 2, 4, 6], ["ip:203.0.113.7", 1, 1, 2]]),
        ("tier", [["pro", 6, 3, 9], ["free", 3, 5, 8]]),
        ("endpoint", [["search", 7, 4, 11], ["export", 1, 3, 4], ["", 1, 1, 2]]),
    ],
)
def test_command_csv(traffic: None, by: str, expected: list[list[object]]) -> None:
    reader = csv.reader(io.StringIO(run("--by", by, "--format", "csv")))
    header, *rows = list(reader)

    assert header == [by, *OUTCOMES, "total", "denied_percent"]
    assert [[key, int(a), int(d), int(t)] for key, a, d, _, _, _, t, _ in rows] == expected


@pytest.mark.parametrize("by", ["client", "tier", "endpoint"])
def test_command_json_for_each_grouping(traffic: None, by: str) -> None:
    data = json.loads(run("--by", by, "--format", "json"))
    totals = {"client": 17, "tier": 17, "endpoint": 17}
    assert sum(item["total"] for item in data) == totals[by]
    assert all(set(item) == {by, *OUTCOMES, "total", "denied_percent"} for item in data)


def test_command_table(traffic: None) -> None:
    output = run("--by", "endpoint", "--since", "15m")

    assert "Requests by endpoint, last 15m (since" in output
    assert "UTC)" in output
    lines = output.splitlines()
    header = next(line for line in lines if "Endpoint" in line)
    for name in ("Allowed", "Denied", "Shadow", "Failed", "Total", "Denied %"):
        assert name in header
    search = next(line for line in lines if "search" in line)
    assert [cell.strip() for cell in search.split("│")[1:-1]] == [
        "search",
        "7",
        "4",
        "0",
        "0",
        "0",
        "11",
        "36.4",
    ]
    assert any("(none)" in line for line in lines)
    assert "\x1b[" not in output  # no colour codes when not writing to a terminal


def test_command_top_limits_rows(traffic: None) -> None:
    data = json.loads(run("--top", "1", "--format", "json"))
    assert [item["client"] for item in data] == ["user:1"]


def test_command_flushes_the_buffer_first() -> None:
    record_many("user:9", "", "", allowed=1, denied=1)
    assert json.loads(run("--format", "json"))[0]["total"] == 2


def test_command_since_excludes_older_rows(traffic: None) -> None:
    UsageCount.objects.create(
        window_start=window() - timedelta(hours=3), client="user:old", allowed=100
    )

    recent = json.loads(run("--since", "2h", "--format", "json"))
    wider = json.loads(run("--since", "1d", "--format", "json"))

    assert "user:old" not in [item["client"] for item in recent]
    assert wider[0] == {
        "client": "user:old",
        **NONE,
        "allowed": 100,
        "denied": 0,
        "total": 100,
        "denied_percent": 0.0,
    }


def test_command_with_no_usage_prints_a_sentence() -> None:
    assert run("--since", "30s") == "No requests recorded in the last 30s.\n"
    assert json.loads(run("--format", "json")) == []
    assert run("--format", "csv") == (
        "client,allowed,denied,shadow_denied,failed_open,failed_closed,total,denied_percent\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "5x"], "--since '5x' is not a duration"),
        (["--since=-1h"], "the duration must be at least 1 h"),
        (["--since", "0m"], "the duration must be at least 1 m"),
        (["--since", "99999999999w"], "--since '99999999999w' is too long"),
        (["--top", "0"], "--top must be at least 1, not 0"),
        (["--top", "many"], "--top must be a whole number"),
        (["--by", "foo"], "invalid choice: 'foo'"),
        (["--format", "xml"], "invalid choice: 'xml'"),
    ],
)
def test_command_rejects_bad_arguments(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        run(*args)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"since": "-1h"}, "the duration must be at least 1 h"),
        ({"top": 0}, "--top must be at least 1, not 0"),
        ({"by": "foo"}, "--by must be one of client, tier, endpoint, not 'foo'"),
        ({"format": "xml"}, "--format must be one of table, json, csv, not 'xml'"),
    ],
)
def test_command_rejects_bad_keyword_options(options: dict[str, object], message: str) -> None:
    """call_command(**options) bypasses argparse, so the command checks again."""
    with pytest.raises(CommandError, match=message):
        call_command("throttle_usage", stdout=io.StringIO(), **options)


# What survives the end of a process (defect 14)

CHILD = """
import os, sys, time
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django_throttle import usage
for _ in range(5):
    usage.record("user:1", "", "", usage.ALLOWED)
usage.flush()  # what the flusher thread does every USAGE_FLUSH_INTERVAL seconds
for _ in range(7):
    usage.record("user:1", "", "", usage.ALLOWED)
print("ready", flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ending", "recorded"),
    [
        ("exit", 12),  # a clean exit flushes the rest (atexit)
        (signal.SIGINT, 12),  # Ctrl-C: KeyboardInterrupt, then a clean exit
        (signal.SIGTERM, 5),  # unhandled SIGTERM (runserver, a bare python): no atexit
        (signal.SIGKILL, 5),
    ],
)
def test_what_reaches_the_database_when_a_process_ends(
    tmp_path: Path, ending: object, recorded: int
) -> None:
    """Counts flushed before the end survive; the rest survive only a clean exit."""
    database = tmp_path / "usage.sqlite3"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"sqlite:///{database}",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "exit" if ending == "exit" else "wait"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    with child.stdout:
        try:
            assert child.stdout.readline() == "ready\n"
            if isinstance(ending, signal.Signals):
                child.send_signal(ending)
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    db = sqlite3.connect(database)
    try:
        [(allowed,)] = db.execute("SELECT SUM(allowed) FROM django_throttle_usagecount")
    finally:
        db.close()
    assert allowed == recorded
