"""Policies as files: export the admin's tiers, endpoint rules and assignments to a document
(JSON or YAML) and import one back, so a policy can live in version control and move from
staging to production.

Rows are named by natural keys (tier slug, rule name, username, group name), never by primary
key. A limit has no name of its own: it belongs to its tier or rule, and an import keeps the
existing row of every limit whose values are unchanged (its counters in Redis are keyed by the
row, so clients keep their buckets), edits rows in place where a parent's limits changed, and
only then adds or deletes rows. Fields are read from the models, so a column added by a later
migration is exported and imported without changes here.

An import is one transaction: every entry is validated with the admin's own rules
(``full_clean`` and ``row_problems``), and a single problem refuses the whole file with a
message naming the entry and field; so does a limit written twice for one parent (it would
be counted twice). ``dry_run`` runs the same code and rolls back. Reading a file's text, with
its bounds, is :mod:`django_throttle.policy.text`'s job.

The document's parts live in their own modules: its vocabulary in
:mod:`~django_throttle.policy.file_rows`, export in :mod:`~django_throttle.policy.file_export`,
import in :mod:`~django_throttle.policy.file_import` and the rows one entry writes in
:mod:`~django_throttle.policy.file_writes`. This module promises the public names below.
"""

from __future__ import annotations

from django_throttle.policy.file_export import export_policy
from django_throttle.policy.file_import import import_policy
from django_throttle.policy.file_rows import Change
from django_throttle.policy.text import PolicyFileError

__all__ = [
    "Change",
    "PolicyFileError",
    "export_policy",
    "import_policy",
]
