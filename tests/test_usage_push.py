"""Counts kept in process reach the backend off the request, a bounded batch per push.

Every decision is counted in process (the backend's tally; while the backend cannot answer,
``usage.record_degraded``); a request that finds a push due wakes the process's pusher
thread and goes on. Each push carries at most ``usage.PUSH_PER_CALL`` of an outage's counts, so
no push holds the server for a long outage's backlog, and nothing is lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from django_throttle.backends import get_backend, usage_store
from django_throttle.backends.base import shard_of
from django_throttle.rates import Algorithm, Limit
from django_throttle.usage import accounting as usage
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db

ALGORITHMS = [algorithm.value for algorithm in Algorithm]


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest, settings: Any, open_store: Callable[..., Any]) -> Any:
    if request.param == "memory":
        settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    return open_store(get_backend())


def failed_open(store: Any, minute: int) -> int:
    """Requests counted as failed open around ``minute`` (a minute may turn during the
    test), over every usage field."""
    found = store.read([minute - 1, minute, minute + 1], clients=False)
    return sum(row[3] for counts in found.values() for row in counts.totals.values())


def test_a_request_does_not_wait_for_the_push_it_wakes(
    client: Any, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The push the first request of a process finds due is held up (the store's own push,
    made to wait for the test): the request is answered meanwhile, on the request's thread,
    and its count arrives once the push goes on."""
    anonymous = tier("anonymous", "1000000/h", is_default_anonymous=True)
    endpoint("ping", "route", "ping", limits={anonymous: "1000000/h"})
    release = threading.Event()
    pushing = threading.Event()
    push = type(store).push

    def held_push(self: Any, *args: Any, **kwargs: Any) -> None:
        pushing.set()
        assert release.wait(30)
        push(self, *args, **kwargs)

    monkeypatch.setattr(type(store), "push", held_push)
    try:
        assert client.get("/api/ping/").status_code == 200  # the first push is due at once
        assert pushing.wait(10)  # the pusher thread is in the push, and the request is done
        assert client.get("/api/ping/").status_code == 200  # so is the next one
        assert not usage.wait_pushed(0.05)
    finally:
        release.set()
    assert usage.wait_pushed()
    minute = store.now_minute()
    found = store.read([minute - 1, minute], clients=False)
    assert sum(row[0] for counts in found.values() for row in counts.totals.values()) >= 1


