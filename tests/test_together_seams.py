"""The seams of a login counted in one call (``hit_together``, lua/together.lua and
lua/refund_together.lua) against the same login counted one call per counter (the path the
request takes where the one call cannot be made: a Cluster whose counters are in two slots, a
concurrency limit, the in-process backend).

- The same random sequence of login checks (costs, successes given back, every rate
  algorithm, time moved on the tests' clock: each call names its instant)
  through both paths, on two fresh key prefixes of the suite's one Redis, and once more per
  counter on the in-process backend: the same decisions, remaining counts, resets and
  Retry-After at every step (:func:`test_together_decides_as_the_counters_one_by_one`).
  Shadow limits among them: a refund leaves out those its hit spared (``Decision.spared``:
  a shadow limit that would deny is left unchanged, so it took nothing to give back).
- N threads against a limit L, each login one call over both counters: exactly L admitted,
  and both counters spent exactly (:func:`test_threads_through_one_call_admit_exactly_the_limit`).
- Every key the two scripts write has a TTL.

The memory backend never counts together (its route is the process's own store, counted
call by call: :meth:`RedisBackend._together_call`); its answers are the per-counter path's.
"""

from __future__ import annotations

import unicodedata
import uuid
from collections import Counter
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from threading import Barrier
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.test import Client, override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_throttle.backends.base import Backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.redis import RedisBackend
from django_throttle.models import Tier
from django_throttle.policy import live as policy
from django_throttle.rates import RATE_ALGORITHMS, Algorithm, Decision, Limit
from django_throttle.request.core import (
    Hit,
    HitTogether,
    Peek,
    Plan,
    Refund,
    RefundTogether,
    Reservation,
    charged,
    retry_after_seconds,
    settling,
)
from tests.clients import AddressedAsyncClient

T0 = 1_700_000_000.0

#: A group: the counter's client and its limits, as the request path names them.
Group = tuple[str, tuple[Limit, ...]]


# --- Driving the request path's steps on the test's clock --------------------------------------


@dataclass
class Calls:
    """What the steps asked the backend for (so a test knows which path ran)."""

    together: int = 0
    together_refused: int = 0
    one_by_one: int = 0
    refunds_together: int = 0


def send(call: Any, backend: Backend, now: float, calls: Calls, together: bool) -> Any:
    """:meth:`Call.send`, at ``now``: the request path's calls as the backend takes them, with
    the instant named (the backends' ``now=``, as every deterministic test names it). Not
    ``together``: the one-call steps answered as a backend that cannot make them answers
    (``None``, ``False``: nothing sent), so the request path counts one call per counter, as
    on a Cluster whose counters are in two slots."""
    if isinstance(call, HitTogether):
        decisions = backend.hit_together(call.groups, call.cost, now=now) if together else None
        if decisions is None:
            calls.together_refused += 1
        else:
            calls.together += 1
        return decisions
    if isinstance(call, RefundTogether):
        done = together and backend.refund_together(
            call.groups, call.cost, now=now, taken_at=call.taken_at
        )
        calls.refunds_together += done
        return done
    if isinstance(call, Plan | Hit):
        calls.one_by_one += 1
        return backend.hit(call.client, call.limits, call.cost, now=now)
    if isinstance(call, Peek):
        return backend.peek(call.client, call.limits, now=now, cost=call.cost)
    if isinstance(call, Refund):
        return backend.refund(call.client, call.limits, call.cost, now=now, taken_at=call.taken_at)
    raise AssertionError(f"unexpected call {call!r}")


def run_at(
    steps: Generator[Any, Any, Any], backend: Backend, now: float, calls: Calls, together: bool
) -> Any:
    """:func:`django_throttle.request.core.run` with every call made at ``now``."""
    try:
        call = next(steps)
        while True:
            call = steps.send(send(call, backend, now, calls, together))
    except StopIteration as done:
        return done.value


