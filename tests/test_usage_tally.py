"""Every decision is counted in the process that made it, exactly (per client too), and its
counts reach the store within ``PUSH_EVERY``: pushed by the first request after that second,
in one call, and kept for the next try when the push fails. Both backends, same rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from django_throttle.backends import get_backend, reset_backend_cache
from django_throttle.backends import redis as redis_backend
from django_throttle.backends.base import Backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.redis import RedisBackend
from django_throttle.rates import Limit
from django_throttle.usage import accounting as usage

#: A whole minute.
T0 = 1_700_000_040.0
MINUTE = int(T0 // 60)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest) -> Backend:
    reset_backend_cache()
    if request.param == "memory":
        return MemoryBackend(clock=lambda: T0)
    return get_backend()


def _counts(backend: Backend) -> Any:
    store = usage.get_store(backend)
    try:
        return store.read([MINUTE])[MINUTE]
    finally:
        store.close()


def _stored(backend: Backend) -> Any:
    """The minute's counts in the store, without pushing this process's own first."""
    store = usage.get_store(backend)
    tally = backend.usage_tally  # type: ignore[attr-defined]
    backend.usage_tally = redis_backend.Tally()  # type: ignore[attr-defined]
    try:
        return store.read([MINUTE]).get(MINUTE)
    finally:
        backend.usage_tally = tally  # type: ignore[attr-defined]
        store.close()


def test_every_allowed_request_is_counted_for_its_client(backend: Backend) -> None:
    field = usage.field_for("free", "search")
    assert field is not None
    limit = (Limit.build("counted", "1000/s"),)
    for i in range(16):
        assert backend.hit("user:7", limit, now=T0 + i / 1e6, usage=field).allowed
    counts = _counts(backend)
    assert counts.totals[field][0] == 16
    assert counts.clients["user:7"][0] == 16


def test_denied_and_allowed_requests_are_listed_exactly(backend: Backend) -> None:
    field = usage.field_for("free", "")
    assert field is not None
    limit = (Limit.build("tight", "1/h", burst=1),)
    decisions = [
        backend.hit("ip:203.0.113.9", limit, now=T0 + (1 + 2 * i) / 1e6, usage=field)
        for i in range(4)
    ]
    assert [d.allowed for d in decisions] == [True, False, False, False]
    counts = _counts(backend)
    assert counts.totals[field][:2] == [1, 3]
    assert counts.clients["ip:203.0.113.9"][:2] == [1, 3]


def test_a_peek_counts_nothing(backend: Backend, open_store: Callable[..., Any]) -> None:
    field = usage.field_for("free", "")
    limit = (Limit.build("looked", "5/h"),)
    backend.peek("user:9", limit, now=T0)
    backend.hit("user:9", limit, now=T0, usage=None)
    assert not open_store(backend).read([MINUTE])
    assert field is not None


def test_the_counts_arrive_within_the_push_interval() -> None:
    """The first request after each second pushes everything counted before it, itself
    included; the requests in between push nothing (no round trip of their own)."""
    clock = Clock(T0)
    reset_backend_cache()
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    backend.usage_tally = redis_backend.Tally(clock)
    field = usage.field_for("free", "")
    limit = (Limit.build("pushed", "1000/s"),)

    def request() -> None:
        assert backend.hit("user:3", limit, now=clock.now, usage=field).allowed
        if usage.pending or backend.usage_tally.waiting:  # what the request path does after a call
            usage.flush_pending()

    request()  # a process's first push is due at once
    assert _stored(backend).totals[field][0] == 1
    for _ in range(5):
        clock.now += 0.1
        request()
    assert _stored(backend).totals[field][0] == 1  # within the second: still in the process
    clock.now = T0 + redis_backend.PUSH_EVERY
    request()
    assert _stored(backend).totals[field][0] == 7  # every one, within the interval
    assert not usage.pending


def test_a_failed_push_keeps_its_counts_for_the_next_try(
    backend: Backend, open_store: Callable[..., Any]
) -> None:
    field = usage.field_for("free", "")
    limit = (Limit.build("kept", "1000/s"),)
    backend.hit("user:4", limit, now=T0, usage=field)
    store = open_store(backend)

    def refuse(*args: Any) -> None:
        raise usage.BackendError("Redis is away")

    push = store.push
    store.push = refuse  # type: ignore[method-assign]
    with pytest.raises(usage.BackendError):
        store.push_tally(backend.usage_tally)  # type: ignore[attr-defined]
    store.push = push  # type: ignore[method-assign]
    backend.hit("user:4", limit, now=T0 + 1e-6, usage=field)
    store.push_tally(backend.usage_tally)  # type: ignore[attr-defined]  # the kept batch
    store.push_tally(backend.usage_tally)  # type: ignore[attr-defined]  # the newer count
    assert _stored(backend).totals[field][0] == 2


def test_counts_kept_while_pushes_fail_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond ``MAX_KEPT`` distinct counts new clients count as ``(other)``; the totals stay
    exact, and everything arrives once a push succeeds."""
    monkeypatch.setattr(redis_backend, "MAX_KEPT", 2)
    backend = MemoryBackend(clock=lambda: T0)
    tally = backend.usage_tally
    store = usage.get_store(backend)
    push = store.push

    def refuse(*args: Any) -> None:
        raise usage.BackendError("Redis is away")

    store.push = refuse  # type: ignore[method-assign]
    for n in range(5):
        tally.add("free", f"user:{n}", True, False, None)
        with pytest.raises(usage.BackendError):
            store.push_tally(tally)
    store.push = push  # type: ignore[method-assign]
    counts = store.read([MINUTE])[MINUTE]
    assert counts.totals["free"][0] == 5
    # user:0 waits in the failed batch; user:1 and user:2 fill the new counts; the rest:
    assert counts.clients["(other)"][0] == 2
    assert [counts.clients[f"user:{n}"][0] for n in range(3)] == [1, 1, 1]
