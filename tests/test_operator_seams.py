"""The operator tools at their seams: ``throttle_inspect``, ``throttle_explain``,
``throttle_reset`` and the admin's inspector see, explain and clear every counter a request
meets (by client, by IP address, by username, shared ceilings), on Redis and in memory, for
odd identities too (long, unicode, rich markup), and refuse an in-process backend from the
command line."""

from __future__ import annotations

import base64
import io
import itertools
import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from django_throttle.models import EndpointLimit, EndpointRule, TierLimit
from tests.factories import tier, with_shards

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.seams_urls")]

TOKEN = "/api/login-token/"
HOME = "127.0.0.1"


@pytest.fixture
def login_policy(db: Any) -> dict[str, Any]:
    """The demo's policy: an anonymous tier, and rule "login" counting failed attempts, 5 a
    minute per IP address and 10 an hour per username (for the anonymous tier)."""
    anon = tier("anonymous", "60/min", is_default_anonymous=True)
    tier("free", "100/min", is_default_authenticated=True)
    rule = EndpointRule.objects.create(
        name="login", match_type="scope", pattern="login", counts=EndpointRule.Counts.FAILURES
    )
    by_ip = EndpointLimit.objects.create(rule=rule, tier=anon, rate="5/min", counted_by="ip")
    by_name = EndpointLimit.objects.create(rule=rule, tier=anon, rate="10/h", counted_by="username")
    alice = User.objects.create_user("alice", password="alice")
    return {"anon": anon, "by_ip": by_ip, "by_name": by_name, "alice": alice}


def run(command: str, *args: str) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def as_json(command: str, *args: str) -> Any:
    return json.loads(run(command, *args, "--format", "json"))


def guess(client: Any, username: str = "alice", address: str = HOME) -> Any:
    return client.post(TOKEN, {"username": username, "password": "wrong"}, REMOTE_ADDR=address)


def retry_after(response: Any) -> int:
    assert response.status_code == 429
    return int(response.headers["Retry-After"])


def lock_out(client: Any) -> Any:
    """The README's wrong-password loop: five 400s, then the 429 of the rule by IP."""
    statuses = [guess(client).status_code for _ in range(5)]
    assert statuses == [400] * 5
    denied = guess(client)
    assert denied.json()["limit"] == "login (anonymous) 5/min"
    return denied


# --- item 9: inspect and explain see counters by IP and by username ---------------------------


def test_explain_gives_the_servers_429_and_retry_after_after_the_password_loop(
    client: Any, backend: Any, login_policy: Any
) -> None:
    before = retry_after(lock_out(client))

    found = as_json("throttle_explain", "--ip", HOME, "--method", "POST", "--path", TOKEN)

    after = retry_after(guess(client))
    assert found["next_request"].startswith("denied (429) by login (anonymous) 5/min")
    assert before >= found["retry_after"] >= after  # the server's Retry-After, as time runs
    assert found["rule"] == "login"
    assert found["checks"] == ["protect_credentials (scope 'login')"]
    assert {(row["id"], row["remaining"]) for row in found["rows"]} == {
        (f"e{login_policy['by_ip'].pk}", 0)
    }
    assert found["notes"] == ["rule 'login' also counts by username: give the username to see it"]


def test_explain_with_a_username_shows_its_counter_and_the_longest_wait(
    client: Any, backend: Any, login_policy: Any
) -> None:
    """Ten guesses at alice from ten addresses lock the username: explained from a fresh
    address, the username counter denies (30 min for a token), never "allowed"."""
    for n in range(10):
        assert guess(client, address=f"198.51.100.{n}").status_code == 400
    denied = guess(client, address="198.51.100.99")
    assert denied.json()["limit"] == "login (anonymous) 10/h"

    found = as_json(
        "throttle_explain",
        "--ip",
        "198.51.100.99",
        "--username",
        "alice",
        "--method",
        "POST",
        "--path",
        TOKEN,
    )

    assert found["next_request"].startswith("denied (429) by login (anonymous) 10/h")
    later = retry_after(guess(client, address="198.51.100.99"))
    assert retry_after(denied) >= found["retry_after"] >= later
    counted = {row["counted_by"]: row["remaining"] for row in found["rows"]}
    assert counted == {"this client": 5, "username alice": 0}
    assert found["notes"] == []


