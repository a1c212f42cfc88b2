"""Usage accounting: what happened to each request, counted where the decision is made.

Each request lands in exactly one outcome: :data:`ALLOWED`, :data:`DENIED`,
:data:`SHADOW_DENIED` (served, but a shadow rule would have denied it), :data:`FAILED_OPEN`
(served uncounted: the limiter was unavailable) or :data:`FAILED_CLOSED` (refused: the limiter
was unavailable).

The backend counts every decision it makes under the usage field :func:`field_for` names
(tier and endpoint) in this process (its :class:`~django_throttle.backends.redis.Tally`:
no I/O), never in the counting call, which touches the counters only. :func:`flush_pending`
pushes those counts in one pipelined call at most once per
:data:`~django_throttle.backends.redis.PUSH_EVERY` (a second), in the process's pusher thread
(:func:`push_soon`): ``core`` wakes it after a successful backend call while :data:`pending`
or the tally's ``waiting`` says a push is due, and the thread wakes itself when the next push
of counts it holds is due, so a worker that falls idle pushes its last second too (a report
pushes its own process's counts first). No request waits for a push (its time grows with the
distinct clients pushed: see the benchmarks), and the request path has no database write and
no extra round trip. A worker that dies loses at most the counts of its last second (and of a
push in flight); a push that fails keeps its counts for the next try (bounded by
:data:`~django_throttle.backends.redis.MAX_KEPT`).

Decisions made without the backend (failed open, failed closed, failure mode ``"local"``)
are kept in this process by :func:`record_degraded` and pushed into the backend by
:func:`flush_pending` too, one batch of at most :data:`PUSH_PER_CALL` counts per call, so the
backlog of a long outage is spread over the pushes that follow it (a bounded script time
each); a push whose reply was lost is retried without counting twice. What a process dies
holding (Redis was down for all of its last requests) is lost: at most :data:`MAX_PENDING`
distinct (minute, client, tier, endpoint, outcome) counts, beyond which new clients count as
:data:`OTHER`.

Reports and the rollup to the database live in :mod:`django_throttle.usage.reports`.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import os
import threading
import time
import uuid
from typing import Any

from django_throttle.backends import BackendError, built_backend, get_backend
from django_throttle.backends.redis import PUSH_EVERY, PendingCount, Tally
from django_throttle.backends.redis_nodes import get_breaker
from django_throttle.backends.usage_store import LETTERS, MEASURE_LETTERS, UsageStore
from django_throttle.conf import app_settings
from django_throttle.rates import WORKER, Limit, Rate

logger = logging.getLogger("django_throttle.usage")

ALLOWED = "allowed"
DENIED = "denied"
SHADOW_DENIED = "shadow_denied"
FAILED_OPEN = "failed_open"
FAILED_CLOSED = "failed_closed"
#: Every outcome, in column order; each is a :class:`~django_throttle.models.UsageCount` field.
OUTCOMES: tuple[str, ...] = (ALLOWED, DENIED, SHADOW_DENIED, FAILED_OPEN, FAILED_CLOSED)
#: Requests served after waiting their turn (a delaying limit): a part of :data:`ALLOWED`.
DELAYED = "delayed"
#: Those requests' waits summed, in milliseconds (the mean wait is this / :data:`DELAYED`).
WAITED_MS = "waited_ms"
#: Requests the load shedder refused to protect the service (503): a part of :data:`DENIED`.
SHED = "shed"
#: Figures counted besides the outcome, per tier and endpoint only (no per-client rows).
MEASURES: tuple[str, ...] = (DELAYED, WAITED_MS, SHED)
#: Every counted column, in the order of a counts list: the outcomes, then the measures;
#: each is a :class:`~django_throttle.models.UsageCount` field.
COLUMNS: tuple[str, ...] = OUTCOMES + MEASURES
#: The one-letter code of each column in Redis (see ``backends/lua/usage.lua``).
LETTER = dict(zip(COLUMNS, LETTERS + MEASURE_LETTERS, strict=True))
#: Stands for "every client" (tier/endpoint total rows) or "every tier/endpoint" (per-client
#: rows) in :class:`~django_throttle.models.UsageCount`.
ALL = "*"
#: Between tier slug and endpoint name in a usage field; a slug never holds it.
SEPARATOR = "|"
#: The tier part of the usage field of a check made before authentication (a credential
#: rule's check of a login or an ``Authorization`` header): those checks are a series of
#: their own, apart from the tiers, so a request checked before authentication and then by
#: its tier is one request in the tier totals. A slug never holds spaces or parentheses.
BEFORE_AUTHENTICATION = "(before authentication)"
#: Longest usage field, in UTF-8 bytes, without the "only if denied" mark (the script refuses
#: longer ones): room for every tier slug and rule name the admin accepts (50 + 1 + 100
#: characters of up to 4 bytes), so those are never cut; a longer one (a scope written in
#: code) is cut and ends in a digest of the whole (:func:`_field`).
MAX_FIELD_BYTES = 512
#: Hex digits of the digest that ends a cut usage field, after ``~``.
FIELD_DIGEST_DIGITS = 12
#: Most distinct counts a process keeps while the backend cannot answer.
MAX_PENDING = 10_000
#: Client name that absorbs new clients once :data:`MAX_PENDING` is reached.
OTHER = "(other)"
#: Most counts one :func:`flush_pending` call pushes: one push of this size holds the server
#: for a bounded script time, never for a whole outage's backlog; the rest follows on the next
#: pushes.
PUSH_PER_CALL = 200


#: Why :func:`flush_pending` has work besides the backend's own tally: ``"counts"`` kept while
#: the backend was down, ``"unsent"`` batches whose push failed. A plain set, so the request path
#: tests it (and the tally's ``waiting``: :data:`~.redis.PUSH_EVERY` had passed since its
#: last push when it last counted a decision) after every successful backend call without a
#: call of its own; :func:`flush_pending` checks ``Tally.due``.
pending: set[str] = set()
_counts: dict[tuple[int, str, str, str], int] = {}
_unsent: list[tuple[str, list[PendingCount]]] = []  # (batch id, counts) whose push failed
_lock = threading.Lock()
#: Held while a batch of kept counts is pushed: a second :func:`flush_pending` (a command's, a
#: test's) waits for the pusher thread's batch in flight, so it returns with that batch
#: pushed or kept again, never while it is neither here nor on the server.
_pushing = threading.Lock()
_owner: int | None = None  # pid that recorded the counts (a forked child drops its copy)
_clock = time.time


class UsageUnavailable(Exception):
    """The configured backend keeps no usage counts."""


def field_for(tier: str, endpoint: str, *, before_authentication: bool = False) -> str | None:
    """The usage field for a tier slug and endpoint name (``""`` for none): what the backend
    counts a decision under, or ``None`` when usage is off
    (``DJANGO_THROTTLE_USAGE_RETENTION_DAYS = 0``).

    ``"<tier>|<endpoint>"`` (just ``"<tier>"`` with no endpoint: every byte is sent with every
    decision), at most :data:`MAX_FIELD_BYTES`: a longer one is cut and ends in ``~`` and a
    digest of the whole, so two long names stay two series; :func:`split_field` reverses
    it. A ``|`` in a tier slug (only possible in rows written around the admin) becomes ``-``.
    ``before_authentication`` (a check before the caller is authenticated, whatever its tier
    then looked like) counts under :data:`BEFORE_AUTHENTICATION` instead of ``tier``.
    """
    if not app_settings.usage_enabled:
        return None
    return _field(BEFORE_AUTHENTICATION if before_authentication else tier, endpoint)


@functools.lru_cache(maxsize=4096)
def _field(tier: str, endpoint: str) -> str:
    field = tier.replace(SEPARATOR, "-") + (SEPARATOR + endpoint if endpoint else "")
    encoded = field.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_FIELD_BYTES:
        digest = hashlib.blake2b(encoded, digest_size=FIELD_DIGEST_DIGITS // 2).hexdigest()
        room = MAX_FIELD_BYTES - 1 - FIELD_DIGEST_DIGITS
        field = encoded[:room].decode("utf-8", "ignore") + "~" + digest
    # An empty field is counted too ("" would mean "count nothing").
    return field or SEPARATOR


def split_field(field: str) -> tuple[str, str]:
    """(tier slug, endpoint name) of a usage field; the tier part of a check before
    authentication is :data:`BEFORE_AUTHENTICATION`."""
    tier, _, endpoint = field.partition(SEPARATOR)
    return tier, endpoint


def get_store(backend: Any = None) -> UsageStore:
    """Where ``backend`` (default: the configured one) keeps its usage counts.

    Raise :class:`UsageUnavailable` for a backend that keeps none. A Redis store may hold a
    client of its own: call its ``close()`` when done.
    """
    backend = get_backend() if backend is None else backend
    store = getattr(backend, "usage", None)
    if isinstance(store, UsageStore):
        return store
    if callable(getattr(backend, "shard_tags", None)):
        from django_throttle.backends.usage_store import RedisUsage

        return RedisUsage(backend)
    raise UsageUnavailable(
        f"the backend {type(backend).__name__} keeps no usage counts; the Redis "
        "and memory backends do."
    )


def record_degraded(field: str | None, client: str, outcome: str) -> None:
    """Count a decision made without the backend, to push when it answers again.

    ``field`` is :func:`field_for`'s value (``None``: count nothing); ``outcome`` is
    :data:`FAILED_OPEN`, :data:`FAILED_CLOSED`, or :data:`ALLOWED` / :data:`DENIED` /
    :data:`SHADOW_DENIED` for failure mode ``"local"``. Thread safe; no I/O. Raises
    ``ValueError`` for another outcome.
    """
    letter = LETTER.get(outcome) if outcome in OUTCOMES else None
    if letter is None:
        raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
    if field:
        _add(int(_clock() // 60), field, client, {letter: 1})


def record_delay(field: str | None, seconds: float, *, local: bool = False) -> None:
    """Count a request served after waiting ``seconds`` for its turn (a delaying limit) under
    usage ``field`` (:func:`field_for`'s value; ``None``: count nothing), in the
    :data:`MEASURES` of its tier and endpoint (its outcome, allowed, is counted with the
    decision): in the backend's tally like the decision, or (``local``: decided in process
    while the backend was down) with the counts kept for it. Called once the wait is over: a
    request refused by the process's cap on waiting requests, or cancelled while it waits, was
    never delayed. Thread safe; no I/O."""
    if not field or seconds <= 0:
        return
    tally = None if local else getattr(built_backend(), "usage_tally", None)
    if isinstance(tally, Tally):
        tally.add_delay(field, seconds)
        return
    waited = {LETTER[DELAYED]: 1, LETTER[WAITED_MS]: max(1, round(seconds * 1000))}
    _add(int(_clock() // 60), field, "", waited)


def record_shed(field: str | None, client: str) -> None:
    """Count a request this worker shed on its own (no backend call): denied, and shed in
    its tier and endpoint's totals, in the backend's tally (or kept for it)."""
    if not field:
        return
    tally = getattr(built_backend(), "usage_tally", None)
    if isinstance(tally, Tally):
        tally.add(field, client, False, False, None, Limit(WORKER, Rate(1, 1), 1))
        return
    minute = int(_clock() // 60)
    _add(minute, field, client, {LETTER[DENIED]: 1})
    _add(minute, field, "", {LETTER[SHED]: 1})


def record_refused_turn(field: str | None, client: str, *, local: bool = False) -> None:
    """Count as denied a request the backend allowed with a turn to wait for that this
    process refused instead (too many requests waiting: see ``core.wait_turn``): the
    decision's count moves from allowed to denied while it is still in this process (it is
    pushed within a second, so almost always), in the backend's tally or (``local``) with
    the counts kept while the backend was down."""
    if not field:
        return
    tally = None if local else getattr(built_backend(), "usage_tally", None)
    if isinstance(tally, Tally):
        tally.refuse(field, client)
        return
    minute = int(_clock() // 60)
    denied = LETTER[DENIED]
    # Counted allowed, or shadow would-deny (a shadow rule would have refused it).
    served = (LETTER[ALLOWED], LETTER[SHADOW_DENIED])
    with _lock:
        for m, letter in ((m, letter) for m in (minute, minute - 1) for letter in served):
            key = (m, field, client, letter)
            if _counts.get(key, 0) > 0:
                _counts[key] -= 1
                if not _counts[key]:
                    del _counts[key]
                _counts[(m, field, client, denied)] = _counts.get((m, field, client, denied), 0) + 1
                return


def _add(minute: int, field: str, client: str, counts: dict[str, int]) -> None:
    global _owner
    pid = os.getpid()
    with _lock:
        if _owner != pid:
            _forget()
            _owner = pid
        for letter, n in counts.items():
            key = (minute, field, client, letter)
            if key not in _counts and len(_counts) >= MAX_PENDING:
                key = (minute, field, OTHER, letter)
            _counts[key] = _counts.get(key, 0) + n
        pending.add("counts")


#: Seconds a pusher thread has to start running before this process is taken for one where
#: threads do not run (uWSGI without ``--enable-threads``): its requests then push the counts
#: themselves, as they did before the thread.
THREAD_START_GRACE = 5.0


class _Pusher:
    """This process's pusher thread: runs :func:`flush_pending` each time it is woken
    (:func:`push_soon`) and when the push of the counts it holds is due (:func:`_next_look`);
    ``idle`` is set while it has nothing to do."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.wake = threading.Event()
        self.idle = threading.Event()
        self.idle.set()
        # Wake-ups asked for, under ``lock``: ``idle`` is set only when none came in during
        # a push, so a wake-up never goes unseen by :func:`wait_pushed`.
        self.asked = 0
        self.lock = threading.Lock()
        self.created = time.monotonic()
        self.ran = False
        self.warned = False
        self.thread = threading.Thread(target=self.run, name="django-throttle-usage", daemon=True)
        self.thread.start()

    def usable(self) -> bool:
        # A forked child inherits the object, not the thread; a thread that never ran is
        # kept (where threads do not run, a new one would not either).
        return self.pid == os.getpid() and (not self.ran or self.thread.is_alive())

    def stuck(self) -> bool:
        """Whether the thread never ran within :data:`THREAD_START_GRACE` of its start."""
        return not self.ran and time.monotonic() - self.created > THREAD_START_GRACE

    def run(self) -> None:
        self.ran = True
        timeout: float | None = None
        while True:
            self.wake.wait(timeout)
            with self.lock:
                self.wake.clear()
                self.idle.clear()
                asked = self.asked
            try:
                flush_pending()
            except Exception:  # pragma: no cover - flush_pending never raises
                logger.exception("Usage push failed")
            timeout = _next_look()
            with self.lock:
                if self.asked == asked and not self.wake.is_set():
                    self.idle.set()

    def ask(self) -> None:
        """Wake the thread, and have :func:`wait_pushed` wait for the push it makes."""
        with self.lock:
            self.asked += 1
            self.idle.clear()
            self.wake.set()


