"""The least-privilege ACL user of :mod:`django_throttle.backends.redis_clients`, on servers this
module starts: the throttle counts, peeks, refunds, resets, retimes, keeps the policy version
and pushes and reads usage holding exactly :func:`acl_rules` (the docs' rules), sync and async,
for every algorithm; the user can touch nothing outside its prefix and run no dangerous
command; a user that lacks a command the throttle needs is an outage the failure mode answers,
never a 500. The whole suite also runs as this user (``DJANGO_THROTTLE_TEST_ACL``)."""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import Client

from django_throttle.backends import get_backend, reset_backend_cache
from django_throttle.backends.base import BackendError
from django_throttle.backends.redis import RedisBackend
from django_throttle.backends.redis_clients import COMMANDS, acl_rules, glob_escape, key_pattern
from django_throttle.backends.usage_store import RedisUsage
from django_throttle.rates import RATE_ALGORITHMS, Algorithm, Limit
from tests.redis_servers import LOOPBACK, RedisServer

DOCS = Path(__file__).resolve().parents[1] / "docs" / "howto" / "managed-redis.md"
PREFIX = "dt"
LIMIT = 5


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


def user_url(server: RedisServer, rules: list[str], name: str = "throttle") -> str:
    """Make (or remake) the ACL user ``name`` with ``rules``; the URL that logs in as it."""
    password = secrets.token_hex(8)
    with server.client() as admin:
        admin.execute_command("ACL", "SETUSER", name, "reset", *rules, "on", f">{password}")
    return f"redis://{name}:{password}@{LOOPBACK}:{server.port}/0"


@pytest.fixture
def least(settings: Any, server: RedisServer) -> Iterator[RedisBackend]:
    """The configured backend, logged in as a user holding exactly ``acl_rules("dt")``."""
    settings.DJANGO_THROTTLE_KEY_PREFIX = PREFIX
    settings.DJANGO_THROTTLE_REDIS_URL = user_url(server, acl_rules(PREFIX))
    # Generous timeouts: a burst of async connections on a loaded machine took longer than
    # the defaults' 50 ms connect timeout; what is tested here is the ACL.
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {
        "socket_timeout": 2.0,
        "socket_connect_timeout": 2.0,
        "timeout": 2.0,
    }
    reset_backend_cache()
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    yield backend
    reset_backend_cache()
    with server.client() as admin:
        for key in admin.scan_iter(match=f"{PREFIX}:*", count=1000):
            admin.delete(key)


def limits(algorithm: str, name: str = "acl") -> tuple[Limit, ...]:
    return (Limit.build(name, f"{LIMIT}/d", algorithm=algorithm),)


@pytest.mark.parametrize("algorithm", RATE_ALGORITHMS)
def test_every_algorithm_counts_exactly_as_the_least_privilege_user(
    least: RedisBackend, algorithm: str
) -> None:
    lim = limits(algorithm)
    assert [least.hit("sync", lim, usage="free|acl").allowed for _ in range(LIMIT + 2)] == [
        True
    ] * LIMIT + [False, False]

    async def burst() -> list[bool]:
        decisions = await asyncio.gather(*(least.ahit("async", lim) for _ in range(LIMIT + 3)))
        return [decision.allowed for decision in decisions]

    assert sum(asyncio.run(burst())) == LIMIT
    assert least.peek("sync", lim).remaining == 0
    refunded = least.hit("refunded", lim, 2)
    least.refund("refunded", lim, 2, taken_at=dict(refunded.taken).get("refunded"))
    assert least.peek("refunded", lim).remaining == LIMIT
    least.reset("sync", lim)
    assert least.peek("sync", lim).remaining == LIMIT


