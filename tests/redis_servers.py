"""Private ``redis-server`` processes that fault tests may pause, kill and restart.

Each :class:`RedisServer` is started by this Python process on 127.0.0.1 and a free port, keeps
nothing on disk, and is the only kind of Redis a fault test may stop, flush or reconfigure.
:meth:`RedisServer.restart` brings it back on the same port, so clients and proxies pointed at
it reconnect to the new process.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
from collections.abc import Callable
from functools import partial
from typing import Any, Self

import redis

from example_project.private_redis import PrivateRedis

LOOPBACK = "127.0.0.1"


class RedisServer(PrivateRedis):
    """One throwaway ``redis-server`` owned by the test process, that tests may pause, kill
    and restart on the same port."""

    paused = False

    def client(self, timeout: float = 10.0) -> redis.Redis:
        """A client of our own with generous timeouts, for setting up and reading state."""
        return redis.Redis(
            host=LOOPBACK, port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout
        )

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets but answers nothing (a hung Redis)."""
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT: the paused server answers again, with everything it had."""
        if self._process is not None and self.paused:
            os.kill(self._process.pid, signal.SIGCONT)
        self.paused = False

    #: Every key the server held when :meth:`kill` was told to keep them: (key, ms to live
    #: or 0, ``DUMP``), written back by :meth:`restart`.
    _kept: list[tuple[bytes, int, bytes]] = []

    def kill(self, *, keep_data: bool = False) -> None:
        """SIGKILL: the server is gone; connects are refused until :meth:`restart`, which
        brings back every key it held if ``keep_data`` (a restart from persisted data)."""
        if keep_data and self._process is not None:
            client = self.client()
            try:
                self._kept = [
                    (key, max(client.pttl(key), 0), dumped)
                    for key in client.scan_iter(count=1000)
                    if (dumped := client.dump(key)) is not None
                ]
            finally:
                client.close()
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=10)
        self._process = None
        self.paused = False

    def restart(self) -> Self:
        """A fresh server on the same port (a crash followed by a supervisor restart): empty,
        or with the keys :meth:`kill` kept."""
        kept, self._kept = self._kept, []
        self.kill()
        self.start()
        if kept:
            client = self.client()
            try:
                for key, ttl, dumped in kept:
                    client.restore(key, ttl, dumped, replace=True)
            finally:
                client.close()
        return self

    def ensure_healthy(self) -> None:
        """Undo what a test did to the server: running, answering, default limits, empty."""
        self.resume()
        if not self.running():
            self.start()
        client = self.client()
        try:
            with contextlib.suppress(redis.ResponseError):  # no script running
                client.script_kill()
            client.config_set("maxmemory", 0)
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("busy-reply-threshold", 5000)
            client.flushall()
        finally:
            client.close()

    def stop(self) -> None:
        self.resume()  # a stopped process cannot act on SIGTERM
        super().stop()


def attempts(retry: Any) -> int:
    """How many times a redis-py ``Retry`` runs a call that keeps failing with a connection
    error: 1 means retries are off. (``Retry.get_retries`` came in redis-py 6.0; this works
    on every supported version.)"""
    tried = 0

    def fail() -> None:
        nonlocal tried
        tried += 1
        raise redis.ConnectionError("down")

    with contextlib.suppress(redis.ConnectionError):
        retry.call_with_retry(fail, lambda error: None)
    return tried


def connection_getter(pool: Any) -> Callable[[], Any]:
    """``pool.get_connection`` as a call without arguments: redis-py 5.3 made the command name
    optional (and warns when one is passed); before, it was required."""
    parameters = list(inspect.signature(pool.get_connection).parameters.values())
    if parameters and parameters[0].default is inspect.Parameter.empty:
        return partial(pool.get_connection, "PING")
    getter: Callable[[], Any] = pool.get_connection
    return getter


def forget_code(client: Any, mode: str = "SYNC") -> None:
    """What a restart or a failover to an empty server does to the package's code on
    ``client``'s server: its scripts (``SCRIPT FLUSH``) and functions (``FUNCTION FLUSH``)
    gone. Only on the suite's own servers."""
    client.script_flush(mode)
    # A replica refuses it: it follows its primary's.
    with contextlib.suppress(redis.exceptions.ReadOnlyError):
        client.function_flush(mode)


def script_calls_of(client: Any) -> int:
    """How many counting calls ``client``'s server has run: ``FCALL``, ``EVALSHA`` and
    ``EVAL`` that did not fail (a call answered "no such function" or ``NOSCRIPT`` ran
    nothing; the commands run inside them are counted apart)."""
    stats = client.info("commandstats")
    names = ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval")
    return sum(
        int(stats.get(name, {}).get("calls", 0)) - int(stats.get(name, {}).get("failed_calls", 0))
        for name in names
    )
