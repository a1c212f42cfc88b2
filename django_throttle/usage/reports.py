"""Usage reports: what ``throttle_usage`` and the dashboard show.

The rollup, and the minute arithmetic both share, live in :mod:`~django_throttle.usage.rollup`.

The backend keeps usage per minute, for
:data:`~django_throttle.backends.usage_base.USAGE_TTL` seconds. The rollup
(:func:`~django_throttle.usage.rollup.rollup`) copies finished minutes into
:class:`~django_throttle.models.UsageCount` rows (``manage.py throttle_usage --rollup``,
from cron or any periodic job, more often than that TTL) and records how far it got (the
watermark). :func:`report` reads the rows for minutes up to the
watermark and the backend for later ones: each minute comes from exactly one place.

Two kinds of rows per minute, both with every outcome column:

- tier x endpoint totals (``client`` is ``"*"``): exact, every request counted;
- per-client rows (``tier`` and ``endpoint`` are ``"*"``): the heaviest clients per outcome,
  at most :data:`~django_throttle.backends.usage_base.TOP_CLIENTS` a minute. Beyond that, a
  new client takes the place of the smallest and inherits its count (Space-Saving): every
  client with a large share is listed and the counts add up to the exact total, but a listed
  count can be too high by what it inherited, and small clients are missing. Exact while
  fewer clients were seen. Allowed requests enter these lists one in
  :data:`~django_throttle.backends.usage_base.CLIENT_SAMPLE`, counted that many times:
  per-client allowed figures are then estimates, and every report says so
  (:attr:`Report.estimated_fields`).

Checks made before authentication (a credential rule's, see
:data:`~django_throttle.usage.accounting.BEFORE_AUTHENTICATION`) are their own series: a tier or
endpoint report lists them in rows of their own (``UsageRow.before_authentication``), so the
tier rows count each request once, under the tier that served it. A presented username is kept
and shown only as :func:`~django_throttle.usage.names.private_labels` allows.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db.models import Sum

from django_throttle.backends import usage_base
from django_throttle.backends.usage_base import UsageStore
from django_throttle.plain import plain_text
from django_throttle.usage import accounting as usage
from django_throttle.usage.names import private_labels
from django_throttle.usage.rollup import (
    add_counts,
    kept_minutes,
    minute_of,
    stored_instant,
    stored_through,
)

REPORT_BY: tuple[str, ...] = ("client", "tier", "endpoint")
#: What every operator view (dashboard, table, CSV, JSON) calls an empty tier (limits given
#: inline to ``@throttle``) and an empty endpoint (no endpoint rule or scope).
NO_TIER = "(no tier)"
NO_ENDPOINT = "(no endpoint rule)"


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Summed counts for one client, tier or endpoint (``key``; ``""`` means none);
    ``total`` is the sum of the outcomes."""

    key: str
    allowed: int
    denied: int
    total: int
    shadow_denied: int = 0
    failed_open: int = 0
    failed_closed: int = 0
    #: Counts of checks made before authentication (tier and endpoint reports only).
    before_authentication: bool = False

    @property
    def denied_percent(self) -> float:
        """Share of requests denied, 0-100 (0 when there were none)."""
        return 100.0 * self.denied / self.total if self.total else 0.0


def label(by: str, row: UsageRow) -> str:
    """The one name every operator view gives a row's key, as plain text: :data:`NO_TIER`
    and :data:`NO_ENDPOINT` for none, :data:`BEFORE_AUTHENTICATION` for the tier of checks
    before authentication (an endpoint row of those keeps its rule's name and says so in
    ``before_authentication``)."""
    key = row.key or (NO_TIER if by == "tier" else NO_ENDPOINT if by == "endpoint" else "")
    if row.before_authentication and by == "tier":
        key = usage.BEFORE_AUTHENTICATION  # no tier had served the request yet
    return plain_text(key)


@dataclass(frozen=True, slots=True)
class Report:
    """Rows busiest first. ``estimated``: a top-client list read from the backend was full,
    so clients beyond it may have been folded into those listed (per-client counts are then
    estimates; totals never are). ``sample``: per-client allowed figures are 1-in-``sample``
    samples, each counted ``sample`` times (1: exact; tier and endpoint reports are always
    exact). ``uncopied_before``: the window reaches minutes that left the backend without a
    rollup copying them (their start, a UTC datetime), else ``None``."""

    rows: list[UsageRow]
    estimated: bool = False
    uncopied_before: datetime | None = None
    sample: int = 1

    @property
    def estimated_fields(self) -> tuple[str, ...]:
        """The row fields that are estimates, not counts: every outcome (and the total and
        denied share) when a top list was full, the allowed figure (and so the total and
        denied share) when allowed requests were sampled, else none."""
        if self.estimated:
            return (*usage.OUTCOMES, "total", "denied_percent")
        if self.sample > 1:
            return (usage.ALLOWED, "total", "denied_percent")
        return ()


