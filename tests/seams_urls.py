"""The test project's URLs plus the demo's two credential seams: DRF's ``obtain_auth_token``
behind ``protect_credentials`` (rule "login"), and a DRF view whose Basic authentication is
protected (rule "authentication"); both count failed attempts by IP address and username."""

from django.urls import path
from rest_framework.authtoken.views import obtain_auth_token
from rest_framework.permissions import IsAuthenticated

from django_throttle.credentials import protect_credentials
from django_throttle.drf import ProtectedBasicAuthentication
from tests.urls import urlpatterns as base
from tests.views import Ping


class BasicPing(Ping):
    authentication_classes = [ProtectedBasicAuthentication]
    permission_classes = [IsAuthenticated]


urlpatterns = [
    path("api/login-token/", protect_credentials(obtain_auth_token), name="login-token"),
    path("api/basic-ping/", BasicPing.as_view(), name="basic-ping"),
    *base,
]
