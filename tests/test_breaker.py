"""The circuit breaker: closed → open after consecutive failures → half-open single probe.

Time is a fake clock moved by hand; no test sleeps. The backends behind it are real: a
RedisBackend pointed at a port nobody listens on, and one on the suite's redis-server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from django_throttle import events
from django_throttle.backends import BackendError, get_backend, reset_backend_cache
from django_throttle.backends import redis_nodes as breaker_module
from django_throttle.backends.redis import RedisBackend
from django_throttle.backends.redis_nodes import CircuitBreaker, CircuitOpen, get_breaker
from django_throttle.rates import Limit
from example_project.private_redis import free_port

LIMIT = Limit.build("l", "100/s")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Backend:
    """Counts calls; fails with BackendError while ``down``."""

    def __init__(self) -> None:
        self.down = True
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.down:
            raise BackendError("connection refused")
        return "ok"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def breaker(clock: Clock) -> CircuitBreaker:
    return CircuitBreaker(threshold=3, cooldown=0.5, clock=clock)


def fail(breaker: CircuitBreaker, func: Callable[[], Any], times: int) -> list[type]:
    raised = []
    for _ in range(times):
        with pytest.raises(BackendError) as excinfo:
            breaker.call(func)
        raised.append(excinfo.type)
    return raised


def test_opens_after_threshold_consecutive_failures(breaker: CircuitBreaker) -> None:
    backend = Backend()
    assert fail(breaker, backend, 2) == [BackendError] * 2
    assert breaker.state == "closed"
    assert fail(breaker, backend, 1) == [BackendError]
    assert breaker.state == "open"
    # Open: 100 calls fail at once without reaching the backend.
    assert fail(breaker, backend, 100) == [CircuitOpen] * 100
    assert backend.calls == 3
    assert (breaker.failures, breaker.opened, breaker.short_circuited) == (3, 1, 100)


def test_a_success_resets_the_streak(breaker: CircuitBreaker) -> None:
    backend = Backend()
    for _ in range(5):
        fail(breaker, backend, 2)
        backend.down = False
        assert breaker.call(backend) == "ok"
        backend.down = True
    assert breaker.state == "closed"
    assert breaker.failures == 10


def test_other_exceptions_do_not_count(breaker: CircuitBreaker) -> None:
    def broken() -> None:
        raise KeyError("a bug, not an outage")

    for _ in range(5):
        with pytest.raises(KeyError):
            breaker.call(broken)
    assert breaker.state == "closed"
    assert breaker.failures == 0


def test_half_open_probe_success_closes(breaker: CircuitBreaker, clock: Clock) -> None:
    backend = Backend()
    fail(breaker, backend, 3)
    clock.now += 0.3
    assert breaker.retry_after() == pytest.approx(0.2)
    assert fail(breaker, backend, 1) == [CircuitOpen]
    clock.now += 0.2
    assert breaker.state == "half-open"
    assert breaker.retry_after() == 0
    backend.down = False
    assert breaker.call(backend) == "ok"
    assert breaker.state == "closed"
    assert breaker.retry_after() == 0
    # Closed again means a fresh streak: it takes the full threshold to reopen.
    backend.down = True
    assert fail(breaker, backend, 3) == [BackendError] * 3
    assert breaker.state == "open"


def test_half_open_probe_failure_reopens_for_a_full_cooldown(
    breaker: CircuitBreaker, clock: Clock
) -> None:
    backend = Backend()
    fail(breaker, backend, 3)
    clock.now += 0.5
    assert fail(breaker, backend, 1) == [BackendError]  # the probe reached the backend
    assert backend.calls == 4
    assert breaker.state == "open"
    assert breaker.retry_after() == pytest.approx(0.5)
    clock.now += 0.49
    assert fail(breaker, backend, 1) == [CircuitOpen]
    assert breaker.opened == 2


def test_a_bug_in_the_probe_lets_the_next_caller_probe(
    breaker: CircuitBreaker, clock: Clock
) -> None:
    fail(breaker, Backend(), 3)
    clock.now += 0.5
    with pytest.raises(KeyError):
        breaker.call(lambda: {}["x"])
    assert breaker.call(lambda: "ok") == "ok"
    assert breaker.state == "closed"


def test_threads_racing_in_half_open_admit_exactly_one_probe(
    breaker: CircuitBreaker, clock: Clock
) -> None:
    fail(breaker, Backend(), 3)
    clock.now += 0.5
    n = 16
    release = threading.Event()
    probes: list[int] = []
    outcomes: list[str] = []
    done = threading.Condition()
    barrier = threading.Barrier(n)

    def probe() -> str:
        probes.append(1)
        release.wait(timeout=10)
        return "ok"

    def worker() -> None:
        barrier.wait()
        try:
            result = breaker.call(probe)
        except CircuitOpen:
            result = "refused"
        with done:
            outcomes.append(result)
            done.notify_all()

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for thread in threads:
        thread.start()
    with done:  # everyone but the probe has been turned away while it is in flight
        assert done.wait_for(lambda: len(outcomes) == n - 1, timeout=10)
    assert breaker.state == "half-open"
    release.set()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["ok"] + ["refused"] * (n - 1)
    assert len(probes) == 1
    assert breaker.state == "closed"


def test_threads_failing_together_open_it_once(breaker: CircuitBreaker) -> None:
    n = 32
    barrier = threading.Barrier(n)
    backend = Backend()

    def worker() -> None:
        barrier.wait()
        with pytest.raises(BackendError):
            breaker.call(backend)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert breaker.opened == 1
    assert backend.calls + breaker.short_circuited == n


def test_each_transition_is_logged_once(
    breaker: CircuitBreaker, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="django_throttle.backends.breaker")
    backend = Backend()
    fail(breaker, backend, 3 + 1000)
    clock.now += 0.5
    fail(breaker, backend, 1 + 1000)  # a failed probe, then more refusals
    clock.now += 0.5
    backend.down = False
    for _ in range(1000):
        breaker.call(backend)
    records = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in records] == ["WARNING", "DEBUG", "WARNING"]
    assert "open" in records[0][1] and "connection refused" in records[0][1]
    assert "closed" in records[2][1] and "2000 calls refused" in records[2][1]


def test_real_backends_dead_then_alive(
    settings: Any, breaker: CircuitBreaker, clock: Clock, redis_url: str
) -> None:
    """Connection refused trips it after 3 real attempts; then the live server closes it."""
    live = get_backend()
    assert isinstance(live, RedisBackend)
    settings.DJANGO_THROTTLE_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    reset_backend_cache()
    dead = get_backend()
    attempts = 0

    def hit(backend: RedisBackend) -> Any:
        nonlocal attempts
        attempts += 1
        return backend.hit("c", [LIMIT])

    raised = [type(exc) for exc in _errors(lambda: breaker.call(hit, dead), 50)]
    assert raised == [BackendError] * 3 + [CircuitOpen] * 47
    assert attempts == 3
    clock.now += 0.5
    assert breaker.call(hit, live).allowed
    assert breaker.state == "closed"
    assert attempts == 4


def _errors(call: Callable[[], Any], times: int) -> list[BaseException]:
    errors = []
    for _ in range(times):
        try:
            call()
        except BackendError as exc:
            errors.append(exc)
    return errors


def test_process_breaker_is_built_from_the_constants_and_reset_with_the_backends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(breaker_module, "THRESHOLD", 7)
    monkeypatch.setattr(breaker_module, "COOLDOWN", 2.5)
    breaker = get_breaker()
    assert breaker is get_breaker()
    assert (breaker.threshold, breaker.cooldown) == (7, 2.5)
    reset_backend_cache()
    assert get_breaker() is not breaker


@pytest.mark.parametrize(("threshold", "cooldown"), [(0, 1.0), (1, -1.0)])
def test_bad_parameters_are_refused(threshold: int, cooldown: float) -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(threshold=threshold, cooldown=cooldown)


def test_error_reasons_name_an_open_breaker_without_events_knowing_the_breaker() -> None:
    """The metrics' ``reason`` label: the breaker's own error names itself (events.py imports
    no backend, so it cannot test for the class)."""
    assert events.error_reason(CircuitOpen("circuit open after 3 failures")) == "circuit_open"
    assert events.error_reason(BackendError("Timeout reading from socket")) == "timeout"
    assert events.error_reason(BackendError("Connection refused")) == "connection"
    assert events.error_reason(BackendError("something else")) == "other"
