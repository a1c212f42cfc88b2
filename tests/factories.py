"""Small helpers that create policy rows the way an operator would in the admin."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

from django_throttle.models import EndpointLimit, EndpointRule, Tier, TierLimit


def tier(slug: str, *rates: str, burst: int | None = None, **flags: object) -> Tier:
    row = Tier.objects.create(slug=slug, name=slug.title(), **flags)
    for rate in rates:
        TierLimit.objects.create(tier=row, rate=rate, burst=burst)
    return row


def endpoint(
    name: str,
    match_type: str,
    pattern: str,
    *,
    cost: int = 1,
    methods: str = "",
    shadow: bool = False,
    limits: dict[Tier, str] | None = None,
) -> EndpointRule:
    rule = EndpointRule.objects.create(
        name=name, match_type=match_type, pattern=pattern, cost=cost, methods=methods, shadow=shadow
    )
    for owner, rate in (limits or {}).items():
        EndpointLimit.objects.create(rule=rule, tier=owner, rate=rate)
    return rule


@contextmanager
def check_constraints_off() -> Iterator[None]:
    """Write rows as a database that predates migration 0002 could hold them."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA ignore_check_constraints = ON")
            try:
                yield
            finally:
                cursor.execute("PRAGMA ignore_check_constraints = OFF")
            return
        # Fire the deferred foreign-key checks now: PostgreSQL refuses ALTER TABLE while
        # trigger events are pending.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for table, name in (
            ("django_throttle_tierlimit", "django_throttle_tier_limit_burst_range"),
            ("django_throttle_endpointlimit", "django_throttle_endpoint_limit_burst_range"),
            ("django_throttle_endpointrule", "django_throttle_endpoint_rule_cost_range"),
        ):
            # Inside the test's transaction: rolled back with it.
            cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {name}")
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        yield
