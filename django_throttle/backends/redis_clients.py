"""The Redis the throttle connects to: the clients the backend builds from the settings
(:func:`build_client`) for each topology, what ``manage.py check`` asks of them
(:func:`option_problem`), and the least-privilege ACL user they may log in as
(:func:`acl_rules`).

One setting chooses the topology: ``DJANGO_THROTTLE_REDIS_URL`` is a single server
(``redis://``, ``rediss://``, ``unix://``, or Valkey's ``valkey://`` / ``valkeys://``), a
Sentinel-managed primary (``redis+sentinel://``) or a Redis Cluster (``redis+cluster://``, whose
counting calls :mod:`.redis_cluster` routes); unset, the Redis of a django-redis or Django
``RedisCache`` cache is reused. Every client has short timeouts, no retries (a replayed
counting call may count twice) and a bounded pool.

``redis+cluster://[user:password@]host:port[,host:port…][?option=value…]`` lists seed nodes
(any of the cluster's nodes; the rest are discovered); ``rediss+cluster://`` is the same over
TLS, and ``valkey+cluster://`` / ``valkeys+cluster://`` spell them for Valkey. Query options are
read as in a ``redis://`` URL (``ssl_ca_certs``, ``ssl_cert_reqs``, …), and
``DJANGO_THROTTLE_REDIS_OPTIONS`` apply to every node's connections.

``redis+sentinel://[user:password@]host:port[,host:port…]/<service>[/<db>]`` (or
``valkey+sentinel://``) lists the sentinels and names the service they monitor; the user and
password in it are the primary's (the data node's). The sentinels' own credentials, if they
have any, are ``DJANGO_THROTTLE_REDIS_OPTIONS["sentinel_kwargs"]`` (redis-py's spelling).
The client is redis-py's own ``Sentinel(...).master_for(service)``: its connections
(``SentinelManagedConnection``) ask the sentinels for the primary's address whenever they
connect, and one that gets a ``READONLY`` reply (its server was demoted to a replica)
disconnects, so that the next use connects to the promoted primary. Counting never reads from a
replica. :class:`AsyncSentinelPool` is the same for ``redis.asyncio``, made per event loop
for ``async def`` views (:mod:`.redis_nodes`).

The least-privilege Redis ACL user for the throttle is the commands and the key pattern it
needs, and nothing else.

Managed Redis (ElastiCache, Memorystore, Azure Cache, Upstash) gives each application its own
ACL user. The throttle's needs no ``@dangerous`` or ``@admin`` command (no ``KEYS``, ``FLUSH*``,
``CONFIG``, ``SCRIPT FLUSH`` or ``DEBUG``), touches only keys under its
``DJANGO_THROTTLE_KEY_PREFIX``, and never publishes or subscribes. :func:`acl_rules` spells that
user in ``ACL SETUSER`` words; the docs (``docs/howto/managed-redis.md``) print it for the
default prefix, and the test suite runs as it (``DJANGO_THROTTLE_TEST_ACL=least-privilege``),
so a command added to a script or an operator tool without being listed here fails there.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.asyncio import connection as aio
from redis.asyncio import sentinel as aio_sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.cluster import REDIS_ALLOWED_KEYS, ClusterNode, RedisCluster
from redis.connection import ConnectionPool, parse_url
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool

from django_throttle.conf import app_settings, is_cluster_url

__all__ = ["acl_rules"]


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
    else the first ``LOCATION`` (the primary) of the cache
    ``DJANGO_THROTTLE_REDIS_URL = "cache://<alias>"`` names, with its password and pool
    options — never through the cache's own client, which has no timeouts.
    ``DJANGO_THROTTLE_REDIS_OPTIONS`` overrides any option except retries, which are always
    off; over TLS the connect timeout is :data:`TLS_CONNECT_TIMEOUT` unless it says otherwise
    (and a URL's query wins over both, as in redis-py)."""
    url = app_settings.REDIS_URL
    borrowed: dict[str, Any] = {}
    if url is None:
        url, borrowed = cache_connection(app_settings.cache_alias)
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
        f"CACHES[{alias!r}] (DJANGO_THROTTLE_REDIS_URL = 'cache://{alias}') is not a Redis "
        "cache with a redis:// LOCATION the throttle can connect to: set "
        "DJANGO_THROTTLE_REDIS_URL to a Redis URL."
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
        problem = query_problem(url) or number_problem(options)
        if problem is not None:
            return problem
        if is_cluster_url(url):
            return cluster_option_problem(url, options)
        pool = single_client(url, options).connection_pool
        pool.connection_class(**pool.connection_kwargs)
    except (TypeError, ValueError, ImproperlyConfigured) as exc:
        return str(exc)
    return None


