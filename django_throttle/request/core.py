"""The one path every adapter calls: identity → policy → one backend call → decision.

No DRF and no responses here; adapters turn the :class:`~django_throttle.rates.Decision` into
headers, a 429 or a 503. A backend failure goes through the process's circuit breaker and
becomes the failure mode that applies (open, closed or local), never an exception.

Limits counted by IP address or username, and rules that count only successes or failures,
reserve tokens that :mod:`~django_throttle.request.reservations` gives back when they
must not count.

The decision is written once: a plan (plain, :mod:`~django_throttle.request.planning`), the
backend calls the plan names, and a finish (plain, :mod:`~django_throttle.request.planning` too)
from the reply. Only the calls differ between :func:`check` and :func:`acheck`: made
blocking or awaited, through the circuit breaker, a :class:`BackendError` being a reply like
any other. Every call is a step: the plan's (``Plan.deciding``: the client's counter, then
those by IP address or username) and the refunds are generators in
:mod:`~django_throttle.request.planning` and :mod:`~django_throttle.request.reservations`
that yield each call they need, driven by :func:`run` (blocking) and :func:`arun` (awaited).
Counts kept while the backend was down are pushed once it answers again.

This module holds the adapters' entry points (:func:`check`, :func:`acheck`, :func:`settle`,
:func:`asettle`, :func:`plan`) and the :mod:`django_throttle.events` it sends; it promises
them to every adapter unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, TypedDict, TypeVar, Unpack

from asgiref.sync import sync_to_async
from django.utils.functional import LazyObject

from django_throttle import events
from django_throttle.backends import BackendError, get_backend
from django_throttle.backends.breaker import get_breaker
from django_throttle.conf import app_settings
from django_throttle.exemptions import is_exempt_view
from django_throttle.identity import Identity
from django_throttle.policy import live as policy_module
from django_throttle.policy.snapshot import Policy
from django_throttle.rates import UNLIMITED, Decision, Limit
from django_throttle.request.planning import (
    Plan,
    counted_decision,
    degraded_decision,
    make_plan,
    usage_outcome,
)
from django_throttle.request.reservations import Steps, settling
from django_throttle.usage import accounting as usage

T = TypeVar("T")


class CheckOptions(TypedDict, total=False):
    """The keyword arguments of :func:`check` (and :func:`acheck`): see :func:`check`."""

    scope: str | None
    limits: Sequence[Limit] | None
    cost: int | None
    failure_mode: str | None
    credential: bool
    rule_only: bool


#: What a request meets when the backend cannot answer (see ``DJANGO_THROTTLE_FAILURE_MODE``).
FAILURE_MODES = ("open", "closed", "local")


def check(request: Any, **options: Unpack[CheckOptions]) -> Decision:
    """Count ``request`` against its limits and say whether it may proceed.

    Without ``limits``, the admin policy decides: the client's tier limits plus those of the
    endpoint rule matching ``scope``, the URL route name or the path. With ``limits`` (a
    decorator's inline rate), exactly those apply. ``rule_only`` counts only the limits of
    the rule matching ``scope`` (no route or path match, no tier limits): a check before
    authentication, whose view counts the tier's limits later. A ``credential`` check
    (login, token), or any check under a credential rule (one counting failures or by
    username), meets the rule's limits counted by IP address and by username of every tier,
    whatever the caller's: they protect the account named and the server, so a signed-in
    caller or an API key holder guessing another account's password meets them.

    When the backend cannot answer, the failure mode is the first of: ``failure_mode``, the
    endpoint rule's, the tier's, the setting; a credential check (a ``credential`` endpoint,
    or any check under a credential rule) counts ``"local"`` where the setting says
    ``"open"``: an outage must neither open the door to password guessing nor lock the
    operators out of the admin.

    An allowed request whose rule counts only successes or failures leaves a
    :class:`Reservation` on ``request.throttle_reservations`` for :func:`settle`.
    """
    if not app_settings.ENABLED:
        return UNLIMITED
    match = getattr(request, "resolver_match", None)
    if match is not None and is_exempt_view(match.func):
        return UNLIMITED
    return decide(request, policy_module.current(), options)


def decide(request: Any, policy: Policy | None, options: CheckOptions) -> Decision:
    """:func:`check` for an adapter that has found its view not exempt and fetched the policy
    snapshot itself (the DRF throttle): each is decided once per request, and passed down."""
    # Timed only when someone listens (events.watching, read here without a call).
    watched = events.request_decided.receivers or events.request_throttled.receivers
    started = time.perf_counter() if watched else 0.0
    planned = make_plan(request, policy, None, **options)
    if not isinstance(planned, Plan):
        return planned
    reply = run(planned.deciding())
    if started or isinstance(reply, BackendError) or planned.refunds or reply.shadow:
        return _finished(planned, reply, request, started)
    return reply  # counted_decision's plain case: the backend's decision as it is


async def acheck(
    request: Any, *, user_loaded: bool = False, **options: Unpack[CheckOptions]
) -> Decision:
    """:func:`check` for ``async def`` views, with the same keyword arguments: the backend
    call is awaited on the event loop (``redis.asyncio``), never in a thread. Only work that
    may touch the database (reloading the policy snapshot, at most once per refresh
    interval; loading the signed-in user) and pushing counts kept while the backend was down
    run in a worker thread.

    ``request.user`` as ``AuthenticationMiddleware`` leaves it is a lazy object whose first
    read queries the database, which Django refuses on an event loop
    (``SynchronousOnlyOperation``). So the request is counted by the user Django's async
    API gives, ``await request.auser()``, as Django's own async ``login_required`` does (an
    anonymous request without a session costs no thread); the identity resolver and the
    user exemptions see that user as ``request.user``, and the view gets
    the lazy one back untouched. ``user_loaded=True`` says an authentication step already
    ran and set ``request.user`` (DRF's): it is read as it is."""
    if not app_settings.ENABLED:
        return UNLIMITED
    match = getattr(request, "resolver_match", None)
    if match is not None and is_exempt_view(match.func):
        return UNLIMITED
    # Timed only when someone listens (events.watching, read here without a call).
    watched = events.request_decided.receivers or events.request_throttled.receivers
    started = time.perf_counter() if watched else 0.0
    counted_as = None if user_loaded else await _async_user(request)
    snapshot = policy_module.fresh()
    if snapshot is None and options.get("limits") is None:
        snapshot = await sync_to_async(policy_module.current)()
    if counted_as is not None:
        # Shown to the identity resolver and the exemptions only (planning never awaits, so
        # nothing else runs meanwhile); the view gets the request's own user back.
        own, request.user = request.user, counted_as
    try:
        planned = make_plan(request, snapshot or policy_module.last(), None, **options)
    finally:
        if counted_as is not None:
            request.user = own
    if not isinstance(planned, Plan):
        return planned
    reply = await arun(planned.deciding())
    return _finished(planned, reply, request, started)


def settle(request: Any, status: int, *, first: int = 0) -> None:
    """Give back the reservations left on ``request`` whose outcome (``status``, and whether
    ``user_login_failed`` fired for it) their rule does not count. Call it once the outcome
    is known; a backend error only means the tokens stay taken. ``first`` leaves the
    reservations made before that many alone (a check inside another settles its own)."""
    run(settling(request, status, first))


async def asettle(request: Any, status: int, *, first: int = 0) -> None:
    """:func:`settle` for async stacks: the refunds are awaited on the event loop."""
    await arun(settling(request, status, first))


def _finished(
    planned: Plan, reply: Decision | BackendError, request: Any, started: float
) -> Decision:
    """The decision on a planned request, from the backend's ``reply`` (``started``: see
    :func:`check`)."""
    if isinstance(reply, BackendError):
        decision = degraded_decision(planned, reply, request)
    else:
        decision = counted_decision(planned, reply, request)
    if started:
        _announce(request, planned, decision, started)
    return decision


def plan(request: Any, identity: Identity, **options: Unpack[CheckOptions]) -> Plan | Decision:
    """What :func:`check` with these keyword arguments would count ``request`` against, were it sent
    by ``identity``, without calling the backend: the counters in the order the check calls
    them (``client``/``limits``, then ``groups``), the cost, the tier and the rule; or the
    decision it returns without counting (exempt, nothing applies). For the operator tools,
    which must see exactly what requests meet, never work it out another way."""
    match = getattr(request, "resolver_match", None)
    if match is not None and is_exempt_view(match.func):
        return UNLIMITED
    return make_plan(request, policy_module.current(), identity, **options)


async def _async_user(request: Any) -> Any:
    """The user to count ``request`` by on an event loop, when ``request.user`` is a lazy
    object that may query the database (see :func:`acheck`): ``await request.auser()``.
    ``None`` when ``request.user`` can be read as it is: a plain user object (set by a
    login, a remote-user middleware or an authentication class), or a lazy one without
    Django's ``auser`` twin, which is then evaluated in a worker thread."""
    user = getattr(request, "user", None)
    if not isinstance(user, LazyObject):  # a lazy object's type() is never its target's
        return None
    auser = getattr(request, "auser", None)
    if callable(auser):
        return await auser()
    await sync_to_async(bool)(user)  # evaluates the lazy object, in a worker thread
    return None


def _announce(request: Any, planned: Plan, decision: Decision, started: float) -> None:
    """Tell :mod:`django_throttle.events` listeners about a decision (only called when one
    listens)."""
    outcome = usage_outcome(decision)
    if outcome == usage.ALLOWED and decision.shadow:
        outcome = usage.SHADOW_DENIED
    about = {
        "request": request,
        "decision": decision,
        "tier": planned.tier.slug if planned.tier is not None else "",
        "endpoint": planned.endpoint.name if planned.endpoint is not None else "",
    }
    seconds = time.perf_counter() - started
    events.send(events.request_decided, check, outcome=outcome, seconds=seconds, **about)
    if outcome in (usage.DENIED, usage.SHADOW_DENIED):
        shadow = outcome == usage.SHADOW_DENIED
        events.send(events.request_throttled, check, shadow=shadow, **about)


def run(steps: Steps[T]) -> T:
    """Make the backend calls ``steps`` yield, blocking, through the process's circuit
    breaker; a :class:`BackendError` is raised into the steps at their ``yield``, anything
    else sent. Counts kept while the backend was down are pushed once it answers again."""
    try:
        call = next(steps)
        while True:
            try:
                with get_breaker().guard():
                    reply = call.send(get_backend())
            except BackendError as exc:
                call = steps.throw(exc)
                continue
            if usage.pending:
                usage.flush_pending()
            call = steps.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def arun(steps: Steps[T]) -> T:
    """:func:`run` on an event loop: each call is awaited (``redis.asyncio``, the backend's
    async method, through the call's ``asend``), never made in a thread; only pushing kept
    counts, which is blocking, runs in a worker thread."""
    try:
        call = next(steps)
        while True:
            try:
                with get_breaker().guard():
                    reply = await call.asend(get_backend())
            except BackendError as exc:
                call = steps.throw(exc)
                continue
            if usage.pending:
                await sync_to_async(usage.flush_pending, thread_sensitive=False)()
            call = steps.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
