"""Policies as files: export the admin's tiers, endpoint rules, assignments, exemptions and
service protection (the load shedder's one row, a ``protection`` mapping) to a document
(JSON or YAML) and import one back, so a policy can live in version control and move from
staging to production.

Rows are named by natural keys (tier slug, rule name, username, group name), never by primary
key; limits are written under their tier or rule. Fields are read from the models, so a column
added by a later migration is exported and imported without changes here.

An import is one transaction: the document's shape is checked first, then its sections are
applied in order (tiers, rules, assignments, exemptions), matched by natural keys; tiers and
rules the document does not name are kept unless pruning. Every entry is validated with the
admin's own rules, and a single problem refuses the whole file, having written nothing, with a
message naming the entry and field. Every problem is listed, in the order the file writes what it
names: a tier whose own fields are wrong still has its limits checked, and an unknown field
stops nothing else. ``dry_run`` runs the same code and rolls back.

Reading a file is bounded: a file above :data:`MAX_BYTES` is refused before it is read (by
``throttle_policy``), and a file nested deeper than :data:`MAX_DEPTH`, or holding more
than :data:`MAX_VALUES` values, is refused before its values are built, in time proportional
to its length (YAML aliases count as what they expand to), so an operator's file never ends in
a ``RecursionError`` nor keeps an import's transaction busy.

Writing one entry keeps the existing limit row of every limit whose values are unchanged (its
counters in Redis are keyed by the row, so clients keep their buckets), edits rows in place
where its limits changed, and only then adds or deletes rows; a limit written twice for one
parent is refused (it would be counted twice). :func:`repeats` finds such rows, for the policy
compiler (which counts them once) and ``manage.py check`` (W106) too. Problems are noted on the
import's state, naming the entry and field, never raised.

:func:`from_drf` writes a document from a ``REST_FRAMEWORK`` setting's throttles (``manage.py
throttle_policy from-drf``), so a project moving from DRF's throttles starts with the limits it
had: it reads the setting's values only (no rows, no DRF import), and the document goes through
:func:`import_policy` like any other.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import models, transaction

from django_throttle.identity import region_codes
from django_throttle.models import (
    EndpointLimit,
    EndpointRule,
    Exemption,
    Protection,
    Tier,
    TierAssignment,
)
from django_throttle.models.exemptions import parse_network
from django_throttle.models.fields import HTTP_METHODS
from django_throttle.models.limits import LimitFields
from django_throttle.rates import MAX_LOG_COUNT, Algorithm, canonical_rate, plain_digits

#: The document's ``version``; an import refuses any other.
FORMAT_VERSION = 1


class PolicyFileError(Exception):
    """The document cannot be imported; ``problems`` lists every reason, each naming the entry
    and field (``tiers[1] 'pro'.limits[0].rate: ...``). Nothing was written."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


