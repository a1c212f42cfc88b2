"""Usage reports and their rollup: what ``throttle_usage`` and the dashboard show, and the
copy of the backend's counts into the database.

The backend keeps usage per minute, for
:data:`~django_throttle.backends.usage_store.USAGE_TTL` seconds. :func:`rollup` copies
finished minutes into :class:`~django_throttle.models.UsageCount` rows (``manage.py
throttle_usage --rollup``, from cron or any periodic job, more often than that TTL; and the
admin's usage list when it is opened, ``admin.usage_counts.roll_up_if_due``) and
records how far it got (the watermark), then copies API keys' last use
(:func:`copy_key_use`) and deletes rows past their retention. :func:`report` reads the rows
for minutes up to the watermark and the backend for later ones: each minute comes from
exactly one place (the minute arithmetic both share: :func:`kept_minutes`,
:func:`stored_through`, :func:`add_counts`).

The rollup writes absolute counts: a minute's rows are replaced, never added to, so running
it twice, concurrently, or again after a crash half way never counts twice. Counts pushed late
into a minute already copied (decisions made while Redis was down) mark that minute, and the
next rollup copies it again.

Two kinds of rows per minute, both with every outcome column:

- tier x endpoint totals (``client`` is ``"*"``): exact, every request counted;
- per-client rows (``tier`` and ``endpoint`` are ``"*"``): the heaviest clients per outcome,
  at most :data:`~django_throttle.backends.usage_store.TOP_CLIENTS` a minute. Beyond that, a
  new client takes the place of the smallest and inherits its count (Space-Saving), and a push
  with more clients than a list holds sends only its heaviest (see
  :meth:`~django_throttle.backends.usage_store.RedisUsage.push`): every client with a large
  share is listed, but a listed count can be too high by what it inherited or low by what a
  push left out, small clients are missing, and the rows no longer add up to the total.
  Exact while fewer clients were seen; a report read from a full list says so
  (:attr:`Report.estimated_fields`).

Checks made before authentication (a credential rule's, see
:data:`~django_throttle.usage.accounting.BEFORE_AUTHENTICATION`) are their own series: a tier or
endpoint report lists them in rows of their own (``UsageRow.before_authentication``), so the
tier rows count each request once, under the tier that served it. A presented username that
names no user is stored and shown only as its digest
(:func:`~django_throttle.usage.names.private_labels`).
"""

from __future__ import annotations

import heapq
import math
import operator
import time
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import reduce
from typing import Any

from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import Case, Count, F, Max, Q, Sum, Value, When
from django.utils import timezone

