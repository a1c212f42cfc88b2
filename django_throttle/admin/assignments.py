"""The rows naming one user or one group: tier assignments and exemptions (exempt users,
groups and networks are compiled into the policy). Registers ``TierAssignment`` and
``Exemption``.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from django_throttle.admin.base import _AppAdmin, _searchable
from django_throttle.models import Exemption, TierAssignment

__all__ = ["ExemptionAdmin", "TierAssignmentAdmin"]


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
