"""``manage.py throttle_inspect <client>``: a client's tier and why, and the live state of
each of its buckets (remaining, reset), read without consuming anything.

A client is ``user:<username or id>``, ``key:<prefix>``, ``ip:<address>`` or a bare username,
API key or address (IPv6 addresses are counted by network, as requests are).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_throttle.backends import BackendError
from django_throttle.inspection import Bucket, UnknownClient, inspect, parse_client
from django_throttle.management.output import add_format_argument, checked_format, write_rows

COLUMNS = (
    ("limit", "Limit"),
    ("id", "Id"),
    ("from", "From"),
    ("algorithm", "Algorithm"),
    ("capacity", "Capacity"),
    ("remaining", "Remaining"),
    ("reset_seconds", "Whole again in (s)"),
    ("shadow", "Shadow"),
)


def bucket_row(bucket: Bucket) -> dict[str, Any]:
    limit = bucket.limit
    return {
        "limit": limit.name or str(limit.rate),
        "id": limit.id,
        "from": bucket.where,
        "algorithm": str(limit.algorithm),
        "capacity": limit.capacity,
        "remaining": bucket.state.remaining,
        "reset_seconds": round(bucket.state.reset_after, 3),
        "shadow": limit.shadow,
    }


class Command(BaseCommand):
    help = "Show a client's tier (and why) and the live state of each of its buckets."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("client", help="user:<name|id>, key:<prefix>, ip:<address>, or bare")
        add_format_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        fmt = checked_format(options["format"])
        try:
            subject = parse_client(options["client"])
            found = inspect(subject)
        except UnknownClient as exc:
            raise CommandError(f"Unknown client: {exc}.") from exc
        except BackendError as exc:
            raise CommandError(f"Could not read the buckets from the backend: {exc}") from exc
        rows = [bucket_row(bucket) for bucket in found.buckets]
        tier = found.tier.slug if found.tier is not None else None
        write_rows(
            self,
            fmt,
            rows,
            COLUMNS,
            title=f"{subject.label} ({subject.client}): tier {tier or 'none'}, {found.reason}",
            caption=None if rows else "No limits apply to this client.",
            document={
                "client": subject.client,
                "label": subject.label,
                "tier": tier,
                "reason": found.reason,
            },
        )
