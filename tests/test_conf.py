"""The typed settings object. ``REDIS_URL`` is the one answer to "where is counting done" and
"how many key shards": ``memory://`` counts in the process, a ``?shards=N`` query sets the
shards, else 1 (one exact shared ceiling) except on a Redis Cluster URL, where it is 16."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from django_throttle.backends import get_backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.redis import RedisBackend
from django_throttle.conf import (
    CLUSTER_SCHEMES,
    MEMORY_BACKEND,
    NAMES,
    REDIS_BACKEND,
    app_settings,
    is_cluster_url,
    split_shards,
)
from django_throttle.rates import Limit

SINGLE = [
    "redis://127.0.0.1:6379/0",
    "rediss://:secret@redis.example.com:6380/1",
    "unix:///run/redis.sock?db=2",
    "valkey://127.0.0.1:6379/0",
    "valkeys://valkey.example.com:6380/0",
]
SENTINEL = [
    "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster",
    "valkey+sentinel://user:pw@10.0.0.1:26379/mymaster/2",
]
CLUSTER = [
    "redis+cluster://10.0.0.1:7000,10.0.0.2:7000",
    "rediss+cluster://:secret@cluster.example.com:6379",
    "valkey+cluster://10.0.0.1:7000",
    "valkeys+cluster://cluster.example.com:6379",
    "REDIS+CLUSTER://10.0.0.1:7000",  # schemes are case-insensitive
]


@pytest.mark.parametrize("url", [*SINGLE, *SENTINEL, None, ""], ids=str)
def test_key_shards_default_to_one_off_a_cluster(settings: Any, url: str | None) -> None:
    """A single Redis, Sentinel's primary, the django-redis cache's Redis (no URL): one
    shard, so a shared limit is one exact ceiling."""
    settings.DJANGO_THROTTLE_REDIS_URL = url

    assert app_settings.key_shards == 1


@pytest.mark.parametrize("url", CLUSTER)
def test_key_shards_default_to_sixteen_on_a_cluster(settings: Any, url: str) -> None:
    """16 shards, one slot each, spread over a Cluster's primaries."""
    settings.DJANGO_THROTTLE_REDIS_URL = url

    assert is_cluster_url(url)
    assert app_settings.key_shards == 16


def test_every_cluster_scheme_is_tested() -> None:
    assert {url.partition("://")[0].lower() for url in CLUSTER} == CLUSTER_SCHEMES


@pytest.mark.parametrize(
    ("url", "shards"),
    [(SINGLE[0], 16), (SINGLE[0], 1), (SENTINEL[0], 4), (CLUSTER[0], 1), (CLUSTER[0], 64)],
)
def test_a_shards_query_wins_over_the_default(settings: Any, url: str, shards: int) -> None:
    """The query is the limiter's: redis-py never sees it (it would take it for a client
    option), and the URL's own parameters are kept as written."""
    settings.DJANGO_THROTTLE_REDIS_URL = f"{url}?shards={shards}"

    assert shards == app_settings.key_shards
    assert url == app_settings.REDIS_URL


@pytest.mark.parametrize(
    ("url", "connected", "shards"),
    [
        ("unix:///run/redis.sock?db=2&shards=4", "unix:///run/redis.sock?db=2", "4"),
        ("redis://h/0?shards=4&protocol=3", "redis://h/0?protocol=3", "4"),
        ("redis://h/0?shards=2&shards=8", "redis://h/0", "8"),  # the last one, as a query
        ("redis://h/0?db=1", "redis://h/0?db=1", None),
        ("redis://h/0", "redis://h/0", None),
    ],
)
def test_only_the_shards_parameter_is_taken_from_the_url(
    url: str, connected: str, shards: str | None
) -> None:
    assert split_shards(url) == (connected, shards)


@pytest.mark.parametrize(
    ("url", "shards"),
    [
        ("cache://throttle?shards=8", 8),
        ("memory://?shards=4", 4),
        ("redis+cluster://10.0.0.1:7000?shards=0", 16),  # refused by E042: the default
        ("redis://h/0?shards=x", 1),
    ],
)
def test_every_form_of_the_url_takes_a_shards_query(settings: Any, url: str, shards: int) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = url

    assert app_settings.key_shards == shards
    assert app_settings.REDIS_URL is None or "shards" not in app_settings.REDIS_URL


