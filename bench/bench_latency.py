"""Path 5 of ``bench_throttle.py``: what the throttle adds to a whole DRF request.

Django's test client runs the full stack (handler, the headers middleware, URL resolution,
DRF's dispatch, JSON rendering) against three otherwise identical views: one with
``PolicyThrottle``, one without, and one without that sends a single ``PING`` on a plain
redis-py client to the same Redis (the floor: what one round trip costs inside a request,
for any throttle that asks Redis). Requests go view by view in rotating order, each request
from its own anonymous address. Added latency = a view's p50 (p99) minus the plain view's,
per repetition; the median over repetitions is reported, and ``above_ping_*`` is the
throttle's added latency minus the PING view's (what the throttle costs beyond the round
trip it cannot avoid).

On a virtual machine whose Redis runs on another virtual CPU, a round trip after a few
hundred microseconds of other work costs far more than one in a tight loop (the idle CPU
must be woken): the PING view shows how much, in the same run.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench_meter import percentile
from bench_paths import SCOPE, URLCONF, address


def install_views(redis_url: str | None = None) -> None:
    import redis
    from django.conf import settings
    from django.urls import path
    from rest_framework.permissions import AllowAny
    from rest_framework.renderers import JSONRenderer
    from rest_framework.response import Response
    from rest_framework.views import APIView

    from django_throttle.drf import PolicyThrottle

    class Plain(APIView):
        authentication_classes: list[Any] = []
        permission_classes = [AllowAny]
        renderer_classes = [JSONRenderer]
        throttle_classes: list[Any] = []
        throttle_scope = SCOPE

        def get(self, request: Any) -> Response:
            return Response({"ok": True})

    class Throttled(Plain):
        throttle_classes = [PolicyThrottle]

    floor = redis.Redis.from_url(redis_url or settings.DJANGO_THROTTLE_REDIS_URL)

    class Pinged(Plain):
        def get(self, request: Any) -> Response:
            floor.execute_command("PING")
            return Response({"ok": True})

    URLCONF.urlpatterns = [  # type: ignore[attr-defined]
        path("plain/", Plain.as_view(), name="bench-plain"),
        path("throttled/", Throttled.as_view(), name="bench-throttled"),
        path("ping/", Pinged.as_view(), name="bench-ping"),
    ]


VIEWS = ("/plain/", "/throttled/", "/ping/")


def added_latency(pairs: int, repetitions: int) -> dict[str, Any]:
    """Time ``pairs`` requests of each view per repetition, interleaved."""
    from django.test import Client

    install_views()
    client = Client()
    for n in range(50):  # warm-up: URL resolver, DRF settings, the policy snapshot
        for url in VIEWS:
            client.get(url, REMOTE_ADDR=address(n, 100))
    clock = time.perf_counter_ns
    runs = []
    missing_headers = bad_status = 0
    n = 1000
    for _ in range(repetitions):
        times: dict[str, list[int]] = {url: [] for url in VIEWS}
        for i in range(pairs):
            turn = i % len(VIEWS)
            order = VIEWS[turn:] + VIEWS[:turn]
            if i % 2:
                order = order[::-1]
            n += 1
            remote = address(n, 100)
            for url in order:
                start = clock()
                response = client.get(url, REMOTE_ADDR=remote)
                times[url].append(clock() - start)
                if response.status_code != 200:
                    bad_status += 1
                elif url == "/throttled/" and "X-RateLimit-Limit" not in response:
                    missing_headers += 1
        run = {}
        for url, name in zip(VIEWS, ("plain", "throttled", "ping"), strict=True):
            run[f"{name}_p50_us"] = percentile(times[url], 0.5) / 1e3
            run[f"{name}_p99_us"] = percentile(times[url], 0.99) / 1e3
        for q in ("p50", "p99"):
            run[f"added_{q}_us"] = run[f"throttled_{q}_us"] - run[f"plain_{q}_us"]
            run[f"ping_added_{q}_us"] = run[f"ping_{q}_us"] - run[f"plain_{q}_us"]
            run[f"above_ping_{q}_us"] = run[f"throttled_{q}_us"] - run[f"ping_{q}_us"]
        runs.append(run)
    result: dict[str, Any] = {
        name: statistics.median(run[name] for run in runs) for name in runs[0]
    }
    result.update(
        pairs=pairs,
        repetitions=repetitions,
        bad_status=bad_status,
        missing_headers=missing_headers,
    )
    return result
