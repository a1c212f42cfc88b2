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

Without pytest, decorate a ``TestCase`` with :class:`isolated_throttle` (each test isolated)
and :func:`throttle_disabled_settings` (or ``@override_settings(DJANGO_THROTTLE_ENABLED=False)``).
"""

from __future__ import annotations

import contextlib
import functools
import unittest
import uuid
from collections.abc import Iterator
from typing import Any

from asgiref.sync import iscoroutinefunction
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


class isolated_throttle(contextlib.ContextDecorator):
    """Count under a fresh key prefix (``dtt<random>`` unless given) with fresh caches, for
    the duration of the block; yields the prefix. Keys written under it expire on their own
    (every key has a TTL), so nothing needs deleting afterwards.

    Also a decorator: on a test function (``async def`` too), for its run; on a ``TestCase`` class
    (``@isolated_throttle()``), for each of its tests, each with a prefix of its own."""

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix
        self._override: override_settings | None = None

    def __enter__(self) -> str:
        prefix = self.prefix or f"dtt{uuid.uuid4().hex[:10]}"
        self._override = override_settings(DJANGO_THROTTLE_KEY_PREFIX=prefix)
        self._override.enable()
        reset_caches()
        return prefix

    def __exit__(self, *exc: object) -> None:
        if self._override is not None:
            self._override.disable()
            self._override = None
        reset_caches()

    def _recreate_cm(self) -> isolated_throttle:
        # A decorated function may run more than once (and in threads): a new block each run.
        return isolated_throttle(self.prefix)

    def __call__(self, decorated: Any) -> Any:
        if iscoroutinefunction(decorated):
            # ContextDecorator would wrap it in a plain function returning the coroutine: the
            # block would end before the test ran, and a test runner would not await it.
            prefix = self.prefix

            @functools.wraps(decorated)
            async def run_isolated(*args: Any, **kwargs: Any) -> Any:
                with isolated_throttle(prefix):
                    return await decorated(*args, **kwargs)

            return run_isolated
        if not isinstance(decorated, type):
            return super().__call__(decorated)
        if not issubclass(decorated, unittest.TestCase):
            # Wrapping a class as a function would make its tests vanish without a word.
            raise TypeError(
                f"@isolated_throttle() decorates a function or a TestCase class, not "
                f"{decorated.__qualname__}: decorate its test methods, or use the "
                "throttle_isolated fixture"
            )
        set_up = decorated.setUp
        prefix = self.prefix

        def setUp(test: unittest.TestCase) -> None:
            test.enterContext(isolated_throttle(prefix))
            set_up(test)

        decorated.setUp = setUp  # type: ignore[method-assign,assignment]
        return decorated


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
