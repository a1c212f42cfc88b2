"""One contract, both backends: the reference example, atomicity, TTLs, script-cache loss.

The Redis backend runs against the real redis-server the suite started; there is no mock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing
import random
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_throttle.backends import BackendError, get_backend, reset_backend_cache
from django_throttle.backends.base import Backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.redis import RETIME_FILES, RedisBackend, load_script
from django_throttle.headers import retry_after_seconds, whole_seconds
from django_throttle.rates import Limit, Rate
from tests.bucket_state import base36

T0 = 1_700_000_000.0
REFERENCE = Limit.build("ref", "2/s", burst=10)


@pytest.fixture(params=["redis", "memory"])
def backend(request: pytest.FixtureRequest, settings: object) -> Iterator[Backend]:
    if request.param == "memory":
        settings.DJANGO_THROTTLE_BACKEND = "django_throttle.backends.memory.MemoryBackend"  # type: ignore[attr-defined]
    instance = get_backend()
    assert isinstance(instance, RedisBackend if request.param == "redis" else MemoryBackend)
    yield instance


def enforced_twin(limit: Limit) -> Limit:
    """The same counter as an enforced limit: peeking at a shadow limit reports nothing."""
    return dataclasses.replace(limit, shadow=False)


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
    assert retry_after_seconds(denied.retry_after) == 1
    assert denied.remaining == 0
    # Honest Retry-After: after the advertised wait, the same request passes.
    assert backend.hit("ip:1", limits, now=T0 + 3 + retry_after_seconds(denied.retry_after)).allowed


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
    assert backend.peek("c", [enforced_twin(shadow)], now=T0).remaining == 0


def test_shadow_limit_does_not_hide_an_enforced_denial(backend: Backend) -> None:
    enforced = Limit.build("enforced", "1/m", burst=1)
    shadow = Limit.build("shadow", "100/m", shadow=True)
    assert backend.hit("c", [enforced, shadow], now=T0).allowed
    denied = backend.hit("c", [enforced, shadow], now=T0)
    assert not denied.allowed
    assert denied.limit == enforced
    # All-or-nothing still holds: the shadow limit was not charged for the denied request.
    assert backend.peek("c", [enforced_twin(shadow)], now=T0).remaining == 99


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


def _process_worker(
    url: str, prefix: str, barrier: object, out: object, n: int, source: str
) -> None:
    client = redis.Redis.from_url(url)
    script = client.register_script(source)
    backend_key = f"{prefix}:{{proc}}:race"
    barrier.wait()  # type: ignore[attr-defined]
    allowed = 0
    for _ in range(n):
        reply = script(keys=[backend_key], args=["1", "t10:360000000"])
        allowed += int(reply.split()[0]) & 1  # status + 4 x index
    out.put(allowed)  # type: ignore[attr-defined]


@pytest.mark.slow
def test_processes_racing_admit_exactly_capacity(redis_url: str, _isolated_throttle: str) -> None:
    """4 processes x 10 requests against capacity 10 on the server clock: exactly 10 pass."""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    workers = [
        ctx.Process(
            target=_process_worker,
            args=(redis_url, _isolated_throttle, barrier, out, 10, load_script()),
        )
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


def test_script_cache_flushed_again_during_the_reload_is_recovered(
    redis_backend: RedisBackend, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SCRIPT FLUSH (or failover) between a reload and the retried EVALSHA: redis-py's
    register_script fails with a second NOSCRIPT; the script is then sent with EVAL instead,
    and it counts exactly once."""
    load = redis_backend.client.script_load

    def load_then_flush(script: str) -> Any:
        sha = load(script)
        redis_client.script_flush()
        return sha

    monkeypatch.setattr(redis_backend.client, "script_load", load_then_flush)
    one = Limit.build("one", "1/m", burst=3)
    redis_client.script_flush()
    assert redis_backend.hit("c", [one]).allowed
    assert redis_backend.peek("c", [one]).remaining == 2


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


# --- Issue 5: honest waits, changed limits, bad state, shadow-only, bounded memory ---------


