"""``django_throttle.testing``: what a project's own tests use to switch limiting off or to
start each test with clean counters."""

from __future__ import annotations

import re
import unittest
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import TestCase

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


# ``@isolated_throttle()`` on a TestCase class: run through unittest, as ``manage.py test``
# does. Before, the class became a function and its tests were silently never run.


def run_case(case: type) -> unittest.TestResult:
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(case).run(result)
    return result


def test_a_decorated_testcase_isolates_each_of_its_tests() -> None:
    prefixes: list[str] = []

    @isolated_throttle()
    class Signup(TestCase):
        def setUp(self) -> None:
            tier("anonymous", "2/h", is_default_anonymous=True)

        def test_one(self) -> None:
            prefixes.append(settings.DJANGO_THROTTLE_KEY_PREFIX)
            assert burst(self.client) == [200, 200, 429, 429]

        def test_two(self) -> None:
            prefixes.append(settings.DJANGO_THROTTLE_KEY_PREFIX)
            assert burst(self.client) == [200, 200, 429, 429]

    assert isinstance(Signup, type)
    result = run_case(Signup)

    assert (result.testsRun, result.errors, result.failures) == (2, [], [])
    assert len(set(prefixes)) == 2
    assert settings.DJANGO_THROTTLE_KEY_PREFIX not in prefixes


def test_a_decorated_test_function_runs_isolated_each_time() -> None:
    seen: list[str] = []

    @isolated_throttle()
    def check() -> None:
        seen.append(settings.DJANGO_THROTTLE_KEY_PREFIX)

    check()
    check()
    assert len(set(seen)) == 2


def test_a_decorated_async_test_runs_isolated() -> None:
    """Wrapped as a plain function, an ``async def`` test returned its coroutine unawaited:
    the runner counted it passed without running it, and the block had ended anyway."""
    seen: list[str] = []

    class Async(TestCase):
        @isolated_throttle()
        async def test_one(self) -> None:
            seen.append(settings.DJANGO_THROTTLE_KEY_PREFIX)

    result = run_case(Async)

    assert (result.testsRun, result.errors, result.failures) == (1, [], [])
    assert len(seen) == 1 and seen[0].startswith("dtt")
    assert seen[0] != settings.DJANGO_THROTTLE_KEY_PREFIX


def test_a_class_that_is_no_testcase_is_refused() -> None:
    with pytest.raises(TypeError, match="decorates a function or a TestCase class"):

        @isolated_throttle()
        class NotATestCase:
            def test_one(self) -> None: ...


# The examples of docs/howto/testing.md, run as a project's tests would run them.


def examples_of_the_testing_page() -> dict[str, Any]:
    """Everything the page's runnable blocks define, by name."""
    page = Path(__file__).resolve().parent.parent / "docs" / "howto" / "testing.md"
    defined: dict[str, Any] = {}
    for code in re.findall(
        r"^% runs-in-tests\n```python\n(.*?)^```", page.read_text(), re.M | re.S
    ):
        namespace: dict[str, Any] = {}
        exec(compile(code, str(page), "exec"), namespace)
        defined.update(namespace)
    return defined


def test_the_pytest_example_of_the_testing_page_passes(client: Any) -> None:
    example = examples_of_the_testing_page()["test_ping_is_limited"]
    with isolated_throttle() as prefix:
        example(client, prefix)


def test_the_testcase_example_of_the_testing_page_passes() -> None:
    result = run_case(examples_of_the_testing_page()["PingTests"])

    assert (result.testsRun, result.errors, result.failures) == (1, [], [])
