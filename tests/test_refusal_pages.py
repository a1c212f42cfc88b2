"""Refusals a browser can read, and logins that say when Redis was down.

A browser (``Accept`` preferring ``text/html``) gets the 429 and the 503 as a page in words,
with the same status and headers; an API client gets the JSON body as before. An operator who
signs in while Redis is down under failure mode ``closed`` meets a page saying rate limiting
is unavailable and when to try again, not raw JSON; under ``local`` or ``open`` the sign-in
is served and says it was degraded (``X-RateLimit-Degraded``). The admin's own login is never
refused for an outage, whatever the mode: it is counted in the process, so an operator can
always sign in. Redis is "down" as
a closed port: no server listens there, so every connection is refused for real.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client
from django.urls import path

from django_throttle.credentials import protect_credentials
from django_throttle.decorators import throttle
from django_throttle.models import EndpointLimit, EndpointRule, Tier
from django_throttle.request.core import human_wait

# Transactions committed: the async view's policy load reads the rows from another thread.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.test_refusal_pages")]

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
DOWN = "redis://127.0.0.1:1/0"


@throttle(rate="1/h")
def page(request: HttpRequest) -> HttpResponse:
    return HttpResponse("page")


@protect_credentials(scope="admin-login")
async def async_login(request: HttpRequest) -> HttpResponse:
    return HttpResponse("wrong password", status=401)


urlpatterns = [
    path("admin/login/", protect_credentials(admin.site.login, scope="admin-login")),
    path(
        "accounts/login/",
        protect_credentials(
            LoginView.as_view(template_name="admin/login.html"), scope="admin-login"
        ),
    ),
    path("admin/", admin.site.urls),
    path("async-login/", async_login),
    path("page/", page),
]

#: Django's login view and an async login view, both behind ``protect_credentials``.
LOGINS = ["/accounts/login/", "/async-login/"]

API_CLIENTS = ["application/json", "*/*", None]


def admin_login_rule(failure_mode: str = "", rate: str = "100/min") -> EndpointRule:
    """The demo's "admin-login" rule, its failure mode set as an operator would in the admin."""
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    rule = EndpointRule.objects.create(
        name="admin-login", pattern="admin-login", failure_mode=failure_mode
    )
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate=rate, counted_by="ip")
    return rule


def post(url: str, accept: str | None = None) -> Any:
    """A sign-in attempt through the whole middleware stack, sending ``accept`` as its
    ``Accept``: sync client for the sync view, async client (an ASGI request, the view
    awaited) for the async one."""
    data = {"username": "root", "password": "wrong"}
    headers = {} if accept is None else {"Accept": accept}
    if url == "/async-login/":
        return async_to_sync(AsyncClient().post)(url, data, headers=headers)
    return Client().post(url, data, headers=headers)


