"""The endpoint rule pages: a rule's match, methods, cost and what it counts, with its limits
per tier inline (and what each is counted by). Registers ``EndpointRule``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from django_throttle.admin.base import LimitInline, _AppAdmin, _problems, _warn
from django_throttle.admin.columns import counts_word, failure_mode_word, match_word
from django_throttle.admin.forms import EndpointLimitFormSet, EndpointRuleForm
from django_throttle.models import EndpointLimit, EndpointRule

__all__ = ["EndpointLimitInline", "EndpointRuleAdmin"]


class EndpointLimitInline(LimitInline):
    model = EndpointLimit
    formset = EndpointLimitFormSet
    fields = ["tier", *LimitInline.fields, "counted_by"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[EndpointLimit]:
        return super().get_queryset(request).select_related("tier")

    def formfield_for_choice_field(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "counted_by":
            # The row is a line of a table: one word each, the column's help says the rest.
            kwargs["choices"] = [
                (EndpointLimit.CountedBy.CLIENT, pgettext_lazy("admin list", "client")),
                (EndpointLimit.CountedBy.IP, _("IP address")),
                (EndpointLimit.CountedBy.USERNAME, pgettext_lazy("admin list", "username")),
            ]
        return super().formfield_for_choice_field(db_field, request, **kwargs)


@admin.register(EndpointRule)
class EndpointRuleAdmin(_AppAdmin):
    form = EndpointRuleForm
    list_display = [
        "name",
        "matches",
        "method_list",
        "cost",
        "counts_word",
        "enabled",
        "shadow",
        "failure_mode_word",
        "problems",
    ]
    list_editable = ["enabled", "shadow"]
    list_filter = ["match_type", "counts", "enabled", "shadow", "failure_mode"]
    search_fields = ["name", "pattern"]
    fields = [
        "name",
        "match_type",
        "pattern",
        "methods",
        "cost",
        "counts",
        "enabled",
        "shadow",
        "failure_mode",
    ]
    inlines = [EndpointLimitInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[EndpointRule]:
        return super().get_queryset(request).prefetch_related("limits")

    def save_model(
        self,
        request: HttpRequest,
        obj: EndpointRule,
        form: ModelForm,  # type: ignore[type-arg]
        change: bool,
    ) -> None:
        super().save_model(request, obj, form, change)
        _warn(request, getattr(form, "warnings", ()))

    @admin.display(description=pgettext_lazy("admin list", "matches"), ordering="pattern")
    def matches(self, obj: EndpointRule) -> str:
        return f"{match_word(obj.match_type)} {obj.pattern}"

    @admin.display(description=_("counts"), ordering="counts")
    def counts_word(self, obj: EndpointRule) -> str:
        return counts_word(obj.counts)

    @admin.display(description=pgettext_lazy("admin list", "methods"), ordering="methods")
    def method_list(self, obj: EndpointRule) -> str:
        return (
            ", ".join(obj.methods.split(","))
            if obj.methods
            else str(pgettext_lazy("admin list", "all"))
        )

    @admin.display(description=_("failure mode"), ordering="failure_mode")
    def failure_mode_word(self, obj: EndpointRule) -> str:
        return failure_mode_word(obj.failure_mode)

    @admin.display(description=_("problems"))
    def problems(self, obj: EndpointRule) -> SafeString:
        return _problems([obj, *obj.limits.all()])