def test_retry_after_is_never_short(backend: Backend) -> None:
    """Defect 10: 1/2s, retried at +0.999999 s: the true wait is 1.000001 s, so the header
    must say 2 and a request at now + retry_after must pass; one 1 µs earlier fails. (Time
    is whole microseconds on both backends, like the server clock.)"""
    limit = Limit.build("slow", "1/2s")
    assert backend.hit("c", [limit], now=T0).allowed
    at = T0 + 0.999999
    denied = backend.hit("c", [limit], now=at)
    assert not denied.allowed
    assert denied.retry_after == pytest.approx(1.000001)
    assert retry_after_seconds(denied.retry_after) == 2
    assert not backend.hit("c", [limit], now=at + denied.retry_after - 1e-6).allowed
    assert backend.hit("c", [limit], now=at + denied.retry_after).allowed


def test_exact_waits_are_not_rounded_up_by_float_noise(backend: Backend) -> None:
    """7/s has an interval of 142857.142857… µs: a full bucket's 1 s must not become 2 s."""
    limit = Limit.build("seven", "7/s")
    decisions = [backend.hit("c", [limit], cost=7, now=T0), backend.hit("c", [limit], now=T0)]
    assert whole_seconds(decisions[0].reset_after) == 1
    assert retry_after_seconds(decisions[1].retry_after) == 1
    assert whole_seconds(decisions[1].reset_after) == 1
    slow = Limit.build("slow", "1/2s")
    backend.hit("d", [slow], now=T0)
    denied = backend.hit("d", [slow], now=T0)
    assert denied.retry_after == 2.0
    assert retry_after_seconds(denied.retry_after) == 2


def test_retry_after_is_an_upper_bound_for_many_rates(backend: Backend) -> None:
    """Property: for random rates, bursts, costs and times, a retry at now + retry_after and at
    now + the Retry-After header (whole seconds) passes. A small epoch keeps the test's own
    float seconds exact to far below a microsecond, as the server's integer clock is."""
    rng = random.Random(5)
    epoch = 1000.0
    for case in range(150):
        count = rng.randint(1, 100)
        period = rng.choice([1, 2, 7, 60, 90, 3600])
        limit = Limit.build(f"p{case}", Rate(count, period), burst=rng.randint(1, 2 * count))
        cost = rng.randint(1, limit.burst)
        start = epoch + rng.randint(0, 10**6) / 1e6
        at = start + rng.uniform(0, limit.window)
        for client in ("a", "b"):
            backend.hit(client, [limit], cost=limit.burst, now=start)
        denied = backend.hit("a", [limit], cost=cost, now=at)
        if denied.allowed:
            continue
        backend.hit("b", [limit], cost=cost, now=at)
        assert denied.retry_after <= limit.window + 1e-6, (case, limit, cost)
        assert backend.hit("a", [limit], cost=cost, now=at + denied.retry_after).allowed, case
        header = retry_after_seconds(denied.retry_after)
        assert backend.hit("b", [limit], cost=cost, now=at + header).allowed, case


def test_lowering_a_limit_hands_out_no_burst(backend: Backend) -> None:
    """Defect 3: drain 10/s, edit to 10/h and retime, wait 1.1 s: 0 of 12 requests pass."""
    fast = Limit.build("edited", "10/s", burst=10)
    slow = Limit.build("edited", "10/h", burst=10)
    clock = _Clock(T0)
    if isinstance(backend, MemoryBackend):
        backend.clock = clock
    assert sum(backend.hit("c", [fast]).allowed for _ in range(10)) == 10
    backend.hit("other", [fast])
    assert backend.retime([slow]) == 2
    if isinstance(backend, MemoryBackend):
        clock.now += 1.1
    else:
        time.sleep(1.1)  # the one real wait: the old TTL (1 s) must not empty the bucket
    assert sum(backend.hit("c", [slow]).allowed for _ in range(12)) == 0
    assert backend.hit("other", [slow]).allowed


