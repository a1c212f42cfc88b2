"""Import: make the database hold a document's policy, as one transaction.

The document's shape is checked first, then its sections are applied in order (tiers, rules,
assignments), matched by natural keys; tiers and rules the document does not name are kept
unless pruning. A single problem refuses the whole file, having written nothing;
``dry_run`` runs the same code and rolls back. Writing one entry's row and its limit rows is
:mod:`~django_throttle.policy.file_writes`'s job.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from django_throttle.models import EndpointLimit, EndpointRule, Tier, TierAssignment, TierLimit
from django_throttle.policy.file_rows import SECTIONS, Change, _Import
from django_throttle.policy.file_writes import _split, _sync_limits, _upsert
from django_throttle.policy.text import FORMAT_VERSION, PolicyFileError

__all__ = ["import_policy"]


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
