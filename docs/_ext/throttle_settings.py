"""Every ``DJANGO_THROTTLE_*`` setting as the code defines it, for the settings reference.

Read from :class:`django_throttle.conf.Settings` (each property's docstring, or a
``Setting``'s ``#:`` comment, its type, the default as ``conf.py`` writes it) and
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
    """Every setting in ``conf.Settings``, in the order ``conf.py`` defines them."""
    from django_throttle import checks, conf

    source = Path(inspect.getfile(conf)).read_text()
    tree = ast.parse(source)
    check_ids = {name: check_id for check_id, name, _ in checks.SETTINGS}
    validators = {name: validate for _, name, validate in checks.SETTINGS}
    (cls,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    found = []
    lines = source.splitlines()
    for prop in cls.body:
        if isinstance(prop, ast.Assign) and isinstance(prop.value, ast.Call):
            # NAME = Setting(default, cast), documented by the "#:" comments above it.
            (target,) = prop.targets
            assert isinstance(target, ast.Name)
            default, cast = prop.value.args
            above = []
            for line in reversed(lines[: prop.lineno - 1]):
                if not line.strip().startswith("#:"):
                    break
                above.insert(0, line.strip()[2:].strip())
            found.append(
                {
                    "name": conf.PREFIX + target.id,
                    "type": ast.get_source_segment(source, cast) or "",
                    "default": ast.get_source_segment(source, default) or "",
                    "check": check_ids.get(target.id, ""),
                    "doc": "\n".join(above),
                    "valid": _valid_values(validators.get(target.id)),
                }
            )
            continue
        if not (isinstance(prop, ast.FunctionDef) and prop.name.isupper()):
            continue
        default = None
        for call in ast.walk(prop):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "_get"
                and isinstance(call.args[0], ast.Constant)
                and call.args[0].value == prop.name
            ):
                default = ast.get_source_segment(source, call.args[1])
        if default is None:
            raise ValueError(f"conf.Settings.{prop.name} reads no setting of its own name")
        found.append(
            {
                "name": conf.PREFIX + prop.name,
                "type": ast.get_source_segment(source, prop.returns) if prop.returns else "",
                "default": default,
                "check": check_ids.get(prop.name, ""),
                "doc": ast.get_docstring(prop) or "",
                "valid": _valid_values(validators.get(prop.name)),
            }
        )
    return found


def _valid_values(validate: Any) -> str:
    """What the setting's system check accepts, in the check's own words: its message for a
    value no setting takes (a huge negative number fails every type and range test)."""
    if validate is None:
        return ""
    problem = validate(-(10**12))
    return "" if problem is None else problem[0].upper() + problem[1:] + "."
