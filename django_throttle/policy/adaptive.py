"""Adaptive limits: the load controller that shrinks tiers' limits while the service is
overloaded and gives them back when the load falls (run by ``manage.py throttle_adapt``).

Every ``step`` seconds one controller in the fleet (a ``SET NX PX`` lock per step, so two
controllers never both move the factors in one step) reads ONE load signal
(``callable() -> float | None``, the load as a ratio to its target, 1.0 at target; the
command's ``--signal``) and applies AIMD, additive increase and multiplicative decrease:

- signal above 1 (overloaded): the automatic factor of the lowest-priority tier still above
  its floor is multiplied by :data:`BETA`, never below the floor (the tier's ``min_factor``);
  only once it sits at its floor does the next tier up shrink. One tier moves per step.
- signal below :data:`LOW` (underloaded): :data:`ALPHA` is added to the highest-priority
  tier below 1.0, up to 1.0: tiers recover in the reverse order.
- in between (the hysteresis band), or no data: hold. A steady overload therefore walks
  every tier down to its floor and holds there; it never oscillates.
- after a move, no further move for ``settle`` seconds (:data:`SETTLE` by default): a move
  must reach the workers (the policy refresh, a second) and show in the signal (its own
  window) before the signal can say whether it was enough, as TCP's AIMD moves once per
  round trip. Without it a step shorter than that delay cuts again and again on readings
  taken before its own cuts, gives back as fast, and the latency saws around its target
  (measured: docs/explanation/benchmarks.md, adaptive limits under a surge). The step stays
  short so that the first overload is seen at once.

The factors live in the backend (:mod:`django_throttle.backends.adaptive_store`) with a TTL
the controller refreshes each step: a controller that stops leaves them to expire, and every
tier is whole again. When a step changes them it bumps the policy version, so every worker
recompiles its snapshot within the refresh interval (one ``GET`` of the factors per compile,
none per request); the request path is unchanged.
"""

from __future__ import annotations

import logging
import math
import reprlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q

from django_throttle.backends import Backend, get_backend
from django_throttle.backends.adaptive_store import AdaptiveStore

logger = logging.getLogger("django_throttle.adaptive")

#: Added to a recovering tier's factor per step.
ALPHA = 0.1
#: A shrinking tier's factor is multiplied by this per step.
BETA = 0.7
#: Below this signal the load is low enough to recover; between it and 1.0, hold.
LOW = 0.9
#: Seconds after a move in which no further move is made, by default: the policy refresh plus a
#: one-second signal window and the requests in flight catching up. Set it to your signal's
#: window plus a second or two (``throttle_adapt --settle``).
SETTLE = 3.0
#: Factors closer than this to a bound count as at it.
_EPSILON = 1e-6


@dataclass(frozen=True)
class TierState:
    """A tier as the controller sees it: its floor for the automatic factor."""

    id: int
    slug: str
    priority: int
    floor: float


@dataclass(frozen=True)
class Step:
    """What one step did. ``acquired`` is false when another controller held the step (it
    did nothing else); ``signal`` is the value read (``None``: no data, or a bad value that
    was logged); ``moved`` the slug of the tier whose factor changed, if any."""

    acquired: bool
    signal: float | None = None
    moved: str | None = None
    factors: dict[int, float] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.moved is not None


def adaptive_tiers() -> list[TierState]:
    """Every tier with some limit (a tier without one has nothing to shrink), with the floor
    of its automatic factor: ``min_factor / load_factor`` (so the effective factor never goes
    below ``min_factor``), 1.0 for a tier whose values the admin would refuse."""
    from django_throttle.models import Tier

    tiers = []
    with_limits = Tier.objects.filter(
        Q(limits__isnull=False) | Q(endpoint_limits__isnull=False)
    ).distinct()
    for tier in with_limits.order_by("priority", "id"):
        floor = 1.0 if tier.factor_problems() else min(1.0, tier.min_factor / tier.load_factor)
        tiers.append(TierState(tier.id, tier.slug, tier.priority, floor))
    return tiers


def read_signal(signal: Callable[[], Any]) -> float | None:
    """The signal's value, or ``None`` (logged) when it raises or returns anything but a
    finite number of at least 0: a broken signal holds the factors, never moves them."""
    try:
        value = signal()
    except Exception:
        logger.exception("load signal %r raised; factors held", signal)
        return None
    if value is None:
        return None
    try:  # an int too large for a float is no finite number either
        number = float(value) if isinstance(value, int | float) else math.nan
    except OverflowError:
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        shown = reprlib.repr(value)
        logger.error("load signal %r returned %s, not a finite number; factors held", signal, shown)
        return None
    if number < 0:
        logger.error("load signal %r returned %r, below 0; factors held", signal, value)
        return None
    return number


