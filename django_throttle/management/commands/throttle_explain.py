"""``manage.py throttle_explain --user alice --method POST --path /api/export/``: which checks
a request would meet (a login's credential check, the view's throttle), which rule each
matches, every counter at what cost (by client, by IP address, by username), and the decision
and ``Retry-After`` the server would give it right now, before anyone sends it (nothing is
consumed).

With Redis down the checks, rule, tier, cost and limits are shown all the same (they need
no Redis), every live counter ``unavailable`` (``null`` in JSON, never a zero), and as the
next request's fate the failure mode it meets (the rule's, else the tier's, else
``DJANGO_THROTTLE_FAILURE_MODE``); the command exits with status 3 after writing them, its
one line on stderr saying why.

Name the client with one of ``--user``, ``--api-key``, ``--ip`` or ``--client``; ``--ip``
with another says where its request comes from, ``--username`` what it presents at a login.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_throttle.inspection.clients import (
    Explanation,
    checked_address,
    explain,
    region_text,
)
from django_throttle.inspection.subjects import CLIENT_HELP, parse_client
from django_throttle.management import output
from django_throttle.management.commands.throttle_inspect import PARTIAL, READ_ERROR, bucket_rows
from django_throttle.models.fields import HTTP_METHODS
from django_throttle.redaction import plain_text
from django_throttle.request.core import retry_after_seconds, throttled_status


def verdict(found: Explanation) -> str:
    """The next request's fate in words, as the server would answer it."""
    decision = found.decision
    if found.unread:  # what the server does now: the request meets its failure mode
        return found.failure_verdict
    if decision is None:
        return "allowed: no limit applies" + (f" ({found.exempt})" if found.exempt else "")
    if decision.allowed and decision.wait:
        return f"allowed after waiting {decision.wait:.3f} s for its turn (a delaying limit)"
    if decision.allowed:
        return "allowed"
    name = decision.limit.name if decision.limit is not None else "a limit"
    # 503 when the service sheds the request (or cannot decide), as the server answers it.
    status = throttled_status(decision)
    return (
        f"denied ({status}) by {name}; Retry-After: {retry_after_seconds(decision.retry_after)} "
        f"({decision.retry_after:.3f} s)"
    )


class Command(output.CountersCommand):
    help = (
        "Explain how a request would be limited: the checks it meets, rule, every counter, "
        "cost, and the decision and Retry-After the server would give now."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        # The client as throttle_inspect and throttle_reset take it (or one of the options).
        parser.add_argument(
            "label", nargs="?", metavar="client", help=CLIENT_HELP + " (as --client)"
        )
        parser.add_argument("--user", help="a username (or user id)")
        parser.add_argument("--api-key", help="an API key or its prefix")
        parser.add_argument(
            "--ip",
            help="a client IP address; with --user, --api-key or --client, the address the "
            "request comes from",
        )
        parser.add_argument("--client", help=CLIENT_HELP)
        parser.add_argument(
            "--username",
            help="the username the request presents (a login's form field or Basic user; "
            "a user's own by default)",
        )
        parser.add_argument(
            "--region",
            help="the region the request comes from, e.g. FR (as DJANGO_THROTTLE_REGION_SOURCE "
            "gives it): its regional limits when some limit names it",
        )
        parser.add_argument("--method", default="GET", help="HTTP method (default GET)")
        parser.add_argument("--path", required=True, help="request path, e.g. /api/export/")
        parser.add_argument(
            "--scope", help="the view's DRF throttle_scope, if not found from the path"
        )
        output.add_format_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        fmt = output.checked_choice(options["format"])
        named = [
            prefix + str(options[option])
            for option, prefix in (
                ("label", ""),
                ("user", "user:"),
                ("api_key", "key:"),
                ("client", ""),
            )
            if options.get(option)
        ]
        address = options.get("ip") or None
        if len(named) > 1:
            raise CommandError(
                "Name the client once: as the first argument, or with one of --user, "
                "--api-key or --client."
            )
        if not named and address is None:
            raise CommandError(
                "Name the client: as the first argument (e.g. ip:203.0.113.9 or user:alice), "
                "or with --user, --api-key, --ip or --client."
            )
        text = named[0] if named else f"ip:{address}"
        method = str(options["method"]).strip().upper()
        if method not in HTTP_METHODS:
            raise CommandError(
                f"--method {options['method']!r} is not an HTTP method: use one of "
                f"{', '.join(HTTP_METHODS)}."
            )
        self.refuse_in_process_backend()
        with output.one_line_errors(
            output.BAD_ADDRESS, output.UNKNOWN_CLIENT, output.BAD_REGION, READ_ERROR
        ):
            checked_address(address)  # "--ip: …", even when it names the client
            subject = parse_client(text)
            found = explain(
                subject,
                method,
                options["path"],
                options.get("scope"),
                address=address if named else None,
                username=options.get("username"),
                region=options.get("region"),
            )
        decision = found.decision
        summary = {
            "client": subject.client,
            "label": subject.label,
            "method": found.method,
            "path": found.path,
            "route": found.route,
            "scope": found.scope,
            "tier": found.tier.slug if found.tier is not None else None,
            "tier_reason": found.reason,
            "region": region_text(found.region, found.regional),
            "checks": list(found.checks),
            "rule": found.rule.name if found.rule is not None else None,
            "cost": found.cost,
            "next_request": verdict(found),
            "denied_by": found.denied_by or None,
            "retry_after": (
                retry_after_seconds(decision.retry_after)
                if decision is not None and not decision.allowed
                else None
            ),
            "in_flight": list(found.in_flight),
            "notes": list(found.notes),
            "unread": found.unread or None,
            "failure_mode": found.failure_mode if found.unread else None,
        }
        if fmt == "table":
            for key, value in summary.items():
                hidden = (
                    "denied_by",
                    "retry_after",
                    "in_flight",
                    "notes",
                    "unread",
                    "failure_mode",
                )
                if key in hidden and not value:
                    continue
                if key == "in_flight":  # one concurrency limit a line
                    for i, line in enumerate(found.in_flight):
                        self.stdout.write(
                            f"{'In flight:' if i == 0 else '':>14} {plain_text(line)}"
                        )
                    continue
                if isinstance(value, list):
                    value = ("; " if key == "notes" else ", ").join(value) or None
                shown = "-" if value is None else plain_text(value)
                self.stdout.write(f"{key.replace('_', ' ').capitalize():>13}: {shown}")
            self.stdout.write("")
        rows, columns = bucket_rows(found.buckets, fmt)
        output.write_rows(
            self,
            fmt,
            rows,
            columns,
            figures=("whole_again",),
            title="Counters the request meets",
            caption=None if found.buckets else "No limits apply.",
            document=summary,
        )
        if found.unread:
            raise CommandError(
                f"The live counters could not be read from Redis ({found.unread}): the checks, "
                "rule and limits are shown, their state is unavailable.",
                returncode=PARTIAL,
            )
