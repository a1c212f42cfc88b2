"""The contract every counting backend keeps.

A backend counts; it knows nothing of requests, models or policies. ``client`` is an opaque
string naming who is counted (``"user:42"``); each :class:`~django_throttle.rates.Limit` names a
counter by its ``id``. All limits passed to one :meth:`Backend.hit` are checked and consumed as
one atomic, all-or-nothing step.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from django_throttle.rates import Decision, Limit

#: Bytes of a client digest (96 bits: no two of a billion clients share one in practice).
DIGEST_SIZE = 12


class BackendError(Exception):
    """The backend could not answer (connection, timeout, server error)."""


class Backend(ABC):
    """Counting storage. Implementations must be thread-safe."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Adapt a backend written before ``hit`` took ``usage``: the core always passes it,
        and a ``TypeError`` would reach the request as a 500. Such a backend counts no usage
        (the report shows its decisions only when made while it was failing)."""
        super().__init_subclass__(**kwargs)
        hit = cls.__dict__.get("hit")
        if hit is None or _accepts(hit, "usage"):
            return

        @functools.wraps(hit)
        def adapted(
            self: Backend,
            client: str,
            limits: Sequence[Limit],
            cost: int = 1,
            *,
            now: float | None = None,
            usage: str | None = None,
        ) -> Decision:
            result: Decision = hit(self, client, limits, cost, now=now)
            return result

        cls.hit = adapted  # type: ignore[method-assign]

    @abstractmethod
    def hit(
        self,
        client: str,
        limits: Sequence[Limit],
        cost: int = 1,
        *,
        now: float | None = None,
        usage: str | None = None,
    ) -> Decision:
        """Take ``cost`` tokens from every limit if all can give them; otherwise take none.

        ``usage`` (a field from :func:`django_throttle.usage.field_for`) counts the outcome
        for the usage report in the same atomic step; ``None`` counts nothing. ``now`` (Unix
        seconds) overrides the backend's clock, for deterministic tests only. Raise
        :class:`BackendError` when the storage cannot answer.
        """

    async def ahit(
        self,
        client: str,
        limits: Sequence[Limit],
        cost: int = 1,
        *,
        now: float | None = None,
        usage: str | None = None,
    ) -> Decision:
        """:meth:`hit` for ``async def`` views. Backends with a native async client override
        it; this default runs :meth:`hit` in a worker thread."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.hit, thread_sensitive=False)(
            client, limits, cost, now=now, usage=usage
        )

    @abstractmethod
    def peek(self, client: str, limits: Sequence[Limit], *, now: float | None = None) -> Decision:
        """Report the current state of the limits without consuming anything."""

    @abstractmethod
    def reset(self, client: str, limits: Sequence[Limit]) -> None:
        """Refill the client's buckets for these limits (forget their state)."""

    @abstractmethod
    def retime(
        self,
        limits: Sequence[Limit],
        *,
        now: float | None = None,
        previous: Sequence[Limit] | None = None,
    ) -> int:
        """Make every stored state of these limits (matched by ``limit.id`` and algorithm, all
        clients) expire when it stops mattering under the limit's current rate and burst.

        Call it after a limit changed: a state written under a faster rate would otherwise
        expire early and hand the client a full bucket. ``previous`` (as long as ``limits``,
        or ``None`` when unknown) holds each limit as it was before the edit: GCRA, which
        stores a time rather than a count, needs the old rate to keep the tokens used.
        Returns the number of states touched. ``now`` (Unix seconds) overrides the
        backend's clock, for deterministic tests only.
        """

    @abstractmethod
    def get_policy_version(self) -> str | None:
        """The shared policy version, bumped whenever an admin edits a policy."""

    @abstractmethod
    def bump_policy_version(self) -> None:
        """Tell every process that the policy changed."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the instance is not used afterwards."""


def _accepts(func: Any, name: str) -> bool:
    """Whether ``func`` takes a keyword argument ``name`` (by name or through ``**kwargs``)."""
    parameters = inspect.signature(func).parameters.values()
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)


def decision_from(
    limits: Sequence[Limit],
    allowed: bool,
    index: int,
    remaining: int,
    reset_us: float,
    retry_us: float,
    shadow: bool = False,
) -> Decision:
    """Build a :class:`Decision` from a backend's reply (``index`` is 0-based; -1 when no
    enforced limit was passed, so nothing is reported)."""
    # Positional (allowed, limit, remaining, reset_after, retry_after, limits, shadow): once
    # per request, and keywords cost a frozen dataclass noticeably more.
    return Decision(
        allowed,
        limits[index] if index >= 0 else None,
        remaining,
        reset_us / 1e6,
        retry_us / 1e6,
        tuple(limits),
        shadow,
    )
