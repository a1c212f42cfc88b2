"""Writing one entry of an imported policy document: its own row and its limit rows, and the
vocabulary shared with export (a row's policy columns, read from the models, and the
:class:`Change` an import reports).

Every row is validated with the admin's own rules (``full_clean`` and ``row_problems``);
problems are noted on the import's state, naming the entry and field, never raised. A
parent's limit rows keep the existing row of every limit whose values are unchanged (its
counters in Redis are keyed by the row, so clients keep their buckets), edit rows in place
where its limits changed, and only then add or delete rows; a limit written twice for one
parent is refused (it would be counted twice). :func:`repeats` finds such rows, for the policy
compiler (which counts them once) and ``manage.py check`` (W106) too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models

from django_throttle.models import EndpointLimit, Tier

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


@dataclass
class Import:
    """One import's state: what changed, what was wrong, the tiers written so far."""

    prune: bool
    changes: list[Change] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    tiers: dict[str, Tier] = field(default_factory=dict)


def columns(model: type[models.Model]) -> list[models.Field[Any, Any]]:
    """The policy columns of ``model``: editable concrete fields that are not keys to a
    parent row (those are written as natural keys) nor bookkeeping."""
    return [
        f
        for f in model._meta.concrete_fields
        if f.editable and not f.is_relation and f.name not in _SKIPPED
    ]


def values(row: models.Model) -> dict[str, Any]:
    """``row``'s values by its policy columns."""
    return {f.name: f.value_from_object(row) for f in columns(type(row))}


def _unknown(where: str, unknown: set[str], known: set[str]) -> str | None:
    """The problem of an entry with fields no column has, naming those it may have."""
    if not unknown:
        return None
    return (
        f"{where}: unknown field {', '.join(map(repr, sorted(unknown)))} "
        f"(known: {', '.join(sorted(known))})"
    )


def label(row: Any) -> str:
    """A tier or an endpoint rule as changes name it."""
    return f"tier {row.slug!r}" if isinstance(row, Tier) else f"rule {row.name!r}"


def split(
    state: Import, where: str, model: type[models.Model], entry: Mapping[str, Any]
) -> tuple[dict[str, Any] | None, list[Mapping[str, Any]]]:
    """The entry's own columns and its limit entries; ``None`` after noting a problem."""
    known = {f.name for f in columns(model)} | {"limits"}
    problem = _unknown(where, set(entry) - known, known)
    limits = entry.get("limits", [])
    if problem is None and not (
        isinstance(limits, list) and all(isinstance(k, Mapping) for k in limits)
    ):
        problem = f"{where}.limits: must be a list of mappings"
    if problem is not None:
        state.problems.append(problem)
        return None, []
    return {k: v for k, v in entry.items() if k != "limits"}, limits


def _assign(row: Any, fields: Mapping[str, Any]) -> Any:
    for name, value in fields.items():
        setattr(row, name, value)
    return row


def upsert(state: Import, where: str, row: models.Model, own: Mapping[str, Any]) -> Any:
    """Set ``own`` on ``row``, validate it as the admin would, save it when it changed."""
    before = values(row) if row.pk is not None else None
    if not _valid(state, where, _assign(row, own)):
        return None
    after = values(row)
    if before is None:
        row.save()
        state.changes.append(Change("+", label(row)))
    elif before != after:
        row.save()
        diff = ", ".join(
            f"{k}: {before[k]!r} → {after[k]!r}" for k in after if before[k] != after[k]
        )
        state.changes.append(Change("~", label(row), diff))
    return row


def _valid(state: Import, where: str, row: Any) -> bool:
    problems: dict[str, list[str]] = {}
    try:
        row.full_clean()
    except ValidationError as exc:
        problems = {k: [str(m) for m in v] for k, v in exc.message_dict.items()}
    if not problems:
        problems = {name: [message] for name, message in row.row_problems().items()}
    for name, messages in sorted(problems.items()):
        column = "" if name == "__all__" else f".{name}"
        state.problems.append(f"{where}{column}: {' '.join(messages)}")
    return not problems


def sync_limits(
    state: Import, where: str, parent: Any, entries: Iterable[tuple[int, Mapping[str, Any]]]
) -> None:
    """Make ``parent``'s limit rows hold ``entries`` (their
    index in the file, their values; an endpoint limit's "tier" a :class:`Tier`), keeping rows
    whose values are unchanged, then editing rows in place, then adding and deleting."""
    model = parent.limits.model
    known = {f.name for f in columns(model)}
    allowed = known | {"tier"} if model is EndpointLimit else known
    defaults = {f.name: f.get_default() for f in columns(model)}
    new = partial(model, **{parent.limits.field.name: parent})
    wanted: list[tuple[int, dict[str, Any], Any]] = []  # (index, fields, a new row of them)
    for j, entry in entries:
        problem = _unknown(f"{where}.limits[{j}]", set(entry) - allowed, allowed)
        if problem is not None:
            state.problems.append(problem)
            continue
        fields = {**defaults, **entry}
        wanted.append((j, fields, _assign(new(), fields)))
    if _duplicates(state, where, [(j, row) for j, _, row in wanted]):
        return
    unmatched = list(parent.limits.select_related("tier").order_by("pk"))

    def take(candidate: Any, same_values: bool) -> Any:
        """The first unmatched row of ``candidate``'s tier (and values), no longer unmatched."""
        for row in unmatched:
            if row.tier_id == candidate.tier_id and (
                not same_values or values(row) == values(candidate)
            ):
                unmatched.remove(row)
                return row
        return None

    pending = [(j, fields, new) for j, fields, new in wanted if take(new, True) is None]
    # Pair each changed limit with a leftover row of the same tier to edit in place, so its
    # counters are re-timed rather than started afresh.
    plan = [(j, fields, new, take(new, False)) for j, fields, new in pending]
    for row in unmatched:
        state.changes.append(Change("-", _limit_label(parent, row), str(row)))
        row.delete()
    for j, fields, candidate, row in plan:
        before = None if row is None else str(row)
        row = candidate if row is None else _assign(row, fields)
        if not _valid(state, f"{where}.limits[{j}]", row):
            continue
        row.save()
        if before is None:
            state.changes.append(Change("+", _limit_label(parent, row), str(row)))
        else:
            state.changes.append(Change("~", _limit_label(parent, row), f"{before} → {row}"))


def _limit_label(parent: Any, row: Any) -> str:
    """A limit row of ``parent`` as a change names it: an endpoint limit with its tier."""
    tier = f" ({row.tier.slug})" if isinstance(row, EndpointLimit) else ""
    return f"{label(parent)} limit{tier}"


def _duplicates(state: Import, where: str, candidates: Sequence[tuple[int, Any]]) -> bool:
    """Note every limit entry that repeats an earlier one of the same parent (the same
    counter twice: each request would take its cost from both); whether there was one. An
    entry no limit can be built from has its own problem, noted when it is validated."""
    index = {id(row): j for j, row in candidates}
    found = list(repeats(row for _, row in candidates))
    for row, original in found:
        state.problems.append(
            f"{where}.limits[{index[id(row)]}]: the same limit as limits[{index[id(original)]}] "
            f"({row}); every request would count it twice: remove one"
        )
    return bool(found)


def repeats(rows: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """Each limit row of ``rows`` that repeats an earlier one (the same counter, see
    ``duplicate_key``: every request would take its cost from both), with the row it
    repeats. A row no limit can be built from repeats nothing."""
    first: dict[tuple[object, ...], Any] = {}
    for row in rows:
        key = row.duplicate_key()
        if key is not None and first.setdefault(key, row) is not row:
            yield row, first[key]
