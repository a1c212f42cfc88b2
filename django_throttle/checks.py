"""System checks: one per ``DJANGO_THROTTLE_*`` setting, ids ``django_throttle.E001``…, and
one (W001) for a ``DJANGO_THROTTLE_*`` name that is no setting.

Checks read the raw settings (not :mod:`conf`, which converts types) so a bad value is
reported with its name instead of crashing at first use.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.core import checks
from django.core.exceptions import FieldError
from django.utils.module_loading import import_string

from django_throttle.conf import NAMES, PREFIX
from django_throttle.redaction import redact_text

_MISSING = object()
#: Django's own Redis cache: the backend builds its client from its LOCATION too.
DJANGO_REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"
Validator = Callable[[Any], str | None]


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be True or False"


def _int_range(low: int, high: int | None = None) -> Validator:
    def validate(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return "must be a whole number"
        if value < low or (high is not None and value > high):
            return f"must be between {low} and {high}" if high is not None else f"must be ≥ {low}"
        return None

    return validate


def _dotted(kind: type | None = None) -> Validator:
    def validate(value: Any) -> str | None:
        if not isinstance(value, str):
            return "must be a dotted import path"
        try:
            obj = import_string(value)
        except ImportError as exc:
            return f"cannot be imported ({exc})"
        if kind is not None and not (isinstance(obj, type) and issubclass(obj, kind)):
            return f"must name a subclass of {kind.__module__}.{kind.__qualname__}"
        if kind is None and not callable(obj):
            return "must name a callable"
        return None

    return validate


def _optional(validate: Validator) -> Validator:
    """``validate``, but ``None`` (the default: not used) is fine."""

    def optional(value: Any) -> str | None:
        return None if value is None else validate(value)

    return optional


def _backend(value: Any) -> str | None:
    from django_throttle.backends.base import Backend

    return _dotted(Backend)(value)


def _redis_url(value: Any) -> str | None:
    if value is None or value == "":  # unset, e.g. os.environ.get("REDIS_URL", "")
        return None
    if not isinstance(value, str) or urlparse(value).scheme not in {"redis", "rediss", "unix"}:
        return "must be None or a URL such as 'redis://127.0.0.1:6379/0' (redis, rediss, unix)"
    return None


def _dict(value: Any) -> str | None:
    return None if isinstance(value, dict) else "must be a dict of redis-py client options"


def _key_prefix(value: Any) -> str | None:
    if not isinstance(value, str) or not value or any(c in value for c in "{} \t\r\n"):
        return "must be non-empty text without braces or whitespace"
    return None


def _choice(*choices: Any) -> Validator:
    def validate(value: Any) -> str | None:
        if value in choices and not isinstance(value, bool):
            return None
        return "must be " + " or ".join(repr(c) for c in choices)

    return validate


def _alias(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "must name a cache in CACHES"


def _proxy_networks(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple, set, frozenset)):
        return "must be a list of networks such as ['10.0.0.0/8', '2001:db8::/32']"
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
    "x-forwarded-for": "is a list: trust it with TRUSTED_PROXY_COUNT or TRUSTED_PROXIES instead",
    "forwarded": "holds for=/by= pairs, not one address",
}


def _header_name(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _HEADER_NAME.fullmatch(value):
        return (
            "must be None or a header name as sent, such as 'X-Real-IP' (letters, digits and "
            "'-'; Django reads it as HTTP_X_REAL_IP, and servers drop names with '_')"
        )
    return _NOT_ONE_ADDRESS.get(value.lower())


def _api_key_headers(value: Any) -> str | None:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(name, str) and _HEADER_NAME.fullmatch(name) for name in value
    ):
        return (
            "must be a list of header names as sent, such as ['Authorization', 'X-API-Key'] "
            "(letters, digits and '-'), or [] to turn API keys off"
        )
    return None


def _api_key_secret(value: Any) -> str | None:
    if not isinstance(value, str) or len(value) < 32:
        return (
            "must be a string of at least 32 characters (API keys are stored as its HMAC); "
            "leave it unset to use SECRET_KEY"
        )
    return None


#: (check id, setting name, validator). Only settings that are set are validated.
SETTINGS: tuple[tuple[str, str, Validator], ...] = (
    ("E001", "BACKEND", _backend),
    ("E002", "REDIS_URL", _redis_url),
    ("E003", "REDIS_OPTIONS", _dict),
    ("E004", "CACHE_ALIAS", _alias),
    ("E005", "KEY_PREFIX", _key_prefix),
    ("E006", "FAILURE_MODE", _choice("open", "closed", "local")),
    ("E007", "TRUSTED_PROXY_COUNT", _int_range(0, 32)),
    ("E008", "IPV4_PREFIX", _int_range(8, 32)),
    ("E009", "IPV6_PREFIX", _int_range(32, 128)),
    ("E010", "IDENTITY_RESOLVER", _dotted()),
    ("E013", "IETF_HEADERS", _bool),
    ("E014", "USAGE_ENABLED", _bool),
    ("E016", "USAGE_RETENTION_DAYS", _int_range(1)),
    ("E017", "ENABLED", _bool),
    # E018 is the Redis source check below.
    ("E019", "FAILURE_STATUS", _choice(503, 429)),
    ("E023", "UNKNOWN_CLIENT", _choice("deny", "allow", "shared")),
    ("E026", "KEY_SHARDS", _int_range(1, 1024)),
    ("E030", "TRUSTED_PROXIES", _proxy_networks),
    ("E031", "CLIENT_IP_HEADER", _header_name),
    # E032 is the proxy trust check below.
    ("E033", "API_KEY_HEADERS", _api_key_headers),
    ("E034", "API_KEY_SECRET", _api_key_secret),
    ("E036", "DENIED_RESPONSE", _optional(_dotted())),
    ("E039", "METRICS", _bool),
)


def check_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for check_id, name, validate in SETTINGS:
        value = getattr(settings, PREFIX + name, _MISSING)
        if value is _MISSING:
            continue
        problem = validate(value)
        if problem is not None:
            errors.append(
                checks.Error(
                    f"{PREFIX}{name} = {_shown(name, value)} {problem}.",
                    hint="See the settings reference in the django-throttle docs.",
                    id=f"django_throttle.{check_id}",
                )
            )
    errors.extend(_check_redis_source())
    errors.extend(_check_proxy_trust())
    errors.extend(_check_unknown_names())
    return errors


def _check_unknown_names() -> list[checks.CheckMessage]:
    """W001: a ``DJANGO_THROTTLE_*`` name that is no setting of this app, most likely a typo:
    the setting meant keeps its default without a word."""
    warnings: list[checks.CheckMessage] = []
    for full_name in dir(settings):
        name = full_name.removeprefix(PREFIX)
        if name == full_name or name in NAMES:
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
    backend = getattr(settings, PREFIX + "BACKEND", "django_throttle.backends.redis.RedisBackend")
    if backend != "django_throttle.backends.redis.RedisBackend":
        return []
    if getattr(settings, PREFIX + "REDIS_URL", None):
        return []
    alias = getattr(settings, PREFIX + "CACHE_ALIAS", "default")
    cache = getattr(settings, "CACHES", {}).get(alias, {})
    backend_path = str(cache.get("BACKEND", ""))
    if backend_path.startswith("django_redis.") or backend_path == DJANGO_REDIS_CACHE:
        return []
    return [
        checks.Error(
            "The Redis backend has no Redis: DJANGO_THROTTLE_REDIS_URL is unset and "
            f"CACHES[{alias!r}] is neither a django-redis cache nor Django's RedisCache.",
            hint="Set DJANGO_THROTTLE_REDIS_URL = 'redis://…', point "
            "DJANGO_THROTTLE_CACHE_ALIAS at a django-redis cache, or use DJANGO_THROTTLE_BACKEND = "
            "'django_throttle.backends.memory.MemoryBackend' for a single process.",
            id="django_throttle.E018",
        )
    ]


def _check_proxy_trust() -> list[checks.CheckMessage]:
    """E032: proxies are trusted by count or by network, not both; W002: a client IP header
    with no trusted proxy is never read."""
    count = getattr(settings, PREFIX + "TRUSTED_PROXY_COUNT", 0)
    networks = getattr(settings, PREFIX + "TRUSTED_PROXIES", None)
    header = getattr(settings, PREFIX + "CLIENT_IP_HEADER", None)
    if count and networks:
        return [
            checks.Error(
                f"Both {PREFIX}TRUSTED_PROXY_COUNT = {count!r} and {PREFIX}TRUSTED_PROXIES = "
                f"{networks!r} are set: proxies are trusted by count or by network, not both.",
                hint="Keep TRUSTED_PROXIES (it also checks that REMOTE_ADDR is one of your "
                "proxies) and remove TRUSTED_PROXY_COUNT, or the other way round.",
                id="django_throttle.E032",
            )
        ]
    if header and _header_name(header) is None and not count and not networks:
        return [
            checks.Warning(
                f"{PREFIX}CLIENT_IP_HEADER = {header!r} is never read: no trusted proxy is "
                "configured, so every request is counted by REMOTE_ADDR.",
                hint=f"Set {PREFIX}TRUSTED_PROXIES to your proxies' networks (or "
                f"{PREFIX}TRUSTED_PROXY_COUNT), or remove CLIENT_IP_HEADER.",
                id="django_throttle.W002",
            )
        ]
    return []


MIDDLEWARE_PATH = "django_throttle.middleware.RateLimitHeadersMiddleware"


def check_settling_middleware(**kwargs: Any) -> list[checks.CheckMessage]:
    """W003: a rule counts only successes or failures, but DRF views' reservations are given
    back by the middleware, which is not installed (``@throttle`` settles by itself)."""
    if MIDDLEWARE_PATH in (getattr(settings, "MIDDLEWARE", None) or ()):
        return []
    from django.db import transaction

    from django_throttle.models import EndpointRule

    try:
        # A savepoint, so a missing table cannot break a surrounding transaction.
        with transaction.atomic(using=EndpointRule.objects.db):
            names = list(
                EndpointRule.objects.filter(enabled=True)
                .exclude(counts=EndpointRule.Counts.ALL)
                .values_list("name", flat=True)[:5]
            )
    except Exception:
        # No tables yet, no database, or database access refused (test runners).
        return []
    if not names:
        return []
    return [
        checks.Warning(
            f"Endpoint rules count only successes or failures ({', '.join(names)}), but "
            f"{MIDDLEWARE_PATH} is not in MIDDLEWARE: DRF views under them count every "
            "request.",
            hint=f"Add '{MIDDLEWARE_PATH}' to MIDDLEWARE (it gives back the tokens of "
            "requests the rule does not count), or set the rules' 'counts' to 'all'.",
            id="django_throttle.W003",
        )
    ]


def check_credential_rules(**kwargs: Any) -> list[checks.CheckMessage]:
    """W005: a credential rule limits some tiers only.

    A credential rule is one with a limit counted by username, or one counting failures (a
    login or token endpoint's; :attr:`~django_throttle.policy.snapshot.EndpointPolicy.credential`).
    Its limits counted by IP address or username apply to every caller whatever the tier
    (they protect the account and the server); its limits counted by client apply only to
    the tiers they are given for, so signed-in users and API keys of the other tiers meet
    none of them there."""
    from django.db import transaction

    from django_throttle.models import EndpointLimit, EndpointRule, Tier

    try:
        # A savepoint, so a missing table cannot break a surrounding transaction.
        with transaction.atomic(using=EndpointRule.objects.db):
            tiers = dict(Tier.objects.order_by("pk").values_list("pk", "slug"))
            rules = dict(EndpointRule.objects.filter(enabled=True).values_list("pk", "counts"))
            rows = list(
                EndpointLimit.objects.filter(rule__in=list(rules))
                .order_by("pk")
                .values_list("rule_id", "rule__name", "tier_id", "counted_by")
            )
    except Exception:
        # No tables yet, no database, or database access refused (test runners).
        return []
    names: dict[int, str] = {}
    credential: set[int] = {pk for pk, counts in rules.items() if counts == "failures"}
    client_tiers: dict[int, set[int]] = {}
    for rule_id, name, tier_id, counted_by in rows:
        names[rule_id] = name
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
                f"Credential rule {names[rule_id]!r} limits its callers by client for tier(s) "
                f"{given} only: callers of tier(s) {', '.join(unlimited)} (signed-in users, "
                "API keys) meet none of those limits on that login or token endpoint. Its "
                "limits counted by IP address and username apply whatever the tier.",
                hint="Give the rule a limit counted by client for every tier, or count it "
                "by IP address or username instead.",
                id="django_throttle.W005",
            )
        )
    return warnings


def register() -> None:
    checks.register(check_settings, checks.Tags.compatibility)
    checks.register(check_settling_middleware, checks.Tags.models)
    checks.register(check_credential_rules, checks.Tags.models)
    # Reads the key table: runs with `manage.py check --database …` (and the test runner),
    # never breaks `check` on a machine without a database.
    checks.register(check_api_key_owners, checks.Tags.database)


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
    from django.db import DatabaseError, transaction
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
        try:
            # A savepoint, so a missing table cannot break a surrounding transaction.
            with transaction.atomic(using=alias):
                total = privileged.count()
                shown = list(privileged.select_related("owner").order_by("pk")[:5])
        except (DatabaseError, FieldError):
            # No tables yet (before migrate), or a user model without is_superuser/is_staff.
            continue
        if not total:
            continue
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
