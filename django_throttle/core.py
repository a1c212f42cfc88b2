"""The one path every adapter calls: identity → policy → one backend call → decision.

No DRF and no responses here; adapters turn the :class:`~django_throttle.rates.Decision` into
headers, a 429 or a 503. A backend failure goes through the process's circuit breaker and
becomes the failure mode that applies (open, closed or local), never an exception.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from django_throttle import policy as policy_module
from django_throttle import usage
from django_throttle.backends import BackendError, get_backend, get_local_backend
from django_throttle.breaker import CircuitBreaker, get_breaker
from django_throttle.conf import app_settings
from django_throttle.identity import UNIDENTIFIED, Identity, get_resolver
from django_throttle.rates import UNLIMITED, Decision, Limit

logger = logging.getLogger("django_throttle")

__all__ = ["FAILURE_MODES", "check"]

#: What a request meets when the backend cannot answer (see ``DJANGO_THROTTLE_FAILURE_MODE``).
FAILURE_MODES = ("open", "closed", "local")
#: Seconds between two error lines about unidentifiable clients, per process.
UNIDENTIFIED_LOG_INTERVAL = 60.0

_FAILED_OPEN = Decision(allowed=True, limit=None, remaining=0, reset_after=0.0, failed_open=True)
_UNIDENTIFIED_DENIED = Decision(
    allowed=False, limit=None, remaining=0, reset_after=0.0, unavailable=True, unidentified=True
)
_SHARED_UNKNOWN = Identity("ip", "unknown")
_last_unidentified_log = -UNIDENTIFIED_LOG_INTERVAL


def check(
    request: Any,
    *,
    scope: str | None = None,
    limits: Sequence[Limit] | None = None,
    cost: int | None = None,
    failure_mode: str | None = None,
    credential: bool = False,
) -> Decision:
    """Count ``request`` against its limits and say whether it may proceed.

    Without ``limits``, the admin policy decides: the client's tier limits plus those of the
    endpoint rule matching ``scope``, the URL route name or the path. With ``limits`` (a
    decorator's inline rate), exactly those apply.

    When the backend cannot answer, the failure mode is the first of: ``failure_mode``, the
    endpoint rule's, the tier's, ``"closed"`` for a ``credential`` endpoint (login, token: an
    outage must not open the door to password guessing), the setting.
    """
    if not app_settings.ENABLED:
        return UNLIMITED
    identity = get_resolver()(request)
    if identity.kind == UNIDENTIFIED.kind:
        decision = _unidentified()
        if decision is not None:
            return decision
        identity = _SHARED_UNKNOWN
    tier_slug = endpoint_name = ""
    policy = tier = endpoint = None
    if limits is None:
        policy = policy_module.current()
        endpoint = policy.match(
            request.method or "GET", scope, _route_name(request), request.path_info
        )
        tier = policy.tier_for(identity)
        limits = policy.limits_for(tier, endpoint)
        if endpoint is not None:
            cost = endpoint.cost if cost is None else cost
            endpoint_name = endpoint.name
        if tier is not None:
            tier_slug = tier.slug
    if not limits:
        return UNLIMITED
    client = identity.key
    cost = 1 if cost is None else cost
    breaker = get_breaker()
    try:
        decision = breaker.call(get_backend().hit, client, limits, cost)
    except BackendError:
        # The breaker logs when it opens and closes; a line per failed request would flood
        # the log exactly when the operator needs it. The mode is only worked out here, off
        # the healthy path.
        default = "closed" if credential else None
        if failure_mode is None and policy is not None:
            failure_mode = policy.failure_mode_for(tier, endpoint, default)
        decision = _degraded(
            client, limits, cost, failure_mode or default or app_settings.FAILURE_MODE, breaker
        )
    if decision.shadow:
        logger.info("shadow rule %r would deny %s", endpoint_name, client)
    usage.record(client, tier_slug, endpoint_name or scope or "", _outcome(decision))
    return decision


def _degraded(
    client: str, limits: Sequence[Limit], cost: int, failure_mode: str, breaker: CircuitBreaker
) -> Decision:
    """The decision when the backend could not answer, by failure mode."""
    if failure_mode == "closed":
        return Decision(
            allowed=False,
            limit=None,
            remaining=0,
            reset_after=0.0,
            retry_after=breaker.retry_after(),
            limits=tuple(limits),
            unavailable=True,
        )
    if failure_mode == "local":
        return dataclasses.replace(get_local_backend().hit(client, limits, cost), local=True)
    return _FAILED_OPEN


def _unidentified() -> Decision | None:
    """Apply ``DJANGO_THROTTLE_UNKNOWN_CLIENT`` to a request with no usable address: the
    decision to return, or ``None`` to count it in the one shared bucket."""
    global _last_unidentified_log
    choice = app_settings.UNKNOWN_CLIENT
    now = time.monotonic()
    if now - _last_unidentified_log >= UNIDENTIFIED_LOG_INTERVAL:
        _last_unidentified_log = now
        logger.error(
            "A request has no usable client address (REMOTE_ADDR is empty or not an IP), so it "
            "cannot be rate limited per client; DJANGO_THROTTLE_UNKNOWN_CLIENT = %r %s. Behind "
            "a proxy that connects over a Unix socket, set DJANGO_THROTTLE_TRUSTED_PROXY_COUNT "
            "so the address comes from X-Forwarded-For. (Logged at most once a minute.)",
            choice,
            {
                "deny": "refuses such requests",
                "allow": "serves them uncounted",
                "shared": "counts them all in one shared bucket",
            }.get(choice, "refuses such requests"),
        )
    if choice == "allow":
        return _FAILED_OPEN
    if choice == "shared":
        return None
    return _UNIDENTIFIED_DENIED


def _outcome(decision: Decision) -> str:
    if decision.unavailable:
        return usage.FAILED_CLOSED
    if decision.failed_open:
        return usage.FAILED_OPEN
    if not decision.allowed:
        return usage.DENIED
    if decision.shadow:
        return usage.SHADOW_DENIED
    return usage.ALLOWED


def _route_name(request: Any) -> str | None:
    match = getattr(request, "resolver_match", None)
    return match.view_name if match is not None else None
