"""What every ModelAdmin of the app shares: the base class that loads the app's stylesheet, the
"problems" column (a row the policy compiler would skip, and why), the warnings shown after a
save, the limit inline the tier and rule pages extend, and whether autocomplete can search a
model (else the pages fall back to raw ids).

It registers nothing: the modules beside it register one model's admin each.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib import admin, messages
from django.db.models import Model
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from django_throttle.admin.forms import LimitForm

__all__ = ["LimitInline"]


class _AppAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Every page of the app's models loads its stylesheet, which keeps each page within a
    1,280 px window whatever the data (long words wrap, limit rows stay narrow)."""

    class Media:
        css = {"all": ["django_throttle/admin.css"]}


def _problems(rows: Iterable[Any]) -> SafeString:
    """Each row's problems, as the policy compiler would log them; empty when all are fine."""
    found = [
        (type(row)._meta.verbose_name, row.pk, field, reason)
        for row in rows
        for field, reason in row.row_problems().items()
    ]
    if not found:
        return mark_safe("")
    items = format_html_join(
        "", "<li>{} {}: {}: {}</li>", ((str(v), pk, f, r) for v, pk, f, r in found)
    )
    return format_html(
        '<ul class="errorlist" title="{}">{}</ul>',
        _("skipped by the throttle policy until corrected"),
        items,
    )


def _warn(request: HttpRequest, warnings: Iterable[str]) -> None:
    """Show what the forms accepted but the operator should know (see
    :class:`~django_throttle.admin.forms.TierLimitFormSet`), once the change is saved."""
    for warning in warnings:
        messages.warning(request, warning)


class LimitInline(admin.TabularInline):  # type: ignore[type-arg]
    """A limit row: rate and algorithm, then the burst (bucket algorithms) or the time zone
    (calendar quota); ``limit_fields.js`` hides what the chosen algorithm does not use."""

    form = LimitForm
    fields = ["rate", "algorithm", "burst", "timezone"]
    extra = 1

    class Media:
        js = ["django_throttle/limit_fields.js"]


def _searchable(site: admin.AdminSite, model: type[Model]) -> bool:
    """Whether ``model`` has an admin that autocomplete can search."""
    return site.is_registered(model) and bool(site.get_model_admin(model).search_fields)
