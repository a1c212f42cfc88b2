"""App configuration: registers system checks and signal receivers, nothing at import."""

from __future__ import annotations

from django.apps import AppConfig
from django.core.checks import Tags
from django.core.checks import register as register_check


class DjangoThrottleConfig(AppConfig):
    name = "django_throttle"
    verbose_name = "Throttle"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_throttle import checks, metrics, row_checks, signals

        checks.register()
        # Reads the key table: runs with `manage.py check --database …` (and the test runner),
        # never breaks `check` on a machine without a database.
        register_check(checks.check_api_key_owners, Tags.database)
        row_checks.register()
        signals.connect()
        metrics.connect()
