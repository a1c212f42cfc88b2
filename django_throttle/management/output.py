"""Output shared by the operator commands: the same rows as a table (rich), JSON (a list of
objects) or CSV with a header row, chosen with ``--format`` as in ``throttle_usage``.

Every data cell is plain text: a client label or username is attacker-chosen, so a table
cell is a rich ``Text`` (``[/x]`` or ``[link=…]`` is shown, never parsed as markup) and table
and CSV cells have control characters removed (:func:`~django_throttle.redaction.plain_text`: no
ESC sequence reaches the operator's terminal). A CSV text cell that a spreadsheet would run
as a formula (``=``, ``+``, ``-``, ``@``) starts with ``'``. JSON escapes control characters
itself."""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from django.core.management.base import (
    BaseCommand,
    CommandError,
    CommandParser,
    DjangoHelpFormatter,
)
from rich.console import Console
from rich.table import Table
from rich.text import Text

from django_throttle.backends import get_backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.inspection.clients import BadAddress, BadRegion
from django_throttle.inspection.subjects import UnknownClient
from django_throttle.redaction import plain_text

FORMATS = ("table", "json", "csv")
#: How :func:`one_line_errors` names a client that is not found.
UNKNOWN_CLIENT = (UnknownClient, "Unknown client: {}.")
#: How :func:`one_line_errors` names an ``--ip`` that is no IP address (the client may be
#: fine). A :class:`UnknownClient` too: give it before :data:`UNKNOWN_CLIENT`.
BAD_ADDRESS = (BadAddress, "--ip: {}.")
#: How :func:`one_line_errors` names a ``--region`` that is no region code.
BAD_REGION = (BadRegion, "--region: {}.")
#: First characters that make a spreadsheet read a CSV cell as a formula.
_FORMULA = ("=", "+", "-", "@")


@contextmanager
def one_line_errors(*messages: tuple[type[Exception], str]) -> Iterator[None]:
    """Turn the first of these exceptions that the block raises into a one-line
    ``CommandError``: each is (exception class, message with ``{}`` for the exception's).
    Only ``{}`` is replaced: a message may quote what the operator typed, braces and all."""
    try:
        yield
    except tuple(kind for kind, _message in messages) as exc:
        message = next(text for kind, text in messages if isinstance(exc, kind))
        raise CommandError(message.replace("{}", str(exc))) from exc


def add_format_argument(parser: CommandParser) -> None:
    parser.add_argument(
        "--format",
        default="table",
        choices=FORMATS,
        help="Output as a table, JSON (a list of objects) or CSV with a header row.",
    )


def checked_choice(value: Any, option: str = "--format", choices: Sequence[str] = FORMATS) -> str:
    """``--format`` (or another ``option`` with these ``choices``), checked: ``call_command``
    skips argparse's choices."""
    if value not in choices:
        raise CommandError(f"{option} must be one of {', '.join(choices)}, not {value!r}.")
    return str(value)


def write_rows(
    command: BaseCommand,
    fmt: str,
    rows: Sequence[dict[str, Any]],
    columns: Sequence[tuple[str, str]],
    *,
    title: str = "",
    caption: str | None = None,
    document: dict[str, Any] | None = None,
    figures: Sequence[str] = (),
    width: int = 140,
) -> None:
    """Write ``rows`` (dicts keyed by column key) under ``columns`` (key, heading). JSON is
    the list of rows, or ``document`` with the rows under ``"rows"`` when given. A table
    aligns numbers right, and the columns named in ``figures`` (numbers already written as
    text), unwrapped; it is ``width`` columns wide when not on a terminal."""
    if fmt == "json":
        data: Any = rows if document is None else {**document, "rows": list(rows)}
        command.stdout.write(json.dumps(data, indent=2, default=str))
        return
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([key for key, _heading in columns])
        writer.writerows([csv_cell(row.get(key)) for key, _ in columns] for row in rows)
        command.stdout.write(buffer.getvalue(), ending="")
        return
    table = Table(
        title=Text(plain_text(title)) if title else None,
        min_width=min(len(title), 100),
        caption=None if caption is None else Text(plain_text(caption)),
        caption_justify="left",
    )
    for key, heading in columns:
        if key in figures:
            table.add_column(Text(heading), justify="right", no_wrap=True)
            continue
        numeric = bool(rows) and all(isinstance(row.get(key), int | float) for row in rows)
        table.add_column(Text(heading), justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(Text(plain_text(_cell(row.get(key)))) for key, _ in columns))
    # Rendered to text first: Django's OutputWrapper appends a newline to every write() it
    # is given, and rich may write in pieces. In colour on a terminal, plain text otherwise.
    is_tty = command.stdout.isatty()
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        force_terminal=is_tty,
        no_color=not is_tty,
        width=shutil.get_terminal_size().columns if is_tty else width,
    )
    console.print(table)
    command.stdout.write(buffer.getvalue(), ending="")


