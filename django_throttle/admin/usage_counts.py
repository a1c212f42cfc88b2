"""The read-only usage list, its filters, the client column (what the client is, in words,
linked to the user or key), and the dashboard and inspector pages mounted under it
(:mod:`django_throttle.admin.views`). Registers ``UsageCount``.

The list copies what the backend holds before it lists (:func:`roll_up_if_due`: the rollup
``manage.py throttle_usage --rollup`` runs, at most once per :data:`ROLLUP_EVERY` seconds per
process and for at most :data:`ROLLUP_BUDGET` seconds), so it fills without a cron job; when
the backend cannot be read the page still shows what was copied, and says so.

Tier and endpoint totals (exact) and per-client rows (the heaviest clients) are two lists,
chosen by the "rows" filter: neither shows the other's ``*`` cells. The per-client list says
when the minutes it shows may hold estimates (a top list was full).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.translation import gettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from django_throttle.admin import views
from django_throttle.admin.base import AppAdmin
from django_throttle.backends import BackendError, usage_store
from django_throttle.backends.redis_nodes import get_breaker
from django_throttle.models import UsageCount
from django_throttle.redaction import plain_text
from django_throttle.usage import accounting
from django_throttle.usage.names import client_names, describe
from django_throttle.usage.reports import NO_ENDPOINT, NO_TIER, estimated_minutes, rollup

#: Seconds between two rollups the usage list runs in one process: opening the list again
#: and again costs the backend nothing more.
ROLLUP_EVERY = 30.0
#: Seconds after which one page view starts no more of the copy's reads (the chunk of minutes
#: in flight ends): the first view after a long quiet copies the rest over the next views.
ROLLUP_BUDGET = 2.0


class _LastRollup:
    """When this process last rolled up (``time.monotonic``), and what went wrong then."""

    lock = threading.Lock()
    at: float | None = None
    error: str = ""


def roll_up_if_due() -> str:
    """Copy the backend's finished minutes to the database (:func:`~django_throttle.usage.
    reports.rollup`) unless this process did within :data:`ROLLUP_EVERY` seconds or another
    thread is at it; through the circuit breaker, starting no read after
    :data:`ROLLUP_BUDGET` seconds (a Redis that answers each read slowly costs the view the
    budget and the reads in flight, not a delay per minute it holds). Returns why the live
    counts could not be read, or not all of them (``""``: they were, or need not be yet).
    Never raises for a backend that is down or keeps no counts: the list still renders."""
    if not _LastRollup.lock.acquire(blocking=False):
        return _LastRollup.error
    try:
        now = time.monotonic()
        if _LastRollup.at is not None and now - _LastRollup.at < ROLLUP_EVERY:
            return _LastRollup.error
        _LastRollup.at, _LastRollup.error = now, ""
        try:
            store = accounting.get_store()
        except accounting.UsageUnavailable as exc:
            _LastRollup.error = plain_text(str(exc))
            return _LastRollup.error
        try:
            done = get_breaker().call(rollup, store, deadline=now + ROLLUP_BUDGET)
        except BackendError as exc:
            _LastRollup.error = plain_text(f"{type(exc).__name__}: {exc}")
        else:
            if done.left:  # a slow backend, or a long backlog: later views copy the rest
                _LastRollup.error = gettext(
                    "copying stopped after %(seconds).1f s, %(left)d minute(s) not copied yet"
                ) % {"seconds": time.monotonic() - now, "left": done.left}
        finally:
            store.close()
        return _LastRollup.error
    finally:
        _LastRollup.lock.release()


def forget_rollup() -> None:
    """Roll up on the next view (tests; a backend change)."""
    with _LastRollup.lock:
        _LastRollup.at, _LastRollup.error = None, ""


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
    """Tier x endpoint totals (exact) apart from per-client rows (the heaviest clients):
    always one or the other (totals unless asked), never both in one list."""

    title = _("rows")
    parameter_name = "kind"
    TOTALS, CLIENTS = "totals", "clients"
    options = {
        TOTALS: (_("tier and endpoint totals"), Q(client=UsageCount.ALL)),
        CLIENTS: (_("per client"), ~Q(client=UsageCount.ALL)),
    }

    def value(self) -> str:
        chosen = super().value()
        return chosen if chosen in self.options else self.TOTALS

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(self.options[self.value()][1])

    def choices(self, changelist: Any) -> Any:
        """The two lists, no "All": a total and a client row have different columns."""
        for value, label in self.lookup_choices:
            yield {
                "selected": self.value() == value,
                "query_string": changelist.get_query_string({self.parameter_name: value}),
                "display": label,
            }


def _kind(request: HttpRequest) -> str:
    """Which list the request shows: :class:`UsageKindFilter`'s value."""
    chosen = request.GET.get(UsageKindFilter.parameter_name, "")
    return chosen if chosen in UsageKindFilter.options else UsageKindFilter.TOTALS


def _estimated(starts: Any) -> bool:
    """Whether the per-client rows of the minutes beginning at ``starts`` (those a page
    shows) may be estimates: a top list was full (:func:`~django_throttle.usage.reports.
    estimated_minutes`); ``False`` for a backend that keeps no usage counts."""
    try:
        return estimated_minutes(starts)
    except accounting.UsageUnavailable:
        return False


@admin.register(UsageCount)
class UsageCountAdmin(AppAdmin):
    """Read-only: the rollup writes these rows from the backend's counts (on opening the
    list, see :func:`roll_up_if_due`, or ``manage.py throttle_usage --rollup``); people only
    read (or delete) them. Two lists: tier and endpoint totals, and per-client rows with
    each client in words."""

    TOTAL_COLUMNS = ["window_start", "tier_name", "endpoint_name"]
    CLIENT_COLUMNS = ["window_start", "client_link"]
    COUNTS = ["allowed", "denied", "shadow_denied", "failed"]
    list_display = [*TOTAL_COLUMNS, *COUNTS]
    list_filter = [UsageKindFilter, HadDenialsFilter, "tier", "endpoint"]
    search_fields = ["client", "endpoint"]
    date_hierarchy = "window_start"
    # Counting a large usage table for the "N total" link is slow; it is not needed here.
    show_full_result_count = False
    change_list_template = "admin/django_throttle/usagecount/change_list.html"

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> Any:
        """Roll up what the backend holds (at most every :data:`ROLLUP_EVERY` seconds), then
        list; when the backend cannot be read, say so above the rows already copied."""
        if self.has_view_permission(request):
            error = roll_up_if_due()
            if error:
                messages.warning(
                    request,
                    gettext(
                        "The live counts could not be read (%s): the list shows what was "
                        "copied before."
                    )
                    % error,
                )
        context = {
            "throttle_rollup_every": int(ROLLUP_EVERY),
            "throttle_kind": _kind(request),
            "throttle_kept_hours": usage_store.USAGE_TTL // 3600,
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def get_list_display(self, request: HttpRequest) -> list[str | Callable[[Any], str | bool]]:
        if _kind(request) == UsageKindFilter.CLIENTS:
            return [*self.CLIENT_COLUMNS, *self.COUNTS]
        return [*self.TOTAL_COLUMNS, *self.COUNTS, "delays"]

    def get_list_filter(self, request: HttpRequest) -> list[Any]:
        if _kind(request) == UsageKindFilter.CLIENTS:
            return [UsageKindFilter, HadDenialsFilter]
        return list(self.list_filter)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        # Who the page's clients are: one query per kind of client, not one per row.
        changelist: Any = super().get_changelist_instance(request)
        names = client_names(row.client for row in changelist.result_list)
        for row in changelist.result_list:
            row.throttle_client_name = names[row.client]
        changelist.throttle_estimated = _kind(request) == UsageKindFilter.CLIENTS and _estimated(
            row.window_start for row in changelist.result_list
        )
        return changelist

    @admin.display(description=pgettext_lazy("admin list", "client"), ordering="client")
    def client_link(self, obj: UsageCount) -> str:
        """What the client is, in words ("User alice", "Address 203.0.113.7"), linked to
        the user's or key's admin page, with a link to inspect it; the label as recorded in
        the tooltip."""
        found = getattr(obj, "throttle_client_name", None)
        words = found.words if found is not None else describe(obj.client)
        label = plain_text(obj.client)
        url = found.url if found is not None else ""
        name = format_html('<a href="{}">{}</a>', url, words) if url else words
        inspect = reverse("admin:django_throttle_usagecount_inspect")
        return format_html(
            '<span title="{}">{}</span> <a class="dt-inspect" href="{}?{}">{}</a>',
            label,
            name,
            inspect,
            urlencode({"client": label}),
            gettext("inspect"),
        )

    @admin.display(description=_("tier"), ordering="tier")
    def tier_name(self, obj: UsageCount) -> str:
        if obj.tier == accounting.BEFORE_AUTHENTICATION:
            return gettext("checks before authentication")
        return obj.tier or NO_TIER

    @admin.display(description=_("endpoint"), ordering="endpoint")
    def endpoint_name(self, obj: UsageCount) -> str:
        return obj.endpoint or NO_ENDPOINT

    @admin.display(description=_("failed open / closed"))
    def failed(self, obj: UsageCount) -> str:
        """Requests the backend could not count, served (open) and refused (closed): one
        column, so the list keeps to the window's width."""
        return f"{obj.failed_open} / {obj.failed_closed}"

    @admin.display(description=_("delayed (wait) / shed"), ordering="delayed")
    def delays(self, obj: UsageCount) -> str:
        """Of the allowed, those served after waiting their turn (a delaying limit) and their
        mean wait; of the denied, those shed (503, to protect the service). A dash for none:
        one column, so the list keeps to the window's width."""
        delayed = "-"
        if obj.delayed:
            delayed = f"{obj.delayed} ({obj.waited_ms / 1000 / obj.delayed:.2f} s)"
        return f"{delayed} / {obj.shed or '-'}"

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
