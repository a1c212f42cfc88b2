"""What a request would get before anyone sends it: the checks its view makes, the rule each
matches, every counter at what cost, and the decision the server would give now, computed
without consuming. Used by ``manage.py throttle_explain`` and the admin's inspector.

The checks and counters come from the request path itself
(:mod:`django_throttle.inspection.probes`); the counters' states are read as
:mod:`django_throttle.inspection.clients` reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.urls import Resolver404, ResolverMatch, resolve
from django.utils.translation import gettext as _

from django_throttle.backends import get_backend
from django_throttle.conf import app_settings
from django_throttle.inspection.clients import Bucket, buckets, probe
from django_throttle.inspection.probes import (
    Counter,
    Planned,
    Probe,
    as_counter,
    planned,
    view_checks,
)
from django_throttle.inspection.subjects import Subject, tier_and_reason
from django_throttle.policy.live import current
from django_throttle.policy.snapshot import EndpointPolicy, Policy, TierPolicy
from django_throttle.rates import Decision


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
        scope = getattr(view, "throttle_scope", None)
    snapshot = current()
    tier, reason = tier_and_reason(subject, snapshot)
    who = probe(subject, address, username)
    basic = who.username is not None and method != "POST"  # see probes.build_request
    checks = view_checks(func, method, scope, basic) if app_settings.ENABLED else []
    plans = [planned(who, check, method, path, match) for check in checks]
    if subject.by_username:  # a login presenting it: its counter under its own label
        counted_by = f"username {subject.username}" if subject.username else subject.client
        plans = [as_counter(plan, who, subject.client, counted_by) for plan in plans]
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
