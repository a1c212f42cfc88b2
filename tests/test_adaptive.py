"""Adaptive limits (issue 33): a tier's load factor (the operator's, in the admin) scales its
limits when the policy compiles; the load controller (``manage.py throttle_adapt``) moves an
automatic factor per tier by AIMD from a load signal, lowest priority first, down to each
tier's floor, and back highest priority first. Real Redis (and the memory backend), real
database; the controller runs on an injected clock and signal sequence, never a sleep."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.test import AsyncClient, Client

from django_throttle.backends import get_backend
from django_throttle.backends.adaptive_store import AdaptiveStore, parse_factors
from django_throttle.checks import check_settings
from django_throttle.models import EndpointLimit, Tier, TierLimit
from django_throttle.policy import adaptive
from django_throttle.policy import live as policy
from django_throttle.policy.adaptive import Controller
from django_throttle.policy.scaling import scaled
from django_throttle.rates import Algorithm, Limit
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db

STEP = 10.0


class Signals:
    """A load signal playing back a sequence (then repeating its last value)."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def __call__(self) -> Any:
        value = self.values.pop(0) if len(self.values) > 1 else self.values[0]
        if isinstance(value, Exception):
            raise value
        return value


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = STEP) -> None:
        self.now += seconds


def overloaded() -> float:
    """A load signal for the command's tests: always overloaded."""
    return 2.0


def statuses(client: Client, path: str, count: int, **extra: str) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(count)]  # type: ignore[arg-type]


def admitted(client: Client, address: str, tries: int = 15) -> int:
    return statuses(client, "/api/ping/", tries, REMOTE_ADDR=address).count(200)


@pytest.fixture
def tiers() -> dict[str, Tier]:
    """free (priority 0, floor 10 %), pro (priority 10, floor 50 %), anonymous (priority 5,
    floor 100 %: never shrinks)."""
    return {
        "free": tier("free", "100/m", priority=0, min_factor=10),
        "pro": tier("pro", "100/m", priority=10, min_factor=50),
        "anon": tier("anon", "10/m", priority=5, min_factor=100, is_default_anonymous=True),
    }


@pytest.fixture
def clock() -> Clock:
    return Clock()


def controller(signal: Any, clock: Clock, **kwargs: Any) -> Controller:
    return Controller(signal=signal, step=STEP, clock=clock, **kwargs)


def run(control: Controller, clock: Clock, steps: int) -> list[str | None]:
    moved = []
    for _ in range(steps):
        clock.tick()
        result = control.run_once()
        assert result.acquired
        moved.append(result.moved)
    return moved


def factors() -> dict[int, float]:
    return AdaptiveStore(get_backend()).factors()


# The operator's factor ------------------------------------------------------------------


def test_operator_factor_halves_the_admitted_rate_through_drf() -> None:
    tier("anonymous", "10/m", is_default_anonymous=True, load_factor=50)
    client = Client()
    response = client.get("/api/ping/", REMOTE_ADDR="203.0.113.1")
    assert response["X-RateLimit-Limit"] == "5"
    assert admitted(client, "203.0.113.1") == 4  # 5 in all with the first
    assert admitted(client, "203.0.113.2") == 5


@pytest.mark.parametrize(("algorithm", "after"), [("token_bucket", [429]), ("gcra", [200, 429])])
def test_a_tightened_limit_carries_its_counter_on(algorithm: str, after: list[int]) -> None:
    """What the adaptive page promises: a client that had used 8 of 10 meets 5 at 50 % and
    is refused until it refills, no fresh burst. A GCRA limit keeps its use as time (8 s at
    1/s), which the halved limit reads as 4 of its 5: one more request, then refusals."""
    anonymous = tier("anonymous", is_default_anonymous=True)
    TierLimit.objects.create(tier=anonymous, rate="10/10s", algorithm=algorithm)
    client = Client(REMOTE_ADDR="203.0.113.3")
    assert [client.get("/api/ping/").status_code for _ in range(8)] == [200] * 8
    Tier.objects.filter(pk=anonymous.pk).update(load_factor=50)
    Tier.objects.get(pk=anonymous.pk).save()  # a save bumps the policy version
    policy.reset()
    answers = [client.get("/api/ping/") for _ in after]
    assert [answer.status_code for answer in answers] == after
    assert answers[-1]["X-RateLimit-Limit"] == "5"


