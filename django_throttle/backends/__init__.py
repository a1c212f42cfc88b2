"""Counting backends, chosen by the ``DJANGO_THROTTLE_BACKEND`` dotted path.

The instance is built lazily on first use, cached per process, and dropped when a
``DJANGO_THROTTLE_*`` setting changes (see :mod:`django_throttle.signals`).
"""

from __future__ import annotations

import threading

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from django_throttle.backends.base import Backend, BackendError
from django_throttle.conf import app_settings

__all__ = ["Backend", "BackendError", "get_backend", "reset_backend_cache"]

_lock = threading.Lock()
_backend: Backend | None = None


def get_backend() -> Backend:
    """The process's backend instance, built on first use."""
    backend = _backend
    if backend is not None:
        return backend
    return _build()


def _build() -> Backend:
    global _backend
    with _lock:
        if _backend is None:
            path = app_settings.BACKEND
            try:
                cls = import_string(path)
            except ImportError as exc:
                raise ImproperlyConfigured(
                    f"DJANGO_THROTTLE_BACKEND = {path!r} cannot be imported: {exc}"
                ) from exc
            _backend = cls()
        return _backend


def reset_backend_cache() -> None:
    """Forget the cached backend (closing its connections); the next use builds a new one."""
    global _backend
    with _lock:
        if _backend is not None:
            _backend.close()
        _backend = None