def test_concurrency_leases_as_the_least_privilege_user(least: RedisBackend) -> None:
    lim = limits(Algorithm.CONCURRENCY)
    held = [least.hit("sync", lim) for _ in range(LIMIT + 1)]
    assert [decision.allowed for decision in held] == [True] * LIMIT + [False]

    async def burst() -> list[bool]:
        decisions = await asyncio.gather(*(least.ahit("async", lim) for _ in range(LIMIT + 3)))
        return [decision.allowed for decision in decisions]

    assert sum(asyncio.run(burst())) == LIMIT
    assert len(least.leases("sync", lim[0])) == LIMIT  # the inspector's read (TIME, ZRANGEBYSCORE)
    [(_client, lease)] = held[0].leases
    assert least.renew("sync", lim, lease) == 1
    assert least.release("sync", lim, lease) == 1
    assert least.hit("sync", lim).allowed
    assert least.retime(lim) == 2  # both clients' keys
    least.reset("sync", lim)
    assert least.peek("sync", lim).remaining == LIMIT


def test_retime_reset_policy_version_and_usage_as_the_least_privilege_user(
    least: RedisBackend,
) -> None:
    lim = limits(Algorithm.GCRA, "edited")
    for name in ("a", "b", "c"):
        least.hit(name, lim, usage="pro|search")
    faster = (Limit.build("edited", f"{2 * LIMIT}/d", algorithm=Algorithm.GCRA),)
    assert least.retime(faster, previous=lim) == 3
    assert least.peek("a", faster).remaining == 2 * LIMIT - 1

    shared = (Limit.build("everyone", "9/d", shared=True),)
    least.hit("a", shared)
    least.reset_shared(shared)
    assert least.peek("b", shared).remaining == 9

    assert least.get_policy_version() is None
    least.bump_policy_version()
    assert least.get_policy_version() is not None

    store = RedisUsage(least)
    try:
        minute = store.now_minute()
        store.push("batch-1", [(minute, "pro|search", "user:late", "a", 4)])
        store.push("batch-1", [(minute, "pro|search", "user:late", "a", 4)])  # once per batch
        totals = store.read([minute])[minute].totals["pro|search"]
        assert totals[0] == 3 + 4
        store.return_late([minute])
        assert store.take_late() == {minute}
        store.advance_watermark(minute)
        assert store.watermark() == minute
    finally:
        store.close()


def test_the_user_can_touch_nothing_outside_its_prefix(
    least: RedisBackend, server: RedisServer
) -> None:
    client = least.client
    client.set(f"{PREFIX}:mine", "1", ex=10)
    for denied in (
        lambda: client.set("other:key", "1"),
        lambda: client.get("dtx:key"),  # a prefix that merely starts like ours
        lambda: client.flushall(),
        lambda: client.keys("*"),
        lambda: client.config_get("maxmemory"),
        lambda: client.script_flush(),
        lambda: client.execute_command("ACL", "LIST"),
        lambda: client.execute_command("CLIENT", "LIST"),
        lambda: client.publish("channel", "x"),
        lambda: client.eval("return redis.call('SET', 'outside', '1')", 0),
    ):
        with pytest.raises(redis.exceptions.ResponseError, match=r"(?i)no ?perm|permission|access"):
            denied()
    with server.client() as admin:
        assert admin.exists("other:key", "outside") == 0


def test_glob_characters_in_the_prefix_are_matched_literally(server: RedisServer) -> None:
    prefix = "team[1]*"
    assert key_pattern(prefix) == r"~team\[1\]\*:*"
    assert glob_escape("a?b\\c") == r"a\?b\\c"
    url = user_url(server, acl_rules(prefix), name="globbed")
    with redis.Redis.from_url(url) as client:
        client.set(f"{prefix}:k", "1", ex=10)
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set("team1x:k", "1", ex=10)
        client.delete(f"{prefix}:k")


