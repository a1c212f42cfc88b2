"""The operator's tools on a Redis Cluster while one primary does not answer (SIGSTOP, no
replica to take over): ``throttle_inspect``, ``throttle_explain`` and ``throttle_reset`` fail
in one line for a client whose counters that primary keeps and work for every other client;
the admin's inspector, reset, dashboard and usage pages answer 200 (the reset with an error
message); usage reports and the rollup fail in one line and, once the primary answers again,
the rollup copies every minute it could not (nothing counted on the live primaries is lost);
and through all of it requests are decided (the live primaries' clients counted)."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from redis.crc import key_slot

from django_throttle.backends import get_backend
from django_throttle.backends.base import BackendError
from django_throttle.backends.redis_nodes import get_breaker
from django_throttle.rates import Limit
from tests.factories import tier
from tests.topologies import LocalCluster, wait_for

pytestmark = pytest.mark.django_db

INSPECT = "/admin/django_throttle/usagecount/inspect/"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    topology = LocalCluster(replicas=0)
    try:
        yield topology.start()
    finally:
        topology.stop()


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def refused(*args: str) -> str:
    """The one-line error of a command that must fail."""
    with pytest.raises(CommandError) as raised:
        run(*args)
    message = str(raised.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def messages(admin: Any, response: Any) -> list[tuple[str, str]]:
    assert response.status_code == 302
    html = admin.get(response["Location"]).content.decode()
    return re.findall(r'<li class="(\w+)">(.*?)</li>', html)


def test_the_operator_tools_while_one_primary_does_not_answer(
    settings: Any, cluster: LocalCluster
) -> None:
    cluster.wait_ok()
    cluster.flushall()
    settings.DJANGO_THROTTLE_REDIS_URL = cluster.url
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 0.3, "socket_connect_timeout": 0.3}
    # Served uncounted while its primary is paused: the usage figures below count what Redis
    # counted, not a process's local count.
    settings.DJANGO_THROTTLE_FAILURE_MODE = "open"
    tier("anonymous", "60/min", is_default_anonymous=True)
    tier("free", "3/h", is_default_authenticated=True)
    backend = get_backend()
    probe = Limit.build("probe", "1/d")
    users, home = [], {}
    for n in range(40):
        user = User.objects.create_user(f"user-{n}", password="pw")
        slot = key_slot(backend.key(f"user:{user.pk}", probe).encode())
        home[user.username] = cluster.node_for_slot(slot).port
        users.append(user)
    dead_port = home["user-0"]
    dead = next(node for node in cluster.nodes if node.port == dead_port)
    alive = next(user for user in users if home[user.username] != dead_port)
    web = Client()
    for user in (users[0], alive):
        web.force_login(user)
        assert web.get("/api/ping/").status_code == 200
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))

    with cluster.paused(dead):
        for args in (
            ("throttle_inspect", "user-0"),
            ("throttle_explain", "--user", "user-0", "--path", "/api/ping/"),
            ("throttle_reset", "user-0"),
        ):
            assert "Timeout" in refused(*args)
        assert "free 3/h" in run("throttle_inspect", alive.username)
        assert "Next request: allowed" in run(
            "throttle_explain", "--user", alive.username, "--path", "/api/ping/"
        )
        assert run("throttle_reset", alive.username).startswith("Cleared 1 counter(s)")

        for user in (users[0], alive):
            page = admin.get(INSPECT, {"client": f"user:{user.pk}", "path": "/api/ping/"})
            assert page.status_code == 200
        kinds = [
            kind
            for kind, _ in messages(
                admin, admin.post(f"{INSPECT}reset/", {"client": f"user:{users[0].pk}"})
            )
        ]
        assert kinds == ["error"]
        kinds = [
            kind
            for kind, _ in messages(
                admin, admin.post(f"{INSPECT}reset/", {"client": f"user:{alive.pk}"})
            )
        ]
        assert kinds == ["success"]
        assert admin.get("/admin/django_throttle/usagecount/dashboard/").status_code == 200
        assert admin.get("/admin/django_throttle/usagecount/").status_code == 200

        # The first call that meets the paused primary names it: the server's clock (when
        # the cluster routes TIME there) or the read every primary must answer.
        for args in (("throttle_usage",), ("throttle_usage", "--rollup")):
            said = refused(*args)
            assert "TimeoutError" in said and f"127.0.0.1:{dead_port}" in said, said

        web.force_login(alive)  # reset above: its 3/h is whole again
        assert [web.get("/api/ping/").status_code for _ in range(4)] == [200, 200, 200, 429]
        web.force_login(users[0])
        assert web.get("/api/ping/").status_code == 200  # failure mode open
        assert get_breaker().state == "closed"

    assert run("throttle_usage", "--rollup").startswith("Rolled up")
    rows = json.loads(run("throttle_usage", "--by", "tier", "--format", "json"))
    free = next(row for row in rows if row["tier"] == "free")
    # Counted on the live primaries meanwhile (and both users before): nothing lost.
    assert (free["allowed"], free["denied"]) == (5, 1)


#: Every credential guard: protect_credentials, ``@throttle`` under a credential rule and the
#: DRF throttle class on a token view, each sync and async (tests/views.py).
LOGINS = (
    "/seams/login/",
    "/seams/login-async/",
    "/seams/login-decorated/",
    "/seams/login-decorated-async/",
    "/seams/token/",
    "/seams/token-async/",
)


def on(backend: Any, cluster: LocalCluster, client: str) -> int:
    """The port of the primary keeping ``client``'s counters."""
    return cluster.node_for_slot(
        key_slot(backend.key(client, Limit.build("p", "1/d")).encode())
    ).port


