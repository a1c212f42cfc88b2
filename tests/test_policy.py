"""The compiled policy: tiers, assignments, zero queries when warm, edits seen within the
refresh interval, bad rows skipped (never a 500), whole-segment paths, failure modes,
recompiling after the max age. Assignment details are in test_user_tiers.py.

The policy's clock is a fake moved by hand wherever a test depends on the refresh interval:
no sleeps, no wall-clock deadlines."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from django_throttle.backends import get_backend
from django_throttle.backends import redis_nodes as breaker_module
from django_throttle.identity import Identity
from django_throttle.models import EndpointLimit, EndpointRule, TierAssignment, TierLimit
from django_throttle.policy import live as policy
from tests.factories import check_constraints_off, endpoint, tier

pytestmark = pytest.mark.django_db


def test_user_assignment_beats_group_beats_default(django_user_model: type) -> None:
    free = tier("free", "10/m", is_default_authenticated=True)
    pro = tier("pro", "100/m", priority=1)
    team = tier("team", "50/m", priority=5)
    user = django_user_model.objects.create_user("u")
    ident = Identity("user", str(user.pk), user_id=user.pk)
    assert policy.current().tier_for(ident) == policy.current().tiers[free.pk]
    group_a, group_b = Group.objects.create(name="a"), Group.objects.create(name="b")
    TierAssignment.objects.create(group=group_a, tier=pro)
    TierAssignment.objects.create(group=group_b, tier=team)
    user.groups.add(group_a, group_b)
    assert policy.current().tier_for(ident).slug == "team"
    TierAssignment.objects.create(user=user, tier=pro)
    assert policy.current().tier_for(ident).slug == "pro"


def test_anonymous_gets_default_anonymous_tier() -> None:
    anon = tier("anonymous", "1/s", is_default_anonymous=True)
    assert policy.current().tier_for(Identity("ip", "1.2.3.4")).id == anon.pk


def test_zero_queries_per_request_once_warm(
    client: Client,
    django_user_model: type,
    django_assert_num_queries: object,
    settings: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 3600)
    tier("anonymous", "100/s", is_default_anonymous=True)
    tier("free", "100/s", "1000/d", is_default_authenticated=True)
    user = django_user_model.objects.create_user("u", password="pw")
    client.get("/api/ping/")  # warm the policy
    with django_assert_num_queries(0):  # type: ignore[operator]
        for _ in range(20):
            assert client.get("/api/ping/").status_code == 200
    # Authenticated, from the first request on: the tier was compiled with the policy.
    basic = {"HTTP_AUTHORIZATION": "Basic dTpwdw=="}  # u:pw
    with CaptureQueriesContext(connection) as ctx:
        for _ in range(20):
            assert client.get("/api/ping/", **basic)["X-RateLimit-Limit"] == "100"
    # Basic authentication itself loads the user (1 query per request); the throttle adds 0.
    assert len(ctx.captured_queries) == 20
    assert user.pk


@pytest.mark.parametrize("users", [0, 40])
def test_a_reload_runs_the_handful_of_queries_the_docs_say_whatever_the_users(
    django_user_model: type, users: int
) -> None:
    """docs/explanation/counting.md: "A reload is a fixed handful of queries per process (not
    per user): 8, whatever the number of users" (one query per model the snapshot holds: tier
    limits, tiers, endpoint limits, rules, assignments, API keys, exemptions, the service
    protection). The docs said 7 after the service protection had added its query."""
    from django_throttle.models import ApiKey, Exemption, Protection

    anonymous = tier("anonymous", "10/min", is_default_anonymous=True)
    pro = tier("pro", "100/min", is_default_authenticated=True)
    endpoint("export", "scope", "export", limits={anonymous: "5/min"})
    group = Group.objects.create(name="customers")
    TierAssignment.objects.create(group=group, tier=pro)
    for n in range(users):
        user = django_user_model.objects.create_user(f"user{n}")
        TierAssignment.objects.create(user=user, tier=pro)
        user.groups.add(group)
    Exemption.objects.create(network="198.51.100.0/24")
    ApiKey.objects.create_key(name="partner", tier=pro)
    Protection.objects.create(in_flight=10, lease=60)
    with CaptureQueriesContext(connection) as ctx:
        policy.compile_policy()
    # PostgreSQL sends an iterator()'s SELECT as "DECLARE … CURSOR FOR SELECT …".
    selects = [q["sql"] for q in ctx.captured_queries if "SELECT " in q["sql"]]
    assert len(selects) == 8, selects


def test_admin_edit_reaches_another_process_within_refresh_interval(
    client: Client,
    settings: object,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker that did not make the edit sees it once the shared version moves: at its
    next check, one refresh interval after the last."""
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 0.5)
    anon = tier("anonymous", "1/h", is_default_anonymous=True)
    assert [client.get("/api/ping/").status_code for _ in range(2)] == [200, 429]
    # Simulate another process's edit: change the row without this process's signals...
    TierLimit.objects.filter(tier=anon).update(rate="100/h")
    assert client.get("/api/ping/").status_code == 429
    # ...then publish it the way the admin's save does.
    get_backend().bump_policy_version()
    clock.now += 0.49
    assert client.get("/api/ping/").status_code == 429  # not checked again yet
    clock.now += 0.01
    response = client.get("/api/ping/")
    assert response.status_code == 200
    assert response["X-RateLimit-Limit"] == "100"