from django_throttle.backends import BackendError, usage_store
from django_throttle.backends.usage_store import MinuteCounts, UsageStore
from django_throttle.conf import app_settings
from django_throttle.redaction import plain_text
from django_throttle.usage import accounting as usage
from django_throttle.usage.names import private_labels

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
    #: Of the allowed, those served after waiting their turn, and their waits summed in
    #: milliseconds (tier and endpoint reports only: clients have no such counts).
    delayed: int = 0
    waited_ms: int = 0
    #: Of the denied, those the load shedder refused (503); tier and endpoint reports only.
    shed: int = 0
    #: Counts of checks made before authentication (tier and endpoint reports only).
    before_authentication: bool = False

    @property
    def denied_percent(self) -> float:
        """Share of requests denied, 0-100 (0 when there were none)."""
        return 100.0 * self.denied / self.total if self.total else 0.0

    @property
    def mean_wait(self) -> float:
        """Seconds a delayed request waited for its turn on average (0 when none waited)."""
        return self.waited_ms / 1000 / self.delayed if self.delayed else 0.0


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
    so clients beyond it may have been folded into those listed or left out (per-client
    counts are then estimates; totals never are). ``uncopied_before``: the window reaches
    minutes that left the backend without a rollup copying them (their start, a UTC
    datetime), else ``None``. ``unread_from``: the backend could not be read (``unread``
    says why), so the minutes from this instant (UTC) on are missing and every count is a
    lower bound; ``None`` when every minute was read."""

    rows: list[UsageRow]
    estimated: bool = False
    uncopied_before: datetime | None = None
    unread_from: datetime | None = None
    unread: str = ""

    @property
    def estimated_fields(self) -> tuple[str, ...]:
        """The row fields that are estimates, not counts: every outcome (and the total and
        denied share) when a top list was full, else none."""
        if self.estimated:
            return (*usage.OUTCOMES, "total", "denied_percent")
        return ()


def report(since: datetime, by: str, top: int | None, store: UsageStore | None = None) -> Report:
    """Sum each outcome per ``by`` ("client", "tier" or "endpoint") from the minute holding
    ``since`` to now: database rows up to the rollup's watermark, the backend after it.

    Rows come busiest first: by total requests, then by denied requests, then by key. ``top``
    keeps the first ``top`` rows; ``None`` keeps all. Writes nothing. Checks before
    authentication are rows of their own; presented usernames that name no user are shown
    as digests.

    A backend that does not answer is not an empty report: the rows the database holds
    are summed (up to its newest minute when the backend cannot give the watermark) and
    :attr:`Report.unread_from` says from when the counts are missing. A backend that does
    not answer its first (short) call is not read again.
    """
    from django_throttle.models import UsageCount

    if by not in REPORT_BY:
        raise ValueError(f"by must be one of {', '.join(REPORT_BY)}, not {by!r}")
    if top is not None and top < 1:
        raise ValueError(f"top must be at least 1, not {top}")
    if store is None:  # the configured backend's, with the client it reads on closed after
        with closing(usage.get_store()) as own:
            return report(since, by, top, own)
    unread = ""
    try:
        now = store.now_minute()
        split = stored_through(store)
    except BackendError as exc:
        now, split, unread = math.floor(time.time() / 60), newest_stored(), _why(exc)
    first = now - kept_minutes() + 1
    since_minute = minute_of(since)
    # (key, before authentication) -> counts per outcome
    sums: dict[tuple[str, bool], list[int]] = {}
    copied_full = False

    if split is not None and since_minute <= split:
        rows = UsageCount.objects.filter(
            window_start__gte=stored_instant(since_minute * 60),
            window_start__lte=stored_instant(split * 60),
        )
        rows = rows.exclude(client=usage.ALL) if by == "client" else rows.filter(client=usage.ALL)
        if by == "client":
            copied_full = _full_minutes(rows, store.top_size)
        names = [f"sum_{o}" for o in usage.COLUMNS]
        group = (by, "tier") if by == "endpoint" else (by, by)
        grouped = (
            rows.order_by()
            .values(*dict.fromkeys(group))
            .annotate(**{name: Sum(o) for name, o in zip(names, usage.COLUMNS, strict=True)})
            .values_list(*group, *names)
        )
        for key, tier, *values in grouped.iterator(chunk_size=10_000):
            add_counts(sums, _series(by, key, tier), [int(n or 0) for n in values])

    live_from = max(since_minute, first if split is None else max(first, split + 1))
    live: dict[int, MinuteCounts] = {}
    if not unread:
        try:
            live = store.read(
                range(live_from, now + 1), totals=by != "client", clients=by == "client"
            )
        except BackendError as exc:
            unread = _why(exc)
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
    denied, outcomes = usage.OUTCOMES.index(usage.DENIED), len(usage.OUTCOMES)
    ranked = [
        (-sum(values[:outcomes]), -values[denied], key, values) for key, values in sums.items()
    ]
    # Only the rows shown are built: a report over 100,000 clients shows 20.
    chosen = sorted(ranked) if top is None else heapq.nsmallest(top, ranked)
    return Report(
        rows=[
            UsageRow(
                key=key,
                total=-total,
                before_authentication=before,
                **dict(zip(usage.COLUMNS, values, strict=True)),
            )
            for total, _, (key, before), values in chosen
        ],
        estimated=by == "client" and (copied_full or any(counts.full for counts in live.values())),
        uncopied_before=(
            datetime.fromtimestamp(first * 60, tz=UTC) if missing_from < first else None
        ),
        unread_from=datetime.fromtimestamp(live_from * 60, tz=UTC) if unread else None,
        unread=unread,
    )


def _why(exc: BackendError) -> str:
    """Why the backend could not be read, in one line of plain text."""
    return plain_text(str(exc))  # a BackendError says the error it stands for


def estimated_minutes(starts: Iterable[datetime], store: UsageStore | None = None) -> bool:
    """Whether the per-client rows copied for any of the minutes beginning at ``starts``
    (``UsageCount.window_start``) may be estimates (:func:`_full_minutes`: every client row
    of those minutes looked at, whatever a list shows of them). ``store`` gives the top
    lists' size (default: the configured backend's)."""
    from django_throttle.models import UsageCount

    starts = set(starts)
    if not starts:
        return False
    if store is None:
        with closing(usage.get_store()) as own:
            return estimated_minutes(starts, own)
    rows = UsageCount.objects.exclude(client=usage.ALL).filter(window_start__in=starts)
    return _full_minutes(rows, store.top_size)


def _full_minutes(client_rows: Any, top_size: int) -> bool:
    """Whether a minute among the per-client ``client_rows`` (rolled-up rows) may come
    from a full top list: as many clients with one outcome as a list holds. The rollup keeps
    no mark of it, so a list full in the backend (:attr:`MinuteCounts.full`) is recognised by
    its size; with several key shards a minute is marked when one shard's list could have
    been full (an estimate said of exact counts, never exact counts said of an estimate)."""
    per_minute = (
        client_rows.order_by()
        .values("window_start")
        .annotate(**{f"n_{o}": Count("pk", filter=Q(**{f"{o}__gt": 0})) for o in usage.OUTCOMES})
    )
    full = reduce(operator.or_, (Q(**{f"n_{o}__gte": top_size}) for o in usage.OUTCOMES))
    return bool(per_minute.filter(full).exists())


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


# The rollup, and the minute arithmetic the reports share.

CHUNK_MINUTES = 5
_UNIQUE = ["window_start", "client", "tier", "endpoint"]


def kept_minutes() -> int:
    """Minutes whose counts are surely still in the backend, the current one included."""
    return max(2, usage_store.USAGE_TTL // 60)


def minute_of(value: datetime) -> int:
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return math.floor(value.timestamp() / 60)


def stored_through(store: UsageStore) -> int | None:
    """The last minute the database holds: the watermark, else (the backend lost it, e.g. a
    Redis restart) the newest row's minute."""
    watermark = store.watermark()
    if watermark is not None:
        return watermark
    return newest_stored()


