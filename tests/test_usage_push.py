"""Counts kept through an outage reach the backend a bounded batch per request.

While the backend cannot answer, every decision is counted in process (``usage.record_degraded``);
the requests after it answers again push those counts, each at most ``usage.PUSH_PER_CALL`` of
them, so no single request carries a long outage's backlog (10,000 counts took 303-355 ms in
one request), and nothing is lost.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_throttle import usage
from django_throttle.backends import get_backend
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db

MEMORY = "django_throttle.backends.memory.MemoryBackend"


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
