"""What an operator asks about one client: which tier and why, the live state of every counter
its requests meet (read without consuming), what a request would get before anyone sends it,
and clearing the client's counters. Used by ``manage.py throttle_inspect``,
``throttle_explain``, ``throttle_reset`` and the admin's inspector.

The counters come from the request path itself
(:mod:`django_throttle.inspection.probes` builds the client's requests and asks
:func:`django_throttle.request.core.plan`), so counters by IP address and by
username are seen as requests meet them. These run off the request path, so they may query the
database (to say *why* a client is in a tier).

A shared limit (a ceiling over every client of a key shard) is listed, marked as shared, but
resetting one client leaves it alone: :func:`reset_ceilings` is its own explicit action.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.urls import Resolver404, resolve
from django.utils.translation import gettext as _

from django_throttle.backends import get_backend
from django_throttle.backends.base import per_shard
from django_throttle.conf import app_settings
from django_throttle.identity import client_ip
from django_throttle.inspection.probes import (
    Counter,
    Planned,
    Probe,
    every_counter,
    planned,
    rules,
    view_checks,
)
from django_throttle.inspection.subjects import (
    Subject,
    UnknownClient,
    parse_client,
    tier_and_reason,
)
from django_throttle.policy import live as policy_module
from django_throttle.policy.snapshot import EndpointPolicy, Policy, TierPolicy
from django_throttle.rates import Decision, Limit

__all__ = [
    "Bucket",
    "Explanation",
    "Inspection",
    "Subject",
    "UnknownClient",
    "counters",
    "explain",
    "in_process_backend",
    "inspect",
    "parse_client",
    "reset",
    "reset_ceilings",
    "shared_limits",
    "tier_and_reason",
]


@dataclass(frozen=True)
class Bucket:
    """One counter's live state. ``where`` says where the limit comes from (the tier, or an
    endpoint rule), ``counted_by`` whose counter it is (``"this client"``, ``"IP …"``,
    ``"username …"``), ``client`` the counter's key; ``state`` is the peek."""

    limit: Limit
    where: str
    state: Decision
    counted_by: str = "this client"
    client: str = ""

    @property
    def shared(self) -> bool:
        """A ceiling shared by every client of a key shard, not this client's own."""
        return self.limit.shared

    @property
    def capacity(self) -> int:
        """What the bucket holds: for a shared limit, its key shard's share."""
        return per_shard(self.limit, app_settings.KEY_SHARDS).capacity

    @property
    def used(self) -> bool:
        """Whether any of it is used (a full bucket has nothing stored)."""
        return self.state.remaining < self.capacity


@dataclass(frozen=True)
class Inspection:
    subject: Subject
    tier: TierPolicy | None
    reason: str
    buckets: list[Bucket] = field(default_factory=list)
    username: str | None = None


@dataclass(frozen=True)
class Explanation:
    """What a request would meet: the checks its view makes, the rule it matches, the
    limits and cost, every counter's state, and the decision it would get now (computed
    without consuming) as the server would answer it. ``notes`` say what could not be
    seen (no address, no username given)."""

    subject: Subject
    method: str
    path: str
    scope: str | None
    route: str | None
    tier: TierPolicy | None
    reason: str
    rule: EndpointPolicy | None
    cost: int
    limits: tuple[Limit, ...]
    buckets: list[Bucket]
    decision: Decision | None
    exempt: str = ""
    checks: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    denied_by: str = ""


# --- the policy ---------------------------------------------------------------------------


def _snapshot() -> Policy:
    return policy_module.current()


# --- the three questions --------------------------------------------------------------------


def _probe(subject: Subject, address: str | None, username: str | None) -> Probe:
    """Who sends the client's requests: from ``address`` (an IP client's own by default),
    presenting ``username`` (a user's own username by default)."""
    if address is None:
        address = subject.address
    elif client_ip({"REMOTE_ADDR": address}) is None:
        raise UnknownClient(_("%(value)r is not an IP address") % {"value": address})
    if username is None and subject.user is not None:
        username = subject.user.get_username()
    return Probe(subject.identity, subject.user, address, username)


def counters(
    subject: Subject, username: str | None = None, address: str | None = None
) -> list[Counter]:
    """Every counter the client's requests meet (see :func:`probes.every_counter`)."""
    return every_counter(_probe(subject, address, username), _snapshot())


