"""A trivial DRF JSON view (everything measured is framework and throttle), a slow one that
``bench/load_concurrency.py`` and ``bench/load_shedding.py`` set beside it (the latter beside
the same trivial view as ``checkout``), and the two ``async def`` views
``bench/load_delay.py`` compares: the same GCRA limit, refusing or delaying."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.decorators import throttle
from loadproject import IN_FLIGHT_KEY


class PingView(APIView):
    """Anonymous, no permissions; the throttle comes from ``DEFAULT_THROTTLE_CLASSES``."""

    def get(self, request: Request) -> Response:
        return Response({"pong": True})


class CheckoutView(PingView):
    """The ping under its own scope, ``checkout``: the critical endpoint of
    ``bench/load_shedding.py`` (an endpoint rule marks it so)."""

    throttle_scope = "checkout"


_counter: Any = None


def _in_flight_counter() -> Any:
    """A redis-py client of this worker process (made after the fork, on first use)."""
    global _counter
    if _counter is None:
        import redis

        _counter = redis.Redis.from_url(settings.REDIS_URL)
    return _counter


class ExportView(APIView):
    """A slow endpoint, like an export: sleeps ``LOADTEST_SLOW_SECONDS`` while holding its
    worker. Counts itself in and out of ``IN_FLIGHT_KEY``, inside the throttle, so the
    count is the workers it holds (never more than the slots it was given)."""

    throttle_scope = "export"

    def get(self, request: Request) -> Response:
        counter = _in_flight_counter()
        counter.incr(IN_FLIGHT_KEY)
        try:
            time.sleep(settings.LOADTEST_SLOW_SECONDS)
        finally:
            counter.decr(IN_FLIGHT_KEY)
        return Response({"exported": True})


#: The limit both views of ``load_delay.py`` count, per client address; only ``delay`` differs.
BURST_LIMIT: dict[str, Any] = {
    "rate": settings.LOADTEST_BURST_RATE,
    "algorithm": "gcra",
    "burst": settings.LOADTEST_BURST,
}


@throttle(**BURST_LIMIT)
async def burst_reject(request: HttpRequest) -> JsonResponse:
    """Refuses what comes beyond the burst (429)."""
    return JsonResponse({"served": True})


@throttle(**BURST_LIMIT, delay=settings.LOADTEST_DELAY, max_wait=settings.LOADTEST_MAX_WAIT)
async def burst_delay(request: HttpRequest) -> JsonResponse:
    """The same limit, holding back what comes beyond ``delay + 1`` at once until its turn
    (awaited: no thread held while it waits)."""
    return JsonResponse({"served": True})
