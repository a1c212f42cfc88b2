"""``manage.py throttle_inspect <client>``: a client's tier and why, and the live state of
every counter its requests meet (remaining, reset), read without consuming anything: its
tier's and endpoint rules' limits counted by client, by its IP address and by its username,
and shared ceilings (marked as shared).

With Redis down the tier, its reason and the limits are shown all the same (they need no
Redis), every live counter ``unavailable`` (``null`` in JSON, never a zero), and the command
exits with status 3 after writing them, its one line on stderr saying why.

A client is ``user:<username or id>``, ``key:<prefix>``, ``ip:<address>`` or a bare username,
API key or address (IPv6 addresses are counted by network, as requests are). A user's
username counters are those of its own username; ``--username`` names the one another client
presents at logins, ``--ip`` the address a user's or key's requests come from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_throttle.backends import BackendError
from django_throttle.inspection.clients import Bucket, inspect, region_text
from django_throttle.inspection.subjects import CLIENT_HELP, parse_client
from django_throttle.management import output
from django_throttle.rates import Limit, format_duration, limit_text

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
    ("in_flight", "In flight"),
)
#: A table says the wait the way the admin writes it ("30 min", "1 h 2 min"), and a
#: concurrency limit's slots in words with when each lease ends; JSON and CSV keep
#: ``reset_seconds`` and ``in_flight``, numbers for scripts (JSON lists the leases too).
TABLE_COLUMNS = tuple(
    ("whole_again", "Whole again in")
    if key == "reset_seconds"
    else ("held", "In flight")
    if key == "in_flight"
    else (key, heading)
    for key, heading in COLUMNS
)


def limit_row(limit: Limit) -> dict[str, Any]:
    """The cells every command's rows start with: the limit's name (else its rate), id."""
    return {"limit": limit.name or limit_text(limit.rate, limit.algorithm), "id": limit.id}


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
        "remaining": bucket.remaining,
        "reset_seconds": None if bucket.state is None else round(bucket.state.reset_after, 3),
        "shared": limit.shared,
        "shadow": limit.shadow,
        "in_flight": bucket.in_flight,
        "leases": [
            {"lease": lease, "ends_in_seconds": round(left, 3)} for lease, left in bucket.leases
        ],
    }


def bucket_rows(
    buckets: Sequence[Bucket], fmt: str
) -> tuple[list[dict[str, Any]], tuple[tuple[str, str], ...]]:
    """The buckets' rows and columns in format ``fmt``: see :data:`TABLE_COLUMNS` (a table
    has its "In flight" column only when a concurrency limit is among the buckets)."""
    rows = [bucket_row(bucket) for bucket in buckets]
    if fmt != "table":
        return rows, COLUMNS
    for row, bucket in zip(rows, buckets, strict=True):
        if bucket.state is None:  # unknown, not zero: see Bucket.state
            row["remaining"] = row["whole_again"] = UNAVAILABLE
        else:
            row["whole_again"] = format_duration(row["reset_seconds"])
        row["held"] = held_text(bucket)
    if any(bucket.concurrency for bucket in buckets):
        return rows, TABLE_COLUMNS
    return rows, tuple(column for column in TABLE_COLUMNS if column[0] != "held")


#: What a table shows for a counter the backend could not give.
UNAVAILABLE = "unavailable"
#: The exit status of an answer written without what Redis holds (as ``throttle_usage``'s).
PARTIAL = 3


def held_text(bucket: Bucket) -> str | None:
    """A concurrency limit's slots in words, with each lease held and when it ends
    ("1 of 3 in flight; Ab3dE9xk… ends in 58 s"); ``None`` for another limit."""
    if not bucket.concurrency:
        return None
    if bucket.state is None:
        return UNAVAILABLE
    ends = (f"{lease} ends in {format_duration(left)}" for lease, left in bucket.leases)
    return "; ".join((bucket.in_flight_text, *ends))


def add_probe_arguments(parser: CommandParser) -> None:
    parser.add_argument(
        "--username",
        help="the username the client presents at logins (a user's own by default)",
    )
    parser.add_argument("--ip", help="the address a user's or API key's requests come from")
    parser.add_argument(
        "--region",
        help="the region the client is seen from, e.g. FR (as DJANGO_THROTTLE_REGION_SOURCE "
        "gives it): its regional limits when some limit names it",
    )


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
        with output.one_line_errors(
            output.BAD_ADDRESS, output.UNKNOWN_CLIENT, output.BAD_REGION, READ_ERROR
        ):
            subject = parse_client(options["client"])
            found = inspect(
                subject, options.get("username"), options.get("ip"), options.get("region")
            )
        tier = found.tier.slug if found.tier is not None else None
        rows, columns = bucket_rows(found.buckets, fmt)
        output.write_rows(
            self,
            fmt,
            rows,
            columns,
            figures=("whole_again",),
            title=f"{subject.label} ({subject.client}): tier {tier or 'none'}, {found.reason}; "
            f"region {region_text(found.region, found.regional)}",
            caption=None if found.buckets else "No limits apply to this client.",
            document={
                "client": subject.client,
                "label": subject.label,
                "tier": tier,
                "reason": found.reason,
                "username": found.username,
                "region": found.region,
                "regional_limits": found.regional,
                "unread": found.unread or None,
            },
        )
        if found.unread:
            raise CommandError(
                f"The live counters could not be read from Redis ({found.unread}): the tier "
                "and limits are shown, their state is unavailable.",
                returncode=PARTIAL,
            )
