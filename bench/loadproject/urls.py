"""The endpoint under load, the slow one ``load_concurrency.py`` drives beside it (and
``load_shedding.py`` beside the critical checkout), the refusing and delaying ones
``load_delay.py`` compares, and the service whose latency ``load_adaptive.py`` watches."""

from __future__ import annotations

from django.urls import path

from loadproject import adaptive
from loadproject.views import CheckoutView, ExportView, PingView, burst_delay, burst_reject

urlpatterns = [
    path("api/ping/", PingView.as_view()),
    path("api/export/", ExportView.as_view()),
    path("api/checkout/", CheckoutView.as_view()),
    path("burst/reject/", burst_reject),
    path("burst/delay/", burst_delay),
    path("adaptive/work/", adaptive.work),
]
