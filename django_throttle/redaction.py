"""Text made safe to show or log: Redis URLs with their password masked, and attacker-chosen
text (client labels, usernames, header values) with what could forge or hide output removed.

A Redis URL carries its password in the user-info part (``redis://:secret@host``,
``redis://user:secret@host``) or in the query (``?password=secret``): :func:`redact_url` and
:func:`redact_text` mask both wherever a URL reaches a log line, a system check, a command's
output or a debug page. The host, port, database and user name stay, so the text still says
which server is meant.

A client label can hold anything a request sent: a username with ``[link=…]`` (rich markup),
ESC bytes (terminal escape sequences), CR/LF (forged log lines) or right-to-left overrides
(text that reads differently from what it is). :func:`plain_text` is what every operator
view shows (tables, CSV, the dashboard): the text with those characters removed.
:func:`log_text` is what log lines carry: every such character written as a visible escape,
so one log record stays one line and says exactly what was sent.

Nothing here does I/O.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any
from urllib.parse import urlsplit

__all__ = ["redact_text", "redact_url"]

#: What a password is replaced with.
MASK = "***"

#: ``scheme://[user]:password@`` anywhere in a text: up to the last ``@`` before a space or a
#: ``/``, so a password holding an unescaped ``@`` is masked whole.
_USERINFO = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^\s:/@]*:)[^\s/]*(?P<at>@)", re.I)
#: ``password=…`` in a query string anywhere in a text.
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)[^\s&#]*", re.I)


def redact_url(url: Any) -> str:
    """``url`` with any password masked; text that is no URL is masked as :func:`redact_text`
    does, so the result is always safe to show."""
    text = str(url)
    try:
        parts = urlsplit(text)
        password = parts.password
    except ValueError:
        return redact_text(text)
    if password is not None:
        userinfo, _, hostinfo = parts.netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        text = text.replace(f"//{parts.netloc}", f"//{user}:{MASK}@{hostinfo}", 1)
    return _QUERY_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)


def redact_text(text: str) -> str:
    """``text`` with the password of every URL in it masked (log lines, exception messages,
    environment values)."""
    text = _USERINFO.sub(lambda m: f"{m['head']}{MASK}{m['at']}", text)
    return _QUERY_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)


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
