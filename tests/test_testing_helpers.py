"""``django_throttle.testing``: what a project's own tests use to switch limiting off or to
start each test with clean counters."""

from __future__ import annotations

from typing import Any

import pytest

from django_throttle.testing import (  # noqa: F401 - pytest fixtures used by name
    isolated_throttle,
    throttle_disabled,
    throttle_disabled_settings,
    throttle_isolated,
)
from tests.factories import tier

pytestmark = pytest.mark.django_db


def burst(client: Any, n: int = 4) -> list[int]:
    return [client.get("/api/ping/", REMOTE_ADDR="203.0.113.5").status_code for _ in range(n)]


def test_each_isolated_block_starts_with_full_buckets(client: Any) -> None:
    tier("anonymous", "2/h", is_default_anonymous=True)
    with isolated_throttle() as first:
        assert burst(client) == [200, 200, 429, 429]
    with isolated_throttle() as second:
        assert burst(client) == [200, 200, 429, 429]
    assert first != second


def test_the_isolated_fixture_gives_a_prefix(client: Any, throttle_isolated: str) -> None:  # noqa: F811
    from django.conf import settings

    assert throttle_isolated == settings.DJANGO_THROTTLE_KEY_PREFIX


def test_the_disabled_fixture_switches_limiting_off(client: Any, throttle_disabled: None) -> None:  # noqa: F811
    tier("anonymous", "1/h", is_default_anonymous=True)
    assert burst(client) == [200] * 4
    assert "X-RateLimit-Limit" not in client.get("/api/ping/")


def test_disabled_settings_as_a_context_manager(client: Any) -> None:
    tier("anonymous", "1/h", is_default_anonymous=True)
    with throttle_disabled_settings():
        assert burst(client) == [200] * 4
    assert burst(client, 2) == [200, 429]
