"""Usage counters: what happened to requests, per minute, client, tier and endpoint.

Each request lands in exactly one outcome: :data:`ALLOWED`, :data:`DENIED`,
:data:`SHADOW_DENIED` (served, but a shadow rule would have denied it), :data:`FAILED_OPEN`
(served uncounted: the limiter was unavailable) or :data:`FAILED_CLOSED` (refused: the limiter
was unavailable).

:func:`record` is on the request path, so it does no I/O: it bumps a counter in a process-local
buffer under a lock. :func:`flush` moves the buffer into :class:`~django_throttle.models.UsageCount`
rows in batches, from a daemon thread every ``DJANGO_THROTTLE_USAGE_FLUSH_INTERVAL`` seconds, at
interpreter exit, and from ``manage.py throttle_usage``. :func:`report` sums the rows for that
command.

Counts are best effort. What reaches the database: everything flushed so far (every
``DJANGO_THROTTLE_USAGE_FLUSH_INTERVAL`` seconds) plus, on a clean interpreter exit (``sys.exit``,
Ctrl-C, a server's graceful shutdown that exits normally), the rest. A process ended by a signal
it does not handle (SIGTERM under ``runserver`` or a bare ``python``, SIGKILL, the OOM killer)
loses what it counted since its last flush: at most one flush interval. A buffer holding more
than :data:`MAX_KEYS` distinct keys folds new clients into :data:`OTHER`.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connections, router, transaction
from django.db.models import F, Sum
from django.utils import timezone

from django_throttle.conf import app_settings

if TYPE_CHECKING:
    from django_throttle.models import UsageCount

__all__ = [
    "ALLOWED",
    "DENIED",
    "FAILED_CLOSED",
    "FAILED_OPEN",
    "MAX_KEYS",
    "OTHER",
    "OUTCOMES",
    "SHADOW_DENIED",
    "UsageRow",
    "flush",
    "record",
    "report",
    "reset",
]

logger = logging.getLogger("django_throttle.usage")

#: Most distinct (minute, client, tier, endpoint) keys one process buffers between flushes.
MAX_KEYS = 50_000
#: Client name that absorbs new clients once the buffer is full.
OTHER = "(other)"
#: Keys written per transaction: bounds how long one flush holds row locks.
CHUNK_SIZE = 500
#: Seconds between deletions of rows older than ``USAGE_RETENTION_DAYS`` (per process).
PRUNE_INTERVAL = 3600.0

ALLOWED = "allowed"
DENIED = "denied"
SHADOW_DENIED = "shadow_denied"
FAILED_OPEN = "failed_open"
FAILED_CLOSED = "failed_closed"
#: Every outcome, in column order; each is a :class:`~django_throttle.models.UsageCount` field.
OUTCOMES: tuple[str, ...] = (ALLOWED, DENIED, SHADOW_DENIED, FAILED_OPEN, FAILED_CLOSED)
_INDEX = {outcome: i for i, outcome in enumerate(OUTCOMES)}

ReportBy = Literal["client", "tier", "endpoint"]
REPORT_BY: tuple[str, ...] = ("client", "tier", "endpoint")

# (minute since the epoch, client, tier, endpoint) -> one count per outcome, in OUTCOMES order
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
    """Summed counts for one client, tier or endpoint (``key``; ``""`` means none);
    ``total`` is the sum of the outcomes."""

    key: str
    allowed: int
    denied: int
    total: int
    shadow_denied: int = 0
    failed_open: int = 0
    failed_closed: int = 0

    @property
    def denied_percent(self) -> float:
        """Share of requests denied, 0-100 (0 when there were none)."""
        return 100.0 * self.denied / self.total if self.total else 0.0


def record(client: str, tier: str, endpoint: str, outcome: str) -> None:
    """Count one request under ``outcome`` (one of :data:`OUTCOMES`). Thread safe; no I/O, no
    allocation beyond the key.

    ``client`` is the identity as text (``"user:42"``, ``"ip:203.0.113.7"``), ``tier`` the tier
    slug and ``endpoint`` the endpoint rule name, ``""`` for none. A no-op when
    ``DJANGO_THROTTLE_USAGE_ENABLED`` is false. Raises ``ValueError`` for an unknown outcome.
    """
    global _folded
    index = _INDEX.get(outcome) if isinstance(outcome, str) else None
    if index is None:
        raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
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
                counts = _buffer[key] = [0] * len(OUTCOMES)
        counts[index] += 1


def flush() -> int:
    """Write the buffered counts to the database and return how many rows were written.

    Each key adds to its row (``allowed = allowed + n``, likewise for every outcome), creating
    it when missing; a row created by another process at the same moment is retried as an
    update inside a savepoint, so the surrounding transaction stays usable on PostgreSQL. Keys
    are written in sorted order, in transactions of :data:`CHUNK_SIZE`, so concurrent flushes
    never deadlock. At most once per :data:`PRUNE_INTERVAL` the flush also deletes rows older
    than ``USAGE_RETENTION_DAYS``.

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
    for (minute, client, tier, endpoint), added in batch.items():
        # Truncate to the column sizes; keys that collide after truncation add up.
        key = (minute, client[:200], tier[:100], endpoint[:100])
        counts = merged.setdefault(key, [0] * len(OUTCOMES))
        for i, n in enumerate(added):
            counts[i] += n

    items = sorted(merged.items())
    written = 0
    for start in range(0, len(items), CHUNK_SIZE):
        chunk = items[start : start + CHUNK_SIZE]
        try:
            with transaction.atomic(using=alias):
                for key, counts in chunk:
                    _add(UsageCount, alias, key, counts)
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
    """Sum each outcome per ``by`` ("client", "tier" or "endpoint") since ``since``.

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
    total: Any = F(OUTCOMES[0])
    for outcome in OUTCOMES[1:]:
        total = total + F(outcome)
    rows = (
        UsageCount.objects.filter(window_start__gte=since)
        .values(by)
        .annotate(sum_total=Sum(total), **{f"sum_{outcome}": Sum(outcome) for outcome in OUTCOMES})
        .order_by("-sum_total", f"-sum_{DENIED}", by)
    )
    if top is not None:
        rows = rows[:top]
    return [
        UsageRow(
            key=row[by],
            total=int(row["sum_total"]),
            **{outcome: int(row[f"sum_{outcome}"]) for outcome in OUTCOMES},
        )
        for row in rows
    ]


def _window_start(minute: int) -> datetime:
    """The datetime of a minute window as the database expects it (aware UTC under USE_TZ)."""
    value = datetime.fromtimestamp(minute * 60, tz=UTC)
    if settings.USE_TZ:
        return value
    return timezone.make_naive(value, timezone.get_default_timezone())


def _add(model: type[UsageCount], alias: str, key: _Key, counts: list[int]) -> None:
    minute, client, tier, endpoint = key
    window_start = _window_start(minute)
    rows = model._default_manager.using(alias).filter(
        window_start=window_start, client=client, tier=tier, endpoint=endpoint
    )
    added = {outcome: n for outcome, n in zip(OUTCOMES, counts, strict=True) if n}
    increment = {outcome: F(outcome) + n for outcome, n in added.items()}
    if rows.update(**increment):
        return
    try:
        with transaction.atomic(using=alias):
            rows.create(
                window_start=window_start, client=client, tier=tier, endpoint=endpoint, **added
            )
    except IntegrityError:
        # Another process created the row between our update and insert.
        rows.update(**increment)


def _restore(chunk: list[tuple[_Key, list[int]]]) -> None:
    """Put the counts of a failed write back into the buffer, within its bound."""
    dropped = 0
    with _lock:
        for key, added in chunk:
            counts = _buffer.get(key)
            if counts is None:
                if len(_buffer) >= MAX_KEYS:
                    dropped += sum(added)
                    continue
                counts = _buffer[key] = [0] * len(OUTCOMES)
            for i, n in enumerate(added):
                counts[i] += n
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
