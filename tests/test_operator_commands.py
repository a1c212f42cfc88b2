"""``throttle_inspect``, ``throttle_explain`` and ``throttle_reset`` as an operator runs them,
on Redis and in memory: the tier and why, bucket states read without consuming, the decision a
request would get, clearing one client, and clear errors."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command

from django_throttle.models import ApiKey, EndpointLimit, TierAssignment, TierLimit
from django_throttle.rates import Rate, rate_text
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db


@pytest.fixture
def policy(db: Any) -> dict[str, Any]:
    anon = tier("anonymous", "5/min", is_default_anonymous=True)
    free = tier("free", "100/min", is_default_authenticated=True)
    pro = tier("pro", "1000/min")
    endpoint("export", "scope", "export", cost=2, limits={anon: "4/h", free: "10/h", pro: "50/h"})
    alice = User.objects.create_user("alice", password="pw")
    bob = User.objects.create_user("bob", password="pw")
    partners = Group.objects.create(name="partners")
    bob.groups.add(partners)
    TierAssignment.objects.create(user=alice, tier=pro)
    TierAssignment.objects.create(group=partners, tier=pro)
    return {"anon": anon, "free": free, "pro": pro, "alice": alice, "bob": bob}


def run(command: str, *args: str) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def as_json(command: str, *args: str) -> Any:
    return json.loads(run(command, *args, "--format", "json"))


def test_inspect_says_the_tier_and_why(backend: Any, policy: Any) -> None:
    assert as_json("throttle_inspect", "alice")["reason"] == "assigned to 'pro' directly"
    assert as_json("throttle_inspect", "user:bob")["reason"] == (
        "member of group 'partners', assigned to 'pro'"
    )
    carol = User.objects.create_user("carol")
    found = as_json("throttle_inspect", f"user:{carol.pk}")
    assert (found["tier"], found["reason"]) == (
        "free",
        "the default tier for authenticated users ('free')",
    )
    found = as_json("throttle_inspect", "203.0.113.9")
    assert (found["client"], found["tier"]) == ("ip:203.0.113.9", "anonymous")


def test_inspect_reads_bucket_state_without_consuming(
    client: Any, backend: Any, policy: Any
) -> None:
    for _ in range(3):
        assert client.get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code == 200

    first = as_json("throttle_inspect", "ip:203.0.113.9")
    second = as_json("throttle_inspect", "ip:203.0.113.9")

    tier_row = next(row for row in first["rows"] if row["from"] == "tier 'anonymous'")
    assert (tier_row["capacity"], tier_row["remaining"]) == (5, 2)
    # Looking consumed nothing (only the clock moved).
    assert [row["remaining"] for row in first["rows"]] == [r["remaining"] for r in second["rows"]]
    rule_row = next(row for row in first["rows"] if row["from"] == "rule 'export'")
    assert rule_row["remaining"] == 4  # untouched


def test_a_table_says_when_a_bucket_is_whole_again_in_words(
    client: Any, backend: Any, policy: Any
) -> None:
    """The table writes the wait as the admin does ("30 min", not "1,800" seconds); JSON keeps
    the number of seconds for scripts."""
    assert client.post("/api/export/", REMOTE_ADDR="203.0.113.9").status_code == 202
    rows = as_json("throttle_inspect", "ip:203.0.113.9")["rows"]
    rule_row = next(row for row in rows if row["from"] == "rule 'export'")
    assert 1795 < rule_row["reset_seconds"] <= 1800  # 2 of 4 an hour taken
    for command, args in [
        ("throttle_inspect", ["ip:203.0.113.9"]),
        ("throttle_explain", ["--ip", "203.0.113.9", "--method", "POST", "--path", "/api/export/"]),
    ]:
        table = run(command, *args)
        assert "Whole again in" in table and "(s)" not in table
        assert re.search(r"\b30 min\b", table), table
        assert "1,79" not in table and "1,800" not in table


def test_ipv6_addresses_are_inspected_by_network(backend: Any, policy: Any) -> None:
    assert as_json("throttle_inspect", "2001:db8:1:2::7")["client"] == "ip:2001:db8:1:2::/64"


def test_an_api_key_is_inspected_by_prefix_or_whole_key(backend: Any, policy: Any) -> None:
    row, key = ApiKey.objects.create_key(name="ci", tier=policy["pro"])

    by_key = as_json("throttle_inspect", key)
    by_prefix = as_json("throttle_inspect", f"key:{row.prefix}")

    assert by_key["client"] == by_prefix["client"] == f"key:{row.prefix}"
    assert by_key["reason"] == "the API key's own tier ('pro')"


def test_explain_names_rule_limits_cost_and_the_next_decision(
    client: Any, backend: Any, policy: Any
) -> None:
    found = as_json(
        "throttle_explain", "--ip", "203.0.113.9", "--method", "POST", "--path", "/api/export/"
    )

    assert (found["rule"], found["scope"], found["cost"], found["tier"]) == (
        "export",
        "export",
        2,
        "anonymous",
    )
    assert found["next_request"] == "allowed"
    assert {row["from"] for row in found["rows"]} == {"rule 'export'", "tier 'anonymous'"}

    statuses = [
        client.post("/api/export/", REMOTE_ADDR="203.0.113.9").status_code for _ in range(3)
    ]
    assert statuses == [202, 202, 429]  # 4/h at cost 2

    found = as_json(
        "throttle_explain", "--ip", "203.0.113.9", "--method", "POST", "--path", "/api/export/"
    )
    assert found["next_request"].startswith("denied (429) by export (anonymous) 4/h")


def test_explain_says_how_long_a_delaying_limit_would_hold_the_next_request(
    client: Any, backend: Any, policy: Any
) -> None:
    from django_throttle.models import EndpointLimit

    ping = endpoint("ping", "route", "ping")
    EndpointLimit.objects.create(
        rule=ping,
        tier=policy["anon"],
        rate="1/min",
        burst=3,
        algorithm="gcra",
        delay=0,
        max_wait=300,
    )
    assert client.get("/api/ping/", REMOTE_ADDR="203.0.113.44").status_code == 200

    found = as_json("throttle_explain", "--ip", "203.0.113.44", "--path", "/api/ping/")

    words = found["next_request"].split()
    assert words[:3] == ["allowed", "after", "waiting"] and 55 < float(words[3]) <= 60
    assert found["next_request"].endswith("s for its turn (a delaying limit)")


@pytest.mark.parametrize(
    ("path", "count"), [("/hello/", 5), ("/hello-async/", 2), ("/cbv/", 1), ("/cbv-a/", 1)]
)
def test_explain_shows_the_inline_limit_of_a_throttle_decorated_view(
    client: Any, backend: Any, policy: Any, path: str, count: int
) -> None:
    """``@throttle(rate=…)`` counts its own limit, not the tier's: explain showed the
    anonymous tier's bucket and "allowed" for a view that was refusing."""
    tier_limit = policy["anon"].limits.get()
    tier_limit.rate, tier_limit.burst = "2/s", 10  # unlike the views' own limits
    tier_limit.save()
    for _ in range(count - 1):
        assert client.get(path, REMOTE_ADDR="203.0.113.77").status_code == 200

    found = as_json("throttle_explain", "--ip", "203.0.113.77", "--path", path)

    assert [(row["capacity"], row["remaining"]) for row in found["rows"]] == [(count, 1)]
    assert found["rows"][0]["from"] == "the view's @throttle"
    assert found["next_request"] == "allowed"
    assert client.get(path, REMOTE_ADDR="203.0.113.77").status_code == 200
    found = as_json("throttle_explain", "--ip", "203.0.113.77", "--path", path)
    assert found["next_request"].startswith("denied (429)")
    assert client.get(path, REMOTE_ADDR="203.0.113.77").status_code == 429


