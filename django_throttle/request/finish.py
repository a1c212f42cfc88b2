"""The finish of a request: its decision from the backend's reply to the plan.

A reply the backend made becomes the decision as it is, leaving a
:class:`~django_throttle.request.reservations.Reservation` on the request when its rule
counts only successes or failures; a :class:`~django_throttle.backends.BackendError`
becomes the decision of the failure mode that applies (open, closed or local), counted
in-process until the backend is back, and recorded in usage. Plain: no awaiting.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from django_throttle.backends import get_local_backend
from django_throttle.backends.breaker import get_breaker
from django_throttle.conf import app_settings
from django_throttle.plain import log_text
from django_throttle.rates import Decision
from django_throttle.request.planning import _FAILED_OPEN, _Plan
from django_throttle.request.reservations import Reservation, watch_login_failures
from django_throttle.usage import accounting as usage

logger = logging.getLogger("django_throttle")

__all__: list[str] = []


def _counted(planned: _Plan, decision: Decision, request: Any) -> Decision:
    if decision.shadow:
        logger.info(
            "shadow rule %r would deny %s",
            planned.endpoint.name if planned.endpoint is not None else "",
            log_text(planned.client),
        )
    if planned.refunds and decision.allowed and planned.endpoint is not None:
        counts = planned.endpoint.counts
        if counts == "failures":
            watch_login_failures()
        reservation = Reservation(counts, planned.cost, planned.refunds, decision.taken)
        reservations = getattr(request, "throttle_reservations", None)
        if reservations is None:
            request.throttle_reservations = [reservation]
        else:
            reservations.append(reservation)
    return decision


def _degraded(planned: _Plan, refused: bool = False) -> Decision:
    """The decision when the backend could not answer, by failure mode, counted in-process
    until the backend is back. A ``refused`` call (the backend answered, refusing one of our
    arguments: a bug, logged by the breaker) is counted in-process where the mode would
    serve it uncounted: whatever provoked it must not slip past the limits.

    The breaker logs when it opens and closes; a line per failed request would flood the log
    exactly when the operator needs it. The mode is only worked out here, off the healthy
    path."""
    failure_mode = planned.failure_mode
    default = "closed" if planned.credential else None
    if failure_mode is None and planned.policy is not None:
        failure_mode = planned.policy.failure_mode_for(planned.tier, planned.endpoint, default)
    failure_mode = failure_mode or default or app_settings.FAILURE_MODE
    if refused and failure_mode == "open":
        failure_mode = "local"
    limits, client = planned.limits, planned.client
    if failure_mode == "closed":
        decision = Decision(
            allowed=False,
            limit=None,
            remaining=0,
            reset_after=0.0,
            retry_after=get_breaker().retry_after(),
            limits=tuple(limits),
            unavailable=True,
        )
    elif failure_mode == "local":
        local = get_local_backend().hit(client, limits, planned.cost)
        decision = dataclasses.replace(local, local=True)
    else:
        decision = _FAILED_OPEN
    usage.record_degraded(planned.field, client, _outcome(decision))
    return decision


def _outcome(decision: Decision) -> str:
    """The usage column of a decision the backend did not make."""
    if decision.unavailable:
        return usage.FAILED_CLOSED
    if decision.failed_open:
        return usage.FAILED_OPEN
    return usage.ALLOWED if decision.allowed else usage.DENIED