_pusher: _Pusher | None = None
_pusher_lock = threading.Lock()


def push_soon() -> None:
    """Wake this process's pusher thread to run :func:`flush_pending` (a daemon thread,
    started on the first call, again in a forked child). Returns at once: the request that
    finds a push due never waits for it. ``core`` calls it only when :data:`pending` or the
    tally's ``waiting`` says there is work, so a plain request makes no call here. Where
    threads do not run (the thread never started within :data:`THREAD_START_GRACE`), the
    request pushes itself: counts are never left behind for a thread that cannot run."""
    global _pusher
    pusher = _pusher
    if pusher is None or not pusher.usable():
        with _pusher_lock:
            pusher = _pusher
            if pusher is None or not pusher.usable():
                pusher = _pusher = _Pusher()
    if pusher.stuck():
        if not pusher.warned:
            pusher.warned = True
            logger.warning(
                "The usage pusher thread has not run for %.0f s: Python threads do not run "
                "in this process (uWSGI without --enable-threads?). Requests push the usage "
                "counts themselves.",
                THREAD_START_GRACE,
            )
        flush_pending()
        return
    pusher.ask()


def _next_look() -> float | None:
    """Seconds the pusher thread sleeps unless a request wakes it: until the tally of the
    process's backend has a push due, or :data:`~.redis.PUSH_EVERY` while kept counts
    wait; ``None`` (until woken) when nothing waits."""
    waits = [PUSH_EVERY] if pending else []
    backend = built_backend()  # never build one here
    if backend is not None:
        tally = getattr(backend, "usage_tally", None)
        left = tally.push_in() if isinstance(tally, Tally) else None
        if left is not None:
            waits.append(left)
    return min(max(min(waits), 0.01), PUSH_EVERY) if waits else None


