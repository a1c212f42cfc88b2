"""What every ModelAdmin of the app shares: the base class (the app's stylesheet, autocomplete
where it can search, the operator pages' frame), list columns in a word, the "problems" column
(a row the policy compiler would skip, and why), the warnings shown after a save, the limit
inline the tier and rule pages extend, and the forms of limits and rules.

The forms check what a single row cannot: a limit written twice, and a request's cost against
the capacity of every limit it would meet. No limit admits more than its capacity at once (a
bucket's burst, a window's count), so a request costing more than some limit's capacity would
be denied forever. A rule's own limit that cannot hold the rule's cost is certain to deny: an
error on the field to change. A tier-wide limit below some rule's cost only matters if the
tier's clients can reach that endpoint, which the admin cannot know: a warning (``warnings``,
shown after saving). A row that is invalid on its own (bad rate, burst out of range) already
has its error; it is not checked against costs as well, so every mistake gets exactly one
message.

It registers nothing: the modules beside it register the models' admins.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.widgets import AutocompleteSelect
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.validators import MinValueValidator
from django.db import IntegrityError, models
from django.db.models import QuerySet, UniqueConstraint
from django.forms.models import InlineForeignKeyField
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from django_throttle import signals
from django_throttle.models import EndpointRule, TierLimit
from django_throttle.models.fields import BadRow
from django_throttle.models.limits import ALGORITHM_FIELDS, ALGORITHM_HELP
from django_throttle.rates import (
    WINDOW_ALGORITHMS,
    Algorithm,
    canonical_rate,
    plain_digits,
)

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


#: Django's positive integer columns (the form field they make refuses values below 0).
POSITIVE_FIELDS = (
    models.PositiveBigIntegerField,
    models.PositiveIntegerField,
    models.PositiveSmallIntegerField,
)


class PlainIntegerField(forms.IntegerField):
    """Django's whole-number field, reading only the digits 0-9, as the rate beside it does
    (:func:`~django_throttle.rates.plain_digits`): ``int()`` alone would save a burst written
    in Arabic-Indic or full-width digits, or ``"1_0"``, as 10, where the rate written so is
    refused. Django's own "Enter a whole number." is the error."""

    def to_python(self, value: Any) -> int | None:
        if isinstance(value, str) and not plain_digits(value):
            raise ValidationError(self.error_messages["invalid"], code="invalid")
        return super().to_python(value)


class PlainFloatField(forms.FloatField):
    """Django's number field, reading only the digits 0-9 (see :class:`PlainIntegerField`)."""

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and not plain_digits(value):
            raise ValidationError(self.error_messages["invalid"], code="invalid")
        return super().to_python(value)


def plain_numbers(db_field: Any, kwargs: dict[str, Any]) -> None:
    """Give a number column's form field the digits 0-9 only (both admins and inlines)."""
    if isinstance(db_field, models.FloatField):
        kwargs.setdefault("form_class", PlainFloatField)
    elif isinstance(db_field, models.IntegerField) and not db_field.is_relation:
        kwargs.setdefault("form_class", PlainIntegerField)


class IdAutocomplete(AutocompleteSelect):
    """Django's autocomplete picker, drawing a submitted value that no row's id can be (a
    hand-written or tampered POST: ``user=abc``) as nothing chosen. Django's own looks the
    value up to draw its label and raises, so the form with its "Select a valid choice" error
    became a 500; the error stays on the field."""

    def optgroups(self, name: str, value: Sequence[str], attr: Any = None) -> Any:
        remote = self.field.remote_field
        target = remote.model._meta.get_field(remote.field_name)
        return super().optgroups(name, [v for v in value if _is_id(target, v)], attr)


def _is_id(target: Any, value: Any) -> bool:
    """Whether ``value`` can be looked up as a value of the column ``target``: of its type,
    and within the range its database column holds (an empty one is kept: the picker draws it
    as nothing chosen)."""
    if value in (None, ""):
        return True
    try:
        target.run_validators(target.get_prep_value(target.to_python(value)))
    except (TypeError, ValueError, ValidationError):
        return False
    return True


class RowIdField(forms.ModelChoiceField):  # type: ignore[type-arg]
    """The hidden id of a row a list edits in place, refusing a value no id can be (a
    tampered POST: 30 digits) with Django's "Select a valid choice": Django looked it up,
    and one beyond the database's integers failed the query (a 500)."""

    def to_python(self, value: Any) -> Any:
        model: Any = getattr(self.queryset, "model", None)
        if value not in self.empty_values and not _is_id(model._meta.pk, value):
            raise ValidationError(self.error_messages["invalid_choice"], code="invalid_choice")
        return super().to_python(value)


