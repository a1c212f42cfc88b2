"""Counting backends, chosen by the ``DJANGO_THROTTLE_BACKEND`` dotted path.

The instance is built lazily on first use, cached per process, and dropped when a
``DJANGO_THROTTLE_*`` setting changes (see :mod:`django_throttle.signals`), together with the
local fallback limiter and the circuit breaker (:mod:`django_throttle.backends.breaker`).
"""

from __future__ import annotations

import functools

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from django_throttle.backends.base import ArgumentRefused, Backend, BackendError
from django_throttle.backends.memory import MemoryBackend
from django_throttle.conf import app_settings

__all__ = ["ArgumentRefused", "Backend", "BackendError", "get_backend"]

#: Most (client, limit) states the fallback limiter of failure mode ``"local"`` keeps, the
#: least recently used forgotten beyond it: bounds what an outage costs a process in memory,
#: whatever the number of clients.
LOCAL_FALLBACK_MAX_CLIENTS = 100_000


@functools.cache
def get_backend() -> Backend:
    """The process's backend instance, built on first use."""
    path = app_settings.BACKEND
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"DJANGO_THROTTLE_BACKEND = {path!r} cannot be imported: {exc}"
        ) from exc
    backend: Backend = cls()
    return backend


@functools.cache
def get_local_backend() -> MemoryBackend:
    """The process's fallback limiter for failure mode ``"local"``: an in-memory backend
    bounded by :data:`LOCAL_FALLBACK_MAX_CLIENTS` states, built on first use."""
    return MemoryBackend(max_entries=LOCAL_FALLBACK_MAX_CLIENTS)


def reset_backend_cache() -> None:
    """Forget the cached backend (closing its connections), the local fallback limiter and
    the circuit breaker; the next use builds new ones."""
    from django_throttle.backends.breaker import reset_breaker

    if get_backend.cache_info().currsize:
        get_backend().close()
    get_backend.cache_clear()
    get_local_backend.cache_clear()
    reset_breaker()
