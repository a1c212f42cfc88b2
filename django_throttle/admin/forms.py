"""Admin forms: the limit row's widgets (an algorithm select that says which fields it uses),
and what a single row cannot check: a limit written twice, and a request's cost against the
capacity of every limit it would meet.

No limit admits more than its capacity at once (a bucket's burst, a window's count), so a
request costing more than some limit's capacity would be denied forever. A rule's own limit
that cannot hold the rule's cost is certain to deny: an error on the field to change. A
tier-wide limit below some rule's cost only matters if the tier's clients can reach that
endpoint, which the admin cannot know: a warning (``warnings``, shown after saving). A row that
is invalid on its own (bad rate, burst out of range) already has its error; it is not checked
against costs as well, so every mistake gets exactly one message.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from django import forms
from django.conf import settings
from django.utils.translation import gettext as _

from django_throttle.models import EndpointRule, TierLimit
from django_throttle.models.fields import BadRow
from django_throttle.models.limits import ALGORITHM_FIELDS, ALGORITHM_HELP
from django_throttle.rates import WINDOW_ALGORITHMS, InvalidRate, Rate


def _valid_rows(formset: forms.BaseInlineFormSet[Any, Any, Any]) -> Iterable[tuple[Any, int]]:
    """Forms that will be saved and are valid on their own, with their limit's capacity
    (computed by :class:`~django_throttle.rates.Limit`, the one place that knows)."""
    for form in formset.forms:
        if not form.cleaned_data or form.cleaned_data.get("DELETE") or form.errors:
            continue
        try:
            yield form, form.instance.capacity
        except BadRow:
            continue


def _fix(form: forms.Form, cost: int) -> tuple[str, str]:
    """The field to raise for a limit that holds less than ``cost``, and what to tell the
    operator: a window's count is its rate's; a bucket's burst when set, else the rate."""
    if form.cleaned_data.get("algorithm") in WINDOW_ALGORITHMS:
        return "rate", _("raise the rate's count to at least %(cost)s") % {"cost": cost}
    field = "burst" if form.cleaned_data.get("burst") is not None else "rate"
    return field, _("set the burst to at least %(cost)s") % {"cost": cost}


def _below_costs(
    tier: str, limit: Any, capacity: int, rules: list[tuple[str, int]], fix: str
) -> str:
    """The warning for a tier-wide limit that holds less than the cost of ``rules`` (name,
    cost): see :class:`TierLimitFormSet`."""
    named = ", ".join(
        _("rule '%(name)s' (cost %(cost)s)") % {"name": n, "cost": c} for n, c in rules
    )
    return _(
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
        value: str = self.cleaned_data["rate"]
        try:
            return str(Rate.parse(value))
        except InvalidRate:
            return value  # the model's validator reports it with the explanation


class TierLimitFormSet(forms.BaseInlineFormSet):  # type: ignore[type-arg]
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
                message = _(
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


class EndpointLimitFormSet(forms.BaseInlineFormSet):  # type: ignore[type-arg]
    """Refuse an endpoint limit smaller than its rule's cost (the rule being edited)."""

    def clean(self) -> None:
        super().clean()
        cost = self.instance.cost
        if "cost" in self.instance.row_problems():
            return  # the rule form reports the cost itself
        for form, capacity in _valid_rows(self):
            if capacity < cost:
                field, fix = _fix(form, cost)
                message = _(
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
        for limit in TierLimit.objects.select_related("tier").order_by("tier__name", "pk"):
            try:
                capacity = limit.capacity
            except BadRow:
                continue
            if capacity < cost:
                fix = _("lower the cost or raise that limit")
                self.warnings.append(_below_costs(limit.tier.name, limit, capacity, rule, fix))
