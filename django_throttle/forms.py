"""Admin forms that check what a single row cannot: a request's cost against the capacity of
every limit it would meet.

A token bucket never holds more than its capacity, so a request costing more than some limit's
capacity would be denied forever. These forms refuse such a configuration, naming the field to
change, instead of letting it reach the policy. A row that is invalid on its own (bad rate,
burst out of range) already has its error; it is not checked against costs as well, so every
mistake gets exactly one message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_throttle.models import BadRow, EndpointRule, TierLimit
from django_throttle.rates import InvalidRate, Rate

__all__ = ["EndpointLimitFormSet", "EndpointRuleForm", "LimitForm", "TierLimitFormSet"]


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


def _flag_row(form: forms.Form, message: str) -> None:
    """Put the error on burst when it is set (the thing to raise), else on the rate."""
    data = form.cleaned_data
    form.add_error("burst" if data.get("burst") is not None else "rate", message)


class LimitForm(forms.ModelForm):  # type: ignore[type-arg]
    """A rate/burst row; stores rates in canonical form so duplicates are caught."""

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
                _flag_row(
                    form,
                    str(
                        _(
                            "rule '%(name)s' costs %(cost)s per request, and this limit holds "
                            "at most %(capacity)s, so clients of this tier could never call it; "
                            "set the burst to at least %(cost)s"
                        )
                    )
                    % {"name": name, "cost": cost, "capacity": capacity},
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
                _flag_row(
                    form,
                    str(
                        _(
                            "a request costing %(cost)s could never pass: this limit holds at "
                            "most %(capacity)s; set the burst to at least %(cost)s or lower "
                            "the cost"
                        )
                    )
                    % {"cost": cost, "capacity": capacity},
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
                    "lower the cost or raise those bursts",
                    "a request costing %(cost)s could never pass the tier limits %(limits)s; "
                    "lower the cost or raise those bursts",
                    len(too_small),
                )
                % {"cost": cost, "limits": "; ".join(too_small)},
            )
