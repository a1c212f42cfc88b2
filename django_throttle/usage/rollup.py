"""The rollup that copies usage counts from the backend to the database.

The backend keeps usage per minute, for
:data:`~django_throttle.backends.usage_base.USAGE_TTL` seconds. :func:`rollup` copies
finished minutes into :class:`~django_throttle.models.UsageCount` rows (``manage.py
throttle_usage --rollup``, from cron or any periodic job, more often than that TTL; and the
admin's usage list when it is opened, ``admin.usage_counts.roll_up_if_due``) and
records how far it got (the watermark), then copies API keys' last use
(:func:`copy_key_use`) and deletes rows past their retention.

The rollup writes absolute counts: a minute's rows are replaced, never added to, so running
it twice, concurrently, or again after a crash half way never counts twice. Counts pushed late
into a minute already copied (decisions made while Redis was down) mark that minute, and the
next rollup copies it again. A presented username that names no user is stored only as its
digest (:func:`~django_throttle.usage.names.private_labels`).

The minute arithmetic the reports share is here too: which minutes the backend surely still
holds, a minute as the database stores it, and where the database's copy ends (the
watermark, else the newest row's minute), so each minute is read from exactly one place;
and the one way both sum counts per outcome.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import reduce
from typing import Any

from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import Case, F, Max, Q, Value, When
from django.utils import timezone

from django_throttle.backends import usage_base
from django_throttle.backends.usage_base import MinuteCounts, UsageStore
from django_throttle.conf import app_settings
from django_throttle.usage.accounting import ALL, OUTCOMES, get_store, split_field
from django_throttle.usage.names import private_labels

CHUNK_MINUTES = 5
_UNIQUE = ["window_start", "client", "tier", "endpoint"]


def kept_minutes() -> int:
    """Minutes whose counts are surely still in the backend, the current one included."""
    return max(2, usage_base.USAGE_TTL // 60)


def minute_of(value: datetime) -> int:
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return math.floor(value.timestamp() / 60)


def stored_through(store: UsageStore) -> int | None:
    """The last minute the database holds: the watermark, else (the backend lost it, e.g. a
    Redis restart) the newest row's minute."""
    from django_throttle.models import UsageCount

    watermark = store.watermark()
    if watermark is not None:
        return watermark
    last = UsageCount.objects.aggregate(last=Max("window_start"))["last"]
    return None if last is None else minute_of(last)


def add_counts(table: dict[Any, list[int]], key: Any, values: list[int]) -> None:
    row = table.setdefault(key, [0] * len(values))
    for i, n in enumerate(values):
        row[i] += n


@dataclass(frozen=True, slots=True)
class Rollup:
    """What one rollup did: minutes read, rows written, the last minute copied (UTC), and
    API keys whose ``last_used`` moved forward."""

    minutes: int
    rows: int
    through: datetime | None
    keys: int = 0


def rollup(store: UsageStore | None = None, *, deadline: float | None = None) -> Rollup:
    """Copy every finished minute the database lacks from the backend into UsageCount rows,
    then delete rows older than ``DJANGO_THROTTLE_USAGE_RETENTION_DAYS``. Idempotent.

    ``deadline`` (a :func:`time.monotonic` instant) stops the copy after the chunk of
    :data:`CHUNK_MINUTES` minutes that passes it: the watermark says how far it got, so the
    next rollup goes on from there (what a page view may spend is bounded, nothing is lost
    while the backend still holds the minutes)."""
    from django_throttle.models import UsageCount

    store = get_store() if store is None else store
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
                    windows = [stored_instant(m * 60) for m in found]
                    UsageCount.objects.using(alias).filter(window_start__in=windows).delete()
                UsageCount.objects.using(alias).bulk_create(rows, batch_size=500, **upsert)
            written += len(rows)
            done.update(chunk)
            if chunk[-1] >= start:  # minutes ascend: the redone ones are all before start
                store.advance_watermark(chunk[-1])
            if deadline is not None and time.monotonic() >= deadline:
                break
    except BaseException:
        store.return_late(m for m in redo if m not in done)
        raise
    store.return_late(m for m in redo if m not in done)  # left for the next run (deadline)
    cutoff = timezone.now() - timedelta(days=app_settings.USAGE_RETENTION_DAYS)
    UsageCount.objects.using(alias).filter(window_start__lt=cutoff).delete()
    through = max(done) if done else split
    return Rollup(
        minutes=len(done),
        rows=written,
        through=None if through is None else datetime.fromtimestamp(through * 60, tz=UTC),
        keys=copy_key_use(store),
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
            tier, endpoint = split_field(field.replace("\x00", "\ufffd"))
            add_counts(merged, (ALL, tier[:100], endpoint[:100]), values)
        for client, values in counts.clients.items():
            name = private.get(client, client).replace("\x00", "\ufffd")
            add_counts(merged, (name[:200], ALL, ALL), values)
        window = stored_instant(minute * 60)
        for (client, tier, endpoint), values in merged.items():
            yield {
                "window_start": window,
                "client": client,
                "tier": tier,
                "endpoint": endpoint,
                **dict(zip(OUTCOMES, values, strict=True)),
            }
