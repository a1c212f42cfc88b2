"""System checks: one per ``DJANGO_THROTTLE_*`` setting, ids ``django_throttle.E001``…, one
(W001) for a ``DJANGO_THROTTLE_*`` name that is no setting, and the checks that read stored
rows (W003, W005, W020). :func:`register` (called from the app's ``ready()``) registers them
all.

Checks read the raw settings (not :mod:`conf`, which converts types) so a bad value is
reported with its name instead of crashing at first use.

- :mod:`.validators`: what each setting may hold, and the table :data:`SETTINGS`.
- :mod:`.configuration`: the settings checks (E001…, E018, E032, W001, W002).
- :mod:`.database`: the checks on stored rows (W003, W005, W020).
"""

from __future__ import annotations

from django.core import checks

from django_throttle.checks.configuration import DJANGO_REDIS_CACHE, SECRET_SETTINGS, check_settings
from django_throttle.checks.database import (
    MIDDLEWARE_PATH,
    check_api_key_owners,
    check_credential_rules,
    check_settling_middleware,
)
from django_throttle.checks.validators import SETTINGS, Validator

__all__ = [
    "DJANGO_REDIS_CACHE",
    "MIDDLEWARE_PATH",
    "SECRET_SETTINGS",
    "SETTINGS",
    "Validator",
    "check_api_key_owners",
    "check_credential_rules",
    "check_settings",
    "check_settling_middleware",
    "register",
]


def register() -> None:
    checks.register(check_settings, checks.Tags.compatibility)
    checks.register(check_settling_middleware, checks.Tags.models)
    checks.register(check_credential_rules, checks.Tags.models)
    # Reads the key table: runs with `manage.py check --database …` (and the test runner),
    # never breaks `check` on a machine without a database.
    checks.register(check_api_key_owners, checks.Tags.database)
