"""An operator's tools while Redis is sick, through :class:`tests.faultproxy.FaultProxy`
(refused, hung, slow, replies dropped, replies torn): the guarded and the plain admin
login, every admin page, saving a rule and a tier, and the management commands answer
promptly with no 500, saying where Redis could not be read; once the fault clears,
everything reads Redis again without a restart. (``tests/test_operator_outages.py`` covers
a Redis with nothing listening and one SIGSTOPped.)"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from tests.faultproxy import FaultProxy
from tests.redis_servers import RedisServer
from tests.test_operator_outages import rows

pytestmark = pytest.mark.django_db(transaction=True)  # a change is published when it commits

BASE = "/admin/django_throttle/"
#: Seconds any one page or command may take with the package's own short timeouts.
PROMPT = 5.0


@pytest.fixture
def proxy(redis_process: RedisServer, settings: Any) -> Iterator[FaultProxy]:
    """The throttle on a private Redis behind a fault proxy, with the package's timeouts."""
    redis_process.ensure_healthy()
    with FaultProxy(redis_process.port) as fault_proxy:
        settings.DJANGO_THROTTLE_REDIS_URL = fault_proxy.url
        settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}
        yield fault_proxy
    redis_process.ensure_healthy()


def timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def pages(made: dict[str, Any]) -> list[str]:
    urls = ["/admin/", BASE]
    for model in ("tier", "endpointrule", "tierassignment", "exemption", "apikey", "protection"):
        urls += [f"{BASE}{model}/", f"{BASE}{model}/add/"]
    urls += [f"{BASE}{model}/{row.pk}/change/" for model, row in made.items()]
    return [
        *urls,
        f"{BASE}usagecount/",
        f"{BASE}usagecount/dashboard/",
        f"{BASE}usagecount/inspect/?client=ip:1.2.3.4",
        f"{BASE}usagecount/inspect/?client=ip:1.2.3.4&path=/api/ping/&method=GET",
        f"{BASE}usagecount/inspect/?client=key:{made['apikey'].prefix}",
        f"{BASE}usagecount/inspect/reset/?client=ip:1.2.3.4",
    ]


def run(*command: str) -> tuple[int, str]:
    """A command's exit status and its output (a one-line error's text)."""
    out = io.StringIO()
    try:
        call_command(command[0], "--skip-checks", *command[1:], stdout=out, stderr=io.StringIO())
    except CommandError as exc:
        return exc.returncode, str(exc)
    return 0, out.getvalue()


COMMANDS = [
    ("throttle_inspect", "ip:1.2.3.4"),
    ("throttle_explain", "--client", "ip:1.2.3.4", "--path", "/api/ping/"),
    ("throttle_reset", "ip:1.2.3.4"),
    ("throttle_usage",),
    ("throttle_policy", "export"),
]


@pytest.mark.parametrize("mode", ["refuse", "blackhole", "delay", "drop_reply", "reset"])
def test_every_operator_tool_answers_a_sick_redis_and_recovers_without_a_restart(
    mode: str, proxy: FaultProxy, settings: Any
) -> None:
    from tests.test_admin_history import change_data

    settings.ROOT_URLCONF = "tests.checks_urls_guarded"  # the admin login under the guard
    made = rows()
    User.objects.create_superuser("root", "root@example.com", "pw")
    guarded = Client(raise_request_exception=False)
    assert run("throttle_inspect", "ip:1.2.3.4")[0] == 0  # scripts loaded, connections made
    proxy.set_mode(mode, delay=1.0)  # slower than the package's timeouts

    problems = []
    login = {"username": "root", "password": "pw"}
    response, elapsed = timed(lambda: guarded.post("/admin/login/?next=/admin/", login))
    if response.status_code != 302 or elapsed > PROMPT:
        problems.append(("guarded login", response.status_code, round(elapsed, 1)))
    for url in pages(made):
        response, elapsed = timed(lambda url=url: guarded.get(url))
        if response.status_code >= 400 or elapsed > PROMPT:
            problems.append((url, response.status_code, round(elapsed, 1)))
    inspected = guarded.get(f"{BASE}usagecount/inspect/?client=ip:1.2.3.4").content.decode()
    if "The live counters could not be read" not in inspected:
        problems.append(("the inspector does not say Redis could not be read", mode))
    for model in ("endpointrule", "tier"):
        data = change_data(model, made[model]) | (
            {"is_default_anonymous": "on"} if model == "tier" else {}
        )
        url = f"{BASE}{model}/{made[model].pk}/change/"
        response, elapsed = timed(lambda url=url, data=data: guarded.post(url, data, follow=True))
        said = " ".join(str(m) for m in response.context["messages"]) if response.context else ""
        if response.status_code != 200 or elapsed > PROMPT or "Redis is unreachable" not in said:
            problems.append((f"save {model}", response.status_code, round(elapsed, 1), said))
    settings.ROOT_URLCONF = "tests.urls"  # the plain admin login; /api/ping/ routed
    for command in COMMANDS:
        (code, said), elapsed = timed(lambda command=command: run(*command))
        export = command[0] == "throttle_policy"
        # Exit 3: the answer is shown without what Redis holds, and says so; 1: an error.
        if (code != 0 if export else code not in (1, 3) or "Redis" not in said) or (
            elapsed > PROMPT
        ):
            problems.append((command[0], code, said[:200], round(elapsed, 1)))
    plain = Client(raise_request_exception=False)
    response, elapsed = timed(lambda: plain.post("/admin/login/?next=/admin/", login))
    if response.status_code != 302 or elapsed > PROMPT:
        problems.append(("plain login", response.status_code, round(elapsed, 1)))
    assert problems == []

    proxy.set_mode("pass")
    healed = time.monotonic()
    while "The live counters could not be read" in (
        guarded.get(f"{BASE}usagecount/inspect/?client=ip:1.2.3.4").content.decode()
    ):
        assert time.monotonic() - healed < 3, "the inspector still cannot read Redis"
        time.sleep(0.05)
    assert run("throttle_inspect", "ip:1.2.3.4")[0] == 0
    assert run("throttle_usage")[0] == 0
    assert run("throttle_reset", "ip:1.2.3.4")[0] == 0


