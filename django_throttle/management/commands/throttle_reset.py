"""``manage.py throttle_reset <client> [--limit ID ...]``: clear a client's counters, so it
starts afresh: every counter its requests meet (its tier's and endpoint rules' limits, by
client, by its IP address and by its username: a locked-out login included), or only the
limits named. Shared ceilings are every client's, never reset with one client:
``throttle_reset --ceiling ID`` refills one in every key shard.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_throttle.backends import BackendError
from django_throttle.inspection.resets import reset_ceilings, reset_counters
from django_throttle.inspection.subjects import UnknownClient, parse_client
from django_throttle.management.commands.throttle_inspect import add_probe_arguments
from django_throttle.management.output import (
    CountersCommand,
    add_format_argument,
    checked_format,
    write_rows,
)


class Command(CountersCommand):
    help = (
        "Clear one client's counters (all of them, or those given with --limit), or with "
        "--ceiling a shared ceiling for every client."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "client", nargs="?", help="user:<name|id>, key:<prefix>, ip:<address>, or bare"
        )
        parser.add_argument(
            "--limit",
            action="append",
            dest="limits",
            metavar="ID",
            help="only this limit (its id, as throttle_inspect shows it); repeatable",
        )
        parser.add_argument(
            "--ceiling",
            action="append",
            dest="ceilings",
            metavar="ID",
            help="refill this shared limit for every client (no client given); repeatable",
        )
        add_probe_arguments(parser)
        add_format_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        fmt = checked_format(options["format"])
        ceilings = options.get("ceilings")
        if ceilings and options.get("client"):
            raise CommandError(
                "--ceiling resets a shared limit for every client: give no client with it."
            )
        if not ceilings and not options.get("client"):
            raise CommandError("Name the client to reset (or a shared limit with --ceiling).")
        self.refuse_in_process_backend()
        if ceilings:
            self._reset_ceilings(fmt, ceilings)
            return
        try:
            subject = parse_client(options["client"])
            found = reset_counters(
                subject, options.get("limits"), options.get("username"), options.get("ip")
            )
        except UnknownClient as exc:
            raise CommandError(f"Unknown client: {exc}.") from exc
        except ValueError as exc:
            raise CommandError(f"{exc}.") from exc
        except BackendError as exc:
            raise CommandError(f"Could not reset the buckets: {exc}") from exc
        rows = [
            {
                "limit": counter.limit.name or str(counter.limit.rate),
                "id": counter.limit.id,
                "counted_by": counter.counted_by,
                "counter": counter.client,
            }
            for counter in found
        ]
        write_rows(
            self,
            fmt,
            rows,
            (("limit", "Limit"), ("id", "Id"), ("counted_by", "Counted by")),
            title=f"Reset {len(rows)} bucket(s) of {subject.label} ({subject.client})",
            caption=None if rows else "No limits apply to this client: nothing to reset.",
            document={"client": subject.client, "label": subject.label, "reset": len(rows)},
        )

    def _reset_ceilings(self, fmt: str, ceilings: list[str]) -> None:
        try:
            limits = reset_ceilings(ceilings)
        except ValueError as exc:
            raise CommandError(f"{exc}.") from exc
        except BackendError as exc:
            raise CommandError(f"Could not reset the shared limits: {exc}") from exc
        rows = [{"limit": limit.name or str(limit.rate), "id": limit.id} for limit in limits]
        write_rows(
            self,
            fmt,
            rows,
            (("limit", "Limit"), ("id", "Id")),
            title=f"Reset {len(rows)} shared limit(s) in every key shard",
            document={"ceilings": len(rows)},
        )
