"""N concurrent requests against a limit of 10: how many does each throttle admit?

Run from the repository root::

    .venv/bin/python bench/race.py [--requests 40] [--rounds 5]

Starts a private ``redis-server`` and stops it at the end. With ``REDIS_URL`` it uses that
Redis instead, but only under a random key prefix, and at the end deletes exactly the keys under
that prefix (``SCAN MATCH``): it never flushes, or touches a key of, a Redis it did not start.

Then it fires ``--requests`` requests of one user at once from as many threads, released
together by a barrier, through (a) ``PolicyThrottle`` with a tier limit of 10/min and (b) DRF's
``UserRateThrottle`` at ``10/min`` on a django-redis cache. A correct limiter admits exactly 10.
DRF reads the request history, decides, then writes it back in a second step, so requests
that read before any write all see an empty history.
"""

from __future__ import annotations

import argparse
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT, ROOT / "bench"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

LIMIT = 10


def race(allow: Callable[[Any], bool], requests: list[Any]) -> int:
    """Release one request per thread at the same instant; count the admitted ones."""
    barrier = threading.Barrier(len(requests))
    admitted: list[bool] = []

    def fire(request: Any) -> None:
        barrier.wait()
        try:
            admitted.append(allow(request))
        except Exception:  # PolicyThrottle raises Throttled (a 429) on denial
            admitted.append(False)

    threads = [threading.Thread(target=fire, args=(r,)) for r in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(admitted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args(argv)

    import os
    import tempfile

    from example_project.private_redis import PrivateRedis

    workdir = tempfile.TemporaryDirectory(prefix="django-throttle-race-")

    private = None if os.environ.get("REDIS_URL") else PrivateRedis().start()
    url = os.environ.get("REDIS_URL") or private.url  # type: ignore[union-attr]
    prefix = f"dtrace{uuid.uuid4().hex[:8]}"
    try:
        from bench_throttle import configure_django

        # A file, not ":memory:": every racing thread opens its own connection.
        configure_django(
            url,
            prefix,
            database=os.path.join(workdir.name, "race.sqlite3"),
            drf_rate=f"{LIMIT}/min",
            count_usage=False,
        )
        from django.contrib.auth import get_user_model
        from django.core.management import call_command
        from rest_framework.request import Request
        from rest_framework.test import APIRequestFactory
        from rest_framework.throttling import UserRateThrottle

        from django_throttle.drf import PolicyThrottle
        from django_throttle.models import Tier, TierLimit

        call_command("migrate", verbosity=0)
        tier = Tier.objects.create(slug="race", name="Race", is_default_authenticated=True)
        TierLimit.objects.create(tier=tier, rate=f"{LIMIT}/m")
        factory = APIRequestFactory()
        print(f"{options.requests} concurrent requests of one user against a limit of {LIMIT}:")
        for round_no in range(1, options.rounds + 1):
            user = get_user_model().objects.create_user(f"racer{round_no}")
            requests = []
            for _ in range(options.requests):
                request = Request(factory.get("/race/"))
                request.user = user
                requests.append(request)
            ours = race(lambda r: PolicyThrottle().allow_request(r, view=None), requests)
            drf = race(lambda r: UserRateThrottle().allow_request(r, view=None), requests)
            print(
                f"  round {round_no}: PolicyThrottle admitted {ours:3d}   "
                f"DRF UserRateThrottle admitted {drf:3d}"
            )
    finally:
        workdir.cleanup()
        if private is not None:
            private.stop()
        else:
            delete_own_keys(url, prefix)
    return 0


def delete_own_keys(url: str, prefix: str) -> int:
    """Delete this run's keys, and only those, from a Redis we did not start.

    Every key the run writes starts with ``prefix`` (the throttle's ``KEY_PREFIX`` and the DRF
    cache's ``<prefix>-cache``). Never ``FLUSHDB``: that Redis may hold someone else's data.
    """
    import redis

    client = redis.Redis.from_url(url)
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += client.delete(*batch)
                batch.clear()
        if batch:
            deleted += client.delete(*batch)
    finally:
        client.close()
    return deleted


if __name__ == "__main__":
    raise SystemExit(main())
