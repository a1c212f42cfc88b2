"""What the operator tools ask about one client, and what they do to it: which tier and why,
the live state of every counter its requests meet (read without consuming), what a request
would get before anyone sends it, and clearing its counters. Used by ``manage.py
throttle_inspect``, ``throttle_explain``, ``throttle_reset``, the admin's inspector and the
API key list's reset action.

The counters come from the request path itself: the tools build the requests the client
would send and ask :func:`django_throttle.request.core.plan` (the last section), so counters by
IP address and by username are seen as requests meet them. These run off the request path, so
they may query the database (to say *why* a client is in a tier).

A shared limit (a ceiling over every client of a key shard) is listed, marked as shared.
Resetting one client leaves it alone: :func:`reset_ceilings` is its own explicit action.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import chain, groupby
from operator import attrgetter
from typing import Any

from django.contrib.auth import get_user_model
from django.http import HttpRequest
from django.urls import Resolver404, ResolverMatch, resolve
from django.utils.translation import gettext as _

from django_throttle.backends import BackendError, get_backend
from django_throttle.backends.base import Backend, per_shard
from django_throttle.conf import app_settings
from django_throttle.identity import Identity, client_ip, region_code
from django_throttle.inspection.budget import ReadBudget, SlowRead
from django_throttle.inspection.subjects import Subject, UnknownClient, tier_and_reason
from django_throttle.policy.live import (
    EndpointPolicy,
    Policy,
    TierPolicy,
    VersionGate,
    current,
    version_checks_while,
)
from django_throttle.rates import FLEET, Algorithm, Decision, Limit, limit_text
from django_throttle.redaction import plain_text
from django_throttle.request import core
from django_throttle.request.usernames import SAFE_METHODS


@dataclass(frozen=True)
class Bucket:
    """One counter's live state. ``where`` says where the limit comes from (the tier, or an
    endpoint rule), ``counted_by`` whose counter it is (``"this client"``, ``"IP …"``,
    ``"username …"``), ``client`` the counter's key; ``state`` is the peek, ``None`` when
    the backend could not be read (unknown: never shown as zeros or as a full bucket)."""

    limit: Limit
    where: str
    state: Decision | None
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
        """Requests holding a slot now (a concurrency limit; ``None`` for another, or when
        the backend could not be read)."""
        return len(self.leases) if self.concurrency and self.state is not None else None

    @property
    def remaining(self) -> int | None:
        """What the bucket has left now; ``None`` when the backend could not be read. The
        counting script never reports the fleet limit (no client's headers show the service's
        ceiling), so its peek says nothing of it: its slots left are its capacity less the
        leases held."""
        if self.state is None:
            return None
        if self.limit.id == FLEET:
            return max(self.capacity - len(self.leases), 0)
        return self.state.remaining

    @property
    def in_flight_text(self) -> str:
        """For a concurrency limit, its slots taken in words ("2 of 3 in flight"); empty
        for another limit."""
        if self.concurrency and self.state is None:
            return _("unavailable")
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
    #: Why the backend could not be read (then every bucket's ``state`` is ``None``: the
    #: tier, its reason and the limits need no backend and are shown all the same).
    unread: str = ""
    #: Said when the page's read budget was spent before the policy's version was checked:
    #: the policy shown is the last one this process read (see :func:`budgeted_policy`).
    policy_unchecked: str = ""

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
    checked_address(address)
    if subject.by_username:
        return dataclasses.replace(login_probe(address, subject.username), region=region)
    if address is None:
        address = subject.address
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


class BadAddress(UnknownClient):
    """An operator's address (``--ip``, the admin's "From address") is no IP address (the
    client may be fine); the message quotes it. The caller names its field. An
    :class:`UnknownClient` too, for callers that catch that alone."""


def checked_address(address: str | None) -> str | None:
    """An operator's ``--ip`` as given (``None``: none); raises :class:`BadAddress` when it
    is no IP address."""
    if address is not None and client_ip({"REMOTE_ADDR": address}) is None:
        raise BadAddress(_("%(value)r is not an IP address") % {"value": str(address)[:60]})
    return address


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


@contextmanager
def budgeted_policy(budget: ReadBudget | None) -> Iterator[VersionGate | None]:
    """Within the block, the policy's version check (one backend read, due once a second)
    counts against ``budget`` as the page's other reads do: once the budget is spent, it is
    not made, and the snapshot this process holds is used (its gate then says how long ago
    its version was last checked; see :func:`policy_unchecked`). It was made whenever due,
    after the budget was spent: "explain" on a Redis answering each read 1.6 s late paid a
    second check, 4.8 s for the page where its budget allows 3.2 s. No budget (a
    command): every due check is made."""
    if budget is None:
        yield None
        return
    with version_checks_while(lambda: not budget.exhausted()) as gate:
        yield gate


def policy_unchecked(gate: VersionGate | None) -> str:
    """What a page says when ``gate`` held the policy unchecked (else nothing), translated."""
    if gate is None or gate.unchecked_for is None:
        return ""
    return _(
        "The policy shown is the last one read, %(seconds).1f s ago: Redis answered too "
        "slowly for its version to be checked again."
    ) % {"seconds": gate.unchecked_for}


def inspect(
    subject: Subject,
    username: str | None = None,
    address: str | None = None,
    region: str | None = None,
    budget: ReadBudget | None = None,
) -> Inspection:
    """The client's tier, why, and the state of every counter its requests meet, read
    without consuming: its tier's and rules' limits, counters by its IP address and by its
    username (a user's own; ``username`` for another client), and shared ceilings. With a
    ``budget`` (an admin page's), the counters left once it is spent are not read:
    ``unread`` says so; nor is the policy's version checked (:func:`budgeted_policy`):
    ``policy_unchecked`` says so."""
    with budgeted_policy(budget) as gate:
        found = _inspect(subject, username, address, region, budget)
    return replace(found, policy_unchecked=policy_unchecked(gate))


def _inspect(
    subject: Subject,
    username: str | None,
    address: str | None,
    region: str | None,
    budget: ReadBudget | None,
) -> Inspection:
    snapshot = current()
    tier, reason = tier_and_reason(subject, snapshot)
    checked_address(address)
    region = checked_region(region)
    regional = region is not None and region in snapshot.regions
    if regional:
        tier = snapshot.in_region(tier, None, region)[0]
    if subject.by_username:
        found = login_counters(subject.client, subject.username, snapshot)
        presented = subject.username
    else:
        who = probe(subject, address, username, region)
        found, presented = every_counter(who, snapshot), who.username
    states, unread = read_buckets(found, budget)
    return Inspection(subject, tier, reason, states, presented, region, regional, unread)


def _unread(c: Counter) -> Bucket:
    """A counter whose state the backend could not give."""
    return Bucket(c.limit, c.where, None, shared_by() if c.limit.shared else c.counted_by, c.client)


def read_buckets(
    found: Sequence[Counter], budget: ReadBudget | None = None
) -> tuple[list[Bucket], str]:
    """:func:`buckets`, and why some could not be read: the backend failed (then none
    is read), or ``budget`` was spent (then those read are kept, the rest are unread)."""
    states: list[Bucket] = []
    try:
        buckets(found, budget, states)
    except SlowRead as exc:  # keep what was read
        return [*states, *(_unread(c) for c in found[len(states) :])], str(exc)
    except BackendError as exc:  # what needs no backend is still worth showing
        return [_unread(c) for c in found], plain_text(str(exc))
    return states, ""


def buckets(
    found: Sequence[Counter], budget: ReadBudget | None = None, states: list[Bucket] | None = None
) -> list[Bucket]:
    """Each counter's live state, read without consuming; a concurrency limit's with the
    leases held in it. Appended to ``states`` as they are read (given one); raises
    :class:`SlowRead` before a read once ``budget`` is spent."""
    backend = get_backend()
    states = [] if states is None else states
    for c in found:
        if budget is not None:
            budget.check()
        held = _held(backend, c)
        state = _peek(backend, c)
        if c.limit.id == FLEET and state.allowed and state.limit is None:
            state = _fleet_state(state, c.limit, held)
        counted_by = shared_by() if c.limit.shared else c.counted_by
        states.append(Bucket(c.limit, c.where, state, counted_by, c.client, held))
    return states


def _peek(backend: Backend, c: Counter) -> Decision:
    """``c``'s state, nothing taken. A shadow limit is never reported (no client's headers
    show it), so a peek of it alone says nothing of it: 0 remaining, whole in 0 s, whatever
    it holds. It is read as the enforced limit it stands for, whose counter is the same (a
    limit's key does not depend on ``shadow``), and shown as the shadow limit it is."""
    if not c.limit.shadow:
        return backend.peek(c.client, [c.limit])
    state = backend.peek(c.client, [replace(c.limit, shadow=False)])
    return replace(state, limit=c.limit if state.limit is not None else None)


def _fleet_state(state: Decision, limit: Limit, held: tuple[tuple[str, float], ...]) -> Decision:
    """The fleet's ``state`` as its own limit's: an allowed call never reports the fleet
    (no client's own limit: see ``lua/driver.lua``), so its peek says nothing of it; its free
    slots and the end of its last lease are those of the ``held`` leases, as the
    concurrency script counts them."""
    slots = per_shard(limit, app_settings.key_shards).capacity
    reset = max((left for _, left in held), default=0.0)
    return replace(state, limit=limit, remaining=max(0, slots - len(held)), reset_after=reset)


def shared_by() -> str:
    """Whose counter a shared limit's is: every client's, or with several key shards every
    client's of the shard this one's key falls in (the ceiling is split between them)."""
    return EVERY_CLIENT if app_settings.key_shards == 1 else f"{EVERY_CLIENT} of its key shard"


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
    #: Why the backend could not be read (then every bucket's ``state`` and the
    #: ``decision`` are ``None``: the checks, rule, tier, cost and limits need no backend
    #: and are shown all the same, and the next request meets its failure mode).
    unread: str = ""
    #: Each counting check's failure mode, ``(check, mode)`` in the order the checks run,
    #: resolved as the request path resolves it (``core.failure_mode``).
    failure_modes: tuple[tuple[str, str], ...] = ()
    #: As :attr:`Inspection.policy_unchecked`.
    policy_unchecked: str = ""

    @property
    def failure_mode(self) -> str:
        """The failure mode the next request meets while the backend cannot answer: its
        checks' own when they agree, else the one that decides its fate ("closed" refuses
        it whatever the others do; "local" may refuse it; "open" serves it). Empty when
        no check counts."""
        modes = {mode for _check, mode in self.failure_modes}
        return next((mode for mode in ("closed", "local", "open") if mode in modes), "")

    @property
    def failure_verdict(self) -> str:
        """What the server does with the next request while the backend cannot answer, in
        words ("local: counted in this process under the same limits")."""
        modes = dict.fromkeys(mode for _check, mode in self.failure_modes)
        if len(modes) == 1:
            mode = self.failure_mode
            return _("its failure mode, as Redis cannot answer — %(mode)s: %(meaning)s") % {
                "mode": mode,
                "meaning": failure_meaning(mode),
            }
        each = "; ".join(
            f"{check}: {mode}: {failure_meaning(mode)}" for check, mode in self.failure_modes
        )
        return _("its failure modes, as Redis cannot answer — %(each)s") % {"each": each}

    @property
    def in_flight(self) -> tuple[str, ...]:
        """For each concurrency limit the request meets: how many of its slots are taken,
        and whether the next request would get one ("exports: 3 of 3 in flight; the next
        request is refused until one ends ...")."""
        return tuple(
            f"{bucket.limit.name or limit_text(bucket.limit.rate, bucket.limit.algorithm)}: "
            + "; ".join(filter(None, (bucket.in_flight_text, bucket.next_slot_text)))
            for bucket in self.buckets
            if bucket.concurrency
        )


def failure_meaning(mode: str) -> str:
    """What a request meets in failure ``mode`` while the backend cannot answer."""
    meanings = {
        "local": _("counted in this process under the same limits"),
        "open": _("served uncounted"),
        "closed": _("refused 503"),
    }
    return meanings.get(mode, mode)


def explain(
    subject: Subject,
    method: str,
    path: str,
    scope: str | None = None,
    *,
    address: str | None = None,
    username: str | None = None,
    region: str | None = None,
    budget: ReadBudget | None = None,
) -> Explanation:
    """Which checks a ``method`` request to ``path`` from this client meets, which rule
    each matches, every counter at what cost, and the decision the server would give it
    now (the first check that denies, with the longest ``Retry-After`` of its counters),
    without sending it or consuming. ``address`` is where it comes from (an IP client's
    own by default), ``username`` what it presents at a login (a user's own by default). For
    a counter by username, the request is an anonymous login presenting that username.
    With the backend down, what needs no backend is returned all the same, ``unread``
    saying why, every counter's state and the decision ``None`` (never zeros). With a
    ``budget`` (an admin page's), what is left once it is spent is not read: the counters
    not read and the decision are ``None``, ``unread`` saying so. Nor, then, is the
    policy's version checked (:func:`budgeted_policy`): ``policy_unchecked`` says so."""
    with budgeted_policy(budget) as gate:
        found = _explain(
            subject,
            method,
            path,
            scope,
            address=address,
            username=username,
            region=region,
            budget=budget,
        )
    return replace(found, policy_unchecked=policy_unchecked(gate))


#: A full URL's scheme and host (``https://example.com``), which a request path never holds.
_ORIGIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*")


def request_path(text: str) -> str:
    """The path the server would match for a request an operator names by ``text``: a full
    URL's path (its scheme and host dropped), without a query string or fragment (neither is
    part of the path a rule or URL pattern matches), starting with ``/``. Everything else is
    kept as written, so a path is explained as the server resolves it."""
    origin = _ORIGIN.match(text)
    path = text[origin.end() :] if origin is not None else text
    path = path.split("#", 1)[0].split("?", 1)[0]
    return path if path.startswith("/") else "/" + path


def _explain(
    subject: Subject,
    method: str,
    path: str,
    scope: str | None,
    *,
    address: str | None,
    username: str | None,
    region: str | None,
    budget: ReadBudget | None,
) -> Explanation:
    method = (method or "GET").upper()
    path = request_path(path)
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
    found = list(seen.values())
    states, unread = read_buckets(found, budget)
    decision, denied_by = None, ""
    if not unread:
        try:
            decision, denied_by = _decide(plans, budget)
        except SlowRead as exc:  # every counter's state is shown, not the decision
            unread = str(exc)
        except BackendError as exc:  # what needs no backend is still worth showing
            states, unread = [_unread(c) for c in found], plain_text(str(exc))
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
        buckets=states,
        decision=decision,
        exempt="" if app_settings.ENABLED else "DJANGO_THROTTLE_ENABLED is off",
        checks=tuple(check.name for check in checks),
        notes=_notes(
            plans, who, snapshot, (method, core.rule_routes(match) if match else None, path)
        ),
        denied_by=denied_by,
        region=region,
        regional=regional,
        unread=unread,
        failure_modes=tuple(
            (plan.check.name, plan.failure_mode) for plan in plans if plan.uncounted is None
        ),
    )


def region_text(region: str | None, regional: bool) -> str:
    """Which region a client was counted in, in words."""
    if region is None:
        return "none (the default limits)"
    if regional:
        return f"{region} (its regional limits)"
    return f"{region} (no limit names it: the default limits)"


def _decide(
    plans: Sequence[Planned], budget: ReadBudget | None = None
) -> tuple[Decision | None, str]:
    """The server's answer: checks run in order and the first that denies answers; within
    one check every counter is asked with the request's cost, and a denial reports the
    longest wait among the counters that deny (the retry must really succeed). Allowed:
    the counter with the fewest tokens left. ``None`` when no counter applies."""
    backend = get_backend()
    allowed: list[Decision] = []
    for plan in plans:
        decisions = []
        for client, found in plan.groups:
            if budget is not None:
                budget.check()
            decisions.append(
                backend.peek(client, [counter.limit for counter in found], cost=plan.cost)
            )
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
    plans: Sequence[Planned],
    who: Probe,
    snapshot: Policy,
    request: tuple[str, tuple[str, ...] | None, str],
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
) -> list[tuple[Counter, bool]]:
    """Forget the client's state in every counter its requests meet (its tier's and
    rules' limits, by client, by its address, by its username), or only the limits whose
    ids are in ``limit_ids``: the client starts afresh, a locked-out login included.
    Shared ceilings are left alone (they are every client's of a key shard: see
    :func:`reset_ceilings`). Returns the counters reset, each with whether it held state
    (``False``: it was whole already, nothing was cleared). Raises ``ValueError`` naming ids
    that are not among the client's limits."""
    found = counters(subject, username, checked_address(address), checked_region(region))
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
    held: dict[tuple[str, str], bool] = {}
    for key, group in groupby(sorted(own, key=client), key=client):
        limits = [counter.limit for counter in group]
        for limit, had in zip(limits, backend.reset(key, limits), strict=True):
            held[key, limit.id] = had
    return [(counter, held[counter.client, counter.limit.id]) for counter in own]


