"""One view of each kind the throttle serves: a sync DRF view, an async ``@throttle`` view,
an adrf view and a slow async view (its client may hang up while it runs), each limited by
the admin rule of the scope in its URL."""

from __future__ import annotations

import asyncio
import os

from adrf.views import APIView as AsyncAPIView
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.decorators import throttle
from django_throttle.drf import AsyncPolicyThrottle

#: Long enough for a body that gzip compresses.
TEXT = "a throttled answer " * 40


class SyncView(APIView):
    def get_throttles(self) -> list:  # type: ignore[type-arg]
        self.throttle_scope = self.kwargs["scope"]
        return super().get_throttles()

    def get(self, request: Request, scope: str) -> Response:
        return Response({"scope": scope, "text": TEXT})


class AdrfView(AsyncAPIView):
    throttle_classes = [AsyncPolicyThrottle]

    def get_throttles(self) -> list:  # type: ignore[type-arg]
        self.throttle_scope = self.kwargs["scope"]
        return super().get_throttles()

    async def get(self, request: Request, scope: str) -> Response:
        seconds = float(request.query_params.get("sleep", "0"))
        if seconds:
            await asyncio.sleep(seconds)
        return Response({"scope": scope})


def _scoped(scope: str):  # type: ignore[no-untyped-def]
    @throttle(scope=scope)
    async def view(request: HttpRequest) -> HttpResponse:
        seconds = float(request.GET.get("sleep", "0"))
        if seconds:
            await asyncio.sleep(seconds)
        return JsonResponse({"scope": scope, "text": TEXT})

    return view


#: An ``@throttle`` async view per scope (the decorator takes its scope when applied).
SCOPES = ("tb", "swl", "fw", "retry-tb", "retry-swl", "retry-fw", "slow", "slow-ok", "edit", "down")
ASYNC_VIEWS = {scope: _scoped(scope) for scope in SCOPES}


async def async_view(request: HttpRequest, scope: str) -> HttpResponse:
    return await ASYNC_VIEWS[scope](request)


def served_by(get_response):  # type: ignore[no-untyped-def]
    """Names the worker process that answered (``X-Served-By``), sync and async."""
    from asgiref.sync import iscoroutinefunction, markcoroutinefunction

    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> HttpResponse:
            response = await get_response(request)
            response["X-Served-By"] = str(os.getpid())
            return response

        markcoroutinefunction(middleware)
        return middleware

    def sync_middleware(request: HttpRequest) -> HttpResponse:
        response = get_response(request)
        response["X-Served-By"] = str(os.getpid())
        return response

    return sync_middleware


served_by.sync_capable = True  # type: ignore[attr-defined]
served_by.async_capable = True  # type: ignore[attr-defined]