def inspect(
    subject: Subject, username: str | None = None, address: str | None = None
) -> Inspection:
    """The client's tier, why, and the state of every counter its requests meet, read
    without consuming: its tier's and rules' limits, counters by its IP address and by its
    username (a user's own; ``username`` for another client), and shared ceilings."""
    snapshot = _snapshot()
    tier, reason = tier_and_reason(subject, snapshot)
    who = _probe(subject, address, username)
    return Inspection(subject, tier, reason, _buckets(every_counter(who, snapshot)), who.username)


def _buckets(found: Sequence[Counter]) -> list[Bucket]:
    backend = get_backend()
    return [
        Bucket(c.limit, c.where, backend.peek(c.client, [c.limit]), c.counted_by, c.client)
        for c in found
    ]


def explain(
    subject: Subject,
    method: str,
    path: str,
    scope: str | None = None,
    *,
    address: str | None = None,
    username: str | None = None,
) -> Explanation:
    """Which checks a ``method`` request to ``path`` from this client meets, which rule
    each matches, every counter at what cost, and the decision the server would give it
    now (the first check that denies, with the longest ``Retry-After`` of its counters),
    without sending it or consuming. ``address`` is where it comes from (an IP client's
    own by default), ``username`` what it presents at a login (a user's own by default)."""
    method = (method or "GET").upper()
    if not path.startswith("/"):
        path = "/" + path
    route = func = None
    try:
        match = resolve(path)
    except Resolver404:
        match = None
    if match is not None:
        route, func = match.view_name, match.func
        if scope is None:
            view = getattr(match.func, "view_class", None) or getattr(match.func, "cls", None)
            scope = getattr(view, "throttle_scope", None)
    snapshot = _snapshot()
    tier, reason = tier_and_reason(subject, snapshot)
    who = _probe(subject, address, username)
    basic = who.username is not None and method != "POST"  # see probes.build_request
    checks = view_checks(func, method, scope, basic) if app_settings.ENABLED else []
    plans = [planned(who, check, method, path, match) for check in checks]
    seen: dict[tuple[str, str], Counter] = {}
    for plan in plans:
        for client, found in plan.groups:
            for counter in found:
                seen.setdefault((client, counter.limit.id), counter)
    decision, denied_by = _decide(plans)
    ruled = next((plan for plan in plans if plan.rule is not None), None)
    return Explanation(
        subject=subject,
        method=method,
        path=path,
        scope=scope,
        route=route,
        tier=tier,
        reason=reason,
        rule=ruled.rule if ruled is not None else None,
        cost=ruled.cost if ruled is not None else 1,
        limits=tuple(counter.limit for counter in seen.values()),
        buckets=_buckets(list(seen.values())),
        decision=decision,
        exempt="" if app_settings.ENABLED else "DJANGO_THROTTLE_ENABLED is off",
        checks=tuple(check.name for check in checks),
        notes=_unseen(plans, who, snapshot) + _uncounted(plans, method, route, path, snapshot),
        denied_by=denied_by,
    )


def _decide(plans: Sequence[Planned]) -> tuple[Decision | None, str]:
    """The server's answer: checks run in order and the first that denies answers; within
    one check every counter is asked with the request's cost, and a denial reports the
    longest wait among the counters that deny (the retry must really succeed). Allowed:
    the counter with the fewest tokens left. ``None`` when no counter applies."""
    backend = get_backend()
    allowed: list[Decision] = []
    for plan in plans:
        decisions = [
            backend.peek(client, [counter.limit for counter in found], cost=plan.cost)
            for client, found in plan.groups
        ]
        denied = [d for d in decisions if not d.allowed]
        if denied:
            return max(denied, key=lambda d: d.retry_after), plan.check.name
        allowed.extend(decisions)
    if not allowed:
        return None, ""
    return min(allowed, key=lambda d: (d.limit is None, d.remaining)), ""


def _unseen(plans: Sequence[Planned], who: Probe, snapshot: Policy) -> tuple[str, ...]:
    """What the rule counts that this explanation could not show: a counter by IP address
    when no address is known, by username when none is presented."""
    notes: list[str] = []
    for plan in plans:
        if plan.rule is None:
            continue
        kinds = {kind for kind, _limits in snapshot.groups_for(plan.tier, plan.rule)}
        if "ip" in kinds and who.address is None:
            notes.append(
                _("rule '%(rule)s' also counts by IP address: give the address to see it")
                % {"rule": plan.rule.name}
            )
        if "username" in kinds and who.username is None:
            notes.append(
                _("rule '%(rule)s' also counts by username: give the username to see it")
                % {"rule": plan.rule.name}
            )
    return tuple(dict.fromkeys(notes))