def csv_cell(value: object) -> object:
    """A CSV cell: numbers as they are, ``None`` empty, text plain and never a formula."""
    if value is None:
        return ""
    if isinstance(value, bool | int | float):
        return value
    text = plain_text(value)
    return "'" + text if text.startswith(_FORMULA) else text


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


class OneLineErrorParser(CommandParser):
    """A command line argparse refuses (an unknown option, a ``--format`` it does not offer, a
    missing argument) is one line, ``CommandError: …``, exit status 1, as every other error of
    the commands: not argparse's usage text and exit status 2. From ``call_command`` it is
    Django's ``CommandError`` as before."""

    def error(self, message: str) -> NoReturn:
        if self.called_from_command_line:
            self.exit(1, f"CommandError: {message} (see {self.prog} --help).\n")
        raise CommandError(f"Error: {message}")  # as Django's CommandParser, for call_command


class ThrottleCommand(BaseCommand):
    """The base of the package's commands: argparse's refusals are one line
    (:class:`OneLineErrorParser`). A command with subcommands makes them with
    :meth:`add_subcommands` and :meth:`add_subcommand`, which take Django's own options
    (``--skip-checks``, ``--verbosity``, …) after the subcommand's name too."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.__class__ = OneLineErrorParser
        return parser

    def add_subcommands(
        self, parser: CommandParser, **kwargs: Any
    ) -> argparse._SubParsersAction[CommandParser]:
        """The subcommands of ``parser``, whose refusals are one line too."""
        return parser.add_subparsers(parser_class=OneLineErrorParser, **kwargs)

    def add_subcommand(
        self, actions: argparse._SubParsersAction[CommandParser], name: str, **kwargs: Any
    ) -> CommandParser:
        """A subcommand that takes Django's options after its name as the command does
        before it: ``throttle_policy export --skip-checks`` (argparse hands everything after
        ``export`` to the subcommand's parser, which refused them as unrecognized)."""
        sub = actions.add_parser(name, formatter_class=DjangoHelpFormatter, **kwargs)
        self.add_django_arguments(sub)
        return sub

    def add_django_arguments(self, parser: CommandParser) -> None:
        """Django's own options (those :meth:`BaseCommand.create_parser` gives the command),
        on a subcommand's parser. Each defaults to nothing (``SUPPRESS``): a subcommand that
        is not given one leaves the command's value (``throttle_policy -v 2 export``)."""
        quiet: dict[str, Any] = {"default": argparse.SUPPRESS}
        self.add_base_argument(
            parser,
            "--version",
            action="version",
            version=self.get_version(),
            help="Show program's version number and exit.",
        )
        self.add_base_argument(
            parser,
            "-v",
            "--verbosity",
            type=int,
            choices=[0, 1, 2, 3],
            help="Verbosity level; 0=minimal output, 1=normal output, 2=verbose output, "
            "3=very verbose output",
            **quiet,
        )
        self.add_base_argument(
            parser, "--settings", help="The Python path to a settings module.", **quiet
        )
        self.add_base_argument(
            parser, "--pythonpath", help="A directory to add to the Python path.", **quiet
        )
        for option, text in (
            ("--traceback", "Display a full stack trace on CommandError exceptions."),
            ("--no-color", "Don't colorize the command output."),
            ("--force-color", "Force colorization of the command output."),
        ):
            self.add_base_argument(parser, option, action="store_true", help=text, **quiet)
        if self.requires_system_checks:
            parser.add_argument(
                "--skip-checks", action="store_true", help="Skip system checks.", **quiet
            )


class CountersCommand(ThrottleCommand):
    """A command that reads or clears the counters the site's requests made. Run from the
    command line (a process that serves no requests) against a backend counting in this
    process's memory, it refuses with a one-line error instead of showing full buckets or
    "resetting" nothing; called in a process that serves requests (``call_command``), it
    reads that process's counters."""

    from_command_line = False

    def run_from_argv(self, argv: list[str]) -> None:
        self.from_command_line = True
        super().run_from_argv(argv)

    def refuse_in_process_backend(self) -> None:
        """Refuse from the command line when the backend counts in this process's memory
        (``MemoryBackend``): this process serves no requests, so every bucket would look
        full and a reset would clear nothing."""
        backend = get_backend()
        if self.from_command_line and isinstance(backend, MemoryBackend):
            raise CommandError(
                f"The backend is {type(backend).__name__} (DJANGO_THROTTLE_REDIS_URL = "
                "'memory://'), which counts inside each process: this command's process "
                "serves no requests, so it has no counters to read or clear. Point "
                "DJANGO_THROTTLE_REDIS_URL at the server's Redis."
            )
