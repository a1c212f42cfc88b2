"""System checks: one per ``DJANGO_THROTTLE_*`` setting, ids ``django_throttle.E002``…, one
(W004, or E041 where ignoring it weakens limiting) per setting of earlier versions still set,
naming what replaces it, one (W001) for a ``DJANGO_THROTTLE_*`` name that is no setting, and
the checks that read stored rows (E101…E105, W106, W003, W005, W020), and W009: DRF views
throttled with no headers middleware. :func:`register`
(called from the app's ``ready()``) registers them all.

Checks read the raw settings (not :mod:`conf`, which converts types) so a bad value is
reported with its name instead of crashing at first use: no database, no Redis, and no import
of rows when this module is imported (the checks on stored rows import them when they run).

Its sections:

- the settings checks: each setting that is set against its validator (E002…),
  ``REDIS_URL``'s ``?shards=`` (E042), the settings that must agree with each other (E018
  the Redis source, W002 proxy trust, W010 DRF's own throttles beside ours), the removed
  settings (W004, E041), and W001;
- what each setting may hold: one validator per setting, and the table :data:`SETTINGS`;
- the checks on stored rows (E101…E105, W106, W003, W005, W020), and W009 (DRF views
  throttled without the headers middleware), which reads the URLconf.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable
from itertools import chain
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.core import checks
from django.core.exceptions import FieldError
from django.db import DatabaseError, transaction
from django.utils.module_loading import import_string

from django_throttle.conf import (
    DEFAULT_CACHE_ALIAS,
    NAMES,
    PREFIX,
    REGION_GEOIP,
    REGION_HEADER_NAME,
    REMOVED,
    SHARDS_RANGE,
    cache_alias,
    is_cache_url,
    is_memory_url,
    split_shards,
)
from django_throttle.redaction import redact_text


def register() -> None:
    checks.register(check_settings, checks.Tags.compatibility)
    checks.register(check_settling_middleware, checks.Tags.models)
    checks.register(check_concurrency_middleware, checks.Tags.models)
    checks.register(check_headers_middleware, checks.Tags.urls)
    checks.register(check_shadowed_credential_views, checks.Tags.urls)
    checks.register(check_unguarded_token_views, checks.Tags.urls)
    checks.register(check_unguarded_login_views, checks.Tags.urls)
    checks.register(check_credential_scopes, checks.Tags.urls)
    checks.register(check_credential_scopes_before_deploy, checks.Tags.security, deploy=True)
    checks.register(check_token_app, checks.Tags.urls)
    checks.register(check_drf_throttled_views, checks.Tags.urls)
    checks.register(check_credential_rules, checks.Tags.models)
    checks.register(check_rows, checks.Tags.models)
    # Reads the key table: runs with `manage.py check --database …` (and the test runner),
    # never breaks `check` on a machine without a database.
    checks.register(check_api_key_owners, checks.Tags.database)


# -- the settings checks -----------------------------------------------------------------------

_MISSING = object()
#: Django's own Redis cache: the backend builds its client from its LOCATION too.
DJANGO_REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"


def check_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for check_id, name, validate in SETTINGS:
        value = getattr(settings, PREFIX + name, _MISSING)
        problem = None if value is _MISSING else validate(value)
        if problem is not None:
            errors.append(
                checks.Error(
                    f"{PREFIX}{name} = {_shown(name, value)} {problem}.",
                    hint=f"Fix it, or remove it for its default: {PREFIX}{name} in the "
                    "django-throttle settings reference says what it holds and why.",
                    id=f"django_throttle.{check_id}",
                )
            )
    errors.extend(_check_url_shards())
    # A URL that is already wrong (E002, E042) names no cache to look for.
    url_wrong = any(error.id in _URL_ERRORS for error in errors)
    source = [] if url_wrong else _check_redis_source()
    # A connection is tried only from settings that passed their own checks.
    return [
        *errors,
        *(source or ([] if errors else _check_redis_options())),
        *_check_proxy_trust(),
        *_check_metrics_package(),
        *_check_regions(),
        *_check_removed(),
        *_check_unknown_names(),
        *_check_drf_lists(),
        *_check_drf_throttles(),
        *_check_middleware_once(),
    ]


def _check_middleware_once() -> list[checks.CheckMessage]:
    """W008: the headers middleware is in ``MIDDLEWARE`` more than once (a settings file
    that adds it to a list that has it already): each request is counted as that many busy
    requests by the worker's own load shedder, which then sheds at a fraction of its
    capacity."""
    middleware = getattr(settings, "MIDDLEWARE", None) or ()
    times = list(middleware).count(_MIDDLEWARE_PATH) if isinstance(middleware, (list, tuple)) else 0
    if times < 2:
        return []
    return [
        checks.Warning(
            f"{_MIDDLEWARE_PATH} is in MIDDLEWARE {times} times: every request counts "
            f"{times} times towards this worker's busy requests (service protection).",
            hint="Keep it once in MIDDLEWARE.",
            id="django_throttle.W008",
        )
    ]


#: DRF settings that name this app's classes (``PolicyThrottle``, the ``Protected*`` and API
#: key authentication classes): DRF reads each as a list of classes.
DRF_CLASS_LISTS = ("DEFAULT_THROTTLE_CLASSES", "DEFAULT_AUTHENTICATION_CLASSES")


def _check_drf_lists() -> list[checks.CheckMessage]:
    """E046: one of DRF's class lists is a single string; DRF imports it as one class and
    every request to every DRF view fails (a 500) when it iterates over it."""
    drf = getattr(settings, "REST_FRAMEWORK", None)
    if not isinstance(drf, dict):
        return []
    return [
        checks.Error(
            f"REST_FRAMEWORK[{key!r}] = {drf[key]!r} is a string, but DRF reads a list of "
            "classes: every request to a DRF view would fail.",
            hint=f"Make it a list: {key!r}: [{drf[key]!r}].",
            id="django_throttle.E046",
        )
        for key in DRF_CLASS_LISTS
        if isinstance(drf.get(key), str)
    ]


#: DRF's own rate throttles, which ``throttle_policy from-drf`` turns into tiers and rules.
DRF_THROTTLES = (
    "rest_framework.throttling.AnonRateThrottle",
    "rest_framework.throttling.UserRateThrottle",
    "rest_framework.throttling.ScopedRateThrottle",
)
_POLICY_THROTTLE = "django_throttle.drf.PolicyThrottle"


def _check_drf_throttles() -> list[checks.CheckMessage]:
    """W010: ``PolicyThrottle`` shares ``DEFAULT_THROTTLE_CLASSES`` with DRF's own rate
    throttles (a migration left half done): DRF still refuses by its
    ``DEFAULT_THROTTLE_RATES``, counted apart and without the admin's tiers, whatever the
    admin says."""
    drf = getattr(settings, "REST_FRAMEWORK", None)
    classes = drf.get("DEFAULT_THROTTLE_CLASSES") if isinstance(drf, dict) else None
    if not isinstance(classes, (list, tuple)) or _POLICY_THROTTLE not in classes:
        return []
    left = [name for name in classes if name in DRF_THROTTLES]
    if not left:
        return []
    names = ", ".join(name.rpartition(".")[2] for name in left)
    return [
        checks.Warning(
            f"REST_FRAMEWORK['DEFAULT_THROTTLE_CLASSES'] has DRF's {names} next to "
            f"{_POLICY_THROTTLE}: DRF still refuses requests by its DEFAULT_THROTTLE_RATES, "
            "counted apart from the admin's tiers, whatever the admin allows.",
            hint="Remove DRF's throttle classes from the list; 'manage.py throttle_policy "
            "from-drf --apply' turns their rates into tiers and rules first.",
            id="django_throttle.W010",
        )
    ]


#: The checks of ``REDIS_URL`` itself: after one of them no connection is tried.
_URL_ERRORS = frozenset({"django_throttle.E002", "django_throttle.E042"})


def _check_url_shards() -> list[checks.CheckMessage]:
    """E042: ``REDIS_URL``'s ``?shards=`` is not a count of key shards (1-1024); the keys
    would be spread by the default instead of the count the project asked for."""
    value = getattr(settings, PREFIX + "REDIS_URL", None)
    problem = url_shards(value)
    if problem is None:
        return []
    return [
        checks.Error(
            f"{PREFIX}REDIS_URL = {_shown('REDIS_URL', value)} {problem}.",
            hint="Write '?shards=N' with N from 1 to 1024 (e.g. "
            "'redis+cluster://host:7000?shards=32'), or remove it for the default: 16 on a "
            "Redis Cluster, else 1.",
            id="django_throttle.E042",
        )
    ]


def _check_removed() -> list[checks.CheckMessage]:
    """W004: a setting of an earlier version is still set and now changes nothing; E041 when
    ignoring its value lets more requests through, or counts clients together, than the
    project asked for. Both name what replaces it, so upgrading is one read."""
    found: list[checks.CheckMessage] = []
    for name, removed in REMOVED.items():
        value = getattr(settings, PREFIX + name, _MISSING)
        if value is _MISSING:
            continue
        weakens = removed.weakens(value)
        kind = checks.Error if weakens else checks.Warning
        found.append(
            kind(
                f"{PREFIX}{name} = {_shown(name, value)} is no longer a django-throttle "
                "setting"
                + (", and limiting without it differs from what it asked for." if weakens else ".")
                + f" It is replaced by {removed.replacement}.",
                hint=f"Remove {PREFIX}{name}"
                + (" and set its replacement." if weakens else " (or set its replacement)."),
                id="django_throttle.E041" if weakens else "django_throttle.W004",
            )
        )
    return found


def _check_unknown_names() -> list[checks.CheckMessage]:
    """W001: a ``DJANGO_THROTTLE_*`` name that is no setting of this app, most likely a typo:
    the setting meant keeps its default without a word."""
    warnings: list[checks.CheckMessage] = []
    grouped = getattr(settings, PREFIX.rstrip("_"), _MISSING)
    if grouped is not _MISSING:  # DJANGO_THROTTLE = {"REDIS_URL": …}, as other apps take them
        keys = grouped if isinstance(grouped, dict) else {}
        names = [f"{PREFIX}{key}" for key in keys if isinstance(key, str)]
        warnings.append(
            checks.Warning(
                f"{PREFIX.rstrip('_')} is not a django-throttle setting, so it changes nothing: "
                f"each setting is one of its own, named {PREFIX}<NAME>.",
                hint=(f"Set {', '.join(names)} instead." if names else "Remove it.")
                + " The settings reference in the django-throttle docs lists every setting.",
                id="django_throttle.W001",
            )
        )
    for full_name in dir(settings):
        name = full_name.removeprefix(PREFIX)
        if name == full_name or name in NAMES or name in REMOVED:
            continue
        meant = difflib.get_close_matches(name, NAMES, n=1, cutoff=0.8)
        warnings.append(
            checks.Warning(
                f"{full_name} is not a django-throttle setting, so it changes nothing.",
                hint=f"Did you mean {PREFIX}{meant[0]}?"
                if meant
                else "Remove it; the settings reference in the django-throttle docs lists "
                "every setting.",
                id="django_throttle.W001",
            )
        )
    return warnings


#: Settings whose value is a secret: a check names them but never shows the value.
SECRET_SETTINGS = frozenset({"API_KEY_SECRET"})


def _shown(name: str, value: Any) -> str:
    """``value`` as a check may show it: a secret hidden, a URL's password masked."""
    if name in SECRET_SETTINGS:
        return "<hidden>" if not isinstance(value, str) else f"<hidden, {len(value)} characters>"
    return redact_text(repr(value))


