"""How much of the package one request passes through, counted so the path stays short.

The design's budget (issue 31, item 4) is at most 35 of the package's function calls in at most
8 of its modules between the adapter and the reply, for one DRF request through
``PolicyThrottle`` and the headers middleware. Each call into a function of ``django_throttle``
(a generator resumed counts again) is recorded with ``sys.setprofile``; the bounds below are
what the code reaches today, the budget is the target, and a failure prints the trace, one
``module:function`` a line, so a reader sees what to cut.

The backend's own modules (the send path) are counted too: they are part of the request.
"""

from __future__ import annotations

import ast
import itertools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from django.test import Client

from django_throttle import events
from django_throttle.policy import live as policy
from django_throttle.usage import accounting as usage
from tests.factories import tier

pytestmark = pytest.mark.django_db

PACKAGE = "django_throttle"
#: The target of issue 31 item 4.
BUDGET_CALLS, BUDGET_MODULES = 35, 8
#: What the code reaches today (the send path in ``backends/`` included); lower them as it shortens.
DRF_CALLS, DRF_MODULES = 28, 8
DECORATOR_CALLS, DECORATOR_MODULES = 30, 9


def trace(action: Callable[[], Any]) -> list[str]:
    """``module:function`` of every call into the package while ``action`` runs."""
    calls: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.startswith("django_throttle"):
                calls.append(f"{module}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    return calls


def report(calls: list[str]) -> str:
    modules = [call.split(":")[0] for call in calls]
    switches = sum(1 for a, b in itertools.pairwise(modules) if a != b)
    inside = sum(1 for m in modules if m.startswith("django_throttle.backends"))
    return (
        f"{len(calls)} calls ({inside} in backends/) in {len(set(modules))} modules, "
        f"{switches} module switches:\n" + "\n".join(calls)
    )


@pytest.fixture
def steady(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A policy snapshot that needs no refresh check while the request is traced (the check
    runs at most once a second per process, not on the request path), and no listener of the
    decisions (an earlier test may have connected the metrics' receivers): their cost is the
    listener's, not the path's."""
    monkeypatch.setattr(policy, "clock", lambda: 1_000.0)
    for signal in (events.request_decided, events.request_throttled):
        monkeypatch.setattr(signal, "receivers", [])
    yield


def traced_request(client: Client, path: str) -> list[str]:
    for _ in range(2):  # compile the policy, load the script, open the connection
        assert client.get(path).status_code == 200
    # The first push of a process is due at once: the pusher thread has taken it before the
    # traced request, which is then a plain one (a push is due once a second).
    assert usage.wait_pushed()
    response: list[Any] = []
    calls = trace(lambda: response.append(client.get(path)))
    assert response[0].status_code == 200
    return calls


def test_one_drf_request_passes_few_package_calls(client: Client, steady: None) -> None:
    """One DRF request through ``PolicyThrottle`` and ``RateLimitHeadersMiddleware`` on the
    Redis backend, counted and given its headers."""
    tier("anonymous", "1000/m", is_default_anonymous=True)
    calls = traced_request(client, "/api/ping/")
    print(report(calls))
    modules = {call.split(":")[0] for call in calls}
    assert "django_throttle.drf:PolicyThrottle.allow_request" in {
        f"{c.split(':')[0]}:PolicyThrottle.{c.split(':')[1]}" for c in calls
    }
    assert len(calls) <= DRF_CALLS and len(modules) <= DRF_MODULES, report(calls)


def test_one_decorated_request_passes_few_package_calls(client: Client, steady: None) -> None:
    """One request to a sync ``@throttle(rate=…)`` view on the Redis backend."""
    calls = traced_request(client, "/hello/")
    print(report(calls))
    modules = {call.split(":")[0] for call in calls}
    assert any(call.startswith("django_throttle.request") for call in calls), report(calls)
    assert len(calls) <= DECORATOR_CALLS and len(modules) <= DECORATOR_MODULES, report(calls)


def private_imports(root: Path) -> list[str]:
    """``file: module._name`` for each import of another module's underscore name."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
                found += [
                    f"{path.relative_to(root.parent)}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    """Ruff's ``PLC2701`` (on in pyproject) leaves imports inside one package alone; this
    holds the package to the same rule."""
    root = Path(__file__).resolve().parent.parent / PACKAGE
    found = private_imports(root)
    assert found == [], "\n".join(found)
