"""Small helpers that create policy rows the way an operator would in the admin, and a
``REDIS_URL`` with a number of key shards (``?shards=N``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from django.db import connection, connections

from django_throttle.conf import split_shards
from django_throttle.models import EndpointLimit, EndpointRule, Tier, TierLimit

P = ParamSpec("P")
T = TypeVar("T")


def with_shards(url: str | None, shards: int) -> str:
    """``url`` (unset: ``cache://default``) asking for ``shards`` key shards, any
    ``shards`` it asked for before replaced."""
    base = split_shards(url or "cache://default")[0]
    return f"{base}{'&' if '?' in base else '?'}shards={shards}"


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


def own_connections(work: Callable[P, T]) -> Callable[P, T]:
    """``work`` for a thread of its own: the database connections the thread opened (a
    request's policy load) are closed when it is done, as a server closes them after each
    request. The test client leaves them open, and PostgreSQL refuses to drop the test
    database while any is."""

    @functools.wraps(work)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return work(*args, **kwargs)
        finally:
            connections.close_all()

    return run
