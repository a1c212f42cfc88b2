"""Operators see and free concurrency slots: ``throttle_inspect``, ``throttle_explain``,
``throttle_reset`` and the admin's inspector show each concurrency limit's slots in use ("2 of
3 in flight") with when each held lease ends, say whether the next request gets a slot, and a
reset frees the slots. On Redis and in memory, for an IP client and a long unicode username."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client

from django_throttle.backends import get_backend
from django_throttle.inspection.clients import Counter, counters, short_lease
from django_throttle.inspection.subjects import parse_client
from django_throttle.models import TierLimit
from django_throttle.rates import Algorithm, Limit
from tests.factories import tier
from tests.topologies import LocalCluster

pytestmark = pytest.mark.django_db

#: A username an operator may have to type: long, unicode, with the characters Django allows.
UNICODE_NAME = "zoë.ñandú-" + "łódź_" * 20
IP = "203.0.113.9"
REFUSED = "the next request is refused until one ends (at most 1 s Retry-After)"
INSPECT = "/admin/django_throttle/usagecount/inspect/"
RESET = "/admin/django_throttle/usagecount/inspect/reset/"


@pytest.fixture
def policy(db: Any) -> None:
    """Every client may have 3 requests in flight (a lease of a minute), besides a rate."""
    for slug, flag in (("anonymous", "is_default_anonymous"), ("free", "is_default_authenticated")):
        row = tier(slug, "1000/h", **{flag: True})
        TierLimit.objects.create(tier=row, rate="3/min", algorithm=Algorithm.CONCURRENCY)
    User.objects.create_user(UNICODE_NAME, password="pw")


@pytest.fixture(params=[IP, UNICODE_NAME], ids=["ip", "unicode-user"])
def who(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def slots(client_text: str) -> Counter:
    """The client's concurrency counter, as its requests meet it."""
    found = counters(parse_client(client_text))
    return next(c for c in found if c.limit.algorithm == Algorithm.CONCURRENCY)


def hold(client_text: str, n: int) -> list[str]:
    """Take ``n`` slots as ``n`` requests in flight would; their lease ids."""
    counter = slots(client_text)
    taken = []
    for _ in range(n):
        decision = get_backend().hit(counter.client, [counter.limit])
        assert decision.allowed
        ((_client, lease),) = decision.leases
        taken.append(lease)
    return taken


def run(command: str, *args: str) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def as_json(command: str, *args: str) -> Any:
    return json.loads(run(command, *args, "--format", "json"))


def concurrency_row(found: Any) -> dict[str, Any]:
    return next(row for row in found["rows"] if row["algorithm"] == "concurrency")


def last_column(table: str) -> str:
    """The table's last column as one text (rich folds a long cell over several lines)."""
    cells = [line.split("│")[-2].strip() for line in table.splitlines() if line.startswith("│")]
    return " ".join(filter(None, cells))


def named(client_text: str) -> str:
    """The client's concurrency limit as the tools name it."""
    return slots(client_text).limit.name


def staff(*permissions: str) -> User:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


# --- the backend's read of the leases ---------------------------------------------------------


def test_leases_lists_the_live_ones_soonest_first_by_the_given_clock(backend: Any) -> None:
    limit = Limit.build("exports", "3/min", algorithm="concurrency")
    hit = backend.hit
    first = hit("user:1", [limit], now=1_000.0).leases[0][1]
    second = hit("user:1", [limit], now=1_030.0).leases[0][1]

    assert backend.leases("user:1", limit, now=1_040.0) == [(first, 20.0), (second, 50.0)]
    assert backend.leases("user:1", limit, now=1_060.0) == [(second, 30.0)]  # first ended
    assert backend.leases("user:2", limit, now=1_040.0) == []
    assert backend.leases("user:1", Limit.build("rate", "3/min"), now=1_040.0) == []


def test_leases_reads_the_servers_clock(backend: Any) -> None:
    limit = Limit.build("exports", "3/min", algorithm="concurrency")
    lease = backend.hit("user:1", [limit]).leases[0][1]

    ((held, left),) = backend.leases("user:1", limit)

    assert held == lease
    assert 55 < left <= 60


# --- throttle_inspect -------------------------------------------------------------------------


def test_inspect_shows_slots_in_use_and_when_each_lease_ends(
    backend: Any, policy: None, who: str
) -> None:
    taken = hold(who, 2)

    row = concurrency_row(as_json("throttle_inspect", who))

    assert (row["capacity"], row["remaining"], row["in_flight"]) == (3, 1, 2)
    assert [lease["lease"] for lease in row["leases"]] == [short_lease(id) for id in taken]
    assert all(55 < lease["ends_in_seconds"] <= 60 for lease in row["leases"])
    held = last_column(run("throttle_inspect", who))
    lease = re.escape(short_lease(taken[0]))
    assert re.search(rf"2 of 3 in flight; {lease} ends in (1 min|\d\d s); ", held), held


def test_lease_ids_are_shown_shortened() -> None:
    assert short_lease("AbCdEfGhIjKlMnOp") == "AbCdEfGh…"
    assert short_lease("short") == "short"


