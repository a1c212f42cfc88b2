"""``manage.py throttle_policy``: policies as files, for version control and for moving them
between environments.

    throttle_policy export [--format json|yaml] [--output FILE] [--no-assignments]
    throttle_policy import FILE [--dry-run] [--prune] [--format json|yaml]
    throttle_policy from-drf [--format json|yaml] [--output FILE] [--apply [--dry-run]]

``import`` prints every change (``+`` added, ``~`` changed, ``-`` deleted); with ``--dry-run``
it prints them and writes nothing. An import saved while Redis cannot be told of it (down) says
so and exits with status 3: the running processes apply it only when their snapshots are next
recompiled, within five minutes, not within a second. A file with any problem is refused
whole, each problem naming its entry and field. ``from-drf`` turns the ``REST_FRAMEWORK``
throttle settings into a policy file, or imports it with ``--apply``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from django_throttle.management import output
from django_throttle.policy.files import (
    MAX_BYTES,
    PolicyFileError,
    decode,
    dump,
    export_policy,
    from_drf,
    import_policy,
    load,
    too_big,
)
from django_throttle.policy.live import MAX_AGE
from django_throttle.signals import unpublished

FORMATS = ("json", "yaml")
#: The exit status of an import saved but not published to the running processes (1 is an
#: import that wrote nothing), as the other commands exit 3 after a partial answer.
UNPUBLISHED = 3


class Command(output.ThrottleCommand):
    help = (
        "Export, import or convert throttle policies (tiers, endpoint rules, assignments, "
        "exemptions)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = self.add_subcommands(parser, dest="action", required=True, metavar="ACTION")
        export = self.add_subcommand(
            actions, "export", help="write the policy in the database to a file"
        )
        _format(export)
        export.add_argument("--output", "-o", help="file to write (default: standard output)")
        export.add_argument(
            "--no-assignments",
            action="store_true",
            help=(
                "leave out who is in which tier and who is exempt (users and groups differ "
                "between sites)"
            ),
        )
        load_ = self.add_subcommand(actions, "import", help="make the database hold a policy file")
        load_.add_argument("file", help="a policy file, or - for standard input")
        _format(load_, default=None)
        _changes(load_)
        drf = self.add_subcommand(
            actions, "from-drf", help="convert REST_FRAMEWORK's DEFAULT_THROTTLE_RATES to a policy"
        )
        _format(drf)
        drf.add_argument("--output", "-o", help="file to write (default: standard output)")
        drf.add_argument("--apply", action="store_true", help="import it instead of printing")
        _changes(drf)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["action"] == "export":
                document = export_policy(assignments=not options["no_assignments"])
                text = dump(document, options["format"])
                problem = too_big(document, text)
                if problem is not None:
                    fix = "" if options["no_assignments"] else "; write it with --no-assignments"
                    raise CommandError(f"Nothing was written: {problem}{fix}")
                self._write(text, options["output"])
            elif options["action"] == "import":
                path = options["file"]
                fmt = options["format"] or (
                    "yaml" if path.lower().endswith((".yaml", ".yml")) else "json"
                )
                try:
                    document = load(decode(_read(path)), fmt)
                except PolicyFileError as exc:
                    name = "standard input" if path == "-" else path
                    raise CommandError(f"Nothing was imported: {name}: {exc.problems[0]}") from exc
                self._apply(document, options)
            else:
                document = from_drf(getattr(settings, "REST_FRAMEWORK", {}) or {})
                if options["apply"]:
                    self._apply(document, options)
                else:
                    self._write(dump(document, options["format"]), options["output"])
        except PolicyFileError as exc:
            if len(exc.problems) == 1:
                raise CommandError(f"Nothing was imported: {exc.problems[0]}") from exc
            lines = "\n".join(f"  {problem}" for problem in exc.problems)
            raise CommandError(f"Nothing was imported; the policy has problems:\n{lines}") from exc

    def _apply(self, document: Any, options: dict[str, Any]) -> None:
        """Import ``document`` (or only list its changes, with ``--dry-run``), printing each
        change and a summary line."""
        token = unpublished.set(None)
        try:
            changes = import_policy(document, dry_run=options["dry_run"], prune=options["prune"])
            failed = unpublished.get()
        finally:
            unpublished.reset(token)
        for change in changes:
            style = {"+": self.style.SUCCESS, "-": self.style.ERROR}.get(
                change.action, self.style.WARNING
            )
            self.stdout.write(style(str(change)))
        count = f"{len(changes)} change{'' if len(changes) == 1 else 's'}"
        if not changes:
            self.stdout.write("No changes: the database already holds this policy.")
        elif options["dry_run"]:
            self.stdout.write(f"Dry run: {count} listed, nothing written.")
        else:
            self.stdout.write(f"Imported: {count}.")
            if failed is not None:
                raise CommandError(
                    f"Redis is unreachable ({failed}): the running processes apply the import "
                    f"within {round(MAX_AGE / 60)} minutes, not within a second.",
                    returncode=UNPUBLISHED,
                )

    def _write(self, text: str, output: str | None) -> None:
        if output:
            try:
                Path(output).write_text(text, encoding="utf-8")
            except OSError as exc:  # a missing folder, a directory, no permission
                raise CommandError(f"Cannot write {output}: {exc.strerror or exc}") from exc
            self.stderr.write(f"Wrote {output}")
        else:
            self.stdout.write(text, ending="")


def _format(parser: CommandParser, default: str | None = "json") -> None:
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=default,
        help="file format" + (f" (default {default})" if default else " (default: by extension)"),
    )


def _changes(parser: CommandParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="list the changes, write nothing")
    parser.add_argument(
        "--prune",
        action="store_true",
        help=(
            "also delete tiers, rules (and assignments and exemptions, when the file has "
            "them) not in it"
        ),
    )


def _read(path: str) -> bytes:
    """The file's bytes (decoded by :func:`decode`, which knows a byte order mark), refused
    above :data:`~django_throttle.policy.files.MAX_BYTES`: a file by its size before any of
    it is read, standard input (or a file that grows) after ``MAX_BYTES`` and one more byte,
    so an import never holds more than that in memory."""
    if path == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is not None:
            data: bytes = stream.read(MAX_BYTES + 1)
        else:  # a text stream: at most as many characters, each one byte or more
            data = sys.stdin.read(MAX_BYTES + 1).encode()
        if len(data) > MAX_BYTES:
            raise CommandError(f"Nothing was imported: standard input is {_over('more than')}.")
        return data
    try:
        with Path(path).open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            data = b"" if size > MAX_BYTES else file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise CommandError(f"Cannot read {path}: {exc.strerror or exc}") from exc
    if size > MAX_BYTES:
        raise CommandError(f"Nothing was imported: {path} is {size:,} bytes, {_over('over')}.")
    if len(data) > MAX_BYTES:  # it grew while being read
        raise CommandError(f"Nothing was imported: {path} is {_over('more than')}.")
    return data


def _over(words: str) -> str:
    """The bound, after ``words`` ("over", "more than"), for the line refusing a file."""
    return f"{words} the {MAX_BYTES:,} bytes ({MAX_BYTES >> 20} MiB) a policy file may weigh"
