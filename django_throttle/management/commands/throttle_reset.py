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
from django_throttle.inspection.clients import reset_ceilings, reset_counters
from django_throttle.inspection.subjects import CLIENT_HELP, parse_client
from django_throttle.management import output
from django_throttle.management.commands.throttle_inspect import add_probe_arguments, limit_row

#: A limit id that is not the client's, or not a shared limit: the message says which.
WRONG_LIMIT = (ValueError, "{}.")


class Command(output.CountersCommand):
    help = (
        "Clear one client's counters (all of them, or those given with --limit), or with "
        "--ceiling a shared ceiling for every client."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("client", nargs="?", help=CLIENT_HELP)
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
        output.add_format_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        fmt = output.checked_choice(options["format"])
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
        with output.one_line_errors(
            output.BAD_ADDRESS,  # before UNKNOWN_CLIENT and WRONG_LIMIT: it is both
            output.UNKNOWN_CLIENT,
            output.BAD_REGION,  # before WRONG_LIMIT: a ValueError too
            WRONG_LIMIT,
            (BackendError, "Could not reset the buckets in Redis: {}"),
        ):
            subject = parse_client(options["client"])
            found = reset_counters(
                subject,
                options.get("limits"),
                options.get("username"),
                options.get("ip"),
                options.get("region"),
            )
        rows = [
            {
                **limit_row(counter.limit),
                "counted_by": counter.counted_by,
                "counter": counter.client,
                "cleared": held,
            }
            for counter, held in found
        ]
        cleared = sum(held for _counter, held in found)
        if fmt == "table":
            for row in rows:
                row["cleared"] = "cleared" if row["cleared"] else "held nothing"
        output.write_rows(
            self,
            fmt,
            rows,
            (
                ("limit", "Limit"),
                ("id", "Id"),
                ("counted_by", "Counted by"),
                ("cleared", "Cleared"),
            ),
            title=reset_summary(f"{subject.label} ({subject.client})", cleared, len(rows)),
            caption=None if rows else "No limits apply to this client: nothing to reset.",
            document={
                "client": subject.client,
                "label": subject.label,
                "reset": cleared,
                "counters": len(rows),
            },
        )

    def _reset_ceilings(self, fmt: str, ceilings: list[str]) -> None:
        with output.one_line_errors(
            WRONG_LIMIT, (BackendError, "Could not reset the shared limits in Redis: {}")
        ):
            limits = reset_ceilings(ceilings)
        rows = [{**limit_row(limit), "shards_cleared": held} for limit, held in limits]
        cleared = sum(1 for _limit, held in limits if held)
        if cleared:
            title = f"Reset {cleared} shared limit(s) in every key shard"
        else:
            title = "Nothing to reset: no key shard held state of these shared limits"
        output.write_rows(
            self,
            fmt,
            rows,
            (("limit", "Limit"), ("id", "Id"), ("shards_cleared", "Key shards cleared")),
            title=title,
            document={"ceilings": cleared},
        )


def reset_summary(client: str, cleared: int, counters: int) -> str:
    """What a reset of ``client`` did, in words: how many of its ``counters`` held state and
    were cleared (a whole bucket holds none: its reset changes nothing)."""
    if not counters:
        return f"Nothing to reset for {client}: no limits apply to it"
    if not cleared:
        return f"Nothing to reset for {client}: none of its {counters} counter(s) held anything"
    whole = counters - cleared
    return f"Cleared {cleared} counter(s) of {client}" + (
        f"; {whole} held nothing" if whole else ""
    )
