"""The columns a limit row shares (tier-wide and per-endpoint): rate, algorithm, burst, delay
and longest wait, and time zone, and how a row becomes a :class:`~django_throttle.rates.Limit`.

:class:`~django_throttle.rates.Limit` is the one judge of what a limit may be; a row only says
which column a refusal belongs to, so the admin puts each message on the field to change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import TYPE_CHECKING, ClassVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from django_throttle.backends.base import per_shard
from django_throttle.conf import app_settings
from django_throttle.identity import region_codes
from django_throttle.models.fields import BadRow, choice_problem, count_field, validate_rate
from django_throttle.rates import (
    MAX_COUNT,
    MAX_WINDOW,
    TOKEN_ALGORITHMS,
    Algorithm,
    InvalidRate,
    Limit,
    Rate,
    rate_text,
)

if TYPE_CHECKING:
    from django_throttle.models.fields import StrOrPromise


#: What the rate means under each algorithm, for the admin (help next to the select).
ALGORITHM_HELP: dict[str, StrOrPromise] = {
    Algorithm.TOKEN_BUCKET: _(
        "The rate is the refill speed: one request's worth comes back every period ÷ count; "
        "the burst is how many may come at once (empty = the count)."
    ),
    Algorithm.GCRA: _(
        "The token bucket's limits, timed to the microsecond: one request every period ÷ "
        "count, and up to the burst at once (empty = the count)."
    ),
    Algorithm.LEAKY_BUCKET: _(
        "Requests fill a queue of burst places (empty = the count) that drains at the rate: "
        "once it is full, one request every period ÷ count."
    ),
    Algorithm.FIXED_WINDOW: _(
        "At most count requests per period, counted in windows on the clock (10:00, "
        "10:01, …); up to twice the count can pass around a window's edge."
    ),
    Algorithm.SLIDING_LOG: _(
        "At most count requests in any period-long span, exactly: every request is kept, "
        "so the count is at most 10,000."
    ),
    Algorithm.SLIDING_COUNTER: _(
        "About count requests in any period-long span, estimated from this window and the "
        "previous one: little memory, any count."
    ),
    Algorithm.CALENDAR: _(
        "count requests per calendar day, week (from Monday), month or year, e.g. "
        "'10000/month'; it resets at midnight in the time zone (empty = the site's TIME_ZONE)."
    ),
    Algorithm.CONCURRENCY: _(
        "At most count requests in flight at once, each holding its slot until its response "
        "ends; the period is the lease: a killed worker's slot is free again within it. "
        "Every request takes one slot, whatever its cost."
    ),
}
#: The optional fields each algorithm uses; the admin shows only these.
ALGORITHM_FIELDS: dict[str, tuple[str, ...]] = {
    **{algorithm: ("burst",) for algorithm in TOKEN_ALGORITHMS},
    Algorithm.GCRA: ("burst", "delay", "max_wait"),
    Algorithm.CALENDAR: ("timezone",),
}
#: The columns of a limit row, all judged together by :class:`~django_throttle.rates.Limit`.
LIMIT_FIELDS = ("rate", "algorithm", "burst", "delay", "max_wait", "timezone")


def regions_message(bad: list[str]) -> str:
    return str(
        _(
            "%(bad)s is no region code: give codes of letters, digits and '-' (at most 16), "
            "separated by commas, e.g. 'FR, DE'"
        )
    ) % {"bad": ", ".join(repr(b[:40]) for b in bad)}


def validate_regions(value: str) -> None:
    """The ``regions`` field's validator: every comma-separated entry a region code."""
    if bad := region_codes(value)[1]:
        raise ValidationError(regions_message(bad), code="invalid")


