"""Every label the operator pages show is one the operator tools accept: the dashboard's
"inspect" links (followed with the test client), the usage list's and reports' labels and
the docs' examples reach ``throttle_inspect``, ``throttle_explain``, ``throttle_reset`` and
the admin's inspector, and a username lockout is lifted from the row that shows it (issue
30 items 5 and 12)."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError
from django.test import Client

from django_throttle.inspection.subjects import UnknownClient, parse_client
from django_throttle.models import ApiKey, EndpointLimit, EndpointRule
from django_throttle.usage import accounting
from tests.factories import tier
from tests.test_operator_seams import TOKEN, as_json, guess, run

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.seams_urls")]

DASHBOARD = "/admin/django_throttle/usagecount/dashboard/"
INSPECT = "/admin/django_throttle/usagecount/inspect/"
LONG = "l" * 150  # its counter is the digest label username#<hex>
#: Longer than a counter keeps a name as it is: its counter is ``username:#<32 hex>``.
LONGER = "long-" + "ü" * 295
ODD = ["zoë_日本語", "<b>x</b>", LONG, LONGER]


@pytest.fixture
def policy(db: Any) -> dict[str, Any]:
    return make_policy()


def make_policy() -> dict[str, Any]:
    """Rule "login" counting failed attempts, 5 a minute per IP address and 3 an hour per
    username; "ping" (the anonymous tier's 2/min) for IP, user and API key rows."""
    anon = tier("anonymous", "2/min", is_default_anonymous=True)
    free = tier("free", "2/min", is_default_authenticated=True)
    rule = EndpointRule.objects.create(
        name="login", match_type="scope", pattern="login", counts=EndpointRule.Counts.FAILURES
    )
    EndpointLimit.objects.create(rule=rule, tier=anon, rate="50/min", counted_by="ip")
    EndpointLimit.objects.create(rule=rule, tier=anon, rate="3/h", counted_by="username")
    alice = User.objects.create_user("alice", password="right")
    return {"anon": anon, "free": free, "alice": alice}


def lock_username(client: Any, name: str, n: int) -> None:
    """Three failed logins presenting ``name`` (from three addresses), then a refusal."""
    for i in range(3):
        assert guess(client, username=name, address=f"198.51.{n}.{i}").status_code == 400
    assert guess(client, username=name, address=f"198.51.{n}.9").status_code == 429


def traffic(client: Any, policy: Any) -> str:
    """Denied requests from every kind of client; returns the API key."""
    for n, name in enumerate(["alice", "bf8", *ODD]):
        lock_username(client, name, n)
    _row, key = ApiKey.objects.create_key(name="ci", tier=policy["free"])
    bob = Client()
    bob.force_login(User.objects.create_user("bob", password="pw"))
    for _ in range(3):
        client.get("/api/ping/", REMOTE_ADDR="203.0.113.7")
        client.get("/api/ping/", REMOTE_ADDR="2001:db8:1:2::7")
        client.get("/api/ping/", HTTP_X_API_KEY=key, REMOTE_ADDR="192.0.2.50")
        bob.get("/api/ping/", REMOTE_ADDR="192.0.2.60")
    accounting.flush_pending()
    return key


def dashboard_rows(admin: Client) -> list[tuple[str, str]]:
    """(label, inspect link) of each "most limited" row, as the page writes them."""
    page = admin.get(DASHBOARD).content.decode()
    links = [html.unescape(h) for h in re.findall(r'class="dt-inspect" href="([^"]+)"', page)]
    labels = [html.unescape(c) for c in re.findall(r'data-client="([^"]*)"', page)]
    assert len(links) == len(labels)
    return list(zip(labels, links, strict=True))


def admin_client() -> Client:
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return admin


def test_every_inspect_link_of_the_dashboard_opens_its_client(
    client: Any, backend: Any, policy: Any
) -> None:
    """The dashboard linked ``username:#<digest>`` and ``username:alice`` rows to a page
    saying "Unknown client"."""
    traffic(client, policy)
    admin = admin_client()
    rows = dashboard_rows(admin)
    kinds = {re.split("[:#]", label, maxsplit=1)[0] for label, _link in rows}
    assert kinds == {"username", "ip", "key", "user"}
    # bf8, zoë and <b> kept private, the longer one by its counter's own digest
    assert sum(label.startswith("username:#") for label, _link in rows) == 4
    assert any(label.startswith("username#") for label, _link in rows)  # the long one
    for label, link in rows:
        response = admin.get(link)
        assert response.status_code == 200, label
        text = response.content.decode()
        assert "Unknown client" not in text, label
        assert 'data-counted-by="' in text, label  # its counters are listed
        assert "<b>x</b>" not in text  # markup in a username is escaped


def test_every_label_is_accepted_by_the_commands(client: Any, backend: Any, policy: Any) -> None:
    traffic(client, policy)
    for label, _link in dashboard_rows(admin_client()):
        inspected = as_json("throttle_inspect", label)
        assert inspected["rows"], label
        explained = as_json(
            "throttle_explain", "--client", label, "--method", "POST", "--path", TOKEN
        )
        assert explained["client"] == inspected["client"], label
        assert as_json("throttle_reset", label)["reset"] >= 1, label


@pytest.mark.parametrize("name", ["bf8", "alice", *ODD])
def test_a_username_lockout_is_lifted_from_its_row(
    client: Any, backend: Any, policy: Any, name: str
) -> None:
    if name == "alice":
        name, password = "alice", "right"
    else:
        User.objects.create_user(f"{name[:140]}_", password="x")  # another user: still unknown
        password = None
    lock_username(client, name, 1)
    accounting.flush_pending()
    label = next(label for label, _link in dashboard_rows(admin_client()) if "username" in label)

    inspected = as_json("throttle_inspect", label)
    (row,) = inspected["rows"]
    assert (row["capacity"], row["remaining"]) == (3, 0)
    explained = run("throttle_explain", "--client", label, "--method", "POST", "--path", TOKEN)
    assert "denied (429) by login (anonymous) 3/h" in explained
    out = run("throttle_reset", label)

    assert "Cleared 1 counter(s)" in out
    assert guess(client, username=name, address="203.0.113.99").status_code == 400
    if password is not None:
        response = client.post(TOKEN, {"username": name, "password": password})
        assert response.status_code == 200


def test_a_name_too_long_to_keep_is_read_by_the_label_its_counter_is_shown_with(
    client: Any, backend: Any, policy: Any
) -> None:
    """A username over 256 characters is counted as ``#`` and its 32-hex digest, and the
    inspector shows that counter as ``username:#<32 hex>`` ("counted by" ``username
    #<32 hex>``). Both were read as a usage digest (``username:#<16 hex>``) and refused as
    "no recent login presented the username": the counter shown could be neither inspected
    nor reset by the label it was shown with."""
    lock_username(client, LONGER, 1)
    shown = as_json("throttle_inspect", f"username:{LONGER}")
    (row,) = shown["rows"]
    assert re.fullmatch(r"username:#[0-9a-f]{32}", row["counter"])
    assert (row["capacity"], row["remaining"]) == (3, 0)
    upper = "username:" + row["counter"].partition(":")[2].upper()
    for label in (row["counter"], row["counted_by"], upper):
        (again,) = as_json("throttle_inspect", label)["rows"]
        assert (again["counter"], again["remaining"]) == (row["counter"], 0), label
    assert "Cleared 1 counter(s)" in run("throttle_reset", row["counted_by"])
    assert guess(client, username=LONGER, address="203.0.113.99").status_code == 400


def test_the_admin_resets_a_username_lockout_from_its_row(
    client: Any, backend: Any, policy: Any
) -> None:
    lock_username(client, "bf1", 1)
    accounting.flush_pending()
    admin = admin_client()
    ((label, link),) = [row for row in dashboard_rows(admin) if "username" in row[0]]
    assert label.startswith("username:#")
    assert "Reset this client" in admin.get(link).content.decode()

    admin.post(f"{INSPECT}reset/", {"client": label})

    assert guess(client, username="bf1", address="203.0.113.99").status_code == 400


@pytest.mark.parametrize(
    "text",
    [
        "key:dt_{prefix}",
        "dt_{prefix}",
        "key:{prefix}",
        "key:{prefix}…",
        "ci ({prefix}…)",
        "API key {prefix} (ci)",
        "{key}",
        "key:{key}",
        "ci (key:{prefix})",
    ],
)
def test_every_form_of_an_api_key_is_read(backend: Any, policy: Any, text: str) -> None:
    """The docs gave ``key:dt_ab12cd34``, which the inspector refused."""
    row, key = ApiKey.objects.create_key(name="ci", tier=policy["free"])
    assert parse_client(text.format(prefix=row.prefix, key=key)).client == f"key:{row.prefix}"


@pytest.mark.parametrize(
    ("text", "client"),
    [
        ("user:alice", "user:{pk}"),
        ("user:{pk}", "user:{pk}"),
        ("user alice", "user:{pk}"),
        ("alice (user:{pk})", "user:{pk}"),
        ("alice", "user:{pk}"),
        ("ip:2001:db8:1:2::/64", "ip:2001:db8:1:2::/64"),
        ("2001:db8:1:2::/64", "ip:2001:db8:1:2::/64"),
        ("IP 203.0.113.7", "ip:203.0.113.7"),
        ("ip:203.0.113.7", "ip:203.0.113.7"),
        ("username:Alice", "username:alice"),
        ("username alice", "username:alice"),
        ("device:AbC123", "device:AbC123"),
    ],
)
def test_every_form_of_a_client_is_read(policy: Any, text: str, client: str) -> None:
    pk = policy["alice"].pk
    assert parse_client(text.format(pk=pk)).client == client.format(pk=pk)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("username:", "a username is needed"),
        ("username:#0123456789abcdef", "no recent login presented the username"),
        ("user:ghost", "no user with the username or id 'ghost'"),
        ("key:dt_nope", "no API key"),
        # digits Python's isdigit() takes that are no id: ValueError, a 500 in the admin
        ("user:²", "no user with the username or id '²'"),
        ("²", "no user with the username or id '²'"),
        ("user:①", "no user with the username or id '①'"),
    ],
)
def test_unknown_labels_are_a_clear_error(
    client: Any, backend: Any, policy: Any, text: str, message: str
) -> None:
    with pytest.raises(UnknownClient, match=message):
        parse_client(text)
    with pytest.raises(CommandError, match=message):
        run("throttle_inspect", text)
    response = admin_client().get(INSPECT, {"client": text})
    assert response.status_code == 200
    assert "Unknown client" in response.content.decode()