def reset(subject: Subject, limit_ids: Sequence[str] | None = None) -> list[Limit]:
    """:func:`reset_counters`, answering with the limits whose counters held state (and
    were cleared)."""
    return [counter.limit for counter, held in reset_counters(subject, limit_ids) if held]


def shared_limits(snapshot: Policy | None = None) -> dict[str, Limit]:
    """Every shared limit (ceiling) of the policy, by id: those of its tiers and rules, and
    the service protection's fleet limit (:data:`FLEET`: every criticality's share is
    counted in its one set of leases, so refilling it frees every slot held)."""
    snapshot = snapshot or current()
    every = [limit for tier in snapshot.tiers.values() for limit in tier.limits]
    for rule in rules(snapshot):
        every.extend(chain.from_iterable(rule.limits_by_tier.values()))
        for groups in rule.groups_by_tier.values():
            every.extend(limit for _kind, limits in groups for limit in limits)
    found = {limit.id: limit for limit in reversed(every) if limit.shared}  # the first of an id
    fleet = snapshot.shedding.fleet.get("critical") if snapshot.shedding is not None else None
    if fleet is not None:  # its whole capacity (the critical share), as the service's
        found[FLEET] = replace(fleet, name=SERVICE)
    return found


def reset_ceilings(limit_ids: Sequence[str]) -> list[tuple[Limit, int]]:
    """Refill these shared limits in every key shard (every client's share of them): the
    explicit action a ceiling needs, since resetting a client never touches it. Returns
    each limit with the number of its key shards that held state (0: nothing to refill).
    Raises ``ValueError`` naming ids that are not shared limits of the policy."""
    shared = shared_limits()
    unknown = [i for i in limit_ids if i not in shared]
    if unknown:
        raise ValueError(
            f"not a shared limit: {', '.join(unknown)} "
            f"(shared limits: {', '.join(sorted(shared)) or 'none'})"
        )
    limits = [shared[i] for i in dict.fromkeys(limit_ids)]
    held = get_backend().reset_shared(limits)
    return list(zip(limits, held, strict=True))


