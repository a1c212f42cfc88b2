"""What a decision costs on the memory backend, next to the Redis backend and a PING.

One process, one run, interleaved laps: ``MemoryBackend.hit()`` and ``RedisBackend.hit()``
(a private ``redis-server``) with the same two limits (a token bucket and a sliding window
counter, as a tier and an endpoint rule give) and usage counting on, over 500 distinct
clients; and redis-py's ``PING`` on that server, the floor of any Redis call. Printed: µs per
call of each, per lap, and the medians of the per-lap ratios.

    .venv/bin/python bench/bench_memory.py [--laps 7] [--calls 3000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--laps", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()

    import django
    from django.conf import settings

    from example_project.private_redis import PrivateRedis

    server = PrivateRedis().start()
    settings.configure(DJANGO_THROTTLE_REDIS_URL=server.url, USE_TZ=True)
    django.setup()
    import redis

    from django_throttle.backends.memory import MemoryBackend
    from django_throttle.backends.redis import RedisBackend
    from django_throttle.rates import Algorithm, Limit

    limits = (
        Limit.build("tier", "1000/s", burst=1000),
        Limit.build("rule", "100000/h", algorithm=Algorithm.SLIDING_COUNTER),
    )
    clients = [f"user:{i}" for i in range(500)]
    memory, on_redis = MemoryBackend(), RedisBackend()
    ping = redis.Redis.from_url(server.url)

    def lap(call: object) -> float:
        start = time.perf_counter_ns()
        for i in range(args.calls):
            call(clients[i % 500])  # type: ignore[operator]
        return (time.perf_counter_ns() - start) / args.calls / 1e3

    try:
        runs: dict[str, list[float]] = {"memory": [], "redis": [], "ping": []}
        calls = {
            "memory": lambda client: memory.hit(client, limits, usage="free|search"),
            "redis": lambda client: on_redis.hit(client, limits, usage="free|search"),
            "ping": lambda client: ping.execute_command("PING"),
        }
        for call in calls.values():  # warm-up: scripts loaded, connections made
            lap(call)
        for _ in range(args.laps):
            for name, call in calls.items():
                runs[name].append(lap(call))
    finally:
        on_redis.close()
        ping.close()
        server.stop()
    for name, laps in runs.items():
        print(f"µs per call, {name + ':':8}", ", ".join(f"{value:.1f}" for value in laps))

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    pairs = list(zip(runs["memory"], runs["redis"], runs["ping"], strict=True))
    print(f"memory ÷ redis hit(), median of laps: {median([m / r for m, r, _ in pairs]):.2f}")
    print(f"memory ÷ PING, median of laps:        {median([m / p for m, _, p in pairs]):.2f}")
    print(f"redis hit() ÷ PING, median of laps:   {median([r / p for _, r, p in pairs]):.2f}")


if __name__ == "__main__":
    main()
