"""Device cookies: a browser that signed in before keeps its own allowance of attempts while
its username is under attack (OWASP's "Slow down online guessing attacks with device
cookies").

A limit counted by username is the only defence against guessing spread over many addresses,
and it is also a lever: anyone can keep a real user locked out by spending the username's
allowance. So a successful sign-in through :func:`~.credentials.protect_credentials` sets a
signed cookie naming the user (by a digest of the normalised username: the cookie shows no
name) and a random device id. A later attempt that presents a valid cookie for the very
username it tries is counted in that device's own counter, with the same limits, instead of
the username's shared one; an absent, forged, expired or other user's cookie counts in the
shared counter as before. A device cookie that keeps failing is locked out on its own, like
any counter; a stolen one is worth one allowance, no more.

The trade-off: a browser that never signed in (a new device, cookies cleared) has only the
shared counter and stays locked out while the attack lasts. The cookie is signed with
``SECRET_KEY`` (``django.core.signing``; ``SECRET_KEY_FALLBACKS`` are honoured), lives
:data:`MAX_AGE` seconds, is ``HttpOnly`` and ``SameSite=Lax``, ``Secure`` on HTTPS, and
is at most :data:`MAX_COOKIE_CHARS` long; a longer one is ignored unread.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from base64 import urlsafe_b64encode
from typing import Any

from django.core import signing

#: The cookie's name.
COOKIE_NAME = "throttle_device"
#: Seconds a device cookie stays valid after the last sign-in that set it (180 days).
MAX_AGE = 180 * 86400
#: Longest cookie value read; ours are about 80 characters.
MAX_COOKIE_CHARS = 200
#: Keeps these signatures apart from every other use of ``SECRET_KEY``.
SALT = "django_throttle.request.device_cookies"


def device_for(request: Any, username: str) -> str | None:
    """The device id of the request's valid device cookie for ``username`` (normalised as
    :func:`~.credentials.normalise_username` does), else ``None``."""
    cookies = getattr(request, "COOKIES", None)
    value = cookies.get(COOKIE_NAME) if cookies else None
    if not value or not isinstance(value, str) or len(value) > MAX_COOKIE_CHARS:
        return None
    try:
        signed = signing.TimestampSigner(salt=SALT).unsign(value, max_age=MAX_AGE)
    except signing.BadSignature:  # forged, garbled or expired (SignatureExpired)
        return None
    device, _, named = signed.partition(":")
    if not device or not hmac.compare_digest(named, _name_digest(username)):
        return None
    return device


def remember(request: Any, response: Any, username: str) -> None:
    """Set (or renew) ``response``'s device cookie for ``username``: a browser that already
    holds one for that user keeps its device id, and so its counter."""
    device = device_for(request, username) or secrets.token_urlsafe(12)
    value = signing.TimestampSigner(salt=SALT).sign(f"{device}:{_name_digest(username)}")
    response.set_cookie(
        COOKIE_NAME,
        value,
        max_age=MAX_AGE,
        httponly=True,
        samesite="Lax",
        secure=bool(request.is_secure()),
    )


def _name_digest(username: str) -> str:
    """128 bits of BLAKE2b of the username: names the user without showing the name."""
    digest = hashlib.blake2b(username.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return urlsafe_b64encode(digest).rstrip(b"=").decode()
