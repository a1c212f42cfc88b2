"""System checks: each bad ``DJANGO_THROTTLE_*`` value is reported with its own id and name."""

from __future__ import annotations

import subprocess
import sys
from io import StringIO
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_throttle.checks import check_settings

MEMORY = "django_throttle.backends.memory.MemoryBackend"
REDIS = "django_throttle.backends.redis.RedisBackend"


def ids() -> list[str]:
    return [error.id for error in check_settings()]


def test_test_settings_pass() -> None:
    assert check_settings() == []


def test_defaults_pass(settings: Any) -> None:
    """With nothing but a Redis URL set, every default is valid."""
    for name in dir(django_settings):
        if name.startswith("DJANGO_THROTTLE_") and name != "DJANGO_THROTTLE_REDIS_URL":
            delattr(settings, name)

    assert check_settings() == []


@pytest.mark.parametrize(
    ("name", "value", "check_id"),
    [
        ("REDIS_URL", "http://x", "E002"),
        ("REDIS_URL", "localhost:6379", "E002"),
        ("REDIS_URL", 6379, "E002"),
        ("REDIS_OPTIONS", [("socket_timeout", 1)], "E003"),
        ("REDIS_OPTIONS", "socket_timeout=1", "E003"),
        ("REDIS_URL", "cache://a/b", "E002"),
        ("REDIS_URL", "memory://somewhere", "E002"),
        ("REDIS_URL", "redis://127.0.0.1:6379/0?shards=0", "E042"),
        ("REDIS_URL", "redis://127.0.0.1:6379/0?shards=1025", "E042"),
        ("REDIS_URL", "redis+cluster://10.0.0.1:7000?shards=many", "E042"),
        ("REDIS_URL", "cache://default?shards=-1", "E042"),
        ("REDIS_URL", "memory://?shards=", "E042"),
        ("KEY_PREFIX", "dt{x}", "E005"),
        ("KEY_PREFIX", "{", "E005"),
        ("KEY_PREFIX", "", "E005"),
        ("KEY_PREFIX", "my prefix", "E005"),
        ("FAILURE_MODE", "sideways", "E006"),
        ("FAILURE_MODE", "OPEN", "E006"),
        ("TRUSTED_PROXIES", -1, "E030"),
        ("TRUSTED_PROXIES", "2", "E030"),
        ("TRUSTED_PROXIES", 33, "E030"),
        ("TRUSTED_PROXIES", True, "E030"),
        ("IDENTITY_RESOLVER", "tests.nowhere.resolver", "E010"),
        ("IDENTITY_RESOLVER", "django_throttle.conf.PREFIX", "E010"),
        ("IETF_HEADERS", "yes", "E013"),
        ("IETF_HEADERS", 1, "E013"),
        ("USAGE_RETENTION_DAYS", -1, "E016"),
        ("USAGE_RETENTION_DAYS", "7", "E016"),
        ("ENABLED", "false", "E017"),
        ("ENABLED", None, "E017"),
        ("TRUSTED_PROXIES", "10.0.0.0/8", "E030"),
        ("TRUSTED_PROXIES", ["10.0.0.0/8", "10.0.0.300/8"], "E030"),
        ("TRUSTED_PROXIES", ["10.0.0.1/8"], "E030"),
        ("TRUSTED_PROXIES", ["2001:db8::/129"], "E030"),
        ("TRUSTED_PROXIES", [10], "E030"),
        ("TRUSTED_PROXIES", {"net": "10.0.0.0/8"}, "E030"),
        ("CLIENT_IP_HEADER", "HTTP_X_REAL_IP", "E031"),
        ("CLIENT_IP_HEADER", "", "E031"),
        ("CLIENT_IP_HEADER", "X Real IP", "E031"),
        ("CLIENT_IP_HEADER", "X-Real-IP:", "E031"),
        ("CLIENT_IP_HEADER", "X-Forwarded-For", "E031"),
        ("CLIENT_IP_HEADER", "forwarded", "E031"),
        ("CLIENT_IP_HEADER", 42, "E031"),
    ],
)
def test_bad_value_has_its_own_id(settings: Any, name: str, value: Any, check_id: str) -> None:
    setattr(settings, f"DJANGO_THROTTLE_{name}", value)

    errors = check_settings()

    assert [error.id for error in errors] == [f"django_throttle.{check_id}"]
    [error] = errors
    assert f"DJANGO_THROTTLE_{name} = {value!r}" in error.msg
    assert error.hint


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REDIS_URL", "memory://"),
        ("REDIS_URL", "MEMORY://?shards=4"),
        ("REDIS_URL", "rediss://cache.internal:6380/2"),
        ("REDIS_URL", "rediss://cache.internal:6380/2?shards=1"),
        ("REDIS_URL", "redis+cluster://10.0.0.1:7000,10.0.0.2:7000?shards=1024"),
        ("REDIS_URL", "redis+sentinel://10.0.0.1:26379/mymaster/2?shards=16"),
        ("REDIS_URL", "unix:///run/redis.sock"),
        ("REDIS_OPTIONS", {}),
        ("KEY_PREFIX", "api-throttle"),
        ("FAILURE_MODE", "open"),
        ("FAILURE_MODE", "closed"),
        ("FAILURE_MODE", "local"),
        ("TRUSTED_PROXIES", 0),
        ("TRUSTED_PROXIES", 32),
        ("IDENTITY_RESOLVER", "tests.test_identity.my_resolver"),
        ("IETF_HEADERS", True),
        ("USAGE_RETENTION_DAYS", 0),
        ("USAGE_RETENTION_DAYS", 30),
        ("ENABLED", False),
        ("TRUSTED_PROXIES", ["10.0.0.0/8", "2001:db8::/32", "192.0.2.1"]),
        ("TRUSTED_PROXIES", ("172.16.0.0/12",)),
        ("TRUSTED_PROXIES", []),
        ("TRUSTED_PROXIES", None),
        ("CLIENT_IP_HEADER", None),
    ],
)
def test_good_value_passes(settings: Any, name: str, value: Any) -> None:
    setattr(settings, f"DJANGO_THROTTLE_{name}", value)

    assert check_settings() == []