def test_raising_a_limit_gives_the_headroom_at_once(backend: Backend) -> None:
    small = Limit.build("edited", "10/h", burst=10)
    big = Limit.build("edited", "20/h", burst=20)
    assert allowed_count(backend, "c", [small], 12, T0) == 10
    assert backend.retime([big], now=T0) == 1
    assert allowed_count(backend, "c", [big], 12, T0) == 10


def test_retime_touches_only_the_named_limit(backend: Backend) -> None:
    limits = [Limit.build(name, "10/m") for name in ("a", "ab", "b:a", "[a]")]
    for client in ("x", "y", "z"):
        backend.hit(client, limits, now=T0)
    assert backend.retime([Limit.build("a", "1/m")], now=T0) == 3
    assert backend.retime([Limit.build("[a]", "1/m")], now=T0) == 3
    assert backend.retime([Limit.build("missing", "1/m")], now=T0) == 0
    # "ab" and "b:a" kept their own expiry: still 9 of 10 left (2 tokens back in 12 s).
    assert backend.peek("x", [limits[1], limits[2]], now=T0 + 12).remaining == 10


def test_tightened_burst_keeps_an_empty_bucket_empty(backend: Backend) -> None:
    big = Limit.build("edited", "10/m", burst=10)
    small = Limit.build("edited", "10/m", burst=5)
    assert allowed_count(backend, "c", [big], 10, T0) == 10
    backend.retime([small], now=T0)
    assert not backend.hit("c", [small], now=T0 + 5).allowed
    # Empty, not "5 below empty": one token back after one interval (6 s).
    assert backend.hit("c", [small], now=T0 + 6).allowed


def test_shadow_only_decision_reports_no_limit(backend: Backend) -> None:
    """Defect 4: with no enforced limit, nothing is advertised; the shadow flag still says
    a shadow limit would have denied."""
    shadow = Limit.build("trial", "1/m", burst=1, shadow=True)
    first = backend.hit("c", [shadow], now=T0)
    second = backend.hit("c", [shadow], now=T0)
    for decision in (first, second):
        assert decision.allowed
        assert (decision.limit, decision.remaining, decision.reset_after) == (None, 0, 0.0)
        assert decision.limits == (shadow,)
    assert (first.shadow, second.shadow) == (False, True)


def _corrupt(backend: Backend, client: str, limit: Limit, state: str) -> None:
    if isinstance(backend, MemoryBackend):
        used, _, stamp = state.partition(" ")
        try:
            parsed = (float(used), float(stamp))
        except ValueError:
            return  # the memory backend cannot hold text; missing state is its twin
        if math.isfinite(parsed[0]) and math.isfinite(parsed[1]):  # nor write non-finite ones
            backend._state[(client, limit.id)] = (parsed, math.inf)
    else:
        assert isinstance(backend, RedisBackend)
        used, space, stamp = state.partition(" ")
        with contextlib.suppress(ValueError, OverflowError):
            stamp = base36(int(float(stamp)))  # the script stores µs stamps in base 36
        backend.client.set(backend.key(client, limit), used + space + stamp, px=3_600_000)


@pytest.mark.parametrize("state", ["garbage", "1", "x 5", "5 y", "nan 5", "inf 5", "5 inf", ""])
def test_corrupt_state_counts_as_a_full_bucket(backend: Backend, state: str) -> None:
    limit = Limit.build("corrupt", "10/m", burst=10)
    _corrupt(backend, "c", limit, state)
    decision = backend.hit("c", [limit], now=T0)
    assert decision.allowed
    assert decision.remaining == 9


def test_state_from_the_future_never_gives_negative_or_huge_waits(backend: Backend) -> None:
    """A key written by a clock an hour ahead, with a used count far past capacity: the wait
    is bounded by one full window, never negative (the key's TTL bounds how long it lives)."""
    limit = Limit.build("future", "1/s", burst=10)
    _corrupt(backend, "c", limit, f"1e12 {(T0 + 3600) * 1e6!r}")
    denied = backend.hit("c", [limit], now=T0)
    assert not denied.allowed
    assert 0 < denied.retry_after <= limit.window
    assert 0 <= denied.reset_after <= limit.window
    assert retry_after_seconds(denied.retry_after) == 1


