"""System checks on stored policy rows: ``manage.py check`` lists every row the policy
compiler would skip (ids ``django_throttle.E101``…), naming the row, the field and the fix.

Rows written around the admin (fixtures, SQL, ``QuerySet.update``) can hold values the admin
refuses. The compiler skips such a row and logs it; this check makes it visible before a
deploy. No tables yet (before ``migrate``) or no database: nothing to report.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.core import checks

__all__ = ["CHECK_IDS", "bad_rows", "check_rows", "register"]

#: Check id per model.
CHECK_IDS = {
    "Tier": "django_throttle.E101",
    "TierLimit": "django_throttle.E102",
    "EndpointRule": "django_throttle.E103",
    "EndpointLimit": "django_throttle.E104",
    "Exemption": "django_throttle.E105",
}


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
            problems = row.row_problems()
            if problems:
                yield row, problems


def check_rows(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django.db import transaction

    from django_throttle.models import Tier

    errors: list[checks.CheckMessage] = []
    try:
        # A savepoint, so a missing table cannot break a surrounding transaction.
        with transaction.atomic(using=Tier.objects.db):
            found = list(bad_rows())
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
    return errors


def register() -> None:
    checks.register(check_rows, checks.Tags.models)
