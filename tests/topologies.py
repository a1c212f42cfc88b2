"""Local Redis topologies the suite starts for itself: a Cluster, a Sentinel set, a TLS server.

Every process is a ``redis-server`` of this test run (the same binary the suite already uses,
:func:`example_project.private_redis.find_redis_server`), listening on 127.0.0.1 only, keeping
nothing on disk and stopped by PID when its owner stops. Nothing here touches a Redis the
suite did not start.

- :class:`LocalCluster`: primaries and replicas joined with redis-py's ``CLUSTER`` commands
  (no ``redis-cli`` needed), slots split evenly, a short ``cluster-node-timeout`` so that a
  killed primary's replica is promoted within seconds.
- :class:`LocalSentinel`: one primary, its replicas and a set of sentinels watching it under
  the service name ``mymaster``; the sentinels may have a password of their own.
- :class:`TLSServer`: a server that speaks only TLS, with a certificate authority made by the
  test (``trustme``), and the CA, server and client files a client needs.
"""

from __future__ import annotations

import contextlib
import random
import socket
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import redis

from tests.redis_servers import LOOPBACK, RedisServer

#: Redis's cluster bus listens on the data port + 10000: both must be free and below 65536.
CLUSTER_BUS_OFFSET = 10000
#: All 16384 hash slots of a Redis Cluster.
SLOTS = 16384


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _ephemeral_start() -> int:
    """The first port the kernel hands out for outgoing connections (Linux's
    ``ip_local_port_range``; 32768, its default, elsewhere)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 32768


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, both below the ports the
    kernel picks for outgoing connections: the suite's own clients (and a parallel run's)
    connect all the time, and one of them could otherwise take a node's port between this
    check and the node's start."""
    high = min(_ephemeral_start(), 65536) - CLUSTER_BUS_OFFSET - 1
    for _ in range(1000):
        port = random.randint(10000, high) if high > 10000 else random.randint(20000, 55000)
        if _port_free(port) and _port_free(port + CLUSTER_BUS_OFFSET):
            return port
    raise RuntimeError("no free port pair for a cluster node")


