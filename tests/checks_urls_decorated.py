"""A URLconf of ``@throttle`` views and a DRF view throttled by DRF's own classes only: no
headers middleware is needed (the headers middleware check, W009)."""

from django.http import HttpRequest, HttpResponse
from django.urls import path
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from django_throttle.decorators import throttle


@throttle(rate="5/min")
def hello(request: HttpRequest) -> HttpResponse:
    return HttpResponse("hello")


class DrfOnly(APIView):
    throttle_classes = [AnonRateThrottle]

    def get(self, request: HttpRequest) -> Response:
        return Response({"ok": True})


urlpatterns = [path("hello/", hello), path("drf/", DrfOnly.as_view())]
