"""Path 5 of ``bench_throttle.py``: what the throttle adds to a whole DRF request.

Django's test client runs the full stack (handler, the headers middleware, URL resolution,
DRF's dispatch, JSON rendering) against two otherwise identical views, one with
``PolicyThrottle`` and one without, request by request in alternating order (ABBA), each
request from its own anonymous address. Added latency = the throttled view's p50 (p99) minus
the plain view's, per repetition; the median over repetitions is reported.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench_meter import percentile
from bench_paths import SCOPE, URLCONF, address


def install_views() -> None:
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

    URLCONF.urlpatterns = [  # type: ignore[attr-defined]
        path("plain/", Plain.as_view(), name="bench-plain"),
        path("throttled/", Throttled.as_view(), name="bench-throttled"),
    ]


def added_latency(pairs: int, repetitions: int) -> dict[str, Any]:
    """Time ``pairs`` requests of each view per repetition, interleaved."""
    from django.test import Client

    install_views()
    client = Client()
    for n in range(50):  # warm-up: URL resolver, DRF settings, the policy snapshot
        client.get("/plain/", REMOTE_ADDR=address(n, 100))
        client.get("/throttled/", REMOTE_ADDR=address(n, 100))
    clock = time.perf_counter_ns
    runs = []
    missing_headers = bad_status = 0
    n = 1000
    for _ in range(repetitions):
        times: dict[str, list[int]] = {"/plain/": [], "/throttled/": []}
        for i in range(pairs):
            order = ("/plain/", "/throttled/") if i % 4 in (0, 3) else ("/throttled/", "/plain/")
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
        plain, throttled = times["/plain/"], times["/throttled/"]
        runs.append(
            {
                "plain_p50_us": percentile(plain, 0.5) / 1e3,
                "plain_p99_us": percentile(plain, 0.99) / 1e3,
                "throttled_p50_us": percentile(throttled, 0.5) / 1e3,
                "throttled_p99_us": percentile(throttled, 0.99) / 1e3,
            }
        )
    result: dict[str, Any] = {
        name: statistics.median(run[name] for run in runs) for name in runs[0]
    }
    result["added_p50_us"] = statistics.median(
        run["throttled_p50_us"] - run["plain_p50_us"] for run in runs
    )
    result["added_p99_us"] = statistics.median(
        run["throttled_p99_us"] - run["plain_p99_us"] for run in runs
    )
    result.update(
        pairs=pairs,
        repetitions=repetitions,
        bad_status=bad_status,
        missing_headers=missing_headers,
    )
    return result
