"""The tutorial's blocks build a working project as they are: a fresh ``startproject``, the
settings, views and URLs pasted in, the commands run, and the throttled endpoint answers 200s
and then 429 with ``Retry-After``, the views of steps 6 and 7 answer at their URLs, and the
admin's CSS is served.

A block of ``docs/tutorial.md`` takes part when the line before its fence (MyST comments,
unseen by readers) says what to do with it:

- ``% tutorial: run`` before a ``sh`` block: its commands, one a line, run in order (``python``
  and ``django-admin`` become this interpreter; ``runserver`` is started on a free port and
  left running; ``createsuperuser`` takes its answers from the environment);
- ``% tutorial: append PATH`` / ``% tutorial: write PATH`` before a ``python`` block: the block
  is added at the end of, or becomes, the file at PATH (relative to where ``startproject`` ran);
- ``% tutorial: shell`` before a ``python`` block: the block is fed to ``manage.py shell``
  before the server starts (it makes the rows the tutorial's admin steps make).

Several ``%`` lines may stand before one fence (``% runs-in-tests`` of
``tests/test_docs_examples.py`` too). The Redis URL of the settings block is replaced with the
suite's own server, under a key prefix of this test's.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from example_project.private_redis import free_port

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(
    r"^% tutorial: (?P<action>run|append|write|shell)(?: (?P<path>\S+))?\n(?:%[^\n]*\n)*"
    r"```(?P<lang>\w+)\n(?P<code>.*?)^```",
    re.MULTILINE | re.DOTALL,
)
#: The URL the tutorial's readers have; the test counts on the suite's Redis instead.
READERS_REDIS = "redis://127.0.0.1:6379/0"
#: What a run block may hold that the test leaves out (nothing else is skipped silently).
NOT_RUN = ("pip ",)


def blocks() -> list[tuple[str, str | None, str, str]]:
    text = TUTORIAL.read_text()
    return [(m["action"], m["path"], m["lang"], m["code"]) for m in BLOCK.finditer(text)]


def test_the_tutorial_marks_its_project_blocks() -> None:
    """Without marks the project test below would pass on nothing."""
    found = blocks()
    actions = [(action, path) for action, path, _, _ in found]
    assert ("append", "mysite/settings.py") in actions
    assert ("write", "mysite/urls.py") in actions
    assert ("write", "mysite/views.py") in actions
    assert ("shell", None) in actions
    # Steps 6 and 7: each view the tutorial adds is appended, and urls.py is given whole.
    assert actions.count(("append", "mysite/views.py")) == 2
    assert actions.count(("write", "mysite/urls.py")) == 3
    for action, path, lang, code in found:
        assert lang == ("sh" if action == "run" else "python"), (action, path)
        if path is not None:
            # The reader sees which file a block goes in: its first line says so.
            assert code.startswith(f"# {path}: "), (action, path)


def _env() -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")
    }
    # This checkout's django_throttle, whatever the interpreter has installed.
    env["PYTHONPATH"] = str(ROOT)
    env["DJANGO_SUPERUSER_USERNAME"] = "admin"
    env["DJANGO_SUPERUSER_PASSWORD"] = "tutorial-admin-pass"
    env["DJANGO_SUPERUSER_EMAIL"] = "admin@example.com"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _command(line: str, port: int) -> list[str]:
    words = shlex.split(line.split("#", 1)[0])
    if words[0] == "django-admin":
        return [sys.executable, "-m", "django", *words[1:]]
    assert words[:2] == ["python", "manage.py"], f"the test cannot run {line!r}"
    args = words[2:]
    if args[0] == "createsuperuser":
        args.append("--noinput")
    if args[0] == "runserver":
        args += [f"127.0.0.1:{port}", "--noreload"]
    return [sys.executable, "manage.py", *args]


def _get(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def _wait_until_listening(port: int, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"runserver did not listen: {log.read_text()}")


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for server in started:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.mark.slow  # it runs the project's commands and a server
def test_the_tutorial_builds_a_working_project(
    tmp_path: Path, redis_url: str, servers: list[subprocess.Popen[bytes]]
) -> None:
    cwd = tmp_path
    port = free_port()
    env = _env()
    server_command: list[str] | None = None
    checked = ""
    for action, path, _, code in blocks():
        if action in ("append", "write"):
            assert path is not None
            target = cwd / path
            if path.endswith("settings.py"):
                assert READERS_REDIS in code
                code = code.replace(READERS_REDIS, redis_url)
                code += f'\nDJANGO_THROTTLE_KEY_PREFIX = "dtt-tutorial-{secrets.token_hex(4)}"\n'
            if action == "append":
                assert target.exists(), f"{path} is not in the project to add to"
                target.write_text(target.read_text() + "\n" + code)
            else:
                target.write_text(code)
        elif action == "shell":
            # The rows the admin steps make: before the server starts, so its first request
            # already finds them.
            done = subprocess.run(
                [sys.executable, "manage.py", "shell"],
                cwd=cwd,
                env=env,
                input=code,
                capture_output=True,
                text=True,
                check=False,
            )
            assert done.returncode == 0, done.stderr
        else:
            for line in code.splitlines():
                line = line.strip()
                if not line or line.startswith("#") or line.startswith(NOT_RUN):
                    continue
                if line.startswith("cd "):
                    cwd = cwd / shlex.split(line)[1]
                    continue
                command = _command(line, port)
                if "runserver" in command:
                    server_command = command
                    continue
                done = subprocess.run(
                    command, cwd=cwd, env=env, capture_output=True, text=True, check=False
                )
                assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
                if "check" in command:
                    checked = done.stdout + done.stderr
    # manage.py check: no warnings and no errors (a warning would not fail the command).
    assert "System check identified no issues" in checked, checked
    assert server_command is not None, "the tutorial never starts the server"

    log = tmp_path / "runserver.log"
    with log.open("wb") as output:
        servers.append(
            subprocess.Popen(
                server_command, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT
            )
        )
    _wait_until_listening(port, servers[0], log)
    base = f"http://127.0.0.1:{port}"

    # The anonymous tier: a bucket of 10 refilling 2 a second, so 10 answers and then a 429
    # (a slow machine may see a token or two come back first).
    answers = []
    for _ in range(20):
        answers.append(_get(f"{base}/api/ping/"))
        if answers[-1][0] == 429:
            break
    statuses = [status for status, _, _ in answers]
    assert statuses[:10] == [200] * 10, statuses
    assert statuses[-1] == 429, statuses
    assert answers[0][1]["X-RateLimit-Limit"] == "10"
    refused = answers[-1][1]
    assert int(refused["Retry-After"]) >= 1
    assert refused["X-RateLimit-Remaining"] == "0"

    # Steps 6 and 7: the views the tutorial adds answer at the URLs it gives them. The inline
    # 5/min of @throttle is the hello view's own, not the tier's; the others take a token of
    # the anonymous bucket, which refills 2 a second.
    time.sleep(1.5)
    codes = [_get(f"{base}/hello/")[0] for _ in range(6)]
    assert codes == [200] * 5 + [429], codes
    status, headers, _ = _get(f"{base}/hello/")
    assert (status, headers["X-RateLimit-Limit"], headers["X-RateLimit-Remaining"]) == (
        429,
        "5",
        "0",
    )
    status, headers, body = _get(f"{base}/login/")
    assert (status, body, headers["X-RateLimit-Limit"]) == (200, b"welcome", "10")
    status, _, body = _get(f"{base}/api/export/", method="POST")
    assert (status, body) == (202, b'{"status":"queued"}')

    # The admin has its CSS: staticfiles is installed and runserver (DEBUG) serves it.
    status, _, page = _get(f"{base}/admin/login/")
    assert status == 200
    assert b"/static/admin/css/base.css" in page
    status, headers, _ = _get(f"{base}/static/admin/css/base.css")
    assert status == 200
    assert headers["Content-Type"].startswith("text/css")