#: Seconds a cluster node may not know every other before it meets the nodes it lacks again.
MEET_AGAIN_AFTER = 3.0


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` until it returns something true; raise naming ``what`` after
    ``timeout`` seconds. Connection errors while a topology settles count as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            result = condition()
            if result:
                return result
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def replicated(primary: redis.Redis, replicas: int, timeout: float = 10.0) -> None:
    """Until ``replicas`` replicas hold every write ``primary`` (a connection to one node) took
    so far, from any client.

    ``WAIT`` counts the replicas that acknowledged *this connection's* last write; on a
    connection that wrote nothing, Valkey 9 returns at once with every connected replica,
    whatever they hold (Redis 7.0 waits). So this connection writes first (a marker key with
    a TTL, in a slot the node serves when it is a cluster node), then waits: its write's
    offset is past every earlier write of the node."""
    key = "dtt-test:replicated"
    if primary.info("cluster").get("cluster_enabled"):
        from redis.crc import key_slot

        port = primary.connection_pool.connection_kwargs["port"]
        served = [
            range(first, last + 1)
            for first, last, owner, *_ in primary.execute_command("CLUSTER", "SLOTS")
            if int(owner[1]) == port
        ]
        key = next(
            f"dtt-test:replicated:{n}"
            for n in range(100_000)
            if any(key_slot(f"dtt-test:replicated:{n}".encode()) in slots for slots in served)
        )
    primary.set(key, 1, px=60_000)
    acknowledged = primary.wait(replicas, round(timeout * 1000))
    assert acknowledged >= replicas, f"{acknowledged} of {replicas} replicas took the writes"


class LocalCluster:
    """A Redis Cluster of ``primaries`` primaries with ``replicas`` replicas each."""

    def __init__(
        self, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = 1000, tls: bool = False
    ) -> None:
        import trustme

        self.node_timeout_ms = node_timeout_ms
        #: With ``tls``: every node speaks only TLS (clients, replication and the cluster bus),
        #: its certificate from this CA.
        self.ca = trustme.CA() if tls else None
        make = partial(TLSServer, ca=self.ca) if tls else RedisServer
        tls_args = ("--tls-cluster", "yes", "--tls-replication", "yes") if tls else ()
        self.nodes = [
            make(
                cluster_port(),
                extra_args=(
                    *tls_args,
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(node_timeout_ms),
                    # A replica may take over however long it was cut off: failover tests
                    # kill a primary right after a write storm.
                    "--cluster-replica-validity-factor", "0",
                    # As managed clusters run: the other primaries keep serving their slots
                    # while one is failed (Redis's default, yes, refuses every slot then).
                    "--cluster-require-full-coverage", "no",
                ),
            )
            for _ in range(primaries * (1 + replicas))
        ]  # fmt: skip
        self.primary_count = primaries

    @property
    def seeds(self) -> str:
        """``host:port,host:port`` of every node, as a cluster URL lists its seed nodes."""
        return ",".join(f"{LOOPBACK}:{node.port}" for node in self.nodes)

    @property
    def url(self) -> str:
        return f"{'rediss' if self.ca else 'redis'}+cluster://{self.seeds}"

    def start(self, timeout: float = 60.0) -> LocalCluster:
        for node in self.nodes:
            node.start()
        clients = [node.client() for node in self.nodes]
        try:
            ids = [client.execute_command("CLUSTER", "MYID").decode() for client in clients]
            per_primary = SLOTS // self.primary_count
            for index, client in enumerate(clients[: self.primary_count]):
                first = index * per_primary
                last = SLOTS - 1 if index == self.primary_count - 1 else first + per_primary - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            met_again_at = [time.monotonic() + MEET_AGAIN_AFTER]

            def met() -> bool:
                """Whether every node knows every other. A node that still does not after
                :data:`MEET_AGAIN_AFTER` seconds meets those it lacks: a handshake lost on
                a loaded machine (a node busy past the handshake's timeout) is dropped, and
                the cluster never tries it again by itself (CI's Valkey pass once waited the
                whole 30 s for it)."""
                views = [client.execute_command("CLUSTER", "NODES").decode() for client in clients]
                unmet = [
                    (client, view)
                    for client, view in zip(clients, views, strict=True)
                    if len(view.splitlines()) != len(self.nodes)
                ]
                if unmet and time.monotonic() >= met_again_at[0]:
                    met_again_at[0] = time.monotonic() + MEET_AGAIN_AFTER
                    for client, view in unmet:
                        for node in self.nodes:
                            if f":{node.port}@" not in view:
                                client.execute_command("CLUSTER", "MEET", LOOPBACK, node.port)
                return not unmet

            for client in clients[1:]:
                client.execute_command("CLUSTER", "MEET", LOOPBACK, self.nodes[0].port)
            wait_for(met, timeout, "every cluster node to know every other")
            for index, client in enumerate(clients[self.primary_count :]):
                client.execute_command("CLUSTER", "REPLICATE", ids[index % self.primary_count])
            self.wait_ok(timeout)
        finally:
            for client in clients:
                client.close()
        return self

    def state(self, node: RedisServer) -> dict[str, str]:
        client = node.client(timeout=1.0)
        try:
            text = client.execute_command("CLUSTER", "INFO").decode()
        finally:
            client.close()
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every running node says ``cluster_state:ok`` and each primary has its
        replicas attached."""

        def settled() -> bool:
            running = [node for node in self.nodes if node.running()]
            if not all(self.state(node)["cluster_state"] == "ok" for node in running):
                return False
            return len(self.primaries()) == self.primary_count

        wait_for(settled, timeout, "the cluster to settle")

    def roles(self) -> dict[int, str]:
        """Port → ``master`` or ``slave`` of every running node, as the nodes see themselves."""
        roles = {}
        for node in self.nodes:
            if not node.running():
                continue
            client = node.client(timeout=1.0)
            try:
                roles[node.port] = client.execute_command("ROLE")[0].decode()
            finally:
                client.close()
        return roles

    def primaries(self) -> list[RedisServer]:
        roles = self.roles()
        return [node for node in self.nodes if roles.get(node.port) == "master"]

    def node_for_slot(self, slot: int) -> RedisServer:
        """The running primary serving ``slot`` now."""
        for node in self.primaries():
            client = node.client(timeout=1.0)
            try:
                for first, last, owner, *_replicas in client.execute_command("CLUSTER", "SLOTS"):
                    if first <= slot <= last:
                        return next(n for n in self.nodes if n.port == int(owner[1]))
            finally:
                client.close()
        raise LookupError(f"no primary serves slot {slot}")

    def node_id(self, node: RedisServer) -> str:
        client = node.client(timeout=5.0)
        try:
            return str(client.execute_command("CLUSTER", "MYID").decode())
        finally:
            client.close()

    def begin_migration(self, slot: int, source: RedisServer, target: RedisServer) -> None:
        """Mark ``slot`` importing on ``target`` and migrating on ``source`` (what
        ``redis-cli --cluster reshard`` does first): from now on ``source`` answers ``ASK``
        for the slot's keys it no longer has."""
        source_id, target_id = self.node_id(source), self.node_id(target)
        with contextlib.closing(target.client()) as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        with contextlib.closing(source.client()) as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)

    def migrate_keys(
        self, slot: int, source: RedisServer, target: RedisServer, batch: int = 10
    ) -> int:
        """Move up to ``batch`` of the slot's keys from ``source`` to ``target`` with one
        ``MIGRATE`` (atomic per call); how many were moved."""
        with contextlib.closing(source.client()) as client:
            keys = client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if keys:
                client.execute_command("MIGRATE", LOOPBACK, target.port, "", 0, 5000, "KEYS", *keys)
        return len(keys)

    def end_migration(self, slot: int, target: RedisServer) -> None:
        """Give ``slot`` to ``target`` on every primary (``SETSLOT … NODE``): the others
        answer ``MOVED`` for it from now on."""
        target_id = self.node_id(target)
        for node in [target, *(n for n in self.primaries() if n is not target)]:
            with contextlib.closing(node.client()) as client:
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def move_slot(self, slot: int, target: RedisServer) -> None:
        """Reshard ``slot`` to ``target`` with all its keys, as ``redis-cli`` does."""
        source = self.node_for_slot(slot)
        self.begin_migration(slot, source, target)
        while self.migrate_keys(slot, source, target):
            pass
        self.end_migration(slot, target)

    def client(self) -> redis.RedisCluster:
        """A cluster client of our own with generous timeouts, for setup and reading state."""
        return redis.RedisCluster(
            host=LOOPBACK,
            port=self.nodes[0].port,
            socket_timeout=10,
            socket_connect_timeout=10,
            **(self.nodes[0].tls_options() if isinstance(self.nodes[0], TLSServer) else {}),
        )

    @contextlib.contextmanager
    def paused(self, node: RedisServer) -> Iterator[None]:
        """``node`` stopped (SIGSTOP) with no replica taking over meanwhile: a test of a
        primary that does not answer must not race the cluster's own failover, which a
        pause longer than ``cluster-node-timeout`` would start."""
        replicas = [n for n in self.nodes if n.running() and n not in self.primaries()]
        node_id = self.node_id(node)
        for replica in replicas:
            self._configure(replica, "cluster-replica-no-failover", "yes")
        node.pause()
        try:
            yield
        finally:
            node.resume()
            # A pause longer than cluster-node-timeout leaves the node flagged as failing;
            # letting the replicas take over before every node sees it again would start
            # the very failover the pause must not race (and the next test would meet it).
            wait_for(
                lambda: not self._flagged_failing(node_id, node),
                30,
                "the resumed node to be seen as healthy",
            )
            for replica in replicas:
                self._configure(replica, "cluster-replica-no-failover", "no")

    def _flagged_failing(self, node_id: str, node: RedisServer) -> bool:
        """Whether any other running node flags ``node_id`` as failing (``fail`` or
        ``fail?`` in ``CLUSTER NODES``)."""
        for other in self.nodes:
            if other is node or not other.running():
                continue
            client = other.client(timeout=1.0)
            try:
                text = client.execute_command("CLUSTER", "NODES").decode()
            finally:
                client.close()
            for line in text.splitlines():
                fields = line.split()
                if fields and fields[0] == node_id and "fail" in fields[2]:
                    return True
        return False

    @staticmethod
    def _configure(node: RedisServer, name: str, value: str) -> None:
        client = node.client(timeout=5.0)
        try:
            client.config_set(name, value)
        finally:
            client.close()

    def flushall(self) -> None:
        for node in self.primaries():
            client = node.client()
            try:
                client.flushall()
            finally:
                client.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class SentinelServer(RedisServer):
    """A ``redis-server --sentinel`` with a config file of its own (sentinels rewrite it)."""

    def __init__(self, primary_port: int, *, quorum: int, password: str | None = None) -> None:
        super().__init__()
        self.primary_port = primary_port
        self.quorum = quorum
        self.password = password
        self.url = f"redis://{LOOPBACK}:{self.port}"

    def command(self) -> list[str]:
        config = Path(self._dir.name) / "sentinel.conf"
        lines = [
            f"port {self.port}",
            f"bind {LOOPBACK}",
            f"dir {self._dir.name}",
            f"sentinel monitor mymaster {LOOPBACK} {self.primary_port} {self.quorum}",
            "sentinel down-after-milliseconds mymaster 1000",
            "sentinel failover-timeout mymaster 5000",
            "sentinel parallel-syncs mymaster 1",
            "loglevel warning",
        ]
        if self.password:
            # The sentinels talk to each other with the same password.
            lines += [f"requirepass {self.password}", f"sentinel sentinel-pass {self.password}"]
        if not config.exists():  # a restart keeps what the sentinel learned
            config.write_text("\n".join(lines) + "\n")
        command = super().command()
        return [command[0], str(config), "--sentinel"]


class LocalSentinel:
    """One primary, ``replicas`` replicas and ``sentinels`` sentinels (quorum: a majority)."""

    service = "mymaster"

    def __init__(
        self, replicas: int = 2, sentinels: int = 3, sentinel_password: str | None = None
    ) -> None:
        self.primary = RedisServer()
        self.replicas = [
            RedisServer(extra_args=("--replicaof", LOOPBACK, str(self.primary.port)))
            for _ in range(replicas)
        ]
        self.sentinel_password = sentinel_password
        self.sentinels = [
            SentinelServer(self.primary.port, quorum=sentinels // 2 + 1, password=sentinel_password)
            for _ in range(sentinels)
        ]

    @property
    def servers(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    @property
    def url(self) -> str:
        hosts = ",".join(f"{LOOPBACK}:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}"

    def sentinel_client(self, sentinel: SentinelServer) -> redis.Redis:
        return redis.Redis(
            host=LOOPBACK,
            port=sentinel.port,
            password=self.sentinel_password,
            socket_timeout=5,
            socket_connect_timeout=5,
        )

    def primary_port(self) -> int:
        """The primary's port as the first answering sentinel says now."""
        for sentinel in self.sentinels:
            if not sentinel.running():
                continue
            client = self.sentinel_client(sentinel)
            try:
                with contextlib.suppress(redis.RedisError):
                    _host, port = client.sentinel_get_master_addr_by_name(self.service)
                    return int(port)
            finally:
                client.close()
        raise RuntimeError("no sentinel answered")

    def server_on(self, port: int) -> RedisServer:
        return next(server for server in self.servers if server.port == port)

    def start(self, timeout: float = 30.0) -> LocalSentinel:
        for server in self.servers:
            server.start()
        for sentinel in self.sentinels:
            sentinel.start()
        self.wait_settled(timeout)
        return self

    def wait_settled(self, timeout: float = 30.0) -> None:
        """Until every sentinel knows the others and the primary's replicas are in sync."""

        def settled() -> bool:
            for sentinel in self.sentinels:
                client = self.sentinel_client(sentinel)
                try:
                    fields = client.sentinel_master(self.service)
                finally:
                    client.close()
                if int(fields["num-other-sentinels"]) < len(self.sentinels) - 1:
                    return False
                if int(fields["num-slaves"]) < len(self.replicas):
                    return False
            primary = self.server_on(self.primary_port()).client(timeout=1.0)
            try:
                replication = primary.info("replication")
            finally:
                primary.close()
            online = [
                value
                for key, value in replication.items()
                if key.startswith("slave") and isinstance(value, dict)
            ]
            return len(online) == len(self.replicas) and all(
                replica.get("state") == "online" for replica in online
            )

        wait_for(settled, timeout, "the sentinels and replicas to settle")

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()


class TLSServer(RedisServer):
    """A ``redis-server`` that speaks only TLS on its port, its certificates made by a CA of
    the test's own. ``client_certificates`` says whether the server requires a client
    certificate (mutual TLS, ``tls-auth-clients yes``)."""

    def __init__(
        self,
        port: int | None = None,
        *,
        client_certificates: bool = False,
        names: tuple[str, ...] = (LOOPBACK, "localhost"),
        extra_args: tuple[str, ...] = (),
        ca: Any = None,
    ) -> None:
        import trustme

        super().__init__(port, extra_args=extra_args)
        self.client_certificates = client_certificates
        self.names = names
        directory = Path(self._dir.name)
        #: The certificate authority (a cluster's nodes share one: ``ca``).
        self.ca = ca if ca is not None else trustme.CA()
        server_cert = self.ca.issue_cert(*names)
        client_cert = self.ca.issue_cert("django-throttle-client")
        self.ca_file = directory / "ca.pem"
        self.cert_file = directory / "server.pem"
        self.key_file = directory / "server.key"
        self.client_cert_file = directory / "client.pem"
        self.client_key_file = directory / "client.key"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        server_cert.cert_chain_pems[0].write_to_path(str(self.cert_file))
        server_cert.private_key_pem.write_to_path(str(self.key_file))
        client_cert.cert_chain_pems[0].write_to_path(str(self.client_cert_file))
        client_cert.private_key_pem.write_to_path(str(self.client_key_file))
        self.url = f"rediss://{LOOPBACK}:{self.port}/0"

    def command(self) -> list[str]:
        command = super().command()
        at = command.index("--port")
        command[at : at + 2] = ["--port", "0", "--tls-port", str(self.port)]
        return [
            *command,
            "--tls-cert-file", str(self.cert_file),
            "--tls-key-file", str(self.key_file),
            "--tls-ca-cert-file", str(self.ca_file),
            "--tls-auth-clients", "yes" if self.client_certificates else "no",
        ]  # fmt: skip

    def tls_options(self) -> dict[str, Any]:
        """redis-py options of a client that trusts this server's CA (and presents the client
        certificate when the server asks for one)."""
        options: dict[str, Any] = {
            "ssl": True,
            "ssl_ca_certs": str(self.ca_file),
            "ssl_check_hostname": LOOPBACK in self.names,
        }
        if self.client_certificates:
            options |= {
                "ssl_certfile": str(self.client_cert_file),
                "ssl_keyfile": str(self.client_key_file),
            }
        return options

    def answering(self) -> bool:
        client = redis.Redis(
            host=LOOPBACK, port=self.port, socket_timeout=0.5, **self.tls_options()
        )
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def client(self, timeout: float = 10.0) -> redis.Redis:
        return redis.Redis(
            host=LOOPBACK,
            port=self.port,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            **self.tls_options(),
        )


@contextlib.contextmanager
def running(topology: Any) -> Iterator[Any]:
    """Start ``topology``, yield it, stop every process it started."""
    try:
        yield topology.start()
    finally:
        topology.stop()