def test_every_bad_setting_is_reported_at_once(settings: Any) -> None:
    settings.DJANGO_THROTTLE_FAILURE_MODE = "sideways"
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:6379/0?shards=0"
    settings.DJANGO_THROTTLE_ENABLED = "yes"

    assert ids() == [
        "django_throttle.E006",
        "django_throttle.E017",
        "django_throttle.E042",
    ]


def test_redis_backend_without_redis(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = None
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

    errors = check_settings()

    assert [error.id for error in errors] == ["django_throttle.E018"]
    assert "DJANGO_THROTTLE_REDIS_URL" in errors[0].msg
    assert "memory://" in errors[0].hint


def test_a_shards_query_names_the_url_and_the_range(settings: Any) -> None:
    """E042: a ``?shards=`` out of range is named with the URL (password masked) and the
    range; the other query parameters are the client's and not the check's concern."""
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://:pw-secret@127.0.0.1:6379/0?shards=0&db=1"

    [error] = check_settings()

    assert error.id == "django_throttle.E042"
    assert "shards='0'" in error.msg and "1 to 1024" in error.msg
    assert "pw-secret" not in error.msg


@pytest.mark.parametrize(
    "url", ["valkey://127.0.0.1:6379/0", "valkeys://cache.example.com:6380/0", "VALKEY://h/1"]
)
def test_valkey_spellings_of_a_redis_url_pass(settings: Any, url: str) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = url
    assert ids() == []


def test_an_option_redis_py_connections_do_not_take_is_an_error(settings: Any) -> None:
    """``ssl=True`` beside a ``redis://`` URL (a redis.Redis() argument, not a connection's)
    would make every counting call fail and take the failure mode: E040 names the option and
    never shows the options' values, which may hold a password."""
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:6379/0"
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"ssl": True, "password": "s3cret-value"}
    errors = check_settings()
    assert [error.id for error in errors] == ["django_throttle.E040"]
    assert "'ssl'" in errors[0].msg
    assert "s3cret-value" not in errors[0].msg + str(errors[0].hint)
    assert "rediss://" in errors[0].hint

    settings.DJANGO_THROTTLE_REDIS_URL = "rediss://127.0.0.1:6379/0"
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {
        "ssl_ca_certs": "/etc/ssl/redis/ca.pem",
        "ssl_check_hostname": False,
        "password": "s3cret-value",
    }
    assert ids() == []


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/0", "redis+cluster://127.0.0.1:7000,127.0.0.1:7001", "unix:///r.sock"],
)
@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("retry=1", "'retry' is not taken: retries are always off"),
        ("credential_provider=tokens", "'credential_provider' as text"),
        ("decode_responses=false", "'decode_responses' as text"),
    ],
)
def test_a_query_parameter_read_as_text_the_client_cannot_use_is_an_error(
    settings: Any, url: str, query: str, named: str
) -> None:
    """redis-py passes a query parameter it does not parse to the client as text: ``?retry=1``
    replaced the client's no-retries object with ``"1"``, so every counting call failed
    (``'str' object has no attribute 'call_with_retry'``) and every request took the failure
    mode while ``manage.py check`` said nothing; ``"false"`` is true. E040 names the
    parameter."""
    settings.DJANGO_THROTTLE_REDIS_URL = f"{url}?{query}"

    errors = check_settings()

    assert [error.id for error in errors] == ["django_throttle.E040"]
    assert named in errors[0].msg


def test_query_parameters_redis_py_reads_pass(settings: Any) -> None:
    """Text options (paths, names, ``ssl_cert_reqs``) and the ones redis-py parses into
    numbers and flags are taken from a URL's query."""
    query = (
        "ssl_cert_reqs=required&ssl_ca_certs=/etc/ssl/ca.pem&ssl_check_hostname=false&"
        "client_name=throttle&socket_timeout=0.2&health_check_interval=30&max_connections=8"
    )
    for url in ("rediss://u:pw@127.0.0.1:6379/0", "rediss+cluster://127.0.0.1:7000"):
        settings.DJANGO_THROTTLE_REDIS_URL = f"{url}?{query}"
        assert ids() == []


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"]
)
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"socket_timeout": "1"}, "'socket_timeout' must be a number of seconds or None, not str"),
        ({"socket_connect_timeout": [0.5]}, "'socket_connect_timeout'"),
        ({"health_check_interval": True}, "'health_check_interval'"),
        ({"socket_timeout": -1}, "not -1"),
    ],
)
def test_a_timeout_that_is_no_number_is_an_error(
    settings: Any, url: str, options: dict[str, object], named: str
) -> None:
    """redis-py takes ``socket_timeout="1"`` and fails only when it connects: every counting
    call failed and every request took the failure mode (served uncounted, by default)."""
    settings.DJANGO_THROTTLE_REDIS_URL = url
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = options

    errors = check_settings()

    assert [error.id for error in errors] == ["django_throttle.E040"]
    assert named in errors[0].msg


def test_timeouts_that_are_numbers_pass(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:6379/0"
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {
        "socket_timeout": 0.2,
        "socket_connect_timeout": 1,
        "health_check_interval": 30,
    }
    assert ids() == []


def test_a_borrowed_cache_the_backend_cannot_read_is_an_error_not_a_traceback(
    settings: Any,
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = None
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://mymaster/0",
            "OPTIONS": {"SENTINELS": [("127.0.0.1", 26379)]},
        }
    }
    errors = check_settings()
    assert [error.id for error in errors] == ["django_throttle.E040"]
    assert "DJANGO_THROTTLE_REDIS_URL" in errors[0].msg


def test_redis_backend_borrowing_a_django_redis_cache(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = None
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "throttle": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:6379/0",
        },
    }
    assert ids() == ["django_throttle.E018"]

    settings.DJANGO_THROTTLE_REDIS_URL = "cache://throttle"
    assert ids() == []

    settings.DJANGO_THROTTLE_REDIS_URL = "cache://default"
    [error] = check_settings()
    assert error.id == "django_throttle.E018"
    assert "CACHES['default'] (cache://default)" in error.msg


def test_redis_backend_building_its_client_from_djangos_redis_cache(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = None
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:6379/0",
        }
    }

    assert ids() == []


