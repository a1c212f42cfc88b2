"""Typed ``DJANGO_THROTTLE_*`` settings, each with a default and the reason to set it.

Only what a project has reason to choose is a setting: how to reach Redis, whom to trust
for the client's address, what happens while Redis is down, and the hooks that replace a
default behaviour. Everything else is a constant of this module, named and documented here.

Every setting is read through :data:`app_settings`: a value is read from
``django.conf.settings`` on first access and remembered until Django's ``setting_changed``
signal (``override_settings``, the pytest ``settings`` fixture) clears it, so a test or a
project changing a setting is always seen. Nothing is read at import. Each setting is
validated by a system check in :mod:`django_throttle.checks`, and each setting this app no
longer has is named there with what replaces it (:data:`REMOVED`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from collections.abc import Callable
from functools import cached_property
from typing import Any, Generic, NamedTuple, TypeVar

from django.conf import settings

PREFIX = "DJANGO_THROTTLE_"
T = TypeVar("T")

#: The counting backend of every ``REDIS_URL`` but ``memory://``.
REDIS_BACKEND = "django_throttle.backends.redis.RedisBackend"
#: The counting backend of ``REDIS_URL = "memory://"``: the same semantics in the process.
MEMORY_BACKEND = "django_throttle.backends.memory.MemoryBackend"
#: ``REDIS_URL`` scheme that borrows the connection settings of a cache in ``CACHES``.
CACHE_SCHEME = "cache"
#: ``REDIS_URL`` scheme that counts in the process (:data:`MEMORY_BACKEND`), no Redis.
MEMORY_SCHEME = "memory"
#: ``REDIS_URL`` query parameter giving the number of key shards (``?shards=16``).
SHARDS_PARAM = "shards"
#: The key shards ``?shards=`` may ask for (a system check names any other value).
SHARDS_RANGE = range(1, 1025)
#: The cache borrowed when ``REDIS_URL`` is unset.
DEFAULT_CACHE_ALIAS = "default"
#: HTTP status of a request refused because the limiter cannot answer (fail-closed) or
#: cannot identify the client: 503, so no client reads it as "you exceeded a limit".
FAILURE_STATUS = 503
#: A request whose address cannot be read (empty or garbage ``REMOTE_ADDR``) is refused
#: with :data:`FAILURE_STATUS`: serving it uncounted or in one shared bucket would let a
#: misconfigured proxy lift every limit or starve every client.
UNKNOWN_CLIENT = "deny"
#: Anonymous IPv4 clients are counted per address.
IPV4_PREFIX = 32
#: Anonymous IPv6 clients are counted per /64, the subnet one site (or one attacker) gets.
IPV6_PREFIX = 64
#: Headers an API key is read from, in order: ``Authorization: Api-Key <key>``, then
#: ``X-API-Key: <key>``.
API_KEY_HEADERS = ("Authorization", "X-API-Key")
#: ``REGION_SOURCE`` reading the client address's country from a GeoIP2 database.
REGION_GEOIP = "geoip"
#: A header name ``REGION_SOURCE = "header:<name>"`` may give.
REGION_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")
#: :data:`API_KEY_HEADERS` as (``request.META`` key, is ``Authorization``) pairs.
API_KEY_META = (("HTTP_AUTHORIZATION", True), ("HTTP_X_API_KEY", False))


class Setting(Generic[T]):
    """A setting: what the user wrote (else ``default``) made a ``T`` by ``parse``, read on
    first access and remembered on the instance (as ``cached_property`` does) until
    :meth:`Settings.reload`."""

    def __init__(self, default: Any, parse: Callable[[Any], T]) -> None:
        self.default = default
        self.parse = parse

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Settings, owner: type | None = None) -> T:
        value = self.parse(getattr(settings, PREFIX + self.name, self.default))
        instance.__dict__[self.name] = value
        return value


def _optional_text(value: Any) -> str | None:
    return (value.strip() or None) if isinstance(value, str) else None


def _redis_url(value: Any) -> str | None:
    """The URL connected to, without its ``shards`` parameter; ``None`` when a cache's
    connection is borrowed or counting is in the process (``memory://``)."""
    url = _optional_text(value)
    if url is None or is_cache_url(url) or is_memory_url(url):
        return None
    return split_shards(url)[0]


def _proxies(value: Any) -> int | tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return max(value, 0)
    return _networks(value)


def _raw_url() -> Any:
    """``REDIS_URL`` as the project wrote it (``?shards=`` and all)."""
    return getattr(settings, PREFIX + "REDIS_URL", None)


class Settings:
    """The app's settings, in the order of the settings reference. Each ``#:`` comment says
    what the setting holds and why a project would set it (the reference is built from
    them)."""

    def reload(self) -> None:
        """Forget remembered values; the next access reads Django's settings again."""
        self.__dict__.clear()

    #: Master switch: ``False`` lets every request through uncounted. Set it to turn the
    #: limiter off in tests of other features, or during an incident.
    ENABLED: Setting[bool] = Setting(True, bool)

    #: The one way to say where counting happens: a Redis URL (``redis://``, ``rediss://``
    #: for TLS, ``unix://``; ``redis+sentinel://[user:password@]host:port,host:port/<service>[/<db>]``
    #: for the primary a set of sentinels names; ``redis+cluster://host:port,host:port`` for a
    #: Redis Cluster; each also as ``valkey``), ``"cache://<alias>"`` to borrow the
    #: connection settings of the django-redis (or Django ``RedisCache``) cache
    #: ``CACHES[alias]``, or ``"memory://"`` to count in the process (the same semantics, no
    #: Redis: development, tests, single-process sites). Unset: ``"cache://default"``.
    #: A ``?shards=N`` query (1-1024, e.g. ``"redis+cluster://host:7000?shards=32"``) sets the
    #: hash-tag shards of the keys: each is one Redis Cluster slot holding its clients'
    #: counters, and a shared limit (one ceiling for all clients of a tier) is kept per shard,
    #: each admitting ``ceil(count / shards)``. Without it: 16 on a Redis Cluster URL,
    #: spreading clients over the primaries; else 1, so a shared ceiling is exact. Changing
    #: the shards starts every counter afresh: the shard is part of each key. Set it so the
    #: limiter counts on the Redis you choose, with its own timeouts.
    REDIS_URL: Setting[str | None] = Setting(None, _redis_url)

    #: Extra keyword arguments of the Redis client the backend builds, for what a URL cannot
    #: say: objects such as a ``credential_provider`` (the short-lived tokens of AWS
    #: ElastiCache, GCP Memorystore or Azure IAM sign-in, on a Cluster or through Sentinel as
    #: on one server) or an ``ssl_context``; with a Sentinel URL, ``"sentinel_kwargs"`` are
    #: those of the connections to the sentinels. Timeouts, TLS files and pool sizes may be
    #: written either here or in ``REDIS_URL``'s query (``?socket_timeout=0.5``), which
    #: redis-py reads. Set it when your Redis needs more than its URL can say.
    REDIS_OPTIONS: Setting[dict[str, Any]] = Setting({}, dict)

    #: First part of every Redis key the app writes. Set it when several projects share one
    #: Redis (or one ACL user may only touch ``<prefix>:*``).
    KEY_PREFIX: Setting[str] = Setting("dt", str)

    #: What a request meets when the backend cannot answer, unless its view, endpoint rule
    #: or tier names a mode. ``"local"`` (the default) keeps serving and keeps limiting: each
    #: process counts its clients in a bounded in-process limiter with the same semantics, so
    #: a Redis outage never switches limiting off; the limits hold per process meanwhile (with
    #: W worker processes a client may get up to W x its limit). ``"open"`` serves every
    #: request uncounted until Redis answers again; ``"closed"`` refuses it (503 with
    #: ``Retry-After``). Credential checks (logins, tokens) count ``"local"`` even where this
    #: says ``"open"``. Set it to ``"open"`` for availability without counting, or to
    #: ``"closed"`` to refuse rather than count per process.
    FAILURE_MODE: Setting[str] = Setting("local", str)

    #: The one way to trust reverse proxies for the client's address: an integer, the number
    #: of proxies in front of Django that append to ``X-Forwarded-For`` (for proxies whose
    #: addresses you do not know, or that connect over a Unix socket); or a list of their
    #: networks, e.g. ``["10.0.0.0/8", "2001:db8::/32"]``, when ``X-Forwarded-For`` is read
    #: only from a ``REMOTE_ADDR`` among them and the client is its right-most address that
    #: is not. Unset: no proxy is trusted and ``REMOTE_ADDR`` is the client. Set it behind a
    #: proxy, or every client shares the proxy's counters.
    TRUSTED_PROXIES: Setting[int | tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]] = (
        Setting((), _proxies)
    )

    #: A header holding the one client address, overwritten by your edge proxy, e.g.
    #: ``"X-Real-IP"``, read instead of ``X-Forwarded-For`` and only from a proxy
    #: ``TRUSTED_PROXIES`` trusts. Set it when your proxy sends such a header.
    CLIENT_IP_HEADER: Setting[str | None] = Setting(None, _optional_text)

    #: Where a client's region (a country code such as ``"FR"``) is read, for tier and endpoint
    #: limits that name regions: ``"header:<Header-Name>"`` (e.g. ``"header:CF-IPCountry"``,
    #: a CDN's country header) read only from a proxy ``TRUSTED_PROXIES`` trusts, or
    #: ``"geoip"``, the client address's country in the GeoIP2 database of Django's
    #: ``GEOIP_PATH``. Unset: no regions; every client meets the limits that name none. Set it
    #: when some regions get limits of their own.
    REGION_SOURCE: Setting[str | None] = Setting(None, _optional_text)

    #: Key of the HMAC-SHA256 digest API keys are stored as. Unset: ``SECRET_KEY``, and keys
    #: issued before a rotation keep working while the old value is in Django's
    #: ``SECRET_KEY_FALLBACKS``. Changing a key of its own invalidates every API key issued
    #: before. Set it to keep API keys apart from ``SECRET_KEY`` and its rotations.
    API_KEY_SECRET: Setting[str | None] = Setting(None, _optional_text)

    #: Dotted path of ``callable(request) -> Identity`` that names the client. Set it when
    #: your clients are identified by something the default (API key, user, address) does
    #: not know.
    IDENTITY_RESOLVER: Setting[str] = Setting("django_throttle.policy.live.resolve_identity", str)

    #: Dotted path of ``callable(request, decision) -> HttpResponse`` that builds the 429
    #: (and the fail-closed 503) of plain Django views and of DRF views using
    #: ``django_throttle.drf.exception_handler``. Unset: a JSON body. Set it for your own
    #: error format.
    DENIED_RESPONSE: Setting[str | None] = Setting(None, _optional_text)

    #: Also send the IETF ``RateLimit`` and ``RateLimit-Policy`` response fields. Set it when
    #: your clients read them; off, responses carry only ``X-RateLimit-*``.
    IETF_HEADERS: Setting[bool] = Setting(False, bool)

    #: Days usage rows are kept in the database before the rollup deletes them; ``0`` counts
    #: no usage at all (no usage report, dashboard figures or ``manage.py throttle_usage``).
    #: Set it to the history your operators need, or to ``0`` when you use none of them.
    USAGE_RETENTION_DAYS: Setting[int] = Setting(7, int)

    #: Keep Prometheus metrics (needs prometheus_client; see :mod:`django_throttle.metrics`).
    #: Set it when you scrape them; off, decisions skip the metric updates.
    METRICS: Setting[bool] = Setting(False, bool)

    # Parsed views of the settings above, kept for the code that reads them on every
    # request (internal: not settings).

    @cached_property
    def proxy_trust(self) -> ProxyTrust:
        """Internal: ``TRUSTED_PROXIES`` and ``CLIENT_IP_HEADER`` parsed together, once per
        settings change: the client-IP path reads this one value on every request."""
        trusted, header = self.TRUSTED_PROXIES, self.CLIENT_IP_HEADER
        networks = () if isinstance(trusted, int) else trusted
        count = trusted if isinstance(trusted, int) else 0
        return ProxyTrust(
            configured=count > 0 or bool(networks),
            proxy_count=count,
            v4=_ipv4_networks(networks),
            v6=tuple(n for n in networks if isinstance(n, ipaddress.IPv6Network)),
            header=None if header is None else "HTTP_" + header.upper().replace("-", "_"),
        )

    @cached_property
    def region_source(self) -> tuple[str, str] | None:
        """Internal: ``REGION_SOURCE`` parsed: ``("header", <request.META key>)``,
        ``("geoip", "")``, or ``None`` (regions off, or a value a system check names)."""
        source = self.REGION_SOURCE
        if source is None:
            return None
        if source.lower() == REGION_GEOIP:
            return (REGION_GEOIP, "")
        kind, _, header = source.partition(":")
        header = header.strip()
        if kind.strip().lower() != "header" or not REGION_HEADER_NAME.fullmatch(header):
            return None
        return ("header", "HTTP_" + header.upper().replace("-", "_"))

    @cached_property
    def api_key_secret(self) -> bytes:
        """Internal: ``API_KEY_SECRET`` (else ``SECRET_KEY``) encoded once per settings
        change: the key new API keys are stored under."""
        secret = self.API_KEY_SECRET or str(getattr(settings, "SECRET_KEY", ""))
        return secret.encode()

    @cached_property
    def api_key_fallbacks(self) -> tuple[bytes, ...]:
        """Internal: older keys API keys issued before are still verified under: Django's
        ``SECRET_KEY_FALLBACKS`` when the digest is keyed by ``SECRET_KEY`` (rotating it as
        Django documents keeps the keys working), none under an ``API_KEY_SECRET`` of its own."""
        if self.API_KEY_SECRET:
            return ()
        fallbacks = getattr(settings, "SECRET_KEY_FALLBACKS", ())
        if not isinstance(fallbacks, (list, tuple)):
            return ()
        return tuple(str(fallback).encode() for fallback in fallbacks if fallback)

    @cached_property
    def backend_path(self) -> str:
        """Internal: dotted path of the counting backend ``REDIS_URL`` selects (a string:
        this module never imports the backends)."""
        return MEMORY_BACKEND if is_memory_url(_raw_url()) else REDIS_BACKEND

    @cached_property
    def cache_alias(self) -> str:
        """Internal: the cache ``REDIS_URL = "cache://<alias>"`` borrows (``"default"``)."""
        return cache_alias(_raw_url()) or DEFAULT_CACHE_ALIAS

    @cached_property
    def key_shards(self) -> int:
        """Internal: the key shards: ``REDIS_URL``'s ``?shards=`` when it is in
        :data:`SHARDS_RANGE` (a system check names any other value), else 16 on a Redis
        Cluster URL and 1 on any other."""
        url = _raw_url()
        asked = split_shards(url.strip())[1] if isinstance(url, str) else None
        if asked is not None and asked.isdigit() and int(asked) in SHARDS_RANGE:
            return int(asked)
        return 16 if is_cluster_url(self.REDIS_URL) else 1

    @cached_property
    def usage_enabled(self) -> bool:
        """Internal: whether decisions are counted for the usage figures
        (``USAGE_RETENTION_DAYS`` above 0)."""
        return self.USAGE_RETENTION_DAYS > 0


