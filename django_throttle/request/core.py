"""The one path every adapter calls: identity → policy → one backend call → decision.

No DRF and no responses here; adapters turn the :class:`~django_throttle.rates.Decision` into
headers, a 429 or a 503. A backend failure goes through the process's circuit breaker and
becomes the failure mode that applies (open, closed or local), never an exception.

Limits counted by IP address or username, and rules that count only successes or failures,
reserve tokens that :mod:`~django_throttle.request.reservations` gives back when they
must not count.

The decision is written once: a plan (plain), the one backend call the plan names, and a
finish (plain) from its reply. Only that call differs between :func:`check` and
:func:`acheck`: made blocking or awaited, through the circuit breaker, a
:class:`BackendError` being a reply like any other. What takes more calls (the counters by IP
address or username after the client's, refunds) is written as steps in
:mod:`~django_throttle.request.reservations`, generators that yield each call they need, driven by
:func:`run` (blocking) and :func:`arun` (awaited).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar, Unpack

from asgiref.sync import sync_to_async
from django.utils.functional import LazyObject

from django_throttle import events
from django_throttle.backends import (
    ArgumentRefused,
    BackendError,
    get_backend,
    get_local_backend,
)
from django_throttle.backends.breaker import get_breaker
from django_throttle.conf import app_settings
from django_throttle.exemptions import is_exempt_view
from django_throttle.identity import UNIDENTIFIED, Identity, client_ip
from django_throttle.plain import log_text
from django_throttle.policy import live as policy_module
from django_throttle.policy.exemptions import exempt_client
from django_throttle.policy.resolver import get_resolver
from django_throttle.policy.snapshot import EndpointPolicy, Policy, TierPolicy
from django_throttle.rates import UNLIMITED, Decision, Limit
from django_throttle.request.reservations import (
    Call,
    Group,
    Reservation,
    Steps,
    hit_groups,
    only_if_denied,
    settling,
    watch_login_failures,
)
from django_throttle.request.usernames import username_counters
from django_throttle.usage import accounting as usage

logger = logging.getLogger("django_throttle")

__all__ = [
    "FAILURE_MODES",
    "CheckOptions",
    "acheck",
    "arun",
    "asettle",
    "check",
    "plan",
    "run",
    "settle",
]

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
#: Seconds between two error lines about unidentifiable clients, per process.
UNIDENTIFIED_LOG_INTERVAL = 60.0

_FAILED_OPEN = Decision(allowed=True, limit=None, remaining=0, reset_after=0.0, failed_open=True)
_UNIDENTIFIED_DENIED = Decision(
    allowed=False, limit=None, remaining=0, reset_after=0.0, unavailable=True, unidentified=True
)
_SHARED_UNKNOWN = Identity("ip", "unknown")
_last_unidentified_log = -UNIDENTIFIED_LOG_INTERVAL


@dataclass(slots=True)
class _Plan:
    """What a request will be counted against, worked out before the backend call: the
    first group (``client``, ``limits``), the further ``groups`` (limits counted by IP
    address or username), and what the rule's counting policy may give back."""

    client: str
    limits: Sequence[Limit]
    cost: int
    field: str | None
    failure_mode: str | None
    credential: bool
    policy: Policy | None
    tier: TierPolicy | None
    endpoint: EndpointPolicy | None
    groups: tuple[Group, ...] = ()
    refunds: tuple[Group, ...] = ()

    def first_call(self) -> Call:
        """The one backend call of a request (the first of several with ``groups``)."""
        field = only_if_denied(self.field) if self.groups else self.field
        return ("hit", (self.client, self.limits, self.cost), {"usage": field})

    def rest(self, first: Decision) -> Steps[Decision | BackendError]:
        """The ``groups``' calls after the first call decided ``first``."""
        head = (self.client, self.limits)
        return hit_groups(head, self.groups, self.cost, first, self.field)


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
    endpoint rule's, the tier's, ``"closed"`` for a ``credential`` endpoint (login, token: an
    outage must not open the door to password guessing), the setting.

    An allowed request whose rule counts only successes or failures leaves a
    :class:`Reservation` on ``request.throttle_reservations`` for :func:`settle`.
    """
    if not app_settings.ENABLED:
        return UNLIMITED
    started = time.perf_counter() if events.watching() else 0.0
    planned = _plan(request, policy_module.current, None, **options)
    if not isinstance(planned, _Plan):
        return planned
    reply = _called(planned.first_call())
    if planned.groups and isinstance(reply, Decision):
        reply = run(planned.rest(reply))
    return _finished(planned, reply, request, started)


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
    staff and superuser exemptions see that user as ``request.user``, and the view gets
    the lazy one back untouched. ``user_loaded=True`` says an authentication step already
    ran and set ``request.user`` (DRF's): it is read as it is."""
    if not app_settings.ENABLED:
        return UNLIMITED
    started = time.perf_counter() if events.watching() else 0.0
    counted_as = None if user_loaded else await _async_user(request)
    snapshot = policy_module.fresh()
    if snapshot is None and options.get("limits") is None:
        snapshot = await sync_to_async(policy_module.current)()
    plan = functools.partial(
        _plan, request, lambda: snapshot or policy_module.last(), None, **options
    )
    if counted_as is None:
        planned = plan()
    else:
        # Shown to the identity resolver and the exemptions only (planning never awaits, so
        # nothing else runs meanwhile); the view gets the request's own user back.
        own, request.user = request.user, counted_as
        try:
            planned = plan()
        finally:
            request.user = own
    if not isinstance(planned, _Plan):
        return planned
    reply = await _acalled(planned.first_call())
    if planned.groups and isinstance(reply, Decision):
        reply = await arun(planned.rest(reply))
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


