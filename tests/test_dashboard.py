"""The admin dashboard, through the test client: who may see it, and that its charts, totals
and tables show the requests a test made (on Redis and in memory)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User

from django_throttle.admin.views import stacked_bars
from django_throttle.backends import get_backend
from django_throttle.backends.redis_nodes import get_breaker, reset_breaker
from django_throttle.models import UsageCount
from django_throttle.usage import accounting
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db

URL = "/admin/django_throttle/usagecount/dashboard/"


def traffic(client: Any) -> None:
    """5 allowed and 3 denied on /api/ping/ for the anonymous tier."""
    anon = tier("anonymous", "1000/h", is_default_anonymous=True)
    endpoint("ping", "route", "ping", limits={anon: "5/h"})
    statuses = [client.get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code for _ in range(8)]
    assert statuses == [200] * 5 + [429] * 3


def staff(*permissions: str) -> User:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def totals(html: str) -> dict[str, int]:
    return {m[0]: int(m[1]) for m in re.findall(r'data-outcome="(\w+)">(\d+)</strong>', html)}


def test_the_dashboard_shows_the_requests_counted(client: Any, backend: Any) -> None:
    traffic(client)
    client.force_login(staff("view_usagecount"))

    response = client.get(URL)

    assert response.status_code == 200
    html = response.content.decode()
    assert totals(html) == {"allowed": 5, "denied": 3, "shadow_denied": 0}
    # One chart for everything, one per tier and one per endpoint, all with the same totals.
    charts = re.findall(
        r'<svg class="dt-chart"[^>]*data-title="([^"]*)" data-allowed="(\d+)" '
        r'data-denied="(\d+)"',
        html,
    )
    assert ("anonymous", "5", "3") in charts
    assert ("ping", "5", "3") in charts
    assert "ip:203.0.113.9" in html  # the most limited client
    assert 'id="dt-reachable"' in html


def test_the_day_window_has_quarter_hour_bars(client: Any, backend: Any) -> None:
    traffic(client)
    client.force_login(staff("view_usagecount"))

    html = client.get(URL + "?window=day").content.decode()

    assert totals(html) == {"allowed": 5, "denied": 3, "shadow_denied": 0}
    overall = html.split('id="overall"', 1)[1].split("</svg>", 1)[0]
    assert overall.count('class="dt-hit"') in (96, 97)


def test_without_the_view_permission_the_dashboard_is_forbidden(client: Any) -> None:
    client.force_login(staff())
    assert client.get(URL).status_code == 403


def test_anonymous_visitors_are_sent_to_the_login_page(client: Any) -> None:
    response = client.get(URL)
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_the_usage_list_links_to_the_dashboard(client: Any) -> None:
    client.force_login(staff("view_usagecount"))
    html = client.get("/admin/django_throttle/usagecount/").content.decode()
    assert URL in html


def test_a_dead_backend_shows_in_health_not_as_an_error(client: Any, settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    client.force_login(staff("view_usagecount"))

    response = client.get(URL)

    assert response.status_code == 200
    html = response.content.decode()
    assert "counts are partial" in html
    assert re.search(r'id="dt-reachable">\s*no', html)


def test_the_last_backend_error_is_shown(client: Any, settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    settings.DJANGO_THROTTLE_FAILURE_MODE = "open"
    tier("anonymous", "5/h", is_default_anonymous=True)
    assert client.get("/api/ping/").status_code == 200  # failed open
    assert get_breaker().last_error
    client.force_login(staff("view_usagecount"))

    html = client.get(URL).content.decode()

    assert "ConnectionError" in html or "Error" in html.split('id="health"', 1)[1]


def test_charts_stay_small_and_escape_names() -> None:
    from datetime import UTC, datetime, timedelta

    start = datetime(2026, 1, 1, tzinfo=UTC)
    starts = [start + timedelta(minutes=i) for i in range(60)]
    svg = stacked_bars("<script>", starts, {"allowed": [1000] * 60, "denied": [7] * 60})
    assert "<script>" not in svg
    assert 'data-allowed="60000"' in svg
    assert len(svg) < 40_000


INSPECT = "/admin/django_throttle/usagecount/inspect/"
RESET = "/admin/django_throttle/usagecount/inspect/reset/"


def test_the_inspector_shows_tier_reason_and_buckets(client: Any, backend: Any) -> None:
    traffic(client)
    client.force_login(staff("view_usagecount"))

    html = client.get(INSPECT, {"client": "203.0.113.9"}).content.decode()

    assert "the default tier for anonymous clients" in html
    remaining = dict(re.findall(r'data-limit="(\w+)" data-remaining="(\d+)"', html))
    assert sorted(remaining.values()) == ["0", "995"]  # the endpoint's 5/h, the tier's 1000/h
    assert 'id="dt-reset"' not in html  # no permission to reset


def test_the_inspector_explains_a_request(client: Any, backend: Any) -> None:
    traffic(client)
    client.force_login(staff("view_usagecount"))

    html = client.get(
        INSPECT, {"client": "203.0.113.9", "method": "GET", "path": "/api/ping/"}
    ).content.decode()

    assert re.search(r'id="dt-rule">\s*ping', html)
    assert 'id="dt-verdict"' in html


def test_the_inspector_names_an_unknown_client(client: Any, backend: Any) -> None:
    client.force_login(staff("view_usagecount"))
    html = client.get(INSPECT, {"client": "nobody"}).content.decode()
    assert "Unknown client: no user with the username or id &#x27;nobody&#x27;" in html


def test_the_reset_page_without_a_client_asks_for_one(client: Any, backend: Any) -> None:
    """Opened with no client (a bookmark, a hand-typed URL), the reset page says none was
    named, not that a user with an empty name does not exist."""
    client.force_login(staff("view_usagecount", "change_tier"))
    for query in ({}, {"client": ""}, {"client": "  "}):
        html = client.get(RESET, query, follow=True).content.decode()
        assert "Unknown client: none was named (a username, an IP address or an API key)." in html
        assert "username or id" not in html


def test_the_inspector_names_the_address_field_for_a_malformed_address(
    client: Any, backend: Any
) -> None:
    """A known client from an address that is no IP address: the error names the "From
    address" field, not the client, on the inspector and on the reset page it links to."""
    import html as html_module

    traffic(client)
    client.force_login(staff("view_usagecount", "change_tier"))
    error = re.compile(r'<p class="errornote" id="dt-error">([^<]*)</p>')
    expected = "From address: 'not-an-ip' is not an IP address."
    for query in (
        {"client": "203.0.113.9", "ip": "not-an-ip"},
        {"client": "203.0.113.9", "ip": "not-an-ip", "path": "/api/ping/"},
        {"client": "username:alice", "ip": "not-an-ip"},
    ):
        page = client.get(INSPECT, query)
        found = error.search(page.content.decode())
        assert page.status_code == 200 and found is not None, query
        assert html_module.unescape(found[1]) == expected, query
    page = client.get(RESET, {"client": "203.0.113.9", "ip": "not-an-ip"}, follow=True)
    shown = [str(message) for message in page.context["messages"]]
    assert [text for text in shown if "IP address" in text] == [expected]