def report(since: datetime, by: str, top: int | None, store: UsageStore | None = None) -> Report:
    """Sum each outcome per ``by`` ("client", "tier" or "endpoint") from the minute holding
    ``since`` to now: database rows up to the rollup's watermark, the backend after it.

    Rows come busiest first: by total requests, then by denied requests, then by key. ``top``
    keeps the first ``top`` rows; ``None`` keeps all. Writes nothing. Checks before
    authentication are rows of their own; presented usernames that name no user are shown
    as digests.
    """
    from django_throttle.models import UsageCount

    if by not in REPORT_BY:
        raise ValueError(f"by must be one of {', '.join(REPORT_BY)}, not {by!r}")
    if top is not None and top < 1:
        raise ValueError(f"top must be at least 1, not {top}")
    store = usage.get_store() if store is None else store
    now = store.now_minute()
    first = now - kept_minutes() + 1
    since_minute = minute_of(since)
    split = stored_through(store)
    # (key, before authentication) -> counts per outcome
    sums: dict[tuple[str, bool], list[int]] = {}

    if split is not None and since_minute <= split:
        rows = UsageCount.objects.filter(
            window_start__gte=stored_instant(since_minute * 60),
            window_start__lte=stored_instant(split * 60),
        )
        rows = rows.exclude(client=usage.ALL) if by == "client" else rows.filter(client=usage.ALL)
        names = [f"sum_{o}" for o in usage.OUTCOMES]
        group = (by, "tier") if by == "endpoint" else (by, by)
        grouped = (
            rows.order_by()
            .values(*dict.fromkeys(group))
            .annotate(**{name: Sum(o) for name, o in zip(names, usage.OUTCOMES, strict=True)})
            .values_list(*group, *names)
        )
        for key, tier, *values in grouped.iterator(chunk_size=10_000):
            add_counts(sums, _series(by, key, tier), [int(n or 0) for n in values])

    live_from = max(since_minute, first if split is None else max(first, split + 1))
    live = store.read(range(live_from, now + 1), totals=by != "client", clients=by == "client")
    for counts in live.values():
        if by == "client":
            for client, values in counts.clients.items():
                add_counts(sums, (client, False), values)
        else:
            for field, values in counts.totals.items():
                tier, endpoint = usage.split_field(field)
                add_counts(sums, _series(by, endpoint if by == "endpoint" else tier, tier), values)
    if by == "client":
        sums = _private(sums)

    missing_from = since_minute if split is None else max(since_minute, split + 1)
    denied = usage.OUTCOMES.index(usage.DENIED)
    ranked = [(-sum(values), -values[denied], key, values) for key, values in sums.items()]
    # Only the rows shown are built: a report over 100,000 clients shows 20.
    chosen = sorted(ranked) if top is None else heapq.nsmallest(top, ranked)
    return Report(
        rows=[
            UsageRow(
                key=key,
                total=-total,
                before_authentication=before,
                **dict(zip(usage.OUTCOMES, values, strict=True)),
            )
            for total, _, (key, before), values in chosen
        ],
        estimated=by == "client" and any(counts.full for counts in live.values()),
        uncopied_before=(
            datetime.fromtimestamp(first * 60, tz=UTC) if missing_from < first else None
        ),
        sample=usage_base.CLIENT_SAMPLE if by == "client" else 1,
    )


def _series(by: str, key: str, tier: str) -> tuple[str, bool]:
    """The report key of a tier or endpoint count: checks before authentication apart."""
    if by == "client" or tier != usage.BEFORE_AUTHENTICATION:
        return key, False
    return ("" if by == "tier" else key), True


def _private(sums: dict[tuple[str, bool], list[int]]) -> dict[tuple[str, bool], list[int]]:
    """Client sums with presented usernames that name no user folded into their digests."""
    private = private_labels(key for key, _ in sums)
    if not private:
        return sums
    merged: dict[tuple[str, bool], list[int]] = {}
    for (key, before), values in sums.items():
        add_counts(merged, (private.get(key, key), before), values)
    return merged
