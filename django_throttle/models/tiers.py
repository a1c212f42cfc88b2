"""Tiers, their tier-wide limits, and who is in which tier."""

from __future__ import annotations

import dataclasses

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from django_throttle.models.fields import (
    BadRow,
    FailureMode,
    choice_problem,
    count_field,
    failure_mode_field,
    in_range,
    validate_rate,
)
from django_throttle.rates import MAX_COUNT, Algorithm, InvalidRate, Limit, Rate


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
            "failure mode wins"
        )
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
            if not getattr(self, field):
                continue
            other = Tier.objects.filter(**{field: True}).exclude(pk=self.pk).first()
            if other is not None:
                errors[field] = str(_("'%(name)s' is already the default tier for %(kind)s")) % {
                    "name": other.name,
                    "kind": kind,
                }
        if errors:
            raise ValidationError(errors)

    def row_problems(self) -> dict[str, str]:
        """Values the admin would refuse, by field (the compiler then ignores the field)."""
        problem = choice_problem(self.failure_mode, FailureMode, _("failure mode"))
        return {} if problem is None else {"failure_mode": problem}


class LimitFields(models.Model):
    """Rate, burst and algorithm shared by tier-wide and per-endpoint limits."""

    rate = models.CharField(
        max_length=32,
        validators=[validate_rate],
        help_text=_("requests per period, e.g. '100/min', '10/s', '5000/day' or '20/15m'"),
    )
    burst = count_field(
        _("The burst must be at least %(limit_value)s."),
        _("The burst must be at most %(limit_value)s."),
        null=True,
        blank=True,
        help_text=_("bucket capacity; empty = the rate's count"),
    )
    algorithm = models.CharField(
        max_length=32, choices=Algorithm.choices, default=Algorithm.TOKEN_BUCKET
    )

    class Meta:
        abstract = True

    @property
    def limit_id(self) -> str:
        """Stable, short counter id; becomes part of a Redis key."""
        raise NotImplementedError

    def limit_name(self, rate: Rate) -> str:
        """What clients see in the 429 body and policy headers."""
        raise NotImplementedError

    def validated_limit(self) -> Limit:
        """The limit this row's values describe, without id or name (no related rows read).

        :class:`~django_throttle.rates.Limit` is the one judge of what a limit may be; this
        only says which column a refusal belongs to. Raises :class:`BadRow`.
        """
        try:
            rate = Rate.parse(self.rate)
        except InvalidRate as exc:
            raise BadRow("rate", str(exc)) from exc
        problem = choice_problem(self.algorithm, Algorithm, _("algorithm"))
        if problem is not None:
            raise BadRow("algorithm", problem)
        try:
            return Limit.build(id="", rate=rate, burst=self.burst, algorithm=self.algorithm)
        except InvalidRate as exc:
            raise BadRow("burst", str(exc)) from exc

    @property
    def capacity(self) -> int:
        """Most cost one burst can absorb. Raises :class:`BadRow` for a bad row."""
        return self.validated_limit().capacity

    def to_limit(self) -> Limit:
        """The compiled limit. Raises :class:`BadRow` naming the bad column."""
        limit = self.validated_limit()
        return dataclasses.replace(limit, id=self.limit_id, name=self.limit_name(limit.rate))

    def row_problems(self) -> dict[str, str]:
        """Why no limit can be built from this row, by field (empty when it can)."""
        try:
            self.validated_limit()
        except BadRow as exc:
            return {exc.field: exc.message}
        return {}

    def clean(self) -> None:
        """Refuse a burst that takes longer than ``MAX_WINDOW`` to refill, with the limit's
        own message. A bad rate, an out-of-range burst and an unknown algorithm are their
        fields' errors already (one message each), so they are not repeated here."""
        if self.burst is None or not 1 <= self.burst <= MAX_COUNT:
            return
        problem = self.row_problems()
        if "burst" in problem:
            raise ValidationError({"burst": problem["burst"]})


class TierLimit(LimitFields):
    """A limit on everything a client of the tier does, whatever the endpoint."""

    tier = models.ForeignKey(Tier, on_delete=models.CASCADE, related_name="limits")

    class Meta:
        ordering = ["tier", "pk"]
        verbose_name = _("tier limit")
        constraints = [
            models.CheckConstraint(
                condition=Q(burst__isnull=True) | in_range("burst"),
                name="django_throttle_tier_limit_burst_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.rate} (burst {self.burst})" if self.burst else self.rate

    @property
    def limit_id(self) -> str:
        return f"t{self.pk}"

    def limit_name(self, rate: Rate) -> str:
        # The policy compiler loads tiers with select_related, so this costs no query there.
        return f"{self.tier.slug} {rate}"


class TierAssignment(models.Model):
    """Puts one user, or every member of one group, in a tier."""

    tier = models.ForeignKey(Tier, on_delete=models.CASCADE, related_name="assignments")
    # One-to-one is a unique foreign key: a user or group is in at most one tier directly.
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="throttle_assignment",
    )
    group = models.OneToOneField(
        "auth.Group",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="throttle_assignment",
    )
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
        if self.user_id is not None:
            return f"user {self.user} → {tier}"
        if self.group_id is not None:
            return f"group {self.group} → {tier}"
        return f"nobody → {tier}"

    def clean(self) -> None:
        if self.user_id is not None and self.group_id is not None:
            msg = _("Choose a user or a group, not both")
            raise ValidationError({"user": msg, "group": msg})
        if self.user_id is None and self.group_id is None:
            raise ValidationError({"user": _("Choose a user or a group")})
