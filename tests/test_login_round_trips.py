"""One Redis round trip per login check, however many counters apply: a login counted by IP
address and by username is one script call on a single server (before: one call per counter,
so a login counted by both made two before the password was checked), and a successful one
gives its tokens back in one more."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.contrib.auth import aauthenticate, authenticate
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from rest_framework.authtoken.views import ObtainAuthToken

from django_throttle.backends.base import Backend
from django_throttle.backends.redis import RedisBackend
from django_throttle.credentials import protect_credentials
from django_throttle.decorators import throttle
from django_throttle.drf import PolicyThrottle
from django_throttle.models import EndpointLimit, EndpointRule, Tier
from django_throttle.policy import live as policy
from tests.clients import AddressedAsyncClient

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.test_login_round_trips")]


def check_password(request: HttpRequest) -> HttpResponse:
    user = authenticate(
        request, username=request.POST.get("username"), password=request.POST.get("password")
    )
    return HttpResponse("in" if user is not None else "wrong", status=200 if user else 401)


async def acheck_password(request: HttpRequest) -> HttpResponse:
    user = await aauthenticate(
        request, username=request.POST.get("username"), password=request.POST.get("password")
    )
    return HttpResponse("in" if user is not None else "wrong", status=200 if user else 401)


sign_in = protect_credentials(check_password)
async_sign_in = protect_credentials(acheck_password)
# Under ``@throttle`` the tier's limits are counted in the same call as the rule's.
counted_sign_in = throttle(scope="login", credential=True)(check_password)
async_counted_sign_in = throttle(scope="login", credential=True)(acheck_password)


class TokenView(ObtainAuthToken):
    """DRF's token view under ``PolicyThrottle`` (its own ``throttle_classes`` are empty)."""

    throttle_classes = [PolicyThrottle]
    throttle_scope = "login"


urlpatterns = [
    path("login/", sign_in),
    path("async-login/", async_sign_in),
    path("counted-login/", counted_sign_in),
    path("async-counted-login/", async_counted_sign_in),
    path("token/", TokenView.as_view()),
]

#: The commands a login makes that reach the counters (every other command the server saw,
#: the policy version's GET, is no request's).
SCRIPT_COMMANDS = ("fcall", "evalsha", "eval")


def scripts_run(admin: redis.Redis) -> int:
    stats = admin.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in SCRIPT_COMMANDS)


def login(url: str, password: str, address: str) -> int:
    form = {"username": "bf1", "password": password}
    if url.startswith("/async"):
        response = async_to_sync(AddressedAsyncClient(address).post)(url, form)
    else:
        response = Client().post(url, form, REMOTE_ADDR=address)
    return int(response.status_code)


@pytest.mark.parametrize("url", ["/login/", "/async-login/"])
@pytest.mark.parametrize(
    ("counted_by", "failed", "successful"),
    [
        # Failed: the check's one call, the tokens kept. Successful: the check's call and
        # one refund of every counter's tokens.
        (("ip",), 1, 2),
        (("username",), 1, 2),
        (("ip", "username"), 1, 2),
    ],
)
def test_a_login_is_one_script_call(
    redis_client: redis.Redis,
    django_user_model: Any,
    settings: Any,
    url: str,
    counted_by: tuple[str, ...],
    failed: int,
    successful: int,
) -> None:
    settings.DJANGO_THROTTLE_USAGE_RETENTION_DAYS = 0  # no usage pushes: the login's calls only
    django_user_model.objects.create_user("bf1", password="right")
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    rule = EndpointRule.objects.create(name="login", pattern="login", counts="failures")
    for n, kind in enumerate(counted_by):
        EndpointLimit.objects.create(
            rule=rule, tier=anonymous, rate=f"{100 + n}/h", counted_by=kind
        )
    # Warm: the policy read, the functions loaded (a first FCALL, FUNCTION LOAD, FCALL).
    assert login(url, "wrong", "192.0.2.1") == 401
    assert login(url, "right", "192.0.2.1") == 200
    before = scripts_run(redis_client)
    assert login(url, "wrong", "192.0.2.2") == 401
    after_failure = scripts_run(redis_client)
    assert login(url, "right", "192.0.2.3") == 200
    after_success = scripts_run(redis_client)
    assert (after_failure - before, after_success - after_failure) == (failed, successful)


#: Attempts (address, username, password): failures spread over addresses and names, and
#: successes whose tokens come back, until the tier's, the address's and the name's limits
#: all refuse some.
ATTEMPTS = [
    ("192.0.2.1", "bf1", "wrong"),
    ("192.0.2.1", "bf1", "right"),
    ("192.0.2.2", "BF1", "wrong"),
    ("192.0.2.1", "other", "wrong"),
    ("192.0.2.3", "bf1", "wrong"),
    ("192.0.2.1", "bf1", "wrong"),
    ("192.0.2.4", "bf1", "right"),
    ("192.0.2.1", "x", "wrong"),
    ("192.0.2.1", "y", "wrong"),
    ("192.0.2.1", "z", "wrong"),
    ("192.0.2.1", "q", "right"),
    ("192.0.2.5", "q", "wrong"),
] * 2


