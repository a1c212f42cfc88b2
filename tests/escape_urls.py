"""The test project's URLs plus views a Django project serves under several spellings of one
path: DRF format suffixes (``format_suffix_patterns`` and ``DefaultRouter``), an optional
trailing slash, and ``i18n_patterns`` language prefixes; under several names (one app's URLs
included in namespaces ``v1`` and ``v2``, and ``v1`` again inside ``outer``); and a plain
Django class-based view and a DRF ``@api_view``, which answer OPTIONS themselves
(tests/test_path_escapes.py)."""

from typing import Any

from django.conf.urls.i18n import i18n_patterns
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import include, path, re_path
from django.views import View
from rest_framework.decorators import api_view
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


class HelloView(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse({"hello": "class"})


@api_view(["GET"])
def hello_api(request: Request) -> Response:
    return Response({"hello": "api_view"})


router = DefaultRouter()
router.register("items", Items, basename="item")

api_router = DefaultRouter()
api_router.register("things", Items, basename="thing")
#: One app's URLs (app namespace "api"), included under two instance namespaces.
api_patterns = (
    [
        path("items/", hello, name="items"),
        path("items-async/", hello_async, name="items-async"),
        path("", include(api_router.urls)),
    ],
    "api",
)

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
    # A converter reads several spellings as one value: /int/hello/01/ is pk 1.
    path("int/hello/<int:pk>/", hello, name="int-hello"),
    path("int/hello-async/<int:pk>/", hello_async, name="int-hello-async"),
    path("int/extra/<int:pk>/", hello, {"extra": True}, name="int-extra"),
    # One name, two routes: reverse() writes one of them for both.
    path("dup/a/<int:pk>/", hello, name="dup"),
    path("dup/b/<int:pk>/", hello, name="dup"),
    path("cbv/hello/", throttle(scope="escapes")(HelloView.as_view()), name="cbv-hello"),
    path("api-view/hello/", hello_api, name="api-view-hello"),
    path("v1/", include(api_patterns, namespace="v1")),
    path("v2/", include(api_patterns, namespace="v2")),
    path("outer/", include(([path("v1/", include(api_patterns, namespace="v1"))], "outer"))),
    *base,
    *i18n_patterns(
        path("intl/ping/", FormatPing.as_view(), name="intl-ping"),
        path("intl/hello/", hello, name="intl-hello"),
        path("intl/hello-async/", hello_async, name="intl-hello-async"),
        prefix_default_language=False,
    ),
]