def test_memory_backend_needs_no_redis(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

    assert ids() == []


def test_manage_py_check_passes() -> None:
    call_command("check")


def test_manage_py_check_fails_on_a_bad_setting(settings: Any) -> None:
    settings.DJANGO_THROTTLE_FAILURE_MODE = "sideways"

    with pytest.raises(SystemCheckError) as excinfo:
        call_command("check")

    assert "django_throttle.E006" in str(excinfo.value)
    assert "DJANGO_THROTTLE_FAILURE_MODE" in str(excinfo.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:abc/0",
        "rediss://:pw@cache.example.com:637900/0",
        "valkey://127.0.0.1:6379:6380/0",
    ],
)
def test_a_port_that_is_no_number_is_named_by_e002(settings: Any, url: str) -> None:
    """A mistyped port was reported by E040 with a hint about DJANGO_THROTTLE_REDIS_OPTIONS,
    which the project had not set: E002 says the URL's port is wrong and how to write it."""
    settings.DJANGO_THROTTLE_REDIS_URL = url

    [error] = check_settings()

    assert error.id == "django_throttle.E002"
    assert "has a port that is no number" in error.msg
    assert "'redis://127.0.0.1:6379/0'" in error.msg
    assert ":pw@" not in error.msg


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/throttle", "rediss://:pw@cache.example.com:6380/1O"]
)
def test_a_database_that_is_no_number_is_an_error(settings: Any, url: str) -> None:
    """redis-py reads a database it cannot make a number of as none at all: the limiter
    counted in database 0 without a word."""
    settings.DJANGO_THROTTLE_REDIS_URL = url

    [error] = check_settings()

    assert error.id == "django_throttle.E002"
    assert "ends with a database that is no number" in error.msg
    assert ":pw@" not in error.msg


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379",
        "redis://127.0.0.1:6379/",
        "redis://127.0.0.1:6379/15",
        "unix:///run/redis/redis.sock?db=2",
    ],
)
def test_a_url_with_a_database_number_or_none_passes(settings: Any, url: str) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = url
    assert ids() == []


def test_empty_redis_url_means_unset(settings: Any) -> None:
    """``os.environ.get("REDIS_URL", "")`` is not a malformed URL, just no URL (→ E018)."""
    settings.DJANGO_THROTTLE_REDIS_URL = ""
    assert [error.id for error in check_settings()] == ["django_throttle.E018"]


def test_every_setting_has_a_check() -> None:
    from django_throttle.checks import SETTINGS
    from django_throttle.conf import NAMES

    assert sorted(name for _id, name, _validate in SETTINGS) == sorted(NAMES)


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("DJANGO_THROTTLE_TRUSTED_PROXY", "Did you mean DJANGO_THROTTLE_TRUSTED_PROXIES?"),
        ("DJANGO_THROTTLE_FAILURE_MDOE", "Did you mean DJANGO_THROTTLE_FAILURE_MODE?"),
        ("DJANGO_THROTTLE_BREAKER_COOLDOWN", "Remove it"),
        ("DJANGO_THROTTLE_", "Remove it"),
    ],
)
def test_a_name_that_is_no_setting_is_a_warning(settings: Any, name: str, hint: str) -> None:
    """A typo leaves the setting meant at its default without a word, unless a check says so;
    a name this app never had (or no longer has) gets the same warning."""
    setattr(settings, name, 5)

    [warning] = check_settings()

    assert warning.id == "django_throttle.W001"
    assert not warning.is_serious()
    assert f"{name} is not a django-throttle setting" in warning.msg
    assert hint in warning.hint


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        (
            {"REDIS_URL": "memory://", "FAILURE_MODE": "closed"},
            "Set DJANGO_THROTTLE_REDIS_URL, DJANGO_THROTTLE_FAILURE_MODE instead.",
        ),
        ("memory://", "Remove it."),
    ],
)
def test_the_settings_grouped_in_one_dict_are_a_warning(
    settings: Any, value: object, hint: str
) -> None:
    """``DJANGO_THROTTLE = {...}``, the way other apps take their settings, was read by
    nothing: the Redis URL and failure mode in it kept their defaults without a word."""
    settings.DJANGO_THROTTLE = value

    [warning] = check_settings()

    assert warning.id == "django_throttle.W001"
    assert "DJANGO_THROTTLE is not a django-throttle setting" in warning.msg
    assert "DJANGO_THROTTLE_<NAME>" in warning.msg
    assert hint in warning.hint


def test_manage_py_check_shows_a_misspelt_setting(settings: Any, capsys: Any) -> None:
    settings.DJANGO_THROTTLE_IETF_HEADER = True

    call_command("check")

    assert "django_throttle.W001" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["DEFAULT_THROTTLE_CLASSES", "DEFAULT_AUTHENTICATION_CLASSES"])
def test_a_drf_class_list_given_as_one_string_is_an_error(settings: Any, key: str) -> None:
    """DRF imports the string as one class and fails every request iterating over it: the
    check says so before the first request does."""
    settings.REST_FRAMEWORK = {key: "django_throttle.drf.PolicyThrottle"}

    [error] = check_settings()

    assert error.id == "django_throttle.E046"
    assert error.is_serious()
    assert f"REST_FRAMEWORK[{key!r}]" in error.msg
    assert f"{key!r}: ['django_throttle.drf.PolicyThrottle']" in error.hint


def test_drf_class_lists_as_lists_pass(settings: Any) -> None:
    settings.REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": ["django_throttle.drf.PolicyThrottle"],
        "DEFAULT_AUTHENTICATION_CLASSES": (),
    }

    assert check_settings() == []


def test_drf_throttles_left_next_to_policy_throttle_are_a_warning(settings: Any) -> None:
    """A migration from DRF left half done: DRF's throttles still refuse by their own rates,
    whatever the admin's tiers allow, and nothing said so."""
    settings.REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": [
            "rest_framework.throttling.AnonRateThrottle",
            "django_throttle.drf.PolicyThrottle",
            "rest_framework.throttling.ScopedRateThrottle",
        ],
        "DEFAULT_THROTTLE_RATES": {"anon": "100/day"},
    }

    [warning] = check_settings()

    assert warning.id == "django_throttle.W010"
    assert not warning.is_serious()
    assert "DRF's AnonRateThrottle, ScopedRateThrottle next to" in warning.msg
    assert "throttle_policy from-drf --apply" in warning.hint


def test_drf_throttles_alone_are_no_concern_of_the_checks(settings: Any) -> None:
    """A project still on DRF's throttles (before ``from-drf``) is not told off."""
    settings.REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.AnonRateThrottle"],
        "DEFAULT_THROTTLE_RATES": {"anon": "100/day"},
    }

    assert check_settings() == []


