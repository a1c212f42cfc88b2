"""Naming a client as an operator types it (``user:alice``, ``key:<prefix>``, ``ip:<address>``
or bare), and saying which tier it is in and why, in words: the first step of
``throttle_inspect``, ``throttle_explain``, ``throttle_reset`` and the admin's inspector.

Off the request path: these query the database (the user, the API key, the assignments that
say *why* a client is in a tier); the tier itself comes from the compiled snapshot requests use.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.utils.translation import gettext as _

from django_throttle.identity import Identity, client_ip
from django_throttle.policy.snapshot import Policy, TierPolicy

__all__ = ["Subject", "UnknownClient", "parse_client", "tier_and_reason"]


class UnknownClient(ValueError):
    """The text names no user, API key or IP address; the message says what was tried."""


@dataclass(frozen=True)
class Subject:
    """A client as the limiter counts it, and how to name it to a person. ``address`` is
    the address an IP client was named by (its requests come from it)."""

    identity: Identity
    label: str
    user: Any = None
    api_key: Any = None
    address: str | None = None

    @property
    def client(self) -> str:
        return self.identity.key


# --- naming a client ------------------------------------------------------------------------


def parse_client(text: str) -> Subject:
    """Read ``user:<username or id>``, ``key:<prefix or whole key>``, ``ip:<address>`` or a
    bare username, address or API key. Raises :class:`UnknownClient`."""
    text = (text or "").strip()
    kind, sep, value = text.partition(":")
    if sep and kind in ("user", "key", "ip"):
        return {"user": _user, "key": _api_key, "ip": _address}[kind](value.strip())
    if _is_address(text):
        return _address(text)
    from django_throttle.api_key_format import key_prefix

    if text and _api_key_row(key_prefix(text)) is not None:
        return _api_key(text)
    return _user(text)


def _user(value: str) -> Subject:
    model = get_user_model()
    user = model._default_manager.filter(**{model.USERNAME_FIELD: value}).first()
    if user is None and value.isdigit():
        user = model._default_manager.filter(pk=value).first()
    if user is None:
        raise UnknownClient(_("no user with the username or id %(value)r") % {"value": value})
    return Subject(
        Identity("user", str(user.pk), user_id=user.pk), f"user {user.get_username()}", user=user
    )


def _api_key_row(prefix: str) -> Any:
    from django_throttle.models import ApiKey

    return ApiKey.objects.filter(prefix=prefix).select_related("tier").first()


def _api_key(value: str) -> Subject:
    from django_throttle.api_key_format import key_prefix

    row = _api_key_row(value) or _api_key_row(key_prefix(value))
    if row is None:
        raise UnknownClient(_("no API key with the prefix %(value)r") % {"value": value})
    return Subject(Identity("key", row.prefix), f"API key {row.prefix} ({row.name})", api_key=row)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_network(text.split("%", 1)[0], strict=False)
    except ValueError:
        return False
    return True


def _address(value: str) -> Subject:
    """The address's network as requests from it are counted (IPv6 by prefix, IPv4-mapped
    unwrapped): ``2001:db8::1`` and ``2001:db8::2`` are one client under a /64."""
    network = client_ip({"REMOTE_ADDR": value.split("/", 1)[0]}) if value else None
    if network is None:
        raise UnknownClient(_("%(value)r is not an IP address") % {"value": value})
    return Subject(Identity("ip", network), f"IP {network}", address=value.split("/", 1)[0])


def tier_and_reason(subject: Subject, snapshot: Policy) -> tuple[TierPolicy | None, str]:
    """The client's tier as requests see it, and why, in words."""
    tier = snapshot.tier_for(subject.identity)
    name = f"'{tier.slug}'" if tier is not None else _("none")
    if subject.api_key is not None:
        if subject.identity.value not in snapshot.api_keys:
            return tier, _("the API key is revoked or expired: counted as anonymous (%(tier)s)") % {
                "tier": name
            }
        return tier, _("the API key's own tier (%(tier)s)") % {"tier": name}
    if subject.user is not None:
        from django_throttle.models import TierAssignment

        if tier is None:
            return None, _("no default tier for authenticated users: not limited")
        assigned = TierAssignment.objects.filter(tier_id=tier.id)
        if assigned.filter(user=subject.user).exists():
            return tier, _("assigned to %(tier)s directly") % {"tier": name}
        groups = subject.user.groups.all()
        group = assigned.filter(group__in=groups).select_related("group").first()
        if group is not None:
            return tier, _("member of group '%(group)s', assigned to %(tier)s") % {
                "group": group.group,
                "tier": name,
            }
        return tier, _("the default tier for authenticated users (%(tier)s)") % {"tier": name}
    if tier is None:
        return None, _("no default tier for anonymous clients: not limited")
    return tier, _("the default tier for anonymous clients (%(tier)s)") % {"tier": name}
