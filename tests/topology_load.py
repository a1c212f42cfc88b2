"""Load for the topology suites (tests/test_sentinel.py, tests/test_tls_acl.py,
tests/test_cluster.py): threads, and coroutines on an event loop of their own, counting on
fresh clients while a test does something to the servers, every call's outcome recorded;
``SCRIPT FLUSH`` on every node of a topology, again and again; the server's count of the
``NOSCRIPT`` replies it gave; and the check that no decision failed and every client was
counted exactly."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from django_throttle.backends.base import BackendError
from django_throttle.backends.redis import RedisBackend
from django_throttle.backends.redis_nodes import CircuitBreaker
from django_throttle.rates import Algorithm, Limit
from tests.redis_servers import forget_code
from tests.test_algorithm_concurrency import quiet_limit

#: Hits past the limit in each client's round: they must all be denied.
EXTRA = 2
#: (group, client, limits index, start, outcome): "allowed", "denied" or the error's text.
Call = tuple[str, str, int, float, str]


def every_algorithm(limit: int, name: str = "load") -> list[tuple[Limit, ...]]:
    """One limit list per algorithm, ``limit`` per window, no window starting or ending within
    minutes of now (as :func:`tests.test_algorithm_concurrency.quiet_limit` chooses them)."""
    found: list[tuple[Limit, ...]] = []
    for n, algorithm in enumerate(Algorithm.values):
        arguments = quiet_limit(algorithm, time.time())
        arguments["rate"] = f"{limit}/{arguments['rate'].split('/', 1)[1]}"
        found.append((Limit.build(f"{name}{n}", **arguments),))
    return found


def fresh_clients(tag: str) -> dict[str, Iterator[str]]:
    """One group of client names never used before (by this test's key prefix)."""
    return {"all": (f"{tag}:{n}" for n in itertools.count())}


class Load:
    """``threads`` threads, and ``coroutines`` coroutines on one event loop in a thread of its
    own (the ``async def`` path), counting through a circuit breaker (the request path's).
    Each round takes a fresh client of one group (``groups``: group → its unused client
    names), the next limit list of ``limits`` in turn, and makes ``limit + EXTRA`` hits."""

    def __init__(
        self,
        backend: RedisBackend,
        limits: Sequence[tuple[Limit, ...]],
        limit: int,
        groups: Mapping[str, Iterable[str]],
        *,
        threads: int = 6,
        coroutines: int = 4,
    ) -> None:
        self.backend, self.limits, self.limit = backend, list(limits), limit
        self.groups = {group: iter(names) for group, names in groups.items()}
        self.coroutines = coroutines
        self.breaker = CircuitBreaker()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.calls: list[Call] = []
        #: What escaped the backend other than a BackendError (the request path's 500).
        self.foreign: list[BaseException] = []
        self._rounds = itertools.count()
        self.threads = [threading.Thread(target=self.run) for _ in range(threads)]
        if coroutines:
            self.threads.append(threading.Thread(target=asyncio.run, args=(self.arun(),)))

    def next_round(self) -> tuple[str, str, int] | None:
        """(group, client, limits index) of the next round; None when a group ran out."""
        with self.lock:
            round_ = next(self._rounds)
            groups = sorted(self.groups)
            group = groups[round_ % len(groups)]
            client = next(self.groups[group], None)
        return None if client is None else (group, client, round_ % len(self.limits))

    def record(self, group: str, client: str, index: int, start: float, outcome: str) -> None:
        with self.lock:
            self.calls.append((group, client, index, start, outcome))

    def run(self) -> None:
        while not self.stop.is_set() and (round_ := self.next_round()) is not None:
            group, client, index = round_
            for _ in range(self.limit + EXTRA):
                start = time.monotonic()
                try:
                    decision = self.breaker.call(self.backend.hit, client, self.limits[index])
                    outcome = "allowed" if decision.allowed else "denied"
                except BackendError as exc:
                    outcome = f"{type(exc).__name__}: {exc}"
                except BaseException as exc:
                    self.foreign.append(exc)
                    return
                self.record(group, client, index, start, outcome)

    async def arun(self) -> None:
        await asyncio.gather(*(self.arun_one() for _ in range(self.coroutines)))

    async def arun_one(self) -> None:
        while not self.stop.is_set() and (round_ := self.next_round()) is not None:
            group, client, index = round_
            for _ in range(self.limit + EXTRA):
                start = time.monotonic()
                try:
                    decision = await self.breaker.acall(
                        self.backend.ahit, client, self.limits[index]
                    )
                    outcome = "allowed" if decision.allowed else "denied"
                except BackendError as exc:
                    outcome = f"{type(exc).__name__}: {exc}"
                except BaseException as exc:
                    self.foreign.append(exc)
                    return
                self.record(group, client, index, start, outcome)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in self.threads), "a load thread hangs"
        assert not self.foreign, self.foreign

    def by_client(self) -> dict[str, tuple[str, int, list[str]]]:
        """Client → (group, its limits index, its outcomes in order)."""
        found: dict[str, tuple[str, int, list[str]]] = {}
        for group, client, index, _start, outcome in sorted(self.calls, key=lambda c: c[3]):
            found.setdefault(client, (group, index, []))[2].append(outcome)
        return found


