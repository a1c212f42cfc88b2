"""A Sentinel-managed primary (``redis+sentinel://``) on the counting path, against a Sentinel
set this module starts (:class:`tests.topologies.LocalSentinel`: 1 primary, 2 replicas, 3
sentinels): every algorithm exact, sync and async; the primary's ACL user from the URL and
the sentinels' own password from ``sentinel_kwargs``; counting only on the primary; a failover
under load (the primary killed while threads count) that costs nothing but
:class:`~django_throttle.backends.base.BackendError` and is exact again right after the
promotion; every key written (every algorithm, usage counted) with a TTL on the primary and
only replicated to the replicas; and ``manage.py check`` on Sentinel URLs.

Marked slow: the failover, 4 processes x 16 threads on one client through the
``redis+sentinel://`` URL (every algorithm admits exactly its limit), and ``SCRIPT FLUSH`` on
the primary and every replica while threads and coroutines count (no failed decision, every
client admitted exactly its limit)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import pytest

from django_throttle.backends import get_backend
from django_throttle.backends.base import BackendError
from django_throttle.backends.redis import RedisBackend
from django_throttle.backends.redis_clients import SentinelURL, parse_sentinel_url
from django_throttle.backends.redis_nodes import CircuitBreaker, CircuitOpen
from django_throttle.checks import check_settings
from django_throttle.rates import Algorithm, Limit
from django_throttle.usage.accounting import get_store
from tests.redis_servers import LOOPBACK
from tests.topologies import LocalSentinel, replicated, wait_for

#: Generous timeouts: the machine is shared and loaded; a kill is refused at once anyway.
SLOW_MACHINE = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0, "timeout": 1.0}
#: Every connection of the backend carries this name, so CLIENT LIST finds them.
NAME = "throttle-sentinel-test"
LIMIT = 5
SENTINEL_PASSWORD = "sentinel-secret"
#: The primary's ACL user, with characters a URL must percent-encode.
USER, PASSWORD = "throttle", "p@ss:w/rd%"


@pytest.fixture(scope="module")
def sentinel_set() -> Iterator[LocalSentinel]:
    topology = LocalSentinel()
    try:
        yield topology.start()
    finally:
        topology.stop()


@pytest.fixture(scope="module")
def guarded_set() -> Iterator[LocalSentinel]:
    """Sentinels with a password of their own, and an ACL user on every data node."""
    topology = LocalSentinel(sentinel_password=SENTINEL_PASSWORD)
    try:
        topology.start()
        for server in topology.servers:
            client = server.client()
            client.acl_setuser(
                USER, enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], commands=["+@all"]
            )
            client.close()
        yield topology
    finally:
        topology.stop()


def backend_on(settings: Any, url: str, **options: Any) -> RedisBackend:
    settings.DJANGO_THROTTLE_REDIS_URL = url
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {**SLOW_MACHINE, "client_name": NAME, **options}
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    return backend


def guarded_url(topology: LocalSentinel, password: str = PASSWORD) -> str:
    hosts = ",".join(f"{LOOPBACK}:{sentinel.port}" for sentinel in topology.sentinels)
    return f"redis+sentinel://{USER}:{quote(password, safe='')}@{hosts}/{topology.service}"


def limits(algorithm: str = Algorithm.TOKEN_BUCKET, name: str = "sentinel") -> tuple[Limit, ...]:
    return (Limit.build(name, f"{LIMIT}/d", algorithm=algorithm),)


def admitted_by_threads(backend: RedisBackend, client: str, algorithm: str, tries: int) -> int:
    with ThreadPoolExecutor(8) as pool:
        hits = pool.map(lambda _: backend.hit(client, limits(algorithm)).allowed, range(tries))
        return sum(hits)


async def admitted_async(backend: RedisBackend, client: str, algorithm: str, tries: int) -> int:
    decisions = await asyncio.gather(
        *(backend.ahit(client, limits(algorithm)) for _ in range(tries))
    )
    return sum(decision.allowed for decision in decisions)


def named_connections(topology: LocalSentinel) -> dict[int, int]:
    """Port → how many of the backend's connections each data node has."""
    found = {}
    for server in topology.servers:
        client = server.client()
        try:
            found[server.port] = sum(entry["name"] == NAME for entry in client.client_list())
        finally:
            client.close()
    return found


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_every_algorithm_admits_exactly_its_limit_through_the_sentinels(
    settings: Any, sentinel_set: LocalSentinel, algorithm: str
) -> None:
    backend = backend_on(settings, sentinel_set.url)
    assert admitted_by_threads(backend, "sync-client", algorithm, LIMIT * 3) == LIMIT
    assert asyncio.run(admitted_async(backend, "async-client", algorithm, LIMIT * 3)) == LIMIT
    assert backend.peek("sync-client", limits(algorithm)).remaining == 0