def test_inspect_lists_the_login_counters_by_ip_and_by_username(
    client: Any, backend: Any, login_policy: Any
) -> None:
    lock_out(client)

    by_ip = as_json("throttle_inspect", HOME)
    of_alice = as_json("throttle_inspect", "user:alice")

    rows = {(row["from"], row["id"]): row["remaining"] for row in by_ip["rows"]}
    assert rows[("rule 'login'", f"e{login_policy['by_ip'].pk}")] == 0
    assert rows[("tier 'anonymous'", f"t{login_policy['anon'].limits.get().pk}")] == 60
    username = next(row for row in of_alice["rows"] if row["counted_by"] == "username alice")
    assert (username["id"], username["remaining"]) == (f"e{login_policy['by_name'].pk}", 5)


# --- item 10: reset lifts a login lockout, never a shared ceiling -----------------------------


def test_reset_of_the_address_lifts_the_login_lockout(
    client: Any, backend: Any, login_policy: Any
) -> None:
    lock_out(client)

    out = run("throttle_reset", HOME)

    assert "login (anonymous) 5/min" in out
    assert guess(client).status_code == 400


def test_reset_of_one_login_limit_by_its_id(client: Any, backend: Any, login_policy: Any) -> None:
    lock_out(client)
    limit_id = f"e{login_policy['by_ip'].pk}"

    found = as_json("throttle_reset", HOME, "--limit", limit_id)

    assert found["reset"] == 1 and found["rows"][0]["id"] == limit_id
    assert guess(client).status_code == 400


def test_reset_of_a_user_clears_its_username_counter(
    client: Any, backend: Any, login_policy: Any
) -> None:
    for n in range(10):
        guess(client, address=f"198.51.100.{n}")
    assert guess(client, address="198.51.100.99").status_code == 429

    found = as_json("throttle_reset", "user:alice")

    assert "username alice" in {row["counted_by"] for row in found["rows"]}
    assert guess(client, address="198.51.100.99").status_code == 400


@pytest.fixture(params=["redis", "memory"])
def one_shard(request: pytest.FixtureRequest, settings: Any) -> None:
    """One key shard, so a shared limit is one ceiling over every client."""
    from django_throttle import backends

    if request.param == "memory":
        settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    settings.DJANGO_THROTTLE_REDIS_URL = with_shards(settings.DJANGO_THROTTLE_REDIS_URL, 1)
    backends.reset_backend_cache()


def test_resetting_a_client_leaves_the_shared_ceiling(client: Any, one_shard: None) -> None:
    anon = tier("anonymous", "100/min", is_default_anonymous=True)
    ceiling = TierLimit.objects.create(tier=anon, rate="3/min", shared=True)
    for _ in range(3):
        assert client.get("/api/ping/", REMOTE_ADDR="203.0.113.1").status_code == 200
    assert client.get("/api/ping/", REMOTE_ADDR="203.0.113.2").status_code == 429

    inspected = as_json("throttle_inspect", "203.0.113.1")
    reset = as_json("throttle_reset", "203.0.113.1")

    shared = next(row for row in inspected["rows"] if row["shared"])
    assert (shared["id"], shared["remaining"]) == (f"t{ceiling.pk}", 0)
    # Everyone's counter, not this client's: resetting the client leaves it.
    assert shared["counted_by"] == "every client"
    assert f"t{ceiling.pk}" not in {row["id"] for row in reset["rows"]}
    assert client.get("/api/ping/", REMOTE_ADDR="203.0.113.2").status_code == 429
    with pytest.raises(CommandError, match="shared ceiling"):
        run("throttle_reset", "203.0.113.1", "--limit", f"t{ceiling.pk}")

    assert as_json("throttle_reset", "--ceiling", f"t{ceiling.pk}")["ceilings"] == 1

    assert client.get("/api/ping/", REMOTE_ADDR="203.0.113.2").status_code == 200
    with pytest.raises(CommandError, match="not a shared limit: nope"):
        run("throttle_reset", "--ceiling", "nope")


# --- the admin's inspector ----------------------------------------------------------------


