"""API keys as text: the ``dt_<prefix>_<secret>`` format, its visible lookup prefix, and the
keyed digest that is all anyone keeps of a key.

Values only: the rows (:mod:`django_throttle.models.api_keys`) store the digest, the compiled
policy (:class:`~django_throttle.policy.snapshot.ApiKeyPolicy`) checks a presented key against
it; neither needs the other to know the format.
"""

from __future__ import annotations

import hashlib
import hmac

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