def wait_pushed(timeout: float = 10.0) -> bool:
    """Wait until the pusher thread has run every push it was woken for (tests, and a
    shutdown hook that must not leave a push in flight); ``False`` if it is still busy after
    ``timeout`` seconds."""
    pusher = _pusher
    if pusher is None or not pusher.usable() or pusher.stuck():
        return True
    return pusher.idle.wait(timeout)


def flush_pending() -> None:
    """Push the backend's tally of decisions when a push is due (at most once per
    :data:`~.redis.PUSH_EVERY`), and one batch of at most :data:`PUSH_PER_CALL` of the
    counts :func:`record_degraded` kept, each through the circuit breaker in one pipeline;
    what is left stays :data:`pending` for the next call (the pusher's next, a second later
    at most), so no push carries an outage's whole backlog. A batch whose push failed is
    retried first, whole and under its own id (a retry after a lost reply is a no-op). One
    batch is pushed at a time: a call waits for another's push in flight (the pusher
    thread's), so the batch it took is pushed or :data:`pending` again when this returns.
    Never raises: on failure the counts stay for the next call. Blocking: the request path
    calls :func:`push_soon`, which runs this in the pusher thread; tests and commands call
    it to push now."""
    backend = get_backend()
    tally = getattr(backend, "usage_tally", None)
    if isinstance(tally, Tally) and tally.due():
        try:
            get_breaker().call(_push_store(backend).push_tally, tally)
        except (BackendError, UsageUnavailable) as exc:
            logger.debug("Usage push failed, kept for the next try: %s", exc)
    _flush_degraded()


