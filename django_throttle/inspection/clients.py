"""What the operator tools ask about one client, and what they do to it: which tier and why,
the live state of every counter its requests meet (read without consuming), what a request
would get before anyone sends it, and clearing its counters. Used by ``manage.py
throttle_inspect``, ``throttle_explain``, ``throttle_reset``, the admin's inspector and the
API key list's reset action.

The counters come from the request path itself
(:mod:`django_throttle.inspection.probes` builds the client's requests and asks
:func:`django_throttle.request.core.plan`), so counters by IP address and by
username are seen as requests meet them. These run off the request path, so they may query the
database (to say *why* a client is in a tier).

A shared limit (a ceiling over every client of a key shard) is listed, marked as shared.
Resetting one client leaves it alone: :func:`reset_ceilings` is its own explicit action.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain, groupby
from operator import attrgetter

from django.urls import Resolver404, ResolverMatch, resolve
from django.utils.translation import gettext as _

from django_throttle.backends import get_backend
from django_throttle.backends.base import Backend, per_shard
from django_throttle.conf import app_settings
from django_throttle.identity import client_ip, region_code
from django_throttle.inspection.probes import (
    Counter,
    Planned,
    Probe,
    as_counter,
    every_counter,
    login_counters,
    login_probe,
    planned,
    policy_scope,
    rules,
    view_checks,
)
from django_throttle.inspection.subjects import Subject, UnknownClient, tier_and_reason
from django_throttle.policy.live import EndpointPolicy, Policy, TierPolicy, current
from django_throttle.rates import Algorithm, Decision, Limit, rate_text


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
    #: A concurrency limit's leases held now, the soonest to end first: each one's
    #: :func:`short_lease` id and the seconds until it ends unless renewed.
    leases: tuple[tuple[str, float], ...] = ()

    @property
    def concurrency(self) -> bool:
        """A limit on requests in flight, whose slots are :attr:`leases`."""
        return self.limit.algorithm == Algorithm.CONCURRENCY

    @property
    def in_flight(self) -> int | None:
        """Requests holding a slot now (a concurrency limit; ``None`` for another)."""
        return len(self.leases) if self.concurrency else None

    @property
    def in_flight_text(self) -> str:
        """For a concurrency limit, its slots taken in words ("2 of 3 in flight"); empty
        for another limit."""
        if self.in_flight is None:
            return ""
        return _("%(held)d of %(slots)d in flight") % {
            "held": self.in_flight,
            "slots": self.capacity,
        }

    @property
    def next_slot_text(self) -> str:
        """For a concurrency limit whose slots are all taken, what that means for the next
        request; empty otherwise."""
        if self.in_flight is None or self.in_flight < self.capacity:
            return ""
        if self.limit.shadow:
            return _("a shadow limit: the next request would be refused, and is not")
        return _("the next request is refused until one ends (at most 1 s Retry-After)")

    @property
    def shared(self) -> bool:
        """A ceiling shared by every client of a key shard, not this client's own."""
        return self.limit.shared

    @property
    def capacity(self) -> int:
        """What the bucket holds: for a shared limit, its key shard's share."""
        return per_shard(self.limit, app_settings.key_shards).capacity


@dataclass(frozen=True)
class Inspection:
    subject: Subject
    tier: TierPolicy | None
    reason: str
    buckets: list[Bucket] = field(default_factory=list)
    username: str | None = None
    #: The region the client was seen from, and whether some limit names it (then its
    #: regional limits were counted).
    region: str | None = None
    regional: bool = False

    @property
    def concurrency(self) -> bool:
        """Whether a limit on requests in flight is among the buckets."""
        return any(bucket.concurrency for bucket in self.buckets)


def probe(
    subject: Subject, address: str | None, username: str | None, region: str | None = None
) -> Probe:
    """Who sends the client's requests: from ``address`` (an IP client's own by default),
    presenting ``username`` (a user's own username by default). A counter by username is
    probed by an anonymous login presenting that username."""
    if subject.by_username:
        if address is not None and client_ip({"REMOTE_ADDR": address}) is None:
            raise UnknownClient(_("%(value)r is not an IP address") % {"value": address})
        return dataclasses.replace(login_probe(address, subject.username), region=region)
    if address is None:
        address = subject.address
    elif client_ip({"REMOTE_ADDR": address}) is None:
        raise UnknownClient(_("%(value)r is not an IP address") % {"value": address})
    if username is None and subject.user is not None:
        username = subject.user.get_username()
    return Probe(subject.identity, subject.user, address, username, region)


def counters(
    subject: Subject,
    username: str | None = None,
    address: str | None = None,
    region: str | None = None,
) -> list[Counter]:
    """Every counter the client's requests meet (see :func:`probes.every_counter`); for a
    counter by username, its limits alone (whoever presents it, from wherever)."""
    if subject.by_username:
        return login_counters(subject.client, subject.username, current())
    return every_counter(probe(subject, address, username, region), current())


