"""The default identity resolver (``DJANGO_THROTTLE_IDENTITY_RESOLVER``): a verified API key,
else the authenticated user, else the client IP.

An API key (``Authorization: Api-Key <key>`` or ``X-API-Key``, see
``conf.API_KEY_HEADERS``) is checked against the compiled policy snapshot: no query,
one HMAC. A key that is unknown, wrong, revoked or expired is ignored, never a bucket of its
own: the request is counted as if it had sent none (so an anonymous client under its IP).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

from django_throttle.conf import app_settings
from django_throttle.identity import UNIDENTIFIED, Identity, client_ip, presented_key
from django_throttle.policy import live
from django_throttle.policy.snapshot import ApiKeyPolicy, Policy

__all__ = ["resolve_identity"]

#: Unix seconds, for API key expiry; tests replace it to expire a key without sleeping.
clock = time.time


def resolve_identity(request: Any) -> Identity:
    """The default resolver: a verified API key's prefix, else the user's pk when
    authenticated, else the client network."""
    key = presented_key(request.META)
    api_key = None if key is None else _verified(key)
    if api_key is not None:
        return Identity("key", api_key.prefix)
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return Identity("user", str(user.pk), user_id=user.pk)
    address = client_ip(request.META)
    return UNIDENTIFIED if address is None else Identity("ip", address)


def verified_api_key(request: Any) -> ApiKeyPolicy | None:
    """The active, unexpired API key the request presents, from the policy snapshot (no
    query), else ``None``. Every presented key costs the same: see
    :meth:`~django_throttle.policy.snapshot.Policy.verify_key`."""
    key = presented_key(request.META)
    return None if key is None else _verified(key)


def _verified(key: str) -> ApiKeyPolicy | None:
    snapshot = _snapshot()
    if snapshot is None:
        return None
    return snapshot.verify_key(key, app_settings.api_key_secret, clock())


def _snapshot() -> Policy | None:
    """The policy snapshot; on an event loop, never one that needs the database (the async
    core has refreshed it already when the view uses the admin policy)."""
    snapshot = live.fresh()
    if snapshot is not None:
        return snapshot
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return live.current()
    return live.last()


def get_resolver() -> Callable[[Any], Identity]:
    """The configured resolver callable (imported once per dotted path)."""
    resolver: Callable[[Any], Identity] = import_resolver(app_settings.IDENTITY_RESOLVER)
    return resolver


#: The resolver a dotted path names, imported once per path (the request path calls it with
#: ``DJANGO_THROTTLE_IDENTITY_RESOLVER`` directly, skipping :func:`get_resolver`).
import_resolver: Callable[[str], Callable[[Any], Identity]] = functools.cache(import_string)