@pytest.mark.parametrize("missing", [("time",), ("fcall", "evalsha")], ids=" and ".join)
def test_a_user_without_a_command_it_needs_is_an_outage_not_an_error(
    least: RedisBackend, settings: Any, server: RedisServer, missing: tuple[str, ...]
) -> None:
    """A command taken away (an operator's rules older than this release): the decision is a
    :class:`BackendError` the breaker counts, and a view answers by its failure mode."""
    taken = {f"+{command}" for command in missing}
    settings.DJANGO_THROTTLE_REDIS_URL = user_url(
        server, [rule for rule in acl_rules(PREFIX) if rule not in taken], name="short"
    )
    reset_backend_cache()
    backend = get_backend()
    with pytest.raises(BackendError):
        backend.hit("c", limits(Algorithm.TOKEN_BUCKET))
    with pytest.raises(BackendError):
        asyncio.run(backend.ahit("c", limits(Algorithm.TOKEN_BUCKET)))

    settings.DJANGO_THROTTLE_FAILURE_MODE = "open"
    reset_backend_cache()
    opened = Client().get("/hello/", REMOTE_ADDR="10.31.0.1")
    assert opened.status_code == 200
    assert opened["X-RateLimit-Degraded"] == "open"
    closed = Client().get("/login-closed/", REMOTE_ADDR="10.31.0.2")
    assert closed.status_code == 503


