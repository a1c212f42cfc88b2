"""What the policy models share: the bad-row error, failure-mode choices, the rate validator,
the bounded count field and its database check (bounds from :mod:`~django_throttle.rates`),
and the optional user or group a row names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from django_throttle.rates import MAX_COUNT, InvalidRate, Rate

if TYPE_CHECKING:
    from django.utils.functional import _StrPromise

    StrOrPromise = str | _StrPromise

#: Methods an endpoint rule may name, in the order they are written back after normalising.
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")


class BadRow(ValueError):
    """A stored row holds a value no limit can be built from; ``field`` names the column."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class FailureMode(models.TextChoices):
    """What a request meets when the counting backend cannot answer."""

    INHERIT = "", _("inherit (tier, else the DJANGO_THROTTLE_FAILURE_MODE setting)")
    OPEN = "open", _("open: serve the request uncounted")
    CLOSED = "closed", _("closed: refuse the request (503 + Retry-After)")
    LOCAL = "local", _("local: count in this process only")


def failure_mode_field(help_text: StrOrPromise) -> models.CharField[Any, Any]:
    """A tier's or rule's own failure mode; blank inherits the next one down."""
    return models.CharField(
        _("failure mode"),
        max_length=10,
        choices=FailureMode.choices,
        default=FailureMode.INHERIT,
        blank=True,
        help_text=help_text,
    )


def validate_rate(value: str) -> None:
    """Accept exactly the rates :meth:`Rate.parse` accepts, with its explanation on failure."""
    try:
        Rate.parse(value)
    except InvalidRate as exc:
        raise ValidationError(str(exc), code="invalid_rate") from exc


def count_field(
    at_least: StrOrPromise, at_most: StrOrPromise, **kwargs: Any
) -> models.IntegerField[Any, Any]:
    """A whole number in [1, MAX_COUNT] with one message per bound (``%(limit_value)s`` is
    the bound). A plain IntegerField, so the admin form adds no '≥ 0' error of its own."""
    return models.IntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_COUNT)],
        error_messages={"min_value": at_least, "max_value": at_most},
        **kwargs,
    )


def range_check(field: str, name: str, null: bool = False) -> models.CheckConstraint:
    """The database's copy of the count bounds (``null``: or empty)."""
    in_range = Q(**{f"{field}__gte": 1, f"{field}__lte": MAX_COUNT})
    return models.CheckConstraint(
        condition=Q(**{f"{field}__isnull": True}) | in_range if null else in_range, name=name
    )


def optional_one_to_one(to: str, related_name: str) -> models.OneToOneField[Any, Any]:
    """A user or group a row may name (one row each at most): one of the row's kinds."""
    return models.OneToOneField(
        to, on_delete=models.CASCADE, null=True, blank=True, related_name=related_name
    )


def subject(row: Any) -> str:
    """Whom a row with an optional user and group names: ``"user <user>"``, ``"group
    <group>"``, or "" when it names neither."""
    if row.user_id is not None:
        return f"user {row.user}"
    if row.group_id is not None:
        return f"group {row.group}"
    return ""


def choice_problem(
    row: models.Model, field: str, choices: type[models.TextChoices], what: StrOrPromise
) -> dict[str, str]:
    """Why ``row``'s ``field`` is not one of ``choices`` (a value written around the admin),
    by field as ``row_problems()`` says it: empty when it is one."""
    value = getattr(row, field)
    if value in choices.values:
        return {}
    message = str(_("unknown %(what)s %(value)r: use %(choices)s")) % {
        "what": what,
        "value": value,
        "choices": ", ".join(repr(v) for v in choices.values),
    }
    return {field: message}
