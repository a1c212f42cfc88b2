"""``{% load throttle_durations %}``: ``{{ seconds|duration }}`` writes float seconds as
:func:`~django_throttle.rates.format_duration` does ("30 d 6 h", "58 min")."""

from __future__ import annotations

from django import template

from django_throttle.rates import format_duration

register = template.Library()


@register.filter
def duration(seconds: float | int | str | None) -> str:
    """The duration, or an empty string for a value that is not a number of seconds (``None``
    and ``""`` among them)."""
    try:
        return format_duration(float(seconds))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
