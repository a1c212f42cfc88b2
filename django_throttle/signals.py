"""Signal receivers, connected in ``AppConfig.ready()``.

Policy edits bump the shared policy version (after the transaction commits) so every process
reloads within its refresh interval; an edited limit also has its stored counters re-timed to
the new rate, so tightening a limit never hands out a free burst (the limit as it was before
the edit is read in ``pre_save``: GCRA needs the old rate to convert its state). A limit whose
algorithm changed starts its counters afresh (keys differ per algorithm): nothing to re-time.
Tier assignments are compiled into the snapshot, so whatever changes who is in which tier bumps
too: assignment saves and deletes (also through a deleted user, group or tier), and group
membership changes (both directions, clears, deleted users) when a group involved puts its
members in a tier. API keys are compiled too: creating, revoking, editing or deleting one bumps.
Settings changes drop cached backends and policies.

:class:`RefusalLog`, on the ``django.request`` logger, logs this package's 503s (the load
shedder's, and those while the limiter cannot decide) at WARNING as Django logs a 429, not at
ERROR: an overload sheds thousands of requests a second, and Django's default logging mails
the ``ADMINS`` each ERROR.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from functools import partial
from typing import Any

from django.core.signals import setting_changed
from django.db import transaction
from django.db.models import Q
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save

from django_throttle.conf import PREFIX, app_settings
from django_throttle.rates import Limit

logger = logging.getLogger("django_throttle.policy")

#: Why the last policy change in this context could not be published to the other processes
#: (the backend error), else ``None``: the admin resets it before a save and tells the
#: operator after one (see :class:`django_throttle.admin.base.AppAdmin`).
unpublished: ContextVar[str | None] = ContextVar("django_throttle_unpublished", default=None)


class RefusalLog(logging.Filter):
    """Log a 503 this package answered (a refusal left on the request: DRF's
    ``throttle_decision``, or ``throttle_refusal`` from the refusal response) at WARNING,
    like a 429, instead of ERROR; every other record passes as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and getattr(record, "status_code", None) == 503:
            request = getattr(record, "request", None)
            decision = getattr(request, "throttle_refusal", None) or getattr(
                request, "throttle_decision", None
            )
            if decision is not None and not decision.allowed:
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def policy_changed(**kwargs: Any) -> None:
    """Reload here at once and tell the other processes through the backend."""
    from django_throttle.policy import live as policy

    policy.invalidate()
    transaction.on_commit(_bump, using=kwargs.get("using"))


#: Set on a limit row between ``pre_save`` and ``post_save``: the limit before the edit
#: (``None`` when the stored row could not be compiled, so nothing counted under it).
_PREVIOUS = "_django_throttle_previous_limit"


