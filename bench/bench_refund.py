"""What a refund costs Redis next to the hit it undoes.

Starts its own redis-server, then runs 20,000 ``hit()`` calls and 20,000 ``refund()`` calls of
a token bucket and a GCRA limit (distinct clients) twice each, and prints the script's server
time per call from ``INFO commandstats`` (``usec_per_call`` of ``evalsha``) and the client's
wall time per call. Run: ``.venv/bin/python bench/bench_refund.py``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

CALLS = 20_000


def main() -> None:
    from example_project.private_redis import PrivateRedis

    server = PrivateRedis().start()
    try:
        import django

        django.setup()
        import redis
        from django.conf import settings

        settings.DJANGO_THROTTLE_REDIS_URL = server.url
        from django_throttle.backends.redis import RedisBackend
        from django_throttle.rates import Limit

        client = redis.Redis.from_url(server.url)
        limits = (Limit.build("a", "100/m"), Limit.build("b", "1000/h", algorithm="gcra"))
        backend = RedisBackend()

        def run(label: str, call: Callable[[str], object]) -> None:
            client.config_resetstat()
            started = time.perf_counter()
            for i in range(CALLS):
                call(f"ip:10.0.{i >> 8 & 255}.{i & 255}")
            wall = (time.perf_counter() - started) / CALLS * 1e6
            stats = client.info("commandstats").get("cmdstat_fcall", {})
            print(f"{label}: script {stats.get('usec_per_call')} µs/call, wall {wall:.1f} µs/call")

        for _ in range(2):
            run("hit (2 limits)   ", lambda c: backend.hit(c, limits))
            run("refund (2 limits)", lambda c: backend.refund(c, limits))
        backend.close()
        client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
