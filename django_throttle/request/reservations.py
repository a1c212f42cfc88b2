"""Reservations: tokens a request takes up front and gives back afterwards.

An endpoint rule's limits counted by IP address or username (rather than by client) are one
more backend call per such counter, after the client's: all are taken, or, when one denies,
those already taken are given back (:func:`hit_groups`), so a denied request consumes nothing
anywhere. A rule that counts only successes or only failures (``EndpointRule.counts``)
reserves like any other, so concurrent requests never pass its limits together; the
reservation is left on the request and :func:`settling` gives it back once the response shows
an outcome the rule does not count (a status, or Django's ``user_login_failed`` for it).

Written once for sync and async callers, as steps (sans I/O): each function here is a
generator that yields the backend :data:`Call` it needs and receives its reply, a
:class:`~django_throttle.rates.Decision` (or ``None``), or has the call's
:class:`~django_throttle.backends.BackendError` raised at the ``yield``.
:func:`django_throttle.request.core.run` and :func:`~django_throttle.request.core.arun`
make the calls.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django_throttle.backends import BackendError
from django_throttle.backends.usage_base import IF_DENIED
from django_throttle.plain import log_text
from django_throttle.rates import Decision, Limit

logger = logging.getLogger("django_throttle")

T = TypeVar("T")

#: (client, limits): what one backend call counts.
Group = tuple[str, Sequence[Limit]]


@dataclass(frozen=True, slots=True)
class Hit:
    """Count ``cost`` against every limit of ``client``, all or nothing (the backend's
    ``hit``), the decision counted in usage under ``usage`` (``None``: not counted)."""

    client: str
    limits: Sequence[Limit]
    cost: int
    usage: str | None

    def send(self, backend: Any, *, usage: bool = True) -> Decision:
        return backend.hit(  # type: ignore[no-any-return]
            self.client, self.limits, self.cost, usage=self.usage if usage else None
        )

    async def asend(self, backend: Any) -> Decision:
        return await backend.ahit(  # type: ignore[no-any-return]
            self.client, self.limits, self.cost, usage=self.usage
        )


@dataclass(frozen=True, slots=True)
class Peek:
    """Whether ``cost`` would pass ``client``'s limits, nothing taken (the backend's ``peek``)."""

    client: str
    limits: Sequence[Limit]
    cost: int

    def send(self, backend: Any, *, usage: bool = True) -> Decision:
        return backend.peek(self.client, self.limits, cost=self.cost)  # type: ignore[no-any-return]

    async def asend(self, backend: Any) -> Decision:
        return await backend.apeek(  # type: ignore[no-any-return]
            self.client, self.limits, cost=self.cost
        )


@dataclass(frozen=True, slots=True)
class Refund:
    """Give ``cost`` back to ``client``'s limits, as of the instant the tokens were taken
    (``taken_at``; the backend's ``refund``)."""

    client: str
    limits: Sequence[Limit]
    cost: int
    taken_at: int | None

    def send(self, backend: Any, *, usage: bool = True) -> None:
        backend.refund(self.client, self.limits, self.cost, taken_at=self.taken_at)

    async def asend(self, backend: Any) -> None:
        await backend.arefund(self.client, self.limits, self.cost, taken_at=self.taken_at)


#: One backend call, as a typed value: the runners call its ``send`` (blocking) or await its
#: ``asend``, which call the backend's method by name in the code, so mypy and "find
#: usages" see every call.
Call = Hit | Peek | Refund
#: Steps that make backend calls and end with a ``T`` (see the module docstring).
Steps = Generator[Call, Any, T]

#: Set on the (Django) request when ``user_login_failed`` fires for it.
FAILED_ATTRIBUTE = "throttle_login_failed"
#: Set on the (Django) request when ``user_logged_in`` fires for it.
LOGGED_IN_ATTRIBUTE = "throttle_logged_in"


@dataclass(frozen=True, slots=True)
class Reservation:
    """Tokens an allowed request took from its rule's limits, which :func:`settling` gives
    back when the outcome is one the rule does not count (``counts``: "success" or
    "failures"). Left on the request in ``throttle_reservations``."""

    counts: str
    cost: int
    groups: tuple[Group, ...]
    #: (client, instant) of each call that took the tokens (``Decision.taken``): the refund
    #: gives back what this request took, not what a later one did.
    taken: tuple[tuple[str, int], ...] = ()
    #: Taken from the in-process backend (failure mode ``local``): given back there too.
    local: bool = False


@functools.cache
def watch_login_failures() -> None:
    """Connect the ``user_login_failed`` and ``user_logged_in`` receivers (once per
    process). Called on first need rather than in ``AppConfig.ready()``, so a site that
    counts no failures pays nothing."""
    from django.contrib.auth.signals import user_logged_in, user_login_failed

    user_login_failed.connect(_login_failed, dispatch_uid="django_throttle.login_failed")
    user_logged_in.connect(_logged_in, dispatch_uid="django_throttle.logged_in")


def _logged_in(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    """Mark the request of a real sign-in (``django.contrib.auth.login``): the only proof
    that earns the browser a device cookie (a 200 or 302 alone proves nothing)."""
    if user is not None:
        _mark(request, LOGGED_IN_ATTRIBUTE)


def _login_failed(sender: Any, credentials: Any = None, request: Any = None, **kwargs: Any) -> None:
    _mark(request, FAILED_ATTRIBUTE)


def _mark(request: Any, attribute: str) -> None:
    if request is None:
        return
    # DRF's serializers pass DRF's Request; the flag belongs on the Django request.
    target = getattr(request, "_request", request)
    with contextlib.suppress(AttributeError):  # a request object that takes no attributes
        setattr(target, attribute, True)


def login_failed(request: Any) -> bool:
    """Whether ``user_login_failed`` fired for ``request`` (once watching started)."""
    return bool(getattr(request, FAILED_ATTRIBUTE, False))


def counted(counts: str, status: int, login_failed: bool = False) -> bool:
    """Whether a finished request keeps its reservation under a rule's ``counts``: every
    request for "all"; status below 400 for "success"; status 400-499, or a failed login
    during the request, for "failures" (a login form re-rendered with 200 is a failure)."""
    if counts == "success":
        return status < 400 and not login_failed
    if counts == "failures":
        return login_failed or 400 <= status < 500
    return True


def settling(request: Any, status: int, first: int = 0) -> Steps[None]:
    """Give back the reservations left on ``request`` whose outcome (``status``, and whether
    ``user_login_failed`` fired for it) their rule does not count; those reservations are
    used up. A backend error only means the tokens stay taken. ``first`` leaves the
    reservations made before that many alone (a check inside another settles its own)."""
    reservations: list[Reservation] | None = getattr(request, "throttle_reservations", None)
    if not reservations or len(reservations) <= first:
        return
    request.throttle_reservations, reservations = reservations[:first], reservations[first:]
    failed = login_failed(request)
    for reservation in reservations:
        if not counted(reservation.counts, status, failed):
            at = dict(reservation.taken)
            refunds = _give_back(reservation.groups, reservation.cost, at, "a reservation of")
            if reservation.local:
                run_locally(refunds)
            else:
                yield from refunds


def run_locally(steps: Steps[T]) -> T:
    """Make the calls ``steps`` yield on the process's in-process backend (failure mode
    ``local``), blocking: it answers from memory, so an event loop may call it too. Usage is
    not counted there (the request path records degraded decisions itself)."""
    from django_throttle.backends import get_local_backend

    backend = get_local_backend()
    try:
        call = next(steps)
        while True:
            try:
                reply = call.send(backend, usage=False)
            except BackendError as exc:
                call = steps.throw(exc)
                continue
            call = steps.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def hit_groups(
    head: Group, groups: Sequence[Group], cost: int, first: Decision, field: str | None = None
) -> Steps[Decision | BackendError]:
    """Count the ``groups`` after ``head`` (already counted, with ``first`` the decision);
    on a denial give back what was taken (a denied request consumes nothing anywhere). A
    backend error stops the counting: what was taken is given back, and the error is the
    result.

    The request is counted once in the usage report, under ``field``: every call but the
    last counts it only if it denies (:func:`only_if_denied`; the head's call too), the last
    call counts whatever it decides. When ``first`` is a denial, nothing more is taken: the
    groups are only looked at, for the longest wait (:func:`longest_wait`)."""
    if not first.allowed:
        denied = yield from longest_wait(first, groups, cost)
        return _reported(head, groups, [denied])
    taken: list[Group] = [head]
    decisions = [first]
    try:
        for n, (client, limits) in enumerate(groups, 1):
            usage = field if n == len(groups) else only_if_denied(field)
            decision = yield Hit(client, limits, cost, usage)
            if not decision.allowed:
                yield from _give_back(taken, cost, _taken_at(decisions), "tokens taken from")
                denied = yield from longest_wait(decision, groups[n:], cost)
                return _reported(head, groups, [denied])
            taken.append((client, limits))
            decisions.append(decision)
    except BackendError as exc:
        yield from _give_back(taken, cost, _taken_at(decisions), "tokens taken from")
        return exc
    return _reported(head, groups, decisions)


def longest_wait(denied: Decision, rest: Sequence[Group], cost: int) -> Steps[Decision]:
    """The denial to report when ``denied`` stopped a request before the groups in ``rest``
    were counted: of ``denied`` and those groups' own denials (looked at, nothing taken),
    the one with the longest wait. ``Retry-After`` promises that the retry passes, so it
    must cover every counter that refuses now, not only the first one asked; the groups
    that allowed only fill up while the client waits. A group that cannot be looked at
    leaves the denial as it is: the request is refused either way."""
    worst = denied
    for client, limits in rest:
        try:
            decision = yield Peek(client, limits, cost)
        except BackendError:
            break
        if not decision.allowed and decision.retry_after > worst.retry_after:
            worst = decision
    return worst


def only_if_denied(field: str | None) -> str | None:
    """``field`` marked to be counted only when the call denies (``None`` stays ``None``)."""
    return None if not field else IF_DENIED + field


def _taken_at(decisions: list[Decision]) -> dict[str, int]:
    return dict(pair for decision in decisions for pair in decision.taken)


def _give_back(groups: Sequence[Group], cost: int, at: dict[str, int], what: str) -> Steps[None]:
    """Refund ``cost`` to each group, each to the instant ``at`` names for its client; a
    refund the backend cannot make is logged (``what`` the client's tokens are) and left."""
    for client, limits in groups:
        try:
            yield Refund(client, limits, cost, at.get(client))
        except BackendError as exc:
            logger.warning("%s %s could not be given back: %s", what, log_text(client), exc)


def _reported(head: Group, groups: Sequence[Group], decisions: list[Decision]) -> Decision:
    """The most restrictive of the groups' decisions (a denial; else the fewest tokens
    left), listing every limit that applied."""
    worst = min(decisions, key=lambda d: (d.allowed, d.limit is None, d.remaining, -d.reset_after))
    every = tuple(head[1]) + tuple(limit for _client, limits in groups for limit in limits)
    shadow = any(d.shadow for d in decisions)
    taken = tuple(pair for d in decisions for pair in d.taken) if worst.allowed else ()
    return dataclasses.replace(worst, limits=every, shadow=shadow, taken=taken)