def test_the_headers_middleware_listed_twice_is_a_warning(settings: Any) -> None:
    """A settings file adding the middleware to a list that has it already: each request
    then counted twice towards the worker's busy requests, so its shedder shed at half its
    capacity."""
    middleware = "django_throttle.middleware.RateLimitHeadersMiddleware"
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, middleware]
    assert settings.MIDDLEWARE.count(middleware) == 2

    [warning] = check_settings()

    assert warning.id == "django_throttle.W008"
    assert f"{middleware} is in MIDDLEWARE 2 times" in warning.msg

    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != middleware]
    assert check_settings() == []


def test_names_of_other_apps_are_not_flagged(settings: Any) -> None:
    settings.DJANGO_THROTTLER = True
    settings.THROTTLE_FAILURE_MODE = "sideways"

    assert check_settings() == []


@pytest.mark.parametrize(
    ("entries", "named", "hint"),
    [
        (["10.0.0.0/8", "10.0.0.300/8"], "'10.0.0.300/8'", "not an IP network"),
        (["10.0.0.1/8"], "'10.0.0.1/8'", "did you mean '10.0.0.0/8'?"),
        (["2001:db8::/32", "2001:db8::1/32"], "'2001:db8::1/32'", "did you mean '2001:db8::/32'?"),
        (["10.0.0.0/8", None], "None", "not text"),
    ],
)
def test_trusted_proxies_check_names_the_bad_entry(
    settings: Any, entries: list[Any], named: str, hint: str
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = entries

    [error] = check_settings()

    assert error.id == "django_throttle.E030"
    assert f"has {named}, which" in error.msg
    assert hint in error.msg


def test_a_single_string_is_not_a_list_of_proxies(settings: Any) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = "10.0.0.0/8"

    [error] = check_settings()

    assert "or a list of their networks such as ['10.0.0.0/8'" in error.msg


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("HTTP_X_REAL_IP", "a header name as sent, such as 'X-Real-IP'"),
        ("X-Forwarded-For", "trust it with TRUSTED_PROXIES (a count or networks)"),
    ],
)
def test_client_ip_header_check_says_what_to_write(settings: Any, value: str, says: str) -> None:
    settings.DJANGO_THROTTLE_CLIENT_IP_HEADER = value
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1

    [error] = check_settings()

    assert error.id == "django_throttle.E031"
    assert says in error.msg


@pytest.mark.parametrize("trusted", [1, ["10.0.0.0/8"]])
def test_a_client_ip_header_from_trusted_proxies_passes(settings: Any, trusted: Any) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = trusted
    settings.DJANGO_THROTTLE_CLIENT_IP_HEADER = "X-Real-IP"

    assert check_settings() == []


def test_client_ip_header_without_a_trusted_proxy_is_a_warning(settings: Any) -> None:
    settings.DJANGO_THROTTLE_CLIENT_IP_HEADER = "X-Real-IP"

    [warning] = check_settings()

    assert warning.id == "django_throttle.W002"
    assert not warning.is_serious()
    assert "DJANGO_THROTTLE_CLIENT_IP_HEADER = 'X-Real-IP' is never read" in warning.msg
    assert "DJANGO_THROTTLE_TRUSTED_PROXIES" in warning.hint

    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1
    assert check_settings() == []


@pytest.mark.django_db
def test_a_credential_rule_limiting_some_tiers_by_client_is_a_warning() -> None:
    """W005: signed-in users and API keys of the other tiers would meet none of the rule's
    limits counted by client; its counters by IP address and username apply to every tier
    (tests/test_request_seams.py), so a rule with only those is fine."""
    from django.core.checks import run_checks

    from django_throttle.models import EndpointLimit, EndpointRule
    from tests.factories import tier

    anonymous = tier("anonymous", "100/h", is_default_anonymous=True)
    tier("members", "100/h", is_default_authenticated=True)
    login = EndpointRule.objects.create(name="login", pattern="login", counts="failures")
    EndpointLimit.objects.create(rule=login, tier=anonymous, rate="5/min", counted_by="ip")
    EndpointLimit.objects.create(rule=login, tier=anonymous, rate="10/h", counted_by="username")
    export = EndpointRule.objects.create(name="export", pattern="export")
    EndpointLimit.objects.create(rule=export, tier=anonymous, rate="1/h")  # not a login

    def warnings() -> list[str]:
        return [m.msg for m in run_checks() if m.id == "django_throttle.W005"]

    assert warnings() == []
    EndpointLimit.objects.create(rule=login, tier=anonymous, rate="3/min")
    (message,) = warnings()
    assert "'login'" in message
    assert "tier(s) anonymous only" in message
    assert "members" in message


@pytest.mark.parametrize(
    ("name", "value", "replacement", "check_id"),
    [
        # Ignored, these change nothing: a warning.
        ("CACHE_ALIAS", "default", 'REDIS_URL = "cache://<alias>"', "W004"),
        ("TRUSTED_PROXY_COUNT", 0, "TRUSTED_PROXIES = <count>", "W004"),
        ("FAILURE_STATUS", 429, "the constant 503", "W004"),
        ("UNKNOWN_CLIENT", "shared", 'the constant "deny"', "W004"),
        ("IPV4_PREFIX", 32, "the constant 32", "W004"),
        ("IPV6_PREFIX", 128, "the constant 64", "W004"),
        ("API_KEY_HEADERS", ["X-API-Key"], '("Authorization", "X-API-Key")', "W004"),
        # The controller's option now; without it the command stops and says so.
        ("LOAD_SIGNAL", "myproject.load.p95", "manage.py throttle_adapt --signal <path>", "W004"),
        ("LOAD_SIGNAL", None, "manage.py throttle_adapt --signal <path>", "W004"),
        # Ignored, these would change limiting: an error.
        # Counters in another Redis than the one asked for.
        ("CACHE_ALIAS", "throttle", 'REDIS_URL = "cache://<alias>"', "E041"),
        # Every client behind the proxy would share the proxy's counters.
        ("TRUSTED_PROXY_COUNT", 1, "TRUSTED_PROXIES = <count>", "E041"),
        # A network asked to be counted as one would get one bucket per address.
        ("IPV4_PREFIX", 24, "the constant 32", "E041"),
        ("IPV6_PREFIX", 48, "the constant 64", "E041"),
        # Keys sent in a header no longer read would be counted as anonymous callers.
        ("API_KEY_HEADERS", ["X-Custom-Key"], '("Authorization", "X-API-Key")', "E041"),
    ],
)
def test_a_removed_setting_still_set_names_its_replacement(
    settings: Any, name: str, value: Any, replacement: str, check_id: str
) -> None:
    """Upgrading is one read: each setting of earlier versions is named with what replaces
    it, never as a typo (W001); a warning (W004) when ignoring its value changes nothing, an
    error (E041) when limiting without it would differ from what it asked for."""
    serious = check_id.startswith("E")
    if serious:
        # Borrowing: no URL, so the default cache would be borrowed instead of the one named.
        settings.DJANGO_THROTTLE_REDIS_URL = None
        settings.CACHES = {
            "default": {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": "redis://127.0.0.1:6379/0",
            }
        }
    setattr(settings, f"DJANGO_THROTTLE_{name}", value)

    [found] = check_settings()

    assert found.id == f"django_throttle.{check_id}"
    assert found.is_serious() is serious
    assert f"DJANGO_THROTTLE_{name} = {value!r} is no longer a django-throttle setting" in (
        found.msg
    )
    assert replacement in found.msg
    assert f"Remove DJANGO_THROTTLE_{name}" in found.hint
    if serious:
        assert "and set its replacement" in found.hint


