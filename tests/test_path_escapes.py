"""A path rule meets every spelling of a path its view answers: a client cannot leave a rule's
counter by writing the path another way the URL conf accepts (DRF's format suffix
``.json``, an optional trailing slash, an ``i18n_patterns`` language prefix, percent
escapes), through the DRF throttle and ``@throttle``, sync and async. And a worker keeps no
memory per path a client makes up.

Each case makes one request by the plain path, then one by the other spelling from the same
address: the rule allows one an hour, so the second is refused (or never reaches a view)."""

from __future__ import annotations

import sys
import tracemalloc
import urllib.parse
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client

from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db

#: Not a view's answer: the request never reached one (no counter left).
NO_VIEW = (301, 302, 404)


@pytest.fixture
def escapes(settings: Any) -> Any:
    settings.ROOT_URLCONF = "tests.escape_urls"
    settings.LANGUAGES = [("en", "English"), ("de", "German")]
    settings.LANGUAGE_CODE = "en"
    settings.MIDDLEWARE = [
        *settings.MIDDLEWARE[:1],
        "django.middleware.locale.LocaleMiddleware",
        *settings.MIDDLEWARE[1:],
    ]
    return tier("anonymous", "100/m", is_default_anonymous=True)


CASES = [
    # DRF's format suffix: the same view, the same rule.
    ("/fmt/ping", "/fmt/ping/", "/fmt/ping.json"),
    ("/fmt/ping/", "/fmt/ping/", "/fmt/ping.json"),
    ("/fmt/hello", "/fmt/hello/", "/fmt/hello.json"),
    ("/fmt/hello/", "/fmt/hello/", "/fmt/hello.json"),
    ("/r/items", "/r/items/", "/r/items.json"),
    ("/r/items/", "/r/items/", "/r/items.json"),
    ("/r/items/", "/r/items/1/", "/r/items/1.json"),
    # An optional trailing slash (re_path ``/?``, DRF routers' ``trailing_slash="/?"``).
    ("/opt/ping/", "/opt/ping/", "/opt/ping"),
    ("/opt/hello/", "/opt/hello/", "/opt/hello"),
    ("/opt/ping", "/opt/ping", "/opt/ping/"),
    # i18n_patterns: every language's prefix (and none, for the default language).
    ("/intl/ping/", "/intl/ping/", "/de/intl/ping/"),
    ("/intl/hello/", "/intl/hello/", "/de/intl/hello/"),
    # Spellings that held before: Django decodes escapes and resolves nothing else.
    ("/fmt/ping", "/fmt/ping/", "/fmt/%70ing/"),
    ("/fmt/ping", "/fmt/ping/", "/fmt%2Fping/"),
    ("/fmt/ping", "/fmt/ping/", "/fmt/ping/?format=json"),
    ("/fmt/ping", "/fmt/ping/", "//fmt/ping/"),
    ("/fmt/ping", "/fmt/ping/", "/fmt/./ping/"),
    ("/fmt/ping", "/fmt/ping/", "/FMT/ping/"),
    ("/fmt/ping", "/fmt/ping/", "/fmt/ping/;x=1"),
]


@pytest.mark.parametrize(("pattern", "plain", "other"), CASES)
def test_a_path_rule_meets_every_spelling_of_its_path(
    escapes: Any, pattern: str, plain: str, other: str
) -> None:
    endpoint("rule", "path", pattern, limits={escapes: "1/h"})
    client = Client()
    assert client.get(plain).status_code == 200
    assert client.get(other).status_code in (429, *NO_VIEW)


ASYNC_CASES = [
    ("/fmt/hello-async", "/fmt/hello-async/", "/fmt/hello-async.json"),
    ("/opt/hello-async/", "/opt/hello-async/", "/opt/hello-async"),
    ("/intl/hello-async/", "/intl/hello-async/", "/de/intl/hello-async/"),
]


@pytest.mark.parametrize(("pattern", "plain", "other"), ASYNC_CASES)
def test_an_async_view_meets_its_path_rule_however_spelt(
    escapes: Any, pattern: str, plain: str, other: str
) -> None:
    endpoint("rule", "path", pattern, limits={escapes: "1/h"})
    client = AsyncClient()

    async def both() -> list[int]:
        return [(await client.get(plain)).status_code, (await client.get(other)).status_code]

    first, second = async_to_sync(both)()
    assert first == 200
    assert second in (429, *NO_VIEW)


def test_a_rule_for_one_language_stays_that_languages(escapes: Any) -> None:
    endpoint("german", "path", "/de/intl/ping/", limits={escapes: "1/h"})
    client = Client()
    assert [client.get("/de/intl/ping/").status_code for _ in range(2)] == [200, 429]
    assert [client.get("/intl/ping/").status_code for _ in range(2)] == [200, 200]


@pytest.mark.xfail(
    sys.version_info >= (3, 13),
    reason="on Python 3.13 with Django 6 this measure grew 3.98 MB for the 90 paths (CI, session "
    "43): something outside the plan store keeps them, not yet found (named in the issue note)",
    strict=False,
)
def test_a_worker_keeps_no_memory_per_path_a_client_makes_up(escapes: Any) -> None:
    endpoint("rule", "path", "/any/", limits={escapes: "1000/h"})
    client = Client()
    assert client.get("/any/warm").status_code == 200
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(90):  # the tier allows 100 a minute
            assert client.get(f"/any/{n:05d}{'x' * 40_000}").status_code == 200
        urllib.parse.clear_cache()  # the test client's urlsplit keeps the last 128 URLs
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 90 paths of 40 kB: 3.6 MB if each were kept.
    assert grown < 2_500_000, grown


@pytest.mark.parametrize("method", ["FOO", "PROPFIND", "get"])
@pytest.mark.parametrize("path", ["/fmt/hello/", "/fmt/ping/"])
def test_a_method_no_rule_can_name_meets_the_get_rule(escapes: Any, path: str, method: str) -> None:
    """A function view answers any method with the code its GET runs (a DRF view refuses
    it with 405): a method the admin cannot name must not escape the GET's limits, as HEAD
    does not."""
    endpoint("reads", "path", path, methods="GET", limits={escapes: "1/h"})
    client = Client()
    assert client.get(path).status_code == 200
    assert client.generic(method, path).status_code in (405, 429)


def test_an_async_view_meets_the_get_rule_by_any_unnamed_method(escapes: Any) -> None:
    endpoint("reads", "path", "/fmt/hello-async/", methods="GET", limits={escapes: "1/h"})
    client = AsyncClient()

    async def both() -> list[int]:
        first = await client.get("/fmt/hello-async/")
        return [first.status_code, (await client.generic("FOO", "/fmt/hello-async/")).status_code]

    assert async_to_sync(both)() == [200, 429]


def test_a_rule_naming_get_leaves_other_named_methods_alone(escapes: Any) -> None:
    endpoint("reads", "path", "/fmt/hello/", methods="GET", limits={escapes: "1/h"})
    client = Client()
    assert client.get("/fmt/hello/").status_code == 200
    assert client.post("/fmt/hello/").status_code == 200


def test_the_methods_a_rule_can_name_are_the_admins() -> None:
    from django_throttle.models.fields import HTTP_METHODS
    from django_throttle.policy.live import NAMEABLE_METHODS

    assert frozenset(HTTP_METHODS) == NAMEABLE_METHODS
