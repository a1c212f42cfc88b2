"""What it takes to flush a spent login counter out of the local fallback's bounded store.

The fallback of failure mode ``"local"`` (and of every credential check while Redis is down)
is a ``MemoryBackend`` bounded to ``--keys`` keys. A victim's username counter (3/h) is
spent; the attacker then sends failed logins, each from a fresh address (a tier limit of
1000/min and a rule limit of 100/min by IP address) and counts requests until the victim's
counter is gone (a right password would pass). Two attacks, each under the old eviction
(least recently used: ``EVICTION_CANDIDATES = 1``) and the shipped one:

- ``rotate``: a fresh username per request (each a counter one failure started);
- ``spend``: 16 fresh usernames spent whole (3 failures each) right after the victim's last
  guess, then the same rotation (keys by address alone expire within a second: they never
  fill the store).

One request is 1 ms of the store's clock. Printed: requests until the counter was forgotten
(or ``kept`` after ``--cap`` times ``--keys`` requests) and µs per request.

    .venv/bin/python bench/bench_fallback_eviction.py [--keys 100000] [--cap 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--cap", type=int, default=3)
    args = parser.parse_args()

    import django
    from django.conf import settings

    settings.configure(USE_TZ=True)
    django.setup()
    from django_throttle.backends import memory
    from django_throttle.rates import Limit

    tier, by_ip = Limit.build("tier", "1000/min"), Limit.build("ip", "100/min")
    by_name = Limit.build("name", "3/h")

    def attack(candidates: int, kind: str) -> tuple[str, float]:
        memory.EVICTION_CANDIDATES = candidates
        now = [1_700_000_000.0]
        backend = memory.MemoryBackend(clock=lambda: now[0], max_entries=args.keys)
        fresh = iter(range(10**9))

        def request(name: str | None) -> None:
            now[0] += 0.001
            backend.hit(f"ip:{next(fresh)}", [tier, by_ip])
            if name is not None:
                backend.hit(f"user:{name}", [by_name])

        before = set(backend.store.execute(b"KEYS", b"*"))
        for _ in range(3):
            backend.hit("user:victim", [by_name])
        (victim,) = set(backend.store.execute(b"KEYS", b"*")) - before
        assert not backend.peek("user:victim", [by_name], cost=1).allowed
        if kind == "spend":
            for n in range(16):
                for _ in range(3):
                    request(f"spent{n}")
        step = max(1, args.keys // 50)
        started = time.perf_counter()
        for sent in range(1, args.cap * args.keys + 1):
            request(f"fresh{sent}")
            # KEYS reads every key in order: the order of use stays as it was.
            if sent % step == 0 and victim not in backend.store.execute(b"KEYS", b"*"):
                return f"{sent:,}", (time.perf_counter() - started) / sent * 1e6
        return "kept", (time.perf_counter() - started) / (args.cap * args.keys) * 1e6

    shipped = memory.EVICTION_CANDIDATES
    print(f"{args.keys:,} keys; requests until the spent counter is forgotten")
    for kind in ("rotate", "spend"):
        for label, candidates in (("least recently used", 1), ("shipped", shipped)):
            flushed, micros = attack(candidates, kind)
            print(f"{kind:7} {label:20} {flushed:>10}  {micros:6.1f} µs/request")


if __name__ == "__main__":
    main()
