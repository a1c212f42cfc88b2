"""In-process backend with the Redis backend's semantics, for development, tests and the
per-process fallback of failure mode ``"local"``.

It is the Redis backend with its scripts run on a :class:`~.memory_store.MemoryStore`
(:class:`InProcess`, the route it hands the backend) instead of a server: the same
keys, the same Lua scripts (run in this process on Redis's Lua), the same usage counts and
operator tools, so a process that falls back to memory makes the decisions Redis would have
made. State lives in this process only: use it with one process, or accept per-process limits.
It is thread-safe (a script runs under the store's lock) and takes an injectable ``clock`` so
tests can move time by hand. ``max_entries`` bounds memory: beyond it the least recently used
keys are forgotten (those clients start afresh).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

from django_throttle.backends.frames import ScriptCall
from django_throttle.backends.memory_store import MemoryStore
from django_throttle.backends.redis import RedisBackend
from django_throttle.backends.redis_single import run_script
from django_throttle.backends.redis_usage import RedisUsage
from django_throttle.backends.scripts import Call, evalsha_all

__all__ = ["MemoryBackend"]


class MemoryBackend(RedisBackend):
    """Counts in this process's memory, with the Redis backend's scripts.
    In-process under a short lock and never waiting on I/O, its async methods need no thread."""

    blocking = False

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        max_entries: int | None = None,
        shards: int | None = None,
    ) -> None:
        self.store = MemoryStore(clock, max_entries)
        super().__init__(shards=shards, route=InProcess(self.store, type(self)))

    @property
    def clock(self) -> Callable[[], float]:
        """The store's clock (Unix seconds): ``TIME`` and every expiry read it."""
        return self.store.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.store.clock = clock

    @property
    def max_entries(self) -> int | None:
        return self.store.max_keys

    def local_time(self) -> float:
        return self.store.clock()

    def __len__(self) -> int:
        """Keys held (counters and usage counts)."""
        return len(self.store)

    @cached_property
    def usage(self) -> RedisUsage:
        """This backend's usage counts, kept and read as on Redis."""
        return RedisUsage(self)


class InProcess:
    """The route of a backend's script calls to a :class:`~.memory_store.MemoryStore`
    (a :class:`~.redis.Route`): every shard is in it, and every call runs there at once.

    The store answers the redis-py client methods the backend uses (``evalsha``, ``eval``,
    pipelines, ``GET``, ``SCAN``), so the calls go through :func:`.redis_single.run_script`
    as on a server: ``NOSCRIPT`` is answered with ``EVAL`` and tells
    :data:`~django_throttle.events.script_loaded` (``sender``), a script's error reply is
    what :func:`.scripts.failure` makes of it. A script runs under the store's lock and never
    waits on I/O, so :meth:`acall` runs it on the calling loop's thread."""

    def __init__(self, store: MemoryStore, sender: type | None = None) -> None:
        self.client: Any = store
        self.sender = sender

    def call(self, call: ScriptCall) -> Any:
        return run_script(self.client, call, self.sender)

    async def acall(self, call: ScriptCall) -> Any:
        return self.call(call)

    def evalsha_all(
        self, sha: str, source: str, calls: Sequence[Call], client: Any = None
    ) -> list[Any]:
        return evalsha_all(client or self.client, sha, source, calls)

    def patient_client(self, timeout: float) -> tuple[Any, bool]:
        """The store itself: no read of it waits on a socket."""
        return self.client, False

    def scanned_clients(self) -> list[Any]:
        """The store: it holds every key."""
        return [self.client]

    def by_slot(self, keys: list[Any]) -> list[list[Any]]:
        """``keys`` in one group: the store has no slots."""
        return [keys]

    def close(self, client_too: bool) -> None:
        """Nothing to close: the store is this process's memory."""