def test_a_login_counted_by_address_and_username_is_one_call_on_the_primary(
    settings: Any, sentinel_set: LocalSentinel, _isolated_throttle: str
) -> None:
    """``hit_together`` through the sentinels (one script call over both counters): threads
    logging in from two addresses as one username admit exactly the username's limit, no
    address is charged for a login the username refused, a reservation goes back in one call
    (refund_together.lua), and every key written on the primary has a TTL."""
    backend = backend_on(settings, sentinel_set.url)
    by_address = (Limit.build("a", f"{LIMIT + 1}/d"),)
    by_name = (Limit.build("n", f"{LIMIT}/d", algorithm=Algorithm.SLIDING_LOG),)
    addresses = ("ip:192.0.2.1", "ip:192.0.2.2")

    def login(n: int) -> tuple[str, bool]:
        address = addresses[n % 2]
        decisions = backend.hit_together(((address, by_address), ("username:x", by_name)))
        assert decisions is not None  # one server: always one call
        return address, all(decision.allowed for decision in decisions)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(login, range(LIMIT * 3)))
    admitted = {a: sum(ok for address, ok in results if address == a) for a in addresses}
    assert sum(admitted.values()) == LIMIT
    for address in addresses:
        assert backend.peek(address, by_address).remaining == LIMIT + 1 - admitted[address]
    busiest = max(addresses, key=admitted.__getitem__)  # admitted at least one login
    groups = ((busiest, by_address), ("username:x", by_name))
    assert backend.refund_together(groups)  # a successful login's reservation, given back
    assert backend.peek(busiest, by_address).remaining == LIMIT + 2 - admitted[busiest]
    assert backend.peek("username:x", by_name).remaining == 1
    primary = sentinel_set.server_on(sentinel_set.primary_port())
    keys = keys_with_ttls(primary, _isolated_throttle)
    # An address whose every login the username refused was never charged, so it has no key:
    # the threads may well admit all of the username's logins from one address.
    charged = sum(1 for address in addresses if admitted[address])
    assert len(keys) == charged + 1 and all(ttl > 0 for ttl in keys.values()), keys


def test_counting_connections_are_on_the_primary_only(
    settings: Any, sentinel_set: LocalSentinel
) -> None:
    """Sync and async counting, and the client's own commands, all talk to the primary the
    sentinels name: none of the backend's connections is on a replica (sync counting shares
    the client's pool; the async one closes with its loop)."""
    backend = backend_on(settings, f"{sentinel_set.url}/3")
    backend.hit("where", limits())
    asyncio.run(backend.ahit("where", limits()))
    backend.bump_policy_version()
    on = named_connections(sentinel_set)
    primary = sentinel_set.primary_port()
    assert on[primary] >= 1
    assert all(count == 0 for port, count in on.items() if port != primary)
    assert backend.client.connection_pool.connection_kwargs["db"] == 3


def test_the_url_user_is_the_primary_s_and_sentinel_kwargs_the_sentinels(
    settings: Any, guarded_set: LocalSentinel
) -> None:
    backend = backend_on(
        settings, guarded_url(guarded_set), sentinel_kwargs={"password": SENTINEL_PASSWORD}
    )
    assert admitted_by_threads(backend, "guarded", Algorithm.GCRA, LIMIT * 2) == LIMIT
    assert asyncio.run(admitted_async(backend, "guarded-async", Algorithm.GCRA, 8)) == LIMIT
    assert backend.client.acl_whoami() in ("throttle", b"throttle")  # decoded by redis-py 6+


