"""The one path every adapter calls: identity → policy → one backend call → decision.

No DRF and no responses here; adapters turn the :class:`~django_throttle.rates.Decision` into
headers or a 429. A backend failure becomes the configured failure mode, never an exception.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from django_throttle import policy as policy_module
from django_throttle import usage
from django_throttle.backends import BackendError, get_backend
from django_throttle.conf import app_settings
from django_throttle.identity import get_resolver
from django_throttle.rates import UNLIMITED, Decision, Limit

logger = logging.getLogger("django_throttle")

__all__ = ["check"]


def check(
    request: Any,
    *,
    scope: str | None = None,
    limits: Sequence[Limit] | None = None,
    cost: int | None = None,
) -> Decision:
    """Count ``request`` against its limits and say whether it may proceed.

    Without ``limits``, the admin policy decides: the client's tier limits plus those of the
    endpoint rule matching ``scope``, the URL route name or the path. With ``limits`` (a
    decorator's inline rate), exactly those apply. Adapters leave the decision on the Django
    request as ``request.throttle_decision`` for the headers middleware.
    """
    if not app_settings.ENABLED:
        return UNLIMITED
    identity = get_resolver()(request)
    tier_slug = endpoint_name = ""
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
    decision = _hit(client, limits, 1 if cost is None else cost)
    if decision.shadow:
        logger.info("shadow rule %r would deny %s", endpoint_name, client)
    # A shadow would-deny counts as denied in the usage report: that is what it would do.
    allowed = decision.allowed and not decision.shadow
    usage.record(client, tier_slug, endpoint_name or scope or "", allowed)
    return decision


def _hit(client: str, limits: Sequence[Limit], cost: int) -> Decision:
    try:
        return get_backend().hit(client, limits, cost)
    except BackendError as exc:
        mode = app_settings.FAILURE_MODE
        logger.error("throttle backend failed (failure mode %s): %s", mode, exc)
        if mode == "closed":
            return Decision(False, limits[0], 0, 1.0, retry_after=1.0, limits=tuple(limits))
        return dataclasses.replace(UNLIMITED, failed_open=True)


def _route_name(request: Any) -> str | None:
    match = getattr(request, "resolver_match", None)
    return match.view_name if match is not None else None
