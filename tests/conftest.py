"""Test fixtures: a private Redis for the session, a fresh key prefix and backend per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from example_project.private_redis import PrivateRedis

_private: PrivateRedis | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Start the suite's own redis-server before Django reads the settings.

    ``REDIS_URL`` points the suite at an outside Redis instead; keys then live under a random
    prefix per test and nothing is ever flushed.
    """
    global _private
    url = os.environ.get("DJANGO_THROTTLE_TEST_REDIS_URL") or os.environ.get("REDIS_URL")
    if not url:
        _private = PrivateRedis().start()
        url = _private.url
    os.environ["DJANGO_THROTTLE_TEST_REDIS_URL"] = url
    # pytest-django may have loaded the settings already; point them at this Redis too.
    from django.conf import settings

    settings.DJANGO_THROTTLE_REDIS_URL = url


def pytest_unconfigure(config: pytest.Config) -> None:
    if _private is not None:
        _private.stop()
        os.environ.pop("DJANGO_THROTTLE_TEST_REDIS_URL", None)


@pytest.fixture(scope="session")
def redis_url() -> str:
    return os.environ["DJANGO_THROTTLE_TEST_REDIS_URL"]


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest, settings: Any) -> Iterator[Any]:
    """The configured backend, once as Redis (the suite's own server) and once in memory: a
    test taking it runs against both, with the same expectations."""
    from django_throttle.backends import get_backend
    from django_throttle.backends.memory import MemoryBackend
    from django_throttle.backends.redis import RedisBackend

    if request.param == "memory":
        settings.DJANGO_THROTTLE_BACKEND = "django_throttle.backends.memory.MemoryBackend"
    instance = get_backend()
    assert isinstance(instance, RedisBackend if request.param == "redis" else MemoryBackend)
    yield instance


@pytest.fixture(autouse=True)
def _isolated_throttle(settings: object, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Give every test its own key prefix, backend instance and policy cache, and exact
    per-client usage counts (tests/test_usage_sampling.py covers the sampled default)."""
    from django_throttle import backends
    from django_throttle.backends import usage_base
    from django_throttle.policy import live as policy
    from django_throttle.usage import accounting as usage

    monkeypatch.setattr(usage_base, "CLIENT_SAMPLE", 1)
    prefix = f"dtt{uuid.uuid4().hex[:10]}"
    settings.DJANGO_THROTTLE_KEY_PREFIX = prefix  # type: ignore[attr-defined]
    backends.reset_backend_cache()
    policy.reset()
    usage.reset()
    yield prefix
    backends.reset_backend_cache()
    policy.reset()
    usage.reset()
