"""``manage.py throttle_reset <client> [--limit ID ...]``: clear a client's buckets, so it
starts afresh (every limit of its tier and endpoint rules, or only those named).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_throttle.backends import BackendError
from django_throttle.inspection import UnknownClient, parse_client, reset
from django_throttle.management.output import add_format_argument, checked_format, write_rows


class Command(BaseCommand):
    help = "Clear one client's buckets (all of them, or those given with --limit)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("client", help="user:<name|id>, key:<prefix>, ip:<address>, or bare")
        parser.add_argument(
            "--limit",
            action="append",
            dest="limits",
            metavar="ID",
            help="only this limit (its id, as throttle_inspect shows it); repeatable",
        )
        add_format_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        fmt = checked_format(options["format"])
        try:
            subject = parse_client(options["client"])
            limits = reset(subject, options.get("limits"))
        except UnknownClient as exc:
            raise CommandError(f"Unknown client: {exc}.") from exc
        except ValueError as exc:
            raise CommandError(f"{exc}.") from exc
        except BackendError as exc:
            raise CommandError(f"Could not reset the buckets: {exc}") from exc
        rows = [{"limit": limit.name or str(limit.rate), "id": limit.id} for limit in limits]
        write_rows(
            self,
            fmt,
            rows,
            (("limit", "Limit"), ("id", "Id")),
            title=f"Reset {len(rows)} bucket(s) of {subject.label} ({subject.client})",
            caption=None if rows else "No limits apply to this client: nothing to reset.",
            document={"client": subject.client, "label": subject.label, "reset": len(rows)},
        )