def test_operator_factor_applies_on_the_async_path() -> None:
    anonymous = tier("anonymous", "10/m", is_default_anonymous=True, load_factor=30)
    endpoint("seam", "scope", "seam", limits={anonymous: "10/m"})
    policy.current()  # compiled here: the event loop's thread shares no SQLite transaction

    async def codes() -> list[int]:
        client = AsyncClient()
        return [(await client.get("/seams/view-async/")).status_code for _ in range(5)]

    # async_to_sync (not asyncio.run): any database read of the view runs on this thread.
    assert async_to_sync(codes)() == [200, 200, 200, 429, 429]


def test_scaled_limits_keep_their_ids_and_scale_burst_and_concurrency() -> None:
    row = tier("t", "10/s", burst=40, load_factor=25)
    rule = endpoint("r", "scope", "r", limits={row: "8/m"})
    EndpointLimit.objects.create(rule=rule, tier=row, rate="4/m", algorithm="concurrency")
    EndpointLimit.objects.create(rule=rule, tier=row, rate="3/m", counted_by="ip")
    compiled = policy.compile_policy()
    unscaled = Tier.objects.filter(pk=row.pk)
    (limit,) = compiled.tiers[row.pk].limits
    assert (limit.rate.count, limit.burst) == (2, 10)  # round(2.5) is 2: banker's rounding
    assert compiled.tiers[row.pk].factor == 0.25
    unscaled.update(load_factor=100)
    whole = policy.compile_policy()
    assert limit.id == whole.tiers[row.pk].limits[0].id  # same counters: the state carries over
    by_client = compiled.match("GET", scope="r").limits_by_tier[row.pk]  # type: ignore[union-attr]
    assert [(x.rate.count, x.burst) for x in by_client] == [(2, 10), (2, 2), (1, 1)]
    # Counted by IP address: protects accounts, not capacity; never scaled.
    groups = compiled.match("GET", scope="r").groups_by_tier[row.pk]  # type: ignore[union-attr]
    assert groups[0][1][0].rate.count == 3


def test_scaling_keeps_a_gcra_rate_valid_and_a_delay_below_the_burst() -> None:
    limit = Limit.build("g", "7/s", burst=9, algorithm=Algorithm.GCRA, delay=8)
    half = scaled(limit, 0.5)
    assert half.id == "g"
    assert half.rate.count in (3, 4)
    assert half.delay is not None and half.delay < half.burst
    assert scaled(limit, 0.001).rate.count == 1
    assert scaled(limit, 1.0) is limit


def test_bad_admin_values_are_form_errors_naming_the_field() -> None:
    from django.core.exceptions import ValidationError

    for values, field in (
        ({"load_factor": 0}, "load_factor"),
        ({"load_factor": 101}, "load_factor"),
        ({"min_factor": 0}, "min_factor"),
        ({"load_factor": 40, "min_factor": 50}, "min_factor"),
    ):
        row = Tier(slug="x", name="X", **values)
        with pytest.raises(ValidationError) as caught:
            row.full_clean()
        assert set(caught.value.message_dict) == {field}, values


def post_factors(admin_client: Client, row: Tier, load_factor: Any, min_factor: Any) -> Any:
    """The tier ``free``'s change form posted with these factors (and no limit rows)."""
    return admin_client.post(
        f"/admin/django_throttle/tier/{row.pk}/change/",
        {
            "name": "Free",
            "slug": "free",
            "priority": 0,
            "failure_mode": "",
            "load_factor": load_factor,
            "min_factor": min_factor,
            "limits-TOTAL_FORMS": 0,
            "limits-INITIAL_FORMS": 0,
        },
    )


