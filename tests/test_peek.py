"""``Backend.peek`` with a cost: what the next request would get, with nothing written.

``manage.py throttle_explain`` and the admin's inspect page ask it. Both backends, every
algorithm; the Redis backend runs against the suite's private redis-server.
"""

from __future__ import annotations

import pytest
import redis

from django_throttle.backends import BackendError, get_backend
from django_throttle.backends.base import Backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.redis import RedisBackend
from django_throttle.rates import RATE_ALGORITHMS, Algorithm, Decision, Limit

T0 = 1_700_000_000.0


def five_per_minute(algorithm: str) -> Limit:
    rate = "5/day" if algorithm == Algorithm.CALENDAR else "5/m"
    return Limit.build("p", rate, algorithm=algorithm)


def seen(decision: Decision) -> tuple[bool, str | None, int, int, int]:
    return (
        decision.allowed,
        decision.limit.id if decision.limit else None,
        decision.remaining,
        round(decision.reset_after * 1e6),
        round(decision.retry_after * 1e6),
    )


@pytest.mark.parametrize("algorithm", Algorithm.values)
def test_peek_with_a_cost_answers_as_the_hit_would(backend: Backend, algorithm: str) -> None:
    """Empty a 5/min bucket: peek(cost=1) is denied with the retry-after the hit then gets,
    and the peek changed nothing the hit sees."""
    limits = [five_per_minute(algorithm)]
    for _ in range(5):
        assert backend.hit("c", limits, now=T0).allowed
    predicted = backend.peek("c", limits, now=T0, cost=1)
    assert not predicted.allowed and predicted.retry_after > 0
    assert seen(backend.peek("c", limits, now=T0, cost=1)) == seen(predicted)
    assert seen(backend.hit("c", limits, now=T0)) == seen(predicted)


@pytest.mark.parametrize("algorithm", [a.value for a in RATE_ALGORITHMS])
def test_peek_with_a_cost_writes_nothing(
    backend: Backend, algorithm: str, redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    limits = [five_per_minute(algorithm)]
    for cost in (1, 3, 5):
        predicted = backend.peek("c", limits, now=T0, cost=cost)
        assert predicted.allowed and predicted.remaining == 5 - cost
    if isinstance(backend, MemoryBackend):
        assert len(backend) == 0
    else:
        assert redis_client.keys(f"{_isolated_throttle}:*") == []
    assert seen(backend.peek("c", limits, now=T0, cost=3)) == seen(
        backend.hit("c", limits, 3, now=T0)
    )


def test_peek_without_a_cost_is_unchanged(backend: Backend) -> None:
    limits = [five_per_minute(Algorithm.TOKEN_BUCKET)]
    for _ in range(5):
        backend.hit("c", limits, now=T0)
    state = backend.peek("c", limits, now=T0)
    assert state.allowed and state.remaining == 0
    assert seen(backend.peek("c", limits, now=T0, cost=0)) == seen(state)


def test_peek_with_a_cost_counts_no_usage(
    redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    """The usage report sees requests only: a peek, with or without a cost, is none.

    Only this test's own prefix is looked at: the shared server's other keys expire while
    it runs, so a count of the whole database is not a measure of what the peek wrote."""
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    limits = [five_per_minute(Algorithm.FIXED_WINDOW)]
    backend.peek("c", limits, cost=2)
    backend.peek("c", limits)
    assert redis_client.keys(f"{_isolated_throttle}:*") == []


@pytest.mark.parametrize("cost", [-1, 1.5, 10**9 + 1])
def test_peek_rejects_a_bad_cost(backend: Backend, cost: float) -> None:
    with pytest.raises(BackendError):
        backend.peek("c", [five_per_minute(Algorithm.GCRA)], now=T0, cost=cost)  # type: ignore[arg-type]
