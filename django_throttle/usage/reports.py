"""Usage reports, and the rollup that copies usage counts from the backend to the database.

The backend keeps usage per minute, for
:data:`~django_throttle.backends.usage_base.USAGE_TTL` seconds. :func:`rollup` copies
finished minutes into :class:`~django_throttle.models.UsageCount` rows (``manage.py
throttle_usage --rollup``, from cron or any periodic job, more often than that TTL) and
records how far it got (the watermark). :func:`report` reads the rows for minutes up to the
watermark and the backend for later ones: each minute comes from exactly one place.

The rollup writes absolute counts: a minute's rows are replaced, never added to, so running
it twice, concurrently, or again after a crash half way never counts twice. Counts pushed late
into a minute already copied (decisions made while Redis was down) mark that minute, and the
next rollup copies it again.

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
import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import reduce
from typing import Any

from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import Case, F, Max, Q, Sum, Value, When
from django.utils import timezone

from django_throttle.backends import usage_base
from django_throttle.backends.usage_base import MinuteCounts, UsageStore
from django_throttle.conf import app_settings
from django_throttle.plain import plain_text
from django_throttle.usage.accounting import (
    ALL,
    ALLOWED,
    BEFORE_AUTHENTICATION,
    DENIED,
    OUTCOMES,
    get_store,
    split_field,
)
from django_throttle.usage.names import private_labels

__all__ = [
    "NO_ENDPOINT",
    "NO_TIER",
    "REPORT_BY",
    "Report",
    "Rollup",
    "UsageRow",
    "copy_key_use",
    "label",
    "report",
    "rollup",
]

REPORT_BY: tuple[str, ...] = ("client", "tier", "endpoint")
#: What every operator view (dashboard, table, CSV, JSON) calls an empty tier (limits given
#: inline to ``@throttle``) and an empty endpoint (no endpoint rule or scope).
NO_TIER = "(no tier)"
NO_ENDPOINT = "(no endpoint rule)"
#: Minutes copied per database transaction (and per watermark step).
CHUNK_MINUTES = 5
_UNIQUE = ["window_start", "client", "tier", "endpoint"]


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
        key = BEFORE_AUTHENTICATION  # no tier had served the request yet
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
            return (*OUTCOMES, "total", "denied_percent")
        if self.sample > 1:
            return (ALLOWED, "total", "denied_percent")
        return ()


@dataclass(frozen=True, slots=True)
class Rollup:
    """What one rollup did: minutes read, rows written, the last minute copied (UTC), and
    API keys whose ``last_used`` moved forward."""

    minutes: int
    rows: int
    through: datetime | None
    keys: int = 0


def _kept_minutes() -> int:
    """Minutes whose counts are surely still in the backend, the current one included."""
    return max(2, usage_base.USAGE_TTL // 60)


def _window_start(minute: int) -> datetime:
    """The datetime of a minute as the database expects it (aware UTC under USE_TZ)."""
    value = datetime.fromtimestamp(minute * 60, tz=UTC)
    return value if settings.USE_TZ else timezone.make_naive(value)


def _minute(value: datetime) -> int:
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return math.floor(value.timestamp() / 60)


def _last_row_minute() -> int | None:
    from django_throttle.models import UsageCount

    last = UsageCount.objects.aggregate(last=Max("window_start"))["last"]
    return None if last is None else _minute(last)


def _split(store: UsageStore) -> int | None:
    """The last minute the database holds: the watermark, else (the backend lost it, e.g. a
    Redis restart) the newest row's minute."""
    watermark = store.watermark()
    return watermark if watermark is not None else _last_row_minute()


