"""The read-only usage list (rows ``manage.py throttle_usage --rollup`` writes), its filters,
the client column linked to the user or key, and the dashboard and inspector pages mounted
under it (:mod:`django_throttle.admin.views`). Registers ``UsageCount``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from django_throttle.admin.base import _AppAdmin
from django_throttle.admin.columns import attach_client_links
from django_throttle.models import UsageCount

__all__ = ["HadDenialsFilter", "UsageCountAdmin", "UsageKindFilter"]


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