@pytest.mark.parametrize("missing", [("fcall", "function|load"), ("function|load",)])
def test_a_user_without_functions_counts_with_evalsha(
    least: RedisBackend,
    settings: Any,
    server: RedisServer,
    missing: tuple[str, ...],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The rules of an earlier release (no ``FCALL``, or no ``FUNCTION LOAD``: an operator
    may leave it out where other applications share the server, since it may replace any
    library): the throttle says so once and counts exactly with ``EVALSHA``, sync and async,
    never an outage."""
    taken = {f"+{command}" for command in missing}
    settings.DJANGO_THROTTLE_REDIS_URL = user_url(
        server, [rule for rule in acl_rules(PREFIX) if rule not in taken], name="older"
    )
    with server.client() as admin:
        admin.function_flush()  # none of the package's functions loaded yet
    reset_backend_cache()
    backend = get_backend()
    lim = limits(Algorithm.TOKEN_BUCKET, "older")
    with caplog.at_level("WARNING", logger="django_throttle.backends"):
        allowed = [backend.hit("sync", lim).allowed for _ in range(LIMIT + 1)]

        async def hits() -> list[bool]:
            return [(await backend.ahit("async", lim)).allowed for _ in range(LIMIT + 1)]

        allowed += asyncio.run(hits())
    assert allowed == ([True] * LIMIT + [False]) * 2
    warned = [r for r in caplog.records if "EVALSHA" in r.getMessage()]
    assert len(warned) == 1 and "+fcall and +function|load" in warned[0].getMessage()


def test_functions_granted_later_are_called_after_the_retry_without_a_restart(
    least: RedisBackend,
    settings: Any,
    server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An operator who reads the warning and grants ``+function|load`` (or upgrades the
    server) gets functions back within :data:`~.redis_nodes.RETRY_FUNCTIONS_AFTER` seconds,
    sync and async, counting exactly throughout; a retry still refused is said at DEBUG."""
    from django_throttle.backends import redis_nodes

    monkeypatch.setattr(redis_nodes, "RETRY_FUNCTIONS_AFTER", 0.3)
    settings.DJANGO_THROTTLE_REDIS_URL = user_url(
        server, [rule for rule in acl_rules(PREFIX) if rule != "+function|load"], name="later"
    )
    with server.client() as admin:
        admin.function_flush()
    reset_backend_cache()
    backend = get_backend()
    lim = limits(Algorithm.TOKEN_BUCKET, "later")

    def fcalls() -> int:
        """``FCALL`` s that ran (one answered "no such function" ran nothing)."""
        with server.client() as admin:
            stats = admin.info("commandstats").get("cmdstat_fcall", {})
        return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))

    async def ahit() -> bool:
        return (await backend.ahit("async", lim)).allowed

    sync: list[bool] = []
    aio: list[bool] = []
    with caplog.at_level("DEBUG", logger="django_throttle.backends"):
        sync.append(backend.hit("sync", lim).allowed)
        aio.append(asyncio.run(ahit()))
        time.sleep(0.4)  # tried again, still refused: EVALSHA again
        sync.append(backend.hit("sync", lim).allowed)
        aio.append(asyncio.run(ahit()))
        before = fcalls()
        with server.client() as admin:
            admin.execute_command("ACL", "SETUSER", "later", "+function|load")
        sync += [backend.hit("sync", lim).allowed for _ in range(2)]
        assert fcalls() == before  # within the retry period: still EVALSHA
        time.sleep(0.4)
        sync.append(backend.hit("sync", lim).allowed)  # loads the library, then FCALL
        aio += [asyncio.run(ahit()) for _ in range(LIMIT - 1)]
        sync.append(backend.hit("sync", lim).allowed)
        assert fcalls() == before + 1 + (LIMIT - 1) + 1
    assert sync == [True] * LIMIT + [False]
    assert aio == [True] * LIMIT + [False]
    said = [r for r in caplog.records if "EVALSHA" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING", "DEBUG"]


def test_the_docs_print_exactly_the_rules_for_the_default_prefix() -> None:
    text = DOCS.read_text()
    lines = [line for line in text.splitlines() if line.startswith("ACL SETUSER throttle ")]
    assert len(lines) == 1, "the docs print one ACL SETUSER line"
    words = lines[0].split()
    assert words[3:-2] == acl_rules(PREFIX)
    assert words[-2:] == ["on", ">change-me"]
    for command in COMMANDS:
        assert re.search(rf"`{re.escape(command.upper().replace('|', ' '))}`", text), command


@pytest.mark.slow
def test_a_cluster_needs_the_cluster_commands_and_no_more(settings: Any) -> None:
    """Every node holds the user (a cluster does not share ACLs). With the cluster rules the
    throttle counts exactly, sync and async, and reads usage across the primaries; without
    them redis-py cannot read the slot map, which is an outage, not an error."""
    from tests.topologies import LocalCluster

    cluster = LocalCluster(primaries=3, replicas=0)
    try:
        cluster.start()
        password = secrets.token_hex(8)
        for rules, name in (
            (acl_rules(PREFIX, cluster=True), "throttle"),
            (acl_rules(PREFIX), "plain"),
        ):
            for node in cluster.nodes:
                with node.client() as admin:
                    admin.execute_command(
                        "ACL", "SETUSER", name, "reset", *rules, "on", f">{password}"
                    )
        settings.DJANGO_THROTTLE_KEY_PREFIX = PREFIX
        settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 2.0, "timeout": 2.0}

        settings.DJANGO_THROTTLE_REDIS_URL = cluster.url.replace("://", f"://plain:{password}@", 1)
        reset_backend_cache()
        with pytest.raises(BackendError):
            get_backend().hit("c", limits(Algorithm.GCRA))

        settings.DJANGO_THROTTLE_REDIS_URL = cluster.url.replace(
            "://", f"://throttle:{password}@", 1
        )
        reset_backend_cache()
        backend = get_backend()
        assert isinstance(backend, RedisBackend) and backend.on_cluster
        for algorithm in Algorithm:
            lim = limits(algorithm)
            names = [f"user:{n}" for n in range(6)]
            for name in names:
                assert [
                    backend.hit(name, lim, usage="free|acl").allowed for _ in range(LIMIT + 1)
                ] == [True] * LIMIT + [False]

            async def burst(lim: tuple[Limit, ...] = lim) -> int:
                decisions = await asyncio.gather(
                    *(backend.ahit("a", lim) for _ in range(LIMIT + 3))
                )
                return sum(decision.allowed for decision in decisions)

            assert asyncio.run(burst()) == LIMIT
            backend.reset(names[0], lim)
            assert backend.peek(names[0], lim).remaining == LIMIT
        faster = (Limit.build("acl", f"{2 * LIMIT}/d", algorithm=Algorithm.CALENDAR),)
        assert backend.retime(faster, previous=limits(Algorithm.CALENDAR)) >= 6
        before = backend.get_policy_version()
        backend.bump_policy_version()
        assert backend.get_policy_version() not in (None, before)
        store = RedisUsage(backend)
        try:
            minute = store.now_minute()
            counts = store.read([minute - 1, minute])
            assert sum(c.totals["free|acl"][0] for c in counts.values()) == 6 * LIMIT * len(
                Algorithm
            )
        finally:
            store.close()
    finally:
        reset_backend_cache()
        cluster.stop()
