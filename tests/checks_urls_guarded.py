"""The same URLconf as ``checks_urls_shadowed`` with the guarded admin login listed first,
as the login how-to says: every guarded view is reached (no W011)."""

from django.contrib import admin
from django.urls import include, path

from django_throttle.credentials import protect_credentials
from tests.checks_urls_shadowed import token

urlpatterns = [
    path("admin/login/", protect_credentials(admin.site.login, scope="admin-login")),
    path("admin/", admin.site.urls),
    path("api/", include([path("token/", protect_credentials(token))])),
]