def newest_stored() -> int | None:
    """The newest minute of any row in the database (what it holds when the backend cannot
    say how far the rollup got)."""
    from django_throttle.models import UsageCount

    last = UsageCount.objects.aggregate(last=Max("window_start"))["last"]
    return None if last is None else minute_of(last)


def add_counts(table: dict[Any, list[int]], key: Any, values: list[int]) -> None:
    row = table.setdefault(key, [0] * len(values))
    for i, n in enumerate(values):
        row[i] += n


@dataclass(frozen=True, slots=True)
class Rollup:
    """What one rollup did: minutes read, rows written, the last minute copied (UTC), API
    keys whose ``last_used`` moved forward, and how many of the minutes read had requests
    (a rollup reads every minute the backend keeps, most of them empty on a quiet site)."""

    minutes: int
    rows: int
    through: datetime | None
    keys: int = 0
    busy: int = 0
    #: Minutes the backend holds that were not copied: the deadline passed first.
    left: int = 0


def rollup(
    store: UsageStore | None = None,
    *,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Rollup:
    """Copy every finished minute the database lacks from the backend into UsageCount rows,
    then delete rows older than ``DJANGO_THROTTLE_USAGE_RETENTION_DAYS``. Idempotent.

    ``deadline`` (an instant of ``clock``, :func:`time.monotonic` by default) is checked
    before each chunk of :data:`CHUNK_MINUTES` minutes and before the API keys' last use
    is copied: once it has passed, the copy starts no more reads (``left`` says how many
    minutes wait). The watermark says how far it got, so the next rollup goes on from there:
    what a page view may spend is bounded (by the deadline and the chunk in flight, with a
    Redis that answers each read slowly too), nothing is lost while the backend still holds
    the minutes."""
    from django_throttle.models import UsageCount

    if store is None:  # the configured backend's, with the client it reads on closed after
        with closing(usage.get_store()) as own:
            return rollup(own, deadline=deadline, clock=clock)
    now = store.now_minute()
    first = now - kept_minutes() + 1
    split = stored_through(store)
    start = first if split is None else max(first, split + 1)
    late = store.take_late()
    redo = sorted(m for m in late if first <= m < start)
    minutes = [*redo, *range(start, now)]
    alias = router.db_for_write(UsageCount)
    features = connections[alias].features
    upsert: dict[str, Any] = {}
    if features.supports_update_conflicts:
        upsert = {"update_conflicts": True, "update_fields": list(usage.COLUMNS)}
        if features.supports_update_conflicts_with_target:
            upsert["unique_fields"] = _UNIQUE
    written = busy = 0
    done: set[int] = set()
    try:
        for at in range(0, len(minutes), CHUNK_MINUTES):
            if deadline is not None and clock() >= deadline:
                break
            chunk = minutes[at : at + CHUNK_MINUTES]
            found = store.read(chunk)
            rows = [UsageCount(**row) for row in _rows(found)]
            with transaction.atomic(using=alias):
                if found:
                    windows = [stored_instant(m * 60) for m in found]
                    UsageCount.objects.using(alias).filter(window_start__in=windows).delete()
                UsageCount.objects.using(alias).bulk_create(rows, batch_size=500, **upsert)
            written += len(rows)
            busy += len(found)
            done.update(chunk)
            if chunk[-1] >= start:  # minutes ascend: the redone ones are all before start
                store.advance_watermark(chunk[-1])
    except BaseException:
        store.return_late(m for m in redo if m not in done)
        raise
    store.return_late(m for m in redo if m not in done)  # left for the next run (deadline)
    try:
        cutoff = timezone.now() - timedelta(days=app_settings.USAGE_RETENTION_DAYS)
    except OverflowError:  # further back than the calendar goes: no row is that old
        pass
    else:
        UsageCount.objects.using(alias).filter(window_start__lt=cutoff).delete()
    through = max(done) if done else split
    late_for_keys = deadline is not None and clock() >= deadline  # copied by the next run
    return Rollup(
        minutes=len(done),
        rows=written,
        through=None if through is None else datetime.fromtimestamp(through * 60, tz=UTC),
        keys=0 if late_for_keys else copy_key_use(store),
        busy=busy,
        left=len(minutes) - len(done),
    )


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
        when = {
            prefix: stored_instant(second) for prefix, second in seen[at : at + KEY_UPDATE_BATCH]
        }
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


def stored_instant(second: int) -> datetime:
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
            tier, endpoint = usage.split_field(field.replace("\x00", "\ufffd"))
            add_counts(merged, (usage.ALL, tier[:100], endpoint[:100]), values)
        for client, values in counts.clients.items():
            name = private.get(client, client).replace("\x00", "\ufffd")
            add_counts(merged, (name[:200], usage.ALL, usage.ALL), values)
        window = stored_instant(minute * 60)
        for (client, tier, endpoint), values in merged.items():
            yield {
                "window_start": window,
                "client": client,
                "tier": tier,
                "endpoint": endpoint,
                **dict(zip(usage.COLUMNS, values, strict=True)),
            }