def _check_redis_source() -> list[checks.CheckMessage]:
    """E018: the Redis backend needs a URL or a django-redis cache to borrow a client from."""
    url = getattr(settings, PREFIX + "REDIS_URL", None)
    alias = cache_alias(url) if url else DEFAULT_CACHE_ALIAS
    if alias is None:  # a Redis URL, or memory://
        return []
    cache = getattr(settings, "CACHES", {}).get(alias, {})
    backend_path = str(cache.get("BACKEND", ""))
    if backend_path.startswith("django_redis.") or backend_path == DJANGO_REDIS_CACHE:
        return []
    return [
        checks.Error(
            "The Redis backend has no Redis: DJANGO_THROTTLE_REDIS_URL borrows "
            f"CACHES[{alias!r}] (cache://{alias}), which is neither a django-redis cache nor "
            "Django's RedisCache.",
            hint="Set DJANGO_THROTTLE_REDIS_URL = 'redis://…' or 'cache://<a django-redis "
            "cache>', or 'memory://' to count in a single process.",
            id="django_throttle.E018",
        )
    ]


def _check_redis_options() -> list[checks.CheckMessage]:
    """E040: redis-py cannot make a connection with the options given (an option its
    connections do not take, a borrowed cache it cannot read): every counting call would fail
    and take the failure mode."""
    if is_memory_url(getattr(settings, PREFIX + "REDIS_URL", None)):
        return []
    from django_throttle.backends.redis_clients import option_problem

    problem = option_problem()
    if problem is None:
        return []
    return [
        checks.Error(
            "The Redis backend cannot make a connection with its settings (URL, cache and "
            f"DJANGO_THROTTLE_REDIS_OPTIONS): {redact_text(problem).rstrip('.')}.",
            hint="Give only options of redis-py's connections (socket_timeout, ssl_ca_certs, "
            "...); TLS is turned on by a rediss:// URL, not by an 'ssl' option.",
            id="django_throttle.E040",
        )
    ]


