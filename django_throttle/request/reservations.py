"""Reservations: tokens a request takes up front and gives back afterwards.

An endpoint rule's limits counted by IP address or username (rather than by client) are one
more backend call per such counter, after the client's: all are taken, or, when one denies,
those already taken are given back (:func:`hit_groups`), so a denied request consumes nothing
anywhere. A rule that counts only successes or only failures (``EndpointRule.counts``)
reserves like any other, so concurrent requests never pass its limits together; the
reservation is left on the request and :func:`settle` gives it back once the response shows
an outcome the rule does not count.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django_throttle import credentials
from django_throttle.backends import Backend, BackendError, get_backend
from django_throttle.backends.breaker import CircuitBreaker, get_breaker
from django_throttle.backends.usage_base import IF_DENIED
from django_throttle.plain import log_text
from django_throttle.rates import Decision, Limit

logger = logging.getLogger("django_throttle")

__all__ = [
    "Group",
    "Reservation",
    "ahit_groups",
    "alongest_wait",
    "asettle",
    "counted",
    "hit_groups",
    "longest_wait",
    "only_if_denied",
    "settle",
]

#: (client, limits): what one backend call counts.
Group = tuple[str, Sequence[Limit]]


@dataclass(frozen=True, slots=True)
class Reservation:
    """Tokens an allowed request took from its rule's limits, which :func:`settle` gives
    back when the outcome is one the rule does not count (``counts``: "success" or
    "failures"). Left on the request in ``throttle_reservations``."""

    counts: str
    cost: int
    groups: tuple[Group, ...]
    #: (client, instant) of each call that took the tokens (``Decision.taken``): the refund
    #: gives back what this request took, not what a later one did.
    taken: tuple[tuple[str, int], ...] = ()


def counted(counts: str, status: int, login_failed: bool = False) -> bool:
    """Whether a finished request keeps its reservation under a rule's ``counts``: every
    request for "all"; status below 400 for "success"; status 400-499, or a failed login
    during the request, for "failures" (a login form re-rendered with 200 is a failure)."""
    if counts == "success":
        return status < 400 and not login_failed
    if counts == "failures":
        return login_failed or 400 <= status < 500
    return True


def settle(request: Any, status: int, *, first: int = 0) -> None:
    """Give back the reservations left on ``request`` whose outcome (``status``, and whether
    ``user_login_failed`` fired for it) their rule does not count. Call it once the outcome
    is known; a backend error only means the tokens stay taken. ``first`` leaves the
    reservations made before that many alone (a check inside another settles its own)."""
    for client, limits, cost, taken_at in _refunds(request, status, first):
        try:
            get_breaker().call(get_backend().refund, client, limits, cost, taken_at=taken_at)
        except BackendError as exc:
            logger.warning("a reservation of %s could not be given back: %s", log_text(client), exc)


async def asettle(request: Any, status: int, *, first: int = 0) -> None:
    """:func:`settle` for async stacks: the refund is awaited on the event loop."""
    for client, limits, cost, taken_at in _refunds(request, status, first):
        try:
            await get_breaker().acall(
                get_backend().arefund, client, limits, cost, taken_at=taken_at
            )
        except BackendError as exc:
            logger.warning("a reservation of %s could not be given back: %s", log_text(client), exc)


def _refunds(
    request: Any, status: int, first: int
) -> list[tuple[str, Sequence[Limit], int, int | None]]:
    """The refunds the request's reservations from ``first`` on call for; those
    reservations are used up."""
    reservations: list[Reservation] | None = getattr(request, "throttle_reservations", None)
    if not reservations or len(reservations) <= first:
        return []
    request.throttle_reservations, reservations = reservations[:first], reservations[first:]
    login_failed = credentials.login_failed(request)
    return [
        (client, limits, reservation.cost, dict(reservation.taken).get(client))
        for reservation in reservations
        if not counted(reservation.counts, status, login_failed)
        for client, limits in reservation.groups
    ]


def hit_groups(
    head: Group,
    groups: Sequence[Group],
    cost: int,
    first: Decision,
    breaker: CircuitBreaker,
    backend: Backend,
    field: str | None = None,
) -> Decision:
    """Count the ``groups`` after ``head`` (already counted, with ``first`` the decision);
    on a denial give back what was taken (a denied request consumes nothing anywhere).

    The request is counted once in the usage report, under ``field``: every call but the
    last counts it only if it denies (:func:`only_if_denied`; the head's call too), the last
    call counts whatever it decides. When ``first`` is a denial, nothing more is taken: the
    groups are only looked at, for the longest wait (:func:`longest_wait`)."""
    if not first.allowed:
        return _reported(head, groups, [longest_wait(first, groups, cost, breaker, backend)])
    taken: list[Group] = [head]
    decisions = [first]
    try:
        for n, (client, limits) in enumerate(groups, 1):
            usage = field if n == len(groups) else only_if_denied(field)
            decision = breaker.call(backend.hit, client, limits, cost, usage=usage)
            if not decision.allowed:
                _give_back(taken, decisions, cost, breaker, backend)
                denied = longest_wait(decision, groups[n:], cost, breaker, backend)
                return _reported(head, groups, [denied])
            taken.append((client, limits))
            decisions.append(decision)
    except BackendError:
        _give_back(taken, decisions, cost, breaker, backend)
        raise
    return _reported(head, groups, decisions)


async def ahit_groups(
    head: Group,
    groups: Sequence[Group],
    cost: int,
    first: Decision,
    breaker: CircuitBreaker,
    backend: Backend,
    field: str | None = None,
) -> Decision:
    """:func:`hit_groups`, awaited."""
    if not first.allowed:
        denied = await alongest_wait(first, groups, cost, breaker, backend)
        return _reported(head, groups, [denied])
    taken: list[Group] = [head]
    decisions = [first]
    try:
        for n, (client, limits) in enumerate(groups, 1):
            usage = field if n == len(groups) else only_if_denied(field)
            decision = await breaker.acall(backend.ahit, client, limits, cost, usage=usage)
            if not decision.allowed:
                await _agive_back(taken, decisions, cost, breaker, backend)
                denied = await alongest_wait(decision, groups[n:], cost, breaker, backend)
                return _reported(head, groups, [denied])
            taken.append((client, limits))
            decisions.append(decision)
    except BackendError:
        await _agive_back(taken, decisions, cost, breaker, backend)
        raise
    return _reported(head, groups, decisions)


def longest_wait(
    denied: Decision,
    rest: Sequence[Group],
    cost: int,
    breaker: CircuitBreaker,
    backend: Backend,
) -> Decision:
    """The denial to report when ``denied`` stopped a request before the groups in ``rest``
    were counted: of ``denied`` and those groups' own denials (looked at, nothing taken),
    the one with the longest wait. ``Retry-After`` promises that the retry passes, so it
    must cover every counter that refuses now, not only the first one asked; the groups
    that allowed only fill up while the client waits. A group that cannot be looked at
    leaves the denial as it is: the request is refused either way."""
    worst = denied
    for client, limits in rest:
        try:
            decision = breaker.call(backend.peek, client, limits, cost=cost)
        except BackendError:
            break
        if not decision.allowed and decision.retry_after > worst.retry_after:
            worst = decision
    return worst


async def alongest_wait(
    denied: Decision,
    rest: Sequence[Group],
    cost: int,
    breaker: CircuitBreaker,
    backend: Backend,
) -> Decision:
    """:func:`longest_wait`, awaited."""
    worst = denied
    for client, limits in rest:
        try:
            decision = await breaker.acall(backend.apeek, client, limits, cost=cost)
        except BackendError:
            break
        if not decision.allowed and decision.retry_after > worst.retry_after:
            worst = decision
    return worst


def only_if_denied(field: str | None) -> str | None:
    """``field`` marked to be counted only when the call denies (``None`` stays ``None``)."""
    return None if not field else IF_DENIED + field


def _give_back(
    taken: list[Group],
    decisions: list[Decision],
    cost: int,
    breaker: CircuitBreaker,
    backend: Backend,
) -> None:
    at = dict(pair for decision in decisions for pair in decision.taken)
    for client, limits in taken:
        try:
            breaker.call(backend.refund, client, limits, cost, taken_at=at.get(client))
        except BackendError as exc:
            logger.warning(
                "tokens taken from %s could not be given back: %s", log_text(client), exc
            )


async def _agive_back(
    taken: list[Group],
    decisions: list[Decision],
    cost: int,
    breaker: CircuitBreaker,
    backend: Backend,
) -> None:
    at = dict(pair for decision in decisions for pair in decision.taken)
    for client, limits in taken:
        try:
            await breaker.acall(backend.arefund, client, limits, cost, taken_at=at.get(client))
        except BackendError as exc:
            logger.warning(
                "tokens taken from %s could not be given back: %s", log_text(client), exc
            )


def _reported(head: Group, groups: Sequence[Group], decisions: list[Decision]) -> Decision:
    """The most restrictive of the groups' decisions (a denial; else the fewest tokens
    left), listing every limit that applied."""
    worst = min(
        decisions,
        key=lambda d: (d.allowed, d.limit is None, d.remaining, -d.reset_after),
    )
    every = tuple(head[1]) + tuple(limit for _client, limits in groups for limit in limits)
    shadow = any(d.shadow for d in decisions)
    taken = tuple(pair for d in decisions for pair in d.taken) if worst.allowed else ()
    return dataclasses.replace(worst, limits=every, shadow=shadow, taken=taken)
