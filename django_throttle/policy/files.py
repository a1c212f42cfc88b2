"""Policies as files: export the admin's tiers, endpoint rules and assignments to a document
(JSON or YAML) and import one back, so a policy can live in version control and move from
staging to production.

Rows are named by natural keys (tier slug, rule name, username, group name), never by primary
key; limits are written under their tier or rule. Fields are read from the models, so a column
added by a later migration is exported and imported without changes here.

An import is one transaction: the document's shape is checked first, then its sections are
applied in order (tiers, rules, assignments), matched by natural keys; tiers and rules the
document does not name are kept unless pruning. Every entry is validated with the admin's own
rules, and a single problem refuses the whole file, having written nothing, with a message
naming the entry and field. ``dry_run`` runs the same code and rolls back. Writing one entry's
row and its limit rows is :mod:`~django_throttle.policy.file_writes`'s job; reading a file's
text, with its bounds, is :mod:`django_throttle.policy.text`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import models, transaction

from django_throttle.models import EndpointLimit, EndpointRule, Tier, TierAssignment
from django_throttle.policy import file_writes as writes
from django_throttle.policy.file_writes import Change, Import
from django_throttle.policy.text import FORMAT_VERSION, PolicyFileError

#: Top-level sections, in the order they are written and applied.
SECTIONS = ("tiers", "rules", "assignments")
#: The sections of rows with limits: (model, natural key).
_PARENTS: dict[str, tuple[type[models.Model], str]] = {
    "tiers": (Tier, "slug"),
    "rules": (EndpointRule, "name"),
}


def export_policy(*, assignments: bool = True) -> dict[str, Any]:
    """The policy in the database as a document (plain dicts and lists, JSON-ready). Reads
    only."""
    document: dict[str, Any] = {"version": FORMAT_VERSION}
    for section, (model, key) in _PARENTS.items():
        parents: Any = model._default_manager.order_by(key).prefetch_related("limits__tier")
        document[section] = [
            {**writes.values(parent), "limits": [_limit_entry(row) for row in _limits(parent)]}
            for parent in parents
        ]
    if assignments:
        document["assignments"] = _export_assignments()
    return document


def _limits(parent: Any) -> list[Any]:
    """A tier's or rule's limit rows (prefetched), by tier and in the order they were added."""
    return sorted(parent.limits.all(), key=lambda row: (row.tier.slug, row.pk))


def _limit_entry(limit: models.Model) -> dict[str, Any]:
    """A limit as written under its parent: an endpoint limit names its tier first."""
    tier = {"tier": limit.tier.slug} if isinstance(limit, EndpointLimit) else {}
    return {**tier, **writes.values(limit)}


def _export_assignments() -> list[dict[str, str]]:
    username = get_user_model().USERNAME_FIELD
    out = []
    for row in TierAssignment.objects.select_related("tier", "user", "group"):
        entry = {"tier": row.tier.slug}
        if row.user_id is not None:
            entry["user"] = getattr(row.user, username)
        else:
            entry["group"] = row.group.name if row.group is not None else ""
        if row.note:
            entry["note"] = row.note
        out.append(entry)
    return sorted(out, key=lambda e: (e.get("user", ""), e.get("group", "")))


def import_policy(document: Any, *, dry_run: bool = False, prune: bool = False) -> list[Change]:
    """Make the database hold ``document``'s policy; return what changed.

    Tiers and rules are matched by slug and name; those the document does not name are kept,
    unless ``prune`` (then deleted, as are assignments when the document has an
    ``assignments`` section). Raises :class:`PolicyFileError` with every problem found, having
    written nothing; with ``dry_run`` the changes are computed and rolled back.
    """
    _check_shape(document)
    state = Import(prune=prune)
    with transaction.atomic():
        _hand_over_defaults(state, document.get("tiers", []))
        for section in _PARENTS:
            _import_parents(state, section, document.get(section, []))
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


def _hand_over_defaults(state: Import, entries: list[Mapping[str, Any]]) -> None:
    """The file decides which tier is a default: clear the flag elsewhere first, so handing
    the default from one tier to another is not refused as a second default."""
    named = {str(entry.get("slug")): entry for entry in entries}
    for flag in ("is_default_anonymous", "is_default_authenticated"):
        if not any(entry.get(flag) for entry in entries):
            continue
        for tier in Tier.objects.filter(**{flag: True}):
            if tier.slug in named and named[tier.slug].get(flag):
                continue
            setattr(tier, flag, False)
            tier.save(update_fields=[flag])
            if tier.slug not in named:
                state.changes.append(Change("~", f"tier {tier.slug!r}", f"{flag}: True → False"))


def _import_parents(state: Import, section: str, entries: list[Mapping[str, Any]]) -> None:
    """Tiers or endpoint rules, each with its limits; a rule's limits name their tier."""
    model, key = _PARENTS[section]
    for i, entry in enumerate(entries):
        where = f"{section}[{i}] {entry.get(key)!r}"
        own, limits = writes.split(state, where, model, entry)
        if own is None:
            continue
        desired = _with_tiers(state, where, limits) if model is EndpointRule else enumerate(limits)
        existing = model._default_manager.filter(**{key: own.get(key)}).first()
        row = writes.upsert(state, where, existing or model(), own)
        if row is None:
            continue
        if isinstance(row, Tier):
            state.tiers[row.slug] = row
        writes.sync_limits(state, where, row, desired)
    if state.prune:
        named = {str(entry.get(key)) for entry in entries}
        for row in model._default_manager.exclude(**{f"{key}__in": named}):
            state.changes.append(Change("-", writes.label(row)))
            row.delete()


def _with_tiers(
    state: Import, where: str, limits: list[Mapping[str, Any]]
) -> list[tuple[int, Mapping[str, Any]]]:
    """An endpoint rule's limits (with their index) whose tier exists, naming the tier."""
    desired: list[tuple[int, Mapping[str, Any]]] = []
    for j, limit in enumerate(limits):
        tier = _tier(state, f"{where}.limits[{j}].tier", limit.get("tier"))
        if tier is not None:
            desired.append((j, {**limit, "tier": tier}))
    return desired


def _import_assignments(state: Import, entries: list[Mapping[str, Any]]) -> None:
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
        tier = _tier(state, f"{where}.tier", entry.get("tier"))
        if tier is None:
            continue
        kind = "user" if "user" in entry else "group"
        name = entry[kind]
        who: Any = (
            user_model._default_manager.filter(**{user_model.USERNAME_FIELD: name}).first()
            if kind == "user"
            else Group.objects.filter(name=name).first()
        )
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


def _tier(state: Import, where: str, slug: Any) -> Tier | None:
    """The tier ``slug`` names, in the file or the database; else a problem at ``where``."""
    found = None
    if isinstance(slug, str):
        found = state.tiers.get(slug) or Tier.objects.filter(slug=slug).first()
    if found is None:
        state.problems.append(f"{where}: no tier {slug!r} in the file or the database")
    return found
