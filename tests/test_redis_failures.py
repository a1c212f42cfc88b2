"""Every way Redis can fail surfaces as one ``BackendError``, and nothing is replayed.

Real servers only: the suite's private redis-server, plus servers this module starts on free
loopback ports (and reconfigures: password, maxmemory, replica, busy script, cluster mode),
plus two loopback listeners that are not Redis at all: one that never answers (a hung server)
and one that answers a handshake and then garbage.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from django_throttle.backends import BackendError, get_backend, reset_backend_cache
from django_throttle.backends.redis import RedisBackend
from django_throttle.rates import Limit
from example_project.private_redis import PrivateRedis, free_port
from tests.redis_servers import attempts, connection_getter
from tests.topologies import cluster_port

LIMIT = Limit.build("l", "100/s")


class OwnRedis(PrivateRedis):
    """A redis-server this module starts with extra arguments, and stops."""

    def __init__(self, *extra: str, port: int | None = None) -> None:
        super().__init__(port, extra_args=extra)
        self.start()

    def client(self, password: str | None = None) -> redis.Redis:
        return redis.Redis(
            port=self.port, password=password, socket_timeout=5, retry=Retry(NoBackoff(), 0)
        )


class FakeRedis:
    """A loopback listener that counts connections. ``reply=None``: it never answers (a hung
    Redis); otherwise it answers the handshake and sends ``reply`` to a counting call
    (``FCALL``, ``EVALSHA``)."""

    def __init__(self, reply: bytes | None = None) -> None:
        self.reply = reply
        self.connections = 0
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            self._sockets.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                if self.reply is None:
                    continue
                if b"FCALL" in data or b"EVALSHA" in data:
                    conn.sendall(self.reply)
                elif b"HELLO" in data:
                    conn.sendall(b"%2\r\n+server\r\n+redis\r\n+proto\r\n:3\r\n")
                else:
                    conn.sendall(b"+OK\r\n")

    def close(self) -> None:
        self._listener.close()
        for conn in self._sockets:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


@pytest.fixture(scope="module")
def own_redis() -> Iterator[OwnRedis]:
    server = OwnRedis()
    yield server
    server.stop()


@pytest.fixture
def hung() -> Iterator[FakeRedis]:
    fake = FakeRedis()
    yield fake
    fake.close()


#: Timeouts for a call that must be answered (or refused by the server), not time out: on a
#: loaded machine a healthy call can take longer than the package's default 50 ms, and a
#: test expecting an error reply would see a timeout instead.
PATIENT = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}


def backend_for(
    settings: Any, url: str | None, *, default_timeouts: bool = False, **options: Any
) -> RedisBackend:
    """The backend on ``url`` with ``options``; the timeouts :data:`PATIENT` unless given,
    or, with ``default_timeouts``, the package's own (what a test of them needs)."""
    settings.DJANGO_THROTTLE_REDIS_URL = url
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = options if default_timeouts else PATIENT | options
    reset_backend_cache()
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    return backend


def test_no_password_is_a_backend_error(settings: Any, own_redis: OwnRedis) -> None:
    own_redis.client().config_set("requirepass", "s3cret")
    try:
        with pytest.raises(BackendError, match=r"(?i)auth"):
            backend_for(settings, own_redis.url).hit("c", [LIMIT])
        wrong = own_redis.url.replace("redis://", "redis://:wrong@")
        with pytest.raises(BackendError, match=r"(?i)WRONGPASS|invalid"):
            backend_for(settings, wrong).hit("c", [LIMIT])
        right = own_redis.url.replace("redis://", "redis://:s3cret@")
        assert backend_for(settings, right).hit("c", [LIMIT]).allowed
    finally:
        own_redis.client("s3cret").config_set("requirepass", "")


def test_out_of_memory_is_a_backend_error(settings: Any, own_redis: OwnRedis) -> None:
    admin = own_redis.client()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    try:
        with pytest.raises(BackendError, match="OutOfMemory"):
            backend_for(settings, own_redis.url).hit("c", [LIMIT])
    finally:
        admin.config_set("maxmemory", 0)


def test_read_only_replica_is_a_backend_error(settings: Any, own_redis: OwnRedis) -> None:
    admin = own_redis.client()
    admin.replicaof("127.0.0.1", free_port())  # a primary that is not there: still read-only
    try:
        with pytest.raises(BackendError, match="ReadOnlyError"):
            backend_for(settings, own_redis.url).hit("c", [LIMIT])
    finally:
        admin.replicaof("NO", "ONE")