@pytest.mark.parametrize("text", ["user:\udcff", "\udcffalice", "key:dt_\udcff", "alice\x00"])
def test_a_label_no_database_can_hold_is_a_clear_error(
    backend: Any, policy: Any, text: str
) -> None:
    """A command line's bytes that are not UTF-8 reach the command as lone surrogates, which
    the database driver refused with a traceback (UnicodeEncodeError); a NUL PostgreSQL
    refuses alike."""
    with pytest.raises(UnknownClient, match="holds a NUL or bytes that are not UTF-8"):
        parse_client(text)
    for command in ("throttle_inspect", "throttle_reset"):
        with pytest.raises(CommandError, match=r"^Unknown client: .* not UTF-8"):
            run(command, text)


def test_the_operate_howto_examples_are_read(policy: Any) -> None:
    """Every client ``docs/howto/operate.md`` gives in its command examples."""
    ApiKey.objects.create(name="docs", prefix="ab12cd34", tier=policy["free"])
    User.objects.create_user("carol", id=42)
    text = (Path(__file__).parent.parent / "docs/howto/operate.md").read_text()
    examples = re.findall(r"throttle_inspect ([^ \n#]+)(?:\s+# or ([^\n]+))?", text)
    clients = {first for first, _rest in examples}
    clients |= {c.strip() for _first, rest in examples for c in rest.split(",") if rest}
    assert {"alice", "user:42", "key:dt_ab12cd34", "203.0.113.9"} <= clients
    for client_text in clients:
        parse_client(client_text)