def login(
    backend: Backend,
    head: Group,
    groups: Sequence[Group],
    refunds: Sequence[Group],
    cost: int,
    succeeded: bool,
    now: float,
    together: bool,
    calls: Calls,
) -> Decision:
    """One login check (:meth:`Plan.deciding`, as :func:`~django_throttle.request.core.decide`
    makes it) at ``now``; then its reservation settled (:func:`settling`) for a rule counting
    failures: given back when the login succeeded."""
    plan = Plan(head[0], head[1], cost, None, None, True, None, None, None, tuple(groups))
    decision: Decision = run_at(plan.deciding(together=True), backend, now, calls, together)
    if decision.allowed and refunds:
        request = SimpleNamespace(
            throttle_reservations=[
                Reservation("failures", cost, charged(refunds, decision.spared), decision.taken)
            ]
        )
        run_at(settling(request, 200 if succeeded else 401), backend, now, calls, together)
    return decision


def answer(decision: Decision) -> tuple[Any, ...]:
    """What a client is told: allowed, the reported limit, X-RateLimit-Remaining, the reset,
    the exact retry and Retry-After (whole seconds), the shadow flag."""
    return (
        decision.allowed,
        decision.limit.id if decision.limit else None,
        decision.remaining,
        round(decision.reset_after * 1e6),
        round(decision.retry_after * 1e6),
        retry_after_seconds(decision.retry_after) if not decision.allowed else 0,
        decision.shadow,
        len(decision.taken),
    )


def redis_backend(prefix: str) -> RedisBackend:
    with override_settings(DJANGO_THROTTLE_KEY_PREFIX=prefix):
        backend = RedisBackend()
    assert backend.prefix == prefix
    return backend


def every_key_expires(admin: redis.Redis, prefix: str) -> list[bytes]:
    """The keys under ``prefix`` without a TTL (``PTTL`` -1); must be none."""
    return [key for key in admin.scan_iter(match=f"{prefix}:*") if admin.pttl(key) == -1]


# --- The random logins ----------------------------------------------------------------------

UNITS = {Algorithm.CALENDAR: ("d",)}


@st.composite
def limit_of(draw: st.DrawFn, id: str, shadow: bool = False) -> Limit:
    algorithm = draw(st.sampled_from(RATE_ALGORITHMS))
    unit = draw(st.sampled_from(UNITS.get(algorithm, ("s", "10s", "min", "h"))))
    count = draw(st.integers(1, 5))
    burst = None
    if algorithm in (Algorithm.TOKEN_BUCKET, Algorithm.GCRA, Algorithm.LEAKY_BUCKET):
        burst = draw(st.one_of(st.none(), st.integers(1, 6)))
    shadow = shadow and draw(st.booleans())
    return Limit.build(id, f"{count}/{unit}", burst=burst, algorithm=algorithm, shadow=shadow)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """A login rule (the client's tier limit, the rule's own by client, by address, by
    username; sometimes a third counter) and a sequence of logins against it."""
    tier = draw(limit_of("t1"))
    own = draw(st.lists(limit_of("r1", shadow=True), max_size=1))
    by_address = (draw(limit_of("r2")),)
    if draw(st.booleans()):
        by_address = (*by_address, draw(limit_of("r4", shadow=True)))
    by_name = (draw(limit_of("r3")),)
    third = draw(st.booleans())
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["192.0.2.1", "192.0.2.2", "user:7"]),  # the client
                st.sampled_from(["alice", "bob"]),  # the username tried
                st.integers(1, 3),  # cost
                st.booleans(),  # the login succeeded (its reservation given back)
                st.one_of(  # time moved on before it, in µs
                    st.just(0),
                    st.integers(1, 2_000_000),
                    st.integers(2_000_000, 400_000_000),
                ),
            ),
            min_size=5,
            max_size=40,
        )
    )
    return {
        "tier": tier,
        "own": tuple(own),
        "by_address": by_address,
        "by_name": by_name,
        "third": third,
        "steps": steps,
    }


