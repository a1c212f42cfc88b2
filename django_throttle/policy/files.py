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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import models, transaction

from django_throttle.models import EndpointLimit, EndpointRule, Tier, TierAssignment, TierLimit
from django_throttle.policy.text import FORMAT_VERSION, PolicyFileError

__all__ = [
    "Change",
    "PolicyFileError",
    "export_policy",
    "import_policy",
]

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


# --- export ---------------------------------------------------------------------------------


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


# --- import ---------------------------------------------------------------------------------


@dataclass
class _Import:
    """One import's state: what changed, what was wrong."""

    prune: bool
    changes: list[Change] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    tiers: dict[str, Tier] = field(default_factory=dict)


def import_policy(document: Any, *, dry_run: bool = False, prune: bool = False) -> list[Change]:
    """Make the database hold ``document``'s policy; return what changed.

    Tiers and rules are matched by slug and name; those the document does not name are kept,
    unless ``prune`` (then deleted, as are assignments when the document has an
    ``assignments`` section). Raises :class:`PolicyFileError` with every problem found, having
    written nothing; with ``dry_run`` the changes are computed and rolled back.
    """
    _check_shape(document)
    state = _Import(prune=prune)
    with transaction.atomic():
        _import_tiers(state, document.get("tiers", []))
        _import_rules(state, document.get("rules", []))
        if "assignments" in document:
            _import_assignments(state, document["assignments"])
        if state.problems:
            transaction.set_rollback(True)
            raise PolicyFileError(state.problems)
        if dry_run:
            transaction.set_rollback(True)
    return state.changes


def _check_shape(document: Any) -> None:
    if not isinstance(document, Mapping):
        raise PolicyFileError(["the document must be a mapping with 'version' and sections"])
    problems = []
    if document.get("version") != FORMAT_VERSION:
        problems.append(f"version: must be {FORMAT_VERSION}, not {document.get('version')!r}")
    unknown = sorted(set(document) - {"version", *SECTIONS})
    if unknown:
        problems.append(
            f"unknown section {', '.join(map(repr, unknown))}: use {', '.join(SECTIONS)}"
        )
    for section in SECTIONS:
        entries = document.get(section, [])
        if not isinstance(entries, list):
            problems.append(f"{section}: must be a list, not {type(entries).__name__}")
            continue
        for i, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                problems.append(f"{section}[{i}]: must be a mapping, not {type(entry).__name__}")
    if problems:
        raise PolicyFileError(problems)


def _import_tiers(state: _Import, entries: list[Mapping[str, Any]]) -> None:
    named = {str(entry.get("slug")): entry for entry in entries}
    # The file decides which tier is a default: clear the flag elsewhere first, so handing
    # the default from one tier to another is not refused as a second default.
    for flag in ("is_default_anonymous", "is_default_authenticated"):
        if any(entry.get(flag) for entry in entries):
            for other in Tier.objects.filter(**{flag: True}).exclude(slug__in=named):
                setattr(other, flag, False)
                other.save(update_fields=[flag])
                state.changes.append(Change("~", f"tier {other.slug!r}", f"{flag}: True → False"))
            for tier in Tier.objects.filter(**{flag: True}, slug__in=named):
                if not named[tier.slug].get(flag):
                    setattr(tier, flag, False)
                    tier.save(update_fields=[flag])
    for i, entry in enumerate(entries):
        where = f"tiers[{i}] {entry.get('slug')!r}"
        values, limits = _split(state, where, Tier, entry, "limits")
        if values is None:
            continue
        existing = Tier.objects.filter(slug=values.get("slug")).first()
        tier = _upsert(state, where, f"tier {values.get('slug')!r}", existing or Tier(), values)
        if tier is None:
            continue
        state.tiers[tier.slug] = tier
        _sync_limits(
            state,
            where,
            f"tier {tier.slug!r}",
            TierLimit,
            list(tier.limits.all().order_by("pk")),
            [(limit, {}) for limit in limits],
            partial(TierLimit, tier=tier),
        )
    if state.prune:
        for tier in Tier.objects.exclude(slug__in=named):
            state.changes.append(Change("-", f"tier {tier.slug!r}"))
            tier.delete()


