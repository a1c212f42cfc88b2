from __future__ import annotations

from django.contrib import admin
from django.urls import path

from tests.serverproject import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("sync/<str:scope>/", views.SyncView.as_view()),
    path("adrf/<str:scope>/", views.AdrfView.as_view()),
    path("async/<str:scope>/", views.async_view),
]