@pytest.mark.parametrize(
    "written",
    [
        "/hello/?y=1",
        "/hello/#top",
        "http://example.com/hello/?y=1",
        "https://example.com:8443/hello/",
    ],
)
def test_explain_takes_the_path_of_a_url_without_its_query(
    backend: Any, policy: Any, written: str
) -> None:
    """``--path "/x?y=1"`` was explained with the query string in the path (a path no view
    answers), and ``--path http://example.com/x`` as ``/http://example.com/x``."""
    expected = as_json("throttle_explain", "--ip", "203.0.113.79", "--path", "/hello/")

    found = as_json("throttle_explain", "--ip", "203.0.113.79", "--path", written)

    assert (found["path"], found["route"]) == ("/hello/", expected["route"])
    assert found["route"] is not None
    assert found == expected


@pytest.mark.parametrize("path", ["/admin/", "/no/such/page/"])
def test_explain_says_nothing_limits_a_view_without_a_throttle(
    backend: Any, policy: Any, path: str
) -> None:
    """The admin's pages and a path no view answers meet no throttle: explain showed the
    anonymous tier's bucket as the counter they meet."""
    found = as_json("throttle_explain", "--ip", "203.0.113.78", "--path", path)

    assert found["rows"] == []
    assert found["next_request"] == "allowed: no limit applies"