class ListEditFormSet(forms.BaseModelFormSet):  # type: ignore[type-arg]
    """The rows a list edits in place, each id read by :class:`RowIdField`."""

    def add_fields(self, form: Any, index: Any) -> None:
        super().add_fields(form, index)
        model: Any = self.model
        field = form.fields.get(model._meta.pk.name)
        if type(field) is forms.ModelChoiceField:
            field.__class__ = RowIdField


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

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        # A positive column with a lower bound of its own (a percent or a lease from 1): the
        # form's own "at least 0" would answer -1 with a bound that 0 breaks too. Without it
        # the column's validator names the real bound, for -1 as for 0.
        validators = getattr(db_field, "validators", ())
        if isinstance(db_field, POSITIVE_FIELDS) and any(
            isinstance(v, MinValueValidator) and v.limit_value >= 1 for v in validators
        ):
            kwargs.setdefault("min_value", None)
        plain_numbers(db_field, kwargs)
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Run a list action on the selected rows whose ids can be ids (a hand-written or
        tampered POST: ``_selected_action=1.5``): Django filters by every value given, and
        one that is no id of the column was a 500 for every action, "delete selected" too.
        With none left, Django's own "Items must be selected" answers."""
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        kept = [value for value in selected if value and _is_id(self.model._meta.pk, value)]
        if kept != selected:
            posted = request.POST.copy()
            posted.setlist(helpers.ACTION_CHECKBOX_NAME, kept)
            request.POST = posted  # type: ignore[assignment]  # Django's own is immutable
        return super().response_action(request, queryset, *args, **kwargs)

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        """The form of a row the list edits in place (``list_editable``): it edits a few
        columns (a rule's "enabled" and "shadow"), and the model's ``clean()`` judges the
        whole row. Its errors on a column the list does not show (a rule's pattern written
        around the admin, flagged in the "problems" column) were a 500 (Django raises on an
        error for a field the form lacks), so unticking "enabled" on that rule could only be
        done on its change page. They are the change page's to show; the list saves what it
        edits."""
        form = super().get_changelist_form(request, **kwargs)

        class ListEditForm(form):  # type: ignore[misc, valid-type]
            def add_error(self, field: Any, error: Any) -> None:
                if field is None and hasattr(error, "error_dict"):
                    kept = {
                        name: errors
                        for name, errors in error.error_dict.items()
                        if name == NON_FIELD_ERRORS or name in self.fields
                    }
                    if not kept:
                        return
                    error = ValidationError(kept)
                super().add_error(field, error)

        return ListEditForm

    def get_changelist_formset(self, request: HttpRequest, **kwargs: Any) -> Any:
        kwargs.setdefault("formset", ListEditFormSet)
        return super().get_changelist_formset(request, **kwargs)

    def _get_list_editable_queryset(self, request: HttpRequest, prefix: str) -> Any:
        # Django reads the posted ids to narrow the rows it loads, and gives that up for an
        # id it cannot read; one that reads but is beyond the database's integers (30
        # digits) failed the query instead: given up the same way (the row's RowIdField
        # then refuses it).
        pks = self._get_edited_object_pks(request, prefix)
        if not all(_is_id(self.opts.pk, pk) for pk in pks):
            return self.get_queryset(request)
        return super()._get_list_editable_queryset(request, prefix)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The list, with a filter value out of every range the database holds
        (``?tier=1000000000000000000000000000000``, a ``window_start__year`` of 30 digits) read
        as the wacky lookup it is: Django then draws the list unfiltered with its own "?e=1"
        note. Django turns most bad values into that, but a number too large for the
        database's integers, or for a date, fails only when the query runs: it was a 500."""
        try:
            return super().get_changelist_instance(request)
        except OverflowError as exc:
            raise IncorrectLookupParameters(exc) from exc

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name in self.get_autocomplete_fields(request) and "widget" not in kwargs:
            using = kwargs.get("using")
            kwargs["widget"] = IdAutocomplete(db_field, self.admin_site, using=using)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_autocomplete_fields(self, request: HttpRequest) -> list[str]:
        site, searchable = self.admin_site, []
        for name in self.raw_id_fields:
            model: Any = self.opts.get_field(name).related_model
            if site.is_registered(model) and site.get_model_admin(model).search_fields:
                searchable.append(name)
        return searchable

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return self._publishing(request, super().changeform_view, request, *args, **kwargs)

    def delete_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return self._publishing(request, super().delete_view, request, *args, **kwargs)

    def changelist_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return self._publishing(request, super().changelist_view, request, *args, **kwargs)

    def _publishing(self, request: HttpRequest, view: Any, *args: Any, **kwargs: Any) -> Any:
        """Run an admin view that may change the policy; when the change was saved but could
        not be published (Redis unreachable), say so in one warning: the other processes
        apply it only when they next recompile their snapshot, not within a second."""
        from django_throttle.policy.live import MAX_AGE
        from django_throttle.signals import unpublished

        token = unpublished.set(None)
        try:
            response = view(*args, **kwargs)
            failed = unpublished.get()
        finally:
            unpublished.reset(token)
        if failed is not None:
            messages.warning(
                request,
                gettext(
                    "The change is saved, but Redis is unreachable (%(error)s): the other "
                    "processes apply it within %(minutes)d minutes, not within a second."
                )
                % {"error": failed, "minutes": round(MAX_AGE / 60)},
            )
        return response

    def render_page(
        self, request: HttpRequest, template: str, title: str | Promise, **context: Any
    ) -> TemplateResponse:
        """One of the app's own pages (``admin/django_throttle/<template>.html``) in the admin's
        frame: the site's context (``each_context``: header, sidebar), the title, and this
        model's options for the breadcrumbs."""
        context.update(self.admin_site.each_context(request), title=title, opts=self.opts)
        return TemplateResponse(request, f"admin/django_throttle/{template}.html", context)