def test_where_threads_do_not_run_the_requests_push_themselves(
    client: Any, store: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under uWSGI without ``--enable-threads`` a started thread never runs: once the pusher
    has not run for ``THREAD_START_GRACE``, a request that finds a push due makes it, and the
    operator is told why once."""
    anonymous = tier("anonymous", "1000000/h", is_default_anonymous=True)
    endpoint("ping", "route", "ping", limits={anonymous: "1000000/h"})
    monkeypatch.setattr(usage, "_pusher", None)  # this test's process has no pusher yet
    monkeypatch.setattr(usage, "THREAD_START_GRACE", 0.0)
    monkeypatch.setattr(threading.Thread, "start", lambda self: None)  # a thread never run
    minute = store.now_minute()
    for n in range(3):
        usage.record_degraded("anonymous|ping", f"ip:10.9.0.{n}", "failed_open")

    with caplog.at_level("WARNING", logger="django_throttle.usage"):
        assert client.get("/api/ping/").status_code == 200  # pushed on the request itself
        assert client.get("/api/ping/").status_code == 200
    assert failed_open(store, minute) == 3
    assert len([r for r in caplog.records if "--enable-threads" in r.getMessage()]) == 1
    assert usage.wait_pushed(0)


def test_each_request_pushes_a_bounded_batch_and_nothing_is_lost(client: Any, store: Any) -> None:
    """Each request after an outage wakes the pusher thread, which pushes one bounded batch
    of the kept counts (the request does not wait for it); every count arrives."""
    anonymous = tier("anonymous", "1000000/h", is_default_anonymous=True)
    endpoint("ping", "route", "ping", limits={anonymous: "1000000/h"})
    minute = store.now_minute()
    for n in range(usage.MAX_PENDING):  # an outage's worth: every count a process keeps
        usage.record_degraded("anonymous|ping", f"ip:10.{n >> 8 & 255}.{n & 255}.1", "failed_open")
    assert usage.pending

    assert client.get("/api/ping/").status_code == 200
    assert usage.wait_pushed()
    assert failed_open(store, minute) == usage.PUSH_PER_CALL

    requests = 1
    while usage.pending:
        before = failed_open(store, minute)
        assert client.get("/api/ping/").status_code == 200
        assert usage.wait_pushed()
        assert 0 < failed_open(store, minute) - before <= usage.PUSH_PER_CALL
        requests += 1
        assert requests <= usage.MAX_PENDING // usage.PUSH_PER_CALL
    assert failed_open(store, minute) == usage.MAX_PENDING


def test_a_failed_batch_goes_first_when_the_backend_answers(
    settings: Any, open_store: Callable[..., Any]
) -> None:
    """A batch whose push failed is retried whole before newer counts, under its own id."""
    store = open_store(get_backend())
    minute = store.now_minute()
    for n in range(usage.PUSH_PER_CALL + 5):
        usage.record_degraded("pro|search", f"user:{n}", "failed_open")
    healthy = settings.DJANGO_THROTTLE_REDIS_URL
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    usage.flush_pending()  # never raises: the batch is kept
    settings.DJANGO_THROTTLE_REDIS_URL = healthy
    store = open_store(get_backend())

    usage.flush_pending()
    assert failed_open(store, minute) == usage.PUSH_PER_CALL
    usage.flush_pending()
    assert failed_open(store, minute) == usage.PUSH_PER_CALL + 5
    assert not usage.pending


#: Put in front of a script: every redis.call / redis.pcall whose command names a key must
#: name one the call declared in KEYS (TIME names none).
_DECLARED_ONLY = """
local function declared_key(command, key)
  if string.upper(command) == 'TIME' then
    return
  end
  for _, name in ipairs(KEYS) do
    if name == key then
      return
    end
  end
  error('undeclared key ' .. tostring(key) .. ' for ' .. command)
end
local function checked_call(command, ...)
  declared_key(command, ...)
  return redis.call(command, ...)
end
local function checked_pcall(command, ...)
  declared_key(command, ...)
  return redis.pcall(command, ...)
end
"""


def declared_only(source: str) -> tuple[str, str]:
    """``source`` checking every key it touches against KEYS, and its digest."""
    import hashlib

    text = _DECLARED_ONLY + source.replace("redis.call(", "checked_call(").replace(
        "redis.pcall(", "checked_pcall("
    )
    return text, hashlib.sha1(text.encode()).hexdigest()


def test_the_push_and_read_scripts_touch_only_declared_keys(
    redis_client: Any, open_store: Callable[..., Any]
) -> None:
    """Servers that check declared keys (and a cluster, beyond the shared hash tag) see every
    key the usage push and read scripts touch in KEYS."""
    store = open_store(get_backend())
    store._push_source, store._push_sha = declared_only(store._push_source)
    store._read_source, store._read_sha = declared_only(store._read_source)
    minute = store.now_minute()
    counts = [
        (minute - n % 3, "pro|search", f"user:{n}", "adsoc"[n % 5], 1 + n % 4) for n in range(40)
    ]
    store.push("declared", counts)
    found = store.read([minute - 2, minute - 1, minute])
    assert sum(sum(row) for counts_ in found.values() for row in counts_.totals.values()) == sum(
        n for *_, n in counts
    )
    assert store.take_late() == {minute - 2, minute - 1, minute}


def _parse_push(keys: list[str], args: list[Any], totals: list[tuple[str, int]]) -> list[Any]:
    """The client counts ``(top list, client, n)`` of one push call, its totals added to
    ``totals``. ARGV: T, then (key index, minute, field, n) per total; L, then per top list
    (key index, m, then m pairs of client and n); then pairs of key client and second."""
    head = 1 + 4 * int(args[0])
    totals += [(keys[args[at] - 1], args[at + 3]) for at in range(1, head, 4)]
    named = [(keys[args[at] - 1], args[at + 2]) for at in range(1, head, 4)]
    assert len(set(named)) == len(named)  # (hash, field): once per call
    clients = []
    at = head + 1
    for _ in range(int(args[head])):
        top, m = keys[args[at] - 1], int(args[at + 1])
        clients += [(top, args[pair], args[pair + 1]) for pair in range(at + 2, at + 2 + 2 * m, 2)]
        at += 2 + 2 * m
    assert (len(args) - at) % 2 == 0  # keys' last use
    return clients


def test_a_push_sends_each_total_once_and_each_client_once_per_minute(store: Any) -> None:
    """The process sums its counts before pushing: a shard's call carries each exact total
    (minute, outcome, usage field) once, however many clients it counts, and each client once
    per minute and outcome, however many usage fields it was counted under; the figures read
    back are those of the counts."""
    calls: list[Any] = []
    send = store._evalsha_all

    def recording(client: Any, sha: str, source: str, batch: Any) -> Any:
        if sha == store._push_sha:
            calls.extend(batch)
        return send(client, sha, source, batch)

    store._evalsha_all = recording
    minute = store.now_minute()
    counts = [(minute, "pro|search", f"user:{n}", "a", 1) for n in range(150)]
    counts += [(minute, "pro|export", f"user:{n}", "a", 2) for n in range(0, 150, 3)]
    counts += [(minute, "pro|search", "user:7", "d", 4), (minute, "pro|search", "user:7", "d", 1)]
    store.push("sums", counts)

    totals: list[tuple[str, int]] = []
    clients: list[tuple[str, str, int]] = []
    for keys, args in calls:
        clients += _parse_push(keys, args, totals)
    shards = {store.tags[shard_of(f"user:{n}", len(store.tags))] for n in range(150)}
    # One total per shard and (outcome, field): allowed search, allowed export, denied search.
    assert len(totals) <= 3 * len(shards)
    assert sum(n for _, n in totals) == sum(count[4] for count in counts)
    # Each client once per outcome: its two fields summed.
    assert len(clients) == 151
    assert len({(key, client) for key, client, _ in clients}) == 151
    assert {client: n for key, client, n in clients if "}ta" in key}["user:3"] == 3
    assert {client: n for key, client, n in clients if "}td" in key} == {"user:7": 5}

    found = store.read([minute])[minute]
    assert found.totals["pro|search"][:2] == [150, 5]
    assert found.totals["pro|export"][:2] == [100, 0]


def test_pushes_leave_no_growing_structure(
    redis_client: Any, open_store: Callable[..., Any]
) -> None:
    """Each batch's mark is a key of its own with a TTL (no set re-armed by every push), and
    the late minutes hold only minutes pushed to within the usage TTL."""
    store = open_store(get_backend())
    minute = store.now_minute()
    for n in range(30):
        store.push(f"batch-{n}", [(minute, "pro|search", "user:1", "o", 1)])
    prefix = get_backend().prefix  # type: ignore[attr-defined]
    marks = [key for key in redis_client.scan_iter(f"{prefix}:*") if b"}p" in key]
    assert len(marks) == 30
    assert all(redis_client.type(key) == b"string" for key in marks)
    assert all(0 < redis_client.ttl(key) <= usage_store.USAGE_TTL for key in marks)
    late = [key for key in redis_client.scan_iter(f"{prefix}:*") if key.endswith(b"}l")]
    assert late and all(redis_client.ttl(key) > 0 for key in late)
    # A minute last pushed to longer ago than the TTL has expired counts: trimmed.
    (key,) = late
    redis_client.zadd(key, {"1": 0})
    store.push("after", [(minute, "pro|search", "user:1", "o", 1)])
    assert redis_client.zscore(key, "1") is None
    assert store.take_late() == {minute}


@pytest.mark.parametrize(
    "algorithms",
    [[algorithm] for algorithm in ALGORITHMS] + [list(ALGORITHMS)],
    ids=[*ALGORITHMS, "all seven"],
)
def test_the_counting_scripts_touch_only_declared_keys(
    redis_client: Any, algorithms: list[str]
) -> None:
    """Every key the counting call touches, usage counters included, is one it declared in
    KEYS (was: the usage keys were derived inside the script from KEYS[1]'s tag), and so is
    every key of the refund that undoes it: for every algorithm and all of them at once, a
    shared limit, a shadow one, an API key's last use, and every outcome."""
    backend = get_backend()
    for calls in (backend._calls, backend._refunds):  # type: ignore[attr-defined]
        source_for = calls.source_for
        calls.source_for = lambda codes, source_for=source_for: declared_only(source_for(codes))[0]
        calls._scripts.clear()
        calls.forget()
    limits = [
        Limit.build(f"declared-{name}", "2/day", algorithm=name, shadow=index == 1)
        for index, name in enumerate(algorithms)
    ]
    limits.append(Limit.build("declared-shared", "1000/h", shared=True))
    field = usage.field_for("pro", "search")
    for client in ("ip:203.0.113.9", "key:abcdefgh", "user:" + "é" * 90):
        outcomes = [backend.hit(client, limits, usage=field) for _ in range(4)]
        assert [d.allowed for d in outcomes][:1] == [True] and not outcomes[-1].allowed
        backend.refund(client, limits)
        assert backend.peek(client, limits).remaining >= 0


def test_a_caller_whose_clock_is_behind_has_its_minute_copied_again(
    redis_client: Any,
    monkeypatch: pytest.MonkeyPatch,
    open_store: Callable[..., Any],
) -> None:
    """The usage keys are named by the caller's minute (it must name them before the script
    reads the server's clock); when the server's minute is already later, the call notes the
    minute as late, as a push does, so a rollup that already copied it copies it again."""
    import time

    from django_throttle.backends import redis as redis_backend

    backend = get_backend()
    store = open_store(backend)
    store.take_late()
    minute = store.now_minute()
    real = time.time
    monkeypatch.setattr(redis_backend.time, "time", lambda: real() - 180)  # three minutes behind
    field = usage.field_for("pro", "search")
    assert backend.hit("ip:203.0.113.10", [Limit.build("behind", "10/h")], usage=field).allowed
    monkeypatch.undo()
    late = store.take_late()
    assert late and all(minute - 4 <= m <= minute - 2 for m in late)
    found = store.read(sorted(late))
    assert sum(row[0] for counts in found.values() for row in counts.totals.values()) == 1


@pytest.mark.parametrize(
    "args",
    [
        [],  # no number of totals
        [0],  # no number of top lists
        [1, 9, 1, "apro|", 1, 0],  # a total naming no key
        [0, 1, 4, 2, "user:1", 1],  # a top list announcing two clients, holding one
        [0, 1, 3, 1, "user:1", 1],  # a top list naming the keys' last-use set
        [0, 0, "key:dt_ab12"],  # a key client without its second
        [0, "x"],
    ],
)
def test_a_push_with_arguments_that_do_not_match_writes_nothing(
    redis_client: Any, open_store: Callable[..., Any], args: list[Any]
) -> None:
    store = open_store(get_backend())
    tag = store.tags[0]
    minute = store.now_minute()
    keys = [f"{tag}pbad", f"{tag}l", f"{tag}k", f"{tag}ta{minute}"]

    with pytest.raises(Exception, match="expected ARGV\\[1\\] totals"):
        redis_client.eval(store._push_source, len(keys), *keys, *args)
    assert not redis_client.exists(*keys)


def test_a_push_with_arguments_that_match_counts_them(
    redis_client: Any, open_store: Callable[..., Any]
) -> None:
    store = open_store(get_backend())
    tag = store.tags[0]
    minute = store.now_minute()
    keys = [f"{tag}pgood", f"{tag}l", f"{tag}k", f"{tag}ta{minute}", f"{tag}u{minute}"]
    args = [1, 5, minute, "apro|", 3, 1, 4, 2, "user:1", 1, "key:dt_ab12", 2, "key:dt_ab12", 7]

    assert redis_client.eval(store._push_source, len(keys), *keys, *args) == 1
    assert redis_client.zrange(keys[3], 0, -1, withscores=True) == [
        (b"user:1", 1.0),
        (b"key:dt_ab12", 2.0),
    ]
    assert redis_client.hgetall(keys[4]) == {b"apro|": b"3"}
    assert redis_client.zscore(keys[2], "dt_ab12") == 7
