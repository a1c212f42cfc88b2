"""Text made safe to show or log: Redis URLs with their password masked, and attacker-chosen
text (client labels, usernames, header values) with what could forge or hide output removed.

A Redis URL carries its password in the user-info part (``redis://:secret@host``,
``redis://user:secret@host``) or in the query (``?password=secret``): :func:`redact_url` and
:func:`redact_text` mask both wherever a URL reaches a log line, a system check, a command's
output or a debug page. The host, port, database and user name stay, so the text still says
which server is meant.

A client label can hold anything a request sent: a username with ``[link=…]`` (rich markup),
ESC bytes (terminal escape sequences), CR/LF (forged log lines), right-to-left overrides
(text that reads differently from what it is) or characters that show nothing (a zero-width
space, a soft hyphen: ``alice\u200b`` is another label than ``alice`` and must not look like
it). :func:`plain_text` is what every operator view shows (tables, CSV, the dashboard): the
text with each such character written as a visible escape (``\u200b``), so no label looks like
another. :func:`log_text` is what log lines carry: the same escapes, and backslashes doubled,
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


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: Categories no renderer shows as a glyph of its own: controls, format characters (zero-width
#: spaces and joiners, soft hyphen, bidi controls), line and paragraph separators, surrogates,
#: private-use and unassigned code points.
_UNSHOWN_CATEGORIES = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"))
#: Unicode's default-ignorable code points outside those categories (DerivedCoreProperties):
#: the combining grapheme joiner, Hangul fillers, Khmer and Mongolian inherent vowels and
#: variation selectors, halfwidth filler. Each renders as nothing, or as a blank.
_IGNORABLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]"
)


def _hidden(char: str) -> bool:
    """Whether ``char`` shows nothing (or moves the text around it) where it is printed:
    :data:`_UNSHOWN_CATEGORIES` and :data:`_IGNORABLE`."""
    return unicodedata.category(char) in _UNSHOWN_CATEGORIES or bool(_IGNORABLE.match(char))


def plain_text(value: object) -> str:
    """``value`` as text with every control character, line separator, bidi override and
    character that shows nothing written as a visible escape (``\\x1b``, ``\\u200b``): what a
    table cell, CSV cell or dashboard label shows, so two labels that differ never look alike.
    Markup is the caller's to avoid (rich ``Text``, Django's autoescape): this handles what
    no renderer escapes. Backslashes stay as they are (``CORP\\alice`` reads as typed)."""
    text = str(value)
    if text.isprintable() and not _IGNORABLE.search(text):
        return text
    return "".join(_escape(char) if _hidden(char) else char for char in text)


def log_text(value: object) -> str:
    """``value`` for a log line: backslash, CR, LF, tab and every other control character,
    line separator, bidi override or character that shows nothing written as an escape
    (``\\n``, ``\\x1b``, ``\\u202e``), so the record stays one line and shows what was sent.
    Cheap for ordinary text."""
    text = str(value)
    if text.isprintable() and "\\" not in text and not _IGNORABLE.search(text):
        return text
    return "".join(map(_escaped, text))


def _escaped(char: str) -> str:
    """One character as :func:`log_text` writes it."""
    if char in _ESCAPES:
        return _ESCAPES[char]
    return _escape(char) if _hidden(char) else char


def _escape(char: str) -> str:
    """``char`` as a visible escape: ``\\n``, ``\\r``, ``\\t``, else its code point."""
    if char in _ESCAPES and char != "\\":
        return _ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
