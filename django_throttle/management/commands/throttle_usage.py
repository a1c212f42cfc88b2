"""``manage.py throttle_usage``: who used the API and who was throttled, over a recent window;
``--rollup`` copies finished minutes from the backend to the database (the admin's usage list
runs the same rollup when opened; run it from cron too to keep every minute when nobody does).

One column per outcome (allowed, denied, shadow would-deny, failed open, failed closed); the
total is their sum. Tier and endpoint totals are exact; per-client rows are the heaviest
clients of each minute (see :mod:`django_throttle.usage.reports`), estimates when a minute's
list was full: every output marks the figures that are estimates (``≈`` in the table,
``estimated`` in JSON and CSV). Checks before authentication are rows
of their own. Every cell is plain text (:mod:`django_throttle.management.output`).

With Redis down the report is the database's minutes (those a rollup copied), every count
marked a lower bound (``≥`` in the table, ``unread_from`` in JSON and CSV: the first minute
not read), and the command exits with status :data:`PARTIAL` after writing it, its one line
on stderr saying what could not be read: a script that checks the status never takes a
lower bound for the count, and one that wants the partial figures has them on stdout (an
empty JSON list could not say that it is partial).
"""

from __future__ import annotations

import re
from contextlib import closing
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError
from django.utils import timezone

from django_throttle.backends import BackendError, usage_store
from django_throttle.management import output
from django_throttle.rates import InvalidRate, format_duration, parse_period
from django_throttle.usage import accounting as usage
from django_throttle.usage.names import client_names
from django_throttle.usage.reports import REPORT_BY, Report, label, report, rollup

#: Table heading per outcome, in :data:`usage.OUTCOMES` order.
_HEADINGS = ("Allowed", "Denied", "Shadow would-deny", "Failed open", "Failed closed")
_ESTIMATED = (
    "Per-client counts may be estimates: in some minutes a top-client list was full, so "
    "smaller clients may have been folded into those listed or left out. Tier and endpoint "
    "totals are exact."
)
_READ_ERROR = (BackendError, "Could not read usage from the backend: {}")
#: The exit status of a report written without the minutes Redis holds (1 is a command that
#: wrote nothing: a bad option, a backend keeping no usage counts).
PARTIAL = 3


def since_start(text: str) -> datetime:
    """The start of ``--since``'s window: a period as rates write it (``30s``, ``15m``, ``1h``,
    ``2d``, ``1w``; any case, ASCII only: a full-width digit is refused, not read as
    its ASCII twin), parsed by :func:`~django_throttle.rates.parse_period`. A negative one is
    refused as such (``--since=-1h``; :meth:`Command.run_from_argv` reads ``--since -1h``
    so too)."""
    period = text.strip()
    if not period.isascii():
        raise CommandError(
            f"--since {text!r} is not a duration: write it in ASCII digits and letters, "
            "e.g. 30s, 15m, 1h, 2d or 1w."
        )
    if period.startswith("-"):
        raise CommandError(
            f"--since {text!r} is negative: give how far back to look, e.g. --since 1h."
        )
    with output.one_line_errors(
        (InvalidRate, f"--since {text!r} is not a duration: {{}}."),
        (OverflowError, f"--since {text!r} is too long."),
    ):
        seconds = parse_period(period.lower(), quoted=period)
        return timezone.now() - timedelta(seconds=seconds)


#: A value after ``--since`` that argparse takes for an option: a negative duration.
_NEGATIVE = re.compile(r"^-\d")