# -- the requests the tools build --------------------------------------------------------------
# The requests the operator tools build, so that the request path itself says what a client
# meets.
#
# ``throttle_inspect``, ``throttle_explain``, ``throttle_reset`` and the admin's inspector never
# work out a client's counters on their own: they build the request the client would send (method,
# path, address, user, the username it presents), ask :func:`django_throttle.request.core.plan`
# what :func:`~django_throttle.request.core.check` would count it against, and read those
# counters. So every counter a request meets is seen, whether it is counted by client, by IP
# address or by username, and a change to the request path changes the tools with it.

#: Who a probe request comes from when only the username it presents matters: an anonymous
#: caller (TEST-NET-1, RFC 5737), whose own counters are left out.
_SOMEONE = Identity("ip", "192.0.2.1")
#: A signed-in user with no tier of its own (so the default tier for authenticated users),
#: who stands in when only the address it sends from matters.
_SIGNED_IN = Identity("user", "\0probe")
#: The username a login probe presents for a counter known by its label alone (a long
#: username's digest, a device's counter): what it would meet is found under this name's
#: counter, then told under the real label (see :func:`as_counter`).
_STAND_IN_USERNAME = "probe"


@dataclass(frozen=True)
class Check:
    """One call an adapter makes to the request path for a view: ``name`` says which, in
    words; the rest are :func:`~django_throttle.request.core.check`'s arguments."""

    name: str
    scope: str | None = None
    credential: bool = False
    rule_only: bool = False
    #: The view's own failure mode (a DRF view's ``throttle_failure_mode``,
    #: ``@throttle(failure_mode=…)``); ``None``: the policy's.
    failure_mode: str | None = None
    #: ``@throttle(rate=…)``'s inline limits and cost, met instead of the tier's.
    limits: tuple[Limit, ...] | None = None
    cost: int | None = None


