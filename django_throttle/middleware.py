"""Adds ``X-RateLimit-*`` headers to responses whose request was checked by a throttle, and
settles the counting policy of DRF views.

DRF throttle classes cannot touch responses, so :class:`~django_throttle.drf.PolicyThrottle`
leaves its decision on the request and this middleware writes the headers; a rule that counts
only successes or failures also leaves a reservation, which this middleware gives back once
the response shows an outcome the rule does not count (without the middleware every request
counts). Works in sync and async stacks; a request without a reservation costs one attribute
lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from django_throttle.request import core
from django_throttle.request.headers import rate_limit_headers

__all__ = ["RateLimitHeadersMiddleware"]


class RateLimitHeadersMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        response = self.get_response(request)
        if getattr(request, "throttle_reservations", None):
            core.settle(request, response.status_code)
        decision = getattr(request, "throttle_decision", None)
        if decision is not None:  # apply_headers, inline on the sync path
            setdefault = response.headers.setdefault
            for name, value in rate_limit_headers(decision).items():
                setdefault(name, value)
        return response

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        response = await self.get_response(request)
        if getattr(request, "throttle_reservations", None):
            await core.asettle(request, response.status_code)
        return self._finish(request, response)

    @staticmethod
    def _finish(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        decision = getattr(request, "throttle_decision", None)
        if decision is not None:  # apply_headers, inline on the sync path
            setdefault = response.headers.setdefault
            for name, value in rate_limit_headers(decision).items():
                setdefault(name, value)
        return response
