"""A policy file's text as values and back: JSON or YAML, read within bounds.

An operator's file must not end in a ``RecursionError``, nor keep an import (and its
transaction) busy: a file nested deeper than :data:`MAX_DEPTH`, or holding more than
:data:`MAX_VALUES` values, is refused before its values are built, in time proportional to its
length. YAML aliases count as what they expand to (a few hundred bytes of them can stand for
millions of entries). What the values mean is :mod:`django_throttle.policy.files`'s job.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

#: The document's ``version``; an import refuses any other.
FORMAT_VERSION = 1


class PolicyFileError(Exception):
    """The document cannot be imported; ``problems`` lists every reason, each naming the entry
    and field (``tiers[1] 'pro'.limits[0].rate: ...``). Nothing was written."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


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


def dump(document: Mapping[str, Any], fmt: str) -> str:
    """The document as ``json`` or ``yaml`` text."""
    if fmt == "yaml":
        return str(_yaml().safe_dump(dict(document), sort_keys=False, allow_unicode=True))
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
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyFileError([f"not valid JSON: {exc}"]) from exc


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
    size, height = 1, 1
    for child in children:
        child_size, child_height = _measure(child, known)
        size += child_size
        height = max(height, child_height + 1)
        if size > MAX_VALUES:
            raise PolicyFileError([_TOO_BIG])
    known[key] = (size, height)
    return size, height


def _yaml() -> Any:
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise PolicyFileError(
            ["YAML needs PyYAML: pip install 'django-throttle-policies[yaml]', or use JSON"]
        ) from exc
    return yaml
