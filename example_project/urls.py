"""URLs of the demo project: a home page saying what to try, the admin (with the throttle
dashboard and inspector under "Usage counts"), four DRF endpoints, two plain Django views, a
login page and a token endpoint whose attempts are counted before the password is checked
(the admin's login too), the OpenAPI schema and Prometheus metrics (for staff only)."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.views import LoginView
from django.urls import path
from rest_framework.authtoken.views import obtain_auth_token

from django_throttle.credentials import protect_credentials
from django_throttle.metrics import metrics_view
from example_project.demo import views

urlpatterns = [
    # Rule "admin-login": the admin's login counts failures like the other login endpoints
    # (before admin.site.urls, which would serve the unprotected view).
    path("admin/login/", protect_credentials(admin.site.login, scope="admin-login")),
    path("admin/", admin.site.urls),
    path("", views.home, name="home"),  # what to try, for a browser opening the demo's address
    path("api/ping/", views.PingView.as_view(), name="ping"),
    path("api/items/", views.ItemsView.as_view(), name="items"),
    path("api/search/", views.SearchView.as_view(), name="search"),
    path("api/export/", views.ExportView.as_view(), name="export"),
    path("api/export/download/", views.ExportDownloadView.as_view(), name="export-download"),
    path("hello/", views.hello, name="hello"),
    path("hello-async/", views.hello_async, name="hello-async"),
    # Rule "login": 5 failed attempts a minute per IP address, 10 an hour per username.
    path(
        "accounts/login/",
        protect_credentials(LoginView.as_view(template_name="demo/login.html")),
        name="login",
    ),
    path("api/token/", protect_credentials(obtain_auth_token), name="api-token"),
    # Staff only: the metrics name every tier and endpoint. A Prometheus server that cannot log
    # in gets the view on an internal port or behind an IP allow-list instead.
    path("metrics", staff_member_required(metrics_view), name="metrics"),
]

try:
    from drf_spectacular.views import SpectacularAPIView
except ImportError:  # the demo extra installs it; without it there is no schema page
    pass
else:
    urlpatterns.append(path("api/schema/", SpectacularAPIView.as_view(), name="schema"))