def test_explain_as_a_table_reads_like_a_sentence(backend: Any, policy: Any) -> None:
    out = run("throttle_explain", "--user", "alice", "--path", "/api/ping/")
    assert "Tier reason: assigned to 'pro' directly" in out
    assert "Next request: allowed" in out
    assert "1000/m" in out


def test_explain_takes_the_client_as_inspect_and_reset_take_it(backend: Any, policy: Any) -> None:
    """``throttle_explain ip:203.0.113.9 --path …`` (the label ``throttle_inspect`` shows and
    takes, a bare address or username too) explains as ``--client`` does; a client named
    twice, or not at all, is one line saying how to name it."""
    by_option = as_json("throttle_explain", "--client", "user:alice", "--path", "/api/ping/")
    for label in ("user:alice", "alice"):
        found = as_json("throttle_explain", label, "--path", "/api/ping/")
        assert found == by_option
    by_address = as_json("throttle_explain", "203.0.113.9", "--path", "/api/ping/")
    assert by_address["client"] == "ip:203.0.113.9"
    assert as_json("throttle_explain", "--ip", "203.0.113.9", "--path", "/api/ping/") == (
        by_address
    )

    for args, words in (
        (("ip:203.0.113.9", "--user", "alice"), "Name the client once"),
        ((), "Name the client: as the first argument"),
    ):
        with pytest.raises(CommandError) as raised:
            call_command("throttle_explain", *args, "--path", "/api/ping/", stdout=io.StringIO())
        assert str(raised.value).startswith(words) and "\n" not in str(raised.value)


def test_reset_clears_one_clients_buckets_only(client: Any, backend: Any, policy: Any) -> None:
    for address in ("203.0.113.9", "203.0.113.10"):
        for _ in range(5):
            client.get("/api/ping/", REMOTE_ADDR=address)
    assert client.get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code == 429

    out = run("throttle_reset", "203.0.113.9")

    # The tier's counter held state; the export rule's, never met, held nothing.
    assert "Cleared 1 counter(s) of IP 203.0.113.9 (ip:203.0.113.9); 1 held nothing" in out
    assert client.get("/api/ping/", REMOTE_ADDR="203.0.113.9").status_code == 200
    assert client.get("/api/ping/", REMOTE_ADDR="203.0.113.10").status_code == 429


