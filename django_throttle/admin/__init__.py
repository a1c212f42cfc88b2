"""The admin pages where operators edit tiers, endpoint rules, assignments and API keys, and read
usage.

Bad input becomes a form error on the field to change (see :mod:`django_throttle.admin.forms`),
never a 500; list pages load related rows up front so they cost a fixed number of queries, and flag
rows written around the admin that the policy skips (a "problems" column).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.db import router
from django.db.models import Model, QuerySet
from django.forms import ModelForm
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from django_throttle.admin.columns import (
    attach_client_links,
    counts_word,
    failure_mode_word,
    match_word,
)
from django_throttle.admin.forms import (
    EndpointLimitFormSet,
    EndpointRuleForm,
    LimitForm,
    TierLimitFormSet,
)
from django_throttle.backends import BackendError
from django_throttle.models import (
    ApiKey,
    EndpointLimit,
    EndpointRule,
    Exemption,
    FailureMode,
    Tier,
    TierAssignment,
    TierLimit,
    UsageCount,
)
from django_throttle.usage import accounting as usage


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


def _searchable(site: admin.AdminSite, model: type[Model]) -> bool:
    """Whether ``model`` has an admin that autocomplete can search."""
    return site.is_registered(model) and bool(site.get_model_admin(model).search_fields)


class _UserOrGroupAdmin(_AppAdmin):
    """Rows naming one user or one group: autocomplete where the user model's admin can
    search, raw ids otherwise (a project with a custom user model may not register one, and
    autocomplete without it fails a system check)."""

    raw_id_fields = ["user", "group"]

    def get_autocomplete_fields(self, request: HttpRequest) -> list[str]:
        return [
            name
            for name in ("user", "group")
            if _searchable(self.admin_site, self.model._meta.get_field(name).related_model)
        ]


@admin.register(TierAssignment)
class TierAssignmentAdmin(_UserOrGroupAdmin):
    list_display = ["tier", "user", "group", "note", "created"]
    list_select_related = ["tier", "user", "group"]
    list_filter = ["tier"]
    search_fields = ["user__username", "group__name", "note"]
    fields = ["tier", "user", "group", "note"]


@admin.register(Exemption)
class ExemptionAdmin(_UserOrGroupAdmin):
    """Users, groups and networks never limited (compiled into the policy: no query and no
    Redis call per exempt request)."""

    list_display = ["__str__", "note", "created"]
    list_select_related = ["user", "group"]
    search_fields = ["user__username", "group__name", "network", "note"]
    fields = ["user", "group", "network", "note"]


@admin.register(ApiKey)
class ApiKeyAdmin(_AppAdmin):
    """Adding a key shows the full key once, in the message after saving; only its prefix
    and digest are stored. Revoke a key by unticking "active" (or the list action)."""

    list_display = [
        "prefix",
        "name",
        "tier",
        "owner",
        "active",
        "expires",
        "created",
        "last_used_at",
    ]
    list_select_related = ["tier", "owner"]
    list_filter = ["active", "tier"]
    search_fields = ["name", "prefix"]
    fields = ["name", "tier", "owner", "active", "expires"]
    change_fields = ["prefix", *fields, "created", "last_used_at"]
    raw_id_fields = ["owner"]
    actions = ["revoke", "reset_buckets"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else ["prefix", "created", "last_used_at"]

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        # One backend round trip for the page's keys, not one per row.
        changelist = super().get_changelist_instance(request)
        _attach_live_use(changelist.result_list)
        return changelist

    @admin.display(description=_("last used"))
    def last_used_at(self, obj: ApiKey) -> Any:
        """The backend's live time (recorded with the usage counts, see
        ``lua/usage.lua``), else the column the rollup copied it to."""
        if not hasattr(obj, "throttle_live_last_used"):
            _attach_live_use([obj])
        live = obj.throttle_live_last_used  # type: ignore[attr-defined]
        stored = obj.last_used
        newest = max((t for t in (live, stored) if t is not None), default=None)
        return newest if newest is not None else _("never (since the last rollup)")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.fields if obj is None else self.change_fields

    def get_autocomplete_fields(self, request: HttpRequest) -> list[str]:
        owner_model = self.model._meta.get_field("owner").related_model
        return ["owner"] if _searchable(self.admin_site, owner_model) else []

    def save_model(self, request: HttpRequest, obj: ApiKey, form: ModelForm, change: bool) -> None:  # type: ignore[type-arg]
        if change:
            super().save_model(request, obj, form, change)
            return
        full_key = obj.set_new_key()
        super().save_model(request, obj, form, change)
        messages.warning(
            request,
            format_html(
                "{} <code>{}</code>",
                _("The new API key is shown only this once; copy it now:"),
                full_key,
            ),
        )

    @admin.action(description=_("Revoke selected API keys"), permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        # One save per key: each is logged in the admin history (worded as the change form
        # words it: the field's label) and bumps the policy.
        label = str(capfirst(ApiKey._meta.get_field("active").verbose_name))
        revoked = 0
        for api_key in queryset.filter(active=True):
            api_key.active = False
            api_key.save(update_fields=["active"], using=router.db_for_write(ApiKey))
            self.log_change(request, api_key, [{"changed": {"fields": [label]}}])
            revoked += 1
        self.message_user(request, _("%(count)d API key(s) revoked.") % {"count": revoked})

    @admin.action(
        description=_("Reset the rate limit buckets of selected API keys"), permissions=["change"]
    )
    def reset_buckets(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> Any:
        """Ask first (an intermediate page listing the keys), then clear each key's buckets,
        recorded in the admin history."""
        from django.contrib.admin import helpers
        from django.template.response import TemplateResponse

        from django_throttle.admin.views import log_reset
        from django_throttle.identity import Identity
        from django_throttle.inspection.clients import Subject, reset

        keys = list(queryset.select_related("tier"))
        if request.POST.get("post") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": _("Reset the rate limit buckets of these API keys?"),
                "opts": self.model._meta,
                "keys": keys,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "action": "reset_buckets",
            }
            return TemplateResponse(
                request, "admin/django_throttle/apikey/reset_buckets.html", context
            )
        count = 0
        for api_key in keys:
            subject = Subject(
                Identity("key", api_key.prefix),
                f"API key {api_key.prefix} ({api_key.name})",
                api_key=api_key,
            )
            try:
                limits = reset(subject)
            except BackendError as exc:
                self.message_user(
                    request,
                    _("The backend could not reset: %(error)s") % {"error": exc},
                    messages.ERROR,
                )
                return None
            log_reset(request, subject, limits)
            count += 1
        self.message_user(
            request, _("Reset the buckets of %(count)d API key(s).") % {"count": count}
        )
        return None


def _attach_live_use(keys: Iterable[ApiKey]) -> None:
    """Set ``throttle_live_last_used`` on each key from the backend's usage store (``None`` when it
    has none, keeps none, or cannot answer: the page falls back to the stored column, never
    an error)."""
    keys = list(keys)
    seen: dict[str, int] = {}
    if keys:
        try:
            store = usage.get_store()
            try:
                seen = store.keys_last_used([key.prefix for key in keys])
            finally:
                store.close()
        except (BackendError, usage.UsageUnavailable):
            seen = {}
    for key in keys:
        second = seen.get(key.prefix)
        live = None if second is None else datetime.fromtimestamp(second, tz=UTC)
        if live is not None and not settings.USE_TZ:
            live = timezone.make_naive(live)
        key.throttle_live_last_used = live  # type: ignore[attr-defined]


class HadDenialsFilter(admin.SimpleListFilter):
    title = _("denials")
    parameter_name = "denied"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("some denied")), ("no", _("none denied"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(denied__gt=0)
        if self.value() == "no":
            return queryset.filter(denied=0)
        return queryset


class UsageKindFilter(admin.SimpleListFilter):
    """Tier x endpoint totals (exact) apart from per-client rows (the heaviest clients)."""

    title = _("rows")
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("totals", _("tier and endpoint totals")), ("clients", _("per client"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "totals":
            return queryset.filter(client=UsageCount.ALL)
        if self.value() == "clients":
            return queryset.exclude(client=UsageCount.ALL)
        return queryset


@admin.register(UsageCount)
class UsageCountAdmin(_AppAdmin):
    """Read-only: ``manage.py throttle_usage --rollup`` writes these rows from the backend's
    counts; people only read (or delete) them. ``*`` stands for every client (a total row)
    or every tier and endpoint (a per-client row)."""

    list_display = [
        "window_start",
        "client_link",
        "tier",
        "endpoint",
        "allowed",
        "denied",
        "shadow_denied",
        "failed",
    ]
    list_filter = [UsageKindFilter, HadDenialsFilter, "tier", "endpoint"]
    search_fields = ["client", "endpoint"]
    date_hierarchy = "window_start"
    # Counting a large usage table for the "N total" link is slow; it is not needed here.
    show_full_result_count = False
    change_list_template = "admin/django_throttle/usagecount/change_list.html"

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        # Two queries for the page's users and keys, not one per row.
        changelist = super().get_changelist_instance(request)
        attach_client_links(self.admin_site, changelist.result_list)
        return changelist

    @admin.display(description=pgettext_lazy("admin list", "client"), ordering="client")
    def client_link(self, obj: UsageCount) -> str:
        """A user or API key by name, linked to its admin page; other clients as recorded."""
        name, url = getattr(obj, "throttle_client_link", (None, None))
        if name is None:
            return obj.client
        if url is None:
            return format_html("{} <small>({})</small>", name, obj.client)
        return format_html('<a href="{}">{}</a> <small>({})</small>', url, name, obj.client)

    @admin.display(description=_("failed open / closed"))
    def failed(self, obj: UsageCount) -> str:
        """Requests the backend could not count, served (open) and refused (closed): one
        column, so the list keeps to the window's width."""
        return f"{obj.failed_open} / {obj.failed_closed}"

    def get_urls(self) -> list[Any]:
        """The dashboard and the inspector live under the usage list (see admin_views)."""
        from django.urls import path

        from django_throttle.admin import views as admin_views

        name = f"{self.opts.app_label}_{self.opts.model_name}"
        pages = {
            "dashboard": admin_views.dashboard,
            "inspect": admin_views.inspector,
            "inspect/reset": admin_views.reset_client,
        }
        return [
            *(
                path(
                    f"{page}/",
                    self.admin_site.admin_view(partial(view, model_admin=self)),
                    name=f"{name}_{page.replace('/', '_')}",
                )
                for page, view in pages.items()
            ),
            *super().get_urls(),
        ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