def test_admin_form_shows_the_factors_and_refuses_a_floor_above_the_factor(
    admin_client: Client,
) -> None:
    row = tier("free", "10/m")
    page = admin_client.get(f"/admin/django_throttle/tier/{row.pk}/change/")
    assert b"load_factor" in page.content and b"min_factor" in page.content
    assert "automatic factor" in page.content.decode().lower()
    response = post_factors(admin_client, row, 30, 40)
    assert response.status_code == 200
    assert "The floor cannot exceed the load factor." in response.content.decode()


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_factor_below_one_is_answered_with_its_real_bound(
    admin_client: Client, value: str
) -> None:
    """-1 was answered "at least 0" (the column type's bound, which 0 breaks as well)."""
    row = tier("free", "10/m")
    response = post_factors(admin_client, row, value, 1)
    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {
        "load_factor": ["A factor is at least 1%."]
    }


def test_a_factor_written_around_the_admin_leaves_the_limits_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    row = tier("free", "10/m")
    Tier.objects.filter(pk=row.pk).update(load_factor=0)
    with caplog.at_level(logging.ERROR, "django_throttle.policy"):
        compiled = policy.compile_policy()
    assert compiled.tiers[row.pk].limits[0].rate.count == 10
    assert "load_factor" in caplog.text and "free" in caplog.text


# The controller ---------------------------------------------------------------------------


def test_overload_shrinks_the_lowest_priority_tier_to_its_floor_then_the_next(
    backend: Any, tiers: dict[str, Tier], clock: Clock
) -> None:
    free, pro = tiers["free"].pk, tiers["pro"].pk
    control = controller(Signals(2.0), clock)
    # free: 1 -> .7 -> .49 -> .343 -> .24 -> .168 -> .118 -> .1 (its floor), 7 steps.
    assert run(control, clock, 7) == ["free"] * 7
    assert factors()[free] == pytest.approx(0.1)
    assert pro not in factors()
    # then pro: 1 -> .7 -> .5 (its floor); anon (floor 100 %) never moves.
    assert run(control, clock, 2) == ["pro"] * 2
    assert factors() == {free: pytest.approx(0.1), pro: pytest.approx(0.5)}
    # A steady overload holds at the floors: no oscillation, no policy bump.
    version = backend.get_policy_version()
    assert run(control, clock, 5) == [None] * 5
    assert backend.get_policy_version() == version


def test_a_cut_settles_before_the_next_one(
    backend: Any, tiers: dict[str, Tier], clock: Clock
) -> None:
    """With a step shorter than the signal's delay, an overload the last cut has not reached
    yet must not cut again, nor a reading taken before it give back: at most one move per
    ``settle`` seconds (the load test saw five cuts in five 1 s steps on readings that
    predated them, free 70 % -> 17 %, then a give-back a second after a cut, and sawing)."""
    free = tiers["free"].pk
    control = Controller(signal=Signals(2.0), step=1.0, clock=clock, settle=3.0)
    moved = []
    for _ in range(7):
        clock.tick(1.0)
        moved.append(control.run_once().moved)
    assert moved == ["free", None, None, "free", None, None, "free"]
    assert factors()[free] == pytest.approx(0.7**3)
    # A second after the cut the load reads low: held until the cut has settled, then each
    # give-back settles in turn.
    control.signal = Signals(0.5)
    moved = []
    for _ in range(7):
        clock.tick(1.0)
        moved.append(control.run_once().moved)
    assert moved == [None, None, "free", None, None, "free", None]
    assert factors()[free] == pytest.approx(0.7**3 + 0.2)
    # A settle of 0 moves on every step.
    control.settle = 0.0
    clock.tick(1.0)
    assert control.run_once().moved == "free"
    with pytest.raises(ValueError, match="settle"):
        Controller(signal=Signals(2.0), settle=-1)


def test_falling_load_recovers_highest_priority_first_and_the_band_holds(
    backend: Any, tiers: dict[str, Tier], clock: Clock
) -> None:
    pro = tiers["pro"].pk
    signal = Signals(*[2.0] * 9, 0.95, 0.95, 1.0, *[0.5] * 20)
    control = controller(signal, clock)
    run(control, clock, 9)
    assert run(control, clock, 3) == [None] * 3  # 0.9 <= load <= 1: hold
    # pro first: .5 -> .6 -> .7 -> .8 -> .9 -> 1.0, then free: .1 -> ... -> 1.0.
    assert run(control, clock, 5) == ["pro"] * 5
    assert pro not in factors()
    assert run(control, clock, 9) == ["free"] * 9
    assert factors() == {}
    assert run(control, clock, 1) == [None]


