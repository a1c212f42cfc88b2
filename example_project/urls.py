"""URLs of the demo project: the admin, three DRF endpoints and two plain Django views."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from example_project.demo import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/ping/", views.PingView.as_view(), name="ping"),
    path("api/items/", views.ItemsView.as_view(), name="items"),
    path("api/export/", views.ExportView.as_view(), name="export"),
    path("hello/", views.hello, name="hello"),
    path("hello-async/", views.hello_async, name="hello-async"),
]
