"""Usage counters: allowed and denied requests per minute, client, tier and endpoint.

:func:`record` is on the request path, so it does no I/O: it bumps a counter in a process-local
buffer under a lock. :func:`flush` moves the buffer into :class:`~django_throttle.models.UsageCount`
rows in batches, from a daemon thread every ``DJANGO_THROTTLE_USAGE_FLUSH_INTERVAL`` seconds, at
interpreter exit, and from ``manage.py throttle_usage``. :func:`report` sums the rows for that
command.

Counts are best effort: a process killed hard loses at most one flush interval of counts, and a
buffer holding more than :data:`MAX_KEYS` distinct keys folds new clients into :data:`OTHER`.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connections, router, transaction
from django.db.models import F, Sum
from django.utils import timezone

from django_throttle.conf import app_settings

if TYPE_CHECKING:
    from django_throttle.models import UsageCount

__all__ = ["MAX_KEYS", "OTHER", "UsageRow", "flush", "record", "report", "reset"]

logger = logging.getLogger("django_throttle.usage")

#: Most distinct (minute, client, tier, endpoint) keys one process buffers between flushes.
MAX_KEYS = 50_000
#: Client name that absorbs new clients once the buffer is full.
OTHER = "(other)"
#: Keys written per transaction: bounds how long one flush holds row locks.
CHUNK_SIZE = 500
#: Seconds between deletions of rows older than ``USAGE_RETENTION_DAYS`` (per process).
PRUNE_INTERVAL = 3600.0

ReportBy = Literal["client", "tier", "endpoint"]
REPORT_BY: tuple[str, ...] = ("client", "tier", "endpoint")

# (minute since the epoch, client, tier, endpoint) -> [allowed, denied]
_Key = tuple[int, str, str, str]
_Buffer = dict[_Key, list[int]]

_lock = threading.Lock()
_buffer: _Buffer = {}
_folded = 0  # requests counted under OTHER since the last flush
_started_pid: int | None = None  # process whose flusher (or decision not to start one) is current
_stop: threading.Event | None = None
_last_prune: float | None = None
_hooks_installed = False


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Summed counts for one client, tier or endpoint (``key``; ``""`` means none)."""

    key: str
    allowed: int
    denied: int
    total: int

    @property
    def denied_percent(self) -> float:
        """Share of requests denied, 0-100 (0 when there were none)."""
        return 100.0 * self.denied / self.total if self.total else 0.0