#: ``REDIS_URL`` schemes of a Redis Cluster: the ones the key shards default to 16 for.
CLUSTER_SCHEMES = frozenset(
    {"redis+cluster", "rediss+cluster", "valkey+cluster", "valkeys+cluster"}
)


def is_cluster_url(url: str | None) -> bool:
    """Whether ``url`` names a Redis Cluster, by its scheme alone (a plain string test: this
    module never imports the backends, and reads no server)."""
    return isinstance(url, str) and url.partition("://")[0].lower() in CLUSTER_SCHEMES


def is_cache_url(url: Any) -> bool:
    """Whether ``url`` borrows a cache's connection (``cache://<alias>``)."""
    return isinstance(url, str) and url.strip().partition("://")[0].lower() == CACHE_SCHEME


def is_memory_url(url: Any) -> bool:
    """Whether ``url`` selects the in-process backend (``memory://``)."""
    return isinstance(url, str) and url.strip().partition("://")[0].lower() == MEMORY_SCHEME


def cache_alias(url: Any) -> str | None:
    """The alias of a ``cache://<alias>`` URL (``"default"`` when it names none); ``None``
    for any other value."""
    if not is_cache_url(url):
        return None
    return split_shards(url.strip())[0].partition("://")[2].strip("/") or DEFAULT_CACHE_ALIAS


