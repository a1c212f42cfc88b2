"""Clearing a client's counters, and refilling shared limits. Used by ``manage.py
throttle_reset``, the admin's inspector and the API key list's reset action.

Resetting one client leaves a shared limit (a ceiling over every client of a key shard)
alone: :func:`reset_ceilings` is its own explicit action.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, groupby
from operator import attrgetter

from django_throttle.backends import get_backend
from django_throttle.inspection.clients import counters
from django_throttle.inspection.probes import Counter, rules
from django_throttle.inspection.subjects import Subject
from django_throttle.policy.live import current
from django_throttle.policy.snapshot import Policy
from django_throttle.rates import Limit


def reset_counters(
    subject: Subject,
    limit_ids: Sequence[str] | None = None,
    username: str | None = None,
    address: str | None = None,
) -> list[Counter]:
    """Forget the client's state in every counter its requests meet (its tier's and
    rules' limits, by client, by its address, by its username), or only the limits whose
    ids are in ``limit_ids``: the client starts afresh, a locked-out login included.
    Shared ceilings are left alone (they are every client's of a key shard: see
    :func:`reset_ceilings`). Returns the counters reset. Raises ``ValueError`` naming ids
    that are not among the client's limits."""
    found = counters(subject, username, address)
    own = [counter for counter in found if not counter.limit.shared]
    if limit_ids:
        known = {counter.limit.id for counter in own}
        shared = {counter.limit.id for counter in found if counter.limit.shared}
        ceilings = [i for i in limit_ids if i in shared]
        if ceilings:
            raise ValueError(
                f"{', '.join(ceilings)}: a shared ceiling counts every client of a key shard, "
                "not this one's own; reset the ceiling itself"
            )
        unknown = [i for i in limit_ids if i not in known]
        if unknown:
            raise ValueError(
                f"not a limit of {subject.label}: {', '.join(unknown)} "
                f"(its limits: {', '.join(sorted(known)) or 'none'})"
            )
        own = [counter for counter in own if counter.limit.id in limit_ids]
    backend = get_backend()
    client = attrgetter("client")
    for key, group in groupby(sorted(own, key=client), key=client):
        backend.reset(key, [counter.limit for counter in group])
    return own


def reset(subject: Subject, limit_ids: Sequence[str] | None = None) -> list[Limit]:
    """:func:`reset_counters`, answering with the limits reset."""
    return [counter.limit for counter in reset_counters(subject, limit_ids)]


def shared_limits(snapshot: Policy | None = None) -> dict[str, Limit]:
    """Every shared limit (ceiling) of the policy, by id."""
    snapshot = snapshot or current()
    every = [limit for tier in snapshot.tiers.values() for limit in tier.limits]
    for rule in rules(snapshot):
        every.extend(chain.from_iterable(rule.limits_by_tier.values()))
        for groups in rule.groups_by_tier.values():
            every.extend(limit for _kind, limits in groups for limit in limits)
    return {limit.id: limit for limit in reversed(every) if limit.shared}  # the first of an id


def reset_ceilings(limit_ids: Sequence[str]) -> list[Limit]:
    """Refill these shared limits in every key shard (every client's share of them): the
    explicit action a ceiling needs, since resetting a client never touches it. Raises
    ``ValueError`` naming ids that are not shared limits of the policy."""
    shared = shared_limits()
    unknown = [i for i in limit_ids if i not in shared]
    if unknown:
        raise ValueError(
            f"not a shared limit: {', '.join(unknown)} "
            f"(shared limits: {', '.join(sorted(shared)) or 'none'})"
        )
    limits = [shared[i] for i in dict.fromkeys(limit_ids)]
    get_backend().reset_shared(limits)
    return limits