def run(steps: Steps[T]) -> T:
    """Make the backend calls ``steps`` yield, blocking, through the process's circuit
    breaker; a :class:`BackendError` is raised into the steps at their ``yield``. Counts
    kept while the backend was down are pushed once it answers again."""
    try:
        call = next(steps)
        while True:
            reply = _called(call)  # an error is raised into the steps, anything else sent
            call = steps.throw(reply) if isinstance(reply, BackendError) else steps.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def arun(steps: Steps[T]) -> T:
    """:func:`run` on an event loop: each call is awaited (``redis.asyncio``), never made in
    a thread; only pushing kept counts, which is blocking, runs in a worker thread."""
    try:
        call = next(steps)
        while True:
            reply = await _acalled(call)
            call = steps.throw(reply) if isinstance(reply, BackendError) else steps.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _called(call: Call) -> Any:
    """The reply to one call: what the backend returned, or the :class:`BackendError`."""
    name, args, kwargs = call
    try:
        with get_breaker().guard():
            reply = getattr(get_backend(), name)(*args, **kwargs)
    except BackendError as exc:
        return exc
    if usage.pending:
        usage.flush_pending()
    return reply


async def _acalled(call: Call) -> Any:
    """:func:`_called`, awaited."""
    name, args, kwargs = call
    try:
        with get_breaker().guard():
            reply = await getattr(get_backend(), "a" + name)(*args, **kwargs)
    except BackendError as exc:
        return exc
    if usage.pending:
        await sync_to_async(usage.flush_pending, thread_sensitive=False)()
    return reply


def _finished(
    planned: _Plan, reply: Decision | BackendError, request: Any, started: float
) -> Decision:
    """The decision on a planned request, from the backend's ``reply`` (``started``: see
    :func:`check`)."""
    if isinstance(reply, BackendError):
        decision = _degraded(planned, isinstance(reply, ArgumentRefused))
    else:
        decision = _counted(planned, reply, request)
    if started:
        _announce(request, planned, decision, started)
    return decision


def plan(
    request: Any,
    identity: Identity,
    *,
    scope: str | None = None,
    credential: bool = False,
    rule_only: bool = False,
) -> _Plan | Decision:
    """What :func:`check` with these arguments would count ``request`` against, were it sent
    by ``identity``, without calling the backend: the counters in the order the check calls
    them (``client``/``limits``, then ``groups``), the cost, the tier and the rule; or the
    decision it returns without counting (exempt, nothing applies). For the operator tools,
    which must see exactly what requests meet, never work it out another way."""
    return _plan(
        request, policy_module.current, identity, scope, credential=credential, rule_only=rule_only
    )


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
    await sync_to_async(_is_authenticated)(user)
    return None


def _is_authenticated(user: Any) -> bool:
    return bool(getattr(user, "is_authenticated", False))


