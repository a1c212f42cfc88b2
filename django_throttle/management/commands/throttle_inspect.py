"""``manage.py throttle_inspect <client>``: a client's tier and why, and the live state of
every counter its requests meet (remaining, reset), read without consuming anything: its
tier's and endpoint rules' limits counted by client, by its IP address and by its username,
and shared ceilings (marked as shared).

A client is ``user:<username or id>``, ``key:<prefix>``, ``ip:<address>`` or a bare username,
API key or address (IPv6 addresses are counted by network, as requests are). A user's
username counters are those of its own username; ``--username`` names the one another client
presents at logins, ``--ip`` the address a user's or key's requests come from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandParser

from django_throttle.backends import BackendError
from django_throttle.durations import format_duration
from django_throttle.inspection.clients import Bucket, inspect
from django_throttle.inspection.subjects import CLIENT_HELP, parse_client
from django_throttle.management import output
from django_throttle.rates import Limit, rate_text

#: The message of a backend error while counters are read.
READ_ERROR = (BackendError, "Could not read the buckets from the backend: {}")

COLUMNS = (
    ("limit", "Limit"),
    ("id", "Id"),
    ("from", "From"),
    ("counted_by", "Counted by"),
    ("algorithm", "Algorithm"),
    ("capacity", "Capacity"),
    ("remaining", "Remaining"),
    ("reset_seconds", "Whole again in (s)"),
    ("shared", "Shared"),
    ("shadow", "Shadow"),
)
#: A table says the wait the way the admin writes it ("30 min", "1 h 2 min"); JSON and CSV
#: keep ``reset_seconds``, a number for scripts.
TABLE_COLUMNS = tuple(
    ("whole_again", "Whole again in") if key == "reset_seconds" else (key, heading)
    for key, heading in COLUMNS
)


def limit_row(limit: Limit) -> dict[str, Any]:
    """The cells every command's rows start with: the limit's name (else its rate), id."""
    return {"limit": limit.name or rate_text(limit.rate), "id": limit.id}


def bucket_row(bucket: Bucket) -> dict[str, Any]:
    """A bucket as a row (``counter``, the backend's key, is in JSON only)."""
    limit = bucket.limit
    return {
        **limit_row(limit),
        "from": bucket.where,
        "counted_by": bucket.counted_by,
        "counter": bucket.client,
        "algorithm": str(limit.algorithm),
        "capacity": bucket.capacity,
        "remaining": bucket.state.remaining,
        "reset_seconds": round(bucket.state.reset_after, 3),
        "shared": limit.shared,
        "shadow": limit.shadow,
    }


def bucket_rows(
    buckets: Sequence[Bucket], fmt: str
) -> tuple[list[dict[str, Any]], tuple[tuple[str, str], ...]]:
    """The buckets' rows and columns in format ``fmt``: see :data:`TABLE_COLUMNS`."""
    rows = [bucket_row(bucket) for bucket in buckets]
    if fmt != "table":
        return rows, COLUMNS
    for row in rows:
        row["whole_again"] = format_duration(row["reset_seconds"])
    return rows, TABLE_COLUMNS


def add_probe_arguments(parser: CommandParser) -> None:
    parser.add_argument(
        "--username",
        help="the username the client presents at logins (a user's own by default)",
    )
    parser.add_argument("--ip", help="the address a user's or API key's requests come from")


class Command(output.CountersCommand):
    help = (
        "Show a client's tier (and why) and the live state of every counter its requests "
        "meet: by client, by IP address, by username, and shared ceilings."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("client", help=CLIENT_HELP)
        add_probe_arguments(parser)
        output.add_format_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        fmt = output.checked_choice(options["format"])
        self.refuse_in_process_backend()
        with output.one_line_errors(output.UNKNOWN_CLIENT, READ_ERROR):
            subject = parse_client(options["client"])
            found = inspect(subject, options.get("username"), options.get("ip"))
        tier = found.tier.slug if found.tier is not None else None
        rows, columns = bucket_rows(found.buckets, fmt)
        output.write_rows(
            self,
            fmt,
            rows,
            columns,
            figures=("whole_again",),
            title=f"{subject.label} ({subject.client}): tier {tier or 'none'}, {found.reason}",
            caption=None if found.buckets else "No limits apply to this client.",
            document={
                "client": subject.client,
                "label": subject.label,
                "tier": tier,
                "reason": found.reason,
                "username": found.username,
            },
        )