def _check_regions() -> list[checks.CheckMessage]:
    """E044: ``REGION_SOURCE = "geoip"`` without a GeoIP2 database that opens (every client
    would meet the default limits); W007: a region header with no trusted proxy is never
    read."""
    source = getattr(settings, PREFIX + "REGION_SOURCE", None)
    if not isinstance(source, str):
        return []
    if source.strip().lower() == REGION_GEOIP:
        from django_throttle.policy.live import open_geoip

        _reader, problem = open_geoip()
        if problem:
            return [
                checks.Error(
                    f"{PREFIX}REGION_SOURCE = 'geoip' but {problem}.",
                    hint="Install geoip2 and set GEOIP_PATH to a GeoIP2 (or GeoLite2) Country "
                    "or City database, or unset REGION_SOURCE.",
                    id="django_throttle.E044",
                )
            ]
    elif not getattr(settings, PREFIX + "TRUSTED_PROXIES", None):
        return [
            checks.Warning(
                f"{PREFIX}REGION_SOURCE = {source!r} is never read: the header is believed "
                "only from a trusted proxy, and none is configured.",
                hint=f"Set {PREFIX}TRUSTED_PROXIES to your edge proxies' networks (or count).",
                id="django_throttle.W007",
            )
        ]
    return []


def _check_proxy_trust() -> list[checks.CheckMessage]:
    """W002: a client IP header with no trusted proxy is never read."""
    trusted = getattr(settings, PREFIX + "TRUSTED_PROXIES", None)
    header = getattr(settings, PREFIX + "CLIENT_IP_HEADER", None)
    if header and header_name(header) is None and not trusted:
        return [
            checks.Warning(
                f"{PREFIX}CLIENT_IP_HEADER = {header!r} is never read: no trusted proxy is "
                "configured, so every request is counted by REMOTE_ADDR.",
                hint=f"Set {PREFIX}TRUSTED_PROXIES to your proxies' networks (or their "
                "count), or remove CLIENT_IP_HEADER.",
                id="django_throttle.W002",
            )
        ]
    return []


def _check_metrics_package() -> list[checks.CheckMessage]:
    """W012: metrics switched on without prometheus_client are silently off."""
    if getattr(settings, PREFIX + "METRICS", False) is not True:
        return []
    from django_throttle.metrics import available

    if available():
        return []
    return [
        checks.Warning(
            f"{PREFIX}METRICS = True but prometheus_client is not installed: no metric is "
            "kept and metrics_view answers 404.",
            hint="pip install 'django-throttle-policies[metrics]' (or prometheus-client), "
            f"or remove {PREFIX}METRICS.",
            id="django_throttle.W012",
        )
    ]


# -- what each setting may hold ----------------------------------------------------------------
# What each ``DJANGO_THROTTLE_*`` setting may hold: one validator per setting and the table
# :data:`SETTINGS` of (check id, setting name, validator) that :func:`check_settings` runs and
# the docs' settings reference reads.
#
# A validator takes the raw value and returns what is wrong with it as a phrase ("must be …"),
# or ``None``; it never raises and never converts (that is :mod:`django_throttle.conf`'s job).

Validator = Callable[[Any], str | None]


def _instance(kind: type, problem: str) -> Validator:
    def validate(value: Any) -> str | None:
        return None if isinstance(value, kind) else problem

    return validate


