"""Views the demo throttles: DRF endpoints limited by the admin policy, plain views by
``@throttle``.

``/api/*`` views get their limits from the tiers and endpoint rules in the admin (through
``PolicyThrottle`` in ``REST_FRAMEWORK``); ``/hello/`` and ``/hello-async/`` carry their own
rate in the decorator. ``/`` (not throttled) lists what to try.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.decorators import throttle
from example_project.demo.tryit import KEY_PLACEHOLDER, try_lines, typed_python

try:
    from drf_spectacular.types import OpenApiTypes
    from drf_spectacular.utils import extend_schema
except ImportError:  # the demo extra installs it; without it there is no schema page
    JSON: Any = None
    CSV: Any = None

    def extend_schema(**kwargs: Any) -> Callable[[_View], _View]:
        return lambda view: view

else:
    # What each view answers, for /api/schema/: without it drf-spectacular prints "unable to
    # guess serializer" for every APIView into the demo's terminal.
    JSON = OpenApiTypes.OBJECT
    CSV = {(200, "text/csv"): OpenApiTypes.STR}

_View = TypeVar("_View")

ITEMS = [
    {"id": 1, "name": "Teapot", "price": "18.00"},
    {"id": 2, "name": "Kettle", "price": "32.50"},
    {"id": 3, "name": "Mug", "price": "6.00"},
]


def home(request: HttpRequest) -> HttpResponse:
    """The page a browser opens at the demo's address: where the admin is, who to log in as,
    and the curl lines to try (the banner's), as plain text. Not throttled: reading it twice
    must not use up the buckets it tells you to drain."""
    base = request.build_absolute_uri("/").rstrip("/")
    text = (
        "django-throttle demo\n\n"
        f"Admin   {base}/admin/   log in as admin / admin (edit tiers and endpoint rules:\n"
        "        the server picks changes up within 1 s)\n"
        "Users   alice / alice (tier free), bob / bob (tier pro)\n"
        "API key run_demo prints a key of tier partner in its banner (a new one each run)\n\n"
        "Try, in another terminal:\n\n" + try_lines(base, KEY_PLACEHOLDER, typed_python())
    )
    return HttpResponse(text, content_type="text/plain; charset=utf-8")


class PingView(APIView):
    """Open to everyone: anonymous callers share their tier's limit per IP address."""

    permission_classes = [AllowAny]

    @extend_schema(responses=JSON)
    def get(self, request: Request) -> Response:
        return Response({"pong": True})


class SearchView(APIView):
    """Open to everyone, paced: the admin rule for scope ``search`` delays a burst's extra
    requests instead of refusing them (``X-RateLimit-Delayed`` says by how long)."""

    permission_classes = [AllowAny]
    throttle_scope = "search"

    @extend_schema(responses=JSON)
    def get(self, request: Request) -> Response:
        query = request.query_params.get("q", "")
        return Response({"q": query, "items": [item for item in ITEMS if query in str(item)]})


class ItemsView(APIView):
    """Signed-in users only: counted against the user's tier (free or pro)."""

    permission_classes = [IsAuthenticated]

    @extend_schema(responses=JSON)
    def get(self, request: Request) -> Response:
        return Response({"user": request.user.get_username(), "items": ITEMS})


class ExportView(APIView):
    """An expensive call: the admin rule for scope ``export`` charges 10 tokens per request."""

    permission_classes = [IsAuthenticated]
    throttle_scope = "export"

    @extend_schema(request=None, responses={202: JSON})
    def post(self, request: Request) -> Response:
        return Response({"status": "queued"}, status=202)


class ExportDownloadView(APIView):
    """A slow export, streamed as CSV: the admin rule for scope ``export-download`` holds a
    concurrency limit (free: one download at a time), whose slot the headers middleware gives
    back when the stream is closed (read to its end, or the client gone). ``?seconds=`` sets
    how long it streams (at most 30)."""

    permission_classes = [IsAuthenticated]
    throttle_scope = "export-download"

    @extend_schema(responses=CSV)
    def get(self, request: Request) -> StreamingHttpResponse:
        try:
            seconds = min(max(float(request.query_params.get("seconds", "3")), 0.0), 30.0)
        except ValueError:
            seconds = 3.0
        response = StreamingHttpResponse(_slow_csv(seconds), content_type="text/csv")
        response["Content-Disposition"] = 'attachment; filename="items.csv"'
        return response


#: Rows of a download: the items over and over, a row at a time over the ``seconds`` asked.
DOWNLOAD_ROWS = 30


def _slow_csv(seconds: float) -> Iterator[bytes]:
    """The header at once, then a row every ``seconds / DOWNLOAD_ROWS``: a stand-in for an
    export that takes a worker for a while, and that notices a few rows later when its
    client went away (a write fails, and the server closes the stream)."""
    yield b"id,name,price\n"
    for row in range(DOWNLOAD_ROWS):
        time.sleep(seconds / DOWNLOAD_ROWS)
        item = ITEMS[row % len(ITEMS)]
        yield f"{row + 1},{item['name']},{item['price']}\n".encode()


@throttle(rate="5/min")
def hello(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"hello": "world"})


@throttle(rate="5/min")
async def hello_async(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"hello": "world", "async": True})