class BadRegion(ValueError):
    """An operator's region is no region code (the client may be fine); the message quotes
    it and says what a code is. The caller names its field (``--region``, the admin's)."""


def checked_region(region: str | None) -> str | None:
    """An operator's ``--region`` as a region code (blank: none); raises :class:`BadRegion`
    when it is no code."""
    if region is None or not str(region).strip():
        return None
    code = region_code(region)
    if code is None:
        raise BadRegion(
            _("%(value)r is not a region code (letters, digits and '-', at most 16, e.g. FR)")
            % {"value": str(region)[:40]}
        )
    return code


def inspect(
    subject: Subject,
    username: str | None = None,
    address: str | None = None,
    region: str | None = None,
) -> Inspection:
    """The client's tier, why, and the state of every counter its requests meet, read
    without consuming: its tier's and rules' limits, counters by its IP address and by its
    username (a user's own; ``username`` for another client), and shared ceilings."""
    snapshot = current()
    tier, reason = tier_and_reason(subject, snapshot)
    region = checked_region(region)
    regional = region is not None and region in snapshot.regions
    if regional:
        tier = snapshot.in_region(tier, None, region)[0]
    if subject.by_username:
        found = login_counters(subject.client, subject.username, snapshot)
        return Inspection(subject, tier, reason, buckets(found), subject.username, region, regional)
    who = probe(subject, address, username, region)
    states = buckets(every_counter(who, snapshot))
    return Inspection(subject, tier, reason, states, who.username, region, regional)


def buckets(found: Sequence[Counter]) -> list[Bucket]:
    """Each counter's live state, read without consuming; a concurrency limit's with the
    leases held in it."""
    backend = get_backend()
    return [
        Bucket(
            c.limit,
            c.where,
            backend.peek(c.client, [c.limit]),
            c.counted_by,
            c.client,
            _held(backend, c),
        )
        for c in found
    ]


#: Characters of a lease id the operator tools show: enough to tell a client's leases apart.
SHORT_LEASE = 8


def short_lease(lease: str) -> str:
    """A lease id as the operator tools show it, shortened. Lease ids are made by this
    package (``redis.new_lease``), never by a client, so they are safe to show."""
    return lease if len(lease) <= SHORT_LEASE else lease[:SHORT_LEASE] + "…"


def _held(backend: Backend, counter: Counter) -> tuple[tuple[str, float], ...]:
    """The leases held in a concurrency counter (:meth:`Backend.leases`); none for
    another."""
    if counter.limit.algorithm != Algorithm.CONCURRENCY:
        return ()
    return tuple(
        (short_lease(lease), left) for lease, left in backend.leases(counter.client, counter.limit)
    )


# What a request would get before anyone sends it: the checks its view makes, the rule each
# matches, every counter at what cost, and the decision the server would give now, computed
# without consuming (``manage.py throttle_explain`` and the admin's inspector).


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
    buckets: list[Bucket]
    decision: Decision | None
    exempt: str = ""
    checks: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    denied_by: str = ""
    #: The region the request was seen from, and whether some limit names it (then its
    #: regional limits were counted).
    region: str | None = None
    regional: bool = False

    @property
    def in_flight(self) -> tuple[str, ...]:
        """For each concurrency limit the request meets: how many of its slots are taken,
        and whether the next request would get one ("exports: 3 of 3 in flight; the next
        request is refused until one ends ...")."""
        return tuple(
            f"{bucket.limit.name or rate_text(bucket.limit.rate)}: "
            + "; ".join(filter(None, (bucket.in_flight_text, bucket.next_slot_text)))
            for bucket in self.buckets
            if bucket.concurrency
        )


def explain(
    subject: Subject,
    method: str,
    path: str,
    scope: str | None = None,
    *,
    address: str | None = None,
    username: str | None = None,
    region: str | None = None,
) -> Explanation:
    """Which checks a ``method`` request to ``path`` from this client meets, which rule
    each matches, every counter at what cost, and the decision the server would give it
    now (the first check that denies, with the longest ``Retry-After`` of its counters),
    without sending it or consuming. ``address`` is where it comes from (an IP client's
    own by default), ``username`` what it presents at a login (a user's own by default). For
    a counter by username, the request is an anonymous login presenting that username."""
    method = (method or "GET").upper()
    if not path.startswith("/"):
        path = "/" + path
    try:
        match: ResolverMatch | None = resolve(path)
    except Resolver404:
        match = None
    route, func = (match.view_name, match.func) if match is not None else (None, None)
    if scope is None:
        view = getattr(func, "view_class", None) or getattr(func, "cls", None)
        scope = getattr(view, "throttle_scope", None) or policy_scope(func)
    snapshot = current()
    tier, reason = tier_and_reason(subject, snapshot)
    region = checked_region(region)
    who = probe(subject, address, username, region)
    basic = who.username is not None and method != "POST"  # see probes.build_request
    checks = view_checks(func, method, scope, basic) if app_settings.ENABLED else []
    plans = [planned(who, check, method, path, match) for check in checks]
    if subject.by_username:  # a login presenting it: its counter under its own label
        counted_by = f"username {subject.username}" if subject.username else subject.client
        plans = [as_counter(plan, who, subject.client, counted_by) for plan in plans]
    if region is None:  # the region the probe request shows (GeoIP2 by its address)
        region = next((plan.region for plan in plans if plan.region), None)
    regional = region is not None and region in snapshot.regions
    if regional:
        tier = snapshot.in_region(tier, None, region)[0]
    seen: dict[tuple[str, str], Counter] = {}
    for counter in (counter for plan in plans for counter in plan.counters):
        seen.setdefault((counter.client, counter.limit.id), counter)
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
        buckets=buckets(list(seen.values())),
        decision=decision,
        exempt="" if app_settings.ENABLED else "DJANGO_THROTTLE_ENABLED is off",
        checks=tuple(check.name for check in checks),
        notes=_notes(plans, who, snapshot, (method, route, path)),
        denied_by=denied_by,
        region=region,
        regional=regional,
    )


