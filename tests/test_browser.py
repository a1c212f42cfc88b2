"""The admin's operator pages in a real browser (headless Chromium): log in, open the
dashboard, read the counts the test produced off the rendered charts, in the light and dark
themes, and save screenshots (see tests/browser.py)."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.browser import browser, screenshot  # noqa: F401 - the fixture
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db(transaction=True)


def traffic() -> None:
    """Requests from several clients: 5 allowed + 3 denied for one, 2 allowed for another,
    and a search endpoint in shadow mode."""
    anon = tier("anonymous", "1000/h", is_default_anonymous=True)
    endpoint("ping", "route", "ping", limits={anon: "5/h"})
    client = Client()
    statuses = [client.get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code for _ in range(8)]
    assert statuses == [200] * 5 + [429] * 3
    for _ in range(2):
        assert client.get("/api/ping/", REMOTE_ADDR="198.51.100.4").status_code == 200


def login(page: Any, live_server: Any) -> None:
    User.objects.create_superuser("admin", "admin@example.com", "s3cret-pass")
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "s3cret-pass")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_dashboard_charts_show_the_counts(browser: Any, live_server: Any, scheme: str) -> None:  # noqa: F811
    started = time.monotonic()
    traffic()
    context = browser.new_context(color_scheme=scheme, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    login(page, live_server)

    page.goto(f"{live_server.url}/admin/django_throttle/usagecount/")
    page.click("text=Dashboard")
    page.wait_for_selector("svg.dt-chart")

    totals = {
        el.get_attribute("data-outcome"): int(el.inner_text())
        for el in page.query_selector_all("strong.dt-total")
    }
    assert totals == {"allowed": 7, "denied": 3, "shadow_denied": 0}
    ping = page.query_selector('svg.dt-chart[data-title="ping"]')
    assert ping is not None
    assert (ping.get_attribute("data-allowed"), ping.get_attribute("data-denied")) == ("7", "3")
    # The bars are drawn: a denied bar of visible height in the chart of everything.
    denied = page.query_selector("#overall rect.dt-denied")
    assert denied is not None and denied.bounding_box()["height"] > 1
    assert "ip:203.0.113.9" in page.inner_text("#limited")
    # The chart follows the theme: axis labels take the admin's quiet colour variable.
    axis_colour = page.eval_on_selector("#overall .dt-axis", "e => getComputedStyle(e).fill")
    background = page.eval_on_selector("body", "e => getComputedStyle(e).backgroundColor")
    assert axis_colour != background
    screenshot(page, f"dashboard-{scheme}")

    page.click("#limited a")  # the client's link leads to the inspector
    page.wait_for_selector("#dt-inspection")
    assert "the default tier for anonymous clients" in page.inner_text("#dt-tier")
    remaining = sorted(
        int(row.get_attribute("data-remaining")) for row in page.query_selector_all("tr.dt-bucket")
    )
    # The ping rule's 5/h bucket is empty (a token per 12 min); the tier's 1000/h one had 5
    # taken and gets one back every 3.6 s, as many as the test's own time allows for (a
    # loaded machine logs in slowly).
    refilled = math.floor((time.monotonic() - started) / 3.6)
    assert remaining[0] == 0
    assert 995 <= remaining[1] <= min(1000, 995 + refilled), (remaining, refilled)
    context.close()


def test_inspect_explain_and_reset_a_client(browser: Any, live_server: Any) -> None:  # noqa: F811
    traffic()
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    login(page, live_server)
    page.goto(f"{live_server.url}/admin/django_throttle/usagecount/")
    page.click("text=Inspect a client")

    page.fill("#dt-client", "203.0.113.9")
    page.select_option("#dt-method", "GET")
    page.fill("#dt-path", "/api/ping/")
    page.click("#dt-inspect-form input[type=submit]")
    page.wait_for_selector("#dt-explanation")
    assert page.inner_text("#dt-rule").strip() == "ping"
    assert "denied (429) by ping (anonymous) 5/h" in page.inner_text("#dt-verdict")
    screenshot(page, "inspector")

    page.click("#dt-reset")
    assert "Clear every rate limit bucket of IP 203.0.113.9?" in page.inner_text("#content")
    page.click("#dt-confirm-reset")
    page.wait_for_selector("#dt-inspection")
    assert "Reset 2 bucket(s) of IP 203.0.113.9." in page.inner_text(".messagelist")
    assert Client().get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code == 200
    page.goto(f"{live_server.url}/admin/")
    assert "IP 203.0.113.9" in page.inner_text("#recent-actions-module")
    page.close()


@pytest.mark.slow
def test_the_example_project_dashboard_inspector_explain_and_reset(
    browser: Any,  # noqa: F811
    tmp_path: Any,
    redis_url: str,
) -> None:
    """The same pages in the running demo (``manage.py run_demo``, its own settings, seeded
    policy, admin / admin): 12 requests against the anonymous bucket of 10, then the
    dashboard, the inspector, explain and reset, in Chromium."""
    from tests.test_example_project import run_demo

    with run_demo(tmp_path, redis_url) as demo:
        statuses = [demo.get("/api/ping/")[0] for _ in range(12)]
        assert statuses.count(200) >= 10 and statuses[-1] == 429
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{demo.base}/admin/login/?next=/admin/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", "admin")
        page.click("input[type=submit]")
        page.wait_for_url(f"{demo.base}/admin/")

        page.goto(f"{demo.base}/admin/django_throttle/usagecount/dashboard/")
        totals = {
            el.get_attribute("data-outcome"): int(el.inner_text())
            for el in page.query_selector_all("strong.dt-total")
        }
        assert totals["allowed"] >= 10 and totals["denied"] >= 1
        assert page.query_selector('svg.dt-chart[data-title="anonymous"]') is not None
        screenshot(page, "demo-dashboard")

        page.click("#limited a")
        page.wait_for_selector("#dt-inspection")
        page.fill("#dt-path", "/api/ping/")
        page.click("#dt-inspect-form input[type=submit]")
        page.wait_for_selector("#dt-explanation")
        # The demo's anonymous bucket refills 2 tokens a second: by now it may allow again.
        verdict = page.inner_text("#dt-verdict").strip()
        assert verdict == "allowed" or verdict.startswith("denied (429) by anonymous")
        assert "anonymous 2/s" in page.inner_text("#dt-explanation")
        screenshot(page, "demo-inspector")

        page.click("#dt-reset")
        page.click("#dt-confirm-reset")
        page.wait_for_selector("#dt-inspection")
        assert "Reset" in page.inner_text(".messagelist")
        assert demo.get("/api/ping/")[0] == 200
        page.close()
