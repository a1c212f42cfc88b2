"""The package's shape: quiet imports, optional dependencies in their adapters, a full wheel."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_throttle"

#: Modules that define models or load them at import, so need configured apps.
NEEDS_APPS = (
    "django_throttle.models",
    "django_throttle.admin",
    # Reads and writes policy rows throughout (manage.py throttle_policy).
    "django_throttle.policy.files",
)
NEEDS_APPS_UNDER = (
    # The admin package registers its ModelAdmins on import; its pages and forms come with it.
    "django_throttle.admin.",
    "django_throttle.migrations.",
    "django_throttle.management.commands.",
    "django_throttle.models.",
)

IMPORT_EVERYTHING = textwrap.dedent(
    """
    import importlib, json, logging, pkgutil, socket, threading

    def refuse(*args, **kwargs):
        raise OSError("a socket was opened at import time")

    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = refuse
    socket.getaddrinfo = refuse

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.DEBUG)

    import django_throttle
    from django.conf import settings

    NEEDS_APPS = set(%(needs_apps)r)
    NEEDS_APPS_UNDER = %(needs_apps_under)r
    imported, failures = ["django_throttle"], []

    def failed(name):
        failures.append(f"{name}: walking into the package failed")

    for info in pkgutil.walk_packages(
        django_throttle.__path__, "django_throttle.", onerror=failed
    ):
        if info.name in NEEDS_APPS or info.name.startswith(NEEDS_APPS_UNDER):
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            failures.append(f"{info.name}: {type(exc).__name__}: {exc}")
        else:
            imported.append(info.name)

    print(json.dumps({
        "imported": imported,
        "failures": failures,
        "threads": [t.name for t in threading.enumerate()],
        "settings_configured": settings.configured,
        "logged": [f"{r.name}: {r.getMessage()}" for r in records
                   if r.name.startswith("django_throttle")],
    }))
    """
) % {"needs_apps": NEEDS_APPS, "needs_apps_under": NEEDS_APPS_UNDER}


def package_modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


@pytest.fixture(scope="module")
def import_report() -> dict[str, Any]:
    """Import every module in one fresh interpreter with no settings and sockets refused."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERYTHING],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


@pytest.mark.slow
@pytest.mark.parametrize(
    "module",
    [
        name
        for name in package_modules()
        if name not in NEEDS_APPS and not name.startswith(NEEDS_APPS_UNDER)
    ],
)
def test_module_imports_without_settings(import_report: dict[str, Any], module: str) -> None:
    errors = [line for line in import_report["failures"] if line.startswith(f"{module}:")]

    assert errors == []
    assert module in import_report["imported"]


@pytest.mark.slow
def test_importing_starts_no_threads(import_report: dict[str, Any]) -> None:
    assert import_report["threads"] == ["MainThread"]


@pytest.mark.slow
def test_importing_configures_no_settings(import_report: dict[str, Any]) -> None:
    assert import_report["settings_configured"] is False


@pytest.mark.slow
def test_importing_logs_nothing(import_report: dict[str, Any]) -> None:
    assert import_report["logged"] == []


def imported_roots(path: Path) -> set[str]:
    """Top-level names of the absolute imports in one source file."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize(
    ("dependency", "allowed_in"),
    [
        ("rest_framework", {"django_throttle/drf.py"}),
        ("drf_spectacular", {"django_throttle/openapi.py"}),
        ("prometheus_client", {"django_throttle/metrics.py"}),
        (
            "redis",
            {
                "django_throttle/backends/redis.py",
                "django_throttle/backends/redis_clients.py",
                "django_throttle/backends/redis_cluster.py",
                "django_throttle/backends/redis_nodes.py",
                # The memory backend is the Redis backend on an in-process store.
                "django_throttle/backends/memory.py",
            },
        ),
        ("lupa", {"django_throttle/backends/memory.py"}),
        ("django_redis", {"django_throttle/backends/redis.py"}),
    ],
)
def test_optional_dependency_stays_in_its_adapter(dependency: str, allowed_in: set[str]) -> None:
    importers = {
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*.py")
        if dependency in imported_roots(path)
    }

    assert importers <= allowed_in


def test_adapters_do_import_their_dependency() -> None:
    """Guards the scan above: it must see the imports that are allowed."""
    assert "rest_framework" in imported_roots(PACKAGE / "drf.py")
    assert "redis" in imported_roots(PACKAGE / "backends" / "redis.py")


@pytest.mark.slow
def test_wheel_ships_lua_and_type_marker(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The distribution is django-throttle-policies: "django-throttle" on the package index
    # is an unrelated project. The import name stays django_throttle.
    [wheel] = tmp_path.glob("django_throttle_policies-*.whl")

    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    [metadata] = [name for name in names if name.endswith(".dist-info/METADATA")]
    assert "Name: django-throttle-policies" in archive.read(metadata).decode()
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)

    assert {
        "django_throttle/backends/lua/token_bucket.lua",
        "django_throttle/backends/lua/driver.lua",
        "django_throttle/backends/lua/prelude.lua",
        "django_throttle/py.typed",
        "django_throttle/rates.py",
        "django_throttle/migrations/0001_initial.py",
        "django_throttle/backends/lua/refund.lua",
        "django_throttle/templates/admin/django_throttle/dashboard.html",
        "django_throttle/templates/admin/django_throttle/inspector.html",
        "django_throttle/static/django_throttle/dashboard.css",
        "django_throttle/static/django_throttle/limit_fields.js",
        "django_throttle/locale/de/LC_MESSAGES/django.mo",
        "django_throttle/locale/fr/LC_MESSAGES/django.mo",
    } <= names
    assert not [name for name in names if name.startswith(("example_project/", "tests/"))]
    assert not [name for name in names if name.endswith(".pyc") or "__pycache__" in name]