def test_reset_asks_first_then_clears_and_is_recorded(backend: Any) -> None:
    from django.contrib.admin.models import LogEntry
    from django.test import Client

    api = Client()  # anonymous, counted by address
    traffic(api)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(staff("view_usagecount", "change_tier"))
    assert api.get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code == 429

    confirm = browser.get(RESET, {"client": "203.0.113.9"})
    assert confirm.status_code == 200
    assert "Clear every rate limit bucket of IP 203.0.113.9?" in confirm.content.decode()
    assert api.get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code == 429  # not yet

    assert browser.post(RESET, {"client": "203.0.113.9"}).status_code == 403  # no CSRF token
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', confirm.content.decode())[1]
    done = browser.post(RESET, {"client": "203.0.113.9", "csrfmiddlewaretoken": token})

    assert done.status_code == 302
    assert api.get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code == 200
    entry = LogEntry.objects.get()
    assert entry.object_repr == "IP 203.0.113.9"
    assert entry.change_message.startswith("Reset the rate limit buckets of ip:203.0.113.9")


def test_reset_needs_the_change_tier_permission(client: Any, backend: Any) -> None:
    client.force_login(staff("view_usagecount"))
    assert client.get(RESET, {"client": "203.0.113.9"}).status_code == 403
    assert client.post(RESET, {"client": "203.0.113.9"}).status_code == 403


