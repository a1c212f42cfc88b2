"""The servers ``bench/load_test.py`` starts: gunicorn (sync workers) or uvicorn (ASGI), each
in its own process group with its output in a log file, serving ``loadproject``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
PATH = "/api/ping/"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One server (its own process group) for one variant, logging to a file."""

    def __init__(self, server: str, variant: str, workers: int, env: dict[str, str]) -> None:
        self.name, self.variant, self.port = server, variant, free_port()
        self.url = f"http://127.0.0.1:{self.port}{PATH}"
        self.log = Path(env["LOADTEST_LOGDIR"]) / f"{server}-{variant}.log"
        common = ["--workers", str(workers), "--log-level", "warning"]
        if server == "gunicorn":
            app = ["gunicorn", "loadproject.wsgi:application", "--worker-class", "sync"]
            where = ["--bind", f"127.0.0.1:{self.port}", "--chdir", str(BENCH)]
        else:
            app = ["uvicorn", "loadproject.asgi:application", "--no-access-log"]
            where = ["--host", "127.0.0.1", "--port", str(self.port), "--app-dir", str(BENCH)]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", *app, *common, *where],
                env={**env, "LOADTEST_VARIANT": variant},
                cwd=BENCH,  # python -m puts the working directory first on sys.path
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() reaches every worker
            )

    def wait_ready(self, address: str, timeout: float = 30.0) -> dict[str, str]:
        """Headers of the first 200 answer to a probe request from ``address``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name}/{self.variant} exited; see {self.log}")
            probe = urllib.request.Request(self.url, headers={"X-Forwarded-For": address})
            try:
                with urllib.request.urlopen(probe, timeout=2) as response:
                    return {key.lower(): value for key, value in response.headers.items()}
            except urllib.error.HTTPError as error:
                raise RuntimeError(f"{self.name}/{self.variant}: HTTP {error.code}") from error
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{self.name}/{self.variant} did not answer in {timeout} s")

    def log_problems(self, offset: int) -> tuple[int, int, str]:
        """(problem lines since ``offset``, new offset, first such line)."""
        data = self.log.read_bytes()
        lines = data[offset:].decode(errors="replace").splitlines()
        bad = [line for line in lines if re.search(r"ERROR|CRITICAL|WARNING|Traceback", line)]
        return len(bad), len(data), bad[0] if bad else ""

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.process.pid, sig)
                self.process.wait(timeout=wait)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue
