"""App configuration: registers system checks and signal receivers, nothing at import."""

from __future__ import annotations

from django.apps import AppConfig


class DjangoThrottleConfig(AppConfig):
    name = "django_throttle"
    verbose_name = "Throttle"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_throttle import checks, metrics, signals

        checks.register()
        signals.connect()
        metrics.connect()