def region_text(region: str | None, regional: bool) -> str:
    """Which region a client was counted in, in words."""
    if region is None:
        return "none (the default limits)"
    if regional:
        return f"{region} (its regional limits)"
    return f"{region} (no limit names it: the default limits)"


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
    fewest = min(allowed, key=lambda d: (d.limit is None, d.remaining))
    # A delaying limit's turn: the request waits for the latest of its counters' turns.
    return dataclasses.replace(fewest, wait=max(d.wait for d in allowed)), ""


def _notes(
    plans: Sequence[Planned], who: Probe, snapshot: Policy, request: tuple[str, str | None, str]
) -> tuple[str, ...]:
    """What the rules count that this explanation could not show (a counter by IP address
    when no address is known, by username when none is presented); then each check that
    counts nothing though a rule matches it, so "no limit applies" is not read as "no rule
    matches"."""
    unseen: list[str] = []
    uncounted: list[str] = []
    for plan in plans:
        if plan.rule is not None:
            kinds = {kind for kind, _limits in snapshot.groups_for(plan.tier, plan.rule)}
            if "ip" in kinds and who.address is None:
                unseen.append(
                    _("rule '%(rule)s' also counts by IP address: give the address to see it")
                    % {"rule": plan.rule.name}
                )
            if "username" in kinds and who.username is None:
                unseen.append(
                    _("rule '%(rule)s' also counts by username: give the username to see it")
                    % {"rule": plan.rule.name}
                )
        if plan.uncounted is None:
            continue
        check = plan.check
        # A credential check matches its rule by scope alone.
        method, route, path = (request[0], None, "") if check.rule_only else request
        rule = snapshot.match(method, check.scope, route, path)
        if rule is not None:
            uncounted.append(
                _(
                    "rule '%(rule)s' matches %(check)s but counts nothing for this client "
                    "(no limits for its tier, or it is exempt)"
                )
                % {"rule": rule.name, "check": check.name}
            )
    return tuple(dict.fromkeys(unseen)) + tuple(uncounted)


# Clearing a client's counters, and refilling shared limits (``manage.py throttle_reset``, the
# admin's inspector and the API key list's reset action).


def reset_counters(
    subject: Subject,
    limit_ids: Sequence[str] | None = None,
    username: str | None = None,
    address: str | None = None,
    region: str | None = None,
) -> list[Counter]:
    """Forget the client's state in every counter its requests meet (its tier's and
    rules' limits, by client, by its address, by its username), or only the limits whose
    ids are in ``limit_ids``: the client starts afresh, a locked-out login included.
    Shared ceilings are left alone (they are every client's of a key shard: see
    :func:`reset_ceilings`). Returns the counters reset. Raises ``ValueError`` naming ids
    that are not among the client's limits."""
    found = counters(subject, username, address, checked_region(region))
    own = [counter for counter in found if not counter.limit.shared]
    if limit_ids:
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
        own = [counter for counter in own if counter.limit.id in limit_ids]
    backend = get_backend()
    client = attrgetter("client")
    for key, group in groupby(sorted(own, key=client), key=client):
        backend.reset(key, [counter.limit for counter in group])
    return own


def reset(subject: Subject, limit_ids: Sequence[str] | None = None) -> list[Limit]:
    """:func:`reset_counters`, answering with the limits reset."""
    return [counter.limit for counter in reset_counters(subject, limit_ids)]


def shared_limits(snapshot: Policy | None = None) -> dict[str, Limit]:
    """Every shared limit (ceiling) of the policy, by id."""
    snapshot = snapshot or current()
    every = [limit for tier in snapshot.tiers.values() for limit in tier.limits]
    for rule in rules(snapshot):
        every.extend(chain.from_iterable(rule.limits_by_tier.values()))
        for groups in rule.groups_by_tier.values():
            every.extend(limit for _kind, limits in groups for limit in limits)
    return {limit.id: limit for limit in reversed(every) if limit.shared}  # the first of an id


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
