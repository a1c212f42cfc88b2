"""Every algorithm, both backends, against the reference model, one random step at a time.

A Hypothesis state machine per algorithm moves time (by microseconds, by fractions of the
window, to the edge of the last retry-after), hits with random costs, peeks, and edits the
limit followed by ``retime(new, previous=old)``. At every step the memory and Redis backends
must answer exactly alike, and both as the model (tests/model.py) does: same allowed and
remaining, reset and retry within 1 µs. Invariants: remaining and retry never negative, waits
within the window, a retry at now + retry passes, and for the exact algorithms one a
microsecond earlier fails; nothing stored ever holds more than the capacity.

Redis keys do not expire on the tests' ``now`` (Redis uses its own clock): the machine deletes
a key when the model says its PX expiry has passed, after checking the key's PTTL matches it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)

from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.redis import RedisBackend
from django_throttle.rates import MAX_PERIOD, RATE_ALGORITHMS, Decision, Limit
from tests.bucket_state import stored_used
from tests.model import EXACT, TOL, Model, Reply, TokenBucket, model_of

#: 2026-03-28 23:00 UTC: a day before Europe's clocks go forward, so calendar runs cross it.
BASE_US = 1_774_738_800_000_000
#: The machines' clock stops 70 years on (in 2096). Runs of long advances by 365-day windows
#: could otherwise pass 2**32 s (in 2106), after which an instant in seconds as a float (the
#: backends' ``now=`` and clock) no longer holds every microsecond, and later 2**53 µs (in
#: 2255), which the scripts refuse: limits of the test's clock, not of counting today.
CLOCK_CEILING_US = BASE_US + 70 * 365 * 86_400_000_000
#: Steps run, by algorithm: the big runs assert they reached STEPS_PER_ALGORITHM.
STEPS: dict[str, int] = {}
STEPS_PER_ALGORITHM = 10_000
#: Set to "memory" to leave Redis out (while its scripts are being written).
BACKENDS = os.environ.get("DJANGO_THROTTLE_MODEL_BACKENDS", "memory,redis").split(",")

ZONES = ["", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]


#: Slow periods, up to the longest the admin accepts (rates.MAX_PERIOD, 366 days): a bucket
#: retimed from a fast rate to one of these keeps its key for months or years, and the
#: machine's window-sized time steps become gaps of as long.
FAST_PERIODS = [1, 2, 3, 7, 60]
SLOW_PERIODS = [86_400, 30 * 86_400, 365 * 86_400, MAX_PERIOD]


def limit_strategy(algorithm: str) -> st.SearchStrategy[Limit]:
    """Small limits of ``algorithm``: mostly short windows so time advances cross many of
    them, and one in five slow (days to a year), so edits switch between fast and slow rates
    and time moves by months."""
    count = st.integers(1, 8)
    if algorithm == "calendar_quota":
        return st.builds(
            lambda n, unit, tz: Limit.build("m", f"{n}/{unit}", algorithm=algorithm, timezone=tz),
            count,
            st.sampled_from(["day", "week", "month", "year"]),
            st.sampled_from(ZONES),
        )
    period = st.sampled_from([*FAST_PERIODS, *FAST_PERIODS, *SLOW_PERIODS])
    if algorithm in ("token_bucket", "leaky_bucket", "gcra"):
        return st.builds(
            lambda n, p, b: Limit.build("m", f"{n}/{p}s", burst=b, algorithm=algorithm),
            count,
            period,
            st.integers(1, 10),
        )
    return st.builds(lambda n, p: Limit.build("m", f"{n}/{p}s", algorithm=algorithm), count, period)


@functools.cache
def inspector() -> redis.Redis:
    """The server's default user, for what the throttle's own (least-privilege) user may not
    do: MULTI, PTTL and PERSIST around a call."""
    return redis.Redis.from_url(os.environ["DJANGO_THROTTLE_TEST_REDIS_ADMIN_URL"])


def micros(decision_seconds: float) -> int:
    return round(decision_seconds * 1e6)


class AlgorithmMachine(RuleBasedStateMachine):
    """One client and one limit of ``algorithm`` on every backend, and the model."""

    algorithm = "token_bucket"
    #: One backend for every example of a run (connections are per backend).
    shared_redis: RedisBackend | None = None

    def __init__(self) -> None:
        super().__init__()
        self.now = BASE_US
        self.model = Model()
        self.memory = MemoryBackend(clock=lambda: self.now / 1e6)
        self.redis = self.shared_redis
        # Unique names: retime scans every client of a limit id.
        self.client = uuid.uuid4().hex
        self.limit = Limit.build("m", "1/s")
        self.last: Reply | None = None
        #: (instant, tokens) of every allowed hit: what a refund may give back.
        self.hits: list[tuple[int, int]] = []
        self.redis_expiry: tuple[int, int, int] | None = None
        self.server_ms = 0
        self.redis_written = False
        # A token bucket's state pre-pays up to 999 µs of refill at the rate it was written
        # with (U is as of the next whole millisecond): after an edit of the rate or a lower
        # burst (U is capped before it drains), reads until the next write are off by up to
        # that much, and a retry-after may be short by it.
        self.edited = False

    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        limit = data.draw(limit_strategy(self.algorithm))
        self.limit = dataclasses.replace(limit, id=uuid.uuid4().hex[:8])
        self.now = BASE_US + data.draw(st.integers(0, 3 * 86_400_000_000))

    def teardown(self) -> None:
        if self.redis is not None:
            self.redis.reset(self.client, [self.limit])

    # --- time ---------------------------------------------------------------------------

    @property
    def window_us(self) -> int:
        return round(self.limit.window * 1e6)

    def _advance(self, dt: int) -> None:
        self.now = min(self.now + dt, CLOCK_CEILING_US)
        self._expire_redis()
        self._count()

    @rule(dt=st.integers(0, 2000))
    def advance_a_little(self, dt: int) -> None:
        self._advance(dt)

    @rule(permille=st.integers(0, 2500))
    def advance_by_window(self, permille: int) -> None:
        self._advance(self.window_us * permille // 1000)

    @rule(offset=st.integers(-1, 1))
    def advance_to_retry(self, offset: int) -> None:
        """To the edge of the last denial's retry-after (no precondition: filtering rules
        would cost more than the steps that do nothing)."""
        if self.last is not None:
            self._advance(max(0, self.last.retry_us + offset))
            self.last = None

    # --- calls --------------------------------------------------------------------------

    @rule(cost=st.integers(0, 12))
    def hit(self, cost: int) -> None:
        self._call(cost, peek=False)

    @rule()
    def peek(self) -> None:
        self._call(0, peek=True)

    @rule(data=st.data())
    def edit(self, data: st.DataObject) -> None:
        old = self.limit
        new = dataclasses.replace(data.draw(limit_strategy(self.algorithm)), id=old.id)
        expected = self.model.retime(new, self.now, old)
        touched = self.memory.retime([new], now=self.now / 1e6, previous=[old])
        assert touched == expected
        if self.redis is not None:
            touched = self._on_redis(
                lambda backend: backend.retime([new], now=self.now / 1e6, previous=[old]), new
            )
            assert touched == expected
        self.edited = True
        self.limit = new
        self._check_expiry(retimed=True)
        self._count()

    def _call(self, cost: int, peek: bool) -> None:
        limits = [self.limit]
        state_before = self.model.state(self.limit, self.now)
        decisions = [self._decide(self.memory, limits, cost, peek)]
        if self.redis is not None:
            decisions.append(
                self._on_redis(
                    lambda backend: self._decide(backend, limits, cost, peek), self.limit
                )
            )
        first = decisions[0]
        for other in decisions[1:]:
            assert _numbers(other) == _numbers(first), "memory and Redis disagree"
        # An allowed hit names the instant it took its tokens at, where a refund needs it
        # (every algorithm but the buckets and GCRA, whose refunds do not depend on it).
        stamped = self.limit.algorithm not in ("token_bucket", "leaky_bucket", "gcra")
        for decision in decisions:
            named = decision.allowed and not peek and stamped
            assert decision.taken == (((self.client, self.now),) if named else ())
        if first.allowed and not peek:
            self.hits.append((self.now, min(cost, self.limit.capacity)))
        reply = self.model.call(limits, cost, self.now, peek=peek, prefer=first.allowed)
        out = reply.outcomes[0]
        assert first.allowed == reply.allowed
        if out.fuzzy_remaining:
            assert abs(first.remaining - reply.remaining) <= 1
        else:
            assert first.remaining == reply.remaining
        assert abs(micros(first.reset_after) - reply.reset_us) <= 1
        assert abs(micros(first.retry_after) - reply.retry_us) <= 1
        self._check_invariants(first, state_before, 0 if peek else min(cost, self.limit.capacity))
        if not peek:
            written = first.allowed and out.pending is not None
            self._check_expiry(written)
            if written:
                self.edited = False
        self.last = reply if not first.allowed else None
        self._count()

    def _on_redis(self, call: Any, limit: Limit) -> Any:
        """Run ``call`` on Redis and take the key's expiry off Redis's clock: record it (as
        the server's millisecond the write happened in, bracketed by TIME before and after)
        and PERSIST the key, so that only the model's expiry (applied by ``_expire_redis``)
        ends it, never the real time the test takes."""
        assert self.redis is not None
        client, key = inspector(), self.redis.key(self.client, limit)
        # Any server time before the call bounds the write from below: the last one read.
        before = self.server_ms if self.server_ms else _server_ms(client.time())
        result = call(self.redis)
        pipe = client.pipeline(transaction=True)
        pipe.pttl(key)
        pipe.time()
        pipe.persist(key)
        pttl, after, _ = pipe.execute()
        after_ms = self.server_ms = _server_ms(after)
        self.redis_expiry = None if pttl < 0 else (pttl + after_ms, before, after_ms)
        self.redis_written = pttl != -1  # -1: a key (persisted earlier) the call did not write
        return result

    def _decide(self, backend: Any, limits: list[Limit], cost: int, peek: bool) -> Decision:
        at = self.now / 1e6
        if peek:
            return backend.peek(self.client, limits, now=at)  # type: ignore[no-any-return]
        return backend.hit(self.client, limits, cost, now=at)  # type: ignore[no-any-return]

    # --- checks -------------------------------------------------------------------------

    def _check_invariants(self, decision: Decision, state: Any, c: int) -> None:
        limit, algorithm = self.limit, model_of(self.limit)
        window = self.window_us * (2 if limit.algorithm == "sliding_window_counter" else 1)
        # A bucket forgives TOLERANCE tokens: at slow rates (a token a year) that is
        # tens of milliseconds of the window.
        slack = 1
        if isinstance(algorithm, TokenBucket):
            slack += math.ceil(algorithm.T * TOL)
        assert decision.remaining >= 0
        assert 0 <= micros(decision.retry_after) <= window + slack
        assert 0 <= micros(decision.reset_after) <= window + slack
        if decision.allowed or (self.edited and isinstance(algorithm, TokenBucket)):
            return
        retry = micros(decision.retry_after)
        assert retry > 0
        later = algorithm.decide(state, self.now + retry, c)
        assert later.allowed or later.ambiguous, "a retry at now + retry-after is denied"
        if limit.algorithm in EXACT:
            before = algorithm.decide(state, self.now + retry - 1, c)
            assert not before.allowed, "a retry 1 µs before retry-after would pass"
        elif isinstance(algorithm, TokenBucket):
            best = algorithm.earliest(state, self.now, c)
            assert 0 <= retry - best <= 1 + math.ceil(algorithm.T * TOL / 2)
            if retry == best:
                assert not algorithm.decide(state, self.now + retry - 1, c).allowed

    def _check_expiry(self, committed: bool = False, retimed: bool = False) -> None:
        """The memory entry lives exactly as long as the model says Redis keeps the key; the
        Redis key's PTTL is that PX (less the real time since it was set). Nothing stored
        holds more than the capacity."""
        key = self.memory.key(self.client, self.limit)
        ttl = self.memory.store.pttl(key)
        modelled = self.model.store.get((self.limit.id, self.limit.algorithm))
        live = modelled is not None and self.now // 1000 <= modelled[1]
        if live:
            assert modelled is not None and ttl >= 0, "memory has no key where the model has one"
            slack = 1 if self.limit.algorithm in ("token_bucket", "leaky_bucket") else 0
            assert abs(self.now // 1000 + ttl - modelled[1]) <= slack
            if committed:
                self._check_capacity(key)
        if self.redis is not None and (committed or retimed):
            # The key's expiry, less its PX, must be the millisecond Redis wrote it in.
            if live and (committed or retimed):
                assert modelled is not None
                px = modelled[1] - self.now // 1000
                assert self.redis_written, "Redis did not write where the model did"
                if self.redis_expiry is None:
                    # A short PX can run out on Redis's clock before PERSIST (a loaded CI
                    # machine can stall a step for a second): drop the state everywhere, as if
                    # it expired now (consistent, not checked).
                    assert px <= SHORT_PX_MS, f"Redis has no key where the model has one (PX {px})"
                    del self.model.store[(self.limit.id, self.limit.algorithm)]
                    self.memory.store.delete(key)
                    return
                when, before, after = self.redis_expiry
                assert before - 1 <= when - px <= after + 1, (when - px, before, after)
            elif retimed:
                assert self.redis_expiry is None, "retime kept a key the model deleted"

    def _check_capacity(self, key: str) -> None:
        """The memory store's state of ``key``, read as the scripts wrote it, holds no more
        than the capacity."""
        capacity, algorithm, store = self.limit.capacity, self.limit.algorithm, self.memory.store
        if algorithm == "sliding_window_log":
            floor = self.now - self.limit.period_us
            entries = store.zrange(key, 0, -1, withscores=True)
            assert len([t for _, t in entries if t > floor]) <= capacity
            return
        raw = store.get(key)
        assert raw is not None
        if algorithm in ("token_bucket", "leaky_bucket"):
            used = stored_used(raw)
            assert used is not None and used <= capacity + 1e-6
        elif algorithm == "gcra":
            assert float(raw) - self.now <= capacity * self.limit.emission_us
        else:  # the windows: "<count> …"
            assert int(raw.split()[0]) <= capacity

    def _expire_redis(self) -> None:
        """Redis's clock is not the test's: delete the key once the model says it expired."""
        entry = self.model.store.get((self.limit.id, self.limit.algorithm))
        if entry is not None and self.now // 1000 > entry[1]:
            del self.model.store[(self.limit.id, self.limit.algorithm)]
            if self.redis is not None:
                inspector().delete(self.redis.key(self.client, self.limit))

    def _count(self) -> None:
        STEPS[self.algorithm] = STEPS.get(self.algorithm, 0) + 1


#: A key whose PX is at most this may vanish on Redis's own clock before the test reads it.
SHORT_PX_MS = 2000


def _server_ms(time: Any) -> int:
    return int(time[0]) * 1000 + int(time[1]) // 1000


def _numbers(decision: Decision) -> tuple[Any, ...]:
    return (
        decision.allowed,
        decision.remaining,
        micros(decision.reset_after),
        micros(decision.retry_after),
    )


ALGORITHMS = [algorithm.value for algorithm in RATE_ALGORITHMS]


def _run(algorithm: str, examples: int, steps: int) -> int:
    """Run the machine of ``algorithm`` for at least ``steps`` steps, in batches of at most
    ``examples`` examples of up to 100 steps."""
    redis = RedisBackend() if "redis" in BACKENDS else None
    machine = type(
        f"{algorithm}_machine",
        (AlgorithmMachine,),
        {"algorithm": algorithm, "shared_redis": redis},
    )
    STEPS[algorithm] = 0
    started = time.monotonic()
    try:
        # Batches of examples until the steps reach the goal: each run draws new seeds.
        while STEPS[algorithm] < steps:
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
        if redis is not None:
            redis.close()
    print(f"{algorithm}: {STEPS[algorithm]} steps in {time.monotonic() - started:.1f} s")
    return STEPS[algorithm]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_backends_follow_the_model(algorithm: str) -> None:
    """A short run for every test pass (the PostgreSQL one included)."""
    assert _run(algorithm, examples=10, steps=300) >= 300


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_backends_follow_the_model_for_ten_thousand_steps(algorithm: str) -> None:
    assert _run(algorithm, examples=10, steps=STEPS_PER_ALGORITHM) >= STEPS_PER_ALGORITHM


DAY = 86_400.0


@pytest.mark.parametrize("algorithm", ["token_bucket", "leaky_bucket"])
def test_a_bucket_retimed_to_a_slow_rate_refills_after_months(backend: Any, algorithm: str) -> None:
    """10/d drained, then edited to 10/365d: 200 days on, 200/36.5 tokens are back (one
    taken now leaves 4), on Redis as in memory. Redis read the compact state's 32-bit
    millisecond, which wraps after 24.8 days, as a recent one and kept the client out."""
    t0 = BASE_US / 1e6
    fast = Limit.build("slowed", "10/d", algorithm=algorithm)  # type: ignore[arg-type]
    slow = dataclasses.replace(Limit.build("slowed", "10/365d", algorithm=algorithm))  # type: ignore[arg-type]
    for _ in range(10):
        assert backend.hit("c", [fast], now=t0).allowed
    assert not backend.hit("c", [fast], now=t0).allowed
    assert backend.retime([slow], now=t0, previous=[fast]) == 1
    decision = backend.hit("c", [slow], now=t0 + 200 * DAY)
    assert (decision.allowed, decision.remaining) == (True, 4)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(
    ("fast_rate", "slow_rate"),
    [("10/d", "10/365d"), ("5/h", "5/366d"), ("3/s", "3/30d"), ("10/365d", "10/d")],
)
def test_backends_agree_on_slow_rates_and_long_gaps(
    algorithm: str, fast_rate: str, slow_rate: str
) -> None:
    """Drained under one rate, retimed to another (up to the longest period a rate may
    have), then peeked and hit at gaps from minutes to years: memory and Redis answer alike."""
    if algorithm == "calendar_quota":
        fast_rate, slow_rate = "10/day", "10/year"
    t0 = BASE_US / 1e6
    now = [t0]
    memory = MemoryBackend(clock=lambda: now[0])
    redis_backend = RedisBackend()
    client = uuid.uuid4().hex
    fast = Limit.build(uuid.uuid4().hex[:8], fast_rate, algorithm=algorithm)  # type: ignore[arg-type]
    slow = dataclasses.replace(
        Limit.build("x", slow_rate, algorithm=algorithm),  # type: ignore[arg-type]
        id=fast.id,
    )
    key = redis_backend.key(client, slow)
    expires = [math.inf]

    def on_redis(call: Any, at: float) -> Any:
        """Redis keys expire on the server's clock, not the test's: note when a PX this call
        set runs out on the test's clock (the key is then PERSISTed, so that a later call
        tells its own writes apart), and delete the key once that has passed."""
        if at > expires[0]:
            redis_backend.client.delete(key)
            expires[0] = math.inf
        result = call()
        pttl = inspector().pttl(key)
        if pttl >= 0:
            expires[0] = at + pttl / 1000
            inspector().persist(key)
        elif pttl == -2:
            expires[0] = math.inf
        return result

    try:
        for _ in range(fast.capacity + 1):
            memory.hit(client, [fast], now=t0)
            on_redis(lambda: redis_backend.hit(client, [fast], now=t0), t0)
        assert memory.retime([slow], now=t0, previous=[fast]) == on_redis(
            lambda: redis_backend.retime([slow], now=t0, previous=[fast]), t0
        )
        for gap_days in (0.01, 20.3, 24.9, 25.1, 50.7, 200.2, 366.4, 800.6, 3000.5):
            at = now[0] = t0 + gap_days * DAY
            seen = [(_numbers(memory.peek(client, [slow], now=at)),)]
            seen[0] += (_numbers(memory.hit(client, [slow], now=at)),)
            seen.append(
                (
                    _numbers(
                        on_redis(lambda at=at: redis_backend.peek(client, [slow], now=at), at)
                    ),
                    _numbers(on_redis(lambda at=at: redis_backend.hit(client, [slow], now=at), at)),
                )
            )
            assert seen[0] == seen[1], f"memory and Redis disagree {gap_days} days on"
    finally:
        redis_backend.reset(client, [fast, slow])
        redis_backend.close()