def _flush_degraded() -> None:
    with _pushing:
        _flush_batch()


def _flush_batch() -> None:
    with _lock:
        if _owner != os.getpid():  # forked: the counts are the parent's to push
            _forget()
            return
        if _unsent:
            batch = _unsent.pop(0)
        elif _counts:
            taken = list(itertools.islice(_counts.items(), PUSH_PER_CALL))
            for key, _n in taken:
                del _counts[key]
            batch = (uuid.uuid4().hex, [(*key, n) for key, n in taken])
        else:
            pending.clear()
            return
        if not _unsent and not _counts:
            pending.clear()
    try:
        get_breaker().call(_push_store(get_backend()).push, *batch)
    except (BackendError, UsageUnavailable) as exc:
        _keep(batch, exc)


def reset() -> None:
    """Forget kept counts (tests, and a backend change)."""
    with _lock:
        _forget()
        _push_store.cache_clear()


def _forget() -> None:
    _counts.clear()
    _unsent.clear()
    pending.clear()


@functools.lru_cache(maxsize=1)
def _push_store(backend: Any) -> UsageStore:
    """The configured backend's store, built once per backend instance."""
    return get_store(backend)


def _keep(batch: tuple[str, list[PendingCount]], exc: Exception) -> None:
    """Keep a batch that could not be pushed, under the :data:`MAX_PENDING` bound."""
    dropped = 0
    with _lock:
        _unsent.insert(0, batch)  # first in line again: the oldest counts go first
        kept = sum(len(counts) for _, counts in _unsent)
        while _unsent and kept > MAX_PENDING:
            _, counts = _unsent.pop(0)
            kept -= len(counts)
            dropped += sum(count[4] for count in counts)
        if _unsent:
            pending.add("unsent")
    if dropped:
        logger.warning(
            "Dropped %d requests' usage counts: the backend has not answered a usage push "
            "for a long time (%s).",
            dropped,
            exc,
        )
