"""Clients that are never limited, compiled into the policy snapshot so checking one costs no
query: the users, groups and IP networks listed in the admin
(:class:`~django_throttle.models.Exemption`). Staff and superusers are limited like everyone
else unless listed there.

An exempt client's requests make no backend call and get no rate limit headers. Exempt views
are marked with :func:`django_throttle.exemptions.throttle_exempt`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from django_throttle.identity import Identity
from django_throttle.policy.user_tiers import memberships

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Exemptions:
    """The admin's exemptions, compiled: user ids (direct and through groups) and networks.
    Empty by default, so a site with none checks two empty containers per request."""

    users: frozenset[Any] = frozenset()
    addresses: frozenset[str] = frozenset()
    networks: tuple[_Network, ...] = ()
    #: Whether any client is exempt: read on every request, so worked out once.
    active: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "active", bool(self.users or self.addresses or self.networks))

    def __bool__(self) -> bool:
        return self.active

    def covers_address(self, network: str) -> bool:
        """``network`` is the client as the limiter counts it: an address, or an IPv6
        network such as ``2001:db8:1:2::/64``; covered when it lies inside an exempt
        network."""
        if network in self.addresses:
            return True
        if not self.networks:
            return False
        try:
            client = ipaddress.ip_network(network, strict=False)
        except ValueError:
            return False
        return any(
            client.version == exempt.version and client.subnet_of(exempt)  # type: ignore[arg-type]
            for exempt in self.networks
        )


def exempt_client(identity: Identity, exemptions: Exemptions | None) -> bool:
    """Whether the client, as ``identity`` names it, is exempt: a user by the admin's list
    (directly or through a group), an address by the admin's networks. Reads only what
    resolving the identity already loaded (an API key's owner is never fetched)."""
    if not exemptions:
        return False
    if identity.kind == "user":
        return identity.user_id in exemptions.users
    return identity.kind == "ip" and exemptions.covers_address(identity.value)


def compile_exemptions() -> Exemptions:
    """Read the exemption rows (two queries): users named directly or through a group, and
    networks. A row no exemption can be built from is skipped (``manage.py check`` names it)."""
    from django.contrib.auth import get_user_model

    from django_throttle.models import Exemption
    from django_throttle.models.exemptions import parse_network

    users: set[Any] = set()
    addresses: set[str] = set()
    networks: list[_Network] = []
    groups: list[Any] = []
    for row in Exemption.objects.order_by("pk"):
        if row.user_id is not None:
            users.add(row.user_id)
        elif row.group_id is not None:
            groups.append(row.group_id)
        elif row.network:
            try:
                network = parse_network(row.network)
            except ValueError:
                continue
            if network.num_addresses == 1:
                addresses.add(str(network.network_address))
            else:
                networks.append(network)
    table = memberships(get_user_model()) if groups else None
    if table is not None:
        through, user_column, group = table
        members = through.objects.filter(**{f"{group}__in": groups})
        users.update(members.values_list(user_column, flat=True).iterator(chunk_size=10_000))
    # By family, largest network first.
    ordered = sorted(set(networks), key=lambda n: (n.version, n.prefixlen, str(n)))
    return Exemptions(frozenset(users), frozenset(addresses), tuple(ordered))