def test_admin_save_bumps_the_shared_version(
    admin_client: Client, django_capture_on_commit_callbacks: object
) -> None:
    before = get_backend().get_policy_version()
    with django_capture_on_commit_callbacks(execute=True):  # type: ignore[operator]
        response = admin_client.post(
            "/admin/django_throttle/tier/add/",
            {
                "slug": "gold",
                "name": "Gold",
                "priority": 0,
                "load_factor": 100,
                "min_factor": 10,
                "limits-TOTAL_FORMS": "1",
                "limits-INITIAL_FORMS": "0",
                "limits-MIN_NUM_FORMS": "0",
                "limits-MAX_NUM_FORMS": "1000",
                "limits-0-rate": "10/s",
                "limits-0-algorithm": "token_bucket",
            },
        )
    assert response.status_code == 302
    assert get_backend().get_policy_version() != before


def test_policy_load_failure_does_not_break_requests(
    client: Client, monkeypatch: pytest.MonkeyPatch, settings: object, clock: FakeClock
) -> None:
    """An unreadable database lets requests through, and is retried once per refresh
    interval, not on every request."""
    from django.db import DatabaseError

    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 3600)
    tier("anonymous", "1/h", is_default_anonymous=True)
    attempts: list[object] = []
    real_compile = policy.compile_policy

    def broken(version: object = None) -> object:
        attempts.append(version)
        raise DatabaseError("no such table")

    monkeypatch.setattr(policy, "compile_policy", broken)
    assert [client.get("/api/ping/").status_code for _ in range(3)] == [200, 200, 200]
    assert len(attempts) == 1
    # The database is back: the next refresh loads the real policy.
    monkeypatch.setattr(policy, "compile_policy", real_compile)
    clock.now += 3600
    assert [client.get("/api/ping/").status_code for _ in range(2)] == [200, 429]


