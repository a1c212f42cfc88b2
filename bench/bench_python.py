"""The Python of one full DRF decision, with no Redis at all: what the library itself costs.

``PolicyThrottle().allow_request`` plus the response headers, on prebuilt DRF requests from
distinct anonymous addresses, against a backend that answers at once (a ``MemoryBackend``
whose ``hit`` returns a fixed decision). Everything else is real: settings, the compiled
policy (one tier, one limit, from an in-memory SQLite database), identity, usage field,
headers. Each of five laps is followed by as many ``PING`` round trips on a plain redis-py
client to a private ``redis-server`` (the floor every benchmark here reports), so the Python
cost reads as a share of one round trip in the same run. ``--profile`` adds a cProfile top 22.

    .venv/bin/python bench/bench_python.py [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _instant_backend() -> type:
    from django_throttle.backends.base import decision_from
    from django_throttle.backends.memory import MemoryBackend

    class Instant(MemoryBackend):
        """Answers at once: allowed, 999 left, full in an hour."""

        def hit(self, client: str, limits: Any, cost: int = 1, **kwargs: Any) -> Any:
            return decision_from(limits, True, 0, 999, 3600e6, 0, False)

    return Instant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="cProfile one lap, top 22")
    args = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()
    sys.modules[__name__].Instant = _instant_backend()  # type: ignore[attr-defined]
    from django_throttle import conf

    conf.REDIS_BACKEND = f"{__name__}.Instant"  # what the Redis URL counts on, in this run
    conf.app_settings.reload()
    from django.core.management import call_command
    from django.http import HttpResponse
    from rest_framework.request import Request
    from rest_framework.test import APIRequestFactory
    from rest_framework.views import APIView

    from django_throttle.drf import PolicyThrottle
    from django_throttle.models import Tier, TierLimit
    from django_throttle.request.core import add_headers

    call_command("migrate", verbosity=0)
    tier = Tier.objects.create(slug="anon", name="anon", is_default_anonymous=True)
    TierLimit.objects.create(tier=tier, rate="1000/hour")

    class View(APIView):
        throttle_scope = "api"

    view, factory = View(), APIRequestFactory()
    items = []
    for i in range(17_000):
        address = f"10.{i >> 16}.{i >> 8 & 255}.{i & 255}"
        request = Request(factory.get("/api/x/", REMOTE_ADDR=address))
        request.user  # noqa: B018 - authenticate now, as DRF has before throttling
        items.append((request, HttpResponse()))

    def run(batch: list[Any]) -> None:
        for request, response in batch:
            PolicyThrottle().allow_request(request, view)
            add_headers(response.headers, request._request.throttle_decision)

    import redis

    from example_project.private_redis import PrivateRedis

    server = PrivateRedis().start()
    try:
        client = redis.Redis.from_url(server.url)
        client.ping()
        run(items[:2000])  # warm-up: the policy snapshot, caches
        laps, pings = [], []
        for lap in range(5):
            batch = items[2000 + lap * 3000 : 5000 + lap * 3000]
            start = time.perf_counter_ns()
            run(batch)
            laps.append((time.perf_counter_ns() - start) / len(batch) / 1e3)
            start = time.perf_counter_ns()
            for _ in batch:
                client.execute_command("PING")
            pings.append((time.perf_counter_ns() - start) / len(batch) / 1e3)
        client.close()
    finally:
        server.stop()
    print("µs per decision, no Redis:", ", ".join(f"{lap:.1f}" for lap in laps))
    print("µs per PING (redis-py):  ", ", ".join(f"{ping:.1f}" for ping in pings))
    shares = sorted(lap / ping for lap, ping in zip(laps, pings, strict=True))
    print(f"decision ÷ PING, median of laps: {shares[len(shares) // 2]:.2f}")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        run(items[:2000])
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
