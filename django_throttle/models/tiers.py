"""Tiers, their tier-wide limits, and who is in which tier."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from django_throttle.models.fields import (
    FailureMode,
    choice_problem,
    failure_mode_field,
    optional_one_to_one,
    range_check,
    subject,
)
from django_throttle.models.limits import LimitFields
from django_throttle.rates import Rate, limit_text

if TYPE_CHECKING:
    from django_throttle.models.fields import StrOrPromise


def _factor(default: int, verbose_name: StrOrPromise, help_text: StrOrPromise) -> Any:
    return models.PositiveSmallIntegerField(
        verbose_name,
        default=default,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        error_messages={
            "min_value": _("A factor is at least 1%%."),
            "max_value": _("A factor is at most 100%%."),
        },
        help_text=help_text,
    )


class Tier(models.Model):
    """A class of client (free, pro, internal…) with its own limits."""

    _DEFAULT_KINDS = (
        ("is_default_anonymous", _("anonymous clients")),
        ("is_default_authenticated", _("authenticated users")),
    )

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    is_default_anonymous = models.BooleanField(
        _("default for anonymous clients"),
        default=False,
        help_text=_("clients that are not logged in and send no API key get this tier"),
    )
    is_default_authenticated = models.BooleanField(
        _("default for authenticated users"),
        default=False,
        help_text=_("logged-in users with no assignment (direct or by group) get this tier"),
    )
    priority = models.IntegerField(
        default=0,
        help_text=_("when a user's groups map to several tiers, the highest priority wins"),
    )
    failure_mode = failure_mode_field(
        _(
            "what this tier's requests meet when Redis cannot answer; an endpoint rule's own "
            "failure mode wins. Credential endpoints (login, token) are counted in each "
            "process where this says 'open'"
        )
    )
    load_factor = _factor(
        100,
        _("load factor (%)"),
        _(
            "percent of this tier's limits that applies (every count, burst and concurrency "
            "limit scaled, at least 1): 50 halves them, 100 leaves them as written"
        ),
    )
    min_factor = _factor(
        10,
        _("floor (%)"),
        _(
            "percent of its limits the automatic load controller (manage.py throttle_adapt) "
            "always leaves this tier, at most the load factor; 100 keeps it out of adaptive "
            "shrinking"
        ),
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-priority", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default_anonymous"],
                condition=Q(is_default_anonymous=True),
                name="django_throttle_one_default_anonymous_tier",
                violation_error_message=_(
                    "Only one tier can be the default for anonymous clients."
                ),
            ),
            models.UniqueConstraint(
                fields=["is_default_authenticated"],
                condition=Q(is_default_authenticated=True),
                name="django_throttle_one_default_authenticated_tier",
                violation_error_message=_(
                    "Only one tier can be the default for authenticated users."
                ),
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Name the existing default in the error, so the operator knows which to untick."""
        errors: dict[str, str] = {}
        for field, kind in self._DEFAULT_KINDS:
            others = Tier.objects.filter(**{field: True}).exclude(pk=self.pk)
            if getattr(self, field) and (other := others.first()) is not None:
                message = _("'%(name)s' is already the default tier for %(kind)s")
                errors[field] = str(message) % {"name": other.name, "kind": kind}
        if not self.factor_problems() and self.min_factor > self.load_factor:
            errors["min_factor"] = str(_("The floor cannot exceed the load factor."))
        if errors:
            raise ValidationError(errors)

    def row_problems(self) -> dict[str, str]:
        """Values the admin would refuse, by field (the compiler then ignores the field)."""
        return choice_problem(self, "failure_mode", FailureMode, _("failure mode"))

    def factor_problems(self) -> dict[str, str]:
        """Load factor and floor values the admin would refuse (written around it): the
        compiler then applies the tier's limits unscaled, never switching them off."""
        problems = {}
        for name in ("load_factor", "min_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
                problems[name] = f"{value!r} is not a percent from 1 to 100"
        return problems


class TierLimit(LimitFields):
    """A limit on everything a client of the tier does, whatever the endpoint."""

    ID_PREFIX = "t"
    SCOPE = ("tier_id", "shared")

    tier = models.ForeignKey(Tier, on_delete=models.CASCADE, related_name="limits")
    shared = models.BooleanField(
        _("for all clients of this tier together"),
        default=False,
        help_text=_(
            "one ceiling for every client of the tier together (e.g. all anonymous traffic, "
            "against address rotation) instead of one per client; each key shard (the ?shards= "
            "of DJANGO_THROTTLE_REDIS_URL) enforces its share, the rate divided by the number "
            "of shards and rounded up"
        ),
    )

    class Meta:
        ordering = ["tier", "pk"]
        verbose_name = _("tier limit")
        constraints = [range_check("burst", "django_throttle_tier_limit_burst_range", null=True)]

    def limit_name(self, rate: Rate) -> str:
        # The policy compiler loads tiers with select_related, so this costs no query there.
        shared = " shared" if self.shared else ""
        return f"{self.tier.slug} {limit_text(rate, self.algorithm)}{shared}{self.region_suffix()}"

    def __str__(self) -> str:
        text = super().__str__()
        shared = _("shared")  # outside the f-string, where makemessages finds it
        return f"{text}, {shared}" if self.shared else text


class TierAssignment(models.Model):
    """Puts one user, or every member of one group, in a tier."""

    tier = models.ForeignKey(Tier, on_delete=models.CASCADE, related_name="assignments")
    # One-to-one is a unique foreign key: a user or group is in at most one tier directly.
    user = optional_one_to_one(settings.AUTH_USER_MODEL, "throttle_assignment")
    group = optional_one_to_one("auth.Group", "throttle_assignment")
    note = models.CharField(max_length=255, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tier", "pk"]
        verbose_name = _("tier assignment")
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(user__isnull=False, group__isnull=True)
                    | Q(user__isnull=True, group__isnull=False)
                ),
                name="django_throttle_assignment_user_xor_group",
                violation_error_message=_("Assign exactly one user or one group."),
            ),
        ]

    def __str__(self) -> str:
        tier = self.tier.name if self.tier_id is not None else "no tier"
        return f"{subject(self) or 'nobody'} → {tier}"

    def clean(self) -> None:
        if self.user_id is not None and self.group_id is not None:
            msg = _("Choose a user or a group, not both")
            raise ValidationError({"user": msg, "group": msg})
        if self.user_id is None and self.group_id is None:
            raise ValidationError({"user": _("Choose a user or a group")})
