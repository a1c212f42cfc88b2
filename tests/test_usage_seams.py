"""The usage figures operators see are what happened: requests through the real request path
(test client, real middleware, DRF), then every view of them (``throttle_usage`` table, CSV,
JSON, the rollup's rows, the admin dashboard).

- a request checked before authentication and again by its tier counts once, under its tier;
  the checks before authentication are a series of their own;
- sampled per-client figures are marked as estimates everywhere;
- attacker-chosen usernames (markup, hyperlinks, ESC, CR/LF, unicode, 300 characters) are
  plain text in every cell and escaped in log lines;
- a username presented at a failed login is shown only when it names a user, else as a digest;
- clients are named (``alice (user:2)``) and linked; "nothing" has one name everywhere.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
import re
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_throttle.credentials import protect_credentials
from django_throttle.drf import ProtectedBasicAuthentication
from django_throttle.identity import Identity
from django_throttle.models import EndpointLimit, EndpointRule, Tier, TierLimit, UsageCount
from django_throttle.policy.live import resolve_identity
from django_throttle.redaction import log_text, plain_text
from tests.test_usage import run
from tests.views import Ping, hello

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.test_usage_seams")]

DASHBOARD = "/admin/django_throttle/usagecount/dashboard/"
INSPECTOR = "/admin/django_throttle/usagecount/inspect/"
#: Usernames an attacker (or a careless user) chooses.
ODD = [
    "é" * 150,  # the longest username Django (and PostgreSQL's column) takes
    "Zoë 東京 🚀",
    "[/x]",
    "[link=https://x]click[/link]",
    "\x1b[31mred\x1b[0m\x1b]8;;https://x\x1b\\",
    "a\r\nb",
    "rtl\u202eevil",
    '=HYPERLINK("https://x")',
]
#: ``alice`` and three names that look like it where an invisible character is not written
#: out: a zero-width space, a soft hyphen, a Hangul filler (one NFKC keeps: Django's
#: ``create_user`` normalizes usernames so).
LOOKALIKES = ["alice", "ali\u200bce", "alice\u00ad", "\u115falice"]
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]")


class Basic(APIView):
    authentication_classes = [ProtectedBasicAuthentication]
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        return Response({"user": str(request.user)})


class FormLogin(LoginView):
    """Django's LoginView, answering without a template: a bad password re-renders (200)."""

    def render_to_response(self, context: dict[str, Any], **kwargs: Any) -> HttpResponse:
        return HttpResponse("login form")