def test_a_database_not_migrated_yet_is_named_with_its_fix(tmp_path: Path) -> None:
    """A newcomer who added the app but did not run ``migrate`` had every request served
    unlimited and read "throttle policy could not be loaded: no such table:
    django_throttle_tierlimit"; the line now ends with the command to run."""
    script = (
        "import logging, sys\n"
        "import django\n"
        "from django.conf import settings\n"
        "settings.configure(INSTALLED_APPS=['django.contrib.contenttypes', "
        "'django.contrib.auth', 'django_throttle'], DJANGO_THROTTLE_REDIS_URL='memory://', "
        f"DATABASES={{'default': {{'ENGINE': 'django.db.backends.sqlite3', "
        f"'NAME': {str(tmp_path / 'fresh.sqlite3')!r}}}}})\n"
        "django.setup()\n"
        "logging.basicConfig(stream=sys.stdout, format='%(message)s')\n"
        "from django_throttle.policy import live\n"
        "print('loaded:', live.current().loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines()[-1] == "loaded: False", done.stdout + done.stderr
    [line] = [line for line in done.stdout.splitlines() if "could not be loaded" in line]
    assert line.startswith("throttle policy could not be loaded: no such table: django_throttle")
    assert line.endswith("(the django_throttle tables do not exist: run 'manage.py migrate')"), line


def test_a_database_error_on_migrated_tables_names_no_migration(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The migrate hint is given only when the tables are really missing, not for any
    database error (a lost connection, a lock)."""
    from django.db import DatabaseError

    def broken(version: object = None) -> object:
        raise DatabaseError("server closed the connection")

    monkeypatch.setattr(policy, "compile_policy", broken)
    policy.invalidate()
    with caplog.at_level(logging.ERROR, logger="django_throttle"):
        policy.current()
    assert [r.getMessage() for r in caplog.records if "could not be loaded" in r.getMessage()] == [
        "throttle policy could not be loaded: server closed the connection"
    ]


def test_last_good_policy_survives_a_failed_reload(
    client: Client, monkeypatch: pytest.MonkeyPatch, settings: object, clock: FakeClock
) -> None:
    from django.db import DatabaseError

    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 1)
    tier("anonymous", "1/h", is_default_anonymous=True)
    assert client.get("/api/ping/").status_code == 200

    def broken(version: object = None) -> object:
        raise DatabaseError("server closed the connection")

    monkeypatch.setattr(policy, "compile_policy", broken)
    get_backend().bump_policy_version()
    clock.now += 1
    assert client.get("/api/ping/").status_code == 429


def test_a_local_edit_that_cannot_be_compiled_keeps_the_last_policy(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This process's own edit recompiles at once; if the database fails right then, the
    last good snapshot stays in force (not the unlimited stand-in)."""
    from django.db import DatabaseError

    tier("anonymous", "1/h", is_default_anonymous=True)
    assert client.get("/api/ping/").status_code == 200

    def broken(version: object = None) -> object:
        raise DatabaseError("server closed the connection")

    monkeypatch.setattr(policy, "compile_policy", broken)
    policy.invalidate()
    assert client.get("/api/ping/").status_code == 429


def test_a_failed_query_leaves_the_callers_transaction_usable(
    monkeypatch: pytest.MonkeyPatch, django_user_model: type
) -> None:
    """Compiling inside a request's transaction (ATOMIC_REQUESTS) runs in a savepoint."""
    from django.db import DatabaseError

    def broken(priorities: object) -> object:
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")
        return None

    monkeypatch.setattr(policy, "compile_user_tiers", broken)
    with pytest.raises(DatabaseError):
        policy.compile_policy()
    assert django_user_model.objects.count() == 0  # the transaction still answers


# Defect 1: a bad row is skipped, logged once per compile, and never breaks a request ---------


def skipped_rows(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "django_throttle.policy" and r.levelno == logging.ERROR
    ]


BAD_LIMIT_VALUES = [
    ({"rate": "10/x"}, "rate", "unknown period unit 'x'"),
    ({"rate": "10/month"}, "algorithm", "months vary in length; choose the calendar quota"),
    ({"algorithm": "leaky"}, "algorithm", "unknown algorithm 'leaky'"),
    ({"algorithm": "fixed_window", "burst": 20}, "burst", "leave the burst empty"),
    ({"algorithm": "calendar_quota", "rate": "10/h"}, "rate", "counts per day, week"),
    (
        {"algorithm": "calendar_quota", "rate": "10/d", "timezone": "Mars/Base"},
        "timezone",
        "unknown time zone",
    ),
    ({"timezone": "UTC"}, "timezone", "only a calendar quota has a time zone"),
    ({"algorithm": "sliding_window_log", "rate": "20000/h"}, "algorithm", "window counter"),
    ({"algorithm": "gcra", "rate": "15000/s"}, "algorithm", "use the token bucket"),
    ({"rate": "1/d", "burst": 1_000_000}, "burst", "lower the burst"),
    ({"burst": 0}, "burst", "burst must be between 1 and"),
]


@pytest.mark.parametrize(("values", "field", "says"), BAD_LIMIT_VALUES)
def test_a_bad_tier_limit_is_skipped_with_one_error(
    caplog: pytest.LogCaptureFixture, values: dict[str, object], field: str, says: str
) -> None:
    free = tier("free", "10/m", "1000/d")
    bad = TierLimit.objects.create(tier=free, rate="5/s")
    with check_constraints_off():
        TierLimit.objects.filter(pk=bad.pk).update(**values)

    with caplog.at_level(logging.ERROR, logger="django_throttle.policy"):
        compiled = policy.compile_policy()

    assert [str(limit.rate) for limit in compiled.tiers[free.pk].limits] == ["10/m", "1000/d"]
    [line] = skipped_rows(caplog)
    assert f"TierLimit pk={bad.pk}" in line
    assert f"{field}: " in line
    assert says in line


@pytest.mark.parametrize(("values", "field", "says"), BAD_LIMIT_VALUES)
def test_a_bad_endpoint_limit_drops_only_that_limit(
    caplog: pytest.LogCaptureFixture, values: dict[str, object], field: str, says: str
) -> None:
    free = tier("free", "100/m")
    rule = endpoint("export", "scope", "export", limits={free: "10/m"})
    bad = EndpointLimit.objects.create(rule=rule, tier=free, rate="1/s")
    with check_constraints_off():
        EndpointLimit.objects.filter(pk=bad.pk).update(**values)

    with caplog.at_level(logging.ERROR, logger="django_throttle.policy"):
        compiled = policy.compile_policy()

    limits = compiled.limits_for(compiled.tiers[free.pk], compiled.match("POST", "export"))
    assert [str(limit.rate) for limit in limits] == ["100/m", "10/m"]
    [line] = skipped_rows(caplog)
    assert f"EndpointLimit pk={bad.pk}" in line
    assert says in line


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"cost": 0}, "cost"),
        ({"cost": 2_000_000_000}, "cost"),
        ({"methods": "GET,FETCH"}, "methods"),
        ({"match_type": "regex"}, "match_type"),
        ({"failure_mode": "sideways"}, "failure_mode"),
        ({"match_type": "path", "pattern": "api/"}, "pattern"),
    ],
)
def test_a_bad_rule_is_skipped(
    caplog: pytest.LogCaptureFixture, values: dict[str, object], field: str
) -> None:
    free = tier("free", "100/m")
    good = endpoint("search", "scope", "search", limits={free: "10/m"})
    bad = endpoint("export", "scope", "export", limits={free: "1/m"})
    with check_constraints_off():
        EndpointRule.objects.filter(pk=bad.pk).update(**values)

    with caplog.at_level(logging.ERROR, logger="django_throttle.policy"):
        compiled = policy.compile_policy()

    assert [rule.id for rules in compiled.by_scope.values() for rule in rules] == [good.pk]
    assert compiled.by_path == ()
    assert compiled.by_route == {}
    [line] = skipped_rows(caplog)
    assert f"EndpointRule pk={bad.pk}" in line
    assert f"{field}: " in line