def test_manage_py_check_fails_on_a_proxy_count_left_from_an_earlier_version(
    settings: Any,
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXY_COUNT = 2

    with pytest.raises(SystemCheckError, match=r"django_throttle\.E041"):
        call_command("check")


def test_a_retired_check_id_is_never_given_to_another_check() -> None:
    """A check id of a removed setting (E045, ``LOAD_SIGNAL``) names no other problem: a
    project silencing it, or an answer found by it, never hides or means another."""
    from pathlib import Path

    from django_throttle.checks import RETIRED_IDS, SETTINGS

    package = Path(__file__).parent.parent / "django_throttle"
    source = "\n".join(path.read_text() for path in package.rglob("*.py"))
    assert "E045" in RETIRED_IDS
    for retired in RETIRED_IDS:
        assert f"django_throttle.{retired}" not in source
        assert retired not in {check_id for check_id, _, _ in SETTINGS}


def test_every_removed_setting_is_in_the_settings_reference() -> None:
    from pathlib import Path

    from django_throttle.conf import REMOVED

    page = (Path(__file__).parent.parent / "docs" / "reference" / "settings.rst").read_text()
    assert [name for name in REMOVED if f"DJANGO_THROTTLE_{name}``" not in page] == []


def test_a_removed_setting_that_was_moot_already_is_only_a_warning(settings: Any) -> None:
    """A borrowed cache beside a Redis URL, or a proxy count beside networks, was not read
    before either: nothing changes but the warning."""
    settings.DJANGO_THROTTLE_CACHE_ALIAS = "throttle"
    settings.DJANGO_THROTTLE_TRUSTED_PROXY_COUNT = 1
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = ["10.0.0.0/8"]

    assert ids() == ["django_throttle.W004", "django_throttle.W004"]


@pytest.mark.parametrize(
    ("name", "value", "also", "check_id"),
    [
        # The default backend: REDIS_URL already says where counting happens.
        ("BACKEND", REDIS, {}, "W004"),
        # Asked to count in the process, would count on Redis.
        ("BACKEND", MEMORY, {}, "E041"),
        # ... unless REDIS_URL says so too.
        ("BACKEND", MEMORY, {"REDIS_URL": "memory://"}, "W004"),
        # A custom backend would be replaced by the Redis one.
        ("BACKEND", "myproject.backends.Custom", {}, "E041"),
        # Shards are part of every key: another count is another layout of the counters.
        ("KEY_SHARDS", 4, {}, "E041"),
        ("KEY_SHARDS", 1, {}, "W004"),  # the default on a single Redis
        ("KEY_SHARDS", 4, {"REDIS_URL": "redis://127.0.0.1:6379/0?shards=4"}, "W004"),
        # Usage counted where the project turned it off.
        ("USAGE_ENABLED", False, {}, "E041"),
        ("USAGE_ENABLED", False, {"USAGE_RETENTION_DAYS": 0}, "W004"),
        ("USAGE_ENABLED", True, {}, "W004"),
    ],
)
def test_the_settings_folded_into_redis_url_and_usage_retention_name_their_replacement(
    settings: Any, name: str, value: Any, also: dict[str, Any], check_id: str
) -> None:
    """``BACKEND`` is ``REDIS_URL = "memory://"``, ``KEY_SHARDS`` its ``?shards=N`` and
    ``USAGE_ENABLED = False`` ``USAGE_RETENTION_DAYS = 0``: an error only where ignoring the
    old value would count differently than it asked for."""
    replacement = {
        "BACKEND": 'REDIS_URL = "memory://"',
        "KEY_SHARDS": '"?shards=N" query on REDIS_URL',
        "USAGE_ENABLED": "USAGE_RETENTION_DAYS = 0",
    }[name]
    for other, other_value in also.items():
        setattr(settings, f"DJANGO_THROTTLE_{other}", other_value)
    setattr(settings, f"DJANGO_THROTTLE_{name}", value)

    [message] = check_settings()

    assert message.id == f"django_throttle.{check_id}"
    assert f"DJANGO_THROTTLE_{name} = {value!r} is no longer" in message.msg
    assert replacement in message.msg


@pytest.mark.parametrize("module", ["django_throttle.drf", "django_throttle.decorators"])
def test_the_app_missing_from_installed_apps_is_named_when_its_faces_are_imported(
    module: str,
) -> None:
    """Without the app in INSTALLED_APPS none of its checks ran and no table existed:
    ``manage.py check`` passed and every request was served unlimited, with a log line per
    request. Importing ``PolicyThrottle`` or ``@throttle`` (as a URLconf does, under
    ``manage.py check`` too) now names the setting."""
    script = (
        "import django\n"
        "from django.conf import settings\n"
        "settings.configure(INSTALLED_APPS=['django.contrib.contenttypes', "
        "'django.contrib.auth', 'rest_framework'])\n"
        "django.setup()\n"
        "from django.core.exceptions import ImproperlyConfigured\n"
        "try:\n"
        f"    import {module}\n"
        "except ImproperlyConfigured as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.startswith(f"refused: {module} is imported")
    assert "add 'django_throttle' to INSTALLED_APPS" in done.stdout


def test_importing_the_drf_adapter_without_drf_names_the_install() -> None:
    """A project that installed the package without its ``[drf]`` extra and copied
    ``PolicyThrottle`` from the README got ``No module named 'rest_framework'`` from deep in
    the adapter's imports; the error now says what to install (or what to use instead)."""
    script = (
        "import sys\n"
        "sys.modules['rest_framework'] = None  # as in a virtualenv without DRF\n"
        "import django\n"
        "from django.conf import settings\n"
        "settings.configure(INSTALLED_APPS=['django.contrib.contenttypes', "
        "'django.contrib.auth', 'django_throttle'])\n"
        "django.setup()\n"
        "try:\n"
        "    import django_throttle.drf\n"
        "except ModuleNotFoundError as exc:\n"
        "    print('refused:', exc.name, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.startswith(
        "refused: rest_framework django_throttle.drf is imported, but Django REST framework is "
        "not installed: pip install 'django-throttle-policies[drf]'"
    ), done.stdout


# -- W009: DRF views throttled with no headers middleware ---------------------------------------

HEADERS_MIDDLEWARE = "django_throttle.middleware.RateLimitHeadersMiddleware"


def _without_headers_middleware(settings: Any) -> None:
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != HEADERS_MIDDLEWARE]


def headers_check() -> list[Any]:
    from django_throttle.checks import check_headers_middleware

    return check_headers_middleware()


def test_drf_throttle_in_settings_without_the_middleware_is_a_warning(settings: Any) -> None:
    _without_headers_middleware(settings)

    [warning] = headers_check()

    assert warning.id == "django_throttle.W009"
    assert "REST_FRAMEWORK['DEFAULT_THROTTLE_CLASSES']" in warning.msg
    assert "no X-RateLimit-* headers" in warning.msg
    assert f"Add '{HEADERS_MIDDLEWARE}' to MIDDLEWARE" in warning.hint


def test_a_subclass_of_the_drf_throttle_in_settings_is_seen(settings: Any) -> None:
    _without_headers_middleware(settings)
    settings.REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": ["django_throttle.drf.AsyncPolicyThrottle"]
    }

    assert [w.id for w in headers_check()] == ["django_throttle.W009"]


