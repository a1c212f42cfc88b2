"""Endpoint rules (which requests form an endpoint, their cost) and their per-tier limits."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from django.core.exceptions import ValidationError
from django.db import models
from django.utils.encoding import repercent_broken_unicode
from django.utils.translation import gettext_lazy as _

from django_throttle.models.fields import (
    HTTP_METHODS,
    FailureMode,
    choice_problem,
    count_field,
    failure_mode_field,
    range_check,
)
from django_throttle.models.limits import LimitFields
from django_throttle.models.tiers import Tier
from django_throttle.rates import MAX_COUNT, Rate, limit_text


class EndpointRule(models.Model):
    """Which requests form one endpoint, what each costs, and whether denials are enforced."""

    class MatchType(models.TextChoices):
        SCOPE = "scope", _("DRF throttle scope")
        ROUTE = "route", _("URL route name")
        PATH = "path", _("Path prefix")

    class Criticality(models.TextChoices):
        """How much of the service's capacity the rule's requests may take when it is
        saturated (see :class:`~django_throttle.models.Protection`)."""

        CRITICAL = "critical", _("critical (never shed before the others)")
        DEFAULT = "default", _("default")
        SHEDDABLE = "sheddable", _("sheddable (shed first)")

    class Counts(models.TextChoices):
        """Which finished requests keep the tokens they took (the others are refunded)."""

        ALL = "all", _("all requests")
        SUCCESS = "success", _("successes only (status below 400)")
        FAILURES = "failures", _("failures only (status 400-499, or a failed login)")

    name = models.CharField(max_length=100, unique=True)
    match_type = models.CharField(max_length=10, choices=MatchType.choices, default=MatchType.SCOPE)
    pattern = models.CharField(
        max_length=255,
        help_text=_(
            "scope: a DRF throttle_scope; route: a URL name such as 'api:orders'; "
            "path: a prefix starting with '/'"
        ),
    )
    methods = models.CharField(
        max_length=100,
        blank=True,
        help_text=_("comma-separated HTTP methods, e.g. 'POST, PUT'; empty = all methods"),
    )
    cost = count_field(
        _("The cost must be at least %(limit_value)s."),
        _("The cost must be at most %(limit_value)s."),
        default=1,
        help_text=_("tokens one matching request takes from every limit that applies"),
    )
    enabled = models.BooleanField(default=True)
    shadow = models.BooleanField(
        default=False, help_text=_("a would-deny is counted and logged, the request passes")
    )
    failure_mode = failure_mode_field(
        _(
            "what matching requests meet when Redis cannot answer; blank: the tier's, else the "
            "setting. Credential endpoints (login, token) are counted in each process where "
            "that says 'open'; 'closed' refuses every attempt instead"
        )
    )
    counts = models.CharField(
        _("counts"),
        max_length=10,
        choices=Counts.choices,
        default=Counts.ALL,
        help_text=_(
            "which requests use up the limits: every request takes its cost when it arrives "
            "(so concurrent requests never pass the limit together), and gets it back when it "
            "ends in an outcome this rule does not count; 'failures' suits a login or token "
            "endpoint (a wrong password, or any 4xx, counts)"
        ),
    )
    criticality = models.CharField(
        max_length=10,
        choices=Criticality.choices,
        default=Criticality.DEFAULT,
        help_text=_(
            "when the service is saturated (Service protection), sheddable requests are "
            "refused first, then default ones; critical ones keep the capacity reserved for them"
        ),
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["match_type", "pattern", "methods"],
                name="django_throttle_unique_endpoint_match",
                violation_error_message=_("Another rule has this match type, pattern and methods."),
            ),
            range_check("cost", "django_throttle_endpoint_rule_cost_range"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def method_set(self) -> frozenset[str]:
        """Methods the rule covers; empty means every method."""
        return frozenset(m.strip().upper() for m in self.methods.split(",") if m.strip())

    def row_problems(self) -> dict[str, str]:
        """Values the admin would refuse, by field (empty when the rule is usable)."""
        errors: dict[str, str] = {}
        unknown = sorted(self.method_set.difference(HTTP_METHODS))
        if unknown:
            errors["methods"] = str(_("unknown HTTP method %(unknown)s: use %(known)s")) % {
                "unknown": ", ".join(unknown),
                "known": ", ".join(HTTP_METHODS),
            }
        errors |= (
            choice_problem(self, "match_type", self.MatchType, _("match type"))
            | choice_problem(self, "failure_mode", FailureMode, _("failure mode"))
            | choice_problem(self, "counts", self.Counts, _("counting policy"))
            | choice_problem(self, "criticality", self.Criticality, _("criticality"))
        )
        if isinstance(self.cost, bool) or not isinstance(self.cost, int):
            errors["cost"] = str(_("the cost must be a whole number"))
        elif not 1 <= self.cost <= MAX_COUNT:
            message = _("the cost must be between 1 and %(max)s, not %(cost)s")
            errors["cost"] = str(message) % {"max": MAX_COUNT, "cost": self.cost}
        pattern = (self.pattern or "").strip()
        if not pattern:
            errors["pattern"] = str(_("enter a pattern"))
        elif any(c.isspace() for c in pattern):
            errors["pattern"] = str(_("a pattern cannot contain spaces"))
        elif self.match_type == self.MatchType.PATH and (problem := path_problem(pattern)):
            errors["pattern"] = problem
        elif self.match_type == self.MatchType.ROUTE and (
            pattern.startswith(":") or pattern.endswith(":") or "::" in pattern
        ):
            errors["pattern"] = str(_("a route name is 'name' or 'namespace:name'"))
        return errors

    def clean(self) -> None:
        """Normalise methods (so the uniqueness constraint sees one spelling) and check the
        pattern fits its match type. Cost and choices are their fields' own errors."""
        self.pattern = (self.pattern or "").strip()
        problems = self.row_problems()
        errors: dict[str, str] = {f: problems[f] for f in ("methods", "pattern") if f in problems}
        if "methods" not in errors:
            self.methods = ",".join(m for m in HTTP_METHODS if m in self.method_set)
        if errors:
            raise ValidationError(errors)


