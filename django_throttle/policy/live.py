"""The compiled, immutable policy snapshot, and how a request finds its limits in it.

Admin rows, tier assignments (:mod:`~django_throttle.policy.user_tiers`) and API keys
(their digests) included, are compiled once into plain objects; requests read only the
snapshot, so a request costs zero SQL queries for any user or key. Every process checks a
shared version (kept by the backend, through the circuit breaker) at most once per
:data:`REFRESH_INTERVAL` and recompiles when it changed, so admin edits reach all workers
within a second, without restarts; it also recompiles once the snapshot is :data:`MAX_AGE`
old, so writes no signal sees (``QuerySet.update``, ``bulk_create``, raw SQL) apply within
that time.

A row no limit can be built from (written around the admin) is skipped with one ERROR line per
compile naming it; the rest of the policy applies. Compiling never raises into a request.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Iterable
from typing import Any

from django.db import DatabaseError, router, transaction

from django_throttle import events
from django_throttle.backends import BackendError, get_backend
from django_throttle.policy.exemptions import compile_exemptions
from django_throttle.policy.snapshot import ApiKeyPolicy, EndpointPolicy, Policy, TierPolicy
from django_throttle.policy.user_tiers import compile_user_tiers
from django_throttle.rates import Limit

logger = logging.getLogger("django_throttle.policy")

#: Monotonic seconds; tests replace it to age a snapshot without sleeping.
clock = time.monotonic
#: Seconds between two checks of the shared policy version: an admin edit reaches every
#: process within it, for one cheap backend read per process and second.
REFRESH_INTERVAL = 1.0
#: Seconds after which a process recompiles its snapshot though the version did not move:
#: bounds how long a change no signal sees (``QuerySet.update``, ``bulk_create``, raw SQL)
#: takes to apply, for one compile per process every five minutes.
MAX_AGE = 300.0
_DEFAULT_FLAGS = ("is_default_anonymous", "is_default_authenticated")


def _usable(row: Any, outcome: str = "skipped") -> bool:
    """Whether a policy row can be compiled; logs one ERROR line naming it when not."""
    problems = row.row_problems()
    if problems:
        logger.error(
            "Throttle policy row %s pk=%s %s: %s. Fix it in the admin "
            "(manage.py check lists every such row).",
            type(row).__name__,
            row.pk,
            outcome,
            "; ".join(f"{name}: {reason}" for name, reason in problems.items()),
        )
    return not problems


def compile_policy(version: str | None = None) -> Policy:
    """Read every policy row and assignment (a fixed handful of queries, whatever the number
    of users) into an immutable snapshot, skipping rows no limit can be built from. In one
    transaction (a savepoint inside a request's), so a failed query breaks no caller's."""
    from django_throttle.models import EndpointLimit, EndpointRule, Tier, TierAssignment, TierLimit

    started = clock()
    with transaction.atomic(using=router.db_for_read(TierAssignment)):
        # A limit row repeating another counts the same thing: count it once (manage.py check
        # lists the copy, django_throttle.W106).
        tier_limits: dict[int, list[Limit]] = {}
        for row in _distinct(TierLimit.objects.select_related("tier").order_by("tier_id", "id")):
            tier_limits.setdefault(row.tier_id, []).append(row.to_limit())
        tiers: dict[int, TierPolicy] = {}
        defaults: dict[str, TierPolicy] = {}
        for t in Tier.objects.all():
            # A bad failure mode is logged and inherited: skipping the tier would lift its limits.
            failure_mode = t.failure_mode if _usable(t, "kept, its failure mode ignored") else ""
            tiers[t.id] = TierPolicy(
                t.id, t.slug, t.name, t.priority, tuple(tier_limits.get(t.id, ())), failure_mode
            )
            # A unique constraint allows one default of each kind.
            defaults |= {flag: tiers[t.id] for flag in _DEFAULT_FLAGS if getattr(t, flag)}
        # (rule, tier) -> counted by -> limits, in row order.
        endpoint_limits: dict[tuple[int, int], dict[str, list[Limit]]] = {}
        rows = EndpointLimit.objects.select_related("rule", "tier").order_by("id")
        for row in _distinct(rows):
            limit = row.to_limit()
            if row.rule.shadow:  # counted but never denying; the tier's limits still apply
                limit = dataclasses.replace(limit, shadow=True)
            by_counter = endpoint_limits.setdefault((row.rule_id, row.tier_id), {})
            by_counter.setdefault(row.counted_by, []).append(limit)
        # A rule naming methods is more specific than one for every method (a stable sort).
        enabled = EndpointRule.objects.filter(enabled=True).order_by("id")
        rules = [
            _endpoint(rule, tiers, endpoint_limits)
            for rule in sorted(enabled, key=lambda rule: not rule.method_set)
            if _usable(rule)
        ]
        return Policy(
            tiers=tiers,
            default_anonymous=defaults.get("is_default_anonymous"),
            default_authenticated=defaults.get("is_default_authenticated"),
            by_scope=_index(r for r in rules if r.match_type == "scope"),
            by_route=_index(r for r in rules if r.match_type == "route"),
            by_path=tuple(
                sorted((r for r in rules if r.match_type == "path"), key=lambda r: -len(r.pattern))
            ),
            version=version,
            user_tiers=compile_user_tiers({t.id: t.priority for t in tiers.values()}),
            compiled_at=started,
            api_keys=_api_keys(),
            exemptions=compile_exemptions(),
        )


def _endpoint(
    rule: Any,
    tiers: dict[int, TierPolicy],
    endpoint_limits: dict[tuple[int, int], dict[str, list[Limit]]],
) -> EndpointPolicy:
    """An enabled rule with its limits for every tier, by counter."""
    own: dict[int, tuple[Limit, ...]] = {}
    groups: dict[int, tuple[tuple[str, tuple[Limit, ...]], ...]] = {}
    # Every tier's limits counted by IP address or username: what a credential check meets
    # whatever the caller's tier (each row keeps its own counter).
    every: dict[str, list[Limit]] = {"ip": [], "username": []}
    for tier_id in tiers:
        by_counter = endpoint_limits.get((rule.id, tier_id), {})
        own[tier_id] = tuple(by_counter.get("client", ()))
        if counted := tuple((c, tuple(by_counter[c])) for c in every if c in by_counter):
            groups[tier_id] = counted
        for counter, limits in every.items():
            limits.extend(by_counter.get(counter, ()))
    return EndpointPolicy(
        id=rule.id,
        name=rule.name,
        match_type=rule.match_type,
        pattern=rule.pattern,
        methods=frozenset(rule.method_set),
        cost=rule.cost,
        shadow=rule.shadow,
        limits_by_tier={t: tier.limits + own[t] for t, tier in tiers.items()},
        failure_mode=rule.failure_mode,
        counts=rule.counts,
        rule_limits_by_tier=own,
        groups_by_tier=groups,
        credential_groups=tuple((c, tuple(limits)) for c, limits in every.items() if limits),
        credential=rule.counts == "failures" or bool(every["username"]),
    )


def _distinct(rows: Iterable[Any]) -> list[Any]:
    """The usable limit rows of ``rows`` that repeat none before them."""
    from django_throttle.policy.file_writes import repeats

    usable = [row for row in rows if _usable(row)]
    copies = {id(row) for row, _ in repeats(usable)}
    return [row for row in usable if id(row) not in copies]


def _api_keys() -> dict[str, ApiKeyPolicy]:
    """Every active API key by prefix (one query). Expired keys stay: expiry is checked
    against the clock on each request, so it needs no reload."""
    from django_throttle.models import ApiKey

    keys = {}
    rows = ApiKey.objects.filter(active=True).values_list(
        "pk", "prefix", "hashed", "tier_id", "expires", "owner_id"
    )
    for pk, prefix, hashed, tier_id, expires, owner_id in rows.iterator():
        try:
            digest = bytes.fromhex(hashed)
        except ValueError:
            logger.error("Throttle API key pk=%s skipped: its stored hash is not hex.", pk)
            continue
        expiry = None if expires is None else expires.timestamp()
        keys[prefix] = ApiKeyPolicy(pk, prefix, digest, tier_id, expiry, owner_id)
    return keys


def _index(rules: Iterable[EndpointPolicy]) -> dict[str, tuple[EndpointPolicy, ...]]:
    """``rules`` by pattern, in their order."""
    index: dict[str, list[EndpointPolicy]] = {}
    for rule in rules:
        index.setdefault(rule.pattern, []).append(rule)
    return {pattern: tuple(same) for pattern, same in index.items()}


@dataclasses.dataclass
class _Cache:
    """The process's snapshot, when its version was last checked, and whether this process
    changed the policy itself (recompile without waiting for the version)."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    policy: Policy | None = None
    checked_at: float = -math.inf
    changed_here: bool = False


_cache = _Cache()


def current() -> Policy:
    """The snapshot to use now; reloads when the shared version moved, when this process
    changed the policy, or when the snapshot is older than :data:`MAX_AGE` (all checked
    at most once per refresh interval, so most calls touch neither the database nor the
    backend). Other threads keep the previous snapshot while one thread recompiles."""
    policy = _cache.policy
    if policy is not None and clock() - _cache.checked_at < REFRESH_INTERVAL:
        return policy  # fresh(), read here without a call: this runs on every request
    with _cache.lock:
        now = clock()
        policy = _cache.policy
        if policy is not None and now - _cache.checked_at < REFRESH_INTERVAL:
            return policy
        _cache.checked_at = now
        version = _shared_version(policy)
        if (
            policy is None
            or not policy.loaded
            or _cache.changed_here
            or version != policy.version
            or now - policy.compiled_at >= MAX_AGE
        ):
            # Cleared first: a change signalled while compiling triggers another compile.
            _cache.changed_here = False
            policy = _cache.policy = _compile(policy, version)
        return policy


def fresh() -> Policy | None:
    """The snapshot when no refresh check is due, else ``None`` (then call :func:`current`,
    which may read the backend and the database): lets async code stay off threads."""
    policy = _cache.policy
    if policy is not None and clock() - _cache.checked_at < REFRESH_INTERVAL:
        return policy
    return None


def _shared_version(policy: Policy | None) -> str | None:
    """The backend's policy version, through the circuit breaker; the snapshot's own version
    (no reload) when the backend cannot answer. An open breaker logs nothing here: the breaker
    itself logs when it opens and closes."""
    from django_throttle.backends.breaker import CircuitOpen, get_breaker

    try:
        return get_breaker().call(get_backend().get_policy_version)
    except CircuitOpen:
        pass
    except BackendError as exc:
        logger.warning("policy version check failed, keeping the current policy: %s", exc)
    return policy.version if policy is not None else None


def _compile(last: Policy | None, version: str | None) -> Policy:
    """A fresh snapshot, else the last good one, else an empty stand-in retried next interval
    (never an exception: requests must not fail because the policy cannot be read)."""
    try:
        policy = compile_policy(version)
    except Exception as exc:
        if isinstance(exc, DatabaseError):
            logger.error("throttle policy could not be loaded: %s", exc)
        else:
            logger.exception("throttle policy could not be compiled")
        if last is not None and last.loaded:
            return last
        return Policy({}, None, None, {}, {}, (), version, loaded=False)
    # Routine, once per process and change: DEBUG, so a project logging this package at INFO
    # (as the example does) does not see it before every management command's output.
    logger.debug("policy loaded (version %s)", version)
    events.send(events.policy_reloaded, Policy, policy=policy, seconds=clock() - policy.compiled_at)
    return policy


def last() -> Policy | None:
    """The snapshot this process holds, however old, without any refresh check (for code
    that must not touch the database, e.g. on an event loop); ``None`` before the first."""
    return _cache.policy


def invalidate() -> None:
    """Recompile on next use in this process (other processes follow the shared version),
    keeping the current snapshot in case the database cannot be read."""
    _cache.changed_here = True
    _cache.checked_at = -math.inf


def reset() -> None:
    """Forget the snapshot entirely (tests, settings changes)."""
    with _cache.lock:
        _cache.policy, _cache.changed_here, _cache.checked_at = None, False, -math.inf
