"""Settings of the load-test project: one DRF endpoint, throttled three ways.

``bench/load_test.py`` sets the environment; nothing here is meant for production.

- ``LOADTEST_VARIANT``: ``none`` (no throttle), ``policy`` (``django_throttle``'s
  ``PolicyThrottle``, limits from the database, ``X-RateLimit-*`` headers) or ``drf`` (DRF's
  ``AnonRateThrottle`` on a django-redis cache).
- ``LOADTEST_REDIS_URL``: the private ``redis-server`` both throttles count in.
- ``LOADTEST_DB``: the SQLite file ``load_test.py`` migrated and filled with the policy.
- ``LOADTEST_DRF_RATE``: DRF's anonymous rate (the policy's rate lives in the database).
- ``LOADTEST_USAGE``: ``0`` turns django_throttle's usage counting off.
- ``LOADTEST_SLOW_SECONDS``: how long the slow endpoint (``/api/export/``) holds its worker.
- ``LOADTEST_BURST_RATE``, ``LOADTEST_BURST``, ``LOADTEST_DELAY``, ``LOADTEST_MAX_WAIT``: the
  GCRA limit of ``/burst/reject/`` and ``/burst/delay/`` (the delay and longest wait only on
  the latter), for ``bench/load_delay.py``.
- ``LOADTEST_ADAPT_RUN``: set by ``bench/load_adaptive.py``: adds the latency middleware of
  ``loadproject.adaptive`` (its keys named after the run); ``LOADTEST_ADAPT_*`` shape the
  service and the load signal (see that module). The signal is the setting below either way.

Clients are told apart by ``X-Forwarded-For`` (one trusted proxy) in both throttles.
"""

from __future__ import annotations

import os

VARIANT = os.environ.get("LOADTEST_VARIANT", "none")
if VARIANT not in {"none", "policy", "drf"}:
    raise RuntimeError(f"LOADTEST_VARIANT must be none, policy or drf, not {VARIANT!r}")
REDIS_URL = os.environ.get("LOADTEST_REDIS_URL", "redis://127.0.0.1:1/0")
LOADTEST_SLOW_SECONDS = float(os.environ.get("LOADTEST_SLOW_SECONDS", "0.2"))
LOADTEST_BURST_RATE = os.environ.get("LOADTEST_BURST_RATE", "2/s")
LOADTEST_BURST = int(os.environ.get("LOADTEST_BURST", "4"))
LOADTEST_DELAY = int(os.environ.get("LOADTEST_DELAY", "0"))
LOADTEST_MAX_WAIT = float(os.environ.get("LOADTEST_MAX_WAIT", "2"))

SECRET_KEY = "load-test-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "loadproject.urls"
WSGI_APPLICATION = "loadproject.wsgi.application"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "rest_framework",
    "django_throttle",
]
# Only what the measured path needs: the headers middleware is part of django_throttle's path.
MIDDLEWARE = (
    ["django_throttle.middleware.RateLimitHeadersMiddleware"] if VARIANT == "policy" else []
)
if os.environ.get("LOADTEST_ADAPT_RUN"):
    # Outermost: the latency it records is everything Django does, throttle included.
    MIDDLEWARE.insert(0, "loadproject.adaptive.LatencyMiddleware")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("LOADTEST_DB", ":memory:"),
    }
}
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "lt-drf",
    }
}

_THROTTLES = {
    "none": [],
    "policy": ["django_throttle.drf.PolicyThrottle"],
    "drf": ["rest_framework.throttling.AnonRateThrottle"],
}
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_THROTTLE_CLASSES": _THROTTLES[VARIANT],
    "DEFAULT_THROTTLE_RATES": {"anon": os.environ.get("LOADTEST_DRF_RATE", "1000000/s")},
    "NUM_PROXIES": 1,
}

DJANGO_THROTTLE_REDIS_URL = REDIS_URL
DJANGO_THROTTLE_KEY_PREFIX = "lt"
DJANGO_THROTTLE_TRUSTED_PROXIES = 1
DJANGO_THROTTLE_USAGE_RETENTION_DAYS = 7 if os.environ.get("LOADTEST_USAGE", "1") != "0" else 0
# Two workers, Redis and wrk share two cores: a stall past the 50 ms production timeout would
# take the failure mode (counted in the process) and look like speed. Failures are logged
# (below) and counted by load_test.py.
DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(levelname)s %(name)s: %(message)s"},
        "timed": {"format": "%(created).3f %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "plain"},
        "timed": {"class": "logging.StreamHandler", "formatter": "timed"},
    },
    "loggers": {
        # 5xx only (a 429 is logged at WARNING): load_test.py counts these lines per run.
        "django.request": {"handlers": ["stderr"], "level": "ERROR", "propagate": False},
        "django_throttle": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
        # The controller's moves (throttle_adapt), with their time: load_adaptive.py reads them.
        "django_throttle.adaptive": {"handlers": ["timed"], "level": "INFO", "propagate": False},
    },
}
