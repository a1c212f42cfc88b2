"""Typed ``DJANGO_THROTTLE_*`` settings, each with a default.

Values are read from ``django.conf.settings`` on first access and remembered until a
``setting_changed`` signal (``override_settings``, the pytest ``settings`` fixture) clears them:
every request reads several settings, and a missing Django setting costs a raised
``AttributeError`` on each plain read. Nothing is read at import. Each setting is validated by
a system check in :mod:`django_throttle.checks`.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Callable
from functools import cached_property
from typing import Any, Generic, NamedTuple, TypeVar

from django.conf import settings

__all__ = ["CLUSTER_SCHEMES", "ProxyTrust", "Settings", "app_settings", "is_cluster_url"]

PREFIX = "DJANGO_THROTTLE_"
T = TypeVar("T")


class Setting(Generic[T]):
    """A setting whose value is what the user wrote, made ``cast`` (``bool``, ``str``,
    ``int``): read on first access, then remembered on the instance (as ``cached_property``
    does) until :meth:`Settings.reload`."""

    def __init__(self, default: Any, cast: Callable[[Any], T]) -> None:
        self.default = default
        self.cast = cast

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Settings, owner: type | None = None) -> T:
        value = self.cast(getattr(settings, PREFIX + self.name, self.default))
        instance.__dict__[self.name] = value
        return value


class Settings:
    """The app's settings. Each documents its setting: plain values are a :class:`Setting`
    (with their default), values parsed further are properties."""

    def _get(self, name: str, default: Any) -> Any:
        return getattr(settings, PREFIX + name, default)

    def reload(self) -> None:
        """Forget remembered values; the next access reads Django's settings again."""
        self.__dict__.clear()

    #: Master switch: ``False`` lets every request through without counting.
    ENABLED = Setting(True, bool)

    #: Dotted path of the counting backend class.
    BACKEND = Setting("django_throttle.backends.redis.RedisBackend", str)

    @cached_property
    def REDIS_URL(self) -> str | None:
        """Redis the Redis backend connects to: ``redis://``, ``rediss://`` (TLS), ``unix://``
        (``valkey://`` and ``valkeys://`` are read as ``redis://`` and ``rediss://``), or
        ``redis+sentinel://[user:password@]host:port,host:port/<service>[/<db>]`` (also
        ``valkey+sentinel://``) for the primary a set of sentinels names, the sentinels' own
        credentials in ``REDIS_OPTIONS["sentinel_kwargs"]``. ``None``: reuse the django-redis
        cache named by ``CACHE_ALIAS``."""
        return self._get("REDIS_URL", None) or None

    #: Extra keyword arguments for the Redis client the backend builds (timeouts, pool);
    #: with a Sentinel URL, ``"sentinel_kwargs"`` are those of the connections to the sentinels.
    REDIS_OPTIONS = Setting({}, dict)

    #: django-redis cache whose connection is reused when ``REDIS_URL`` is unset.
    CACHE_ALIAS = Setting("default", str)

    #: First part of every Redis key the app writes.
    KEY_PREFIX = Setting("dt", str)

    @cached_property
    def KEY_SHARDS(self) -> int:
        """Hash-tag shards of the keys (1-1024): each is one Redis Cluster slot holding its
        clients' counters and usage. A shared limit (one ceiling for all clients of a tier)
        is kept per shard, each admitting ``ceil(count / shards)``: up to ``shards x
        ceil(count / shards)`` in all. Unset: 16 when ``REDIS_URL`` is a Redis Cluster URL
        (``redis+cluster://``, ``rediss+cluster://``, ``valkey+cluster://``,
        ``valkeys+cluster://``), spreading clients and their load over the primaries; else
        1, so the ceiling is exact (a single Redis, Sentinel, the django-redis cache's Redis,
        the memory backend). On a Cluster, fewer shards make the ceiling more exact and put
        all counting on fewer primaries. Changing it starts every counter afresh: the shard
        is part of each key."""
        on_cluster = is_cluster_url(self.REDIS_URL)
        return int(self._get("KEY_SHARDS", 16 if on_cluster else 1))

    #: What happens when the backend cannot answer, unless a tier or endpoint rule says
    #: otherwise: ``"open"`` serves the request uncounted, ``"closed"`` refuses it with
    #: ``FAILURE_STATUS`` and ``Retry-After``, ``"local"`` counts it in a per-process
    #: in-memory limiter with the same semantics.
    FAILURE_MODE = Setting("open", str)

    #: HTTP status of a request refused because the limiter is unavailable (fail-closed)
    #: or cannot identify the client: 503 (default) or 429.
    FAILURE_STATUS = Setting(503, int)

    #: Anonymous requests whose address cannot be read (empty or garbage ``REMOTE_ADDR``,
    #: e.g. behind a Unix-socket proxy without ``TRUSTED_PROXY_COUNT``): ``"deny"`` refuses
    #: them with ``FAILURE_STATUS`` (default), ``"allow"`` serves them uncounted,
    #: ``"shared"`` counts them all in one bucket. Each choice logs an error at most once a
    #: minute per process naming the fix.
    UNKNOWN_CLIENT = Setting("deny", str)

    #: Reverse proxies in front of Django that append to ``X-Forwarded-For``. 0 (default)
    #: ignores the header and uses ``REMOTE_ADDR``.
    TRUSTED_PROXY_COUNT = Setting(0, int)

    @cached_property
    def TRUSTED_PROXIES(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """Networks of the reverse proxies in front of Django, e.g. ``["10.0.0.0/8",
        "2001:db8::/32"]`` (default none). With them, ``X-Forwarded-For`` is read only from a
        trusted ``REMOTE_ADDR``, and the client is its right-most address that is not itself
        trusted. Exclusive with ``TRUSTED_PROXY_COUNT``. Entries that do not parse are
        skipped (trusting less); a system check names them."""
        return _networks(self._get("TRUSTED_PROXIES", ()))

    @cached_property
    def CLIENT_IP_HEADER(self) -> str | None:
        """A header holding the one client address, overwritten by the edge proxy, e.g.
        ``"X-Real-IP"`` (default ``None``). Read instead of ``X-Forwarded-For``, and only
        from a trusted proxy: ``REMOTE_ADDR`` in ``TRUSTED_PROXIES``, or any connection when
        ``TRUSTED_PROXY_COUNT`` > 0."""
        value = self._get("CLIENT_IP_HEADER", None)
        return (value.strip() or None) if isinstance(value, str) else None

    @cached_property
    def proxy_trust(self) -> ProxyTrust:
        """The three proxy settings parsed together once per settings change: the client-IP
        path reads this one value on every request."""
        networks, header = self.TRUSTED_PROXIES, self.CLIENT_IP_HEADER
        return ProxyTrust(
            configured=self.TRUSTED_PROXY_COUNT > 0 or bool(networks),
            proxy_count=self.TRUSTED_PROXY_COUNT,
            v4=tuple(n for n in networks if isinstance(n, ipaddress.IPv4Network)),
            v6=tuple(n for n in networks if isinstance(n, ipaddress.IPv6Network)),
            header=None if header is None else "HTTP_" + header.upper().replace("-", "_"),
        )

    @cached_property
    def API_KEY_HEADERS(self) -> tuple[str, ...]:
        """Headers an API key is read from, in order (default ``("Authorization",
        "X-API-Key")``). ``Authorization`` carries it as ``Api-Key <key>``; any other header
        holds the bare key. An empty list turns API keys off."""
        value = self._get("API_KEY_HEADERS", ("Authorization", "X-API-Key"))
        return tuple(value) if isinstance(value, (list, tuple)) else ()

    @cached_property
    def api_key_headers(self) -> tuple[tuple[str, bool], ...]:
        """``API_KEY_HEADERS`` as (``request.META`` key, is ``Authorization``) pairs, parsed
        once per settings change: every request reads it."""
        return tuple(
            ("HTTP_" + name.upper().replace("-", "_"), name.lower() == "authorization")
            for name in self.API_KEY_HEADERS
            if isinstance(name, str) and name
        )

    @property
    def API_KEY_SECRET(self) -> str:
        """Key of the HMAC-SHA256 digest API keys are stored as (default ``SECRET_KEY``).
        Changing it invalidates every API key issued before: set it on its own to rotate
        ``SECRET_KEY`` without re-issuing keys."""
        value = self._get("API_KEY_SECRET", None)
        return str(value) if value else str(getattr(settings, "SECRET_KEY", ""))

    @cached_property
    def api_key_secret(self) -> bytes:
        """``API_KEY_SECRET`` encoded once per settings change."""
        return self.API_KEY_SECRET.encode()

    #: Anonymous IPv4 clients are grouped by this prefix length (32: one address).
    IPV4_PREFIX = Setting(32, int)

    #: Anonymous IPv6 clients are grouped by this prefix length (64: one subnet; 32-128).
    IPV6_PREFIX = Setting(64, int)

    #: Dotted path of ``callable(request) -> Identity`` that names the client.
    IDENTITY_RESOLVER = Setting("django_throttle.policy.resolver.resolve_identity", str)

    #: Also send the IETF ``RateLimit`` and ``RateLimit-Policy`` response fields.
    IETF_HEADERS = Setting(False, bool)

    #: Count every decision's outcome for ``manage.py throttle_usage`` (in the decision's
    #: own backend call).
    USAGE_ENABLED = Setting(True, bool)

    @cached_property
    def DENIED_RESPONSE(self) -> str | None:
        """Dotted path of a callable ``(request, decision) -> HttpResponse`` that builds the
        429 (and the fail-closed 503) of plain Django views and of DRF views using
        ``django_throttle.drf.exception_handler``; ``None`` keeps the JSON default."""
        value = self._get("DENIED_RESPONSE", None)
        return None if value is None else str(value)

    #: Keep Prometheus metrics (needs prometheus_client; see
    #: :mod:`django_throttle.metrics`). Off by default: they cost each decision a few µs.
    METRICS = Setting(False, bool)

    #: Days usage rows are kept in the database before the rollup deletes them.
    USAGE_RETENTION_DAYS = Setting(7, int)


#: ``REDIS_URL`` schemes of a Redis Cluster: the ones ``KEY_SHARDS`` defaults to 16 for.
CLUSTER_SCHEMES = frozenset(
    {"redis+cluster", "rediss+cluster", "valkey+cluster", "valkeys+cluster"}
)


def is_cluster_url(url: str | None) -> bool:
    """Whether ``url`` names a Redis Cluster, by its scheme alone (a plain string test: this
    module never imports the backends, and reads no server)."""
    return isinstance(url, str) and url.partition("://")[0].lower() in CLUSTER_SCHEMES


class ProxyTrust(NamedTuple):
    """Who may name the client. Networks are split by version because ``IPv4Address in
    IPv6Network`` compares bare integers, not versions; ``header`` is a ``request.META`` key
    (``"HTTP_X_REAL_IP"``)."""

    configured: bool
    proxy_count: int
    v4: tuple[ipaddress.IPv4Network, ...]
    v6: tuple[ipaddress.IPv6Network, ...]
    header: str | None


def _networks(value: Any) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    entries = [value] if isinstance(value, str) else value
    networks = []
    for entry in entries if isinstance(entries, (list, tuple, set, frozenset)) else ():
        with contextlib.suppress(TypeError, ValueError):
            networks.append(ipaddress.ip_network(entry, strict=False))
    return tuple(networks)


#: Every setting's name without :data:`PREFIX`: a ``DJANGO_THROTTLE_*`` name outside it is a
#: typo or a setting this app does not have (system check W001).
NAMES = frozenset(name for name in vars(Settings) if name.isupper())

app_settings = Settings()