def by_username(request: HttpRequest) -> Identity:
    """A custom resolver (a supported setting) that counts signed-in users by username."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return Identity("name", user.get_username())
    return resolve_identity(request)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/basic/", Basic.as_view(), name="basic"),
    path("api/ping/", Ping.as_view(), name="ping"),
    path("hello/", hello, name="hello"),
    path("login/", protect_credentials(FormLogin.as_view())),
]


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest, settings: Any) -> str:
    if request.param == "memory":
        settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    return str(request.param)


@pytest.fixture
def tiers() -> tuple[Tier, Tier]:
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    members = Tier.objects.create(slug="members", name="Members", is_default_authenticated=True)
    for tier in (anonymous, members):
        TierLimit.objects.create(tier=tier, rate="1000/min")
    return anonymous, members


def credential_rule(tier: Tier, scope: str) -> None:
    """Counted by IP address and by username, failures only (the README's login rule)."""
    rule = EndpointRule.objects.create(name=scope, pattern=scope, counts="failures")
    for counted_by, rate in (("ip", "100/min"), ("username", "100/h")):
        EndpointLimit.objects.create(rule=rule, tier=tier, rate=rate, counted_by=counted_by)


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def operator(client: Any) -> None:
    client.force_login(User.objects.create_superuser("operator", password="pw"))


def dashboard(client: Any) -> str:
    response = client.get(DASHBOARD)
    assert response.status_code == 200
    return str(response.content.decode())


def charts(html: str, section: str) -> dict[str, tuple[int, int]]:
    """{chart title: (allowed, denied)} of one dashboard section."""
    part = html.split(f'id="{section}"', 1)[1].split("</section>", 1)[0]
    found = re.findall(
        r'<svg class="dt-chart"[^>]*data-title="([^"]*)" data-allowed="(\d+)" '
        r'data-denied="(\d+)"',
        part,
    )
    return {title: (int(a), int(d)) for title, a, d in found}


def overall(html: str) -> dict[str, int]:
    return {m[0]: int(m[1]) for m in re.findall(r'data-outcome="(\w+)">(\d+)</strong>', html)}


def report(what: str, *args: str) -> list[dict[str, Any]]:
    return list(json.loads(run("--by", what, "--format", "json", "--top", "1000", *args)))


# 12. Each request is counted once, under the tier that served it


def test_a_basic_auth_request_counts_once_under_the_users_tier(
    client: Any, backend: str, tiers: tuple[Tier, Tier]
) -> None:
    anonymous, _members = tiers
    credential_rule(anonymous, "authentication")
    User.objects.create_user("alice", password="pw")
    auth = basic("alice", "pw")
    assert [client.get("/api/basic/", HTTP_AUTHORIZATION=auth).status_code for _ in range(5)] == [
        200
    ] * 5

    by_tier = {row["tier"]: row for row in report("tier")}
    assert set(by_tier) == {"members", "(before authentication)"}  # never "anonymous"
    assert by_tier["members"]["allowed"] == 5
    assert by_tier["members"]["before_authentication"] is False
    assert by_tier["(before authentication)"]["allowed"] == 5
    assert by_tier["(before authentication)"]["before_authentication"] is True
    by_endpoint = {
        (row["endpoint"], row["before_authentication"]): row["total"] for row in report("endpoint")
    }
    assert by_endpoint == {("(no endpoint rule)", False): 5, ("authentication", True): 5}
    assert "│ authentication (before " in run("--by", "endpoint")

    operator(client)
    html = dashboard(client)
    assert overall(html) == {"allowed": 5, "denied": 0, "shadow_denied": 0}
    assert charts(html, "by-tier") == {"members": (5, 0)}
    assert charts(html, "before-authentication") == {"authentication": (5, 0)}


def test_a_refused_login_counts_as_a_check_before_authentication(
    client: Any, backend: str, tiers: tuple[Tier, Tier]
) -> None:
    anonymous, _ = tiers
    rule = EndpointRule.objects.create(name="login", pattern="login", counts="failures")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="2/h", counted_by="username")
    User.objects.create_user("bob", password="right")
    statuses = [
        client.post("/login/", {"username": "bob", "password": "wrong"}).status_code
        for _ in range(3)
    ]
    assert statuses == [200, 200, 429]

    (row,) = report("endpoint")
    assert (row["endpoint"], row["before_authentication"]) == ("login", True)
    assert (row["allowed"], row["denied"]) == (2, 1)
    (row,) = report("tier")
    assert (row["tier"], row["total"]) == ("(before authentication)", 3)
    operator(client)
    html = dashboard(client)
    assert charts(html, "before-authentication") == {"login": (2, 1)}
    assert charts(html, "by-tier") == {}  # no tier served these requests


# 13. Sampled per-client figures are estimates, and say so


def traffic(client: Any, tiers: tuple[Tier, Tier]) -> None:
    """2 allowed and 3 denied for one anonymous client on /api/ping/."""
    anonymous, _ = tiers
    rule = EndpointRule.objects.create(name="ping", match_type="route", pattern="ping")
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="2/h")
    statuses = [client.get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code for _ in range(5)]
    assert statuses == [200, 200, 429, 429, 429]


def test_exact_per_client_figures_carry_no_mark(
    client: Any, backend: str, tiers: tuple[Tier, Tier]
) -> None:
    traffic(client, tiers)  # the test settings count every request (sample 1)

    (row,) = report("client")
    assert (row["allowed"], row["denied"], row["estimated"]) == (2, 3, [])
    assert "≈" not in run()
    operator(client)
    assert "≈" not in dashboard(client)


# 14, 17, 19. Odd usernames are plain text; clients are named; presented usernames stay private