def test_a_second_controller_in_the_same_step_does_nothing(
    backend: Any, tiers: dict[str, Tier], clock: Clock
) -> None:
    first, second = controller(Signals(2.0), clock), controller(Signals(2.0), clock)
    assert first.run_once().moved == "free"
    assert second.run_once() == adaptive.Step(acquired=False)
    assert factors() == {tiers["free"].pk: pytest.approx(0.7)}
    clock.tick()
    assert second.run_once().moved == "free"


@pytest.mark.parametrize(
    "bad",
    # 10**400: an int no float holds (math.isfinite raised OverflowError out of the step).
    [
        RuntimeError("metrics down"),
        "high",
        float("nan"),
        float("inf"),
        -1,
        True,
        pytest.param(10**400, id="huge-int"),
    ],
)
def test_a_broken_signal_is_logged_and_changes_nothing(
    backend: Any, tiers: dict[str, Tier], clock: Clock, bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    control = controller(Signals(2.0, bad), clock)
    run(control, clock, 1)
    before, version = factors(), backend.get_policy_version()
    with caplog.at_level(logging.ERROR, "django_throttle.adaptive"):
        assert run(control, clock, 3) == [None] * 3
    assert factors() == before
    assert backend.get_policy_version() == version
    assert "factors held" in caplog.text


def test_no_data_holds(backend: Any, tiers: dict[str, Tier], clock: Clock) -> None:
    assert run(controller(Signals(None), clock), clock, 3) == [None] * 3
    assert factors() == {}


def test_a_worker_sees_the_new_factor_once_the_policy_version_moves(
    backend: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admitted rate follows the controller: 10 a minute, 7 after one overloaded step,
    10 again after recovering; each change reaches the worker with the version check."""
    tier("anonymous", "10/m", is_default_anonymous=True, min_factor=10)
    now = [1_000.0]
    monkeypatch.setattr(policy, "clock", lambda: now[0])
    client = Client()
    assert admitted(client, "198.51.100.1") == 10
    control = controller(Signals(2.0, 0.5), clock)
    run(control, clock, 1)
    assert admitted(client, "198.51.100.2") == 10  # the snapshot is fresh: not checked yet
    now[0] += policy.REFRESH_INTERVAL
    assert admitted(client, "198.51.100.3") == 7
    run(control, clock, 1)  # recovering adds 10 points a step: 80 %
    now[0] += policy.REFRESH_INTERVAL
    assert admitted(client, "198.51.100.4") == 8
    run(control, clock, 2)
    now[0] += policy.REFRESH_INTERVAL
    assert admitted(client, "198.51.100.5") == 10


def test_the_operator_factor_and_the_floor_combine(
    backend: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Effective factor = load factor x automatic factor, never below the floor: at 50 % with
    a floor of 20 %, a long overload leaves 20 % (the automatic factor stops at 0.4)."""
    row = tier("free", "100/m", load_factor=50, min_factor=20)
    run(controller(Signals(3.0), clock), clock, 10)
    assert factors() == {row.pk: pytest.approx(0.4)}
    policy.invalidate()
    assert policy.current().tiers[row.pk].limits[0].rate.count == 20


def test_history_keeps_each_minute_for_the_dashboard(
    backend: Any, tiers: dict[str, Tier], clock: Clock
) -> None:
    control = controller(Signals(2.0), clock)
    run(control, clock, 12)  # two minutes of 10 s steps
    history = AdaptiveStore(get_backend()).history(0)
    assert set(history) == {t.pk for t in tiers.values()}
    free = history[tiers["free"].pk]
    assert len(free) in (2, 3)  # one entry per minute, the minute's last
    assert [m for m, _ in free] == sorted({m for m, _ in free})
    assert free[-1][1] < free[0][1]


def test_factors_expire_when_the_controller_stops(
    tiers: dict[str, Tier], clock: Clock, settings: Any
) -> None:
    """A controller that stopped leaves no tier shrunk for longer than its TTL (memory
    backend: its store's clock moves by hand)."""
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    memory = get_backend()
    memory.clock = clock  # type: ignore[attr-defined]
    run(controller(Signals(2.0), clock, ttl=60), clock, 1)
    assert factors()
    clock.tick(61)
    assert factors() == {}


# The command and its signal ---------------------------------------------------------------

#: ``--signal`` of the command's tests: always overloaded.
OVERLOADED = ("--signal", "tests.test_adaptive.overloaded")


def test_command_once_moves_a_factor(tiers: dict[str, Tier], redis_client: Any) -> None:
    out = io.StringIO()
    call_command("throttle_adapt", *OVERLOADED, "--once", stdout=out)
    assert "tier free moved" in out.getvalue()
    assert parse_factors(f"{tiers['free'].pk}=0.7") == factors()
    call_command("throttle_adapt", "--clear", stdout=out)  # no signal needed to clear
    assert factors() == {}


@pytest.mark.parametrize("options", [["--once"], [], ["--once", "--signal", " "]])
def test_command_without_a_signal_is_a_one_line_error_naming_the_option(
    tiers: dict[str, Tier], options: list[str]
) -> None:
    """Without ``--signal`` the command says what to give (a dotted path of a callable
    returning the load as a ratio to its target), in one line; nothing moves."""
    with pytest.raises(CommandError, match="--signal") as caught:
        call_command("throttle_adapt", *options, stdout=io.StringIO())
    message = str(caught.value)
    assert "\n" not in message
    assert "ratio to its target" in message and "None for no data" in message
    assert factors() == {}


def test_command_with_a_bad_step_is_a_one_line_error() -> None:
    with pytest.raises(CommandError, match="step") as caught:
        call_command("throttle_adapt", *OVERLOADED, "--once", "--step", "0")
    assert "\n" not in str(caught.value)


#: Not a callable: what a ``--signal`` naming a constant finds.
NOT_A_SIGNAL = 1.5


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("tests.nowhere.signal", "cannot be imported (ModuleNotFoundError"),
        ("nodots", "cannot be imported (ImportError"),
        ("os.path.nope", "cannot be imported (ImportError"),
        ("tests.test_adaptive.NOT_A_SIGNAL", "names a float, not a callable"),
    ],
)
def test_a_signal_that_does_not_import_is_a_one_line_error(
    tiers: dict[str, Tier], path: str, says: str
) -> None:
    """A typo in ``--signal`` stops the controller with one line naming the option and the
    path, not an ImportError traceback; a path to something that is not callable too, rather
    than a step that logs and holds forever."""
    for options in (["--once"], []):
        with pytest.raises(CommandError, match="--signal") as caught:
            call_command("throttle_adapt", "--signal", path, *options, stdout=io.StringIO())
        message = str(caught.value)
        assert "\n" not in message and repr(path) in message and says in message, message
    assert factors() == {}