def test_the_admin_inspector_explains_and_resets_the_login_lockout(
    client: Any, backend: Any, login_policy: Any
) -> None:
    from django.test import Client

    lock_out(client)
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    page = "/admin/django_throttle/usagecount/inspect/"

    html = admin.get(
        page, {"client": HOME, "method": "POST", "path": TOKEN, "username": "alice"}
    ).content.decode()

    assert "denied (429) by login (anonymous) 5/min" in html
    assert 'data-counted-by="username alice"' in html
    confirm = admin.get(f"{page}reset/", {"client": HOME}).content.decode()
    assert "login (anonymous) 5/min" in confirm
    admin.post(f"{page}reset/", {"client": HOME})
    assert guess(client).status_code == 400


# --- item 11: an in-process backend, from the command line ---------------------------------


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("throttle_inspect", ["alice"]),
        ("throttle_reset", ["alice"]),
        ("throttle_explain", ["--user", "alice", "--path", TOKEN]),
    ],
)
def test_the_command_line_refuses_an_in_process_backend(
    settings: Any, login_policy: Any, capsys: Any, command: str, argv: list[str]
) -> None:
    """``manage.py throttle_inspect`` in a second terminal with ``MemoryBackend``: its own
    process serves no requests, so it says so in one line and exits 1 (no full buckets, no
    "Reset 3 bucket(s)" that reset nothing)."""
    from django.core.management import load_command_class

    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    # --skip-checks: the system checks' own report (this test project's URLconf guards scopes
    # the policy has no rule for, W014) is not the command's error.
    argv = ["manage.py", command, *argv, "--skip-checks"]
    with pytest.raises(SystemExit) as exited:
        load_command_class("django_throttle", command).run_from_argv(argv)

    assert exited.value.code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    error = captured.err.strip()
    assert len(error.splitlines()) == 1
    assert "MemoryBackend" in error and "serves no requests" in error


def test_the_command_line_reads_a_shared_redis(login_policy: Any, capsys: Any) -> None:
    from django.core.management import load_command_class

    load_command_class("django_throttle", "throttle_inspect").run_from_argv(
        ["manage.py", "throttle_inspect", "alice", "--format", "json"]
    )

    assert json.loads(capsys.readouterr().out)["client"] == f"user:{login_policy['alice'].pk}"


def squeezed(text: str) -> str:
    return "".join(text.split())


def column(table: str, heading: str) -> list[str]:
    """The cells of one column of a rich table, each put back together from the lines it
    was folded over (a continuation line has an empty "Id" cell), without whitespace."""
    head = [line.strip().strip("┃").split("┃") for line in table.splitlines() if line[:1] == "┃"]
    rows = [line.strip().strip("│").split("│") for line in table.splitlines() if line[:1] == "│"]
    # A narrow column folds its heading too ("Counted" over "by"): join each over its lines.
    headings = ["".join(squeezed(line[n]) for line in head) for n in range(len(head[0]))]
    index, id_index = headings.index(squeezed(heading)), headings.index("Id")
    cells: list[str] = []
    for parts in rows:
        if parts[id_index].strip() or not cells:
            cells.append("")
        cells[-1] += squeezed(parts[index])
    return cells


# --- odd identities: long, unicode, markup ------------------------------------------------

ODD_NAMES = ["zoë_日本語", "[bold]mallory[/bold]", "[/x]", "[link=https://evil.example]x[/link]"]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_odd_usernames_are_inspected_reset_and_shown_as_typed(
    client: Any, backend: Any, login_policy: Any, name: str
) -> None:
    """A unicode username, and usernames that are rich markup (broken, or a hyperlink):
    their counters are seen and cleared, and the table shows them as typed."""
    User.objects.create_user(name, password="pw")
    for n in range(10):
        guess(client, username=name, address=f"198.51.100.{n}")
    assert guess(client, username=name, address="198.51.100.99").status_code == 429

    table = run("throttle_inspect", f"user:{name}")
    inspected = as_json("throttle_inspect", f"user:{name}")
    explained = run(
        "throttle_explain",
        *("--ip", "198.51.100.99", "--username", name),
        *("--method", "POST", "--path", TOKEN),
    )
    reset = as_json("throttle_reset", f"user:{name}")

    assert f"user {name}" in table  # the title as typed: no markup applied, no MarkupError
    assert squeezed(f"username {name}") in column(table, "Counted by")
    assert f"username {name}" in {row["counted_by"] for row in inspected["rows"]}
    assert "denied (429) by login (anonymous) 10/h" in explained
    assert squeezed(f"username {name}") in column(explained, "Counted by")
    assert f"username {name}" in {row["counted_by"] for row in reset["rows"]}
    assert guess(client, username=name, address="198.51.100.99").status_code == 400