def _uncounted(
    plans: Sequence[Planned], method: str, route: str | None, path: str, snapshot: Policy
) -> tuple[str, ...]:
    """A check that counts nothing though a rule matches it: said, so "no limit applies"
    is not read as "no rule matches"."""
    notes: list[str] = []
    for plan in plans:
        if plan.uncounted is None:
            continue
        check = plan.check
        rule = (
            snapshot.match(method, check.scope)
            if check.rule_only
            else snapshot.match(method, check.scope, route, path)
        )
        if rule is not None:
            notes.append(
                _(
                    "rule '%(rule)s' matches %(check)s but counts nothing for this client "
                    "(no limits for its tier, or it is exempt)"
                )
                % {"rule": rule.name, "check": check.name}
            )
    return tuple(notes)


def reset_counters(
    subject: Subject,
    limit_ids: Sequence[str] | None = None,
    username: str | None = None,
    address: str | None = None,
) -> list[Counter]:
    """Forget the client's state in every counter its requests meet (its tier's and
    rules' limits, by client, by its address, by its username), or only the limits whose
    ids are in ``limit_ids``: the client starts afresh, a locked-out login included.
    Shared ceilings are left alone (they are every client's of a key shard: see
    :func:`reset_ceilings`). Returns the counters reset. Raises ``ValueError`` naming ids
    that are not among the client's limits."""
    found = counters(subject, username, address)
    own = [counter for counter in found if not counter.limit.shared]
    if limit_ids:
        wanted = set(limit_ids)
        known = {counter.limit.id for counter in own}
        shared = {counter.limit.id for counter in found if counter.limit.shared}
        ceilings = [i for i in limit_ids if i in shared]
        if ceilings:
            raise ValueError(
                f"{', '.join(ceilings)}: a shared ceiling counts every client of a key shard, "
                "not this one's own; reset the ceiling itself"
            )
        unknown = [i for i in limit_ids if i not in known]
        if unknown:
            raise ValueError(
                f"not a limit of {subject.label}: {', '.join(unknown)} "
                f"(its limits: {', '.join(sorted(known)) or 'none'})"
            )
        own = [counter for counter in own if counter.limit.id in wanted]
    by_client: dict[str, list[Limit]] = {}
    for counter in own:
        by_client.setdefault(counter.client, []).append(counter.limit)
    backend = get_backend()
    for client, limits in by_client.items():
        backend.reset(client, limits)
    return own


def reset(subject: Subject, limit_ids: Sequence[str] | None = None) -> list[Limit]:
    """:func:`reset_counters`, answering with the limits reset."""
    return [counter.limit for counter in reset_counters(subject, limit_ids)]


def shared_limits(snapshot: Policy | None = None) -> dict[str, Limit]:
    """Every shared limit (ceiling) of the policy, by id."""
    snapshot = snapshot or _snapshot()
    found: dict[str, Limit] = {}
    every: list[Limit] = []
    for tier in snapshot.tiers.values():
        every.extend(tier.limits)
    for rule in rules(snapshot):
        for limits in rule.limits_by_tier.values():
            every.extend(limits)
        for groups in rule.groups_by_tier.values():
            every.extend(limit for _kind, limits in groups for limit in limits)
    for limit in every:
        if limit.shared:
            found.setdefault(limit.id, limit)
    return found


def reset_ceilings(limit_ids: Sequence[str]) -> list[Limit]:
    """Refill these shared limits in every key shard (every client's share of them): the
    explicit action a ceiling needs, since resetting a client never touches it. Raises
    ``ValueError`` naming ids that are not shared limits of the policy."""
    shared = shared_limits()
    unknown = [i for i in limit_ids if i not in shared]
    if unknown:
        raise ValueError(
            f"not a shared limit: {', '.join(unknown)} "
            f"(shared limits: {', '.join(sorted(shared)) or 'none'})"
        )
    limits = [shared[i] for i in dict.fromkeys(limit_ids)]
    get_backend().reset_shared(limits)
    return limits


def in_process_backend() -> str | None:
    """Why this process cannot see the counters the site's requests made, when the backend
    counts in this process's memory (``MemoryBackend``): a command's own process serves no
    requests, so every bucket would look full and a reset would clear nothing. ``None``
    when the backend is shared (Redis)."""
    from django_throttle.backends.memory import MemoryBackend

    backend = get_backend()
    if not isinstance(backend, MemoryBackend):
        return None
    return (
        f"DJANGO_THROTTLE_BACKEND is {type(backend).__name__}, which counts inside each "
        "process: this command's process serves no requests, so it has no counters to "
        "read or clear. Point it at the server's Redis (DJANGO_THROTTLE_REDIS_URL)."
    )