@pytest.mark.parametrize("what", ["no sentinel password", "wrong primary password"])
def test_wrong_credentials_are_an_outage_not_an_error(
    settings: Any, guarded_set: LocalSentinel, what: str
) -> None:
    if what == "no sentinel password":
        backend = backend_on(settings, guarded_url(guarded_set))
    else:
        backend = backend_on(
            settings,
            guarded_url(guarded_set, password="wrong"),
            sentinel_kwargs={"password": SENTINEL_PASSWORD},
        )
    with pytest.raises(BackendError):
        backend.hit("refused", limits())
    with pytest.raises(BackendError):
        asyncio.run(backend.ahit("refused", limits()))


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        (
            "redis+sentinel://a:26380,b/mymaster",
            SentinelURL((("a", 26380), ("b", 26379)), "mymaster"),
        ),
        (
            "valkey+sentinel://u:p%40ss%3Aw%2Frd@[::1]:5000,10.0.0.2:5001/svc/4",
            SentinelURL((("::1", 5000), ("10.0.0.2", 5001)), "svc", 4, "u", "p@ss:w/rd"),
        ),
        (
            "redis+sentinel://:secret@h:1/m",
            SentinelURL((("h", 1),), "m", password="secret"),
        ),
    ],
)
def test_sentinel_urls_are_parsed(url: str, parsed: SentinelURL) -> None:
    assert parse_sentinel_url(url) == parsed


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h:26379", "names no service"),
        ("redis+sentinel://h:26379/", "names no service"),
        ("redis+sentinel:///mymaster", "names no sentinel host"),
        ("redis+sentinel://a:1,,b:2/mymaster", "names no sentinel host"),
        ("redis+sentinel://:26379/mymaster", "bad sentinel address ':26379'"),
        ("redis+sentinel://h:port/mymaster", "bad sentinel address 'h:port'"),
        ("redis+sentinel://h:99999/mymaster", "bad sentinel address 'h:99999'"),
        ("redis+sentinel://h:0/mymaster", "bad sentinel address 'h:0'"),
        ("redis+sentinel://h/mymaster/zero", "bad database 'zero'"),
        ("redis+sentinel://h/mymaster?ssl=1", "DJANGO_THROTTLE_REDIS_OPTIONS"),
    ],
)
def test_a_malformed_sentinel_url_is_explained_in_one_line(
    settings: Any, url: str, says: str
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = url.replace("//", "//u:s3cret@", 1)
    [error] = check_settings()
    assert error.id == "django_throttle.E002"
    assert says in error.msg and "\n" not in error.msg
    assert "s3cret" not in error.msg


def test_a_good_sentinel_url_passes_the_checks(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "valkey+sentinel://u:p@h1:26379,h2:26379/mymaster/2"
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"sentinel_kwargs": {"password": "x"}}
    assert check_settings() == []


@pytest.mark.parametrize(
    ("options", "named"),
    [({"socket_timout": 1}, "socket_timout"), ({"sentinel_kwargs": {"pasword": "x"}}, "pasword")],
    ids=["primary option", "sentinel option"],
)
def test_an_option_redis_py_does_not_take_is_e033_for_a_sentinel_url(
    settings: Any, options: dict[str, Any], named: str
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "redis+sentinel://h1:26379/mymaster"
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = options
    [error] = check_settings()
    assert error.id == "django_throttle.E040"
    assert named in error.msg


def answers(backend: RedisBackend, client: str = "probe", lim: Any = None) -> bool:
    """Whether one hit (of ``lim``) or peek is answered."""
    try:
        if lim is None:
            backend.peek(client, limits())
        else:
            backend.hit(client, lim)
    except BackendError:
        return False
    return True


def wait_promoted(topology: LocalSentinel, old: int) -> float:
    """Poll the sentinels until they name a primary other than ``old``; when (monotonic)."""
    wait_for(lambda: topology.primary_port() != old, 60, "the sentinels to promote a replica")
    return time.monotonic()


class Load:
    """``threads`` threads counting through a circuit breaker (the request path's), each on
    fresh clients in rounds of ``LIMIT + 2`` hits; every call's outcome recorded."""

    def __init__(self, backend: RedisBackend, threads: int = 8) -> None:
        self.backend = backend
        self.breaker = CircuitBreaker()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        #: (thread, round, start, end, outcome): "allowed", "denied", "open" or "error".
        self.calls: list[tuple[int, int, float, float, str]] = []
        self.foreign: list[BaseException] = []
        self.threads = [threading.Thread(target=self.run, args=(n,)) for n in range(threads)]

    def run(self, thread: int) -> None:
        lim = limits(Algorithm.SLIDING_LOG, "failover")
        round_ = 0
        while not self.stop.is_set():
            round_ += 1
            for _ in range(LIMIT + 2):
                start = time.monotonic()
                try:
                    decision = self.breaker.call(self.backend.hit, f"t{thread}-r{round_}", lim)
                    outcome = "allowed" if decision.allowed else "denied"
                except CircuitOpen:
                    outcome = "open"
                except BackendError:
                    outcome = "error"
                except BaseException as exc:  # the request path would answer 500
                    self.foreign.append(exc)
                    return
                with self.lock:
                    self.calls.append((thread, round_, start, time.monotonic(), outcome))
                if outcome in ("open", "error"):
                    time.sleep(0.005)  # a failing request is answered; the next one comes

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def rounds(self, after: float) -> dict[tuple[int, int], list[str]]:
        """The outcomes of every complete round that started after ``after``."""
        rounds: dict[tuple[int, int], list[tuple[float, str]]] = {}
        for thread, round_, start, _end, outcome in self.calls:
            rounds.setdefault((thread, round_), []).append((start, outcome))
        return {
            key: [outcome for _, outcome in calls]
            for key, calls in rounds.items()
            if min(start for start, _ in calls) > after and len(calls) == LIMIT + 2
        }


@pytest.mark.slow
def test_a_failover_under_load_is_followed_and_exact_again_after_the_promotion(
    settings: Any, sentinel_set: LocalSentinel
) -> None:
    """SIGKILL the primary while 8 threads count through the breaker: nothing but
    BackendError leaves the backend; once the sentinels promote a replica, the breaker closes
    within its cooldown and every round of hits that starts after the last failure admits
    exactly the limit. Peek, policy version and reset work on the new primary."""
    backend = backend_on(settings, sentinel_set.url)
    old = sentinel_set.primary_port()
    with Load(backend) as load:
        time.sleep(0.5)  # counting in full swing
        killed = time.monotonic()
        sentinel_set.server_on(old).kill()
        promoted = wait_promoted(sentinel_set, old)
        new = sentinel_set.primary_port()
        wait_for(lambda: switched(sentinel_set, new), 30, "every sentinel to switch")
        switched_at = time.monotonic()
        time.sleep(2.0)  # counting on the new primary
    assert not load.foreign, load.foreign
    failed = [end for _, _, _, end, outcome in load.calls if outcome in ("error", "open")]
    assert failed, "the kill cost no call: it did not happen under load"
    last_failure = max(failed)
    first_served = min(
        end
        for _, _, start, end, outcome in load.calls
        if outcome in ("allowed", "denied") and start > min(failed)
    )
    report = {
        "kill to promotion (s)": round(promoted - killed, 3),
        "promotion to +switch-master (s)": round(switched_at - promoted, 3),
        "promotion to first decision after failing (s)": round(first_served - promoted, 3),
        "promotion to last failure (s)": round(last_failure - promoted, 3),
        "promotion to last backend error (s)": round(
            max(end for _, _, _, end, outcome in load.calls if outcome == "error") - promoted, 3
        ),
        "breaker cooldown (s)": load.breaker.cooldown,
        "calls": len(load.calls),
        "failed calls": len(failed),
    }
    print("\nfailover:", report)
    # The sentinels are polled every 50 ms: the promotion is seen up to then after it happened.
    assert last_failure - promoted < load.breaker.cooldown + 0.5, report
    after = load.rounds(last_failure)
    assert len(after) >= len(load.threads), report
    for outcomes in after.values():
        assert outcomes == ["allowed"] * LIMIT + ["denied"] * 2, report
    # The client's own commands follow the new primary too.
    lim = limits(Algorithm.GCRA, "after")
    assert backend.hit("after", lim).allowed
    assert backend.peek("after", lim).remaining == LIMIT - 1
    before = backend.get_policy_version()
    backend.bump_policy_version()
    assert backend.get_policy_version() != before
    backend.reset("after", lim)
    assert backend.peek("after", lim).remaining == LIMIT
    assert asyncio.run(admitted_async(backend, "after-async", Algorithm.GCRA, 8)) == LIMIT
    # Bring the killed server back: the sentinels make it a replica of the new primary.
    sentinel_set.server_on(old).start()
    sentinel_set.wait_settled(60)


def test_a_demoted_primary_is_left_for_the_promoted_one(
    settings: Any, sentinel_set: LocalSentinel
) -> None:
    """SENTINEL FAILOVER promotes a replica while the primary still runs; the old primary is
    then made a replica of the new one (as the sentinels do when they reconfigure it): the
    backend's connection to it gets a READONLY reply, which is a BackendError and drops it,
    and every connection after goes to the promoted primary, none to the demoted one."""
    backend = backend_on(settings, sentinel_set.url)
    lim = limits(Algorithm.TOKEN_BUCKET, "demoted")
    assert backend.hit("before", lim).allowed  # one idle connection, on the old primary
    old = sentinel_set.primary_port()
    sentinel = sentinel_set.sentinel_client(sentinel_set.sentinels[0])
    try:
        sentinel.sentinel_failover(sentinel_set.service)
    finally:
        sentinel.close()
    wait_promoted(sentinel_set, old)
    new = sentinel_set.primary_port()
    wait_for(lambda: switched(sentinel_set, new), 30, "every sentinel to switch the primary")
    demoted = sentinel_set.server_on(old).client()
    try:
        demoted.replicaof(LOOPBACK, new)
    finally:
        demoted.close()
    failures = 0
    while not answers(backend, "after", lim):
        failures += 1
        assert failures < 10
    assert failures <= 1  # the READONLY reply on the old connection; then the new primary
    assert admitted_by_threads(backend, "after-demotion", Algorithm.TOKEN_BUCKET, 12) == LIMIT
    assert asyncio.run(admitted_async(backend, "after-demotion-async", "gcra", 8)) == LIMIT
    on = named_connections(sentinel_set)
    assert on[old] == 0, on
    assert on[new] >= 1, on
    sentinel_set.wait_settled(60)


def switched(topology: LocalSentinel, port: int) -> bool:
    """Whether every sentinel's SENTINEL MASTERS (what redis-py's ``discover_master`` reads)
    names ``port``: it does after ``+switch-master``, which may come seconds after SENTINEL
    GET-MASTER-ADDR-BY-NAME already names the promoted replica."""
    for server in topology.sentinels:
        client = topology.sentinel_client(server)
        try:
            if int(client.sentinel_master(topology.service)["port"]) != port:
                return False
        finally:
            client.close()
    return True


# -- Exactness, TTLs and SCRIPT FLUSH under load -----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", Algorithm.values)
def test_4_processes_x_16_threads_on_one_client_admit_exactly_the_limit(
    sentinel_set: LocalSentinel, _isolated_throttle: str, algorithm: str
) -> None:
    """64 requests released together by one barrier, in 4 processes each with the backend's
    own client for the ``redis+sentinel://`` URL: exactly the limit is admitted."""
    from tests.test_algorithm_concurrency import race_on

    sentinel_set.wait_settled(60)
    race_on(sentinel_set.url, _isolated_throttle, algorithm)


def keys_with_ttls(server: Any, prefix: str) -> dict[bytes, int]:
    """Key → PTTL of every key of this test's prefix on ``server``."""
    client = server.client()
    try:
        return {key: client.pttl(key) for key in client.scan_iter(match=f"{prefix}*", count=1000)}
    finally:
        client.close()


def replication(server: Any) -> dict[str, Any]:
    """The replication fields of ``server``'s INFO (role, primary, link, sync in progress)."""
    client = server.client()
    try:
        info = client.info("replication")
    finally:
        client.close()
    wanted = ("role", "master_port", "master_link_status", "master_sync_in_progress")
    return {key: info.get(key) for key in wanted}


def test_every_key_has_a_ttl_on_the_primary_and_the_replicas_only_replicate(
    settings: Any, sentinel_set: LocalSentinel, _isolated_throttle: str
) -> None:
    """Every algorithm, with usage counted, sync and async: every key the backend wrote is on
    the primary with a TTL; the replicas hold the same keys, with their TTLs, and ran no
    script and have no connection of the backend's (nothing was written to one directly)."""
    from tests.topology_load import script_calls

    sentinel_set.wait_settled(60)
    primary = sentinel_set.server_on(sentinel_set.primary_port())
    replicas = [server for server in sentinel_set.servers if server is not primary]
    before = {replica.port: script_calls(replica) for replica in replicas}
    backend = backend_on(settings, sentinel_set.url)
    every = tuple(Limit.build(f"l{n}", f"{LIMIT}/d", algorithm=a) for n, a in enumerate(Algorithm))
    for n in range(8):
        for _ in range(LIMIT + 1):
            backend.hit(f"user:{n}", every, usage="free|x")

    async def hits() -> None:
        for n in range(8):
            await asyncio.gather(
                *(backend.ahit(f"auser:{n}", every, usage="free|x") for _ in range(LIMIT + 1))
            )

    asyncio.run(hits())
    # The usage counts kept in this process, pushed as the next request would.
    get_store(backend).push_tally(backend.usage_tally)
    keys = keys_with_ttls(primary, _isolated_throttle)
    ids = tuple(limit.id.encode() for limit in every)
    counters = [key for key in keys if key.endswith(ids)]
    assert len(counters) == 16 * len(every), sorted(keys)  # every client's, every limit's
    assert len(keys) > len(counters), sorted(keys)  # and the usage counts
    assert all(ttl > 0 for ttl in keys.values()), {k: t for k, t in keys.items() if t <= 0}
    with primary.client() as client:
        replicated(client, len(replicas))
    for replica in replicas:
        # WAIT says each replica took the writes; a replica the sentinels reconfigured after
        # an earlier test's failover may still be finishing a full resync (its key space is
        # empty while it loads), so its copy is awaited, with its replication state on failure.
        try:
            wait_for(
                lambda replica=replica: (
                    set(keys_with_ttls(replica, _isolated_throttle)) == set(keys)
                ),
                30,
                f"the replica on {replica.port} to hold the primary's keys",
            )
        except RuntimeError as timed_out:
            raise AssertionError(f"{timed_out}: {replication(replica)}") from None
        copied = keys_with_ttls(replica, _isolated_throttle)
        assert all(ttl > 0 for ttl in copied.values()), replica.port
        assert script_calls(replica) == before[replica.port], replica.port
    on = named_connections(sentinel_set)
    assert on[primary.port] >= 1
    assert all(on[replica.port] == 0 for replica in replicas), on


@pytest.mark.slow
def test_script_flush_on_every_node_under_load_costs_no_failed_decision(
    settings: Any, sentinel_set: LocalSentinel, _isolated_throttle: str
) -> None:
    """6 threads and 4 coroutines count on fresh clients (every algorithm in turn) while the
    primary's and every replica's script cache is flushed every 20 ms for 4 s or more: every
    call is allowed or denied (the ``NOSCRIPT`` reply answered by ``EVAL``), none fails, and each
    client is admitted exactly its limit and counted once per admitted request."""
    from tests.topology_load import (
        Load,
        assert_every_decision_exact,
        every_algorithm,
        flush_scripts,
        fresh_clients,
        noscript_replies,
    )

    sentinel_set.wait_settled(60)
    primary = sentinel_set.server_on(sentinel_set.primary_port())
    # Timeouts for a machine loaded by other test runs: a failed decision here is an error
    # reply or a lost connection, not a slow one.
    backend = backend_on(settings, sentinel_set.url, socket_timeout=5.0, timeout=5.0)
    lists = every_algorithm(LIMIT)
    refused_before = noscript_replies([primary])
    with Load(backend, lists, LIMIT, fresh_clients("flush")) as load:
        time.sleep(0.5)
        flushes = flush_scripts(
            sentinel_set.servers,
            seconds=4.0,
            enough=lambda n: n >= 20 and noscript_replies([primary]) - refused_before >= 20,
        )
        time.sleep(0.5)
    refused = noscript_replies([primary]) - refused_before
    outcomes = load.by_client()
    print(f"\nscript flush: {flushes} flushes, {refused} NOSCRIPT replies, "
          f"{len(load.calls)} calls, {len(outcomes)} clients")  # fmt: skip
    assert flushes >= 20 and refused >= 20, (flushes, refused)
    assert_every_decision_exact(
        {client: calls for client, (_, _, calls) in outcomes.items()},
        LIMIT,
        lambda client: backend.peek(client, lists[outcomes[client][1]]).remaining,
    )
    assert load.breaker.state == "closed"