#: Options whose value is text: a URL's query may give them as redis-py reads them (paths,
#: names, passwords, ``ssl_cert_reqs=required``). Every other query parameter must be one
#: redis-py parses into what its client takes (``socket_timeout=0.5``, ``ssl_check_hostname=
#: false``); left as text, it reaches the client where an object, a number or a flag is
#: needed (``retry=…`` makes every counting call fail; ``"false"`` is true).
TEXT_OPTIONS = frozenset(
    {
        "host",
        "path",
        "username",
        "password",
        "client_name",
        "lib_name",
        "lib_version",
        "encoding",
        "encoding_errors",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_ca_data",
        "ssl_password",
        "ssl_ciphers",
    }
)


def query_problem(url: str) -> str | None:
    """Why a query parameter of ``url`` (single server or cluster) would reach the client as
    text it cannot use, naming the parameter (never its value), or ``None``: the parameters
    are read by redis-py's own ``parse_url``, and a value it leaves as text must be one of
    :data:`TEXT_OPTIONS`. ``parse_url`` raises ``ValueError`` for a value it cannot parse."""
    if is_sentinel_url(url) or "?" not in url:
        return None
    node_url = parse_cluster_url(url).node_url if is_cluster_url(url) else redis_spelling(url)
    given = parse_url(node_url)  # type: ignore[no-untyped-call]
    texts = sorted(k for k, v in given.items() if isinstance(v, str) and k not in TEXT_OPTIONS)
    if not texts:
        return None
    name = texts[0]
    if name == "retry":
        return (
            "the URL's query parameter 'retry' is not taken: retries are always off (a "
            "replayed counting call may count twice)"
        )
    return (
        f"redis-py {redis.__version__} reads the URL's query parameter {name!r} as text, "
        "where its client needs an object, a number or a flag: remove it from the URL (an object "
        "is given in DJANGO_THROTTLE_REDIS_OPTIONS)"
    )


#: Options redis-py reads as seconds only once it connects or takes a pooled connection:
#: ``{"socket_timeout": "1"}`` makes every connection fail, not the client's construction.
NUMBER_OPTIONS = ("socket_timeout", "socket_connect_timeout", "timeout", "health_check_interval")


def number_problem(options: dict[str, Any]) -> str | None:
    """Why one of :data:`NUMBER_OPTIONS` is no number of seconds (naming its type, never
    showing a text value), or ``None``."""
    for name in NUMBER_OPTIONS:
        value = options.get(name)
        if value is None:
            continue
        must = f"the option {name!r} must be a number of seconds or None"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{must}, not {type(value).__name__}"
        if value < 0:
            return f"{must}, not {value!r}"
    return None


#: Cluster URL schemes (:data:`~django_throttle.conf.CLUSTER_SCHEMES`, which chooses the
#: default number of key shards) and the single-server scheme each node is reached by.
CLUSTER_SCHEMES = {
    "redis+cluster": "redis",
    "rediss+cluster": "rediss",
    "valkey+cluster": "redis",
    "valkeys+cluster": "rediss",
}


@dataclass(frozen=True)
class ClusterURL:
    """What a cluster URL says: the seed nodes, and the URL that reaches the first of them
    (its scheme, credentials and query), as redis-py reads a single server's."""

    nodes: tuple[tuple[str, int], ...]
    node_url: str


def parse_cluster_url(url: str) -> ClusterURL:
    """Split a cluster URL; a malformed one raises ``ValueError`` saying in one line what is
    wrong (never showing the password)."""
    scheme = url.partition("://")[0]
    if scheme.lower() not in CLUSTER_SCHEMES:
        schemes = ", ".join(s + "://" for s in CLUSTER_SCHEMES)
        raise ValueError(f"is not a Redis Cluster URL ({schemes})")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"is not a valid URL ({exc})") from None
    if parts.path not in ("", "/", "/0"):
        raise ValueError("names a database, and a cluster has only database 0: end it at the port")
    if parts.fragment:
        raise ValueError("takes no #fragment")
    userinfo, at, hosts = parts.netloc.rpartition("@")
    nodes = []
    for host in hosts.split(","):
        try:
            address = urlsplit(f"//{host}")
            name, port = address.hostname, address.port
        except ValueError as exc:
            raise ValueError(f"has a bad node address {host!r} ({exc})") from None
        if not name or not port:
            raise ValueError(
                f"has a bad node address {host!r}: list seed nodes as host:port,host:port"
            )
        nodes.append((name, port))
    host, port = nodes[0]
    name = f"[{host}]" if ":" in host else host
    query = f"?{parts.query}" if parts.query else ""
    node_url = f"{CLUSTER_SCHEMES[scheme.lower()]}://{userinfo}{at}{name}:{port}{query}"
    return ClusterURL(nodes=tuple(nodes), node_url=node_url)


