"""Clients the limiter never counts: one user, every member of a group, or an IP network
(an office, a monitoring service). Compiled into the policy snapshot, so an exempt request
costs no query and no Redis call."""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from django_throttle.conf import IPV4_CARRIERS, IPV6_PREFIX
from django_throttle.models.fields import optional_one_to_one, subject

#: Longest network text: a full IPv6 address with a /128 suffix.
NETWORK_MAX_LENGTH = 43
#: Shortest prefix an exempt network may have, by IP version: the widest private ranges
#: (``10.0.0.0/8``; ``fc00::/7``, the unique local addresses). A wider network exempts much of
#: the internet (``10.0.0.0/0``, a typo for ``/8``, is every IPv4 address): limiting off for
#: every client behind it, which the admin refuses rather than stores.
WIDEST_PREFIX = {4: 8, 6: 7}


def parse_network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """``text`` as a network (a bare address is a /32 or /128; host bits are dropped:
    ``203.0.113.7/24`` is ``203.0.113.0/24``). Raises ``ValueError``."""
    network = ipaddress.ip_network(text.strip(), strict=False)
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96:
        for carrier in IPV4_CARRIERS:
            if network.subnet_of(carrier):
                # ::ffff:a.b.c.d and 64:ff9b::a.b.c.d are counted as a.b.c.d: exempt the same.
                low = int(network.network_address) & 0xFFFFFFFF
                return ipaddress.IPv4Network((low, network.prefixlen - 96))
    return network


class Exemption(models.Model):
    """Exactly one of a user, a group (all its members) or an IP network."""

    user = optional_one_to_one(settings.AUTH_USER_MODEL, "throttle_exemption")
    group = optional_one_to_one("auth.Group", "throttle_exemption")
    network = models.CharField(
        _("IP address or network"),
        max_length=NETWORK_MAX_LENGTH,
        blank=True,
        help_text=_(
            "an address or CIDR range such as 203.0.113.7, 198.51.100.0/24 or 2001:db8::/48, "
            "matched against the client address as the limiter reads it (behind your trusted "
            "proxies)"
        ),
    )
    note = models.CharField(
        max_length=255, blank=True, help_text=_("why, e.g. 'office', 'uptime monitor'")
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        verbose_name = _("exemption")
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(user__isnull=False, group__isnull=True, network="")
                    | Q(user__isnull=True, group__isnull=False, network="")
                    | (Q(user__isnull=True, group__isnull=True) & ~Q(network=""))
                ),
                name="django_throttle_exemption_one_kind",
                violation_error_message=_("Exempt exactly one user, group or network."),
            ),
        ]

    def __str__(self) -> str:
        return subject(self) or f"network {self.network}"

    def row_problems(self) -> dict[str, str]:
        """Values the admin would refuse, by field (the compiler skips such a row)."""
        if self.network:
            try:
                network = parse_network(self.network)
            except ValueError:
                message = _("'%(value)s' is not an IP address or network (e.g. 198.51.100.0/24)")
                return {"network": str(message) % {"value": self.network}}
            widest = WIDEST_PREFIX[network.version]
            if network.prefixlen < widest:
                message = _(
                    "%(network)s is wider than /%(widest)d: it would exempt much of the "
                    "internet from every limit. Exempt your own networks (at most /8 for "
                    "IPv4, /7 for IPv6); to turn limiting off, set DJANGO_THROTTLE_ENABLED = False."
                )
                return {"network": str(message) % {"network": network, "widest": widest}}
        return {}

    def clean(self) -> None:
        """One kind per row, and a network stored in its normal form."""
        self.network = (self.network or "").strip()
        chosen = [self.user_id is not None, self.group_id is not None, bool(self.network)]
        if sum(chosen) != 1:
            message = _("Exempt exactly one user, group or network.")
            raise ValidationError({"user": message, "group": message, "network": message})
        if problems := self.row_problems():
            raise ValidationError(problems)
        if self.network:
            network = parse_network(self.network)
            self.network = str(network)
            if network.version == 6 and network.prefixlen > IPV6_PREFIX:
                wider = network.supernet(new_prefix=IPV6_PREFIX)
                message = _(
                    "IPv6 clients are counted by /%(prefix)d networks, so this never matches "
                    "one: exempt "
                    "%(wider)s or a wider network"
                )
                values = {"prefix": IPV6_PREFIX, "wider": wider}
                raise ValidationError({"network": message % values})
