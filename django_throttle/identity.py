"""Who is calling: the authenticated user, else the client IP (through trusted proxies only).

The resolver is pluggable (``DJANGO_THROTTLE_IDENTITY_RESOLVER``). The default never trusts
``X-Forwarded-For`` unless ``DJANGO_THROTTLE_TRUSTED_PROXY_COUNT`` says proxies append to it,
groups IPv6 clients by prefix (a /64 is one subscriber), unwraps IPv4-mapped IPv6, and never
raises on a malformed header: it falls back to ``REMOTE_ADDR``. A request with no usable
address at all is :data:`UNIDENTIFIED`, never silently one shared bucket: the core applies
``DJANGO_THROTTLE_UNKNOWN_CLIENT`` to it.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.utils.module_loading import import_string

from django_throttle.conf import app_settings

logger = logging.getLogger("django_throttle.identity")

__all__ = ["UNIDENTIFIED", "Identity", "client_ip", "get_resolver", "resolve_identity"]


@dataclass(frozen=True, slots=True)
class Identity:
    """A counted client: ``kind`` is ``"user"``, ``"key"`` or ``"ip"``; ``value`` its id.

    ``user_id`` is set for authenticated users so the policy can find their tier.
    """

    kind: str
    value: str
    user_id: Any = None

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.value}"

    @property
    def is_authenticated(self) -> bool:
        return self.kind in ("user", "key")


#: A request whose address cannot be read at all (empty or garbage ``REMOTE_ADDR``, e.g.
#: behind a Unix-socket proxy): it has no bucket of its own. A custom resolver returns this
#: (or any identity of kind ``"unknown"``) for the same treatment.
UNIDENTIFIED = Identity("unknown", "")


def resolve_identity(request: Any) -> Identity:
    """The default resolver: the user's pk when authenticated, else the client network."""
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return Identity("user", str(user.pk), user_id=user.pk)
    address = client_ip(request.META)
    return UNIDENTIFIED if address is None else Identity("ip", address)


def client_ip(meta: Any) -> str | None:
    """The client's network as text (``203.0.113.7``, ``2001:db8:1:2::/64``), or ``None``."""
    remote = meta.get("REMOTE_ADDR") or ""
    proxies = app_settings.TRUSTED_PROXY_COUNT
    candidate = remote
    if proxies > 0:
        forwarded = [part.strip() for part in str(meta.get("HTTP_X_FORWARDED_FOR", "")).split(",")]
        forwarded = [part for part in forwarded if part]
        if len(forwarded) >= proxies:
            # Each trusted proxy appended the address it saw; the proxies-th from the right
            # was written by the outermost trusted proxy and is the first we can believe.
            candidate = forwarded[-proxies]
        else:
            logger.warning(
                "X-Forwarded-For has %d address(es) but DJANGO_THROTTLE_TRUSTED_PROXY_COUNT is "
                "%d; counting the request by REMOTE_ADDR",
                len(forwarded),
                proxies,
            )
    v4_prefix = app_settings.IPV4_PREFIX
    if v4_prefix == 32 and _is_plain_ipv4(candidate):
        return candidate  # the common case, in a fraction of ipaddress's time
    network = _network(candidate, v4_prefix, app_settings.IPV6_PREFIX)
    if network is None and candidate != remote:
        network = _network(remote, app_settings.IPV4_PREFIX, app_settings.IPV6_PREFIX)
    return network


def _is_plain_ipv4(text: str) -> bool:
    """Whether ``text`` is a dotted-quad IPv4 address exactly as ``str(IPv4Address)`` writes
    it (inet_pton refuses leading zeros, spaces, ports and short forms)."""
    try:
        socket.inet_pton(socket.AF_INET, text)
    except (OSError, ValueError, TypeError):
        return False
    return True


@lru_cache(maxsize=4096)
def _network(text: str, v4_prefix: int, v6_prefix: int) -> str | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[2001:db8::1]:443"
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "203.0.113.7:443"
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    prefix = v4_prefix if address.version == 4 else v6_prefix
    if prefix >= address.max_prefixlen:
        return str(address)
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))


_resolvers: dict[str, Callable[[Any], Identity]] = {}


def get_resolver() -> Callable[[Any], Identity]:
    """The configured resolver callable (imported once per dotted path)."""
    path = app_settings.IDENTITY_RESOLVER
    resolver = _resolvers.get(path)
    if resolver is None:
        resolver = _resolvers[path] = import_string(path)
    return resolver
