"""The admin's usage list, through the test client: it copies the backend's counts when it is
opened (no cron job to know about), renders when the backend is down, and shows tier totals
and per-client rows as two lists, each client in words, estimates marked (issue 30, items 9
and 10)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User

from django_throttle.admin import usage_counts
from django_throttle.backends import get_backend, usage_store
from django_throttle.backends import redis as redis_backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.models import UsageCount
from django_throttle.usage import accounting
from django_throttle.usage.reports import CHUNK_MINUTES, rollup
from tests.factories import endpoint, tier, with_shards
from tests.test_usage import send
from tests.test_usage_report import minutes_ago

pytestmark = pytest.mark.django_db

LIST = "/admin/django_throttle/usagecount/"
DASHBOARD = LIST + "dashboard/"


@pytest.fixture(autouse=True)
def _roll_up_on_the_next_view() -> Iterator[None]:
    """Each test's first view rolls up (the last one is per process, not per test)."""
    usage_counts.forget_rollup()
    yield
    usage_counts.forget_rollup()


def operator(client: Any) -> None:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_usagecount"))
    client.force_login(user)


def cells(html: str, column: str) -> list[str]:
    return re.findall(rf'<td class="field-{column}[^"]*">(.*?)</td>', html, re.S)


def behind(backend: Any, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The clock that names the usage minute, ``seconds`` behind: the requests' minute is a
    finished one by the time the list is opened (the rollup copies finished minutes)."""
    real = time.time
    if isinstance(backend, MemoryBackend):
        backend.clock = lambda: real() - seconds
    else:
        monkeypatch.setattr(redis_backend.time, "time", lambda: real() - seconds)


def test_opening_the_usage_list_copies_the_counts_without_the_command(
    client: Any, backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The list showed "0 usage counts" beside a dashboard of 107 allowed until someone ran
    ``throttle_usage --rollup``; now opening it copies what the backend holds."""
    anon = tier("anonymous", "1000/h", is_default_anonymous=True)
    endpoint("ping", "route", "ping", limits={anon: "5/h"})
    behind(backend, monkeypatch, 180)
    statuses = [client.get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code for _ in range(8)]
    assert statuses == [200] * 5 + [429] * 3
    monkeypatch.undo()
    if isinstance(backend, MemoryBackend):
        backend.clock = time.time
    assert not UsageCount.objects.exists()
    operator(client)

    html = client.get(LIST).content.decode()

    assert cells(html, "tier_name") == ["anonymous"]
    assert cells(html, "endpoint_name") == ["ping"]
    assert cells(html, "allowed") == ["5"]
    assert cells(html, "denied") == ["3"]
    assert 'id="dt-rollup-note"' in html and "throttle_usage --rollup" in html
    clients = client.get(LIST, {"kind": "clients"}).content.decode()
    assert "Address 203.0.113.9" in clients
    assert "ip:203.0.113.9" not in re.sub(r'(title|href)="[^"]*"', "", clients)


def test_the_list_rolls_up_at_most_once_per_interval(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = get_backend()
    send(store, "ip:203.0.113.1", "free", "ping", allowed=2, at=minutes_ago(3))
    operator(client)
    client.get(LIST)
    assert UsageCount.objects.filter(client="*").count() == 1
    behind(store, monkeypatch, 120)  # a minute already copied: noted late, copied again
    send(store, "ip:203.0.113.1", "free", "other", allowed=2)

    client.get(LIST)  # within ROLLUP_EVERY: nothing copied
    assert UsageCount.objects.filter(client="*").count() == 1
    monkeypatch.setattr(usage_counts, "ROLLUP_EVERY", 0.0)
    client.get(LIST)
    assert UsageCount.objects.filter(client="*").count() == 2


def test_the_list_renders_when_the_backend_is_down(client: Any, settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    minute = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)
    UsageCount.objects.create(
        window_start=minute, client="*", tier="free", endpoint="ping", allowed=7
    )
    operator(client)

    response = client.get(LIST)

    assert response.status_code == 200
    html = response.content.decode()
    assert "The live counts could not be read" in html
    assert cells(html, "allowed") == ["7"]


def test_a_rollup_with_a_deadline_stops_after_a_chunk_and_the_next_goes_on(
    open_store: Callable[..., Any],
) -> None:
    store = get_backend()
    for n in range(2, 2 + 2 * CHUNK_MINUTES):
        send(store, "ip:203.0.113.1", "free", "ping", allowed=1, at=minutes_ago(n))
    usage = open_store(store)
    ticks = iter([0.0])  # the deadline passes while the first chunk is copied

    first = rollup(usage, deadline=1.0, clock=lambda: next(ticks, 2.0))
    assert first.minutes == CHUNK_MINUTES
    assert first.left > CHUNK_MINUTES  # the rest of what the backend keeps
    rest = rollup(usage)
    copied = UsageCount.objects.filter(client="*")
    assert sum(row.allowed for row in copied) == 2 * CHUNK_MINUTES
    assert rest.minutes >= CHUNK_MINUTES


def test_a_rollup_whose_deadline_passed_starts_no_read(open_store: Callable[..., Any]) -> None:
    """The deadline was checked after each chunk only: a Redis answering each read slowly
    had a page view read a chunk, advance the watermark and copy the API keys' last use
    after its budget was spent. Past its deadline a rollup now reads nothing more."""
    store = get_backend()
    send(store, "ip:203.0.113.1", "free", "ping", allowed=1, at=minutes_ago(3))
    usage = open_store(store)

    late = rollup(usage, deadline=0.0)

    assert (late.minutes, late.rows, late.keys) == (0, 0, 0)
    assert late.left > 0
    assert not UsageCount.objects.exists()
    assert rollup(usage).rows > 0  # the next run copies it


def test_totals_and_clients_are_two_lists_in_words(client: Any) -> None:
    """One list held both kinds of row with ``*`` in the cells and raw labels (``user:2`` and
    ``username:alice`` as if two Alices). Every request is counted: no figure is marked as an
    estimate."""
    odd = "<b>Ünïcødé</b>" + "x" * 120
    alice = User.objects.create_user("alice")
    other = User.objects.create_user(odd)
    minute = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)
    UsageCount.objects.create(
        window_start=minute, client="*", tier="free", endpoint="ping", allowed=40
    )
    UsageCount.objects.create(
        window_start=minute,
        client="*",
        tier=accounting.BEFORE_AUTHENTICATION,
        endpoint="login",
        denied=2,
    )
    for label, allowed in (
        (f"user:{alice.pk}", 40),
        ("username:alice", 0),
        (f"user:{other.pk}", 8),
        ("username:#0123456789abcdef", 0),
    ):
        UsageCount.objects.create(
            window_start=minute, client=label, tier="*", endpoint="*", allowed=allowed, denied=1
        )
    operator(client)

    totals = client.get(LIST).content.decode()
    assert sorted(cells(totals, "tier_name")) == ["checks before authentication", "free"]
    assert "User alice" not in totals
    clients = client.get(LIST, {"kind": "clients"}).content.decode()
    for html in (totals, clients):
        assert not re.search(r"<td[^>]*>\s*\*\s*</td>", html)  # no "*" cell
    assert "User alice</a>" in clients
    assert "Username at login: alice</a>" in clients
    assert "Username at login: not a user (#01234567)" in clients
    assert "User &lt;b&gt;Ünïcødé&lt;/b&gt;xxx" in clients and "<b>Ünïcødé" not in clients
    assert sorted(cells(clients, "allowed")) == ["0", "0", "40", "8"]
    assert "≈" not in clients and 'id="dt-estimates"' not in clients
    inspect = "/admin/django_throttle/usagecount/inspect/?client="
    assert f'href="{inspect}user%3A{alice.pk}"' in clients
    assert f'href="{inspect}username%3Aalice"' in clients


def test_the_client_list_says_when_the_minutes_shown_hold_estimates(
    client: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-client rows of a minute whose top list was full may be estimates (smaller clients
    folded into those listed); ``throttle_usage`` and the dashboard said so, the usage list
    showed the same rows as plain counts. It says so when, and only when, a minute it shows
    was full (every row of that minute counts, not only those a search leaves)."""
    monkeypatch.setattr(usage_store, "TOP_CLIENTS", 2)  # two clients per list and minute
    settings.DJANGO_THROTTLE_REDIS_URL = with_shards(settings.DJANGO_THROTTLE_REDIS_URL, 1)
    full = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=2)
    room = full + timedelta(hours=1)
    UsageCount.objects.create(window_start=full, client="*", tier="free", endpoint="x", allowed=9)
    for label, allowed in (("user:1", 5), ("user:2", 3), ("user:3", 1)):
        UsageCount.objects.create(
            window_start=full, client=label, tier="*", endpoint="*", allowed=allowed
        )
    UsageCount.objects.create(window_start=room, client="user:9", tier="*", endpoint="*", allowed=4)
    operator(client)
    note = 'id="dt-estimates"'

    def shown(**query: str) -> str:
        response = client.get(LIST, query)
        assert response.status_code == 200
        return response.content.decode()

    everything = shown(kind="clients")
    assert note in everything
    assert "may be estimates" in " ".join(everything.split())
    assert note in shown(kind="clients", q="user:2")  # one row of the full minute
    assert note not in shown(kind="clients", q="user:9")  # only the minute with room
    assert note not in shown()  # the totals are exact


def test_the_dashboard_names_clients_in_words(client: Any, backend: Any) -> None:
    alice = User.objects.create_user("alice")
    store = get_backend()
    send(store, f"user:{alice.pk}", "free", "ping", denied=2, at=minutes_ago(1))
    send(store, "username:alice", accounting.BEFORE_AUTHENTICATION, "login", denied=1)
    send(store, "ip:203.0.113.9", "free", "ping", denied=1)
    operator(client)

    html = client.get(DASHBOARD).content.decode()
    limited = html.split('id="limited"', 1)[1].split("</section>", 1)[0]

    assert "User alice</a>" in limited
    assert "Username at login: alice</a>" in limited
    assert "Address 203.0.113.9" in limited
    assert f'href="/admin/django_throttle/usagecount/inspect/?client=user%3A{alice.pk}"' in limited
    assert not re.search(r">[^<]*\b(user|username|ip):", limited)  # no raw label as text


def test_a_hung_redis_holds_the_list_for_its_short_timeouts_only(
    client: Any, hung_redis: str
) -> None:
    """The list's rollup is bounded (at most 2 s a view), yet a Redis that answers nothing
    held it for the report timeout (10 s): its first call now has the short timeouts."""
    minute = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)
    UsageCount.objects.create(
        window_start=minute, client="*", tier="free", endpoint="ping", allowed=7
    )
    operator(client)

    started = time.monotonic()
    response = client.get(LIST)
    elapsed = time.monotonic() - started

    assert response.status_code == 200
    html = response.content.decode()
    assert "The live counts could not be read" in html
    assert cells(html, "allowed") == ["7"]
    assert elapsed < 2, f"{elapsed:.1f} s"
