"""In-process backend with the Redis backend's semantics, for development, tests and the
per-process fallback of failure mode ``"local"``.

It is the Redis backend on a :class:`~.memory_store.MemoryStore` instead of a server: the same
keys, the same Lua scripts (run in this process on Redis's Lua), the same usage counts and
operator tools, so a process that falls back to memory makes the decisions Redis would have
made. State lives in this process only: use it with one process, or accept per-process limits.
It is thread-safe (a script runs under the store's lock) and takes an injectable ``clock`` so
tests can move time by hand. ``max_entries`` bounds memory: beyond it the least recently used
keys are forgotten (those clients start afresh).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cached_property
from typing import Any, cast

from django_throttle.backends.frames import ScriptCall
from django_throttle.backends.memory_store import MemoryStore
from django_throttle.backends.redis import RedisBackend
from django_throttle.backends.redis_single import OneServer, run_script
from django_throttle.backends.redis_usage import RedisUsage

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
        # The store answers the client methods the Redis backend calls.
        super().__init__(cast(Any, self.store), shards=shards)

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

    def _route_for(self, client: Any) -> OneServer:
        return InProcess(client, type(self))


class InProcess(OneServer):
    """The route of counting calls to the store: every shard is in it."""

    def __init__(self, store: MemoryStore, sender: type | None = None) -> None:
        self.client: Any = store
        self.sender = sender

    def call(self, call: ScriptCall) -> Any:
        return run_script(self.client, call, self.sender)

    async def acall(self, call: ScriptCall) -> Any:
        return self.call(call)

    def close(self, client_too: bool) -> None:
        """Nothing to close: the store is this process's memory."""
