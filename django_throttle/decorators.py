"""``@throttle`` for plain Django views, sync and async; a thin wrapper over :func:`core.check`.

``@throttle(scope="login")`` applies the admin rules for that scope (plus the client's tier
limits); ``@throttle(rate="5/min")`` an inline limit keyed by client identity, shared by every
view that uses the same ``scope`` (or private to the view when no scope is given). Class-based
views take it through ``method_decorator``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async

from django_throttle import core
from django_throttle.headers import apply_headers, throttled_response
from django_throttle.rates import Limit, Rate

__all__ = ["throttle"]

View = TypeVar("View", bound=Callable[..., Any])


def throttle(
    scope: str | None = None,
    rate: str | None = None,
    burst: int | None = None,
    cost: int | None = None,
) -> Callable[[View], View]:
    """Limit a view; a denied request gets 429 with ``Retry-After`` and a JSON body.

    ``rate`` is parsed here, so a bad rate fails at import time with a message saying what is
    wrong, not on the first request.
    """
    if scope is None and rate is None:
        raise TypeError("throttle() needs scope='…' (admin rules) or rate='…' (inline limit)")
    if cost is not None and cost < 1:
        raise ValueError(f"throttle(cost={cost}): cost must be at least 1")
    parsed = Rate.parse(rate) if rate is not None else None

    def decorator(view: View) -> View:
        limits: tuple[Limit, ...] | None = None
        if parsed is not None:
            owner = scope or f"{view.__module__}.{view.__qualname__}"
            digest = hashlib.blake2b(f"{owner}|{parsed}|{burst}".encode(), digest_size=6)
            limits = (Limit.build(f"i{digest.hexdigest()}", parsed, burst, name=owner),)

        def run_check(request: Any) -> Any:
            return core.check(request, scope=scope, limits=limits, cost=cost)

        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
                decision = await sync_to_async(run_check)(request)
                request.throttle_decision = decision
                if not decision.allowed:
                    return throttled_response(decision)
                response = await view(request, *args, **kwargs)
                apply_headers(response, decision)
                return response

            return markcoroutinefunction(async_wrapper)  # type: ignore[return-value]

        @functools.wraps(view)
        def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            decision = run_check(request)
            request.throttle_decision = decision
            if not decision.allowed:
                return throttled_response(decision)
            response = view(request, *args, **kwargs)
            apply_headers(response, decision)
            return response

        return wrapper  # type: ignore[return-value]

    return decorator
