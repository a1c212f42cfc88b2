"""Admin forms that check what a single row cannot: a request's cost against the capacity of
every limit it would meet.

A token bucket never holds more than its capacity, so a request costing more than some limit's
capacity would be denied forever. These forms refuse such a configuration, naming the field to
change, instead of letting it reach the policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms

from django_throttle.models import EndpointRule, TierLimit
from django_throttle.rates import InvalidRate, Rate

__all__ = ["EndpointLimitFormSet", "EndpointRuleForm", "LimitForm", "TierLimitFormSet"]


def _capacity(rate: str | None, burst: int | None) -> int | None:
    """Capacity of a limit from form values, or ``None`` when they are not valid yet."""
    if burst is not None:
        return burst if burst >= 1 else None
    try:
        return Rate.parse(rate or "").count
    except InvalidRate:
        return None


def _never_passes(cost: int, capacity: int) -> str:
    return (
        f"a request costing {cost} could never pass: this limit holds at most {capacity}; "
        f"set the burst to at least {cost} or lower the cost"
    )


def _live_forms(formset: forms.BaseInlineFormSet[Any, Any, Any]) -> Iterable[forms.Form]:
    """Forms that will be saved: filled in, valid so far and not marked for deletion."""
    for form in formset.forms:
        data = getattr(form, "cleaned_data", None)
        if data and not data.get("DELETE"):
            yield form


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
        for form in _live_forms(self):
            capacity = _capacity(form.cleaned_data.get("rate"), form.cleaned_data.get("burst"))
            if capacity is not None and capacity < cost:
                _flag_row(
                    form,
                    f"rule '{name}' costs {cost} per request, and this limit holds at most "
                    f"{capacity}, so clients of this tier could never call it; set the burst to "
                    f"at least {cost}",
                )


class EndpointLimitFormSet(forms.BaseInlineFormSet):  # type: ignore[type-arg]
    """Refuse an endpoint limit smaller than its rule's cost (the rule being edited)."""

    def clean(self) -> None:
        super().clean()
        rule: EndpointRule = self.instance
        cost = rule.cost
        if not isinstance(cost, int) or cost < 1:
            return  # the rule form reports the cost itself
        for form in _live_forms(self):
            capacity = _capacity(form.cleaned_data.get("rate"), form.cleaned_data.get("burst"))
            if capacity is not None and capacity < cost:
                _flag_row(form, _never_passes(cost, capacity))


class EndpointRuleForm(forms.ModelForm):  # type: ignore[type-arg]
    """Refuse a cost that some tier-wide limit can never hold; limits of this rule are checked
    row by row in :class:`EndpointLimitFormSet`."""

    class Meta:
        model = EndpointRule
        fields = "__all__"

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        cost = data.get("cost")
        if not isinstance(cost, int) or cost <= 1:
            return data
        too_small = []
        for limit in TierLimit.objects.select_related("tier").order_by("tier__name", "pk"):
            try:
                capacity = limit.capacity
            except InvalidRate:
                continue
            if capacity < cost:
                too_small.append(f"'{limit.tier.name}' {limit.rate} holds at most {capacity}")
        if too_small:
            self.add_error(
                "cost",
                f"a request costing {cost} could never pass the tier limit"
                f"{'s' if len(too_small) > 1 else ''} {'; '.join(too_small)}; lower the cost "
                "or raise those bursts",
            )
        return data
