"""Helpers for testing a project that uses django-throttle.

Switch limiting off for a test, or give each test a clean slate: a key prefix of its own (so
counts never leak between tests, even on a shared Redis) and no cached backend, policy or
breaker. With pytest, add ``pytest_plugins = ["django_throttle.testing"]`` to a
``conftest.py`` for the fixtures ``throttle_isolated`` and ``throttle_disabled``::

    def test_signup_is_limited(client, throttle_isolated):
        ...

    @pytest.mark.usefixtures("throttle_disabled")
    def test_bulk_import(client):
        ...

Without pytest, use :func:`isolated_throttle` and :func:`throttle_disabled_settings` (or
``@override_settings(DJANGO_THROTTLE_ENABLED=False)``) in a ``TestCase``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

from django.test import override_settings

__all__ = [
    "isolated_throttle",
    "reset_caches",
    "throttle_disabled",
    "throttle_disabled_settings",
    "throttle_isolated",
]


def reset_caches() -> None:
    """Forget this process's backend instances (an in-memory backend's counts with them),
    compiled policy, circuit breaker and usage counts kept while the backend was down."""
    from django_throttle import backends
    from django_throttle.policy import live as policy
    from django_throttle.usage import accounting as usage

    backends.reset_backend_cache()
    policy.reset()
    usage.reset()


@contextlib.contextmanager
def isolated_throttle(prefix: str | None = None) -> Iterator[str]:
    """Count under a fresh key prefix (``dtt<random>`` unless given) with fresh caches, for
    the duration of the block; yields the prefix. Keys written under it expire on their own
    (every key has a TTL), so nothing needs deleting afterwards."""
    prefix = prefix or f"dtt{uuid.uuid4().hex[:10]}"
    try:
        with override_settings(DJANGO_THROTTLE_KEY_PREFIX=prefix):
            reset_caches()
            yield prefix
    finally:
        reset_caches()


def throttle_disabled_settings() -> override_settings:
    """``override_settings`` that switch limiting off: every check allows, nothing counted."""
    return override_settings(DJANGO_THROTTLE_ENABLED=False)


# --- pytest fixtures (pytest_plugins = ["django_throttle.testing"]) ---------------------------

try:
    import pytest
except ImportError:  # pragma: no cover - pytest is optional
    pass
else:

    @pytest.fixture
    def throttle_isolated() -> Iterator[str]:
        """A key prefix and caches of this test's own; yields the prefix."""
        with isolated_throttle() as prefix:
            yield prefix

    @pytest.fixture
    def throttle_disabled() -> Iterator[None]:
        """Limiting off for this test."""
        with throttle_disabled_settings():
            reset_caches()
            yield
        reset_caches()


def __getattr__(name: str) -> Any:  # pragma: no cover - a clear message without pytest
    if name in ("throttle_isolated", "throttle_disabled"):
        raise AttributeError(f"{name} is a pytest fixture: install pytest to use it")
    raise AttributeError(name)