def test_a_tier_with_a_bad_failure_mode_keeps_its_limits(caplog: pytest.LogCaptureFixture) -> None:
    free = tier("free", "10/m", failure_mode="closed")
    Tier = type(free)
    Tier.objects.filter(pk=free.pk).update(failure_mode="sideways")
    with caplog.at_level(logging.ERROR, logger="django_throttle.policy"):
        compiled = policy.compile_policy()
    assert [str(limit.rate) for limit in compiled.tiers[free.pk].limits] == ["10/m"]
    assert compiled.tiers[free.pk].failure_mode == ""
    assert len(skipped_rows(caplog)) == 1


def make_anonymous_policy_with_a_bad_row() -> None:
    anon = tier("anonymous", "2/h", is_default_anonymous=True)
    bad = TierLimit.objects.create(tier=anon, rate="1/h")
    rule = endpoint("ping", "route", "ping", limits={anon: "1/h"})
    bad_endpoint = EndpointLimit.objects.create(rule=rule, tier=anon, rate="5/h")
    TierLimit.objects.filter(pk=bad.pk).update(rate="10/month")
    EndpointLimit.objects.filter(pk=bad_endpoint.pk).update(algorithm="unknown")


def test_bad_rows_never_500_on_first_compile(client: Client) -> None:
    """A freshly started process: the first request compiles a policy with bad rows."""
    make_anonymous_policy_with_a_bad_row()
    policy.reset()
    # The remaining endpoint limit (1/h) decides; the bad 1/h tier limit is skipped.
    assert [client.get("/api/ping/").status_code for _ in range(3)] == [200, 429, 429]


