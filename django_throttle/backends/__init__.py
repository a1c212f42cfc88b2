"""Counting backends, chosen by ``DJANGO_THROTTLE_REDIS_URL`` (``"memory://"``: in process).

The instance is built lazily on first use, cached per process, and dropped when a
``DJANGO_THROTTLE_*`` setting changes (see :mod:`django_throttle.signals`), together with the
local fallback limiter and the circuit breaker (:mod:`django_throttle.backends.redis_nodes`).
"""

from __future__ import annotations

import functools
import threading

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from django_throttle.backends.base import ArgumentRefused, Backend, BackendError
from django_throttle.backends.memory import MemoryBackend
from django_throttle.conf import app_settings

__all__ = ["ArgumentRefused", "Backend", "BackendError", "get_backend"]

#: Most (client, limit) states the fallback limiter of failure mode ``"local"`` keeps
#: (beyond it, of the least recently used the one expiring first is forgotten, never a counter
#: that denied or a credential check's; when all are such, new clients share an overflow
#: counter per limit): bounds what an outage costs a process in memory, whatever clients send.
LOCAL_FALLBACK_MAX_CLIENTS = 100_000


_lock = threading.Lock()
_backend: Backend | None = None
_local: MemoryBackend | None = None


@functools.cache
def get_backend() -> Backend:
    """The process's backend instance, built on first use: once, so threads that ask at the
    same moment count in the same one (each thread that misses the cache waits for the
    first's instance)."""
    return _build()


def _build() -> Backend:
    global _backend
    with _lock:
        if _backend is None:
            path = app_settings.backend_path
            try:
                cls = import_string(path)
            except ImportError as exc:
                raise ImproperlyConfigured(
                    f"the counting backend {path!r} cannot be imported: {exc}"
                ) from exc
            _backend = cls()
        return _backend


def built_backend() -> Backend | None:
    """The process's backend instance if it was built, else ``None`` (never builds one)."""
    return _backend


@functools.cache
def get_local_backend() -> MemoryBackend:
    """The process's fallback limiter for failure mode ``"local"``: an in-memory backend
    bounded by :data:`LOCAL_FALLBACK_MAX_CLIENTS` states, built on first use (once: the
    first requests of an outage, arriving together, count in the same one)."""
    global _local
    with _lock:
        if _local is None:
            _local = MemoryBackend(max_entries=LOCAL_FALLBACK_MAX_CLIENTS)
        return _local


def reset_backend_cache(*, close: bool = True) -> None:
    """Forget the process's backend (closing its connections unless ``close`` is false), the
    local fallback limiter and the circuit breaker; the next use builds new ones."""
    global _backend, _local
    from django_throttle.backends.redis_nodes import reset_breaker

    with _lock:
        backend, _backend, _local = _backend, None, None
        get_backend.cache_clear()
        get_local_backend.cache_clear()
    if backend is not None and close:
        backend.close()
    reset_breaker()
