"""A URLconf of a project moving from DRF's throttles: DRF's token view and a subclass routed
bare and under ``protect_credentials`` (the unguarded token view check, W013), and views whose
own ``throttle_classes`` still hold DRF's throttles or ``PolicyThrottle`` (W010 per view)."""

from django.http import HttpRequest
from django.urls import include, path, re_path
from rest_framework.authtoken.views import ObtainAuthToken, obtain_auth_token
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle, UserRateThrottle
from rest_framework.views import APIView

from django_throttle.credentials import protect_credentials
from django_throttle.drf import PolicyThrottle


class CustomToken(ObtainAuthToken):
    """A subclass, as projects write to return more than the token: DRF's ``()`` inherited."""


class ThrottledToken(ObtainAuthToken):
    throttle_classes = [PolicyThrottle]


class Uploads(APIView):
    throttle_classes = [ScopedRateThrottle, UserRateThrottle]
    throttle_scope = "uploads"

    def post(self, request: HttpRequest) -> Response:
        return Response({"ok": True})


class Orders(APIView):
    throttle_classes = [PolicyThrottle]
    throttle_scope = "orders"

    def get(self, request: HttpRequest) -> Response:
        return Response([])


class Status(APIView):
    """Sets no ``throttle_classes``: DRF's default list, inherited from ``APIView``."""

    def get(self, request: HttpRequest) -> Response:
        return Response({"ok": True})


urlpatterns = [
    path("api/token/", obtain_auth_token),
    path("api/", include([re_path(r"^token2/$", CustomToken.as_view())])),
    path("api/guarded/", protect_credentials(obtain_auth_token)),
    path("api/guarded2/", protect_credentials(CustomToken.as_view(), scope="api-login")),
    path("api/throttled-token/", ThrottledToken.as_view()),
    path("api/uploads/", Uploads.as_view()),
    path("api/orders/", Orders.as_view()),
    path("api/status/", Status.as_view()),
]
