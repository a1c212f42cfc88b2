"""The pages of the rows the policy is compiled from: tiers and their limits inline (the shared
flag too), endpoint rules with their limits per tier inline (and what each is counted by), tier
assignments and exemptions (rows naming one user or one group; exempt users, groups and
networks are compiled into the policy). Registers ``Tier``, ``EndpointRule``,
``TierAssignment`` and ``Exemption``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from django_throttle import models
from django_throttle.admin.base import COUNTS, MATCH_TYPES, AppAdmin, LimitedAdmin, LimitInline
from django_throttle.admin.forms import EndpointLimitFormSet, EndpointRuleForm, TierLimitFormSet
from django_throttle.models.fields import FailureMode


class TierLimitInline(LimitInline):
    model = models.TierLimit
    formset = TierLimitFormSet
    fields = [*LimitInline.fields, "shared"]


@admin.register(models.Tier)
class TierAdmin(LimitedAdmin):
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
    fields = [
        "name",
        "slug",
        "description",
        "is_default_anonymous",
        "is_default_authenticated",
        "priority",
        "failure_mode",
    ]

    class Media:
        # The slug filled in from the name is selected when clicked into, so typing the slug
        # replaces it rather than running on after it ("anonymousanonymous").
        js = ["django_throttle/slug_field.js"]

    @admin.display(description=_("anonymous default"), boolean=True)
    def default_anonymous(self, obj: models.Tier) -> bool:
        return obj.is_default_anonymous

    @admin.display(description=_("users' default"), boolean=True)
    def default_authenticated(self, obj: models.Tier) -> bool:
        return obj.is_default_authenticated

    def formfield_for_choice_field(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "failure_mode":
            # A tier has nothing between it and the setting to inherit from.
            inherit = _("inherit (the DJANGO_THROTTLE_FAILURE_MODE setting)")
            others = [choice for choice in FailureMode.choices if choice[0]]
            kwargs["choices"] = [(FailureMode.INHERIT, inherit), *others]
        return super().formfield_for_choice_field(db_field, request, **kwargs)

    @admin.display(description=_("limits"))
    def limits_summary(self, obj: models.Tier) -> str:
        return ", ".join(str(limit) for limit in obj.limits.all()) or str(_("unlimited"))


class EndpointLimitInline(LimitInline):
    model = models.EndpointLimit
    formset = EndpointLimitFormSet
    fields = ["tier", *LimitInline.fields, "counted_by"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[models.EndpointLimit]:
        return super().get_queryset(request).select_related("tier")

    def formfield_for_choice_field(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "counted_by":
            # The row is a line of a table: one word each, the column's help says the rest.
            kwargs["choices"] = [
                (models.EndpointLimit.CountedBy.CLIENT, pgettext_lazy("admin list", "client")),
                (models.EndpointLimit.CountedBy.IP, _("IP address")),
                (models.EndpointLimit.CountedBy.USERNAME, pgettext_lazy("admin list", "username")),
            ]
        return super().formfield_for_choice_field(db_field, request, **kwargs)


@admin.register(models.EndpointRule)
class EndpointRuleAdmin(LimitedAdmin):
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

    @admin.display(description=_("counts"), ordering="counts")
    def counts_word(self, obj: models.EndpointRule) -> str:
        return str(COUNTS.get(obj.counts, obj.counts))

    @admin.display(description=pgettext_lazy("admin list", "matches"), ordering="pattern")
    def matches(self, obj: models.EndpointRule) -> str:
        return f"{MATCH_TYPES.get(obj.match_type, obj.match_type)} {obj.pattern}"

    @admin.display(description=pgettext_lazy("admin list", "methods"), ordering="methods")
    def method_list(self, obj: models.EndpointRule) -> str:
        return ", ".join(obj.methods.split(",")) if obj.methods else str(COUNTS["all"])


@admin.register(models.TierAssignment)
class TierAssignmentAdmin(AppAdmin):
    list_display = ["tier", "user", "group", "note", "created"]
    list_select_related = ["tier", "user", "group"]
    list_filter = ["tier"]
    search_fields = ["user__username", "group__name", "note"]
    raw_id_fields = ["user", "group"]


@admin.register(models.Exemption)
class ExemptionAdmin(AppAdmin):
    """Users, groups and networks never limited (compiled into the policy: no query and no
    Redis call per exempt request)."""

    list_display = ["__str__", "note", "created"]
    list_select_related = ["user", "group"]
    search_fields = ["user__username", "group__name", "network", "note"]
    raw_id_fields = ["user", "group"]