def test_a_hung_redis_costs_the_inspector_one_policy_version_check_not_one_per_read(
    proxy: FaultProxy, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """With a socket timeout of a second (as long as the policy's refresh interval), every
    read of the policy during one inspector page found its check due again once the last
    check had waited out its timeout: the page asked a hung Redis for the version three
    times, 4.2 s for one page at ``socket_timeout=1``. The interval counts from the check's
    answer: one version check per page, a timeout for it and one for the counters."""
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 1, "socket_connect_timeout": 1}
    rows()
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    url = f"{BASE}usagecount/inspect/?client=ip:1.2.3.4"
    assert client.get(url).status_code == 200  # policy compiled, connections made
    time.sleep(1.1)  # the next read of the policy checks its version
    proxy.set_mode("blackhole")
    caplog.clear()

    response, elapsed = timed(lambda: client.get(url))

    assert response.status_code == 200
    assert "The live counters could not be read" in response.content.decode()
    checks = [r for r in caplog.records if "policy version check failed" in r.getMessage()]
    assert len(checks) == 1  # the version, asked once
    assert elapsed < 2.8, f"{elapsed:.1f} s"


def test_a_hung_redis_costs_the_dashboard_one_socket_timeout_not_one_per_section(
    proxy: FaultProxy, settings: Any
) -> None:
    """The dashboard's timeline, health, load factors and most limited clients each asked a
    hung Redis in turn, each waiting out the socket timeout: four timeouts for one page (8 s
    at ``socket_timeout=2``; 40 s, past a gunicorn worker's 30 s, at 10). The first read
    that goes unanswered now ends the page's reads: every section says why at once."""
    import re

    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 1, "socket_connect_timeout": 1}
    rows()
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    url = f"{BASE}usagecount/dashboard/"
    assert client.get(url).status_code == 200  # policy compiled, connections made
    proxy.set_mode("blackhole")

    response, elapsed = timed(lambda: client.get(url))

    assert response.status_code == 200
    html = response.content.decode()
    assert "counts are partial" in html
    assert re.search(r'id="dt-reachable">\s*no', html)
    assert "Timeout" in html.split('id="limited"', 1)[1]  # the list says why it is partial
    assert elapsed < 1.8, f"{elapsed:.1f} s"


def test_a_slow_redis_costs_an_admin_page_its_read_budget_not_a_delay_per_read(
    proxy: FaultProxy, settings: Any
) -> None:
    """A Redis that answers each read just under the socket timeout made each page wait for
    every one of its reads in turn: at ``socket_timeout=0.5`` with each reply 0.4 s late the
    dashboard took 3.7 s, the inspector's "explain" 2.0 s (14.4 s and 9.7 s at 2 s and
    1.6 s). A page now starts no read once its reads have taken longer than its budget (one
    socket timeout, at least 1 s): 1.2 s each (3.2 s and 4.8 s at 2 s). What was read is
    shown; the sections not read say so. A reset asked for still runs.

    The policy's version check is one of the page's reads: once the budget is spent,
    "explain" makes none more (it checked the version again, due a second after the
    inspection's check, outside the budget: 4.8 s where the budget allows 3.2 s at 2 s and
    1.6 s, 3.3 s for 2.2 s at 1.3 s and 1.1 s) and says the policy shown is the last read."""
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
    rows()
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    dashboard = f"{BASE}usagecount/dashboard/"
    explain = f"{BASE}usagecount/inspect/?client=ip:1.2.3.4&path=/api/ping/&method=GET"
    for url in (dashboard, explain):
        assert client.get(url).status_code == 200  # policy compiled, connections made
    proxy.set_mode("delay", delay=0.4)

    response, elapsed = timed(lambda: client.get(dashboard))
    assert response.status_code == 200
    html = response.content.decode()
    assert "not read: Redis answered slowly" in html
    assert 'data-slow="yes"' in html or "counts are partial" in html
    assert elapsed < 1.8, f"dashboard {elapsed:.1f} s"

    response, elapsed = timed(lambda: client.get(explain))
    assert response.status_code == 200
    html = response.content.decode()
    assert "not read: Redis answered slowly" in html
    assert 'data-unread="yes"' in html or 'id="dt-explained-unread"' in html
    assert elapsed < 1.7, f"explain {elapsed:.1f} s"

    reset = {"client": "ip:1.2.3.4"}
    response = client.post(f"{BASE}usagecount/inspect/reset/", reset, follow=True)
    said = " ".join(str(m) for m in response.context["messages"])
    assert response.status_code == 200 and "IP 1.2.3.4" in said, said  # it ran, and says so

    # A budget longer than the policy's refresh interval (1 s): the inspection's reads end
    # more than a second after its version check, so "explain" finds the next one due.
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 1.3, "socket_connect_timeout": 1.3}
    proxy.set_mode("pass")
    assert client.get(explain).status_code == 200  # connections made with the new timeout
    proxy.set_mode("delay", delay=1.1)
    time.sleep(1.1)  # the page's first read of the policy checks its version
    proxy.reset_counts()

    response, elapsed = timed(lambda: client.get(explain))
    assert response.status_code == 200
    html = response.content.decode()
    assert proxy.forwarded["GET"] == 1, proxy.counts()  # the version, asked once
    assert 'id="dt-explained-policy-unchecked"' in html
    assert "The policy shown is the last one read" in html
    assert "not read: Redis answered slowly" in html
    assert elapsed < 2.8, f"explain {elapsed:.1f} s"  # budget 1.3 s + the read in flight


