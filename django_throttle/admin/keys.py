"""The API key pages: the full key shown once after adding it, "last used" read live from the
usage store (one backend round trip per page), and the revoke and reset-buckets actions, both
recorded in the admin history. Registers ``ApiKey``.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import closing, suppress
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import formats, timezone
from django.utils.html import format_html
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _

from django_throttle.admin.base import AppAdmin, stored_time
from django_throttle.admin.views import backend_failed, log_reset
from django_throttle.backends import BackendError
from django_throttle.identity import Identity
from django_throttle.inspection.resets import reset
from django_throttle.inspection.subjects import Subject
from django_throttle.models import ApiKey
from django_throttle.usage import accounting as usage


@admin.register(ApiKey)
class ApiKeyAdmin(AppAdmin):
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
    readonly_fields = ["prefix", "created", "last_used_at"]
    raw_id_fields = ["owner"]
    actions = ["revoke", "reset_buckets"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.fields if obj is None else ["prefix", *self.fields, "created", "last_used_at"]

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        # One backend round trip for the page's keys, not one per row.
        changelist = super().get_changelist_instance(request)
        _attach_live_use(changelist.result_list)
        return changelist

    @admin.display(description=_("last used"))
    def last_used_at(self, obj: ApiKey) -> Any:
        """The later of the backend's live time (recorded with the usage counts, see
        ``lua/usage.lua``) and the column the rollup copied it to."""
        if not hasattr(obj, "throttle_last_used"):
            _attach_live_use([obj])
        newest = obj.throttle_last_used  # type: ignore[attr-defined]
        if newest is None:
            return _("never (since the last rollup)")
        # Written as the admin writes "created" on the same page and in the list (a read-only
        # callable's value would otherwise be printed in ISO form on the change page).
        if settings.USE_TZ and timezone.is_aware(newest):
            newest = timezone.localtime(newest)
        return formats.localize(newest)

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        full_key = None if change else obj.set_new_key()
        super().save_model(request, obj, form, change)
        if full_key is not None:
            shown_once = _("The new API key is shown only this once; copy it now:")
            messages.warning(request, format_html("{} <code>{}</code>", shown_once, full_key))

    @admin.action(description=_("Revoke selected API keys"), permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        # One save per key: each is logged in the admin history (worded as the change form
        # words it: the field's label) and bumps the policy.
        label = str(capfirst(ApiKey._meta.get_field("active").verbose_name))
        revoked = list(queryset.filter(active=True))
        for api_key in revoked:
            api_key.active = False
            api_key.save(update_fields=["active"])  # on the router's database for writes
            self.log_change(request, api_key, [{"changed": {"fields": [label]}}])
        self.message_user(request, _("%(count)d API key(s) revoked.") % {"count": len(revoked)})

    @admin.action(
        description=_("Reset the rate limit buckets of selected API keys"), permissions=["change"]
    )
    def reset_buckets(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> Any:
        """Ask first (an intermediate page listing the keys), then clear each key's buckets,
        recorded in the admin history."""
        keys = list(queryset.select_related("tier"))
        if request.POST.get("post") != "yes":
            return self.render_page(
                request,
                "apikey/reset_buckets",
                _("Reset the rate limit buckets of these API keys?"),
                keys=keys,
                action_checkbox_name=helpers.ACTION_CHECKBOX_NAME,
                action="reset_buckets",
            )
        for api_key in keys:
            label = f"API key {api_key.prefix} ({api_key.name})"
            subject = Subject(Identity("key", api_key.prefix), label, api_key=api_key)
            try:
                limits = reset(subject)
            except BackendError as exc:
                self.message_user(request, backend_failed(request, exc), messages.ERROR)
                return None
            log_reset(request, subject, limits)
        message = _("Reset the buckets of %(count)d API key(s).") % {"count": len(keys)}
        self.message_user(request, message)
        return None


def _attach_live_use(keys: Iterable[ApiKey]) -> None:
    """Set ``throttle_last_used`` on each key: the later of the backend's live time (none when
    its usage store has none, keeps none, or cannot answer: never an error) and the stored
    column, ``None`` when neither has one."""
    keys = list(keys)
    seen: dict[str, int] = {}
    if keys:
        with suppress(BackendError, usage.UsageUnavailable), closing(usage.get_store()) as store:
            seen = store.keys_last_used([key.prefix for key in keys])
    for key in keys:
        live = None if key.prefix not in seen else stored_time(seen[key.prefix])
        known = [time for time in (live, key.last_used) if time is not None]
        key.throttle_last_used = max(known, default=None)  # type: ignore[attr-defined]