def path_problem(pattern: str) -> str:
    """Why a path prefix could never match a request's path as Django gives it (decoded, no
    query string, no scheme or host), with the spelling that would; "" when it could."""
    if "://" in pattern or pattern.startswith("//"):  # a URL (or one without its scheme)
        path = "/" + pattern.partition("//")[2].partition("/")[2]
        message = _("a path prefix is the path alone, without scheme or host: '%(path)s'")
        return str(message) % {"path": path.partition("?")[0].partition("#")[0]}
    if not pattern.startswith("/"):
        return str(_("a path prefix starts with '/', e.g. '/%(pattern)s'")) % {"pattern": pattern}
    for mark, message in (
        ("?", _("a path prefix never holds a query string ('?'): the path is '%(path)s'")),
        ("#", _("a browser never sends the part from '#' on: the path is '%(path)s'")),
    ):
        if mark in pattern:
            return str(message) % {"path": pattern.partition(mark)[0]}
    if "*" in pattern:
        message = _(
            "a path prefix is matched as written, '*' is no wildcard: '%(path)s' covers "
            "everything below it"
        )
        return str(message) % {"path": pattern.partition("*")[0].rpartition("/")[0] + "/"}
    # Requests are matched by their path as Django decodes it (/caf%C3%A9/ is /café/; bytes
    # that are not UTF-8 stay escaped, in capitals), so an escape in a pattern never matches.
    decoded = repercent_broken_unicode(unquote_to_bytes(pattern)).decode()
    if decoded == pattern:
        return ""
    if any(c.isspace() for c in decoded):
        message = _(
            "requests are matched by their decoded path, which here holds a space: name "
            "its view with a route rule instead"
        )
        return str(message)
    message = _("requests are matched by their decoded path: write '%(path)s'")
    return str(message) % {"path": decoded}


class EndpointLimit(LimitFields):
    """A limit on one endpoint for clients of one tier, on top of the tier's own limits."""

    ID_PREFIX = "e"
    SCOPE = ("rule_id", "tier_id", "counted_by")

    class CountedBy(models.TextChoices):
        """Whose requests share this limit's counter."""

        CLIENT = "client", _("client (API key, else user, else IP address)")
        IP = "ip", _("IP address")
        USERNAME = "username", _("username presented (login and token requests)")

    rule = models.ForeignKey(EndpointRule, on_delete=models.CASCADE, related_name="limits")
    tier = models.ForeignKey(Tier, on_delete=models.CASCADE, related_name="endpoint_limits")
    counted_by = models.CharField(
        _("counted by"),
        max_length=10,
        choices=CountedBy.choices,
        default=CountedBy.CLIENT,
        help_text=_(
            "whose requests share the counter: the client as identified (API key, user, IP), "
            "the IP address even for a signed-in user, or the username a login or token "
            "request presents (to slow password guessing spread over many addresses; "
            "requests that present no username skip this limit)"
        ),
    )

    class Meta:
        ordering = ["rule", "tier", "pk"]
        verbose_name = _("endpoint limit")
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "tier", "rate", "regions"],
                name="django_throttle_unique_endpoint_limit_region",
                violation_error_message=_(
                    "This rule already has this rate for this tier and these regions."
                ),
            ),
            range_check("burst", "django_throttle_endpoint_limit_burst_range", null=True),
        ]

    def row_problems(self) -> dict[str, str]:
        """The limit's problems, and a counted-by value written around the admin."""
        counted_by = choice_problem(self, "counted_by", self.CountedBy, _("counted by"))
        return super().row_problems() | counted_by

    def limit_name(self, rate: Rate) -> str:
        text = limit_text(rate, self.algorithm)
        return f"{self.rule.name} ({self.tier.slug}) {text}{self.region_suffix()}"