def test_the_controller_needs_a_callable_signal() -> None:
    """The class takes ``signal=`` and reads no setting: a value that is not callable is a
    ``ValueError`` naming it."""
    with pytest.raises(ValueError, match="not callable"):
        Controller(signal=NOT_A_SIGNAL)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Controller()  # type: ignore[call-arg]


def test_the_load_signal_setting_of_earlier_versions_is_a_warning_naming_the_option(
    settings: Any,
) -> None:
    """``DJANGO_THROTTLE_LOAD_SIGNAL`` is no setting any more: the command's ``--signal`` is.
    A project still setting it gets W004 naming the replacement (no limit is weaker without
    it: the controller that read it stops with a one-line error until given ``--signal``)."""
    settings.DJANGO_THROTTLE_LOAD_SIGNAL = "tests.test_adaptive.overloaded"
    found = [m for m in check_settings() if "LOAD_SIGNAL" in m.msg]
    assert [m.id for m in found] == ["django_throttle.W004"]
    assert "manage.py throttle_adapt --signal <path>" in found[0].msg


# The dashboard --------------------------------------------------------------------------


def test_dashboard_charts_each_scaled_tiers_factor(
    admin_client: Client, tiers: dict[str, Tier]
) -> None:
    import time

    clock = Clock(time.time() - 60)  # both steps in minutes already past
    run(controller(Signals(2.0), clock), clock, 2)
    page = admin_client.get("/admin/django_throttle/usagecount/dashboard/").content.decode()
    assert 'id="load-factors"' in page
    assert 'data-title="Free"' in page and 'data-last="49"' in page
    assert "automatic 49% now; load factor 100%, floor 10%" in page
    assert 'data-title="Pro"' not in page  # never scaled: no chart


