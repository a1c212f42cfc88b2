"""A worker killed with SIGKILL loses at most its last second's usage counts: it counts in
process, and its pusher thread pushes them once a second, whether or not another request
comes (a worker gone idle pushes its last counts too)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent

#: A real WSGI server over the tests' settings: its own SQLite file, the suite's Redis.
SERVER = """
import sys
from django.conf import settings
settings.DJANGO_THROTTLE_KEY_PREFIX = sys.argv[1]
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from tests.factories import endpoint, tier
anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
endpoint("ping", "route", "ping", limits={anonymous: "5/h"})
from wsgiref.simple_server import WSGIRequestHandler, make_server
from django.core.wsgi import get_wsgi_application

class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass

server = make_server("127.0.0.1", 0, get_wsgi_application(), handler_class=Quiet)
print(server.server_port, flush=True)
server.serve_forever()
"""


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def report(by: str) -> list[dict[str, object]]:
    out = StringIO()
    call_command("throttle_usage", "--by", by, "--format", "json", stdout=out, stderr=StringIO())
    rows: list[dict[str, object]] = json.loads(out.getvalue())
    return rows


def pushed() -> tuple[object, object] | None:
    """The ping endpoint's allowed and denied counts the worker has pushed so far."""
    rows = report("endpoint")
    return (rows[0]["allowed"], rows[0]["denied"]) if rows else None


def test_a_worker_killed_after_its_responses_loses_at_most_its_last_second(
    tmp_path: Path, _isolated_throttle: str
) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'server.sqlite3'}",
        "PYTHONPATH": str(ROOT),
    }
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, _isolated_throttle],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    try:
        port = int(server.stdout.readline())
        statuses = [status(f"http://127.0.0.1:{port}/api/ping/") for _ in range(12)]
        # Idle: no request wakes the pusher, its push falls due by itself (a second after
        # the last, later only when the machine is loaded: waited for, without a request).
        time.sleep(2.0)
        deadline = time.monotonic() + 30
        while (idle := pushed()) != (5, 7) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert idle == (5, 7)  # pushed with no request to wake it
        statuses.append(status(f"http://127.0.0.1:{port}/api/ping/"))  # its last second
        server.send_signal(signal.SIGKILL)  # the moment the last response arrived
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        server.stdout.close()

    assert server.returncode == -signal.SIGKILL
    assert statuses == [200] * 5 + [429] * 8
    # Every count before the idle second is in; the last request's may be lost with the worker.
    [ping] = report("endpoint")
    assert (ping["endpoint"], ping["allowed"]) == ("ping", 5)
    assert ping["denied"] in (7, 8) and ping["total"] == 5 + ping["denied"]
    [client] = report("client")
    assert (client["client"], client["allowed"], client["denied"]) == (
        "ip:127.0.0.1",
        5,
        ping["denied"],
    )
    [anonymous] = report("tier")
    assert (anonymous["tier"], anonymous["total"]) == ("anonymous", ping["total"])