def test_drf_throttle_on_a_routed_view_without_the_middleware_is_a_warning(settings: Any) -> None:
    """Not in the settings, but in a view's ``throttle_classes``: the view is named."""
    _without_headers_middleware(settings)
    settings.REST_FRAMEWORK = {"DEFAULT_THROTTLE_CLASSES": []}
    settings.ROOT_URLCONF = "tests.checks_urls"

    [warning] = headers_check()

    assert warning.id == "django_throttle.W009"
    assert "the throttle_classes of tests.checks_urls.Throttled" in warning.msg


def test_decorated_views_only_need_no_middleware(settings: Any) -> None:
    """``@throttle`` writes its own headers: a project of decorated views is not warned."""
    _without_headers_middleware(settings)
    settings.REST_FRAMEWORK = {"DEFAULT_THROTTLE_CLASSES": []}
    settings.ROOT_URLCONF = "tests.checks_urls_decorated"

    assert headers_check() == []


@pytest.mark.parametrize("place", ["first", "last"])
def test_the_middleware_anywhere_silences_the_warning(settings: Any, place: str) -> None:
    _without_headers_middleware(settings)
    rest = list(settings.MIDDLEWARE)
    settings.MIDDLEWARE = (
        [HEADERS_MIDDLEWARE, *rest] if place == "first" else [*rest, HEADERS_MIDDLEWARE]
    )

    assert headers_check() == []


@pytest.mark.django_db
@pytest.mark.parametrize("place", ["first", "last", "none"])
def test_drf_headers_come_from_the_middleware_wherever_it_sits(
    settings: Any, client: Any, place: str
) -> None:
    """What W009 is about, seen by a client: no middleware, no headers; first or last in
    ``MIDDLEWARE``, the same headers (so the check asks for no particular place)."""
    from tests.factories import tier

    _without_headers_middleware(settings)
    rest = list(settings.MIDDLEWARE)
    settings.MIDDLEWARE = {
        "first": [HEADERS_MIDDLEWARE, *rest],
        "last": [*rest, HEADERS_MIDDLEWARE],
        "none": rest,
    }[place]
    tier("anonymous", "1/m", burst=3, is_default_anonymous=True)

    response = client.get("/api/ping/")

    assert response.status_code == 200
    if place == "none":
        assert "X-RateLimit-Limit" not in response
    else:
        assert response["X-RateLimit-Limit"] == "3"


def test_manage_py_check_shows_the_missing_headers_middleware(settings: Any) -> None:
    _without_headers_middleware(settings)
    out = StringIO()

    call_command("check", stdout=out, stderr=out)

    assert "django_throttle.W009" in out.getvalue()


# -- W011: a guarded login view that an earlier URL pattern shadows -----------------------------


def shadow_check() -> list[Any]:
    from django_throttle.checks import check_shadowed_credential_views

    return check_shadowed_credential_views()


def test_guarded_admin_login_after_the_admin_urls_is_a_warning(settings: Any) -> None:
    """``path("admin/login/", protect_credentials(admin.site.login))`` after
    ``path("admin/", admin.site.urls)`` is never reached: wrong passwords on the admin's
    login went uncounted and nothing said so."""
    settings.ROOT_URLCONF = "tests.checks_urls_shadowed"

    [warning] = shadow_check()

    assert warning.id == "django_throttle.W011"
    assert "protect_credentials on '/admin/login/' never runs" in warning.msg
    assert "'admin:login'" in warning.msg
    assert "before path('admin/', admin.site.urls)" in warning.hint


