"""Small helpers that create policy rows the way an operator would in the admin, and a
``REDIS_URL`` with a number of key shards (``?shards=N``)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from django.db import connection, connections

from django_throttle.conf import split_shards
from django_throttle.models import EndpointLimit, EndpointRule, Tier, TierLimit

if TYPE_CHECKING:
    from django_throttle.rates import Decision

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


def assert_turns_spaced(
    decide: Callable[[], Decision], clock: Callable[[], float], count: int, interval: float
) -> None:
    """``count`` requests decided at once by ``decide`` get turns exactly ``interval`` apart on
    the server's ``clock``, and each is released at its turn.

    The turn a delaying limit reserved is the server's time of the decision plus the wait it
    answered; each decision is bracketed between two readings of the server's clock, so the
    spacing is checked exactly whatever the machine's load: there must be one origin with
    every turn at origin + k x interval inside its bracket (to the clock's microsecond). A
    release is checked one-sided: never before its turn, and at most one interval late, for a
    sleeping thread woken on a loaded two-core machine (CI saw one 0.1 s late)."""
    start = threading.Barrier(count)

    def turn(_: int) -> tuple[float, float, float]:
        start.wait()
        before = clock()
        decision = decide()
        after = clock()
        assert decision.allowed
        time.sleep(decision.wait)
        return before + decision.wait, after + decision.wait, clock()

    with ThreadPoolExecutor(max_workers=count) as pool:
        turns = sorted(pool.map(turn, range(count)))
    origin_at_least = max(earliest - interval * k for k, (earliest, _, _) in enumerate(turns))
    origin_at_most = min(latest - interval * k for k, (_, latest, _) in enumerate(turns))
    assert origin_at_least <= origin_at_most + 2e-6, turns
    for earliest, latest, released in turns:
        assert earliest - 2e-6 <= released <= latest + interval, (earliest, latest, released)


def push_kept(rounds: int = 100) -> None:
    """Push every usage count this process kept (an outage's), as the pusher thread does
    within a few seconds, and wait for a push of the thread's own still in flight: it may
    have taken a batch (before the backend came back, then kept it again) just as the test
    pushes the rest, so one ``flush_pending()`` can leave a batch out of what the test
    reads next."""
    from django_throttle.usage import accounting as usage

    assert usage.wait_pushed()
    for _ in range(rounds):
        if not usage.pending:
            break
        usage.flush_pending()
    assert not usage.pending, "the kept counts could not be pushed"
    assert usage.wait_pushed()