def test_odd_usernames_are_plain_text_in_every_view(
    client: Any, backend: str, tiers: tuple[Tier, Tier]
) -> None:
    anonymous, members = tiers
    rule = EndpointRule.objects.create(name="ping", match_type="route", pattern="ping")
    EndpointLimit.objects.create(rule=rule, tier=members, rate="1/h")
    credential_rule(anonymous, "login")
    users = [User.objects.create_user(name, password="pw") for name in ODD]
    for user in users:  # signed in: counted as user:<pk>, shown by username
        client.force_login(user)
        assert [client.get("/api/ping/").status_code for _ in range(2)] == [200, 429]
        client.logout()
    # Failed logins: a username that names a user, and a password typed as a username.
    for typed in ("[/x]", "[link=https://x]click[/link]", "hunter2", "Zoë 東京 🚀"):
        assert client.post("/login/", {"username": typed, "password": "no"}).status_code == 200

    table = run("--top", "1000")  # rich would raise MarkupError on "[/x]"
    assert not CONTROL.search(table)
    assert "[/x]" in table and "[link=https://x]click[/link]" in table
    assert "hunter2" not in table and "username:#" in table
    rows = {row["client"]: row for row in report("client")}
    for user in users:
        assert rows[f"user:{user.pk}"]["name"] == plain_text(user.username)
        assert rows[f"user:{user.pk}"]["denied"] == 1
    assert rows["username:[/x]"]["name"] == "[/x]"  # names an existing user: shown
    assert not any("hunter2" in label for label in rows)
    text = run("--format", "csv", "--top", "1000")
    assert not CONTROL.search(text.replace("\n", ""))
    names = {line["name"] for line in csv.DictReader(io.StringIO(text))}
    assert '\'=HYPERLINK("https://x")' in names  # never run as a spreadsheet formula
    assert "hunter2" not in text and "hunter2" not in run("--format", "json")

    operator(client)
    html = dashboard(client)
    limited = html.split('id="limited"', 1)[1].split("</section>", 1)[0]
    assert not CONTROL.search(limited.replace("\n", ""))
    for user in users[1:]:
        assert f'href="/admin/auth/user/{user.pk}/change/"' in limited
    assert "hunter2" not in html
    assert "[/x]" in limited


def test_names_that_differ_by_a_character_that_shows_nothing_never_look_alike(
    client: Any, backend: str, tiers: tuple[Tier, Tier]
) -> None:
    """``alice`` and ``ali<zero-width space>ce`` are two accounts: the usage table, its CSV and
    the dashboard show the second with the invisible character written out, never as a
    second ``alice`` (it was shown as typed: two rows reading ``alice``)."""
    _, members = tiers
    rule = EndpointRule.objects.create(name="ping", match_type="route", pattern="ping")
    EndpointLimit.objects.create(rule=rule, tier=members, rate="1/h")
    users = [User.objects.create_user(name, password="pw") for name in LOOKALIKES]
    for user in users:
        client.force_login(user)
        assert [client.get("/api/ping/").status_code for _ in range(2)] == [200, 429]
        client.logout()

    names = {row["name"] for row in report("client")}
    assert {"alice", "ali\\u200bce", "alice\\xad", "\\u115falice"} <= names
    table = run("--top", "1000")
    csv_text = run("--format", "csv", "--top", "1000")
    operator(client)
    limited = dashboard(client).split('id="limited"', 1)[1].split("</section>", 1)[0]
    for shown in (table, csv_text, limited):
        assert "ali\\u200bce" in shown and "alice\\xad" in shown and "\\u115falice" in shown
        assert not any(char in shown for char in "\u200b\u00ad\u115f")
    inspected = client.get(INSPECTOR, {"client": f"user:{users[1].pk}"})
    assert inspected.status_code == 200
    assert "user ali\\u200bce" in inspected.content.decode()
    assert "\u200b" not in inspected.content.decode()


def test_the_rollup_stores_presented_usernames_only_when_they_name_a_user(backend: str) -> None:
    from django_throttle.backends import get_backend
    from tests.test_usage import send
    from tests.test_usage_report import minutes_ago

    User.objects.create_user("Alice", password="pw")
    store = get_backend()
    for label in ("username:alice", "username:hunter2", "username:[/x]"):
        send(store, label, "(before authentication)", "login", denied=2, at=minutes_ago(3))

    assert run("--rollup").startswith("Rolled up ")

    stored = set(UsageCount.objects.exclude(client="*").values_list("client", flat=True))
    assert "username:alice" in stored  # names a user: kept, and shown as that user
    digests = {label for label in stored if label.startswith("username:#")}
    assert len(digests) == 2  # "hunter2" and "[/x]": distinct, unreadable
    assert not any("hunter2" in label or "[/x]" in label for label in stored)
    rows = {row["client"]: row for row in report("client", "--since", "1h")}
    assert set(rows) == stored
    assert rows["username:alice"]["name"] == "Alice"