def test_bad_rows_never_500_after_a_version_bump(
    client: Client,
    settings: object,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A running process whose next reload meets bad rows keeps answering 200/429."""
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 1)
    tier("anonymous", "3/h", is_default_anonymous=True)
    assert client.get("/api/ping/").status_code == 200
    make_bad = TierLimit.objects.create(tier=TierLimit.objects.get().tier, rate="1/h")
    TierLimit.objects.filter(pk=make_bad.pk).update(algorithm="bogus")
    get_backend().bump_policy_version()
    clock.now += 1
    assert [client.get("/api/ping/").status_code for _ in range(3)] == [200, 200, 429]


def test_an_unexpected_compile_error_keeps_the_last_policy(
    client: Client, monkeypatch: pytest.MonkeyPatch, settings: object, clock: FakeClock
) -> None:
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 1)
    tier("anonymous", "1/h", is_default_anonymous=True)
    assert client.get("/api/ping/").status_code == 200

    def broken(version: object = None) -> object:
        raise ValueError("a bug")

    monkeypatch.setattr(policy, "compile_policy", broken)
    get_backend().bump_policy_version()
    clock.now += 1
    assert client.get("/api/ping/").status_code == 429
    policy.reset()
    assert client.get("/api/ping/").status_code == 200  # nothing to keep: unlimited, no 500


# Defect 9: path rules match whole segments ------------------------------------------------


def test_path_rules_match_whole_segments() -> None:
    pi = endpoint("pi", "path", "/api/pi")
    api = endpoint("api", "path", "/api/")
    root = endpoint("root", "path", "/")
    compiled = policy.compile_policy()

    def rule_for(path: str) -> int | None:
        rule = compiled.match("GET", path=path)
        return None if rule is None else rule.id

    assert rule_for("/api/pi") == pi.pk
    assert rule_for("/api/pi/") == pi.pk
    assert rule_for("/api/pi/digits") == pi.pk
    assert rule_for("/api/pizza/") == api.pk
    assert rule_for("/api/pi.json") == api.pk
    assert rule_for("/api/") == api.pk
    assert rule_for("/api") == root.pk  # "/api/" covers what is below it, not "/api"
    assert rule_for("/apixyz") == root.pk


# Failure modes per tier and rule ----------------------------------------------------------


def test_failure_mode_is_the_rules_else_the_tiers_else_the_setting(settings: object) -> None:
    settings.DJANGO_THROTTLE_FAILURE_MODE = "open"  # type: ignore[attr-defined]
    free = tier("free", "10/m")
    strict = tier("strict", "10/m", failure_mode="local")
    endpoint("login", "scope", "login", limits={free: "5/m"})
    EndpointRule.objects.filter(name="login").update(failure_mode="closed")
    endpoint("search", "scope", "search")
    compiled = policy.compile_policy()
    login, search = compiled.match("POST", "login"), compiled.match("GET", "search")
    plain, local = compiled.tiers[free.pk], compiled.tiers[strict.pk]

    assert compiled.failure_mode_for(plain, login) == "closed"
    assert compiled.failure_mode_for(local, login) == "closed"
    assert compiled.failure_mode_for(local, search) == "local"
    assert compiled.failure_mode_for(local, None) == "local"
    assert compiled.failure_mode_for(plain, search) == "open"
    assert compiled.failure_mode_for(None, None) == "open"
    settings.DJANGO_THROTTLE_FAILURE_MODE = "closed"  # type: ignore[attr-defined]
    assert compiled.failure_mode_for(plain, None) == "closed"
    assert compiled.failure_mode_for(plain, search, credential=True) == "closed"


def test_a_credential_check_counts_locally_where_the_setting_would_open(settings: object) -> None:
    """Password guessing is never served uncounted by the setting's "open"; a rule or tier
    that names a mode gets it."""
    settings.DJANGO_THROTTLE_FAILURE_MODE = "open"  # type: ignore[attr-defined]
    free = tier("free", "10/m")
    endpoint("login", "scope", "login", limits={free: "5/m"})
    endpoint("token", "scope", "token", limits={free: "5/m"})
    EndpointRule.objects.filter(name="token").update(failure_mode="closed")
    compiled = policy.compile_policy()
    login, token = compiled.match("POST", "login"), compiled.match("POST", "token")
    plain = compiled.tiers[free.pk]
    assert compiled.failure_mode_for(plain, login, credential=True) == "local"
    assert compiled.failure_mode_for(plain, token, credential=True) == "closed"
    assert compiled.failure_mode_for(plain, login) == "open"
    settings.DJANGO_THROTTLE_FAILURE_MODE = "local"  # type: ignore[attr-defined]
    assert compiled.failure_mode_for(plain, login, credential=True) == "local"


# Changes no signal sees apply after policy.MAX_AGE -----------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(policy, "clock", fake)
    return fake


def test_a_queryset_update_applies_after_the_max_age(
    client: Client,
    clock: FakeClock,
    settings: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 1)
    monkeypatch.setattr(policy, "MAX_AGE", 120)
    anon = tier("anonymous", "1/h", is_default_anonymous=True)
    assert [client.get("/api/ping/").status_code for _ in range(2)] == [200, 429]
    TierLimit.objects.filter(tier=anon).update(rate="100/h")  # no signal, no bump
    clock.now += 119
    assert client.get("/api/ping/").status_code == 429
    clock.now += 1
    assert client.get("/api/ping/")["X-RateLimit-Limit"] == "100"


def test_the_max_age_is_checked_once_per_refresh_interval(
    clock: FakeClock,
    settings: object,
    django_assert_num_queries: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 10)
    monkeypatch.setattr(policy, "MAX_AGE", 5)
    first = policy.current()
    clock.now += 9
    with django_assert_num_queries(0):  # type: ignore[operator]
        assert policy.current() is first
    clock.now += 1
    assert policy.current() is not first


# The version check goes through the circuit breaker ----------------------------------------


def test_an_open_breaker_keeps_the_policy_and_logs_nothing_per_request(
    settings: object,
    caplog: pytest.LogCaptureFixture,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_throttle.backends import BackendError
    from django_throttle.backends.redis_nodes import get_breaker

    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 0.001)
    monkeypatch.setattr(breaker_module, "COOLDOWN", 3600)
    tier("anonymous", "2/h", is_default_anonymous=True)
    warm = policy.current()
    breaker = get_breaker()

    def down() -> None:
        raise BackendError("connection refused")

    for _ in range(breaker.threshold):
        with pytest.raises(BackendError):
            breaker.call(down)
    assert breaker.state == "open"
    get_backend().bump_policy_version()  # unseen while open: the check is not even tried
    short_circuited = breaker.short_circuited
    with caplog.at_level(logging.DEBUG, logger="django_throttle.policy"):
        for _ in range(5):
            clock.now += 0.002
            assert policy.current() is warm
    assert [r for r in caplog.records if r.name == "django_throttle.policy"] == []
    assert breaker.short_circuited == short_circuited + 5


def test_an_edit_after_redis_restarted_empty_reaches_a_worker_holding_the_same_count(
    client: Client,
    settings: object,
    clock: FakeClock,
    _pausable_redis: object,
) -> None:
    """The shared version was a counter from 1: Redis restarted empty (or the key lost), the
    next edit set it to 1 again, and a worker that last read 1 before the restart (idle
    meanwhile) saw no change: it kept the old policy until its snapshot was five minutes old.
    Each bump moves the version by a random step now, so no count repeats."""
    from django_throttle.backends import BackendError
    from tests.redis_servers import RedisServer

    server = _pausable_redis
    assert isinstance(server, RedisServer)
    settings.DJANGO_THROTTLE_REDIS_URL = server.url  # type: ignore[attr-defined]
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}  # type: ignore[attr-defined]
    anon = tier("anonymous", "1/h", is_default_anonymous=True)
    get_backend().bump_policy_version()
    assert [client.get("/api/ping/").status_code for _ in range(2)] == [200, 429]

    server.restart()  # empty: the version key is gone
    # Another process's edit once Redis is back (its first call may meet the old connection).
    TierLimit.objects.filter(tier=anon).update(rate="100/h")
    for _ in range(3):
        try:
            get_backend().bump_policy_version()
            break
        except BackendError:
            continue
    breaker_module.reset_breaker()
    clock.now += policy.REFRESH_INTERVAL

    response = client.get("/api/ping/")
    assert response.status_code == 200
    assert response["X-RateLimit-Limit"] == "100"


def test_an_unpublished_edit_reaches_a_worker_that_compiled_while_redis_was_empty(
    client: Client, settings: object, clock: FakeClock, _pausable_redis: object
) -> None:
    """A worker compiled while Redis held no policy version (never bumped, or restarted
    empty); another process saved an edit while Redis was down, could not publish it and
    exited; Redis restarted empty. The worker read no version again, took that for its own
    snapshot's, and kept the old policy until the snapshot was five minutes old. A check that
    finds no version now publishes one, so every process recompiles once."""
    from tests.redis_servers import RedisServer

    server = _pausable_redis
    assert isinstance(server, RedisServer)
    settings.DJANGO_THROTTLE_REDIS_URL = server.url  # type: ignore[attr-defined]
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}  # type: ignore[attr-defined]
    server.client().flushall()
    anon = tier("anonymous", "1/h", is_default_anonymous=True)
    assert [client.get("/api/ping/").status_code for _ in range(2)] == [200, 429]

    server.kill()
    TierLimit.objects.filter(tier=anon).update(rate="100/h")  # saved, never published
    server.restart()  # empty
    breaker_module.reset_breaker()
    for _ in range(3):  # the first calls may meet the old connections
        clock.now += policy.REFRESH_INTERVAL
        response = client.get("/api/ping/")
    assert response.status_code == 200
    assert response["X-RateLimit-Limit"] == "100"


@pytest.mark.parametrize("outage", ["refuse", "blackhole"])
def test_an_unpublished_edit_reaches_a_worker_that_compiled_while_redis_was_unreachable(
    client: Client, settings: object, clock: FakeClock, _pausable_redis: object, outage: str
) -> None:
    """A worker recompiled during an outage (its snapshot five minutes old) and labelled the
    new snapshot with the version it last read; another process saved an edit, could not
    publish it and exited; Redis came back with that version, so the worker kept its
    snapshot, without the edit, five minutes more. A snapshot compiled while the version
    could not be read is recompiled once at the first check Redis answers."""
    from tests.faultproxy import FaultProxy
    from tests.redis_servers import RedisServer

    server = _pausable_redis
    assert isinstance(server, RedisServer)
    with FaultProxy(server.port) as proxy:
        settings.DJANGO_THROTTLE_REDIS_URL = proxy.url  # type: ignore[attr-defined]
        settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}  # type: ignore[attr-defined]
        anon = tier("anonymous", "1/h", is_default_anonymous=True)
        get_backend().bump_policy_version()
        assert [client.get("/api/ping/").status_code for _ in range(2)] == [200, 429]

        proxy.set_mode(outage)
        clock.now += policy.MAX_AGE
        assert client.get("/api/ping/")["X-RateLimit-Degraded"] == "local"  # recompiled
        TierLimit.objects.filter(tier=anon).update(rate="100/h")  # saved, never published
        proxy.set_mode("pass")
        breaker_module.reset_breaker()
        for _ in range(3):
            clock.now += policy.REFRESH_INTERVAL
            response = client.get("/api/ping/")
        assert response.status_code == 200
        assert response["X-RateLimit-Limit"] == "100"


def test_an_edit_saved_during_an_outage_by_a_process_that_exited_reaches_a_worker_that_compiled_before(  # noqa: E501
    client: Client,
    settings: object,
    clock: FakeClock,
    _pausable_redis: object,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: object,
) -> None:
    """A worker compiled before Redis went down; during the outage another process saved an
    edit, could not publish it and exited; Redis came back with its data, the version
    unchanged, so the worker kept its snapshot, without the edit, up to five minutes. The
    failed publish is recorded in the database now, and the first check Redis answers after
    the worker met the outage reads that record (one query) and publishes it."""
    from django_throttle import signals
    from tests.redis_servers import RedisServer

    server = _pausable_redis
    assert isinstance(server, RedisServer)
    server.ensure_healthy()
    settings.DJANGO_THROTTLE_REDIS_URL = server.url  # type: ignore[attr-defined]
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}  # type: ignore[attr-defined]
    monkeypatch.setattr(breaker_module, "COOLDOWN", 0.05)
    anon = tier("anonymous", "1/h", is_default_anonymous=True)
    get_backend().bump_policy_version()
    assert [client.get("/api/ping/").status_code for _ in range(2)] == [200, 429]
    worker = policy._cache

    server.kill(keep_data=True)
    for _ in range(3):  # the worker meets the outage, and keeps its snapshot
        clock.now += policy.REFRESH_INTERVAL
        assert client.get("/api/ping/")["X-RateLimit-Degraded"] == "local"
    # Another process (a snapshot cache of its own) saves an edit it cannot publish, and exits.
    monkeypatch.setattr(policy, "_cache", policy._Cache())
    limit = TierLimit.objects.get(tier=anon)
    limit.rate = "100/h"
    with django_capture_on_commit_callbacks(execute=True):  # type: ignore[operator]
        limit.save()
    assert signals.unpublished.get() is not None
    monkeypatch.setattr(policy, "_cache", worker)

    server.restart()  # with its data: the version the worker read before the outage
    deadline = time.monotonic() + 10
    while True:
        clock.now += policy.REFRESH_INTERVAL
        response = client.get("/api/ping/")
        if "X-RateLimit-Degraded" not in response or time.monotonic() > deadline:
            break
        time.sleep(0.06)  # past the breaker's cooldown: the next call probes
    assert "X-RateLimit-Degraded" not in response
    assert response.status_code == 200
    assert response["X-RateLimit-Limit"] == "100"


def test_an_edit_saved_during_an_outage_reaches_a_worker_idle_through_it(
    client: Client,
    settings: object,
    clock: FakeClock,
    _pausable_redis: object,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: object,
) -> None:
    """A worker compiled before Redis went down and got no request during the outage (it
    never met it); another process saved an edit, could not publish it and exited; Redis
    came back with its data. The worker's first check read the unchanged version and kept
    its snapshot, without the edit, up to five minutes. A check after a quiet spell (two
    refresh intervals without one) reads the database's record once: the edit applies at
    the worker's first request once Redis answers."""
    from tests.redis_servers import RedisServer

    server = _pausable_redis
    assert isinstance(server, RedisServer)
    server.ensure_healthy()
    settings.DJANGO_THROTTLE_REDIS_URL = server.url  # type: ignore[attr-defined]
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}  # type: ignore[attr-defined]
    anon = tier("anonymous", "1/h", is_default_anonymous=True)
    get_backend().bump_policy_version()
    assert [client.get("/api/ping/").status_code for _ in range(2)] == [200, 429]
    worker = policy._cache

    server.kill(keep_data=True)  # the worker makes no call meanwhile
    monkeypatch.setattr(policy, "_cache", policy._Cache())  # another process, which exits
    limit = TierLimit.objects.get(tier=anon)
    limit.rate = "100/h"
    with django_capture_on_commit_callbacks(execute=True):  # type: ignore[operator]
        limit.save()
    monkeypatch.setattr(policy, "_cache", worker)
    server.restart()  # with its data: the version the worker read before the outage

    clock.now += policy.QUIET_INTERVALS * policy.REFRESH_INTERVAL
    response = client.get("/api/ping/")
    deadline = time.monotonic() + 5
    while "X-RateLimit-Degraded" in response and time.monotonic() < deadline:
        # This test's two "processes" share one circuit breaker: the other's two failed calls
        # and a connection the restart broke can open it (seen on a loaded machine); a worker
        # with a breaker of its own meets Redis at once. Wait for its probe.
        time.sleep(0.2)
        clock.now += policy.REFRESH_INTERVAL
        response = client.get("/api/ping/")
    assert "X-RateLimit-Degraded" not in response
    assert response.status_code == 200
    assert response["X-RateLimit-Limit"] == "100"


def test_steady_traffic_costs_no_query_though_its_checks_may_read_the_record(
    client: Client, clock: FakeClock, django_assert_num_queries: object
) -> None:
    """Requests a tenth of a second apart, 10 s of them (10 version checks): no query; the
    record of unpublished changes is read only after a quiet spell (one query, in a
    savepoint inside the test's transaction)."""
    tier("anonymous", "100000/h", is_default_anonymous=True)
    client.get("/api/ping/")  # warm the policy
    with django_assert_num_queries(0):  # type: ignore[operator]
        for _ in range(100):
            clock.now += policy.REFRESH_INTERVAL / 10
            assert client.get("/api/ping/").status_code == 200
    clock.now += policy.QUIET_INTERVALS * policy.REFRESH_INTERVAL
    with CaptureQueriesContext(connection) as quiet:
        assert client.get("/api/ping/").status_code == 200
    reads = [q["sql"] for q in quiet.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(reads) == 1 and "unpublished" in reads[0].lower(), reads
    with django_assert_num_queries(0):  # type: ignore[operator]
        for _ in range(100):
            clock.now += policy.REFRESH_INTERVAL / 10
            assert client.get("/api/ping/").status_code == 200
