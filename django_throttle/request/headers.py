"""Turn a decision into response headers and the 429 / 503 response.

``X-RateLimit-Limit`` is the reported limit's capacity, ``-Remaining`` whole tokens left,
``-Reset`` whole seconds until that limit is full again. They describe enforced limits only: a
shadow rule's limits are counted and logged, never advertised. With
``DJANGO_THROTTLE_IETF_HEADERS`` the IETF ``RateLimit`` / ``RateLimit-Policy`` fields
(draft-ietf-httpapi-ratelimit-headers) are added: ``q`` is a limit's capacity and ``w`` the
seconds its bucket takes to refill. ``X-RateLimit-Degraded`` says the backend could not answer
and the failure mode decided: ``open`` (served uncounted) or ``local`` (counted per process).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.http import HttpResponseBase, JsonResponse
from django.utils.cache import patch_vary_headers
from django.utils.translation import gettext, ngettext

from django_throttle.conf import FAILURE_STATUS, app_settings
from django_throttle.policy import live
from django_throttle.rates import Decision, Limit
from django_throttle.request.pages import throttled_page, wants_html

logger = logging.getLogger("django_throttle")


def whole_seconds(seconds: float) -> int:
    """Round up to whole seconds, forgiving nothing: backends report waits free of float
    noise (an exact 3600 s arrives as 3600.0 s), so waiting the rounded value is never short."""
    return max(0, math.ceil(seconds))


def retry_after_seconds(seconds: float) -> int:
    """``Retry-After`` in whole seconds: rounded up with no tolerance (a retry after it must
    succeed, so it is never short, not even by a microsecond), and at least 1."""
    return max(1, whole_seconds(seconds))


#: Says the backend could not answer and the failure mode decided (see the module docstring).
DEGRADED_HEADER = "X-RateLimit-Degraded"


def degraded_mode(decision: Decision) -> str | None:
    """The failure mode that decided (``open``: served uncounted; ``local``: counted per
    process), or ``None`` when the backend answered."""
    if decision.failed_open:
        return "open"
    return "local" if decision.local else None


def rate_limit_headers(decision: Decision) -> dict[str, str]:
    """Every header the decision implies (empty when no enforced limit applied)."""
    headers: dict[str, str] = {}
    if decision.failed_open or decision.local:
        headers[DEGRADED_HEADER] = "open" if decision.failed_open else "local"  # degraded_mode
    if decision.unavailable:
        if not decision.unidentified:
            headers["Retry-After"] = str(retry_after_seconds(decision.retry_after))
        return headers
    limit = decision.limit
    if limit is None or limit.shadow:
        return headers
    if limit.shared:
        limit = _as_met(limit)
    reset = max(0, math.ceil(decision.reset_after))  # whole_seconds
    headers["X-RateLimit-Limit"] = str(limit.capacity)
    headers["X-RateLimit-Remaining"] = str(decision.remaining)
    headers["X-RateLimit-Reset"] = str(reset)
    if not decision.allowed:
        headers["Retry-After"] = str(retry_after_seconds(decision.retry_after))
    if app_settings.IETF_HEADERS:
        enforced = [_as_met(item) for item in decision.limits if not item.shadow] or [limit]
        headers["RateLimit-Policy"] = ", ".join(
            f'"{item.id}";q={item.capacity};w={whole_seconds(item.window)}' for item in enforced
        )
        headers["RateLimit"] = f'"{limit.id}";r={decision.remaining};t={reset}'
    return headers


def _as_met(limit: Limit) -> Limit:
    """``limit`` as the client meets it: a shared limit's shard's share (the remaining count
    is of that share, so the capacity shown must be too). Worked out once per limit and
    policy version, in the snapshot's store (a change of ``KEY_SHARDS`` drops the snapshot)."""
    if not limit.shared:
        return limit
    policy = live.last()
    store: dict[Any, Any] = policy.compiled if policy is not None else {}
    met: Limit | None = store.get(("shared", limit))
    if met is None:
        from django_throttle.backends.base import per_shard

        met = store["shared", limit] = per_shard(limit, app_settings.KEY_SHARDS)
    return met