def test_busy_script_is_a_backend_error(settings: Any, own_redis: OwnRedis) -> None:
    admin = own_redis.client()
    admin.config_set("busy-reply-threshold", 20)
    backend = backend_for(settings, own_redis.url, socket_timeout=5)
    blocker = threading.Thread(
        target=_eval_quietly, args=(own_redis.client(), "while true do end"), daemon=True
    )
    blocker.start()
    errors: list[str] = []
    # Until the blocker's script runs (however late its thread starts on a loaded machine):
    # from then on every call is answered BUSY.
    deadline = time.monotonic() + 60
    try:
        while not errors and time.monotonic() < deadline:
            try:
                backend.hit("c", [LIMIT])
            except BackendError as exc:
                errors.append(str(exc))
    finally:
        while time.monotonic() < deadline + 30:
            try:
                admin.script_kill()
                break
            except redis.ResponseError:  # NOTBUSY: the blocker has not started yet
                time.sleep(0.01)
        blocker.join(timeout=30)
        admin.config_set("busy-reply-threshold", 5000)
    assert errors and "BUSY" in errors[0]


def _eval_quietly(client: redis.Redis, script: str) -> None:
    with contextlib.suppress(redis.ResponseError):  # "script killed by user"
        client.eval(script, 0)


def test_cluster_down_is_a_backend_error(settings: Any) -> None:
    server = OwnRedis("--cluster-enabled", "yes", port=cluster_port())
    try:
        # ClusterDownError from redis-py 6.0; a plain ResponseError naming it before.
        with pytest.raises(BackendError, match=r"ClusterDownError|CLUSTERDOWN"):
            backend_for(settings, server.url).hit("c", [LIMIT])
    finally:
        server.stop()


def test_pool_exhausted_is_a_backend_error(settings: Any, redis_url: str) -> None:
    """Every connection of the client's bounded pool in use for longer than the pool's
    timeout: the next call fails over (a BackendError), and counts again once one comes
    back."""
    backend = backend_for(settings, redis_url, max_connections=1, timeout=0.01)
    pool = backend.client.connection_pool
    held = connection_getter(pool)()
    try:
        with pytest.raises(BackendError, match=r"(?i)no connection available"):
            backend.hit("c", [LIMIT])
    finally:
        pool.release(held)
    assert backend.hit("c", [LIMIT]).allowed


@pytest.mark.parametrize(
    "reply",
    [
        b":1x\r\n",  # redis-py's parser: ValueError
        b"*6\r\n:1\r\n:zz\r\n:0\r\n:0\r\n:0\r\n:0\r\n",
        b"+OK\r\n",  # not six values
        b"*6\r\n$1\r\nx\r\n:1\r\n:0\r\n:0\r\n:0\r\n:0\r\n",  # "allowed" is not 0 or 1
        b"*6\r\n:1\r\n:9\r\n:0\r\n:0\r\n:0\r\n:0\r\n",  # a limit that was not passed
        b"*6\r\n:1\r\n:-3\r\n:0\r\n:0\r\n:0\r\n:0\r\n",
    ],
)
def test_garbled_reply_is_a_backend_error(settings: Any, reply: bytes) -> None:
    fake = FakeRedis(reply)
    try:
        with pytest.raises(BackendError):
            backend_for(settings, fake.url, socket_timeout=5).hit("c", [LIMIT])
    finally:
        fake.close()


def test_garbled_handshake_is_a_backend_error(settings: Any) -> None:
    """A server answering HELLO with "+OK" makes redis-py raise AttributeError."""
    fake = FakeRedis(b"+OK\r\n")
    fake._serve = lambda conn: _answer_everything(conn)  # type: ignore[method-assign]
    try:
        with pytest.raises(BackendError):
            backend_for(settings, fake.url, socket_timeout=5).hit("c", [LIMIT])
    finally:
        fake.close()


def _answer_everything(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while conn.recv(65536):
            conn.sendall(b"+OK\r\n")


def test_hung_server_times_out_once_and_is_never_replayed(settings: Any, hung: FakeRedis) -> None:
    """A call that timed out may have counted: one connection, one attempt, even when the
    settings ask for retries."""
    retrying = Retry(ExponentialBackoff(cap=0.01, base=0.001), 10)
    backend = backend_for(
        settings, hung.url, socket_timeout=0.05, retry=retrying, retry_on_timeout=True
    )
    with pytest.raises(BackendError, match=r"(?i)timeout"):
        backend.hit("c", [LIMIT])
    assert hung.connections == 1
    assert backend.client.get_retry() is not None
    assert attempts(backend.client.get_retry()) == 1


def test_refused_connection_is_a_backend_error(settings: Any) -> None:
    with pytest.raises(BackendError, match=r"(?i)connect"):
        backend_for(settings, f"redis://127.0.0.1:{free_port()}/0").hit("c", [LIMIT])


# --- Defect 13: the default configuration builds its own bounded client -----------------


def django_redis_cache(settings: Any, location: Any, **options: Any) -> None:
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "throttle": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": location,
            "OPTIONS": options,
        },
    }