def no_cluster_retries() -> dict[str, Any]:
    """``RedisCluster``'s options (sync and asyncio) that turn its own retries off, besides the
    ``retry`` with no retries given to it: before redis-py 6, ``cluster_error_retry_attempts``
    (default 3) sends a command again after a connection error or a timeout, when it may
    already have run; from 6 on, the ``retry`` governs that too (and the option warns)."""
    major = int(redis.__version__.split(".")[0])
    return {"cluster_error_retry_attempts": 0} if major < 6 else {}


#: Times ``RedisCluster`` may ask another primary for the command table while it starts,
#: after the first one it asks (the primary serving slot 0) did not answer.
COMMAND_TABLE_RETRIES = 3


def cluster_client(url: str, options: dict[str, Any]) -> RedisCluster:
    """redis-py's ``RedisCluster`` for ``url`` (it asks a seed node for the slot map now, and
    raises if none answers), retries off, ``options`` on every node's connections. It never
    needs every slot covered: while one primary is down, the others' slots still work.

    While it starts, ``RedisCluster`` also reads the command table (``COMMAND``) from one
    primary, the first of its slot map: the primary serving slot 0. Should that one be dead
    and not yet replaced, redis-py's own retry asks another primary (it replaces the node it
    asks after a connection error), so the client starts and counts on the live primaries.
    ``COMMAND`` only reads, so asking again is safe; the retries are turned off (the client's
    public ``set_retry``, or ``cluster_error_retry_attempts`` before redis-py 6) before the
    client is handed out, so that no counting call is ever sent twice."""
    parsed = parse_cluster_url(url)
    options = {k: v for k, v in options.items() if k not in ("retry", "timeout")}
    seeds = [ClusterNode(host, port) for host, port in parsed.nodes[1:]]  # type: ignore[no-untyped-call]
    before_6 = bool(no_cluster_retries())
    # Before redis-py 6, ``retry`` is the nodes' connections' (kept off) and
    # ``cluster_error_retry_attempts`` the client's; from 6 on, ``retry`` is the client's.
    retries: dict[str, Any] = (
        {"retry": Retry(NoBackoff(), 0), "cluster_error_retry_attempts": COMMAND_TABLE_RETRIES}
        if before_6
        else {"retry": Retry(NoBackoff(), COMMAND_TABLE_RETRIES)}
    )
    client: Any = RedisCluster(
        url=parsed.node_url,
        startup_nodes=seeds,
        require_full_coverage=False,
        **retries,
        **options,
    )
    if before_6:
        client.cluster_error_retry_attempts = 0
    else:
        client.set_retry(Retry(NoBackoff(), 0))
    built: RedisCluster = client
    return built


def cluster_option_problem(url: str, options: dict[str, Any]) -> str | None:
    """Why a node's connections could not be made from ``url`` and ``options`` (without
    connecting), or ``None``: options ``RedisCluster`` would drop without a word (it passes
    only the names it knows to the nodes), or that a node's connection does not take."""
    dropped = sorted(set(options) - set(REDIS_ALLOWED_KEYS) - {"retry", "timeout"})
    if dropped:
        return (
            f"redis-py's RedisCluster does not pass {', '.join(map(repr, dropped))} to the "
            "nodes' connections"
        )
    kept = {k: v for k, v in options.items() if k not in ("retry", "timeout")}
    pool = ConnectionPool(**{**parse_url(parse_cluster_url(url).node_url), **kept})  # type: ignore[no-untyped-call]
    pool.connection_class(**pool.connection_kwargs)
    return None


