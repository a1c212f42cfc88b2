"""Load shedding holds across processes (issue 33's proof), on real Redis servers the suite
starts: 4 worker processes hammer the fleet's in-flight limit with sheddable requests, each
holding its slot about 50 ms, and never have more in flight than the sheddable share (checked
by their own count and by the leases Redis holds); meanwhile critical requests of the main
process are admitted at once while the fleet has room, take the whole capacity once the
sheddable ones drained (every sheddable request refused as shed meanwhile), and afterwards
every lease is given back and every key has a TTL. On one server (capacity 20, sheddable share
50 %) and on a Redis Cluster of 16 key shards (capacity 160: each shard holds 10, 5 of them for
sheddable traffic), where every share is asserted per shard.

The limits are the ones the admin's Service protection compiles to (``compile_shedding``),
counted through the backend API the request path uses (``hit`` and ``release``)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from django_throttle.backends import get_backend
from django_throttle.backends.redis import RedisBackend
from django_throttle.rates import Limit
from tests.topologies import LocalCluster

pytestmark = pytest.mark.slow

PROCESSES = 4
#: How long a sheddable request holds its slot, and how long a refused one waits to retry.
HOLD_S = 0.05
RETRY_S = (0.005, 0.02)
#: Generous timeouts: every thread of 4 processes shares a loaded machine.
PATIENT = {"socket_timeout": 10, "socket_connect_timeout": 10}
#: Bounded waits (a loaded machine; none of them is reached when all is well).
SATURATED_WITHIN_S = 30.0
DRAINED_WITHIN_S = 10.0
#: How long the critical requests hold the whole fleet while the sheddable ones keep trying.
HELD_FULL_S = 0.3


@dataclass(frozen=True)
class Fleet:
    """One setting of the test: the capacity, the key shards it is split over, the threads
    of each worker process."""

    capacity: int
    shards: int
    threads: int

    def limits(self) -> tuple[Limit, Limit]:
        """The sheddable and the critical fleet limit, as Service protection compiles them
        (the sheddable share 50 %)."""
        # Imported here: a worker process unpickles this module before Django is set up.
        from django_throttle.models import Protection
        from django_throttle.policy.live import compile_shedding

        row = Protection(in_flight=self.capacity, default_share=50, sheddable_share=50, lease=60)
        shedding = compile_shedding(row)
        assert shedding is not None
        return shedding.fleet["sheddable"], shedding.fleet["critical"]

    @property
    def per_shard(self) -> int:
        return self.capacity // self.shards

    @property
    def sheddable_per_shard(self) -> int:
        return self.per_shard // 2


ONE_SERVER = Fleet(capacity=20, shards=1, threads=10)
#: 4 x 40 threads: 10 per shard, twice the sheddable share of each.
CLUSTER = Fleet(capacity=160, shards=16, threads=40)


def configure(settings: Any, url: str, prefix: str, shards: int) -> None:
    """The throttle ``settings`` of a process: ``url`` (a cluster URL with ``shards`` shards)."""
    settings.DJANGO_THROTTLE_KEY_PREFIX = prefix
    if url.startswith("redis+cluster://"):
        settings.DJANGO_THROTTLE_REDIS_URL = f"{url}?shards={shards}"
        settings.DJANGO_THROTTLE_REDIS_OPTIONS = {**PATIENT, "timeout": 10}
    else:
        settings.DJANGO_THROTTLE_REDIS_URL = url
        settings.DJANGO_THROTTLE_REDIS_OPTIONS = PATIENT


# -- the worker processes --------------------------------------------------------------------


def _sheddable_worker(
    url: str,
    prefix: str,
    fleet: Fleet,
    clients: list[tuple[str, int]],
    stop: Any,
    lock: Any,
    in_flight: Any,
    most: Any,
    admitted: Any,
    results: Any,
) -> None:
    """One worker process: a thread per ``(client, shard)`` of ``clients``, each taking a
    sheddable slot until ``stop`` is set (a refusal is retried after 5 to 20 ms), holding it
    ``HOLD_S`` counted in the shared ``in_flight[shard]`` (its peak in ``most[shard]``), then
    giving it back. Reports (allowed, refused, released, refusals not shed, errors)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings

    configure(settings, url, prefix, fleet.shards)
    backend = RedisBackend()
    sheddable = fleet.limits()[0]
    tally = {"allowed": 0, "refused": 0, "released": 0, "not_shed": 0}
    errors: list[str] = []
    tally_lock = threading.Lock()

    def one(client: str, shard: int) -> None:
        counts = dict.fromkeys(tally, 0)
        try:
            deadline = time.monotonic() + 120  # bounded, whatever happens to the main process
            while not stop.is_set() and time.monotonic() < deadline:
                decision = backend.hit(client, [sheddable])
                if not decision.allowed:
                    counts["refused"] += 1
                    counts["not_shed"] += not decision.shed
                    time.sleep(random.uniform(*RETRY_S))
                    continue
                [(holder, lease)] = decision.leases
                with lock:
                    in_flight[shard] += 1
                    most[shard] = max(most[shard], in_flight[shard])
                    admitted.value += 1
                time.sleep(HOLD_S)
                with lock:
                    in_flight[shard] -= 1
                counts["released"] += backend.release(holder, [sheddable], lease)
                counts["allowed"] += 1
        except Exception as error:
            errors.append(repr(error))
        with tally_lock:
            for name, count in counts.items():
                tally[name] += count

    threads = [threading.Thread(target=one, args=pair) for pair in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    backend.close()
    results.put((tally, errors))


# -- the main process ------------------------------------------------------------------------


def clients_by_shard(backend: RedisBackend, limit: Limit, per_shard: int) -> list[list[str]]:
    """``per_shard`` client names for each shard, in shard order (the order of
    ``fleet_keys``), found by the key the backend gives each client's fleet slot."""
    keys = fleet_keys(backend, limit)
    found: list[list[str]] = [[] for _ in keys]
    n = 0
    while any(len(names) < per_shard for names in found):
        client = f"user:shed{n}"
        names = found[keys.index(backend.key(client, limit))]
        if len(names) < per_shard:
            names.append(client)
        n += 1
    return found


def fleet_keys(backend: RedisBackend, limit: Limit) -> list[str]:
    """The fleet limit's key in every shard (one on a single server)."""
    keys: list[str] = []
    n = 0
    while len(keys) < backend.shards:
        key = backend.key(f"probe:{n}", limit)
        if key not in keys:
            keys.append(key)
        n += 1
        assert n < 100_000
    return sorted(keys)


def redis_now(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def live_leases(client: redis.Redis, key: str) -> int:
    """Leases of ``key`` that have not ended by Redis's clock (0 when the key is gone)."""
    return int(client.zcount(key, f"({redis_now(client)}", "+inf"))


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


class Sampler:
    """A thread reading the live leases of every shard's fleet key every few ms; its peak
    per shard until ``mark()`` (while only sheddable requests run)."""

    def __init__(self, nodes: list[redis.Redis], keys: list[str]) -> None:
        self.nodes, self.keys = nodes, keys
        self.peak = [0] * len(keys)
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            for shard, (node, key) in enumerate(zip(self.nodes, self.keys, strict=True)):
                self.peak[shard] = max(self.peak[shard], live_leases(node, key))
            self.samples += 1
            self.stop.wait(0.002)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def prove(
    url: str, prefix: str, fleet: Fleet, backend: RedisBackend, node_of: Callable[[str], Any]
) -> dict[str, Any]:
    """Run the proof on ``backend`` (the main process's, on the workers' Redis at ``url``);
    ``node_of(key)`` is a context manager giving a client of the node holding ``key``.
    Returns what was counted."""
    sheddable, critical = fleet.limits()
    keys = fleet_keys(backend, sheddable)
    assert len(keys) == fleet.shards
    assert [backend.key(f"x{n}", critical) in keys for n in range(20)] == [True] * 20
    share, full = fleet.sheddable_per_shard, fleet.per_shard
    assert share * 2 == full and share >= 5  # every shard: 10 slots, 5 for sheddable traffic
    threads_per_shard = PROCESSES * fleet.threads // fleet.shards
    assert threads_per_shard >= 2 * share  # saturated: twice as many threads as the share
    clients = clients_by_shard(backend, sheddable, threads_per_shard + 1)
    # The last client of each shard is the main process's, for its critical requests.
    main_clients = [names.pop() for names in clients]
    pairs = [(name, shard) for shard, names in enumerate(clients) for name in names]
    random.Random(33).shuffle(pairs)
    per_process = [pairs[n::PROCESSES] for n in range(PROCESSES)]

    context = multiprocessing.get_context("spawn")
    stop, lock = context.Event(), context.Lock()
    in_flight = context.Array("i", fleet.shards, lock=False)
    most = context.Array("i", fleet.shards, lock=False)
    admitted = context.Value("i", 0, lock=False)
    results = context.Queue()
    processes = [
        context.Process(
            target=_sheddable_worker,
            args=(url, prefix, fleet, chunk, stop, lock, in_flight, most, admitted, results),
            daemon=True,
        )
        for chunk in per_process
    ]
    found: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        nodes = [stack.enter_context(node_of(key)) for key in keys]
        for process in processes:
            process.start()
        try:
            with Sampler(nodes, keys) as sampler:
                # 1. Sheddable traffic alone: every shard reaches its share, never more.
                wait_until(
                    lambda: (
                        all(p.is_alive() for p in processes)
                        and all(most[shard] == share for shard in range(fleet.shards))
                    ),
                    SATURATED_WITHIN_S,
                    f"the sheddable share was not reached: {list(most)}",
                )
                time.sleep(0.5)  # half a second more of saturation, sampled
                sampler.stop.set()
            assert sampler.samples > 0
            assert all(0 < peak <= share for peak in sampler.peak), sampler.peak
            found["sheddable_peak_by_redis"] = list(sampler.peak)

            # 2. Critical requests, the fleet saturated by sheddable ones: the reserve (the
            # capacity less the sheddable share) is admitted at once, on every shard.
            held: list[tuple[str, str]] = []
            for client in main_clients:
                for _ in range(full - share):
                    decision = backend.hit(client, [critical])
                    assert decision.allowed, (client, decision)
                    held.extend(decision.leases)
            found["critical_admitted_at_once"] = len(held)

            # 3. With the reserve held, no sheddable request gets in: those in flight end,
            # and critical requests take the rest, up to the whole capacity.
            refused = 0
            for shard, client in enumerate(main_clients):
                mine = full - share
                deadline = time.monotonic() + DRAINED_WITHIN_S
                while mine < full:
                    assert time.monotonic() < deadline, f"shard {shard}: {mine} of {full}"
                    decision = backend.hit(client, [critical])
                    if decision.allowed:
                        held.extend(decision.leases)
                        mine += 1
                    else:
                        assert decision.shed and decision.retry_after <= 1, decision
                        refused += 1
                        time.sleep(0.01)
                over = backend.hit(client, [critical])
                assert not over.allowed and over.shed, over  # the whole capacity: no more
            assert len(held) == fleet.capacity
            found["critical_refused_while_draining"] = refused
            before = admitted.value
            time.sleep(HELD_FULL_S)  # the sheddable threads keep trying meanwhile
            assert admitted.value == before, "a sheddable request got in past the critical"
            assert list(in_flight) == [0] * fleet.shards
            assert [live_leases(node, key) for node, key in zip(nodes, keys, strict=True)] == [
                full
            ] * fleet.shards

            # 4. The critical requests end: sheddable traffic gets its share back.
            for client, lease in held:
                assert backend.release(client, [critical], lease) == 1
            resumed = admitted.value
            wait_until(
                lambda: admitted.value >= resumed + fleet.capacity,
                SATURATED_WITHIN_S,
                "sheddable traffic did not resume",
            )
        finally:
            stop.set()
            reports = [results.get(timeout=60) for _ in processes]
            for process in processes:
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
        errors = [error for _, errs in reports for error in errs]
        assert not errors, errors[:5]
        tally = {name: sum(report[0][name] for report in reports) for name in reports[0][0]}
        assert tally["allowed"] == tally["released"] == admitted.value > 0, tally
        assert tally["refused"] > 0 and tally["not_shed"] == 0, tally
        # The workers' own count never went past the share, on any shard.
        assert list(most) == [share] * fleet.shards, list(most)
        assert list(in_flight) == [0] * fleet.shards
        # Every lease was given back: no live lease, and every key left has a TTL.
        assert [live_leases(node, key) for node, key in zip(nodes, keys, strict=True)] == [
            0
        ] * fleet.shards
    found.update(tally)
    return found


# -- one server ------------------------------------------------------------------------------


def test_critical_traffic_keeps_its_share_while_4_processes_saturate_the_fleet(
    redis_url: str, redis_admin_url: str, redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    backend = get_backend()
    assert isinstance(backend, RedisBackend) and backend.shards == 1

    def node_of(key: str) -> Any:
        return redis.Redis.from_url(redis_admin_url)

    found = prove(redis_url, _isolated_throttle, ONE_SERVER, backend, node_of)
    print("one server:", found)
    for left in redis_client.scan_iter(match=f"{_isolated_throttle}:*", count=1000):
        assert redis_client.pttl(left) > 0, left


# -- Redis Cluster ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    topology = LocalCluster()
    try:
        yield topology.start()
    finally:
        topology.stop()


def test_on_a_cluster_critical_traffic_keeps_its_share_of_every_shard(
    cluster: LocalCluster, settings: Any, _isolated_throttle: str
) -> None:
    cluster.wait_ok()
    configure(settings, cluster.url, _isolated_throttle, CLUSTER.shards)
    backend = get_backend()
    assert isinstance(backend, RedisBackend) and backend.on_cluster
    assert backend.shards == CLUSTER.shards

    def node_of(key: str) -> Any:
        return cluster.node_for_slot(key_slot(key.encode())).client()

    found = prove(cluster.url, _isolated_throttle, CLUSTER, backend, node_of)
    print("cluster:", found)
    for node in cluster.primaries():
        with node.client() as client:
            for left in client.scan_iter(match=f"{_isolated_throttle}:*", count=1000):
                assert client.pttl(left) > 0, left