#: Most bytes a policy file may weigh: a hundred times a big real policy, so a file above it
#: is no policy (a log, a dump, a runaway string) and is refused before it is read whole.
#: How it was chosen: docs/explanation/benchmarks.md, "Policy file sizes".
MAX_BYTES = 16 * 1024 * 1024
#: Deepest nesting a policy file may have (a document needs 5: sections, entries, limits).
MAX_DEPTH = 20
#: Most values (mappings, lists and scalars, each alias counted as what it expands to) a
#: policy file may hold: hundreds of tiers and rules fit, and an import stays quick.
MAX_VALUES = 200_000
# A JSON string (skipped over: brackets inside it do not nest), one bracket, or another
# scalar (a number, true, false, null): every token but a closing bracket is one value.
_JSON_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]|[^\s,:\[\]{}"]+')
_NESTING = {"[": 1, "{": 1, "]": -1, "}": -1}


_TOO_DEEP = f"the file nests deeper than {MAX_DEPTH} levels; a policy file needs 5 at most"
_TOO_BIG = (
    f"the file holds more than {MAX_VALUES:,} values (aliases counted as what they expand "
    "to); split the policy or write it without repeated aliases"
)


def too_big(document: Any, text: str) -> str | None:
    """Why an import would refuse ``text``, the dump of ``document``, by its size (more than
    :data:`MAX_BYTES` or :data:`MAX_VALUES` values), or ``None``: an export checks it, so it
    never writes a file the import refuses."""
    size = len(text.encode("utf-8"))
    if size > MAX_BYTES:
        return f"it weighs {size:,} bytes, more than the {MAX_BYTES:,} an import takes"
    count, stack = 0, [document]
    while stack:
        value = stack.pop()
        count += 1
        if isinstance(value, dict):
            count += len(value)  # the keys
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    if count > MAX_VALUES:
        return f"it holds {count:,} values, more than the {MAX_VALUES:,} an import takes"
    return None


def dump(document: Mapping[str, Any], fmt: str) -> str:
    """The document as ``json`` or ``yaml`` text."""
    if fmt == "yaml":
        yaml = _yaml()

        class Dumper(yaml.SafeDumper):  # type: ignore[misc,name-defined]
            """Writes a value met twice (one limit in two tiers) out in full each time: an
            ``&id001`` anchor and ``*id001`` alias would tie the copies for whoever edits it.
            Text holding U+0085 (NEXT LINE) is written double-quoted, where it is escaped:
            PyYAML writes it raw in single quotes, and reads it back as a line break folded
            into a space, so a description changed on its way through a file."""

            def ignore_aliases(self, data: Any) -> bool:
                return True

            def represent_str(self, data: str) -> Any:
                if "\x85" in data:
                    return self.represent_scalar("tag:yaml.org,2002:str", data, style='"')
                return super().represent_str(data)

        Dumper.add_representer(str, Dumper.represent_str)
        text = yaml.dump(dict(document), Dumper=Dumper, sort_keys=False, allow_unicode=True)
        return str(text)
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def decode(data: bytes) -> str:
    """A policy file's bytes as text: UTF-8, with or without a byte order mark (what some
    Windows editors write), or UTF-16 with its byte order mark (what Windows PowerShell's
    ``>`` writes). Anything else is a :class:`PolicyFileError` saying what was found, never
    a ``UnicodeDecodeError``: an operator's file must get a one-line answer."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        encoding = "utf-16"  # the BOM says which byte order
    else:
        encoding = "utf-8-sig"  # plain UTF-8 too: the BOM is optional
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        name = "UTF-16" if encoding == "utf-16" else "UTF-8"
        raise PolicyFileError(
            [
                f"not {name} text (byte {exc.object[exc.start : exc.start + 1]!r} at offset "
                f"{exc.start}); save it as UTF-8"
            ]
        ) from exc


def load(text: str, fmt: str) -> Any:
    """Parse ``json`` or ``yaml`` text; a syntax error is a :class:`PolicyFileError`.

    A file nested deeper than :data:`MAX_DEPTH` or holding more than :data:`MAX_VALUES` values
    is refused before its values are built, in time proportional to its length: an operator's
    file must not end in a ``RecursionError``, nor keep an import busy expanding YAML aliases
    (a few kilobytes of them can stand for millions of entries)."""
    if fmt == "yaml":
        return _load_yaml(text)
    depth = values = 0
    for token in _JSON_TOKENS.finditer(text):
        step = _NESTING.get(token.group(), 0)  # a scalar changes nothing
        depth, values = depth + step, values + (step >= 0)
        if depth > MAX_DEPTH:
            raise PolicyFileError([_TOO_DEEP])
        if values > MAX_VALUES:
            raise PolicyFileError([_TOO_BIG])
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except ValueError as exc:  # a syntax error, or a number too long to read
        raise PolicyFileError([f"not valid JSON: {_unreadable(exc)}"]) from exc


def _unreadable(exc: ValueError) -> str:
    """Why a value could not be read, for an operator: Python's refusal of a number of
    thousands of digits ends with advice to call ``sys.set_int_max_str_digits()``, which a
    policy file's author cannot follow (no limit is that long)."""
    return str(exc).partition("; use sys.set_int_max_str_digits")[0]


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused when it writes a key twice: ``json`` keeps the last value, so
    ``{"slug": "free", "slug": "pro"}`` would silently write tier ``pro``."""
    document = dict(pairs)
    if len(document) < len(pairs):
        twice = next(key for i, (key, _) in enumerate(pairs) if key in dict(pairs[:i]))
        raise PolicyFileError([f"the key {twice!r} is written twice in one object: keep one"])
    return document


def _load_yaml(text: str) -> Any:
    """Compose the YAML node graph (bounded depth: PyYAML's composer recurses once per level),
    measure what its aliases expand to, and only then build the values. Built values share
    what an alias names, so building is cheap; it is whatever walks them afterwards
    (validation, a field's text) that would pay the whole expansion."""
    yaml = _yaml()

    class Loader(yaml.SafeLoader):  # type: ignore[misc,name-defined]
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise PolicyFileError([_TOO_DEEP])
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    loader = Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _measure(node, {})[1] > MAX_DEPTH:  # the document's depth, aliases expanded
            raise PolicyFileError([_TOO_DEEP])
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise PolicyFileError([f"not valid YAML: {' '.join(str(exc).split())}"]) from exc
    except ValueError as exc:
        # A value YAML resolves by its look but cannot build: a date that is not one
        # (2024-02-30), a number of thousands of digits. PyYAML raises no YAMLError there.
        raise PolicyFileError(
            [f"not valid YAML: {_unreadable(exc)} (quote the value to keep it as text)"]
        ) from exc
    finally:
        loader.dispose()


def _measure(node: Any, known: dict[int, tuple[int, int] | None]) -> tuple[int, int]:
    """``node``'s size and height as built (an alias counts as the whole node it names);
    :class:`PolicyFileError` when the size is over its bound or an alias names a node that
    contains it. Each node is measured once, so an alias costs a lookup; the recursion is as
    deep as the composed nodes, which the loader bounds."""
    key = id(node)
    if key in known:
        measured = known[key]
        if measured is None:
            raise PolicyFileError(["an alias names a value that contains it (a loop)"])
        return measured
    known[key] = None
    # PyYAML's node kinds: a scalar holds text, a sequence its nodes, a mapping its pairs.
    children = node.value if node.id == "sequence" else []
    if node.id == "mapping":
        children = [part for pair in node.value for part in pair]
        _check_keys(node)
    size, height = 1, 1
    for child in children:
        child_size, child_height = _measure(child, known)
        size += child_size
        height = max(height, child_height + 1)
        if size > MAX_VALUES:
            raise PolicyFileError([_TOO_BIG])
    known[key] = (size, height)
    return size, height


def _check_keys(node: Any) -> None:
    """Refuse a YAML mapping writing one key twice (PyYAML keeps the last value, so a tier
    written ``slug: free`` then ``slug: pro`` would silently become ``pro``), naming its
    line. Merge keys (``<<``) are YAML's own way to repeat, and left alone."""
    seen: set[tuple[str, str]] = set()
    for key, _ in node.value:
        if key.id != "scalar" or key.tag == "tag:yaml.org,2002:merge":
            continue
        if (key.tag, key.value) in seen:
            raise PolicyFileError(
                [
                    f"line {key.start_mark.line + 1}: the key {key.value!r} is written twice "
                    "in one mapping: keep one"
                ]
            )
        seen.add((key.tag, key.value))


def _yaml() -> Any:
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise PolicyFileError(
            ["YAML needs PyYAML: pip install 'django-throttle-policies[yaml]', or use JSON"]
        ) from exc
    return yaml


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
    """One import's state: what changed, what was wrong, the tiers written so far and the
    slugs of those the file writes that could not be (their problems are listed)."""

    prune: bool
    changes: list[Change] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    tiers: dict[str, Tier] = field(default_factory=dict)
    refused_tiers: set[str] = field(default_factory=set)


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


def stored(row: models.Model) -> dict[str, Any]:
    """``row``'s values by its policy columns, each value that has several spellings the
    limiter reads alike written as the admin stores it: a rate (``20/min`` is ``20/m``), a
    limit's regions (``fr, de`` is ``DE,FR``), a rule's methods (``post, get`` is
    ``GET,POST``). A row saved another way (through the ORM, a data migration, ``loaddata``)
    may hold any spelling: an export writes this form, so export → import → export gives the
    same file, and an import compares it, so a row the file matches is kept as it is (a
    limit with its counters). A value the admin would refuse is written as it is."""
    found = values(row)
    if isinstance(found.get("rate"), str):
        found["rate"] = canonical_rate(found["rate"])
    if isinstance(row, LimitFields) and isinstance(found.get("regions"), str):
        codes, bad = region_codes(found["regions"])
        if not bad:
            found["regions"] = ",".join(codes)
    methods = row.method_set if isinstance(row, EndpointRule) else None
    if methods is not None and methods.issubset(HTTP_METHODS):
        found["methods"] = ",".join(m for m in HTTP_METHODS if m in methods)
    return found


def _normal_network(text: Any) -> str | None:
    """The network ``text`` names in the normal form the admin stores (``192.0.2.1`` is
    ``192.0.2.1/32``, ``::ffff:198.51.100.0/120`` is ``198.51.100.0/24``), or ``None``."""
    try:
        return str(parse_network(text))
    except (ValueError, TypeError, AttributeError):  # the row's validation names the problem
        return None


def _unknown(where: str, unknown: set[str], known: set[str]) -> str | None:
    """The problem of an entry with fields no column has, naming those it may have."""
    if not unknown:
        return None
    return f"{where}: unknown field {_names(unknown)} (known: {', '.join(sorted(known))})"


def _names(keys: Iterable[Any]) -> str:
    """Keys a file wrote, as a problem lists them: each as written (``'colour'``, ``1``),
    sorted by that text, so a YAML mapping with a number and a text key (``1:`` and
    ``'1':``) is listed too, not a ``TypeError`` comparing them."""
    return ", ".join(sorted(map(repr, keys)))


def label(row: Any) -> str:
    """A tier or an endpoint rule as changes name it."""
    if isinstance(row, Protection):
        return "service protection"
    return f"tier {row.slug!r}" if isinstance(row, Tier) else f"rule {row.name!r}"


def split(
    state: Import, where: str, model: type[models.Model], entry: Mapping[str, Any]
) -> tuple[dict[str, Any], list[Mapping[str, Any]] | None]:
    """The entry's own columns (those it names that exist) and its limit entries (``None``
    when they are not a list of mappings), noting an unknown field and malformed limits."""
    known = {f.name for f in columns(model)} | {"limits"}
    problem = _unknown(where, set(entry) - known, known)
    if problem is not None:
        state.problems.append(problem)
    limits = entry.get("limits", [])
    if not (isinstance(limits, list) and all(isinstance(k, Mapping) for k in limits)):
        state.problems.append(f"{where}.limits: must be a list of mappings")
        limits = None
    return {k: v for k, v in entry.items() if k in known and k != "limits"}, limits


def _assign(row: Any, fields: Mapping[str, Any]) -> Any:
    for name, value in fields.items():
        setattr(row, name, value)
    return row


def upsert(state: Import, where: str, row: models.Model, own: Mapping[str, Any]) -> Any:
    """Set ``own`` on ``row``, validate it as the admin would, save it when it changed."""
    before = stored(row) if row.pk is not None else None
    if not _valid(state, where, _assign(row, own)):
        return None
    after = stored(row)
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


def _shape_problems(row: Any) -> dict[str, list[str]]:
    """The columns of ``row`` holding what no value of theirs can be, by name. Django's
    validation skips an empty value (``None``, ``""``, a list or mapping) of a blank column,
    and then the save fails (a NOT NULL constraint, ``int('')``), and any other list or
    mapping fails a check or a comparison with a TypeError; so these are named first."""
    problems: dict[str, list[str]] = {}
    for f in columns(type(row)):
        value = getattr(row, f.attname, None)
        if isinstance(value, list | Mapping):
            problems[f.name] = [f"must be one value, not a {type(value).__name__}"]
        elif value is None and not f.null:
            empty = ' (write "" for none)' if f.empty_strings_allowed else ""
            problems[f.name] = [f"must not be null{empty}"]
        elif value == "" and not f.empty_strings_allowed:
            problems[f.name] = ["must not be empty" + (" (write null for none)" if f.null else "")]
        elif isinstance(value, str) and value and not value.strip() and not f.blank:
            # The admin's form strips a value before checking it is there: only spaces is
            # none, refused there as "This field is required." (a tier or rule named " ").
            problems[f.name] = ["must not be empty (it is only whitespace)"]
        elif value is not None and (problem := _type_problem(f, value)) is not None:
            problems[f.name] = [problem]
    return problems


def _type_problem(f: models.Field[Any, Any], value: Any) -> str | None:
    """Why ``value`` is not of ``f``'s kind as a file writes it (``None`` when it is).

    Django's ``to_python`` converts what it can, which a file's value must not rely on: it
    truncates ``1.5`` to a burst of 1, reads ``true`` as 1, turns YAML's unquoted ``NO`` (the
    boolean ``false``, meant as Norway's region code) into the region ``'FALSE'`` and a YAML
    date into text, reads ``1`` or ``"no"`` as a flag, and fails with a traceback on ``1e400``
    (infinity) for a whole number."""
    if isinstance(f, models.IntegerField | models.FloatField):
        if isinstance(value, bool):
            return f"must be a number, not {json.dumps(value)}"
        if isinstance(value, str) and not plain_digits(value):  # int() reads other digits
            shown = json.dumps(value, ensure_ascii=False)
            return f"must be a number written in the digits 0-9, not {shown}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number, not {value!r}"
        if isinstance(f, models.IntegerField) and isinstance(value, float) and value % 1:
            return f"must be a whole number, not {value!r}"
    elif isinstance(f, models.CharField | models.TextField):
        # A number is read as its text, as the column saves it (region 44, slug 2024).
        if isinstance(value, bool):  # YAML's unquoted yes, no, on, off (NO: Norway)
            return f"must be text, not {json.dumps(value)} (in YAML, quote it)"
        if not isinstance(value, str | int | float):  # a YAML date, say
            return f"must be text, not {type(value).__name__} {value} (quote it)"
    elif isinstance(f, models.BooleanField) and not isinstance(value, bool):
        # Django reads 1, 0, "t", "False" as booleans; a file says true or false.
        shown = json.dumps(value, ensure_ascii=False, default=str)
        return f"must be true or false, not {shown}"
    return None


def _valid(state: Import, where: str, row: Any, exclude: Sequence[str] = ()) -> bool:
    """Note ``row``'s problems as the admin finds them (``exclude``: fields not checked);
    whether it has none."""
    problems = _shape_problems(row)
    try:
        # The other fields are still checked, so one import lists every problem.
        row.full_clean(exclude=[*exclude, *problems])
    except ValidationError as exc:
        for name, messages in exc.message_dict.items():
            problems.setdefault(name, [str(m) for m in messages])
    except (TypeError, ValueError, AttributeError, ArithmeticError):
        # A check reading a column named above (a list, a null) fails on it: that column's
        # problem is the one to fix first.
        if not problems:
            raise
    if not problems and hasattr(row, "row_problems"):  # an assignment has no limit to build
        problems = {name: [message] for name, message in row.row_problems().items()}
    for name, messages in sorted(problems.items()):
        column = "" if name == "__all__" else f".{name}"
        state.problems.append(f"{where}{column}: {' '.join(messages)}")
    return not problems


def sync_limits(
    state: Import,
    where: str,
    parent: Any,
    entries: Iterable[tuple[int, Mapping[str, Any]]],
    *,
    write: bool = True,
) -> None:
    """Make ``parent``'s limit rows hold ``entries`` (their
    index in the file, their values; an endpoint limit's "tier" a :class:`Tier`), keeping rows
    whose values are unchanged, then editing rows in place, then adding and deleting. Every
    entry is checked first, each problem noted; with one, or without ``write`` (the parent
    has problems of its own and was not saved), nothing is written."""
    relation = type(parent)._meta.get_field("limits")
    model, parent_field = relation.related_model, relation.field.name
    known = {f.name for f in columns(model)}
    allowed = known | {"tier"} if model is EndpointLimit else known
    defaults = {f.name: f.get_default() for f in columns(model)}
    new = partial(model, **{parent_field: parent})
    wanted: list[tuple[int, dict[str, Any], Any]] = []  # (index, fields, a new row of them)
    refused = False
    for j, entry in entries:
        problem = _unknown(f"{where}.limits[{j}]", set(entry) - allowed, allowed)
        if problem is not None:
            state.problems.append(problem)
            refused = True
            continue
        fields = {**defaults, **entry}
        if isinstance(fields["rate"], str):  # stored as the admin stores it: '5 / min' is 5/m
            fields["rate"] = canonical_rate(fields["rate"])
        candidate = _assign(new(), fields)
        # The parent may be unsaved: its own link is checked once it is written. An endpoint
        # limit whose tier is not there (noted already) has its other fields checked.
        unlinked = model is EndpointLimit and entry.get("tier") is None
        exclude = (parent_field, "tier") if unlinked else (parent_field,)
        if not _valid(state, f"{where}.limits[{j}]", candidate, exclude=exclude) or unlinked:
            refused = True
            continue
        wanted.append((j, fields, candidate))
    if _duplicates(state, where, [(j, row) for j, _, row in wanted]) or refused or not write:
        return
    unmatched = list(parent.limits.select_related("tier").order_by("pk"))

    def take(candidate: Any, same_values: bool) -> Any:
        """The first unmatched row of ``candidate``'s tier (and values, a rate compared as
        the admin stores it: a row saved as ``20/min`` is the file's ``20/m``, kept as it
        is), no longer unmatched."""
        for row in unmatched:
            if row.tier_id == candidate.tier_id and (
                not same_values or stored(row) == stored(candidate)
            ):
                unmatched.remove(row)
                return row
        return None

    pending = [(j, fields, new) for j, fields, new in wanted if take(new, True) is None]
    # Pair each changed limit with a leftover row of the same tier to edit in place, so its
    # counters are re-timed rather than started afresh.
    plan = [(j, fields, new, take(new, False)) for j, fields, new in pending]
    for row in unmatched:
        state.changes.append(Change("-", _limit_label(parent, row), _limit_text(row)))
        row.delete()
    for j, fields, candidate, row in plan:
        before = None if row is None else _limit_text(row)
        row = candidate if row is None else _assign(row, fields)
        if not _valid(state, f"{where}.limits[{j}]", row):
            continue
        row.save()
        if before is None:
            state.changes.append(Change("+", _limit_label(parent, row), _limit_text(row)))
        else:
            change = f"{before} → {_limit_text(row)}"
            state.changes.append(Change("~", _limit_label(parent, row), change))


def _limit_text(row: Any) -> str:
    """A limit row's values as a change shows them: an endpoint limit counted by IP address
    or username says so (a change of whom it counts showed as ``5/min → 5/min``)."""
    counted_by = getattr(row, "counted_by", EndpointLimit.CountedBy.CLIENT)
    text = str(row)
    return (
        text if counted_by == EndpointLimit.CountedBy.CLIENT else f"{text}, counted by {counted_by}"
    )


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


#: Top-level sections, in the order they are written and applied.
SECTIONS = ("tiers", "rules", "assignments", "exemptions")
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
            {**stored(parent), "limits": [_limit_entry(row) for row in _limits(parent)]}
            for parent in parents
        ]
    if assignments:
        document["assignments"] = _export_assignments()
        document["exemptions"] = _export_exemptions()
    protection = Protection.objects.order_by("pk").first()
    if protection is not None:
        document["protection"] = stored(protection)
    return document


def _limits(parent: Any) -> list[Any]:
    """A tier's or rule's limit rows (prefetched), by tier and in the order they were added."""
    return sorted(parent.limits.all(), key=lambda row: (row.tier.slug, row.pk))


def _limit_entry(limit: models.Model) -> dict[str, Any]:
    """A limit as written under its parent: an endpoint limit names its tier first."""
    tier = {"tier": limit.tier.slug} if isinstance(limit, EndpointLimit) else {}
    return {**tier, **stored(limit)}


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


def _export_exemptions() -> list[dict[str, str]]:
    """Who is never limited: networks (in their normal form), then users, then groups.

    Each network is written once: rows saved around the admin in several spellings of one
    network (``192.0.2.1`` and ``192.0.2.1/32``) are one exemption to the limiter, and an
    import refuses a file listing a network twice. The first row (by primary key) is written,
    with its note, as an import matches the first row of each network."""
    username = get_user_model().USERNAME_FIELD
    out = []
    networks: set[str] = set()
    for row in Exemption.objects.select_related("user", "group").order_by("pk"):
        if row.user_id is not None:
            entry = {"user": getattr(row.user, username)}
        elif row.group_id is not None:
            entry = {"group": row.group.name}
        else:
            network = _normal_network(row.network) or row.network
            if network in networks:
                continue
            networks.add(network)
            entry = {"network": network}
        if row.note:
            entry["note"] = row.note
        out.append(entry)
    order = {"network": 0, "user": 1, "group": 2}
    return sorted(out, key=lambda e: next((order[k], str(v)) for k, v in e.items()))


def import_policy(document: Any, *, dry_run: bool = False, prune: bool = False) -> list[Change]:
    """Make the database hold ``document``'s policy; return what changed.

    Tiers and rules are matched by slug and name; those the document does not name are kept,
    unless ``prune`` (then deleted, as are assignments and exemptions when the document has
    those sections). Raises :class:`PolicyFileError` with every problem found, having
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
        if "exemptions" in document:
            _import_exemptions(state, document["exemptions"])
        if "protection" in document:
            _import_protection(state, document["protection"])
        if state.problems:
            transaction.set_rollback(True)
            raise PolicyFileError(state.problems)
        if dry_run:
            transaction.set_rollback(True)
    return state.changes


def _check_shape(document: Any) -> None:
    if not isinstance(document, Mapping):
        raise PolicyFileError(["the document must be a mapping with 'version' and sections"])
    problems = list(_unstorable_text(document, ""))
    if document.get("version") != FORMAT_VERSION:
        problems.append(f"version: must be {FORMAT_VERSION}, not {document.get('version')!r}")
    unknown = set(document) - {"version", *SECTIONS, "protection"}
    if unknown:
        problems.append(
            f"unknown section {_names(unknown)}: use {', '.join((*SECTIONS, 'protection'))}"
        )
    if "protection" in document and not isinstance(document["protection"], Mapping):
        problems.append(
            f"protection: must be a mapping, not {type(document['protection']).__name__}"
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


def _unstorable_text(value: Any, path: str) -> Iterator[str]:
    """A problem for each text in ``value`` (keys too) that no database stores and no
    lookup may send: a NUL character (PostgreSQL refuses it), or a lone UTF-16 surrogate (a
    JSON ``\\ud800`` escape without its pair: not UTF-8). Such text failed a query or a
    save with a traceback; the admin's form refuses it."""
    if isinstance(value, str):
        if "\x00" in value:
            yield f"{path or 'the document'}: {value!r} holds a NUL character (\\x00)"
        elif not _encodes(value):
            yield f"{path or 'the document'}: {value!r} holds a lone UTF-16 surrogate"
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _unstorable_text(key, f"{path}: a key" if path else "a key")
            yield from _unstorable_text(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _unstorable_text(item, f"{path}[{i}]")


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _import_protection(state: Import, entry: Mapping[str, Any]) -> None:
    """The one Service protection row (the load shedder): its fields as the entry gives them,
    the others left as they are (a new row starts from the model's defaults)."""
    known = {f.name for f in columns(Protection)}
    problem = _unknown("protection", set(entry) - known, known)
    if problem is not None:
        state.problems.append(problem)
        return
    row = Protection.objects.order_by("pk").first() or Protection()
    upsert(state, "protection", row, dict(entry))


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
    seen: dict[Any, int] = {}
    for i, entry in enumerate(entries):
        where = f"{section}[{i}] {entry.get(key)!r}"
        if (earlier := _seen_before(seen, entry.get(key), i)) is not None:
            # The second entry would silently overwrite the first: say which to keep.
            state.problems.append(
                f"{where}.{key}: {section}[{earlier}] has this {key} too; write each "
                f"{'tier' if model is Tier else 'rule'} once"
            )
            continue
        first = len(state.problems)
        own, limits = split(state, where, model, entry)
        desired: Iterable[tuple[int, Mapping[str, Any]]] = ()
        if limits is not None:
            desired = (
                _with_tiers(state, where, limits) if model is EndpointRule else enumerate(limits)
            )
        target = model._default_manager.filter(**{key: own.get(key)}).first() or model()
        row = upsert(state, where, target, own)
        if isinstance(row, Tier):
            state.tiers[row.slug] = row
        elif model is Tier and row is None and isinstance(entry.get(key), str):
            state.refused_tiers.add(entry[key])
        if limits is not None:
            sync_limits(state, where, target, desired, write=row is not None)
        state.problems[first:] = _in_file_order(state.problems[first:], where, entry)
    if state.prune:
        named = {str(entry.get(key)) for entry in entries}
        for row in model._default_manager.exclude(**{f"{key}__in": named}):
            if isinstance(row, Tier) and (problem := _keys_of(row)) is not None:
                state.problems.append(problem)
                continue
            state.changes.append(Change("-", label(row)))
            if isinstance(row, Tier):
                state.changes.extend(_going_with(row))
            row.delete()


def _keys_of(tier: Tier) -> str | None:
    """Why pruning ``tier`` is refused: API keys are in it (a key's tier is protected, and
    keys are never in a policy file, so the import cannot move them), else ``None``."""
    count = tier.api_keys.count()
    if not count:
        return None
    shown = ", ".join(str(key) for key in tier.api_keys.order_by("name", "pk")[:3])
    more = f" and {count - 3:,} more" if count > 3 else ""
    them = "them" if count > 1 else "it"
    return (
        f"tier {tier.slug!r}: not in the file, so --prune would delete it, but "
        f"{count:,} API key{'s are' if count > 1 else ' is'} in it ({shown}{more}): move "
        f"{them} to another tier in the admin, or keep the tier in the file"
    )


def _going_with(tier: Tier) -> Iterator[Change]:
    """The rows deleting ``tier`` deletes with it: its endpoint limits in every rule and
    who was assigned to it (those users fall back to the default tier), so the list of
    changes says what an import deletes, not only the tier."""
    for limit in tier.endpoint_limits.select_related("rule", "tier").order_by("rule__name", "pk"):
        yield Change("-", _limit_label(limit.rule, limit), _limit_text(limit))
    for assignment in tier.assignments.select_related("user", "group").order_by("pk"):
        kind = "user" if assignment.user_id is not None else "group"
        yield Change("-", f"assignment of {kind} {str(getattr(assignment, kind))!r}")


#: What a problem of an entry names after the entry's own ``where``: a limit (its index)
#: and a field; neither for one about the entry as a whole.
_NAMED = re.compile(r"(?:\.limits\[(\d+)\])?(?:\.(\w+))?")


def _seen_before(seen: dict[Any, int], key: Any, index: int) -> int | None:
    """The index of the entry before ``index`` with natural key ``key`` (noting ``key`` as
    ``index``'s when it is the first). A key that is not text (a list) is left to the
    entry's own checks."""
    try:
        earlier = seen.setdefault(key, index)
    except TypeError:  # unhashable: its field's check names it
        return None
    return None if earlier == index else earlier


def _in_file_order(problems: list[str], where: str, entry: Mapping[str, Any]) -> list[str]:
    """The ``problems`` of ``entry`` (each starting with its ``where``) in the order the
    file writes what they name: those of the entry as a whole (an unknown field) first, then
    each field's where the entry writes it, its limits' where it writes ``limits``, limit by
    limit, each in the order of its own fields; a field the entry leaves out (a missing
    name) after those it writes."""
    keys = list(entry)
    limits = entry.get("limits")
    limits = limits if isinstance(limits, list) else []

    def at(names: list[str], name: str | None) -> int:
        if name is None:
            return -1
        return names.index(name) if name in names else len(names)

    def position(problem: str) -> tuple[int, int, int]:
        named = _NAMED.match(problem, len(where))
        index, name = (named[1], named[2]) if named is not None else (None, None)
        if index is None:
            return (at(keys, name), -1, -1)
        limit = limits[int(index)] if int(index) < len(limits) else {}
        fields = list(limit) if isinstance(limit, Mapping) else []
        return (at(keys, "limits"), int(index), at(fields, name))

    return sorted(problems, key=position)


def _with_tiers(
    state: Import, where: str, limits: list[Mapping[str, Any]]
) -> list[tuple[int, Mapping[str, Any]]]:
    """An endpoint rule's limits (with their index), each naming its :class:`Tier`, or
    ``None`` after noting that it is not there (its other fields are still checked)."""
    return [
        (j, {**limit, "tier": _tier(state, f"{where}.limits[{j}].tier", limit.get("tier"))})
        for j, limit in enumerate(limits)
    ]


def _import_assignments(state: Import, entries: list[Mapping[str, Any]]) -> None:
    wanted: set[tuple[str, Any]] = set()
    seen: dict[Any, int] = {}
    for i, entry in enumerate(entries):
        where = f"assignments[{i}]"
        unknown = set(entry) - {"tier", "user", "group", "note"}
        if unknown:
            state.problems.append(f"{where}: unknown field {_names(unknown)}")
            continue
        if ("user" in entry) == ("group" in entry):
            state.problems.append(f"{where}: give exactly one of 'user' and 'group'")
            continue
        tier = _tier(state, f"{where}.tier", entry.get("tier"))
        if tier is None:
            continue
        kind = "user" if "user" in entry else "group"
        name = entry[kind]
        who = _who(state, f"{where}.{kind}", kind, name)
        if who is None:
            continue
        if (earlier := _seen_before(seen, (kind, who.pk), i)) is not None:
            state.problems.append(
                f"{where}.{kind}: assignments[{earlier}] assigns this {kind} too; "
                "a user or group is in one tier: write it once"
            )
            continue
        wanted.add((kind, who.pk))
        row = TierAssignment.objects.filter(**{kind: who}).first()
        before = None if row is None else (row.tier, row.note)
        row = row or TierAssignment(**{kind: who})
        # Validated as the admin validates it: a note too long for its column, or not text,
        # is a problem here rather than a database error (or a note of 'None') at the save.
        row.tier, row.note = tier, entry.get("note", "")
        if not _valid(state, where, row):
            continue
        label = f"assignment of {kind} {name!r}"
        if before is None:
            row.save()
            state.changes.append(Change("+", label, f"tier {tier.slug!r}"))
        elif before != (tier, row.note):
            detail = f"tier {before[0].slug!r} → {tier.slug!r}" if before[0] != tier else ""
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


def _who(state: Import, where: str, kind: str, name: Any) -> Any:
    """The user (by username) or group (by name) ``name`` names; else a problem at
    ``where``."""
    user_model = get_user_model()
    who: Any = (
        user_model._default_manager.filter(**{user_model.USERNAME_FIELD: name}).first()
        if kind == "user"
        else Group.objects.filter(name=name).first()
    )
    if who is None:
        state.problems.append(f"{where}: no {kind} {name!r} in the database")
    return who


_EXEMPT = ("network", "user", "group")


def _import_exemptions(state: Import, entries: list[Mapping[str, Any]]) -> None:
    """Who is never limited, each entry one network, user or group with an optional note,
    validated as the admin validates it (a network is kept in its normal form, so
    ``203.0.113.7/24`` matches the row of ``203.0.113.0/24``); with ``prune``, exemptions
    the file does not list are deleted."""
    kept: set[int] = set()
    seen: dict[Any, int] = {}
    networks = _exempt_networks()
    for i, entry in enumerate(entries):
        where = f"exemptions[{i}]"
        problem = _unknown(where, set(entry) - {*_EXEMPT, "note"}, {*_EXEMPT, "note"})
        kinds = [kind for kind in _EXEMPT if kind in entry]
        if problem is not None or len(kinds) != 1:
            state.problems.append(problem or f"{where}: give exactly one of {', '.join(_EXEMPT)}")
            continue
        (kind,) = kinds
        name = entry[kind]
        if kind == "network":
            row = networks.get(_normal_network(name)) or Exemption(network=name)
            row.network = name
        else:
            who = _who(state, f"{where}.{kind}", kind, name)
            if who is None:
                continue
            row = Exemption.objects.filter(**{kind: who}).first() or Exemption(**{kind: who})
        before = row.note if row.pk is not None else None
        row.note = entry.get("note", "")
        if not _valid(state, where, row):  # normalises the network
            continue
        key = row.network or (kind, getattr(row, f"{kind}_id"))
        if (earlier := _seen_before(seen, key, i)) is not None:
            state.problems.append(
                f"{where}.{kind}: exemptions[{earlier}] exempts this {kind} too: write it once"
            )
            continue
        what = _exemption_label(row)
        if before is None:
            row.save()
            state.changes.append(Change("+", what))
        elif before != row.note:
            row.save()
            state.changes.append(Change("~", what, f"note: {before!r} → {row.note!r}"))
        kept.add(row.pk)
    if state.prune:
        for row in Exemption.objects.exclude(pk__in=kept).select_related("user", "group"):
            state.changes.append(Change("-", _exemption_label(row)))
            row.delete()


def _exemption_label(row: Exemption) -> str:
    """An exemption as changes name it, as an assignment is named: its kind and who."""
    if row.user_id is not None:
        return f"exemption of user {getattr(row.user, get_user_model().USERNAME_FIELD)!r}"
    if row.group_id is not None:
        return f"exemption of group {row.group.name!r}"
    return f"exemption of network {row.network!r}"


def _exempt_networks() -> dict[str | None, Exemption]:
    """The network exemptions in the database by their normal form (the first row of each),
    read once per import: a row saved another way (``192.0.2.1`` for ``192.0.2.1/32``) is
    read alike by the limiter, and an import adding a second row of it would list it twice."""
    found: dict[str | None, Exemption] = {}
    for row in Exemption.objects.exclude(network="").order_by("pk"):
        found.setdefault(_normal_network(row.network), row)
    found.pop(None, None)  # a row the admin would refuse matches no entry
    return found


def _tier(state: Import, where: str, slug: Any) -> Tier | None:
    """The tier ``slug`` names, in the file or the database; else a problem at ``where``:
    a tier the file writes with problems of its own is said to be refused ("no tier 'x' in
    the file" sent its author looking for a tier that is there)."""
    found = None
    if isinstance(slug, str):
        found = state.tiers.get(slug) or Tier.objects.filter(slug=slug).first()
    if found is not None:
        return found
    if isinstance(slug, str) and slug in state.refused_tiers:
        state.problems.append(f"{where}: tier {slug!r} is refused for its own problems (above)")
    else:
        state.problems.append(f"{where}: no tier {slug!r} in the file or the database")
    return None


_USER = "rest_framework.throttling.UserRateThrottle"


def from_drf(rest_framework: Mapping[str, Any]) -> dict[str, Any]:
    """A policy document doing what a ``REST_FRAMEWORK`` setting's throttles do.

    ``anon`` becomes the rate of an ``anonymous`` tier (the default for anonymous clients),
    ``user`` that of an ``authenticated`` tier (the default for users) and, when
    ``UserRateThrottle`` is a default class, of the anonymous tier too (DRF's user throttle
    counts anonymous clients by IP); every other rate becomes an endpoint rule matching that
    DRF ``throttle_scope`` (``ScopedRateThrottle``) with the rate for both tiers. DRF counts
    with a sliding window log, so the limits use it too. Raises :class:`PolicyFileError` for a
    rate DRF itself could not read, and when the setting holds no rate at all (the document
    would only take limits away).
    """
    if not isinstance(rest_framework, Mapping):
        raise PolicyFileError(
            [f"REST_FRAMEWORK must be a dict, not {type(rest_framework).__name__}"]
        )
    rates = rest_framework.get("DEFAULT_THROTTLE_RATES") or {}
    if not isinstance(rates, Mapping):
        raise PolicyFileError(
            [
                "REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'] must be a dict of scope to rate, "
                f"not {type(rates).__name__}"
            ]
        )
    rates = dict(rates)
    classes = [str(c) for c in rest_framework.get("DEFAULT_THROTTLE_CLASSES") or ()]
    if not any(rate is not None for rate in rates.values()):
        # Converting nothing would give both tiers no limits: applied, it would delete the
        # anonymous tier's limits and hand the authenticated default to an unlimited tier.
        raise PolicyFileError(
            [
                "REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'] holds no rates, so there is nothing "
                "to convert (applied, it would remove every limit of the default tiers)"
            ]
        )
    converted = {scope: _drf_limit(rate) for scope, rate in rates.items() if rate is not None}
    problems = [
        f"DEFAULT_THROTTLE_RATES[{scope!r}]: {rates[scope]!r} is not a DRF rate such as '100/day'"
        for scope, limit in converted.items()
        if limit is None
    ]
    if problems:
        raise PolicyFileError(problems)
    limits = {scope: limit for scope, limit in converted.items() if limit is not None}
    anonymous = [limits["anon"]] if "anon" in limits else []
    if "user" in limits and _USER in classes:
        anonymous.append(limits["user"])  # DRF's user throttle counts anonymous clients by IP
    authenticated = [limits["user"]] if "user" in limits else []
    tiers = [
        _drf_tier("anonymous", "AnonRateThrottle", "anon", "is_default_anonymous", anonymous),
        _drf_tier(
            "authenticated", "UserRateThrottle", "user", "is_default_authenticated", authenticated
        ),
    ]
    rules = [
        {
            "name": scope,
            "match_type": "scope",
            "pattern": scope,
            "limits": [{"tier": slug, **limit} for slug in ("anonymous", "authenticated")],
        }
        for scope, limit in sorted(limits.items())
        if scope not in ("anon", "user")
    ]
    return {"version": FORMAT_VERSION, "tiers": tiers, "rules": rules}


def _drf_tier(
    slug: str, throttle: str, scope: str, default: str, limits: list[dict[str, Any]]
) -> dict[str, Any]:
    """A default tier's entry, ``default`` the flag making it one, from DRF's ``throttle``."""
    return {
        "slug": slug,
        "name": slug.capitalize(),
        "description": f"From DRF's {throttle} (DEFAULT_THROTTLE_RATES[{scope!r}]).",
        default: True,
        "limits": limits,
    }


def _drf_limit(rate: Any) -> dict[str, Any] | None:
    """DRF's reading of ``rate`` as a limit row, or ``None`` where DRF would fail."""
    try:
        count_text, period = str(rate).split("/")
        count = int(count_text)
    except ValueError:
        return None
    unit = period[:1]  # DRF reads only the first letter ("100/day", "5/minute")
    if unit not in ("s", "m", "h", "d") or count < 1:
        return None
    # DRF keeps every request's time in a list, a sliding window log; beyond the log's
    # largest count the sliding window counter stands in.
    log = count <= MAX_LOG_COUNT
    algorithm = Algorithm.SLIDING_LOG if log else Algorithm.SLIDING_COUNTER
    return {"rate": f"{count}/{unit}", "algorithm": str(algorithm)}