@pytest.mark.parametrize("url", LOGINS)
def test_a_browser_locked_out_by_an_outage_gets_a_page(url: str, settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = DOWN
    admin_login_rule(failure_mode="closed")

    response = post(url, BROWSER)

    assert response.status_code == 503
    assert response["Content-Type"] == "text/html; charset=utf-8"
    assert int(response["Retry-After"]) >= 1
    assert "Accept" in response["Vary"]
    html = response.content.decode()
    assert html.startswith("<!DOCTYPE html>")
    assert "Rate limiting is unavailable right now" in html
    assert "Try again in " in html


@pytest.mark.parametrize("url", LOGINS)
@pytest.mark.parametrize("accept", API_CLIENTS)
def test_an_api_client_locked_out_by_an_outage_gets_json(
    url: str, accept: str | None, settings: Any
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = DOWN
    admin_login_rule(failure_mode="closed")

    response = post(url, accept)

    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response.json()["detail"].startswith("Rate limiting is temporarily unavailable.")
    assert response.json()["retry_after"] == int(response["Retry-After"])


@pytest.mark.parametrize("url", LOGINS)
def test_a_browser_over_the_limit_gets_a_page_with_the_same_headers(url: str) -> None:
    admin_login_rule(rate="1/h")
    post(url, BROWSER)

    response = post(url, BROWSER)
    api = post(url, "application/json")

    assert response.status_code == api.status_code == 429
    assert response["Content-Type"] == "text/html; charset=utf-8"
    assert "Too many requests" in response.content.decode()
    assert "Try again in 60 minutes." in response.content.decode()
    for name in ("Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining"):
        assert response[name] == api[name]
    assert api.json()["limit"] == "admin-login (anonymous) 1/h"


@pytest.mark.parametrize("url", LOGINS)
@pytest.mark.parametrize("mode", ["local", "open"])
def test_a_login_served_while_redis_is_down_says_it_was_degraded(
    url: str, mode: str, settings: Any
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = DOWN
    admin_login_rule(failure_mode=mode)

    response = post(url, BROWSER)

    assert response.status_code in (200, 401)  # the view answered: a wrong password
    assert response["X-RateLimit-Degraded"] == mode
    assert "X-RateLimit-Remaining" not in response  # a login advertises no counts


@pytest.mark.parametrize("where", ["rule", "setting"])
def test_the_admin_login_is_never_refused_for_an_outage(
    where: str, settings: Any, django_user_model: Any
) -> None:
    """'closed' on the admin-login rule or in the setting refused every sign-in to the admin
    while Redis was down: the operators were locked out of their own tools. The admin's
    login is counted in the process instead (``local``): the operator signs in, and a
    guesser is still held to the rule's limit."""
    django_user_model.objects.create_superuser("root", password="right")
    settings.DJANGO_THROTTLE_REDIS_URL = DOWN
    if where == "setting":
        settings.DJANGO_THROTTLE_FAILURE_MODE = "closed"
        admin_login_rule(rate="3/h")
    else:
        admin_login_rule(failure_mode="closed", rate="3/h")
    operator = Client()
    signed_in = operator.post(
        "/admin/login/?next=/admin/", {"username": "root", "password": "right"}
    )
    assert signed_in.status_code == 302, signed_in.content[:300]
    assert signed_in["X-RateLimit-Degraded"] == "local"
    assert operator.get("/admin/").status_code == 200
    guesser = Client(REMOTE_ADDR="203.0.113.77")
    guesses = [
        guesser.post("/admin/login/", {"username": "root", "password": f"guess{n}"}).status_code
        for n in range(5)
    ]
    assert guesses == [200, 200, 200, 429, 429]  # the form again, wrong password; then held


@pytest.mark.parametrize("url", LOGINS)
def test_a_login_answered_by_redis_says_nothing_of_degrading(url: str) -> None:
    admin_login_rule(failure_mode="local")
    assert "X-RateLimit-Degraded" not in post(url, BROWSER)


def test_a_plain_view_answers_a_browser_with_a_page_and_an_api_client_with_json() -> None:
    client = Client()
    client.get("/page/")

    html = client.get("/page/", HTTP_ACCEPT=BROWSER)
    json = client.get("/page/", HTTP_ACCEPT="application/json, text/html;q=0.5")

    assert html.status_code == json.status_code == 429
    assert "Too many requests" in html.content.decode()
    assert json.json()["limit"] == "1/h"
    assert "Accept" in html["Vary"]
    assert "Accept" in json["Vary"]


def test_the_projects_denied_response_still_wins_for_a_browser(settings: Any) -> None:
    settings.DJANGO_THROTTLE_DENIED_RESPONSE = "tests.denied_responses.plain_text"
    client = Client()
    client.get("/page/")

    response = client.get("/page/", HTTP_ACCEPT=BROWSER)

    assert response.content.decode() == "slow down (1/h) on /page/"
    assert response["Retry-After"] == "3600"


def test_a_project_overrides_the_page(settings: Any, tmp_path: Any) -> None:
    (tmp_path / "django_throttle").mkdir()
    (tmp_path / "django_throttle" / "throttled.html").write_text("{{ status }} in {{ wait }}")
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [str(tmp_path)]}]
    client = Client()
    client.get("/page/")

    assert client.get("/page/", HTTP_ACCEPT=BROWSER).content.decode() == "429 in 60 minutes"


def test_a_broken_page_falls_back_to_json(settings: Any, tmp_path: Any, caplog: Any) -> None:
    (tmp_path / "django_throttle").mkdir()
    (tmp_path / "django_throttle" / "throttled.html").write_text("{% if %}")
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [str(tmp_path)]}]
    client = Client()
    client.get("/page/")

    response = client.get("/page/", HTTP_ACCEPT=BROWSER)

    assert response.status_code == 429
    assert response.json()["retry_after"] == 3600
    assert "throttled.html failed" in caplog.text


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (1, "1 second"),
        (59, "59 seconds"),
        (60, "1 minute"),
        (61, "2 minutes"),
        (3600, "60 minutes"),
        (3601, "2 hours"),
        (86400, "24 hours"),
        (86401, "2 days"),
    ],
)
def test_a_wait_in_words_is_never_shorter_than_the_wait(seconds: int, words: str) -> None:
    assert human_wait(seconds) == words


