"""The tier pages: a tier's fields and its limits inline (the shared flag too), with the
failure-mode and limit summary columns and the "problems" column. Registers ``Tier``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_throttle.admin.base import LimitInline, _AppAdmin, _problems, _warn
from django_throttle.admin.columns import failure_mode_word
from django_throttle.admin.forms import TierLimitFormSet
from django_throttle.models import FailureMode, Tier, TierLimit

__all__ = ["TierAdmin", "TierLimitInline"]


class TierLimitInline(LimitInline):
    model = TierLimit
    formset = TierLimitFormSet
    fields = [*LimitInline.fields, "shared"]


@admin.register(Tier)
class TierAdmin(_AppAdmin):
    list_display = [
        "name",
        "slug",
        "default_anonymous",
        "default_authenticated",
        "priority",
        "failure_mode_word",
        "limits_summary",
        "problems",
    ]
    # No filters: a site has a handful of tiers, and the list's room goes to their limits.
    search_fields = ["name", "slug", "description"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [TierLimitInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tier]:
        return super().get_queryset(request).prefetch_related("limits")

    fields = [
        "name",
        "slug",
        "description",
        "is_default_anonymous",
        "is_default_authenticated",
        "priority",
        "failure_mode",
    ]

    def formfield_for_choice_field(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "failure_mode":
            # A tier has nothing between it and the setting to inherit from.
            kwargs["choices"] = [
                (FailureMode.INHERIT, _("inherit (the DJANGO_THROTTLE_FAILURE_MODE setting)")),
                *((value, label) for value, label in FailureMode.choices if value),
            ]
        return super().formfield_for_choice_field(db_field, request, **kwargs)

    @admin.display(description=_("anonymous default"), boolean=True)
    def default_anonymous(self, obj: Tier) -> bool:
        return obj.is_default_anonymous

    @admin.display(description=_("users' default"), boolean=True)
    def default_authenticated(self, obj: Tier) -> bool:
        return obj.is_default_authenticated

    @admin.display(description=_("failure mode"), ordering="failure_mode")
    def failure_mode_word(self, obj: Tier) -> str:
        return failure_mode_word(obj.failure_mode)

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        super().save_formset(request, form, formset, change)
        _warn(request, getattr(formset, "warnings", ()))

    @admin.display(description=_("limits"))
    def limits_summary(self, obj: Tier) -> str:
        return ", ".join(str(limit) for limit in obj.limits.all()) or str(_("unlimited"))

    @admin.display(description=_("problems"))
    def problems(self, obj: Tier) -> SafeString:
        return _problems([obj, *obj.limits.all()])