def test_control_characters_never_reach_the_terminal(
    client: Any, backend: Any, login_policy: Any
) -> None:
    name = "eve\x1b]8;;https://evil.example\x07\r\nroot"
    for fmt in ("table", "csv"):
        out = run(
            "throttle_explain",
            *("--ip", HOME, "--username", name, "--method", "POST", "--path", TOKEN),
            *("--format", fmt),
        )
        assert not {"\x1b", "\x07", "\r"} & set(out)
        if fmt == "csv":
            assert "username eve\\x1b]8;;https://evil.example\\x07\\r\\nroot" in out


def test_a_300_character_username_is_explained_and_reset(
    client: Any, backend: Any, login_policy: Any
) -> None:
    """A username far longer than a counter label may be (its label is a digest) is seen by
    explain and cleared by reset, on both backends."""
    name = "a" * 300
    for n in range(10):
        guess(client, username=name, address=f"198.51.100.{n}")
    assert guess(client, username=name, address="198.51.100.99").status_code == 429

    found = as_json(
        "throttle_explain",
        "--ip",
        "198.51.100.99",
        "--username",
        name,
        "--method",
        "POST",
        "--path",
        TOKEN,
    )
    assert found["next_request"].startswith("denied (429) by login (anonymous) 10/h")
    run("throttle_reset", "198.51.100.99", "--username", name)
    assert guess(client, username=name, address="198.51.100.99").status_code == 400


# --- the backends: refilling a ceiling in every shard -------------------------------------


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra", "sliding_window_log"])
def test_reset_shared_refills_every_shard_and_nothing_else(
    settings: Any, algorithm: str, backend: Any
) -> None:
    """``reset_shared`` is the ceiling's own reset: every key shard's state of the shared
    limit goes (16 shards, a Cluster's default), a client's own limit stays."""
    from django_throttle.backends import get_backend
    from django_throttle.backends.base import shard_of
    from django_throttle.conf import app_settings
    from django_throttle.rates import Limit

    settings.DJANGO_THROTTLE_REDIS_URL = with_shards(settings.DJANGO_THROTTLE_REDIS_URL, 16)
    backend = get_backend()  # rebuilt with 16 shards
    shards = app_settings.key_shards
    ceiling = Limit.build("c1", "64/m", algorithm=algorithm, shared=True)
    own = Limit.build("o1", "5/m", algorithm=algorithm)
    by_shard: dict[int, str] = {}
    for n in range(10_000):
        by_shard.setdefault(
            shard_of(f"ip:10.0.{n // 256}.{n % 256}", shards), f"ip:10.0.{n // 256}.{n % 256}"
        )
        if len(by_shard) == shards:
            break
    for client in by_shard.values():
        assert backend.hit(client, [ceiling, own], 4).allowed

    backend.reset_shared([ceiling, own])

    for client in by_shard.values():
        assert backend.peek(client, [ceiling]).remaining == 4  # the shard's whole share
        assert backend.peek(client, [own]).remaining == 1


def test_explain_sees_the_protected_basic_authentication_check(
    client: Any, backend: Any, login_policy: Any
) -> None:
    """Wrong Basic passwords to a DRF view are counted by rule "authentication" before the
    password is checked; explained with the username, the next one is the server's 429."""
    rule = EndpointRule.objects.create(
        name="authentication",
        match_type="scope",
        pattern="authentication",
        counts=EndpointRule.Counts.FAILURES,
    )
    EndpointLimit.objects.create(
        rule=rule, tier=login_policy["anon"], rate="3/min", counted_by="username"
    )
    wrong = "Basic " + base64.b64encode(b"alice:wrong").decode()
    statuses = [
        client.get("/api/basic-ping/", HTTP_AUTHORIZATION=wrong).status_code for _ in range(4)
    ]
    assert statuses == [401, 401, 401, 429]

    found = as_json(
        "throttle_explain",
        *("--ip", HOME, "--username", "alice", "--path", "/api/basic-ping/"),
    )

    assert found["checks"][0] == "ProtectedBasicAuthentication (scope 'authentication')"
    assert found["next_request"].startswith("denied (429) by authentication (anonymous) 3/min")


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("throttle_explain", ["--user", "alice", "--ip", "nope", "--path", TOKEN]),
        ("throttle_inspect", ["alice", "--ip", "nope"]),
        ("throttle_reset", ["alice", "--ip", "nope"]),
        ("throttle_reset", ["alice", "--ceiling", "t1"]),
        ("throttle_reset", []),
        ("throttle_explain", ["--user", "alice", "--client", "ip:1.2.3.4", "--path", TOKEN]),
    ],
)
def test_bad_probe_arguments_get_one_line_errors(
    backend: Any, login_policy: Any, command: str, args: list[str]
) -> None:
    with pytest.raises(CommandError) as error:
        run(command, *args)
    assert "\n" not in str(error.value)


