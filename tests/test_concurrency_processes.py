"""Concurrency limits hold across processes, on real Redis servers the suite starts: 4 worker
processes x 50 threads never have more requests in flight than the limit (on one server and
on a Redis Cluster); a real WSGI server gives its slots back after a view raised and after a
client dropped a stream, and the slots of a SIGKILLed server end with their leases, as
Redis's clock tells; on a cluster a client's leases are released and renewed in one slot."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from django_throttle.backends import get_backend
from django_throttle.backends.redis import RedisBackend
from django_throttle.rates import Algorithm, Limit
from tests.redis_servers import LOOPBACK
from tests.topologies import LocalCluster

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = 4
THREADS = 50
#: Requests in flight at once, per client.
LIMIT = 5
CLIENT = "user:racer"
#: Generous timeouts: 200 threads share a loaded machine.
PATIENT = {"socket_timeout": 10, "socket_connect_timeout": 10}


def race_limits() -> tuple[Limit, ...]:
    return (Limit.build("exports", f"{LIMIT}/min", algorithm=Algorithm.CONCURRENCY),)


# -- 4 processes x 50 threads ----------------------------------------------------------------


def _racer(url: str, prefix: str, barrier: Any, in_flight: Any, most: Any, results: Any) -> None:
    """One worker process: ``THREADS`` threads, released together, each hit until allowed
    (a refusal is retried after 5 to 20 ms), then hold the slot 10 to 50 ms counted in the
    shared ``in_flight`` (its peak in ``most``), then release it. Reports (allowed, refused,
    slots released, errors)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings

    settings.DJANGO_THROTTLE_KEY_PREFIX = prefix
    if url.startswith("redis+cluster://"):
        settings.DJANGO_THROTTLE_REDIS_URL = f"{url}?shards=16"
        settings.DJANGO_THROTTLE_REDIS_OPTIONS = {**PATIENT, "timeout": 10}
    else:
        settings.DJANGO_THROTTLE_REDIS_URL = url
        settings.DJANGO_THROTTLE_REDIS_OPTIONS = PATIENT
    backend = RedisBackend()
    assert backend.on_cluster == url.startswith("redis+cluster://")
    limits = race_limits()
    lock = threading.Lock()
    tally = {"allowed": 0, "refused": 0, "released": 0}
    errors: list[str] = []

    def one() -> None:
        try:
            backend.peek("warm-up", limits)  # script loaded, a connection each
            barrier.wait(timeout=60)
            refused = 0
            while not (decision := backend.hit(CLIENT, limits)).allowed:
                refused += 1
                time.sleep(random.uniform(0.005, 0.02))
            [(client, lease)] = decision.leases
            with in_flight.get_lock():
                in_flight.value += 1
                most.value = max(most.value, in_flight.value)
            time.sleep(random.uniform(0.01, 0.05))
            with in_flight.get_lock():
                in_flight.value -= 1
            released = backend.release(client, limits, lease)
            with lock:
                tally["allowed"] += 1
                tally["refused"] += refused
                tally["released"] += released
        except Exception as error:
            with lock:
                errors.append(repr(error))

    threads = [threading.Thread(target=one) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    backend.close()
    results.put((tally["allowed"], tally["refused"], tally["released"], errors))


def race(url: str, prefix: str) -> tuple[int, int]:
    """``PROCESSES`` spawned processes x ``THREADS`` threads race for ``LIMIT`` slots of one
    client until every thread got through once: never more than ``LIMIT`` in flight, every
    slot given back. Returns (peak in flight, refusals)."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES * THREADS)
    in_flight, most = context.Value("i", 0), context.Value("i", 0)
    results = context.Queue()
    processes = [
        context.Process(
            target=_racer, args=(url, prefix, barrier, in_flight, most, results), daemon=True
        )
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    try:
        reports = [results.get(timeout=90) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    errors = [error for report in reports for error in report[3]]
    assert not errors, errors[:5]
    allowed = sum(report[0] for report in reports)
    refused = sum(report[1] for report in reports)
    released = sum(report[2] for report in reports)
    assert (allowed, released) == (PROCESSES * THREADS, PROCESSES * THREADS)
    assert in_flight.value == 0
    assert most.value <= LIMIT, most.value
    # 200 threads after 5 slots: the limit is reached, and refusals are many.
    assert most.value == LIMIT and refused > 0
    return most.value, refused


def redis_now(client: redis.Redis) -> int:
    """Redis's clock, in microseconds."""
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def live_leases(client: redis.Redis, key: str) -> int:
    """Leases of ``key`` that have not ended by Redis's clock (0 when the key is gone)."""
    return int(client.zcount(key, f"({redis_now(client)}", "+inf"))


def test_4_processes_x_50_threads_never_hold_more_than_the_limit(
    redis_url: str, redis_client: redis.Redis, _isolated_throttle: str
) -> None:
    race(redis_url, _isolated_throttle)
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    key = backend.key(CLIENT, race_limits()[0])
    assert live_leases(redis_client, key) == 0
    assert not redis_client.exists(key)  # the last release deleted it
    for left in redis_client.scan_iter(match=f"{_isolated_throttle}:*", count=1000):
        assert redis_client.pttl(left) > 0, left


# -- a real WSGI server: exceptions, dropped streams, SIGKILL --------------------------------

#: A threaded WSGI server over the tests' settings and tests/concurrency_views.py, counting
#: on the suite's Redis under the key prefix it is given.
SERVER = """
import sys
from django.conf import settings
settings.DJANGO_THROTTLE_KEY_PREFIX = sys.argv[1]
settings.ROOT_URLCONF = "tests.concurrency_views"
import django
django.setup()
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from django.core.wsgi import get_wsgi_application

class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass

class Threaded(ThreadingMixIn, WSGIServer):
    daemon_threads = True

server = make_server(
    "127.0.0.1", 0, get_wsgi_application(), server_class=Threaded, handler_class=Quiet
)
print(server.server_port, flush=True)
server.serve_forever()
"""


@contextlib.contextmanager
def wsgi_server(prefix: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A server process and its base URL; killed on leaving if still running."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'server.sqlite3'}",
        "PYTHONPATH": str(ROOT),
    }
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, prefix], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    try:
        port = int(server.stdout.readline())
        yield server, f"http://{LOOPBACK}:{port}"
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(timeout=30)
        server.stdout.close()


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def hang(url: str) -> None:
    """A request that blocks until its server is killed."""
    with contextlib.suppress(OSError):
        status(url)