def groups_of(scenario: dict[str, Any], client: str, name: str) -> tuple[Group, list[Group]]:
    """The plan's head and groups as ``_grouped`` makes them: a client that is the address
    (an anonymous login) counts the address's limits in its own group."""
    head_limits = (scenario["tier"], *scenario["own"])
    groups: list[Group] = []
    if client.startswith("user:"):
        groups.append(("ip:192.0.2.9", scenario["by_address"]))
    else:
        head_limits = (*head_limits, *scenario["by_address"])
    groups.append((f"username:{name}", scenario["by_name"]))
    if scenario["third"]:
        groups.append((f"username:{name}:lower", scenario["by_name"]))
    return (client if client.startswith("user:") else f"ip:{client}", head_limits), groups


def refunds_of(scenario: dict[str, Any], head: Group, groups: list[Group]) -> list[Group]:
    """A reservation's groups: the rule's limits only (the tier's stay taken)."""
    first = tuple(limit for limit in head[1] if limit is not scenario["tier"])
    found = [(head[0], first)] if first else []
    return [*found, *groups]


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
@given(scenario=scenarios())
def test_together_decides_as_the_counters_one_by_one(
    scenario: dict[str, Any], redis_client: redis.Redis
) -> None:
    """Every login of the sequence answered alike through one call over every counter and
    through one call per counter (and the in-process backend's per-counter answer too), at
    every step: allowed, the reported limit, remaining, reset, Retry-After; and every key
    either path wrote expires."""
    prefixes = [f"dtt{uuid.uuid4().hex[:10]}" for _ in range(2)]
    together, one_by_one = (redis_backend(prefix) for prefix in prefixes)
    memory = MemoryBackend(clock=lambda: T0)
    calls = [Calls(), Calls(), Calls()]
    try:
        now_us = round(T0 * 1e6)
        for number, (client, name, cost, succeeded, moved) in enumerate(scenario["steps"]):
            now_us += moved
            at = now_us / 1e6
            head, groups = groups_of(scenario, client, name)
            refunds = refunds_of(scenario, head, groups)
            answers = [
                answer(login(backend, head, groups, refunds, cost, succeeded, at, flag, seen))
                for backend, flag, seen in zip(
                    (together, one_by_one, memory), (True, False, True), calls, strict=True
                )
            ]
            assert answers[0] == answers[1] == answers[2], (number, answers)
        assert calls[0].one_by_one == 0 and calls[0].together == len(scenario["steps"])
        assert calls[1].together == 0 and calls[1].together_refused == len(scenario["steps"])
        assert calls[2].together == 0 and calls[2].together_refused == len(scenario["steps"])
        for prefix in prefixes:
            assert every_key_expires(redis_client, prefix) == []
    finally:
        for backend in (together, one_by_one, memory):
            backend.close()
        for prefix in prefixes:
            keys = list(redis_client.scan_iter(match=f"{prefix}:*"))
            if keys:
                redis_client.delete(*keys)


# --- Exactness under concurrency -----------------------------------------------------------


@pytest.mark.parametrize("algorithm", RATE_ALGORITHMS)
def test_threads_through_one_call_admit_exactly_the_limit(redis_url: str, algorithm: str) -> None:
    """16 threads x 3 logins each (one address, one username, both counted in one call)
    against a limit of 7: exactly 7 admitted, and each counter has exactly nothing left
    (a denial took nothing from the counter that allowed beside it)."""
    limit = 7
    rate = f"{limit}/d"
    by_address = (Limit.build("a", rate, algorithm=algorithm),)
    by_name = (Limit.build("n", rate, algorithm=algorithm),)
    groups = (("ip:192.0.2.50", by_address), ("username:carol", by_name))
    backend = RedisBackend()
    threads, each = 16, 3
    start = Barrier(threads)

    def logins(_: int) -> list[bool]:
        start.wait()
        found = []
        for _ in range(each):
            decisions = backend.hit_together(groups)
            assert decisions is not None
            found.append(all(d.allowed for d in decisions))
        return found

    try:
        with ThreadPoolExecutor(threads) as pool:
            admitted = sum(sum(found) for found in pool.map(logins, range(threads)))
        assert admitted == limit
        for client, limits in groups:
            assert backend.peek(client, limits).remaining == 0
            assert not backend.peek(client, limits, cost=1).allowed
    finally:
        backend.close()


