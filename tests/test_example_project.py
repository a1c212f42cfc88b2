"""The demo project, run the way the README tells a newcomer to run it: a real
``manage.py run_demo`` process answering real HTTP requests."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from email.message import Message
from pathlib import Path

import pytest

from example_project.private_redis import free_port

ROOT = Path(__file__).resolve().parent.parent
REAL_DB = ROOT / "example_project" / "db.sqlite3"

pytestmark = pytest.mark.slow


class Demo:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.base = f"http://127.0.0.1:{port}"
        self.log = log

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def get(
        self, path: str, auth: tuple[str, str] | None = None, method: str = "GET"
    ) -> tuple[int, Message]:
        request = urllib.request.Request(self.base + path, method=method)
        if auth is not None:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
                return response.status, response.headers
        except urllib.error.HTTPError as error:
            with error:
                error.read()
                return error.code, error.headers


@contextmanager
def run_demo(tmp_path: Path, redis_url: str | None, key_prefix: str = "") -> Iterator[Demo]:
    """Start ``manage.py run_demo`` on a free port with a throwaway SQLite file (and without
    ``REDIS_URL`` when ``redis_url`` is None); stop it with SIGTERM and insist it exits
    cleanly."""
    port = free_port()
    log = tmp_path / "run_demo.log"
    child_env = {
        **os.environ,
        # pytest-django exports tests.settings; the demo must use its own.
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "DJANGO_THROTTLE_KEY_PREFIX": key_prefix or f"dtdemo{uuid.uuid4().hex[:8]}",
        "PYTHONUNBUFFERED": "1",
    }
    child_env.pop("PORT", None)
    child_env.pop("REDIS_URL", None)
    if redis_url is not None:
        child_env["REDIS_URL"] = redis_url
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "run_demo", "--port", str(port)],
            cwd=ROOT,
            env=child_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    demo = Demo(process, port, log)
    try:
        _wait_until_listening(demo, port, timeout=60)
        yield demo
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail(f"run_demo ignored SIGTERM:\n{demo.output()}")
    assert process.returncode == 0, demo.output()


def _wait_until_listening(demo: Demo, port: int, timeout: float) -> None:
    # A TCP connect, not an HTTP request: a request would spend a token of the bucket tested.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if demo.process.poll() is not None:
            pytest.fail(f"run_demo exited with {demo.process.returncode}:\n{demo.output()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"run_demo did not listen on port {port} in {timeout} s:\n{demo.output()}")


def _has_rate_limit_headers(headers: Message) -> bool:
    return all(
        headers.get(name) is not None
        for name in ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset")
    )


def test_run_demo_serves_the_throttled_api(tmp_path: Path, redis_url: str) -> None:
    real_db_before = REAL_DB.stat().st_mtime_ns if REAL_DB.exists() else None

    with run_demo(tmp_path, redis_url) as demo:
        for path in ("/hello/", "/hello-async/"):
            status, headers = demo.get(path)
            assert status == 200, path
            assert headers["X-RateLimit-Limit"] == "5", path

        status, _ = demo.get("/api/items/")
        assert status in (401, 403)
        status, headers = demo.get("/api/items/", auth=("alice", "alice"))
        assert status == 200
        assert _has_rate_limit_headers(headers)

        # The anonymous bucket (10 tokens, 2 a second) is full again after this, whether or
        # not the requests above drew from it.
        time.sleep(1.5)
        statuses: list[int] = []
        started = time.monotonic()
        while len(statuses) < 40:
            status, headers = demo.get("/api/ping/")
            statuses.append(status)
            if status == 429:
                break
            assert _has_rate_limit_headers(headers)
        elapsed = time.monotonic() - started

        assert statuses[:10] == [200] * 10
        assert statuses[-1] == 429, statuses
        if elapsed < 0.45:  # too fast for a refill: exactly the 11th request is refused
            assert len(statuses) == 11, statuses
        assert int(headers["Retry-After"]) >= 1
        assert _has_rate_limit_headers(headers)
        assert headers["X-RateLimit-Remaining"] == "0"

    output = demo.output()
    assert "admin / admin" in output
    assert "curl" in output
    assert (REAL_DB.stat().st_mtime_ns if REAL_DB.exists() else None) == real_db_before


def test_run_demo_starts_and_stops_its_own_redis(tmp_path: Path) -> None:
    with run_demo(tmp_path, redis_url=None) as demo:
        status, headers = demo.get("/api/ping/")
        assert status == 200
        assert _has_rate_limit_headers(headers)
        match = re.search(r"redis://127\.0\.0\.1:(\d+)/0 \(private", demo.output())
        assert match, demo.output()
        redis_port = int(match[1])

    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", redis_port), 1):
        pass


def test_an_edit_reaches_the_running_server_within_two_seconds(
    tmp_path: Path, redis_url: str
) -> None:
    """Another process (here: this test, as an admin's worker would) changes the anonymous
    tier and publishes the new policy version; the running server enforces it within 2 s."""
    import sqlite3

    import redis

    prefix = f"dtdemo{uuid.uuid4().hex[:8]}"
    with run_demo(tmp_path, redis_url, key_prefix=prefix) as demo:
        status, headers = demo.get("/api/ping/")
        assert status == 200
        assert headers["X-RateLimit-Limit"] == "10"

        with closing(sqlite3.connect(tmp_path / "demo.sqlite3")) as db, db:
            db.execute(
                "UPDATE django_throttle_tierlimit SET rate = '50/s', burst = 50 WHERE tier_id = "
                "(SELECT id FROM django_throttle_tier WHERE slug = 'anonymous')"
            )
        client = redis.Redis.from_url(redis_url)
        client.incr(f"{prefix}:policy-version")
        client.close()

        edited = time.monotonic()
        while headers["X-RateLimit-Limit"] != "50":
            assert time.monotonic() - edited < 2.0, "the edit was not seen within 2 s"
            time.sleep(0.1)
            status, headers = demo.get("/api/ping/")
        assert status == 200


def _post_form(demo: Demo, path: str, fields: dict[str, str]) -> tuple[int, bytes]:
    data = urllib.parse.urlencode(fields).encode()
    request = urllib.request.Request(demo.base + path, data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def test_run_demo_counts_failed_credentials_before_checking_them(
    tmp_path: Path, redis_url: str
) -> None:
    """The seeded "login" and "authentication" rules: 5 failures a minute per address on the
    token endpoint and on Basic authentication, each its own counter."""
    with run_demo(tmp_path, redis_url) as demo:
        status, body = _post_form(demo, "/api/token/", {"username": "alice", "password": "alice"})
        assert status == 200
        token = json.loads(body)["token"]
        wrong = {"username": "alice", "password": "wrong"}
        assert [_post_form(demo, "/api/token/", wrong)[0] for _ in range(6)] == [400] * 5 + [429]
        assert _post_form(demo, "/api/token/", wrong)[0] == 429

        request = urllib.request.Request(demo.base + "/api/items/")
        request.add_header("Authorization", f"Token {token}")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        # A wrong Basic password: 403, as SessionAuthentication comes first (no challenge).
        assert [demo.get("/api/items/", auth=("bob", "wrong"))[0] for _ in range(6)] == [
            403
        ] * 5 + [429]
        # The address is refused for every scheme of the rule now, a right token too.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 429
        refused.value.close()

        status, _ = demo.get("/accounts/login/")
        assert status == 200
