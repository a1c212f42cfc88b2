"""What a policy document's entries are made of, shared by export and import: its sections,
the policy columns of a row (read from the models, so a column added by a later migration
needs no change here), a row's values by those columns, one import's state and the
:class:`Change` it reports.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import models

from django_throttle.models import Tier

__all__ = ["Change"]

#: Top-level sections, in the order they are written and applied.
SECTIONS = ("tiers", "rules", "assignments")
#: Columns that are bookkeeping, not policy.
_SKIPPED = frozenset({"id", "created", "updated"})


@dataclass(frozen=True)
class Change:
    """One difference an import makes: ``+`` added, ``-`` deleted, ``~`` changed."""

    action: str
    what: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.action} {self.what}" + (f": {self.detail}" if self.detail else "")


def _ordered(rows: Iterable[models.Model]) -> list[models.Model]:
    return sorted(rows, key=lambda row: row.pk)


def _columns(model: type[models.Model]) -> list[models.Field[Any, Any]]:
    """The policy columns of ``model``: editable concrete fields that are not keys to a
    parent row (those are written as natural keys) nor bookkeeping."""
    return [
        f
        for f in model._meta.concrete_fields
        if f.editable and not f.is_relation and f.name not in _SKIPPED
    ]


def _values(row: models.Model) -> dict[str, Any]:
    return {f.name: f.value_from_object(row) for f in _columns(type(row))}


@dataclass
class _Import:
    """One import's state: what changed, what was wrong."""

    prune: bool
    changes: list[Change] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    tiers: dict[str, Tier] = field(default_factory=dict)
