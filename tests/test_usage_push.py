"""Counts kept through an outage reach the backend a bounded batch per request.

While the backend cannot answer, every decision is counted in process (``usage.record_degraded``);
the requests after it answers again push those counts, each at most ``usage.PUSH_PER_CALL`` of
them, so no single request carries a long outage's backlog (its time would grow with the
outage), and nothing is lost.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_throttle.backends import get_backend, usage_base
from django_throttle.rates import Algorithm, Limit
from django_throttle.usage import accounting as usage
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db

MEMORY = "django_throttle.backends.memory.MemoryBackend"
ALGORITHMS = [algorithm.value for algorithm in Algorithm]


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest, settings: Any) -> Any:
    if request.param == "memory":
        settings.DJANGO_THROTTLE_BACKEND = MEMORY
    return usage.get_store(get_backend())


def failed_open(store: Any, minute: int) -> int:
    """Requests counted as failed open around ``minute`` (a minute may turn during the
    test), over every usage field."""
    found = store.read([minute - 1, minute, minute + 1], clients=False)
    return sum(row[3] for counts in found.values() for row in counts.totals.values())


def test_each_request_pushes_a_bounded_batch_and_nothing_is_lost(client: Any, store: Any) -> None:
    anonymous = tier("anonymous", "1000000/h", is_default_anonymous=True)
    endpoint("ping", "route", "ping", limits={anonymous: "1000000/h"})
    minute = store.now_minute()
    for n in range(usage.MAX_PENDING):  # an outage's worth: every count a process keeps
        usage.record_degraded("anonymous|ping", f"ip:10.{n >> 8 & 255}.{n & 255}.1", "failed_open")
    assert usage.pending

    assert client.get("/api/ping/").status_code == 200
    assert failed_open(store, minute) == usage.PUSH_PER_CALL

    requests = 1
    while usage.pending:
        before = failed_open(store, minute)
        assert client.get("/api/ping/").status_code == 200
        assert 0 < failed_open(store, minute) - before <= usage.PUSH_PER_CALL
        requests += 1
        assert requests <= usage.MAX_PENDING // usage.PUSH_PER_CALL
    assert failed_open(store, minute) == usage.MAX_PENDING


def test_a_failed_batch_goes_first_when_the_backend_answers(settings: Any) -> None:
    """A batch whose push failed is retried whole before newer counts, under its own id."""
    store = usage.get_store(get_backend())
    minute = store.now_minute()
    for n in range(usage.PUSH_PER_CALL + 5):
        usage.record_degraded("pro|search", f"user:{n}", "failed_open")
    healthy = settings.DJANGO_THROTTLE_REDIS_URL
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    usage.flush_pending()  # never raises: the batch is kept
    settings.DJANGO_THROTTLE_REDIS_URL = healthy
    store = usage.get_store(get_backend())

    usage.flush_pending()
    assert failed_open(store, minute) == usage.PUSH_PER_CALL
    usage.flush_pending()
    assert failed_open(store, minute) == usage.PUSH_PER_CALL + 5
    assert not usage.pending


#: Put in front of a script: every redis.call / redis.pcall whose command names a key must
#: name one the call declared in KEYS (TIME names none).
_DECLARED_ONLY = """
local declared = {}
for _, name in ipairs(KEYS) do declared[name] = true end
local function declared_key(command, key)
  if string.upper(command) ~= 'TIME' and not declared[key] then
    error('undeclared key ' .. tostring(key) .. ' for ' .. command)
  end
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


def test_the_push_and_read_scripts_touch_only_declared_keys(redis_client: Any) -> None:
    """Servers that check declared keys (and a cluster, beyond the shared hash tag) see every
    key the usage push and read scripts touch in KEYS."""
    store = usage.get_store(get_backend())
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


def test_pushes_leave_no_growing_structure(redis_client: Any) -> None:
    """Each batch's mark is a key of its own with a TTL (no set re-armed by every push), and
    the late minutes hold only minutes pushed to within the usage TTL."""
    store = usage.get_store(get_backend())
    minute = store.now_minute()
    for n in range(30):
        store.push(f"batch-{n}", [(minute, "pro|search", "user:1", "o", 1)])
    prefix = get_backend().prefix  # type: ignore[attr-defined]
    marks = [key for key in redis_client.scan_iter(f"{prefix}:*") if b"}p" in key]
    assert len(marks) == 30
    assert all(redis_client.type(key) == b"string" for key in marks)
    assert all(0 < redis_client.ttl(key) <= usage_base.USAGE_TTL for key in marks)
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
        calls._cache = type(calls._cache)()
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
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usage keys are named by the caller's minute (it must name them before the script
    reads the server's clock); when the server's minute is already later, the call notes the
    minute as late, as a push does, so a rollup that already copied it copies it again."""
    import time

    from django_throttle.backends import frames

    backend = get_backend()
    store = usage.get_store(backend)
    store.take_late()
    minute = store.now_minute()
    real = time.time
    monkeypatch.setattr(frames.time, "time", lambda: real() - 180)  # three minutes behind
    field = usage.field_for("pro", "search")
    assert backend.hit("ip:203.0.113.10", [Limit.build("behind", "10/h")], usage=field).allowed
    monkeypatch.undo()
    late = store.take_late()
    assert late and all(minute - 4 <= m <= minute - 2 for m in late)
    found = store.read(sorted(late))
    assert sum(row[0] for counts in found.values() for row in counts.totals.values()) == 1
