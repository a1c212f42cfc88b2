"""Known answers for every algorithm, on both backends and on the reference model.

Each file in tests/vectors/ holds cases: limits (as ``Limit.build`` takes them), a base
instant (Unix µs) and steps at ``t`` µs after it: a hit (``cost``, default 1), a peek, or an
edit of the limits followed by ``retime(new, previous=old)``. A hit or peek expects exactly
``allowed``, the reported limit's id, ``remaining``, ``reset_us`` and ``retry_after_us``.
``only`` peeks at one limit of the case alone (its counter is the same).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_throttle.backends.base import Backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.redis import RedisBackend
from django_throttle.rates import RATE_ALGORITHMS, Limit
from tests.model import Model

VECTORS = Path(__file__).parent / "vectors"
CASES = [
    pytest.param(case, id=f"{path.stem}-{case['name']}")
    for path in sorted(VECTORS.glob("*.json"))
    for case in json.loads(path.read_text())["cases"]
]


def build(spec: dict[str, Any]) -> Limit:
    return Limit.build(
        spec["id"],
        spec["rate"],
        burst=spec.get("burst"),
        algorithm=spec["algorithm"],
        timezone=spec.get("timezone", ""),
        shadow=spec.get("shadow", False),
    )


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Backend]:
    instance: Backend = MemoryBackend() if request.param == "memory" else RedisBackend()
    yield instance
    instance.close()


def test_every_algorithm_has_vectors() -> None:
    names = {path.stem for path in VECTORS.glob("*.json")}
    assert {
        *(a.value for a in RATE_ALGORITHMS),
        "mixed",
    } <= names  # concurrency: test_concurrency.py


@pytest.mark.parametrize("case", CASES)
def test_backend_answers_every_vector(backend: Backend, case: dict[str, Any]) -> None:
    client = uuid.uuid4().hex
    limits = [build(spec) for spec in case["limits"]]
    for number, step in enumerate(case["steps"]):
        at = (case["base"] + step["t"]) / 1e6
        if step.get("op") == "edit":
            new = [build(spec) for spec in step["limits"]]
            backend.retime(new, now=at, previous=limits)
            limits = new
            continue
        chosen = [limit for limit in limits if limit.id == step.get("only", limit.id)]
        if step.get("op") == "peek":
            decision = backend.peek(client, chosen, now=at)
        else:
            decision = backend.hit(client, chosen, step.get("cost", 1), now=at)
        got = {
            "allowed": decision.allowed,
            "limit": decision.limit.id if decision.limit else None,
            "remaining": decision.remaining,
            "reset_us": round(decision.reset_after * 1e6),
            "retry_after_us": round(decision.retry_after * 1e6),
        }
        assert got == step["expect"], f"step {number}: {step}"


@pytest.mark.parametrize("case", CASES)
def test_model_answers_every_vector(case: dict[str, Any]) -> None:
    """The vectors and the model agree, so a vector cannot drift from the spec unnoticed."""
    model = Model()
    limits = [build(spec) for spec in case["limits"]]
    for step in case["steps"]:
        now = case["base"] + step["t"]
        if step.get("op") == "edit":
            new = [build(spec) for spec in step["limits"]]
            for limit, old in zip(new, limits, strict=True):
                model.retime(limit, now, old)
            limits = new
            continue
        chosen = [limit for limit in limits if limit.id == step.get("only", limit.id)]
        reply = model.call(chosen, step.get("cost", 1), now, peek=step.get("op") == "peek")
        assert {
            "allowed": reply.allowed,
            "limit": chosen[reply.index].id if reply.index >= 0 else None,
            "remaining": reply.remaining,
            "reset_us": reply.reset_us,
            "retry_after_us": reply.retry_us,
        } == step["expect"]
