"""What ``bench/load_adaptive.py`` serves and measures: a service that slows down as it gets
busier, the latency of what it served as the server itself measures it, and the load signal
the adaptive controller (``manage.py throttle_adapt``) reads from it.

- :func:`work` (``/adaptive/work/``, ``async def``, under ``@throttle(scope="adaptive")``, so
  the client's tier limits apply): it counts itself into a Redis counter of requests in
  flight in the server (every worker's) and awaits ``BASE * (1 + (n - 1) / CAPACITY)``, ``n``
  the count it found, itself included. A shared resource, like a database that answers more
  slowly the more queries it runs at once: at an arrival rate ``r`` the server holds
  ``n = r T`` requests and serves each in ``T = BASE / (1 - u)``, ``u = r BASE / CAPACITY``;
  beyond ``CAPACITY / BASE`` requests a second (``u >= 1``) the requests in flight, and so
  the latency, grow for as long as the overload lasts, and drain once it ends. It only
  sleeps, so what it measures does not depend on how busy the machine is.
- :class:`LatencyMiddleware`: the time each request under ``/adaptive/`` answered 200 (refused
  ones are fast and would pull the figure down) spent in Django, added to a sorted set in
  Redis (score: when it ended), one ``ZADD`` after the response is made.
- :func:`p95_over_target`: the benchmark's load signal (``throttle_adapt --signal``). The p95
  of the latencies that set holds for the last ``WINDOW`` seconds, divided by ``TARGET_MS``;
  ``None`` (hold) with fewer than ``MIN_SAMPLES``. Each value it returns is appended to a
  Redis list, so the benchmark can plot what the controller saw.

The keys are ``lt-adapt:<LOADTEST_ADAPT_RUN>:…``: each run of the benchmark has its own.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from django_throttle.decorators import throttle

#: A request's service time when it is alone, seconds.
BASE = float(os.environ.get("LOADTEST_ADAPT_BASE_MS", "20")) / 1e3
#: How many requests in flight double it (the service's capacity is CAPACITY / BASE per s).
CAPACITY = float(os.environ.get("LOADTEST_ADAPT_CAPACITY", "1.5"))
#: The latency objective the signal divides by, ms.
TARGET_MS = float(os.environ.get("LOADTEST_ADAPT_TARGET_MS", "150"))
#: Seconds of served requests the signal's p95 covers.
WINDOW = float(os.environ.get("LOADTEST_ADAPT_WINDOW", "1"))
#: Fewer served requests than this in the window: no signal (hold).
MIN_SAMPLES = 5
RUN = os.environ.get("LOADTEST_ADAPT_RUN", "run")
#: The Redis keys of this run: requests in flight, served latencies, signal values.
IN_FLIGHT_KEY = f"lt-adapt:{RUN}:in-flight"
LATENCY_KEY = f"lt-adapt:{RUN}:latency"
SIGNAL_KEY = f"lt-adapt:{RUN}:signal"
#: Seconds the latency set and the signal list live after their last write.
KEEP = 3600

_clients: dict[int, Any] = {}
_sequence = itertools.count()


def async_client() -> Any:
    """A redis-py asyncio client of this worker process and event loop."""
    loop = id(asyncio.get_running_loop())
    if loop not in _clients:
        import redis.asyncio

        _clients[loop] = redis.asyncio.Redis.from_url(settings.REDIS_URL)
    return _clients[loop]


@throttle(scope="adaptive")
async def work(request: HttpRequest) -> JsonResponse:
    """Served in ``BASE * (1 + (n - 1) / CAPACITY)``, ``n`` the requests in flight with it."""
    client = async_client()
    in_flight = int(await client.incr(IN_FLIGHT_KEY))
    try:
        seconds = BASE * (1 + (in_flight - 1) / CAPACITY)
        await asyncio.sleep(seconds)
    finally:
        await client.decr(IN_FLIGHT_KEY)
    return JsonResponse({"served": True, "in_flight": in_flight})


class LatencyMiddleware:
    """Records how long each request under ``/adaptive/`` answered 200 took in Django."""

    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[HttpResponse]]) -> None:
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        began = time.time()
        response = await self.get_response(request)
        if response.status_code == 200 and request.path.startswith("/adaptive/"):
            ended = time.time()
            ms = (ended - began) * 1e3
            member = f"{ended:.6f}:{ms:.3f}:{os.getpid()}:{next(_sequence)}"
            client = async_client()
            await client.zadd(LATENCY_KEY, {member: ended})
            await client.expire(LATENCY_KEY, KEEP)
        return response


def served_latencies(
    client: Any, since: float, until: float = float("inf")
) -> list[tuple[float, float]]:
    """(when it ended, ms) of each request served from ``since`` to ``until`` (Unix s)."""
    upper = "+inf" if until == float("inf") else until
    rows = client.zrangebyscore(LATENCY_KEY, since, upper)
    found = []
    for row in rows:
        ended, ms, *_ = row.decode().split(":")
        found.append((float(ended), float(ms)))
    return found


_signal_client: Any = None


def p95_over_target() -> float | None:
    """The load signal: p95 of the last ``WINDOW`` seconds' served latencies / ``TARGET_MS``."""
    global _signal_client
    if _signal_client is None:
        import redis

        _signal_client = redis.Redis.from_url(settings.REDIS_URL)
    now = time.time()
    latencies = sorted(ms for _, ms in served_latencies(_signal_client, now - WINDOW))
    value = None
    if len(latencies) >= MIN_SAMPLES:
        p95 = latencies[min(len(latencies) - 1, max(0, round(0.95 * len(latencies) + 0.5) - 1))]
        value = p95 / TARGET_MS
    _signal_client.rpush(SIGNAL_KEY, f"{now:.3f}:{'' if value is None else f'{value:.4f}'}")
    _signal_client.expire(SIGNAL_KEY, KEEP)
    return value