def test_guarded_views_listed_first_are_not_warned(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.checks_urls_guarded"

    assert shadow_check() == []


def test_the_shadowed_login_is_named_by_manage_py_check(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.checks_urls_shadowed"
    out = StringIO()

    call_command("check", stdout=out, stderr=out)

    assert "django_throttle.W011" in out.getvalue()


# -- W012: metrics switched on without prometheus_client ----------------------------------------


def test_metrics_on_without_prometheus_client_is_a_warning(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DJANGO_THROTTLE_METRICS = True`` in a project installed without the ``[metrics]``
    extra passed every check while no metric was kept and ``/metrics`` said 404 "Metrics are
    off (DJANGO_THROTTLE_METRICS)" about a setting that was on."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    settings.DJANGO_THROTTLE_METRICS = True

    [warning] = [w for w in check_settings() if w.id == "django_throttle.W012"]

    assert "prometheus_client is not installed" in warning.msg
    assert "django-throttle-policies[metrics]" in warning.hint


def test_metrics_on_with_prometheus_client_or_off_pass(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DJANGO_THROTTLE_METRICS = True
    assert check_settings() == []

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    settings.DJANGO_THROTTLE_METRICS = False
    assert check_settings() == []


# -- W013: DRF's token view routed without protect_credentials ----------------------------------


def token_check() -> list[Any]:
    from django_throttle.checks import check_unguarded_token_views

    return check_unguarded_token_views()


def test_token_views_without_protect_credentials_are_a_warning(settings: Any) -> None:
    """DRF's ``ObtainAuthToken`` sets ``throttle_classes = ()``: ``PolicyThrottle`` in
    ``DEFAULT_THROTTLE_CLASSES`` never runs on it or a subclass, so a project moving from
    DRF's throttles had an unlimited password endpoint and ``manage.py check`` said nothing."""
    settings.ROOT_URLCONF = "tests.checks_urls_tokens"

    warnings = token_check()

    assert [w.id for w in warnings] == ["django_throttle.W013"] * 2
    bare, subclass = warnings
    assert "rest_framework.authtoken.views.ObtainAuthToken on '/api/token/'" in bare.msg
    assert "throttle_classes = ()" in bare.msg
    assert "protect_credentials(obtain_auth_token)" in bare.hint
    assert "tests.checks_urls_tokens.CustomToken on '/api/^token2/$'" in subclass.msg


def test_guarded_or_policy_throttled_token_views_are_not_warned(settings: Any) -> None:
    """Under ``protect_credentials`` (any scope), or with ``PolicyThrottle`` in the view's own
    ``throttle_classes``, the token view is limited."""
    settings.ROOT_URLCONF = "tests.checks_urls_tokens"

    text = " ".join(w.msg for w in token_check())

    assert "/api/token/" in text
    assert "guarded" not in text and "ThrottledToken" not in text


def test_an_unguarded_token_view_is_named_by_manage_py_check(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.checks_urls_tokens"
    out = StringIO()

    call_command("check", stdout=out, stderr=out)

    assert out.getvalue().count("django_throttle.W013") == 2


# -- W014: a guarded login view whose scope no enabled rule has -----------------------------------


def scope_check() -> list[Any]:
    from django_throttle.checks import check_credential_scopes

    return check_credential_scopes()


def scope_rule(pattern: str, enabled: bool = True) -> None:
    from django_throttle.models import EndpointRule

    EndpointRule.objects.create(
        name=pattern,
        match_type=EndpointRule.MatchType.SCOPE,
        pattern=pattern,
        counts=EndpointRule.Counts.FAILURES,
        enabled=enabled,
    )


@pytest.mark.django_db
def test_a_guarded_view_whose_scope_has_no_rule_is_a_warning(settings: Any) -> None:
    """The login how-to makes a rule of scope ``login`` and routes the admin's login as
    ``protect_credentials(admin.site.login, scope="admin-login")``: followed as written, wrong
    admin passwords went uncounted (7 x 200 from one address under a 5/min rule) and
    ``manage.py check`` said "no issues"."""
    settings.ROOT_URLCONF = "tests.checks_urls_guarded"
    scope_rule("login")
    scope_rule("admin-login", enabled=False)

    [warning] = scope_check()

    assert warning.id == "django_throttle.W014"
    assert "protect_credentials on '/admin/login/'" in warning.msg
    assert "scope 'admin-login', but no enabled rule has that scope" in warning.msg
    assert "enabled scopes: 'login'" in warning.msg
    assert "pattern 'admin-login'" in warning.hint


@pytest.mark.django_db
def test_guarded_views_whose_scopes_have_rules_or_no_rules_yet_pass(settings: Any) -> None:
    """A fresh (or test) database with no rules is not warned about; with a rule for every
    guarded scope nothing is."""
    settings.ROOT_URLCONF = "tests.checks_urls_guarded"
    assert scope_check() == []

    scope_rule("login")
    scope_rule("admin-login")

    assert scope_check() == []


@pytest.mark.django_db
def test_protected_authentication_without_its_rule_is_a_warning(settings: Any) -> None:
    """``ProtectedBasicAuthentication`` counts the rules of scope ``authentication``: listed
    with only a ``login`` rule made, every Basic password was hashed and checked, uncounted."""
    settings.ROOT_URLCONF = "tests.checks_urls_guarded"
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_AUTHENTICATION_CLASSES": [
            "rest_framework.authentication.SessionAuthentication",
            "django_throttle.drf.ProtectedBasicAuthentication",
            "no.such.Authentication",  # DRF reports it; the check passes over it
        ],
    }
    scope_rule("login")
    scope_rule("admin-login")

    [warning] = scope_check()

    assert warning.msg.startswith(
        "ProtectedBasicAuthentication in DEFAULT_AUTHENTICATION_CLASSES checks the endpoint "
        "rules of scope 'authentication', but no enabled rule has that scope"
    )

    scope_rule("authentication")
    assert scope_check() == []


@pytest.mark.django_db
def test_a_scope_without_a_rule_is_named_by_manage_py_check(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.checks_urls_guarded"
    scope_rule("login")
    out = StringIO()

    call_command("check", stdout=out, stderr=out)

    assert "django_throttle.W014" in out.getvalue()


@pytest.mark.django_db
def test_guarded_views_without_any_rule_are_named_before_a_deploy(settings: Any) -> None:
    """A project that guards its logins and never made a rule counts nothing there: the plain
    check stays quiet on such a database (every fresh or test database is one), ``check
    --deploy`` names each guarded scope."""
    from django_throttle.checks import check_credential_scopes_before_deploy

    settings.ROOT_URLCONF = "tests.checks_urls_guarded"
    assert scope_check() == []

    warnings = check_credential_scopes_before_deploy()

    assert warnings and {w.id for w in warnings} == {"django_throttle.W014"}
    assert all("(enabled scopes: none)" in w.msg for w in warnings)
    out = StringIO()
    call_command("check", "--deploy", stdout=out, stderr=out)
    assert "django_throttle.W014" in out.getvalue()

    scope_rule("login")  # from here on the plain check names what is missing, once
    assert check_credential_scopes_before_deploy() == []


# -- W015: DRF's token view routed without rest_framework.authtoken ------------------------------


def token_app_check() -> list[Any]:
    from django_throttle.checks import check_token_app

    return check_token_app()


def test_a_token_view_without_the_authtoken_app_is_a_warning(settings: Any) -> None:
    """The login how-to's URLconf routes ``obtain_auth_token``; in a project made by
    ``startproject`` without ``rest_framework.authtoken`` the URLconf imports, ``manage.py
    check`` said "no issues", and the first correct password was a 500 ("type object 'Token'
    has no attribute 'objects'")."""
    settings.ROOT_URLCONF = "tests.checks_urls_tokens"
    settings.INSTALLED_APPS = [
        app for app in settings.INSTALLED_APPS if app != "rest_framework.authtoken"
    ]

    warnings = token_app_check()

    assert warnings and {w.id for w in warnings} == {"django_throttle.W015"}
    assert any(
        "ObtainAuthToken on '/api/token/' needs 'rest_framework.authtoken'" in w.msg
        for w in warnings
    )
    assert "INSTALLED_APPS" in warnings[0].hint


def test_a_token_view_with_the_authtoken_app_passes(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.checks_urls_tokens"

    assert token_app_check() == []


# -- W016: a login view routed without protect_credentials ---------------------------------------


def test_login_views_without_protect_credentials_are_a_warning(settings: Any) -> None:
    """The admin's login and DRF's browsable-API login (``include("rest_framework.urls")``,
    the DRF tutorial's) served unguarded beside guarded ones: every guess there was checked
    and never counted, so a locked account's password was still tried there, and
    ``manage.py check`` said nothing. A login guarded before the include that also routes
    it, and a ``LoginView`` under ``@throttle``, are not warned."""
    from django_throttle.checks import check_unguarded_login_views

    settings.ROOT_URLCONF = "tests.checks_urls_logins"

    warnings = check_unguarded_login_views()

    assert [w.id for w in warnings] == ["django_throttle.W016"] * 2
    admin_login, drf_login = warnings
    assert "The login of admin site 'admin' on '/admin/login/'" in admin_login.msg
    assert "protect_credentials(admin.site.login)" in admin_login.hint
    assert "django.contrib.auth.views.LoginView on '/api-auth/login/'" in drf_login.msg
    assert "path('api-auth/login/', protect_credentials(…))" in drf_login.hint


def test_a_project_guarding_no_login_is_not_warned_about_its_login_views(settings: Any) -> None:
    """W016 is for a project that guards some logins and left others open: one that guards
    none (the tutorial's, an API-only project) got it on every ``manage.py`` command for the
    admin's login."""
    from django_throttle.checks import check_unguarded_login_views

    settings.ROOT_URLCONF = "tests.checks_urls_admin_only"
    assert check_unguarded_login_views() == []


def test_guarded_login_views_are_not_warned(settings: Any) -> None:
    from django_throttle.checks import check_unguarded_login_views

    settings.ROOT_URLCONF = "tests.checks_urls_guarded"

    assert check_unguarded_login_views() == []


# -- W010 per view: DRF's throttles left in a view's own throttle_classes ------------------------


def drf_views_check() -> list[Any]:
    from django_throttle.checks import check_drf_throttled_views

    return check_drf_throttled_views()


def test_drf_throttles_left_on_a_view_are_a_warning(settings: Any) -> None:
    """A view's ``throttle_classes = [ScopedRateThrottle]`` replaces the default list: after
    ``from-drf --apply`` and ``PolicyThrottle`` in the settings, the admin's rule for its scope
    never applied to it and DRF still refused by its own rate, silently."""
    settings.ROOT_URLCONF = "tests.checks_urls_tokens"

    [warning] = drf_views_check()

    assert warning.id == "django_throttle.W010"
    assert "tests.checks_urls_tokens.Uploads (on '/api/uploads/')" in warning.msg
    assert "DRF's ScopedRateThrottle, UserRateThrottle" in warning.msg
    assert "throttle_classes = [PolicyThrottle]" in warning.hint


def test_views_that_inherit_a_half_migrated_default_list_are_not_named(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With DRF's throttle left next to ``PolicyThrottle`` in ``DEFAULT_THROTTLE_CLASSES``
    (the settings' W010), DRF's ``APIView.throttle_classes`` is that list, read when DRF was
    imported: a view that sets no ``throttle_classes`` of its own inherits it and must not be
    named as one that "sets throttle_classes" (the example project got one such warning per
    routed DRF view). The view that does set DRF's throttles is still named, once."""
    from rest_framework.throttling import AnonRateThrottle
    from rest_framework.views import APIView

    from django_throttle.drf import PolicyThrottle

    settings.ROOT_URLCONF = "tests.checks_urls_tokens"
    settings.REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": [
            "django_throttle.drf.PolicyThrottle",
            "rest_framework.throttling.AnonRateThrottle",
        ],
        "DEFAULT_THROTTLE_RATES": {"anon": "100/day"},
    }
    # What DRF's import did with these settings: the class attribute is the default list.
    monkeypatch.setattr(APIView, "throttle_classes", [PolicyThrottle, AnonRateThrottle])

    warnings = drf_views_check()

    assert [w.msg.split(" (on ")[0] for w in warnings] == ["tests.checks_urls_tokens.Uploads"]


def test_drf_throttles_on_views_before_the_migration_are_not_warned(settings: Any) -> None:
    """A project still on DRF's throttles (no ``PolicyThrottle`` in the settings) is not told
    off."""
    settings.ROOT_URLCONF = "tests.checks_urls_tokens"
    settings.REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.AnonRateThrottle"],
        "DEFAULT_THROTTLE_RATES": {"anon": "100/day", "uploads": "2/min"},
    }

    assert drf_views_check() == []
