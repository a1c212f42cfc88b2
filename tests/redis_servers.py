"""Private ``redis-server`` processes that fault tests may pause, kill and restart.

Each :class:`RedisServer` is started by this Python process on 127.0.0.1 and a free port, keeps
nothing on disk, and is the only kind of Redis a fault test may stop, flush or reconfigure.
:meth:`RedisServer.restart` brings it back on the same port, so clients and proxies pointed at
it reconnect to the new process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time

import redis

from example_project.private_redis import find_redis_server, free_port

LOOPBACK = "127.0.0.1"


class RedisServer:
    """One throwaway ``redis-server`` owned by the test process."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://{LOOPBACK}:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="django-throttle-faults-")
        self._process: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 10.0) -> RedisServer:
        command = [
            find_redis_server(),
            "--port", str(self.port),
            "--bind", LOOPBACK,
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir.name,
            "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.paused = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited with code {self._process.returncode}")
            try:
                with socket.create_connection((LOOPBACK, self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} in {timeout} s")

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

    def kill(self) -> None:
        """SIGKILL: the server is gone; connects are refused until :meth:`restart`."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=10)
        self._process = None
        self.paused = False

    def restart(self) -> RedisServer:
        """A fresh, empty server on the same port (a crash followed by a supervisor restart)."""
        self.kill()
        return self.start()

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
        if self._process is not None and self._process.poll() is None:
            self.resume()
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=5)
        self._process = None
        self._dir.cleanup()
