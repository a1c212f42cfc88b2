"""``manage.py throttle_explain --user alice --method POST --path /api/export/``: which rule
a request would match, which limits apply at what cost, and what it would get right now,
before anyone sends it (nothing is consumed).

Name the client with one of ``--user``, ``--api-key``, ``--ip`` or ``--client``.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_throttle.backends import BackendError
from django_throttle.inspection import UnknownClient, explain, parse_client
from django_throttle.management.commands.throttle_inspect import COLUMNS, bucket_row
from django_throttle.management.output import add_format_argument, checked_format, write_rows
from django_throttle.models.fields import HTTP_METHODS
from django_throttle.plain import plain_text


class Command(BaseCommand):
    help = "Explain how a request would be limited: rule, limits, cost, and the decision now."

    def add_arguments(self, parser: CommandParser) -> None:
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--user", help="a username (or user id)")
        who.add_argument("--api-key", help="an API key or its prefix")
        who.add_argument("--ip", help="a client IP address")
        who.add_argument("--client", help="user:<name|id>, key:<prefix>, ip:<address>")
        parser.add_argument("--method", default="GET", help="HTTP method (default GET)")
        parser.add_argument("--path", required=True, help="request path, e.g. /api/export/")
        parser.add_argument(
            "--scope", help="the view's DRF throttle_scope, if not found from the path"
        )
        add_format_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        fmt = checked_format(options["format"])
        text = (
            (options.get("user") and f"user:{options['user']}")
            or (options.get("api_key") and f"key:{options['api_key']}")
            or (options.get("ip") and f"ip:{options['ip']}")
            or options.get("client")
        )
        if not text:
            raise CommandError("Name the client with --user, --api-key, --ip or --client.")
        method = str(options["method"]).strip().upper()
        if method not in HTTP_METHODS:
            raise CommandError(
                f"--method {options['method']!r} is not an HTTP method: use one of "
                f"{', '.join(HTTP_METHODS)}."
            )
        options["method"] = method
        try:
            subject = parse_client(text)
            found = explain(subject, options["method"], options["path"], options.get("scope"))
        except UnknownClient as exc:
            raise CommandError(f"Unknown client: {exc}.") from exc
        except BackendError as exc:
            raise CommandError(f"Could not read the buckets from the backend: {exc}") from exc
        rule = found.rule
        decision = found.decision
        if decision is None:
            verdict = "allowed: no limit applies" + (f" ({found.exempt})" if found.exempt else "")
        elif decision.allowed:
            verdict = "allowed"
        else:
            name = decision.limit.name if decision.limit is not None else "a limit"
            verdict = f"denied (429) by {name}; Retry-After {decision.retry_after:.3f} s"
        summary = {
            "client": subject.client,
            "label": subject.label,
            "method": found.method,
            "path": found.path,
            "route": found.route,
            "scope": found.scope,
            "tier": found.tier.slug if found.tier is not None else None,
            "tier_reason": found.reason,
            "rule": rule.name if rule is not None else None,
            "cost": found.cost,
            "next_request": verdict,
        }
        if fmt == "table":
            for key, value in summary.items():
                shown = "-" if value is None else plain_text(value)
                self.stdout.write(f"{key.replace('_', ' ').capitalize():>13}: {shown}")
            self.stdout.write("")
        write_rows(
            self,
            fmt,
            [bucket_row(bucket) for bucket in found.buckets],
            COLUMNS,
            title="Limits that apply",
            caption=None if found.buckets else "No limits apply.",
            document=summary,
        )