def test_reset_of_one_limit_and_unknown_limit_ids(client: Any, backend: Any, policy: Any) -> None:
    limit_id = f"t{policy['anon'].limits.get().pk}"
    found = as_json("throttle_reset", "203.0.113.9", "--limit", limit_id)
    assert (found["reset"], found["counters"], found["rows"][0]["id"]) == (0, 1, limit_id)
    with pytest.raises(CommandError, match=r"not a limit of IP 203\.0\.113\.9: nope"):
        run("throttle_reset", "203.0.113.9", "--limit", "nope")


@pytest.mark.parametrize(
    ("command", "args", "message"),
    [
        ("throttle_inspect", ["ghost"], "Unknown client: no user with the username or id 'ghost'"),
        ("throttle_inspect", ["ip:not-an-ip"], "'not-an-ip' is not an IP address"),
        ("throttle_inspect", ["key:zzz"], "no API key with the prefix 'zzz'"),
        ("throttle_reset", ["user:ghost"], "Unknown client"),
        ("throttle_explain", ["--user", "ghost", "--path", "/"], "Unknown client"),
        ("throttle_inspect", ["alice", "--format", "xml"], "invalid choice: 'xml'"),
        (
            "throttle_explain",
            ["--user", "alice", "--method", "FETCH", "--path", "/"],
            "--method 'FETCH' is not an HTTP method",
        ),
    ],
)
def test_bad_arguments_get_clear_errors(
    backend: Any, policy: Any, command: str, args: list[str], message: str
) -> None:
    with pytest.raises((CommandError, SystemExit)) as error:
        run(command, *args)
    if isinstance(error.value, CommandError):
        assert message in str(error.value)


@pytest.mark.parametrize(
    "command",
    [
        ("throttle_inspect", "alice"),
        ("throttle_inspect", "username:alice"),
        ("throttle_explain", "--user", "alice", "--path", "/api/ping/"),
        ("throttle_explain", "--path", "/api/ping/"),  # --ip names the client
        ("throttle_reset", "alice"),
        ("throttle_reset", "username:alice"),
    ],
    ids=" ".join,
)
@pytest.mark.parametrize("value", ["not-an-ip", "203.0.113.999", "<b>"])
def test_a_malformed_ip_option_is_a_one_line_error_naming_the_option(
    backend: Any, policy: Any, command: tuple[str, ...], value: str
) -> None:
    """The client is fine (or is the address), the ``--ip`` is not: the error names the
    option, as ``--region``'s does, never "Unknown client"."""
    with pytest.raises(CommandError) as raised:
        run(*command, "--ip", value)
    message = str(raised.value)
    assert message == f"--ip: {value!r} is not an IP address."