@pytest.mark.parametrize(
    ("language", "words"),
    [("de", "Versuchen Sie es in 60 Minuten erneut."), ("fr", "Réessayez dans 60 minutes.")],
)
def test_the_page_speaks_the_browsers_language(settings: Any, language: str, words: str) -> None:
    middleware = list(settings.MIDDLEWARE)
    middleware.insert(
        middleware.index("django.middleware.common.CommonMiddleware"),
        "django.middleware.locale.LocaleMiddleware",
    )
    settings.MIDDLEWARE = middleware
    settings.LANGUAGES = [("en", "English"), ("de", "Deutsch"), ("fr", "Français")]
    client = Client(headers={"Accept": BROWSER, "Accept-Language": language})
    client.get("/page/")

    html = client.get("/page/").content.decode()

    assert words in html
    assert f'<html lang="{language}">' in html


def test_an_operator_signs_in_and_sees_the_dashboard_while_redis_is_down(settings: Any) -> None:
    """Issue 30 item 4, end to end: with Redis down and no failure mode chosen anywhere, the
    admin login is counted in the process (a flood of wrong passwords still meets its 5 per
    minute) and the operator's right password signs in; the dashboard that says Redis is
    down opens. It answered every browser with 503 and a raw JSON body."""
    from django.contrib.auth.models import User

    settings.DJANGO_THROTTLE_REDIS_URL = DOWN
    admin_login_rule(rate="5/min")
    User.objects.create_superuser("root", "root@example.com", "right")
    operator = Client()
    response = operator.post(
        "/admin/login/?next=/admin/",
        {"username": "root", "password": "right"},
        headers={"Accept": BROWSER},
    )
    assert response.status_code == 302, response.content[:300]
    assert response["X-RateLimit-Degraded"] == "local"
    dashboard = operator.get("/admin/django_throttle/usagecount/dashboard/")
    assert dashboard.status_code == 200
    assert "Connection refused" in dashboard.content.decode()  # the backend's health, said
    attacker = Client()
    statuses = [
        attacker.post("/admin/login/", {"username": "root", "password": f"guess{n}"}).status_code
        for n in range(8)
    ]
    assert statuses.count(429) >= 3, statuses  # 5 a minute, the operator's sign-in included


def test_explain_shows_the_admin_login_counting_locally_in_an_outage(settings: Any) -> None:
    """The operator tools say what the admin's login meets while Redis is down: ``local``,
    even under a rule set to ``closed`` (which a guarded login of the site's own meets)."""
    import json
    from io import StringIO

    from django.core.management import CommandError, call_command

    settings.DJANGO_THROTTLE_REDIS_URL = DOWN
    admin_login_rule(failure_mode="closed")

    def explained(path: str) -> Any:
        out = StringIO()
        with pytest.raises(CommandError, match="could not be read"):  # written, then said
            call_command(
                "throttle_explain",
                *("--ip", "203.0.113.9", "--method", "POST", "--path", path, "--format", "json"),
                stdout=out,
            )
        return json.loads(out.getvalue())["failure_mode"]

    assert explained("/admin/login/") == "local"
    assert explained("/accounts/login/") == "closed"
