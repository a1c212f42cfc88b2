"""What every ModelAdmin of the app shares: the base class (the app's stylesheet, autocomplete
where it can search, the operator pages' frame), list columns in a word, the "problems" column
(a row the policy compiler would skip, and why), the warnings shown after a save, and the limit
inline the tier and rule pages extend.

It registers nothing: the modules beside it register one model's admin each.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from django_throttle.admin.forms import LimitForm

# What a list shows in a column, in a word, by stored value (the choices of
# :mod:`django_throttle.models`); a value written around the admin is shown as it is. The change
# pages keep the long explanations; a list repeats a value on every row, so there it is one
# word, and the list keeps to the window's width. The context "admin list" keeps these words
# ("open", "all") translated apart from the same words elsewhere.
FAILURE_MODES: dict[str, Any] = {
    "": pgettext_lazy("admin list", "inherit"),
    "open": pgettext_lazy("admin list", "open"),
    "closed": pgettext_lazy("admin list", "closed"),
    "local": pgettext_lazy("admin list", "local"),
}
COUNTS: dict[str, Any] = {
    "all": pgettext_lazy("admin list", "all"),
    "success": pgettext_lazy("admin list", "successes"),
    "failures": pgettext_lazy("admin list", "failures"),
}
MATCH_TYPES: dict[str, Any] = {
    "scope": pgettext_lazy("admin list", "scope"),
    "route": pgettext_lazy("admin list", "route"),
    "path": pgettext_lazy("admin list", "path"),
}


def stored_time(second: float) -> datetime:
    """A Unix time as the database holds datetimes (aware UTC under USE_TZ, else naive in
    the current time zone)."""
    value = datetime.fromtimestamp(second, tz=UTC)
    return value if settings.USE_TZ else timezone.make_naive(value)


class AppAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Every page of the app's models loads its stylesheet and ``long_words.js``, which keep
    each page within a 1,280 px window whatever the data (long tokens wrap, ordinary words stay
    whole, limit rows stay narrow).

    The related rows in ``raw_id_fields`` get autocomplete where their model's admin can
    search, raw ids otherwise (a project with a custom user model may not register one, and
    autocomplete without it fails a system check)."""

    class Media:
        css = {"all": ["django_throttle/admin.css"]}
        js = ["django_throttle/long_words.js"]

    def get_autocomplete_fields(self, request: HttpRequest) -> list[str]:
        site, searchable = self.admin_site, []
        for name in self.raw_id_fields:
            model: Any = self.opts.get_field(name).related_model
            if site.is_registered(model) and site.get_model_admin(model).search_fields:
                searchable.append(name)
        return searchable

    def render_page(
        self, request: HttpRequest, template: str, title: str | Promise, **context: Any
    ) -> TemplateResponse:
        """One of the app's own pages (``admin/django_throttle/<template>.html``) in the admin's
        frame: the site's context (``each_context``: header, sidebar), the title, and this
        model's options for the breadcrumbs."""
        context.update(self.admin_site.each_context(request), title=title, opts=self.opts)
        return TemplateResponse(request, f"admin/django_throttle/{template}.html", context)


class LimitedAdmin(AppAdmin):
    """The pages of a row with limits inline (a tier, an endpoint rule): the "problems" and
    failure-mode columns, and the warnings the forms leave (see
    :class:`~django_throttle.admin.forms.TierLimitFormSet`), shown once the change is saved."""

    @admin.display(description=_("failure mode"), ordering="failure_mode")
    def failure_mode_word(self, obj: Any) -> str:
        return str(FAILURE_MODES.get(obj.failure_mode, obj.failure_mode))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).prefetch_related("limits")

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        for source in (form, *formsets):
            for warning in getattr(source, "warnings", ()):
                messages.warning(request, warning)

    @admin.display(description=_("problems"))
    def problems(self, obj: Any) -> SafeString:
        """The row's and its limits' problems, as the policy compiler would log them; empty
        when all are fine."""
        found = [
            (str(type(row)._meta.verbose_name), row.pk, field, reason)
            for row in [obj, *obj.limits.all()]
            for field, reason in row.row_problems().items()
        ]
        if not found:
            return mark_safe("")
        return format_html(
            '<ul class="errorlist" title="{}">{}</ul>',
            _("skipped by the throttle policy until corrected"),
            format_html_join("", "<li>{} {}: {}: {}</li>", found),
        )


class LimitInline(admin.TabularInline):  # type: ignore[type-arg]
    """A limit row: rate and algorithm, then the burst (bucket algorithms) or the time zone
    (calendar quota); ``limit_fields.js`` hides what the chosen algorithm does not use."""

    form = LimitForm
    fields = ["rate", "algorithm", "burst", "timezone"]
    extra = 1

    class Media:
        js = ["django_throttle/limit_fields.js"]