def test_the_admin_resets_a_client_but_not_its_ceiling_and_the_ceiling_on_its_own(
    client: Any, one_shard: None
) -> None:
    from django.contrib.admin.models import LogEntry
    from django.test import Client

    anon = tier("anonymous", "100/min", is_default_anonymous=True)
    ceiling = TierLimit.objects.create(tier=anon, rate="3/min", shared=True)
    for _ in range(3):
        client.get("/api/ping/", REMOTE_ADDR="203.0.113.1")
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    page = "/admin/django_throttle/usagecount/inspect/"

    html = admin.get(page, {"client": "203.0.113.1"}).content.decode()
    admin.post(f"{page}reset/", {"client": "203.0.113.1"})

    assert 'data-shared="yes"' in html and "dt-reset-ceiling" in html
    assert client.get("/api/ping/", REMOTE_ADDR="203.0.113.2").status_code == 429
    confirm = admin.get(f"{page}reset/", {"ceiling": f"t{ceiling.pk}"}).content.decode()
    assert "in every key shard" in confirm
    admin.post(f"{page}reset/", {"ceiling": f"t{ceiling.pk}", "client": "203.0.113.1"})
    assert client.get("/api/ping/", REMOTE_ADDR="203.0.113.2").status_code == 200
    assert LogEntry.objects.filter(change_message__contains="in every key shard").exists()


def test_explain_says_when_a_matching_rule_counts_nothing(backend: Any, login_policy: Any) -> None:
    """The login rule has limits for the anonymous tier only (78bbfa0's request path then
    counts nothing for a signed-in user posting to it): explain says so rather than only
    "no limit applies"."""
    found = as_json("throttle_explain", "--user", "alice", "--method", "POST", "--path", TOKEN)
    if found["rows"]:  # the request path counts the login rule for every tier
        assert found["rule"] == "login"
    else:
        assert found["notes"] == [
            "rule 'login' matches protect_credentials (scope 'login') but counts nothing for "
            "this client (no limits for its tier, or it is exempt)"
        ]


# --- the class of bug: explain predicts the next request, for every kind of counter --------

WRONG_BASIC = "Basic " + base64.b64encode(b"alice:wrong").decode()
#: A fresh address for each guess of the username scenario (198.51.100.250 is explained).
ADDRESSES = itertools.count()


