"""``DJANGO_THROTTLE_DENIED_RESPONSE`` callables used by tests/test_denied_response.py."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse


def plain_text(request: Any, decision: Any) -> HttpResponse:
    status = 503 if decision.unavailable else 429
    limit = decision.limit.name if decision.limit is not None else "none"
    return HttpResponse(
        f"slow down ({limit}) on {request.path}", status=status, content_type="text/plain"
    )


def broken(request: Any, decision: Any) -> HttpResponse:
    raise RuntimeError("bug in the project's callable")


def not_a_response(request: Any, decision: Any) -> Any:
    return {"not": "a response"}
