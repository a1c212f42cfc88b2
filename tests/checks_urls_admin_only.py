"""A project that guards no login: the admin and DRF's browsable-API login, unguarded (the
unguarded login view check, W016, stays quiet: the project has not asked for login
protection)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api-auth/", include("rest_framework.urls")),
]
