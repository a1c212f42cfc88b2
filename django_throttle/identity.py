"""Who is calling, as a value: :class:`Identity` (a verified API key, else the authenticated
user, else the client IP), the client IP read through trusted proxies only, and API keys as
text: the ``dt_<prefix>_<secret>`` format, its visible lookup prefix, and the keyed digest
that is all anyone keeps of a key.

The default resolver that picks one (``DJANGO_THROTTLE_IDENTITY_RESOLVER``,
:func:`django_throttle.policy.live.resolve_identity`) reads the compiled policy for API
keys; this module reads nothing but the request and the settings, so the policy's own types
can name an :class:`Identity`. A custom resolver imports :class:`Identity`,
:data:`UNIDENTIFIED` and :func:`client_ip` from here.

:func:`client_ip` never trusts ``X-Forwarded-For`` (or ``CLIENT_IP_HEADER``) unless proxies
are configured (``TRUSTED_PROXIES``: a count of proxies or their networks); groups
IPv6 clients by prefix (a /64 is one subscriber); unwraps IPv4-mapped and NAT64 IPv6; and never
raises on a malformed header: it falls back to ``REMOTE_ADDR``. A request with no usable
address at all is :data:`UNIDENTIFIED`, never silently one shared bucket: the core refuses
it (``conf.UNKNOWN_CLIENT``).

The API key rows (:mod:`django_throttle.models.api_keys`) store a key's digest and the
compiled policy (:class:`~django_throttle.policy.live.ApiKeyPolicy`) checks a presented key
against it: both take the format from here, and neither needs the other.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import re
import socket
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from django_throttle.conf import API_KEY_META, IPV4_PREFIX, IPV6_PREFIX, ProxyTrust, app_settings

logger = logging.getLogger("django_throttle.identity")

__all__ = ["Identity"]

#: Longest client label, in UTF-8 bytes; a longer one is digested (see :attr:`Identity.key`).
#: The counting script refuses labels over 200 bytes: this stays well under, with room for
#: a custom resolver's kind.
MAX_KEY_BYTES = 128


def _digest(value: bytes) -> str:
    """128 bits of BLAKE2b in hex: distinct long values keep distinct labels."""
    return hashlib.blake2b(value, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True, init=False)
class Identity:
    """A counted client: ``kind`` is ``"user"``, ``"key"`` or ``"ip"``; ``value`` its id.

    ``user_id`` is set for authenticated users so the policy can find their tier.

    ``key`` is ``kind:value``: the client label every backend counts under, always encodable
    as UTF-8 and at most :data:`MAX_KEY_BYTES` bytes, whatever the value (a 300-character
    username, an e-mail address, a custom resolver's long token), worked out once when the
    identity is made. A longer key is written ``<kind>#<digest>`` (128 bits of BLAKE2b over
    the whole value, in hex), so two long values stay two clients. A value with lone
    surrogates (bytes a custom resolver decoded with ``surrogateescape``) would fail every
    backend call; it is written ``<kind>\\0<hex of its bytes>`` instead (digested too when
    long). No ``kind:value`` key equals either form as long as no kind holds ``:``, ``#`` or
    NUL: the label is bounded here, once, for every kind of identity.
    """

    kind: str
    value: str
    user_id: Any = None
    #: The client label (see the class docstring).
    key: str = field(init=False, repr=False, compare=False)

    def __init__(self, kind: str, value: str, user_id: Any = None) -> None:
        key = f"{kind}:{value}"
        if not key.isascii() or len(key) > MAX_KEY_BYTES:  # else the common case, as it is
            key = _bounded_key(kind, value)
        setattr_ = object.__setattr__  # frozen
        setattr_(self, "kind", kind)
        setattr_(self, "value", value)
        setattr_(self, "user_id", user_id)
        setattr_(self, "key", key)

    @property
    def is_authenticated(self) -> bool:
        return self.kind in ("user", "key")


def _bounded_key(kind: str, value: Any) -> str:
    """``kind:value`` bounded as :class:`Identity` promises, for a key that is not short ASCII."""
    key = f"{kind}:{value}"
    try:
        encoded = key.encode()
    except UnicodeEncodeError:
        raw = str(value).encode("utf-8", "surrogatepass")
        key = f"{kind}\0{raw.hex()}"
        return key if len(key) <= MAX_KEY_BYTES else f"{kind}\0#{_digest(raw)}"
    if len(encoded) <= MAX_KEY_BYTES:
        return key
    return f"{kind}#{_digest(str(value).encode())}"


#: A request whose address cannot be read at all (empty or garbage ``REMOTE_ADDR``, e.g.
#: behind a Unix-socket proxy): it has no bucket of its own. A custom resolver returns this
#: (or any identity of kind ``"unknown"``) for the same treatment.
UNIDENTIFIED = Identity("unknown", "")


def presented_key(meta: Any) -> str | None:
    """The API key the request carries in the first ``conf.API_KEY_HEADERS`` header that holds
    one, unverified; ``None`` when it carries none. ``Authorization`` counts only with the
    ``Api-Key`` scheme (``Basic``, ``Bearer``… are someone else's)."""
    for meta_key, is_authorization in API_KEY_META:
        value = meta.get(meta_key)
        if not value or not isinstance(value, str):
            continue
        if is_authorization:
            scheme, _, value = value.strip().partition(" ")
            if scheme.lower() != "api-key":
                continue
        value = value.strip()
        if value:
            return value
    return None


#: Every API key starts with this: ``dt_<prefix>_<secret>``.
KEY_SCHEME = "dt"
#: Longer presented keys are refused unhashed: ours are 56 characters.
KEY_MAX_LENGTH = 200


def key_digest(secret: bytes, key: str) -> bytes:
    """HMAC-SHA256 of a whole API key: fast, and enough for high-entropy secrets (a password
    hasher would add milliseconds per request and nothing else)."""
    return hmac.new(secret, key.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()


def key_prefix(key: str) -> str:
    """The visible lookup prefix of ``dt_<prefix>_<secret>``, or "" for anything else."""
    scheme, _, rest = key.partition("_")
    prefix, _, secret = rest.partition("_")
    return prefix if scheme == KEY_SCHEME and secret else ""


def client_ip(meta: Any) -> str | None:
    """The client's network as text (``203.0.113.7``, ``2001:db8:1:2::/64``), or ``None``.

    Precedence: with ``TRUSTED_PROXIES``, a ``REMOTE_ADDR`` outside them is the client and
    every header is ignored; from a trusted one (or with a count of proxies), the
    ``CLIENT_IP_HEADER`` when set, else ``X-Forwarded-For``. Any header value that does not
    hold one usable address falls back to ``REMOTE_ADDR``.
    """
    remote = meta.get("REMOTE_ADDR") or ""
    trust = app_settings.proxy_trust
    listed = trust.v4 or trust.v6  # wins when the count is set too (a system check error)
    if not trust.configured:
        candidate = remote
        if FORWARDED_FOR in meta and not _warned:
            _warned.add("untrusted-forwarded-for")
            logger.warning(
                "A request carries X-Forwarded-For but no trusted proxy is configured: the "
                "header is ignored; set DJANGO_THROTTLE_TRUSTED_PROXIES (a count or the "
                "proxies' networks) if a proxy sets it. (Logged once per process.)"
            )
    elif listed and not _is_trusted(_address(remote), trust):
        candidate = remote  # a client talking to us directly: whatever it wrote is ignored
    elif trust.header is not None:
        # CLIENT_IP_HEADER's one address; a missing, empty or joined (``a, b``: sent twice)
        # value falls back to REMOTE_ADDR.
        candidate = str(meta.get(trust.header, "")).strip()
        if not candidate or "," in candidate:
            candidate = remote
    elif listed:
        candidate = _through_listed_proxies(meta, remote, trust)
    else:
        candidate = _through_counted_proxies(meta, remote, trust)
    # The common case, a dotted quad exactly as ``str(IPv4Address)`` writes it (inet_pton
    # refuses leading zeros, spaces, ports and short forms), is its own /32 without ipaddress.
    try:
        socket.inet_pton(socket.AF_INET, candidate)
    except (OSError, ValueError, TypeError):
        pass
    else:
        return candidate
    v4_prefix, v6_prefix = IPV4_PREFIX, IPV6_PREFIX
    network = _network(candidate, v4_prefix, v6_prefix)
    if network is None and candidate != remote:
        network = _network(remote, v4_prefix, v6_prefix)
    return network


#: ``request.META`` key of ``X-Forwarded-For``.
FORWARDED_FOR = "HTTP_X_FORWARDED_FOR"
#: Longer text is no address (the longest, ``[<IPv6 with IPv4 tail>%<zone>]:<port>``, is
#: far shorter): refused before it can fill the parse caches with attacker-chosen keys.
MAX_ADDRESS_LENGTH = 100
#: RFC 6052's well-known NAT64 prefix: ``64:ff9b::198.51.100.9`` is that IPv4 client.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

_warned: set[str] = set()
#: Seconds between two warnings about an ``X-Forwarded-For`` shorter than the proxy count.
SHORT_FORWARDED_LOG_INTERVAL = 60.0
#: When that warning was last logged (``time.monotonic()``), in a list so tests can reset it.
_short_forwarded_logged = [float("-inf")]


def _forwarded(meta: Any) -> list[str]:
    """The non-empty addresses of ``X-Forwarded-For``, left to right, as text."""
    parts = (part.strip() for part in str(meta.get(FORWARDED_FOR, "")).split(","))
    return [part for part in parts if part]


def _through_listed_proxies(meta: Any, remote: str, trust: ProxyTrust) -> str:
    """The client address text when proxies are trusted by network and ``remote`` is one."""
    leftmost = remote
    for part in reversed(_forwarded(meta)):
        address = _address(part)
        if address is None:
            return remote  # "unknown", garbage: no address can be believed past this
        if not _is_trusted(address, trust):
            return part  # appended by a trusted proxy: the first hop we do not trust
        leftmost = part
    # Every hop is trusted (an internal client): the earliest one is the most specific.
    return leftmost


def _through_counted_proxies(meta: Any, remote: str, trust: ProxyTrust) -> str:
    """The client address text when ``trust.proxy_count`` proxies are trusted, whoever connects."""
    count = trust.proxy_count
    forwarded = _forwarded(meta)
    if len(forwarded) >= count:
        # Each trusted proxy appended the address it saw; the count-th from the right
        # was written by the outermost trusted proxy and is the first we can believe.
        return forwarded[-count]
    # Any client that reaches the app without passing every proxy sends such a request: the
    # line is rate limited, so how much is logged is not the client's to choose.
    now = time.monotonic()
    if now - _short_forwarded_logged[0] >= SHORT_FORWARDED_LOG_INTERVAL:
        _short_forwarded_logged[0] = now
        logger.warning(
            "X-Forwarded-For has %d address(es) but DJANGO_THROTTLE_TRUSTED_PROXIES is "
            "%d; counting the request by REMOTE_ADDR. (Logged at most once a minute.)",
            len(forwarded),
            count,
        )
    return remote


def _is_trusted(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None, trust: ProxyTrust
) -> bool:
    if address is None:
        return False
    networks = trust.v4 if address.version == 4 else trust.v6
    return any(address in network for network in networks)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``text`` names, port and zone id stripped, IPv4-mapped and NAT64 IPv6
    unwrapped to IPv4; ``None`` for anything else. Text too long to be an address is
    refused here, before it can fill the cache."""
    return None if len(text) > MAX_ADDRESS_LENGTH else _parse_address(text)


@lru_cache(maxsize=4096)
def _parse_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[2001:db8::1]:443"
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "203.0.113.7:443"
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _network(text: str, v4_prefix: int, v6_prefix: int) -> str | None:
    """The client's network ``text`` names (see :func:`_address`), as :func:`client_ip` gives it."""
    return None if len(text) > MAX_ADDRESS_LENGTH else _format_network(text, v4_prefix, v6_prefix)


@lru_cache(maxsize=4096)
def _format_network(text: str, v4_prefix: int, v6_prefix: int) -> str | None:
    address = _parse_address(text)
    if address is None:
        return None
    prefix = v4_prefix if address.version == 4 else v6_prefix
    if prefix >= address.max_prefixlen:
        return str(address)
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))