#: Set while a page is drawn again after its save met a unique constraint (see
#: :meth:`LimitedAdmin.changeform_view`).
_clashed: ContextVar[bool] = ContextVar("clashed", default=False)
CLASHED = _(
    "Nothing was saved: a row saved by someone else while this page was being saved clashes "
    "with this change (the same limit twice: tier, rate and regions). Check the rows, "
    "reload the page if needed, and save again."
)


class LimitedAdmin(AppAdmin):
    """The pages of a row with limits inline (a tier, an endpoint rule): the "problems" and
    failure-mode columns, and the warnings the forms leave (see
    :class:`TierLimitFormSet`), shown once the change is saved."""

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        """The page, its form shown again with an error when the save met a unique
        constraint after validation passed: a row another operator saved in between (the same
        tier, rate and regions as one of this rule's limits). Django's save is one
        transaction, rolled back whole: nothing is saved, and the form is drawn again with
        what was posted (not a 500)."""
        if request.method != "POST":
            return super().changeform_view(request, *args, **kwargs)
        try:
            return super().changeform_view(request, *args, **kwargs)
        except IntegrityError:
            token = _clashed.set(True)
            try:
                return super().changeform_view(request, *args, **kwargs)
            finally:
                _clashed.reset(token)

    def get_form(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        form = super().get_form(request, *args, **kwargs)
        if not _clashed.get():
            return form

        class Clashed(form):  # type: ignore[misc, valid-type]
            def clean(self) -> Any:
                cleaned = super().clean()
                self.add_error(None, CLASHED)
                return cleaned

        return Clashed

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


# The forms: the limit row's widgets (an algorithm select that says which fields it uses), and
# the checks across rows (a limit written twice, a cost above a capacity).


def _valid_rows(formset: forms.BaseInlineFormSet[Any, Any, Any]) -> Iterable[tuple[Any, int]]:
    """Forms that will be saved and are valid on their own, with their limit's capacity
    (computed by :class:`~django_throttle.rates.Limit`, the one place that knows). A
    concurrency limit is left out: a request takes one slot whatever its cost."""
    for form in formset.forms:
        if not form.cleaned_data or form.cleaned_data.get("DELETE") or form.errors:
            continue
        if form.cleaned_data.get("algorithm") == Algorithm.CONCURRENCY:
            continue
        try:
            yield form, form.instance.capacity
        except BadRow:
            continue


def _fix(form: forms.Form, cost: int) -> tuple[str, str]:
    """The field to raise for a limit that holds less than ``cost``, and what to tell the
    operator: a window's count is its rate's; a bucket's burst when set, else the rate."""
    if form.cleaned_data.get("algorithm") in WINDOW_ALGORITHMS:
        return "rate", gettext("raise the rate's count to at least %(cost)s") % {"cost": cost}
    field = "burst" if form.cleaned_data.get("burst") is not None else "rate"
    return field, gettext("set the burst to at least %(cost)s") % {"cost": cost}


def _below_costs(
    tier: str, limit: Any, capacity: int, rules: list[tuple[str, int]], fix: str
) -> str:
    """The warning for a tier-wide limit that holds less than the cost of ``rules`` (name,
    cost): see :class:`TierLimitFormSet`."""
    named = ", ".join(
        gettext("rule '%(name)s' (cost %(cost)s)") % {"name": n, "cost": c} for n, c in rules
    )
    return gettext(
        "Tier '%(tier)s': its limit %(limit)s holds at most %(capacity)s, less than the cost "
        "of %(rules)s: such a call is charged the whole limit (%(capacity)s) and passes only "
        "when the limit is full. Fine if the tier's clients cannot reach it anyway (e.g. it "
        "requires login); otherwise %(fix)s."
    ) % {"tier": tier, "limit": limit, "capacity": capacity, "rules": named, "fix": fix}


class AlgorithmSelect(forms.Select):
    """The algorithm select; each option says which optional fields its algorithm uses and
    what the rate means under it, for ``limit_fields.js`` to show and hide the row's fields
    (the server validates the same rules without it)."""

    def create_option(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        option: dict[str, Any] = super().create_option(*args, **kwargs)
        value = str(option["value"])
        if value in ALGORITHM_HELP:
            option["attrs"]["data-uses"] = " ".join(ALGORITHM_FIELDS.get(value, ()))
            option["attrs"]["data-help"] = str(ALGORITHM_HELP[value])
        return option


class LimitForm(forms.ModelForm):  # type: ignore[type-arg]
    """A limit row; stores rates in canonical form so duplicates are caught.

    The form validates and saves a copy of its row: the admin captions an inline row with the
    object its formset read from the database, and a refused value ("10/minn") written into
    that object would read as saved."""

    class Meta:
        widgets = {"algorithm": AlgorithmSelect(attrs={"class": "django-throttle-algorithm"})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.instance = copy.copy(self.instance)
        # What an empty time zone means, read per form so override_settings applies.
        self.fields["timezone"].widget.attrs["placeholder"] = settings.TIME_ZONE or "UTC"

    def clean_rate(self) -> str:
        # A rate that is none is kept: the model's validator reports it with the explanation.
        return canonical_rate(self.cleaned_data["rate"])

    def validate_constraints(self) -> None:
        """Check the row's constraints as Django 6 does, except those naming the tier or rule
        the row belongs to (a rule's rows are unique by tier, rate and regions).

        Django 6 checks those against the rows as stored, one row at a time, so it refused
        valid edits in which rows pass their values on to each other in one save (two rows
        swapping tiers). The formset checks them over the rows as posted instead (Django's
        check across the forms, and :class:`OwnRowsFormSet` for rows saved meanwhile), and
        saves in an order that never meets them half way; Django 5.2 left them out here too.
        Like Django, a field with an error of its own is left out of the check."""
        model: Any = self.instance
        exclude = {
            field.name
            for field in model._meta.fields
            if field.name not in self.fields
            or field.name in self.errors
            or isinstance(self.fields[field.name], InlineForeignKeyField)
        }
        try:
            self.instance.validate_constraints(exclude=exclude)
        except ValidationError as error:
            self.add_error(None, error)


class OwnRowsFormSet(forms.BaseInlineFormSet):  # type: ignore[type-arg]
    """Refuse a saved row the page did not draw: one whose id names a row deleted since the
    page was opened, or a row of another tier or rule (Django saves neither, silently), and
    a row whose id is posted twice (Django saves both into that one row, overwriting it). An
    error on the row, asking for a reload; a row being deleted is left alone."""

    def clean(self) -> None:
        super().clean()
        model: Any = self.model
        pk_name = model._meta.pk.name
        seen: set[Any] = set()
        for form in self.initial_forms:
            posted = getattr(form, "cleaned_data", {}).get(pk_name)
            if getattr(form, "cleaned_data", {}).get("DELETE"):
                continue
            pk = form.instance.pk
            if pk is None or posted is None or posted.pk != pk:
                form.add_error(
                    None,
                    gettext(
                        "this row is no longer one of the limits here (deleted or changed "
                        "elsewhere since the page was opened): reload the page and make the "
                        "change again"
                    ),
                )
            elif pk in seen:
                form.add_error(
                    None,
                    gettext(
                        "this row is in the form twice (the page was altered): reload the "
                        "page and make the change again"
                    ),
                )
            seen.add(pk)
        for form in self.extra_forms:
            if getattr(form, "cleaned_data", {}).get(pk_name) is not None:
                form.add_error(
                    None,
                    gettext(
                        "this row is saved already (the page was altered): reload the page "
                        "and make the change again"
                    ),
                )
        self._check_rows_saved_meanwhile({form.instance.pk for form in self.initial_forms})

    def save_existing_objects(self, commit: bool = True) -> list[Any]:
        """Save the page's rows as Django does, one after the other, each keeping its id (the
        key of its counters), after moving out of the way every row whose limit another row
        takes in this save: a rate of its own (``~`` and its id) until it is saved or deleted.

        Without that, a row taking the tier, rate and regions of a row saved or deleted after
        it (two rows swapping tiers; A 5/m to 10/m while B 10/m to 20/m; a deleted row's
        rate) met the rule's unique constraint half way: a 500, though the rows as posted
        differ. A row moved out of the way is re-timed from its limit as stored before."""
        if commit:
            self._make_room()
        return super().save_existing_objects(commit)

    def _make_room(self) -> None:
        model: Any = self.model
        uniques = [
            [model._meta.get_field(name) for name in constraint.fields]
            for constraint in model._meta.constraints
            if isinstance(constraint, UniqueConstraint) and "rate" in constraint.fields
        ]

        def keys(row: Any) -> set[tuple[int, tuple[Any, ...]]]:
            return {
                (index, tuple(field.value_from_object(row) for field in fields))
                for index, fields in enumerate(uniques)
            }

        deleted = self.deleted_forms
        written = [
            form
            for form in self.initial_forms
            if form.instance.pk is not None and (form in deleted or form.has_changed())
        ]
        taker = {
            key: form.instance.pk
            for form in written
            if form not in deleted
            for key in keys(form.instance)
        }
        if not taker:
            return
        # As stored now (the forms' rows carry the posted values).
        stored = model._default_manager.in_bulk([form.instance.pk for form in written])
        for form in written:
            row = stored.get(form.instance.pk)
            if row is None or all(taker.get(key, row.pk) == row.pk for key in keys(row)):
                continue  # no other row takes its limit
            if form not in deleted:
                signals.note_stored_limit(form.instance)
            model._default_manager.filter(pk=row.pk).update(rate=f"~{row.pk}")

    def _check_rows_saved_meanwhile(self, drawn: set[Any]) -> None:
        """A row repeating a row of this tier or rule saved since the page was opened (by
        another operator, from the same page): the same limit twice, or, for an endpoint
        limit, the database's unique constraint (a 500 when saved)."""
        if self.instance.pk is None:
            return
        saved = [row for row in self.get_queryset() if row.pk not in drawn]
        if not saved:
            return
        model: Any = self.model
        columns = [
            [model._meta.get_field(name).attname for name in constraint.fields]
            for constraint in model._meta.constraints
            if isinstance(constraint, UniqueConstraint) and constraint.fields
        ]
        keys = {row.duplicate_key(): row for row in saved} | {
            tuple(getattr(row, name) for name in names): row for names in columns for row in saved
        }
        keys.pop(None, None)
        for form in self.forms:
            if not getattr(form, "cleaned_data", None) or form.errors:
                continue
            if form.cleaned_data.get("DELETE"):
                continue
            row = form.instance
            found = [row.duplicate_key()]
            found += [tuple(getattr(row, name) for name in names) for names in columns]
            other = next((keys[key] for key in found if key in keys), None)
            if other is not None:
                message = gettext(
                    "the same limit as a row saved since the page was opened (%(limit)s): "
                    "reload the page"
                )
                form.add_error("rate", message % {"limit": other})


class TierLimitFormSet(OwnRowsFormSet):
    """Refuse a limit written twice; warn about a limit smaller than the cost of an enabled
    endpoint rule.

    A limit written twice is the same counter twice: each request would take its cost from
    both, and count twice against the client. An error on the rate of every row that repeats
    an earlier one.

    A request costing more than a limit holds is denied forever, but whether the tier's
    clients can reach that endpoint at all is the project's business (a view requiring login
    is out of the anonymous tier's reach): tightening the anonymous tier below the cost of a
    signed-in export is normal. So that is a warning the admin shows after saving
    (:attr:`warnings`), naming the rule and the tier, not an error."""

    def clean(self) -> None:
        super().clean()
        self.warnings: list[str] = []
        costly = list(
            EndpointRule.objects.filter(cost__gt=1, enabled=True)
            .order_by("-cost", "name")
            .values_list("name", "cost")
        )
        first: dict[tuple[object, ...], Any] = {}
        for form, capacity in _valid_rows(self):
            key = form.instance.duplicate_key()
            if key in first:
                message = gettext(
                    "the same limit as another row (%(limit)s): every request would count it "
                    "twice; remove one of them"
                )
                form.add_error("rate", message % {"limit": first[key].instance})
                continue  # one message per mistake: not compared with costs as well
            first[key] = form  # a row with a capacity has a key
            beyond = [(name, cost) for name, cost in costly if cost > capacity]
            if beyond:
                fix = _fix(form, beyond[0][1])[1]
                self.warnings.append(
                    _below_costs(self.instance.name, form.instance, capacity, beyond, fix)
                )


class EndpointLimitFormSet(OwnRowsFormSet):
    """Refuse an endpoint limit smaller than its rule's cost (the rule being edited)."""

    def clean(self) -> None:
        super().clean()
        cost = self.instance.cost
        if "cost" in self.instance.row_problems():
            return  # the rule form reports the cost itself
        for form, capacity in _valid_rows(self):
            if capacity < cost:
                field, fix = _fix(form, cost)
                message = gettext(
                    "a request costing %(cost)s could never pass: this limit holds at most "
                    "%(capacity)s; %(fix)s or lower the cost"
                )
                form.add_error(field, message % {"cost": cost, "capacity": capacity, "fix": fix})


class EndpointRuleForm(forms.ModelForm):  # type: ignore[type-arg]
    """Warn about a cost that some tier-wide limit can never hold (a warning shown after
    saving, :attr:`warnings`: that tier's clients may never reach this endpoint, see
    :class:`TierLimitFormSet`); limits of this rule itself are checked row by row in
    :class:`EndpointLimitFormSet`, and there a cost too high is an error. The admin makes
    the form's model and fields (``modelform_factory``)."""

    def _post_clean(self) -> None:
        # After the model's own validation, so a cost out of range has its one error and is
        # not also compared with the tier limits. A disabled rule costs nothing; enabling it
        # is checked then.
        super()._post_clean()  # type: ignore[misc]
        self.warnings: list[str] = []
        cost = self.cleaned_data.get("cost")  # gone from cleaned_data when it has an error
        if not isinstance(cost, int) or cost <= 1 or not self.cleaned_data.get("enabled", True):
            return
        rule = [(self.cleaned_data.get("name", ""), cost)]
        limits = TierLimit.objects.select_related("tier").exclude(algorithm=Algorithm.CONCURRENCY)
        for limit in limits.order_by("tier__name", "pk"):
            try:
                capacity = limit.capacity
            except BadRow:
                continue
            if capacity < cost:
                fix = gettext("lower the cost or raise that limit")
                self.warnings.append(_below_costs(limit.tier.name, limit, capacity, rule, fix))


#: Most limit rows of one tier or endpoint rule the admin takes (:class:`LimitInline`).
MAX_LIMIT_ROWS = 100


class LimitInline(admin.TabularInline):  # type: ignore[type-arg]
    """A limit row: rate and algorithm, then the burst (bucket algorithms), the delay and
    longest wait (GCRA) or the time zone (calendar quota); ``limit_fields.js`` hides what the
    chosen algorithm does not use."""

    form = LimitForm
    fields = ["rate", "algorithm", "burst", "delay", "max_wait", "timezone", "regions"]
    extra = 1
    #: Most limit rows one tier or rule shows and saves: far more than a policy uses (a
    #: window per period, per region), and a bound on what a form whose row count was
    #: tampered with makes the server draw (Django's own bound, 1,000 rows, each with its
    #: time-zone list, took a minute).
    max_num = MAX_LIMIT_ROWS

    class Media:
        js = ["django_throttle/limit_fields.js"]

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        plain_numbers(db_field, kwargs)
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        kwargs.setdefault("absolute_max", MAX_LIMIT_ROWS)
        return super().get_formset(request, obj, **kwargs)