def test_inspect_without_a_concurrency_limit_has_no_in_flight_column(backend: Any) -> None:
    tier("anonymous", "1000/h", is_default_anonymous=True)
    assert "In flight" not in run("throttle_inspect", IP)
    assert as_json("throttle_inspect", IP)["rows"][0]["in_flight"] is None


# --- throttle_explain -------------------------------------------------------------------------


def test_explain_says_how_many_are_in_flight_and_that_the_next_gets_a_slot(
    backend: Any, policy: None
) -> None:
    hold(IP, 1)

    found = as_json("throttle_explain", "--ip", IP, "--path", "/api/ping/")

    assert found["next_request"] == "allowed"
    assert found["in_flight"] == [f"{named(IP)}: 1 of 3 in flight"]


def test_explain_says_the_next_request_is_refused_until_one_ends(
    backend: Any, policy: None, who: str
) -> None:
    hold(who, 3)
    args = ("--ip", IP) if who == IP else ("--user", UNICODE_NAME)

    found = as_json("throttle_explain", *args, "--path", "/api/ping/")

    assert found["next_request"].startswith("denied (429)")
    assert found["retry_after"] == 1
    assert found["in_flight"] == [f"{named(who)}: 3 of 3 in flight; {REFUSED}"]
    assert f"In flight: {named(who)}: 3 of 3 in flight; {REFUSED}" in run(
        "throttle_explain", *args, "--path", "/api/ping/"
    )


# --- throttle_reset ---------------------------------------------------------------------------


def test_reset_frees_the_slots(backend: Any, policy: None, who: str) -> None:
    hold(who, 3)
    counter = slots(who)
    assert not backend.peek(counter.client, [counter.limit], cost=1).allowed

    done = as_json("throttle_reset", who)

    assert done["reset"] >= 1
    assert counter.limit.id in [row["id"] for row in done["rows"]]
    assert backend.leases(counter.client, counter.limit) == []
    assert concurrency_row(as_json("throttle_inspect", who))["in_flight"] == 0
    assert len(hold(who, 3)) == 3  # every slot free again


def test_reset_of_the_concurrency_limit_alone(backend: Any, policy: None) -> None:
    hold(IP, 3)
    counter = slots(IP)

    run("throttle_reset", IP, "--limit", counter.limit.id)

    assert backend.leases(counter.client, counter.limit) == []


# --- the admin's inspector --------------------------------------------------------------------


def test_the_inspector_shows_slots_and_lease_ends(
    client: Any, backend: Any, policy: None, who: str
) -> None:
    taken = hold(who, 2)
    client.force_login(staff("view_usagecount"))

    html = client.get(INSPECT, {"client": who}).content.decode()

    assert re.search(r'data-limit="\w+" data-remaining="1" [^>]*data-in-flight="2"', html)
    assert "2 of 3 in flight" in html
    for lease in taken:
        assert f"<code>{short_lease(lease)}</code> ends in" in html
        assert lease not in html  # shortened, always


def test_the_inspector_explains_a_refusal_by_slots_in_flight(
    client: Any, backend: Any, policy: None
) -> None:
    hold(IP, 3)
    client.force_login(staff("view_usagecount"))

    html = client.get(
        INSPECT, {"client": IP, "method": "GET", "path": "/api/ping/"}
    ).content.decode()

    assert re.search(r'id="dt-verdict">\s*<span class="dt-bad">denied \(429\)', html)
    expected = re.escape(f"{named(IP)}: 3 of 3 in flight; {REFUSED}")
    assert re.search(rf'id="dt-in-flight">{expected}', html)


def test_the_admin_reset_frees_the_slots(backend: Any, policy: None, who: str) -> None:
    hold(who, 3)
    counter = slots(who)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(staff("view_usagecount", "change_tier"))
    confirm = browser.get(RESET, {"client": who}).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', confirm)
    assert token is not None

    done = browser.post(RESET, {"client": who, "csrfmiddlewaretoken": token[1]})

    assert done.status_code == 302
    assert backend.leases(counter.client, counter.limit) == []
    html = browser.get(INSPECT, {"client": who}).content.decode()
    assert "0 of 3 in flight" in html
    assert len(hold(who, 3)) == 3


# --- on a Redis Cluster: the lease ends read on the key's own node's clock --------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    topology = LocalCluster(replicas=0)
    try:
        yield topology.start()
    finally:
        topology.stop()


def test_inspect_and_reset_on_a_cluster(settings: Any, cluster: LocalCluster, policy: None) -> None:
    cluster.wait_ok()
    cluster.flushall()
    settings.DJANGO_THROTTLE_REDIS_URL = cluster.url
    taken = hold(UNICODE_NAME, 2)

    row = concurrency_row(as_json("throttle_inspect", UNICODE_NAME))

    assert row["in_flight"] == 2
    assert [lease["lease"] for lease in row["leases"]] == [short_lease(id) for id in taken]
    assert all(55 < lease["ends_in_seconds"] <= 60 for lease in row["leases"])
    run("throttle_reset", UNICODE_NAME)
    assert concurrency_row(as_json("throttle_inspect", UNICODE_NAME))["in_flight"] == 0