def _plan(
    request: Any,
    snapshot: Callable[[], Policy | None],
    identity: Identity | None = None,
    scope: str | None = None,
    limits: Sequence[Limit] | None = None,
    cost: int | None = None,
    failure_mode: str | None = None,
    credential: bool = False,
    rule_only: bool = False,
) -> _Plan | Decision:
    """Identity, policy lookup and usage field: everything but the backend call. An exempt
    view, user or address stops here: no backend call, no headers."""
    match = getattr(request, "resolver_match", None)
    if match is not None and is_exempt_view(match.func):
        return UNLIMITED
    policy = snapshot()
    if identity is None:
        identity = get_resolver()(request)
    if exempt_client(identity, policy.exemptions if policy is not None else None):
        return UNLIMITED
    if identity.kind == UNIDENTIFIED.kind:
        decision = _unidentified()
        if decision is not None:
            return decision
        identity = _SHARED_UNKNOWN
    tier_slug = endpoint_name = ""
    tier = endpoint = None
    groups: tuple[tuple[str, tuple[Limit, ...]], ...] = ()
    if limits is None:
        if policy is None:
            return UNLIMITED
        if rule_only:
            endpoint = policy.match(request.method or "GET", scope)
            if endpoint is None:
                return UNLIMITED
        else:
            endpoint = policy.match(
                request.method or "GET", scope, _route_name(request), request.path_info
            )
        tier = policy.tier_for(identity)
        limits = policy.limits_for(tier, endpoint)
        if endpoint is not None:
            cost = endpoint.cost if cost is None else cost
            endpoint_name = endpoint.name
            if rule_only and tier is not None:
                limits = endpoint.rule_limits_by_tier.get(tier.id, ())
            groups = policy.groups_for(tier, endpoint, credential)
        if tier is not None:
            tier_slug = tier.slug
    if groups and endpoint is not None:
        return _grouped(
            request,
            identity,
            limits,
            groups,
            endpoint,
            tier,
            cost,
            failure_mode,
            credential,
            policy,
            usage.field_for(
                tier_slug, endpoint_name or scope or "", before_authentication=rule_only
            ),
        )
    if not limits:
        return UNLIMITED
    planned = _Plan(  # positional, in field order: once per request
        identity.key,
        limits,
        1 if cost is None else cost,
        usage.field_for(tier_slug, endpoint_name or scope or "", before_authentication=rule_only),
        failure_mode,
        credential,
        policy,
        tier,
        endpoint,
    )
    if endpoint is not None and endpoint.counts != "all" and tier is not None:
        own = endpoint.rule_limits_by_tier.get(tier.id, ())
        if own:
            planned.refunds = ((identity.key, own),)
    return planned


def _grouped(
    request: Any,
    identity: Identity,
    limits: Sequence[Limit],
    groups: tuple[tuple[str, tuple[Limit, ...]], ...],
    endpoint: EndpointPolicy,
    tier: TierPolicy | None,
    cost: int | None,
    failure_mode: str | None,
    credential: bool,
    policy: Policy | None,
    field: str | None,
) -> _Plan | Decision:
    """The plan of a rule with limits counted by IP address or username: one group per
    distinct counter, the client's first. A counter equal to the client's (an anonymous
    client's IP address) joins its group, so the call count stays as low as it can."""
    own = endpoint.rule_limits_by_tier.get(tier.id, ()) if tier is not None else ()
    calls: dict[str, list[Limit]] = {identity.key: list(limits)}
    refunds: dict[str, list[Limit]] = {identity.key: list(own)}
    for counted_by, counted in groups:
        if counted_by == "ip":
            address = client_ip(request.META)
            if address is None:
                continue
            key = Identity("ip", address).key
        else:
            for key in username_counters(request):  # none: nothing presented
                calls.setdefault(key, []).extend(counted)
                refunds.setdefault(key, []).extend(counted)
            continue
        calls.setdefault(key, []).extend(counted)
        refunds.setdefault(key, []).extend(counted)
    planned_groups = [(key, tuple(found)) for key, found in calls.items() if found]
    if not planned_groups:
        return UNLIMITED
    (client, first), *rest = planned_groups
    planned = _Plan(
        client,
        first,
        1 if cost is None else cost,
        field,
        failure_mode,
        credential,
        policy,
        tier,
        endpoint,
        tuple(rest),
    )
    if endpoint.counts != "all":
        planned.refunds = tuple((key, tuple(found)) for key, found in refunds.items() if found)
    return planned


