"""Per-minute usage counts, written by the usage flusher and read by ``throttle_usage``."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class UsageCount(models.Model):
    """What happened to one client's requests in one minute, written by the usage flusher.

    Each request is counted in exactly one column; their sum is all requests.
    """

    window_start = models.DateTimeField(
        db_index=True, help_text=_("start of a one-minute window, UTC")
    )
    client = models.CharField(max_length=200, help_text=_("e.g. 'user:42', 'ip:203.0.113.0/24'"))
    tier = models.CharField(max_length=100, blank=True, help_text=_("tier slug"))
    endpoint = models.CharField(
        max_length=100, blank=True, help_text=_("endpoint rule name or scope")
    )
    allowed = models.PositiveBigIntegerField(default=0, help_text=_("served within the limits"))
    denied = models.PositiveBigIntegerField(default=0, help_text=_("refused with 429"))
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
        return f"{self.client} {self.endpoint or '*'} @ {self.window_start:%Y-%m-%d %H:%M}"
