"""The paths ``bench_throttle.py`` compares, and the database and Redis state behind them.

The policy lives in the database as an operator would set it up: a default tier for anonymous
clients and one for users (``1000/hour`` each), a "pro" tier assigned directly to every tenth
user, a "partner" tier assigned to a group holding another tenth, a "hot" tier (never reached:
``1000000/hour``) for the one hot user, and an endpoint rule matching the benchmark view's
``throttle_scope`` whose own limit belongs to a tier no benchmarked client is in. So every
decision matches the rule and carries exactly one limit, for every path: they do the same
Redis work and differ only in what it takes to get there.
"""

from __future__ import annotations

import random
import socket
import time
import types
from collections.abc import Callable
from typing import Any

from bench_meter import Path, Source, constant

SCOPE = "bench"
TIER_RATE = "1000/hour"
HOT_RATE = "1000000/hour"
#: DRF's throttle keeps one timestamp per request of the last period: at this rate a client
#: that used a few hundred requests in the last hour is ordinary.
DRF_RATE = "1000/hour"
DRF_HISTORY = 300
#: ROOT_URLCONF of the whole-request latency path (a module object, not a dotted path: the
#: views can only be defined once Django is set up, and they fill it then).
URLCONF = types.ModuleType("bench_urls")
URLCONF.urlpatterns = []  # type: ignore[attr-defined]

#: The floor for a counting script: GET the state, refill, SET it with a TTL. Written here,
#: shares nothing with the package's scripts. ARGV: capacity, microseconds per token, cost.
MINIMAL_BUCKET = """
local capacity, interval, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local tokens = capacity
local state = redis.call('GET', KEYS[1])
if state then
  local left, stamp = string.match(state, '(%S+) (%S+)')
  tokens = math.min(capacity, tonumber(left) + (now - tonumber(stamp)) / interval)
end
if tokens < cost then return {0, math.floor(tokens)} end
tokens = tokens - cost
local ttl = math.max(1, math.ceil((capacity - tokens) * interval / 1000))
redis.call('SET', KEYS[1], string.format('%.3f %d', tokens, now), 'PX', ttl)
return {1, math.floor(tokens)}
"""


def address(n: int, first: int) -> str:
    return f"{first}.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"