def test_threads_through_one_call_spend_the_address_and_the_username_each_exactly(
    redis_url: str,
) -> None:
    """Two addresses trying one username (limit 4) and each address its own limit 3, in
    16 threads: the username admits exactly 4 in all; no address is charged for a login the
    username refused (each address's remaining is its limit less its admitted logins)."""
    by_address = (Limit.build("a", "3/d"),)
    by_name = (Limit.build("n", "4/d", algorithm=Algorithm.SLIDING_LOG),)
    addresses = ["ip:192.0.2.60", "ip:192.0.2.61"]
    backend = RedisBackend()
    start = Barrier(16)

    def logins(n: int) -> list[tuple[str, bool]]:
        address = addresses[n % 2]
        start.wait()
        found = []
        for _ in range(3):
            decisions = backend.hit_together(((address, by_address), ("username:dave", by_name)))
            assert decisions is not None
            found.append((address, all(d.allowed for d in decisions)))
        return found

    try:
        with ThreadPoolExecutor(16) as pool:
            results = [pair for found in pool.map(logins, range(16)) for pair in found]
        admitted = {address: sum(ok for a, ok in results if a == address) for address in addresses}
        assert sum(admitted.values()) == 4
        for address in addresses:
            assert backend.peek(address, by_address).remaining == 3 - admitted[address]
        assert backend.peek("username:dave", by_name).remaining == 0
    finally:
        backend.close()


# --- Every key written expires ------------------------------------------------------------


@pytest.mark.parametrize("algorithm", RATE_ALGORITHMS)
def test_every_key_the_together_scripts_write_expires(
    redis_client: redis.Redis, _isolated_throttle: str, algorithm: str
) -> None:
    """Hits through together.lua (allowed, then denied), refunds through
    refund_together.lua (given a taken instant and without one), with a shadow limit
    beside: every key under the prefix has a PTTL, none -1."""
    period = "d" if algorithm == Algorithm.CALENDAR else "h"
    by_address = (
        Limit.build("a", f"3/{period}", algorithm=algorithm),
        Limit.build("s", f"1/{period}", algorithm=algorithm, shadow=True),
    )
    by_name = (Limit.build("n", f"2/{period}", algorithm=algorithm),)
    groups = (("ip:192.0.2.70", by_address), ("username:erin", by_name))
    backend = RedisBackend()
    try:
        for n in range(4):
            decisions = backend.hit_together(groups, now=T0 + n)
            assert decisions is not None
            taken = tuple(
                dict(d.taken).get(client) for d, (client, _) in zip(decisions, groups, strict=True)
            )
            if n % 2 == 0:
                assert backend.refund_together(groups, now=T0 + n, taken_at=taken)
            else:
                assert backend.refund_together(groups, now=T0 + n)
        decisions = backend.hit_together(groups, cost=3)  # on the server's clock
        assert decisions is not None
        keys = list(redis_client.scan_iter(match=f"{_isolated_throttle}:*"))
        assert keys, "the scripts wrote nothing"
        assert [
            key for key in keys if redis_client.pttl(key) == -1
        ] == []  # -1: no TTL; -2: expired since the scan
    finally:
        backend.close()


# --- Odd usernames through the real login views ---------------------------------------------

