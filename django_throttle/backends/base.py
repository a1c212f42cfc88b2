"""The contract every counting backend keeps.

A backend counts; it knows nothing of requests, models or policies. ``client`` is an opaque
string naming who is counted (``"user:42"``); each :class:`~django_throttle.rates.Limit` names a
counter by its ``id``. All limits passed to one :meth:`Backend.hit` are checked and consumed as
one atomic, all-or-nothing step; :meth:`Backend.refund` undoes an allowed hit.

A :attr:`~django_throttle.rates.Limit.shared` limit is counted per key shard for every client
of that shard together: see :func:`shard_of` and :func:`per_shard`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from django_throttle.rates import WINDOW_ALGORITHMS, Algorithm, Decision, InvalidRate, Limit, Rate

__all__ = ["ArgumentRefused", "Backend", "BackendError", "NodeUnavailable"]

#: Bytes of a client digest (96 bits: no two of a billion clients share one in practice).
DIGEST_SIZE = 12

#: Limit lists a backend keeps encoded (``redis.Calls``) before it starts afresh.
CACHED_LISTS = 4096

T = TypeVar("T")
P = ParamSpec("P")
Limits = Sequence[Limit]
#: Unix seconds, or ``None`` for the backend's own clock.
Now = float | None
#: A usage field (``None``: count no usage).
Usage = str | None
#: A hit's instant (the instant of a ``(client, instant)`` pair of ``Decision.taken``), or
#: ``None``.
Taken = int | None


def check_taken_at(taken_at: object) -> None:
    """A ``taken_at`` given to ``refund`` that is no instant is the caller's mistake (such as
    the whole ``Decision.taken`` tuple): a ``TypeError`` saying what to give, not a backend
    error about the script's arguments."""
    if taken_at is not None and (isinstance(taken_at, bool) or not isinstance(taken_at, int)):
        raise TypeError(
            "taken_at must be the hit's instant, an int of microseconds (its client's pair in "
            f"Decision.taken: dict(decision.taken).get(client)), or None, not {taken_at!r}"
        )


#: Each algorithm's code: in a limit spec and key (lua/prelude.lua ``limit_spec``).
ALGORITHM_CODES = {
    Algorithm.TOKEN_BUCKET: "t",
    Algorithm.GCRA: "g",
    Algorithm.LEAKY_BUCKET: "l",
    Algorithm.FIXED_WINDOW: "f",
    Algorithm.SLIDING_LOG: "w",
    Algorithm.SLIDING_COUNTER: "s",
    Algorithm.CALENDAR: "c",
    Algorithm.CONCURRENCY: "n",
}