def split_shards(url: str) -> tuple[str, str | None]:
    """``url`` without its ``shards`` query parameter, and that parameter's value (the last
    one given; ``None`` when absent). Every other parameter is kept as written: redis-py
    reads them as client options."""
    base, mark, query = url.partition("?")
    if not mark:
        return url, None
    kept, shards = [], None
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name == SHARDS_PARAM:
            shards = value
        else:
            kept.append(part)
    return (base + "?" + "&".join(kept) if kept else base), shards


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
    """Entries that do not parse are skipped (trusting less); a system check names them."""
    entries = [value] if isinstance(value, str) else value
    networks = []
    for entry in entries if isinstance(entries, (list, tuple, set, frozenset)) else ():
        with contextlib.suppress(TypeError, ValueError):
            networks.append(ipaddress.ip_network(entry, strict=False))
    return tuple(networks)


#: IPv6 prefixes whose addresses carry an IPv4 address in their last 32 bits, which the client
#: IP path reads as that IPv4 address: IPv4-mapped (``::ffff:10.0.0.1``, what a dual-stack
#: socket gives as ``REMOTE_ADDR``) and RFC 6052's well-known NAT64 prefix.
IPV4_CARRIERS = (ipaddress.IPv6Network("::ffff:0:0/96"), ipaddress.IPv6Network("64:ff9b::/96"))


