"""Django signals for exporters and alerting: connect a receiver to watch what the limiter
does. The Prometheus metrics in :mod:`django_throttle.metrics` are built on them.

Every signal is sent with ``sender`` set to the class or function that sends it (a
decision's: :func:`django_throttle.request.core.check`); receivers
should accept ``**kwargs``. With no receiver connected, a decision does not time itself for
:data:`request_decided` (:func:`watching`), so leaving the signals unused adds nothing to the
request path. Receivers run in the request's thread: keep them fast, and never raise (an
exception in a receiver is logged and swallowed, so it cannot fail a request).

- :data:`request_decided`: every decision that reached a verdict (``decision``, ``tier``,
  ``endpoint``, ``outcome``: one of ``allowed``, ``denied``, ``shadow_denied``,
  ``failed_open``, ``failed_closed``; ``seconds``: time spent deciding).
- :data:`request_throttled`: a request refused with 429 (``request``, ``decision``, ``tier``,
  ``endpoint``). Also sent for a shadow would-deny, with ``shadow=True``.
- :data:`backend_error`: a backend call failed (``error``, ``reason``: ``timeout``,
  ``connection``, ``script`` or ``other``); calls the open circuit breaker refuses at once
  are not errors of their own.
- :data:`backend_unavailable` / :data:`backend_available`: a circuit breaker opened /
  closed again (``error`` / ``down_seconds``; ``node``: None for the process's breaker, a
  Redis Cluster primary's ``host:port`` for that primary's own).
- :data:`policy_reloaded`: this process compiled a new policy snapshot (``policy``,
  ``seconds``).
- :data:`script_loaded`: the backend (re)loaded its Lua into Redis (a function library, or
  a script after ``NOSCRIPT``: after a restart, a failover or a flush).
- :data:`leases_held`: the concurrency leases this process's requests hold changed
  (``held``: how many it holds now; a lease is one request's slots of one client).
- :data:`lease_lost`: a renewal found a held lease already ended (``client``): its slot may
  have gone to another request, so the limit may have been passed for a while (renewals
  failed for a whole lease period: Redis down or the process stalled).
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

__all__ = [
    "backend_available",
    "backend_error",
    "backend_unavailable",
    "lease_lost",
    "leases_held",
    "policy_reloaded",
    "request_decided",
    "request_throttled",
    "script_loaded",
]

logger = logging.getLogger("django_throttle.events")

request_decided = Signal()
request_throttled = Signal()
backend_error = Signal()
backend_unavailable = Signal()
backend_available = Signal()
policy_reloaded = Signal()
script_loaded = Signal()
leases_held = Signal()
lease_lost = Signal()


def watching() -> bool:
    """Whether anyone listens to decisions: the request path times itself only then."""
    return bool(request_decided.receivers or request_throttled.receivers)


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` to its receivers; a receiver that raises is logged, never raised, so a
    receiver cannot fail a request."""
    for receiver, result in signal.send_robust(sender, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "django_throttle signal receiver %r raised %s: %s",
                receiver,
                type(result).__name__,
                result,
            )


def error_reason(error: BaseException) -> str:
    """A short, bounded label for a backend error (metrics labels must not grow without
    bound): ``circuit_open``, ``timeout``, ``connection``, ``script`` or ``other``. An error
    that names its own reason (the breaker's ``CircuitOpen``: ``circuit_open``) keeps it, so
    this module knows no backend."""
    reason = getattr(type(error), "reason", None)
    if isinstance(reason, str):
        return reason
    text = str(error).lower()
    if "timeout" in text or "timed out" in text:
        return "timeout"
    if "connect" in text or "closed" in text or "reset" in text:  # "connection" too
        return "connection"
    if "script" in text or "django_throttle:" in text:  # "noscript" too
        return "script"
    return "other"