def test_a_slow_redis_costs_the_usage_list_its_rollup_budget_not_a_delay_per_read(
    proxy: FaultProxy, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usage list copies what Redis holds before it lists (the rollup), for at most its
    budget: the deadline was checked only after a chunk of minutes, so a Redis answering
    each read 0.4 s late still cost the view the time, the watermark, the late minutes, a
    chunk, its watermark and the API keys' last use, one slow reply each, whatever the
    budget. The rollup now starts no read once its budget is spent, and the list says the
    minutes it did not copy; a later view copies them."""
    from django_throttle.admin import usage_counts

    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
    monkeypatch.setattr(usage_counts, "ROLLUP_BUDGET", 0.5)
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    usage_list = f"{BASE}usagecount/"
    assert client.get(f"{BASE}usagecount/dashboard/").status_code == 200  # connections made
    proxy.set_mode("delay", delay=0.4)  # nothing copied yet: three hours of minutes to copy
    usage_counts.forget_rollup()

    try:
        response, elapsed = timed(lambda: client.get(usage_list))
    finally:
        usage_counts.forget_rollup()
    assert response.status_code == 200
    assert elapsed < 1.7, f"{elapsed:.1f} s"  # 3 reads before the budget's first check
    said = " ".join(str(m) for m in response.context["messages"])
    assert "The live counts could not be read (copying stopped after" in said, said


def test_a_slow_redis_costs_each_operator_tool_a_few_slow_replies_at_most(
    proxy: FaultProxy, settings: Any
) -> None:
    """Redis answering each read 0.25 s late, under a socket timeout of 0.3 s (slow, but
    never timing out): every admin page, the guarded admin login and each command answers
    with no error, a page within its read budget (1 s) and the read in flight, the usage
    list within its copy's (2 s) and the chunk in flight, a command within a few replies
    (commands have no budget: a script waits for its reads). The fault test above delays
    replies past the package's default timeouts, which is a hung Redis to the client."""
    from django_throttle.admin import usage_counts

    settings.ROOT_URLCONF = "tests.checks_urls_guarded"  # the admin login under the guard
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 0.3, "socket_connect_timeout": 0.3}
    made = rows()
    User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client(raise_request_exception=False)
    login = {"username": "root", "password": "pw"}
    assert client.post("/admin/login/?next=/admin/", login).status_code == 302
    # The inspector's explanation and a key's inspection: their own test above.
    urls = [url for url in pages(made) if "&path=" not in url and "client=key:" not in url]
    for url in urls:  # policy compiled, connections made
        assert client.get(url).status_code == 200, url
    proxy.set_mode("delay", delay=0.25)

    problems = []
    response, elapsed = timed(lambda: Client().post("/admin/login/?next=/admin/", login))
    if response.status_code != 302 or elapsed > 2.0:
        problems.append(("guarded login", response.status_code, round(elapsed, 1)))
    usage_counts.forget_rollup()
    try:
        for url in [*urls, f"{BASE}usagecount/?kind=clients"]:
            response, elapsed = timed(lambda url=url: client.get(url))
            bound = 3.0 if url.endswith("usagecount/") else 2.0
            if response.status_code != 200 or elapsed > bound:
                problems.append((url, response.status_code, round(elapsed, 1)))
    finally:
        usage_counts.forget_rollup()
    settings.ROOT_URLCONF = "tests.urls"  # /api/ping/ routed
    for command in COMMANDS:
        (code, said), elapsed = timed(lambda command=command: run(*command))
        if code != 0 or elapsed > 3.0:
            problems.append((command[0], code, said[:200], round(elapsed, 1)))
    assert problems == []