@dataclass(frozen=True)
class Counter:
    """One bucket a request meets: the backend's ``(client, limit)`` pair, where the limit
    comes from (``"tier 'free'"``, ``"rule 'login'"``) and whose counter it is
    (``"this client"``, ``"IP 203.0.113.9"``, ``"username alice"``)."""

    client: str
    limit: Limit
    where: str
    counted_by: str


@dataclass(frozen=True)
class Planned:
    """What one check would count: the counters in the order it calls the backend (one
    call per distinct counter: ``groups``), at ``cost``, under ``tier`` and ``rule``."""

    check: Check
    tier: TierPolicy | None
    rule: EndpointPolicy | None
    cost: int
    groups: tuple[tuple[str, tuple[Counter, ...]], ...]
    #: The decision the check returns without counting (exempt, no limits), else ``None``.
    uncounted: Decision | None = None
    #: The region whose limits were picked (``None``: the default limits).
    region: str | None = None
    #: What the check meets while the backend cannot answer (``core.failure_mode``).
    failure_mode: str = ""

    @property
    def counters(self) -> list[Counter]:
        """Every counter of every group, in order."""
        return [counter for _client, counters in self.groups for counter in counters]


@dataclass(frozen=True)
class Probe:
    """Who sends the probe requests: ``identity`` as the limiter counts it, the ``user``
    signed in (``None``: anonymous), the ``address`` it comes from and the ``username`` it
    presents at a login (``None``: none)."""

    identity: Identity
    user: Any = None
    address: str | None = None
    username: str | None = None
    #: The region the request is seen from (``None``: the one its request shows, none).
    region: str | None = None


