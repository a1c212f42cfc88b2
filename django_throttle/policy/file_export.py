"""Export: the policy in the database as a document (plain dicts and lists, JSON-ready).

Rows are named by natural keys (tier slug, rule name, username, group name), never by
primary key; limits are written under their tier or rule. Reads only.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model

from django_throttle.models import EndpointRule, Tier, TierAssignment
from django_throttle.policy.file_rows import _ordered, _values
from django_throttle.policy.text import FORMAT_VERSION

__all__ = ["export_policy"]


def export_policy(*, assignments: bool = True) -> dict[str, Any]:
    """The policy in the database as a document (plain dicts and lists, JSON-ready)."""
    document: dict[str, Any] = {"version": FORMAT_VERSION}
    document["tiers"] = [
        {**_values(tier), "limits": [_values(limit) for limit in _ordered(tier.limits.all())]}
        for tier in Tier.objects.order_by("slug").prefetch_related("limits")
    ]
    rules = EndpointRule.objects.order_by("name").prefetch_related("limits__tier")
    document["rules"] = [
        {
            **_values(rule),
            "limits": [
                {"tier": limit.tier.slug, **_values(limit)}
                for limit in sorted(rule.limits.all(), key=lambda row: (row.tier.slug, row.pk))
            ],
        }
        for rule in rules
    ]
    if assignments:
        document["assignments"] = _export_assignments()
    return document


def _export_assignments() -> list[dict[str, str]]:
    username = get_user_model().USERNAME_FIELD
    rows = TierAssignment.objects.select_related("tier", "user", "group")
    out = []
    for row in rows:
        entry = {"tier": row.tier.slug}
        if row.user_id is not None:
            entry["user"] = getattr(row.user, username)
        else:
            entry["group"] = row.group.name if row.group is not None else ""
        if row.note:
            entry["note"] = row.note
        out.append(entry)
    return sorted(out, key=lambda e: (e.get("user", ""), e.get("group", "")))
