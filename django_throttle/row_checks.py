"""System checks on stored policy rows: ``manage.py check`` lists every row the policy
compiler would skip (ids ``django_throttle.E101``…), naming the row, the field and the fix,
and every limit row that repeats another of the same tier or rule (``django_throttle.W106``:
the compiler counts it once, but the copy is clutter an operator should delete).

Rows written around the admin (fixtures, SQL, ``QuerySet.update``) can hold values the admin
refuses. The compiler skips such a row and logs it; this check makes it visible before a
deploy. No tables yet (before ``migrate``) or no database: nothing to report.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.core import checks

__all__ = ["CHECK_IDS", "DUPLICATE_ID", "bad_rows", "check_rows", "duplicate_rows", "register"]

#: Check id per model.
CHECK_IDS = {
    "Tier": "django_throttle.E101",
    "TierLimit": "django_throttle.E102",
    "EndpointRule": "django_throttle.E103",
    "EndpointLimit": "django_throttle.E104",
    "Exemption": "django_throttle.E105",
}
#: Check id of a limit row that repeats another.
DUPLICATE_ID = "django_throttle.W106"


def bad_rows() -> Iterator[tuple[Any, dict[str, str]]]:
    """Every policy row with a problem, with its problems by field (a few queries)."""
    from django_throttle.models import EndpointLimit, EndpointRule, Exemption, Tier, TierLimit

    querysets = (
        Exemption.objects.order_by("pk"),
        Tier.objects.order_by("pk"),
        TierLimit.objects.select_related("tier").order_by("pk"),
        EndpointRule.objects.order_by("pk"),
        EndpointLimit.objects.select_related("rule", "tier").order_by("pk"),
    )
    for queryset in querysets:
        for row in queryset:
            if problems := row.row_problems():
                yield row, problems


def duplicate_rows() -> Iterator[tuple[Any, Any]]:
    """Every limit row that repeats an earlier one (same parent, same counter: see
    ``duplicate_key``), with the row it repeats (two queries)."""
    from django_throttle.models import EndpointLimit, TierLimit

    for queryset in (
        TierLimit.objects.select_related("tier").order_by("pk"),
        EndpointLimit.objects.select_related("rule", "tier").order_by("pk"),
    ):
        first: dict[tuple[object, ...], Any] = {}
        for row in queryset:
            key = row.duplicate_key()  # None (a bad row) repeats nothing
            if key in first:
                yield row, first[key]
            elif key is not None:
                first[key] = row


def check_rows(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django.db import transaction

    from django_throttle.models import Tier

    errors: list[checks.CheckMessage] = []
    try:
        # A savepoint, so a missing table cannot break a surrounding transaction.
        with transaction.atomic(using=Tier.objects.db):
            found = list(bad_rows())
            repeated = list(duplicate_rows())
    except Exception:
        # No tables yet, no database, or database access refused (test runners): a check
        # that cannot read rows has nothing to say.
        return []
    for row, problems in found:
        model = type(row).__name__
        what = "; ".join(f"{field}: {reason}" for field, reason in problems.items())
        errors.append(
            checks.Error(
                f"{model} pk={row.pk} cannot be used, so the throttle policy skips it: {what}.",
                hint=f"Correct or delete it in the admin ({model} {row.pk}).",
                obj=row,
                id=CHECK_IDS[model],
            )
        )
    for row, original in repeated:
        model = type(row).__name__
        parent = f"tier '{row.tier.slug}'" if model == "TierLimit" else f"rule '{row.rule.name}'"
        errors.append(
            checks.Warning(
                f"{model} pk={row.pk} repeats {model} pk={original.pk} of {parent} ({row}): "
                "the policy counts that limit once and ignores the copy.",
                hint=f"Delete one of them in the admin ({parent}).",
                obj=row,
                id=DUPLICATE_ID,
            )
        )
    return errors


def register() -> None:
    checks.register(check_rows, checks.Tags.models)