def build_request(
    probe: Probe, method: str, path: str, match: ResolverMatch | None = None
) -> HttpRequest:
    """The request ``probe`` would send: a ``POST`` presents the username in the login
    form's field, another method in ``Authorization: Basic`` (both where the request path
    reads it); no address at all when none is known."""
    from django.contrib.auth.models import AnonymousUser
    from django.test import RequestFactory

    if method == "POST":
        data = {} if probe.username is None else {get_user_model().USERNAME_FIELD: probe.username}
        request = RequestFactory().post(path or "/", data=data)
    else:
        extra: dict[str, Any] = {}
        if probe.username is not None:
            pair = base64.b64encode(f"{probe.username}:".encode()).decode()
            extra["HTTP_AUTHORIZATION"] = "Basic " + pair
        request = RequestFactory().generic(method, path or "/", **extra)
    request.META.pop("REMOTE_ADDR", None)  # no address at all unless one is known
    if probe.address is not None:
        request.META["REMOTE_ADDR"] = probe.address
    if not path:
        request.path_info = ""  # matches no path rule: the tier's limits alone
    request.user = probe.user if probe.user is not None else AnonymousUser()
    request.resolver_match = match
    return request


def planned(
    probe: Probe, check: Check, method: str, path: str, match: ResolverMatch | None
) -> Planned:
    """Ask the request path what ``check`` would count for ``probe``'s request."""
    request = build_request(probe, method, path, match)
    plan = core.plan(
        request,
        probe.identity,
        scope=check.scope,
        limits=check.limits,
        cost=check.cost,
        credential=check.credential,
        rule_only=check.rule_only,
        failure_mode=check.failure_mode,
        region=probe.region,
    )
    if isinstance(plan, Decision):
        return Planned(check, None, None, 1, (), uncounted=plan)
    tier_ids = {limit.id for limit in plan.tier.limits} if plan.tier is not None else set()
    tier = f"tier '{plan.tier.slug}'" if plan.tier is not None else ""
    rule = f"rule '{plan.endpoint.name}'" if plan.endpoint is not None else ""
    if check.limits is not None:
        rule = INLINE
    network = client_ip({"REMOTE_ADDR": probe.address}) if probe.address is not None else None
    ip_key = Identity("ip", network).key if network is not None else None
    # Whose counter each is: this client's, its address's, else (the only other kind of
    # counter a plan holds) the presented username's.
    whose = {ip_key: f"IP {network}", probe.identity.key: "this client"}
    # A counter rules counting failures share is told by the rule owning it, whichever rule
    # meets it (the policy counts it under that rule's row: its id and name).
    others = plan.endpoint.others if plan.endpoint is not None else {}
    where = {i: f"rule '{name}'" for i, name in others.items()} | dict.fromkeys(tier_ids, tier)
    groups = []
    for client, limits in ((plan.client, plan.limits), *plan.groups):
        counted_by = whose.get(client, f"username {probe.username}")
        counters = tuple(
            Counter(client, limit, SERVICE, EVERY_CLIENT)
            if limit.id == FLEET
            else Counter(client, limit, where.get(limit.id, rule), counted_by)
            for limit in limits
        )
        groups.append((client, counters))
    return Planned(
        check,
        plan.tier,
        plan.endpoint,
        plan.cost,
        tuple(groups),
        region=plan.region,
        failure_mode=core.failure_mode(plan),
    )