def _ipv4_networks(
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...],
) -> tuple[ipaddress.IPv4Network, ...]:
    """The IPv4 networks ``networks`` trust: the IPv4 ones, and the IPv4 addresses an IPv6
    one names through :data:`IPV4_CARRIERS` (``::ffff:10.0.0.0/104`` is ``10.0.0.0/8``). The
    client IP path reads a mapped address as IPv4, so without these a proxy listed in mapped
    form would never be trusted, and every client behind it would be counted as the proxy."""
    found = [n for n in networks if isinstance(n, ipaddress.IPv4Network)]
    for network in networks:
        if not isinstance(network, ipaddress.IPv6Network):
            continue
        for carrier in IPV4_CARRIERS:
            if carrier.subnet_of(network):  # ``::/0``: every address it carries
                found.append(ipaddress.IPv4Network("0.0.0.0/0"))
            elif network.subnet_of(carrier):
                low = int(network.network_address) & 0xFFFFFFFF
                found.append(ipaddress.IPv4Network((low, network.prefixlen - 96)))
    return tuple(dict.fromkeys(found))


#: The one settings object every reader goes through.
app_settings = Settings()


def require_installed(module: str) -> None:
    """Raise ``ImproperlyConfigured`` naming the setting to change when ``module`` (a public
    face: ``PolicyThrottle``, ``@throttle``, the rows) is imported by a project whose
    ``INSTALLED_APPS`` lacks this app: no system check of the app runs then, no table exists,
    and every request would be served unlimited. Before the app registry is ready (a settings
    file importing a module) nothing can be told, and nothing is raised."""
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured

    if apps.apps_ready and not apps.is_installed("django_throttle"):
        raise ImproperlyConfigured(
            f"{module} is imported, but 'django_throttle' is not in INSTALLED_APPS, so no "
            "request would be limited: add 'django_throttle' to INSTALLED_APPS, then run "
            "'manage.py migrate'."
        )