#: Usernames an attacker or a user may choose: the account's stored name (``None``: no
#: account can be named so) and the spellings three failed attempts present.
ODD_LOGINS = {
    # Over the 256 characters a counter keeps as they are (a digest then), and over the 150
    # of Django's username field (its login form still checks the password of such a name).
    "300-chars": ("long-" + "\u00fc" * 295, ["long-" + "\u00fc" * 295] * 3),
    "unicode": (
        "\u00dcn\u00efc\u00f8d\u00e9-\u7528\u6237",
        [
            "\u00dcn\u00efc\u00f8d\u00e9-\u7528\u6237",
            unicodedata.normalize("NFD", "\u00dcn\u00efc\u00f8d\u00e9-\u7528\u6237"),
            "\u00fcn\u00efc\u00f8d\u00e9-\u7528\u6237",
        ],
    ),
    # Fullwidth (NFKC), upper case and plain: one account's one counter.
    "nfkc": ("bf1", ["\uff42\uff46\uff11", "BF1", "bf1"]),
    "markup": (
        "<script>alert(1)</script>",
        ["<script>alert(1)</script>", " <script>alert(1)</script> ", "<SCRIPT>alert(1)</SCRIPT>"],
    ),
    # Refused unchecked by Django's forms and DRF's serializer (a NUL is no character of a
    # name); counted under the name without it, which only ever limits more.
    "nul": (None, ["b\x00f1", "bf1\x00", "b\x00f1"]),
    "empty": (None, ["", " ", ""]),
}
#: The login views, and whether each is a form that refuses a name it cannot hold unchecked.
LOGIN_VIEWS = {
    "/login/": True,  # Django's LoginView
    "/admin/login/": True,  # the admin's
    "/async-login/": False,  # an ``async def`` view calling aauthenticate()
    "/token/": False,  # DRF's obtain_auth_token
}
#: What the right password gets at each view.
SIGNED_IN = {"/login/": 302, "/admin/login/": 302, "/async-login/": 302, "/token/": 200}
ADDRESSES = ("198.51.100.1", "198.51.100.1", "198.51.100.2")
BY_IP, BY_NAME = 100, 5


def form_refuses(name: str) -> bool:
    """Whether Django's login form refuses ``name`` before checking a password (blank, or
    holding a NUL): no failed login, nothing counted."""
    stripped = name.strip()
    return not stripped or "\x00" in stripped


def attempt(url: str, address: str, username: str, password: str) -> int:
    form = {"username": username, "password": password}
    if url.startswith("/async"):
        response = async_to_sync(AddressedAsyncClient(address).post)(url, form)
    else:
        response = Client().post(url, form, REMOTE_ADDR=address)
    return int(response.status_code)


def login_counters(addresses: Sequence[str], spellings: Sequence[str]) -> dict[str, int | None]:
    """What the inspector reads of the login rule's counters a login from each of
    ``addresses`` presenting each of ``spellings`` meets: backend label -> tokens left."""
    from django_throttle.inspection.clients import buckets, every_counter, login_probe
    from django_throttle.policy.live import current

    found = [
        counter
        for address in addresses
        for spelling in spellings
        for counter in every_counter(login_probe(address, spelling), current())
        if counter.where == "rule 'login'"
    ]
    return {bucket.client: bucket.remaining for bucket in buckets(found)}


def odd_logins(url: str, account: str | None, spellings: list[str]) -> list[dict[str, Any]]:
    """Three failed attempts (two addresses), then the right password from the first: the
    counters after each."""
    seen = []
    for address, spelling in zip(ADDRESSES, spellings, strict=True):
        attempt(url, address, spelling, "wrong")
        seen.append(login_counters(sorted(set(ADDRESSES)), spellings))
    if account is not None:
        assert attempt(url, ADDRESSES[0], account, "right") == SIGNED_IN[url]
        seen.append(login_counters(sorted(set(ADDRESSES)), spellings))
    return seen


