"""A tier's limits scaled by its load factor (the operator's ``Tier.load_factor`` times the
automatic factor of the adaptive controller, :mod:`.adaptive`), when the policy is compiled:
never per request.

A scaled limit keeps its id, so it counts in the same keys: the state carries over, and the
algorithms' own rule for a changed limit applies (a tightened limit hands a drained client no
new burst). Its count and burst are multiplied by the factor and rounded, at least 1 (a
concurrency or window limit's burst is its count); a delaying GCRA limit keeps at most
``burst - 1`` served at once. Its name shows the rate that applies.
"""

from __future__ import annotations

import dataclasses
import logging

from django_throttle.rates import (
    WINDOW_ALGORITHMS,
    Algorithm,
    InvalidRate,
    Limit,
    Rate,
    limit_text,
)

logger = logging.getLogger("django_throttle.policy")

#: Lower counts tried when a scaled GCRA rate is not a whole number of microseconds.
_GCRA_TRIES = 16


def scaled(limit: Limit, factor: float) -> Limit:
    """``limit`` with its count and burst times ``factor`` (in (0, 1]); ``limit`` itself at
    1.0. A scaled limit the rules refuse (a GCRA rate that is not a whole number of
    microseconds) takes the next lower count that works; none: ``limit`` unscaled, logged."""
    if factor >= 1.0:
        return limit
    count = max(1, round(limit.rate.count * factor))
    for attempt in range(_GCRA_TRIES if limit.algorithm == Algorithm.GCRA else 1):
        try:
            return _with_count(limit, max(1, count - attempt), factor)
        except InvalidRate:
            continue
    logger.error("Limit %s kept unscaled: no count near %s x %s is valid", limit.id, limit, factor)
    return limit


def _with_count(limit: Limit, count: int, factor: float) -> Limit:
    rate = Rate(count, limit.rate.period, limit.rate.calendar)
    if limit.algorithm in WINDOW_ALGORITHMS or limit.algorithm == Algorithm.CONCURRENCY:
        burst = count
    else:
        burst = max(1, round(limit.burst * factor))
    delay = limit.delay
    if delay is not None:
        delay = min(delay, burst - 1)
    shown = limit_text(limit.rate, limit.algorithm)
    name = limit.name.replace(shown, limit_text(rate, limit.algorithm), 1)
    return dataclasses.replace(limit, rate=rate, burst=burst, delay=delay, name=name)


def effective_factor(load_factor: int, min_factor: int, automatic: float) -> float:
    """What a tier's limits are scaled by: the operator's ``load_factor`` (percent) times the
    ``automatic`` factor, never below the tier's floor ``min_factor`` (percent) on the
    automatic side (the operator's own factor can go lower)."""
    load = load_factor / 100
    floor = min(1.0, min_factor / load_factor)
    return load * min(1.0, max(floor, automatic))