def test_a_digest_label_with_the_backend_down_is_an_error_not_a_500(
    policy: Any, settings: Any
) -> None:
    """A ``username:#<digest>`` label is looked up in the usage counts, which need the
    backend: a dead one is said in a line, on each page and in the command."""
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"
    label = "username:#0123456789abcdef"
    admin = admin_client()

    inspected = admin.get(INSPECT, {"client": label})
    confirm = admin.get(f"{INSPECT}reset/", {"client": label}, follow=True)
    posted = admin.post(f"{INSPECT}reset/", {"client": label}, follow=True)

    assert inspected.status_code == confirm.status_code == posted.status_code == 200
    assert "The backend could not be read" in inspected.content.decode()
    assert "The backend could not be read" in confirm.content.decode()
    assert "The backend could not reset" in posted.content.decode()
    with pytest.raises(CommandError, match="Could not read the buckets from the backend"):
        run("throttle_inspect", label)


@pytest.mark.parametrize("kind", ["user", "username"])
def test_a_name_that_ends_like_a_label_names_its_own_client(
    client: Any, backend: Any, policy: Any, kind: str
) -> None:
    """A username chosen to end like a bracketed label, ``mallory (user:<pk>)``: the label
    ``user:<that name>`` (or ``username:<that name>``) names its own client, never the one in
    the brackets (whose counters a reset would clear)."""
    victim = policy["alice"]
    name = f"mallory (user:{victim.pk})"
    mallory = User.objects.create_user(name, password="pw")

    found = parse_client(f"{kind}:{name}")

    assert victim.pk != mallory.pk
    expected = f"user:{mallory.pk}" if kind == "user" else f"username:{name}"
    assert found.client == expected
    assert as_json("throttle_inspect", f"{kind}:{name}")["client"] == expected
    if kind == "user":  # the tools' title, "user <name> (user:<pk>)", names it by its pk
        assert parse_client(f"{found.label} ({found.client})").client == expected


FULL_WIDTH_BOB = "\uff42\uff4f\uff42"


@pytest.mark.parametrize(
    "typed", [FULL_WIDTH_BOB, f"user:{FULL_WIDTH_BOB}", f"user {FULL_WIDTH_BOB}"]
)
def test_a_username_is_found_as_its_user_typed_it(
    client: Any, backend: Any, policy: Any, typed: str
) -> None:
    """Django stores and signs in a username NFKC-normalised (the full-width bob signs in as
    ``bob``): the tools find the user by the name as typed at sign-up, as they find a
    ``username:`` login counter by it."""
    bob = User.objects.create_user(FULL_WIDTH_BOB, password="pw")
    assert bob.get_username() == "bob"

    assert parse_client(typed).client == f"user:{bob.pk}"
    assert as_json("throttle_inspect", typed)["client"] == f"user:{bob.pk}"
    response = admin_client().get(INSPECT, {"client": typed})
    assert "Unknown client" not in response.content.decode()