class Command(output.ThrottleCommand):
    help = (
        "Show requests per client, tier or endpoint over a recent window, one column per "
        "outcome (allowed, denied, shadow would-deny, failed open, failed closed), busiest "
        "first (most requests, then most denied); by tier or endpoint also how many of the "
        "allowed were delayed (waited for their turn) and their mean wait in seconds, and how "
        "many of the denied were shed (503, to protect the service). Tier "
        "and endpoint totals are exact; "
        f"per-client rows list the {usage_store.TOP_CLIENTS} heaviest clients of each minute: "
        "with more clients than that, smaller ones are folded into those listed or left out. "
        "With "
        "--rollup, copy finished minutes from Redis to the database instead (and API keys' "
        "last use; the admin's usage list does the same when opened): schedule it more often "
        f"than Redis keeps them ({format_duration(usage_store.USAGE_TTL)})."
    )

    def run_from_argv(self, argv: list[str]) -> None:
        """``--since -1h`` met argparse's "expected one argument" (it reads ``-1h`` as an
        option) under the usage text: it is read as ``--since=-1h``, refused in one line."""
        argv = list(argv)
        for at in range(len(argv) - 2, 0, -1):
            if argv[at] == "--since" and _NEGATIVE.match(argv[at + 1]):
                argv[at : at + 2] = [f"--since={argv[at + 1]}"]
        super().run_from_argv(argv)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--since",
            default="1h",
            help="How far back to look: 30s, 15m, 1h, 2d, 1w (default: 1h).",
        )
        parser.add_argument(
            "--top", default=20, help="Show at most this many rows (default: 20, at least 1)."
        )
        parser.add_argument(
            "--by",
            default="client",
            choices=REPORT_BY,
            help="Group by client, tier or endpoint (default: client).",
        )
        output.add_format_argument(parser)
        parser.add_argument(
            "--rollup",
            action="store_true",
            help="Copy every finished minute the database lacks from the backend to the "
            "database (idempotent; safe to run concurrently), delete rows older than "
            "DJANGO_THROTTLE_USAGE_RETENTION_DAYS, print one line, and show no report.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options.get("rollup"):
            self._rollup()
            return
        # call_command(**options) skips argparse's type and choices checks: validate here.
        since_text = str(options["since"])
        since = since_start(since_text)
        top = _parse_top(options["top"])
        by = output.checked_choice(options["by"], "--by", REPORT_BY)
        fmt = output.checked_choice(options["format"])
        with (
            output.one_line_errors((usage.UsageUnavailable, "{}"), _READ_ERROR),
            closing(usage.get_store()) as store,
        ):
            result = report(since=since, by=by, top=top, store=store)
        records = _records(result, by)
        since_text = since_text.strip()
        if fmt == "table" and not records and result.unread_from is not None:
            self.stdout.write(f"No requests in the database's minutes of the last {since_text}.")
        elif fmt == "table" and not records:
            self.stdout.write(f"No requests recorded in the last {since_text}.")
        elif fmt == "table":
            zone = since.tzname() or "local time"
            title = f"Requests by {by}, last {since_text} (since {since:%Y-%m-%d %H:%M} {zone})"
            self._write_table(result, records, by, title)
        else:
            first = "name" if by == "client" else "before_authentication"
            columns = [by, first, *usage.OUTCOMES, "total", "denied_percent"]
            columns += [] if by == "client" else [usage.DELAYED, "mean_wait_s", usage.SHED]
            columns += ["estimated", "unread_from"]
            if fmt == "csv":
                records = [
                    {**row, "denied_percent": f"{row['denied_percent']:.2f}"}
                    | {"estimated": " ".join(row["estimated"])}
                    for row in records
                ]
            output.write_rows(self, fmt, records, [(key, key) for key in columns])
        if result.uncopied_before is not None:
            self.stderr.write(
                f"Note: counts from before {result.uncopied_before:%Y-%m-%d %H:%M} UTC are "
                "missing unless a rollup copied them: Redis keeps them "
                f"{format_duration(usage_store.USAGE_TTL)}. Schedule 'manage.py throttle_usage "
                "--rollup' more often than that."
            )
        if result.estimated and fmt != "table":
            self.stderr.write(_ESTIMATED)
        if result.unread_from is not None:
            raise CommandError(_unread(result), returncode=PARTIAL)

    def _rollup(self) -> None:
        with (
            output.one_line_errors(
                (usage.UsageUnavailable, "{}"),
                _READ_ERROR,
                (DatabaseError, "Could not write usage rows: {}"),
            ),
            closing(usage.get_store()) as store,
        ):
            done = rollup(store)
        through = "nothing yet" if done.through is None else f"{done.through:%Y-%m-%d %H:%M} UTC"
        self.stdout.write(
            f"Rolled up {done.minutes} minute(s), {done.busy} with requests, into {done.rows} "
            "row(s); the database holds "
            f"usage through {through}. API keys with a newer last use: {done.keys}."
        )

    def _write_table(
        self, result: Report, records: list[dict[str, Any]], by: str, title: str
    ) -> None:
        notes = [_ESTIMATED] if result.estimated else []
        if result.unread_from is not None:
            notes.append("≥: at least; the minutes Redis holds could not be read (see below).")
        figures: tuple[str, ...] = (*usage.OUTCOMES, "total", "denied_percent")
        delays = by != "client" and any(record[usage.DELAYED] for record in records)
        if delays:  # only where a delaying limit served some request late
            figures += (usage.DELAYED, "mean_wait_s")
        shedding = by != "client" and any(record[usage.SHED] for record in records)
        if shedding:  # only where the load shedder refused some request
            figures += (usage.SHED,)
        rows = []
        for record in records:
            key = record[by]
            if by == "client" and record["name"]:
                key = f"{record['name']} ({key})"
            elif by == "endpoint" and record["before_authentication"]:
                key = f"{key} {usage.BEFORE_AUTHENTICATION}"
            cells = {field: f"{record[field]:,}" for field in figures}
            cells["denied_percent"] = f"{record['denied_percent']:.1f}"
            if result.unread_from is not None:  # lower bounds: the share is of what was read
                cells |= {f: f"≥{cells[f]}" for f in (*usage.OUTCOMES, "total")}
            if delays:
                cells["mean_wait_s"] = f"{record['mean_wait_s']:.2f}"
            rows.append(
                {by: key}
                | {name: "≈" * (name in record["estimated"]) + cells[name] for name in cells}
            )
        headings: tuple[str, ...] = (by.capitalize(), *_HEADINGS, "Total", "Denied %")
        headings += ("Delayed", "Mean wait (s)") if delays else ()
        headings += ("Shed (503)",) if shedding else ()
        columns = list(zip((by, *figures), headings, strict=True))
        caption = " ".join(notes) or None
        output.write_rows(
            self,
            "table",
            rows,
            columns,
            title=title,
            caption=caption,
            figures=figures,
            width=120 + 30 * delays + 15 * shedding,  # room for the columns they add
        )


def _unread(result: Report) -> str:
    """The one line saying which minutes are missing from ``result``, and why."""
    assert result.unread_from is not None
    return (
        f"Minutes from {result.unread_from:%Y-%m-%d %H:%M} UTC on could not be read from "
        f"Redis ({result.unread}): the counts shown are the database's, lower bounds."
    )


def _parse_top(value: object) -> int:
    with output.one_line_errors((ValueError, f"--top must be a whole number, not {value!r}.")):
        top = int(str(value))
    if top < 1:
        raise CommandError(f"--top must be at least 1, not {top}.")
    return top


def _records(result: Report, by: str) -> list[dict[str, Any]]:
    """One dict per row, the same in JSON, CSV and the table: the key under its one
    label (:func:`~django_throttle.usage.reports.label`), for clients also the user or
    API key it names, and the fields that are estimates."""
    names = client_names(row.key for row in result.rows) if by == "client" else {}
    records = []
    for row in result.rows:
        if by == "client":
            record: dict[str, Any] = {"client": names[row.key].label, "name": names[row.key].name}
        else:
            record = {by: label(by, row), "before_authentication": row.before_authentication}
        record.update({outcome: getattr(row, outcome) for outcome in usage.OUTCOMES})
        record.update(total=row.total, denied_percent=round(row.denied_percent, 2))
        if by != "client":
            record.update(delayed=row.delayed, mean_wait_s=round(row.mean_wait, 3), shed=row.shed)
        unread = None if result.unread_from is None else result.unread_from.isoformat()
        records.append(
            {**record, "estimated": list(result.estimated_fields), "unread_from": unread}
        )
    return records