#: The URL schemes of a Sentinel-managed primary (Valkey's sentinels speak the same protocol).
SENTINEL_SCHEMES = ("redis+sentinel", "valkey+sentinel")
#: The port of a sentinel given without one.
DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelURL:
    """What a ``redis+sentinel://`` URL says."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    #: None when the URL does not say (``DJANGO_THROTTLE_REDIS_OPTIONS`` may, else 0).
    db: int | None = None
    username: str | None = None
    password: str | None = None


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelURL:
    """Split a Sentinel URL; a malformed one raises ``ValueError`` saying in one line what is
    wrong (never showing the password)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"is not a valid URL ({exc})") from None
    if parts.scheme not in SENTINEL_SCHEMES:
        schemes = " or ".join(s + "://" for s in SENTINEL_SCHEMES)
        raise ValueError(f"is not a Sentinel URL ({schemes})")
    if parts.query or parts.fragment:
        raise ValueError(
            "takes no ?query or #fragment in a Sentinel URL: give options in "
            "DJANGO_THROTTLE_REDIS_OPTIONS"
        )
    userinfo, _, hosts = parts.netloc.rpartition("@")
    sentinels = []
    for host in hosts.split(","):
        if not host:
            raise ValueError(
                "names no sentinel host (or an empty one between commas): list the sentinels "
                "as //host:port,host:port"
            )
        try:
            address = urlsplit(f"//{host}")
            name, port = address.hostname, address.port
        except ValueError as exc:
            raise ValueError(f"has a bad sentinel address {host!r} ({exc})") from None
        if not name or port == 0:
            raise ValueError(
                f"has a bad sentinel address {host!r}: list the sentinels as host:port,host:port"
            )
        sentinels.append((name, DEFAULT_SENTINEL_PORT if port is None else port))
    service, _, db = parts.path.removeprefix("/").partition("/")
    if not service:
        raise ValueError(
            "names no service: end the URL with /<service>, the name the sentinels monitor "
            "(sentinel monitor <service> …), e.g. /mymaster"
        )
    if db and not db.isdigit():
        raise ValueError(f"has a bad database {db!r}: end the URL with /<service>[/<db number>]")
    user, colon, password = userinfo.partition(":")
    return SentinelURL(
        sentinels=tuple(sentinels),
        service=unquote(service),
        db=int(db) if db else None,
        username=unquote(user) or None,
        password=unquote(password) if colon else None,
    )


class SentinelPool(SentinelConnectionPool):
    """redis-py's ``SentinelConnectionPool`` accepting the ``timeout`` option the client
    options carry for a ``BlockingConnectionPool`` and leaving it unused: like the pool it
    extends, it never waits for a connection, and refuses one beyond ``max_connections``."""

    def __init__(
        self,
        service_name: str,
        sentinel_manager: Any,
        *,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        del timeout  # a blocking pool's wait; this pool does not wait
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call, unused-ignore]


def sentinel_client(url: str, options: dict[str, Any]) -> redis.Redis:
    """The client of the primary ``url`` names, with ``options`` (the backend's, retries
    already off; what the URL says wins, as in redis-py's ``from_url``). The sentinels are
    asked with the same socket timeouts and no retries, plus ``options["sentinel_kwargs"]``
    (their password, TLS…)."""
    parsed = parse_sentinel_url(url)
    options = dict(options)
    sentinel_kwargs = {
        **{name: value for name, value in options.items() if name.startswith("socket_")},
        **(options.pop("sentinel_kwargs", None) or {}),
        "retry": Retry(NoBackoff(), 0),
    }
    for name in ("retry_on_timeout", "retry_on_error"):
        sentinel_kwargs.pop(name, None)
    given = {"db": parsed.db, "username": parsed.username, "password": parsed.password}
    options.update({name: value for name, value in given.items() if value is not None})
    sentinel = redis.Sentinel(parsed.sentinels, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call, unused-ignore]
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        parsed.service, connection_pool_class=SentinelPool, **options
    )
    return client


class AsyncSentinelPool(aio_sentinel.SentinelConnectionPool, aio.BlockingConnectionPool):
    """``redis.asyncio``'s ``SentinelConnectionPool`` that waits for a free connection (as its
    ``BlockingConnectionPool``) instead of refusing one beyond ``max_connections``."""

    def connected_to_primary(self, connection: Any) -> bool:
        """Whether ``connection`` is connected to the primary the sentinels named last
        (``owns_connection`` says so in the sync pool; not callable here in redis-py 8)."""
        return self.master_address == (connection.host, connection.port)

    async def disconnect_all(self) -> None:
        """Close the pool's connections and those of its sentinel clients."""
        await self.disconnect()
        for client in self.sentinel_manager.sentinels:
            with contextlib.suppress(Exception):
                await client.connection_pool.disconnect()


