"""Every ``DJANGO_THROTTLE_*`` setting as the code defines it, for the settings reference.

Read from :class:`django_throttle.conf.Settings` (each ``Setting``'s ``#:`` comment, its
type, the default as ``conf.py`` writes it, or how it is derived when unset) and
``django_throttle.checks.SETTINGS`` (the check that validates it, and what that check
accepts). Plain Python, no Sphinx: the docs build and
``tests/test_docs_examples.py`` both import it.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any


def settings_reference() -> list[dict[str, str]]:
    """Every setting in ``conf.Settings``, in the order ``conf.py`` defines them: each
    ``NAME: Setting[type] = Setting(default, parse)`` with the ``#:`` comments
    above it (what it holds and why a project sets it)."""
    from django_throttle import checks, conf

    source = Path(inspect.getfile(conf)).read_text()
    tree = ast.parse(source)
    check_ids = {name: check_id for check_id, name, _ in checks.SETTINGS}
    validators = {name: validate for _, name, validate in checks.SETTINGS}
    (cls,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    found = []
    lines = source.splitlines()
    for node in cls.body:
        if not (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(node.value, ast.Call)
            and isinstance(node.annotation, ast.Subscript)
        ):
            continue
        name = node.target.id
        first = node.value.args[0]
        # A default named by a constant of conf.py is shown as its value.
        shown = repr(getattr(conf, first.id)) if isinstance(first, ast.Name) else None
        default = shown or ast.get_source_segment(source, first) or ""
        above = []
        for line in reversed(lines[: node.lineno - 1]):
            if not line.strip().startswith("#:"):
                break
            above.insert(0, line.strip()[2:].strip())
        found.append(
            {
                "name": conf.PREFIX + name,
                "type": ast.get_source_segment(source, node.annotation.slice) or "",
                "default": default,
                "check": check_ids.get(name, ""),
                "doc": "\n".join(above),
                "valid": _valid_values(validators.get(name)),
            }
        )
    return found


def removed_settings() -> list[dict[str, str]]:
    """Every setting of earlier versions (``conf.REMOVED``) with what replaces it."""
    from django_throttle import conf

    return [
        {"name": conf.PREFIX + name, "replacement": removed.replacement}
        for name, removed in conf.REMOVED.items()
    ]


def _valid_values(validate: Any) -> str:
    """What the setting's system check accepts, in the check's own words: its message for a
    value no setting takes (a huge negative number fails every type and range test)."""
    if validate is None:
        return ""
    problem = validate(-(10**12))
    return "" if problem is None else problem[0].upper() + problem[1:] + "."
