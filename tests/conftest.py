"""Test fixtures: a private Redis for the session, a fresh key prefix and backend per test."""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from example_project.private_redis import PrivateRedis
from tests.redis_servers import RedisServer

_private: PrivateRedis | None = None


def _one_parse_at_a_time() -> None:
    """Make ``ast.parse`` take a lock, for the suite's process only.

    CPython 3.11 keeps the AST constructor's recursion depth in state shared by every thread
    (python/cpython#106905 and the reports since), and a traceback formatted in one thread
    parses its source line (for the ``^^^`` markers) while another thread parses too: now
    and then one of them fails with "SystemError: AST constructor recursion depth mismatch".
    The suite's worker threads (usage pushes, concurrency tests, servers) log exceptions
    while the main thread parses (pytest's assertion rewriting, the layering tests), so
    without the lock a run under load could fail on an error of the interpreter's."""
    import ast
    import threading

    parse, lock = ast.parse, threading.RLock()

    def locked_parse(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return parse(*args, **kwargs)

    ast.parse = locked_parse  # type: ignore[assignment]


_one_parse_at_a_time()

#: ``DJANGO_THROTTLE_TEST_ACL=least-privilege``: the throttle counts as an ACL user holding
#: only :func:`~django_throttle.backends.redis_clients.acl_rules` (on the suite's own server).
ACL_MODE = "least-privilege"
#: Every test's key prefix starts so (``_isolated_throttle``).
TEST_PREFIX = "dtt"


def pytest_configure(config: pytest.Config) -> None:
    """Start the suite's own redis-server before Django reads the settings.

    ``REDIS_URL`` points the suite at an outside Redis instead; keys then live under a random
    prefix per test and nothing is ever flushed. ``DJANGO_THROTTLE_TEST_ACL=least-privilege``
    makes the throttle (every backend the tests build from ``redis_url`` or the settings,
    here and in the processes they start) count as a least-privilege ACL user, while the
    tests' own setup and inspection (``redis_client``, ``redis_admin_url``) stay the server's
    default user.
    """
    global _private
    url = os.environ.get("DJANGO_THROTTLE_TEST_REDIS_URL") or os.environ.get("REDIS_URL")
    acl = os.environ.get("DJANGO_THROTTLE_TEST_ACL", "")
    if acl not in ("", ACL_MODE):
        raise pytest.UsageError(f"DJANGO_THROTTLE_TEST_ACL must be {ACL_MODE!r} or unset")
    if acl and url:
        raise pytest.UsageError(
            "DJANGO_THROTTLE_TEST_ACL adds an ACL user: only on the suite's own redis-server, "
            "so unset REDIS_URL"
        )
    if not url:
        _private = PrivateRedis().start()
        url = _private.url
    os.environ.setdefault("DJANGO_THROTTLE_TEST_REDIS_ADMIN_URL", url)
    if acl:
        url = _least_privilege_user(url)
    os.environ["DJANGO_THROTTLE_TEST_REDIS_URL"] = url
    # pytest-django may have loaded the settings already; point them at this Redis too.
    from django.conf import settings

    settings.DJANGO_THROTTLE_REDIS_URL = url


def _least_privilege_user(admin_url: str) -> str:
    """Add the throttle's ACL user to the server at ``admin_url``; the URL that logs in as it.

    Its rules are the docs' for the default prefix, plus the tests' prefixes."""
    from django_throttle.backends.redis_clients import acl_rules

    password = secrets.token_urlsafe(16)
    rules = [*acl_rules("dt"), f"~{TEST_PREFIX}*", "on", f">{password}"]
    client = redis.Redis.from_url(admin_url)
    try:
        client.execute_command("ACL", "SETUSER", "throttle", *rules)
    finally:
        client.close()
    scheme, rest = admin_url.split("://", 1)
    return f"{scheme}://throttle:{password}@{rest.rpartition('@')[2]}"


def pytest_unconfigure(config: pytest.Config) -> None:
    if _private is not None:
        _private.stop()
        os.environ.pop("DJANGO_THROTTLE_TEST_REDIS_URL", None)
        os.environ.pop("DJANGO_THROTTLE_TEST_REDIS_ADMIN_URL", None)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The URL the throttle counts on (as the least-privilege user in that mode)."""
    return os.environ["DJANGO_THROTTLE_TEST_REDIS_URL"]


@pytest.fixture(scope="session")
def redis_admin_url() -> str:
    """The same server as the default user: for tests that set up or inspect it."""
    return os.environ["DJANGO_THROTTLE_TEST_REDIS_ADMIN_URL"]


@pytest.fixture
def redis_client(redis_admin_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_admin_url)
    yield client
    client.close()


@pytest.fixture
def open_store() -> Iterator[Callable[..., Any]]:
    """:func:`django_throttle.usage.accounting.get_store` for a test: every store it hands out
    is closed when the test ends (a Redis store reads on a client of its own)."""
    from django_throttle.usage import accounting

    stores: list[Any] = []

    def get(backend: Any = None) -> Any:
        stores.append(store := accounting.get_store(backend))
        return store

    yield get
    for store in stores:
        store.close()


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest, settings: Any) -> Iterator[Any]:
    """The configured backend, once as Redis (the suite's own server) and once in memory: a
    test taking it runs against both, with the same expectations (and the same key shards,
    when a fixture before it asked for some on the Redis URL)."""
    from django_throttle.backends import get_backend
    from django_throttle.backends.memory import MemoryBackend
    from django_throttle.backends.redis import RedisBackend
    from django_throttle.conf import split_shards

    if request.param == "memory":
        shards = split_shards(settings.DJANGO_THROTTLE_REDIS_URL or "")[1]
        settings.DJANGO_THROTTLE_REDIS_URL = "memory://" + (f"?shards={shards}" if shards else "")
    instance = get_backend()
    assert isinstance(instance, RedisBackend if request.param == "redis" else MemoryBackend)
    yield instance


@pytest.fixture(autouse=True)
def _isolated_throttle(settings: object) -> Iterator[str]:
    """Give every test its own key prefix, backend instance and policy cache."""
    from django_throttle import backends
    from django_throttle.policy import live as policy
    from django_throttle.usage import accounting as usage

    prefix = f"{TEST_PREFIX}{uuid.uuid4().hex[:10]}"
    settings.DJANGO_THROTTLE_KEY_PREFIX = prefix  # type: ignore[attr-defined]
    usage.wait_pushed()  # no push of an earlier test's in flight
    backends.reset_backend_cache()
    policy.reset()
    usage.reset()
    yield prefix
    usage.wait_pushed()
    backends.reset_backend_cache()
    policy.reset()
    usage.reset()


@pytest.fixture(scope="session")
def _pausable_redis() -> Iterator[Any]:
    """A redis-server of the suite's own that a test may pause, started on first use."""
    from tests.redis_servers import RedisServer

    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def hung_redis(_pausable_redis: Any, settings: Any) -> Iterator[str]:
    """The throttle on a Redis that accepts connections and answers nothing (SIGSTOP: a hung
    server), with the package's own short timeouts, until the test ends; yields its URL."""
    settings.DJANGO_THROTTLE_REDIS_URL = _pausable_redis.url
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}
    _pausable_redis.pause()
    yield _pausable_redis.url
    _pausable_redis.resume()


@pytest.fixture(scope="module")
def redis_process() -> Iterator[RedisServer]:
    """A private redis-server of the module's own (the fault, outage and seam tests stop,
    pause and restart it), started once for the module and stopped after it."""
    server = RedisServer().start()
    yield server
    server.stop()
