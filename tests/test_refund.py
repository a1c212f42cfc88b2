"""Refunds: a reservation given back (``Backend.refund``) on both backends and every algorithm.

A refund is the undo of an allowed hit: after N hits and k refunds a client sees what N - k
hits would have shown, never more than a full limit, and a refund of nothing writes nothing.
The Redis backend runs against the suite's private redis-server; no mocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from collections.abc import Sequence

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from django_throttle.backends import BackendError, get_backend
from django_throttle.backends.base import Backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.redis import RedisBackend
from django_throttle.backends.scripts import REFUND_FILES, load_script
from django_throttle.rates import RATE_ALGORITHMS, Algorithm, Decision, Limit
from tests.redis_servers import forget_code
from tests.test_model import SHORT_PX_MS, AlgorithmMachine, inspector

T0 = 1_700_000_000.0
CAPACITY = 5


def limit_for(algorithm: str, capacity: int = CAPACITY, **kwargs: object) -> Limit:
    """A limit of ``capacity`` per minute (per day for the calendar quota)."""
    period = "day" if algorithm == Algorithm.CALENDAR else "m"
    return Limit.build(f"r{algorithm[:4]}", f"{capacity}/{period}", algorithm=algorithm, **kwargs)  # type: ignore[arg-type]


def stored_states(backend: Backend, redis_client: redis.Redis, prefix: str) -> int:
    """How many states the backend holds (Redis: keys under this test's prefix)."""
    if isinstance(backend, MemoryBackend):
        return len(backend)
    return len(redis_client.keys(f"{prefix}:*"))


def seen(decision: Decision) -> tuple[bool, int, int, int]:
    """What a client sees of a decision: allowed, remaining, reset and retry in whole µs."""
    return (
        decision.allowed,
        decision.remaining,
        round(decision.reset_after * 1e6),
        round(decision.retry_after * 1e6),
    )


def hits(backend: Backend, client: str, limits: Sequence[Limit], n: int, at: float) -> None:
    for _ in range(n):
        assert backend.hit(client, limits, now=at).allowed


ALGORITHMS = pytest.mark.parametrize("algorithm", [a.value for a in RATE_ALGORITHMS])


@ALGORITHMS
@pytest.mark.parametrize(("n", "k"), [(1, 1), (4, 1), (5, 2), (5, 5)])
def test_refund_gives_what_fewer_hits_give(
    backend: Backend, algorithm: str, n: int, k: int
) -> None:
    """N hits then k refunds answer as N - k hits did, now and for the hits that follow."""
    limits = [limit_for(algorithm)]
    hits(backend, "refunded", limits, n, T0)
    for _ in range(k):
        backend.refund("refunded", limits, now=T0)
    hits(backend, "plain", limits, n - k, T0)
    assert seen(backend.peek("refunded", limits, now=T0)) == seen(
        backend.peek("plain", limits, now=T0)
    )
    for _ in range(k + 1):  # up to and including the first denial
        assert seen(backend.hit("refunded", limits, now=T0)) == seen(
            backend.hit("plain", limits, now=T0)
        )


@ALGORITHMS
def test_refund_later_in_the_window(backend: Backend, algorithm: str) -> None:
    """A refund some seconds after the hits matches a client who made one hit fewer."""
    limits = [limit_for(algorithm)]
    for client, count in (("refunded", 4), ("plain", 3)):
        hits(backend, client, limits, count, T0)
    backend.refund("refunded", limits, now=T0 + 7)
    for at in (T0 + 7, T0 + 8.5):
        assert seen(backend.peek("refunded", limits, now=at)) == seen(
            backend.peek("plain", limits, now=at)
        )


@ALGORITHMS
def test_refund_of_a_cost_above_one(backend: Backend, algorithm: str) -> None:
    limits = [limit_for(algorithm, capacity=20)]
    backend.hit("refunded", limits, 12, now=T0)
    backend.refund("refunded", limits, 3, now=T0)
    backend.hit("plain", limits, 9, now=T0)
    for cost in (3, 9):
        assert seen(backend.hit("refunded", limits, cost, now=T0)) == seen(
            backend.hit("plain", limits, cost, now=T0)
        )


@ALGORITHMS
def test_refund_never_exceeds_a_full_limit(
    backend: Backend, algorithm: str, redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    limits = [limit_for(algorithm)]
    hits(backend, "c", limits, 2, T0)
    backend.refund("c", limits, 3, now=T0)
    backend.refund("c", limits, 1000, now=T0)
    assert backend.peek("c", limits, now=T0).remaining == CAPACITY
    # Nothing used is no state at all: the key is gone, not negative.
    assert stored_states(backend, redis_client, _isolated_throttle) == 0
    assert [backend.hit("c", limits, now=T0).allowed for _ in range(CAPACITY + 1)] == [
        True
    ] * CAPACITY + [False]


@ALGORITHMS
def test_refund_of_a_missing_state_writes_nothing(
    backend: Backend, algorithm: str, redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    limits = [limit_for(algorithm)]
    backend.refund("never-seen", limits, now=T0)
    backend.refund("never-seen", limits, 5, now=T0)
    assert stored_states(backend, redis_client, _isolated_throttle) == 0
    assert backend.peek("never-seen", limits, now=T0).remaining == CAPACITY


@ALGORITHMS
def test_refund_long_after_the_hits_gives_nothing_extra(
    backend: Backend, algorithm: str, redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    """Two days on, the limit is whole: a refund then adds nothing and creates nothing (the
    store's TTLs run on its own clock, not the test's ``now``: the hits' key keeps its TTL)."""
    limits = [limit_for(algorithm)]
    hits(backend, "c", limits, 3, T0)
    before = stored_states(backend, redis_client, _isolated_throttle)
    later = T0 + 2 * 86400
    backend.refund("c", limits, 5, now=later)
    assert backend.peek("c", limits, now=later).remaining == CAPACITY
    assert stored_states(backend, redis_client, _isolated_throttle) <= before
    assert all(redis_client.pttl(key) > 0 for key in redis_client.keys(f"{_isolated_throttle}:*"))


@ALGORITHMS
def test_every_key_keeps_a_ttl_after_a_refund(
    algorithm: str, redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    """Real time (no test clock), so the TTLs are the ones production keys get."""
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    limits = [limit_for(algorithm, capacity=10)]
    for _ in range(4):
        assert backend.hit("refunded", limits).allowed
    backend.refund("refunded", limits)
    for _ in range(3):
        assert backend.hit("plain", limits).allowed
    assert len(redis_client.keys(f"{_isolated_throttle}:*")) == 2
    refunded = redis_client.pttl(backend.key("refunded", limits[0]))
    plain = redis_client.pttl(backend.key("plain", limits[0]))
    # The TTL three hits give (the two clients' calls are milliseconds apart).
    assert refunded > 0
    assert abs(refunded - plain) < 250
    assert backend.peek("refunded", limits).remaining == 7


@ALGORITHMS
def test_memory_state_expires_after_a_refund(algorithm: str) -> None:
    """A refund keeps the key's expiry bounded: on the store's clock, the state is gone
    once its window has passed, as its Redis key would be."""
    now = [T0]
    backend = MemoryBackend(clock=lambda: now[0], shards=16)
    limits = [limit_for(algorithm)]
    hits(backend, "c", limits, 3, T0)
    now[0] = T0 + 1
    backend.refund("c", limits)
    assert len(backend) == 1
    now[0] = T0 + 2 * limits[0].window + 1
    backend.refund("c", limits)  # long expired: dropped
    assert len(backend) == 0


@ALGORITHMS
def test_shadow_limits_are_refunded_too(backend: Backend, algorithm: str) -> None:
    enforced = limit_for(algorithm, capacity=10)
    shadow = dataclasses.replace(limit_for(algorithm), id="shadow", shadow=True)
    hits(backend, "c", [enforced, shadow], 3, T0)
    backend.refund("c", [enforced, shadow], 2, now=T0)
    assert backend.peek("c", [enforced], now=T0).remaining == 9
    assert backend.peek("c", [dataclasses.replace(shadow, shadow=False)], now=T0).remaining == 4


@pytest.mark.parametrize("algorithm", [Algorithm.FIXED_WINDOW, Algorithm.SLIDING_COUNTER])
def test_refund_after_the_window_ended_changes_nothing(backend: Backend, algorithm: str) -> None:
    """Windows count what happened in them: a refund in the next window takes nothing from
    it (a sliding counter's previous window keeps its weight)."""
    limits = [limit_for(algorithm)]
    start = T0 - T0 % 60
    for client in ("refunded", "plain"):
        hits(backend, client, limits, 4, start + 50)
    backend.refund("refunded", limits, 4, now=start + 70)
    for at in (start + 70, start + 80):
        assert seen(backend.peek("refunded", limits, now=at)) == seen(
            backend.peek("plain", limits, now=at)
        )


def test_sliding_log_refund_keeps_members_unique(backend: Backend) -> None:
    """Twelve entries in one microsecond are numbered 0-11; refunding three removes 9-11
    (not "9" as the greatest text), so the next three hits are counted as three."""
    limits = [limit_for(Algorithm.SLIDING_LOG, capacity=20)]
    hits(backend, "c", limits, 12, T0)
    backend.refund("c", limits, 3, now=T0)
    hits(backend, "c", limits, 3, T0)
    assert backend.peek("c", limits, now=T0).remaining == 8


def test_refund_of_several_limits_in_one_call(backend: Backend) -> None:
    limits = [limit_for(algorithm) for algorithm in RATE_ALGORITHMS]
    hits(backend, "c", limits, 4, T0)
    backend.refund("c", limits, 3, now=T0)
    for limit in limits:
        assert backend.peek("c", [limit], now=T0).remaining == CAPACITY - 1, limit.algorithm


@ALGORITHMS
def test_async_refund(backend: Backend, algorithm: str) -> None:
    limits = [limit_for(algorithm)]

    async def scenario() -> int:
        for _ in range(4):
            assert (await backend.ahit("c", limits, now=T0)).allowed
        await backend.arefund("c", limits, 3, now=T0)
        return (await backend.ahit("c", limits, now=T0)).remaining

    assert asyncio.run(scenario()) == CAPACITY - 2


@pytest.mark.parametrize("cost", [-1, 1.5, 10**9 + 1])
def test_refund_rejects_a_bad_cost(backend: Backend, cost: float) -> None:
    with pytest.raises(BackendError):
        backend.refund("c", [limit_for(Algorithm.TOKEN_BUCKET)], cost, now=T0)  # type: ignore[arg-type]


def test_refund_of_no_limits_is_a_no_op(backend: Backend) -> None:
    backend.refund("c", [], now=T0)


@ALGORITHMS
@pytest.mark.parametrize("kind", ["redis", "memory"])
def test_concurrent_hit_then_refund_never_drifts(
    kind: str, algorithm: str, redis_url: str, redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    """100 threads each reserve and give back on a limit of 5: once all are done the limit
    is whole again, with no state left. (The Redis client gets a pool of 100 connections:
    the default's 64, with a 50 ms wait, would fail some threads before they count.)"""
    backend: Backend = MemoryBackend()
    if kind == "redis":
        pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=100, timeout=10)
        backend = RedisBackend(redis.Redis(connection_pool=pool))
    limits = [limit_for(algorithm)]
    start = threading.Barrier(100)
    admitted: list[bool] = []

    def worker() -> None:
        start.wait()
        decision = backend.hit("c", limits, now=T0)
        admitted.append(decision.allowed)
        if decision.allowed:
            backend.refund("c", limits, now=T0)

    threads = [threading.Thread(target=worker) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(admitted) == 100 and any(admitted)
    assert backend.peek("c", limits, now=T0).remaining == CAPACITY
    assert stored_states(backend, redis_client, _isolated_throttle) == 0
    backend.close()


def test_refund_script_checks_every_argument_first(
    redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    """A bad spec anywhere fails the call before the first key is touched."""
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    good = limit_for(Algorithm.FIXED_WINDOW)
    backend.hit("c", [good], 3, now=T0)
    key = backend.key("c", good)
    before = redis_client.get(key)
    script = load_script(REFUND_FILES)
    now = str(round(T0 * 1e6))
    for args in (
        ["1", now, "", "f5:60000000", "x5:1"],
        ["-1", now, "", "f5:60000000", "f5:1"],
        ["1", now, "soon", "f5:60000000", "f5:1"],
    ):
        with pytest.raises(redis.ResponseError, match="django_throttle: ARGV"):
            redis_client.eval(script, 2, key, key + "2", *args)
    assert redis_client.get(key) == before
    assert redis_client.exists(key + "2") == 0


def test_refund_survives_a_flushed_script_cache(redis_client: redis.Redis) -> None:
    backend = get_backend()
    limits = [limit_for(Algorithm.GCRA)]
    hits(backend, "c", limits, 3, T0)
    forget_code(redis_client)
    backend.refund("c", limits, now=T0)
    assert backend.peek("c", limits, now=T0).remaining == CAPACITY - 2


class RefundMachine(AlgorithmMachine):
    """The model-based machine of tests/test_model.py (time moves, hits, peeks, edits) with
    refunds among its steps: after each, memory, Redis and the model answer a peek alike."""

    @rule(cost=st.integers(0, 12))
    def refund(self, cost: int) -> None:
        """Give back the newest tokens (a refund that names no hit)."""
        self._refund(cost, None)

    @rule(data=st.data())
    def refund_a_hit(self, data: st.DataObject) -> None:
        """Give back one earlier allowed hit, named by its instant, as a reservation does:
        the model removes that hit's own entries, whatever came after it."""
        if not self.hits:
            return
        taken, cost = self.hits.pop(data.draw(st.integers(0, len(self.hits) - 1)))
        self._refund(cost, taken)

    def _refund(self, cost: int, taken: int | None) -> None:
        at = self.now / 1e6
        self.model.refund([self.limit], cost, self.now, taken)
        self.memory.refund(self.client, [self.limit], cost, now=at, taken_at=taken)
        if self.redis is not None:
            self._on_redis(
                lambda backend: backend.refund(
                    self.client, [self.limit], cost, now=at, taken_at=taken
                ),
                self.limit,
            )
            key = (self.limit.id, self.limit.algorithm)
            model = self.model.store.get(key)
            if model is None:  # nothing used: no key anywhere
                assert not inspector().exists(self.redis.key(self.client, self.limit))
            elif self.redis_written and self.redis_expiry is None:
                # Written with a PX so short it ran out on Redis's clock before the machine
                # read it: drop the state everywhere, as _check_expiry does after a hit.
                assert model[1] - self.now // 1000 <= SHORT_PX_MS
                del self.model.store[key]
                self.memory.store.delete(self.memory.key(self.client, self.limit))
        self._check_expiry()
        self._call(0, peek=True)


def _run_refund_model(algorithm: str, examples: int) -> None:
    """Random walks of 100 steps each (hits, refunds, time, edits) on both backends and the
    model."""
    redis_backend = RedisBackend()
    machine = type(
        f"{algorithm}_refund_machine",
        (RefundMachine,),
        {"algorithm": algorithm, "shared_redis": redis_backend},
    )
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=100,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        redis_backend.close()


@ALGORITHMS
def test_refunds_follow_the_model(algorithm: str) -> None:
    """A short run for every test pass: about 500 steps per algorithm."""
    _run_refund_model(algorithm, examples=5)


@pytest.mark.slow
@ALGORITHMS
def test_refunds_follow_the_model_for_longer(algorithm: str) -> None:
    """About 2,000 steps per algorithm (``REFUND_MODEL_EXAMPLES`` walks of 100)."""
    _run_refund_model(algorithm, examples=int(os.environ.get("REFUND_MODEL_EXAMPLES", "20")))


def test_the_counting_script_leaves_the_refund_functions_out() -> None:
    """Refunds must not cost the request path: only refund.lua's script defines them."""
    from django_throttle.backends.scripts import SCRIPT_FILES

    assert "refunding.lua" in REFUND_FILES and "refunding.lua" not in SCRIPT_FILES
    assert "REFUND = true" in load_script(REFUND_FILES)
    assert "REFUND = true" not in load_script(SCRIPT_FILES)


def test_the_counting_script_leaves_the_retime_functions_out() -> None:
    """Nor retimes: only retime.lua's script defines them (and GCRA's exact arithmetic);
    the counting script builds no closure for them on each call."""
    from django_throttle.backends.scripts import RETIME_FILES, SCRIPT_FILES

    assert "retiming.lua" in RETIME_FILES and "retiming.lua" not in SCRIPT_FILES
    assert "RETIME = true" in load_script(RETIME_FILES)
    assert "RETIME = true" not in load_script(SCRIPT_FILES)
    assert "expire_or_delete = function" not in load_script(SCRIPT_FILES)


@pytest.mark.parametrize("taken_at", [(), (("user:42", 5),), 1.5, "5", True])
def test_a_refund_given_no_instant_is_a_clear_type_error(
    backend: Backend, taken_at: object
) -> None:
    """The migrating page's refund: ``taken_at`` is the instant of the client's pair in
    ``Decision.taken``. Given the tuple itself (what "its Decision.taken" read as) or anything
    but an int, it was a BackendError "TypeError: not enough arguments for format string"
    from building the script's arguments; now a TypeError saying what to give, on both
    paths, and nothing is given back."""
    limits = [Limit.build("burst", "10/s"), Limit.build("daily", "1000/day", algorithm="gcra")]
    decision = backend.hit("user:42", limits)
    with pytest.raises(TypeError, match=r"dict\(decision.taken\).get\(client\)"):
        backend.refund("user:42", limits, taken_at=taken_at)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="taken_at must be the hit's instant"):
        asyncio.run(backend.arefund("user:42", limits, taken_at=taken_at))  # type: ignore[arg-type]
    assert backend.peek("user:42", limits).remaining == 9
    backend.refund("user:42", limits, taken_at=dict(decision.taken).get("user:42"))
    assert backend.peek("user:42", limits).remaining == 10
