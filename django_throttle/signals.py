"""Signal receivers, connected in ``AppConfig.ready()``.

Policy edits bump the shared policy version (after the transaction commits) so every process
reloads within its refresh interval; settings changes drop cached backends and policies.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.signals import setting_changed
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save

from django_throttle.conf import PREFIX, app_settings

logger = logging.getLogger("django_throttle.policy")


def policy_changed(**kwargs: Any) -> None:
    """Reload here at once and tell the other processes through the backend."""
    from django_throttle import policy

    policy.invalidate()
    transaction.on_commit(_bump, using=kwargs.get("using"))


def _bump() -> None:
    from django_throttle import policy
    from django_throttle.backends import BackendError, get_backend

    policy.invalidate()
    try:
        get_backend().bump_policy_version()
    except BackendError as exc:
        logger.warning("could not publish the policy change to other processes: %s", exc)


def settings_changed(setting: str, **kwargs: Any) -> None:
    if setting.startswith(PREFIX):
        from django_throttle import backends, policy

        app_settings.reload()
        backends.reset_backend_cache()
        policy.reset()


def connect() -> None:
    from django.contrib.auth import get_user_model

    from django_throttle import models

    for model in (
        models.Tier,
        models.TierLimit,
        models.EndpointRule,
        models.EndpointLimit,
        models.TierAssignment,
    ):
        post_save.connect(policy_changed, sender=model, dispatch_uid=f"dt-save-{model.__name__}")
        post_delete.connect(policy_changed, sender=model, dispatch_uid=f"dt-del-{model.__name__}")
    groups = get_user_model().groups.through
    m2m_changed.connect(policy_changed, sender=groups, dispatch_uid="dt-user-groups")
    setting_changed.connect(settings_changed, dispatch_uid="dt-settings")
