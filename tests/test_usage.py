"""Usage counting: every decision counted by the backend in the same step, the Lua that does
it, and decisions made without the backend (kept in process, pushed when it answers)."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.test import RequestFactory

from django_throttle.backends import get_backend, usage_store
from django_throttle.backends.base import Backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.usage_store import lua_source
from django_throttle.rates import Limit
from django_throttle.request import core
from django_throttle.usage import accounting as usage
from tests.factories import endpoint, tier, with_shards

pytestmark = pytest.mark.django_db

OUTCOMES = ["allowed", "denied", "shadow_denied", "failed_open", "failed_closed"]
ALLOW = (Limit.build("usage-allow", "1000000/s"),)
DENY = (Limit.build("usage-deny", "1/h"),)
SHADOW = (*ALLOW, Limit.build("usage-shadow", "1/h", shadow=True))
SHADOW_PRIMER = (Limit.build("usage-shadow", "1/h"),)


def send(
    backend: Backend,
    client: str,
    tier: str,
    endpoint: str,
    *,
    allowed: int = 0,
    denied: int = 0,
    shadow: int = 0,
    at: float | None = None,
) -> None:
    """Decide requests whose outcomes are known in advance, counted under tier/endpoint."""
    field = usage.field_for(tier, endpoint)
    for _ in range(allowed):
        assert backend.hit(client, ALLOW, usage=field, now=at).allowed
    if denied:
        backend.hit(client, DENY, now=at)  # empties the bucket, uncounted
        for _ in range(denied):
            assert not backend.hit(client, DENY, usage=field, now=at).allowed
    if shadow:
        backend.hit(client, SHADOW_PRIMER, now=at)
        for _ in range(shadow):
            decision = backend.hit(client, SHADOW, usage=field, now=at)
            assert decision.allowed and decision.shadow


def run(*args: str, stderr: io.StringIO | None = None) -> str:
    out = io.StringIO()
    call_command("throttle_usage", *args, stdout=out, stderr=stderr or io.StringIO())
    return out.getvalue()


def by(what: str, *args: str) -> dict[str, dict[str, int]]:
    """The JSON report as {key: {column: count}}."""
    rows = json.loads(run("--by", what, "--format", "json", "--top", "1000", *args))
    for row in rows:  # what tests/test_usage_seams.py checks
        for extra in ("name", "before_authentication", "estimated", "unread_from"):
            row.pop(extra, None)
        if not row.get("delayed"):  # tests/test_delay_usage.py checks the delays
            row.pop("delayed", None)
            row.pop("mean_wait_s", None)
        if not row.get("shed"):  # tests/test_shedding.py checks the shed requests
            row.pop("shed", None)
    return {row.pop(what): row for row in rows}


def columns(allowed: int = 0, denied: int = 0, shadow: int = 0, fo: int = 0, fc: int = 0) -> Any:
    total = allowed + denied + shadow + fo + fc
    values = dict(zip(OUTCOMES, (allowed, denied, shadow, fo, fc), strict=True))
    return {**values, "total": total, "denied_percent": round(100 * denied / total, 2)}


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest, settings: Any) -> Backend:
    if request.param == "memory":
        settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    return get_backend()


# Every decision is counted by the backend, in the same step


def test_each_outcome_is_counted_per_tier_endpoint_and_client(backend: Backend) -> None:
    send(backend, "user:1", "pro", "search", allowed=5, denied=3, shadow=2)
    send(backend, "user:2", "pro", "export", allowed=1)
    send(backend, "ip:203.0.113.7", "", "", allowed=2, denied=1)

    assert by("client") == {
        "user:1": columns(5, 3, 2),
        "user:2": columns(1),
        "ip:203.0.113.7": columns(2, 1),
    }
    assert by("tier") == {"pro": columns(6, 3, 2), "(no tier)": columns(2, 1)}
    assert by("endpoint") == {
        "search": columns(5, 3, 2),
        "export": columns(1),
        "(no endpoint rule)": columns(2, 1),
    }


def test_requests_are_counted_with_no_query_and_no_thread_but_the_pusher(client: Any) -> None:
    """No SQL, and no thread per request: the one thread counts start is the process's
    pusher (at most one, whatever the requests), which pushes the counts off the request."""
    anon = tier("anonymous", "100/h", is_default_anonymous=True)
    endpoint("ping", "scope", "ping", limits={anon: "3/h"})
    request = RequestFactory().get("/api/ping/")
    request.resolver_match = None
    core.check(request, scope="ping")  # compiles the policy (queries) once
    usage.push_soon()  # the pusher, started once per process
    threads = threading.active_count()

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        decisions = [core.check(request, scope="ping") for _ in range(5)]

    assert queries.captured_queries == []
    assert threading.active_count() == threads
    assert [d.allowed for d in decisions] == [True, True, False, False, False]
    assert by("endpoint")["ping"] == columns(3, 3)


def test_shadow_would_denies_through_requests(client: Any) -> None:
    anon = tier("anonymous", "100/h", is_default_anonymous=True)
    endpoint("ping", "route", "ping", shadow=True, limits={anon: "1/h"})

    statuses = [client.get("/api/ping/").status_code for _ in range(3)]

    assert statuses == [200, 200, 200]
    assert by("endpoint") == {"ping": columns(allowed=1, shadow=2)}


def test_nothing_is_counted_when_usage_is_off(backend: Backend, settings: Any) -> None:
    settings.DJANGO_THROTTLE_USAGE_RETENTION_DAYS = 0
    assert usage.field_for("pro", "search") is None
    backend.hit("user:1", ALLOW, usage=usage.field_for("pro", "search"))
    usage.record_degraded(usage.field_for("pro", "search"), "user:1", usage.FAILED_OPEN)

    assert not usage.pending
    assert by("client") == {}


# Usage fields


@pytest.mark.parametrize(
    ("tier_slug", "endpoint_name"),
    [("pro", "search"), ("", ""), ("", "export"), ("free", ""), ("pro", "a|b c"), ("t", "é")],
)
def test_a_field_names_its_tier_and_endpoint(tier_slug: str, endpoint_name: str) -> None:
    field = usage.field_for(tier_slug, endpoint_name)
    assert field
    assert usage.split_field(field) == (tier_slug, endpoint_name)


def test_a_field_is_short_and_bounded() -> None:
    assert usage.field_for("pro", "search") == "pro|search"
    long = usage.field_for("t", "é" * 300)
    assert long is not None and len(long.encode()) <= usage.MAX_FIELD_BYTES
    assert usage.split_field(usage.field_for("a|b", "c") or "") == ("a-b", "c")


# The Lua: one shard's keys, bounded, with TTLs, never failing a decision


@pytest.fixture
def count(redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Call count_into directly on one shard's keys of this minute: usage.lua with a top size
    of 3, and a one-line driver."""
    monkeypatch.setattr(usage_store, "TOP_CLIENTS", 3)
    driver = (
        "count_into(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4],"
        " tonumber(ARGV[5]))"
    )
    source = lua_source(shards=1) + "\n" + driver
    tag = f"test-{os.urandom(4).hex()}:{{0}}"
    now = time.time() * 1e6
    minute = int(now // 60e6)

    def call(client: str, outcome: str = "a", n: int = 1, field: str = "pro|search") -> None:
        keys = (f"{tag}u{minute}", f"{tag}t{outcome}{minute}", f"{tag}k")
        redis_client.eval(source, 3, *keys, now, field, client, outcome, n)

    call.tag = tag  # type: ignore[attr-defined]
    call.minute = minute  # type: ignore[attr-defined]
    yield call
    keys = redis_client.keys(f"{tag}*")
    if keys:
        redis_client.delete(*keys)


def test_lua_counts_exactly_and_keeps_the_heaviest_clients(
    count: Any, redis_client: redis.Redis
) -> None:
    for client, n in [("a", 5), ("b", 4), ("c", 3), ("d", 1), ("e", 10)]:
        for _ in range(n):
            count(client)
    top = redis_client.zrange(f"{count.tag}ta{count.minute}", 0, -1, withscores=True)
    totals = redis_client.hgetall(f"{count.tag}u{count.minute}")

    assert totals == {b"apro|search": b"23"}
    assert len(top) == 3  # bounded by the top size
    scores = dict(top)
    # The heavy late client is listed; the counts still add up to the exact total.
    assert {b"a", b"e"} <= set(scores)
    assert sum(scores.values()) == 23


def test_lua_sets_a_ttl_on_every_key_it_writes(count: Any, redis_client: redis.Redis) -> None:
    for i, outcome in enumerate("adsoc" * 3):
        count(f"ip:{i}", outcome)
    keys = redis_client.keys(f"{count.tag}*")

    assert len(keys) == 6  # the totals hash and one top list per outcome
    assert all(0 < redis_client.ttl(key) <= usage_store.USAGE_TTL for key in keys)


def test_lua_top_of_one_keeps_its_ttl(
    count: Any, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(usage_store, "TOP_CLIENTS", 1)
    source = lua_source(shards=1) + (
        "\ncount_into(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), 'f', ARGV[2], 'a', 1)"
    )
    keys = (f"{count.tag}u{count.minute}", f"{count.tag}ta{count.minute}", f"{count.tag}k")
    for client in ("a", "b", "c"):
        redis_client.eval(source, 3, *keys, time.time() * 1e6, client)
    [key] = redis_client.keys(f"{count.tag}ta*")
    assert redis_client.zcard(key) == 1
    assert redis_client.ttl(key) > 0


def test_a_broken_usage_key_never_fails_a_decision(
    redis_client: redis.Redis, settings: Any
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = with_shards(
        settings.DJANGO_THROTTLE_REDIS_URL, 16
    )  # every one of a Cluster's shards broken
    backend = get_backend()
    minute = int(redis_client.time()[0]) // 60
    for tag in backend.shard_tags():  # type: ignore[attr-defined]
        redis_client.set(f"{tag}u{minute}", "not a hash", ex=60)
        redis_client.set(f"{tag}ta{minute}", "not a sorted set", ex=60)

    decisions = [backend.hit("user:1", DENY, usage="pro|search") for _ in range(2)]

    assert [d.allowed for d in decisions] == [True, False]


def test_a_clients_usage_keys_live_in_one_shard_and_expire(
    redis_client: redis.Redis, settings: Any
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = with_shards(
        settings.DJANGO_THROTTLE_REDIS_URL, 16
    )  # a Cluster's default
    backend = get_backend()
    send(backend, "user:1", "pro", "search", denied=1)
    usage.flush_pending()  # the first push of a process is due at once

    tags = backend.shard_tags()  # type: ignore[attr-defined]
    holding = [tag for tag in tags if redis_client.keys(f"{tag}[ut]*")]
    assert len(holding) == 1  # one hash tag: one Redis Cluster slot per push call
    usage_keys = redis_client.keys(f"{holding[0]}[ut]*")
    assert all(redis_client.ttl(key) > 0 for key in usage_keys)


# Decisions made without the backend


def test_degraded_decisions_are_pushed_when_the_backend_answers(settings: Any) -> None:
    anon = tier("anonymous", "100/h", is_default_anonymous=True)
    endpoint("ping", "scope", "ping", limits={anon: "100/h"})
    request = RequestFactory().get("/api/ping/")
    request.resolver_match = None
    healthy = settings.DJANGO_THROTTLE_REDIS_URL
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    settings.DJANGO_THROTTLE_FAILURE_MODE = "open"
    assert all(core.check(request, scope="ping").allowed for _ in range(3))
    settings.DJANGO_THROTTLE_FAILURE_MODE = "closed"
    assert not any(core.check(request, scope="ping").allowed for _ in range(2))
    assert usage.pending

    settings.DJANGO_THROTTLE_REDIS_URL = healthy
    assert core.check(request, scope="ping").allowed  # the backend answers: pushes them
    assert usage.wait_pushed()  # in the process's pusher thread, not on the request

    assert not usage.pending
    assert by("endpoint") == {"ping": columns(allowed=1, fo=3, fc=2)}
    assert by("client") == {"ip:127.0.0.1": columns(allowed=1, fo=3, fc=2)}


def test_a_failed_push_keeps_the_counts(settings: Any) -> None:
    healthy = settings.DJANGO_THROTTLE_REDIS_URL
    usage.record_degraded("pro|search", "user:1", usage.FAILED_OPEN)
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    usage.flush_pending()  # never raises
    assert usage.pending

    settings.DJANGO_THROTTLE_REDIS_URL = healthy
    usage.flush_pending()

    assert not usage.pending
    assert by("client") == {"user:1": columns(fo=1)}


def test_a_repeated_push_counts_once(backend: Backend, open_store: Callable[..., Any]) -> None:
    """A push whose reply was lost is sent again: the batch id makes it a no-op."""
    store = open_store(backend)
    minute = store.now_minute()
    counts = [(minute, "pro|search", "user:1", "o", 4), (minute, "pro|", "user:2", "c", 1)]
    store.push("batch-1", counts)
    store.push("batch-1", counts)

    assert by("client") == {"user:1": columns(fo=4), "user:2": columns(fc=1)}


def test_kept_counts_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(usage, "MAX_PENDING", 2)
    for n in range(5):
        usage.record_degraded("pro|search", f"ip:198.51.100.{n}", usage.FAILED_OPEN)
    usage.flush_pending()

    assert by("client") == {
        usage.OTHER: columns(fo=3),
        "ip:198.51.100.0": columns(fo=1),
        "ip:198.51.100.1": columns(fo=1),
    }
    assert by("tier") == {"pro": columns(fo=5)}


@pytest.mark.parametrize("outcome", [True, None, "ok", usage.SHADOW_DENIED])
def test_record_degraded_refuses_anything_but_its_outcomes(outcome: object) -> None:
    if outcome == usage.SHADOW_DENIED:  # a backend outcome, but harmless to keep
        usage.record_degraded("f|", "user:1", outcome)
        return
    with pytest.raises(ValueError, match="outcome must be one of allowed, denied"):
        usage.record_degraded("f|", "user:1", outcome)  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_does_not_push_its_parents_counts() -> None:
    """gunicorn --preload: counts kept before the fork are the parent's to push."""
    usage.record_degraded("pro|search", "user:parent", usage.FAILED_OPEN)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never return into pytest
        try:
            usage.flush_pending()
            os._exit(0 if not usage.pending else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert by("client") == {}
    usage.flush_pending()
    assert by("client") == {"user:parent": columns(fo=1)}


def test_the_memory_backend_keeps_usage_in_process() -> None:
    backend = MemoryBackend(clock=lambda: 1_700_000_030.0)
    backend.hit("user:1", ALLOW, usage="pro|search")
    backend.hit("user:1", ALLOW, usage=None)

    found = backend.usage.read([1_700_000_030 // 60])
    assert [(m, c.totals, c.clients) for m, c in found.items()] == [
        # outcomes, then the delays (totals only)
        (1_700_000_030 // 60, {"pro|search": [1] + [0] * 7}, {"user:1": [1] + [0] * 7})
    ]


def test_any_client_label_reads_back(backend: Backend) -> None:
    """Reads join names with NUL bytes for speed; a name holding one still reads back."""
    odd = "key:a\x00b|c"
    send(backend, odd, "pro", "x\x00y", allowed=2, denied=1)
    send(backend, "user:1", "pro", "x\x00y", allowed=1)

    # Shown as plain text: control characters written as escapes.
    assert by("client") == {"key:a\\x00b|c": columns(2, 1), "user:1": columns(1)}
    assert by("endpoint") == {"x\\x00y": columns(3, 1)}


def test_a_push_waits_for_the_batch_another_thread_has_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two pushes of kept counts at once (the pusher thread's and a command's): the second
    returns only once the first's batch reached Redis, so a reader right after sees it (it
    returned at once, the batch still in flight: tests had to wait for the thread)."""
    monkeypatch.setattr(usage, "PUSH_PER_CALL", 1)
    usage.record_degraded("pro|search", "ip:198.51.100.1", usage.FAILED_OPEN)
    usage.record_degraded("pro|search", "ip:198.51.100.2", usage.FAILED_CLOSED)
    store_class = type(usage._push_store(get_backend()))
    real_push = store_class.push
    sending, go = threading.Event(), threading.Event()

    def held_push(self: Any, batch: str, counts: Any) -> Any:
        if not sending.is_set():  # the first batch waits, sent, for the test
            sending.set()
            assert go.wait(10)
        return real_push(self, batch, counts)

    monkeypatch.setattr(store_class, "push", held_push)
    first = threading.Thread(target=usage.flush_pending)
    first.start()
    assert sending.wait(10)
    second = threading.Thread(target=usage.flush_pending)
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waits for the batch in flight
    go.set()
    first.join(10)
    second.join(10)

    assert not usage.pending
    assert by("client") == {"ip:198.51.100.1": columns(fo=1), "ip:198.51.100.2": columns(fc=1)}
