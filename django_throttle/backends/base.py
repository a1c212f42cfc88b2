"""The contract every counting backend keeps.

A backend counts; it knows nothing of requests, models or policies. ``client`` is an opaque
string naming who is counted (``"user:42"``); each :class:`~django_throttle.rates.Limit` names a
counter by its ``id``. All limits passed to one :meth:`Backend.hit` are checked and consumed as
one atomic, all-or-nothing step.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence

from django_throttle.rates import Decision, Limit


class BackendError(Exception):
    """The backend could not answer (connection, timeout, server error)."""


class Backend(ABC):
    """Counting storage. Implementations must be thread-safe."""

    @abstractmethod
    def hit(
        self, client: str, limits: Sequence[Limit], cost: int = 1, *, now: float | None = None
    ) -> Decision:
        """Take ``cost`` tokens from every limit if all can give them; otherwise take none.

        ``now`` (Unix seconds) overrides the backend's clock, for deterministic tests only.
        Raise :class:`BackendError` when the storage cannot answer.
        """

    @abstractmethod
    def peek(self, client: str, limits: Sequence[Limit], *, now: float | None = None) -> Decision:
        """Report the current state of the limits without consuming anything."""

    @abstractmethod
    def reset(self, client: str, limits: Sequence[Limit]) -> None:
        """Refill the client's buckets for these limits (forget their state)."""

    @abstractmethod
    def get_policy_version(self) -> str | None:
        """The shared policy version, bumped whenever an admin edits a policy."""

    @abstractmethod
    def bump_policy_version(self) -> None:
        """Tell every process that the policy changed."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the instance is not used afterwards."""

    @staticmethod
    def digest(client: str) -> str:
        """A fixed-length digest of the client, so user-controlled text never shapes a key."""
        return hashlib.blake2b(client.encode(), digest_size=12).hexdigest()


def decision_from(
    limits: Sequence[Limit],
    allowed: bool,
    index: int,
    remaining: int,
    reset_us: float,
    retry_us: float,
    shadow: bool = False,
) -> Decision:
    """Build a :class:`Decision` from a backend's reply (``index`` is 0-based)."""
    return Decision(
        allowed=allowed,
        limit=limits[index],
        remaining=remaining,
        reset_after=reset_us / 1e6,
        retry_after=retry_us / 1e6,
        limits=tuple(limits),
        shadow=shadow,
    )
