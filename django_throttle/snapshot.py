"""The compiled policy snapshot's types: what a request reads to find its tier and limits.

Plain frozen objects with no database access; :mod:`django_throttle.policy` builds them from
the admin rows and keeps the current one per process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django_throttle.conf import app_settings
from django_throttle.identity import Identity
from django_throttle.rates import Limit
from django_throttle.user_tiers import UserTiers

__all__ = ["EndpointPolicy", "Policy", "TierPolicy"]


@dataclass(frozen=True, slots=True)
class TierPolicy:
    id: int
    slug: str
    name: str
    priority: int
    limits: tuple[Limit, ...]
    #: "" inherits the setting; else "open", "closed" or "local".
    failure_mode: str = ""


@dataclass(frozen=True, slots=True)
class EndpointPolicy:
    """An enabled endpoint rule; ``limits_by_tier`` already holds tier + endpoint limits."""

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

    def accepts(self, method: str) -> bool:
        return not self.methods or method in self.methods

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
    #: ``clock()`` when compiling started, for ``DJANGO_THROTTLE_POLICY_MAX_AGE``.
    compiled_at: float = 0.0
    #: False for the empty stand-in used while the database cannot be read.
    loaded: bool = True

    def match(
        self, method: str, scope: str | None = None, route: str | None = None, path: str = ""
    ) -> EndpointPolicy | None:
        """The endpoint rule for a request: by scope, else route name, else longest path
        pattern covering the path (whole segments); among rules with the same pattern, one
        naming the method beats one for all."""
        if scope is not None:
            for rule in self.by_scope.get(scope, ()):
                if rule.accepts(method):
                    return rule
        if route is not None:
            for rule in self.by_route.get(route, ()):
                if rule.accepts(method):
                    return rule
        for rule in self.by_path:
            if rule.matches_path(path) and rule.accepts(method):
                return rule
        return None

    def tier_for(self, identity: Identity) -> TierPolicy | None:
        """The client's tier: own assignment, else best group assignment, else the default.
        No query: assignments were compiled into the snapshot."""
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

    def failure_mode_for(
        self,
        tier: TierPolicy | None,
        endpoint: EndpointPolicy | None,
        default: str | None = None,
    ) -> str:
        """The endpoint rule's failure mode, else the tier's, else ``default`` (a credential
        endpoint's "closed"), else the setting."""
        if endpoint is not None and endpoint.failure_mode:
            return endpoint.failure_mode
        if tier is not None and tier.failure_mode:
            return tier.failure_mode
        return default or app_settings.FAILURE_MODE
