"""Turn a decision into response headers and the 429 response.

``X-RateLimit-Limit`` is the reported limit's capacity, ``-Remaining`` whole tokens left,
``-Reset`` whole seconds until that limit is full again. With ``DJANGO_THROTTLE_IETF_HEADERS``
the IETF ``RateLimit`` / ``RateLimit-Policy`` fields (draft-ietf-httpapi-ratelimit-headers)
are added: ``q`` is a limit's capacity and ``w`` the seconds its bucket takes to refill.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponseBase, JsonResponse

from django_throttle.conf import app_settings
from django_throttle.rates import Decision, whole_seconds

__all__ = ["apply_headers", "rate_limit_headers", "throttled_body", "throttled_response"]


def rate_limit_headers(decision: Decision) -> dict[str, str]:
    """Every header the decision implies (empty when no limit applied)."""
    limit = decision.limit
    if limit is None:
        return {}
    reset = decision.reset_header
    headers = {
        "X-RateLimit-Limit": str(limit.capacity),
        "X-RateLimit-Remaining": str(decision.remaining),
        "X-RateLimit-Reset": str(reset),
    }
    if not decision.allowed:
        headers["Retry-After"] = str(decision.retry_after_header)
    if app_settings.IETF_HEADERS:
        headers["RateLimit-Policy"] = ", ".join(
            f'"{item.id}";q={item.capacity};w={whole_seconds(item.window)}'
            for item in decision.limits or (limit,)
        )
        headers["RateLimit"] = f'"{limit.id}";r={decision.remaining};t={reset}'
    return headers


def apply_headers(response: HttpResponseBase, decision: Decision) -> None:
    """Add the decision's headers to ``response`` without overwriting ones already set."""
    for name, value in rate_limit_headers(decision).items():
        if name not in response:
            response[name] = value


def throttled_body(decision: Decision) -> dict[str, Any]:
    """The JSON body of a 429: what was exceeded and when to retry."""
    wait = decision.retry_after_header
    return {
        "detail": f"Request was throttled. Expected available in {wait} second"
        f"{'' if wait == 1 else 's'}.",
        "limit": decision.limit.name if decision.limit is not None else None,
        "retry_after": wait,
    }


def throttled_response(decision: Decision) -> JsonResponse:
    """HTTP 429 with ``Retry-After``, the rate-limit headers and a small JSON body."""
    response = JsonResponse(throttled_body(decision), status=429)
    apply_headers(response, decision)
    return response