def test_client_labels_in_log_lines_are_escaped(
    client: Any, backend: str, tiers: tuple[Tier, Tier], settings: Any, caplog: Any
) -> None:
    settings.DJANGO_THROTTLE_IDENTITY_RESOLVER = "tests.test_usage_seams.by_username"
    rule = EndpointRule.objects.create(name="ping", match_type="route", pattern="ping", shadow=True)
    for tier in tiers:
        EndpointLimit.objects.create(rule=rule, tier=tier, rate="1/h")
    client.force_login(User.objects.create_user("a\r\nINFO forged line\x1b[2J", password="pw"))

    with caplog.at_level(logging.INFO, logger="django_throttle"):
        assert [client.get("/api/ping/").status_code for _ in range(2)] == [200, 200]

    (line,) = [r.getMessage() for r in caplog.records if "would deny" in r.getMessage()]
    assert "\r" not in line and "\n" not in line and "\x1b" not in line
    assert line.endswith("name:a\\r\\nINFO forged line\\x1b[2J")


def test_nothing_has_one_name_in_every_view(client: Any, backend: str) -> None:
    # An inline @throttle rate: no tier, no endpoint rule.
    assert client.get("/hello/").status_code == 200

    assert [row["tier"] for row in report("tier")] == ["(no tier)"]
    assert [row["endpoint"] for row in report("endpoint")] == ["(no endpoint rule)"]
    (line,) = list(csv.DictReader(io.StringIO(run("--by", "endpoint", "--format", "csv"))))
    assert line["endpoint"] == "(no endpoint rule)"
    assert "(no endpoint rule)" in run("--by", "endpoint")
    operator(client)
    html = dashboard(client)
    assert charts(html, "by-tier") == {"(no tier)": (1, 0)}
    assert charts(html, "by-endpoint") == {"(no endpoint rule)": (1, 0)}


@pytest.mark.parametrize(
    ("value", "shown", "logged"),
    [
        ("alice", "alice", "alice"),
        ("a\r\nb", "a\\r\\nb", "a\\r\\nb"),
        ("\x1b[31mx", "\\x1b[31mx", "\\x1b[31mx"),
        ("back\\slash", "back\\slash", "back\\\\slash"),
        ("rtl\u202eevil", "rtl\\u202eevil", "rtl\\u202eevil"),
        ("Zoë 東京", "Zoë 東京", "Zoë 東京"),
        # Characters that show nothing: a label with one never looks like the one without.
        ("ali\u200bce", "ali\\u200bce", "ali\\u200bce"),
        ("alice\u00ad", "alice\\xad", "alice\\xad"),
        ("\ufeffalice", "\\ufeffalice", "\\ufeffalice"),
        ("ali\u034fce", "ali\\u034fce", "ali\\u034fce"),
        ("\u3164alice", "\\u3164alice", "\\u3164alice"),
        ("alice\U000e0101", "alice\\U000e0101", "alice\\U000e0101"),
    ],
)
def test_plain_and_log_text(value: str, shown: str, logged: str) -> None:
    assert plain_text(value) == shown
    assert log_text(value) == logged


def test_inspect_and_explain_show_an_odd_username_as_plain_text(
    backend: str, tiers: tuple[Tier, Tier]
) -> None:
    from django.core.management import call_command

    user = User.objects.create_user("[/x][link=https://x]\x1b[2J\r\nme", password="pw")
    for command, args in (
        ("throttle_inspect", [f"user:{user.pk}"]),
        ("throttle_explain", ["--client", f"user:{user.pk}", "--path", "/api/ping/"]),
    ):
        out = io.StringIO()
        call_command(command, *args, stdout=out)  # rich raised MarkupError on "[/x]"
        text = out.getvalue()
        assert "[/x][link=https://x]" in text
        assert not CONTROL.search(text.replace("\n", ""))
