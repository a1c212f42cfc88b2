"""``manage.py throttle_usage``: who used the API and who was throttled, over a recent window.

One column per outcome (allowed, denied, shadow would-deny, failed open, failed closed); the
total is their sum.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from rich.console import Console
from rich.table import Table

from django_throttle import usage

FORMATS = ("table", "json", "csv")
_DURATION_RE = re.compile(r"^\s*(?P<count>[+-]?\d+)\s*(?P<unit>[a-zA-Z]+)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: Table heading per outcome, in :data:`usage.OUTCOMES` order.
_HEADINGS = ("Allowed", "Denied", "Shadow would-deny", "Failed open", "Failed closed")


def parse_duration(text: str) -> timedelta:
    """Parse ``30s``, ``15m``, ``1h``, ``2d`` or ``1w`` into a positive timedelta."""
    match = _DURATION_RE.match(str(text))
    if match is None or match["unit"].lower() not in _UNITS:
        raise CommandError(
            f"--since {text!r} is not a duration: write a whole number and a unit "
            "(s, m, h, d or w), e.g. 30s, 15m, 1h, 2d or 1w."
        )
    count = int(match["count"])
    if count < 1:
        raise CommandError(f"--since {text!r}: the duration must be at least 1 {match['unit']}.")
    try:
        return timedelta(seconds=count * _UNITS[match["unit"].lower()])
    except OverflowError:
        raise CommandError(f"--since {text!r} is too long.") from None


class Command(BaseCommand):
    help = (
        "Show requests per client, tier or endpoint over a recent window, one column per "
        "outcome (allowed, denied, shadow would-deny, failed open, failed closed), busiest "
        "first (most requests, then most denied)."
    )

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
            choices=usage.REPORT_BY,
            help="Group by client, tier or endpoint (default: client).",
        )
        parser.add_argument(
            "--format",
            default="table",
            choices=FORMATS,
            help="Output as a table, JSON (a list of objects) or CSV with a header row.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # call_command(**options) skips argparse's type and choices checks: validate here.
        since_text = str(options["since"])
        delta = parse_duration(since_text)
        top = self._parse_top(options["top"])
        by = options["by"]
        if by not in usage.REPORT_BY:
            raise CommandError(f"--by must be one of {', '.join(usage.REPORT_BY)}, not {by!r}.")
        fmt = options["format"]
        if fmt not in FORMATS:
            raise CommandError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}.")
        try:
            since = timezone.now() - delta
        except OverflowError:
            raise CommandError(f"--since {since_text!r} is too long.") from None

        usage.flush()
        rows = usage.report(since=since, by=by, top=top)

        if fmt == "json":
            self._write_json(rows, by)
        elif fmt == "csv":
            self._write_csv(rows, by)
        elif not rows:
            self.stdout.write(f"No requests recorded in the last {since_text.strip()}.")
        else:
            self._write_table(rows, by, since_text.strip(), since)

    @staticmethod
    def _parse_top(value: object) -> int:
        try:
            top = int(str(value))
        except ValueError:
            raise CommandError(f"--top must be a whole number, not {value!r}.") from None
        if top < 1:
            raise CommandError(f"--top must be at least 1, not {top}.")
        return top

    def _write_json(self, rows: list[usage.UsageRow], by: str) -> None:
        data = [
            {
                by: row.key,
                **{outcome: getattr(row, outcome) for outcome in usage.OUTCOMES},
                "total": row.total,
                "denied_percent": round(row.denied_percent, 2),
            }
            for row in rows
        ]
        self.stdout.write(json.dumps(data, indent=2))

    def _write_csv(self, rows: list[usage.UsageRow], by: str) -> None:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([by, *usage.OUTCOMES, "total", "denied_percent"])
        for row in rows:
            writer.writerow(
                [
                    row.key,
                    *(getattr(row, outcome) for outcome in usage.OUTCOMES),
                    row.total,
                    f"{row.denied_percent:.2f}",
                ]
            )
        self.stdout.write(buffer.getvalue(), ending="")

    def _write_table(
        self, rows: list[usage.UsageRow], by: str, since_text: str, since: datetime
    ) -> None:
        zone = since.tzname() or "local time"
        title = f"Requests by {by}, last {since_text} (since {since:%Y-%m-%d %H:%M} {zone})"
        # min_width keeps the title on one line above a narrow table.
        table = Table(title=title, min_width=len(title))
        table.add_column(by.capitalize(), overflow="fold")
        for name in (*_HEADINGS, "Total", "Denied %"):
            table.add_column(name, justify="right", no_wrap=True)
        for row in rows:
            table.add_row(
                row.key or "(none)",
                *(f"{getattr(row, outcome):,}" for outcome in usage.OUTCOMES),
                f"{row.total:,}",
                f"{row.denied_percent:.1f}",
            )
        # Render to text first: OutputWrapper appends a newline to every write() it is given,
        # and Console may write in pieces.
        is_tty = self.stdout.isatty()
        buffer = io.StringIO()
        console = Console(
            file=buffer,
            force_terminal=is_tty,
            no_color=not is_tty,
            width=shutil.get_terminal_size().columns if is_tty else 120,
        )
        console.print(table)
        self.stdout.write(buffer.getvalue(), ending="")
