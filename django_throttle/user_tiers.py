"""Which tier a logged-in user is in: one query on first sight, then a bounded cache.

The cache is per policy snapshot (a policy edit starts a fresh one) and every answer expires
after ``DJANGO_THROTTLE_USER_TIER_CACHE_TTL`` seconds, so changes the signals cannot see
(``QuerySet.update``, ``bulk_create``, raw SQL) apply within that time.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

__all__ = ["UserTierCache", "assigned_tier"]


class _Prioritised(Protocol):
    @property
    def priority(self) -> int: ...


class UserTierCache:
    """A bounded, thread-safe LRU of user id → tier id (``None``: no assignment), each answer
    trusted for ``ttl`` seconds of ``clock`` (monotonic seconds, injectable for tests)."""

    def __init__(self, size: int, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.size = size
        self.ttl = ttl
        self.clock = clock
        self._data: OrderedDict[Any, tuple[float, int | None]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, user_id: Any) -> tuple[bool, int | None]:
        """``(True, tier id)`` for a fresh answer, ``(False, None)`` when unknown or stale."""
        now = self.clock()
        with self._lock:
            entry = self._data.get(user_id)
            if entry is None:
                return False, None
            expires, tier_id = entry
            if now >= expires:
                del self._data[user_id]
                return False, None
            self._data.move_to_end(user_id)
            return True, tier_id

    def put(self, user_id: Any, tier_id: int | None) -> None:
        expires = self.clock() + self.ttl
        with self._lock:
            self._data[user_id] = (expires, tier_id)
            self._data.move_to_end(user_id)
            while len(self._data) > self.size:
                self._data.popitem(last=False)


def assigned_tier(user_id: Any, tiers: Mapping[int, _Prioritised]) -> int | None:
    """One query: the user's own assignment wins; among group assignments, the highest
    priority (a tier missing from ``tiers`` ranks last)."""
    from django.db.models import Q

    from django_throttle.models import TierAssignment

    best: int | None = None
    for own_user, tier_id in TierAssignment.objects.filter(
        Q(user_id=user_id) | Q(group__user__id=user_id)
    ).values_list("user_id", "tier_id"):
        if own_user is not None:
            return int(tier_id)
        if best is None or _priority(tiers, tier_id) > _priority(tiers, best):
            best = int(tier_id)
    return best


def _priority(tiers: Mapping[int, _Prioritised], tier_id: int) -> int:
    tier = tiers.get(tier_id)
    return tier.priority if tier is not None else -(2**31)
