"""The public API is the API reference: a module that declares ``__all__`` is one
``docs/reference/api.rst`` documents, every name in that ``__all__`` is documented there, and
every name the page documents imports; and what the README and the docs pages tell users to
import (``from django_throttle… import …``) is documented there. A name made public without
its docs, docs naming something that moved, or a how-to importing an internal name fails here.

The page is read as text (no Sphinx build), the way autodoc reads it: an ``auto*`` directive
documents its target; ``automodule`` with ``:members: a, b`` documents those names, and with a
bare ``:members:`` every name of the module's ``__all__`` that has a docstring (autodoc skips
the others). A name written as a literal (````name````) in the page's text counts as listed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import django_throttle

ROOT = Path(__file__).resolve().parent.parent
API_PAGE = ROOT / "docs" / "reference" / "api.rst"
#: The pages that tell users what to import: the README and every page of the docs.
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "docs").rglob("*.rst")),
]
IMPORT = re.compile(r"^\s*from (django_throttle[\w.]*) import ([\w, ]+)$", re.MULTILINE)
PACKAGE = Path(django_throttle.__file__).resolve().parent

# Modules allowed an ``__all__`` the API reference does not document: none. Do not add to it.
PENDING: set[str] = set()

DIRECTIVE = re.compile(
    r"^\.\. (auto(?:module|class|function|exception|data))::\s*(\S+)\n((?:[ \t]+:.*\n)*)",
    re.MULTILINE,
)


def module_all(path: Path) -> list[str] | None:
    """The literal ``__all__`` a source file assigns at module level, or None."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "__all__":
            names = ast.literal_eval(value)
            assert isinstance(names, list)
            return [str(name) for name in names]
    return None


def modules_with_all() -> dict[str, list[str]]:
    """Every package module that declares ``__all__``, by dotted name (migrations aside)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        if "migrations" in rel.parts:
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        names = module_all(path)
        if names is not None:
            found[".".join(parts)] = names
    return found


def split_target(target: str) -> tuple[str, str | None]:
    """``package.module.Name`` as (module, name); a module target as (module, None)."""
    try:
        importlib.import_module(target)
    except ImportError:
        module, _, name = target.rpartition(".")
        return module, name
    return target, None


def documented() -> tuple[set[str], set[tuple[str, str]], set[str]]:
    """What the page documents: modules, (module, name) pairs, and names listed as literals."""
    text = API_PAGE.read_text()
    modules: set[str] = set()
    names: set[tuple[str, str]] = set()
    for match in DIRECTIVE.finditer(text):
        kind, target, options = match[1], match[2], match[3]
        module, name = split_target(target)
        modules.add(module)
        if name is not None:
            names.add((module, name))
            continue
        members = re.search(r":members:(.*)", options)
        if kind != "automodule" or members is None:
            continue
        listed = [n.strip() for n in members[1].split(",") if n.strip()]
        if listed:
            names.update((module, n) for n in listed)
        else:
            obj = importlib.import_module(module)
            names.update(
                (module, n) for n in getattr(obj, "__all__", []) if inspect.getdoc(getattr(obj, n))
            )
    literals = set(re.findall(r"``(\w+)``", text))
    return modules, names, literals


def resolve(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def is_documented(module: str, name: str, names: set[tuple[str, str]], literals: set[str]) -> bool:
    """Whether the page documents ``module.name``, lists the name, or documents the same
    object under the module that defines it (a re-export)."""
    if (module, name) in names or name in literals:
        return True
    obj = resolve(module, name)
    return any(obj is resolve(*pair) for pair in names)


def test_only_documented_modules_declare_all() -> None:
    modules, _, _ = documented()
    undocumented = sorted(set(modules_with_all()) - modules - PENDING)
    assert not undocumented, (
        f"{undocumented} declare __all__ but docs/reference/api.rst does not document them: "
        "document them there, or make them internal (no __all__)"
    )


def test_every_public_name_is_documented() -> None:
    _, names, literals = documented()
    missing = [
        f"{module}.{name}"
        for module, public in modules_with_all().items()
        if module not in PENDING
        for name in public
        if not is_documented(module, name, names, literals)
    ]
    assert not missing, f"in __all__ but not in docs/reference/api.rst: {missing}"


def test_the_docs_import_only_the_public_api() -> None:
    """What the tutorial, the how-tos and the README tell users to import is in the API
    reference, so following the docs never leads into an internal module."""
    _, names, literals = documented()
    internal = sorted(
        f"{page.relative_to(ROOT)}: {module}.{name}"
        for page in PAGES
        for module, imported in IMPORT.findall(page.read_text())
        for name in (n.strip() for n in imported.split(","))
        if name and not is_documented(module, name, names, literals)
    )
    assert not internal, f"the docs import names the API reference does not document: {internal}"


@pytest.mark.parametrize("pair", sorted(documented()[1]), ids=lambda pair: ".".join(pair))
def test_every_documented_name_imports(pair: tuple[str, str]) -> None:
    module, name = pair
    assert resolve(module, name) is not None


def test_every_public_module_has_all() -> None:
    """A documented module says which of its names are the API; the rest are internal."""
    modules, _, _ = documented()
    assert sorted(modules - set(modules_with_all())) == []
