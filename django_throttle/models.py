"""Database rows an operator edits in the admin: tiers, their limits, endpoint rules, who is in
which tier, and the per-minute usage counts the flusher writes.

Every rate stored here is one :class:`~django_throttle.rates.Rate` accepts, so the policy
compiler can turn rows into :class:`~django_throttle.rates.Limit` values without surprises.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from django_throttle.rates import Algorithm, InvalidRate, Limit, Rate

__all__ = [
    "HTTP_METHODS",
    "EndpointLimit",
    "EndpointRule",
    "LimitFields",
    "Tier",
    "TierAssignment",
    "TierLimit",
    "UsageCount",
    "validate_rate",
]

#: Methods an endpoint rule may name, in the order they are written back after normalising.
HTTP_METHODS: tuple[str, ...] = (
    "GET",
    "HEAD",
    "POST",
    "PUT",
    "PATCH",
    "DELETE",
    "OPTIONS",
    "TRACE",
)


def validate_rate(value: str) -> None:
    """Accept exactly the rates :meth:`Rate.parse` accepts, with its explanation on failure."""
    try:
        Rate.parse(value)
    except InvalidRate as exc:
        raise ValidationError(str(exc), code="invalid_rate") from exc


class Tier(models.Model):
    """A class of client (free, pro, internal…) with its own limits."""

    _DEFAULT_KINDS = (
        ("is_default_anonymous", "anonymous clients"),
        ("is_default_authenticated", "authenticated users"),
    )

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    is_default_anonymous = models.BooleanField(
        "default for anonymous clients",
        default=False,
        help_text="clients that are not logged in and send no API key get this tier",
    )
    is_default_authenticated = models.BooleanField(
        "default for authenticated users",
        default=False,
        help_text="logged-in users with no assignment (direct or by group) get this tier",
    )
    priority = models.IntegerField(
        default=0,
        help_text="when a user's groups map to several tiers, the highest priority wins",
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
                violation_error_message="Only one tier can be the default for anonymous clients.",
            ),
            models.UniqueConstraint(
                fields=["is_default_authenticated"],
                condition=Q(is_default_authenticated=True),
                name="django_throttle_one_default_authenticated_tier",
                violation_error_message="Only one tier can be the default for authenticated users.",
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
                errors[field] = f"'{other.name}' is already the default tier for {kind}"
        if errors:
            raise ValidationError(errors)


class LimitFields(models.Model):
    """Rate, burst and algorithm shared by tier-wide and per-endpoint limits."""

    rate = models.CharField(
        max_length=32,
        validators=[validate_rate],
        help_text="requests per period, e.g. '100/min', '10/s', '5000/day' or '20/15m'",
    )
    burst = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="bucket capacity; empty = the rate's count",
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

    @property
    def capacity(self) -> int:
        """Most cost one burst can absorb. Raises :class:`InvalidRate` for a malformed rate."""
        return self.burst if self.burst is not None else Rate.parse(self.rate).count

    def to_limit(self) -> Limit:
        rate = Rate.parse(self.rate)
        return Limit.build(
            id=self.limit_id,
            rate=rate,
            burst=self.burst,
            algorithm=self.algorithm,
            name=self.limit_name(rate),
        )


class TierLimit(LimitFields):
    """A limit on everything a client of the tier does, whatever the endpoint."""

    tier = models.ForeignKey(Tier, on_delete=models.CASCADE, related_name="limits")

    class Meta:
        ordering = ["tier", "pk"]
        verbose_name = "tier limit"

    def __str__(self) -> str:
        return f"{self.rate} (burst {self.burst})" if self.burst else self.rate

    @property
    def limit_id(self) -> str:
        return f"t{self.pk}"

    def limit_name(self, rate: Rate) -> str:
        # The policy compiler loads tiers with select_related, so this costs no query there.
        return f"{self.tier.slug} {rate}"


class EndpointRule(models.Model):
    """Which requests form one endpoint, what each costs, and whether denials are enforced."""

    class MatchType(models.TextChoices):
        SCOPE = "scope", "DRF throttle scope"
        ROUTE = "route", "URL route name"
        PATH = "path", "Path prefix"

    name = models.CharField(max_length=100, unique=True)
    match_type = models.CharField(max_length=10, choices=MatchType.choices, default=MatchType.SCOPE)
    pattern = models.CharField(
        max_length=255,
        help_text=(
            "scope: a DRF throttle_scope; route: a URL name such as 'api:orders'; "
            "path: a prefix starting with '/'"
        ),
    )
    methods = models.CharField(
        max_length=100,
        blank=True,
        help_text="comma-separated HTTP methods, e.g. 'POST, PUT'; empty = all methods",
    )
    cost = models.PositiveIntegerField(
        default=1,
        validators=[MinValueValidator(1)],
        help_text="tokens one matching request takes from every limit that applies",
    )
    enabled = models.BooleanField(default=True)
    shadow = models.BooleanField(
        default=False, help_text="a would-deny is counted and logged, the request passes"
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["match_type", "pattern", "methods"],
                name="django_throttle_unique_endpoint_match",
                violation_error_message="Another rule has this match type, pattern and methods.",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def method_set(self) -> frozenset[str]:
        """Methods the rule covers; empty means every method."""
        return frozenset(m.strip().upper() for m in self.methods.split(",") if m.strip())

    def clean(self) -> None:
        """Normalise methods (so the uniqueness constraint sees one spelling) and check the
        pattern fits its match type."""
        errors: dict[str, str] = {}
        methods = self.method_set
        unknown = sorted(methods.difference(HTTP_METHODS))
        if unknown:
            errors["methods"] = (
                f"unknown HTTP method {', '.join(unknown)}: use {', '.join(HTTP_METHODS)}"
            )
        else:
            self.methods = ",".join(m for m in HTTP_METHODS if m in methods)
        pattern = (self.pattern or "").strip()
        self.pattern = pattern
        if not pattern:
            errors["pattern"] = "enter a pattern"
        elif any(c.isspace() for c in pattern):
            errors["pattern"] = "a pattern cannot contain spaces"
        elif self.match_type == self.MatchType.PATH and not pattern.startswith("/"):
            errors["pattern"] = f"a path prefix starts with '/', e.g. '/{pattern}'"
        elif self.match_type == self.MatchType.ROUTE and (
            pattern.startswith(":") or pattern.endswith(":") or "::" in pattern
        ):
            errors["pattern"] = "a route name is 'name' or 'namespace:name'"
        if errors:
            raise ValidationError(errors)


class EndpointLimit(LimitFields):
    """A limit on one endpoint for clients of one tier, on top of the tier's own limits."""

    rule = models.ForeignKey(EndpointRule, on_delete=models.CASCADE, related_name="limits")
    tier = models.ForeignKey(Tier, on_delete=models.CASCADE, related_name="endpoint_limits")

    class Meta:
        ordering = ["rule", "tier", "pk"]
        verbose_name = "endpoint limit"
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "tier", "rate"],
                name="django_throttle_unique_endpoint_limit",
                violation_error_message="This rule already has this rate for this tier.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.rate} (burst {self.burst})" if self.burst else self.rate

    @property
    def limit_id(self) -> str:
        return f"e{self.pk}"

    def limit_name(self, rate: Rate) -> str:
        return f"{self.rule.name} ({self.tier.slug}) {rate}"


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
        verbose_name = "tier assignment"
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(user__isnull=False, group__isnull=True)
                    | Q(user__isnull=True, group__isnull=False)
                ),
                name="django_throttle_assignment_user_xor_group",
                violation_error_message="Assign exactly one user or one group.",
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
            msg = "Choose a user or a group, not both"
            raise ValidationError({"user": msg, "group": msg})
        if self.user_id is None and self.group_id is None:
            raise ValidationError({"user": "Choose a user or a group"})


class UsageCount(models.Model):
    """Allowed and denied requests of one client in one minute, written by the usage flusher."""

    window_start = models.DateTimeField(
        db_index=True, help_text="start of a one-minute window, UTC"
    )
    client = models.CharField(max_length=200, help_text="e.g. 'user:42', 'ip:203.0.113.0/24'")
    tier = models.CharField(max_length=100, blank=True, help_text="tier slug")
    endpoint = models.CharField(max_length=100, blank=True, help_text="endpoint rule name or scope")
    allowed = models.PositiveBigIntegerField(default=0)
    denied = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-window_start", "client"]
        verbose_name = "usage count"
        constraints = [
            models.UniqueConstraint(
                fields=["window_start", "client", "tier", "endpoint"],
                name="django_throttle_unique_usage_window",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.client} {self.endpoint or '*'} @ {self.window_start:%Y-%m-%d %H:%M}"
