"""System checks: one per ``DJANGO_THROTTLE_*`` setting, ids ``django_throttle.E002``…, one
(W004, or E041 where ignoring it weakens limiting) per setting of earlier versions still set,
naming what replaces it, one (W001) for a ``DJANGO_THROTTLE_*`` name that is no setting, and
the checks that read stored rows (E101…E105, W106, W003, W005, W020). :func:`register`
(called from the app's ``ready()``) registers them all.

Checks read the raw settings (not :mod:`conf`, which converts types) so a bad value is
reported with its name instead of crashing at first use: no database, no Redis, no import of
rows here.

- :mod:`.validators`: what each setting may hold, and the table :data:`SETTINGS`.
- this module: the settings checks, each setting that is set against its validator (E002…),
  ``REDIS_URL``'s ``?shards=`` (E042), the settings that must agree with each other (E018
  the Redis source, W002 proxy trust), the removed settings (W004, E041), and W001.
- :mod:`.database`: the checks on stored rows (E101…E105, W106, W003, W005, W020).
"""

from __future__ import annotations

import difflib
from typing import Any

from django.conf import settings
from django.core import checks

from django_throttle.checks.database import (
    check_api_key_owners,
    check_concurrency_middleware,
    check_credential_rules,
    check_rows,
    check_settling_middleware,
)
from django_throttle.checks.validators import SETTINGS, header_name, url_shards
from django_throttle.conf import (
    DEFAULT_CACHE_ALIAS,
    NAMES,
    PREFIX,
    REGION_GEOIP,
    REMOVED,
    cache_alias,
    is_memory_url,
)
from django_throttle.redaction import redact_text


def register() -> None:
    checks.register(check_settings, checks.Tags.compatibility)
    checks.register(check_settling_middleware, checks.Tags.models)
    checks.register(check_concurrency_middleware, checks.Tags.models)
    checks.register(check_credential_rules, checks.Tags.models)
    checks.register(check_rows, checks.Tags.models)
    # Reads the key table: runs with `manage.py check --database …` (and the test runner),
    # never breaks `check` on a machine without a database.
    checks.register(check_api_key_owners, checks.Tags.database)


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
        *_check_regions(),
        *_check_removed(),
        *_check_unknown_names(),
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