def answers(url: str) -> list[tuple[Any, ...]]:
    """Each attempt's status and rate limit headers."""
    seen = []
    for address, username, password in ATTEMPTS:
        form = {"username": username, "password": password}
        if url.startswith("/async"):
            response = async_to_sync(AddressedAsyncClient(address).post)(url, form)
        else:
            response = Client().post(url, form, REMOTE_ADDR=address)
        wait = response.headers.get("Retry-After")
        seen.append(
            (
                response.status_code,
                response.headers.get("X-RateLimit-Limit"),
                response.headers.get("X-RateLimit-Remaining"),
                None if wait is None else int(wait),
            )
        )
    return seen


def alike(seen: list[tuple[Any, ...]], expected: list[tuple[Any, ...]]) -> bool:
    """Whether two runs of :data:`ATTEMPTS` got the same answers: ``Retry-After`` within
    half a minute (the runs are seconds apart, and a window's wait shrinks meanwhile)."""
    return len(seen) == len(expected) and all(
        a[:3] == b[:3] and (a[3] == b[3] or (None not in (a[3], b[3]) and abs(a[3] - b[3]) <= 30))
        for a, b in zip(seen, expected, strict=True)
    )


@pytest.mark.parametrize("url", ["/counted-login/", "/async-counted-login/", "/token/"])
def test_one_call_decides_as_one_call_per_counter(
    django_user_model: Any, settings: Any, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    """The tier's limits (one shared by every client), the address's and the username's,
    of several algorithms (windows of a day: no run sees one end), counted in one call of
    together.lua: every attempt gets the answer and headers it gets counted one call per
    counter (as on a Redis Cluster whose slots differ) and in the in-process store,
    successes given back alike."""
    django_user_model.objects.create_user("bf1", password="right")
    django_user_model.objects.create_user("q", password="right")
    anonymous = Tier.objects.create(slug="anonymous", name="Anonymous", is_default_anonymous=True)
    anonymous.limits.create(rate="9/min")
    anonymous.limits.create(rate="11/d", algorithm="sliding_window_log")
    anonymous.limits.create(rate="15/h", shared=True)
    rule = EndpointRule.objects.create(name="login", pattern="login", counts="failures")
    for counted_by, rate, algorithm in (
        ("ip", "6/min", "gcra"),
        ("username", "3/d", "fixed_window"),
        ("username", "4/d", "sliding_window_log"),
        ("client", "20/d", "sliding_window_counter"),
    ):
        EndpointLimit.objects.create(
            rule=rule, tier=anonymous, rate=rate, counted_by=counted_by, algorithm=algorithm
        )
    prefix = settings.DJANGO_THROTTLE_KEY_PREFIX
    together = answers(url)
    assert 429 in {status for status, *_ in together}
    settings.DJANGO_THROTTLE_KEY_PREFIX = prefix + "-apart"
    policy.reset()
    for name in ("hit_together", "ahit_together", "refund_together", "arefund_together"):
        monkeypatch.setattr(RedisBackend, name, getattr(Backend, name))
    assert alike(answers(url), together)
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    policy.reset()
    assert alike(answers(url), together)


def test_a_login_is_one_call_only_for_counters_of_one_key_shard(redis_url: str) -> None:
    """On one server with several key shards (``?shards=4``) a login's counters go in one
    call only when they share a shard's hash tag, as on a Cluster: one endpoint may be a
    proxy that clusters behind it and refuses a script over two tags (``CROSSSLOT``), which
    the request path would read as an outage. A pair in two shards is counted one call per
    counter (``None``: nothing sent)."""
    from django.test import override_settings

    from django_throttle.rates import Limit

    url = f"{redis_url}{'&' if '?' in redis_url else '?'}shards=4"
    with override_settings(DJANGO_THROTTLE_REDIS_URL=url):
        backend = RedisBackend()
    try:
        limits = (Limit.build("one-shard", "5/m"),)

        def tag(client: str) -> str:
            return backend.key(client, limits[0]).partition("}")[0]

        address = "ip:192.0.2.1"
        names = [f"username:user{n}" for n in range(64)]
        apart = next(name for name in names if tag(name) != tag(address))
        beside = next(name for name in names if tag(name) == tag(address))
        assert backend.hit_together(((address, limits), (apart, limits))) is None
        decisions = backend.hit_together(((address, limits), (beside, limits)))
        assert decisions is not None and [d.remaining for d in decisions] == [4, 4]
    finally:
        backend.close()
