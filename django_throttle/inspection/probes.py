"""The requests the operator tools build, so that the request path itself says what a client
meets.

``throttle_inspect``, ``throttle_explain``, ``throttle_reset`` and the admin's inspector never
work out a client's counters on their own: they build the request the client would send (method,
path, address, user, the username it presents), ask :func:`django_throttle.request.core.plan`
what :func:`~django_throttle.request.core.check` would count it against, and read those
counters. So every counter a request meets is seen, whether it is counted by client, by IP
address or by username, and a change to the request path changes the tools with it.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.contrib.auth import get_user_model
from django.http import HttpRequest
from django.urls import ResolverMatch

from django_throttle.identity import Identity, client_ip
from django_throttle.policy.live import EndpointPolicy, Policy, TierPolicy
from django_throttle.rates import FLEET, Decision, Limit
from django_throttle.request import core

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
        credential=check.credential,
        rule_only=check.rule_only,
        region=probe.region,
    )
    if isinstance(plan, Decision):
        return Planned(check, None, None, 1, (), uncounted=plan)
    tier_ids = {limit.id for limit in plan.tier.limits} if plan.tier is not None else set()
    tier = f"tier '{plan.tier.slug}'" if plan.tier is not None else ""
    rule = f"rule '{plan.endpoint.name}'" if plan.endpoint is not None else ""
    network = client_ip({"REMOTE_ADDR": probe.address}) if probe.address is not None else None
    ip_key = Identity("ip", network).key if network is not None else None
    # Whose counter each is: this client's, its address's, else (the only other kind of
    # counter a plan holds) the presented username's.
    whose = {ip_key: f"IP {network}", probe.identity.key: "this client"}
    groups = []
    for client, limits in ((plan.client, plan.limits), *plan.groups):
        counted_by = whose.get(client, f"username {probe.username}")
        counters = tuple(
            Counter(client, limit, SERVICE, EVERY_CLIENT)
            if limit.id == FLEET
            else Counter(client, limit, tier if limit.id in tier_ids else rule, counted_by)
            for limit in limits
        )
        groups.append((client, counters))
    return Planned(check, plan.tier, plan.endpoint, plan.cost, tuple(groups), region=plan.region)


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
    when a ``PolicyThrottle`` is among its throttle classes; any other view is assumed to
    be throttled by the policy, as a path rule or ``@throttle(scope=...)`` would)."""
    credential_scope = drf_view = None
    seen: set[int] = set()
    while func is not None and id(func) not in seen:  # down the __wrapped__ chain
        seen.add(id(func))
        credential_scope = credential_scope or getattr(func, "throttle_credential_scope", None)
        drf_view = drf_view or getattr(func, "cls", None)
        func = getattr(func, "__wrapped__", None)
    checks = []
    if credential_scope is not None and method == "POST":
        name = f"protect_credentials (scope '{credential_scope}')"
        checks.append(_credential_check(name, str(credential_scope)))
    if drf_view is None:
        if credential_scope is None:
            checks.append(Check("the view's throttle", scope))
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
            )
        )
    return checks


def _credential_check(name: str, scope: str) -> Check:
    """A credential rule's check (``protect_credentials``, a protected authentication
    class): it counts only when a rule matches."""
    return Check(name, scope, credential=True, rule_only=True)


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
