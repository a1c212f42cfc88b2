"""What does a flood of distinct anonymous identities cost Redis, and what does a shared
ceiling let through?

Run from the repository root::

    .venv/bin/python bench/bench_flood.py [--clients 1000000] [--ceiling 1000/min] [--json]

One run starts a private ``redis-server`` (never any other Redis) and sends ``--clients``
requests, each from a distinct IPv4 address (``ip:10.x.y.z``, as the identity resolver names
an anonymous client), through the production counting script: the bytes of each call are
built by ``RedisBackend`` itself (the ``FCALL`` it would send for ``hit(client, limits,
usage=field)``), written to one socket in batches of ``--batch`` and the replies read back,
so Python's per-call overhead does not bound the rate. The anonymous tier is one token bucket,
``--rate`` per client, with usage counted.

It reports, per scenario: decisions per second, allowed and denied, ``used_memory`` growth per
identity, ``MEMORY USAGE`` of a sample of limit keys, ``DBSIZE``, and whether every key has a
TTL (``SCAN`` of the whole keyspace, ``PTTL`` of each). With ``--ceiling`` a second scenario
adds a shared limit for all anonymous clients together: each of the key shards
admits ``ceil(count / shards)``, and a denied request writes nothing, so the flood's
memory is bounded by what the ceiling admits.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RECV_SIZE = 1 << 20


def addresses(count: int, start: int = 0) -> Iterator[str]:
    """``count`` distinct client labels ``ip:10.x.y.z`` (count up to 2^24)."""
    for i in range(start, start + count):
        yield f"ip:10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"


def _replies(sock: socket.socket, count: int, buffer: bytes) -> tuple[int, bytes]:
    """Read ``count`` array replies of the counting script (see ``driver.lua``'s header: the
    first element is 1 when allowed); return how many allowed and the bytes read past them."""
    allowed = seen = pos = 0
    while seen < count:
        end = buffer.find(b"\r\n", pos)
        if end < 0:
            buffer = buffer[pos:] + sock.recv(RECV_SIZE)
            pos = 0
            continue
        if buffer[pos : pos + 1] != b"*":
            raise RuntimeError(f"unexpected reply {buffer[pos : pos + 200]!r}")
        size = int(buffer[pos + 1 : end])
        # Every element is an integer, ":<n>\r\n": the reply ends after ``size`` more lines.
        stop, lines = end + 2, 0
        while lines < size:
            found = buffer.find(b"\r\n", stop)
            if found < 0:
                buffer += sock.recv(RECV_SIZE)
                continue
            if lines == 0:
                allowed += buffer[stop : stop + 2] == b":1"
            stop, lines = found + 2, lines + 1
        seen += 1
        pos = stop
    return allowed, buffer[pos:]


def command(call: Any) -> bytes:
    """The RESP bytes of ``call`` (a ``ScriptCall``) as the package sends it: one ``FCALL`` of
    its function (the warm-up's ``hit`` loaded the library)."""
    from django_throttle.backends.scripts import function_name

    name = function_name(call.sha).encode()
    parts = [b"FCALL", name, b"%d" % len(call.keys), *call.keys, *call.args]
    encoded = [part if isinstance(part, bytes) else str(part).encode() for part in parts]
    return b"*%d\r\n" % len(encoded) + b"".join(
        b"$%d\r\n%s\r\n" % (len(part), part) for part in encoded
    )


def flood(
    backend: Any,
    clients: Sequence[str] | Iterator[str],
    limits: Sequence[Any],
    field: str | None,
    *,
    batch: int = 5000,
) -> dict[str, float]:
    """One decision per client through ``backend``'s script, pipelined on a socket of our
    own: the request bytes are the backend's own (``RedisBackend._request``), so keys, hash
    tags, specs and usage counting are exactly production's. Returns decisions, allowed,
    seconds."""
    backend.hit("ip:warm-up", limits, usage=field)  # loads the library (FUNCTION LOAD)
    kwargs = backend.client.connection_pool.connection_kwargs
    sock = socket.create_connection((kwargs.get("host", "127.0.0.1"), kwargs.get("port", 6379)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    done = allowed = 0
    buffer = b""
    pending: list[bytes] = []
    started = time.perf_counter()
    try:
        for client in clients:
            pending.append(command(backend._request(client, limits, 1, None, field)))
            if len(pending) >= batch:
                sock.sendall(b"".join(pending))
                n, buffer = _replies(sock, len(pending), buffer)
                allowed += n
                done += len(pending)
                pending = []
        if pending:
            sock.sendall(b"".join(pending))
            n, buffer = _replies(sock, len(pending), buffer)
            allowed += n
            done += len(pending)
    finally:
        sock.close()
    return {"decisions": done, "allowed": allowed, "seconds": time.perf_counter() - started}


def ping_rate(backend: Any, count: int, batch: int) -> float:
    """The floor, in the same run: ``count`` PINGs pipelined in batches of ``batch`` on a
    socket of our own, as the flood sends its scripts. Returns PINGs per second."""
    kwargs = backend.client.connection_pool.connection_kwargs
    sock = socket.create_connection((kwargs.get("host", "127.0.0.1"), kwargs.get("port", 6379)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reply = b"+PONG\r\n"
    started = time.perf_counter()
    try:
        sent = 0
        while sent < count:
            n = min(batch, count - sent)
            sock.sendall(b"*1\r\n$4\r\nPING\r\n" * n)
            expected, got = len(reply) * n, 0
            while got < expected:
                got += len(sock.recv(RECV_SIZE))
            sent += n
    finally:
        sock.close()
    return count / (time.perf_counter() - started)


def keyspace(client: Any, match: str) -> dict[str, int]:
    """Keys matching ``match``, how many have no TTL (PTTL -1) or vanished while read, and
    the least PTTL seen (ms): a full SCAN, PTTL pipelined per step."""
    keys = without_ttl = 0
    least = None
    cursor = 0
    while True:
        cursor, found = client.scan(cursor=cursor, match=match, count=5000)
        if found:
            pipe = client.pipeline(transaction=False)
            for key in found:
                pipe.pttl(key)
            for ttl in pipe.execute():
                keys += 1
                if ttl < 0:
                    without_ttl += ttl == -1
                else:
                    least = ttl if least is None else min(least, ttl)
        if not cursor:
            break
    return {"keys": keys, "without_ttl": without_ttl, "least_pttl_ms": least or 0}


def measure(
    backend: Any,
    client: Any,
    count: int,
    limits: Sequence[Any],
    field: str | None,
    *,
    start: int = 0,
    batch: int = 5000,
) -> dict[str, Any]:
    """Flood ``count`` fresh identities and report rate, memory and keys."""
    client.execute_command("MEMORY", "PURGE")
    before = int(client.info("memory")["used_memory"])
    keys_before = int(client.dbsize())
    pings = ping_rate(backend, min(count, 200_000), batch)
    result = flood(backend, addresses(count, start), limits, field, batch=batch)
    client.execute_command("MEMORY", "PURGE")
    after = int(client.info("memory")["used_memory"])
    # Token bucket keys: the shard's tag, the 16-character client digest, the code letter "t".
    buckets = f"{backend.prefix}:{{*}}{'?' * 16}t*"
    sample = [
        client.memory_usage(key, samples=0) or 0
        for key in client.scan(cursor=0, match=buckets, count=2000)[1][:200]
    ]
    space = keyspace(client, f"{backend.prefix}:*")
    return {
        **result,
        "decisions_per_second": round(result["decisions"] / result["seconds"]),
        "pings_per_second": round(pings),
        "ratio_to_ping": round(result["decisions"] / result["seconds"] / pings, 3),
        "used_memory_growth": after - before,
        "bytes_per_identity": round((after - before) / count, 1),
        "memory_usage_per_key": max(sample) if sample else 0,
        "dbsize_growth": int(client.dbsize()) - keys_before,
        **space,
    }


def configure(redis_url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-only-not-secret",
        USE_TZ=True,
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "django_throttle"],
        # A Cluster's default: the shared ceiling split over 16 shards, the case whose bound
        # (shards x ceil(count / shards)) the benchmark shows; one Redis defaults to 1.
        DJANGO_THROTTLE_REDIS_URL=f"{redis_url}?shards=16",
        DJANGO_THROTTLE_KEY_PREFIX="dt",
        DJANGO_THROTTLE_REDIS_OPTIONS={"socket_timeout": 30.0, "socket_connect_timeout": 5.0},
    )
    django.setup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1_000_000)
    parser.add_argument(
        "--rate",
        default="100/day",
        help="per-client anonymous limit; its keys live until the bucket is full again, so a "
        "slow refill keeps every identity in memory for the measurement (the worst case)",
    )
    parser.add_argument("--ceiling", default="1000/min", help="shared ceiling ('' for none)")
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from example_project.private_redis import PrivateRedis

    server = PrivateRedis().start()
    try:
        configure(server.url)
        import redis

        from django_throttle.backends import get_backend
        from django_throttle.rates import Limit
        from django_throttle.usage import accounting as usage

        client = redis.Redis.from_url(server.url, socket_timeout=60)
        backend = get_backend()
        field = usage.field_for("anonymous", "")
        per_client = Limit.build("t1", args.rate, name=f"anonymous {args.rate}")
        results: dict[str, Any] = {
            "redis": client.info("server")["redis_version"],
            "clients": args.clients,
            "shards": backend.shards,
            "rate": args.rate,
            "per_client": measure(
                backend, client, args.clients, (per_client,), field, batch=args.batch
            ),
        }
        if args.ceiling:
            client.flushall()
            ceiling = Limit.build(
                "t2", args.ceiling, name=f"anonymous {args.ceiling} shared", shared=True
            )
            results["ceiling"] = args.ceiling
            results["with_ceiling"] = measure(
                backend, client, args.clients, (per_client, ceiling), field, batch=args.batch
            )
        client.close()
    finally:
        server.stop()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(
            f"Redis {results['redis']}, {args.clients:,} distinct IPv4 clients, "
            f"{results['shards']} key shards, anonymous {args.rate} per client, usage counted"
        )
        scenarios = [("per client", results["per_client"])]
        if "with_ceiling" in results:
            scenarios.append((f"+ shared {args.ceiling}", results["with_ceiling"]))
        print(
            "| scenario | dec/s | ÷ pipelined PING | allowed | denied | used_memory / identity"
            " | MEMORY USAGE / key | keys | keys without TTL |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for name, r in scenarios:
            print(
                f"| {name} | {r['decisions_per_second']:,} | {r['ratio_to_ping']} "
                f"({r['pings_per_second']:,} PING/s) | {r['allowed']:,} | "
                f"{r['decisions'] - r['allowed']:,} | {r['bytes_per_identity']} B | "
                f"{r['memory_usage_per_key']} B | {r['keys']:,} | {r['without_ttl']} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