@pytest.mark.parametrize("cost", [-1, 10**9 + 1, 1.5])
def test_bad_cost_is_refused_before_anything_is_counted(backend: Backend, cost: Any) -> None:
    with pytest.raises(BackendError, match="cost"):
        backend.hit("c", [REFERENCE], cost=cost, now=T0)
    assert backend.peek("c", [REFERENCE], now=T0).remaining == 10


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --- memory only -------------------------------------------------------------------------


def test_memory_backend_is_bounded_least_recently_used_first() -> None:
    backend = MemoryBackend(max_entries=100)
    one = Limit.build("one", "1/h", burst=1)
    assert backend.hit("kept", [one], now=T0).allowed
    for i in range(1000):
        backend.hit(f"client-{i}", [one], now=T0)
        # The drained client keeps knocking: recently used, so it is never forgotten.
        assert not backend.hit("kept", [one], now=T0).allowed
        assert len(backend) <= 100
    assert len(backend) == 100
    assert not backend.hit("client-999", [one], now=T0).allowed
    assert backend.hit("client-0", [one], now=T0).allowed  # forgotten: a full bucket again


def test_memory_backend_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        MemoryBackend(max_entries=0)


def test_local_fallback_backend_is_bounded_by_its_setting(settings: Any) -> None:
    from django_throttle.backends import get_local_backend

    settings.DJANGO_THROTTLE_LOCAL_FALLBACK_MAX_CLIENTS = 7
    local = get_local_backend()
    assert local is get_local_backend()
    assert local.max_entries == 7
    reset_backend_cache()
    assert get_local_backend() is not local


# --- Redis only: the script checks every argument before its first write ----------------

VALID_LIMIT = "t10:1000000"


def _script_args(*limits: str, op: str = "1") -> list[str]:
    return [op, *limits]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # Defect 11: cost 2^31-1 against 1/366d with capacity 2^31-1 overflowed SET PX after
        # the first key had been written.
        (
            _script_args(VALID_LIMIT, f"t{10**9}:{366 * 86400 * 10**6}", op=str(10**9)),
            "ARGV[3] capacity x interval",
        ),
        (
            _script_args(VALID_LIMIT, VALID_LIMIT, op=str(2**31 - 1)),
            "ARGV[1] must be 'p' or a cost",
        ),
        (_script_args(VALID_LIMIT, VALID_LIMIT, op="-1"), "ARGV[1] must be 'p' or a cost"),
        (_script_args(VALID_LIMIT, VALID_LIMIT, op="1.5"), "ARGV[1] must be 'p' or a cost"),
        (_script_args(VALID_LIMIT, VALID_LIMIT, op="hit"), "ARGV[1] must be 'p' or a cost"),
        (_script_args(VALID_LIMIT, "g10:1000000"), "ARGV[3] limit spec"),
        (_script_args(VALID_LIMIT, "token_bucket10:1000000"), "ARGV[3] limit spec"),
        (_script_args(VALID_LIMIT, "t0:1000000"), "ARGV[3] capacity"),
        (_script_args(VALID_LIMIT, "t2.5:1000000"), "ARGV[3] limit spec"),
        (_script_args(VALID_LIMIT, "tx:1000000"), "ARGV[3] limit spec"),
        (_script_args(VALID_LIMIT, "t10:0"), "ARGV[3] interval"),
        (_script_args(VALID_LIMIT, "t10:-5"), "ARGV[3] interval"),
        (_script_args(VALID_LIMIT, "t10:inf"), "ARGV[3] interval"),
        (_script_args(VALID_LIMIT, "t10:nan"), "ARGV[3] interval"),
        (_script_args(VALID_LIMIT, "t?10:1000000"), "ARGV[3] limit spec"),
        (_script_args(VALID_LIMIT, VALID_LIMIT)[:-1], "expected 3 arguments"),
        (_script_args(VALID_LIMIT, VALID_LIMIT, op="1@soon"), "ARGV[1] now"),
        (_script_args(VALID_LIMIT, VALID_LIMIT, op="1@1.5"), "ARGV[1] now"),
        (["1\n" + "f" * 201 + "\nc", VALID_LIMIT, VALID_LIMIT], "ARGV[1] usage field and client"),
        (["1\nf\n" + "c" * 201, VALID_LIMIT, VALID_LIMIT], "ARGV[1] usage field and client"),
    ],
)
def test_script_validates_every_argument_before_writing(
    redis_backend: RedisBackend, redis_client: redis.Redis, args: list[str], message: str
) -> None:
    keys = [redis_backend.key("c", Limit.build(name, "1/s")) for name in ("first", "second")]
    with pytest.raises(redis.ResponseError, match=re.escape(message)):
        redis_client.eval(load_script(), len(keys), *keys, *args)
    assert redis_client.exists(*keys) == 0


