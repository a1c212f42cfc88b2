"""Small helpers that create policy rows the way an operator would in the admin."""

from __future__ import annotations

from django_throttle.models import EndpointLimit, EndpointRule, Tier, TierLimit


def tier(slug: str, *rates: str, burst: int | None = None, **flags: object) -> Tier:
    row = Tier.objects.create(slug=slug, name=slug.title(), **flags)
    for rate in rates:
        TierLimit.objects.create(tier=row, rate=rate, burst=burst)
    return row


def endpoint(
    name: str,
    match_type: str,
    pattern: str,
    *,
    cost: int = 1,
    methods: str = "",
    shadow: bool = False,
    limits: dict[Tier, str] | None = None,
) -> EndpointRule:
    rule = EndpointRule.objects.create(
        name=name, match_type=match_type, pattern=pattern, cost=cost, methods=methods, shadow=shadow
    )
    for owner, rate in (limits or {}).items():
        EndpointLimit.objects.create(rule=rule, tier=owner, rate=rate)
    return rule