def test_the_dashboard_stays_readable_at_a_thousand_clients(client: Any, settings: Any) -> None:
    from django_throttle.rates import Limit
    from django_throttle.usage import accounting as usage

    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    backend = get_backend()
    deny = (Limit.build("flood", "1/h"),)
    for n in range(1000):
        field = usage.field_for(f"tier{n % 30}", f"endpoint{n % 40}")
        for _ in range(2):
            backend.hit(f"ip:10.0.{n // 256}.{n % 256}", deny, usage=field)
    client.force_login(staff("view_usagecount"))

    html = client.get(URL).content.decode()

    assert totals(html) == {"allowed": 1000, "denied": 1000, "shadow_denied": 0}
    assert html.count('<tr class="dt-client"') == 20
    assert "(other): 19 more" in html  # 30 tiers: 11 charts, the rest in one
    assert "(other): 29 more" in html  # 40 endpoints
    assert len(html) < 400_000


def test_the_api_key_action_asks_then_resets_and_is_recorded(
    admin_client: Any, backend: Any
) -> None:
    from django.contrib.admin.models import LogEntry
    from django.test import Client

    from django_throttle.models import ApiKey

    partner = tier("partner", "2/h")
    row, key = ApiKey.objects.create_key(name="ci", tier=partner)
    api = Client()
    statuses = [api.get("/api/ping/", HTTP_X_API_KEY=key).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    url = "/admin/django_throttle/apikey/"
    form = {"action": "reset_buckets", "_selected_action": [row.pk]}

    confirm = admin_client.post(url, form)

    assert confirm.status_code == 200
    assert "Clear every rate limit bucket of these API keys?" in confirm.content.decode()
    assert api.get("/api/ping/", HTTP_X_API_KEY=key).status_code == 429

    done = admin_client.post(url, {**form, "post": "yes"})

    assert done.status_code == 302
    assert api.get("/api/ping/", HTTP_X_API_KEY=key).status_code == 200
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert entry.change_message.startswith(f"Reset the rate limit buckets of key:{row.prefix}")


# --- an operator's dashboard during an outage -------------------------------------------------


def rolled_up(tier_name: str, allowed: int, denied: int, minutes_ago: int = 5) -> None:
    """A total row the rollup copied to the database: a finished minute of the last hour."""
    start = datetime.now(tz=UTC).replace(second=0, microsecond=0)
    UsageCount.objects.create(
        window_start=start - timedelta(minutes=minutes_ago),
        client="*",
        tier=tier_name,
        endpoint="",
        allowed=allowed,
        denied=denied,
    )


def test_a_hung_redis_costs_the_dashboard_its_short_timeouts_not_its_report_timeouts(
    client: Any, hung_redis: str
) -> None:
    """A Redis that accepts connections and answers nothing (SIGSTOP) once held the page for
    four report timeouts (40 s, past a gunicorn worker's 30 s), while an operator most needs
    it: the first unanswered call ends the page's reads."""
    client.force_login(staff("view_usagecount"))

    started = time.monotonic()
    response = client.get(URL)
    elapsed = time.monotonic() - started

    assert response.status_code == 200
    html = response.content.decode()
    assert "counts are partial" in html
    assert re.search(r'id="dt-reachable">\s*no', html)
    assert elapsed < 5, f"{elapsed:.1f} s"


def test_minutes_in_the_database_are_shown_when_redis_lost_the_watermark(
    client: Any, settings: Any, redis_url: str
) -> None:
    """After a Redis restart (the rollup's watermark gone) the minutes already copied to the
    database are still counted, as ``throttle_usage`` counts them: they were left out, and
    the page said 0 requests for an hour of traffic."""
    settings.DJANGO_THROTTLE_REDIS_URL = redis_url
    rolled_up("anonymous", allowed=10, denied=3)
    client.force_login(staff("view_usagecount"))

    html = client.get(URL).content.decode()

    assert totals(html) == {"allowed": 10, "denied": 3, "shadow_denied": 0}
    assert "counts are partial" not in html


def test_with_redis_down_the_dashboard_says_what_it_could_not_read(
    client: Any, settings: Any
) -> None:
    """Down, the page shows the minutes the database holds, marked as a lower bound, and
    never claims that nothing was counted or that no client was limited."""
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    rolled_up("anonymous", allowed=10, denied=3)
    client.force_login(staff("view_usagecount"))

    html = client.get(URL).content.decode()

    assert "counts are partial" in html
    assert totals(html) == {"allowed": 10, "denied": 3, "shadow_denied": 0}
    assert html.count('class="dt-at-least"') == 3  # each total marked "at least"
    assert "No requests counted in this window." not in html
    assert "No client was limited in this window." not in html
    limited = html.split('id="limited"', 1)[1]
    assert "The backend could not be read" in limited


def test_requests_served_uncounted_during_an_outage_are_on_the_dashboard(
    client: Any, settings: Any, hung_redis: str, _pausable_redis: Any
) -> None:
    """An hour in which Redis hung for a while: the requests served uncounted then (failed
    open) were missing from the page, which showed only the counted ones."""
    settings.DJANGO_THROTTLE_FAILURE_MODE = "open"
    tier("anonymous", "1000/h", is_default_anonymous=True)
    statuses = [client.get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code for _ in range(3)]
    assert statuses == [200] * 3
    _pausable_redis.resume()
    reset_breaker()  # its cooldown passed
    accounting.flush_pending()  # what the process's pusher does within a second
    client.force_login(staff("view_usagecount"))

    html = client.get(URL).content.decode()

    assert totals(html) == {"allowed": 0, "denied": 0, "shadow_denied": 0, "failed_open": 3}
    assert "served uncounted" in html.split('id="overall"', 1)[1].split("</p>", 1)[0]


def test_with_redis_down_the_most_limited_are_the_databases_clients_at_least(
    client: Any, settings: Any
) -> None:
    """Down, the most limited list was only the error although the database held the
    clients a rollup copied: they are listed, each count marked a lower bound."""
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    start = datetime.now(tz=UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    UsageCount.objects.create(
        window_start=start, client="ip:203.0.113.9", tier="*", endpoint="*", allowed=2, denied=7
    )
    client.force_login(staff("view_usagecount"))

    limited = client.get(URL).content.decode().split('id="limited"', 1)[1]

    assert 'data-client="ip:203.0.113.9"' in limited
    assert re.search(r'<span class="dt-at-least">≥</span>7\b', limited)
    assert "The backend could not be read" in limited and "≥: at least" in limited


def test_with_redis_down_the_inspector_shows_tier_reason_and_limits_not_zeros(
    client: Any, settings: Any
) -> None:
    """Down, the inspector showed only the error, although the tier, why and the limits
    need no Redis: they are shown, each live counter "unavailable", never a zero."""
    from django_throttle.models import TierAssignment

    pro = tier("pro", "1000/h")
    alice = User.objects.create_user("alice")
    TierAssignment.objects.create(user=alice, tier=pro)
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    client.force_login(staff("view_usagecount"))

    html = client.get(INSPECT, {"client": "alice"}).content.decode()

    assert 'id="dt-error"' not in html
    assert re.search(r'id="dt-tier">.*<strong>pro</strong> — assigned to &#x27;pro&#x27;', html)
    assert re.search(r'data-limit="\w+" data-unread="yes"', html)
    assert "data-remaining" not in html
    assert html.count('<td class="dt-unavailable">unavailable</td>') == 2
    assert "The live counters could not be read (ConnectionError: " in html


def test_with_redis_down_the_inspector_explains_a_request_by_its_failure_mode(
    client: Any, settings: Any
) -> None:
    """Down, the inspector's "explain a request" showed only the error, although the
    checks, rule, tier, cost and limits need no Redis: they are shown, each live counter
    "unavailable" (never a zero), and the next request's fate is the failure mode it meets
    (here the tier's) and what it means."""
    from django_throttle.models import TierAssignment

    pro = tier("pro", "1000/h", failure_mode="closed")
    endpoint("ping", "route", "ping", limits={pro: "5/h"})
    alice = User.objects.create_user("alice")
    TierAssignment.objects.create(user=alice, tier=pro)
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    client.force_login(staff("view_usagecount"))

    html = client.get(INSPECT, {"client": "alice", "path": "/api/ping/"}).content.decode()

    assert 'id="dt-error"' not in html
    explained = html[html.index('id="dt-explanation"') :]
    assert re.search(r'id="dt-rule">\s*ping', explained)
    assert re.search(r'id="dt-checks">PolicyThrottle', explained)
    assert re.search(
        r'id="dt-failure-mode" data-mode="closed">its failure mode, as Redis cannot answer '
        r"— closed: refused 503<",
        explained,
    )
    assert "The live counters could not be read (ConnectionError: " in explained
    assert "data-remaining" not in explained
    assert explained.count('<td class="dt-unavailable">unavailable</td>') == 4  # 2 limits
