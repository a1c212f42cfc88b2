"""The compiled policy snapshot's types: what a request reads to find its tier and limits, and
how it checks an API key against the keys' digests (one HMAC-SHA256, no query).

Plain frozen objects with no database access; :mod:`django_throttle.policy.live` builds them from
the admin rows and keeps the current one per process.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Any

from django_throttle.api_key_format import KEY_MAX_LENGTH, key_digest, key_prefix
from django_throttle.conf import app_settings
from django_throttle.identity import Identity
from django_throttle.policy.exemptions import Exemptions
from django_throttle.policy.user_tiers import UserTiers
from django_throttle.rates import Limit

#: Compared against when no key has the presented prefix, so an unknown prefix costs what a
#: wrong secret costs: one HMAC and one constant-time comparison.
_DUMMY_DIGEST = bytes(32)


@dataclass(frozen=True, slots=True)
class ApiKeyPolicy:
    """An active API key as the snapshot holds it: never the key, only its digest.
    ``expires`` is Unix seconds (``None``: never), checked on every request."""

    pk: int
    prefix: str
    digest: bytes
    tier_id: int
    expires: float | None = None
    owner_id: Any = None


@dataclass(frozen=True, slots=True)
class TierPolicy:
    id: int
    slug: str
    name: str
    priority: int
    limits: tuple[Limit, ...]
    #: "" inherits the setting; else "open", "closed" or "local".
    failure_mode: str = ""


#: Limits counted under one counter other than the client's: ``("ip", limits)`` or
#: ``("username", limits)``.
CountedGroup = tuple[str, tuple[Limit, ...]]


@dataclass(frozen=True, slots=True)
class EndpointPolicy:
    """An enabled endpoint rule; ``limits_by_tier`` already holds tier + endpoint limits
    counted by client, ``rule_limits_by_tier`` the rule's own share of them (what its
    counting policy may give back, and what a credential check counts), and
    ``groups_by_tier`` the rule's limits counted by IP address or username (only tiers that
    have some), ``credential_groups`` those of every tier together. ``counts`` is "all",
    "success" or "failures"."""

    id: int
    name: str
    match_type: str
    pattern: str
    methods: frozenset[str]
    cost: int
    shadow: bool
    limits_by_tier: dict[int, tuple[Limit, ...]]
    #: "" inherits the tier's; else "open", "closed" or "local".
    failure_mode: str = ""
    counts: str = "all"
    rule_limits_by_tier: dict[int, tuple[Limit, ...]] = field(default_factory=dict)
    groups_by_tier: dict[int, tuple[CountedGroup, ...]] = field(default_factory=dict)
    #: Every tier's limits counted by IP address or username, for credential checks: those
    #: counters protect the account and the server, whoever the caller is.
    credential_groups: tuple[CountedGroup, ...] = ()
    #: A login or token endpoint's rule by its rows: one with a limit counted by username
    #: (only credential requests present one), or one counting failures. Its checks are
    #: credential checks whichever adapter makes them.
    credential: bool = False

    def matches_path(self, path: str) -> bool:
        """Whole path segments: ``/api/pi`` covers ``/api/pi`` and ``/api/pi/x``, never
        ``/api/pizza``; a pattern ending in ``/`` covers everything below it."""
        if self.pattern.endswith("/"):
            return path.startswith(self.pattern)
        return path == self.pattern or path.startswith(self.pattern + "/")


@dataclass(frozen=True)
class Policy:
    """Everything a request needs to find its limits, with no database access."""

    tiers: dict[int, TierPolicy]
    default_anonymous: TierPolicy | None
    default_authenticated: TierPolicy | None
    by_scope: dict[str, tuple[EndpointPolicy, ...]]
    by_route: dict[str, tuple[EndpointPolicy, ...]]
    by_path: tuple[EndpointPolicy, ...]
    version: str | None = None
    user_tiers: UserTiers = field(default_factory=UserTiers)
    #: ``clock()`` when compiling started, for :data:`django_throttle.policy.live.MAX_AGE`.
    compiled_at: float = 0.0
    #: False for the empty stand-in used while the database cannot be read.
    loaded: bool = True
    #: Active API keys by prefix.
    api_keys: dict[str, ApiKeyPolicy] = field(default_factory=dict)
    #: Users (direct and through groups) and networks never limited.
    exemptions: Exemptions = field(default_factory=Exemptions)
    #: The one store for what the request path works out from this snapshot (what a view,
    #: a rule and a tier come to), so it is dropped with the snapshot when the version
    #: changes; no other cache holds anything compiled from the policy.
    compiled: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def verify_key(self, key: str, secret: bytes, now: float) -> ApiKeyPolicy | None:
        """The active, unexpired API key ``key`` is, else ``None``. No query; every key of a
        plausible length costs one HMAC and one constant-time comparison, whether its prefix
        is unknown, its secret wrong, or it is revoked or expired."""
        if len(key) > KEY_MAX_LENGTH:
            return None
        found = self.api_keys.get(key_prefix(key))
        expected = _DUMMY_DIGEST if found is None else found.digest
        matches = hmac.compare_digest(key_digest(secret, key), expected)
        expired = found is not None and found.expires is not None and now >= found.expires
        return None if found is None or not matches or expired else found

    def match(
        self, method: str, scope: str | None = None, route: str | None = None, path: str = ""
    ) -> EndpointPolicy | None:
        """The endpoint rule for a request: by scope, else route name, else longest path
        pattern covering the path (whole segments); among rules with the same pattern, one
        naming the method beats one for all. HEAD meets the rules of GET, after a rule naming
        HEAD itself: Django (and DRF) answer HEAD with the GET handler, so a HEAD costs the
        server what a GET does and must not escape the GET's limits."""
        for index, name in ((self.by_scope, scope), (self.by_route, route)):
            if name is not None and (found := _pick(index.get(name, ()), method)) is not None:
                return found
        return _pick(self.by_path, method, path)

    def tier_for(self, identity: Identity) -> TierPolicy | None:
        """The client's tier: own assignment, else best group assignment, else the default.
        An API key's tier is its own. No query: assignments were compiled into the snapshot."""
        if identity.kind == "key":
            api_key = self.api_keys.get(identity.value)
            if api_key is None:  # revoked between resolving and now: treated as unknown
                return self.default_anonymous
            return self.tiers.get(api_key.tier_id, self.default_authenticated)
        if identity.user_id is None:
            return self.default_anonymous if identity.kind == "ip" else self.default_authenticated
        tier_id = self.user_tiers.get(identity.user_id)
        if tier_id is None:
            return self.default_authenticated
        return self.tiers.get(tier_id, self.default_authenticated)

    def limits_for(
        self, tier: TierPolicy | None, endpoint: EndpointPolicy | None
    ) -> tuple[Limit, ...]:
        if tier is None:
            return ()
        if endpoint is None:
            return tier.limits
        return endpoint.limits_by_tier.get(tier.id, tier.limits)

    def groups_for(
        self,
        tier: TierPolicy | None,
        endpoint: EndpointPolicy | None,
        credential: bool = False,
    ) -> tuple[CountedGroup, ...]:
        """The endpoint's limits counted by IP address or username for this tier; for a
        ``credential`` check (login, token, authentication) or a credential rule
        (:attr:`EndpointPolicy.credential`), those of every tier whatever the caller's: they
        protect the account named and the server, so a signed-in caller or an API key
        holder guessing someone else's password meets them too."""
        if endpoint is None:
            return ()
        if credential or endpoint.credential:
            return endpoint.credential_groups
        return () if tier is None else endpoint.groups_by_tier.get(tier.id, ())

    @staticmethod
    def failure_mode_for(
        tier: TierPolicy | None,
        endpoint: EndpointPolicy | None,
        credential: bool = False,
        view: str | None = None,
    ) -> str:
        """The one place a check's failure mode is decided: the rule's (the view's own in
        code, ``view``: ``@throttle(failure_mode=…)`` or a DRF view's
        ``throttle_failure_mode``; else the endpoint rule's in the admin), else the tier's,
        else the ``FAILURE_MODE`` setting; except that a ``credential`` check (a login or
        token endpoint, or any check under a credential rule) is never served uncounted by
        the setting's ``"open"``: it counts ``"local"`` then, so password guessing stays
        limited through an outage and operators can still sign in to the admin. A rule or
        tier that names a mode gets that mode. Static: a check made while no policy is
        compiled is decided the same way."""
        if view:
            return view
        for owner in (endpoint, tier):
            if owner is not None and owner.failure_mode:
                return owner.failure_mode
        mode = app_settings.FAILURE_MODE
        return "local" if credential and mode == "open" else mode


def _pick(
    rules: tuple[EndpointPolicy, ...], method: str, path: str | None = None
) -> EndpointPolicy | None:
    """The first of ``rules`` (ordered most specific first: longest pattern, then those
    naming methods) that covers ``method`` (and ``path``, when given). A rule that covers
    HEAD only by naming GET yields to a rule of the same pattern naming HEAD, and beats one
    of the same pattern for every method."""
    covering: EndpointPolicy | None = None
    for rule in rules:
        if path is not None and not rule.matches_path(path):
            continue
        if covering is not None and rule.pattern != covering.pattern:
            break
        if not rule.methods or method in rule.methods:
            return covering if covering is not None and not rule.methods else rule
        if covering is None and method == "HEAD" and "GET" in rule.methods:
            covering = rule
    return covering
