"""What an operator asks about one client: which tier and why, the live state of each bucket
(read without consuming), what a request would get before anyone sends it, and clearing the
client's buckets. Used by ``manage.py throttle_inspect``, ``throttle_explain``,
``throttle_reset`` and the admin's inspector.

These run off the request path, so they may query the database (to say *why* a client is in a
tier); the limits and tiers come from the same compiled snapshot requests use.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.urls import Resolver404, resolve
from django.utils.translation import gettext as _

from django_throttle import policy as policy_module
from django_throttle.backends import get_backend
from django_throttle.conf import app_settings
from django_throttle.identity import Identity, client_ip
from django_throttle.rates import Decision, Limit
from django_throttle.snapshot import EndpointPolicy, Policy, TierPolicy

__all__ = [
    "Bucket",
    "Explanation",
    "Inspection",
    "Subject",
    "UnknownClient",
    "explain",
    "inspect",
    "parse_client",
    "reset",
]


class UnknownClient(ValueError):
    """The text names no user, API key or IP address; the message says what was tried."""


@dataclass(frozen=True)
class Subject:
    """A client as the limiter counts it, and how to name it to a person."""

    identity: Identity
    label: str
    user: Any = None
    api_key: Any = None

    @property
    def client(self) -> str:
        return self.identity.key


@dataclass(frozen=True)
class Bucket:
    """One limit's live state for a client. ``where`` says where the limit comes from (the
    tier, or an endpoint rule); ``state`` is the peek."""

    limit: Limit
    where: str
    state: Decision

    @property
    def used(self) -> bool:
        """Whether the client has used any of it (a full bucket has nothing stored)."""
        return self.state.remaining < self.limit.capacity


@dataclass(frozen=True)
class Inspection:
    subject: Subject
    tier: TierPolicy | None
    reason: str
    buckets: list[Bucket] = field(default_factory=list)


@dataclass(frozen=True)
class Explanation:
    """What a request would meet: the rule it matches, the limits and cost, and the
    decision it would get now (computed without consuming)."""

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


# --- naming a client ------------------------------------------------------------------------


def parse_client(text: str) -> Subject:
    """Read ``user:<username or id>``, ``key:<prefix or whole key>``, ``ip:<address>`` or a
    bare username, address or API key. Raises :class:`UnknownClient`."""
    text = (text or "").strip()
    kind, sep, value = text.partition(":")
    if sep and kind in ("user", "key", "ip"):
        return {"user": _user, "key": _api_key, "ip": _address}[kind](value.strip())
    if _is_address(text):
        return _address(text)
    from django_throttle.snapshot import key_prefix

    if text and _api_key_row(key_prefix(text)) is not None:
        return _api_key(text)
    return _user(text)


def _user(value: str) -> Subject:
    model = get_user_model()
    user = model._default_manager.filter(**{model.USERNAME_FIELD: value}).first()
    if user is None and value.isdigit():
        user = model._default_manager.filter(pk=value).first()
    if user is None:
        raise UnknownClient(_("no user with the username or id %(value)r") % {"value": value})
    return Subject(
        Identity("user", str(user.pk), user_id=user.pk), f"user {user.get_username()}", user=user
    )


def _api_key_row(prefix: str) -> Any:
    from django_throttle.models import ApiKey

    return ApiKey.objects.filter(prefix=prefix).select_related("tier").first()


def _api_key(value: str) -> Subject:
    from django_throttle.snapshot import key_prefix

    row = _api_key_row(value) or _api_key_row(key_prefix(value))
    if row is None:
        raise UnknownClient(_("no API key with the prefix %(value)r") % {"value": value})
    return Subject(Identity("key", row.prefix), f"API key {row.prefix} ({row.name})", api_key=row)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_network(text.split("%", 1)[0], strict=False)
    except ValueError:
        return False
    return True


def _address(value: str) -> Subject:
    """The address's network as requests from it are counted (IPv6 by prefix, IPv4-mapped
    unwrapped): ``2001:db8::1`` and ``2001:db8::2`` are one client under a /64."""
    network = client_ip({"REMOTE_ADDR": value.split("/", 1)[0]}) if value else None
    if network is None:
        raise UnknownClient(_("%(value)r is not an IP address") % {"value": value})
    return Subject(Identity("ip", network), f"IP {network}")


# --- tier and limits ------------------------------------------------------------------------


def _snapshot() -> Policy:
    return policy_module.current()


def tier_and_reason(subject: Subject, snapshot: Policy) -> tuple[TierPolicy | None, str]:
    """The client's tier as requests see it, and why, in words."""
    tier = snapshot.tier_for(subject.identity)
    name = f"'{tier.slug}'" if tier is not None else _("none")
    if subject.api_key is not None:
        if subject.identity.value not in snapshot.api_keys:
            return tier, _("the API key is revoked or expired: counted as anonymous (%(tier)s)") % {
                "tier": name
            }
        return tier, _("the API key's own tier (%(tier)s)") % {"tier": name}
    if subject.user is not None:
        from django_throttle.models import TierAssignment

        own = TierAssignment.objects.filter(user=subject.user).select_related("tier").first()
        if own is not None and tier is not None and own.tier_id == tier.id:
            return tier, _("assigned to %(tier)s directly") % {"tier": name}
        group = None
        if tier is not None:
            group = (
                TierAssignment.objects.filter(group__in=subject.user.groups.all(), tier_id=tier.id)
                .select_related("group")
                .first()
            )
        if group is not None:
            return tier, _("member of group '%(group)s', assigned to %(tier)s") % {
                "group": group.group,
                "tier": name,
            }
        if tier is None:
            return None, _("no default tier for authenticated users: not limited")
        return tier, _("the default tier for authenticated users (%(tier)s)") % {"tier": name}
    if tier is None:
        return None, _("no default tier for anonymous clients: not limited")
    return tier, _("the default tier for anonymous clients (%(tier)s)") % {"tier": name}