def drop_stream(base: str) -> None:
    """GET the endless stream, read its first chunk, then reset the connection (the client
    went away mid-response)."""
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection((LOOPBACK, port), timeout=10) as sock:
        sock.sendall(b"GET /streams/ HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        received = b""
        while b"chunk 0\n" not in received:
            data = sock.recv(4096)
            assert data, received
            received += data
        assert received.startswith(b"HTTP/1.0 200") or received.startswith(b"HTTP/1.1 200")
        # Close with unread data and no linger: a reset, as a client gone away sends.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def leases(client: redis.Redis, key: str) -> dict[bytes, int]:
    """Each lease of ``key`` and the microsecond it ends."""
    found: Any = client.zrange(key, 0, -1, withscores=True)
    return {lease: int(end) for lease, end in found}


#: How late after the first lease ends by Redis's clock a probe may first be let through:
#: probes go every 0.1 s, each a round trip to the server (slack for a loaded machine).
FREED_WITHIN_S = 1.0
#: How late a renewal may come after its third of the period (a loaded machine).
RENEWED_WITHIN_S = 0.5


def test_slots_are_freed_after_errors_dropped_streams_and_a_killed_server_s_leases(
    redis_client: redis.Redis, _isolated_throttle: str, tmp_path: Path
) -> None:
    from tests.concurrency_views import limit_of

    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    client = "ip:127.0.0.1"
    keys = {view: backend.key(client, limit_of(view)) for view in ("raises", "streams", "blocks")}
    prefix = _isolated_throttle
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    with wsgi_server(prefix, first_dir) as (server, base):
        # A view that raises gives its slot back: more of them than the limit all get to it.
        assert [status(f"{base}/raises/") for _ in range(6)] == [500] * 6
        assert live_leases(redis_client, keys["raises"]) == 0

        # A stream read to its end, then streams the client drops: each slot is given back
        # once the server finds the client gone (its next write fails).
        assert status(f"{base}/streams/?chunks=3") == 200
        assert live_leases(redis_client, keys["streams"]) == 0
        for _ in range(6):
            drop_stream(base)
            wait_until(
                lambda: live_leases(redis_client, keys["streams"]) == 0,
                5.0,
                "a dropped stream kept its slot",
            )

        # Three requests block, holding every slot; a fourth is refused.
        blocked = [
            threading.Thread(target=hang, args=(f"{base}/blocks/",), daemon=True) for _ in range(3)
        ]
        for thread in blocked:
            thread.start()
        wait_until(
            lambda: live_leases(redis_client, keys["blocks"]) == 3, 10.0, "3 requests in flight"
        )
        assert status(f"{base}/blocks/?seconds=0") == 429
        assert status(f"{base}/raises/") == 500  # another view's slots are its own
        # The keeper renews each lease every third of its period (5 s / 3): every end moves.
        taken = leases(redis_client, keys["blocks"])
        wait_until(
            lambda: all(
                leases(redis_client, keys["blocks"]).get(lease, 0) > end
                for lease, end in taken.items()
            ),
            5.0,
            "the leases were not renewed",
        )
        with wsgi_server(prefix, second_dir) as (_, fresh):  # its replacement, already up
            assert status(f"{fresh}/blocks/?seconds=0") == 429
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=30)
            killed_us = redis_now(redis_client)
            assert server.returncode == -signal.SIGKILL
            ends = sorted(leases(redis_client, keys["blocks"]).values())
            # Every lease ends within the period after the kill (renewed last before it).
            assert len(ends) == 3 and max(ends) <= killed_us + 5_000_000, (ends, killed_us)
            # ... and, renewed every third of it, none before two thirds of it after the kill.
            assert min(ends) >= killed_us + (5 * 2 / 3 - RENEWED_WITHIN_S) * 1e6, (ends, killed_us)
            freed_at = ends[0]  # one slot is free once the first lease ends
            refused_after_kill = 0
            while True:
                before = redis_now(redis_client)
                answer = status(f"{fresh}/blocks/?seconds=0")
                after = redis_now(redis_client)
                if after < freed_at:  # decided before the first lease ended: refused
                    assert answer == 429, (before, freed_at)
                    refused_after_kill += 1
                elif before > freed_at:  # decided after: let through
                    assert answer == 200, (before, freed_at)
                    assert before - freed_at <= FREED_WITHIN_S * 1e6
                    break
                elif answer == 200:  # the probe straddled the lease's end
                    break
                time.sleep(0.1)
            assert refused_after_kill > 0
            wait_until(lambda: redis_now(redis_client) > ends[-1], 6.0, "the last lease")
            assert live_leases(redis_client, keys["blocks"]) == 0
            assert [status(f"{fresh}/blocks/?seconds=0") for _ in range(4)] == [200] * 4
    for thread in blocked:
        thread.join(timeout=30)
    for left in redis_client.scan_iter(match=f"{prefix}:*", count=1000):
        assert redis_client.pttl(left) > 0, left