# Regions: a country code (or any code a trusted edge sends) that picks a tier's regional
# limits. What a client sends is bounded and checked here: it is never a key of anything.

#: Longest region code: longer text is no code.
MAX_REGION_LENGTH = 16
_REGION_CODE = re.compile(r"[A-Z0-9-]{1,16}")


def region_code(value: Any) -> str | None:
    """``value`` as a region code (upper-cased, ``[A-Z0-9-]{1,16}``), else ``None`` (no
    region: the default limits)."""
    if not isinstance(value, str) or len(value) > MAX_REGION_LENGTH + 8:
        return None
    code = value.strip().upper()
    return code if _REGION_CODE.fullmatch(code) else None


def region_codes(text: Any) -> tuple[tuple[str, ...], list[str]]:
    """The region codes of a comma-separated list (upper-cased, sorted, each once), and the
    entries that are no code. Anything but text (a policy file's number) is read as the
    text the column would save of it, as Django's ``CharField`` does."""
    codes: set[str] = set()
    bad: list[str] = []
    for part in ("" if text is None else str(text)).split(","):
        if not part.strip():
            continue
        code = region_code(part)
        if code is None:
            bad.append(part.strip())
        else:
            codes.add(code)
    return tuple(sorted(codes)), bad


def from_trusted_proxy(meta: Any) -> bool:
    """Whether the request came through a proxy ``TRUSTED_PROXIES`` trusts: its
    ``REMOTE_ADDR`` among the listed networks, or (a count of proxies) any connection; with
    no trusted proxy, never. Only then are a trusted edge's headers believed."""
    trust = app_settings.proxy_trust
    if not trust.configured:
        return False
    if not (trust.v4 or trust.v6):
        return trust.proxy_count > 0
    return _is_trusted(_address(str(meta.get("REMOTE_ADDR") or "")), trust)
