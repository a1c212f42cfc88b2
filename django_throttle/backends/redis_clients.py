"""The Redis clients the backend builds from the settings (:func:`build_client`), and what
``manage.py check`` asks of them (:func:`option_problem`).

One setting chooses the topology: ``DJANGO_THROTTLE_REDIS_URL`` is a single server
(``redis://``, ``rediss://``, ``unix://``, or Valkey's ``valkey://`` / ``valkeys://``), a
Sentinel-managed primary (``redis+sentinel://``, :mod:`.redis_sentinel`) or a Redis Cluster
(``redis+cluster://``, :mod:`.redis_cluster`); unset, the Redis of a django-redis or Django
``RedisCache`` cache is reused. Every client has short timeouts, no retries (a replayed
counting call may count twice) and a bounded pool.
"""

from __future__ import annotations

from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from django_throttle.backends.redis_cluster_url import cluster_client
from django_throttle.backends.redis_cluster_url import option_problem as cluster_option_problem
from django_throttle.backends.redis_sentinel import is_sentinel_url, sentinel_client
from django_throttle.conf import app_settings, is_cluster_url

#: A stalled Redis must cost a request tens of milliseconds, not redis-py's default 5 s x 10.
DEFAULT_CLIENT_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": 0.05,
    "socket_timeout": 0.05,
    "max_connections": 64,
}
#: The connect timeout over TLS unless one is given: a handshake costs two more round trips
#: and the key exchange, and an ``async def`` view under WSGI opens a connection per request.
TLS_CONNECT_TIMEOUT = 0.5
#: The URL schemes that mean TLS.
TLS_SCHEMES = ("rediss", "valkeys", "rediss+cluster", "valkeys+cluster")
#: Options of a borrowed cache connection that would undo the bounds above; retries are
#: always off whatever the settings say, because a replayed call may count twice.
_NOT_BORROWED = ("retry", "retry_on_timeout", "retry_on_error", "timeout", "max_connections")


def client_options() -> tuple[str, dict[str, Any]]:
    """The URL the backend connects to and the client options: ``DJANGO_THROTTLE_REDIS_URL``,
    else the first ``LOCATION`` (the primary) of the cache named by
    ``DJANGO_THROTTLE_CACHE_ALIAS`` with its password and pool options — never through the
    cache's own client, which has no timeouts. ``DJANGO_THROTTLE_REDIS_OPTIONS`` overrides any
    option except retries, which are always off; over TLS the connect timeout is
    :data:`TLS_CONNECT_TIMEOUT` unless it says otherwise (and a URL's query wins over both,
    as in redis-py)."""
    url = app_settings.REDIS_URL
    borrowed: dict[str, Any] = {}
    if url is None:
        url, borrowed = cache_connection(app_settings.CACHE_ALIAS)
        for name in _NOT_BORROWED:
            borrowed.pop(name, None)
    given = app_settings.REDIS_OPTIONS
    options = {**borrowed, **DEFAULT_CLIENT_OPTIONS, **given}
    if "socket_connect_timeout" not in given and (
        url.partition("://")[0].lower() in TLS_SCHEMES or options.get("ssl")
    ):
        options["socket_connect_timeout"] = TLS_CONNECT_TIMEOUT
    options.pop("retry_on_timeout", None)
    options.pop("retry_on_error", None)
    options["retry"] = Retry(NoBackoff(), 0)
    # How long a request may wait for a free pooled connection before failing over.
    options.setdefault("timeout", options.get("socket_connect_timeout", 0.05))
    return url, options


def build_client() -> redis.Redis | RedisCluster:
    """A client with short timeouts, no retries and a bounded pool, for the topology the URL
    names (see the module docstring). A cluster client asks a seed node for the slot map as
    it is built; the others connect on first use."""
    return client_for(*client_options())


def client_for(url: str, options: dict[str, Any]) -> redis.Redis | RedisCluster:
    """redis-py's client for ``url`` in any of the URL forms the settings take (single,
    Sentinel, Cluster), with ``options``: for tools that must reach the same Redis, such as
    the demo's start-up check. A bad URL raises ``ValueError``."""
    if is_cluster_url(url):
        return cluster_client(url, options)
    return single_client(url, options)


def single_client(url: str, options: dict[str, Any]) -> redis.Redis:
    """The client of one server, or of the primary the sentinels of a Sentinel URL name."""
    if is_sentinel_url(url):
        return sentinel_client(url, options)
    url = redis_spelling(url)
    return redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(url, **options))


#: Valkey's names of the single-server schemes (as ``limits`` and valkey-py take them).
VALKEY_SCHEMES = {"valkey": "redis", "valkeys": "rediss"}


def redis_spelling(url: str) -> str:
    """``url`` with a ``valkey://`` / ``valkeys://`` scheme written as redis-py reads it."""
    scheme, separator, rest = url.partition("://")
    return VALKEY_SCHEMES.get(scheme.lower(), scheme) + separator + rest


def cache_connection(alias: str) -> tuple[str, dict[str, Any]]:
    """The primary URL and connection options of a django-redis (or Django ``RedisCache``)
    cache, read from ``CACHES[alias]``."""
    config: dict[str, Any] = settings.CACHES.get(alias) or {}
    backend = str(config.get("BACKEND", ""))
    options: dict[str, Any] = dict(config.get("OPTIONS") or {})
    location = config.get("LOCATION") or ""
    urls = location.split(",") if isinstance(location, str) else list(location)
    url = str(urls[0]).strip() if urls else ""
    hint = (
        f"CACHES[DJANGO_THROTTLE_CACHE_ALIAS = {alias!r}] is not a Redis cache with a redis:// "
        "LOCATION the throttle can connect to: set DJANGO_THROTTLE_REDIS_URL."
    )
    if not url.startswith(("redis://", "rediss://", "unix://")) or "SENTINELS" in options:
        raise ImproperlyConfigured(hint)
    if backend.startswith("django_redis."):
        kwargs = dict(options.get("CONNECTION_POOL_KWARGS") or {})
        for option, kwarg in (("USERNAME", "username"), ("PASSWORD", "password")):
            if options.get(option):
                kwargs[kwarg] = options[option]
        return url, kwargs
    if backend == "django.core.cache.backends.redis.RedisCache":
        for name in ("pool_class", "parser_class", "serializer"):
            options.pop(name, None)
        return url, options
    raise ImproperlyConfigured(hint)


def option_problem() -> str | None:
    """Why :func:`build_client`'s options would fail every counting call, or ``None``.

    A client is built and one connection object made from its pool, never connected: an option
    redis-py's connections do not take (``ssl`` beside a ``redis://`` URL, a misspelt name), or
    a borrowed cache with no usable ``LOCATION``, is then a ``manage.py check`` error instead of
    every request taking the failure mode.
    """
    try:
        url, options = client_options()
        if is_cluster_url(url):
            return cluster_option_problem(url, options)
        pool = single_client(url, options).connection_pool
        pool.connection_class(**pool.connection_kwargs)
    except (TypeError, ValueError, ImproperlyConfigured) as exc:
        return str(exc)
    return None
