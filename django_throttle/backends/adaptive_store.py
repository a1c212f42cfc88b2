"""Where the adaptive load controller keeps what every worker shares: each tier's automatic
factor, the lock that lets one controller move them per step, and their history for the
dashboard. Four keys under the key prefix, each with a TTL, on the backend's own client (the
in-process store for the memory backend); single-key commands only, so they work on a
Redis Cluster as on one server.

- ``<prefix>:adaptive:factors``: a string ``"<tier id>=<factor>,…"`` (factors in (0, 1],
  tiers at 1.0 left out), rewritten by the controller, read once per policy compile. Its TTL
  (:data:`FACTORS_TTL` unless the controller asks for another) bounds how long a controller
  that stopped leaves limits shrunk: the factors then expire and every tier is whole again.
- ``<prefix>:adaptive:step:<n>``: ``SET NX PX`` per controller step ``n``; the controller
  that sets it moves the factors in that step, any other skips it.
- ``<prefix>:adaptive:moved``: when (the controller's clock, Unix seconds) a tier's factor
  last moved, so no controller moves one again before that move could show in the load
  signal (``--settle``).
- ``<prefix>:adaptive:history``: a sorted set, score the minute (since the Unix epoch),
  member ``"<minute>:<tier id>:<factor>"``; the last :data:`HISTORY_MINUTES` minutes only
  (one entry per tier and minute, the minute's last), so it is bounded whatever runs.

This module never imports redis-py: it drives the backend's client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django_throttle.backends.base import Backend, BackendError
from django_throttle.backends.scripts import call_backend

#: Minutes of factor history kept (24 hours).
HISTORY_MINUTES = 24 * 60
#: Seconds the factors live after the controller last wrote them, by default.
FACTORS_TTL = 600


class AdaptiveStore:
    """The controller's shared state on ``backend`` (a Redis or memory backend)."""

    def __init__(self, backend: Backend) -> None:
        prefix = getattr(backend, "prefix", None)
        if prefix is None or not hasattr(backend, "client"):
            raise BackendError(
                f"{type(backend).__name__} keeps no shared state: adaptive limits need the "
                "Redis or memory backend"
            )
        self.backend = backend
        self.factors_key = f"{prefix}:adaptive:factors"
        self.history_key = f"{prefix}:adaptive:history"
        self.step_prefix = f"{prefix}:adaptive:step:"
        self.move_key = f"{prefix}:adaptive:moved"

    @classmethod
    def of(cls, backend: Backend) -> AdaptiveStore | None:
        """The store on ``backend``, ``None`` for a backend that keeps no shared state."""
        try:
            return cls(backend)
        except BackendError:
            return None

    @property
    def client(self) -> Any:
        return self.backend.client

    def factors(self) -> dict[int, float]:
        """Each tier's automatic factor (tiers at 1.0 absent); one ``GET``. Entries that do
        not parse are skipped (their tier counts as whole)."""
        return parse_factors(call_backend(self.client.get, self.factors_key))

    def acquire(self, step: int, hold_ms: int) -> bool:
        """Whether this controller holds step ``step`` (``SET NX PX``): one per step, fleet-wide."""
        key = f"{self.step_prefix}{step}"
        taken = call_backend(self.client.set, key, b"1", px=hold_ms, nx=True)
        return bool(taken)

    def last_move(self) -> float | None:
        """When a tier's factor last moved (the controller's clock, Unix seconds), if lately."""
        value = call_backend(self.client.get, self.move_key)
        try:
            return float(value) if value else None
        except ValueError:
            return None

    def note_move(self, when: float, ttl: int) -> None:
        """Remember a move at ``when`` for ``ttl`` seconds."""
        call_backend(self.client.set, self.move_key, repr(when).encode(), ex=max(1, ttl))

    def save(
        self,
        factors: Mapping[int, float],
        minute: int,
        ttl: int = FACTORS_TTL,
        tiers: tuple[int, ...] = (),
    ) -> None:
        """Write the factors (those below 1.0) and this minute's history of ``tiers`` (all of
        them, at 1.0 too, so the chart shows the recovery), in one pipeline."""
        pipe = self.client.pipeline(transaction=False)
        text = format_factors(factors)
        if text:
            pipe.set(self.factors_key, text.encode(), ex=max(1, ttl))
        else:
            pipe.delete(self.factors_key)
        if tiers:
            pipe.zremrangebyscore(self.history_key, minute, minute)
            pipe.zremrangebyscore(self.history_key, "-inf", minute - HISTORY_MINUTES)
            entries = {
                f"{minute}:{tier}:{factors.get(tier, 1.0):.4g}".encode(): minute for tier in tiers
            }
            pipe.zadd(self.history_key, entries)
            pipe.expire(self.history_key, HISTORY_MINUTES * 60 + 3600)
        call_backend(pipe.execute)

    def history(self, since_minute: int) -> dict[int, list[tuple[int, float]]]:
        """Each tier's (minute, factor) from ``since_minute`` on, oldest first."""
        rows = call_backend(self.client.zrangebyscore, self.history_key, since_minute, "+inf")
        found: dict[int, list[tuple[int, float]]] = {}
        for row in rows:
            text = row.decode() if isinstance(row, bytes) else str(row)
            try:
                minute, tier, factor = text.split(":")
                found.setdefault(int(tier), []).append((int(minute), float(factor)))
            except ValueError:
                continue
        return found

    def clear(self) -> None:
        """Forget the factors (every tier whole again) and their history."""
        for key in (self.factors_key, self.history_key, self.move_key):  # one slot each
            call_backend(self.client.delete, key)


def parse_factors(value: Any) -> dict[int, float]:
    """``"<tier id>=<factor>,…"`` as a dict, skipping what does not parse or lies outside
    (0, 1]."""
    if not value:
        return {}
    text = value.decode() if isinstance(value, bytes) else str(value)
    factors: dict[int, float] = {}
    for part in text.split(","):
        tier, _, factor = part.partition("=")
        try:
            tier_id, number = int(tier), float(factor)
        except ValueError:
            continue
        if 0.0 < number <= 1.0:
            factors[tier_id] = number
    return factors


def format_factors(factors: Mapping[int, float]) -> str:
    """The stored form of ``factors``, tiers at 1.0 left out."""
    return ",".join(
        f"{tier}={factor:.4g}" for tier, factor in sorted(factors.items()) if factor < 1.0
    )
