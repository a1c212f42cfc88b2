"""Settings of the project ``tests/test_real_servers.py`` serves under gunicorn and uvicorn.

The test sets the environment: ``SERVERPROJECT_REDIS_URL`` (its private ``redis-server``),
``SERVERPROJECT_DB`` (the SQLite file it migrated and filled with the policy). Clients are
told apart by ``X-Forwarded-For`` (loopback is the trusted proxy).
"""

from __future__ import annotations

import os

SECRET_KEY = "server-test-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "tests.serverproject.urls"
WSGI_APPLICATION = "tests.serverproject.wsgi.application"
STATIC_URL = "static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "adrf",
    "django_throttle",
]
MIDDLEWARE = [
    # Outermost, as Django's docs place it: compresses what the throttle answered too.
    "django.middleware.gzip.GZipMiddleware",
    "tests.serverproject.views.served_by",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_throttle.middleware.RateLimitHeadersMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SERVERPROJECT_DB", ":memory:"),
        # Two worker processes read the policy while an operator writes it.
        "OPTIONS": {"timeout": 20},
    }
}
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_THROTTLE_CLASSES": ["django_throttle.drf.PolicyThrottle"],
    "UNAUTHENTICATED_USER": None,
}
DJANGO_THROTTLE_REDIS_URL = os.environ.get("SERVERPROJECT_REDIS_URL", "memory://")
# Above the 50 ms default: on a loaded two-core machine a worker starved of CPU for 50 ms
# would count in the process (failure mode "local") and the exact counts could not be checked.
DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}
DJANGO_THROTTLE_KEY_PREFIX = "srv"
DJANGO_THROTTLE_TRUSTED_PROXIES = ["127.0.0.1/32"]
DJANGO_THROTTLE_FAILURE_MODE = os.environ.get("SERVERPROJECT_FAILURE_MODE", "local")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django.request": {"handlers": ["console"], "level": "ERROR"}},
}