def decide(
    tiers: list[TierState],
    factors: dict[int, float],
    signal: float | None,
    may_move: bool = True,
) -> tuple[dict[int, float], str | None]:
    """The factors after one step of AIMD, and the slug of the tier that moved (``None``:
    none did). ``tiers`` in any order; ``factors`` missing a tier means 1.0. ``may_move``
    False (the last move is still settling): every signal holds."""
    new = {t.id: min(1.0, max(t.floor, factors.get(t.id, 1.0))) for t in tiers}
    clamped = next((t.slug for t in tiers if new[t.id] != factors.get(t.id, 1.0)), None)
    if signal is None or LOW <= signal <= 1.0 or not may_move:
        return new, clamped
    if signal > 1.0:
        for tier in sorted(tiers, key=lambda t: (t.priority, t.id)):
            if new[tier.id] > tier.floor + _EPSILON:
                new[tier.id] = max(tier.floor, new[tier.id] * BETA)
                return new, tier.slug
        return new, clamped
    for tier in sorted(tiers, key=lambda t: (-t.priority, t.id)):
        if new[tier.id] < 1.0 - _EPSILON:
            grown = new[tier.id] + ALPHA
            new[tier.id] = 1.0 if grown >= 1.0 - _EPSILON else grown
            return new, tier.slug
    return new, clamped


@dataclass
class Controller:
    """The load controller. ``signal`` is ``callable() -> float | None``, the load as a
    ratio to its target (``manage.py throttle_adapt --signal`` imports it from a dotted
    path); ``clock`` (Unix seconds) names the step and the history minute, so a test moves
    time by hand."""

    signal: Callable[[], Any]
    step: float = 10.0
    clock: Callable[[], float] = time.time
    backend: Backend | None = None
    #: Seconds the factors outlive the last step that wrote them (at least a minute).
    ttl: int | None = None
    #: Seconds after a move in which no further move is made (see :data:`SETTLE`).
    settle: float = SETTLE

    def __post_init__(self) -> None:
        if not (isinstance(self.step, int | float) and 0.1 <= self.step <= 3600):
            raise ValueError(f"step must be between 0.1 and 3600 seconds, not {self.step!r}")
        if not (isinstance(self.settle, int | float) and 0 <= self.settle <= 3600):
            raise ValueError(f"settle must be between 0 and 3600 seconds, not {self.settle!r}")
        if not callable(self.signal):
            raise ValueError(
                f"the load signal {self.signal!r} is not callable: give a callable taking no "
                "argument"
            )

    @property
    def store(self) -> AdaptiveStore:
        return AdaptiveStore(self.backend or get_backend())

    def run_once(self) -> Step:
        """One step: take the step's lock, read the signal, move at most one tier, save the
        factors and this minute's history, and bump the policy version if a factor moved.
        A :class:`~django_throttle.backends.BackendError` propagates (nothing moved)."""
        now = self.clock()
        store = self.store
        number = math.floor(now / self.step)
        if not store.acquire(number, max(1, round(self.step * 2000))):
            return Step(acquired=False)
        tiers = adaptive_tiers()
        signal = read_signal(self.signal)
        last_move = store.last_move()
        may_move = last_move is None or now - last_move >= self.settle
        factors, moved = decide(tiers, store.factors(), signal, may_move)
        if moved is not None and signal is not None and may_move:
            store.note_move(now, math.ceil(self.settle) + 60)
        ttl = self.ttl or max(60, round(self.step * 30))
        store.save(factors, int(now // 60), ttl, tuple(t.id for t in tiers))
        if moved is not None:
            (self.backend or get_backend()).bump_policy_version()
            percent = 100 * factors[_id(tiers, moved)]
            logger.info("load %s: tier %s now at %.0f%% (automatic)", signal, moved, percent)
        return Step(True, signal, moved, factors)

    def run(self, steps: int | None = None, sleep: Callable[[float], Any] = time.sleep) -> None:
        """Run a step at the start of every step period, ``steps`` times (``None``: until
        interrupted). A backend error is logged and the loop goes on."""
        from django_throttle.backends import BackendError

        done = 0
        while steps is None or done < steps:
            try:
                self.run_once()
            except BackendError as exc:
                logger.warning("adaptive step skipped, the backend did not answer: %s", exc)
            done += 1
            if steps is None or done < steps:
                sleep(self.step - self.clock() % self.step)


def _id(tiers: list[TierState], slug: str) -> int:
    return next(t.id for t in tiers if t.slug == slug)
