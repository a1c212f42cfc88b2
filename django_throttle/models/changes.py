"""Policy changes no other process has been told of yet: a save whose publish (the bump of the
shared version in the backend) failed because the backend was down. The saving process may
exit before the backend returns; a process that meets the backend answering again after an
outage reads these rows (one query), publishes them, and deletes them (see
:mod:`django_throttle.policy.live`)."""

from __future__ import annotations

from django.db import models


class UnpublishedChange(models.Model):
    """One policy change saved while the backend could not be told of it."""

    #: When it was saved (for an operator reading the table; nothing compares it).
    saved = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"policy change saved {self.saved:%Y-%m-%d %H:%M:%S} (not published yet)"