@pytest.mark.parametrize(
    ("scenario", "send", "explain_args"),
    [
        (
            "tier limit",
            lambda c: c.get("/api/ping/", REMOTE_ADDR="203.0.113.5"),
            ["--ip", "203.0.113.5", "--path", "/api/ping/"],
        ),
        (
            "rule by client, cost 2",
            lambda c: c.post("/api/export/", REMOTE_ADDR="203.0.113.5"),
            ["--ip", "203.0.113.5", "--method", "POST", "--path", "/api/export/"],
        ),
        (
            "login counted by IP",
            # A new username each time: only the address's counter fills (a username's meets
            # the authentication rule's 3/h too, which explain sees only when named).
            lambda c: guess(c, username=f"nobody{next(ADDRESSES)}", address="203.0.113.5"),
            ["--ip", "203.0.113.5", "--method", "POST", "--path", TOKEN],
        ),
        (
            "login counted by username",
            lambda c: guess(c, address=f"198.51.100.{next(ADDRESSES)}"),
            ["--ip", "198.51.100.250", "--username", "alice", "--method", "POST", "--path", TOKEN],
        ),
        (
            "Basic authentication by username",
            lambda c: c.get("/api/basic-ping/", HTTP_AUTHORIZATION=WRONG_BASIC),
            ["--ip", HOME, "--username", "alice", "--path", "/api/basic-ping/"],
        ),
    ],
)
def test_explain_predicts_every_next_request(
    client: Any, backend: Any, login_policy: Any, scenario: str, send: Any, explain_args: Any
) -> None:
    """Request after request, explain's verdict is the next request's: allowed (whatever
    the view then answers) or 429 by the same limit. Hourly limits: nothing refills while
    the test runs, however slow the machine."""
    anon = login_policy["anon"]
    anon.limits.update(rate="6/h")
    rule = EndpointRule.objects.create(name="export", match_type="scope", pattern="export")
    EndpointLimit.objects.create(rule=rule, tier=anon, rate="5/h")
    rule.cost = 2
    rule.save()
    auth = EndpointRule.objects.create(
        name="authentication",
        match_type="scope",
        pattern="authentication",
        counts=EndpointRule.Counts.FAILURES,
    )
    EndpointLimit.objects.create(rule=auth, tier=anon, rate="3/h", counted_by="username")
    EndpointLimit.objects.filter(pk=login_policy["by_ip"].pk).update(rate="4/h")
    EndpointLimit.objects.filter(pk=login_policy["by_name"].pk).update(rate="5/h")
    outcomes = []
    for _ in range(8):
        predicted = as_json("throttle_explain", *explain_args)
        response = send(client)
        denied = response.status_code == 429
        outcomes.append(denied)
        assert predicted["next_request"].startswith("denied") == denied, (scenario, outcomes)
        if denied:
            assert predicted["next_request"].startswith(
                f"denied (429) by {response.json()['limit']};"
            )
            assert predicted["retry_after"] >= int(response.headers["Retry-After"])
    assert outcomes[-1], f"{scenario}: never limited in 8 requests"


def test_an_address_counter_filled_by_signed_in_users_is_inspected_and_reset(
    client: Any, backend: Any, login_policy: Any
) -> None:
    """Signed-in users of the default tier guessing at the login from one address fill its
    counter by IP (under their tier's limit): inspecting and resetting the address see it."""
    from django_throttle.models import Tier

    free = Tier.objects.get(slug="free")
    rule = EndpointRule.objects.get(name="login")
    by_ip = EndpointLimit.objects.create(rule=rule, tier=free, rate="2/h", counted_by="ip")
    client.force_login(User.objects.create_user("carol", password="pw"))
    assert [guess(client, "bob").status_code for _ in range(3)][-1] == 429

    rows = as_json("throttle_inspect", HOME)["rows"]
    reset = as_json("throttle_reset", HOME)

    row = next(row for row in rows if row["id"] == f"e{by_ip.pk}")
    # Counted under every caller's tier (a credential rule's counters by IP protect the
    # server), so the address's own counter: "this client" when inspecting the address.
    assert (row["counted_by"], row["remaining"]) == ("this client", 0)
    assert f"e{by_ip.pk}" in {row["id"] for row in reset["rows"]}
    assert guess(client, "bob").status_code == 400


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["throttle_inspect"], "the following arguments are required: client"),
        (["throttle_inspect", "alice", "--format", "xml"], "argument --format: invalid choice"),
        (["throttle_explain", "--path", "/x", "--method"], "argument --method: expected one"),
        (["throttle_reset", "alice", "--nope"], "unrecognized arguments: --nope"),
        (["throttle_usage", "--by", "minute"], "argument --by: invalid choice"),
        (["throttle_adapt", "--step"], "argument --step: expected one argument"),
        (["throttle_policy"], "the following arguments are required: ACTION"),
        (["throttle_policy", "export", "--format", "xml"], "argument --format: invalid choice"),
        (["throttle_policy", "import"], "the following arguments are required: file"),
    ],
)
def test_a_command_line_argparse_refuses_is_one_line_with_status_1(
    argv: list[str], says: str, capsys: Any
) -> None:
    """An option argparse refuses is one line, ``CommandError: …``, exit status 1, as the
    commands reference and troubleshooting page say of every command error (it was
    argparse's usage text, several lines, then the error, with exit status 2)."""
    from django.core.management import load_command_class

    with pytest.raises(SystemExit) as exited:
        load_command_class("django_throttle", argv[0]).run_from_argv(["manage.py", *argv])

    assert exited.value.code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("CommandError: ") and says in line
    assert line.endswith(" --help).")