def test_dashboard_without_scaled_tiers_has_no_factor_section(
    admin_client: Client, tiers: dict[str, Tier]
) -> None:
    page = admin_client.get("/admin/django_throttle/usagecount/dashboard/").content.decode()
    assert 'id="load-factors"' not in page


def test_policy_files_carry_the_factors_and_refuse_a_bad_one() -> None:
    from django_throttle.policy.files import PolicyFileError, export_policy, import_policy

    tier("free", "10/m", load_factor=50, min_factor=20)
    document = export_policy()
    assert (document["tiers"][0]["load_factor"], document["tiers"][0]["min_factor"]) == (50, 20)
    document["tiers"][0]["min_factor"] = 60
    with pytest.raises(PolicyFileError, match="min_factor"):
        import_policy(document)


# Redis down, rows written around the admin -------------------------------------------------


def test_with_redis_down_the_admin_and_the_command_say_so(
    admin_client: Client, tiers: dict[str, Tier], settings: Any
) -> None:
    """The tier's page and the dashboard read the automatic factor from Redis: with Redis
    down they answer and say it could not be read, and show no factor they did not read (the
    dashboard drew each scaled tier at "automatic 100% now", a flat line over the window);
    the controller stops with one line. Nothing here is a 500 or a traceback."""
    tier("halved", "10/m", load_factor=50)  # a scaled tier: the dashboard charts it
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    page = admin_client.get(f"/admin/django_throttle/tier/{tiers['free'].pk}/change/")
    assert page.status_code == 200
    assert "unknown: the backend did not answer" in page.content.decode()
    dashboard = admin_client.get("/admin/django_throttle/usagecount/dashboard/")
    assert dashboard.status_code == 200
    assert "The backend could not be read:" in dashboard.content.decode()
    assert 'data-title="Halved"' not in dashboard.content.decode()
    assert "automatic 100% now" not in dashboard.content.decode()
    for options in (["--once"], ["--clear"]):
        with pytest.raises(CommandError, match="The backend did not answer") as caught:
            call_command("throttle_adapt", *OVERLOADED, *options, stdout=io.StringIO())
        assert "\n" not in str(caught.value)


def test_factors_written_around_the_admin_never_break_its_pages_or_the_controller(
    admin_client: Client, tiers: dict[str, Tier], clock: Clock
) -> None:
    """A load factor of 0 or 500 and a floor of 0 written by SQL: the tier's limits apply as
    written (never switched off), its admin pages and the dashboard answer, and the
    controller leaves that tier alone while it moves the others."""
    free, pro = tiers["free"], tiers["pro"]
    Tier.objects.filter(pk=free.pk).update(load_factor=0)
    Tier.objects.filter(pk=pro.pk).update(load_factor=500, min_factor=0)
    compiled = policy.compile_policy()
    assert [compiled.tiers[t.pk].limits[0].rate.count for t in (free, pro)] == [100, 100]
    for url in (
        f"/admin/django_throttle/tier/{free.pk}/change/",
        f"/admin/django_throttle/tier/{pro.pk}/change/",
        "/admin/django_throttle/tier/",
        "/admin/django_throttle/usagecount/dashboard/",
    ):
        assert admin_client.get(url).status_code == 200, url
    control = controller(Signals(2.0), clock)
    assert set(run(control, clock, 3)) == {None}  # free and pro held; anon's floor is 100 %
    assert factors() == {}
