"""The plain halves of a request: its plan, what :func:`~django_throttle.request.core.check`
will count it against, worked out before any backend call; and its finish, the decision
from the backend's reply.

Holds the plan itself (the client's counter and limits, the further groups counted by IP
address or username, what the rule may give back) and how it is made from the request, its
identity and the policy snapshot: exempt users and addresses stop here (exempt views stop
before, in :mod:`~django_throttle.request.core` or the adapter), as do clients with no usable
address (refused: ``conf.UNKNOWN_CLIENT``). What a rule and a tier come to is worked out once
per policy version and kept in the snapshot's store (``Policy.compiled``). Plain: no backend
call, no awaiting, so planning is the same for blocking and async checks.

A reply the backend made becomes the decision as it is, leaving a
:class:`~django_throttle.request.reservations.Reservation` on the request when its rule
counts only successes or failures; a :class:`~django_throttle.backends.BackendError`
becomes the decision of the failure mode that applies (open, closed or local), counted
in-process until the backend is back, and recorded in usage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from django_throttle.backends import ArgumentRefused, BackendError
from django_throttle.backends.base import NodeUnavailable
from django_throttle.backends.breaker import get_breaker
from django_throttle.conf import UNKNOWN_CLIENT, app_settings
from django_throttle.identity import UNIDENTIFIED, Identity, client_ip
from django_throttle.plain import log_text
from django_throttle.policy.exemptions import exempt_client
from django_throttle.policy.resolver import import_resolver
from django_throttle.policy.snapshot import CountedGroup, EndpointPolicy, Policy, TierPolicy
from django_throttle.rates import UNLIMITED, Decision, Limit
from django_throttle.request.reservations import (
    Group,
    Hit,
    Reservation,
    Steps,
    hit_groups,
    only_if_denied,
    run_locally,
    watch_login_failures,
)
from django_throttle.request.usernames import username_counters
from django_throttle.usage import accounting as usage

logger = logging.getLogger("django_throttle")

#: Seconds between two error lines about unidentifiable clients, per process.
UNIDENTIFIED_LOG_INTERVAL = 60.0

_FAILED_OPEN = Decision(allowed=True, limit=None, remaining=0, reset_after=0.0, failed_open=True)
_UNIDENTIFIED_DENIED = Decision(
    allowed=False, limit=None, remaining=0, reset_after=0.0, unavailable=True, unidentified=True
)
#: A closed failure mode's refusal, completed per request with the breaker's wait.
_FAILED_CLOSED = Decision(allowed=False, limit=None, remaining=0, reset_after=0.0, unavailable=True)
_UNKNOWN_CLIENT_CHOICES = {
    "allow": "serves them uncounted",
    "shared": "counts them all in one shared bucket",
}
_SHARED_UNKNOWN = Identity("ip", "unknown")
_last_unidentified_log = -UNIDENTIFIED_LOG_INTERVAL


@dataclass(slots=True)
class Plan:
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

    def deciding(self) -> Steps[Decision | BackendError]:
        """The request's backend calls: the first group's, then the further ``groups``'
        (:func:`hit_groups`); ends with the decision, or the error that stopped them."""
        field = only_if_denied(self.field) if self.groups else self.field
        try:
            first = yield Hit(self.client, self.limits, self.cost, field)
        except BackendError as exc:
            return exc
        if not self.groups:
            return first  # type: ignore[no-any-return]
        head = (self.client, self.limits)
        return (yield from hit_groups(head, self.groups, self.cost, first, self.field))


def make_plan(
    request: Any,
    policy: Policy | None,
    identity: Identity | None = None,
    scope: str | None = None,
    limits: Sequence[Limit] | None = None,
    cost: int | None = None,
    failure_mode: str | None = None,
    credential: bool = False,
    rule_only: bool = False,
) -> Plan | Decision:
    """Identity, policy lookup and usage field: everything but the backend call, on the
    snapshot ``policy`` (the caller has found the view not exempt). An exempt user or
    address stops here: no backend call, no headers."""
    if identity is None:
        identity = import_resolver(app_settings.IDENTITY_RESOLVER)(request)
    if (
        policy is not None
        and policy.exemptions.active
        and exempt_client(identity, policy.exemptions)
    ):
        return UNLIMITED
    if identity.kind == UNIDENTIFIED.kind:
        decision = _unidentified()
        if decision is not None:
            return decision
        identity = _SHARED_UNKNOWN
    if limits is not None:  # a decorator's inline limits: only the usage field to look up
        store: dict[Any, Any] = policy.compiled if policy is not None else {}
        field_key = ("field", scope, rule_only)
        if field_key not in store:
            store[field_key] = _inline_field(scope, rule_only)
        field = store[field_key]
        planned = Plan(
            identity.key,
            limits,
            1 if cost is None else cost,
            field,
            failure_mode,
            credential,
            policy,
            None,
            None,
        )
        return planned if limits else UNLIMITED
    if policy is None:
        return UNLIMITED
    tier = policy.tier_for(identity)
    if rule_only:  # the rule of ``scope`` alone: no route or path match
        route, path = None, ""
    else:
        match = getattr(request, "resolver_match", None)
        route = match.view_name if match is not None else None
        # Only rules by path read the path: without any, one entry serves every path.
        path = request.path_info if policy.by_path else ""
    tier_id = tier.id if tier is not None else None
    key = (request.method or "GET", scope, route, path, tier_id, rule_only, credential)
    found = policy.compiled.get(key)
    if found is None:
        found = _found(policy, key, tier)
    if isinstance(found, Decision):  # no rule of a rule-only check's scope
        return found
    endpoint, limits, rule_cost, field, is_credential, own, groups = found
    planned = Plan(
        identity.key,
        limits,
        rule_cost if cost is None else cost,
        field,
        failure_mode,
        is_credential,
        policy,
        tier,
        endpoint,
    )
    if own:
        planned.refunds = ((identity.key, own),)
    if groups:
        return _grouped(planned, request, groups)
    return planned if limits else UNLIMITED


def _inline_field(scope: str | None, rule_only: bool) -> str | None:
    """The usage field of a check with inline limits (no tier, no rule)."""
    return usage.field_for("", scope or "", before_authentication=rule_only)


#: Most entries :func:`_found` keeps per snapshot: a key holds the path when rules match by
#: path, and paths are chosen by clients.
MAX_COMPILED = 4096

_Found = tuple[
    EndpointPolicy | None,
    tuple[Limit, ...],
    int,
    str | None,
    bool,
    tuple[Limit, ...],
    tuple[CountedGroup, ...],
]


def _found(policy: Policy, key: tuple[Any, ...], tier: TierPolicy | None) -> _Found | Decision:
    """What a request meets under ``policy`` for ``key`` (method, scope, route, path, tier
    id, rule only, credential; ``tier`` the tier that id names): its rule, its limits, the
    rule's cost, its usage field, whether it is a credential check, what the rule may give
    back, and the limits counted by IP address or username. Kept in the snapshot's own store,
    so it is worked out once per policy version."""
    method, scope, route, path, _tier_id, rule_only, credential = key
    endpoint = policy.match(method, scope, route, path)
    found: _Found | Decision
    if rule_only and endpoint is None:
        found = UNLIMITED
    else:
        limits = policy.limits_for(tier, endpoint)
        own: tuple[Limit, ...] = ()
        groups: tuple[CountedGroup, ...] = ()
        if endpoint is not None:
            if rule_only and tier is not None:
                limits = endpoint.rule_limits_by_tier.get(tier.id, ())
            if tier is not None and endpoint.counts != "all":
                own = endpoint.rule_limits_by_tier.get(tier.id, ())
            groups = policy.groups_for(tier, endpoint, credential)
        field = usage.field_for(
            tier.slug if tier is not None else "",
            (endpoint.name if endpoint is not None else "") or scope or "",
            before_authentication=rule_only,
        )
        # A check under a credential rule is a credential check whichever adapter makes it:
        # it meets every tier's counters, and is never served uncounted (see failure_mode).
        is_credential = credential or (endpoint is not None and endpoint.credential)
        cost = endpoint.cost if endpoint is not None else 1
        found = (endpoint, limits, cost, field, is_credential, own, groups)
    if len(policy.compiled) < MAX_COMPILED:
        policy.compiled[key] = found
    return found


def _grouped(
    planned: Plan, request: Any, groups: tuple[tuple[str, tuple[Limit, ...]], ...]
) -> Plan | Decision:
    """``planned`` with the rule's limits counted by IP address or username added: one group
    per distinct counter, the client's first. A counter equal to the client's (an anonymous
    client's IP address) joins its group, so the call count stays as low as it can."""
    calls: dict[str, list[Limit]] = {planned.client: list(planned.limits)}
    refunds = {planned.client: [limit for _, own in planned.refunds for limit in own]}
    for counted_by, counted in groups:
        if counted_by == "ip":
            address = client_ip(request.META)
            keys: tuple[str, ...] = () if address is None else (Identity("ip", address).key,)
        else:
            keys = username_counters(request)  # none: nothing presented
        for key in keys:
            calls.setdefault(key, []).extend(counted)
            refunds.setdefault(key, []).extend(counted)
    found = [(key, tuple(limits)) for key, limits in calls.items() if limits]
    if not found:
        return UNLIMITED
    (planned.client, planned.limits), *rest = found
    planned.groups = tuple(rest)
    if planned.endpoint is not None and planned.endpoint.counts != "all":
        planned.refunds = tuple((key, tuple(limits)) for key, limits in refunds.items() if limits)
    return planned


def _unidentified() -> Decision | None:
    """Apply ``conf.UNKNOWN_CLIENT`` to a request with no usable address: the
    decision to return, or ``None`` to count it in the one shared bucket."""
    global _last_unidentified_log
    choice = UNKNOWN_CLIENT
    now = time.monotonic()
    if now - _last_unidentified_log >= UNIDENTIFIED_LOG_INTERVAL:
        _last_unidentified_log = now
        logger.error(
            "A request has no usable client address (REMOTE_ADDR is empty or not an IP), so it "
            "cannot be rate limited per client and is refused (%s). Behind a proxy that "
            "connects over a Unix socket, set DJANGO_THROTTLE_TRUSTED_PROXIES to the proxy count "
            "so the address comes from X-Forwarded-For. (Logged at most once a minute.)",
            _UNKNOWN_CLIENT_CHOICES.get(choice, "503"),
        )
    if choice == "allow":
        return _FAILED_OPEN
    if choice == "shared":
        return None
    return _UNIDENTIFIED_DENIED


def counted_decision(
    planned: Plan, decision: Decision, request: Any, local: bool = False
) -> Decision:
    """The decision the backend made, as it is; an allowed request whose rule may give its
    tokens back leaves its :class:`Reservation` on ``request.throttle_reservations``
    (``local``: taken from the in-process backend, given back there)."""
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
        reservation = Reservation(counts, planned.cost, planned.refunds, decision.taken, local)
        reservations = getattr(request, "throttle_reservations", ())
        request.throttle_reservations = [*reservations, reservation]
    return decision


def degraded_decision(planned: Plan, error: BackendError, request: Any) -> Decision:
    """The decision when the backend could not answer (``error``), by failure mode (see
    :func:`failure_mode`), counted in-process until the backend is back. A refused call
    (:class:`ArgumentRefused`: the backend answered, refusing one of our arguments, a bug
    logged by the breaker) is counted in-process where the mode would serve it uncounted:
    whatever provoked it must not slip past the limits. Fail-closed's ``Retry-After`` is
    when the breaker that stopped the call lets one through: the process's, or one Cluster
    node's (:class:`NodeUnavailable`).

    ``local`` counts exactly what the backend would have: the same steps
    (:meth:`Plan.deciding`: the client's limits, then those by IP address and username,
    all or nothing), on the in-process backend; a rule that counts only failures or
    successes leaves its reservation there.

    The breaker logs when it opens and closes; a line per failed request would flood the log
    exactly when the operator needs it. The mode is only worked out here, off the healthy
    path."""
    mode = failure_mode(planned)
    if isinstance(error, ArgumentRefused) and mode == "open":
        mode = "local"
    decision: Decision | BackendError = _FAILED_OPEN
    if mode == "local":
        decision = run_locally(planned.deciding())
        if not isinstance(decision, BackendError):
            decision = counted_decision(planned, replace(decision, local=True), request, local=True)
    if mode == "closed" or isinstance(decision, BackendError):
        if isinstance(error, NodeUnavailable):
            wait = error.retry_after
        else:
            wait = get_breaker().retry_after()
        decision = replace(_FAILED_CLOSED, retry_after=wait, limits=tuple(planned.limits))
    usage.record_degraded(planned.field, planned.client, usage_outcome(decision))
    return decision


def failure_mode(planned: Plan) -> str:
    """What ``planned`` meets while the backend cannot answer: the check's own
    ``failure_mode``, else what the policy says for its tier and rule
    (:meth:`~django_throttle.policy.snapshot.Policy.failure_mode_for`: a credential check
    counts in-process where the setting would serve it uncounted)."""
    return Policy.failure_mode_for(
        planned.tier, planned.endpoint, planned.credential, planned.failure_mode
    )


def usage_outcome(decision: Decision) -> str:
    """The usage column of a decision the backend did not make."""
    if decision.unavailable:
        return usage.FAILED_CLOSED
    if decision.failed_open:
        return usage.FAILED_OPEN
    return usage.ALLOWED if decision.allowed else usage.DENIED
