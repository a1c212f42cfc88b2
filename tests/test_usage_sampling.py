"""Allowed requests enter the per-client lists one in ``CLIENT_SAMPLE``, weighted; the
tier x endpoint totals and denied requests stay exact. Both backends, same rule."""

from __future__ import annotations

from typing import Any

import pytest

from django_throttle.backends import get_backend, reset_backend_cache, usage_base
from django_throttle.backends.base import Backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.rates import Limit
from django_throttle.usage import accounting as usage

#: A whole minute, and a multiple of 8 µs: sampled calls are those at T0 + 8k µs.
T0 = 1_700_000_040.0
MINUTE = int(T0 // 60)
#: One request in 8, the package's own sample (the suite counts every one: tests/conftest.py).
SAMPLE = 8


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    monkeypatch.setattr(usage_base, "CLIENT_SAMPLE", SAMPLE)
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


def test_allowed_requests_are_sampled_into_the_client_list_with_their_weight(
    backend: Backend,
) -> None:
    field = usage.field_for("free", "search")
    assert field is not None
    limit = (Limit.build("sampled", "1000/s"),)
    for i in range(16):  # at T0 + 0..15 µs: the calls at +0 and +8 are the sample
        assert backend.hit("user:7", limit, now=T0 + i / 1e6, usage=field).allowed
    counts = _counts(backend)
    assert counts.totals[field][0] == 16  # exact: every decision
    assert counts.clients["user:7"][0] == 16  # 2 sampled x weight 8


def test_denied_requests_are_always_listed(backend: Backend) -> None:
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
    assert counts.clients["ip:203.0.113.9"][1] == 3  # denied: each one
    assert counts.clients["ip:203.0.113.9"][0] == 0  # the allowed one fell outside the sample


def test_a_sample_of_one_counts_every_request(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(usage_base, "CLIENT_SAMPLE", 1)
    reset_backend_cache()
    if isinstance(backend, MemoryBackend):
        backend = MemoryBackend(clock=lambda: T0)
    else:
        backend = get_backend()
    field = usage.field_for("free", "")
    limit = (Limit.build("every", "1000/s"),)
    for i in range(5):
        backend.hit("user:8", limit, now=T0 + (1 + i) / 1e6, usage=field)
    assert _counts(backend).clients["user:8"][0] == 5
