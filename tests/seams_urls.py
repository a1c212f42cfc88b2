"""The test project's URLs plus the demo's token endpoint: DRF's ``obtain_auth_token`` behind
``protect_credentials`` (rule "login": failed attempts counted by IP address and username)."""

from django.urls import path
from rest_framework.authtoken.views import obtain_auth_token

from django_throttle.credentials import protect_credentials
from tests.urls import urlpatterns as base

urlpatterns = [
    path("api/login-token/", protect_credentials(obtain_auth_token), name="login-token"),
    *base,
]