def test_the_default_follows_a_changed_url(settings: Any) -> None:
    """Both settings are read again after any ``DJANGO_THROTTLE_*`` change."""
    settings.DJANGO_THROTTLE_REDIS_URL = CLUSTER[0]
    assert app_settings.key_shards == 16
    settings.DJANGO_THROTTLE_REDIS_URL = SINGLE[0]
    assert app_settings.key_shards == 1


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("memory://", MEMORY_BACKEND),
        ("MEMORY://?shards=2", MEMORY_BACKEND),
        (None, REDIS_BACKEND),
        ("cache://throttle", REDIS_BACKEND),
        (SINGLE[0], REDIS_BACKEND),
        (CLUSTER[0], REDIS_BACKEND),
    ],
)
def test_the_url_chooses_the_backend(settings: Any, url: str | None, path: str) -> None:
    """``memory://`` is the one way to count in the process; every other URL counts on
    Redis."""
    settings.DJANGO_THROTTLE_REDIS_URL = url

    assert app_settings.backend_path == path


def test_the_memory_backend_has_one_shard_by_default(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"

    backend = get_backend()

    assert isinstance(backend, MemoryBackend)
    assert backend.shards == MemoryBackend().shards == 1


def test_the_redis_backend_keys_one_shard_by_default(redis_url: str) -> None:
    """On the suite's own (single) Redis: every key under the one hash tag ``{0}``."""
    backend = get_backend()

    assert isinstance(backend, RedisBackend)
    assert backend.shards == 1
    assert backend.shard_tags() == (f"{backend.prefix}:{{0}}",)


@pytest.mark.parametrize("shards", [1, 16])
def test_every_reader_sees_the_same_count(settings: Any, redis_url: str, shards: int) -> None:
    """The backends build their keys and scripts from ``app_settings.key_shards``."""
    settings.DJANGO_THROTTLE_REDIS_URL = f"{redis_url}?shards={shards}"
    redis_backend = get_backend()
    settings.DJANGO_THROTTLE_REDIS_URL = f"memory://?shards={shards}"
    memory_backend = get_backend()

    assert isinstance(redis_backend, RedisBackend) and isinstance(memory_backend, MemoryBackend)
    assert redis_backend.shards == memory_backend.shards == app_settings.key_shards == shards
    assert len(redis_backend.shard_tags()) == shards
    # redis-py connects to the URL without the query it would take for a client option.
    assert redis_backend.hit("user:1", (Limit.build("t1", "5/m"),)).allowed


@pytest.mark.parametrize(("days", "enabled"), [(7, True), (1, True), (0, False)])
def test_usage_is_counted_while_days_of_it_are_kept(
    settings: Any, days: int, enabled: bool
) -> None:
    settings.DJANGO_THROTTLE_USAGE_RETENTION_DAYS = days

    assert app_settings.usage_enabled is enabled


@pytest.mark.parametrize(
    ("url", "alias"),
    [
        (None, "default"),
        ("", "default"),
        ("cache://default", "default"),
        ("cache://throttle", "throttle"),
        ("CACHE://throttle/", "throttle"),
    ],
)
def test_a_cache_url_borrows_that_cache(settings: Any, url: str | None, alias: str) -> None:
    """``REDIS_URL`` is the one way to reach Redis: a URL to connect to, or ``cache://<alias>``
    (unset: ``cache://default``) to borrow a cache's connection settings."""
    settings.DJANGO_THROTTLE_REDIS_URL = url

    assert app_settings.REDIS_URL is None
    assert alias == app_settings.cache_alias
    assert app_settings.key_shards == 1


def test_a_redis_url_is_connected_to(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = SINGLE[0]

    assert SINGLE[0] == app_settings.REDIS_URL


@pytest.mark.parametrize(
    ("trusted", "count", "v4", "v6"),
    [
        ((), 0, (), ()),
        (None, 0, (), ()),
        (2, 2, (), ()),
        (["10.0.0.0/8", "2001:db8::/32"], 0, ("10.0.0.0/8",), ("2001:db8::/32",)),
        (["10.0.0.0/8", "not a network"], 0, ("10.0.0.0/8",), ()),  # trusting less
        # Mapped and NAT64 IPv6 (read as the IPv4 they carry) trust those IPv4 addresses too.
        (
            ["::ffff:10.0.0.0/104", "64:ff9b::192.0.2.0/120"],
            0,
            ("10.0.0.0/8", "192.0.2.0/24"),
            ("::ffff:a00:0/104", "64:ff9b::c000:200/120"),
        ),
        (["::/0"], 0, ("0.0.0.0/0",), ("::/0",)),
    ],
)
def test_proxies_are_trusted_by_count_or_by_network_in_one_setting(
    settings: Any, trusted: Any, count: int, v4: tuple[str, ...], v6: tuple[str, ...]
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = trusted
    settings.DJANGO_THROTTLE_CLIENT_IP_HEADER = "X-Real-IP"

    trust = app_settings.proxy_trust

    assert trust.configured is bool(count or v4 or v6)
    assert trust.proxy_count == count
    assert tuple(map(str, trust.v4)) == v4
    # Compared as networks: Python 3.13 writes a mapped one dotted (::ffff:10.0.0.0/104),
    # earlier versions in hex (::ffff:a00:0/104).
    assert trust.v6 == tuple(map(ipaddress.ip_network, v6))
    assert trust.header == "HTTP_X_REAL_IP"


def test_a_removed_proxy_count_trusts_no_proxy(settings: Any) -> None:
    """``TRUSTED_PROXY_COUNT`` is read no more (system check E041 says what replaces it)."""
    settings.DJANGO_THROTTLE_TRUSTED_PROXY_COUNT = 1

    assert not app_settings.proxy_trust.configured


def test_settings_are_read_again_after_a_change(settings: Any) -> None:
    """What ``override_settings`` and the ``settings`` fixture rely on."""
    settings.DJANGO_THROTTLE_FAILURE_MODE = "closed"
    assert app_settings.FAILURE_MODE == "closed"
    settings.DJANGO_THROTTLE_FAILURE_MODE = "local"
    assert app_settings.FAILURE_MODE == "local"


def test_every_setting_is_documented_with_its_reason() -> None:
    """Each setting's ``#:`` comment says what it holds and when a project sets it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "docs" / "_ext"))
    from throttle_settings import settings_reference

    found = settings_reference()
    assert {s["name"].removeprefix("DJANGO_THROTTLE_") for s in found} == NAMES
    for setting in found:
        assert "Set it" in setting["doc"], setting["name"]


def test_unset_an_outage_is_counted_in_the_process() -> None:
    """The product promises that a Redis outage never switches limiting off: unset, the
    failure mode is "local" (counted per process), the system check accepts it, and the
    settings reference (generated from ``conf.py``) shows it with what each mode does."""
    import sys
    from pathlib import Path

    from django.conf import settings

    from django_throttle.checks import check_settings

    assert not hasattr(settings, "DJANGO_THROTTLE_FAILURE_MODE")
    assert app_settings.FAILURE_MODE == "local"
    assert check_settings() == []
    sys.path.insert(0, str(Path(__file__).parent.parent / "docs" / "_ext"))
    from throttle_settings import settings_reference

    (found,) = (s for s in settings_reference() if s["name"] == "DJANGO_THROTTLE_FAILURE_MODE")
    assert found["default"] == '"local"'
    assert "W x its limit" in found["doc"]
    assert all(f'``"{mode}"``' in found["doc"] for mode in ("local", "open", "closed"))


@pytest.mark.parametrize(
    ("setting", "view", "credential", "expected"),
    [
        ("open", None, False, "open"),
        ("closed", None, False, "closed"),
        ("open", None, True, "local"),  # a login is never served uncounted by the setting
        ("closed", None, True, "closed"),
        ("local", None, False, "local"),
        ("local", None, True, "local"),
        ("open", "closed", False, "closed"),  # the view's own rule in code wins
        ("closed", "open", True, "open"),
    ],
)
def test_the_failure_mode_is_decided_in_one_place_with_or_without_a_policy(
    settings: Any, setting: str, view: str | None, credential: bool, expected: str
) -> None:
    """``FAILURE_MODE`` is the last word after the rule's and the tier's; a check made while
    no policy is compiled is decided by the same function."""
    from django_throttle.policy.live import Policy

    settings.DJANGO_THROTTLE_FAILURE_MODE = setting

    assert Policy.failure_mode_for(None, None, credential, view) == expected
