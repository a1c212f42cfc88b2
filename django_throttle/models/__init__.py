"""Database rows an operator edits in the admin: tiers, their limits, endpoint rules, who is in
which tier, API keys, and the per-minute usage counts the flusher writes.

The admin refuses every value :mod:`~django_throttle.rates` rejects, and the database refuses a
burst or cost outside ``[1, MAX_COUNT]``. Rows written some other way (fixtures, SQL,
``QuerySet.update``) can still hold a value no limit can be built from: each policy model's
``row_problems()`` names it, so the policy compiler skips that row, and ``manage.py check`` and
the admin lists flag it.
"""

from __future__ import annotations

from django_throttle.models.api_keys import ApiKey

# Internal: policy changes not published to the other processes yet.
from django_throttle.models.changes import UnpublishedChange as UnpublishedChange
from django_throttle.models.exemptions import Exemption

# The first migration names the validator by this path.
from django_throttle.models.fields import validate_rate as validate_rate
from django_throttle.models.protection import Protection
from django_throttle.models.rules import EndpointLimit, EndpointRule
from django_throttle.models.tiers import Tier, TierAssignment, TierLimit
from django_throttle.models.usage import UsageCount

__all__ = [
    "ApiKey",
    "EndpointLimit",
    "EndpointRule",
    "Exemption",
    "Protection",
    "Tier",
    "TierAssignment",
    "TierLimit",
    "UsageCount",
]
