"""Usage reports and the rollup to the database: ``manage.py throttle_usage`` [``--rollup``]."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.db.models import QuerySet
from django.urls import reverse

from django_throttle.backends import get_backend, usage_store
from django_throttle.backends.base import Backend, shard_of
from django_throttle.models import UsageCount
from django_throttle.usage import reports as usage_report
from tests.factories import with_shards
from tests.test_usage import OUTCOMES, by, columns, run, send

pytestmark = pytest.mark.django_db

NONE = {
    "shadow_denied": 0,
    "failed_open": 0,
    "failed_closed": 0,
    "name": "",
    "estimated": [],
    "unread_from": None,
}
ALL = UsageCount.ALL


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest, settings: Any) -> Backend:
    if request.param == "memory":
        settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    return get_backend()


@pytest.fixture
def traffic() -> None:
    """Three clients over two tiers and three endpoints, this minute."""
    backend = get_backend()
    send(backend, "user:1", "pro", "search", allowed=5)
    send(backend, "user:1", "pro", "export", allowed=1, denied=3)
    send(backend, "user:2", "free", "search", allowed=2, denied=4)
    send(backend, "ip:203.0.113.7", "free", "", allowed=1, denied=1)


def minutes_ago(n: int) -> float:
    """Mid-minute, n minutes back: no test straddles a minute."""
    return (int(time.time()) // 60 - n) * 60 + 30.0


def rows() -> set[tuple[str, str, str, int, int, int]]:
    return {
        (r.client, r.tier, r.endpoint, r.allowed, r.denied, r.failed_open)
        for r in UsageCount.objects.all()
    }


def rollup() -> str:
    return run("--rollup")


# Reports


def test_report_orders_by_total_then_denied(traffic: None) -> None:
    send(get_backend(), "user:3", "free", "search", allowed=6)  # same total as user:2

    found = usage_report.report(datetime.now(UTC) - timedelta(hours=1), "client", top=None)

    assert found.rows == [
        usage_report.UsageRow("user:1", allowed=6, denied=3, total=9),
        usage_report.UsageRow("user:2", allowed=2, denied=4, total=6),
        usage_report.UsageRow("user:3", allowed=6, denied=0, total=6),
        usage_report.UsageRow("ip:203.0.113.7", allowed=1, denied=1, total=2),
    ]
    assert found.rows[1].denied_percent == pytest.approx(66.666, rel=1e-3)
    assert not found.estimated


def test_report_top_and_bad_arguments(traffic: None) -> None:
    since = datetime.now(UTC) - timedelta(hours=1)
    assert [row.key for row in usage_report.report(since, "tier", top=1).rows] == ["pro"]
    with pytest.raises(ValueError, match="by must be one of client, tier, endpoint"):
        usage_report.report(since, "user", top=None)
    with pytest.raises(ValueError, match="top must be at least 1"):
        usage_report.report(since, "client", top=0)


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
    ("group", "expected"),
    [
        ("client", [["user:1", 6, 3, 9], ["user:2", 2, 4, 6], ["ip:203.0.113.7", 1, 1, 2]]),
        ("tier", [["pro", 6, 3, 9], ["free", 3, 5, 8]]),
        (
            "endpoint",
            [["search", 7, 4, 11], ["export", 1, 3, 4], ["(no endpoint rule)", 1, 1, 2]],
        ),
    ],
)
def test_command_csv(traffic: None, group: str, expected: list[list[object]]) -> None:
    reader = csv.reader(io.StringIO(run("--by", group, "--format", "csv")))
    header, *lines = list(reader)

    second = "name" if group == "client" else "before_authentication"
    delays = [] if group == "client" else ["delayed", "mean_wait_s", "shed"]
    assert header == [
        *(group, second, *OUTCOMES, "total", "denied_percent", *delays),
        *("estimated", "unread_from"),
    ]
    assert [[key, int(a), int(d), int(t)] for key, _, a, d, _, _, _, t, *_ in lines] == expected
    if delays:  # no delaying limit served these, and none was shed
        assert {(line[-5], line[-4], line[-3]) for line in lines} == {("0", "0.0", "0")}


def test_command_table(traffic: None) -> None:
    output = run("--by", "endpoint", "--since", "15m")

    assert "Requests by endpoint, last 15m (since" in output
    assert "UTC)" in output
    lines = output.splitlines()
    header = next(line for line in lines if "Endpoint" in line)
    for name in ("Allowed", "Denied", "Shadow", "Failed", "Total", "Denied %"):
        assert name in header
    search = next(line for line in lines if "search" in line)
    cells = [cell.strip() for cell in search.split("│")[1:-1]]
    assert cells == ["search", "7", "4", "0", "0", "0", "11", "36.4"]
    assert any("(no endpoint rule)" in line for line in lines)
    assert "estimate" not in output
    assert "\x1b[" not in output  # no colour codes when not writing to a terminal


def test_command_top_limits_rows(traffic: None) -> None:
    data = json.loads(run("--top", "1", "--format", "json"))
    assert [item["client"] for item in data] == ["user:1"]


def test_command_with_no_usage_prints_a_sentence() -> None:
    assert run("--since", "30s") == "No requests recorded in the last 30s.\n"
    assert json.loads(run("--format", "json")) == []
    assert run("--format", "csv") == (
        "client,name,allowed,denied,shadow_denied,failed_open,failed_closed,total,"
        "denied_percent,estimated,unread_from\n"
    )


def test_command_since_reads_periods_as_rates_write_them() -> None:
    """--since is parsed by the rates' own period parser (any case, long unit names too)."""
    assert run("--since", "15min") == "No requests recorded in the last 15min.\n"
    assert run("--since", "2H") == "No requests recorded in the last 2H.\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "5x"], "--since '5x' is not a duration"),
        (["--since=-1h"], "--since '-1h' is negative: give how far back to look, e.g. --since 1h"),
        (["--since", "\uff11h"], "--since '\uff11h' is not a duration: write it in ASCII digits"),
        (["--since", "\u0661h"], "--since '\u0661h' is not a duration: write it in ASCII digits"),
        (["--since", "1\u00a0h"], "is not a duration: write it in ASCII digits"),
        # In call_command's list argparse still reads "-1h" as an option (one line too).
        (["--since", "-1h"], "argument --since: expected one argument"),
        (
            ["--since", "0m"],
            "--since '0m' is not a duration: '0m': the period multiplier must be at least 1",
        ),
        (["--since", "99999999999w"], "--since '99999999999w' is too long"),
        (["--top", "0"], "--top must be at least 1, not 0"),
        (["--top", "many"], "--top must be a whole number"),
        (["--top", "{x}"], "--top must be a whole number, not '{x}'"),
        (["--since", "1month"], "a calendar month or year has no fixed length"),
        (["--by", "foo"], "invalid choice: 'foo'"),
        (["--format", "xml"], "invalid choice: 'xml'"),
    ],
)
def test_command_rejects_bad_arguments(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        run(*args)


@pytest.mark.parametrize("args", [["--since", "-1h"], ["--since=-1h"], ["--since", "-30m"]])
def test_a_negative_since_is_one_line_naming_it_on_the_command_line(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--since -1h`` met argparse's "expected one argument" under the whole usage text
    (argparse takes ``-1h`` for an option); from the command line it is the value of
    ``--since``, refused as negative in one line, as ``--since=-1h`` is."""
    from django.core.management import ManagementUtility

    # --skip-checks: the system checks' own report (W016 names the test URLconf's unguarded
    # admin login) is not the command's error.
    argv = ["manage.py", "throttle_usage", *args, "--skip-checks"]
    with pytest.raises(SystemExit) as stopped:
        ManagementUtility(argv).execute()
    assert stopped.value.code == 1
    error = capsys.readouterr().err.strip()
    value = args[-1].removeprefix("--since=")
    assert error == (
        f"CommandError: --since '{value}' is negative: give how far back to look, e.g. --since 1h."
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"since": "-1h"}, "--since '-1h' is negative"),
        ({"since": "\uff11h"}, "--since '\uff11h' is not a duration: write it in ASCII digits"),
        ({"top": 0}, "--top must be at least 1, not 0"),
        ({"by": "foo"}, "--by must be one of client, tier, endpoint, not 'foo'"),
        ({"format": "xml"}, "--format must be one of table, json, csv, not 'xml'"),
    ],
)
def test_command_rejects_bad_keyword_options(options: dict[str, object], message: str) -> None:
    """call_command(**options) bypasses argparse, so the command checks again."""
    with pytest.raises(CommandError, match=message):
        call_command("throttle_usage", stdout=io.StringIO(), **options)


def test_command_says_when_redis_cannot_answer(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    with pytest.raises(CommandError, match="could not be read from Redis") as raised:
        run()
    assert raised.value.returncode == 3
    with pytest.raises(CommandError, match="Could not read usage from the backend"):
        rollup()


def copied(minutes_back: int, **counts: Any) -> datetime:
    """Rows the rollup copied for a finished minute: a total and user:1's row; its start."""
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes_back)
    UsageCount.objects.create(window_start=start, client=ALL, tier="pro", endpoint="", **counts)
    UsageCount.objects.create(window_start=start, client="user:1", tier=ALL, endpoint=ALL, **counts)
    return start


@pytest.mark.parametrize("by_what", ["client", "tier"])
def test_with_redis_down_the_report_is_the_databases_minutes_marked_lower_bounds(
    settings: Any, by_what: str
) -> None:
    """With Redis down, ``throttle_usage`` refused outright although the database held the
    minutes a rollup copied: it shows them now, each count marked a lower bound, says from
    which minute on nothing could be read (stderr and JSON), and exits 3 after writing."""
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    copied(7, allowed=4, denied=1)
    newest = copied(3, allowed=2, denied=2)
    unread_from = newest + timedelta(minutes=1)

    out = io.StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("throttle_usage", "--by", by_what, "--format", "json", stdout=out)

    assert raised.value.returncode == 3
    message = str(raised.value)
    assert f"Minutes from {unread_from:%Y-%m-%d %H:%M} UTC on could not be read" in message
    assert "lower bounds" in message and "Connection refused" in message
    assert "\n" not in message
    [row] = json.loads(out.getvalue())
    assert (row["allowed"], row["denied"], row["total"]) == (6, 3, 9)
    assert datetime.fromisoformat(row["unread_from"]) == unread_from

    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("throttle_usage", "--by", by_what, stdout=out)
    table = out.getvalue()
    assert "≥6" in table and "≥3" in table and "≥9" in table
    assert "≥: at least" in table


def test_with_redis_down_and_nothing_copied_the_report_never_says_nothing_happened(
    settings: Any,
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    out = io.StringIO()
    with pytest.raises(CommandError, match="could not be read from Redis"):
        call_command("throttle_usage", stdout=out)
    assert "No requests recorded" not in out.getvalue()
    assert "No requests in the database's minutes of the last 1h." in out.getvalue()


def test_more_clients_than_the_top_lists_hold_are_estimates(
    backend: Backend, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(usage_store, "TOP_CLIENTS", 2)
    settings.DJANGO_THROTTLE_REDIS_URL = with_shards(settings.DJANGO_THROTTLE_REDIS_URL, 1)
    backend = get_backend()  # rebuilt with the new size
    send(backend, "user:1", "pro", "search", allowed=30)
    for client in ["user:2", "user:3", "user:4"]:
        send(backend, client, "pro", "search", allowed=3)
    stderr = io.StringIO()

    clients = by("client")
    table = run()
    run("--format", "json", stderr=stderr)

    assert len(clients) == 2  # bounded
    # The batch's heaviest, with exact counts (the first of equals); the others not sent.
    assert {client: row["allowed"] for client, row in clients.items()} == {
        "user:1": 30,
        "user:2": 3,
    }
    assert by("tier") == {"pro": columns(allowed=39)}  # exact
    assert "Per-client counts may be estimates" in " ".join(table.split())
    assert "Per-client counts may be estimates" in stderr.getvalue()


def _per_shard_traffic(store: Any) -> tuple[dict[str, int], dict[str, int], set[str]]:
    """Allowed counts for more distinct clients than each shard's top list holds: per shard
    two heavy clients (one for a list of two), then 1-request clients and one API key
    (``key:dt_ab12``) filling it many times over, in that order. Returns every count, the
    heavy ones, and the light ones a push sends (per shard the first to fill the list: ties
    go to the earlier)."""
    shards, size = len(store.tags), store.top_size
    counts: dict[str, int] = {}
    heavy: dict[str, int] = {}
    room = [size] * shards
    for i in range(400):
        client = f"user:heavy{i}"
        shard = shard_of(client, shards)
        if room[shard] > size - min(2, size - 1):
            room[shard] -= 1
            counts[client] = heavy[client] = 50 + i
    first: set[str] = set()
    lights = [f"ip:198.51.100.{i}" for i in range(256)] + ["key:dt_ab12"]
    lights += [f"ip:203.0.113.{i}" for i in range(256)]
    for client in lights:
        shard = shard_of(client, shards)
        counts[client] = 1
        if room[shard] and client != "key:dt_ab12":
            room[shard] -= 1
            first.add(client)
    on_shard = [sum(shard_of(c, shards) == shard for c in counts) for shard in range(shards)]
    assert not any(room) and min(on_shard) > size  # every shard's list overflows
    return counts, heavy, first


@pytest.fixture(params=[1, 4], ids=["shards=1", "shards=4"])
def small_lists(
    backend: Backend,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    open_store: Callable[..., Any],
    request: pytest.FixtureRequest,
) -> Any:
    """A usage store of ``request.param`` key shards whose top lists hold 12 clients in all,
    rebuilt with that size."""
    monkeypatch.setattr(usage_store, "TOP_CLIENTS", 12)
    settings.DJANGO_THROTTLE_REDIS_URL = with_shards(
        settings.DJANGO_THROTTLE_REDIS_URL, request.param
    )
    return open_store(get_backend())


def test_a_push_with_more_clients_than_a_list_holds_sends_the_heaviest(
    small_lists: Any,
) -> None:
    """A push sends per shard, minute and outcome only as many clients as a top list holds:
    the heaviest of the batch (the first among equals), and every API key's last use. The
    list is full either way, so the minute is an estimate; the totals are exact, the heavy
    clients too."""
    store, shards = small_lists, len(small_lists.tags)
    assert store.top_size == -(-12 // shards)
    counts, heavy, first = _per_shard_traffic(store)
    minute = store.now_minute()
    pending = [(minute, "pro|search", client, "a", n) for client, n in counts.items()]
    pending.append((minute, "pro|search", "user:heavy0", "d", 7))  # another outcome's list
    store.push("batch-1", pending, {"key:dt_ab12": 1_700_000_000})
    stderr = io.StringIO()

    clients = by("client")
    run("--format", "json", stderr=stderr)

    assert by("tier") == {"pro": columns(allowed=sum(counts.values()), denied=7)}  # exact
    # Every list holds the batch's heaviest, each sent once: exact, nothing inherited; the
    # light clients of each shard that came in first (equals keep their order).
    assert {client: row["allowed"] for client, row in clients.items()} == {
        client: counts[client] for client in [*heavy, *first]
    }
    assert len(clients) == store.top_size * shards  # every list full, none beyond
    assert clients["user:heavy0"]["denied"] == 7
    # The key's last use is exact, though its one request was left out with the light ones.
    assert store.keys_last_used(["dt_ab12"]) == {"dt_ab12": 1_700_000_000}
    since = datetime.now(UTC) - timedelta(hours=1)
    assert usage_report.report(since, "client", top=None).estimated
    assert "Per-client counts may be estimates" in stderr.getvalue()
    assert "Per-client counts may be estimates" in " ".join(run().split())


def test_a_push_with_room_in_the_lists_sends_every_client(
    small_lists: Any,
) -> None:
    store, shards = small_lists, len(small_lists.tags)
    minute = store.now_minute()
    clients = [f"user:{i}" for i in range(40)]
    room = {
        client: i + 1
        for i, client in enumerate(clients)
        if sum(shard_of(c, shards) == shard_of(client, shards) for c in clients[: i + 1])
        < store.top_size  # one short of full on its shard
    }
    store.push("batch-1", [(minute, "pro|search", c, "a", n) for c, n in room.items()])
    stderr = io.StringIO()

    found = by("client")
    run("--format", "json", stderr=stderr)

    assert {client: row["allowed"] for client, row in found.items()} == room
    assert by("tier") == {"pro": columns(allowed=sum(room.values()))}
    since = datetime.now(UTC) - timedelta(hours=1)
    assert not usage_report.report(since, "client", top=None).estimated
    assert "estimates" not in stderr.getvalue()


def test_estimates_stay_estimates_once_rolled_up(
    backend: Backend, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A minute whose top list was full was reported "may be estimates" while the backend
    held it, and as exact counts once the rollup had copied it to the database."""
    monkeypatch.setattr(usage_store, "TOP_CLIENTS", 2)
    settings.DJANGO_THROTTLE_REDIS_URL = with_shards(settings.DJANGO_THROTTLE_REDIS_URL, 1)
    backend = get_backend()  # rebuilt with the new size
    at = minutes_ago(10)
    send(backend, "user:1", "pro", "search", allowed=30, at=at)
    for client in ["user:2", "user:3", "user:4"]:
        send(backend, client, "pro", "search", allowed=3, at=at)
    since = datetime.now(UTC) - timedelta(hours=1)
    assert usage_report.report(since, "client", top=None).estimated

    assert rollup().startswith("Rolled up ")

    assert usage_report.report(since, "client", top=None).estimated
    assert "Per-client counts may be estimates" in " ".join(run().split())
    # Totals are exact, from the backend or the database.
    assert not usage_report.report(since, "tier", top=None).estimated


def test_a_rolled_up_minute_with_room_in_its_top_lists_is_exact(backend: Backend) -> None:
    send(backend, "user:1", "pro", "search", allowed=3, denied=2, at=minutes_ago(10))
    rollup()
    since = datetime.now(UTC) - timedelta(hours=1)
    assert not usage_report.report(since, "client", top=None).estimated


# The rollup


def test_rollup_copies_finished_minutes_and_reports_count_them_once(backend: Backend) -> None:
    send(backend, "user:1", "pro", "search", allowed=3, denied=2, at=minutes_ago(10))
    send(backend, "user:1", "pro", "search", allowed=1)  # this minute: not finished

    assert rollup().startswith("Rolled up ")

    assert rows() == {
        (ALL, "pro", "search", 3, 2, 0),
        ("user:1", ALL, ALL, 3, 2, 0),
    }
    assert by("client") == {"user:1": columns(allowed=4, denied=2)}
    assert by("tier") == {"pro": columns(allowed=4, denied=2)}


def test_rollup_says_how_many_of_the_minutes_it_read_had_requests(backend: Backend) -> None:
    """A rollup reads every minute the backend keeps: "Rolled up 179 minute(s)" on a site up
    for three minutes read as if it had counted three hours of traffic."""
    send(backend, "user:1", "pro", "search", allowed=3, at=minutes_ago(10))
    send(backend, "user:2", "free", "search", allowed=1, at=minutes_ago(4))

    said = rollup()

    assert said.startswith("Rolled up ")
    assert ", 2 with requests, into 4 row(s);" in said, said
    assert ", 0 with requests, into 0 row(s);" in rollup()  # nothing new the second time


def test_rollup_twice_or_without_its_watermark_writes_the_same_rows(
    redis_client: redis.Redis,
) -> None:
    backend = get_backend()
    send(backend, "user:1", "pro", "search", allowed=3, at=minutes_ago(10))
    send(backend, "user:2", "pro", "", denied=1, at=minutes_ago(5))
    rollup()
    first = rows()
    rollup()
    redis_client.delete(f"{backend.prefix}:usage-rolled")  # type: ignore[attr-defined]
    rollup()

    assert rows() == first
    assert by("client") == {"user:1": columns(allowed=3), "user:2": columns(denied=1)}


def test_counts_outlive_redis_once_rolled_up(redis_client: redis.Redis) -> None:
    backend = get_backend()
    send(backend, "user:1", "pro", "search", allowed=3, denied=1, at=minutes_ago(10))
    rollup()
    for tag in backend.shard_tags():  # type: ignore[attr-defined]
        for key in redis_client.keys(f"{tag}*"):
            redis_client.delete(key)  # what the TTL does later

    assert by("client") == {"user:1": columns(allowed=3, denied=1)}
    assert by("endpoint") == {"search": columns(allowed=3, denied=1)}


def test_a_late_push_into_a_copied_minute_is_copied_again(
    backend: Backend, open_store: Callable[..., Any]
) -> None:
    at = minutes_ago(10)
    send(backend, "user:1", "pro", "search", allowed=2, at=at)
    rollup()
    store = open_store(backend)
    store.push("late-1", [(int(at) // 60, "pro|search", "user:1", "o", 5)])

    rollup()

    assert (ALL, "pro", "search", 2, 0, 5) in rows()
    assert by("client") == {"user:1": columns(allowed=2, fo=5)}


def test_a_rollup_that_fails_half_way_loses_and_doubles_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = get_backend()
    send(backend, "user:1", "pro", "search", allowed=2, at=minutes_ago(20))
    send(backend, "user:1", "pro", "search", allowed=3, at=minutes_ago(10))
    monkeypatch.setattr(usage_report, "CHUNK_MINUTES", 1)
    real = QuerySet.bulk_create
    calls: list[int] = []

    def fail_the_second_chunk(self: QuerySet[Any], objs: Any, *args: Any, **kwargs: Any) -> Any:
        objs = list(objs)
        if objs:
            calls.append(len(objs))
            if len(calls) == 2:
                raise DatabaseError("disk full")
        return real(self, objs, *args, **kwargs)

    monkeypatch.setattr(QuerySet, "bulk_create", fail_the_second_chunk)
    with pytest.raises(CommandError, match="Could not write usage rows: disk full"):
        rollup()
    rollup()

    assert by("client") == {"user:1": columns(allowed=5)}
    assert UsageCount.objects.filter(client="user:1").count() == 2  # one row per minute


def test_an_odd_name_never_stops_the_rollup() -> None:
    """PostgreSQL refuses NUL bytes in text: they are stored as U+FFFD."""
    send(get_backend(), "key:a\x00b", "pro", "x\x00y", allowed=2, at=minutes_ago(10))
    send(get_backend(), "user:1", "pro", "search", allowed=1, at=minutes_ago(10))

    rollup()

    assert ("key:a\ufffdb", ALL, ALL, 2, 0, 0) in rows()
    assert (ALL, "pro", "x\ufffdy", 2, 0, 0) in rows()
    assert by("tier") == {"pro": columns(allowed=3)}


def test_rollup_deletes_rows_past_retention(settings: Any) -> None:
    settings.DJANGO_THROTTLE_USAGE_RETENTION_DAYS = 7
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    UsageCount.objects.create(window_start=now - timedelta(days=8), client="old")
    UsageCount.objects.create(window_start=now - timedelta(days=6), client="recent")

    rollup()

    assert list(UsageCount.objects.values_list("client", flat=True)) == ["recent"]


@pytest.mark.parametrize("days", [800_000, 999_999_999, 10**30])
def test_a_retention_longer_than_the_calendar_keeps_every_row(settings: Any, days: int) -> None:
    """A retention reaching back before the year 1 (passed by the check: a whole number,
    0 or more, "keep it all") was an OverflowError traceback from every rollup, after the
    minutes were copied: now every row is kept and the rollup prints its line."""
    settings.DJANGO_THROTTLE_USAGE_RETENTION_DAYS = days
    old = datetime(1971, 1, 1, tzinfo=UTC)
    UsageCount.objects.create(window_start=old, client="old")

    assert rollup().startswith("Rolled up")
    assert list(UsageCount.objects.values_list("client", flat=True)) == ["old"]


def test_report_reads_rows_older_than_redis_keeps(traffic: None) -> None:
    three_hours_ago = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=3)
    UsageCount.objects.create(
        window_start=three_hours_ago, client="user:old", tier=ALL, endpoint=ALL, allowed=100
    )
    UsageCount.objects.create(
        window_start=three_hours_ago, client=ALL, tier="old", endpoint="", allowed=100
    )

    recent = json.loads(run("--since", "2h", "--format", "json"))
    wider = json.loads(run("--since", "1d", "--format", "json"))

    assert "user:old" not in [item["client"] for item in recent]
    assert [item["client"] for item in wider] == ["user:old", "user:1", "user:2", "ip:203.0.113.7"]
    assert wider[0] == {
        "client": "user:old",
        **NONE,
        "allowed": 100,
        "denied": 0,
        "total": 100,
        "denied_percent": 0.0,
    }
    assert by("tier", "--since", "1d")["old"] == columns(allowed=100)


def test_report_notes_minutes_that_left_redis_uncopied(
    traffic: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(usage_store, "USAGE_TTL", 3600)
    stderr = io.StringIO()

    run("--since", "2h", stderr=stderr)

    assert "missing unless a rollup copied them" in stderr.getvalue()
    assert "throttle_usage --rollup" in stderr.getvalue()
    quiet = io.StringIO()
    run("--since", "30m", stderr=quiet)
    assert quiet.getvalue() == ""


# Upgrading: rows the old flusher wrote


@pytest.mark.django_db(transaction=True)
def test_migration_splits_old_rows_into_totals_and_clients() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([("django_throttle", "0002_bounds_failure_modes_usage_outcomes")])
    old = executor.loader.project_state(
        ("django_throttle", "0002_bounds_failure_modes_usage_outcomes")
    ).apps.get_model("django_throttle", "UsageCount")
    minute = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    for client, tier_slug, endpoint_name, allowed, denied in [
        ("user:1", "pro", "search", 3, 1),
        ("user:1", "pro", "export", 2, 0),
        ("user:2", "pro", "search", 1, 4),
    ]:
        old.objects.create(
            window_start=minute,
            client=client,
            tier=tier_slug,
            endpoint=endpoint_name,
            allowed=allowed,
            denied=denied,
        )

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes("django_throttle"))

    assert {
        (r[0], r[1], r[2], r[3], r[4])
        for r in UsageCount.objects.values_list("client", "tier", "endpoint", "allowed", "denied")
    } == {
        (ALL, "pro", "search", 4, 5),
        (ALL, "pro", "export", 2, 0),
        ("user:1", ALL, ALL, 5, 1),
        ("user:2", ALL, ALL, 1, 4),
    }


# Admin


def test_admin_lists_totals_apart_from_clients(admin_client: Any) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    UsageCount.objects.create(
        window_start=now, client=ALL, tier="pro", endpoint="endpoint-xyz", allowed=7
    )
    UsageCount.objects.create(window_start=now, client="user:42", tier=ALL, endpoint=ALL, allowed=7)
    url = reverse("admin:django_throttle_usagecount_changelist")

    def listed(kind: str) -> list[tuple[str, str]]:
        page = admin_client.get(url, {"kind": kind})
        return [(row.client, row.endpoint) for row in page.context["cl"].result_list]

    assert listed("totals") == [(ALL, "endpoint-xyz")]
    assert listed("clients") == [("user:42", ALL)]