def made_together(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Each one-call hit and refund the backend is asked for, as it is asked (the real
    method runs): its name, and whether it was made in one call (else nothing was sent)."""
    made: list[tuple[str, bool]] = []
    for name in ("hit_together", "refund_together"):
        blocking, awaited = getattr(RedisBackend, name), getattr(RedisBackend, "a" + name)

        def spy(self: Any, *args: Any, _real: Any = blocking, _name: str = name, **kw: Any) -> Any:
            found = _real(self, *args, **kw)
            made.append((_name, found not in (None, False)))
            return found

        async def aspy(
            self: Any, *args: Any, _real: Any = awaited, _name: str = name, **kw: Any
        ) -> Any:
            found = await _real(self, *args, **kw)
            made.append((_name, found not in (None, False)))
            return found

        monkeypatch.setattr(RedisBackend, name, spy)
        monkeypatch.setattr(RedisBackend, "a" + name, aspy)
    return made


@pytest.mark.django_db
@pytest.mark.urls("tests.test_login_protection")
@pytest.mark.parametrize("url", list(LOGIN_VIEWS))
@pytest.mark.parametrize("case", list(ODD_LOGINS))
def test_odd_usernames_are_counted_once_and_given_back_as_the_memory_store_counts_them(
    settings: Any,
    django_user_model: Any,
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    case: str,
) -> None:
    """Failed logins presenting a long, unicode, NFKC-variant, markup, NUL or empty username
    at Django's LoginView, the admin's login, an ``async def`` view and DRF's
    obtain_auth_token, counted by address and by username in one call of together.lua:
    each failure takes one token from its address's counter and one from its username's
    (every spelling of one name one counter; none for a blank name), a name the form refuses
    unchecked takes nothing, and the right password gives back what it took from both. The
    in-process store (one call per counter) reads the same counters alike at every step."""
    from django.db import connection

    from django_throttle.identity import Identity
    from django_throttle.request.usernames import normalise_username
    from tests.test_login_protection import guard

    account, spellings = ODD_LOGINS[case]
    if connection.vendor != "sqlite":
        if account is not None and len(account) > 150:
            pytest.skip("this database enforces auth_user.username's 150 characters")
        if case == "nul" and url == "/async-login/":
            # The test's own view hands the name to aauthenticate, whose query PostgreSQL
            # refuses (a NUL in text); Django's forms and DRF's serializer refuse it first.
            pytest.skip("this database refuses a NUL in a query's text")
    if account is not None:
        django_user_model.objects.create_user(account, password="right", is_staff=True)
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    anonymous.limits.create(rate="1000/min")
    guard("login", anonymous, by_username=f"{BY_NAME}/h", by_ip=f"{BY_IP}/d")

    made = made_together(monkeypatch)
    on_redis = odd_logins(url, account, spellings)
    # Each attempt naming a user was one call over its address and its username, and so
    # was each refund of both.
    named = sum(bool(normalise_username(s)) for s in spellings) + (account is not None)
    assert [ok for call, ok in made if call == "hit_together"] == [True] * named
    assert all(ok for call, ok in made if call == "refund_together")
    made.clear()
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    policy.reset()
    assert odd_logins(url, account, spellings) == on_redis
    assert not any(ok for _call, ok in made)  # the in-process store: one call per counter

    # Each failure the view checked takes a token from its address's counter and from its
    # username's (the one its spelling normalises to; none for a blank name).
    labels = {address: Identity("ip", address).key for address in ADDRESSES}
    names = {s: Identity("username", n).key for s in spellings if (n := normalise_username(s))}
    taken: Counter[str] = Counter()
    for n, (address, spelling) in enumerate(zip(ADDRESSES, spellings, strict=True)):
        if not (LOGIN_VIEWS[url] and form_refuses(spelling)):
            taken.update([labels[address], *([names[spelling]] if spelling in names else [])])
        expected = {label: BY_IP - taken[label] for label in labels.values()}
        expected |= {label: BY_NAME - taken[label] for label in names.values()}
        assert on_redis[n] == expected, n
    if account is not None:
        assert on_redis[-1] == on_redis[-2]  # the right password gave both back
