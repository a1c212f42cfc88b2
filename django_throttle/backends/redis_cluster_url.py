"""The ``redis+cluster://`` URL and the ``RedisCluster`` client made from it (see
:mod:`.redis_cluster` for how counting calls travel on it).

``redis+cluster://[user:password@]host:port[,host:port…][?option=value…]`` lists seed nodes
(any of the cluster's nodes; the rest are discovered); ``rediss+cluster://`` is the same over
TLS, and ``valkey+cluster://`` / ``valkeys+cluster://`` spell them for Valkey. Query options are
read as in a ``redis://`` URL (``ssl_ca_certs``, ``ssl_cert_reqs``, …), and
``DJANGO_THROTTLE_REDIS_OPTIONS`` apply to every node's connections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import REDIS_ALLOWED_KEYS, ClusterNode, RedisCluster
from redis.connection import ConnectionPool, parse_url
from redis.retry import Retry

#: Cluster URL schemes (:data:`~django_throttle.conf.CLUSTER_SCHEMES`, which chooses the
#: default number of key shards) and the single-server scheme each node is reached by.
SCHEMES = {
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
    if scheme.lower() not in SCHEMES:
        raise ValueError(f"is not a Redis Cluster URL ({', '.join(s + '://' for s in SCHEMES)})")
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
    node_url = f"{SCHEMES[scheme.lower()]}://{userinfo}{at}{name}:{port}{query}"
    return ClusterURL(nodes=tuple(nodes), node_url=node_url)


def no_cluster_retries() -> dict[str, Any]:
    """``RedisCluster``'s options (sync and asyncio) that turn its own retries off, besides the
    ``retry`` with no retries given to it: before redis-py 6, ``cluster_error_retry_attempts``
    (default 3) sends a command again after a connection error or a timeout, when it may
    already have run; from 6 on, the ``retry`` governs that too (and the option warns)."""
    major = int(redis.__version__.split(".")[0])
    return {"cluster_error_retry_attempts": 0} if major < 6 else {}


def cluster_client(url: str, options: dict[str, Any]) -> RedisCluster:
    """redis-py's ``RedisCluster`` for ``url`` (it asks a seed node for the slot map now, and
    raises if none answers), retries off, ``options`` on every node's connections. It never
    needs every slot covered: while one primary is down, the others' slots still work."""
    parsed = parse_cluster_url(url)
    options = {k: v for k, v in options.items() if k not in ("retry", "timeout")}
    seeds = [ClusterNode(host, port) for host, port in parsed.nodes[1:]]  # type: ignore[no-untyped-call]
    return RedisCluster(
        url=parsed.node_url,
        startup_nodes=seeds,
        retry=Retry(NoBackoff(), 0),
        require_full_coverage=False,
        **no_cluster_retries(),
        **options,
    )


def option_problem(url: str, options: dict[str, Any]) -> str | None:
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