def apply_headers(response: HttpResponseBase, decision: Decision) -> None:
    """Add the decision's headers to ``response`` without overwriting ones already set, through
    Django's public ``response.headers`` (``setdefault`` validates each name and value)."""
    setdefault = response.headers.setdefault
    for name, value in rate_limit_headers(decision).items():
        setdefault(name, value)


def throttled_status(decision: Decision) -> int:
    """429 for a limit the client exceeded; 503 (``conf.FAILURE_STATUS``)
    when the limiter itself could not decide: that is not the client's fault."""
    return FAILURE_STATUS if decision.unavailable else 429


def throttled_body(decision: Decision) -> dict[str, Any]:
    """The JSON body of a refusal: what was exceeded (or why nothing could be decided) and
    when to retry."""
    if decision.unidentified:
        return {
            "detail": gettext(
                "The server could not determine the client address, so the request cannot "
                "be rate limited and was refused. This is a server configuration problem."
            ),
            "limit": None,
            "retry_after": None,
        }
    wait = retry_after_seconds(decision.retry_after)
    limit = None
    if decision.unavailable:
        detail = ngettext(
            "Rate limiting is temporarily unavailable. Try again in %(wait)d second.",
            "Rate limiting is temporarily unavailable. Try again in %(wait)d seconds.",
            wait,
        )
    else:
        detail = ngettext(
            "Request was throttled. Expected available in %(wait)d second.",
            "Request was throttled. Expected available in %(wait)d seconds.",
            wait,
        )
        limit = decision.limit.name if decision.limit is not None else None
    return {"detail": detail % {"wait": wait}, "limit": limit, "retry_after": wait}


#: How DRF's ``JSONRenderer`` writes JSON by default (``COMPACT_JSON``, ``UNICODE_JSON``): plain
#: views send a 429 body byte for byte like a DRF view's.
DRF_JSON: dict[str, Any] = {"separators": (",", ":"), "ensure_ascii": False}


def throttled_response(decision: Decision, request: Any = None) -> HttpResponseBase:
    """The refusal: 429 (or the failure status) with ``Retry-After`` and the rate-limit
    headers; its body a small JSON object, or, for a request whose ``Accept`` prefers
    ``text/html`` (a browser), a page saying the same in words
    (:mod:`~django_throttle.request.pages`), with ``Vary: Accept`` on both. What
    ``DJANGO_THROTTLE_DENIED_RESPONSE`` builds wins, with the same headers added where it did
    not set them. A callable or template that fails is logged and the JSON response is sent
    instead: a refusal must never become a 500."""
    factory = app_settings.DENIED_RESPONSE
    response = None if factory is None else _custom_response(factory, request, decision)
    if response is None:
        response = _default_response(decision, request)
    apply_headers(response, decision)
    return response


def _default_response(decision: Decision, request: Any) -> HttpResponseBase:
    status = throttled_status(decision)
    response: HttpResponseBase | None = None
    if wants_html(request):
        wait = None if decision.unidentified else retry_after_seconds(decision.retry_after)
        response = throttled_page(request, decision, status, wait)
    if response is None:
        response = JsonResponse(throttled_body(decision), status=status, json_dumps_params=DRF_JSON)
    patch_vary_headers(response, ("Accept",))
    return response


def _custom_response(path: str, request: Any, decision: Decision) -> HttpResponseBase | None:
    from django.utils.module_loading import import_string

    try:
        response = import_string(path)(request, decision)
        if not isinstance(response, HttpResponseBase):
            raise TypeError(f"it returned {type(response).__name__!r}, not an HttpResponse")
    except Exception:
        logger.exception("DJANGO_THROTTLE_DENIED_RESPONSE %s failed; sending the default", path)
        return None
    return response