# -- Redis Cluster ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    topology = LocalCluster()
    try:
        yield topology.start()
    finally:
        topology.stop()


def cluster_keys(cluster: LocalCluster, prefix: str) -> list[tuple[bytes, int]]:
    """(key, TTL in ms) of every key under ``prefix`` on every primary."""
    found = []
    for node in cluster.primaries():
        with node.client() as client:
            for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                found.append((key, int(client.pttl(key))))
    return found


def cluster_backend(settings: Any, cluster: LocalCluster) -> RedisBackend:
    cluster.wait_ok()
    settings.DJANGO_THROTTLE_REDIS_URL = f"{cluster.url}?shards=16"
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {**PATIENT, "timeout": 10}
    found = get_backend()
    assert isinstance(found, RedisBackend) and found.on_cluster
    return found


def test_on_a_cluster_4_processes_x_50_threads_never_hold_more_than_the_limit(
    cluster: LocalCluster, settings: Any, _isolated_throttle: str
) -> None:
    race(cluster.url, _isolated_throttle)
    backend = cluster_backend(settings, cluster)
    key = backend.key(CLIENT, race_limits()[0])
    with cluster.node_for_slot(key_slot(key.encode())).client() as client:
        assert live_leases(client, key) == 0
    assert all(ttl > 0 for _, ttl in cluster_keys(cluster, _isolated_throttle))