def rollup(store: UsageStore | None = None) -> Rollup:
    """Copy every finished minute the database lacks from the backend into UsageCount rows,
    then delete rows older than ``DJANGO_THROTTLE_USAGE_RETENTION_DAYS``. Idempotent."""
    from django_throttle.models import UsageCount

    store = get_store() if store is None else store
    now = store.now_minute()
    first = now - _kept_minutes() + 1
    split = _split(store)
    start = first if split is None else max(first, split + 1)
    late = store.take_late()
    redo = sorted(m for m in late if first <= m < start)
    minutes = [*redo, *range(start, now)]
    alias = router.db_for_write(UsageCount)
    features = connections[alias].features
    upsert: dict[str, Any] = {}
    if features.supports_update_conflicts:
        upsert = {"update_conflicts": True, "update_fields": list(OUTCOMES)}
        if features.supports_update_conflicts_with_target:
            upsert["unique_fields"] = _UNIQUE
    written = 0
    done: set[int] = set()
    try:
        for at in range(0, len(minutes), CHUNK_MINUTES):
            chunk = minutes[at : at + CHUNK_MINUTES]
            found = store.read(chunk)
            rows = [UsageCount(**row) for row in _rows(found)]
            with transaction.atomic(using=alias):
                if found:
                    windows = [_window_start(m) for m in found]
                    UsageCount.objects.using(alias).filter(window_start__in=windows).delete()
                UsageCount.objects.using(alias).bulk_create(rows, batch_size=500, **upsert)
            written += len(rows)
            done.update(chunk)
            fresh = [m for m in chunk if m >= start]
            if fresh:
                store.advance_watermark(max(fresh))
    except BaseException:
        store.return_late(m for m in redo if m not in done)
        raise
    _prune(alias)
    keys = copy_key_use(store)
    through = max(minutes) if minutes else split
    return Rollup(
        minutes=len(minutes),
        rows=written,
        through=None if through is None else datetime.fromtimestamp(through * 60, tz=UTC),
        keys=keys,
    )


#: API keys per UPDATE statement (each costs three query parameters).
KEY_UPDATE_BATCH = 300


def copy_key_use(store: UsageStore) -> int:
    """Copy the backend's last-use times of API keys into ``ApiKey.last_used``, where they
    are later than the column (the backend forgets them: see ``lua/usage.lua``). One UPDATE
    per :data:`KEY_UPDATE_BATCH` keys, so one per run for most sites; returns the rows
    updated."""
    from django_throttle.models import ApiKey

    # Only labels that can be a stored prefix: a client label is anything a custom resolver
    # returned ("key:a\x00b"), and PostgreSQL refuses NUL in a query parameter.
    longest = ApiKey._meta.get_field("prefix").max_length or 0
    seen = sorted(
        (prefix, second)
        for prefix, second in store.keys_last_used().items()
        if "\x00" not in prefix and len(prefix) <= longest
    )
    alias = router.db_for_write(ApiKey)
    updated = 0
    for at in range(0, len(seen), KEY_UPDATE_BATCH):
        when = {prefix: _instant(second) for prefix, second in seen[at : at + KEY_UPDATE_BATCH]}
        later = [
            Q(prefix=prefix) & (Q(last_used__isnull=True) | Q(last_used__lt=value))
            for prefix, value in when.items()
        ]
        updated += (
            ApiKey.objects.using(alias)
            .filter(reduce(operator.or_, later))
            .update(
                last_used=Case(
                    *(When(prefix=prefix, then=Value(value)) for prefix, value in when.items()),
                    default=F("last_used"),
                )
            )
        )
    return updated


def _instant(second: int) -> datetime:
    """A Unix second as the database expects it (aware UTC under USE_TZ)."""
    value = datetime.fromtimestamp(second, tz=UTC)
    return value if settings.USE_TZ else timezone.make_naive(value)


