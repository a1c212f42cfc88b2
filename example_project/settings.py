"""Settings for the django-throttle demo project.

Start it with ``python manage.py run_demo``: that command points ``REDIS_URL`` at a private
``redis-server`` when you have not set it, creates the SQLite database, seeds the demo tiers
and users, and runs the development server. ``DATABASE_URL`` selects another database.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-insecure-demo-only-never-deploy-this")
DEBUG = True
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

# Prometheus metrics at /metrics (django_throttle.metrics).
DJANGO_THROTTLE_METRICS = True

# run_demo sets REDIS_URL to a private redis-server when you have not set it yourself.
DJANGO_THROTTLE_REDIS_URL = os.environ.get("REDIS_URL")
if not DJANGO_THROTTLE_REDIS_URL:
    # Without Redis (plain `manage.py runserver`, `migrate`…) count in this one process.
    DJANGO_THROTTLE_BACKEND = "django_throttle.backends.memory.MemoryBackend"
# Lets several demo runs (or the test suite) share one Redis without sharing counters.
DJANGO_THROTTLE_KEY_PREFIX = os.environ.get("DJANGO_THROTTLE_KEY_PREFIX", "dt")
# Admin edits reach the running server within this many seconds.
DJANGO_THROTTLE_POLICY_REFRESH_INTERVAL = 1.0

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_throttle": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
