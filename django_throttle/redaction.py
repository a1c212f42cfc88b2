"""Redis URLs made safe to show: the password replaced by ``***`` wherever a URL reaches a log
line, a system check, a command's output or a debug page.

A Redis URL carries its password in the user-info part (``redis://:secret@host``,
``redis://user:secret@host``) or in the query (``?password=secret``); both are masked. The
host, port, database and user name stay, so the text still says which server is meant.
Nothing here does I/O.
"""

from __future__ import annotations

import re
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
