"""A Redis primary found through Redis Sentinel: the ``redis+sentinel://`` URL and the clients
made from it.

``redis+sentinel://[user:password@]host:port[,host:port…]/<service>[/<db>]`` (or
``valkey+sentinel://``) lists the sentinels and names the service they monitor; the user and
password in it are the primary's (the data node's). The sentinels' own credentials, if they
have any, are ``DJANGO_THROTTLE_REDIS_OPTIONS["sentinel_kwargs"]`` (redis-py's spelling).

The client is redis-py's own ``Sentinel(...).master_for(service)``: its connections
(``SentinelManagedConnection``) ask the sentinels for the primary's address whenever they
connect, and one that gets a ``READONLY`` reply (its server was demoted to a replica)
disconnects, so that the next use connects to the promoted primary. Counting never reads from a
replica. :class:`AsyncSentinelPool` is the same for ``redis.asyncio``, made per event loop
for ``async def`` views (:mod:`.redis_single`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.asyncio import connection as aio
from redis.asyncio import sentinel as aio_sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool

#: The URL schemes of a Sentinel-managed primary (Valkey's sentinels speak the same protocol).
SCHEMES = ("redis+sentinel", "valkey+sentinel")
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
    return url.partition("://")[0].lower() in SCHEMES


def parse_sentinel_url(url: str) -> SentinelURL:
    """Split a Sentinel URL; a malformed one raises ``ValueError`` saying in one line what is
    wrong (never showing the password)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"is not a valid URL ({exc})") from None
    if parts.scheme not in SCHEMES:
        raise ValueError(f"is not a Sentinel URL ({' or '.join(s + '://' for s in SCHEMES)})")
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
    """redis-py's ``SentinelConnectionPool`` taking the ``timeout`` option the client options
    carry for a ``BlockingConnectionPool`` (kept as :attr:`timeout`); like the pool it
    extends, it refuses a connection beyond ``max_connections``."""

    def __init__(
        self,
        service_name: str,
        sentinel_manager: Any,
        *,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call, unused-ignore]
        self.timeout = timeout


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