def pick(backend: Any, cluster: LocalCluster, make: Any, dead: bool, port: int) -> str:
    """The first value ``make(n)`` whose counters are (``dead``) or are not on ``port``."""
    return next(
        value for value in map(make, range(500)) if (on(backend, cluster, value[1]) == port) is dead
    )[0]


@pytest.mark.parametrize("mode", ["closed", "default"])
@pytest.mark.parametrize("path", LOGINS)
def test_a_login_whose_counter_is_on_a_stopped_primary_takes_its_failure_mode(
    settings: Any, cluster: LocalCluster, path: str, mode: str
) -> None:
    """The attacker's seam: a credential endpoint meets two counters (the address's and the
    presented username's), each on the primary of its own shard. While either primary does
    not answer, the guard takes its failure mode before the view checks a password,
    whichever counter it is: ``closed`` (the operator's choice) answers 503 and
    ``Retry-After``; by default the attempt is counted in the process (both counters, far
    from their limits here) and checked (401), saying so in ``X-RateLimit-Degraded``. With
    both on live primaries the attempt is checked (401) and counted as before. Never a
    500."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    from django_throttle.identity import Identity
    from django_throttle.models import EndpointLimit, EndpointRule
    from django_throttle.request.usernames import normalise_username

    cluster.wait_ok()
    cluster.flushall()
    settings.DJANGO_THROTTLE_REDIS_URL = cluster.url
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 0.3, "socket_connect_timeout": 0.3}
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1
    if mode == "closed":
        settings.DJANGO_THROTTLE_FAILURE_MODE = "closed"
    refused = 503 if mode == "closed" else 401
    anonymous = tier("anonymous", "1000/h", is_default_anonymous=True)
    rule = EndpointRule.objects.create(
        name="seam-login", pattern="seam-login", counts=EndpointRule.Counts.FAILURES
    )
    for rate, counted_by in (("30/min", "ip"), ("30/h", "username")):
        EndpointLimit.objects.create(rule=rule, tier=anonymous, rate=rate, counted_by=counted_by)
    backend = get_backend()
    backend.get_policy_version()  # a running worker: its cluster client is made
    port = cluster.node_for_slot(16383).port

    def address(n: int) -> tuple[str, str]:
        ip = f"203.0.113.{n % 250}" if n < 250 else f"198.51.100.{n % 250}"
        return ip, Identity("ip", ip).key

    def username(n: int) -> tuple[str, str]:
        name = f"ünïcødé-[victim]-{n}"
        return name, Identity("username", normalise_username(name)).key

    cases = {
        "username's primary stopped": (
            pick(backend, cluster, address, False, port),
            pick(backend, cluster, username, True, port),
            refused,
        ),
        "address's primary stopped": (
            pick(backend, cluster, address, True, port),
            pick(backend, cluster, username, False, port),
            refused,
        ),
        "both live": (
            pick(backend, cluster, address, False, port),
            pick(backend, cluster, username, False, port),
            401,
        ),
    }
    asynchronous = path.endswith("-async/")

    def attempt(ip: str, name: str) -> Any:
        data = {"username": name, "password": "guess"}
        headers = {"X-Forwarded-For": ip}
        if asynchronous:
            return async_to_sync(AsyncClient().post)(path, data, headers=headers)
        return Client().post(path, data, headers=headers)

    stopped = next(node for node in cluster.nodes if node.port == port)
    with cluster.paused(stopped):
        for case, (ip, name, status) in cases.items():
            for _ in range(2):
                response = attempt(ip, name)
                assert response.status_code == status, case
                if status == 503:
                    assert 1 <= int(response["Retry-After"]) <= 2, case
                if case != "both live" and mode == "default":
                    assert response["X-RateLimit-Degraded"] == "local", case


def test_workers_starting_while_a_primary_is_down(settings: Any, cluster: LocalCluster) -> None:
    """A worker (backend) starting while a primary does not answer counts the other
    primaries' clients, also when the stopped one serves slot 0: redis-py's ``RedisCluster``
    asks that primary for the command table as it is made, and the client is built with
    redis-py's retries allowed (then switched off) so it asks another primary instead."""
    from django_throttle.backends import reset_backend_cache

    cluster.wait_ok()
    cluster.flushall()
    settings.DJANGO_THROTTLE_REDIS_URL = cluster.url
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {"socket_timeout": 0.2, "socket_connect_timeout": 0.2}
    limits = (Limit.build("start", "5/d"),)
    first = cluster.node_for_slot(0)
    other = cluster.node_for_slot(16383)
    backend = get_backend()
    live = next(
        name
        for name in (f"ip:192.0.2.{n}" for n in range(200))
        if on(backend, cluster, name) not in (first.port, other.port)
    )
    with cluster.paused(other):
        for worker in range(3):
            reset_backend_cache()
            assert get_backend().hit(live, limits).remaining == 4 - worker
            get_backend().close()
    reset_backend_cache()
    with cluster.paused(first):
        started = get_backend()
        assert started.hit(live, limits).remaining == 1, "the start needed slot 0's primary"

    def counted() -> bool:
        with contextlib.suppress(BackendError):
            return started.hit(live, limits).allowed
        return False

    wait_for(counted, 5, "counting once slot 0 answers")
    started.close()
