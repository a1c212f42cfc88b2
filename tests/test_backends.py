"""One contract, both backends: the reference example, atomicity, TTLs, script-cache loss.

The Redis backend runs against the real redis-server the suite started; there is no mock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import math
import multiprocessing
import random
import re
import threading
import time
from typing import Any

import pytest
import redis

from django_throttle import backends
from django_throttle.backends import BackendError, get_backend, reset_backend_cache
from django_throttle.backends.base import Backend
from django_throttle.backends.memory import MemoryBackend
from django_throttle.backends.redis import RedisBackend
from django_throttle.backends.scripts import RETIME_FILES, function_name, library, load_script
from django_throttle.rates import Limit, Rate
from django_throttle.request.core import retry_after_seconds, whole_seconds
from django_throttle.usage.accounting import get_store
from tests.bucket_state import pack_bucket, unpack_bucket
from tests.redis_servers import attempts, forget_code, script_calls_of

T0 = 1_700_000_000.0
REFERENCE = Limit.build("ref", "2/s", burst=10)


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
    # An hour's refill: the roomy bucket's key (TTL: the time its two used tokens take to come
    # back, in real time) outlives a slow machine's test; at 100/s it expired after 20 ms.
    roomy = Limit.build("roomy", "100/h", burst=100)
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
        reply = script(keys=[backend_key], args=["1", "0", "t10:360000000"])
        allowed += int(reply[0])  # [allowed, index, ...]
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
    # Refill times of a minute or more: the seconds a loaded machine may take between the
    # hits and PTTL are far inside the bounds.
    limits = [Limit.build("ref", "2/min", burst=10), Limit.build("day", "5000/d", burst=5000)]
    for _ in range(3):
        redis_backend.hit("ttl-client", limits)
    keys = list(redis_client.scan_iter(f"{redis_backend.prefix}:*"))
    assert len(keys) == 2
    ttls = {limit.id: redis_client.pttl(redis_backend.key("ttl-client", limit)) for limit in limits}
    # 3 tokens at 2/min refill in 90 s; at 5000/day in 3 x 17.28 s.
    assert 60_000 < ttls["ref"] <= 90_000
    assert 30_000 < ttls["day"] <= 51_840


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
    return script_calls_of(client)


def test_script_cache_loss_is_recovered(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    one = Limit.build("one", "1/m", burst=2)
    assert redis_backend.hit("c", [one]).allowed
    forget_code(redis_client)
    assert redis_backend.hit("c", [one]).allowed
    assert not redis_backend.hit("c", [one]).allowed


def test_each_mix_of_algorithms_runs_a_script_defining_only_those_algorithms(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    """Redis runs a script's whole body on every call, so every algorithm a script defines
    costs each decision: a call uses a script with just its limits' algorithms (and the
    ones they reuse), each mix loaded and recovered after a flush on its own."""
    bucket = Limit.build("b", "5/m")
    leaky = Limit.build("l", "5/m", algorithm="leaky_bucket")
    gcra = Limit.build("g", "5/m", algorithm="gcra")
    quota = Limit.build("q", "5/day", algorithm="calendar_quota")
    mixes = ((bucket,), (leaky, gcra), (quota,), (bucket, leaky, gcra, quota))
    registered = re.compile(r"^ALGORITHMS\['(\w)'\] =", re.MULTILINE)
    defined = {}
    for mix in mixes:
        _, source = redis_backend._calls.script(mix)
        defined[mix] = set(registered.findall(source))
    assert defined[(bucket,)] == {"t"}
    assert defined[(leaky, gcra)] == {"t", "l", "g"}
    assert defined[(quota,)] == {"f", "c"}
    assert defined[mixes[-1]] == {"t", "l", "g", "f", "c"}
    for round_ in range(2):
        forget_code(redis_client)
        for n, mix in enumerate(mixes):
            decision = redis_backend.hit(f"mix-{round_}-{n}", mix)
            assert decision.allowed and decision.remaining == 4
    shas = [redis_backend._calls.script(mix)[0] for mix in mixes]
    assert len(set(shas)) == len(mixes)
    loaded = {entry["library_name"] for entry in _libraries(redis_client)}
    assert {function_name(sha).encode() for sha in shas} <= loaded


def _libraries(client: redis.Redis) -> list[dict[str, Any]]:
    """The server's function libraries (``FUNCTION LIST``), each a dict of its fields."""
    found = []
    for entry in client.function_list():
        fields = (
            entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2], strict=True))
        )
        found.append({(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()})
    return found


@pytest.mark.parametrize(
    "n", [1, 10, 100, 1000, 3600000, 86_400_000_000, 1_234_000, 10**15, 2**53 - 1, 316224e9]
)
def test_compact_numbers_in_specs_are_read_exactly_by_lua(
    redis_client: redis.Redis, n: float
) -> None:
    from django_throttle.backends.redis import compact

    text = compact(int(n))
    assert len(text) <= len(str(int(n)))
    same = "return tonumber(ARGV[1]) == tonumber(ARGV[2]) and 1 or 0"
    assert redis_client.eval(same, 0, text, str(int(n))) == 1


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, digit = divmod(n, 36)
        out = digits[digit] + out
        if n == 0:
            return out


def test_window_stamps_are_written_in_base_36_on_both_paths(redis_client: redis.Redis) -> None:
    """windows.lua's to36 writes ten-digit numbers (every microsecond timestamp from 1973 to
    2085) in one string.char call and others digit by digit: both give Python's base 36,
    at the edges of the fast path and between."""
    rng = random.Random(36)
    numbers = [0, 1, 9, 10, 35, 36, 36**9 - 1, 36**9, 36**9 + 1, 36**10 - 1, 36**10, 2**53 - 1]
    numbers += [round(time.time() * 1e6), 1_733_456_789_123_456, 2_085_000_000_000_000]
    numbers += [rng.randrange(36**9, 36**10) for _ in range(40)]
    numbers += [rng.randrange(0, 2**53) for _ in range(40)]
    script = load_script(("prelude.lua", "windows.lua")) + (
        "\nlocal out = {}\nfor i, n in ipairs(ARGV) do out[i] = to36(tonumber(n)) end\nreturn out"
    )
    got = redis_client.eval(script, 0, *map(str, numbers))
    assert [text.decode() for text in got] == [_base36(n) for n in numbers]


def test_script_cache_flushed_again_during_the_reload_is_recovered(
    redis_backend: RedisBackend, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Functions flushed (or a failover) between the library's load and the call sent again:
    that call answers "no such function" again (nothing ran); the script is then sent with
    EVAL, which carries its source, and it counts exactly once."""
    from django_throttle.backends import redis_nodes

    def other_library(sha: str, source: str) -> str:  # loads, but not the function called
        return library("f" * 40, source)

    monkeypatch.setattr(redis_nodes, "library", other_library)
    one = Limit.build("one", "1/m", burst=3)
    forget_code(redis_client)
    assert redis_backend.hit("c", [one]).allowed
    assert redis_backend.peek("c", [one]).remaining == 2
    forget_code(redis_client)
    assert asyncio.run(redis_backend.ahit("c", [one])).remaining == 1


def test_server_clock_is_used(redis_backend: RedisBackend) -> None:
    one = Limit.build("one", "1/m", burst=1)
    started = time.monotonic()
    assert redis_backend.hit("c", [one]).allowed
    denied = redis_backend.hit("c", [one])
    between = time.monotonic() - started  # at least the server time between the two calls
    assert not denied.allowed
    assert 60 - between - 0.001 <= denied.retry_after <= 60


def test_default_client_has_short_timeouts_and_no_retries(settings: object) -> None:
    settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}  # type: ignore[attr-defined]
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    kwargs = backend.client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] <= 0.1
    assert kwargs["socket_connect_timeout"] <= 0.1
    assert attempts(kwargs["retry"]) == 1


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
    """Defect 3: drain 10/s, edit to 10/h and retime, wait 1.1 s: 0 of 12 requests pass.

    Every call names its instant (the memory backend's clock, the script's ``now``), so the
    drained state cannot refill while a loaded machine is slow between calls. On Redis the
    wait is also real: the key's old TTL (1 s) must not run out and empty the bucket, and a
    longer wait only makes that check stricter."""
    fast = Limit.build("edited", "10/s", burst=10)
    slow = Limit.build("edited", "10/h", burst=10)
    clock = _Clock(T0)
    if isinstance(backend, MemoryBackend):
        backend.clock = clock
    assert sum(backend.hit("c", [fast], now=T0).allowed for _ in range(10)) == 10
    backend.hit("other", [fast], now=T0)
    assert backend.retime([slow], now=T0) == 2
    if isinstance(backend, MemoryBackend):
        clock.now += 1.1
    else:
        time.sleep(1.1)  # the one real wait: the old TTL (1 s) must not empty the bucket
    later = T0 + 1.1
    assert sum(backend.hit("c", [slow], now=later).allowed for _ in range(12)) == 0
    assert backend.hit("other", [slow], now=later).allowed


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
    """Write ``state`` as the client's token bucket key, in the script's binary form where
    the text has one (the memory backend's store takes the same bytes)."""
    assert isinstance(backend, RedisBackend)
    used, _, stamp = state.partition(" ")
    raw: bytes | str = state
    with contextlib.suppress(ValueError, OverflowError):
        # The script's binary state (non-finite used included), where the text has one.
        raw = pack_bucket(float(used), int(float(stamp)) // 1000, compact=False)
    backend.client.set(backend.key(client, limit), raw, px=3_600_000)


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


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_bounded_store_never_forgets_a_counter_that_denied(mode: str) -> None:
    """A spent 10/h counter, then a fresh client per request whose one request starts a
    counter living a day (a fixed window of 1000/day): the store filled with keys that
    outlive the spent one, and it was forgotten after as many requests as the store holds
    keys, its ten attempts given back. A counter that denied is kept while it lives."""
    from asgiref.sync import async_to_sync

    now = [T0]
    backend = MemoryBackend(clock=lambda: now[0], max_entries=100)
    spent, daily = (
        Limit.build("name", "10/h"),
        Limit.build("day", "1000/day", algorithm="fixed_window"),
    )

    def hit(client: str, limit: Limit) -> bool:
        if mode == "async":
            return async_to_sync(backend.ahit)(client, [limit]).allowed
        return backend.hit(client, [limit]).allowed

    assert [hit("user:victim", spent) for _ in range(11)] == [True] * 10 + [False]
    for n in range(1000):
        now[0] += 0.001
        assert hit(f"key:{n}", daily)
        assert len(backend) <= 100
    assert not hit("user:victim", spent)


def test_a_store_full_of_kept_counters_counts_new_clients_together() -> None:
    """When every key is kept, a new client's counter is the shared overflow counter of its
    limit: limiting goes on, more strictly, and memory stays within the bound plus that
    counter, whatever the number of clients. Once kept counters expire, new clients get
    counters of their own again."""
    now = [T0]
    backend = MemoryBackend(clock=lambda: now[0], max_entries=50)
    one, five = Limit.build("one", "1/h"), Limit.build("five", "5/h")
    for n in range(50):
        assert backend.hit(f"spent:{n}", [one]).allowed
        assert not backend.hit(f"spent:{n}", [one]).allowed
    fresh = [backend.hit(f"fresh:{n}", [five]).allowed for n in range(1000)]
    assert fresh == [True] * 5 + [False] * 995
    assert len(backend) == 51
    assert not any(backend.hit(f"spent:{n}", [one]).allowed for n in range(50))
    now[0] += 3601  # the kept counters expired: room again
    assert [backend.hit("late", [five]).allowed for _ in range(6)] == [True] * 5 + [False]
    assert backend.hit("later", [five]).allowed


def test_a_bounded_store_keeps_counters_safely_from_many_threads() -> None:
    """Threads keep their spent counters while others fill the store: every keep and every
    eviction happens under the store's lock, so none fails and the bound holds."""
    backend = MemoryBackend(max_entries=64)
    one = Limit.build("one", "1/h")
    errors: list[BaseException] = []

    def work(thread: int) -> None:
        try:
            for n in range(300):
                backend.hit(f"t{thread}-{n}", [one])
                backend.hit(f"t{thread}-{n}", [one])  # denied: kept
                backend.keep(f"t{thread}-{n - 1}", [one])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(backend) <= 64 + 1


def test_memory_backend_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        MemoryBackend(max_entries=0)


@pytest.mark.django_db
def test_memory_url_keeps_worker_memory_bounded_whatever_addresses_clients_send(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``memory://`` on a site limited per day: 5,000 fresh /64s through the request path,
    sync and async, leave at most the bound's keys in the worker (each client's counter
    would otherwise live a day)."""
    from asgiref.sync import async_to_sync
    from django.test import RequestFactory

    from django_throttle.backends import memory
    from django_throttle.request import core
    from tests.factories import tier

    monkeypatch.setattr(memory, "MAX_ENTRIES", 1000, raising=False)
    settings.DJANGO_THROTTLE_REDIS_URL = "memory://"
    tier("anonymous", "100/day", is_default_anonymous=True)
    rf = RequestFactory()
    for i in range(5000):
        request = rf.get(f"/api/ping/?i={i}", REMOTE_ADDR=f"2001:db8:{i >> 8:x}:{i & 255:x}::1")
        check = core.check if i % 2 else async_to_sync(core.acheck)
        assert check(request).allowed
    backend = get_backend()
    assert isinstance(backend, MemoryBackend)
    assert len(backend) <= 1000


def test_local_fallback_backend_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_throttle.backends import get_local_backend

    monkeypatch.setattr(backends, "LOCAL_FALLBACK_MAX_CLIENTS", 7)
    local = get_local_backend()
    assert local is get_local_backend()
    assert local.max_entries == 7
    reset_backend_cache()
    assert get_local_backend() is not local


# --- Redis only: the script checks every argument before its first write ----------------

VALID_LIMIT = "t10:1000000"


def _script_args(*limits: str, cost: str = "1", peek: str = "0", now: str = "") -> list[str]:
    return [cost, peek, *limits, now]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # Defect 11: cost 2^31-1 against 1/366d with capacity 2^31-1 overflowed SET PX after
        # the first key had been written.
        (
            _script_args(VALID_LIMIT, f"t{10**9}:{366 * 86400 * 10**6}", cost=str(10**9)),
            "ARGV[4] capacity x interval",
        ),
        (
            _script_args(VALID_LIMIT, VALID_LIMIT, cost=str(2**31 - 1)),
            "ARGV[1] cost must be a whole number",
        ),
        (_script_args(VALID_LIMIT, VALID_LIMIT, cost="-1"), "ARGV[1] cost must be a whole number"),
        (_script_args(VALID_LIMIT, VALID_LIMIT, cost="1.5"), "ARGV[1] cost must be a whole number"),
        (_script_args(VALID_LIMIT, VALID_LIMIT, cost="hit"), "ARGV[1] cost must be a whole number"),
        (_script_args(VALID_LIMIT, "x10:1000000"), "ARGV[4] limit spec"),
        (_script_args(VALID_LIMIT, "token_bucket10:1000000"), "ARGV[4] limit spec"),
        (_script_args(VALID_LIMIT, "t0:1000000"), "ARGV[4] capacity"),
        (_script_args(VALID_LIMIT, "t2.5:1000000"), "ARGV[4] limit spec"),
        (_script_args(VALID_LIMIT, "tx:1000000"), "ARGV[4] limit spec"),
        (_script_args(VALID_LIMIT, "t10:0"), "ARGV[4] interval"),
        (_script_args(VALID_LIMIT, "t10:-5"), "ARGV[4] interval"),
        (_script_args(VALID_LIMIT, "t10:inf"), "ARGV[4] interval"),
        (_script_args(VALID_LIMIT, "t10:nan"), "ARGV[4] interval"),
        (_script_args(VALID_LIMIT, "t?10:1000000"), "ARGV[4] limit spec"),
        (
            _script_args(VALID_LIMIT, VALID_LIMIT)[:-2],
            "expected 4 to 6 arguments for 2 keys, got 3",
        ),
        (_script_args(VALID_LIMIT, VALID_LIMIT, peek="yes"), "ARGV[2] peek must be '0' or '1'"),
        (_script_args(VALID_LIMIT, VALID_LIMIT, now="soon"), "ARGV[5] now"),
        (_script_args(VALID_LIMIT, VALID_LIMIT, now="1.5"), "ARGV[5] now"),
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
    limit = Limit.build("kept", "10/h")  # a TTL of minutes: it cannot run out meanwhile
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
    # 10/min: each key lives 60 s, so none expires before the retime however slow the hits.
    fast = Limit.build("edited", "10/min", burst=10)
    for i in range(25):
        redis_backend.hit(f"client-{i}", [fast], cost=10)
    keys_before = _command_calls(redis_client, "keys")
    assert redis_backend.retime([Limit.build("edited", "10/h", burst=10)]) == 25
    assert _command_calls(redis_client, "keys") == keys_before
    ttls = [redis_client.pttl(redis_backend.key(f"client-{i}", fast)) for i in range(25)]
    # 10 tokens used at 360 s each: an hour, less the time since the hits (generously).
    assert all(3_000_000 < ttl <= 3_600_000 for ttl in ttls)


def _command_calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.mark.parametrize("counts_usage", [False, True], ids=["no usage", "usage"])
def test_a_decision_costs_at_most_190_bytes_on_the_wire_usage_counted_or_not(
    redis_backend: RedisBackend, redis_client: redis.Redis, counts_usage: bool
) -> None:
    """Request + reply of one decision (one limit, an IPv4 client, a short tier name), as
    the server counts them: issue 6's budget of 180 bytes plus the plain arguments and
    array reply of issue 31 (cost, peek and clock apart, seven integers back), the same with
    usage counted (it is counted in the process and pushed apart, never sent with a
    decision)."""
    from django_throttle.usage import accounting as usage

    limits = (Limit.build("t12", "100/m"),)
    field = usage.field_for("anonymous", "") if counts_usage else None
    redis_backend.hit("ip:203.0.113.7", limits, usage=field)  # connect and load the script
    stats = redis_client.info("stats")
    before = stats["total_net_input_bytes"] + stats["total_net_output_bytes"]
    for i in range(100):
        redis_backend.hit(f"ip:203.0.113.{i}", limits, usage=field)
    stats = redis_client.info("stats")
    after = stats["total_net_input_bytes"] + stats["total_net_output_bytes"]
    info_call = 2000  # generous bound for the INFO command and its reply in between
    assert (after - before - info_call) / 100 <= 190


def test_a_forked_child_never_reads_its_parents_replies(redis_backend: RedisBackend) -> None:
    """A child forked after the parent counted (gunicorn's preload) counts on a connection of
    its own, on its own bucket, and the parent's connection keeps working."""
    import os

    limit = (Limit.build("forked", "100/h", burst=100),)
    assert redis_backend.hit("parent", limit).remaining == 99
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its own call was counted on its own bucket
        try:
            ok = redis_backend.hit("child", limit).remaining == 99
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert redis_backend.hit("parent", limit).remaining == 98
    assert redis_backend.peek("child", limit).remaining == 99


# --- Every algorithm -------------------------------------------------------------------------

#: One limit per algorithm admitting 10 at once, with a refill or window of 5 s.
ALGORITHM_LIMITS = {
    "token_bucket": Limit.build("t12", "2/s", burst=10),
    "gcra": Limit.build("t12", "2/s", burst=10, algorithm="gcra"),
    "leaky_bucket": Limit.build("t12", "2/s", burst=10, algorithm="leaky_bucket"),
    "fixed_window": Limit.build("t12", "10/5s", algorithm="fixed_window"),
    "sliding_window_log": Limit.build("t12", "10/5s", algorithm="sliding_window_log"),
    "sliding_window_counter": Limit.build("t12", "10/5s", algorithm="sliding_window_counter"),
    "calendar_quota": Limit.build("t12", "10/day", algorithm="calendar_quota"),
}
#: Algorithms whose retry-after is exact: a microsecond earlier is still denied.
EXACT = ("token_bucket", "gcra", "leaky_bucket", "fixed_window", "sliding_window_log")
ALGORITHMS = pytest.mark.parametrize("algorithm", list(ALGORITHM_LIMITS))
#: A grid-aligned instant (a multiple of every window above, UTC midnight): 2023-11-15.
MIDNIGHT = 1_700_006_400.0


@ALGORITHMS
def test_each_algorithm_admits_its_capacity_then_denies_honestly(
    backend: Backend, algorithm: str
) -> None:
    limit = ALGORITHM_LIMITS[algorithm]
    limits = [limit]
    at = MIDNIGHT + 1
    decisions = [backend.hit("c", limits, now=at) for _ in range(11)]
    assert [d.allowed for d in decisions] == [True] * 10 + [False]
    assert [d.remaining for d in decisions] == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0]
    denied = decisions[-1]
    assert denied.limit == limit
    assert 0 < denied.retry_after <= limit.window
    assert 0 <= denied.reset_after <= 2 * limit.window
    if algorithm in EXACT:
        assert not backend.hit("c", limits, now=at + denied.retry_after - 1e-6).allowed
    assert backend.hit("c", limits, now=at + denied.retry_after).allowed


@ALGORITHMS
def test_each_algorithm_denial_takes_nothing(backend: Backend, algorithm: str) -> None:
    limit = ALGORITHM_LIMITS[algorithm]
    assert backend.hit("c", [limit], cost=8, now=MIDNIGHT).allowed
    denied = backend.hit("c", [limit], cost=3, now=MIDNIGHT)
    assert not denied.allowed
    assert denied.remaining == 2
    assert backend.hit("c", [limit], cost=2, now=MIDNIGHT).allowed


@ALGORITHMS
def test_each_algorithm_peek_counts_nothing(backend: Backend, algorithm: str) -> None:
    limit = ALGORITHM_LIMITS[algorithm]
    backend.hit("c", [limit], cost=4, now=MIDNIGHT)
    for _ in range(3):
        assert backend.peek("c", [limit], now=MIDNIGHT).remaining == 6


def test_mixed_algorithms_are_all_or_nothing(backend: Backend) -> None:
    """Seven algorithms in one call: the one that denies stops every other from counting."""
    roomy = [
        dataclasses.replace(limit, id=f"r{i}") for i, limit in enumerate(ALGORITHM_LIMITS.values())
    ]
    tight = Limit.build("tight", "2/h", algorithm="fixed_window")
    limits = [*roomy, tight]
    assert allowed_count(backend, "c", limits, 5, MIDNIGHT) == 2
    for limit in roomy:
        assert backend.peek("c", [limit], now=MIDNIGHT).remaining == 8, limit.algorithm
    denied = backend.hit("c", limits, now=MIDNIGHT)
    assert denied.limit == tight
    assert denied.retry_after == 3600


def test_a_denying_calendar_quota_reports_the_longest_wait(backend: Backend) -> None:
    quota = Limit.build("quota", "2/month", algorithm="calendar_quota")
    burst = Limit.build("burst", "1/s", burst=1, algorithm="gcra")
    backend.hit("c", [quota, burst], now=MIDNIGHT)
    backend.hit("c", [quota, burst], now=MIDNIGHT + 1)
    denied = backend.hit("c", [quota, burst], now=MIDNIGHT + 1)
    assert denied.limit == quota
    # 2023-11-15 00:00:01 UTC to 2023-12-01 00:00 UTC.
    assert denied.retry_after == 16 * 86400 - 1


def test_gcra_is_exact_in_whole_microseconds(backend: Backend) -> None:
    limit = Limit.build("g", "3/s", burst=3, algorithm="gcra")  # 333,333 µs per request
    assert allowed_count(backend, "c", [limit], 4, MIDNIGHT) == 3
    denied = backend.hit("c", [limit], now=MIDNIGHT)
    assert denied.retry_after == pytest.approx(0.333333, abs=1e-9)
    assert denied.reset_after == pytest.approx(0.999999, abs=1e-9)
    assert not backend.hit("c", [limit], now=MIDNIGHT + 0.333332).allowed
    assert backend.hit("c", [limit], now=MIDNIGHT + 0.333333).allowed


def test_fixed_window_lets_twice_the_count_through_across_a_boundary(backend: Backend) -> None:
    """The documented price of one counter per window: C at the end of one window and C at
    the start of the next, within one period."""
    limit = ALGORITHM_LIMITS["fixed_window"]
    assert allowed_count(backend, "c", [limit], 11, MIDNIGHT + 4.9) == 10
    assert allowed_count(backend, "c", [limit], 11, MIDNIGHT + 5.0) == 10


def test_sliding_log_waits_for_the_oldest_entries_to_leave(backend: Backend) -> None:
    limit = ALGORITHM_LIMITS["sliding_window_log"]
    for second in range(5):
        assert allowed_count(backend, "c", [limit], 2, MIDNIGHT + second) == 2
    denied = backend.hit("c", [limit], cost=3, now=MIDNIGHT + 4.5)
    # Three must leave: two taken at +0, one at +1: the third leaves at +6.
    assert denied.retry_after == pytest.approx(1.5)
    assert denied.reset_after == pytest.approx(4.5)
    assert not backend.hit("c", [limit], cost=3, now=MIDNIGHT + 5.999999).allowed
    assert backend.hit("c", [limit], cost=3, now=MIDNIGHT + 6).allowed


def test_sliding_counter_weighs_the_previous_window(backend: Backend) -> None:
    limit = ALGORITHM_LIMITS["sliding_window_counter"]
    assert allowed_count(backend, "c", [limit], 10, MIDNIGHT) == 10
    # 1 s into the next window, the previous one still weighs 4/5 x 10 = 8.
    assert backend.peek("c", [limit], now=MIDNIGHT + 6).remaining == 2
    assert allowed_count(backend, "c", [limit], 5, MIDNIGHT + 6) == 2
    denied = backend.hit("c", [limit], now=MIDNIGHT + 6)
    # 8 + 2 + 1 > 10 until the previous window weighs 7: at 1.5 s into the window.
    assert denied.retry_after == pytest.approx(0.5)
    assert backend.hit("c", [limit], now=MIDNIGHT + 6.5).allowed


def test_calendar_quota_resets_at_local_midnight(backend: Backend) -> None:
    """A daily quota in Berlin (UTC+1 in November) resets at 23:00 UTC."""
    limit = Limit.build("q", "3/day", algorithm="calendar_quota", timezone="Europe/Berlin")
    before = MIDNIGHT - 3600 - 10  # 22:59:50 UTC, 23:59:50 in Berlin
    assert allowed_count(backend, "c", [limit], 4, before) == 3
    denied = backend.hit("c", [limit], now=before)
    assert denied.retry_after == 10
    assert allowed_count(backend, "c", [limit], 4, before + 10) == 3


def test_calendar_quota_month_across_daylight_saving(backend: Backend) -> None:
    """October 2026 in Berlin has 31 days and a 25-hour day: the quota ends at 23:00 UTC on
    31 October, not at 22:00 (CEST's midnight)."""
    limit = Limit.build("q", "1/month", algorithm="calendar_quota", timezone="Europe/Berlin")
    oct_31_2200_utc = 1_793_484_000.0  # 2026-10-31 22:00 UTC = 23:00 CET
    assert backend.hit("c", [limit], now=oct_31_2200_utc).allowed
    denied = backend.hit("c", [limit], now=oct_31_2200_utc)
    assert denied.retry_after == 3600
    assert backend.hit("c", [limit], now=oct_31_2200_utc + 3600).allowed


# --- Every algorithm, Redis only ---------------------------------------------------------


#: The limits of ALGORITHM_LIMITS with periods of minutes: a key's TTL is a minute or more,
#: so however slow the machine is between a hit and PTTL, the key is still there to read.
TTL_LIMITS = {
    "token_bucket": Limit.build("t12", "2/min", burst=10),
    "gcra": Limit.build("t12", "2/min", burst=10, algorithm="gcra"),
    "leaky_bucket": Limit.build("t12", "2/min", burst=10, algorithm="leaky_bucket"),
    "fixed_window": Limit.build("t12", "10/5min", algorithm="fixed_window"),
    "sliding_window_log": Limit.build("t12", "10/5min", algorithm="sliding_window_log"),
    "sliding_window_counter": Limit.build("t12", "10/5min", algorithm="sliding_window_counter"),
    "calendar_quota": Limit.build("t12", "10/day", algorithm="calendar_quota"),
}


@ALGORITHMS
def test_each_algorithm_key_has_a_ttl(
    redis_backend: RedisBackend, redis_client: redis.Redis, algorithm: str
) -> None:
    limit = TTL_LIMITS[algorithm]
    # A second into the current window (on the windows' grid), so a window's key lives for
    # the rest of it: TTLs are relative to the instant the script is given.
    period = limit.period_us / 1e6
    at = time.time() // period * period + 1.0
    for _ in range(3):
        assert redis_backend.hit("ttl", [limit], now=at).allowed
    (key,) = redis_client.scan_iter(f"{redis_backend.prefix}:*")
    assert key.decode() == redis_backend.key("ttl", limit)
    ttl_ms = redis_client.pttl(key)
    assert 0 < ttl_ms <= 2 * limit.window * 1000
    if algorithm in ("token_bucket", "gcra", "leaky_bucket"):
        assert ttl_ms > 45_000  # three tokens at 2/min: 90 s


def test_keys_name_their_algorithm(redis_backend: RedisBackend) -> None:
    """``…<digest><code>id``: same length, no collisions, and a new algorithm starts afresh."""
    keys = {name: redis_backend.key("c", limit) for name, limit in ALGORITHM_LIMITS.items()}
    assert keys["token_bucket"].endswith("tt12")
    tag_and_digest = keys["token_bucket"][: -len("tt12")]
    assert {key[len(tag_and_digest) :] for key in keys.values()} == {
        "tt12",
        "gt12",
        "lt12",
        "ft12",
        "wt12",
        "st12",
        "ct12",
    }
    assert redis_backend.hit("c", [ALGORITHM_LIMITS["token_bucket"]], cost=10).remaining == 0
    assert redis_backend.hit("c", [ALGORITHM_LIMITS["gcra"]]).remaining == 9


def is_valkey(redis_client: redis.Redis) -> bool:
    return bool(redis_client.info("server").get("server_name") == "valkey")


def within(used: Any, redis_bytes: int, valkey: bool) -> bool:
    """A key's ``MEMORY USAGE``: exactly Redis 7's figure, or at most it on Valkey."""
    return bool(used <= redis_bytes) if valkey else used == redis_bytes


@pytest.fixture
def dt_backend(redis_backend: RedisBackend, settings: Any) -> RedisBackend:
    """The Redis backend with the default key prefix, whose key names the byte counts of
    the memory tests below assume."""
    settings.DJANGO_THROTTLE_KEY_PREFIX = "dt"
    reset_backend_cache()
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    return backend


def test_token_bucket_state_is_12_bytes(
    dt_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    """With the default prefix and a short limit id, a token bucket key takes 88 bytes of
    Redis memory and a GCRA key 72 (an int-encoded string); Valkey 8+ keeps keys in no more."""
    backend = dt_backend
    bucket, gcra = ALGORITHM_LIMITS["token_bucket"], ALGORITHM_LIMITS["gcra"]
    client = f"ip:198.51.100.{random.randrange(256)}-{time.time_ns()}"
    try:
        backend.hit(client, [bucket, gcra], now=T0)
        bucket_key, gcra_key = backend.key(client, bucket), backend.key(client, gcra)
        assert len(bucket_key) <= 28
        raw = redis_client.get(bucket_key)
        assert raw is not None
        assert len(raw) == 12
        used, stamp_ms = unpack_bucket(raw)
        assert (used, stamp_ms) == (1.0, round(T0 * 1000) % 2**32)
        valkey = is_valkey(redis_client)
        assert within(redis_client.memory_usage(bucket_key), 88, valkey)
        assert redis_client.get(gcra_key) == str(round(T0 * 1e6) + 500_000).encode()
        # Valkey may keep a script's number as text (embstr), in at most what a 12-byte state
        # takes (how it keeps it depends on what ran before: it reuses argument objects).
        encoding = redis_client.object("encoding", gcra_key)
        assert encoding in ((b"int", b"embstr") if valkey else (b"int",))
        assert within(redis_client.memory_usage(gcra_key), 88 if valkey else 72, valkey)
    finally:
        backend.reset(client, [bucket, gcra])


@pytest.mark.parametrize(
    "other", ["fixed_window", "sliding_window_counter", "sliding_window_log", "gcra"]
)
def test_a_state_keeps_its_own_allocation_in_every_mix(
    dt_backend: RedisBackend, redis_client: redis.Redis, other: str
) -> None:
    """Redis lends a script's command arguments objects cached from earlier commands at the
    same position: a 12-byte state written after a longer argument took its 40-48 bytes
    (MEMORY USAGE 104-120 instead of 88). The counting call's own commands never leave one
    for the next state, whatever algorithms a request mixes (a sliding log's scores do: its
    scripts write a placeholder first), so every state keeps an allocation of its own."""
    backend = dt_backend
    bucket, second = ALGORITHM_LIMITS["token_bucket"], ALGORITHM_LIMITS[other]
    valkey = is_valkey(redis_client)
    clients = [f"ip:198.51.100.{n}-{time.time_ns()}" for n in range(6)]
    try:
        for n, client in enumerate(clients):
            limits = [bucket, second] if n % 2 else [second, bucket]
            backend.hit(client, limits, usage="anonymous|api" if n % 3 else None)
            assert len(backend.key(client, bucket)) <= 28
            assert within(redis_client.memory_usage(backend.key(client, bucket)), 88, valkey)
            if other == "fixed_window":
                assert within(redis_client.memory_usage(backend.key(client, second)), 88, valkey)
    finally:
        for client in clients:
            backend.reset(client, [bucket, second])


def test_another_scripts_long_argument_costs_at_most_the_next_state(
    dt_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    """A longer argument another script leaves in position 2 is lent to the next state
    written, at most: that state keeps its 40-48 bytes (a key of 104-120 bytes, until it is
    written again or expires), and every state after it gets an allocation of its own. A
    bounded cost, where writing a placeholder before every state would cost every counting
    call about a tenth of its work."""
    backend = dt_backend
    bucket, window = ALGORITHM_LIMITS["token_bucket"], ALGORITHM_LIMITS["fixed_window"]
    scratch = f"dt:{{0}}scratch-{time.time_ns()}"
    valkey = is_valkey(redis_client)
    clients = [f"ip:198.51.100.{n}-{time.time_ns()}" for n in range(4)]
    try:
        redis_client.eval("redis.call('HINCRBY', KEYS[1], ARGV[1], 1)", 1, scratch, "x" * 40)
        sizes = []
        for client in clients:
            backend.hit(client, [bucket, window])
            sizes += [
                redis_client.memory_usage(backend.key(client, limit)) for limit in (bucket, window)
            ]
        assert all(size <= 120 for size in sizes)
        assert sum(not within(size, 88, valkey) for size in sizes) <= 1
        assert all(within(size, 88, valkey) for size in sizes[1:])
    finally:
        redis_client.delete(scratch)
        for client in clients:
            backend.reset(client, [bucket, window])


def test_a_usage_push_leaves_no_argument_for_the_next_state(
    dt_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    """The usage push, which every process runs once a second with long fields and client
    labels, ends with a command Redis rewrites for its replicas (``EXPIRE``), which replaces
    the argument it was lent: the next state written keeps an allocation of its own."""
    backend = dt_backend
    bucket = ALGORITHM_LIMITS["token_bucket"]
    valkey = is_valkey(redis_client)
    long_client = "user:" + "ü" * 40
    clients = [f"ip:198.51.100.{n}-{time.time_ns()}" for n in range(3)]
    try:
        for client in clients:
            backend.hit(long_client, [bucket], usage="authenticated|some-long-endpoint-name")
            get_store(backend).push_tally(backend.usage_tally)
            backend.hit(client, [bucket])
            assert within(redis_client.memory_usage(backend.key(client, bucket)), 88, valkey)
    finally:
        for client in [*clients, long_client]:
            backend.reset(client, [bucket])


def test_slow_token_buckets_keep_the_whole_millisecond(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    """A bucket that takes longer than 2e12 µs (23 days) to fill stores 14 bytes: the low 32
    bits of the millisecond would wrap (49.7 days) while the key still lives."""
    limit = Limit.build("slow", "1/d", burst=30)
    assert redis_backend.hit("c", [limit], cost=30, now=T0).allowed
    raw = redis_client.get(redis_backend.key("c", limit))
    assert raw is not None
    assert len(raw) == 14
    assert unpack_bucket(raw) == (30.0, round(T0 * 1000))
    assert redis_backend.peek("c", [limit], now=T0 + 29 * 86400).remaining == 29
    assert redis_backend.hit("c", [limit], cost=29, now=T0 + 29 * 86400).allowed
    assert not redis_backend.hit("c", [limit], now=T0 + 29 * 86400).allowed


def test_token_bucket_compact_state_reads_across_the_32_bit_wrap(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    limit = Limit.build("wrap", "1/h", burst=10)
    wrap_ms = (round(T0 * 1000) // 2**32 + 1) * 2**32  # the next 2^32 ms boundary
    at = wrap_ms / 1000 - 1800  # 30 minutes before it
    assert redis_backend.hit("c", [limit], cost=10, now=at).allowed
    # An hour later, past the wrap: one token back, not a full or empty bucket.
    assert redis_backend.peek("c", [limit], now=at + 3600).remaining == 1


def test_calendar_quota_works_on_the_server_clock(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    limit = Limit.build("q", "2/day", algorithm="calendar_quota")
    assert [redis_backend.hit("c", [limit]).allowed for _ in range(3)] == [True, True, False]
    ttl_ms = redis_client.pttl(redis_backend.key("c", limit))
    assert 0 < ttl_ms <= 86_400_000


def test_calendar_specs_are_encoded_again_when_their_window_ends(
    redis_backend: RedisBackend,
) -> None:
    from django_throttle.backends.redis import FOREVER

    calls = redis_backend._calls
    plain = (REFERENCE,)
    assert calls.encoded(plain).valid_until is FOREVER
    assert calls.encoded(plain) is calls.encoded(plain)
    quota = (Limit.build("q", "2/day", algorithm="calendar_quota"),)
    first = calls.encoded(quota)
    assert time.time() < first.valid_until <= time.time() + 86400
    assert calls.encoded(quota) is first
    # A test's clock encodes its own windows and leaves the cached ones alone.
    yesterday = calls.encoded(quota, round((time.time() - 86400) * 1e6))
    assert yesterday.valid_until == first.valid_until - 86400
    assert calls.encoded(quota) is first
    calls.keep(quota, dataclasses.replace(first, valid_until=time.time() - 1))
    again = calls.encoded(quota)
    assert again.valid_until == first.valid_until
    assert again is not first


def test_a_limit_list_is_encoded_once_by_value_and_again_when_edited(
    redis_backend: RedisBackend,
) -> None:
    """Encodings are found by the limits' ids and used only for equal limits: a new tuple of
    the same limits (the request path builds one per request) or equal new objects find the
    entry; a limit edited under the same id is encoded again (issue 31 item 5: no cache keyed
    by ``id()``)."""
    calls = redis_backend._calls
    limit = Limit.build("edited", "10/m")
    first = calls.encoded((limit,))
    assert calls.encoded([limit]) is first
    assert calls.encoded((Limit.build("edited", "10/m"),)) is first
    edited = calls.encoded((Limit.build("edited", "20/m"),))
    assert edited is not first and edited.specs != first.specs
    assert calls.encoded((Limit.build("edited", "20/m"),)) is edited


def test_async_calls_send_the_same_bytes(redis_backend: RedisBackend) -> None:
    import asyncio

    limits = [ALGORITHM_LIMITS["calendar_quota"], ALGORITHM_LIMITS["sliding_window_log"]]
    sync = redis_backend.hit("c", limits, now=MIDNIGHT)

    async def run() -> Any:
        return await redis_backend.ahit("c", limits, now=MIDNIGHT)  # closed with the loop

    assert sync.remaining == 9
    assert asyncio.run(run()).remaining == 8


def test_gcra_retime_keeps_the_tokens_used(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    fast = Limit.build("edited", "10/s", burst=10, algorithm="gcra")
    slow = Limit.build("edited", "10/h", burst=10, algorithm="gcra")
    assert allowed_count(redis_backend, "c", [fast], 10, T0) == 5 * 2
    assert redis_backend.retime([slow], now=T0, previous=[fast]) == 1
    # Ten used at 360 s each: an hour to be full, none back after a second.
    assert not redis_backend.hit("c", [slow], now=T0 + 1).allowed
    assert redis_backend.peek("c", [slow], now=T0 + 360).remaining == 1
    assert (
        redis_client.get(redis_backend.key("c", slow))
        == str(round(T0 * 1e6) + 3600 * 10**6).encode()
    )
    # Without the old rate the stored instant stays: one second of debt only.
    redis_backend.reset("c", [fast])
    assert allowed_count(redis_backend, "c", [fast], 10, T0) == 10
    assert redis_backend.retime([slow], now=T0) == 1
    assert redis_backend.hit("c", [slow], now=T0 + 1).allowed


def test_gcra_retime_is_exact_for_large_products(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    """(TAT - now) x E_new overflows a double's 53 bits: the script's split products still
    round up exactly, as Python's integers do."""
    old = Limit.build("edited", "7/d", burst=1000, algorithm="gcra")  # E = 12,342,857 µs
    new = Limit.build("edited", "3/d", burst=1000, algorithm="gcra")  # E = 28,800,000 µs
    assert redis_backend.hit("c", [old], cost=999, now=T0).allowed
    ahead = 999 * old.emission_us
    redis_backend.retime([new], now=T0, previous=[old])
    stored = int(redis_client.get(redis_backend.key("c", new)) or 0)
    assert stored - round(T0 * 1e6) == -(-ahead * new.emission_us // old.emission_us)


@ALGORITHMS
def test_retime_touches_each_algorithms_own_keys(
    redis_backend: RedisBackend, redis_client: redis.Redis, algorithm: str
) -> None:
    limit = ALGORITHM_LIMITS[algorithm]
    other = ALGORITHM_LIMITS["token_bucket" if algorithm != "token_bucket" else "gcra"]
    for client in ("x", "y"):
        redis_backend.hit(client, [limit, dataclasses.replace(other, id="other")], now=MIDNIGHT)
        redis_backend.hit(client, [other], now=MIDNIGHT)
    assert redis_backend.retime([limit], now=MIDNIGHT, previous=[limit]) == 2
    ttl_ms = redis_client.pttl(redis_backend.key("x", limit))
    assert ttl_ms > 0


def test_retime_of_a_changed_algorithm_ignores_the_old_spec(
    redis_backend: RedisBackend,
) -> None:
    bucket, gcra = ALGORITHM_LIMITS["token_bucket"], ALGORITHM_LIMITS["gcra"]
    redis_backend.hit("c", [gcra], now=T0)
    assert redis_backend.retime([gcra], now=T0, previous=[bucket]) == 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("g10:1.5", "ARGV[4] emission interval"),
        ("g10:0", "ARGV[4] emission interval"),
        (f"g{10**9}:{10**9}", "ARGV[4] capacity x emission interval"),
        ("l10:0", "ARGV[4] interval"),
        ("f10:0", "ARGV[4] period"),
        ("f10:1:2", "ARGV[4] fixed window spec"),
        ("s10:1.5", "ARGV[4] period"),
        ("w10001:1000000", "ARGV[4] capacity must be at most 10000"),
        ("w10:-1", "ARGV[4] period"),
        ("c10:1:2:3", "ARGV[4] calendar boundaries must be 4"),
        ("c10:4:3:2:1", "ARGV[4] calendar boundaries must be 4"),
        ("c10:1:2:3:4", "ARGV[4] calendar boundaries must cover now"),
        ("t10:1000000:5", "ARGV[4] limit spec"),
    ],
)
def test_every_algorithm_spec_is_validated_before_writing(
    redis_backend: RedisBackend, redis_client: redis.Redis, spec: str, message: str
) -> None:
    limits = [Limit.build(name, "1/s") for name in ("first", "second")]
    keys = [redis_backend.key("c", limit) for limit in limits]
    with pytest.raises(redis.ResponseError, match=re.escape(message)):
        redis_client.eval(load_script(), 2, *keys, "1", "0", "w10:1000000", spec)
    assert redis_client.exists(*keys) == 0


def test_retime_refuses_an_old_spec_of_another_algorithm(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    limit = Limit.build("kept", "10/h", algorithm="gcra")  # lives minutes, not 0.1 s
    redis_backend.hit("c", [limit])
    key = redis_backend.key("c", limit)
    before = redis_client.get(key)
    with pytest.raises(redis.ResponseError, match=re.escape("ARGV[3] old spec must be")):
        redis_client.eval(load_script(RETIME_FILES), 1, key, "g10:100000", "", "t10:100000")
    assert redis_client.get(key) == before


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_counter", "gcra"])
def test_corrupt_window_and_gcra_state_counts_nothing_used(
    redis_backend: RedisBackend, redis_client: redis.Redis, algorithm: str
) -> None:
    limit = ALGORITHM_LIMITS[algorithm]
    for state in ("garbage", "1.5 x", "-3 abc", "1 2", "inf", ""):
        redis_client.set(redis_backend.key("c", limit), state, px=60_000)
        assert redis_backend.hit("c", [limit], now=MIDNIGHT).remaining == 9, state
        redis_backend.reset("c", [limit])


def test_sliding_log_key_of_another_type_is_replaced(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    limit = ALGORITHM_LIMITS["sliding_window_log"]
    key = redis_backend.key("c", limit)
    redis_client.set(key, "not a log", px=60_000)
    assert redis_backend.hit("c", [limit], cost=3, now=MIDNIGHT).remaining == 7
    assert redis_client.zcard(key) == 3
    assert redis_backend.peek("c", [limit], now=MIDNIGHT).remaining == 7


def test_sliding_log_takes_a_large_cost_in_one_call(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    limit = Limit.build("big", "10000/h", algorithm="sliding_window_log")
    assert redis_backend.hit("c", [limit], cost=10_000, now=MIDNIGHT).allowed
    assert redis_client.zcard(redis_backend.key("c", limit)) == 10_000
    assert not redis_backend.hit("c", [limit], now=MIDNIGHT + 1).allowed


def test_a_sliding_log_keeps_every_entry_when_its_period_shrinks(backend: Backend) -> None:
    """Regression (found by the refund model test): after an edit shortened the period, a hit
    in the same microsecond as the log's newest entry reused that entry's member name on
    Redis, so one request went uncounted and the limit admitted one too many."""
    t = T0
    one = Limit.build("log", "1/s", algorithm="sliding_window_log")
    two_per_2s = Limit.build("log", "2/2s", algorithm="sliding_window_log")
    two_per_s = Limit.build("log", "2/s", algorithm="sliding_window_log")
    assert backend.hit("c", [one], now=t).allowed
    t += 1.0
    backend.retime([two_per_2s], now=t, previous=[one])
    assert backend.hit("c", [two_per_2s], now=t).allowed  # 2 in the last 2 s
    backend.retime([two_per_s], now=t, previous=[two_per_2s])
    assert backend.hit("c", [two_per_s], now=t).allowed  # the entry at t0 left the second

    assert backend.peek("c", [two_per_s], now=t).remaining == 0
    assert not backend.hit("c", [two_per_s], now=t).allowed


@pytest.mark.parametrize("algorithm", ["token_bucket", "leaky_bucket"])
def test_slow_bucket_retry_after_a_hit_the_tolerance_admitted_passes(
    backend: Backend, algorithm: str
) -> None:
    """1/day: a hit 78 µs before the bucket is full again passes (float tolerance) and leaves
    a hair more than the capacity used, stamped 900 µs ahead (the millisecond is rounded up).
    The read capped that at the capacity, so the Retry-After of the next hit came out 34 µs
    early (milliseconds on a yearly rate) and a retry then was denied."""
    limit = Limit.build("slow", "1/d", burst=1, algorithm=algorithm)  # type: ignore[arg-type]
    day_us = 86_400_000_000
    t0_us = 1_700_000_000_000_178  # so that t1 is 100 µs into its millisecond
    assert backend.hit("c", [limit], now=t0_us / 1e6).allowed
    t1_us = t0_us + day_us - 78
    assert backend.hit("c", [limit], now=t1_us / 1e6).allowed
    t2_us = t1_us + 1
    denied = backend.hit("c", [limit], now=t2_us / 1e6)
    assert not denied.allowed
    wait_us = math.ceil(denied.retry_after * 1e6)
    assert wait_us <= day_us
    assert backend.hit("c", [limit], now=(t2_us + wait_us) / 1e6).allowed


def test_every_script_called_as_a_function_loads_as_a_library_with_every_algorithm(
    redis_client: redis.Redis,
) -> None:
    """Each script the backend calls with ``FCALL`` (counting, refund, together, their
    refund, leases), with every algorithm, loads as a Redis function library: within Lua's
    limits (60 upvalues per function, 200 locals), and its definitions need nothing at load
    that Redis gives a library only at call time (``KEYS``, ``ipairs``)."""
    from django_throttle.backends.base import ALGORITHM_CODES
    from django_throttle.backends.scripts import (
        LEASE_FILES,
        REFUND_FILES,
        REFUND_TOGETHER_FILES,
        SCRIPT_FILES,
        TOGETHER_FILES,
        files_for,
    )

    every = set(ALGORITHM_CODES.values())
    for files in (SCRIPT_FILES, REFUND_FILES, TOGETHER_FILES, REFUND_TOGETHER_FILES, LEASE_FILES):
        source = load_script(files_for(files, every))
        sha = hashlib.sha1(source.encode()).hexdigest()
        assert redis_client.function_load(library(sha, source), replace=True).decode() == (
            function_name(sha)
        )
        redis_client.function_delete(function_name(sha))


@pytest.mark.parametrize("renamed", [("FCALL", "FUNCTION"), ("FUNCTION",)], ids=" and ".join)
def test_a_server_without_functions_counts_with_evalsha_sync_and_async(
    settings: Any, caplog: pytest.LogCaptureFixture, renamed: tuple[str, ...]
) -> None:
    """A server that does not know ``FCALL`` (Redis 6.2; here a server whose ``FCALL`` and
    ``FUNCTION`` are renamed away, which answers as 6.2 does: "unknown command"), or whose
    ``FUNCTION LOAD`` fails (a managed service's own refusal): the backend says so once and
    counts every decision exactly with ``EVALSHA``, reloading a flushed script with ``EVAL``
    as before."""
    from tests.redis_servers import RedisServer

    args = tuple(arg for command in renamed for arg in ("--rename-command", command, ""))
    server = RedisServer(extra_args=args).start()
    try:
        settings.DJANGO_THROTTLE_REDIS_URL = server.url
        reset_backend_cache()
        backend = get_backend()
        one = (Limit.build("old", "3/h"),)
        with caplog.at_level("WARNING", logger="django_throttle.backends"):
            allowed = [backend.hit("sync", one).allowed for _ in range(2)]
            with server.client() as admin:
                admin.script_flush()
            allowed += [backend.hit("sync", one).allowed for _ in range(2)]

            async def hits() -> list[bool]:
                return [(await backend.ahit("async", one)).allowed for _ in range(4)]

            allowed += asyncio.run(hits())
        assert allowed == [True, True, True, False] * 2
        warned = [r for r in caplog.records if "EVALSHA" in r.getMessage()]
        assert len(warned) == 1
        with server.client() as admin:
            assert admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0) >= 7
    finally:
        backend.close()
        reset_backend_cache()
        server.stop()
