"""The drf-spectacular extension: a throttled view's operations document 429 and 503 with
Retry-After and X-RateLimit-* headers; other views are left alone."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from django.urls import path
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.utils import extend_schema
from drf_spectacular.validation import validate_schema
from rest_framework import serializers
from rest_framework.authtoken.views import ObtainAuthToken, obtain_auth_token
from rest_framework.decorators import api_view, throttle_classes
from rest_framework.decorators import schema as schema_for
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.credentials import protect_credentials
from django_throttle.drf import PolicyThrottle
from django_throttle.openapi import ThrottledAutoSchema


class ItemSerializer(serializers.Serializer):
    name = serializers.CharField()


class Throttled(APIView):
    throttle_classes = [PolicyThrottle]
    serializer_class = ItemSerializer

    def get(self, request: Any) -> Response:
        return Response({"name": "x"})

    def post(self, request: Any) -> Response:
        return Response({"name": "x"})


class Plain(APIView):
    throttle_classes: list[Any] = []
    serializer_class = ItemSerializer

    def get(self, request: Any) -> Response:
        return Response({"name": "x"})


# A function view's schema is fixed when @api_view runs (DRF reads DEFAULT_SCHEMA_CLASS then).
@api_view(["GET"])
@throttle_classes([PolicyThrottle])
@schema_for(ThrottledAutoSchema())
@extend_schema(responses=ItemSerializer)
def function_view(request: Any) -> Response:
    return Response({"name": "x"})


class CustomToken(ObtainAuthToken):
    pass


urlpatterns = [
    path("throttled/", Throttled.as_view()),
    path("plain/", Plain.as_view()),
    path("function/", function_view),
    path("token/", protect_credentials(obtain_auth_token)),
    path("token2/", protect_credentials(CustomToken.as_view(), scope="api-login")),
    path("bare-token/", obtain_auth_token),
]

REST = {"DEFAULT_SCHEMA_CLASS": "django_throttle.openapi.ThrottledAutoSchema"}


def schema() -> dict[str, Any]:
    generated = SchemaGenerator(patterns=urlpatterns).get_schema(request=None, public=True)
    validate_schema(generated)  # a valid OpenAPI 3 document
    return generated


@override_settings(REST_FRAMEWORK=REST)
def test_throttled_operations_document_429_and_503_with_headers() -> None:
    paths = schema()["paths"]
    for method in ("get", "post"):
        responses = paths["/throttled/"][method]["responses"]
        assert set(responses["429"]["headers"]) == {
            "Retry-After",
            "X-RateLimit-Limit",
            "X-RateLimit-Remaining",
            "X-RateLimit-Reset",
        }
        assert set(responses["503"]["headers"]) == {"Retry-After"}
        ref = responses["429"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == "#/components/schemas/ThrottledError"
    ok = paths["/throttled/"]["get"]["responses"]["200"]
    assert "X-RateLimit-Remaining" in ok["headers"]
    assert "X-RateLimit-Remaining" in paths["/throttled/"]["post"]["responses"]["200"]["headers"]


@override_settings(REST_FRAMEWORK=REST)
def test_the_error_body_matches_what_the_throttle_sends() -> None:
    body = schema()["components"]["schemas"]["ThrottledError"]
    assert set(body["properties"]) == {"detail", "limit", "retry_after"}


@override_settings(REST_FRAMEWORK=REST)
def test_unthrottled_views_are_left_alone_and_function_views_are_covered() -> None:
    paths = schema()["paths"]
    plain = paths["/plain/"]["get"]["responses"]
    assert "429" not in plain
    assert "headers" not in plain["200"]
    assert "429" in paths["/function/"]["get"]["responses"]


@override_settings(REST_FRAMEWORK=REST, DJANGO_THROTTLE_IETF_HEADERS=True)
def test_ietf_fields_are_documented_when_switched_on() -> None:
    headers = schema()["paths"]["/throttled/"]["get"]["responses"]["429"]["headers"]
    assert {"RateLimit", "RateLimit-Policy"} <= set(headers)


def test_the_schema_class_works_when_set_on_a_view() -> None:
    class Own(Throttled):
        schema = ThrottledAutoSchema()

    generated = SchemaGenerator(patterns=[path("own/", Own.as_view())]).get_schema(
        request=None, public=True
    )
    assert "429" in generated["paths"]["/own/"]["get"]["responses"]


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@override_settings(REST_FRAMEWORK=REST)
def test_token_views_under_protect_credentials_document_429() -> None:
    """DRF's ``ObtainAuthToken`` has ``throttle_classes = ()``, so only ``protect_credentials``
    limits it; the schema documented no 429 for a route that answers one."""
    paths = schema()["paths"]

    for route in ("/token/", "/token2/"):
        responses = paths[route]["post"]["responses"]
        assert {"429", "503"} <= set(responses), route
        assert "Retry-After" in responses["429"]["headers"]
    assert "429" not in paths["/bare-token/"]["post"]["responses"]


@pytest.mark.django_db
def test_the_guarded_token_view_serves_as_before() -> None:
    """The copy of ``initkwargs`` is for schema generators only: the wrapped view still runs
    ``obtain_auth_token`` (a wrong password is its 400), and the original is untouched."""
    from django.test import RequestFactory

    guarded = protect_credentials(obtain_auth_token)
    request = RequestFactory().post("/token/", {"username": "nobody", "password": "wrong"})

    response = guarded(request)

    assert response.status_code == 400
    assert "non_field_errors" in response.data
    assert guarded.initkwargs is not obtain_auth_token.initkwargs
    assert "throttle_credential_scope" not in obtain_auth_token.initkwargs


@pytest.mark.django_db
@override_settings(REST_FRAMEWORK=REST, ROOT_URLCONF=__name__)
def test_successful_responses_document_the_rate_headers_they_carry() -> None:
    """A success documents ``X-RateLimit-*`` only where the response carries them: a view
    ``PolicyThrottle`` guards, with ``RateLimitHeadersMiddleware`` installed. A token view
    limited by ``protect_credentials`` alone answers a right password with no such header
    (the schema said it sent all three), and without the middleware no view sends them."""
    from django.contrib.auth.models import User
    from django.test import Client

    from tests.factories import tier

    tier("anonymous", "100/min", is_default_anonymous=True)
    User.objects.create_user("carol", password="pw")
    client = Client()
    token = client.post("/token/", {"username": "carol", "password": "pw"})
    throttled = client.post("/throttled/")
    assert token.status_code == throttled.status_code == 200
    assert "X-RateLimit-Remaining" not in token
    assert "X-RateLimit-Remaining" in throttled

    paths = schema()["paths"]
    assert "X-RateLimit-Remaining" not in paths["/token/"]["post"]["responses"]["200"].get(
        "headers", {}
    )
    assert "X-RateLimit-Remaining" in paths["/throttled/"]["post"]["responses"]["200"]["headers"]

    from django.conf import settings

    without = [m for m in settings.MIDDLEWARE if not m.endswith("RateLimitHeadersMiddleware")]
    with override_settings(MIDDLEWARE=without):
        assert "X-RateLimit-Remaining" not in Client().post("/throttled/")
        ok = schema()["paths"]["/throttled/"]["post"]["responses"]["200"]
        assert "X-RateLimit-Remaining" not in ok.get("headers", {})
        assert "429" in schema()["paths"]["/throttled/"]["post"]["responses"]


def _sent(response: Any) -> set[str]:
    return {
        name
        for name in response.headers
        if name.lower().startswith(("x-ratelimit-", "ratelimit", "retry-after"))
    }


@pytest.mark.django_db
@pytest.mark.parametrize("ietf", [False, True])
def test_a_real_refusal_carries_what_the_schema_documents(settings: Any, ietf: bool) -> None:
    """The 429 of a ``PolicyThrottle`` view and of a token view under
    ``protect_credentials``, and the fail-closed 503, send exactly the headers and body
    fields their operations document (the IETF fields too when switched on)."""
    from django.test import Client

    from django_throttle.models import EndpointLimit, EndpointRule
    from tests.factories import tier

    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, **REST}
    settings.ROOT_URLCONF = __name__
    settings.DJANGO_THROTTLE_IETF_HEADERS = ietf
    anonymous = tier("anonymous", "1/h", is_default_anonymous=True)
    login = EndpointRule.objects.create(name="login", match_type="scope", pattern="login")
    EndpointLimit.objects.create(rule=login, tier=anonymous, rate="1/h", counted_by="ip")
    client = Client()
    paths = schema()["paths"]
    body = schema()["components"]["schemas"]["ThrottledError"]["required"]

    for route, method in (("/throttled/", "get"), ("/token/", "post")):
        for _ in range(2):
            refused = getattr(client, method)(route, {"username": "x", "password": "y"})
        assert refused.status_code == 429, route
        documented = paths[route][method]["responses"]["429"]["headers"]
        assert _sent(refused) == set(documented), route
        assert sorted(refused.json()) == sorted(body), route

    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    settings.DJANGO_THROTTLE_FAILURE_MODE = "closed"
    closed = Client().get("/throttled/")
    assert closed.status_code == 503
    assert _sent(closed) == set(paths["/throttled/"]["get"]["responses"]["503"]["headers"])
    assert sorted(closed.json()) == sorted(body)