def test_retime_script_validates_its_arguments(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    limit = Limit.build("kept", "10/s")
    redis_backend.hit("c", [limit])
    key = redis_backend.key("c", limit)
    before = redis_client.pttl(key)
    args = [f"t{10**9}:{366 * 86400 * 10**6}", ""]
    with pytest.raises(redis.ResponseError, match=re.escape("ARGV[1] capacity x interval")):
        redis_client.eval(load_script(RETIME_FILES), 1, key, *args)
    assert 0 < redis_client.pttl(key) <= before


def test_retime_rewrites_ttls_without_keys_command(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    fast = Limit.build("edited", "10/s", burst=10)
    for i in range(25):
        redis_backend.hit(f"client-{i}", [fast], cost=10)
    keys_before = _command_calls(redis_client, "keys")
    assert redis_backend.retime([Limit.build("edited", "10/h", burst=10)]) == 25
    assert _command_calls(redis_client, "keys") == keys_before
    ttls = [redis_client.pttl(redis_backend.key(f"client-{i}", fast)) for i in range(25)]
    # 10 tokens used at 360 s each: an hour, less the few ms since the hits.
    assert all(3_590_000 < ttl <= 3_600_000 for ttl in ttls)


def _command_calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_decision_costs_at_most_180_bytes_on_the_wire(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    """Request + reply of one decision (one limit, an IPv4 client, a short tier name), as
    the server counts them: the byte budget of issue 6."""
    from django_throttle import usage

    limits = (Limit.build("t12", "100/m"),)
    field = usage.field_for("anonymous", "")
    redis_backend.hit("ip:203.0.113.7", limits, usage=field)  # connect and load the script
    stats = redis_client.info("stats")
    before = stats["total_net_input_bytes"] + stats["total_net_output_bytes"]
    for i in range(100):
        redis_backend.hit(f"ip:203.0.113.{i}", limits, usage=field)
    stats = redis_client.info("stats")
    after = stats["total_net_input_bytes"] + stats["total_net_output_bytes"]
    info_call = 2000  # generous bound for the INFO command and its reply in between
    assert (after - before - info_call) / 100 <= 180


def test_a_forked_child_never_reads_its_parents_replies(redis_backend: RedisBackend) -> None:
    """A child forked after the parent counted (gunicorn's preload) counts on a connection of
    its own, on its own bucket, and the parent's connection keeps working."""
    import os

    parent_sockets = {conn._sock.fileno() for conn, _ in redis_backend._stack._idle}

    limit = (Limit.build("forked", "100/h", burst=100),)
    assert redis_backend.hit("parent", limit).remaining == 99
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its own call was counted on its own bucket
        try:
            ok = redis_backend.hit("child", limit).remaining == 99
            mine = {conn._sock.fileno() for conn, _ in redis_backend._stack._idle}
            ok = ok and not mine & parent_sockets
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert redis_backend.hit("parent", limit).remaining == 98
    assert redis_backend.peek("child", limit).remaining == 99
