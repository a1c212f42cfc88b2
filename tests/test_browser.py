"""The admin's operator pages in a real browser (headless Chromium): log in, open the
dashboard, read the counts the test produced off the rendered charts, in the light and dark
themes, and save screenshots (see tests/browser.py)."""

from __future__ import annotations

import math
import re
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


def test_typing_the_slug_after_the_name_replaces_the_filled_in_slug(
    browser: Any,  # noqa: F811
    live_server: Any,
) -> None:
    """The tier's slug is filled in from its name; an operator who then clicks into the slug
    and types it gets what they typed, not the two run together ("anonymousanonymous"). Once
    they have typed in it, a click places the caret as usual."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    login(page, live_server)
    page.goto(f"{live_server.url}/admin/django_throttle/tier/add/")
    page.click("#id_name")
    page.keyboard.type("Anonymous")
    assert page.input_value("#id_slug") == "anonymous"  # filled in
    page.click("#id_slug")
    page.keyboard.type("anonymous")
    assert page.input_value("#id_slug") == "anonymous"
    page.click("#id_name")
    page.click("#id_slug")
    page.keyboard.press("End")
    page.keyboard.type("-2")
    assert page.input_value("#id_slug") == "anonymous-2"
    page.click("#id_description")
    page.click("#id_slug")
    page.keyboard.type("x")  # the operator's own slug: the caret goes where they click
    assert page.input_value("#id_slug") != "x"
    # A change page's slug is the row's own: never selected for the operator.
    row = tier("anonymous", "10/s")
    page.goto(f"{live_server.url}/admin/django_throttle/tier/{row.pk}/change/")
    page.click("#id_slug")
    page.keyboard.press("End")
    page.keyboard.type("x")
    assert page.input_value("#id_slug") == "anonymousx"
    page.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_dashboard_charts_show_the_counts(browser: Any, live_server: Any, scheme: str) -> None:  # noqa: F811
    started = time.monotonic()
    traffic()
    context = browser.new_context(color_scheme=scheme, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    login(page, live_server)

    page.goto(f"{live_server.url}/admin/django_throttle/usagecount/")
    page.get_by_role("link", name="Dashboard", exact=True).click()
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
    assert "Address 203.0.113.9" in page.inner_text("#limited")  # the client in words
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
    assert "Cleared 2 of the 2 counter(s) of IP 203.0.113.9." in page.inner_text(".messagelist")
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
        # The bucket refilling 2 tokens a second may have emptied (its key expired) by now: the
        # message says which happened.
        message = page.inner_text(".messagelist")
        assert message.startswith(("Cleared", "Nothing to reset for IP")), message
        assert demo.get("/api/ping/")[0] == 200
        page.close()


# Layout: no admin page of the app scrolls sideways at 1,280 x 800 ----------------------------

#: A long unbroken word: a path prefix, a scope or an attacker's username.
LONG = "very-long-segment-" * 5


def policy_with_long_and_realistic_data() -> dict[str, Any]:
    """Every kind of row, each with a realistic value and one as long as its column allows,
    and the usage a busy day leaves; the pks of one row of each kind."""
    from datetime import UTC, datetime, timedelta

    from django.contrib.auth.models import Group

    from django_throttle.models import (
        ApiKey,
        EndpointLimit,
        EndpointRule,
        Exemption,
        Tier,
        TierAssignment,
        TierLimit,
        UsageCount,
    )

    anon = tier("anonymous", "1000/h", is_default_anonymous=True)
    TierLimit.objects.create(tier=anon, rate="100/min", shared=True)
    free = Tier.objects.create(
        slug="free-" + "x" * 40,
        name="Free plan for very small teams with a name that goes on and on " + "x" * 36,
        description="A description of a tier, written the way operators write them. " * 8,
        is_default_authenticated=True,
        failure_mode="closed",
    )
    for rate, algorithm, burst, zone in [
        ("10/s", "token_bucket", 50, ""),
        ("600/min", "gcra", 30, ""),
        ("1000/h", "leaky_bucket", 100, ""),
        ("5000/d", "fixed_window", None, ""),
        ("100/5m", "sliding_window_log", None, ""),
        ("20000/d", "sliding_window_counter", None, ""),
        ("100000/month", "calendar_quota", None, "America/Argentina/ComodRivadavia"),
    ]:
        TierLimit.objects.create(
            tier=free, rate=rate, algorithm=algorithm, burst=burst, timezone=zone
        )
    for i in range(8):
        Tier.objects.create(slug=f"tier-{i}", name=f"Tier {i}", priority=i, failure_mode="local")
    rule = EndpointRule.objects.create(
        name="export " + "x" * 93,
        match_type="path",
        pattern="/api/" + LONG * 2,
        methods="GET,HEAD,POST,PUT,PATCH,DELETE,OPTIONS,TRACE",
        cost=10,
        counts="failures",
        failure_mode="closed",
    )
    for owner in (anon, free):
        for counted_by in ("client", "ip", "username"):
            EndpointLimit.objects.create(
                rule=rule,
                tier=owner,
                rate={"client": "100/month", "ip": "20/min", "username": "10/min"}[counted_by],
                algorithm="calendar_quota" if counted_by == "client" else "sliding_window_log",
                timezone="America/Argentina/ComodRivadavia" if counted_by == "client" else "",
                counted_by=counted_by,
            )
    endpoint("login", "route", "login", limits={anon: "5/min"})
    long_user = User.objects.create_user("u" * 150, "long@example.com")
    group = Group.objects.create(name="g" * 150)
    assignment = TierAssignment.objects.create(user=long_user, tier=free, note="n " * 127)
    TierAssignment.objects.create(group=group, tier=free, note="partners")
    exemption = Exemption.objects.create(
        network="2001:db8:abcd:1234:5678:9abc:def0:1234/128", note="monitoring " * 23
    )
    Exemption.objects.create(user=long_user)
    api_key, _full = ApiKey.objects.create_key(name="k" * 100, tier=free, owner=long_user)
    # Recent: opening the usage list runs the rollup, which deletes rows past their retention.
    minute = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)
    usage = UsageCount.objects.create(
        window_start=minute,
        client="username:" + LONG * 2,
        tier="*",
        endpoint="*",
        allowed=123456789,
        denied=98765,
    )
    UsageCount.objects.create(
        window_start=minute, client="*", tier=free.slug, endpoint=rule.name, allowed=123456789
    )
    UsageCount.objects.create(
        window_start=minute, client="*", tier="(before authentication)", endpoint="login"
    )
    return {
        "tier": free.pk,
        "endpointrule": rule.pk,
        "tierassignment": assignment.pk,
        "exemption": exemption.pk,
        "apikey": api_key.pk,
        "usagecount": usage.pk,
    }


def _admin_pages(pks: dict[str, Any]) -> list[str]:
    base = "/admin/django_throttle"
    pages = [f"{base}/"]
    for model, pk in pks.items():
        pages += [f"{base}/{model}/", f"{base}/{model}/{pk}/change/"]
        if model != "usagecount":
            pages.append(f"{base}/{model}/add/")
    client = "u" * 150
    pages += [
        f"{base}/usagecount/?kind=clients",
        f"{base}/usagecount/dashboard/",
        f"{base}/usagecount/dashboard/?window=day",
        f"{base}/usagecount/inspect/",
        f"{base}/usagecount/inspect/?client={client}",
        f"{base}/usagecount/inspect/?client={client}&method=POST&path=/api/{LONG * 2}",
        f"{base}/usagecount/inspect/?client=203.0.113.9&method=GET&path=/api/ping/",
        f"{base}/usagecount/inspect/reset/?client={client}",
    ]
    return pages


#: What scrolls sideways on the page: the document, or a box of its own that scrolls (the
#: changelist's results table), so that a column is off screen.
SIDEWAYS = """() => {
  const doc = document.scrollingElement;
  const wide = [];
  if (doc.scrollWidth > doc.clientWidth) wide.push(`document ${doc.scrollWidth}px`);
  for (const box of document.querySelectorAll("#changelist .results, .inline-related")) {
    if (box.scrollWidth > box.clientWidth + 1) {
      wide.push(`${box.className} ${box.scrollWidth}px in ${box.clientWidth}px`);
    }
  }
  return wide;
}"""


#: The innermost elements reaching past the window: what to fix, in the failure message.
WIDEST = """() => {
  const limit = document.scrollingElement.clientWidth;
  const out = [];
  const wide = el => el.getBoundingClientRect().left + el.scrollWidth > limit + 1;
  for (const el of document.querySelectorAll("body *")) {
    if (wide(el) && ![...el.children].some(wide)) {
      const right = Math.round(el.getBoundingClientRect().left + el.scrollWidth);
      out.push(`${el.tagName.toLowerCase()}.${el.className}#${el.id} to ${right}px`);
    }
  }
  return out.slice(0, 4);
}"""


@pytest.mark.slow
def test_no_admin_page_scrolls_sideways_at_1280_by_800(
    browser: Any,  # noqa: F811
    live_server: Any,
) -> None:
    """Every page the app adds to the admin (lists, change and add forms, the dashboard, the
    inspector with explain, the reset confirmations) fits a 1,280 x 800 window with long
    names, patterns, usernames and notes: nothing scrolls sideways, no column is off screen."""
    pks = policy_with_long_and_realistic_data()
    traffic_from_a_long_username()
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    login(page, live_server)
    too_wide = {}
    for number, url in enumerate(_admin_pages(pks)):
        response = page.goto(f"{live_server.url}{url}")
        assert response is not None and response.status == 200, url
        wide = page.evaluate(SIDEWAYS)
        if wide:
            too_wide[url] = wide + page.evaluate(WIDEST)
        name = re.sub(r"[^\w-]+", "-", url.removeprefix("/admin/django_throttle").strip("/"))
        screenshot(page, f"layout-{number:02}-{name[:60] or 'index'}")
    # The API key action's confirmation page (a POST from the list).
    page.goto(f"{live_server.url}/admin/django_throttle/apikey/")
    page.check("#action-toggle")
    page.select_option("select[name=action]", "reset_buckets")
    page.click("button[name=index]")
    page.wait_for_selector("#dt-confirm-reset")
    wide = page.evaluate(SIDEWAYS)
    if wide:
        too_wide["apikey reset confirmation"] = wide
    assert too_wide == {}, "\n".join(f"{url}: {wide}" for url, wide in too_wide.items())
    page.close()


def traffic_from_a_long_username() -> None:
    """A signed-in user with a 150-character username, limited on the long endpoint."""
    client = Client()
    client.force_login(User.objects.get(username="u" * 150))
    for _ in range(3):
        client.get("/api/ping/", REMOTE_ADDR="203.0.113.9")


# Layout: no ordinary word breaks inside itself at 1,280 x 800 --------------------------------

#: Words of letters (at most 30 of them) whose characters are laid out on more than one line:
#: "anony mous", "Partn er". Long tokens (paths, 150-character usernames) may wrap anywhere.
SPLIT_WORDS = """() => {
  const split = [];
  const roots = document.querySelectorAll(".breadcrumbs, #content, .messagelist");
  for (const root of roots) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (node.parentElement.closest("option, script, style, svg, textarea")) continue;
      for (const match of node.data.matchAll(/\\p{L}+/gu)) {
        if (match[0].length > 30) continue;
        const range = document.createRange();
        range.setStart(node, match.index);
        range.setEnd(node, match.index + match[0].length);
        const tops = new Set(
          [...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top))
        );
        if (tops.size > 1) split.push(match[0]);
      }
    }
  }
  return [...new Set(split)].slice(0, 12);
}"""


@pytest.mark.slow
def test_no_word_of_the_admin_pages_breaks_inside_itself_at_1280_by_800(
    browser: Any,  # noqa: F811
    live_server: Any,
) -> None:
    """On every page of the app's admin, with realistic and long data, ordinary words stay
    whole ("anonymous", not "anony mous"): only tokens too long for any column wrap."""
    pks = policy_with_long_and_realistic_data()
    traffic_from_a_long_username()
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    login(page, live_server)
    broken = {}
    for url in _admin_pages(pks):
        response = page.goto(f"{live_server.url}{url}")
        assert response is not None and response.status == 200, url
        if words := page.evaluate(SPLIT_WORDS):
            broken[url] = words
    assert broken == {}, "\n".join(f"{url}: {words}" for url, words in broken.items())
    page.close()


# Every inspect link of the dashboard opens its client (issue 30 item 5) --------------------


@pytest.mark.urls("tests.seams_urls")
def test_a_browser_follows_every_inspect_link_of_the_dashboard(
    browser: Any,  # noqa: F811
    live_server: Any,
    settings: Any,
) -> None:
    """After failed logins (usernames plain, unicode, markup and long: labels ``username:``,
    ``username:#<digest>`` and ``username#<hex>``), requests of an address (IPv4 and IPv6),
    an API key and a signed-in user, every "inspect" link the dashboard draws opens a page
    that lists that client's counters; none says "Unknown client"."""
    from tests.test_operator_labels import make_policy
    from tests.test_operator_labels import traffic as labels_traffic

    labels_traffic(Client(), make_policy())
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    login(page, live_server)
    page.goto(f"{live_server.url}/admin/django_throttle/usagecount/dashboard/")
    links = [a.get_attribute("href") for a in page.query_selector_all("a.dt-inspect")]
    assert len(links) >= 8, links
    for link in links:
        page.goto(f"{live_server.url}{link}")
        content = page.inner_text("#content")
        assert "Unknown client" not in content, link
        assert page.query_selector("[data-counted-by]") is not None, link
    page.close()