def _int_range(low: int, high: int | None = None) -> Validator:
    def validate(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return "must be a whole number"
        if value < low or (high is not None and value > high):
            return f"must be between {low} and {high}" if high is not None else f"must be ≥ {low}"
        return None

    return validate


def _dotted() -> Validator:
    """A dotted path to a callable."""

    def validate(value: Any) -> str | None:
        if not isinstance(value, str):
            return "must be a dotted import path"
        try:
            obj = import_string(value)
        except ImportError as exc:
            return f"cannot be imported ({exc})"
        return None if callable(obj) else "must name a callable"

    return validate


def _optional(validate: Validator) -> Validator:
    """``validate``, but ``None`` (the default for some: not used) is fine."""

    def optional(value: Any) -> str | None:
        return None if value is None else validate(value)

    return optional


def _redis_url(value: Any) -> str | None:
    from django_throttle.backends.redis_clients import (
        CLUSTER_SCHEMES,
        VALKEY_SCHEMES,
        parse_cluster_url,
        parse_sentinel_url,
    )
    from django_throttle.backends.redis_clients import SENTINEL_SCHEMES as SCHEMES

    if value is None or value == "":  # unset, e.g. os.environ.get("REDIS_URL", "")
        return None
    if isinstance(value, str):
        value = split_shards(value.strip())[0]  # ?shards= is its own check (E042)
    if is_memory_url(value):
        return None if value.strip().lower() == "memory://" else "must be just 'memory://'"
    if is_cache_url(value):
        alias = cache_alias(value)
        return None if alias and "/" not in alias else "must name one cache: 'cache://<alias>'"
    scheme = value.partition("://")[0].lower() if isinstance(value, str) else None
    if scheme in SCHEMES:
        try:
            parse_sentinel_url(value)
        except ValueError as exc:
            return str(exc)
        return None
    if scheme in CLUSTER_SCHEMES:
        try:
            parse_cluster_url(value)
        except ValueError as exc:
            return str(exc)
        return None
    if scheme not in {"redis", "rediss", "unix", *VALKEY_SCHEMES}:
        return (
            "must be None, a URL such as 'redis://127.0.0.1:6379/0' (redis, rediss, unix, "
            "valkey, valkeys), 'redis+sentinel://host:26379,host:26379/mymaster' "
            "(redis+sentinel, valkey+sentinel) or 'redis+cluster://host:7000,host:7001' "
            "(redis+cluster, rediss+cluster, valkey+cluster, valkeys+cluster), "
            "'cache://<alias>' to borrow a Redis cache in CACHES, or 'memory://' to count in "
            "the process"
        )
    try:
        parts = urlsplit(value)
    except ValueError:  # redis-py cannot read it either: E040 names it
        return None
    if scheme == "unix":
        return None
    try:
        parts.port  # noqa: B018 - reading it is the check: ValueError for a bad port
    except ValueError:
        return (
            "has a port that is no number from 1 to 65535: write the server as host:port, "
            "such as 'redis://127.0.0.1:6379/0'"
        )
    path = parts.path
    database = unquote(path).replace("/", "")
    if database and not database.isdigit():  # redis-py would count in database 0 instead
        return (
            "ends with a database that is no number, so redis-py would use database 0: end "
            "it with the database's number, such as '/0'"
        )
    return None


def url_shards(value: Any) -> str | None:
    """What is wrong with the ``?shards=`` of a ``REDIS_URL`` (E042), or ``None``: absent,
    or a whole number in :data:`~django_throttle.conf.SHARDS_RANGE`."""
    if not isinstance(value, str):
        return None
    shards = split_shards(value.strip())[1]
    if shards is None or (shards.isdigit() and int(shards) in SHARDS_RANGE):
        return None
    return (
        f"asks for shards={shards!r}: the key shards must be a whole number from "
        f"{SHARDS_RANGE.start} to {SHARDS_RANGE.stop - 1}"
    )


def _key_prefix(value: Any) -> str | None:
    if not isinstance(value, str) or not value or any(c in value for c in "{} \t\r\n"):
        return "must be non-empty text without braces or whitespace"
    return None


def _choice(*choices: Any) -> Validator:
    def validate(value: Any) -> str | None:
        ok = value in choices and not isinstance(value, bool)
        return None if ok else "must be " + " or ".join(repr(c) for c in choices)

    return validate


def _trusted_proxies(value: Any) -> str | None:
    shape = (
        "must be a count of proxies (0-32), or a list of their networks such as "
        "['10.0.0.0/8', '2001:db8::/32']"
    )
    if isinstance(value, int) and not isinstance(value, bool):
        return None if 0 <= value <= 32 else shape
    if not isinstance(value, (list, tuple, set, frozenset)):
        return shape
    for entry in value:
        if not isinstance(entry, str):
            return f"has {entry!r}, which is not text such as '10.0.0.0/8'"
        try:
            ipaddress.ip_network(entry)
        except ValueError:
            try:
                meant = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                return f"has {entry!r}, which is not an IP network such as '10.0.0.0/8'"
            return f"has {entry!r}, which has host bits set (did you mean {str(meant)!r}?)"
    return None


_HEADER_NAME = re.compile(r"[A-Za-z0-9-]+")
#: Headers that carry a list or pairs, not the one address ``CLIENT_IP_HEADER`` expects.
_NOT_ONE_ADDRESS = {
    "x-forwarded-for": "is a list: trust it with TRUSTED_PROXIES (a count or networks) instead",
    "forwarded": "holds for=/by= pairs, not one address",
}


def header_name(value: Any) -> str | None:
    if not isinstance(value, str) or not _HEADER_NAME.fullmatch(value):
        return (
            "must be None or a header name as sent, such as 'X-Real-IP' (letters, digits and "
            "'-'; Django reads it as HTTP_X_REAL_IP, and servers drop names with '_')"
        )
    return _NOT_ONE_ADDRESS.get(value.lower())


def _api_key_secret(value: Any) -> str | None:
    if not isinstance(value, str) or len(value) < 32:
        return (
            "must be a string of at least 32 characters (API keys are stored as its HMAC); "
            "leave it unset to use SECRET_KEY"
        )
    return None


def _region_source(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        kind, mark, header = value.strip().partition(":")
        if value.strip().lower() == "geoip":
            return None
        if (
            mark
            and kind.strip().lower() == "header"
            and REGION_HEADER_NAME.fullmatch(header.strip())
        ):
            return None
    return (
        "must be None, 'geoip' (the GeoIP2 database of GEOIP_PATH) or 'header:<Header-Name>' "
        "such as 'header:CF-IPCountry' (a header set by a trusted proxy)"
    )


_BOOL = _instance(bool, "must be True or False")
#: Ids of checks on settings this app no longer has: never given to another check, so a
#: project's ``SILENCED_SYSTEM_CHECKS`` or an old answer found by the id never means another
#: problem. E045 checked ``LOAD_SIGNAL`` (now ``manage.py throttle_adapt --signal``).
RETIRED_IDS = frozenset({"E045"})
#: (check id, setting name, validator). Only settings that are set are validated.
SETTINGS: tuple[tuple[str, str, Validator], ...] = (
    ("E002", "REDIS_URL", _redis_url),
    ("E003", "REDIS_OPTIONS", _instance(dict, "must be a dict of redis-py client options")),
    ("E005", "KEY_PREFIX", _key_prefix),
    ("E006", "FAILURE_MODE", _choice("open", "closed", "local")),
    ("E010", "IDENTITY_RESOLVER", _dotted()),
    ("E013", "IETF_HEADERS", _BOOL),
    ("E016", "USAGE_RETENTION_DAYS", _int_range(0)),
    ("E017", "ENABLED", _BOOL),
    # E018 is the Redis source check below.
    ("E030", "TRUSTED_PROXIES", _optional(_trusted_proxies)),
    ("E031", "CLIENT_IP_HEADER", _optional(header_name)),
    ("E034", "API_KEY_SECRET", _api_key_secret),
    ("E043", "REGION_SOURCE", _region_source),
    ("E036", "DENIED_RESPONSE", _optional(_dotted())),
    ("E039", "METRICS", _BOOL),
)


# -- the checks on stored rows -----------------------------------------------------------------
# The checks that read stored rows: every policy row the compiler would skip (E101…E105)
# and every limit row repeating another (W106), rules that count only successes or failures
# without the settling middleware (W003), a credential rule that limits some tiers only (W005)
# and an active API key owned by a superuser or staff user (W020).
#
# Rows written around the admin (fixtures, SQL, ``QuerySet.update``) can hold values the admin
# refuses: the compiler skips such a row and logs it, and E101…E105 make it visible before a
# deploy. Each check reads in a savepoint and reports nothing when the tables or the database
# are missing, so ``manage.py check`` never breaks before ``migrate``.

_MIDDLEWARE_PATH = "django_throttle.middleware.RateLimitHeadersMiddleware"
#: Check id of a policy row the compiler skips, per model.
_ROW_CHECK_IDS = {
    "Tier": "django_throttle.E101",
    "TierLimit": "django_throttle.E102",
    "EndpointRule": "django_throttle.E103",
    "EndpointLimit": "django_throttle.E104",
    "Exemption": "django_throttle.E105",
}
_Read = TypeVar("_Read")


def _read(
    alias: str, read: Callable[[], _Read], missing: tuple[type[Exception], ...] = (Exception,)
) -> _Read | None:
    """``read()`` in a savepoint (a missing table cannot break a surrounding transaction);
    ``None`` when it raises one of ``missing``: by default anything, as with no tables yet, no
    database, or database access refused (test runners)."""
    try:
        with transaction.atomic(using=alias):
            return read()
    except missing:
        return None


def check_rows(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E101…E105: a policy row the compiler skips, naming the row, the field and the fix;
    W106: a limit row repeating an earlier one of the same tier or rule (same counter: see
    ``duplicate_key``), which the compiler counts once but an operator should delete."""
    from django_throttle.models import EndpointLimit, EndpointRule, Exemption, Tier, TierLimit
    from django_throttle.policy.files import repeats

    querysets = (
        Exemption.objects.all(),
        Tier.objects.all(),
        TierLimit.objects.select_related("tier"),
        EndpointRule.objects.all(),
        EndpointLimit.objects.select_related("rule", "tier"),
    )
    tables: list[list[Any]] | None = _read(
        Tier.objects.db, lambda: [list(rows.order_by("pk")) for rows in querysets]
    )
    if tables is None:
        return []
    messages: list[checks.CheckMessage] = []
    for row in chain.from_iterable(tables):
        if problems := row.row_problems():
            model = type(row).__name__
            what = "; ".join(f"{field}: {reason}" for field, reason in problems.items())
            messages.append(
                checks.Error(
                    f"{model} pk={row.pk} cannot be used, so the throttle policy skips it: {what}.",
                    hint=f"Correct or delete it in the admin ({model} {row.pk}).",
                    obj=row,
                    id=_ROW_CHECK_IDS[model],
                )
            )
    for row, original in chain(repeats(tables[2]), repeats(tables[4])):
        model = type(row).__name__
        parent = f"tier '{row.tier.slug}'" if model == "TierLimit" else f"rule '{row.rule.name}'"
        messages.append(
            checks.Warning(
                f"{model} pk={row.pk} repeats {model} pk={original.pk} of {parent} "
                f"({row}): the policy counts that limit once and ignores the copy.",
                hint=f"Delete one of them in the admin ({parent}).",
                obj=row,
                id="django_throttle.W106",
            )
        )
    return messages


def check_settling_middleware(**kwargs: Any) -> list[checks.CheckMessage]:
    """W003: a rule counts only successes or failures, but DRF views' reservations are given
    back by the middleware, which is not installed (``@throttle`` settles by itself)."""
    if _MIDDLEWARE_PATH in (getattr(settings, "MIDDLEWARE", None) or ()):
        return []
    from django_throttle.models import EndpointRule

    rules = EndpointRule.objects.filter(enabled=True).exclude(counts=EndpointRule.Counts.ALL)
    names = _read(EndpointRule.objects.db, lambda: list(rules.values_list("name", flat=True)[:5]))
    if not names:
        return []
    return [
        checks.Warning(
            f"Endpoint rules count only successes or failures ({', '.join(names)}), but "
            f"{_MIDDLEWARE_PATH} is not in MIDDLEWARE: DRF views under them count every "
            "request.",
            hint=f"Add '{_MIDDLEWARE_PATH}' to MIDDLEWARE (it gives back the tokens of "
            "requests the rule does not count), or set the rules' 'counts' to 'all'.",
            id="django_throttle.W003",
        )
    ]


def check_concurrency_middleware(**kwargs: Any) -> list[checks.CheckMessage]:
    """W006: a concurrency limit is set, but DRF views give their slots back through the
    middleware, which is not installed (``@throttle`` gives its own back)."""
    if _MIDDLEWARE_PATH in (getattr(settings, "MIDDLEWARE", None) or ()):
        return []
    from django_throttle.models import EndpointLimit, Protection, TierLimit
    from django_throttle.rates import Algorithm

    def read() -> list[str]:
        rules = EndpointLimit.objects.filter(algorithm=Algorithm.CONCURRENCY, rule__enabled=True)
        tiers = TierLimit.objects.filter(algorithm=Algorithm.CONCURRENCY)
        named = [f"rule {name}" for name in rules.values_list("rule__name", flat=True)[:5]]
        named += [f"tier {slug}" for slug in tiers.values_list("tier__slug", flat=True)[:5]]
        shedding = Protection.objects.filter(enabled=True, in_flight__isnull=False).exists()
        return named + ["service protection (load shedding)"] * shedding

    names = _read(EndpointLimit.objects.db, read)
    if not names:
        return []
    return [
        checks.Warning(
            f"Concurrency limits are set ({', '.join(dict.fromkeys(names))}), but "
            f"{_MIDDLEWARE_PATH} is not in MIDDLEWARE: a DRF view's slot is held until its "
            "request object is collected instead of when its response ends.",
            hint=f"Add '{_MIDDLEWARE_PATH}' to MIDDLEWARE (it gives the slots back when the "
            "response ends); views under @throttle give their own back.",
            id="django_throttle.W006",
        )
    ]


#: The DRF throttle classes (given by name: importing :mod:`~django_throttle.drf` needs DRF).
_DRF_THROTTLES = frozenset({"django_throttle.drf.PolicyThrottle"})


def check_headers_middleware(**kwargs: Any) -> list[checks.CheckMessage]:
    """W009: DRF views are throttled by ``PolicyThrottle`` (in ``DEFAULT_THROTTLE_CLASSES`` or
    a routed view's ``throttle_classes``), but the middleware that writes their
    ``X-RateLimit-*`` headers is not installed: their responses carry none, and a client
    cannot see its budget until it is refused. ``@throttle`` writes its own headers, so a
    project of decorated views only is never told. Anywhere in ``MIDDLEWARE`` will do: it
    reads the decision the throttle left on the request once the view has answered."""
    if _MIDDLEWARE_PATH in (getattr(settings, "MIDDLEWARE", None) or ()):
        return []
    drf = getattr(settings, "REST_FRAMEWORK", None)
    listed = drf.get("DEFAULT_THROTTLE_CLASSES") if isinstance(drf, dict) else None
    where = "REST_FRAMEWORK['DEFAULT_THROTTLE_CLASSES']"
    if not (isinstance(listed, (list, tuple)) and any(map(_is_drf_throttle, listed))):
        views = _throttled_views()
        if not views:
            return []
        where = f"the throttle_classes of {', '.join(views)}"
    return [
        checks.Warning(
            f"django_throttle.drf.PolicyThrottle is in {where}, but {_MIDDLEWARE_PATH} is not "
            "in MIDDLEWARE: DRF responses carry no X-RateLimit-* headers.",
            hint=f"Add '{_MIDDLEWARE_PATH}' to MIDDLEWARE (anywhere in the list).",
            id="django_throttle.W009",
        )
    ]


def _is_drf_throttle(entry: Any) -> bool:
    """Whether ``entry`` (a class or a dotted path, as DRF takes them) is ``PolicyThrottle`` or
    a subclass; a path that does not import is DRF's to report, not ours."""
    if isinstance(entry, str):
        if entry in _DRF_THROTTLES:
            return True
        try:
            entry = import_string(entry)
        except ImportError:
            return False
    return isinstance(entry, type) and any(
        f"{base.__module__}.{base.__qualname__}" in _DRF_THROTTLES for base in entry.__mro__
    )


def _throttled_views(limit: int = 3) -> list[str]:
    """Up to ``limit`` routed DRF views (``as_view()`` keeps the class as ``cls``) whose
    ``throttle_classes`` hold ``PolicyThrottle``. A URLconf that does not load is reported by
    Django's own URL checks."""
    from django.urls import URLPattern, URLResolver, get_resolver

    found: dict[str, None] = {}
    try:
        stack = list(get_resolver().url_patterns)
    except Exception:  # a URLconf that does not load: Django's urls check names it
        return []
    while stack and len(found) < limit:
        entry = stack.pop(0)
        if isinstance(entry, URLResolver):
            stack[:0] = entry.url_patterns
        elif isinstance(entry, URLPattern):
            view: Any = getattr(entry.callback, "cls", None)
            if view is not None and any(
                map(_is_drf_throttle, getattr(view, "throttle_classes", None) or ())
            ):
                found[f"{view.__module__}.{view.__qualname__}"] = None
    return list(found)


#: Characters of a regex or a path converter: a route holding one has no single path to try.
_NOT_LITERAL = frozenset("<>^$()[]{}\\?*+|")


def _url_patterns(*, literal: bool = False) -> list[tuple[str, Any]]:
    """Each ``URLPattern`` of the URLconf, in the order Django tries them, with its route as
    written (no leading slash); ``literal``: only routes with no converter and no regex (an
    ``include`` whose prefix has one is passed over whole). None when the URLconf does not
    load: Django's own URL checks name it."""
    from django.urls import URLPattern, URLResolver, get_resolver

    try:
        stack: list[tuple[str, Any]] = [("", entry) for entry in get_resolver().url_patterns]
    except Exception:
        return []
    found: list[tuple[str, Any]] = []
    while stack:
        prefix, entry = stack.pop(0)
        route = prefix + str(getattr(entry, "pattern", ""))
        if literal and _NOT_LITERAL & set(route):
            continue
        if isinstance(entry, URLResolver):
            stack[:0] = [(route, child) for child in entry.url_patterns]
        elif isinstance(entry, URLPattern):
            found.append((route, entry))
    return found


def _credential_routes() -> list[tuple[str, Any]]:
    """Each routed ``protect_credentials`` view (it carries ``throttle_credential_scope``)
    whose route is a literal path (no converter, no regex), with that path."""
    return [
        ("/" + route, entry.callback)
        for route, entry in _url_patterns(literal=True)
        if hasattr(entry.callback, "throttle_credential_scope")
    ]


def check_shadowed_credential_views(**kwargs: Any) -> list[checks.CheckMessage]:
    """W011: a ``protect_credentials`` view whose path an earlier URL pattern already takes
    (``path("admin/login/", protect_credentials(admin.site.login))`` listed after
    ``path("admin/", admin.site.urls)``): the guard never runs and the login is unlimited."""
    from django.urls import Resolver404, resolve

    warnings: list[checks.CheckMessage] = []
    for path, view in _credential_routes():
        try:
            match = resolve(path)
        except Resolver404:
            continue
        if match.func is view:
            continue
        warnings.append(
            checks.Warning(
                f"protect_credentials on {path!r} never runs: an earlier URL pattern "
                f"(view {match.view_name!r}) serves that path, so its attempts are not limited.",
                hint=(
                    f"List the path({path.lstrip('/')!r}, protect_credentials(…)) entry before "
                    "the pattern that takes it (e.g. before path('admin/', admin.site.urls))."
                ),
                id="django_throttle.W011",
            )
        )
    return warnings


def _routed_views() -> list[tuple[str, Any, type]]:
    """Each routed class-based view (``as_view()`` keeps the class as ``cls``; a
    ``protect_credentials`` wrapper copies it) with its route as written and its callback."""
    found: list[tuple[str, Any, type]] = []
    for route, entry in _url_patterns():
        view = getattr(entry.callback, "cls", None)
        if isinstance(view, type):
            found.append(("/" + route, entry.callback, view))
    return found


#: DRF's token view, named rather than imported (only django_throttle.drf imports DRF).
_TOKEN_VIEW = "rest_framework.authtoken.views.ObtainAuthToken"


def _is_token_view(view: type) -> bool:
    """Whether ``view`` is DRF's ``ObtainAuthToken`` or a subclass."""
    return any(f"{base.__module__}.{base.__qualname__}" == _TOKEN_VIEW for base in view.__mro__)


def check_unguarded_token_views(**kwargs: Any) -> list[checks.CheckMessage]:
    """W013: DRF's ``ObtainAuthToken`` (``obtain_auth_token``) or a subclass is routed without
    ``protect_credentials``. DRF sets its ``throttle_classes = ()``, so ``PolicyThrottle`` in
    ``DEFAULT_THROTTLE_CLASSES`` never runs on it: every password guess there is checked,
    unlimited. Not warned when the view's own ``throttle_classes`` hold ``PolicyThrottle``."""
    warnings: list[checks.CheckMessage] = []
    for route, callback, view in _routed_views():
        if not _is_token_view(view) or hasattr(callback, "throttle_credential_scope"):
            continue
        if any(map(_is_drf_throttle, getattr(view, "throttle_classes", None) or ())):
            continue
        name = f"{view.__module__}.{view.__qualname__}"
        warnings.append(
            checks.Warning(
                f"{name} on {route!r} is not wrapped in protect_credentials: DRF's "
                "ObtainAuthToken sets throttle_classes = (), so PolicyThrottle (or any "
                "DEFAULT_THROTTLE_CLASSES entry) never runs on it and password guesses there "
                "are not limited.",
                hint=(
                    "Route it as protect_credentials(obtain_auth_token) (or "
                    "protect_credentials(MyTokenView.as_view())) and give scope 'login' a rule "
                    "counting failures (see the 'Protect logins' how-to)."
                ),
                id="django_throttle.W013",
            )
        )
    return warnings


def _guarded_routes() -> list[tuple[str, str]]:
    """Each routed ``protect_credentials`` view, converters and regexes included, as its
    route as written and the scope it checks."""
    found: list[tuple[str, str]] = []
    for route, entry in _url_patterns():
        scope = getattr(entry.callback, "throttle_credential_scope", None)
        if isinstance(scope, str):
            found.append((f"protect_credentials on {'/' + route!r}", scope))
    return found


def _guarded_authentication() -> list[tuple[str, str]]:
    """Each ``REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]`` entry that counts attempts
    (``ProtectedBasicAuthentication`` and the like carry ``protection_scope``), named, with
    its scope. An entry that does not import is left to DRF to report."""
    drf = getattr(settings, "REST_FRAMEWORK", None)
    listed = drf.get("DEFAULT_AUTHENTICATION_CLASSES") if isinstance(drf, dict) else None
    found: list[tuple[str, str]] = []
    for entry in listed if isinstance(listed, (list, tuple)) else ():
        try:
            cls = import_string(entry) if isinstance(entry, str) else entry
        except Exception:
            continue
        scope = getattr(cls, "protection_scope", None)
        if isinstance(scope, str):
            found.append(
                (f"{getattr(cls, '__name__', entry)} in DEFAULT_AUTHENTICATION_CLASSES", scope)
            )
    return found


def check_credential_scopes(**kwargs: Any) -> list[checks.CheckMessage]:
    """W014: a routed ``protect_credentials`` view, or a ``Protected*Authentication`` class in
    DRF's ``DEFAULT_AUTHENTICATION_CLASSES``, checks the rules of a scope that no enabled
    endpoint rule has (``scope="admin-login"`` with only a ``login`` rule made): it counts
    nothing, and every password guess there is checked. Only once the policy has enabled
    rules of some scope, so a fresh database (or a test database) is not warned about;
    ``check --deploy`` warns there too (:func:`check_credential_scopes_before_deploy`)."""
    return _credential_scopes(before_deploy=False)


def check_credential_scopes_before_deploy(**kwargs: Any) -> list[checks.CheckMessage]:
    """W014 under ``manage.py check --deploy``, also on a database with no scope rules at all:
    a project about to deploy guarded logins whose rules it never made would count nothing
    (the plain check stays quiet there, as on every fresh or test database)."""
    return _credential_scopes(before_deploy=True)


def _credential_scopes(*, before_deploy: bool) -> list[checks.CheckMessage]:
    routes = _guarded_routes() + _guarded_authentication()
    if not routes:
        return []
    from django_throttle.models import EndpointRule

    rules = EndpointRule.objects.filter(enabled=True, match_type=EndpointRule.MatchType.SCOPE)
    scopes = _read(EndpointRule.objects.db, lambda: set(rules.values_list("pattern", flat=True)))
    if scopes is None or bool(scopes) == before_deploy:
        return []  # unreadable; or the other check of the pair says it
    warnings: list[checks.CheckMessage] = []
    for guard, scope in routes:
        if scope in scopes:
            continue
        known = ", ".join(repr(name) for name in sorted(scopes)) or "none"
        warnings.append(
            checks.Warning(
                f"{guard} checks the endpoint rules of scope "
                f"{scope!r}, but no enabled rule has that scope (enabled scopes: {known}): "
                "attempts there are not limited.",
                hint=(
                    f"Add an endpoint rule in the admin (match type DRF throttle scope, pattern "
                    f"{scope!r}, counts failures, limits counted by IP address and username), "
                    "or pass the scope of an existing rule (protect_credentials(…, scope=…), "
                    "or protection_scope on an authentication class)."
                ),
                id="django_throttle.W014",
            )
        )
    return warnings


def check_token_app(**kwargs: Any) -> list[checks.CheckMessage]:
    """W015: DRF's ``ObtainAuthToken`` (``obtain_auth_token``) or a subclass is routed while
    ``rest_framework.authtoken`` is not in ``INSTALLED_APPS``: DRF's ``Token`` model is then
    abstract, so a correct password there is a 500 (``Token`` has no ``objects``)."""
    if "rest_framework.authtoken" in getattr(settings, "INSTALLED_APPS", ()):
        return []
    warnings: list[checks.CheckMessage] = []
    for route, _callback, view in _routed_views():
        if not _is_token_view(view):
            continue
        name = f"{view.__module__}.{view.__qualname__}"
        warnings.append(
            checks.Warning(
                f"{name} on {route!r} needs 'rest_framework.authtoken' in INSTALLED_APPS: "
                "without it DRF's Token model has no table, and a correct password there is a "
                "500.",
                hint="Add 'rest_framework.authtoken' to INSTALLED_APPS and run manage.py migrate.",
                id="django_throttle.W015",
            )
        )
    return warnings


def _login_view_name(callback: Any) -> str | None:
    """The name of the login view ``callback`` serves, when it is Django's ``LoginView`` (or
    a subclass: DRF's browsable-API login in ``rest_framework.urls`` is one) or an admin
    site's ``login``; else ``None``."""
    from django.apps import apps

    view_class = getattr(callback, "view_class", None)
    if isinstance(view_class, type):
        from django.contrib.auth.views import LoginView

        if issubclass(view_class, LoginView):
            return f"{view_class.__module__}.{view_class.__qualname__}"
    site = getattr(callback, "__self__", None)
    if getattr(callback, "__name__", None) == "login" and apps.is_installed("django.contrib.admin"):
        from django.contrib.admin import AdminSite

        if isinstance(site, AdminSite):
            return f"The login of admin site {site.name!r}"
    return None


def _throttled_class(callback: Any) -> bool:
    """Whether the class-based view ``callback`` serves is under ``@throttle``
    (``method_decorator`` on its ``dispatch`` or ``post``): its attempts are limited."""
    view_class = getattr(callback, "view_class", None)
    for name in ("dispatch", "post"):
        func = getattr(view_class, name, None)
        seen: set[int] = set()
        while func is not None and id(func) not in seen:
            seen.add(id(func))
            if hasattr(func, "throttle_policy_scope") or hasattr(func, "throttle_options"):
                return True
            func = getattr(func, "__wrapped__", None)
    return False


def check_unguarded_login_views(**kwargs: Any) -> list[checks.CheckMessage]:
    """W016: a login view the URLconf serves (Django's ``LoginView`` or a subclass, such as
    the one ``include("django.contrib.auth.urls")`` or DRF's ``include("rest_framework.urls")``
    routes, or an admin site's login) without ``protect_credentials`` or ``@throttle``: password
    guesses there are not counted, so an attacker tries them there, whatever the guarded
    login views allow. Only in a project that guards a login (a routed ``protect_credentials``
    view, or a ``Protected*Authentication`` class in DRF's defaults): one that protects none
    has not asked for it, and its every ``manage.py`` command would print the admin's. Routes
    with converters or regexes are not checked; a route an earlier pattern serves is not
    reached and not warned (the reached one is)."""
    from django.urls import Resolver404, resolve

    if not (_guarded_routes() or _guarded_authentication()):
        return []
    warnings: list[checks.CheckMessage] = []
    for route, entry in _url_patterns(literal=True):
        callback = entry.callback
        name = _login_view_name(callback)
        if name is None or hasattr(callback, "throttle_credential_scope"):
            continue
        if _throttled_class(callback):
            continue
        try:
            reached = resolve("/" + route).func
        except Resolver404:
            continue
        if reached is not callback and reached != callback:  # a bound method is made anew
            continue
        warnings.append(
            checks.Warning(
                f"{name} on {'/' + route!r} is not wrapped in protect_credentials: password "
                "guesses there are not counted, whatever the guarded login views allow.",
                hint=(
                    f"Route path({route!r}, protect_credentials(…)) before the pattern that "
                    "serves it (e.g. protect_credentials(admin.site.login) before "
                    "path('admin/', admin.site.urls)), or leave the view out (see the "
                    "'Protect logins' how-to)."
                ),
                id="django_throttle.W016",
            )
        )
    return warnings


#: DRF's ``APIView``: its ``throttle_classes`` is ``DEFAULT_THROTTLE_CLASSES`` as read when
#: DRF was imported, so a view that inherits the attribute from it sets none of its own.
_DRF_API_VIEW = "rest_framework.views.APIView"


def _inherits_drf_default(view: type) -> bool:
    """Whether ``view`` takes ``throttle_classes`` from DRF's ``APIView`` (the default list,
    which the settings' W010 already names) rather than setting its own."""
    owner = next((base for base in view.__mro__ if "throttle_classes" in vars(base)), None)
    return owner is not None and f"{owner.__module__}.{owner.__qualname__}" == _DRF_API_VIEW


def check_drf_throttled_views(**kwargs: Any) -> list[checks.CheckMessage]:
    """W010 (per view): ``PolicyThrottle`` is in ``DEFAULT_THROTTLE_CLASSES`` but a routed
    view's own ``throttle_classes`` still hold DRF's ``AnonRateThrottle``,
    ``UserRateThrottle`` or ``ScopedRateThrottle`` (a migration left half done): the view
    replaces the default list, so the admin's tiers and rules (those ``from-drf`` made for its
    ``throttle_scope`` too) never apply to it, and DRF refuses by its own rates."""
    drf = getattr(settings, "REST_FRAMEWORK", None)
    listed = drf.get("DEFAULT_THROTTLE_CLASSES") if isinstance(drf, dict) else None
    if not (isinstance(listed, (list, tuple)) and any(map(_is_drf_throttle, listed))):
        return []
    warnings: list[checks.CheckMessage] = []
    seen: set[type] = set()
    for route, _callback, view in _routed_views():
        if view in seen or _inherits_drf_default(view):
            continue
        seen.add(view)
        left = [
            entry.__name__
            for entry in getattr(view, "throttle_classes", None) or ()
            if isinstance(entry, type)
            and f"{entry.__module__}.{entry.__qualname__}" in DRF_THROTTLES
        ]
        if not left:
            continue
        name = f"{view.__module__}.{view.__qualname__}"
        warnings.append(
            checks.Warning(
                f"{name} (on {route!r}) sets throttle_classes with DRF's {', '.join(left)}: "
                "it replaces REST_FRAMEWORK['DEFAULT_THROTTLE_CLASSES'], so the admin's tiers "
                "and rules never apply to it and DRF refuses by its DEFAULT_THROTTLE_RATES.",
                hint=(
                    "Set throttle_classes = [PolicyThrottle] (django_throttle.drf) on the view, "
                    "or remove the attribute; its throttle_scope selects the admin's rules."
                ),
                id="django_throttle.W010",
            )
        )
    return warnings


def check_credential_rules(**kwargs: Any) -> list[checks.CheckMessage]:
    """W005: a credential rule limits some tiers only.

    A credential rule is one with a limit counted by username, or one counting failures (a
    login or token endpoint's; :attr:`~django_throttle.policy.live.EndpointPolicy.credential`).
    Its limits counted by IP address or username apply to every caller whatever the tier
    (they protect the account and the server); its limits counted by client apply only to
    the tiers they are given for, so signed-in users and API keys of the other tiers meet
    none of them there."""
    from django_throttle.models import EndpointLimit, EndpointRule, Tier

    def read() -> tuple[dict[int, str], dict[int, tuple[str, str]], list[tuple[int, int, str]]]:
        enabled = EndpointRule.objects.filter(enabled=True).values_list("pk", "name", "counts")
        rules = {pk: (name, counts) for pk, name, counts in enabled}
        rows = EndpointLimit.objects.filter(rule__in=list(rules)).order_by("pk")
        return (
            dict(Tier.objects.order_by("pk").values_list("pk", "slug")),
            rules,
            list(rows.values_list("rule_id", "tier_id", "counted_by")),
        )

    found = _read(EndpointRule.objects.db, read)
    if found is None:
        return []
    tiers, rules, rows = found
    credential = {pk for pk, (_, counts) in rules.items() if counts == "failures"}
    client_tiers: dict[int, set[int]] = {}
    for rule_id, tier_id, counted_by in rows:
        if counted_by == "username":
            credential.add(rule_id)
        elif counted_by == "client":
            client_tiers.setdefault(rule_id, set()).add(tier_id)
    warnings: list[checks.CheckMessage] = []
    for rule_id, limited in sorted(client_tiers.items()):
        unlimited = [slug for pk, slug in tiers.items() if pk not in limited]
        if rule_id not in credential or not unlimited:
            continue
        given = ", ".join(slug for pk, slug in tiers.items() if pk in limited)
        warnings.append(
            checks.Warning(
                f"Credential rule {rules[rule_id][0]!r} limits its callers by client for tier(s) "
                f"{given} only: callers of tier(s) {', '.join(unlimited)} (signed-in users, "
                "API keys) meet none of those limits on that login or token endpoint. Its "
                "limits counted by IP address and username apply whatever the tier.",
                hint="Give the rule a limit counted by client for every tier, or count it "
                "by IP address or username instead.",
                id="django_throttle.W005",
            )
        )
    return warnings


def check_api_key_owners(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W020: an active API key owned by a superuser or a staff user.

    ``ApiKeyAuthentication`` logs a key in as its owner, with every permission the owner has,
    so such a key is a superuser's (or staff) login in the hands of whoever holds it. A
    database check (``manage.py check --database default``, ``migrate``, the test runner):
    it reads the key table (two small queries), so plain ``manage.py check`` stays quiet.
    """
    if not databases:
        return []
    from django.db.models import Q
    from django.utils import timezone

    from django_throttle.models import ApiKey

    messages: list[checks.CheckMessage] = []
    for alias in databases:
        privileged = (
            ApiKey.objects.using(alias)
            .filter(active=True)
            .filter(Q(expires__isnull=True) | Q(expires__gt=timezone.now()))
            .filter(Q(owner__is_superuser=True) | Q(owner__is_staff=True))
        )
        # Nothing when there are no tables yet (before migrate), or the user model has no
        # is_superuser/is_staff.
        total = _read(alias, privileged.count, (DatabaseError, FieldError))
        if not total:
            continue
        shown = list(privileged.select_related("owner").order_by("pk")[:5])
        named = ", ".join(_privileged_key(key) for key in shown)
        more = f" and {total - len(shown)} more" if total > len(shown) else ""
        messages.append(
            checks.Warning(
                f"{total} active API key(s) in database {alias!r} are owned by a superuser "
                f"or staff user: {named}{more}. ApiKeyAuthentication logs a key in as its "
                "owner, with all the owner's permissions.",
                hint="Give each key an owner with only the permissions its holder needs (or no "
                "owner: the key then selects its tier only), revoke it, or authenticate keys "
                "with a subclass of ApiKeyAuthentication that sets acts_as_owner = False.",
                id="django_throttle.W020",
            )
        )
    return messages


def _privileged_key(key: Any) -> str:
    owner = key.owner
    kind = "superuser" if getattr(owner, "is_superuser", False) else "staff"
    return f"{key.name!r} ({key.prefix}, owner {owner.get_username()!r}, {kind})"