def async_twin(
    method: Callable[Concatenate[Any, P], T],
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]:
    """The ``async`` twin of a backend method (``acount = async_twin(count)``): it calls the
    instance's own method of that name, an override included, as :class:`Backend` says."""
    name = method.__name__

    async def twin(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        func: Callable[P, T] = getattr(self, name)
        if not self.blocking:
            return func(*args, **kwargs)
        from asgiref.sync import sync_to_async

        return await sync_to_async(func, thread_sensitive=False)(*args, **kwargs)

    twin.__name__ = twin.__qualname__ = "a" + name
    twin.__doc__ = f":meth:`{name}` for ``async def`` views."
    return twin


class BackendError(Exception):
    """The backend could not answer (connection, timeout, server error)."""


#: The attribute :func:`note_lease` sets on a counting call's exception.
MAYBE_LEASED = "throttle_maybe_leased"


def note_lease(exc: BaseException, client: str, limits: Limits, lease: str) -> None:
    """Say on ``exc``, the failure of a counting call after it was sent (a timeout, a
    connection lost before the reply, an await cancelled because the client went away),
    that the backend may have run it and taken concurrency slots of ``client``'s ``limits``
    under ``lease``, a lease id only this call knew. The request path gives them back by id
    (:func:`maybe_leased`), which releases nothing if the call never ran; else they would
    stay taken until their lease ends, refusing the client meanwhile."""
    found = getattr(exc, MAYBE_LEASED, ())
    # An exception object takes attributes unless its class has __slots__ (none of ours,
    # nor asyncio's CancelledError, nor redis-py's).
    with contextlib.suppress(AttributeError):
        setattr(exc, MAYBE_LEASED, (*found, (client, tuple(limits), lease)))


def maybe_leased(exc: BaseException) -> tuple[tuple[str, tuple[Limit, ...], str], ...]:
    """The (client, limits, lease id) :func:`note_lease` noted on ``exc``."""
    found: tuple[tuple[str, tuple[Limit, ...], str], ...] = getattr(exc, MAYBE_LEASED, ())
    return found


class ArgumentRefused(BackendError):
    """The backend answered, refusing an argument this package sent (a client label, cost
    or limit spec out of the script's bounds): a bug of ours, never an outage.

    A :class:`BackendError` so that every caller already turns it into a decision instead of
    a 500, but the circuit breaker does not count it as a failure (the backend is answering),
    and logs it as an error instead: one such request must never switch limiting off for
    every client of the process.
    """


class NodeUnavailable(BackendError):
    """One node of a Redis Cluster (the primary owning this client's slot) could not answer;
    the other primaries, and so the other clients, are unaffected. The request takes its
    failure mode like any other :class:`BackendError`, with ``retry_after`` the seconds until
    that node's own breaker lets a call through again, but the process's breaker counts it as
    the backend answering: one failed primary must not switch every client to its failure
    mode. The node's breaker (:mod:`.redis_cluster`) does the fast failing for its clients.
    """

    def __init__(self, message: str, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Backend(ABC):
    """Counting storage. Implementations must be thread-safe.

    A backend implements :meth:`count` (what :meth:`hit` and :meth:`peek` share) and
    :meth:`refund`; their ``async`` twins run them in a worker thread unless the backend
    has a native async client (and overrides :meth:`acount` and :meth:`arefund`) or never
    blocks (:attr:`blocking`).
    """

    #: Whether a call waits on I/O. An in-process backend (counting under a short lock, no
    #: I/O) says ``False``: its default async methods answer on the event loop.
    blocking = True

    def hit(
        self, client: str, limits: Limits, cost: int = 1, *, now: Now = None, usage: Usage = None
    ) -> Decision:
        """Take ``cost`` tokens from every limit if all can give them; otherwise take none.

        ``usage`` (a field from :func:`django_throttle.usage.accounting.field_for`) counts the
        outcome for the usage report in the same atomic step; ``None`` counts nothing. ``now`` (Unix
        seconds) overrides the backend's clock, for deterministic tests only. Raise
        :class:`BackendError` when the storage cannot answer.
        """
        return self.count(client, limits, cost, now, usage)

    async def ahit(
        self, client: str, limits: Limits, cost: int = 1, *, now: Now = None, usage: Usage = None
    ) -> Decision:
        """:meth:`hit` for ``async def`` views."""
        return await self.acount(client, limits, cost, now, usage)

    def peek(self, client: str, limits: Limits, *, now: Now = None, cost: int = 0) -> Decision:
        """Report the current state of the limits without consuming anything. With a
        ``cost``, decide exactly as :meth:`hit` with that cost would (allowed, reported
        limit, remaining, reset, retry), still writing nothing and counting no usage: what
        the next request would get."""
        return self.count(client, limits, cost, now, None, peek=True)

    async def apeek(
        self, client: str, limits: Limits, *, now: Now = None, cost: int = 0
    ) -> Decision:
        """:meth:`peek` for ``async def`` views."""
        return await self.acount(client, limits, cost, now, None, peek=True)

    @abstractmethod
    def count(
        self, client: str, limits: Limits, cost: int, now: Now, usage: Usage, peek: bool = False
    ) -> Decision:
        """:meth:`hit` (``usage`` counted), or with ``peek`` :meth:`peek` (``usage`` is
        ``None``; nothing written)."""

    acount = async_twin(count)

    @abstractmethod
    def refund(
        self,
        client: str,
        limits: Limits,
        cost: int = 1,
        *,
        looked: Limits | None = None,
        now: Now = None,
        taken_at: Taken = None,
    ) -> Decision | None:
        """Give ``cost`` tokens back to each of ``limits`` for ``client``: the undo of a
        :meth:`hit` that was allowed (a reservation whose request did not count), as one
        atomic step.

        ``taken_at`` is the instant that hit took its tokens (``client``'s pair in its
        ``Decision.taken``: ``dict(decision.taken).get(client)``, ``None`` when it has none): the
        refund then gives back what that hit took and nothing another request took since (a
        sliding log's entries of that instant, a window's count only if the hit was counted
        in the current window); ``None`` gives back the newest.

        Each limit is clamped so its state never goes below "nothing used"; a missing or
        expired state stays missing; a window that is no longer the current one is left as
        it is; a shadow limit is refunded like the others, so leave out those the hit
        spared (``Decision.spared``: they would have denied, so took nothing), as the
        request path does. A request must never fail because its reservation could not be
        given back: the request path logs a :class:`BackendError` raised here and goes on.

        With ``looked`` (more of ``client``'s limits, given nothing back: a tier's beside a
        rule's; ``()`` for none), the same step also answers what :meth:`peek` would report
        on ``limits`` and ``looked`` once the tokens are back: what a response's rate limit
        headers show once its reservation is back, with no round trip more. ``None`` without
        ``looked``, or from a backend that cannot look in the same step (the headers then
        show the state before the refund).
        """

    arefund = async_twin(refund)

    def hit_together(
        self,
        groups: Sequence[tuple[str, Limits]],
        cost: int = 1,
        *,
        now: Now = None,
        usage: Usage = None,
    ) -> list[Decision] | None:
        """:meth:`hit` of several clients' limits (``groups``: ``(client, limits)`` pairs) as
        one atomic step, all or nothing across them: each group's decision as :meth:`hit`
        would make it alone, nothing taken anywhere unless every group allows. ``usage``
        counts the request once: under the first group that denied, else under the last.

        ``None`` (the default) when this backend cannot count them in one step (the request
        path then counts them one group at a time, giving back what it took when one
        denies); nothing is counted then."""
        return None

    async def ahit_together(
        self,
        groups: Sequence[tuple[str, Limits]],
        cost: int = 1,
        *,
        now: Now = None,
        usage: Usage = None,
    ) -> list[Decision] | None:
        """:meth:`hit_together` for ``async def`` views."""
        return None

    def refund_together(
        self,
        groups: Sequence[tuple[str, Limits]],
        cost: int = 1,
        *,
        looked: Sequence[Limits] | None = None,
        now: Now = None,
        taken_at: Sequence[Taken] = (),
    ) -> bool | list[Decision]:
        """:meth:`refund` of several clients' limits (``taken_at``: each group's instant, as
        :meth:`refund` takes it) as one step; ``False`` (the default) when this backend
        cannot, and gave nothing back. With ``looked`` (each group's limits given nothing
        back, by position), each group's report as :meth:`refund` gives it, a list, in place
        of ``True``."""
        return False

    async def arefund_together(
        self,
        groups: Sequence[tuple[str, Limits]],
        cost: int = 1,
        *,
        looked: Sequence[Limits] | None = None,
        now: Now = None,
        taken_at: Sequence[Taken] = (),
    ) -> bool | list[Decision]:
        """:meth:`refund_together` for ``async def`` views."""
        return False

    def release(self, client: str, limits: Limits, lease: str, *, now: Now = None) -> int:
        """Give back the slots ``client``'s hit took under ``lease`` (its
        ``Decision.leases``) in the concurrency limits among ``limits`` (the others are
        ignored), as one atomic step. Idempotent: a lease released, ended or never taken
        releases nothing. Returns the number of slots released."""
        raise NotImplementedError(f"{type(self).__name__} keeps no concurrency limits")

    arelease = async_twin(release)

    def renew(self, client: str, limits: Limits, lease: str, *, now: Now = None) -> int:
        """Extend each slot held under ``lease`` to now plus its limit's lease (its rate's
        period), while the request that took it runs. A lease that ended or was released is
        never revived: its slot may be another request's already. Returns the number of
        slots renewed."""
        raise NotImplementedError(f"{type(self).__name__} keeps no concurrency limits")

    def leases(self, client: str, limit: Limit, *, now: Now = None) -> list[tuple[str, float]]:
        """The leases held now in ``client``'s slots of the concurrency ``limit``, the
        soonest to end first: each lease's id and the seconds until it ends unless renewed.
        For the operator tools (what is in flight, and for how long); nothing for a limit of
        another algorithm."""
        raise NotImplementedError(f"{type(self).__name__} keeps no concurrency limits")

    @abstractmethod
    def reset(self, client: str, limits: Limits) -> list[bool]:
        """Refill the client's buckets for these limits (forget their state). Returns, for
        each limit, whether its bucket held state (``False``: it was whole, nothing was
        cleared)."""

    @abstractmethod
    def reset_shared(self, limits: Limits) -> list[int]:
        """Refill these shared limits in every key shard: the whole ceiling, for every client
        at once (:meth:`reset` of a client leaves a shared limit alone, since it is not the
        client's own). Limits that are not shared are ignored (0). Returns, for each limit,
        how many key shards held state of it."""

    @abstractmethod
    def retime(self, limits: Limits, *, now: Now = None, previous: Limits | None = None) -> int:
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


def client_digest(client: str) -> bytes:
    """The client's 96-bit digest: its keys' name, and (first two bytes) its shard."""
    return hashlib.blake2b(client.encode(), digest_size=DIGEST_SIZE).digest()


def shard_of(client: str, shards: int) -> int:
    """The key shard (``0 <= n < shards``) of every key of ``client``, the shared limits'
    among them: the Redis backend's hash tag, and the memory backend's twin of it."""
    digest = client_digest(client)
    return (digest[0] << 8 | digest[1]) % shards


def per_shard(limit: Limit, shards: int) -> Limit:
    """What each of ``shards`` shards enforces of a shared limit: ``ceil(count / shards)``
    per period and a burst of ``ceil(burst / shards)``; ``limit`` itself when it is not
    shared.

    Exact per shard, an approximation of the whole (clients spread over the shards by their
    digest; the total admitted is at most ``shards x`` the share). Rounding up keeps a small
    ceiling usable: 50/min over 16 shards is 4/min per shard, at most 64/min in all. Should
    the share break a rule of its algorithm (GCRA's whole-microsecond interval), the next
    larger count that keeps it is taken.
    """
    if not limit.shared or shards <= 1:
        return limit
    rate = limit.rate
    burst = math.ceil(limit.burst / shards)
    count = math.ceil(rate.count / shards)
    # A window or concurrency limit's burst is its count.
    window = limit.algorithm in WINDOW_ALGORITHMS or limit.algorithm == Algorithm.CONCURRENCY
    while True:
        try:
            share = Rate(count, rate.period, rate.calendar)
            return dataclasses.replace(limit, rate=share, burst=count if window else burst)
        except InvalidRate:
            if count >= rate.count:
                return limit
            count += 1


def decision_from(
    limits: Limits,
    allowed: bool,
    index: int,
    remaining: int,
    reset_us: float,
    retry_us: float,
    shadow: bool = False,
    taken: tuple[tuple[str, int], ...] = (),
) -> Decision:
    """Build a :class:`Decision` from a backend's reply (``index`` is 0-based; -1 when no
    enforced limit was passed, so nothing is reported); ``taken``: see ``Decision.taken``."""
    # Positional, in Decision's field order: a frozen dataclass takes keywords more slowly,
    # and one Decision is built per request.
    return Decision(
        allowed,
        limits[index] if index >= 0 else None,
        remaining,
        reset_us / 1e6,
        retry_us / 1e6,
        tuple(limits),
        shadow,
        False,
        False,
        False,
        False,
        taken,
    )