def async_twin(pool: SentinelConnectionPool, **kwargs: Any) -> AsyncSentinelPool:
    """An :class:`AsyncSentinelPool` for the running event loop, asking the same sentinels as
    the sync ``pool`` with the same options (retries off) through ``redis.asyncio`` clients of
    its own; ``kwargs`` are its connections' (and the pool's) options."""
    manager = pool.sentinel_manager
    kwargs_of = [client.connection_pool.connection_kwargs for client in manager.sentinels]
    addresses = [(each["host"], each["port"]) for each in kwargs_of]
    sentinel_kwargs = {**manager.sentinel_kwargs, "retry": AsyncRetry(NoBackoff(), 0)}
    sentinel = aio_sentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        addresses, min_other_sentinels=manager.min_other_sentinels, sentinel_kwargs=sentinel_kwargs
    )
    return AsyncSentinelPool(pool.service_name, sentinel, **kwargs)  # type: ignore[no-untyped-call, unused-ignore]


#: Every command the throttle sends, or its Lua scripts call (a script's calls are checked
#: against the caller's ACL too), with what it is for. redis-py's ``CLIENT SETINFO`` on
#: connect is left out: redis-py ignores its refusal, and Redis before 7.2 has no such
#: command for an ACL rule to name.
COMMANDS = {
    "fcall": "every decision, peek, refund and lease given back: one call of a function",
    "function|load": (
        "the package's functions loaded where the server lacks them (a restart, a failover, "
        "a new release)"
    ),
    "evalsha": "every retime batch and usage push: one script call (and every call, where "
    "functions are refused)",
    "eval": "the same script sent whole when the server has not cached it (NOSCRIPT)",
    "time": (
        "the scripts read the server's clock, so every worker counts on one clock; the "
        "inspector reads it to say when each concurrency lease ends"
    ),
    "get": "policy version; counters and state of the fixed-window and calendar algorithms",
    "set": "counters and state written by the scripts, with their expiry",
    "incrby": "the policy version, moved a random step when an admin edit must reach every worker",
    "expire": "every key written expires (policy version, usage minutes)",
    "pexpire": "the scripts' keys expire with their window",
    "del": "reset (manage.py throttle_reset, the admin's reset) and the scripts",
    "scan": "retime and reset find a limit's keys (never KEYS: no long stall)",
    "hincrby": "usage: requests and denials per minute",
    "hgetall": "usage reports read a minute's totals",
    "zadd": "sliding logs; concurrency leases, taken and renewed; usage's top clients",
    "zrange": "sliding logs and concurrency leases; usage reports read the top clients",
    "zrevrange": "the sliding log reads its newest entries",
    "zrangebyscore": (
        "the sliding log and concurrency find when a slot frees (Retry-After); "
        "the inspector lists the concurrency leases held"
    ),
    "zremrangebyscore": "the sliding log forgets what left its window, concurrency ended leases",
    "zremrangebyrank": "usage keeps its top clients bounded",
    "zrem": "refund takes back a sliding-log entry; a request gives its concurrency slot back",
    "zcard": "the sliding log counts its entries",
    "zcount": "the sliding log counts what is still in the window, concurrency live leases",
    "zscore": "concurrency finds a request's own lease (taken, renewed or released once)",
    "zpopmin": "usage: the rollup takes the minutes pushed late",
    "zmscore": "usage reports read chosen clients' counts",
    "ping": "redis-py's health checks (health_check_interval)",
    "client|setname": "client_name in DJANGO_THROTTLE_REDIS_OPTIONS names connections",
}

#: What redis-py's ``RedisCluster`` adds on a cluster: reading the slot map and the command
#: table when it starts, and following an ``ASK`` redirect during a resharding.
CLUSTER_COMMANDS = {
    "cluster|slots": "the slot map, read when the client starts and after a MOVED reply",
    "cluster|shards": "the slot map on servers and redis-py versions that read it so",
    "command": "the command table, read once when the client starts (which arguments are keys)",
    "asking": "follow an ASK redirect to the node importing a slot",
}

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob (``SCAN MATCH``, an ACL key pattern)."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def key_pattern(prefix: str) -> str:
    """The ACL key pattern covering every key under ``prefix``."""
    return f"~{glob_escape(prefix)}:*"


def acl_rules(prefix: str, *, cluster: bool = False) -> list[str]:
    """``ACL SETUSER`` rules for the throttle's user: its keys, no channels, its commands.

    ``resetkeys`` and ``-@all`` first, so applying them to an existing user takes away what it
    had; the password and ``on`` are the caller's to add."""
    commands = {**COMMANDS, **(CLUSTER_COMMANDS if cluster else {})}
    return [
        "resetkeys",
        key_pattern(prefix),
        "resetchannels",
        "-@all",
        *(f"+{command}" for command in commands),
    ]
