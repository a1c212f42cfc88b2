"""The endpoint under load, the slow one ``load_concurrency.py`` drives beside it (and
``load_shedding.py`` beside the critical checkout), and the refusing and delaying ones
``load_delay.py`` compares."""

from __future__ import annotations

from django.urls import path

from loadproject.views import CheckoutView, ExportView, PingView, burst_delay, burst_reject

urlpatterns = [
    path("api/ping/", PingView.as_view()),
    path("api/export/", ExportView.as_view()),
    path("api/checkout/", CheckoutView.as_view()),
    path("burst/reject/", burst_reject),
    path("burst/delay/", burst_delay),
]
