"""What reading a script's reply costs redis-py, by the reply's shape.

Run from the repository root::

    .venv/bin/python bench/bench_reply.py [--calls 20000] [--rounds 3] [--json]

On one held connection of a private ``redis-server``, sent with the connection's own
``send_command`` / ``read_response`` (as the backend counts), each round times ``--calls``
calls of: PING; ``EVALSHA`` of a script answering the counting script's full reply (seven
integers); its common reply (four integers: an allowed hit, the trailing zeros left out); one
integer. Each figure is the best of five repetitions, in µs per call; the scripts do nothing
else, so the differences are the reply's reading (and its few bytes). Which parser redis-py
uses (its Python one, or ``hiredis`` when installed) is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: (name, script): what each timed call's reply looks like.
SCRIPTS = (
    ("seven integers", "return {1, 1, 99, 600000, 0, 0, 0}"),
    ("four integers", "return {1, 1, 99, 600000}"),
    ("one integer", "return 1"),
)
#: One key and the arguments of a one-limit counting call (cost, peek, a token bucket spec).
ARGS = (1, b"dt:{0}abcdefghijklmnop", b"1", b"0", b"t100:6e5")


def best_of(call: Callable[[], object], calls: int, repetitions: int = 5) -> float:
    best = float("inf")
    for _ in range(repetitions):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def run(url: str, calls: int, rounds: int) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(url)
    connection = client.connection_pool.get_connection()

    def ping() -> object:
        connection.send_command("PING")
        return connection.read_response()

    def evalsha(sha: str) -> Callable[[], object]:
        def call() -> object:
            connection.send_command("EVALSHA", sha, *ARGS)
            return connection.read_response()

        return call

    timed = [("PING", ping)] + [(name, evalsha(client.script_load(s))) for name, s in SCRIPTS]
    results: dict[str, list[float]] = {name: [] for name, _ in timed}
    for _ in range(rounds):
        for name, call in timed:
            results[name].append(round(best_of(call, calls), 1))
    parser = type(connection._parser).__name__
    client.connection_pool.release(connection)
    client.close()
    return {"parser": parser, "calls": calls, "us_per_call": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per repetition")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every shape")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.rounds < 1:
        parser.error("--calls and --rounds must be at least 1")
    from example_project.private_redis import PrivateRedis

    private = PrivateRedis().start()
    try:
        result = run(private.url, args.calls, args.rounds)
    finally:
        private.stop()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"redis-py parser: {result['parser']}; µs per call, best of 5, each round:")
        for name, figures in result["us_per_call"].items():
            print(f"  {name:15} " + "  ".join(f"{figure:6.1f}" for figure in figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
