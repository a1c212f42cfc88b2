from __future__ import annotations

from adrf.views import APIView as AsyncAPIView
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.credentials import protect_credentials
from django_throttle.decorators import throttle
from django_throttle.drf import AsyncPolicyThrottle, ProtectedBasicAuthentication


class Ping(APIView):
    permission_classes = [AllowAny]

    def get(self, request: Request, pk: int | None = None) -> Response:
        return Response({"pong": True})


class Export(APIView):
    permission_classes = [AllowAny]
    throttle_scope = "export"

    def post(self, request: Request) -> Response:
        return Response({"status": "queued"}, status=202)


class Scoped(APIView):
    """Mounted twice, each time with its own ``as_view(throttle_scope=...)``."""

    permission_classes = [AllowAny]
    throttle_scope = "scoped"

    def get(self, request: Request) -> Response:
        return Response({"scope": self.throttle_scope})


class ScopedAsync(AsyncAPIView):  # type: ignore[misc]
    permission_classes = [AllowAny]
    throttle_classes = [AsyncPolicyThrottle]
    throttle_scope = "scoped"

    async def get(self, request: Request) -> Response:
        return Response({"scope": self.throttle_scope})


@throttle(rate="5/min")
def hello(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"hello": "world"})


@throttle(rate="2/min")
async def hello_async(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"hello": "async"})


@throttle(scope="login")
def login(request: HttpRequest) -> HttpResponse:
    return HttpResponse("login form")


@throttle(rate="5/min", failure_mode="closed")
def login_closed(request: HttpRequest) -> HttpResponse:
    return HttpResponse("login form")


@method_decorator(throttle(rate="1/min", scope="cbv"), name="dispatch")
class ClassBased(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("cbv")


@method_decorator(throttle(rate="1/min"), name="dispatch")
class UnscopedA(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("a")


@method_decorator(throttle(rate="1/min"), name="dispatch")
class UnscopedB(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("b")


@method_decorator(throttle(rate="5/min"), name="dispatch")
class ThrottledLogin(LoginView):
    """Django's own login view: a credential endpoint, counted in the process (never served
    uncounted) while Redis is down, unless its mode says otherwise."""


class TokenLogin(APIView):
    permission_classes = [AllowAny]
    throttle_credential = True

    def post(self, request: Request) -> Response:
        return Response({"token": "t"})


# The seams (tests/test_request_seams.py): every adapter, sync and async, under the admin
# rules of scope "seam" (a GET rule) and "seam-login" (a credential rule).


@throttle(scope="seam")
def seam_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"user": request.user.get_username()})


@throttle(scope="seam")
async def seam_view_async(request: HttpRequest) -> HttpResponse:
    user = await request.auser()
    return JsonResponse({"user": user.get_username()})


class SeamApi(APIView):
    permission_classes = [AllowAny]
    throttle_scope = "seam"

    def get(self, request: Request) -> Response:
        return Response({"user": request.user.get_username()})


class SeamAsyncApi(AsyncAPIView):  # type: ignore[misc]
    permission_classes = [AllowAny]
    throttle_classes = [AsyncPolicyThrottle]
    throttle_scope = "seam"

    async def get(self, request: Request) -> Response:
        return Response({"user": request.user.get_username()})


@protect_credentials(scope="seam-login")
def seam_login(request: HttpRequest) -> HttpResponse:
    """A login whose every attempt fails (the rule counts failures)."""
    return HttpResponse("wrong password", status=401)


@protect_credentials(scope="seam-login")
async def seam_login_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("wrong password", status=401)


@throttle(scope="seam-login")
def seam_login_decorated(request: HttpRequest) -> HttpResponse:
    """A login under ``@throttle`` with no ``credential=True``: the rule says it is one."""
    return HttpResponse("wrong password", status=401)


@throttle(scope="seam-login")
async def seam_login_decorated_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("wrong password", status=401)


class SeamToken(APIView):
    """A token endpoint under the credential rule, through the DRF throttle class."""

    permission_classes = [AllowAny]
    throttle_scope = "seam-login"
    throttle_credential = True

    def post(self, request: Request) -> Response:
        return Response({"detail": "wrong password"}, status=401)


class SeamAsyncToken(AsyncAPIView):  # type: ignore[misc]
    permission_classes = [AllowAny]
    throttle_classes = [AsyncPolicyThrottle]
    throttle_scope = "seam-login"
    throttle_credential = True

    async def post(self, request: Request) -> Response:
        return Response({"detail": "wrong password"}, status=401)


class SeamBasicAuthentication(ProtectedBasicAuthentication):
    protection_scope = "seam-login"


class SeamBasic(APIView):
    """Basic credentials counted under the credential rule before the password is checked."""

    authentication_classes = [SeamBasicAuthentication]
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        return Response({"user": request.user.get_username()})