#: Where a ``@throttle(rate=…)`` view's own limit comes from (the inspector's words).
INLINE = "the view's @throttle"
#: Where the fleet limit comes from, and whose counter it is (the inspector's words).
SERVICE = "service protection"
EVERY_CLIENT = "every client"


def policy_scope(func: Any) -> str | None:
    """The scope of the admin rules ``@throttle(scope=...)`` (no inline rate) gives the view
    ``func``, found down its ``__wrapped__`` chain; ``None`` for any other view."""
    seen: set[int] = set()
    while func is not None and id(func) not in seen:
        seen.add(id(func))
        scope = getattr(func, "throttle_policy_scope", None)
        if scope is not None:
            return str(scope)
        func = getattr(func, "__wrapped__", None)
    return None


def view_checks(func: Any, method: str, scope: str | None, basic: bool = False) -> list[Check]:
    """The checks a request to the view ``func`` makes, in the order it makes them: a
    ``protect_credentials`` check before a login's password is read (``POST`` only); on a
    DRF view, the credential check of a protected Basic authentication class when the
    request sends ``basic`` credentials; then the view's own throttle (a DRF view's only
    when a ``PolicyThrottle`` is among its throttle classes; another view's only under
    ``@throttle``: its inline limit, or the rules of its scope, route or path). A view
    under none of them, or a path no view answers, meets no check: nothing limits it."""
    credential_scope = credential_mode = drf_view = own_mode = inline = None
    decorated = False  # @throttle(scope=…) somewhere down the chain
    # A class-based view decorated with method_decorator carries the marks on its methods
    # (as_view() copies dispatch's onto the view function, but not what names its bucket).
    view_class: Any = getattr(func, "view_class", None)
    starts = [
        *((getattr(view_class, n, None), n) for n in ("dispatch", method.lower())),
        (func, None),
    ]
    seen: set[int] = set()
    for func, name in starts:
        if name is not None and inline is None and hasattr(func, "throttle_options"):
            # Its unscoped inline limit is named after the class and method (_owner).
            owner = f"{view_class.__module__}.{view_class.__qualname__}.{name}"
            inline = functools.partial(func.throttle_options, owner)
        while func is not None and id(func) not in seen:  # down the __wrapped__ chain
            seen.add(id(func))
            decorated = decorated or hasattr(func, "throttle_policy_scope")
            credential_scope = credential_scope or getattr(func, "throttle_credential_scope", None)
            credential_mode = credential_mode or getattr(
                func, "throttle_credential_failure_mode", None
            )
            drf_view = drf_view or getattr(func, "cls", None)
            own_mode = own_mode or getattr(func, "throttle_failure_mode", None)
            inline = inline or getattr(func, "throttle_options", None)
            func = getattr(func, "__wrapped__", None)
    checks = []
    # Checked for every method that may carry credentials (a probe of a safe one has no body).
    if credential_scope is not None and method not in SAFE_METHODS:
        name = f"protect_credentials (scope '{credential_scope}')"
        checks.append(_credential_check(name, str(credential_scope), credential_mode))
    if inline is not None:  # @throttle(rate=…): its own limit, not the tier's
        options = inline()
        checks.append(
            Check(
                "the view's throttle",
                options["scope"],
                credential=options["credential"],
                failure_mode=_mode(options["failure_mode"]),
                limits=tuple(options["limits"]),
                cost=options["cost"],
            )
        )
        return checks
    if drf_view is None:
        if credential_scope is None and decorated:
            checks.append(Check("the view's throttle", scope, failure_mode=_mode(own_mode)))
        return checks
    throttles = getattr(drf_view, "throttle_classes", ()) or ()
    # Reading throttle_classes imported the DRF adapter if the settings name it.
    drf = sys.modules.get("django_throttle.drf")
    if drf is None:
        return checks
    # DRF tries its authentication classes in order; only a Basic one reads Basic credentials.
    kinds = (drf.CredentialProtection, drf.BasicAuthentication)
    auth = next(
        (
            auth
            for auth in getattr(drf_view, "authentication_classes", ()) or ()
            if isinstance(auth, type) and all(issubclass(auth, kind) for kind in kinds)
        ),
        None,
    )
    if basic and auth is not None:
        auth_scope: str = getattr(auth, "protection_scope", "authentication")
        checks.append(_credential_check(f"{auth.__name__} (scope '{auth_scope}')", auth_scope))
    if any(isinstance(t, type) and issubclass(t, drf.PolicyThrottle) for t in throttles):
        checks.append(
            Check(
                "PolicyThrottle",
                scope if scope is not None else getattr(drf_view, "throttle_scope", None),
                credential=bool(getattr(drf_view, "throttle_credential", False)),
                failure_mode=_mode(getattr(drf_view, "throttle_failure_mode", None)),
            )
        )
    return checks