def limit_saving(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    """Note the limit as stored before this save, for :func:`limit_saved` (one query),
    unless :func:`note_stored_limit` noted it already."""
    if not raw and instance.pk is not None and _PREVIOUS not in instance.__dict__:
        setattr(instance, _PREVIOUS, _stored_limit(sender, instance.pk, kwargs.get("using")))


def note_stored_limit(instance: Any, using: str | None = None) -> None:
    """Note the limit row ``instance`` as stored now, for its next save to re-time its
    counters from, when the row is written in between (the admin moving rows out of each
    other's way: see :class:`~django_throttle.admin.base.OwnRowsFormSet`)."""
    setattr(instance, _PREVIOUS, _stored_limit(type(instance), instance.pk, using))


def limit_saved(instance: Any, created: bool, **kwargs: Any) -> None:
    """Bump the version, then re-time the limit's stored counters (both after commit).

    A counter written under the old rate expires when it would have been full under the old
    rate; re-timing makes it last until full under the new one. New rows have no counters."""
    policy_changed(**kwargs)
    previous = instance.__dict__.pop(_PREVIOUS, None)
    if not created:
        retime = partial(_retime, type(instance), instance.pk, previous)
        transaction.on_commit(retime, kwargs.get("using"))


def _stored_limit(model: Any, pk: Any, using: str | None = None) -> Limit | None:
    """Row ``pk``'s limit as stored; ``None`` when the row is gone or no limit can be built
    from it (the compiler skips it and logs it: nothing counts under it)."""
    from django_throttle.models.fields import BadRow

    rows = model._default_manager.using(using).filter(pk=pk)
    row = rows.select_related(*_RELATED[model.__name__]).first()
    try:
        return None if row is None else row.to_limit()
    except BadRow:
        return None


def _call_backend(failure: str, method: str, *args: Any, **kwargs: Any) -> str | None:
    """Call a backend method through the breaker; an outage only logs ``failure`` and is
    returned (the error's text), else ``None``."""
    from django_throttle.backends import BackendError, get_backend
    from django_throttle.backends.redis_nodes import get_breaker

    try:
        get_breaker().call(getattr(get_backend(), method), *args, **kwargs)
    except BackendError as exc:
        logger.warning("%s: %s", failure, exc)
        return str(exc)
    return None


def _bump() -> None:
    from django_throttle.policy import live as policy

    policy.invalidate()
    failed = _call_backend(
        "could not publish the policy change to other processes", "bump_policy_version"
    )
    if failed is not None:
        unpublished.set(failed)
        policy.unpublished()
        policy.record_unpublished()


def _retime(model: Any, pk: Any, previous: Limit | None) -> None:
    limit = _stored_limit(model, pk)
    # The new algorithm's keys are new: it starts afresh.
    if limit is not None and (previous is None or previous.algorithm == limit.algorithm):
        failure = (
            f"could not re-time stored counters of {limit.name} to its new rate (they expire "
            "on the old schedule)"
        )
        _call_backend(failure, "retime", [limit], previous=None if previous is None else [previous])


_RELATED = {"TierLimit": ("tier",), "EndpointLimit": ("rule", "tier")}


def groups_changed(
    instance: Any, action: str, reverse: bool, pk_set: set[Any] | None, **kwargs: Any
) -> None:
    """Bump once per membership change that can move someone between tiers.

    ``user.groups.add(g)`` sends pre_add and post_add; only post_add and post_remove bump, and
    only when a group involved has a tier assignment, so group changes elsewhere on the site
    cost the workers nothing. ``clear`` sends no ``pk_set``: pre_clear, while the groups being
    removed can still be read, bumps when a tiered group is among them (the bump waits for the
    commit of the clear's own transaction)."""
    if action == "pre_clear":
        tiered = _has_tiered_group(instance, reverse, None)
    elif action in ("post_add", "post_remove"):
        tiered = bool(pk_set) and _has_tiered_group(instance, reverse, pk_set)
    else:
        return
    if tiered:
        policy_changed(using=kwargs.get("using"))


def _has_tiered_group(instance: Any, reverse: bool, pk_set: set[Any] | None) -> bool:
    """Whether any group involved has a tier assignment or an exemption. Forward
    (``user.groups``): the groups in ``pk_set``, or all the user's groups for a clear; reverse
    (``group.user_set``): the group itself."""
    from django_throttle.models import Exemption, TierAssignment

    if reverse:
        groups = Q(group_id=instance.pk)
    elif pk_set is None:
        groups = Q(group__user=instance)
    else:
        groups = Q(group_id__in=pk_set)
    # Groups that place, or exempt, their members.
    return any(model.objects.filter(groups).exists() for model in (TierAssignment, Exemption))


def user_deleting(instance: Any, **kwargs: Any) -> None:
    """Bump when a user being deleted is in a tiered group: the database drops their
    memberships with no m2m signal. (Their own assignment is deleted with a signal.) The bump
    waits for the commit of the deletion's transaction, which pre_delete is sent in."""
    if _has_tiered_group(instance, False, None):
        policy_changed(using=kwargs.get("using"))


def settings_changed(setting: str, **kwargs: Any) -> None:
    if setting in ("SECRET_KEY", "SECRET_KEY_FALLBACKS"):  # what API keys are verified under
        app_settings.reload()
    if setting.startswith(PREFIX):
        from django_throttle import backends
        from django_throttle.policy import live as policy

        app_settings.reload()
        backends.reset_backend_cache()
        policy.reset()


def connect() -> None:
    from django.contrib.auth import get_user_model

    from django_throttle import models

    # Every model compiled into the policy snapshot: a saved or deleted row bumps its version.
    for name in (
        *_RELATED,
        "Tier",
        "EndpointRule",
        "TierAssignment",
        "ApiKey",
        "Exemption",
        "Protection",
    ):
        model = getattr(models, name)
        on_save = limit_saved if name in _RELATED else policy_changed
        if name in _RELATED:
            pre_save.connect(limit_saving, sender=model, dispatch_uid=f"dt-saving-{name}")
        post_save.connect(on_save, sender=model, dispatch_uid=f"dt-save-{name}")
        post_delete.connect(policy_changed, sender=model, dispatch_uid=f"dt-del-{name}")
    user_model = get_user_model()
    m2m_changed.connect(
        groups_changed, sender=user_model.groups.through, dispatch_uid="dt-user-groups"
    )
    pre_delete.connect(user_deleting, sender=user_model, dispatch_uid="dt-user-deleting")
    setting_changed.connect(settings_changed, dispatch_uid="dt-settings")
    request_log = logging.getLogger("django.request")
    if not any(isinstance(found, RefusalLog) for found in request_log.filters):
        request_log.addFilter(RefusalLog())