class Removed(NamedTuple):
    """A setting this app no longer reads: what replaces it, and whether ignoring the
    value a project still sets (beside its other settings) would count differently than it
    asked for (then the system check is an error)."""

    replacement: str
    weakens: Callable[[Any], bool]


def _never(value: Any) -> bool:
    return False


def _is_set(name: str) -> bool:
    """Whether the project sets ``name`` (a setting that made a removed one moot before)."""
    return bool(getattr(settings, PREFIX + name, None))


#: Settings of earlier versions, each with what replaces it: a project that still sets one
#: gets system check W004 naming the replacement, or E041 where ignoring its value would
#: let more requests through (or count clients together) than the project asked for.
REMOVED: dict[str, Removed] = {
    "BACKEND": Removed(
        'REDIS_URL = "memory://" for the in-process backend (the one way to say where counting '
        "happens)",
        lambda value: value != app_settings.backend_path,
    ),
    "KEY_SHARDS": Removed(
        'a "?shards=N" query on REDIS_URL (the shards are part of the Redis address)',
        lambda value: value != app_settings.key_shards,
    ),
    "USAGE_ENABLED": Removed(
        "USAGE_RETENTION_DAYS = 0 (keeping no usage history counts no usage)",
        lambda value: value is False and app_settings.usage_enabled,
    ),
    "CACHE_ALIAS": Removed(
        'REDIS_URL = "cache://<alias>" (the one way to reach Redis)',
        lambda value: value != DEFAULT_CACHE_ALIAS and not _is_set("REDIS_URL"),
    ),
    "TRUSTED_PROXY_COUNT": Removed(
        "TRUSTED_PROXIES = <count> (the one way to trust proxies)",
        lambda value: value not in (0, None) and not _is_set("TRUSTED_PROXIES"),
    ),
    "FAILURE_STATUS": Removed("the constant 503 (no setting)", _never),
    "UNKNOWN_CLIENT": Removed(
        'the constant "deny" (no setting: configure TRUSTED_PROXIES so every client has an '
        "address)",
        _never,
    ),
    "IPV4_PREFIX": Removed(
        "the constant 32: IPv4 clients are counted per address (no setting)",
        lambda value: isinstance(value, int) and value < IPV4_PREFIX,
    ),
    "IPV6_PREFIX": Removed(
        "the constant 64: IPv6 clients are counted per /64 (no setting)",
        lambda value: isinstance(value, int) and value < IPV6_PREFIX,
    ),
    "API_KEY_HEADERS": Removed(
        'the constant ("Authorization", "X-API-Key") (no setting)',
        lambda value: isinstance(value, (list, tuple)) and bool(set(value) - set(API_KEY_HEADERS)),
    ),
    "LOAD_SIGNAL": Removed(
        "manage.py throttle_adapt --signal <path> (the load signal is the controller's "
        "option, not a setting of every process)",
        _never,
    ),
}

#: Every setting's name without :data:`PREFIX`: a ``DJANGO_THROTTLE_*`` name outside it and
#: :data:`REMOVED` is a typo or a setting this app does not have (system check W001).
NAMES = frozenset(name for name, value in vars(Settings).items() if isinstance(value, Setting))