def _mode(mode: Any) -> str | None:
    """A view's own failure mode as its adapter takes it: an unknown one is ignored."""
    return mode if mode in core.FAILURE_MODES else None


def _credential_check(name: str, scope: str, failure_mode: str | None = None) -> Check:
    """A credential rule's check (``protect_credentials``, a protected authentication
    class): it counts only when a rule matches; ``failure_mode``, the guard's own (the
    admin's login: ``local``)."""
    return Check(name, scope, credential=True, rule_only=True, failure_mode=failure_mode)


def every_counter(probe: Probe, snapshot: Policy) -> list[Counter]:
    """Every counter a request from ``probe`` could meet under the policy: its tier's, each
    endpoint rule's (as its throttle and as a credential check), counted by client, by its
    address and by the username it presents; for a username, the counters of that
    username that anonymous callers fill (a login's "by username" limits); for an address,
    those that signed-in users of the default tier fill from it. Each once."""
    # Stand-ins whose own counters are not the probe's: an anonymous caller presenting its
    # username; for an IP client, a signed-in user (of the default tier for authenticated
    # users) sending from its address, whose counters by IP address are that address's too.
    senders = [probe]
    if probe.username is not None:
        senders.append(Probe(_SOMEONE, username=probe.username, region=probe.region))
    if probe.identity.kind == "ip" and probe.address is not None:
        senders.append(Probe(_SIGNED_IN, address=probe.address, region=probe.region))
    found: dict[tuple[str, str], Counter] = {}
    for who in senders:
        for check, method, path, match in _rule_requests(snapshot):
            for counter in planned(who, check, method, path, match).counters:
                # The stand-in caller's own counters are not the probe's.
                if who is probe or counter.client != who.identity.key:
                    found.setdefault((counter.client, counter.limit.id), counter)
    return list(found.values())