def record(client: str, tier: str, endpoint: str, allowed: bool) -> None:
    """Count one request as allowed or denied. Thread safe; no I/O, no allocation beyond the key.

    ``client`` is the identity as text (``"user:42"``, ``"ip:203.0.113.7"``), ``tier`` the tier
    slug and ``endpoint`` the endpoint rule name, ``""`` for none. A no-op when
    ``DJANGO_THROTTLE_USAGE_ENABLED`` is false.
    """
    global _folded
    if not app_settings.USAGE_ENABLED:
        return
    if _started_pid is None:  # first use in this process (the at-fork hook resets it)
        _start()
    key = (int(time.time()) // 60, client, tier, endpoint)
    with _lock:
        counts = _buffer.get(key)
        if counts is None:
            if len(_buffer) >= MAX_KEYS:
                # A flood of distinct clients must not grow memory without bound; tiers and
                # endpoints come from the admin, so at most one OTHER key per pair per minute.
                key = (key[0], OTHER, tier, endpoint)
                _folded += 1
                counts = _buffer.get(key)
            if counts is None:
                counts = _buffer[key] = [0, 0]
        counts[0 if allowed else 1] += 1


def flush() -> int:
    """Write the buffered counts to the database and return how many rows were written.

    Each key adds to its row (``allowed = allowed + n``), creating it when missing; a row created
    by another process at the same moment is retried as an update inside a savepoint, so the
    surrounding transaction stays usable on PostgreSQL. Keys are written in sorted order, in
    transactions of :data:`CHUNK_SIZE`, so concurrent flushes never deadlock. At most once per
    :data:`PRUNE_INTERVAL` the flush also deletes rows older than ``USAGE_RETENTION_DAYS``.

    Database errors are logged, never raised: the counts of a failed chunk go back into the
    buffer for the next flush (or are dropped, with a warning, when the buffer is full).
    """
    global _buffer, _folded
    with _lock:
        batch, _buffer = _buffer, {}
        folded, _folded = _folded, 0
    if folded:
        logger.warning(
            "Usage buffer full (%d keys): counted %d requests from new clients as %r.",
            MAX_KEYS,
            folded,
            OTHER,
        )
    if not batch:
        return 0

    from django_throttle.models import UsageCount

    alias = router.db_for_write(UsageCount)
    merged: _Buffer = {}
    for (minute, client, tier, endpoint), (allowed, denied) in batch.items():
        # Truncate to the column sizes; keys that collide after truncation add up.
        counts = merged.setdefault((minute, client[:200], tier[:100], endpoint[:100]), [0, 0])
        counts[0] += allowed
        counts[1] += denied

    items = sorted(merged.items())
    written = 0
    for start in range(0, len(items), CHUNK_SIZE):
        chunk = items[start : start + CHUNK_SIZE]
        try:
            with transaction.atomic(using=alias):
                for key, (allowed, denied) in chunk:
                    _add(UsageCount, alias, key, allowed, denied)
        except DatabaseError:
            logger.exception("Could not write %d usage rows; keeping them for later.", len(chunk))
            _restore(chunk)
        else:
            written += len(chunk)
    _prune(UsageCount, alias)
    return written


def reset() -> None:
    """Forget buffered counts and stop this process's flusher (for tests)."""
    global _buffer, _folded, _started_pid, _stop, _last_prune
    with _lock:
        _buffer = {}
        _folded = 0
        if _stop is not None:
            _stop.set()
        _stop = None
        _started_pid = None
        _last_prune = None


def report(since: datetime, by: str, top: int | None) -> list[UsageRow]:
    """Sum allowed and denied counts per ``by`` ("client", "tier" or "endpoint") since ``since``.

    Includes the whole minute window containing ``since``. Rows come busiest first: by total
    requests, then by denied requests, then by key, so the clients (or tiers, endpoints) that
    matter most lead and equal totals list the most throttled first. ``top`` keeps the first
    ``top`` rows; ``None`` keeps all. Only flushed counts are seen.
    """
    from django_throttle.models import UsageCount

    if by not in REPORT_BY:
        raise ValueError(f"by must be one of {', '.join(REPORT_BY)}, not {by!r}")
    if top is not None and top < 1:
        raise ValueError(f"top must be at least 1, not {top}")
    since = since.replace(second=0, microsecond=0)
    rows = (
        UsageCount.objects.filter(window_start__gte=since)
        .values(by)
        .annotate(
            sum_allowed=Sum("allowed"),
            sum_denied=Sum("denied"),
            sum_total=Sum(F("allowed") + F("denied")),
        )
        .order_by("-sum_total", "-sum_denied", by)
    )
    if top is not None:
        rows = rows[:top]
    return [
        UsageRow(
            key=row[by],
            allowed=int(row["sum_allowed"]),
            denied=int(row["sum_denied"]),
            total=int(row["sum_total"]),
        )
        for row in rows
    ]


def _window_start(minute: int) -> datetime:
    """The datetime of a minute window as the database expects it (aware UTC under USE_TZ)."""
    value = datetime.fromtimestamp(minute * 60, tz=UTC)
    if settings.USE_TZ:
        return value
    return timezone.make_naive(value, timezone.get_default_timezone())


def _add(
    model: type[UsageCount],
    alias: str,
    key: _Key,
    allowed: int,
    denied: int,
) -> None:
    minute, client, tier, endpoint = key
    window_start = _window_start(minute)
    rows = model._default_manager.using(alias).filter(
        window_start=window_start, client=client, tier=tier, endpoint=endpoint
    )
    increment = {"allowed": F("allowed") + allowed, "denied": F("denied") + denied}
    if rows.update(**increment):
        return
    try:
        with transaction.atomic(using=alias):
            rows.create(
                window_start=window_start,
                client=client,
                tier=tier,
                endpoint=endpoint,
                allowed=allowed,
                denied=denied,
            )
    except IntegrityError:
        # Another process created the row between our update and insert.
        rows.update(**increment)


def _restore(chunk: list[tuple[_Key, list[int]]]) -> None:
    """Put the counts of a failed write back into the buffer, within its bound."""
    dropped = 0
    with _lock:
        for key, (allowed, denied) in chunk:
            counts = _buffer.get(key)
            if counts is None:
                if len(_buffer) >= MAX_KEYS:
                    dropped += allowed + denied
                    continue
                counts = _buffer[key] = [0, 0]
            counts[0] += allowed
            counts[1] += denied
    if dropped:
        logger.warning(
            "Usage buffer full: dropped %d requests' counts after a failed write.", dropped
        )


def _prune(model: type[UsageCount], alias: str) -> None:
    """Delete rows past the retention period, at most once per PRUNE_INTERVAL per process."""
    global _last_prune
    now = time.monotonic()
    if _last_prune is not None and now - _last_prune < PRUNE_INTERVAL:
        return
    _last_prune = now
    days = app_settings.USAGE_RETENTION_DAYS
    if days <= 0:
        return
    cutoff = timezone.now() - timedelta(days=days)
    try:
        model._default_manager.using(alias).filter(window_start__lt=cutoff).delete()
    except DatabaseError:
        logger.exception("Could not delete usage rows older than %d days.", days)


def _start() -> None:
    """Start this process's flusher thread once (again in a forked child)."""
    global _started_pid, _stop, _buffer, _folded
    pid = os.getpid()
    with _lock:
        if _started_pid == pid:
            return
        if _started_pid is not None:
            # Forked: the parent flushes what it buffered before the fork.
            _buffer = {}
            _folded = 0
        _started_pid = pid
        _install_hooks()
        interval = app_settings.USAGE_FLUSH_INTERVAL
        if interval <= 0:
            _stop = None
            return
        stop = _stop = threading.Event()
    threading.Thread(
        target=_run, args=(stop, interval), name="django-throttle-usage", daemon=True
    ).start()


def _run(stop: threading.Event, interval: float) -> None:
    """Flush every ``interval`` seconds until ``stop`` is set."""
    while not stop.wait(interval):
        try:
            flush()
        except Exception:
            logger.exception("Usage flush failed.")
        finally:
            # Close this thread's connections so an idle flusher holds none open.
            connections.close_all()


def _install_hooks() -> None:
    """Flush at exit and start clean after fork; installed once per interpreter."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_flush_at_exit)
    os.register_at_fork(after_in_child=_after_fork)


def _after_fork() -> None:
    # The lock may have been held by a thread that does not exist in the child.
    global _lock, _buffer, _folded, _started_pid, _stop
    _lock = threading.Lock()
    _buffer = {}
    _folded = 0
    _started_pid = None
    _stop = None


def _flush_at_exit() -> None:
    try:
        flush()
    except Exception:
        logger.warning("Could not flush usage counts at exit.", exc_info=True)
