"""The one endpoint under load."""

from __future__ import annotations

from django.urls import path

from loadproject.views import PingView

urlpatterns = [path("api/ping/", PingView.as_view())]
