"""Django settings for building the docs: enough for autodoc to import every public module.

No Redis is needed: the memory backend counts, and nothing connects at import anyway.
"""

SECRET_KEY = "docs-only-not-secret"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "rest_framework",
    "django_throttle",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DJANGO_THROTTLE_REDIS_URL = "memory://"
