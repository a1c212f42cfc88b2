"""The docs say what the code does: their marked examples run, their settings pass the system
checks, and every setting and check id of the code is in the reference.

A Python block in a page under ``docs/`` is run when the line before its fence says so:

- ``% runs-in-tests``: the block runs as a module of its own (imports, views, rows written to
  the test database), with nothing given to it: a reader pastes it into ``manage.py shell``;
- ``% runs-in-tests as myproject.responses``: the same, then importable under that name, so
  a settings example can point a dotted path at it;
- ``% settings-in-tests``: the block is a settings file. Its ``DJANGO_THROTTLE_*`` values must
  pass django-throttle's system checks, and every app, middleware and class it names must
  import;
- ``% policy-in-tests`` before a ``json`` block: a policy file, which ``manage.py
  throttle_policy import`` must take, and then find nothing to change in a second time.

The README's test command must be the one ``.ci/run`` runs, byte for byte.
"""

from __future__ import annotations

import importlib
import io
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils.module_loading import import_string

from django_throttle import checks, conf
from django_throttle.testing import isolated_throttle

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
from throttle_settings import settings_reference  # noqa: E402

MARKED = re.compile(
    r"^% (?P<kind>runs-in-tests|settings-in-tests|policy-in-tests)(?: as (?P<module>[\w.]+))?\n"
    r"```(?:python|json)\n(?P<code>.*?)^```",
    re.MULTILINE | re.DOTALL,
)
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)


def examples(page: Path) -> list[tuple[str, str | None, str, int]]:
    text = page.read_text()
    return [
        (
            m["kind"],
            m["module"],
            m["code"],
            text.count("\n", 0, m.start("code")) + 1,
        )
        for m in MARKED.finditer(text)
    ]


PAGES_WITH_EXAMPLES = [page for page in PAGES if examples(page)]


def test_pages_have_examples_that_run() -> None:
    assert len(PAGES_WITH_EXAMPLES) >= 8
    assert sum(len(examples(page)) for page in PAGES) >= 20


def _dotted_paths(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if "." in value and " " not in value and "/" not in value else []
    if isinstance(value, dict):
        return [path for item in value.values() for path in _dotted_paths(item)]
    if isinstance(value, (list, tuple)):
        return [path for item in value for path in _dotted_paths(item)]
    return []


def check_settings_example(namespace: dict[str, Any]) -> None:
    values = {
        name: value
        for name, value in namespace.items()
        if name.isupper() and not isinstance(value, types.ModuleType)
    }
    assert values, "a settings example sets nothing"
    for name in ("INSTALLED_APPS",):
        for app in values.get(name, []):
            if app is not Ellipsis:
                importlib.import_module(app)
    for name in ("MIDDLEWARE", "REST_FRAMEWORK"):
        for path in _dotted_paths(values.get(name, [])):
            import_string(path)
    throttle = {name: value for name, value in values.items() if name.startswith(conf.PREFIX)}
    with override_settings(**throttle):
        problems = [str(message) for message in checks.check_settings()]
    assert problems == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "page", PAGES_WITH_EXAMPLES, ids=[str(p.relative_to(DOCS)) for p in PAGES_WITH_EXAMPLES]
)
def test_examples_of_the_page_run(
    page: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    found = examples(page)
    with (
        override_settings(DJANGO_THROTTLE_REDIS_URL="memory://"),
        isolated_throttle(),
    ):
        # Modules first, so a settings example can name one of them.
        for kind, name, code, line in found:
            if kind != "runs-in-tests":
                continue
            module = types.ModuleType(name or f"docs_example_{page.stem}_{line}")
            exec(compile(code, f"{page}:{line}", "exec"), module.__dict__)
            if name:
                parts = name.split(".")
                for depth in range(1, len(parts)):
                    parent = ".".join(parts[:depth])
                    if parent not in sys.modules:
                        package = types.ModuleType(parent)
                        package.__path__ = []
                        monkeypatch.setitem(sys.modules, parent, package)
                monkeypatch.setitem(sys.modules, name, module)
        for kind, _, code, line in found:
            if kind == "settings-in-tests":
                namespace: dict[str, Any] = {}
                exec(compile(code, f"{page}:{line}", "exec"), namespace)
                check_settings_example(namespace)
            elif kind == "policy-in-tests":
                policy = tmp_path / f"policy-{line}.json"
                policy.write_text(code)
                call_command("throttle_policy", "import", str(policy), stdout=io.StringIO())
                again = io.StringIO()
                call_command("throttle_policy", "import", str(policy), stdout=again)
                assert "No changes" in again.getvalue()


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Run the tests", 1)[1]
    command = re.search(r"```sh\n(.*?)\n```", section, re.DOTALL)
    assert command is not None
    assert command[1] == (
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' "
        "&& .venv/bin/python -m pytest"
    )
    assert command[1] in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_settings_reference_has_every_setting_with_a_docstring_and_a_check() -> None:
    documented = {setting["name"] for setting in settings_reference()}
    defined = {conf.PREFIX + name for name in conf.NAMES}
    assert documented == defined
    for setting in settings_reference():
        assert setting["doc"], setting["name"]
        assert setting["check"], setting["name"]


def _expand(ids: set[str]) -> set[str]:
    """``E101`` to ``E105``, written as a range in the checks page."""
    return {f"E{n}" for n in range(101, 106)} if {"E101", "E105"} <= ids else set()


def test_every_check_id_in_the_code_is_in_the_checks_reference() -> None:
    source = "\n".join(path.read_text() for path in (ROOT / "django_throttle").rglob("*.py"))
    in_code = set(re.findall(r"django_throttle\.([EW]\d{3})", source))
    in_code |= {check_id for check_id, _, _ in checks.SETTINGS}
    page = (DOCS / "reference" / "checks.rst").read_text()
    written = set(re.findall(r"django_throttle\.([EW]\d{3})", page))
    generated = {setting["check"] for setting in settings_reference()}
    assert in_code - (written | _expand(written) | generated) == set()
