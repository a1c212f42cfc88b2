"""The test project's URLs plus views a Django project serves under several spellings of one
path: DRF format suffixes (``format_suffix_patterns`` and ``DefaultRouter``), an optional
trailing slash, and ``i18n_patterns`` language prefixes (tests/test_path_escapes.py)."""

from typing import Any

from django.conf.urls.i18n import i18n_patterns
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import include, path, re_path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import DefaultRouter
from rest_framework.urlpatterns import format_suffix_patterns
from rest_framework.viewsets import ViewSet

from django_throttle.decorators import throttle
from tests.urls import urlpatterns as base
from tests.views import Ping


class FormatPing(Ping):
    def get(self, request: Request, format: Any = None) -> Response:
        return Response({"pong": True})


class Items(ViewSet):
    permission_classes = [AllowAny]

    def list(self, request: Request, format: Any = None) -> Response:
        return Response([])

    def retrieve(self, request: Request, pk: Any = None, format: Any = None) -> Response:
        return Response({})


@throttle(scope="escapes")  # no rule has this scope: rules by route or path apply
def hello(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    return JsonResponse({"hello": "world"})


@throttle(scope="escapes")
async def hello_async(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    return JsonResponse({"hello": "async"})


router = DefaultRouter()
router.register("items", Items, basename="item")

urlpatterns = [
    *format_suffix_patterns(
        [
            path("fmt/ping/", FormatPing.as_view(), name="fmt-ping"),
            path("fmt/hello/", hello, name="fmt-hello"),
            path("fmt/hello-async/", hello_async, name="fmt-hello-async"),
        ]
    ),
    re_path(r"^opt/ping/?$", FormatPing.as_view(), name="opt-ping"),
    re_path(r"^opt/hello/?$", hello, name="opt-hello"),
    re_path(r"^opt/hello-async/?$", hello_async, name="opt-hello-async"),
    path("r/", include(router.urls)),
    path("any/<path:rest>", hello, name="any"),
    *base,
    *i18n_patterns(
        path("intl/ping/", FormatPing.as_view(), name="intl-ping"),
        path("intl/hello/", hello, name="intl-hello"),
        path("intl/hello-async/", hello_async, name="intl-hello-async"),
        prefix_default_language=False,
    ),
]