class LimitFields(models.Model):
    """Rate, algorithm, burst, delay, longest wait and time zone shared by tier-wide and
    per-endpoint limits."""

    rate = models.CharField(
        max_length=32,
        validators=[validate_rate],
        help_text=_(
            "requests per period, e.g. '100/min', '10/s', '5000/day' or '20/15min'; "
            "'10000/month' or '/year' with the calendar quota; with concurrency, requests "
            "in flight at once per lease, e.g. '2/min': two at a time, a killed worker's "
            "slot free again within a minute"
        ),
    )
    burst = count_field(
        _("The burst must be at least %(limit_value)s."),
        _("The burst must be at most %(limit_value)s."),
        null=True,
        blank=True,
        help_text=_(
            "token bucket, GCRA and leaky bucket only: how many requests may come at once "
            "(the leaky bucket's queue size; with a delay, served or waiting their turn); "
            "empty = the rate's count"
        ),
    )
    algorithm = models.CharField(
        max_length=32,
        choices=Algorithm.choices,
        default=Algorithm.TOKEN_BUCKET,
        help_text=_(
            "how requests are counted: token bucket, GCRA and leaky bucket allow a burst; "
            "the window algorithms allow the rate's count per window; the calendar quota "
            "counts per calendar day, week, month or year; concurrency limits the requests "
            "in flight at once"
        ),
    )
    delay = models.IntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0), MaxValueValidator(MAX_COUNT - 1)],
        help_text=_(
            "GCRA only: delay instead of refusing, as nginx's delay: of the burst's "
            "requests, this many plus one are served at once and the rest wait their turn, "
            "one period ÷ count apart (0 paces all but the first); empty = refuse beyond "
            "the rate"
        ),
    )
    max_wait = models.FloatField(
        _("longest wait"),
        null=True,
        blank=True,
        validators=[MinValueValidator(0.001), MaxValueValidator(float(MAX_WINDOW))],
        help_text=_(
            "with a delay: the longest a request may wait for its turn, in seconds; "
            "empty = what the burst allows, at most 10 s"
        ),
    )
    timezone = models.CharField(
        _("time zone"),
        max_length=64,
        blank=True,
        default="",
        help_text=_(
            "calendar quota only: where its days start, as an IANA name such as "
            "'Europe/Berlin'; empty = the TIME_ZONE setting"
        ),
    )

    regions = models.CharField(
        _("regions"),
        max_length=200,
        blank=True,
        default="",
        validators=[validate_regions],
        help_text=_(
            "comma-separated region codes (as DJANGO_THROTTLE_REGION_SOURCE gives them, e.g. "
            "'FR, DE'): this limit applies to clients from those regions instead of the rows "
            "that name none; empty = every region without rows of its own"
        ),
    )

    class Meta:
        abstract = True

    def __str__(self) -> str:
        algorithm = "" if self.algorithm == Algorithm.TOKEN_BUCKET else self.algorithm_name
        burst = f"burst {self.burst}" if self.burst else ""
        delay = "" if self.delay is None else f"delay {self.delay}"
        wait = "" if self.max_wait is None else f"waits at most {self.max_wait:g} s"
        details = ", ".join(filter(None, (algorithm, burst, delay, wait, self.timezone)))
        rate = rate_text(self.rate)
        if self.regions:
            details = ", ".join(filter(None, (details, self.regions)))
        return f"{rate} ({details})" if details else rate

    @property
    def region_set(self) -> tuple[str, ...]:
        """The regions this row names, sorted (empty: the default row of every region)."""
        return region_codes(self.regions)[0]

    def region_suffix(self) -> str:
        """What the limit's name adds for a regional row (" [FR,DE]"), else ""."""
        return f" [{','.join(self.region_set)}]" if self.region_set else ""

    @property
    def algorithm_name(self) -> str:
        """The algorithm's label as in a sentence (the stored value when it is unknown)."""
        if self.algorithm not in Algorithm.values:
            return self.algorithm
        label = str(Algorithm(self.algorithm).label)
        return label if label.isupper() else label.lower()

    #: The first letter of the counter id of this kind of row.
    ID_PREFIX: ClassVar[str]
    #: The columns besides the limit's own that make two rows count apart (the parent,
    #: whose clients, how they share the counter).
    SCOPE: ClassVar[tuple[str, ...]]

    @property
    def limit_id(self) -> str:
        """Stable, short counter id; becomes part of a Redis key."""
        return f"{self.ID_PREFIX}{self.pk}"

    def limit_name(self, rate: Rate) -> str:
        """What clients see in the 429 body and policy headers."""
        raise NotImplementedError

    def zone(self) -> str:
        """The time zone the limit counts in: a calendar quota's own, else the TIME_ZONE
        setting (read now, so ``override_settings`` applies); other algorithms have none."""
        if self.timezone or self.algorithm != Algorithm.CALENDAR:
            return self.timezone
        return settings.TIME_ZONE or ""

    def validated_limit(self) -> Limit:
        """The limit this row's values describe, without id or name (no related rows read).

        :class:`~django_throttle.rates.Limit` is the one judge of what a limit may be; this
        only says which column a refusal belongs to. Raises :class:`BadRow`.
        """
        try:
            Rate.parse(self.rate)
        except InvalidRate as exc:
            raise BadRow("rate", str(exc)) from exc
        if problem := choice_problem(self, "algorithm", Algorithm, _("algorithm")):
            raise BadRow("algorithm", problem["algorithm"])
        try:
            # The text, not the parsed rate: a calendar quota reads "/day" as a calendar day.
            shared = getattr(self, "shared", False)  # only a tier limit has the column
            return Limit.build(
                "",
                self.rate,
                self.burst,
                self.algorithm,
                timezone=self.zone(),
                shared=shared,
                delay=self.delay,
                max_wait=self.max_wait,
            )
        except InvalidRate as exc:
            raise BadRow(exc.field, str(exc)) from exc

    @property
    def capacity(self) -> int:
        """Most cost one request may have; for a shared limit, what one key shard holds
        (its share of the ceiling). Raises :class:`BadRow` for a bad row."""
        return per_shard(self.validated_limit(), app_settings.key_shards).capacity

    def to_limit(self) -> Limit:
        """The compiled limit. Raises :class:`BadRow` naming the bad column."""
        limit = self.validated_limit()
        return dataclasses.replace(limit, id=self.limit_id, name=self.limit_name(limit.rate))

    def duplicate_key(self) -> tuple[object, ...] | None:
        """What this row counts, and for whom: two rows with the same key are one limit
        written twice (every request would take its cost from both), ``None`` for a row no
        limit can be built from. Rates compare as parsed ('10/m' is '10/min'), and an empty
        time zone as the zone it stands for."""
        try:
            limit = self.validated_limit()
        except BadRow:
            return None
        scope = (getattr(self, column) for column in self.SCOPE)
        return (type(self).__name__, *scope, self.region_set, limit)

    def row_problems(self) -> dict[str, str]:
        """Why no limit can be built from this row, by field (empty when it can)."""
        if bad := region_codes(self.regions)[1]:
            return {"regions": regions_message(bad)}
        try:
            self.validated_limit()
        except BadRow as exc:
            return {exc.field: exc.message}
        return {}

    def clean_fields(self, exclude: Collection[str] | None = None) -> None:
        # A field the form refused (it excludes those) or refused here has its one message
        # already: clean() needs to know.
        self._refused = set(exclude or ())
        try:
            super().clean_fields(exclude)
        except ValidationError as exc:
            self._refused.update(exc.error_dict)
            raise

    def clean(self) -> None:
        """Refuse values that are fine alone but not together (a burst for a window
        algorithm, '/month' without the calendar quota, an unknown time zone…), with the
        limit's own message on the field to change. A bad rate, an out-of-range burst and an
        unknown algorithm are their fields' errors already, and a field a form refused is
        not validated here: every mistake gets exactly one message."""
        refused: set[str] = self.__dict__.pop("_refused", set())
        if "regions" not in refused:
            # One spelling ("DE,FR"), so the uniqueness constraint sees one.
            self.regions = ",".join(self.region_set)
        if refused.intersection(LIMIT_FIELDS):
            return
        # Only the limit's columns: any other field's problem is that field's own error.
        if problems := {f: m for f, m in self.row_problems().items() if f in LIMIT_FIELDS}:
            raise ValidationError(problems)
