"""Settings for the django-throttle demo project.

Start it with ``python manage.py run_demo``: that command points ``REDIS_URL`` at a private
``redis-server`` when you have not set it, creates the SQLite database, seeds the demo tiers
and users, and runs the development server. ``DATABASE_URL`` selects another database.

While it runs, ``manage.py`` commands in another terminal (``throttle_inspect alice``,
``throttle_reset alice``…) count in the same Redis: ``run_demo`` records where, next to the
database (:mod:`example_project.demo_state`).

Safe to start from: ``DEBUG`` is off unless ``DJANGO_DEBUG=1``, the admin login is limited
like the other login endpoints, ``/metrics`` is for staff only, and a Redis password never
reaches a debug page (:mod:`example_project.reporting`).
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

from example_project import demo_state

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-insecure-demo-only-never-deploy-this")
# Off unless asked for: Django's debug page shows settings and tracebacks to any visitor.
DEBUG = os.environ.get("DJANGO_DEBUG", "").lower() in {"1", "true", "yes", "on"}
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_throttle",
    "example_project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # After AuthenticationMiddleware: adds X-RateLimit-* headers to DRF responses.
    "django_throttle.middleware.RateLimitHeadersMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": dj_database_url.config(default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Where run_demo records its Redis for the commands of other terminals.
RUN_DEMO_STATE_FILE = demo_state.state_file(DATABASES["default"], BASE_DIR)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
LOGIN_REDIRECT_URL = "/api/items/"

REST_FRAMEWORK = {
    # Basic and Token attempts are counted (rule "authentication") before the password hash
    # runs or the token table is read.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "django_throttle.drf.ProtectedBasicAuthentication",
        "django_throttle.drf.ProtectedTokenAuthentication",
    ],
    "DEFAULT_THROTTLE_CLASSES": ["django_throttle.drf.PolicyThrottle"],
    # /api/schema/ documents each throttled operation's 429 and 503 (drf-spectacular).
    "DEFAULT_SCHEMA_CLASS": "django_throttle.openapi.ThrottledAutoSchema",
}

# Prometheus metrics at /metrics (django_throttle.metrics), for staff only (see urls.py).
DJANGO_THROTTLE_METRICS = True

# Regional limits: the region is a trusted edge's country header (Cloudflare's). The demo
# serves on loopback only, so loopback is its edge proxy: a curl on this machine plays the
# CDN and may send CF-IPCountry (and X-Forwarded-For, which then names the client; without
# it the client is 127.0.0.1, as before). In production list your proxies' networks only.
DJANGO_THROTTLE_TRUSTED_PROXIES = ["127.0.0.1/32", "::1/128"]
DJANGO_THROTTLE_REGION_SOURCE = "header:CF-IPCountry"

# REDIS_URL if you set it; else the Redis of the run_demo running on this database (its
# private redis-server), so commands in a second terminal see and reset the server's counters.
_running_demo = demo_state.read(RUN_DEMO_STATE_FILE)
# Without Redis (plain `manage.py runserver`, `migrate`…) count in this one process.
DJANGO_THROTTLE_REDIS_URL = os.environ.get("REDIS_URL") or (
    _running_demo["redis_url"] if _running_demo else "memory://"
)
# Lets several demo runs (or the test suite) share one Redis without sharing counters; the
# running demo's prefix when counting in its Redis.
DJANGO_THROTTLE_KEY_PREFIX = os.environ.get("DJANGO_THROTTLE_KEY_PREFIX") or (
    _running_demo["key_prefix"]
    if _running_demo and _running_demo["redis_url"] == DJANGO_THROTTLE_REDIS_URL
    else "dt"
)

# Masks Redis passwords (settings, environment, messages, traceback variables) on the debug
# page and in error reports, should DEBUG be turned on; RedactingLogFilter does it for logs.
DEFAULT_EXCEPTION_REPORTER = "example_project.reporting.RedactingExceptionReporter"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"redact": {"()": "example_project.reporting.RedactingLogFilter"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["redact"]}
    },
    "loggers": {
        "django_throttle": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # Server errors with their tracebacks, in run_demo's terminal whether DEBUG is on or off.
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}
