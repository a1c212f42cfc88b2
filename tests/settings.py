"""Settings for the test suite: SQLite by default, ``DATABASE_URL`` when set; the Redis the
suite's conftest started (or ``REDIS_URL``)."""

from __future__ import annotations

import os

import dj_database_url

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # The browser tests' live server serves the admin's CSS and scripts (tests/browser.py).
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_throttle",
]
STATIC_URL = "/static/"

MIDDLEWARE = [
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
    "default": dj_database_url.config(default="sqlite:///:memory:", conn_max_age=0),
}

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

REST_FRAMEWORK = {
    "DEFAULT_THROTTLE_CLASSES": ["django_throttle.drf.PolicyThrottle"],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.BasicAuthentication",
    ],
}

DJANGO_THROTTLE_REDIS_URL = os.environ.get(
    "DJANGO_THROTTLE_TEST_REDIS_URL", "redis://127.0.0.1:1/0"
)
# A loaded 2-core CI machine can stall for more than the production default of 50 ms.
DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
