"""The refusal as a page, for a browser: a request whose ``Accept`` prefers ``text/html`` to
JSON gets the 429 or 503 explained in words (what happened, how long to wait) instead of a
JSON body it would show raw. API clients (``application/json``, ``*/*``, no ``Accept``) are
never sent HTML.

The page is the template ``django_throttle/throttled.html``, which a project overrides by
putting its own under that name in a template directory found first. It extends nothing, so
it renders outside the admin and with no project template. It is rendered without the
request's context processors (a processor may query the database, which an async view may not
do, and a refusal must stay cheap); its context names the request, the decision and the words.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.http import HttpResponse
from django.template.loader import render_to_string
from django.utils.translation import ngettext

from django_throttle.rates import Decision

logger = logging.getLogger("django_throttle")

#: The template of the page; override it in a project's templates.
TEMPLATE = "django_throttle/throttled.html"

#: Offered in this order, so a tie (``*/*``, no ``Accept`` at all) goes to JSON.
_OFFERED = ("application/json", "text/html")


def wants_html(request: Any) -> bool:
    """Whether ``request`` prefers ``text/html`` to JSON by its ``Accept`` header (Django's
    ``HttpRequest.get_preferred_type``: quality first, then the more specific type)."""
    preferred = getattr(request, "get_preferred_type", None)
    return preferred is not None and preferred(_OFFERED) == "text/html"


def human_wait(seconds: int) -> str:
    """A wait in words, in the largest unit it fills, rounded up: "1 second", "2 minutes",
    "3 hours", "2 days" (a browser's reader must not come back too early)."""
    if seconds < 60:
        return ngettext("%(count)d second", "%(count)d seconds", seconds) % {"count": seconds}
    if seconds <= 3600:
        count = math.ceil(seconds / 60)
        return ngettext("%(count)d minute", "%(count)d minutes", count) % {"count": count}
    if seconds <= 86400:
        count = math.ceil(seconds / 3600)
        return ngettext("%(count)d hour", "%(count)d hours", count) % {"count": count}
    count = math.ceil(seconds / 86400)
    return ngettext("%(count)d day", "%(count)d days", count) % {"count": count}


def throttled_page(
    request: Any, decision: Decision, status: int, wait: int | None
) -> HttpResponse | None:
    """The page for ``decision`` answered with ``status``, or ``None`` when the template
    could not be rendered (logged; the caller sends its JSON instead: a refusal never
    becomes a 500). ``wait`` is the ``Retry-After`` in seconds (``None``: none is sent)."""
    context = {
        "request": request,
        "decision": decision,
        "status": status,
        "unavailable": decision.unavailable,
        "unidentified": decision.unidentified,
        "limit": None if decision.limit is None else decision.limit.name,
        "retry_after": wait,
        "wait": None if wait is None else human_wait(wait),
    }
    try:
        content = render_to_string(TEMPLATE, context)
    except Exception:
        logger.exception("The template %s failed; sending the JSON refusal", TEMPLATE)
        return None
    return HttpResponse(content, status=status)