def _import_rules(state: _Import, entries: list[Mapping[str, Any]]) -> None:
    names = {str(entry.get("name")) for entry in entries}
    for i, entry in enumerate(entries):
        where = f"rules[{i}] {entry.get('name')!r}"
        values, limits = _split(state, where, EndpointRule, entry, "limits")
        if values is None:
            continue
        desired = []
        for j, limit in enumerate(limits):
            tier = _tier(state, limit.get("tier"))
            if tier is None:
                state.problems.append(
                    f"{where}.limits[{j}].tier: no tier {limit.get('tier')!r} in the file or "
                    "the database"
                )
                continue
            desired.append(({k: v for k, v in limit.items() if k != "tier"}, {"tier": tier}))
        existing = EndpointRule.objects.filter(name=values.get("name")).first()
        rule = _upsert(
            state, where, f"rule {values.get('name')!r}", existing or EndpointRule(), values
        )
        if rule is None:
            continue
        _sync_limits(
            state,
            where,
            f"rule {rule.name!r}",
            EndpointLimit,
            list(rule.limits.select_related("tier").order_by("pk")),
            desired,
            partial(EndpointLimit, rule=rule),
        )
    if state.prune:
        for rule in EndpointRule.objects.exclude(name__in=names):
            state.changes.append(Change("-", f"rule {rule.name!r}"))
            rule.delete()


def _import_assignments(state: _Import, entries: list[Mapping[str, Any]]) -> None:
    user_model = get_user_model()
    wanted: set[tuple[str, Any]] = set()
    for i, entry in enumerate(entries):
        where = f"assignments[{i}]"
        unknown = sorted(set(entry) - {"tier", "user", "group", "note"})
        if unknown:
            state.problems.append(f"{where}: unknown field {', '.join(map(repr, unknown))}")
            continue
        if ("user" in entry) == ("group" in entry):
            state.problems.append(f"{where}: give exactly one of 'user' and 'group'")
            continue
        tier = _tier(state, entry.get("tier"))
        if tier is None:
            state.problems.append(
                f"{where}.tier: no tier {entry.get('tier')!r} in the file or the database"
            )
            continue
        who: Any
        if "user" in entry:
            who = user_model._default_manager.filter(
                **{user_model.USERNAME_FIELD: entry["user"]}
            ).first()
            kind, name = "user", entry["user"]
        else:
            who = Group.objects.filter(name=entry["group"]).first()
            kind, name = "group", entry["group"]
        if who is None:
            state.problems.append(f"{where}.{kind}: no {kind} {name!r} in the database")
            continue
        wanted.add((kind, who.pk))
        row = TierAssignment.objects.filter(**{kind: who}).first()
        note = str(entry.get("note", ""))
        label = f"assignment of {kind} {name!r}"
        if row is None:
            TierAssignment.objects.create(tier=tier, note=note, **{kind: who})
            state.changes.append(Change("+", label, f"tier {tier.slug!r}"))
        elif row.tier_id != tier.pk or row.note != note:
            detail = f"tier {row.tier.slug!r} → {tier.slug!r}" if row.tier_id != tier.pk else ""
            row.tier, row.note = tier, note
            row.save()
            state.changes.append(Change("~", label, detail or "note"))
    if state.prune:
        for row in TierAssignment.objects.select_related("user", "group"):
            kind = "user" if row.user_id is not None else "group"
            if (kind, getattr(row, f"{kind}_id")) not in wanted:
                state.changes.append(
                    Change("-", f"assignment of {kind} {str(getattr(row, kind))!r}")
                )
                row.delete()


def _tier(state: _Import, slug: Any) -> Tier | None:
    if not isinstance(slug, str):
        return None
    return state.tiers.get(slug) or Tier.objects.filter(slug=slug).first()


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
