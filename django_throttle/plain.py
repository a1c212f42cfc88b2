"""Attacker-chosen text (client labels, usernames, header values) made safe to show or log.

A client label can hold anything a request sent: a username with ``[link=…]`` (rich markup),
ESC bytes (terminal escape sequences), CR/LF (forged log lines) or right-to-left overrides
(text that reads differently from what it is). :func:`plain_text` is what every operator
view shows (tables, CSV, the dashboard): the text with those characters removed.
:func:`log_text` is what log lines carry: every such character written as a visible escape,
so one log record stays one line and says exactly what was sent.
"""

from __future__ import annotations

import unicodedata

#: Format characters that reorder or hide text (bidirectional overrides and isolates).
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _hidden(char: str) -> bool:
    """Control characters (C0, DEL, C1), line and paragraph separators, and bidi controls."""
    return char in _BIDI or unicodedata.category(char) in ("Cc", "Zl", "Zp")


def plain_text(value: object) -> str:
    """``value`` as text with control characters, line separators and bidi overrides
    removed: what a table cell, CSV cell or dashboard label shows. Markup is the caller's
    to avoid (rich ``Text``, Django's autoescape): this removes what no renderer escapes."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(char for char in text if not _hidden(char))


def log_text(value: object) -> str:
    """``value`` for a log line: backslash, CR, LF, tab and every other control character,
    line separator or bidi override written as an escape (``\\n``, ``\\x1b``, ``\\u202e``),
    so the record stays one line and shows what was sent. Cheap for ordinary text."""
    text = str(value)
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(map(_escaped, text))


def _escaped(char: str) -> str:
    """One character as :func:`log_text` writes it."""
    if char in _ESCAPES:
        return _ESCAPES[char]
    if not _hidden(char):
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
