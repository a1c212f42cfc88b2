"""``async def`` views decide on the event loop: redis.asyncio, the same script, no thread."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, RequestFactory
from django.urls import path

from django_throttle import backends
from django_throttle.backends.redis import RedisBackend
from django_throttle.decorators import throttle
from tests.factories import tier
from tests.redis_servers import forget_code

pytestmark = pytest.mark.django_db(transaction=True)


@throttle(rate="10/h")
async def limited(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@throttle(scope="async-admin")
async def admin_limited(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("limited/", limited), path("admin-limited/", admin_limited)]


def _requests(count: int, address: str = "10.20.0.1") -> list[HttpRequest]:
    factory = RequestFactory()
    return [factory.get("/async/", REMOTE_ADDR=address) for _ in range(count)]


def _no_sync_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync call must not be used (it would need a thread under ASGI)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the async path called the sync backend")

    monkeypatch.setattr(RedisBackend, "hit", refuse)


def test_concurrent_async_requests_admit_exactly_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _no_sync_hit(monkeypatch)
    threads: set[int] = set()

    async def one(request: HttpRequest) -> int:
        threads.add(threading.get_ident())
        return (await limited(request)).status_code

    async def burst() -> list[int]:
        return list(await asyncio.gather(*(one(r) for r in _requests(200))))

    codes = async_to_sync(burst)()
    assert codes.count(200) == 10
    assert codes.count(429) == 190
    assert len(threads) == 1


def test_async_headers_match_the_sync_path(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_sync_hit(monkeypatch)

    async def two() -> list[HttpResponse]:
        return [await limited(r) for r in _requests(2, "10.20.0.2")]

    first, second = async_to_sync(two)()
    assert first["X-RateLimit-Limit"] == "10"
    assert first["X-RateLimit-Remaining"] == "9"
    assert second["X-RateLimit-Remaining"] == "8"


def test_admin_policy_applies_to_async_views(monkeypatch: pytest.MonkeyPatch) -> None:
    tier("anonymous", "3/h", burst=3, is_default_anonymous=True)
    _no_sync_hit(monkeypatch)

    async def four() -> list[int]:
        return [(await admin_limited(r)).status_code for r in _requests(4, "10.20.0.3")]

    assert async_to_sync(four)() == [200, 200, 200, 429]


def test_async_path_fails_open_when_redis_is_down(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    settings.DJANGO_THROTTLE_FAILURE_MODE = "open"
    backends.reset_backend_cache()

    async def three() -> list[HttpResponse]:
        return [await limited(r) for r in _requests(3, "10.20.0.4")]

    responses = async_to_sync(three)()
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert all(r["X-RateLimit-Degraded"] == "open" for r in responses)


def test_async_path_counts_usage_like_the_sync_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from io import StringIO

    from django.core.management import call_command

    tier("anonymous", "2/h", burst=2, is_default_anonymous=True)

    async def three() -> list[int]:
        return [(await admin_limited(r)).status_code for r in _requests(3, "10.20.0.5")]

    assert async_to_sync(three)() == [200, 200, 429]
    out = StringIO()
    call_command("throttle_usage", "--by", "tier", "--format", "csv", stdout=out)
    assert "anonymous" in out.getvalue()


def test_async_drf_view_through_adrf(monkeypatch: pytest.MonkeyPatch) -> None:
    """adrf's APIView awaits ``AsyncPolicyThrottle.allow_request``: same 429 and headers."""
    from adrf.views import APIView
    from rest_framework.response import Response

    from django_throttle.drf import AsyncPolicyThrottle

    class AsyncEcho(APIView):
        throttle_classes = [AsyncPolicyThrottle]
        authentication_classes: list[Any] = []
        permission_classes: list[Any] = []

        async def get(self, request: Any) -> Response:
            return Response({"ok": True})

    tier("anonymous", "2/h", burst=2, is_default_anonymous=True)
    _no_sync_hit(monkeypatch)
    view = AsyncEcho.as_view()

    async def three() -> list[Any]:
        return [await view(r) for r in _requests(3, "10.20.0.6")]

    responses = async_to_sync(three)()
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert int(responses[-1]["Retry-After"]) >= 1


def test_async_path_recovers_a_flushed_script_cache(redis_client: Any) -> None:
    """NOSCRIPT on the pipelined connection: the call is sent once more as EVAL, counted once."""
    from django_throttle.rates import Limit

    backend = backends.get_backend()
    limit = (Limit.build("async-flush", "1/m", burst=3),)

    async def run() -> list[int]:
        first = await backend.ahit("ip:10.20.0.9", limit)
        forget_code(redis_client)
        second = await backend.ahit("ip:10.20.0.9", limit)
        return [first.remaining, second.remaining]

    assert async_to_sync(run)() == [2, 1]


@pytest.mark.urls("tests.test_async")
@pytest.mark.parametrize("signed_in", [False, True], ids=["anonymous", "signed-in"])
def test_concurrent_requests_through_the_asgi_stack_admit_exactly_the_limit(
    monkeypatch: pytest.MonkeyPatch, django_user_model: Any, signed_in: bool
) -> None:
    """Through ``AsyncClient`` and the real session and authentication middleware, where
    ``request.user`` is lazy and may not be read on the event loop: a signed-in user is
    counted under their tier's limit, on the event loop, never a 500."""
    tier("anonymous", "3/h", burst=3, is_default_anonymous=True)
    tier("members", "5/h", burst=5, is_default_authenticated=True)
    _no_sync_hit(monkeypatch)
    client = AsyncClient()
    if signed_in:
        client.force_login(django_user_model.objects.create_user("[async]"))

    async def burst() -> list[int]:
        responses = await asyncio.gather(*(client.get("/admin-limited/") for _ in range(20)))
        return [response.status_code for response in responses]

    codes = async_to_sync(burst)()
    assert codes.count(200) == (5 if signed_in else 3)
    assert codes.count(429) == len(codes) - codes.count(200)


class TokenUser:
    """A middleware that signs requests in from a header, lazily and without the database
    (as JWT middlewares do), after Django's AuthenticationMiddleware."""

    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        from asgiref.sync import markcoroutinefunction

        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request: Any) -> Any:
        from django.contrib.auth.models import AnonymousUser
        from django.utils.functional import SimpleLazyObject

        if "HTTP_X_TOKEN_USER" in request.META:
            name = request.META["HTTP_X_TOKEN_USER"]
            user = type("Token", (AnonymousUser,), {"username": name})()
            request.user = SimpleLazyObject(lambda: user)
        return await self.get_response(request)


@throttle(rate="10/h")
async def who(request: HttpRequest) -> HttpResponse:
    return HttpResponse(request.user.username)


urlpatterns.append(path("who/", who))


@pytest.mark.urls("tests.test_async")
def test_an_async_view_keeps_its_own_request_user(settings: Any) -> None:
    """The check reads the signed-in user through ``request.auser()`` and never replaces
    the request's own (here another middleware's lazy user) for the view."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.test_async.TokenUser"]

    async def get() -> HttpResponse:
        return await AsyncClient().get("/who/", headers={"X-Token-User": "[token]"})  # type: ignore[no-any-return]

    response = async_to_sync(get)()
    assert response.status_code == 200
    assert response.content == b"[token]"
