"""A trivial DRF JSON view: everything measured is framework and throttle."""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class PingView(APIView):
    """Anonymous, no permissions; the throttle comes from ``DEFAULT_THROTTLE_CLASSES``."""

    def get(self, request: Request) -> Response:
        return Response({"pong": True})
