"""Views that are never limited: :func:`throttle_exempt` on a function or class-based view,
or ``throttle_exempt = True`` on a DRF view.

An exempt view's requests make no backend call and get no rate limit headers. Exempt clients
(the users, groups and IP networks listed in the admin) are rows of
:class:`~django_throttle.models.Exemption`; staff and superusers are limited like everyone else
unless listed there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["throttle_exempt"]

V = TypeVar("V", bound=Callable[..., Any])


def throttle_exempt(view: V) -> V:
    """Never limit this view. Works on a function view (for DRF, above ``@api_view``: below
    it, ``@api_view`` builds its view class without the mark, and the view stays limited), a
    class-based view class, or the result of ``as_view()``."""
    view.throttle_exempt = True  # type: ignore[attr-defined]
    for attribute in ("cls", "view_class"):  # DRF's and Django's as_view() results
        owner = getattr(view, attribute, None)
        if owner is not None:
            owner.throttle_exempt = True
    return view


def is_exempt_view(view: Any) -> bool:
    """Whether a view (function, class, instance, or ``as_view()`` result) is exempt."""
    if getattr(view, "throttle_exempt", False) is True:
        return True
    owner = getattr(view, "cls", None) or getattr(view, "view_class", None)
    return owner is not None and getattr(owner, "throttle_exempt", False) is True