def _rows(found: dict[int, MinuteCounts]) -> Iterable[dict[str, Any]]:
    """UsageCount field values for each minute's totals and clients, cut to the columns
    (names that collide after the cut add up). A NUL byte, which PostgreSQL refuses in text,
    becomes U+FFFD: one odd name must not stop every rollup. A presented username that names
    no user is stored only as its digest (:func:`private_labels`)."""
    private = private_labels(client for counts in found.values() for client in counts.clients)
    for minute, counts in found.items():
        merged: dict[tuple[str, str, str], list[int]] = {}
        for field, values in counts.totals.items():
            tier, endpoint = split_field(_storable(field))
            _add(merged, (ALL, tier[:100], endpoint[:100]), values)
        for client, values in counts.clients.items():
            _add(merged, (_storable(private.get(client, client))[:200], ALL, ALL), values)
        window = _window_start(minute)
        for (client, tier, endpoint), values in merged.items():
            yield {
                "window_start": window,
                "client": client,
                "tier": tier,
                "endpoint": endpoint,
                **dict(zip(OUTCOMES, values, strict=True)),
            }


def _storable(name: str) -> str:
    return name.replace("\x00", "\ufffd") if "\x00" in name else name


def _add(table: dict[Any, list[int]], key: Any, values: list[int]) -> None:
    row = table.get(key)
    if row is None:
        table[key] = list(values)
    else:
        for i, n in enumerate(values):
            row[i] += n


def _prune(alias: str) -> None:
    from django_throttle.models import UsageCount

    cutoff = timezone.now() - timedelta(days=app_settings.USAGE_RETENTION_DAYS)
    UsageCount.objects.using(alias).filter(window_start__lt=cutoff).delete()


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
    store = get_store() if store is None else store
    now = store.now_minute()
    first = now - _kept_minutes() + 1
    since_minute = _minute(since)
    split = _split(store)
    # (key, before authentication) -> counts per outcome
    sums: dict[tuple[str, bool], list[int]] = {}

    if split is not None and since_minute <= split:
        rows = UsageCount.objects.filter(
            window_start__gte=_window_start(since_minute), window_start__lte=_window_start(split)
        )
        rows = rows.exclude(client=ALL) if by == "client" else rows.filter(client=ALL)
        names = [f"sum_{o}" for o in OUTCOMES]
        group = (by, "tier") if by == "endpoint" else (by, by)
        grouped = (
            rows.order_by()
            .values(*dict.fromkeys(group))
            .annotate(**{name: Sum(o) for name, o in zip(names, OUTCOMES, strict=True)})
            .values_list(*group, *names)
        )
        for key, tier, *values in grouped.iterator(chunk_size=10_000):
            _add(sums, _series(by, key, tier), [int(n or 0) for n in values])

    live_from = max(since_minute, first if split is None else max(first, split + 1))
    live = store.read(range(live_from, now + 1), totals=by != "client", clients=by == "client")
    for counts in live.values():
        if by == "client":
            for client, values in counts.clients.items():
                _add(sums, (client, False), values)
        else:
            for field, values in counts.totals.items():
                tier, endpoint = split_field(field)
                _add(sums, _series(by, endpoint if by == "endpoint" else tier, tier), values)
    if by == "client":
        sums = _private(sums)

    missing_from = since_minute if split is None else max(since_minute, split + 1)
    denied = OUTCOMES.index(DENIED)
    ranked = [(-sum(values), -values[denied], key, values) for key, values in sums.items()]
    # Only the rows shown are built: a report over 100,000 clients shows 20.
    chosen = sorted(ranked) if top is None else heapq.nsmallest(top, ranked)
    return Report(
        rows=[
            UsageRow(
                key=key,
                total=-total,
                before_authentication=before,
                **dict(zip(OUTCOMES, values, strict=True)),
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
    if by == "client" or tier != BEFORE_AUTHENTICATION:
        return key, False
    return ("" if by == "tier" else key), True


def _private(sums: dict[tuple[str, bool], list[int]]) -> dict[tuple[str, bool], list[int]]:
    """Client sums with presented usernames that name no user folded into their digests."""
    private = private_labels(key for key, _ in sums)
    if not private:
        return sums
    merged: dict[tuple[str, bool], list[int]] = {}
    for (key, before), values in sums.items():
        _add(merged, (private.get(key, key), before), values)
    return merged
