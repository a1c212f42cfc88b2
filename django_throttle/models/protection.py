"""Protecting the service itself, not only fairness between clients: how many requests the
whole fleet of workers serves at once, and how much of that capacity traffic below critical may
take (load shedding by criticality; an endpoint rule's criticality says which traffic is which).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from django_throttle.models.fields import count_field, range_check

if TYPE_CHECKING:
    from django_throttle.models.fields import StrOrPromise

#: Longest lease of a fleet slot, in seconds (a day).
MAX_LEASE = 86_400
#: Largest event loop lag to shed at, in milliseconds (a minute).
MAX_LAG_MS = 60_000


def _percent(default: int, help_text: StrOrPromise) -> models.PositiveSmallIntegerField[int, int]:
    return models.PositiveSmallIntegerField(
        default=default,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        error_messages={
            "min_value": _("A share is at least 1%%."),
            "max_value": _("A share is at most 100%%."),
        },
        help_text=help_text,
    )


class Protection(models.Model):
    """The fleet shedder's settings: one row (the admin edits it in place).

    With ``in_flight`` set, every request the throttle checks also takes a slot of the
    fleet's in-flight capacity, counted in Redis across every worker in the same call as its
    rate limits (a concurrency lease, given back when the response ends): critical traffic
    may fill all of it, default traffic ``default_share`` percent, sheddable traffic
    ``sheddable_share`` percent; a request beyond its share is refused with 503 and a short
    ``Retry-After``, so critical traffic keeps the rest while the fleet is saturated.
    """

    enabled = models.BooleanField(
        default=True, help_text=_("untick to stop shedding without losing the values")
    )
    in_flight = count_field(
        _("The capacity must be at least %(limit_value)s."),
        _("The capacity must be at most %(limit_value)s."),
        verbose_name=_("requests in flight"),
        null=True,
        blank=True,
        help_text=_(
            "requests the whole service (every worker together) serves at once; blank: no "
            "load shedding"
        ),
    )
    default_share = _percent(
        90, _("percent of that capacity default traffic may take; critical traffic may take all")
    )
    sheddable_share = _percent(
        70, _("percent of that capacity sheddable traffic may take; at most the default share")
    )
    lease = models.PositiveIntegerField(
        _("lease (seconds)"),
        default=60,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_LEASE)],
        help_text=_(
            "a slot is given back when its response ends, and renewed while a request runs; a "
            "killed worker's slots are free again after this long"
        ),
    )
    worker_capacity = count_field(
        _("The worker capacity must be at least %(limit_value)s."),
        _("The worker capacity must be at most %(limit_value)s."),
        verbose_name=_("requests per worker"),
        null=True,
        blank=True,
        help_text=_(
            "requests one worker process serves at once (its threads, e.g. gunicorn's "
            "--threads); beyond the shares above of it, the worker sheds sheddable, then "
            "default requests on its own, without asking Redis. Blank: no worker shedding"
        ),
    )
    worker_lag_ms = models.PositiveIntegerField(
        _("event loop lag (ms)"),
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_LAG_MS)],
        help_text=_(
            "under ASGI: once a worker's event loop runs this late, it sheds sheddable "
            "requests, and default ones at twice the lag. Blank: no lag shedding"
        ),
    )
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("service protection")
        verbose_name_plural = _("service protection")
        constraints = [range_check("in_flight", "django_throttle_protection_in_flight", null=True)]

    def __str__(self) -> str:
        if not self.enabled or not (self.in_flight or self.worker_capacity or self.worker_lag_ms):
            return str(_("load shedding off"))
        if not self.in_flight:
            return str(_("worker shedding only"))
        return str(_("%(n)s requests in flight")) % {"n": self.in_flight}

    def row_problems(self) -> dict[str, str]:
        """Values the admin would refuse, by field (the policy compiler then leaves shedding
        off): :meth:`clean`'s, as the other policy rows have them."""
        try:
            self.clean()
        except ValidationError as exc:
            return {name: " ".join(messages) for name, messages in exc.message_dict.items()}
        return {}

    def clean(self) -> None:
        # Only two valid shares compare: a share out of range is its own field's one error.
        shares = (self.sheddable_share, self.default_share)
        if (
            all(isinstance(share, int) and 1 <= share <= 100 for share in shares)
            and self.sheddable_share > self.default_share
        ):
            raise ValidationError(
                {"sheddable_share": _("The sheddable share cannot exceed the default share.")}
            )
