"""A URLconf whose guarded admin login is listed after the admin's own URLs, so the admin's
login view serves the path and the guard never runs (the shadowed credential view check,
W011), next to a guarded token view that is reached."""

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import include, path

from django_throttle.credentials import protect_credentials


def token(request: HttpRequest) -> HttpResponse:
    return HttpResponse("token")


urlpatterns = [
    path("admin/", admin.site.urls),
    path("admin/login/", protect_credentials(admin.site.login, scope="admin-login")),
    path("api/", include([path("token/", protect_credentials(token))])),
    path("user/<int:pk>/login/", protect_credentials(token)),
]
