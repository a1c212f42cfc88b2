"""Per-minute usage counts, copied from the backend by the rollup and read by
``throttle_usage`` (see :mod:`django_throttle.usage.reports`)."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class UsageCount(models.Model):
    """What happened to requests in one minute, copied from the backend by the rollup.

    Two kinds of rows: a tier x endpoint total (``client`` is ``"*"``: every client, exact)
    and a per-client row (``tier`` and ``endpoint`` are ``"*"``) for the heaviest clients of
    the minute. Each request is counted in exactly one outcome column; their sum is all
    requests. ``delayed`` and ``waited_ms`` (totals only) say how many of the allowed waited
    for their turn, and how long in all.
    """

    #: ``client`` of a total row, ``tier`` and ``endpoint`` of a per-client row.
    ALL = "*"

    window_start = models.DateTimeField(
        db_index=True, help_text=_("start of a one-minute window, UTC")
    )
    client = models.CharField(
        max_length=200,
        help_text=_("e.g. 'user:42', 'ip:203.0.113.7'; '*' on a tier and endpoint total"),
    )
    tier = models.CharField(
        max_length=100, blank=True, help_text=_("tier slug; '*' on a per-client row")
    )
    endpoint = models.CharField(
        max_length=100,
        blank=True,
        help_text=_("endpoint rule name or scope; '*' on a per-client row"),
    )
    allowed = models.PositiveBigIntegerField(default=0, help_text=_("served within the limits"))
    denied = models.PositiveBigIntegerField(
        default=0, help_text=_("refused with 429 (or 503 when shed, see below)")
    )
    shadow_denied = models.PositiveBigIntegerField(
        _("shadow would-deny"),
        default=0,
        help_text=_("served, but a shadow rule would have denied them"),
    )
    failed_open = models.PositiveBigIntegerField(
        default=0, help_text=_("served uncounted because the limiter was unavailable")
    )
    failed_closed = models.PositiveBigIntegerField(
        default=0, help_text=_("refused because the limiter was unavailable")
    )
    delayed = models.PositiveBigIntegerField(
        default=0,
        help_text=_(
            "served after waiting their turn (a delaying limit); part of allowed. "
            "Tier and endpoint totals only"
        ),
    )
    waited_ms = models.PositiveBigIntegerField(
        _("waited (ms)"),
        default=0,
        help_text=_("the delayed requests' waits summed, in milliseconds"),
    )
    shed = models.PositiveBigIntegerField(
        default=0,
        help_text=_(
            "refused with 503 to protect the service (load shedding); part of denied. Tier "
            "and endpoint totals only"
        ),
    )

    class Meta:
        ordering = ["-window_start", "client"]
        verbose_name = _("usage count")
        constraints = [
            models.UniqueConstraint(
                fields=["window_start", "client", "tier", "endpoint"],
                name="django_throttle_unique_usage_window",
            ),
        ]

    def __str__(self) -> str:
        where = f"{self.tier or '-'} {self.endpoint or '-'}"
        return f"{self.client} {where} @ {self.window_start:%Y-%m-%d %H:%M}"