def test_on_a_cluster_a_clients_leases_are_released_and_renewed_in_one_slot(
    cluster: LocalCluster, settings: Any, _isolated_throttle: str
) -> None:
    backend = cluster_backend(settings, cluster)
    limits = (
        Limit.build("exports", "2/min", algorithm=Algorithm.CONCURRENCY),
        Limit.build("hourly", "100/h"),  # a rate limit alongside: not a lease
        Limit.build("uploads", "1/30s", algorithm=Algorithm.CONCURRENCY),
    )
    leased = (limits[0], limits[2])
    client = "user:cluster"
    keys = [backend.key(client, limit) for limit in leased]
    [slot] = {key_slot(key.encode()) for key in keys}
    node = cluster.node_for_slot(slot)

    first = backend.hit(client, limits)
    assert first.allowed
    [(holder, lease)] = first.leases
    assert holder == client
    assert not backend.hit(client, limits).allowed  # "uploads" holds 1 in flight
    with node.client() as redis_client:
        scores = [redis_client.zscore(key, lease) for key in keys]
        assert all(score is not None for score in scores)
        time.sleep(0.05)
        assert backend.renew(client, limits, lease) == 2
        renewed = [redis_client.zscore(key, lease) for key in keys]
        assert all(new > old for new, old in zip(renewed, scores, strict=True))
        for key, limit in zip(keys, leased, strict=True):
            assert 0 < redis_client.pttl(key) <= limit.rate.period * 1000

        assert backend.release(client, limits, lease) == 2
        assert backend.release(client, limits, lease) == 0  # idempotent
        assert backend.renew(client, limits, lease) == 0  # never revived
        assert [redis_client.exists(key) for key in keys] == [0, 0]

        second = backend.hit(client, limits)  # both slots free again
        assert second.allowed and second.leases[0][1] != lease
        assert all(live_leases(redis_client, key) == 1 for key in keys)
        backend.reset(client, limits)
        assert all(live_leases(redis_client, key) == 0 for key in keys)


def test_on_a_cluster_delayed_requests_are_spaced_one_interval_apart(
    cluster: LocalCluster, settings: Any, _isolated_throttle: str
) -> None:
    """A delaying limit's turns (issue 32's proof, on a cluster): 8 concurrent requests on 2/s
    with a burst of 8 and delay 0 get turns exactly 0.5 s apart on the clock of the primary
    holding the client's key, and each is released at its turn."""
    backend = cluster_backend(settings, cluster)
    limit = Limit.build("paced", "2/s", burst=8, algorithm=Algorithm.GCRA, delay=0)
    client = "user:paced"
    node = cluster.node_for_slot(key_slot(backend.key(client, limit).encode()))

    # Imported here: the module is imported again by each spawned worker process, before
    # Django is set up, and tests.factories imports the package's models.
    from tests.factories import assert_turns_spaced

    with node.client() as redis_client:

        def clock() -> float:
            seconds, micros = redis_client.time()
            return seconds + micros / 1e6

        assert_turns_spaced(lambda: backend.hit(client, [limit]), clock, count=8, interval=0.5)
