"""Reference pages written from the code, so they cannot drift from it.

- ``.. throttle-settings::`` lists every ``DJANGO_THROTTLE_*`` setting of
  :class:`django_throttle.conf.Settings` (its property docstring, its type, the default as
  ``conf.py`` writes it) with the system check that validates it (``checks.SETTINGS``).
- ``.. throttle-setting-checks::`` lists the check id of each setting, with what it accepts.
- ``.. throttle-commands:: NAME`` prints management command ``NAME``'s ``--help`` (and its
  subcommands'); with no name, every command's. The examples around it are written by hand in
  ``reference/commands.rst`` from real runs; ``tests/test_docs_pages.py`` asserts each command
  has them.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles
from throttle_settings import settings_reference


def _parse(directive: SphinxDirective, lines: list[str]) -> list[nodes.Node]:
    node = nodes.section()
    node.document = directive.state.document
    source = directive.get_source_info()[0]
    nested_parse_with_titles(directive.state, StringList(lines, source), node)
    return node.children


class SettingsDirective(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        found = settings_reference()
        lines = [".. list-table::", "   :header-rows: 1", "", "   * - setting", "     - default"]
        lines.append("     - check")
        for setting in found:
            lines.append(f"   * - :ref:`{setting['name']} <setting-{setting['name']}>`")
            lines.append(f"     - ``{setting['default']}``")
            lines.append(f"     - ``{setting['check']}``" if setting["check"] else "     -")
        lines.append("")
        for setting in found:
            name = setting["name"]
            lines += [f".. _setting-{name}:", "", f"``{name}``", "~" * (len(name) + 4), ""]
            lines += [f":Default: ``{setting['default']}``", f":Type: ``{setting['type']}``"]
            if setting["check"]:
                lines.append(f":Checked by: ``django_throttle.{setting['check']}``")
            if setting["valid"]:
                lines.append(f":Valid values: {setting['valid']}")
            lines += ["", *setting["doc"].splitlines(), ""]
        return _parse(self, lines)


def _subcommand_helps(parser: argparse.ArgumentParser) -> list[str]:
    return [
        sub.format_help()
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for sub in action.choices.values()
    ]


class SettingChecksDirective(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        lines = [".. list-table::", "   :header-rows: 1", "", "   * - id", "     - setting"]
        lines.append("     - the check's message ends")
        for setting in sorted(settings_reference(), key=lambda s: s["check"]):
            if setting["check"]:
                lines.append(f"   * - ``django_throttle.{setting['check']}``")
                lines.append(f"     - :ref:`{setting['name']} <setting-{setting['name']}>`")
                lines.append(f"     - {setting['valid'] or '-'}")
        return _parse(self, lines)


def command_names() -> list[str]:
    from django.core.management import find_commands

    import django_throttle

    folder = os.path.join(os.path.dirname(django_throttle.__file__), "management")
    return sorted(find_commands(folder))


class CommandsDirective(SphinxDirective):
    optional_arguments = 1

    def run(self) -> list[nodes.Node]:
        from django.core.management import load_command_class

        os.environ["COLUMNS"] = "92"
        lines: list[str] = []
        names = self.arguments or command_names()
        for name in names:
            if name not in command_names():
                raise self.error(f"{name!r} is no management command of django_throttle")
            command = load_command_class("django_throttle", name)
            parser = command.create_parser("manage.py", name)
            if not self.arguments:
                lines += [f"``{name}``", "~" * (len(name) + 4), ""]
            for help_text in [parser.format_help(), *_subcommand_helps(parser)]:
                lines += ["::", ""]
                lines += ["   " + line if line else "" for line in help_text.splitlines()]
                lines.append("")
        return _parse(self, lines)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("throttle-settings", SettingsDirective)
    app.add_directive("throttle-commands", CommandsDirective)
    app.add_directive("throttle-setting-checks", SettingChecksDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
