"""The pages of the rows the policy is compiled from: tiers and their limits inline (the shared
flag too), endpoint rules with their limits per tier inline (and what each is counted by), tier
assignments and exemptions (rows naming one user or one group; exempt users, groups and
networks are compiled into the policy), and API keys. Registers ``Tier``, ``EndpointRule``,
``TierAssignment``, ``Exemption`` and ``ApiKey``.

An API key's page shows the full key once after adding it and "last used" read live from the
usage store (one backend round trip per page); the revoke and reset-buckets actions are both
recorded in the admin history.
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
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import format_html
from django.utils.text import capfirst
from django.utils.translation import gettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from django_throttle import models
from django_throttle.admin.base import (
    COUNTS,
    MATCH_TYPES,
    AppAdmin,
    EndpointLimitFormSet,
    EndpointRuleForm,
    LimitedAdmin,
    LimitInline,
    TierLimitFormSet,
    stored_time,
)
from django_throttle.admin.views import backend_failed, log_reset
from django_throttle.backends import BackendError, get_backend
from django_throttle.backends.adaptive_store import AdaptiveStore
from django_throttle.identity import Identity
from django_throttle.inspection.clients import reset
from django_throttle.inspection.subjects import Subject
from django_throttle.models import ApiKey
from django_throttle.models.fields import FailureMode
from django_throttle.policy.scaling import effective_factor
from django_throttle.usage import accounting as usage


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
        "load_factor",
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
        "load_factor",
        "min_factor",
        "automatic_factor",
    ]
    readonly_fields = ["automatic_factor"]

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

    @admin.display(description=_("automatic factor"))
    def automatic_factor(self, obj: models.Tier) -> str:
        """The adaptive controller's factor now (one backend read), and what the limits are
        scaled by with the load factor."""
        if obj.pk is None:
            return "100%"
        store = AdaptiveStore.of(get_backend())
        if store is None:
            return str(_("none (the backend keeps no shared state)"))
        try:
            automatic = store.factors().get(obj.pk, 1.0)
        except BackendError:
            return str(_("unknown: the backend did not answer"))
        if obj.factor_problems():
            return f"{automatic:.0%}"
        effective = effective_factor(obj.load_factor, obj.min_factor, automatic)
        text = _("%(automatic)s (limits at %(effective)s; manage.py throttle_adapt moves it)")
        return str(text) % {"automatic": f"{automatic:.0%}", "effective": f"{effective:.0%}"}

    @admin.display(description=_("limits"))
    def limits_summary(self, obj: models.Tier) -> str:
        return ", ".join(str(limit) for limit in obj.limits.all()) or str(_("unlimited"))

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """What deleting ``objs`` deletes (Django's list), and on the confirmation page (of the
        delete page and of the "delete selected" action) a warning for each client left with
        no limit: clients with no tier are not limited, so deleting a default tier (or the tier
        of assigned users when no default for authenticated users remains) switches limiting
        off for them, which the list of rows deleted does not say."""
        if request.POST.get("post") is None:  # the confirmation, not the deletion
            for text in deletion_warnings(list(objs)):
                messages.warning(request, text)
        return super().get_deleted_objects(objs, request)


def deletion_warnings(tiers: list[models.Tier]) -> list[str]:
    """What deleting ``tiers`` does to clients beyond the rows it deletes, in words."""
    gone = {tier.pk for tier in tiers}
    remaining = models.Tier.objects.exclude(pk__in=gone)
    default = remaining.filter(is_default_authenticated=True).first()
    texts = []
    for tier in tiers:
        values = {"tier": tier.name}
        if tier.is_default_anonymous:
            texts.append(
                gettext(
                    "Tier “%(tier)s” is the default tier for anonymous clients: without it they "
                    "are not limited at all, until another tier is made their default."
                )
                % values
            )
        if tier.is_default_authenticated:
            texts.append(
                gettext(
                    "Tier “%(tier)s” is the default tier for authenticated users: without it, "
                    "users in no other tier are not limited at all, until another tier is made "
                    "their default."
                )
                % values
            )
        assigned = tier.assignments.count()
        if assigned and default is not None:
            texts.append(
                gettext(
                    "The users and groups assigned to tier “%(tier)s” (%(count)d) are moved to "
                    "the default tier for authenticated users, “%(default)s”."
                )
                % (values | {"count": assigned, "default": default.name})
            )
        elif assigned:
            texts.append(
                gettext(
                    "The users and groups assigned to tier “%(tier)s” (%(count)d) are not "
                    "limited at all once it is deleted: no other tier is the default for "
                    "authenticated users."
                )
                % (values | {"count": assigned})
            )
    return texts


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
    list_filter = ["match_type", "counts", "enabled", "shadow", "failure_mode", "criticality"]
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
        "criticality",
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


@admin.register(models.Protection)
class ProtectionAdmin(AppAdmin):
    """The one row of service protection (the fleet's load shedder), edited in place: the
    list goes straight to it, and a second row cannot be added."""

    fieldsets = [
        (None, {"fields": ["enabled", "default_share", "sheddable_share"]}),
        (_("The fleet (every worker, counted in Redis)"), {"fields": ["in_flight", "lease"]}),
        (
            _("Each worker on its own (no Redis call)"),
            {"fields": ["worker_capacity", "worker_lag_ms"]},
        ),
    ]
    list_display = ["__str__", "enabled", "in_flight", "worker_capacity", "worker_lag_ms"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and not models.Protection.objects.exists()

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        row = models.Protection.objects.order_by("pk").first()
        if row is not None and self.has_view_permission(request, row):
            return redirect(reverse("admin:django_throttle_protection_change", args=[row.pk]))
        return super().changelist_view(request, extra_context)


# API keys.


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
        unread = obj.throttle_live_unread  # type: ignore[attr-defined]
        if newest is None:
            # With Redis down, a use since the last rollup cannot be ruled out: never "never".
            if unread:
                return _("unknown: Redis is unavailable (none before the last rollup)")
            return _("never (since the last rollup)")
        # Written as the admin writes "created" on the same page and in the list (a read-only
        # callable's value would otherwise be printed in ISO form on the change page).
        if settings.USE_TZ and timezone.is_aware(newest):
            newest = timezone.localtime(newest)
        if unread:
            return _("%(time)s or later: Redis is unavailable") % {"time": formats.localize(newest)}
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
        cleared = 0
        for api_key in keys:
            label = f"API key {api_key.prefix} ({api_key.name})"
            subject = Subject(Identity("key", api_key.prefix), label, api_key=api_key)
            try:
                limits = reset(subject)
            except BackendError as exc:
                self.message_user(request, backend_failed(request, exc), messages.ERROR)
                return None
            log_reset(request, subject, limits)
            cleared += len(limits)
        if cleared:
            message = _("Cleared %(cleared)d counter(s) of %(count)d API key(s).")
        else:
            message = _("Nothing to reset: no counter of these %(count)d API key(s) held anything.")
        self.message_user(request, message % {"cleared": cleared, "count": len(keys)})
        return None


def _attach_live_use(keys: Iterable[ApiKey]) -> None:
    """Set ``throttle_last_used`` on each key: the later of the backend's live time (none when
    its usage store has none, keeps none, or cannot answer: never an error) and the stored
    column, ``None`` when neither has one."""
    keys = list(keys)
    seen: dict[str, int] = {}
    unread = False  # the backend could not answer: a use since the last rollup is unknown
    if keys:
        try:
            with suppress(usage.UsageUnavailable), closing(usage.get_store()) as store:
                seen = store.keys_last_used([key.prefix for key in keys])
        except BackendError:
            unread = True
    for key in keys:
        live = None if key.prefix not in seen else stored_time(seen[key.prefix])
        known = [time for time in (live, key.last_used) if time is not None]
        key.throttle_last_used = max(known, default=None)  # type: ignore[attr-defined]
        key.throttle_live_unread = unread  # type: ignore[attr-defined]