def _rules(snapshot: Policy) -> list[EndpointPolicy]:
    rules = list(snapshot.by_path)
    for group in (*snapshot.by_scope.values(), *snapshot.by_route.values()):
        rules.extend(group)
    unique = {rule.id: rule for rule in rules}
    return sorted(unique.values(), key=lambda rule: rule.name)


def client_limits(tier: TierPolicy | None, snapshot: Policy) -> list[tuple[Limit, str]]:
    """Every limit of the policy that counts this tier's clients: the tier's own, then each
    endpoint rule's (limits set with ``@throttle(rate=...)`` on a view are not in the
    policy and are not listed)."""
    if tier is None:
        return []
    found: dict[str, tuple[Limit, str]] = {}
    for limit in tier.limits:
        found.setdefault(limit.id, (limit, f"tier '{tier.slug}'"))
    for rule in _rules(snapshot):
        for limit in rule.limits_by_tier.get(tier.id, ()):
            found.setdefault(limit.id, (limit, f"rule '{rule.name}'"))
    return list(found.values())


def _buckets(client: str, limits: Sequence[tuple[Limit, str]]) -> list[Bucket]:
    backend = get_backend()
    return [Bucket(limit, where, backend.peek(client, [limit])) for limit, where in limits]


# --- the three questions --------------------------------------------------------------------


def inspect(subject: Subject) -> Inspection:
    """The client's tier, why, and every bucket's state, read without consuming."""
    snapshot = _snapshot()
    tier, reason = tier_and_reason(subject, snapshot)
    return Inspection(
        subject, tier, reason, _buckets(subject.client, client_limits(tier, snapshot))
    )


def explain(subject: Subject, method: str, path: str, scope: str | None = None) -> Explanation:
    """Which rule a ``method`` request to ``path`` from this client matches, which limits
    apply at what cost, and what it would get now, without sending it or consuming."""
    method = (method or "GET").upper()
    if not path.startswith("/"):
        path = "/" + path
    route = None
    try:
        match = resolve(path)
    except Resolver404:
        match = None
    if match is not None:
        route = match.view_name
        if scope is None:
            view = getattr(match.func, "view_class", None) or getattr(match.func, "cls", None)
            scope = getattr(view, "throttle_scope", None)
    snapshot = _snapshot()
    tier, reason = tier_and_reason(subject, snapshot)
    rule = snapshot.match(method, scope, route, path)
    limits = snapshot.limits_for(tier, rule)
    cost = rule.cost if rule is not None else 1
    tier_ids = {limit.id for limit in (tier.limits if tier is not None else ())}
    described = [
        (
            limit,
            f"tier '{tier.slug}'"
            if tier is not None and limit.id in tier_ids
            else f"rule '{rule.name}'"
            if rule is not None
            else "",
        )
        for limit in limits
    ]
    buckets = _buckets(subject.client, described)
    decision = None
    if limits and app_settings.ENABLED:
        decision = _predict(subject.client, limits, cost)
    return Explanation(
        subject=subject,
        method=method,
        path=path,
        scope=scope,
        route=route,
        tier=tier,
        reason=reason,
        rule=rule,
        cost=cost,
        limits=tuple(limits),
        buckets=buckets,
        decision=decision,
        exempt="" if app_settings.ENABLED else "DJANGO_THROTTLE_ENABLED is off",
    )


def _predict(client: str, limits: Sequence[Limit], cost: int) -> Decision:
    """The decision a request of ``cost`` would get now, without consuming: the backend's
    peek with that cost. A backend written before ``peek`` took a cost is asked for the state
    alone, and the request is judged by the fewest tokens left."""
    backend = get_backend()
    try:
        return backend.peek(client, limits, cost=cost)
    except TypeError:
        state = backend.peek(client, limits)
        if state.remaining >= cost:
            return state
        return dataclasses.replace(state, allowed=False, retry_after=state.reset_after)


def reset(subject: Subject, limit_ids: Sequence[str] | None = None) -> list[Limit]:
    """Forget the client's state in every bucket of its tier and endpoint rules (or only those
    whose ids are in ``limit_ids``): the client starts afresh. Returns the limits reset.
    Raises ``ValueError`` naming ids that are not among the client's limits."""
    snapshot = _snapshot()
    tier, _reason = tier_and_reason(subject, snapshot)
    limits = [limit for limit, _where in client_limits(tier, snapshot)]
    if limit_ids:
        known = {limit.id for limit in limits}
        unknown = [i for i in limit_ids if i not in known]
        if unknown:
            raise ValueError(
                f"not a limit of {subject.label}: {', '.join(unknown)} "
                f"(its limits: {', '.join(sorted(known)) or 'none'})"
            )
        limits = [limit for limit in limits if limit.id in set(limit_ids)]
    if limits:
        get_backend().reset(subject.client, limits)
    return limits