@pytest.mark.parametrize(
    "command",
    [
        ("throttle_inspect", "alice"),
        ("throttle_explain", "--user", "alice", "--path", "/api/ping/"),
        ("throttle_reset", "alice"),
        ("throttle_usage",),
        ("throttle_usage", "--rollup"),
        ("throttle_adapt", "--signal", "tests.test_adaptive.overloaded", "--once"),
        ("throttle_adapt", "--clear"),
    ],
    ids=" ".join,
)
def test_with_redis_unreachable_each_command_says_so_in_one_sentence(
    policy: Any, settings: Any, command: tuple[str, ...]
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    with pytest.raises(CommandError) as raised:
        run(*command)
    message = str(raised.value)
    assert "\n" not in message and "Connection refused" in message, message
    assert not message.endswith(".."), message


@pytest.mark.parametrize("outage", ["down", "hung"])
@pytest.mark.parametrize("target", [("alice",), ("--ceiling",)], ids=["client", "ceiling"])
def test_with_redis_unavailable_reset_says_redis_could_not_reset(
    policy: Any, settings: Any, request: Any, outage: str, target: tuple[str, ...]
) -> None:
    """Down or hung, ``throttle_reset`` said only "Could not reset the buckets: Timeout
    reading from 127.0.0.1:6379", naming neither Redis nor the backend; it names Redis."""
    if outage == "down":
        settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    else:
        request.getfixturevalue("hung_redis")
    if target == ("--ceiling",):
        ceiling = TierLimit.objects.create(tier=policy["pro"], rate="3/min", shared=True)
        target = ("--ceiling", f"t{ceiling.pk}")
    with pytest.raises(CommandError) as raised:
        run("throttle_reset", *target)
    message = str(raised.value)
    assert "\n" not in message
    assert re.match(r"Could not reset the (buckets|shared limits) in Redis: \w+Error", message)


def test_csv_has_a_header_row(backend: Any, policy: Any) -> None:
    out = run("throttle_inspect", "alice", "--format", "csv")
    assert out.splitlines()[0] == (
        "limit,id,from,counted_by,algorithm,capacity,remaining,reset_seconds,shared,shadow,in_flight"
    )


def test_no_info_line_before_a_commands_output(
    backend: Any, policy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A project that logs this package at INFO (as the example project does) saw "policy
    loaded (version N)" before every command's output: loading the policy is routine."""
    import logging

    from django_throttle.policy import live

    live.invalidate()
    caplog.set_level(logging.INFO, logger="django_throttle")

    run("throttle_inspect", "alice")

    assert live.last() is not None  # the command did load the policy
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []


@pytest.mark.parametrize("url", ["redis://:notaport", "foo://x", "redis+sentinel://"])
@pytest.mark.parametrize(
    "command",
    [
        ("throttle_inspect", "203.0.113.9"),
        ("throttle_explain", "--ip", "203.0.113.9", "--path", "/api/ping/"),
        ("throttle_reset", "203.0.113.9"),
        ("throttle_usage",),
    ],
    ids=lambda command: command[0],
)
def test_a_malformed_redis_url_is_a_one_line_error_naming_the_setting(
    settings: Any, policy: Any, command: tuple[str, ...], url: str
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = url
    with pytest.raises(CommandError) as raised:
        run(*command)
    message = str(raised.value)
    assert f"DJANGO_THROTTLE_REDIS_URL = {url!r} cannot be used: " in message
    assert "\n" not in message


def test_with_redis_down_inspect_shows_the_tier_and_limits_and_exits_3(
    policy: Any, settings: Any
) -> None:
    """Down, ``throttle_inspect`` refused outright, although the tier, why and the limits
    need no Redis: they are written, the counters unavailable (null, never 0), exit 3."""
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    out = io.StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("throttle_inspect", "alice", "--format", "json", stdout=out)

    assert raised.value.returncode == 3
    message = str(raised.value)
    assert "\n" not in message and "Connection refused" in message
    assert message.startswith("The live counters could not be read from Redis")
    found = json.loads(out.getvalue())
    assert (found["tier"], found["reason"]) == ("pro", "assigned to 'pro' directly")
    assert "Connection refused" in found["unread"]
    assert found["rows"] and {(r["remaining"], r["reset_seconds"]) for r in found["rows"]} == {
        (None, None)
    }

    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("throttle_inspect", "alice", stdout=out)
    assert "unavailable" in out.getvalue()


def test_with_redis_down_a_command_logs_no_warning_before_its_own_line(
    policy: Any, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A project logging this package at INFO saw two WARNING lines ("policy version check
    failed, keeping the current policy", "adaptive factors could not be read, keeping the
    last") before a command's one line: its first policy load keeps nothing, so warns of
    nothing. A process that keeps a snapshot because Redis failed still warns."""
    import logging

    from django_throttle.policy import live

    live.reset()
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    caplog.set_level(logging.INFO, logger="django_throttle")

    with pytest.raises(CommandError):
        run("throttle_inspect", "alice")

    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    live.invalidate()  # a server's reload, its snapshot kept
    live.current()
    assert any("keeping the current policy" in r.getMessage() for r in caplog.records)


def test_with_redis_down_explain_shows_checks_rule_limits_and_the_failure_mode_and_exits_3(
    policy: Any, settings: Any
) -> None:
    """Down, ``throttle_explain`` refused outright, although the checks, rule, tier, cost and
    limits need no Redis: they are written, the counters unavailable (null, never 0), the
    next request's fate the failure mode it meets (the rule's, else the tier's, else the
    setting's), exit 3 after writing, one line on stderr."""
    from django_throttle.models import EndpointRule

    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    args = ("--user", "alice", "--method", "POST", "--path", "/api/export/")
    out = io.StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("throttle_explain", *args, "--format", "json", stdout=out)

    assert raised.value.returncode == 3
    message = str(raised.value)
    assert "\n" not in message and "Connection refused" in message
    assert message.startswith("The live counters could not be read from Redis")
    found = json.loads(out.getvalue())
    assert (found["tier"], found["rule"], found["cost"]) == ("pro", "export", 2)
    assert found["checks"] == ["PolicyThrottle"]
    assert "Connection refused" in found["unread"]
    assert found["failure_mode"] == "local"  # the setting's default
    assert found["next_request"].endswith("local: counted in this process under the same limits")
    assert found["retry_after"] is None and found["denied_by"] is None
    assert {row["from"] for row in found["rows"]} == {"rule 'export'", "tier 'pro'"}
    assert {(r["remaining"], r["reset_seconds"]) for r in found["rows"]} == {(None, None)}

    rule = EndpointRule.objects.get(name="export")
    rule.failure_mode = "closed"  # the rule's wins
    rule.save()
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("throttle_explain", *args, stdout=out)
    table = out.getvalue()
    assert "closed: refused 503" in table and "unavailable" in table
    assert re.search(r"Failure mode: closed", table)


def explained_while_down() -> Any:
    """``throttle_explain --format json`` for alice's ``/api/ping/`` with Redis down: what it
    wrote before exiting with its one-line error."""
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command(
            "throttle_explain",
            "--user",
            "alice",
            "--path",
            "/api/ping/",
            "--format",
            "json",
            stdout=out,
        )
    return json.loads(out.getvalue())


def test_with_redis_down_explain_names_the_tiers_or_the_settings_failure_mode(
    policy: Any, settings: Any
) -> None:
    """Without a rule's mode, the tier's applies, else the setting's ("open": served
    uncounted), as the request path resolves it."""
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    settings.DJANGO_THROTTLE_FAILURE_MODE = "open"
    found = explained_while_down()
    assert found["failure_mode"] == "open"
    assert found["next_request"].endswith("open: served uncounted")

    policy["pro"].failure_mode = "local"
    policy["pro"].save()
    assert explained_while_down()["failure_mode"] == "local"


# --- what the tools say about the demo's policy (seed_demo) ------------------------------------


@pytest.fixture
def demo(db: Any) -> None:
    """The example project's policy: its tiers, rules (three credential rules counting
    failures alike) and service protection (20 requests in flight)."""
    from example_project.demo.management.commands.seed_demo import Command

    Command(stdout=io.StringIO()).handle()


def test_the_service_protection_inspect_calls_shared_is_a_ceiling_reset_refills(
    backend: Any, demo: None
) -> None:
    """throttle_inspect shows the fleet limit as shared; throttle_reset --ceiling fleet
    refilled nothing but answered "not a shared limit: fleet (shared limits: none)". It now
    frees every slot held, and says when none was."""
    from django_throttle.policy.live import current

    fleet = current().shedding.fleet["default"]  # type: ignore[union-attr]
    backend.hit("ip:203.0.113.9", [fleet])  # a request in flight
    (row,) = [r for r in as_json("throttle_inspect", "203.0.113.9")["rows"] if r["id"] == "fleet"]
    assert (row["shared"], row["in_flight"]) == (True, 1)

    done = as_json("throttle_reset", "--ceiling", "fleet")

    assert done["ceilings"] == 1 and done["rows"][0]["id"] == "fleet"
    (row,) = [r for r in as_json("throttle_inspect", "203.0.113.9")["rows"] if r["id"] == "fleet"]
    assert row["in_flight"] == 0
    assert run("throttle_reset", "--ceiling", "fleet").startswith("Nothing to reset")


def test_reset_says_how_many_counters_held_something_not_how_many_limits_apply(
    client: Any, backend: Any, demo: None
) -> None:
    """``throttle_reset username:root`` with no attempt said "Reset 1 bucket(s)": it
    counted the limits that apply, whole ones too."""
    assert run("throttle_reset", "username:root").startswith(
        "Nothing to reset for username root (username:root): none of its 1 counter(s) held"
    )
    assert as_json("throttle_reset", "username:root")["reset"] == 0

    client.get("/api/ping/", REMOTE_ADDR="203.0.113.9")  # the anonymous tier's counter
    done = as_json("throttle_reset", "203.0.113.9")

    assert done["reset"] == 1 and done["counters"] > 1
    assert [row["id"] for row in done["rows"] if row["cleared"]] == [
        f"t{TierLimit.objects.get(tier__slug='anonymous', regions='').pk}"
    ]
    assert "held nothing" in run("throttle_reset", "203.0.113.9")


def test_a_shared_failure_counter_has_one_name_in_every_tool(backend: Any, demo: None) -> None:
    """The demo's three credential rules write "10/h by username" alike: one counter, the
    login rule's (id e.g. e10). throttle_inspect called it "admin-login (anonymous) 10/h",
    explain "authentication (anonymous) 10/h" or "login" depending on the view. Now the
    owning row's name and rule everywhere."""
    login = EndpointLimit.objects.get(rule__name="login", counted_by="username")
    shown = set()
    for row in as_json("throttle_inspect", "203.0.113.9", "--username", "root")["rows"]:
        if row["id"] == f"e{login.pk}":
            shown.add((row["limit"], row["from"]))
    for scope in ("login", "admin-login", "authentication"):
        explained = as_json(
            "throttle_explain",
            *("--ip", "203.0.113.9", "--username", "root", "--method", "POST"),
            *("--path", "/api/token/", "--scope", scope),
        )
        for row in explained["rows"]:
            if row["id"] == f"e{login.pk}":
                shown.add((row["limit"], row["from"]))
    assert shown == {(f"login (anonymous) {rate_text(Rate.parse('10/h'))}", "rule 'login'")}


def test_the_admin_resets_the_service_protection_ceiling_and_says_what_a_reset_did(
    client: Any, backend: Any, demo: None
) -> None:
    """The inspector offered "reset for every client…" on the fleet row, and the page it led
    to answered "'fleet' is not a shared limit."; a client's reset said "Reset 1 bucket(s)"
    when nothing was held."""
    from django_throttle.policy.live import current

    admin_client = client
    admin_client.force_login(User.objects.create_superuser("operator", "op@example.com", "pw"))
    page = "/admin/django_throttle/usagecount/inspect/"
    backend.hit("ip:203.0.113.9", [current().shedding.fleet["default"]])  # type: ignore[union-attr]
    assert "ceiling=fleet" in admin_client.get(page, {"client": "203.0.113.9"}).content.decode()

    confirm = admin_client.get(f"{page}reset/", {"ceiling": "fleet"})
    done = admin_client.post(f"{page}reset/", {"ceiling": "fleet"}, follow=True)
    again = admin_client.post(f"{page}reset/", {"ceiling": "fleet"}, follow=True)
    nothing = admin_client.post(f"{page}reset/", {"client": "username:root"}, follow=True)

    assert confirm.status_code == 200 and "in every key shard" in confirm.content.decode()
    said = [[str(m) for m in r.context["messages"]] for r in (done, again, nothing)]
    assert said == [
        ["Reset the shared limit service protection for every client."],
        ["Nothing to reset: no key shard held state of the shared limit service protection."],
        ["Nothing to reset for username root: none of its 1 counter(s) held anything."],
    ]
