"""Which tier each assigned user is in, compiled into the policy snapshot so that resolving a
request's tier never queries the database, for the millionth user as for the first.

A per-request lookup with a cache costs a query for every user a process has not seen, and
every policy reload empties the cache: after an admin save, every worker re-queries all active
users. Instead the compiler reads every assignment in one streamed query (own assignments and
memberships of groups that have a tier, sorted by user by the database) and keeps, for integer
primary keys, two parallel arrays searched with :mod:`bisect`: the sorted user ids
(``array('q')``, 8 bytes each) and each user's tier slot (1 byte while at most 256 tiers are
assigned), far less memory per assigned user than a dict of the same answers (both measured
in docs/explanation/benchmarks.md, "Tier assignments"). Other primary keys (UUID users) fall
back to a dict.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db.models import IntegerField, Value
from django.db.models.sql.constants import MULTI

#: Rows fetched per round trip while streaming assignments.
CHUNK_SIZE = 20_000


@dataclass(frozen=True, slots=True, eq=False)
class UserTiers:
    """Immutable user id → tier id for every user with an assignment of their own or through
    a group: integer ids sorted in ``ids`` with each one's index into ``tier_ids`` in
    ``slots``, other keys in ``by_key`` (a user id given as text read with ``coerce``).
    Thread-safe: nothing changes after construction."""

    ids: array[int] | None = None
    slots: array[int] | None = None
    tier_ids: tuple[int, ...] = ()
    by_key: dict[Any, int] = field(default_factory=dict)
    coerce: Callable[[Any], Any] = int

    def get(self, user_id: Any) -> int | None:
        """The user's tier id, or ``None`` when the user has no assignment."""
        ids = self.ids
        if ids is not None:
            if type(user_id) is not int:  # e.g. "42" from a custom identity resolver
                try:
                    user_id = int(user_id)
                except (TypeError, ValueError):
                    return None
            i = bisect_left(ids, user_id)
            if i != len(ids) and ids[i] == user_id:
                return self.tier_ids[self.slots[i]]  # type: ignore[index]
            return None
        found = self.by_key.get(user_id)
        if found is None and isinstance(user_id, str):
            try:
                found = self.by_key.get(self.coerce(user_id))
            except (TypeError, ValueError, ValidationError):
                return None
        return found

    def __len__(self) -> int:
        return len(self.by_key if self.ids is None else self.ids)


def compile_user_tiers(priorities: Mapping[int, int]) -> UserTiers:
    """Read every assignment (one query, streamed) into a :class:`UserTiers`.

    ``priorities`` maps the snapshot's tier ids to their priority. A user's own assignment
    wins; among their groups' tiers the highest priority (then the lowest tier id) wins, a
    tier missing from ``priorities`` ranking last.
    """
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    pk: Any = user_model._meta.pk
    while pk.is_relation:  # multi-table inheritance: the parent's key
        pk = pk.target_field
    query = _assignments(user_model)
    if isinstance(pk, IntegerField):  # AutoField, BigAutoField, PositiveIntegerField, ...
        # Lists of raw rows, streamed (a server-side cursor where the database has one),
        # without building a Python object per row.
        compiler = query.query.get_compiler(query.db)
        chunks = compiler.execute_sql(MULTI, chunked_fetch=True, chunk_size=CHUNK_SIZE)
        ids, tiers = _best(chain.from_iterable(chunks), priorities, array("q"))
        return _pack(ids, tiers)
    users, tiers = _best(query.iterator(chunk_size=CHUNK_SIZE), priorities, [])
    return UserTiers(by_key=dict(zip(users, tiers, strict=True)), coerce=pk.to_python)


def _assignments(user_model: Any) -> Any:
    """(user id, tier id, 0) for each own assignment and (user id, tier id, 1) for each
    membership of a group with a tier, by user id: the database sorts, Python takes one pass."""
    from django_throttle.models import TierAssignment

    own = (
        TierAssignment.objects.filter(user__isnull=False)
        .order_by()
        .values_list("user_id", "tier_id", Value(0))
    )
    groups = memberships(user_model)
    if groups is None:  # a custom user model without groups
        return own.order_by("user_id")
    through, user_column, group = groups
    by_group = (
        through.objects.filter(**{f"{group}__throttle_assignment__isnull": False})
        .order_by()
        .values_list(user_column, f"{group}__throttle_assignment__tier_id", Value(1))
    )
    return own.union(by_group, all=True).order_by("user_id")


def memberships(user_model: Any) -> tuple[Any, str, str] | None:
    """The user model's group membership table, its user id column and its field naming
    the group; ``None`` for a custom user model without groups."""
    try:
        field = user_model._meta.get_field("groups")
    except FieldDoesNotExist:
        return None
    through = field.remote_field.through
    user_column = through._meta.get_field(field.m2m_field_name()).attname
    return through, user_column, field.m2m_reverse_field_name()


def _best(
    rows: Iterator[tuple[Any, int, int]], priorities: Mapping[int, int], ids: Any
) -> tuple[Any, array[int]]:
    """Each user's tier from the user-sorted rows of :func:`_assignments`, appended to
    ``ids`` (an array or a list) and a parallel array of tier ids."""
    rank = _Rank((tier, priority * 2**64 - tier) for tier, priority in priorities.items())
    tiers: array[int] = array("q")
    last: Any = None
    own = False
    best = 0
    for user_id, tier_id, by_group in rows:
        if user_id != last:
            ids.append(user_id)
            tiers.append(tier_id)
            last, own = user_id, not by_group
            best = rank[tier_id]
        elif own:
            continue
        elif not by_group:
            tiers[-1], own = tier_id, True
        elif rank[tier_id] > best:
            tiers[-1], best = tier_id, rank[tier_id]
    return ids, tiers


class _Rank(dict[int, int]):
    """Tier id → one integer ordering tiers by priority, then lowest id; a tier missing from
    the snapshot ranks below every known one."""

    def __missing__(self, tier_id: int) -> int:
        return -(2**100) - tier_id


def _pack(ids: array[int], tiers: array[int]) -> UserTiers:
    """Replace each tier id by a slot in the smallest array type that holds them all."""
    tier_ids = tuple(sorted(set(tiers)))
    slot_of = {tier_id: slot for slot, tier_id in enumerate(tier_ids)}
    typecode = "B" if len(tier_ids) <= 2**8 else "H" if len(tier_ids) <= 2**16 else "I"
    slots = array(typecode, map(slot_of.__getitem__, tiers))
    return UserTiers(ids=ids, slots=slots, tier_ids=tier_ids)