def create_policy(users: int) -> dict[str, Any]:
    """Migrate, then the tiers, the endpoint rule and ``users`` users (bulk_create)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.core.management import call_command

    from django_throttle.models import (
        EndpointLimit,
        EndpointRule,
        Tier,
        TierAssignment,
        TierLimit,
    )

    started = time.perf_counter()
    call_command("migrate", verbosity=0)
    tiers = {}
    for slug, rate, priority, anonymous, authenticated in (
        ("anon", TIER_RATE, 0, True, False),
        ("free", TIER_RATE, 0, False, True),
        ("partner", "3000/hour", 10, False, False),
        ("pro", "5000/hour", 20, False, False),
        ("hot", HOT_RATE, 30, False, False),
        ("internal", "100000/hour", 5, False, False),
    ):
        tiers[slug] = Tier.objects.create(
            slug=slug,
            name=slug,
            priority=priority,
            is_default_anonymous=anonymous,
            is_default_authenticated=authenticated,
        )
        TierLimit.objects.create(tier=tiers[slug], rate=rate)
    rule = EndpointRule.objects.create(name="bench-api", match_type="scope", pattern=SCOPE)
    EndpointLimit.objects.create(rule=rule, tier=tiers["internal"], rate="100/min")

    user_model = get_user_model()
    created = user_model.objects.bulk_create(
        (user_model(username=f"bench{i}", password="!") for i in range(users)), batch_size=5000
    )
    pks = [user.pk for user in created]
    group = Group.objects.create(name="partners")
    through = user_model.groups.through
    through.objects.bulk_create(
        (through(user_id=pk, group_id=group.pk) for pk in pks[5::10]), batch_size=5000
    )
    TierAssignment.objects.create(tier=tiers["partner"], group=group)
    TierAssignment.objects.bulk_create(
        (TierAssignment(tier=tiers["pro"], user_id=pk) for pk in pks[::10]), batch_size=5000
    )
    hot = user_model.objects.create(username="bench-hot", password="!")
    TierAssignment.objects.create(tier=tiers["hot"], user=hot)
    return {
        "users": users,
        "first_pk": pks[0],
        "contiguous": pks[-1] - pks[0] + 1 == users,
        "direct_assignments": len(pks[::10]) + 1,
        "group_members": len(pks[5::10]),
        "hot_pk": hot.pk,
        "seconds": time.perf_counter() - started,
    }


class Requests:
    """DRF requests as a view sees them after authentication, each with the response the
    headers middleware would write to."""

    def __init__(self) -> None:
        from rest_framework.test import APIRequestFactory

        request: Any = APIRequestFactory().get("/bench/")
        self.environ = request.environ

    def build(self, remote_addr: str, user: Any = None) -> tuple[Any, Any]:
        from django.core.handlers.wsgi import WSGIRequest
        from django.http import HttpResponse
        from rest_framework.request import Request
        from rest_framework.test import force_authenticate

        http_request = WSGIRequest({**self.environ, "REMOTE_ADDR": remote_addr})
        if user is not None:
            force_authenticate(http_request, user)
        request = Request(http_request)
        request.user  # noqa: B018 - authenticate now, as DRF does before any throttle
        return request, HttpResponse()


def users_source(info: dict[str, Any], requests: Requests, total: int) -> Source:
    """Authenticated requests of the users in pk order: each user once until all were used."""
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    first = info["first_pk"]

    def make(start: int, n: int) -> list[Any]:
        users = user_model.objects.filter(pk__gte=first + start, pk__lt=first + start + n)
        return [requests.build("192.0.2.1", user) for user in users.order_by("pk")]

    return Source(make, total=total)


def build_paths(ctx: dict[str, Any]) -> list[Path]:
    """Every timed path; ``ctx`` holds the clients, backend, fixture info and the prefix."""
    from django.contrib.auth import get_user_model
    from rest_framework.throttling import UserRateThrottle
    from rest_framework.views import APIView

    from django_throttle.drf import PolicyThrottle
    from django_throttle.policy import live as policy_module
    from django_throttle.request.core import add_headers

    plain, backend, info, prefix = ctx["plain"], ctx["backend"], ctx["fixtures"], ctx["prefix"]
    snapshot = policy_module.current()
    assert snapshot.default_anonymous is not None, "the fixtures define a default tier"
    anon_limits = snapshot.default_anonymous.limits
    hot_limits = next(t.limits for t in snapshot.tiers.values() if t.slug == "hot")
    sha = plain.execute_command("SCRIPT", "LOAD", MINIMAL_BUCKET)
    sha = sha.decode() if isinstance(sha, bytes) else sha
    hour_us = 3600 * 1e6

    class BenchView(APIView):
        throttle_scope = SCOPE

    view = BenchView()
    requests = Requests()
    hot_user = get_user_model().objects.get(pk=info["hot_pk"])
    denied = ctx.setdefault("drf_denied", [0])

    def ping(_: object) -> object:
        return plain.execute_command("PING")

    kwargs = plain.connection_pool.connection_kwargs
    raw = socket.create_connection((kwargs.get("host", "127.0.0.1"), kwargs.get("port", 6379)))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ctx["raw_socket"] = raw

    def raw_ping(_: object) -> object:
        raw.sendall(b"*1\r\n$4\r\nPING\r\n")
        return raw.recv(64)  # "+PONG\r\n" arrives whole

    def evalsha(args: tuple[Any, ...]) -> object:
        return plain.execute_command(*args)

    def bucket_args(key: str, capacity: int) -> tuple[Any, ...]:
        return ("EVALSHA", sha, 1, key, capacity, hour_us / capacity, 1)

    def hit(args: tuple[str, Any]) -> object:
        return backend.hit(*args)

    def push_usage() -> None:
        """The usage counts of the slice's decisions, pushed now: the pusher thread's push in
        flight awaited, the rest pushed here (each full path pays for its own clients)."""
        from django_throttle.usage import accounting

        accounting.wait_pushed()
        tally = getattr(backend, "usage_tally", None)
        if tally is not None:
            accounting.get_store(backend).push_tally(tally)

    def full(item: tuple[Any, Any]) -> object:
        request, response = item
        PolicyThrottle().allow_request(request, view)
        add_headers(response.headers, request._request.throttle_decision)
        return response

    def drf(request: Any) -> object:
        if not UserRateThrottle().allow_request(request, view):
            denied[0] += 1
        return None

    def sequence(build: Callable[[int], Any]) -> Source:
        return Source(lambda start, n: [build(i) for i in range(start, start + n)])

    evalsha_keys = ("evalsha", "eval", "fcall")  # the package counts with FCALL
    return [
        Path("ping", "0   PING, plain redis-py client", ping, constant(None)),
        Path("ping_raw", "0b  PING, raw socket (no redis-py)", raw_ping, constant(None)),
        Path(
            "evalsha",
            "1a  minimal bucket EVALSHA, distinct keys",
            evalsha,
            sequence(lambda i: bucket_args(f"{prefix}-mb:{i}", 1000)),
            evalsha_keys,
        ),
        Path(
            "evalsha_hot",
            "1b  minimal bucket EVALSHA, one hot key",
            evalsha,
            constant(bucket_args(f"{prefix}-mb:hot", 1_000_000)),
            evalsha_keys,
            hot=True,
        ),
        Path(
            "hit",
            "2a  RedisBackend.hit(), distinct clients",
            hit,
            sequence(lambda i: (f"ip:{address(i, 198)}", anon_limits)),
            evalsha_keys,
        ),
        Path(
            "hit_hot",
            "2b  RedisBackend.hit(), one hot client",
            hit,
            constant(("user:bench-hot-backend", hot_limits)),
            evalsha_keys,
            hot=True,
        ),
        Path(
            "full_anon",
            "3a  PolicyThrottle, anonymous, distinct IPs",
            full,
            sequence(lambda i: requests.build(address(i, 10))),
            evalsha_keys,
            settle=push_usage,
        ),
        Path(
            "full_user_new",
            "3b  PolicyThrottle, users never seen before",
            full,
            users_source(info, requests, info["users"]),
            evalsha_keys,
            settle=push_usage,
        ),
        Path(
            "full_hot",
            "3c  PolicyThrottle, one hot user",
            full,
            sequence(lambda i: requests.build("192.0.2.2", hot_user)),
            evalsha_keys,
            hot=True,
            settle=push_usage,
        ),
        Path(
            "drf",
            "4   DRF UserRateThrottle (django-redis)",
            drf,
            Source(lambda start, n: ctx["drf_requests"][start : start + n], ctx["drf_clients"]),
            ("set",),
            fresh_keys=False,
        ),
    ]


def prefill_drf(ctx: dict[str, Any], clients: int) -> dict[str, Any]:
    """Give the first ``clients`` users a DRF history of ``DRF_HISTORY`` timestamps spread
    over the last 50 minutes, and build their requests; returns what the histories cost."""
    from django.contrib.auth import get_user_model
    from django.core.cache import cache

    server, info = ctx["server"], ctx["fixtures"]
    first = info["first_pk"]
    users = list(
        get_user_model().objects.filter(pk__gte=first, pk__lt=first + clients).order_by("pk")
    )
    requests = Requests()
    ctx["drf_requests"] = [requests.build("192.0.2.3", user)[0] for user in users]
    ctx["drf_clients"] = len(users)
    rng = random.Random(6)
    now = time.time()
    before = server.used_memory()
    for start in range(0, len(users), 500):
        batch = {}
        for user in users[start : start + 500]:
            ages = sorted(rng.uniform(0, 3000) for _ in range(DRF_HISTORY))
            batch[f"throttle_user_{user.pk}"] = [now - age for age in ages]
        cache.set_many(batch, timeout=3600)
    used = server.used_memory() - before
    sample = [cache.make_key(f"throttle_user_{u.pk}") for u in users[:: max(1, len(users) // 200)]]
    sizes = server.memory_usage(sample)
    return {
        "clients": len(users),
        "history": DRF_HISTORY,
        "used_memory_per_client": used / len(users),
        "memory_usage_per_key": sorted(sizes)[len(sizes) // 2],
    }
