"""A URLconf with one DRF view given ``PolicyThrottle`` by its own ``throttle_classes`` (the
headers middleware check, W009)."""

from django.http import HttpRequest
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.drf import PolicyThrottle


class Throttled(APIView):
    throttle_classes = [PolicyThrottle]

    def get(self, request: HttpRequest) -> Response:
        return Response({"ok": True})


class Open(APIView):
    throttle_classes: list[type] = []

    def get(self, request: HttpRequest) -> Response:
        return Response({"ok": True})


urlpatterns = [path("open/", Open.as_view()), path("api/", Throttled.as_view())]
