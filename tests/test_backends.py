"""One contract, both backends: the reference example, atomicity, TTLs, script-cache loss.

The Redis backend runs against the real redis-server the suite started; there is no mock.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator

import pytest
import redis

from django_throttle.backends import get_backend
from django_throttle.backends.base import Backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.redis import RedisBackend, load_script
from django_throttle.rates import Limit

T0 = 1_700_000_000.0
REFERENCE = Limit.build("ref", "2/s", burst=10)


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest, settings: object) -> Iterator[Backend]:
    if request.param == "memory":
        settings.DJANGO_THROTTLE_BACKEND = "django_throttle.backends.memory.MemoryBackend"  # type: ignore[attr-defined]
    instance = get_backend()
    assert isinstance(instance, RedisBackend if request.param == "redis" else MemoryBackend)
    yield instance


def allowed_count(backend: Backend, client: str, limits: list[Limit], n: int, at: float) -> int:
    return sum(backend.hit(client, limits, now=at).allowed for _ in range(n))


def test_reference_example(backend: Backend) -> None:
    """Capacity 10, refill 2/s: refill is continuous, never truncated to whole seconds."""
    limits = [REFERENCE]
    assert allowed_count(backend, "ip:1", limits, 5, T0) == 5
    assert backend.peek("ip:1", limits, now=T0).remaining == 5
    assert backend.peek("ip:1", limits, now=T0 + 1).remaining == 7
    assert backend.peek("ip:1", limits, now=T0 + 2).remaining == 9
    assert allowed_count(backend, "ip:1", limits, 4, T0 + 2) == 4
    assert backend.peek("ip:1", limits, now=T0 + 2).remaining == 5
    assert backend.peek("ip:1", limits, now=T0 + 3).remaining == 7
    decisions = [backend.hit("ip:1", limits, now=T0 + 3) for _ in range(8)]
    assert [d.allowed for d in decisions] == [True] * 7 + [False]
    denied = decisions[-1]
    assert denied.retry_after == pytest.approx(0.5)
    assert denied.retry_after_header == 1
    assert denied.remaining == 0
    # Honest Retry-After: after the advertised wait, the same request passes.
    assert backend.hit("ip:1", limits, now=T0 + 3 + denied.retry_after_header).allowed


def test_fractional_refill_is_exact(backend: Backend) -> None:
    limit = Limit.build("frac", "7/s", burst=7)
    assert allowed_count(backend, "u", [limit], 7, T0) == 7
    assert not backend.hit("u", [limit], now=T0).allowed
    # One token is back 1/7 s (142857.14 µs) later: not a microsecond before, but just after.
    assert not backend.hit("u", [limit], now=T0 + 0.142856).allowed
    assert backend.hit("u", [limit], now=T0 + 0.142858).allowed
    assert not backend.hit("u", [limit], now=T0 + 0.142858).allowed
    assert allowed_count(backend, "u", [limit], 8, T0 + 2) == 7


def test_headers_values_when_allowed(backend: Backend) -> None:
    decision = backend.hit("c", [REFERENCE], now=T0)
    assert decision.allowed
    assert decision.limit == REFERENCE
    assert decision.remaining == 9
    assert decision.reset_after == pytest.approx(0.5)
    assert decision.retry_after == 0


def test_all_or_nothing_across_limits(backend: Backend) -> None:
    roomy = Limit.build("roomy", "100/s", burst=100)
    tight = Limit.build("tight", "1/m", burst=2)
    limits = [roomy, tight]
    assert allowed_count(backend, "c", limits, 5, T0) == 2
    # The three denials consumed nothing from the roomy limit.
    assert backend.peek("c", [roomy], now=T0).remaining == 98
    denied = backend.hit("c", limits, now=T0)
    assert not denied.allowed
    assert denied.limit == tight
    assert denied.retry_after == pytest.approx(60.0)


def test_shadow_limit_counts_but_never_denies(backend: Backend) -> None:
    enforced = Limit.build("enforced", "10/m", burst=10)
    shadow = Limit.build("shadow", "1/m", burst=2, shadow=True)
    decisions = [backend.hit("c", [enforced, shadow], now=T0) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True] * 4
    assert [d.shadow for d in decisions] == [False, False, True, True]
    # Headers report the enforced limit, which paid for all four requests.
    assert decisions[-1].limit == enforced
    assert decisions[-1].remaining == 6
    # The shadow bucket was consumed while it allowed, and not past its capacity.
    assert backend.peek("c", [shadow], now=T0).remaining == 0


def test_shadow_limit_does_not_hide_an_enforced_denial(backend: Backend) -> None:
    enforced = Limit.build("enforced", "1/m", burst=1)
    shadow = Limit.build("shadow", "100/m", shadow=True)
    assert backend.hit("c", [enforced, shadow], now=T0).allowed
    denied = backend.hit("c", [enforced, shadow], now=T0)
    assert not denied.allowed
    assert denied.limit == enforced
    # All-or-nothing still holds: the shadow limit was not charged for the denied request.
    assert backend.peek("c", [shadow], now=T0).remaining == 99


def test_denial_reports_longest_wait(backend: Backend) -> None:
    a = Limit.build("a", "1/s", burst=1)
    b = Limit.build("b", "1/m", burst=1)
    backend.hit("c", [a, b], now=T0)
    denied = backend.hit("c", [a, b], now=T0)
    assert denied.limit == b
    assert denied.retry_after == pytest.approx(60.0)
    assert backend.hit("c", [a, b], now=T0 + 60).allowed


def test_allowed_reports_fewest_remaining(backend: Backend) -> None:
    a = Limit.build("a", "10/s", burst=10)
    b = Limit.build("b", "3/m", burst=3)
    decision = backend.hit("c", [a, b], now=T0)
    assert decision.limit == b
    assert decision.remaining == 2


def test_cost_takes_several_tokens(backend: Backend) -> None:
    assert backend.hit("c", [REFERENCE], 10, now=T0).allowed
    denied = backend.hit("c", [REFERENCE], 10, now=T0 + 1)
    assert not denied.allowed
    assert denied.retry_after == pytest.approx(4.0)
    assert backend.hit("c", [REFERENCE], 10, now=T0 + 5).allowed


def test_cost_above_capacity_is_clamped_so_a_full_bucket_serves_it(backend: Backend) -> None:
    assert backend.hit("c", [REFERENCE], 50, now=T0).allowed
    assert not backend.hit("c", [REFERENCE], 50, now=T0 + 1).allowed


def test_clients_and_limits_are_independent(backend: Backend) -> None:
    one = Limit.build("one", "1/m", burst=1)
    assert backend.hit("a", [one], now=T0).allowed
    assert backend.hit("b", [one], now=T0).allowed
    assert backend.hit("a", [Limit.build("two", "1/m", burst=1)], now=T0).allowed
    assert not backend.hit("a", [one], now=T0).allowed


def test_clock_going_back_mints_no_tokens(backend: Backend) -> None:
    one = Limit.build("one", "1/m", burst=1)
    assert backend.hit("c", [one], now=T0).allowed
    assert not backend.hit("c", [one], now=T0 - 3600).allowed


def test_reset_refills(backend: Backend) -> None:
    one = Limit.build("one", "1/h", burst=1)
    backend.hit("c", [one], now=T0)
    backend.reset("c", [one])
    assert backend.hit("c", [one], now=T0).allowed


def test_policy_version_moves_on_bump(backend: Backend) -> None:
    before = backend.get_policy_version()
    backend.bump_policy_version()
    assert backend.get_policy_version() != before


def _race_threads(backend: Backend, limit: Limit, n: int) -> int:
    results: list[bool] = []
    barrier = threading.Barrier(n)

    def worker() -> None:
        barrier.wait()
        results.append(backend.hit("racer", [limit]).allowed)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(results)


def test_threads_racing_admit_exactly_capacity(backend: Backend) -> None:
    limit = Limit.build("race", "10/h", burst=10)
    assert _race_threads(backend, limit, 8) == 8
    assert _race_threads(backend, limit, 8) == 2


# --- Redis only --------------------------------------------------------------------------


@pytest.fixture
def redis_backend() -> RedisBackend:
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    return backend


def _process_worker(url: str, prefix: str, barrier: object, out: object, n: int) -> None:
    client = redis.Redis.from_url(url)
    script = client.register_script(load_script())
    backend_key = f"{prefix}:{{proc}}:race"
    barrier.wait()  # type: ignore[attr-defined]
    allowed = 0
    for _ in range(n):
        reply = script(keys=[backend_key], args=["", 1, "hit", "token_bucket", 10, 360e6])
        allowed += reply[0]
    out.put(allowed)  # type: ignore[attr-defined]


@pytest.mark.slow
def test_processes_racing_admit_exactly_capacity(redis_url: str, _isolated_throttle: str) -> None:
    """4 processes x 10 requests against capacity 10 on the server clock: exactly 10 pass."""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    workers = [
        ctx.Process(target=_process_worker, args=(redis_url, _isolated_throttle, barrier, out, 10))
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    total = sum(out.get(timeout=60) for _ in workers)
    for worker in workers:
        worker.join(timeout=30)
    assert total == 10


def test_every_key_has_a_ttl_matching_refill(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    limits = [REFERENCE, Limit.build("day", "5000/d", burst=5000)]
    for _ in range(3):
        redis_backend.hit("ttl-client", limits)
    keys = list(redis_client.scan_iter(f"{redis_backend.prefix}:*"))
    assert len(keys) == 2
    ttls = {k.decode().rsplit(":", 1)[1]: redis_client.pttl(k) for k in keys}
    # 3 tokens at 2/s refill in 1.5 s; at 5000/day in 3 x 17.28 s.
    assert 1000 < ttls["ref"] <= 1500
    assert 50_000 < ttls["day"] <= 51_840


def test_keys_share_one_hash_tag_and_hide_the_client(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    client = "ip:{evil}:*"
    redis_backend.hit(client, [REFERENCE, Limit.build("b", "1/s")])
    keys = sorted(k.decode() for k in redis_client.scan_iter(f"{redis_backend.prefix}:*"))
    assert len(keys) == 2
    tags = {key.split("{", 1)[1].split("}", 1)[0] for key in keys}
    assert len(tags) == 1
    assert "evil" not in keys[0]


def test_one_round_trip_per_hit(redis_backend: RedisBackend, redis_client: redis.Redis) -> None:
    limits = [Limit.build(f"l{i}", "100/s") for i in range(5)]
    redis_backend.hit("warm", limits)
    before = _evalsha_calls(redis_client)
    for _ in range(20):
        redis_backend.hit("c", limits)
    assert _evalsha_calls(redis_client) - before == 20


def _evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def test_script_cache_loss_is_recovered(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    one = Limit.build("one", "1/m", burst=2)
    assert redis_backend.hit("c", [one]).allowed
    redis_client.script_flush()
    assert redis_backend.hit("c", [one]).allowed
    assert not redis_backend.hit("c", [one]).allowed


def test_server_clock_is_used(redis_backend: RedisBackend) -> None:
    one = Limit.build("one", "1/m", burst=1)
    assert redis_backend.hit("c", [one]).allowed
    denied = redis_backend.hit("c", [one])
    assert not denied.allowed
    assert 59 < denied.retry_after <= 60


def test_default_client_has_short_timeouts_and_no_retries(settings: object) -> None:
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}  # type: ignore[attr-defined]
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    kwargs = backend.client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] <= 0.1
    assert kwargs["socket_connect_timeout"] <= 0.1
    assert kwargs["retry"].get_retries() == 0


def test_unreachable_redis_raises_backend_error_quickly(settings: object) -> None:
    from django_throttle.backends import BackendError

    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # type: ignore[attr-defined]
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}  # type: ignore[attr-defined]
    with pytest.raises(BackendError):
        get_backend().hit("c", [REFERENCE])