def _counted(planned: _Plan, decision: Decision, request: Any) -> Decision:
    if decision.shadow:
        logger.info(
            "shadow rule %r would deny %s",
            planned.endpoint.name if planned.endpoint is not None else "",
            log_text(planned.client),
        )
    if planned.refunds and decision.allowed and planned.endpoint is not None:
        counts = planned.endpoint.counts
        if counts == "failures":
            watch_login_failures()
        reservation = Reservation(counts, planned.cost, planned.refunds, decision.taken)
        reservations = getattr(request, "throttle_reservations", None)
        if reservations is None:
            request.throttle_reservations = [reservation]
        else:
            reservations.append(reservation)
    return decision


def _degraded(planned: _Plan, refused: bool = False) -> Decision:
    """The decision when the backend could not answer, by failure mode, counted in-process
    until the backend is back. A ``refused`` call (the backend answered, refusing one of our
    arguments: a bug, logged by the breaker) is counted in-process where the mode would
    serve it uncounted: whatever provoked it must not slip past the limits.

    The breaker logs when it opens and closes; a line per failed request would flood the log
    exactly when the operator needs it. The mode is only worked out here, off the healthy
    path."""
    failure_mode = planned.failure_mode
    default = "closed" if planned.credential else None
    if failure_mode is None and planned.policy is not None:
        failure_mode = planned.policy.failure_mode_for(planned.tier, planned.endpoint, default)
    failure_mode = failure_mode or default or app_settings.FAILURE_MODE
    if refused and failure_mode == "open":
        failure_mode = "local"
    limits, client = planned.limits, planned.client
    if failure_mode == "closed":
        decision = Decision(
            allowed=False,
            limit=None,
            remaining=0,
            reset_after=0.0,
            retry_after=get_breaker().retry_after(),
            limits=tuple(limits),
            unavailable=True,
        )
    elif failure_mode == "local":
        local = get_local_backend().hit(client, limits, planned.cost)
        decision = dataclasses.replace(local, local=True)
    else:
        decision = _FAILED_OPEN
    usage.record_degraded(planned.field, client, _outcome(decision))
    return decision


def _announce(request: Any, planned: _Plan, decision: Decision, started: float) -> None:
    """Tell :mod:`django_throttle.events` listeners about a decision (only called when one
    listens)."""
    tier = planned.tier.slug if planned.tier is not None else ""
    endpoint = planned.endpoint.name if planned.endpoint is not None else ""
    outcome = _outcome(decision)
    if outcome == usage.ALLOWED and decision.shadow:
        outcome = usage.SHADOW_DENIED
    events.send(
        events.request_decided,
        check,
        request=request,
        decision=decision,
        tier=tier,
        endpoint=endpoint,
        outcome=outcome,
        seconds=time.perf_counter() - started,
    )
    if outcome in (usage.DENIED, usage.SHADOW_DENIED):
        events.send(
            events.request_throttled,
            check,
            request=request,
            decision=decision,
            tier=tier,
            endpoint=endpoint,
            shadow=outcome == usage.SHADOW_DENIED,
        )


def _unidentified() -> Decision | None:
    """Apply ``DJANGO_THROTTLE_UNKNOWN_CLIENT`` to a request with no usable address: the
    decision to return, or ``None`` to count it in the one shared bucket."""
    global _last_unidentified_log
    choice = app_settings.UNKNOWN_CLIENT
    now = time.monotonic()
    if now - _last_unidentified_log >= UNIDENTIFIED_LOG_INTERVAL:
        _last_unidentified_log = now
        logger.error(
            "A request has no usable client address (REMOTE_ADDR is empty or not an IP), so it "
            "cannot be rate limited per client; DJANGO_THROTTLE_UNKNOWN_CLIENT = %r %s. Behind "
            "a proxy that connects over a Unix socket, set DJANGO_THROTTLE_TRUSTED_PROXY_COUNT "
            "so the address comes from X-Forwarded-For. (Logged at most once a minute.)",
            choice,
            {
                "deny": "refuses such requests",
                "allow": "serves them uncounted",
                "shared": "counts them all in one shared bucket",
            }.get(choice, "refuses such requests"),
        )
    if choice == "allow":
        return _FAILED_OPEN
    if choice == "shared":
        return None
    return _UNIDENTIFIED_DENIED


def _outcome(decision: Decision) -> str:
    """The usage column of a decision the backend did not make."""
    if decision.unavailable:
        return usage.FAILED_CLOSED
    if decision.failed_open:
        return usage.FAILED_OPEN
    return usage.ALLOWED if decision.allowed else usage.DENIED


def _route_name(request: Any) -> str | None:
    match = getattr(request, "resolver_match", None)
    return match.view_name if match is not None else None