def _rule_requests(snapshot: Policy) -> Iterable[tuple[Check, str, str, ResolverMatch | None]]:
    """A request matching no rule (the tier's limits), then, for each rule, one it matches
    (with a method it accepts), as the view's throttle and as a credential check."""
    from django_throttle.models.fields import HTTP_METHODS

    yield Check("the view's throttle"), "GET", "", None
    for rule in rules(snapshot):
        scope = rule.pattern if rule.match_type == "scope" else None
        route = rule.pattern if rule.match_type == "route" else None
        path = rule.pattern if rule.match_type == "path" else ""
        # POST first: logins present their username in a POST's form, as probes do.
        methods: Sequence[str] = sorted(rule.methods or HTTP_METHODS, key=lambda m: m != "POST")
        method = next((m for m in methods if snapshot.match(m, scope, route, path) is rule), None)
        if method is None:
            continue  # another rule always wins: no request meets this one
        match = None if route is None else _route_match(route)
        yield Check("the view's throttle", scope), method, path, match
        if scope is not None:
            yield _credential_check("credential check", scope), method, "", None


def rules(snapshot: Policy) -> list[EndpointPolicy]:
    """Every enabled endpoint rule of the policy, once each, by name."""
    groups = (snapshot.by_path, *snapshot.by_scope.values(), *snapshot.by_route.values())
    unique = {rule.id: rule for group in groups for rule in group}
    return sorted(unique.values(), key=lambda rule: rule.name)


def _route_match(view_name: str) -> ResolverMatch:
    *namespaces, url_name = view_name.split(":")
    return ResolverMatch(_no_view, (), {}, url_name=url_name, namespaces=list(namespaces))


def _no_view(request: HttpRequest) -> None:
    """Stands in for the view of a route rule's probe request (never called)."""


# --- counters by presented username ------------------------------------------------------------


def login_probe(address: str | None, username: str | None) -> Probe:
    """An anonymous login presenting ``username`` (a stand-in name when ``None``: the
    counter is known by its label alone) from ``address`` (a stand-in caller, whose own
    counters are left out, when ``None``)."""
    network = client_ip({"REMOTE_ADDR": address}) if address is not None else None
    identity = Identity("ip", network) if network is not None else _SOMEONE
    return Probe(identity, None, address, _STAND_IN_USERNAME if username is None else username)


def as_counter(plan: Planned, probe: Probe, counter: str, counted_by: str) -> Planned:
    """``plan`` of a :func:`login_probe`, its username's counters told as ``counter`` (the
    backend's label: the username's own, a long name's digest, a device's) and the stand-in
    caller's own counters left out."""
    presented = Identity("username", str(probe.username)).key
    groups = []
    for client, found in plan.groups:
        if client == _SOMEONE.key:
            continue
        if client == presented:
            client = counter
            found = tuple(replace(c, client=counter, counted_by=counted_by) for c in found)
        groups.append((client, found))
    return replace(plan, groups=tuple(groups))


def login_counters(counter: str, username: str | None, snapshot: Policy) -> list[Counter]:
    """Every counter by presented username that a login presenting ``username`` meets
    (the limits credential rules count by username), told as ``counter``, the backend's
    label of that username's counter (or of a device's, which has the same limits)."""
    who = login_probe(None, username)
    counted_by = f"username {username}" if username is not None else counter
    found: dict[str, Counter] = {}
    for check, method, path, match in _rule_requests(snapshot):
        plan = as_counter(planned(who, check, method, path, match), who, counter, counted_by)
        for c in plan.counters:
            if c.client == counter:
                found.setdefault(c.limit.id, c)
    return list(found.values())