def test_borrowed_cache_connection_gets_our_timeouts_and_bounded_pool(
    settings: Any, redis_url: str
) -> None:
    replica = f"redis://127.0.0.1:{free_port()}/0"
    django_redis_cache(
        settings,
        [redis_url, replica],
        SOCKET_TIMEOUT=30,
        CONNECTION_POOL_KWARGS={"max_connections": 10_000, "retry_on_timeout": True},
    )
    backend = backend_for(settings, "cache://throttle", default_timeouts=True)
    pool = backend.client.connection_pool
    kwargs = pool.connection_kwargs
    assert isinstance(pool, redis.BlockingConnectionPool)
    assert pool.max_connections == 64
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (0.05, 0.05)
    assert attempts(kwargs["retry"]) == 1
    assert not kwargs.get("retry_on_timeout")
    assert kwargs["port"] == int(redis_url.rsplit(":", 1)[1].split("/")[0])  # the primary


def test_borrowed_cache_connection_counts_with_its_password(settings: Any) -> None:
    server = OwnRedis("--requirepass", "s3cret")
    try:
        django_redis_cache(settings, server.url, PASSWORD="s3cret")
        backend = backend_for(
            settings, "cache://throttle", socket_timeout=2.0, socket_connect_timeout=2.0
        )
        assert backend.client.connection_pool.connection_kwargs["socket_timeout"] == 2.0
        assert [backend.hit("c", [Limit.build("one", "1/m")]).allowed for _ in range(2)] == [
            True,
            False,
        ]
    finally:
        server.stop()


def test_borrowed_cache_connection_to_a_hung_server_fails_within_the_timeout(
    settings: Any, hung: FakeRedis
) -> None:
    django_redis_cache(settings, hung.url)
    backend = backend_for(settings, "cache://throttle", default_timeouts=True)
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            backend.hit("c", [LIMIT])
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(timeout=5)  # far above 50 ms; without timeouts it would hang for ever
    assert len(outcome) == 1
    assert isinstance(outcome[0], BackendError)
    assert hung.connections == 1


def test_django_builtin_redis_cache_is_borrowed_too(settings: Any, redis_url: str) -> None:
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis_url,
            "OPTIONS": {"db": 0},
        }
    }
    backend = backend_for(settings, None, socket_timeout=2.0)
    assert backend.hit("c", [LIMIT]).allowed


@pytest.mark.parametrize(
    "cache",
    [
        {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "not-a-url"},
        {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://mymaster/0",
            "OPTIONS": {"SENTINELS": [("127.0.0.1", 26379)]},
        },
    ],
)
def test_cache_the_throttle_cannot_connect_through_is_a_configuration_error(
    settings: Any, cache: dict[str, Any]
) -> None:
    """Named in every counting call's error (a request meets its failure mode, never a 500:
    tests/test_core.py), not raised while the backend is built."""
    settings.CACHES = {"default": cache}
    backend = backend_for(settings, None)
    assert "is not a Redis cache" in backend.unusable
    with pytest.raises(BackendError, match=r"\(DJANGO_THROTTLE_REDIS_URL = 'cache://default'\)"):
        backend.hit("c", [LIMIT])


def test_a_forked_child_counts_on_connections_of_its_own(settings: Any, redis_url: str) -> None:
    """The parent's sockets are not the child's: after a fork, the child's counting opens its
    own connection (redis-py's pool starts afresh in a new process) and the parent's keeps
    answering the parent."""
    backend = backend_for(settings, redis_url)
    assert backend.hit("fork", [LIMIT]).allowed
    # The least-privilege ACL user may not ask CLIENT ID: there, the counts alone say it.
    ids = not os.environ.get("DJANGO_THROTTLE_TEST_ACL")
    parent = backend.client.client_id() if ids else None
    with warnings.catch_warnings():
        # Python 3.12+ warns about forking a process with threads (other tests' servers).
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: report by exit status only
        ok = backend.hit("fork", [LIMIT]).allowed and (
            not ids or backend.client.client_id() != parent
        )
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert backend.hit("fork", [LIMIT]).allowed
    assert not ids or backend.client.client_id() == parent
