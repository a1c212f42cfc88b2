"""The read-only usage list (rows ``manage.py throttle_usage --rollup`` writes), its filters,
the client column linked to the user or key, and the dashboard and inspector pages mounted
under it (:mod:`django_throttle.admin.views`). Registers ``UsageCount``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.urls import path
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from django_throttle.admin import views
from django_throttle.admin.base import _AppAdmin
from django_throttle.models import UsageCount
from django_throttle.usage.names import client_names

__all__ = ["HadDenialsFilter", "UsageCountAdmin", "UsageKindFilter"]


class _ChoiceFilter(admin.SimpleListFilter):
    """A filter whose choices are a table: value → (label, the rows it keeps)."""

    options: dict[str, tuple[Any, Q]]

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(value, label) for value, (label, _rows) in self.options.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        choice = self.options.get(self.value() or "")
        return queryset if choice is None else queryset.filter(choice[1])


class HadDenialsFilter(_ChoiceFilter):
    title = _("denials")
    parameter_name = "denied"
    options = {"yes": (_("some denied"), Q(denied__gt=0)), "no": (_("none denied"), Q(denied=0))}


class UsageKindFilter(_ChoiceFilter):
    """Tier x endpoint totals (exact) apart from per-client rows (the heaviest clients)."""

    title = _("rows")
    parameter_name = "kind"
    options = {
        "totals": (_("tier and endpoint totals"), Q(client=UsageCount.ALL)),
        "clients": (_("per client"), ~Q(client=UsageCount.ALL)),
    }


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
        # Who the page's clients are: one query per kind of client, not one per row.
        changelist = super().get_changelist_instance(request)
        names = client_names(row.client for row in changelist.result_list)
        for row in changelist.result_list:
            row.throttle_client_name = names[row.client]
        return changelist

    @admin.display(description=pgettext_lazy("admin list", "client"), ordering="client")
    def client_link(self, obj: UsageCount) -> str:
        """A user or API key by name, linked to its admin page; other clients as recorded."""
        found = getattr(obj, "throttle_client_name", None)
        if found is None or not found.name:
            return obj.client
        name = (
            format_html('<a href="{}">{}</a>', found.url, found.name) if found.url else found.name
        )
        return format_html("{} <small>({})</small>", name, obj.client)

    @admin.display(description=_("failed open / closed"))
    def failed(self, obj: UsageCount) -> str:
        """Requests the backend could not count, served (open) and refused (closed): one
        column, so the list keeps to the window's width."""
        return f"{obj.failed_open} / {obj.failed_closed}"

    def get_urls(self) -> list[Any]:
        """The dashboard and the inspector live under the usage list (see
        :mod:`~django_throttle.admin.views`)."""

        def page(route: str, view: Any) -> Any:
            name = f"django_throttle_usagecount_{route.replace('/', '_')}"
            return path(
                f"{route}/", self.admin_site.admin_view(partial(view, model_admin=self)), name=name
            )

        own = [
            page("dashboard", views.dashboard),
            page("inspect", views.inspector),
            page("inspect/reset", views.reset_client),
        ]
        return [*own, *super().get_urls()]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