def assert_every_decision_exact(
    outcomes: dict[str, list[str]], limit: int, remaining: Callable[[str], int]
) -> None:
    """No call failed; each client was admitted exactly its first ``limit`` hits and denied
    the rest (a round cut short when the load stopped: a prefix of that), and its counter
    holds exactly what it was told (``remaining(client)``: a peek): nothing counted twice."""
    failed = {c: calls for c, calls in outcomes.items() if set(calls) - {"allowed", "denied"}}
    assert not failed, (
        f"{len(failed)} clients saw a failed decision, e.g. {next(iter(failed.items()))}"
    )
    expected = ["allowed"] * limit + ["denied"] * EXTRA
    wrong = {c: calls for c, calls in outcomes.items() if calls != expected[: len(calls)]}
    assert not wrong, wrong
    complete = [c for c, calls in outcomes.items() if len(calls) == len(expected)]
    assert len(complete) >= len(outcomes) // 2, (len(complete), len(outcomes))
    counted = {c: (remaining(c), calls.count("allowed")) for c, calls in outcomes.items()}
    miscounted = {c: n for c, n in counted.items() if n[0] != limit - n[1]}
    assert not miscounted, miscounted


def flush_scripts(
    nodes: Sequence[Any],
    seconds: float,
    pause: float = 0.02,
    enough: Callable[[int], bool] | None = None,
) -> int:
    """``SCRIPT FLUSH`` and ``FUNCTION FLUSH`` (``SYNC`` and ``ASYNC`` in turn: what a
    restart or a failover to an empty server does to the package's scripts and functions) on
    every one of ``nodes`` (servers
    of :mod:`tests.redis_servers` or :mod:`tests.topologies`), again every ``pause`` seconds
    for ``seconds``, and after that until ``enough(flushes)`` holds (at most a minute more:
    a loaded machine flushes and counts less in the same time); how many times each node
    was flushed."""
    clients = [node.client() for node in nodes]
    try:
        deadline = time.monotonic() + seconds
        flushes = 0
        while time.monotonic() < deadline or (
            enough is not None and time.monotonic() < deadline + 60 and not enough(flushes)
        ):
            for client in clients:
                forget_code(client, "ASYNC" if flushes % 2 else "SYNC")
            flushes += 1
            time.sleep(pause)
        return flushes
    finally:
        for client in clients:
            client.close()


def noscript_replies(nodes: Sequence[Any]) -> int:
    """How many times ``nodes`` were sent the package's code again since they started: their
    ``NOSCRIPT`` error replies (a script sent whole with ``EVAL`` next) and the libraries
    loaded (``FUNCTION LOAD``, after a function call answered "not found")."""
    total = 0
    for node in nodes:
        client = node.client()
        try:
            errors = client.info("errorstats")
            commands = client.info("commandstats")
        finally:
            client.close()
        total += int(errors.get("errorstat_NOSCRIPT", {}).get("count", 0))
        total += int(commands.get("cmdstat_function|load", {}).get("calls", 0))
    return total


def script_calls(node: Any) -> int:
    """How many script and function calls (``EVAL``, ``EVALSHA``, ``FCALL`` and their
    ``_RO``) ``node`` has served since it started."""
    client = node.client()
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    names = ("cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro")
    names += ("cmdstat_fcall", "cmdstat_fcall_ro")
    return sum(int(stats.get(name, {}).get("calls", 0)) for name in names)
