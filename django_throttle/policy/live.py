"""The policy a request reads: the admin's rows compiled into an immutable snapshot, the
snapshot each process holds, and who is calling (the default identity resolver).

Admin rows, tier assignments and API keys (their digests) included, are compiled once into
plain frozen objects (:class:`Policy`); requests read only the snapshot, so a request costs
zero SQL queries for any user or key. Every process checks a shared version (kept by the
backend, through the circuit breaker) at most once per :data:`REFRESH_INTERVAL` and
recompiles when it changed, so admin edits reach all workers within a second, without
restarts; it also recompiles once the snapshot is :data:`MAX_AGE` old, so writes no signal
sees (``QuerySet.update``, ``bulk_create``, raw SQL) apply within that time. A row no limit
can be built from (written around the admin) is skipped with one ERROR line per compile
naming it; the rest of the policy applies. Compiling never raises into a request.

Which tier each assigned user is in (:class:`UserTiers`) is compiled from one streamed query:
for integer primary keys two parallel arrays searched with :mod:`bisect`, the sorted user ids
(``array('q')``, 8 bytes each) and each user's tier slot (1 byte while at most 256 tiers are
assigned), far less memory per assigned user than a dict of the same answers (measured in
docs/explanation/benchmarks.md, "Tier assignments"); other primary keys (UUID users) fall back
to a dict. So resolving a tier never queries the database, for the millionth user as for the
first.

Clients that are never limited (:class:`Exemptions`: the users, groups and IP networks listed
in the admin, :class:`~django_throttle.models.Exemption`) are compiled in too. Staff and
superusers are limited like everyone else unless listed there. An exempt client's requests
make no backend call and get no rate limit headers; exempt views are marked with
:func:`django_throttle.exemptions.throttle_exempt`.

The default identity resolver (``DJANGO_THROTTLE_IDENTITY_RESOLVER``,
:func:`resolve_identity`) picks a verified API key, else the authenticated user, else the
client IP. An API key (``Authorization: Api-Key <key>`` or ``X-API-Key``, see
``conf.API_KEY_HEADERS``) is checked against the snapshot: no query, one HMAC. A key that is
unknown, wrong, revoked or expired is ignored, never a bucket of its own: the request is
counted as if it had sent none (so an anonymous client under its IP).

The region a request comes from (:func:`request_region`, ``DJANGO_THROTTLE_REGION_SOURCE``)
picks the limits that name regions: a trusted edge's header, or the client address's country
in a GeoIP2 database.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import ipaddress
import logging
import math
import threading
import time
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Any, Protocol

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import DatabaseError, router, transaction
from django.db.models import IntegerField, Value
from django.db.models.sql.constants import MULTI
from django.utils.module_loading import import_string

from django_throttle import events
from django_throttle.backends import BackendError, get_backend
from django_throttle.conf import REGION_GEOIP, app_settings
from django_throttle.identity import (
    KEY_MAX_LENGTH,
    UNIDENTIFIED,
    Identity,
    client_ip,
    from_trusted_proxy,
    key_digest,
    key_prefix,
    presented_key,
    region_code,
)
from django_throttle.policy.scaling import effective_factor, scaled
from django_throttle.rates import FLEET, Algorithm, Limit, Rate

__all__ = ["resolve_identity"]


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


_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Exemptions:
    """The admin's exemptions, compiled: user ids (direct and through groups) and networks.
    Empty by default, so a site with none checks two empty containers per request."""

    users: frozenset[Any] = frozenset()
    addresses: frozenset[str] = frozenset()
    networks: tuple[_Network, ...] = ()
    #: Whether any client is exempt: read on every request, so worked out once.
    active: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "active", bool(self.users or self.addresses or self.networks))

    def __bool__(self) -> bool:
        return self.active

    def covers_address(self, network: str) -> bool:
        """``network`` is the client as the limiter counts it: an address, or an IPv6
        network such as ``2001:db8:1:2::/64``; covered when it lies inside an exempt
        network."""
        if network in self.addresses:
            return True
        if not self.networks:
            return False
        try:
            client = ipaddress.ip_network(network, strict=False)
        except ValueError:
            return False
        return any(
            client.version == exempt.version and client.subnet_of(exempt)  # type: ignore[arg-type]
            for exempt in self.networks
        )


def exempt_client(identity: Identity, exemptions: Exemptions | None) -> bool:
    """Whether the client, as ``identity`` names it, is exempt: a user by the admin's list
    (directly or through a group), an address by the admin's networks. Reads only what
    resolving the identity already loaded (an API key's owner is never fetched)."""
    if not exemptions:
        return False
    if identity.kind == "user":
        return identity.user_id in exemptions.users
    return identity.kind == "ip" and exemptions.covers_address(identity.value)


def compile_exemptions() -> Exemptions:
    """Read the exemption rows (two queries): users named directly or through a group, and
    networks. A row no exemption can be built from is skipped (``manage.py check`` names it)."""
    from django.contrib.auth import get_user_model

    from django_throttle.models import Exemption
    from django_throttle.models.exemptions import parse_network

    users: set[Any] = set()
    addresses: set[str] = set()
    networks: list[_Network] = []
    groups: list[Any] = []
    for row in Exemption.objects.order_by("pk"):
        if row.user_id is not None:
            users.add(row.user_id)
        elif row.group_id is not None:
            groups.append(row.group_id)
        elif row.network:
            if row.row_problems():  # not a network, or one wide enough to exempt the internet
                continue
            network = parse_network(row.network)
            if network.num_addresses == 1:
                addresses.add(str(network.network_address))
            else:
                networks.append(network)
    table = memberships(get_user_model()) if groups else None
    if table is not None:
        through, user_column, group = table
        members = through.objects.filter(**{f"{group}__in": groups})
        users.update(members.values_list(user_column, flat=True).iterator(chunk_size=10_000))
    # By family, largest network first.
    ordered = sorted(set(networks), key=lambda n: (n.version, n.prefixlen, str(n)))
    return Exemptions(frozenset(users), frozenset(addresses), tuple(ordered))


#: Compared against when no key has the presented prefix, so an unknown prefix costs what a
#: wrong secret costs: one HMAC and one constant-time comparison.
_DUMMY_DIGEST = bytes(32)


@dataclass(frozen=True, slots=True)
class ApiKeyPolicy:
    """An active API key as the snapshot holds it: never the key, only its digest.
    ``expires`` is Unix seconds (``None``: never), checked on every request."""

    pk: int
    prefix: str
    digest: bytes
    tier_id: int
    expires: float | None = None
    owner_id: Any = None


@dataclass(frozen=True, slots=True)
class TierPolicy:
    id: int
    slug: str
    name: str
    priority: int
    limits: tuple[Limit, ...]
    #: "" inherits the setting; else "open", "closed" or "local".
    failure_mode: str = ""
    #: What its limits (and its endpoint limits counted by client) are scaled by: the
    #: operator's load factor times the adaptive controller's (see :mod:`.scaling`).
    factor: float = 1.0
    #: This tier as a client of each region some row names sees it (its limits that name the
    #: region, else those that name none).
    by_region: dict[str, TierPolicy] = field(default_factory=dict, compare=False, repr=False)


#: Limits counted under one counter other than the client's: ``("ip", limits)`` or
#: ``("username", limits)``.
CountedGroup = tuple[str, tuple[Limit, ...]]


@dataclass(frozen=True, slots=True)
class EndpointPolicy:
    """An enabled endpoint rule; ``limits_by_tier`` already holds tier + endpoint limits
    counted by client, ``rule_limits_by_tier`` the rule's own share of them (what its
    counting policy may give back, and what a credential check counts), and
    ``groups_by_tier`` the rule's limits counted by IP address or username (only tiers that
    have some), ``credential_groups`` those of every tier together. ``counts`` is "all",
    "success" or "failures"."""

    id: int
    name: str
    match_type: str
    pattern: str
    methods: frozenset[str]
    cost: int
    shadow: bool
    limits_by_tier: dict[int, tuple[Limit, ...]]
    #: "" inherits the tier's; else "open", "closed" or "local".
    failure_mode: str = ""
    counts: str = "all"
    rule_limits_by_tier: dict[int, tuple[Limit, ...]] = field(default_factory=dict)
    groups_by_tier: dict[int, tuple[CountedGroup, ...]] = field(default_factory=dict)
    #: Every tier's limits counted by IP address or username, for credential checks: those
    #: counters protect the account and the server, whoever the caller is. A rule counting
    #: failures meets those of every such rule, one counter per limit written alike (see
    #: :func:`_shared_failure_counters`).
    credential_groups: tuple[CountedGroup, ...] = ()
    #: The counters of :attr:`credential_groups` another rule owns (written in its rows, or
    #: a row of this rule written alike, counted under the other's id and name): limit id ->
    #: the name of that rule (what the operator tools say a counter comes from).
    others: dict[str, str] = field(default_factory=dict)
    #: A login or token endpoint's rule by its rows: one with a limit counted by username
    #: (only credential requests present one), or one counting failures. Its checks are
    #: credential checks whichever adapter makes them.
    credential: bool = False
    #: "critical", "default" or "sheddable": the share of the fleet's capacity its requests
    #: may take (see :class:`Shedding`).
    criticality: str = "default"
    #: This rule as a client of each region some row names sees it.
    by_region: dict[str, EndpointPolicy] = field(default_factory=dict, compare=False, repr=False)

    def matches_path(self, path: str) -> bool:
        """Whole path segments: ``/api/pi`` covers ``/api/pi`` and ``/api/pi/x``, never
        ``/api/pizza``; a pattern ending in ``/`` covers everything below it."""
        if self.pattern.endswith("/"):
            return path.startswith(self.pattern)
        return path == self.pattern or path.startswith(self.pattern + "/")


@dataclass(frozen=True, slots=True)
class Shedding:
    """The load shedder as compiled from :class:`~django_throttle.models.Protection`.

    ``fleet``: per criticality, the fleet limit its requests meet (the same shared
    concurrency limit, :data:`~django_throttle.rates.FLEET`, with a smaller count for less
    critical traffic, so every share is counted in the one set of leases); empty when only
    workers shed. ``shares``: the percent of a capacity each criticality may take.
    ``worker_capacity``: requests one process serves at once (``None``: not watched);
    ``worker_lag``: seconds of event loop lag at which sheddable requests are shed (default
    ones at twice it; ``None``: not watched)."""

    fleet: dict[str, Limit]
    shares: dict[str, int]
    worker_capacity: int | None = None
    worker_lag: float | None = None

    def fleet_limit(self, endpoint: EndpointPolicy | None) -> Limit | None:
        """The fleet limit a request of ``endpoint``'s rule meets (no rule: default);
        ``None`` when the fleet's capacity is not set."""
        criticality = endpoint.criticality if endpoint is not None else "default"
        return self.fleet.get(criticality) or self.fleet.get("default")


def compile_shedding(row: Any) -> Shedding | None:
    """``row`` (a :class:`~django_throttle.models.Protection`, or ``None``) as a
    :class:`Shedding`; ``None`` while shedding is off or the row holds a value the admin
    would refuse (logged: shedding stays off rather than refusing traffic by mistake)."""
    if row is None or not row.enabled:
        return None
    if not (row.in_flight or row.worker_capacity or row.worker_lag_ms):
        return None
    try:
        row.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        logger.error("Service protection is off: its row holds values the admin refuses: %s", exc)
        return None
    shares = {"critical": 100, "default": row.default_share, "sheddable": row.sheddable_share}
    fleet = {}
    if row.in_flight:
        fleet = {
            criticality: Limit.build(
                FLEET,
                Rate(max(1, row.in_flight * share // 100), row.lease),
                algorithm=Algorithm.CONCURRENCY,
                name=criticality,
                shared=True,
            )
            for criticality, share in shares.items()
        }
    return Shedding(
        fleet,
        shares,
        row.worker_capacity or None,
        row.worker_lag_ms / 1000 if row.worker_lag_ms else None,
    )


@dataclass(frozen=True)
class Policy:
    """Everything a request needs to find its limits, with no database access."""

    tiers: dict[int, TierPolicy]
    default_anonymous: TierPolicy | None
    default_authenticated: TierPolicy | None
    by_scope: dict[str, tuple[EndpointPolicy, ...]]
    by_route: dict[str, tuple[EndpointPolicy, ...]]
    by_path: tuple[EndpointPolicy, ...]
    version: str | None = None
    user_tiers: UserTiers = field(default_factory=UserTiers)
    #: ``clock()`` when compiling started, for :data:`MAX_AGE`.
    compiled_at: float = 0.0
    #: False for the empty stand-in used while the database cannot be read.
    loaded: bool = True
    #: Active API keys by prefix.
    api_keys: dict[str, ApiKeyPolicy] = field(default_factory=dict)
    #: Users (direct and through groups) and networks never limited.
    exemptions: Exemptions = field(default_factory=Exemptions)
    #: The fleet shedder (``None``: off).
    shedding: Shedding | None = None
    #: Every region some limit row names: a client's region outside it meets the default
    #: limits (and is never a key of :attr:`compiled`).
    regions: frozenset[str] = frozenset()
    #: The adaptive controller's factor per tier id as read when compiling (tiers at 1.0
    #: absent); kept when the backend cannot answer the next compile.
    auto_factors: dict[int, float] = field(default_factory=dict)
    #: The one store for what the request path works out from this snapshot (what a view,
    #: a rule and a tier come to), so it is dropped with the snapshot when the version
    #: changes; no other cache holds anything compiled from the policy.
    compiled: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def verify_key(
        self, key: str, secret: bytes, now: float, fallbacks: tuple[bytes, ...] = ()
    ) -> ApiKeyPolicy | None:
        """The active, unexpired API key ``key`` is, else ``None``. No query; every key of a
        plausible length costs one HMAC and one constant-time comparison per secret (the
        current one and each of ``fallbacks``, the secrets keys issued before a rotation were
        stored under), whether its prefix is unknown, its secret wrong, or it is revoked or
        expired."""
        if len(key) > KEY_MAX_LENGTH:
            return None
        found = self.api_keys.get(key_prefix(key))
        expected = _DUMMY_DIGEST if found is None else found.digest
        matches = hmac.compare_digest(key_digest(secret, key), expected)
        for fallback in fallbacks:  # every one computed: no early exit to time
            matches |= hmac.compare_digest(key_digest(fallback, key), expected)
        expired = found is not None and found.expires is not None and now >= found.expires
        return None if found is None or not matches or expired else found

    def match(
        self,
        method: str,
        scope: str | None = None,
        route: str | tuple[str, ...] | None = None,
        path: str | tuple[str, ...] = "",
        runs_get: bool = False,
    ) -> EndpointPolicy | None:
        """The endpoint rule for a request: by scope, else route name, else longest path
        pattern covering the path (whole segments), or any of its spellings when ``path`` is
        a tuple of them (see :func:`~django_throttle.request.core.rule_paths`); among rules
        with the same pattern, one naming the method beats one for all. ``route`` may be the
        names a namespaced route is known by, most specific first (``v1:items``, then
        ``items``, see :func:`~django_throttle.request.core.rule_routes`): the first named
        by a rule covering the method wins. HEAD meets the rules of GET, after a rule naming
        HEAD itself: Django (and DRF) answer HEAD with the GET handler, so a HEAD costs the
        server what a GET does and must not escape the GET's limits; so does a method no rule
        can name (:data:`NAMEABLE_METHODS`), and any method the caller says ``runs_get`` (an
        OPTIONS to a function view, which answers it with its GET code)."""
        names = (route,) if isinstance(route, str) else route or ()
        for index, name in ((self.by_scope, scope), *((self.by_route, n) for n in names)):
            if name is None:
                continue
            if (found := _pick(index.get(name, ()), method, None, runs_get)) is not None:
                return found
        paths = (path,) if isinstance(path, str) else path
        return _pick(self.by_path, method, paths, runs_get)

    def tier_for(self, identity: Identity) -> TierPolicy | None:
        """The client's tier: own assignment, else best group assignment, else the default.
        An API key's tier is its own. No query: assignments were compiled into the snapshot."""
        if identity.kind == "key":
            api_key = self.api_keys.get(identity.value)
            if api_key is None:  # revoked between resolving and now: treated as unknown
                return self.default_anonymous
            return self.tiers.get(api_key.tier_id, self.default_authenticated)
        if identity.user_id is None:
            return self.default_anonymous if identity.kind == "ip" else self.default_authenticated
        tier_id = self.user_tiers.get(identity.user_id)
        if tier_id is None:
            return self.default_authenticated
        return self.tiers.get(tier_id, self.default_authenticated)

    def in_region(
        self, tier: TierPolicy | None, endpoint: EndpointPolicy | None, region: str | None
    ) -> tuple[TierPolicy | None, EndpointPolicy | None]:
        """``tier`` and ``endpoint`` as a client of ``region`` sees them (unchanged for no
        region, or one no row names)."""
        if region is None or region not in self.regions:
            return tier, endpoint
        if tier is not None:
            tier = tier.by_region.get(region, tier)
        if endpoint is not None:
            endpoint = endpoint.by_region.get(region, endpoint)
        return tier, endpoint

    def limits_for(
        self, tier: TierPolicy | None, endpoint: EndpointPolicy | None
    ) -> tuple[Limit, ...]:
        if tier is None:
            return ()
        if endpoint is None:
            return tier.limits
        return endpoint.limits_by_tier.get(tier.id, tier.limits)

    def groups_for(
        self,
        tier: TierPolicy | None,
        endpoint: EndpointPolicy | None,
        credential: bool = False,
    ) -> tuple[CountedGroup, ...]:
        """The endpoint's limits counted by IP address or username for this tier; for a
        ``credential`` check (login, token, authentication) or a credential rule
        (:attr:`EndpointPolicy.credential`), those of every tier whatever the caller's: they
        protect the account named and the server, so a signed-in caller or an API key
        holder guessing someone else's password meets them too."""
        if endpoint is None:
            return ()
        if credential or endpoint.credential:
            return endpoint.credential_groups
        return () if tier is None else endpoint.groups_by_tier.get(tier.id, ())

    @staticmethod
    def failure_mode_for(
        tier: TierPolicy | None,
        endpoint: EndpointPolicy | None,
        credential: bool = False,
        view: str | None = None,
    ) -> str:
        """The one place a check's failure mode is decided: the rule's (the view's own in
        code, ``view``: ``@throttle(failure_mode=…)`` or a DRF view's
        ``throttle_failure_mode``; else the endpoint rule's in the admin), else the tier's,
        else the ``FAILURE_MODE`` setting; except that a ``credential`` check (a login or
        token endpoint, or any check under a credential rule) is never served uncounted by
        the setting's ``"open"``, nor by the caller's tier's (its counters protect the
        account named, whatever the caller's tier): it counts ``"local"`` then, so password
        guessing stays limited through an outage and operators can still sign in to the
        admin. A rule that names a mode gets that mode. Static: a check made while no policy
        is compiled is decided the same way."""
        if view:
            return view
        if endpoint is not None and endpoint.failure_mode:
            return endpoint.failure_mode
        mode = (tier.failure_mode if tier is not None else "") or app_settings.FAILURE_MODE
        return "local" if credential and mode == "open" else mode


def _pick(
    rules: tuple[EndpointPolicy, ...],
    method: str,
    paths: tuple[str, ...] | None = None,
    runs_get: bool = False,
) -> EndpointPolicy | None:
    """The first of ``rules`` (ordered most specific first: longest pattern, then those
    naming methods) that covers ``method`` (and one of ``paths``, when given). A rule that
    covers HEAD (or another method that runs the GET code, ``runs_get``) only by naming GET
    yields to a rule of the same pattern naming that method, and beats one of the same
    pattern for every method."""
    covering: EndpointPolicy | None = None
    as_get = runs_get or method == "HEAD" or method not in NAMEABLE_METHODS
    for rule in rules:
        if paths is not None and not any(rule.matches_path(path) for path in paths):
            continue
        if covering is not None and rule.pattern != covering.pattern:
            break
        if not rule.methods or method in rule.methods:
            return covering if covering is not None and not rule.methods else rule
        if covering is None and as_get and "GET" in rule.methods:
            covering = rule
    return covering


#: The methods a rule can name (``models.fields.HTTP_METHODS``, not imported: the models
#: need the app registry). Any other (``FOO``, ``PROPFIND``) meets the rules naming GET, as
#: HEAD does: a function view answers it with the code its GET runs (a class-based or DRF
#: view refuses it with 405 after the check), so it must not escape the GET's limits.
NAMEABLE_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"))


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
#: Refresh intervals without a version check (no request in this process) after which the
#: next check also reads the database's record of changes saved while the backend was down
#: (one query): an outage may have begun and ended while the process was idle, unseen by it.
#: So reads come at most once per this many intervals, never under steady traffic.
QUIET_INTERVALS = 2
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
    from django_throttle.models import (
        EndpointLimit,
        EndpointRule,
        Protection,
        Tier,
        TierAssignment,
        TierLimit,
    )

    started = clock()
    with transaction.atomic(using=router.db_for_read(TierAssignment)):
        # A limit row repeating another counts the same thing: count it once (manage.py check
        # lists the copy, django_throttle.W106).
        # Each row with the regions it names (none: the default row of every region).
        regions: set[str] = set()
        tier_limits: dict[int, list[Regional]] = {}
        for row in _distinct(TierLimit.objects.select_related("tier").order_by("tier_id", "id")):
            tier_limits.setdefault(row.tier_id, []).append((row.region_set, row.to_limit()))
            regions.update(row.region_set)
        tier_rows = list(Tier.objects.all())
        automatic = _auto_factors()
        factors = {t.id: _tier_factor(t, automatic.get(t.id, 1.0)) for t in tier_rows}
        _scale(tier_limits, factors)
        # (rule, tier) -> counted by -> limits, in row order.
        endpoint_limits: dict[tuple[int, int], dict[str, list[Regional]]] = {}
        rows = EndpointLimit.objects.select_related("rule", "tier").order_by("id")
        for row in _distinct(rows):
            limit = row.to_limit()
            if row.rule.shadow:  # counted but never denying; the tier's limits still apply
                limit = dataclasses.replace(limit, shadow=True)
            by_counter = endpoint_limits.setdefault((row.rule_id, row.tier_id), {})
            by_counter.setdefault(row.counted_by, []).append((row.region_set, limit))
            regions.update(row.region_set)
        for (_rule, tier_id), by_counter in endpoint_limits.items():
            # Limits counted by IP address or username protect accounts, not capacity.
            if "client" in by_counter:
                by_counter["client"] = _scaled_rows(by_counter["client"], factors.get(tier_id))
        # A rule naming methods is more specific than one for every method (a stable sort).
        enabled = EndpointRule.objects.filter(enabled=True).order_by("id")
        rule_rows = [
            rule for rule in sorted(enabled, key=lambda rule: not rule.method_set) if _usable(rule)
        ]
        tiers, rules = _compiled_rows(
            tier_rows, tier_limits, rule_rows, endpoint_limits, None, factors
        )
        defaults: dict[str, TierPolicy] = {}
        for t in tier_rows:
            # A unique constraint allows one default of each kind.
            defaults |= {flag: tiers[t.id] for flag in _DEFAULT_FLAGS if getattr(t, flag)}
        for region in sorted(regions):
            there, rules_there = _compiled_rows(
                tier_rows, tier_limits, rule_rows, endpoint_limits, region, factors
            )
            for tier_id, tier in there.items():
                tiers[tier_id].by_region[region] = tier
            for rule, rule_there in zip(rules, rules_there, strict=True):
                rule.by_region[region] = rule_there
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
            shedding=compile_shedding(Protection.objects.order_by("pk").first()),
            regions=frozenset(regions),
            auto_factors=automatic,
        )


def _auto_factors() -> dict[int, float]:
    """The adaptive controller's factors (one ``GET``, through the circuit breaker); the
    current snapshot's when the backend cannot answer, so an outage neither lifts nor
    tightens anything."""
    from django_throttle.backends.adaptive_store import AdaptiveStore
    from django_throttle.backends.redis_nodes import CircuitOpen, get_breaker

    last = _cache.policy
    try:
        store = AdaptiveStore.of(get_backend())
        return {} if store is None else get_breaker().call(store.factors)
    except (CircuitOpen, BackendError) as exc:
        if not isinstance(exc, CircuitOpen):
            # A process's first load keeps nothing (a command's only load: its own output
            # says what it could not read; a server's breaker logs the outage).
            level = logging.WARNING if last is not None else logging.DEBUG
            logger.log(level, "adaptive factors could not be read, keeping the last: %s", exc)
        return dict(last.auto_factors) if last is not None else {}


def _tier_factor(tier: Any, automatic: float) -> float:
    """``tier``'s effective factor; 1.0 (its limits as written) while its load factor or
    floor holds a value the admin refuses (logged by name)."""
    problems = tier.factor_problems()
    if problems:
        logger.error(
            "Throttle tier %s pk=%s kept unscaled: %s. Fix it in the admin.",
            tier.slug,
            tier.pk,
            "; ".join(f"{name}: {reason}" for name, reason in problems.items()),
        )
        return 1.0
    return effective_factor(tier.load_factor, tier.min_factor, automatic)


def _scaled_rows(rows: list[Regional], factor: float | None) -> list[Regional]:
    if factor is None or factor >= 1.0:
        return rows
    return [(regions, scaled(limit, factor)) for regions, limit in rows]


def _scale(tier_limits: dict[int, list[Regional]], factors: Mapping[int, float]) -> None:
    for tier_id, rows in tier_limits.items():
        tier_limits[tier_id] = _scaled_rows(rows, factors.get(tier_id))


#: A compiled limit with the regions its row names.
Regional = tuple[tuple[str, ...], Limit]


def in_region(rows: Iterable[Regional], region: str | None) -> list[Limit]:
    """The limits a client of ``region`` meets of ``rows`` (one tier's, or one rule's for one
    tier and counter): those naming the region if any do, else those naming none."""
    rows = list(rows)
    if region is not None:
        named = [limit for regions, limit in rows if region in regions]
        if named:
            return named
    return [limit for regions, limit in rows if not regions]


def _compiled_rows(
    tier_rows: list[Any],
    tier_limits: dict[int, list[Regional]],
    rule_rows: list[Any],
    endpoint_limits: dict[tuple[int, int], dict[str, list[Regional]]],
    region: str | None,
    factors: Mapping[int, float],
) -> tuple[dict[int, TierPolicy], list[EndpointPolicy]]:
    """The tiers and enabled rules as a client of ``region`` (``None``: the defaults) sees
    them."""
    tiers: dict[int, TierPolicy] = {}
    for t in tier_rows:
        # A bad failure mode is logged and inherited: skipping the tier would lift its limits.
        failure_mode = (
            t.failure_mode
            if (region is not None and not t.row_problems())
            or (region is None and _usable(t, "kept, its failure mode ignored"))
            else ""
        )
        limits = tuple(in_region(tier_limits.get(t.id, ()), region))
        factor = factors.get(t.id, 1.0)
        tiers[t.id] = TierPolicy(t.id, t.slug, t.name, t.priority, limits, failure_mode, factor)
    there = {
        key: {counter: in_region(rows, region) for counter, rows in by_counter.items()}
        for key, by_counter in endpoint_limits.items()
    }
    # A counter with no limit for this region is no counter.
    there = {key: {c: rows for c, rows in by.items() if rows} for key, by in there.items()}
    return tiers, _shared_failure_counters([_endpoint(rule, tiers, there) for rule in rule_rows])


def _shared_failure_counters(rules: list[EndpointPolicy]) -> list[EndpointPolicy]:
    """``rules`` with the failure counters of their credential checks shared: a rule counting
    failures (a shadow one aside) meets the limits by IP address and by username of every
    such rule, so an account's failures count together wherever they are tried (the web
    login, the token view, the admin's login) and its budget is the strictest limit written,
    not their sum. Rows written alike (same algorithm, rate, burst…) are one counter, under
    the id and name of the first of them (one counter has one name, in a refusal and in the
    operator tools, whichever rule meets it); each other limit keeps its own row's counter,
    so a key is only ever read with the one rate it was written with.

    Rules counting every attempt, or successes, keep their own counters: charging another
    rule's failure counter for their successes would lock the account out for signing in."""
    sharing = {r.id for r in rules if r.counts == "failures" and not r.shadow}
    # (counter, limit without id or name) -> the first row's limit, and its rule's name.
    first: dict[tuple[str, Limit], tuple[Limit, str]] = {}
    for rule in rules:
        if rule.id in sharing:
            for counter, limits in rule.credential_groups:
                for limit in limits:
                    first.setdefault((counter, _shape(limit)), (limit, rule.name))
    if not first:
        return rules
    shared = []
    for rule in rules:
        if rule.id not in sharing:
            shared.append(rule)
            continue
        groups: list[CountedGroup] = []
        others: dict[str, str] = {}
        for counter in ("ip", "username"):
            met: dict[Limit, Limit] = {}
            for kind, limits in rule.credential_groups:
                for limit in limits if kind == counter else ():
                    shape = _shape(limit)
                    owned, owner = first[counter, shape]
                    # One counter, one name: the row owning it (the 429's and the tools').
                    met.setdefault(shape, replace(limit, id=owned.id, name=owned.name))
                    if owner != rule.name:  # its own row, written alike: the other's counter
                        others[owned.id] = owner
            for (kind, shape), (limit, owner) in first.items():
                if kind == counter and shape not in met:
                    met[shape] = limit
                    others[limit.id] = owner
            if met:
                groups.append((counter, tuple(met.values())))
        shared.append(replace(rule, credential_groups=tuple(groups), others=others))
    return shared


def _shape(limit: Limit) -> Limit:
    """What ``limit`` counts, without the row it came from."""
    return replace(limit, id="", name="")


def _endpoint(
    rule: Any,
    tiers: dict[int, TierPolicy],
    endpoint_limits: dict[tuple[int, int], dict[str, list[Limit]]],
) -> EndpointPolicy:
    """An enabled rule with its limits for every tier, by counter."""
    own: dict[int, tuple[Limit, ...]] = {}
    groups: dict[int, tuple[tuple[str, tuple[Limit, ...]], ...]] = {}
    # Every tier's limits counted by IP address or username: what a credential check meets
    # whatever the caller's tier (rows written alike are one counter: _shared_failure_counters).
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
        criticality=rule.criticality,
    )


def _distinct(rows: Iterable[Any]) -> list[Any]:
    """The usable limit rows of ``rows`` that repeat none before them."""
    from django_throttle.policy.files import repeats

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
    #: A change made here that the backend could not be told of (it was down): told at the
    #: first version check it answers.
    unpublished: bool = False
    #: Whether the version check has not answered since the last check that read the
    #: database's record of unpublished changes, and the breaker (and its ``failures`` count)
    #: that check saw: an outage met by any call since (or a new breaker, or none checked yet
    #: in this process) makes the next answered check read the record once.
    missed: bool = True
    breaker: Any = None
    failures: int = 0


_cache = _Cache()


@dataclass
class VersionGate:
    """Whether :func:`current` may check the shared version now (``allows``, asked only when
    a check is due), and, once it held a snapshot unchecked, how long before that the
    snapshot's version had last been checked (``unchecked_for``, seconds; ``None`` while no
    check was skipped)."""

    allows: Callable[[], bool]
    unchecked_for: float | None = None


_gate: ContextVar[VersionGate | None] = ContextVar("django_throttle_version_gate", default=None)


@contextmanager
def version_checks_while(allows: Callable[[], bool]) -> Iterator[VersionGate]:
    """Within the block, a due version check is made only while ``allows()``; otherwise
    :func:`current` returns the snapshot this process holds, unchecked (one that holds none
    still compiles it). For an operator page reading a slow backend under a read budget
    (:class:`~django_throttle.inspection.budget.ReadBudget`): the check is one more backend
    read, and once the page's budget is spent it must cost no more than the reads it
    skips. The gate says whether a check was skipped, so the page can say that the policy
    shown is the last one read."""
    gate = VersionGate(allows)
    token = _gate.set(gate)
    try:
        yield gate
    finally:
        _gate.reset(token)


def current() -> Policy:
    """The snapshot to use now; reloads when the shared version moved, when this process
    changed the policy, or when the snapshot is older than :data:`MAX_AGE` (all checked
    at most once per refresh interval, so most calls touch neither the database nor the
    backend). Other threads keep the previous snapshot while one thread recompiles. Within
    :func:`version_checks_while`, a check its gate does not allow is not made."""
    policy = _cache.policy
    if policy is not None and clock() - _cache.checked_at < REFRESH_INTERVAL:
        return policy  # fresh(), read here without a call: this runs on every request
    gate = _gate.get()
    if policy is not None and gate is not None and not gate.allows():
        gate.unchecked_for = clock() - _cache.checked_at
        return policy
    with _cache.lock:
        now = clock()
        policy = _cache.policy
        if policy is not None and now - _cache.checked_at < REFRESH_INTERVAL:
            return policy
        quiet = now - _cache.checked_at >= QUIET_INTERVALS * REFRESH_INTERVAL
        _cache.checked_at = now
        version, answered = _shared_version(policy, quiet)
        # The interval counts from the check's answer: a check that waited out a long socket
        # timeout (a hung Redis, ``socket_timeout`` of a second or more) must not leave the
        # next call due at once, or one admin page (or request) pays the timeout per call.
        _cache.checked_at = clock()
        if (
            policy is None
            or not policy.loaded
            or _cache.changed_here
            or version != policy.version
            or now - policy.compiled_at >= MAX_AGE
        ):
            # Cleared first: a change signalled while compiling triggers another compile.
            _cache.changed_here = False
            # Compiled while the version could not be read, the snapshot is labelled with no
            # version: an edit another process saved meanwhile (and could not publish) may
            # be missing from it, so the first check the backend answers recompiles it.
            policy = _cache.policy = _compile(policy, version if answered else None)
        return policy


def fresh() -> Policy | None:
    """The snapshot when no refresh check is due, else ``None`` (then call :func:`current`,
    which may read the backend and the database): lets async code stay off threads."""
    policy = _cache.policy
    if policy is not None and clock() - _cache.checked_at < REFRESH_INTERVAL:
        return policy
    return None


def _shared_version(policy: Policy | None, quiet: bool = False) -> tuple[str | None, bool]:
    """The backend's policy version through the circuit breaker, and ``True``; the
    snapshot's own version (no reload) and ``False`` when the backend cannot answer.

    The database's record of changes saved while the backend was down (and never published:
    their process may have exited) is read once when the backend answers after this process
    met an outage (a failed call of any kind), or, ``quiet``, after it checked nothing for
    :data:`QUIET_INTERVALS` refresh intervals (an outage may have come and gone unseen), so
    such a change reaches every process within a second of the backend answering again.

    An open breaker logs nothing here: the breaker itself logs when it opens and closes. A
    failure is a warning only when a snapshot is kept because of it.

    A missing version (Redis restarted empty, or the key expired) is not one: the check
    that finds none publishes one (a bump), so every process recompiles once. Otherwise a
    process whose snapshot was compiled while the key was missing would take the missing
    key for its snapshot's version, and miss an edit that a process saved while Redis was
    down and could not publish before it exited."""
    from django_throttle.backends.redis_nodes import CircuitOpen, get_breaker

    breaker, backend = get_breaker(), get_backend()
    try:
        version = breaker.call(backend.get_policy_version)
        recorded = None
        if (
            quiet
            or _cache.missed
            or breaker is not _cache.breaker
            or breaker.failures != _cache.failures
        ):
            # The first answer after an outage (or in this process, or after a quiet spell):
            # publish what processes saved meanwhile and could not (one query; they may have
            # exited since).
            _cache.missed, _cache.breaker, _cache.failures = False, breaker, breaker.failures
            recorded = _newest_unpublished()
        pending = _cache.unpublished or version is None or recorded is not None
        if pending and _publish_late(recorded) and (version is None or recorded is not None):
            version = breaker.call(backend.get_policy_version)
        return version, True
    except CircuitOpen:
        _cache.missed = True
    except BackendError as exc:
        _cache.missed = True
        # Without a snapshot the policy is compiled from the database anyway: nothing kept,
        # nothing to warn of (a command's only load would log it before its own answer).
        level = logging.WARNING if policy is not None else logging.DEBUG
        logger.log(level, "policy version check failed, keeping the current policy: %s", exc)
    return (policy.version if policy is not None else None), False


def _publish_late(recorded: int | None = None) -> bool:
    """Move the shared version, now that the backend answers, and say whether it moved: to
    tell the other processes of a change this process saved while the backend was down
    (they apply it within a second of their next check, not when their snapshots reach
    :data:`MAX_AGE`), or of those the database records (``recorded``: the newest record's
    id, deleted with every older one once published), or to give a missing version a value.
    (Their check reads the moved version; so does this process's next one, which recompiles
    once more, harmlessly.) A failure keeps the change pending."""
    from django_throttle.backends.redis_nodes import get_breaker

    try:
        get_breaker().call(get_backend().bump_policy_version)
    except BackendError as exc:
        # Said once already, when the change was saved: no line per check while it fails.
        logger.debug("could not publish the policy change to other processes: %s", exc)
        _cache.missed = True  # the records stay: read them again at the next answer
        return False
    if recorded is not None:
        _forget_unpublished(recorded)
    if _cache.unpublished or recorded is not None:
        _cache.unpublished = False
        logger.info("policy change saved while the backend was down published to other processes")
    return True


def record_unpublished() -> None:
    """Record in the database that a change saved here could not be published, so that the
    first process to meet the backend answering again publishes it, should this one exit
    first (one insert; a database error is logged, and the change then reaches the other
    processes when they meet :data:`MAX_AGE`)."""
    from django_throttle.models import UnpublishedChange

    try:
        with transaction.atomic(using=router.db_for_write(UnpublishedChange)):
            UnpublishedChange._default_manager.create()
    except Exception as exc:  # never a request's error (as _compile)
        logger.warning("could not record the unpublished policy change: %s", exc)


def _newest_unpublished() -> int | None:
    """The id of the newest recorded unpublished change, else ``None`` (one query, in a
    savepoint inside a request's transaction; a database error is ``None``, logged)."""
    from django_throttle.models import UnpublishedChange

    try:
        with transaction.atomic(using=router.db_for_read(UnpublishedChange)):
            newest = UnpublishedChange._default_manager.order_by("-pk").values_list("pk", flat=True)
            found: int | None = newest.first()
            return found
    except Exception as exc:  # never a request's error (as _compile)
        logger.warning("could not read the unpublished policy changes: %s", exc)
        return None


def _forget_unpublished(newest: int) -> None:
    """Delete the records of published changes: ``newest`` and every older one (a change
    recorded since stays, for the next process to publish)."""
    from django_throttle.models import UnpublishedChange

    try:
        with transaction.atomic(using=router.db_for_write(UnpublishedChange)):
            UnpublishedChange._default_manager.filter(pk__lte=newest).delete()
    except Exception as exc:  # never a request's error (as _compile)
        logger.warning("could not delete the published policy changes' records: %s", exc)


def _compile(last: Policy | None, version: str | None) -> Policy:
    """A fresh snapshot, else the last good one, else an empty stand-in retried next interval
    (never an exception: requests must not fail because the policy cannot be read)."""
    try:
        policy = compile_policy(version)
    except Exception as exc:
        if isinstance(exc, DatabaseError):
            logger.error("throttle policy could not be loaded: %s%s", exc, _unmigrated_hint())
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


def _unmigrated_hint() -> str:
    """The fix when the policy could not be read because the app's tables do not exist yet
    (``manage.py migrate`` not run: every request is served unlimited meanwhile), else
    nothing. Asked only after a failed load, so the look at the schema costs no request."""
    from django.db import connections

    from django_throttle.models import Tier

    try:
        tables = connections[router.db_for_read(Tier)].introspection.table_names()
    except DatabaseError:
        return ""
    if Tier._meta.db_table in tables:
        return ""
    return " (the django_throttle tables do not exist: run 'manage.py migrate')"


def last() -> Policy | None:
    """The snapshot this process holds, however old, without any refresh check (for code
    that must not touch the database, e.g. on an event loop); ``None`` before the first."""
    return _cache.policy


def invalidate() -> None:
    """Recompile on next use in this process (other processes follow the shared version),
    keeping the current snapshot in case the database cannot be read."""
    _cache.changed_here = True
    _cache.checked_at = -math.inf


def unpublished() -> None:
    """The change this process just saved could not be published (the backend is down):
    publish it at the first version check the backend answers (see :func:`current`)."""
    _cache.unpublished = True


def reset() -> None:
    """Forget the snapshot entirely (tests, settings changes)."""
    with _cache.lock:
        _cache.policy, _cache.changed_here, _cache.checked_at = None, False, -math.inf
        _cache.unpublished = False
        _cache.missed, _cache.breaker, _cache.failures = True, None, 0


#: Unix seconds, for API key expiry; tests replace it to expire a key without sleeping.
key_clock = time.time


def resolve_identity(request: Any) -> Identity:
    """The default resolver: a verified API key's prefix, else the user's pk when
    authenticated, else the client network."""
    key = presented_key(request.META)
    api_key = None if key is None else _verified(key)
    if api_key is not None:
        return Identity("key", api_key.prefix)
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return Identity("user", str(user.pk), user_id=user.pk)
    address = client_ip(request.META)
    return UNIDENTIFIED if address is None else Identity("ip", address)


def verified_api_key(request: Any) -> ApiKeyPolicy | None:
    """The active, unexpired API key the request presents, from the policy snapshot (no
    query), else ``None``. Every presented key costs the same: see
    :meth:`Policy.verify_key`."""
    key = presented_key(request.META)
    return None if key is None else _verified(key)


def _verified(key: str) -> ApiKeyPolicy | None:
    snapshot = _snapshot()
    if snapshot is None:
        return None
    return snapshot.verify_key(
        key, app_settings.api_key_secret, key_clock(), app_settings.api_key_fallbacks
    )


def _snapshot() -> Policy | None:
    """The policy snapshot; on an event loop, never one that needs the database (the async
    core has refreshed it already, inline rate or not)."""
    snapshot = fresh()
    if snapshot is not None:
        return snapshot
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return current()
    return last()


def get_resolver() -> Callable[[Any], Identity]:
    """The configured resolver callable (imported once per dotted path)."""
    resolver: Callable[[Any], Identity] = import_resolver(app_settings.IDENTITY_RESOLVER)
    return resolver


#: The resolver a dotted path names, imported once per path (the request path calls it with
#: ``DJANGO_THROTTLE_IDENTITY_RESOLVER`` directly, skipping :func:`get_resolver`).
import_resolver: Callable[[str], Callable[[Any], Identity]] = functools.cache(import_string)


# -- the region a request comes from ---------------------------------------------------------
# For the limits that name regions (``DJANGO_THROTTLE_REGION_SOURCE``): a trusted edge's header,
# or the client address's country in a GeoIP2 database. A header is believed only from a proxy
# ``TRUSTED_PROXIES`` trusts; anything else (no header, an untrusted sender, a value that is no
# region code, an address the database does not know, a database that cannot be opened) is no
# region, and the client meets the default limits. The GeoIP2 database (Django's
# :class:`~django.contrib.gis.geoip2.GeoIP2`, its ``GEOIP_PATH``) is opened once per process; a
# system check names one that cannot be opened. Nothing here raises into a request, queries the
# database or calls Redis.


class CountryReader(Protocol):
    """What is read of a GeoIP2 database (Django's ``GeoIP2`` has it)."""

    def country_code(self, query: str) -> str | None: ...


def request_region(request: Any) -> str | None:
    """The region code of ``request`` by ``REGION_SOURCE``, else ``None``."""
    source = app_settings.region_source
    if source is None:
        return None
    meta = request.META
    kind, header = source
    if kind == REGION_GEOIP:
        address = client_ip(meta)
        return None if address is None else address_region(address)
    if not from_trusted_proxy(meta):
        return None
    return region_code(meta.get(header))


def address_region(address: str) -> str | None:
    """The country code of ``address`` (an address, or the ``/64`` network the limiter
    counts an IPv6 client by) in the GeoIP2 database, else ``None``."""
    reader = geoip()
    if reader is None:
        return None
    try:
        return region_code(reader.country_code(address.partition("/")[0]))
    except Exception:  # an address the database does not know; a damaged database
        return None


_geoip_lock = threading.Lock()
#: The process's database, by the ``GEOIP_PATH`` it was opened from (``None``: could not be).
_geoip_opened: dict[str, CountryReader | None] = {}


def geoip() -> CountryReader | None:
    """The GeoIP2 database of ``GEOIP_PATH``, opened once per process and path; ``None``
    when it cannot be opened (logged once)."""
    path = str(getattr(settings, "GEOIP_PATH", "") or "")
    if path in _geoip_opened:
        return _geoip_opened[path]
    with _geoip_lock:
        if path not in _geoip_opened:
            reader, problem = open_geoip()
            if problem:
                logger.error(
                    "Regions by GeoIP2: %s; every client meets the default limits.", problem
                )
            _geoip_opened[path] = reader
    return _geoip_opened[path]


def open_geoip() -> tuple[CountryReader | None, str]:
    """Django's ``GeoIP2`` on ``GEOIP_PATH``, or ``None`` and why it cannot be opened."""
    try:
        from django.contrib.gis.geoip2 import GeoIP2
    except Exception as exc:  # the geoip2 package is missing
        return None, f"django.contrib.gis.geoip2 cannot be imported ({exc})"
    try:
        return GeoIP2(), ""
    except Exception as exc:
        return None, f"the GeoIP2 database of GEOIP_PATH cannot be opened ({exc})"


def forget_geoip() -> None:
    """Open the database again on next use (tests; a new ``GEOIP_PATH``)."""
    with _geoip_lock:
        _geoip_opened.clear()
