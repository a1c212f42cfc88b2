"""The local topologies of :mod:`tests.topologies` are what later suites rely on: a cluster
whose slots are all served and whose killed primary's replica takes over, and a Sentinel set
whose failover the sentinels announce. Marked slow: they start 6 to 9 processes each."""

from __future__ import annotations

import time

import pytest
import redis

from tests.redis_servers import LOOPBACK, RedisServer
from tests.topologies import SLOTS, LocalCluster, LocalSentinel, replicated, running, wait_for

pytestmark = pytest.mark.slow


def test_a_local_cluster_starts_though_a_meet_was_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node whose first ``CLUSTER MEET`` came to nothing (here: never sent; on a loaded
    machine, a handshake that timed out) meets the nodes it lacks again, and the cluster
    starts: the cluster would never retry it, and CI's Valkey pass once waited 30 s for it."""
    lost: list[tuple[object, ...]] = []
    send = redis.Redis.execute_command

    def losing_the_first_meet(self: redis.Redis, *args: object, **options: object) -> object:
        if args[:2] == ("CLUSTER", "MEET") and not lost:
            lost.append(args)
            return b"OK"
        return send(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", losing_the_first_meet)
    with running(LocalCluster(primaries=3, replicas=0)) as cluster:
        monkeypatch.undo()
        assert lost
        assert len(cluster.primaries()) == 3


def test_a_local_cluster_serves_every_slot_and_fails_over() -> None:
    with running(LocalCluster(primaries=3, replicas=1)) as cluster:
        primaries = cluster.primaries()
        assert len(primaries) == 3
        assert sorted(cluster.roles().values()) == ["master"] * 3 + ["slave"] * 3
        client = cluster.client()
        try:
            for n in range(300):
                client.set(f"k{n}", n)
            slot = client.keyslot("k1")
            victim = cluster.node_for_slot(slot)
            direct = victim.client()
            # Its replica has the writes (it may still be in its first sync on a loaded machine).
            replicated(direct, 1, timeout=30)
            direct.close()
            victim.kill()
            started = time.monotonic()
            wait_for(lambda: cluster.node_for_slot(slot).port != victim.port, 30, "a promotion")
            cluster.wait_ok()
            promoted_after = time.monotonic() - started
            assert promoted_after < 15
            assert int(client.get("k1")) == 1  # the replica had it, the client followed
            served = {cluster.node_for_slot(s).port for s in (0, SLOTS // 2, SLOTS - 1)}
            assert len(served) == 3 and victim.port not in served
        finally:
            client.close()


def test_a_local_sentinel_set_announces_its_failover() -> None:
    with running(LocalSentinel(sentinel_password="sentinel-secret")) as topology:
        sentinel = redis.Sentinel(
            [(LOOPBACK, server.port) for server in topology.sentinels],
            sentinel_kwargs={"password": "sentinel-secret"},
            socket_timeout=2,
        )
        primary = sentinel.master_for(topology.service, socket_timeout=2)
        primary.set("before", 1)
        old = topology.primary_port()
        topology.server_on(old).kill()
        wait_for(lambda: topology.primary_port() != old, 30, "the sentinels to promote a replica")
        wait_for(lambda: primary.set("after", 2), 30, "the client to follow the new primary")
        assert sentinel.discover_master(topology.service)[1] == topology.primary_port()
        assert int(primary.get("before")) == 1


def test_replicated_waits_for_writes_made_on_another_connection() -> None:
    """``replicated`` holds until the replica has what other clients wrote: on Valkey, a bare
    ``WAIT`` on a connection that wrote nothing answers at once with every connected replica
    (the Sentinel lease test's failover lost writes this way), so a hung replica makes
    ``replicated`` fail, not pass, and once it answers its copy holds the write."""
    primary = RedisServer().start()
    replica = RedisServer(extra_args=("--replicaof", LOOPBACK, str(primary.port))).start()
    try:
        with primary.client() as writer, primary.client() as waiter:
            replicated(writer, 1, timeout=30)  # the first sync is done
            replica.pause()
            writer.set("written", 1, px=60_000)
            # A bare WAIT here answers "1 replica" at once on Valkey 9 (Redis 7.0 waits).
            with pytest.raises(AssertionError, match="0 of 1 replicas"):
                replicated(waiter, 1, timeout=0.5)
            replica.resume()
            replicated(waiter, 1)
        with replica.client() as copy:
            assert copy.get("written") == b"1"
    finally:
        replica.resume()
        replica.stop()
        primary.stop()
