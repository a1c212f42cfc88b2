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
  fill the store);
- ``daily``: an allowed request per fresh client whose one request starts a counter living a
  day (a fixed window of 1000/day), no login at all.

Counters that deny are kept (never forgotten for a fresh key), so the victim's is kept
under every attack; what a full store of kept counters costs new clients is in
``docs/explanation/failure-modes.md``.

One request is 1 ms of the store's clock. Printed: requests until the counter was forgotten
(or ``kept`` after ``--cap`` times ``--keys`` requests) and µs per request.

``--memory``: the process's resident memory once the store is full of spent login counters
(each fresh name guessed until denied), and again after ``--cap`` times as many fresh clients
more (counted in the overflow counters: memory stays flat).

    .venv/bin/python bench/bench_fallback_eviction.py [--keys 100000] [--cap 3] [--memory]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--cap", type=int, default=3)
    parser.add_argument("--memory", action="store_true")
    args = parser.parse_args()

    import django
    from django.conf import settings

    settings.configure(USE_TZ=True)
    django.setup()
    from django_throttle.backends import memory
    from django_throttle.rates import Limit

    tier, by_ip = Limit.build("tier", "1000/min"), Limit.build("ip", "100/min")
    by_name = Limit.build("name", "3/h")
    daily = Limit.build("day", "1000/day", algorithm="fixed_window")

    def attack(candidates: int, kind: str) -> tuple[str, float]:
        memory.EVICTION_CANDIDATES = candidates
        now = [1_700_000_000.0]
        backend = memory.MemoryBackend(clock=lambda: now[0], max_entries=args.keys)
        fresh = iter(range(10**9))

        def request(name: str | None) -> None:
            now[0] += 0.001
            if kind == "daily":
                backend.hit(f"key:{next(fresh)}", [daily])
                return
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

    if args.memory:
        measure_memory(memory.MemoryBackend, [tier, by_ip], by_name, args.keys, args.cap)
        return
    shipped = memory.EVICTION_CANDIDATES
    print(f"{args.keys:,} keys; requests until the spent counter is forgotten")
    for kind in ("rotate", "spend", "daily"):
        for label, candidates in (("least recently used", 1), ("shipped", shipped)):
            flushed, micros = attack(candidates, kind)
            print(f"{kind:7} {label:20} {flushed:>10}  {micros:6.1f} µs/request")


def measure_memory(backend_class: Any, tier: list[Any], by_name: Any, keys: int, cap: int) -> None:
    import gc

    def resident_mb() -> float:
        gc.collect()
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096 / 1e6

    now = [1_700_000_000.0]
    backend = backend_class(clock=lambda: now[0], max_entries=keys)
    backend.hit("warm", tier)
    before = resident_mb()
    for n in range(keys):
        now[0] += 0.0001
        while backend.hit(f"user:{n}", [by_name]).allowed:
            pass
    full = resident_mb() - before
    print(f"{len(backend):,} keys: {full:.1f} MB, {full * 1e6 / len(backend):.0f} bytes a key")
    for n in range(cap * keys):
        now[0] += 0.0001
        backend.hit(f"ip:{n}", tier)
    print(
        f"after {cap * keys:,} fresh clients more: {len(backend):,} keys, "
        f"{resident_mb() - before:.1f} MB"
    )


if __name__ == "__main__":
    main()
