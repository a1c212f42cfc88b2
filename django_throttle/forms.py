"""Admin forms: the limit row's widgets (an algorithm select that says which fields it uses),
and what a single row cannot check: a request's cost against the capacity of every limit it
would meet.

No limit admits more than its capacity at once (a bucket's burst, a window's count), so a
request costing more than some limit's capacity would be denied forever. These forms refuse
such a configuration, naming the field to change, instead of letting it reach the policy. A row
that is invalid on its own (bad rate, burst out of range) already has its error; it is not
checked against costs as well, so every mistake gets exactly one message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms
from django.conf import settings
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_throttle.models import ALGORITHM_FIELDS, ALGORITHM_HELP, BadRow, EndpointRule, TierLimit
from django_throttle.rates import WINDOW_ALGORITHMS, InvalidRate, Rate

__all__ = [
    "AlgorithmSelect",
    "EndpointLimitFormSet",
    "EndpointRuleForm",
    "LimitForm",
    "TierLimitFormSet",
]


def _valid_rows(formset: forms.BaseInlineFormSet[Any, Any, Any]) -> Iterable[tuple[Any, int]]:
    """Forms that will be saved and are valid on their own, with their limit's capacity
    (computed by :class:`~django_throttle.rates.Limit`, the one place that knows)."""
    for form in formset.forms:
        data = getattr(form, "cleaned_data", None)
        if not data or data.get("DELETE") or form.errors:
            continue
        try:
            capacity = form.instance.capacity
        except BadRow:
            continue
        yield form, capacity


def _fix(form: forms.Form, cost: int) -> tuple[str, str]:
    """The field to raise for a limit that holds less than ``cost``, and what to tell the
    operator: a window's count is its rate's; a bucket's burst when set, else the rate."""
    if form.cleaned_data.get("algorithm") in WINDOW_ALGORITHMS:
        return "rate", str(_("raise the rate's count to at least %(cost)s")) % {"cost": cost}
    field = "burst" if form.cleaned_data.get("burst") is not None else "rate"
    return field, str(_("set the burst to at least %(cost)s")) % {"cost": cost}


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
    """A limit row; stores rates in canonical form so duplicates are caught."""

    class Meta:
        widgets = {"algorithm": AlgorithmSelect(attrs={"class": "django-throttle-algorithm"})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "timezone" in self.fields:
            # What an empty time zone means, read per form so override_settings applies.
            self.fields["timezone"].widget.attrs["placeholder"] = settings.TIME_ZONE or "UTC"

    def clean_rate(self) -> str:
        value: str = self.cleaned_data["rate"]
        try:
            return str(Rate.parse(value))
        except InvalidRate:
            return value  # the model's validator reports it with the explanation


class TierLimitFormSet(forms.BaseInlineFormSet):  # type: ignore[type-arg]
    """Refuse a tier limit smaller than the cost of an existing endpoint rule."""

    def clean(self) -> None:
        super().clean()
        costly = list(
            EndpointRule.objects.filter(cost__gt=1).order_by("-cost").values_list("name", "cost")
        )
        if not costly:
            return
        name, cost = costly[0]
        for form, capacity in _valid_rows(self):
            if capacity < cost:
                field, fix = _fix(form, cost)
                form.add_error(
                    field,
                    str(
                        _(
                            "rule '%(name)s' costs %(cost)s per request, and this limit holds "
                            "at most %(capacity)s, so clients of this tier could never call it; "
                            "%(fix)s"
                        )
                    )
                    % {"name": name, "cost": cost, "capacity": capacity, "fix": fix},
                )


class EndpointLimitFormSet(forms.BaseInlineFormSet):  # type: ignore[type-arg]
    """Refuse an endpoint limit smaller than its rule's cost (the rule being edited)."""

    def clean(self) -> None:
        super().clean()
        rule: EndpointRule = self.instance
        cost = rule.cost
        if "cost" in rule.row_problems():
            return  # the rule form reports the cost itself
        for form, capacity in _valid_rows(self):
            if capacity < cost:
                field, fix = _fix(form, cost)
                form.add_error(
                    field,
                    str(
                        _(
                            "a request costing %(cost)s could never pass: this limit holds at "
                            "most %(capacity)s; %(fix)s or lower the cost"
                        )
                    )
                    % {"cost": cost, "capacity": capacity, "fix": fix},
                )


class EndpointRuleForm(forms.ModelForm):  # type: ignore[type-arg]
    """Refuse a cost that some tier-wide limit can never hold; limits of this rule are checked
    row by row in :class:`EndpointLimitFormSet`."""

    class Meta:
        model = EndpointRule
        fields = "__all__"

    def _post_clean(self) -> None:
        # After the model's own validation, so a cost out of range has its one error and is
        # not also compared with the tier limits.
        super()._post_clean()  # type: ignore[misc]
        cost = self.cleaned_data.get("cost")
        if "cost" in self.errors or not isinstance(cost, int) or cost <= 1:
            return
        too_small = []
        for limit in TierLimit.objects.select_related("tier").order_by("tier__name", "pk"):
            try:
                capacity = limit.capacity
            except BadRow:
                continue
            if capacity < cost:
                too_small.append(f"'{limit.tier.name}' {limit.rate} holds at most {capacity}")
        if too_small:
            self.add_error(
                "cost",
                ngettext(
                    "a request costing %(cost)s could never pass the tier limit %(limits)s; "
                    "lower the cost or raise that limit",
                    "a request costing %(cost)s could never pass the tier limits %(limits)s; "
                    "lower the cost or raise those limits",
                    len(too_small),
                )
                % {"cost": cost, "limits": "; ".join(too_small)},
            )
