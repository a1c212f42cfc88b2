"""Views the demo throttles: DRF endpoints limited by the admin policy, plain views by
``@throttle``.

``/api/*`` views get their limits from the tiers and endpoint rules in the admin (through
``PolicyThrottle`` in ``REST_FRAMEWORK``); ``/hello/`` and ``/hello-async/`` carry their own
rate in the decorator.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.decorators import throttle

ITEMS = [
    {"id": 1, "name": "Teapot", "price": "18.00"},
    {"id": 2, "name": "Kettle", "price": "32.50"},
    {"id": 3, "name": "Mug", "price": "6.00"},
]


class PingView(APIView):
    """Open to everyone: anonymous callers share their tier's limit per IP address."""

    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        return Response({"pong": True})


class ItemsView(APIView):
    """Signed-in users only: counted against the user's tier (free or pro)."""

    permission_classes = [IsAuthenticated]

    def get(self, request: Request) -> Response:
        return Response({"user": request.user.get_username(), "items": ITEMS})


class ExportView(APIView):
    """An expensive call: the admin rule for scope ``export`` charges 10 tokens per request."""

    permission_classes = [IsAuthenticated]
    throttle_scope = "export"

    def post(self, request: Request) -> Response:
        return Response({"status": "queued"}, status=202)


@throttle(rate="5/min")
def hello(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"hello": "world"})


@throttle(rate="5/min")
async def hello_async(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"hello": "world", "async": True})
