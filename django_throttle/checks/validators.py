"""What each ``DJANGO_THROTTLE_*`` setting may hold: one validator per setting and the table
:data:`SETTINGS` of (check id, setting name, validator) that :mod:`django_throttle.checks`
runs and the docs' settings reference reads.

A validator takes the raw value and returns what is wrong with it as a phrase ("must be …"),
or ``None``; it never raises and never converts (that is :mod:`django_throttle.conf`'s job).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

from django_throttle.conf import (
    REGION_HEADER_NAME,
    SHARDS_RANGE,
    cache_alias,
    is_cache_url,
    is_memory_url,
    split_shards,
)

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
    ("E045", "LOAD_SIGNAL", _optional(_dotted())),
    ("E039", "METRICS", _BOOL),
)
