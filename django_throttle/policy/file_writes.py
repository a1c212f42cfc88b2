"""Writing one entry of an imported document: its own row and its limit rows.

Every row is validated with the admin's own rules (``full_clean`` and ``row_problems``);
problems are noted on the import's state, naming the entry and field, never raised. A
parent's limit rows keep the existing row of every limit whose values are unchanged (its
counters in Redis are keyed by the row, so clients keep their buckets), edit rows in place
where its limits changed, and only then add or delete rows; a limit written twice for one
parent is refused (it would be counted twice).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models

from django_throttle.models import EndpointLimit
from django_throttle.policy.file_rows import Change, _columns, _Import, _values

__all__: list[str] = []


def _split(
    state: _Import,
    where: str,
    model: type[models.Model],
    entry: Mapping[str, Any],
    children: str,
) -> tuple[dict[str, Any] | None, list[Mapping[str, Any]]]:
    """The entry's own columns and its child entries; ``None`` after noting a problem."""
    known = {f.name for f in _columns(model)}
    unknown = sorted(set(entry) - known - {children})
    if unknown:
        state.problems.append(
            f"{where}: unknown field {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(sorted(known | {children}))})"
        )
        return None, []
    kids = entry.get(children, [])
    if not isinstance(kids, list) or not all(isinstance(k, Mapping) for k in kids):
        state.problems.append(f"{where}.{children}: must be a list of mappings")
        return None, []
    return {k: v for k, v in entry.items() if k != children}, kids


def _upsert(
    state: _Import, where: str, label: str, row: models.Model, values: Mapping[str, Any]
) -> Any:
    """Set ``values`` on ``row``, validate it as the admin would, save it when it changed."""
    before = _values(row) if row.pk is not None else None
    for name, value in values.items():
        setattr(row, name, value)
    if not _valid(state, where, row):
        return None
    after = _values(row)
    if before is None:
        row.save()
        state.changes.append(Change("+", label))
    elif before != after:
        row.save()
        diff = ", ".join(
            f"{k}: {before[k]!r} → {after[k]!r}" for k in after if before[k] != after[k]
        )
        state.changes.append(Change("~", label, diff))
    return row


def _valid(state: _Import, where: str, row: models.Model) -> bool:
    problems: dict[str, list[str]] = {}
    try:
        row.full_clean()
    except ValidationError as exc:
        problems = {k: [str(m) for m in v] for k, v in exc.message_dict.items()}
    if not problems:
        for name, message in getattr(row, "row_problems", dict)().items():
            problems.setdefault(name, []).append(message)
    for name, messages in sorted(problems.items()):
        column = "" if name == "__all__" else f".{name}"
        state.problems.append(f"{where}{column}: {' '.join(messages)}")
    return not problems


def _sync_limits(
    state: _Import,
    where: str,
    parent: str,
    model: type[models.Model],
    existing: list[Any],
    desired: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
    new: Any,
) -> None:
    """Make ``parent``'s limit rows hold ``desired`` (column values, relation values),
    keeping rows whose values are unchanged, then editing rows in place, then adding and
    deleting."""
    known = {f.name for f in _columns(model)}
    allowed = known | {"tier"} if model is EndpointLimit else known
    wanted: list[tuple[int, dict[str, Any], dict[str, Any]]] = []
    for j, (values, relations) in enumerate(desired):
        unknown = sorted(set(values) - known)
        if unknown:
            state.problems.append(
                f"{where}.limits[{j}]: unknown field {', '.join(map(repr, unknown))} "
                f"(known: {', '.join(sorted(allowed))})"
            )
            continue
        wanted.append((j, dict(values), dict(relations)))
    if _duplicates(state, where, model, wanted, new):
        return

    def same(row: Any, values: dict[str, Any], relations: dict[str, Any]) -> bool:
        candidate = new()
        for name, value in {**values, **relations}.items():
            setattr(candidate, name, value)
        return _values(row) == _values(candidate) and all(
            getattr(row, f"{k}_id") == v.pk for k, v in relations.items()
        )

    unmatched = list(existing)
    pending = []
    for j, values, relations in wanted:
        match = next((row for row in unmatched if same(row, values, relations)), None)
        if match is not None:
            unmatched.remove(match)
        else:
            pending.append((j, values, relations))
    # Pair each changed limit with a leftover row (of the same tier for endpoint limits) to
    # edit in place, so its counters are re-timed rather than started afresh.
    plan = []
    for j, values, relations in pending:
        row = next(
            (
                r
                for r in unmatched
                if all(getattr(r, f"{k}_id") == v.pk for k, v in relations.items())
            ),
            None,
        )
        if row is not None:
            unmatched.remove(row)
        plan.append((j, values, relations, row))
    for row in unmatched:
        tier = f" ({row.tier.slug})" if model is EndpointLimit else ""
        state.changes.append(Change("-", f"{parent} limit{tier}", str(row)))
        row.delete()
    defaults = {f.name: f.get_default() for f in _columns(model)}
    for j, values, relations, row in plan:
        before = None if row is None else str(row)
        if row is None:
            row = new()
        for name, value in {**defaults, **values, **relations}.items():
            setattr(row, name, value)
        if not _valid(state, f"{where}.limits[{j}]", row):
            continue
        row.save()
        tier = f" ({relations['tier'].slug})" if "tier" in relations else ""
        if before is None:
            state.changes.append(Change("+", f"{parent} limit{tier}", str(row)))
        else:
            state.changes.append(Change("~", f"{parent} limit{tier}", f"{before} → {row}"))


def _duplicates(
    state: _Import,
    where: str,
    model: type[models.Model],
    wanted: Sequence[tuple[int, dict[str, Any], dict[str, Any]]],
    new: Any,
) -> bool:
    """Note every limit entry that repeats an earlier one of the same parent (the same
    counter twice: each request would take its cost from both); whether there was one."""
    defaults = {f.name: f.get_default() for f in _columns(model)}
    first: dict[tuple[object, ...], int] = {}
    found = False
    for j, values, relations in wanted:
        candidate = new()
        for name, value in {**defaults, **values, **relations}.items():
            setattr(candidate, name, value)
        key = candidate.duplicate_key()
        if key is None:
            continue  # its own problem is reported when it is validated
        if key in first:
            state.problems.append(
                f"{where}.limits[{j}]: the same limit as limits[{first[key]}] ({candidate}); "
                "every request would count it twice: remove one"
            )
            found = True
        else:
            first[key] = j
    return found
