"""The admin pages where operators edit tiers, endpoint rules, assignments and API keys, and read
usage.

Bad input becomes a form error on the field to change (see the forms in
:mod:`django_throttle.admin.base`), never a 500; list pages load related rows up front so they
cost a fixed number of queries, and flag rows written around the admin that the policy skips (a
"problems" column).

Django's admin autodiscovery imports this package; importing it registers every ModelAdmin of the
app:

- :mod:`.policy_rows`: tiers and endpoint rules with their limits, tier assignments,
  exemptions (rows naming a user or a group) and API keys (shown once, revoked, their buckets
  reset).
- :mod:`.usage_counts`: the read-only usage list, with the dashboard and inspector
  (:mod:`.views`) under it.

What they share (the base class, the columns in a word, the "problems" column, the limit
inline, the forms) is in :mod:`.base`.
"""

from __future__ import annotations

# Imported for what importing does: each module registers its ModelAdmins.
from django_throttle.admin import policy_rows, usage_counts  # noqa: F401
