"""API keys: a client's tier without a login, stored only as a keyed digest.

A key reads ``dt_<prefix>_<secret>``: the 8-character prefix is stored in the clear to find the
row (and shown in the admin), the secret (256 random bits) never is. The database keeps
HMAC-SHA256 of the whole key under ``DJANGO_THROTTLE_API_KEY_SECRET``; the full key is returned
once, by :meth:`ApiKeyManager.create_key`, and cannot be recovered afterwards.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_throttle.conf import app_settings
from django_throttle.identity import KEY_SCHEME, key_digest

#: Hex characters of the visible prefix (32 bits: collisions are retried at creation).
PREFIX_LENGTH = 8
_CREATE_ATTEMPTS = 5


def digest_hex(key: str) -> str:
    """What the database stores for ``key``."""
    return key_digest(app_settings.api_key_secret, key).hex()


class ApiKeyManager(models.Manager["ApiKey"]):
    def create_key(
        self,
        *,
        name: str,
        tier: Any,
        owner: Any = None,
        expires: datetime | None = None,
        active: bool = True,
    ) -> tuple[ApiKey, str]:
        """Save a new key and return it with the full key text, which is shown only now."""
        api_key = self.model(name=name, tier=tier, owner=owner, expires=expires, active=active)
        full_key = api_key.set_new_key()
        api_key.save(using=self._db)
        return api_key, full_key


class ApiKey(models.Model):
    """A secret a client sends (``Authorization: Api-Key <key>`` or ``X-API-Key``) to be
    counted under its own bucket in its tier. Revoke by clearing ``active``; either change
    applies within the policy refresh interval."""

    name = models.CharField(_("name"), max_length=100, help_text=_("who or what uses the key"))
    prefix = models.CharField(
        _("prefix"),
        max_length=16,
        unique=True,
        editable=False,
        help_text=_("the visible start of the key, to recognise it; the rest is never stored"),
    )
    hashed = models.CharField(_("hashed key"), max_length=64, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("owner"),
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="throttle_api_keys",
        help_text=_("optional: the user a DRF view sees as request.user"),
    )
    tier = models.ForeignKey(
        "django_throttle.Tier",
        verbose_name=_("tier"),
        on_delete=models.PROTECT,
        related_name="api_keys",
    )
    active = models.BooleanField(_("active"), default=True, help_text=_("untick to revoke the key"))
    expires = models.DateTimeField(
        _("expires"), null=True, blank=True, help_text=_("empty: never expires")
    )
    created = models.DateTimeField(_("created"), auto_now_add=True)
    last_used = models.DateTimeField(
        _("last used"),
        null=True,
        blank=True,
        editable=False,
        help_text=_(
            "as of the last usage rollup (manage.py throttle_usage --rollup); the admin shows "
            "the live time from the backend when it has one"
        ),
    )

    objects = ApiKeyManager()

    class Meta:
        ordering = ["-created", "pk"]
        verbose_name = _("API key")
        verbose_name_plural = _("API keys")

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def set_new_key(self) -> str:
        """Give this unsaved row a fresh key; return the full key (not kept anywhere)."""
        for _attempt in range(_CREATE_ATTEMPTS):
            prefix = secrets.token_hex(PREFIX_LENGTH // 2)
            if not ApiKey.objects.filter(prefix=prefix).exists():
                break
        else:  # pragma: no cover - 5 collisions in a 32-bit space
            raise RuntimeError("could not find a free API key prefix")
        full_key = f"{KEY_SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"
        self.prefix = prefix
        self.hashed = digest_hex(full_key)
        return full_key

    def clean(self) -> None:
        if self.expires is not None and timezone.is_aware(self.expires):
            # The database keeps UTC: the last hours of 9999-12-31 in a zone behind UTC
            # are past the last datetime there is, and failed the save (a 500).
            try:
                self.expires.astimezone(UTC)
            except OverflowError:
                message = _(
                    "This date is too far ahead to be stored; leave the field empty for a "
                    "key that never expires."
                )
                raise ValidationError({"expires": message}) from None
        if self._state.adding and self.expires is not None and self.expires <= timezone.now():
            raise ValidationError({"expires": _("A new key must expire in the future.")})
