"""The minutes of usage, shared by the rollup and the reports: which minutes the backend
surely still holds, a minute as the database stores it, and where the database's copy ends
(the rollup's watermark, else the newest row's minute), so each minute is read from exactly
one place. Also the one way both sum counts per outcome.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db.models import Max
from django.utils import timezone

from django_throttle.backends import usage_base
from django_throttle.backends.usage_base import UsageStore

__all__: list[str] = []


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


def _add(table: dict[Any, list[int]], key: Any, values: list[int]) -> None:
    row = table.get(key)
    if row is None:
        table[key] = list(values)
    else:
        for i, n in enumerate(values):
            row[i] += n
