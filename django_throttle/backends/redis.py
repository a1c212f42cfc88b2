"""Redis backend: every limit of a request checked in one script call, on the server's clock; the
call's arguments, its reply read as a decision, and the decisions counted in the process for
the usage reports.

Keys are ``<prefix>:{<shard>}<client digest><code><limit id>`` (``t`` token bucket, ``g``
GCRA, ``l`` leaky bucket, ``f`` fixed window, ``w`` sliding log, ``s`` sliding counter, ``c``
calendar quota): the hash tag is the shard, so all keys of one call, and that shard's usage
counters, share a Redis Cluster slot. A shared limit's key has ``*`` in place of the client digest,
``<prefix>:{<shard>}*<suffix>``: one state per shard for every client of that shard, still in
the calling client's slot, each enforcing its share of the capacity (:func:`.base.per_shard`).
Scripts ship as ``.lua`` files in this package (assembled by :mod:`.scripts`) and run as Redis
functions (``FCALL``; :class:`.redis_nodes.Functions`) through redis-py's own clients
(``Redis``, ``RedisCluster``, Sentinel's ``master_for``, and their ``redis.asyncio`` twins for
``async def`` views), or by ``EVALSHA`` where a server has no functions or the user may not
load them; a server without the call's code (the call did not run) gets it and the call once
more (``FUNCTION LOAD``, or ``EVAL`` after ``NOSCRIPT``). Nothing else is ever replayed,
because a call that timed out may already have counted: the clients it builds
(:func:`.redis_clients.build_client`) have retries off, short timeouts and a bounded pool, and
every failure (redis-py's errors, socket errors, a garbled reply) surfaces as
:class:`BackendError`; an error reply of the counting script itself (an argument it refuses)
as :class:`~.base.ArgumentRefused`, which is our bug and no outage (see
:func:`.scripts.failure`). :mod:`.redis_nodes` sends the calls to one server or a
Sentinel-managed primary, :mod:`.redis_cluster` across a cluster's primaries.

A call is a :class:`~.redis_nodes.ScriptCall`: the script's digest and source, one key per limit,
then the arguments ``lua/driver.lua`` (or ``lua/refund.lua``) lists in its header. What is the
same for every call of a limit list (its key suffixes, its limit specs, the script) is worked
out once per list and kept by the list's value (:class:`Calls`), so a request only adds its key
prefix, cost and clock; :func:`decision_of` reads the reply.

A decision is counted in the process that made it (:class:`Tally`, no I/O), never in the
counting script, so the counting call touches the counters only. The tally is pushed to the
usage store (:mod:`.usage_store`) in one pipelined call at most once per :data:`PUSH_EVERY`
(``usage.accounting``'s pusher thread does it once that second has passed, and a read of the
store first pushes its own backend's tally), so a worker that dies loses at most its last
second's counts.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import secrets
import threading
import time
import uuid
from base64 import urlsafe_b64encode
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Any, Protocol

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.cluster import RedisCluster

from django_throttle.backends.base import (
    ALGORITHM_CODES,
    CACHED_LISTS,
    DIGEST_SIZE,
    Backend,
    BackendError,
    Limits,
    NodeUnavailable,
    Now,
    Taken,
    Usage,
    check_taken_at,
    note_lease,
    per_shard,
)
from django_throttle.backends.redis_clients import (
    build_client,
    client_for,
    client_options,
    glob_escape,
    parse_cluster_url,
)
from django_throttle.backends.redis_cluster import (
    ClusterRoute,
    PrimaryHealth,
    number_tags,
    spread_tags,
)
from django_throttle.backends.redis_nodes import OneServer, ScriptCall
from django_throttle.backends.scripts import (
    LEASE_FILES,
    REFUND_FILES,
    REFUND_TOGETHER_FILES,
    RETIME_FILES,
    SCRIPT_FILES,
    TOGETHER_FILES,
    Call,
    call_backend,
    failure,
    files_for,
    load_script,
)
from django_throttle.conf import app_settings, is_cluster_url
from django_throttle.rates import FLEET, WORKER, Algorithm, Decision, Limit, windows
from django_throttle.redaction import redact_text

__all__ = ["RedisBackend"]

logger = logging.getLogger("django_throttle.backends")

#: The policy version key outlives any sane gap between edits; missing simply means "reload".
POLICY_VERSION_TTL = 30 * 86400
#: Each bump moves the policy version by a random step below this: a counter from 1 would
#: repeat the count a worker last read once Redis restarts empty (or loses the key), and that
#: worker would take the next edit for the policy it has (now a 1 in 2**32 chance). Small
#: enough that Redis's 64-bit counter never overflows: 2**31 bumps of the largest step.
POLICY_VERSION_STEP = 2**32
#: The load shedders' limit ids: a decision denied by one of them was shed (see Tally.add).
SHEDDERS = (FLEET, WORKER)
#: Keys asked of each SCAN step, and so at most this many per retime script call.
RETIME_BATCH = 1000
#: The socket timeouts of a client made for long reads.
_TIMEOUTS = ("socket_timeout", "socket_connect_timeout")


class Route(Protocol):
    """Where a backend's script calls go, and all it asks of them: one server or a
    Sentinel-managed primary (:class:`.redis_nodes.OneServer`), a cluster's primaries
    (:class:`.redis_cluster.ClusterRoute`), or this process's memory
    (:class:`.memory.InProcess`). The backend's keys, scripts and replies are the same on
    each, so a route decides only where a call runs."""

    @property
    def client(self) -> Any:
        """The client the backend's other commands (``GET``, pipelines, ``SCAN``) go to."""

    def call(self, call: ScriptCall) -> Any:
        """The script's reply to ``call``, untouched; a failure as :func:`.scripts.failure`
        makes it. Never sent twice, except after "no such function" or ``NOSCRIPT`` (nothing
        ran)."""

    async def acall(self, call: ScriptCall) -> Any:
        """:meth:`call` without blocking the running event loop."""

    def evalsha_all(
        self, sha: str, source: str, calls: Sequence[Call], client: Any = None
    ) -> list[Any]:
        """:func:`.scripts.evalsha_all` on ``client`` (default: :attr:`client`)."""

    def patient_client(self, timeout: float) -> tuple[Any, bool]:
        """A client whose reads may take ``timeout`` seconds, and whether to close it."""

    def scanned_clients(self) -> list[Any]:
        """The clients whose keys together are every key."""

    def by_slot(self, keys: list[Any]) -> list[list[Any]]:
        """``keys`` in groups one script call may take together."""

    def close(self, client_too: bool) -> None:
        """Let go of connections (the client's own only if ``client_too``)."""


class Unusable:
    """The route of a backend whose settings name no Redis a client can be built for (a
    malformed ``DJANGO_THROTTLE_REDIS_URL``, a borrowed cache that is no Redis): every call
    raises :class:`BackendError` saying which setting and why, so that a request meets its
    failure mode as when Redis cannot be reached, never a 500 (``manage.py check`` names the
    setting too, when checks run)."""

    def __init__(self, problem: str) -> None:
        self.problem = problem

    @property
    def client(self) -> Any:
        raise BackendError(self.problem)

    def call(self, call: ScriptCall) -> Any:
        raise BackendError(self.problem)

    async def acall(self, call: ScriptCall) -> Any:
        raise BackendError(self.problem)

    def evalsha_all(
        self, sha: str, source: str, calls: Sequence[Call], client: Any = None
    ) -> list[Any]:
        raise BackendError(self.problem)

    def patient_client(self, timeout: float) -> tuple[Any, bool]:
        raise BackendError(self.problem)

    def scanned_clients(self) -> list[Any]:
        raise BackendError(self.problem)

    def by_slot(self, keys: list[Any]) -> list[list[Any]]:
        return [keys]

    def close(self, client_too: bool) -> None:
        """Nothing to let go of: no client was built."""


def unusable_settings(exc: Exception) -> str:
    """What is wrong with the settings a client could not be built from, naming them (a URL's
    password masked)."""
    shown = repr(getattr(settings, "DJANGO_THROTTLE_REDIS_URL", None))
    if isinstance(exc, ImproperlyConfigured):  # a borrowed cache's: it names the settings
        return redact_text(str(exc).rstrip("."))
    if isinstance(exc, TypeError):  # an option the client does not take
        where = f"DJANGO_THROTTLE_REDIS_OPTIONS (with DJANGO_THROTTLE_REDIS_URL = {shown})"
    else:
        where = f"DJANGO_THROTTLE_REDIS_URL = {shown}"
    return redact_text(f"{where} cannot be used: {str(exc).rstrip('.')}")


class RedisBackend(Backend):
    """Counts in Redis (single server, Sentinel-managed primary or Redis Cluster; anything
    speaking its protocol with ``FCALL`` or ``EVALSHA``).

    A ``client`` passed in (``redis.Redis`` or ``RedisCluster``) is used as it is: give it
    short timeouts and no retries (see :mod:`.redis_clients`). Counting calls go through its
    own command path; ``async def`` ones through a ``redis.asyncio`` twin with the same
    options, one per event loop (:mod:`.redis_nodes`, :mod:`.redis_cluster`).

    ``route`` is for this package's own use: the :class:`Route` to run the scripts on in place
    of Redis (:class:`~.memory.MemoryBackend` hands in its in-process one). With it no client
    is built or closed, and ``client`` is not asked for.
    """

    def __init__(
        self,
        client: redis.Redis | RedisCluster | None = None,
        *,
        shards: int | None = None,
        route: Route | None = None,
    ) -> None:
        self._owns_client = client is None and route is None
        self.prefix = app_settings.KEY_PREFIX
        #: Key shards (default: the ``?shards=`` of ``DJANGO_THROTTLE_REDIS_URL``).
        self.shards = shards or app_settings.key_shards
        #: On a cluster the shards' hash tags spread their slots evenly (.redis_cluster);
        #: a route handed in is never a cluster (the setting's URL is not its server).
        self._spread = route is None and (
            isinstance(client, RedisCluster)
            or (client is None and is_cluster_url(app_settings.REDIS_URL))
        )
        self._tags = tuple(tag.encode() for tag in self.shard_tags())
        self._calls = Calls(partial(self._script_for, SCRIPT_FILES), self.shards, self.local_time)
        self._refunds = Calls(partial(self._script_for, REFUND_FILES), self.shards, self.local_time)
        # Only their scripts are used: a group's keys and specs are its counting call's.
        self._together = Calls(partial(self._script_for, TOGETHER_FILES))
        self._refunds_together = Calls(partial(self._script_for, REFUND_TOGETHER_FILES))
        self._route: Route
        if route is not None:
            self._route = route
        else:
            try:
                self._route = self._route_to(client)
            except (ValueError, TypeError, ImproperlyConfigured) as exc:
                # Checks skipped (runserver --skip-checks, a WSGI server): requests meet their
                # failure mode, as when Redis is down, and this says why once per process.
                self._route = Unusable(unusable_settings(exc))
                logger.error(
                    "%s; every counting call fails, so requests meet their failure mode as "
                    "when Redis cannot be reached (manage.py check reports it too).",
                    self._route.problem,
                )
        #: This process's count of the decisions made with a usage field, until pushed
        #: (:class:`Tally`): the counting call itself counts no usage.
        self.usage_tally = Tally(self.local_time)
        source = load_script(RETIME_FILES)
        self._retime = (hashlib.sha1(source.encode()).hexdigest(), source)
        source = load_script(LEASE_FILES)
        self._lease = (hashlib.sha1(source.encode()).hexdigest(), source)
        self._version_key = f"{self.prefix}:policy-version"

    def _route_to(self, client: redis.Redis | RedisCluster | None) -> Route:
        """The route to ``client``, or to the Redis the settings name. Raises ``ValueError``,
        ``TypeError`` or ``ImproperlyConfigured`` for settings no client can be built from."""
        if client is None and is_cluster_url(app_settings.REDIS_URL):
            # Built on first use: a cluster client asks for the slot map as it is made. A
            # malformed URL is a settings error now, not a cluster that does not answer.
            url, options = client_options()
            parse_cluster_url(url)
            return ClusterRoute(
                build_client,  # type: ignore[arg-type]
                self.shard_tags(),
                lambda timeout: client_for(url, {**options, **dict.fromkeys(_TIMEOUTS, timeout)}),
                sender=type(self),
            )
        given = client if client is not None else build_client()
        if isinstance(given, RedisCluster):
            return ClusterRoute(lambda: given, self.shard_tags(), sender=type(self))
        return OneServer(given, type(self))

    @property
    def unusable(self) -> str:
        """Why no client could be built from the settings (naming them), else ``""``."""
        return self._route.problem if isinstance(self._route, Unusable) else ""

    def local_time(self) -> float:
        """This process's reading of the server's clock (Unix seconds), for what must be
        named before a script reads ``TIME``: a usage key's minute, a calendar quota's
        windows."""
        return time.time()

    @property
    def client(self) -> Any:
        """The redis-py client (``redis.Redis``, or ``RedisCluster`` on a cluster, built on
        first use there: a :class:`BackendError` while no node answers); the route's own
        client when one was handed in (the in-process store)."""
        return self._route.client

    @property
    def on_cluster(self) -> bool:
        """Whether the keys are spread over a Redis Cluster's primaries."""
        return isinstance(self._route, ClusterRoute)

    def primaries_health(self) -> list[PrimaryHealth]:
        """Each cluster primary's ``PING`` and breaker (:meth:`.ClusterRoute.health`); none
        on a single server, whose health is the backend's."""
        return self._route.health() if isinstance(self._route, ClusterRoute) else []

    def _script_for(self, files: Sequence[str], codes: frozenset[str]) -> str:
        """The source of ``files`` defining only the algorithms ``codes`` need."""
        return load_script(files_for(files, codes))

    def shard_tags(self) -> tuple[str, ...]:
        """Every shard's key prefix, ``"<prefix>:{<tag>}"``: one Redis Cluster slot each. The
        tags are the shard numbers on one server, and on a cluster numbers whose slots are
        spread evenly over the slot range (:func:`.redis_cluster.spread_tags`)."""
        tags = spread_tags(self.shards) if self._spread else number_tags(self.shards)
        return tuple(f"{self.prefix}:{{{tag}}}" for tag in tags)

    def key(self, client: str, limit: Limit) -> str:
        """The key of ``client``'s state of ``limit`` (for a shared limit, its shard's)."""
        tag = self._client_tag(client)[1]
        if limit.shared:
            tag = tag[:-DIGEST_KEY_CHARS] + SHARED_MARK
        return tag.decode() + key_suffix(limit)

    def _client_tag(self, client: str) -> tuple[int, bytes]:
        """The client's shard and ``<prefix>:{<shard>}<digest>``, the start of every key of
        this client: a 96-bit digest in 16 base64url characters (user-controlled text never
        shapes a key), the shard taken from the same digest."""
        # base.shard_of's arithmetic, inline: this runs on every call, and one function call
        # fewer on that path is kept.
        digest = hashlib.blake2b(client.encode(), digest_size=DIGEST_SIZE).digest()
        shard = (digest[0] << 8 | digest[1]) % self.shards
        return shard, self._tags[shard] + urlsafe_b64encode(digest)

    def hit(
        self, client: str, limits: Limits, cost: int = 1, *, now: Now = None, usage: Usage = None
    ) -> Decision:
        """:meth:`count` without ``peek``, written out: the request path's one backend call
        makes one call into the backend fewer."""
        call = self._request(client, limits, cost, now, usage)
        args = call.args  # the lease id is the last of a full argument list (lua/driver.lua)
        lease = args[-1] if len(args) == len(call.keys) + 4 else None
        try:
            decision = decision_of(client, limits, self._route.call(call), lease)
        except BaseException as exc:
            _noted(exc, client, limits, lease)
            raise
        if usage:
            self.usage_tally.add(
                usage, client, decision.allowed, decision.shadow, now, decision.limit
            )
        return decision

    def count(
        self, client: str, limits: Limits, cost: int, now: Now, usage: Usage, peek: bool = False
    ) -> Decision:
        call = self._request(client, limits, cost, now, usage, peek=peek)
        lease = lease_of(call)
        try:
            decision = decision_of(client, limits, self._route.call(call), lease)
        except BaseException as exc:
            _noted(exc, client, limits, lease)
            raise
        if usage and not peek:
            self.usage_tally.add(
                usage, client, decision.allowed, decision.shadow, now, decision.limit
            )
        return decision

    async def acount(
        self, client: str, limits: Limits, cost: int, now: Now, usage: Usage, peek: bool = False
    ) -> Decision:
        """:meth:`count` on ``redis.asyncio``: the same script call, no thread."""
        call = self._request(client, limits, cost, now, usage, peek=peek)
        lease = lease_of(call)
        try:
            decision = decision_of(client, limits, await self._route.acall(call), lease)
        except BaseException as exc:  # a timeout, or the await cancelled (the client left)
            _noted(exc, client, limits, lease)
            raise
        if usage and not peek:
            self.usage_tally.add(
                usage, client, decision.allowed, decision.shadow, now, decision.limit
            )
        return decision

    def refund(
        self,
        client: str,
        limits: Limits,
        cost: int = 1,
        *,
        looked: Limits | None = None,
        now: Now = None,
        taken_at: Taken = None,
    ) -> Decision | None:
        """One call of refund.lua over the keys the hit used (same slot); ``taken_at``
        travels as ARGV[1]'s ``#<taken>``. With ``looked``, their keys too and the count
        given back as its last argument: it answers what the headers report."""
        every, call = self._refund_call(client, limits, cost, looked, now, taken_at)
        if call is None:
            return None
        reply = self._route.call(call)
        return None if looked is None else shown_of(every, reply)

    async def arefund(
        self,
        client: str,
        limits: Limits,
        cost: int = 1,
        *,
        looked: Limits | None = None,
        now: Now = None,
        taken_at: Taken = None,
    ) -> Decision | None:
        """:meth:`refund` on ``redis.asyncio``, as :meth:`acount`."""
        every, call = self._refund_call(client, limits, cost, looked, now, taken_at)
        if call is None:
            return None
        reply = await self._route.acall(call)
        return None if looked is None else shown_of(every, reply)

    def _refund_call(
        self,
        client: str,
        limits: Limits,
        cost: int,
        looked: Limits | None,
        now: Now,
        taken_at: Taken,
    ) -> tuple[Limits, ScriptCall | None]:
        """The limits :meth:`refund` reports on and its call of refund.lua (``None``: no
        limit to give back, nothing to look at)."""
        check_taken_at(taken_at)
        every = tuple(limits) if looked is None else (*limits, *looked)
        if not every:
            return every, None
        given = None if looked is None else len(limits)
        return every, self._request(client, every, cost, now, None, True, taken_at, given=given)

    def hit_together(
        self,
        groups: Sequence[tuple[str, Limits]],
        cost: int = 1,
        *,
        now: Now = None,
        usage: Usage = None,
    ) -> list[Decision] | None:
        """One call of together.lua over every group's keys, when they may share one
        (:meth:`_together_call`): a login counted by its client, its IP address and its
        username is one round trip. ``None`` (nothing sent) when they may not."""
        call = self._together_call(groups, cost, now)
        if call is None:
            return None
        return self._together_decided(groups, self._route.call(call), now, usage)

    async def ahit_together(
        self,
        groups: Sequence[tuple[str, Limits]],
        cost: int = 1,
        *,
        now: Now = None,
        usage: Usage = None,
    ) -> list[Decision] | None:
        """:meth:`hit_together` on ``redis.asyncio``, as :meth:`acount`."""
        call = self._together_call(groups, cost, now)
        if call is None:
            return None
        return self._together_decided(groups, await self._route.acall(call), now, usage)

    def refund_together(
        self,
        groups: Sequence[tuple[str, Limits]],
        cost: int = 1,
        *,
        looked: Sequence[Limits] | None = None,
        now: Now = None,
        taken_at: Sequence[Taken] = (),
    ) -> bool | list[Decision]:
        """One call of refund_together.lua over every group's keys, when they may share
        one (as :meth:`hit_together`); ``False`` (nothing sent) when they may not. With
        ``looked``, each group's ``looked`` limits among its keys: it answers what the
        headers report on each group (see lua/refund_together.lua)."""
        every, call = self._refund_together_call(groups, cost, looked, now, taken_at)
        if call is None:
            return False
        reply = self._route.call(call)
        return True if looked is None else shown_together(every, reply)

    async def arefund_together(
        self,
        groups: Sequence[tuple[str, Limits]],
        cost: int = 1,
        *,
        looked: Sequence[Limits] | None = None,
        now: Now = None,
        taken_at: Sequence[Taken] = (),
    ) -> bool | list[Decision]:
        """:meth:`refund_together` on ``redis.asyncio``."""
        every, call = self._refund_together_call(groups, cost, looked, now, taken_at)
        if call is None:
            return False
        reply = await self._route.acall(call)
        return True if looked is None else shown_together(every, reply)

    def _refund_together_call(
        self,
        groups: Sequence[tuple[str, Limits]],
        cost: int,
        looked: Sequence[Limits] | None,
        now: Now,
        taken_at: Sequence[Taken],
    ) -> tuple[Sequence[tuple[str, Limits]], ScriptCall | None]:
        """The groups :meth:`refund_together` reports on (each with its ``looked`` limits)
        and its call of refund_together.lua, or ``None`` (see :meth:`_together_call`)."""
        taken = taken_at or (None,) * len(groups)
        if looked is None:
            return groups, self._together_call(groups, cost, now, taken)
        every = _with_looked(groups, looked)
        given = [len(limits) for _, limits in groups]
        return every, self._together_call(every, cost, now, taken, given)

    def _together_call(
        self,
        groups: Sequence[tuple[str, Limits]],
        cost: int,
        now: Now,
        taken_at: Sequence[Taken] | None = None,
        given: Sequence[int] | None = None,
    ) -> ScriptCall | None:
        """The one call of together.lua (with ``taken_at``, of refund_together.lua) over
        ``groups``' keys, or ``None`` where they must be counted one group at a time:

        - when the groups' clients are in different shards (their keys under different hash
          tags). On a Redis Cluster they are in different slots, which no script may touch
          (``CROSSSLOT``); one endpoint may be a proxy clustering behind it (Redis
          Enterprise's), which refuses them too: a call keeps to one tag everywhere, as
          driver.lua's calls do. A client's shard is its digest's, so a login's address and
          username share one in one case out of ``shards`` (16 on a cluster URL without
          ``?shards=``; always on one server, whose default is 1);
        - when a group holds a concurrency limit (it is taken under a lease of the group's
          own, released call by call: see lua/driver.lua);
        - when two groups name one key (a shared limit counted under two clients of one
          shard): one script decides each on the state before it writes, so the key would
          be counted once where two calls count it twice;
        - on any other route (the in-process store counts call by call, as ever).

        ``given`` (a refund's): how many of each group's limits are given back, the first
        ones; the others are only looked at (refund_together.lua's last argument).
        """
        if len(groups) < 2 or not isinstance(self._route, OneServer | ClusterRoute):
            return None
        refund = taken_at is not None
        counting = self._refunds if refund else self._calls
        for taken in taken_at or ():
            check_taken_at(taken)
        now_us = None if now is None else round(now * 1e6)
        try:
            keys: list[bytes] = []
            specs: list[bytes] = []
            every: list[Limit] = []
            sizes: list[str] = []
            shards: set[int] = set()
            for n, (client, limits) in enumerate(groups):
                if not limits:
                    return None
                encoded = counting.encoded(limits, now_us)
                if encoded.leased:
                    return None
                shard, tag = self._client_tag(client)
                shards.add(shard)
                keys.extend(counting.keys(encoded, tag))
                specs.extend(encoded.specs)
                every.extend(limits)
                if refund:
                    taken = taken_at[n] if taken_at is not None and n < len(taken_at) else None
                    sizes.append(f"{len(limits)}:{'' if taken is None else taken}")
                else:
                    sizes.append(str(len(limits)))
            if len(shards) > 1:
                return None
            if len(set(keys)) < len(keys):
                return None
            when = b"" if now_us is None else b"%d" % now_us
            listed = ",".join(sizes).encode()
            args: tuple[bytes, ...]
            if refund:
                sha, source = self._refunds_together.script(every)
                args = (str(cost).encode(), when, listed, *specs)
                if given is not None:
                    args = (*args, ",".join(map(str, given)).encode())
            else:
                sha, source = self._together.script(every)
                args = (str(cost).encode(), listed, *specs)
                if now_us is not None:
                    args = (*args, when)
        except Exception as exc:
            raise failure(exc) from exc
        return ScriptCall(self._client_tag(groups[0][0])[0], sha, source, keys, args)

    def _together_decided(
        self, groups: Sequence[tuple[str, Limits]], reply: Any, now: Now, usage: Usage
    ) -> list[Decision]:
        """Each group's decision from together.lua's ``reply`` (one driver reply per group),
        the request counted in usage once: under the first group that denied, else the
        last (as the calls one group at a time count it)."""
        if type(reply) is not list or len(reply) != len(groups):
            raise failure(ValueError(f"unexpected reply {reply!r}"))
        decisions = [
            decision_of(client, limits, one)
            for (client, limits), one in zip(groups, reply, strict=True)
        ]
        if usage:
            at = next((n for n, d in enumerate(decisions) if not d.allowed), len(groups) - 1)
            decision = decisions[at]
            self.usage_tally.add(
                usage, groups[at][0], decision.allowed, decision.shadow, now, decision.limit
            )
        return decisions

    def release(self, client: str, limits: Limits, lease: str, *, now: Now = None) -> int:
        """One call of lease.lua over ``client``'s keys of the concurrency limits among
        ``limits`` (the others are ignored): the slots held under ``lease`` are given back.
        Idempotent. Returns the number of slots released."""
        call = self._lease_call("release", client, limits, lease, now)
        return 0 if call is None else int(self._route.call(call))

    async def arelease(self, client: str, limits: Limits, lease: str, *, now: Now = None) -> int:
        """:meth:`release` on ``redis.asyncio``, as :meth:`acount`."""
        call = self._lease_call("release", client, limits, lease, now)
        return 0 if call is None else int(await self._route.acall(call))

    def renew(self, client: str, limits: Limits, lease: str, *, now: Now = None) -> int:
        """Move the end of each slot held under ``lease`` to now plus its limit's lease; a
        lease that ended or was released is never revived (see lua/lease.lua). Returns the
        number of slots renewed."""
        call = self._lease_call("renew", client, limits, lease, now)
        return 0 if call is None else int(self._route.call(call))

    def _lease_call(
        self, op: str, client: str, limits: Limits, lease: str, now: Now
    ) -> ScriptCall | None:
        held = [limit for limit in limits if limit.algorithm == Algorithm.CONCURRENCY]
        if not held:
            return None
        try:
            shard = self._client_tag(client)[0]
            keys = [self.key(client, limit) for limit in held]
            when = "" if now is None else str(round(now * 1e6))
            leases = [str(per_shard(limit, self.shards).period_us) for limit in held]
        except Exception as exc:
            raise failure(exc) from exc
        return ScriptCall(shard, *self._lease, keys, (op, lease, when, *leases))

    def leases(self, client: str, limit: Limit, *, now: Now = None) -> list[tuple[str, float]]:
        """``ZRANGEBYSCORE`` of the limit's key above now, read on the server's clock
        (``TIME`` of the key's own node on a cluster) unless ``now`` is given, as the
        scripts read it: an ended lease is not held, trimmed or not."""
        if limit.algorithm != Algorithm.CONCURRENCY:
            return []
        key = self.key(client, limit)
        if now is None:
            node = {"target_nodes": self.client.get_node_from_key(key)} if self.on_cluster else {}
            seconds, micros = self._call(self.client.time, **node)
            now_us = int(seconds) * 1_000_000 + int(micros)
        else:
            now_us = round(now * 1e6)
        held = self._call(self.client.zrangebyscore, key, f"({now_us}", "+inf", withscores=True)
        return [
            (lease.decode() if isinstance(lease, bytes) else str(lease), (end - now_us) / 1e6)
            for lease, end in held
        ]

    def reset(self, client: str, limits: Limits) -> list[bool]:
        """Delete the client's key of each limit: one ``DEL`` per key, pipelined, so each
        reply says whether that key held state."""
        if not limits:
            return []
        pipe = self.client.pipeline(transaction=False)
        for limit in limits:
            pipe.delete(self.key(client, limit))
        return [bool(deleted) for deleted in self._call(pipe.execute)]

    def reset_shared(self, limits: Limits) -> list[int]:
        """Delete every shard's key of these shared limits: one ``DEL`` per key (each shard
        is a Cluster slot of its own), pipelined."""
        keys = [
            (index, (tag + SHARED_MARK).decode() + key_suffix(limit))
            for index, limit in enumerate(limits)
            if limit.shared
            for tag in self._tags
        ]
        held = [0] * len(limits)
        if keys:
            pipe = self.client.pipeline(transaction=False)
            for _index, key in keys:
                pipe.delete(key)
            for (index, _key), deleted in zip(keys, self._call(pipe.execute), strict=True):
                held[index] += int(bool(deleted))
        return held

    def retime(self, limits: Limits, *, now: Now = None, previous: Limits | None = None) -> int:
        """SCAN each limit's keys (never KEYS: no long server stall) and re-time them in
        batches, one small script call per batch. ``previous[i]``, the limit before the edit,
        lets GCRA keep the tokens used when its rate changed; one of another algorithm kept
        other keys and is ignored.

        On a cluster, each primary is scanned and a batch's keys are grouped by slot: one
        script call per slot, pipelined per node by ``RedisCluster``.
        """
        touched = 0
        now_us = None if now is None else round(now * 1e6)
        when = "" if now_us is None else str(now_us)
        spec_us = round(self.local_time() * 1e6) if now_us is None else now_us
        olds = previous if previous is not None else [None] * len(limits)
        for limit, old in zip(limits, olds, strict=True):
            pattern = "{}:{{*}}{}{}".format(
                glob_escape(self.prefix),
                # A shared limit's keys have "*" where the others have the client digest.
                "\\*" if limit.shared else "?" * DIGEST_KEY_CHARS,
                glob_escape(key_suffix(limit)),
            )
            same = old is not None and old.algorithm == limit.algorithm
            args = (
                limit_spec(per_shard(limit, self.shards), spec_us),
                when,
                limit_spec(per_shard(old, self.shards), spec_us) if same and old else "",
            )
            for batches in self._scanned(pattern):
                calls = [(keys, args) for keys in batches]
                touched += sum(map(int, self.evalsha_all(*self._retime, calls)))
        return touched

    def evalsha_all(
        self, sha: str, source: str, calls: Sequence[Call], client: Any = None
    ) -> list[Any]:
        """:func:`.scripts.evalsha_all` on ``client`` (default: the backend's), across the
        primaries on a cluster (:meth:`.redis_cluster.ClusterRoute.evalsha_all`)."""
        return self._route.evalsha_all(sha, source, calls, client)

    def patient_client(self, timeout: float) -> tuple[Any, bool]:
        """A client like the backend's whose reads may take ``timeout`` seconds (a usage
        report over many keys), and whether it is a new one the caller must close."""
        return self._route.patient_client(timeout)

    def _scanned(self, pattern: str) -> Iterator[list[list[Any]]]:
        """The keys matching ``pattern``, a SCAN step at a time (of each primary in turn on a
        cluster), each step's keys grouped by slot (one group on a single server)."""
        for client in self._route.scanned_clients():
            cursor = 0
            while True:
                cursor, keys = self._call(
                    client.scan, cursor=cursor, match=pattern, count=RETIME_BATCH
                )
                if keys:
                    yield self._route.by_slot(keys)
                if not cursor:
                    break

    def get_policy_version(self) -> str | None:
        value = self._call(self.client.get, self._version_key)
        return None if value is None else value.decode() if isinstance(value, bytes) else value

    def bump_policy_version(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.incrby(self._version_key, 1 + secrets.randbelow(POLICY_VERSION_STEP))
        pipe.expire(self._version_key, POLICY_VERSION_TTL)
        self._call(pipe.execute)

    def _call(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """:func:`.scripts.call_backend`; on a cluster a failure is the one node's
        (:class:`NodeUnavailable`): the key lives on one primary, and the process's breaker
        must not open for every client because that primary is down."""
        try:
            return call_backend(func, *args, **kwargs)
        except BackendError as exc:
            if self.on_cluster:
                raise NodeUnavailable(str(exc)) from exc
            raise

    def close(self) -> None:
        self._route.close(self._owns_client)

    def _request(
        self,
        client: str,
        limits: Limits,
        cost: int | None,
        now: Now,
        usage: Usage,
        refund: bool = False,
        taken_at: Taken = None,
        peek: bool = False,
        given: int | None = None,
    ) -> ScriptCall:
        """The call of the counting script (or with ``refund`` of refund.lua) for ``client``'s
        keys of ``limits``, in the arguments the script's header lists. ``peek``: decide on
        ``cost``, write nothing. ``given`` (a refund's): only the first that many limits are
        given back, the others looked at, and the reply says what the headers report.
        ``usage`` is counted in the process (:attr:`usage_tally`), never sent. Every argument
        is bounded here (a cost outside [0, MAX_COUNT] is our caller's bug, refused by the
        script as such); what cannot be encoded (a client no UTF-8 encodes) is a
        :class:`BackendError`."""
        calls = self._refunds if refund else self._calls
        now_us = None if now is None else round(now * 1e6)
        when = b"" if now_us is None else b"%d" % now_us
        try:
            encoded = calls.encoded(limits, now_us)
            shard, tag = self._client_tag(client)
            keys = calls.keys(encoded, tag)
            if refund:
                taken = b"" if taken_at is None else b"%d" % taken_at
                args = (str(1 if cost is None else cost).encode(), when, taken, *encoded.specs)
                if given is not None:
                    args = (*args, str(given).encode())
            elif encoded.leased:  # the clock ("": the server's), then the request's lease
                lease = PEEK_LEASE if peek or not cost else new_lease()
                args = (
                    str(cost or 0).encode(),
                    b"1" if peek else b"0",
                    *encoded.specs,
                    when,
                    lease,
                )
            elif now_us is None:  # the server's clock: the optional last argument left out
                args = (str(cost or 0).encode(), b"1" if peek else b"0", *encoded.specs)
            else:
                args = (str(cost or 0).encode(), b"1" if peek else b"0", *encoded.specs, when)
        except Exception as exc:
            raise failure(exc) from exc
        return ScriptCall(shard, encoded.sha, encoded.source, keys, args)


#: ``Encoded.valid_until`` of a limit list without calendar quotas (compared by identity).
FOREVER = math.inf
#: Characters of the client digest in a key (base64url of DIGEST_SIZE bytes).
DIGEST_KEY_CHARS = 4 * DIGEST_SIZE // 3
#: What stands in a shared limit's key for the client digest (never a base64url character).
SHARED_MARK = b"*"
#: The counting script's reply has eight elements, its trailing zeros left out down to four
#: (see lua/driver.lua): what stands for those left out, by the reply's length.
REPLY_PADDING = {4: [0, 0, 0, 0], 5: [0, 0, 0], 6: [0, 0], 7: [0], 8: []}
#: A limit's id, read without a call of ours (:class:`Calls` finds a list's encoding by them).
LIMIT_ID = attrgetter("id")


def compact(n: int) -> str:
    """A whole number in its shortest form Lua's ``tonumber`` reads exactly: trailing zeros
    as an exponent when that is shorter (3600000 as ``36e5``). Round rates give round
    intervals, and the spec crosses the wire on every decision."""
    text = str(n)
    digits = text.rstrip("0")
    zeros = len(text) - len(digits)
    return f"{digits}e{zeros}" if zeros >= 3 and digits else text


def limit_spec(limit: Limit, now_us: int | None = None) -> str:
    """``<code>[!~]<capacity>:<parameters>``, ``!`` for a shadow limit, ``~`` for the load
    shedder's fleet limit (enforced, but never reported for an allowed request: it is no
    client's own limit, so the ``X-RateLimit-*`` headers keep showing the client's): the interval in
    microseconds per token (token and leaky bucket, a float; GCRA, whole), the period in whole
    microseconds (windows), or a calendar quota's four window boundaries around ``now_us``
    (Unix microseconds, default now). Whole numbers are written :func:`compact`."""
    code = ALGORITHM_CODES[limit.algorithm]
    if code in "tl":
        interval = limit.interval_us
        text = compact(int(interval)) if interval.is_integer() else repr(interval)
    elif code == "g":
        text = compact(limit.emission_us)
        if limit.delay is not None:
            text += f":{limit.delay + 1}:{compact(limit.max_wait_us)}"
    elif code == "c":
        when = round(time.time() * 1e6) if now_us is None else now_us
        text = ":".join(map(str, windows(limit.calendar_unit, limit.timezone, when)))
    else:
        text = compact(limit.period_us)
    mark = "!" if limit.shadow else "~" if limit.id == FLEET else ""
    return f"{code}{mark}{limit.burst}:{text}"


def key_suffix(limit: Limit) -> str:
    """What follows the client digest in a limit's key: ``<code letter><id>``. The digest has
    a fixed length, so keys never collide, and a limit whose algorithm changes starts afresh."""
    return ALGORITHM_CODES[limit.algorithm] + limit.id


@dataclass(frozen=True, slots=True)
class Encoded:
    """What one limit list adds to every call: its key suffixes and limit specs, and the
    script (digest and source) for its mix of algorithms.

    ``valid_until`` (Unix seconds) is when a calendar quota's window ends and the specs must
    be encoded again; :data:`FOREVER` when the list has none. ``leased``: the list has a
    concurrency limit, so a call takes a lease id (lua/driver.lua). ``shared`` marks the shared
    limits (empty when there are none, the usual case): their keys carry the shard's tag and
    :data:`SHARED_MARK` instead of the client's digest. ``source`` is the one object every list
    of that mix of algorithms shares.
    """

    suffixes: tuple[bytes, ...]
    specs: tuple[bytes, ...]
    sha: str
    source: str
    valid_until: float = FOREVER
    shared: tuple[bool, ...] = ()
    leased: bool = False


class Calls:
    """Builds the calls of one script; limit lists are encoded once and kept by value: found
    by the ids of the limits they hold (:attr:`Limit.id <django_throttle.rates.Limit.id>`, short
    strings that hash once), and used only while the limits found are equal to those asked
    about, so a limit edited under the same id is encoded again. The request path builds a new
    tuple per request for the counters by IP address and username, from the same
    :class:`Limit` objects of the policy snapshot, and each finds the entry its first one made
    (equal by identity, so comparing them costs no call). At most :data:`~.base.CACHED_LISTS`
    lists are kept before it starts afresh: memory stays bounded whatever clients send.
    Thread-safe (single dict operations).

    ``source_for(codes)`` gives the script's source defining just the algorithms of those
    spec codes: each distinct mix of algorithms is its own script (its own digest), and most
    policies use one or two mixes. ``shards`` splits a shared limit's capacity (see
    :func:`~.base.per_shard`).
    """

    def __init__(
        self,
        source_for: Callable[[frozenset[str]], str],
        shards: int = 1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source_for = source_for
        self.shards = shards
        #: This process's reading of the server's clock (Unix seconds): what places a calendar
        #: quota's windows before the script reads TIME.
        self.clock = clock
        self._encoded: dict[tuple[str, ...], tuple[tuple[Limit, ...], Encoded]] = {}
        self._scripts: dict[frozenset[str], tuple[str, str]] = {}

    def script(self, limits: Sequence[Limit]) -> tuple[str, str]:
        """The digest and source of the script for ``limits``' mix of algorithms."""
        codes = frozenset(ALGORITHM_CODES[limit.algorithm] for limit in limits)
        found = self._scripts.get(codes)
        if found is None:
            source = self.source_for(codes)
            found = self._scripts[codes] = (hashlib.sha1(source.encode()).hexdigest(), source)
        return found

    def encoded(self, limits: Sequence[Limit], now_us: int | None = None) -> Encoded:
        """The list's encoding, cached. One with calendar quotas is made again once its
        window has passed, and for a test's ``now_us`` (then not cached: real time keeps its
        own)."""
        held = limits if type(limits) is tuple else tuple(limits)
        ids = tuple(map(LIMIT_ID, held))
        entry = self._encoded.get(ids)
        if entry is not None and entry[0] == held:
            found = entry[1]
            if found.valid_until is FOREVER or (
                now_us is None and self.clock() < found.valid_until
            ):
                return found
        encoded = self._encode(held, now_us)
        if now_us is None or encoded.valid_until is FOREVER:
            self.keep(held, encoded)
        return encoded

    def keep(self, limits: tuple[Limit, ...], encoded: Encoded) -> None:
        """Keep ``encoded`` as the encoding of ``limits`` (all are dropped first once
        :data:`~.base.CACHED_LISTS` lists are kept)."""
        if len(self._encoded) >= CACHED_LISTS:
            self._encoded.clear()
        self._encoded[tuple(map(LIMIT_ID, limits))] = (limits, encoded)

    def forget(self) -> None:
        """Drop every encoding kept."""
        self._encoded.clear()

    def _encode(self, limits: Sequence[Limit], now_us: int | None) -> Encoded:
        if now_us is None:
            now_us = round(self.clock() * 1e6)
        until = min(
            (
                windows(limit.calendar_unit, limit.timezone, now_us)[2] / 1e6
                for limit in limits
                if limit.algorithm == Algorithm.CALENDAR
            ),
            default=FOREVER,
        )
        shared = tuple(limit.shared for limit in limits)
        sha, source = self.script(limits)
        return Encoded(
            suffixes=tuple(key_suffix(limit).encode() for limit in limits),
            specs=tuple(
                limit_spec(per_shard(limit, self.shards), now_us).encode() for limit in limits
            ),
            sha=sha,
            source=source,
            valid_until=until,
            shared=shared if any(shared) else (),
            leased=any(limit.algorithm == Algorithm.CONCURRENCY for limit in limits),
        )

    @staticmethod
    def keys(encoded: Encoded, tag: bytes) -> list[bytes]:
        """One key per limit: the client's ``tag`` (``<prefix>:{<shard>}<digest>``) and the
        limit's suffix; a shared limit's has :data:`SHARED_MARK` for the digest."""
        if encoded.shared:
            shard = tag[:-DIGEST_KEY_CHARS] + SHARED_MARK
            return [
                (shard if shared else tag) + suffix
                for suffix, shared in zip(encoded.suffixes, encoded.shared, strict=True)
            ]
        return list(map(tag.__add__, encoded.suffixes))


#: The lease id of a call that takes no slot (a peek, or a cost of 0): the driver asks for
#: one whenever a concurrency limit is counted. Shorter than any :func:`new_lease`.
PEEK_LEASE = b"peek"


def new_lease() -> bytes:
    """A new lease id: 96 random bits in 16 base64url characters (what lua/driver.lua
    accepts), unique in practice across every process and request."""
    return urlsafe_b64encode(os.urandom(12))


def lease_of(call: ScriptCall) -> Any:
    """The lease id a counting ``call`` was made under: its last argument when the driver's
    argument list is full (see lua/driver.lua), else ``None``."""
    args = call.args
    return args[-1] if len(args) == len(call.keys) + 4 else None


def _noted(exc: BaseException, client: str, limits: Limits, lease: Any) -> None:
    """A counting call under ``lease`` failed with ``exc`` once sent: Redis may have run it
    and taken its concurrency slots (see :func:`~.base.note_lease`)."""
    if lease and lease != PEEK_LEASE:
        note_lease(exc, client, limits, lease.decode())


def decision_of(client: str, limits: Limits, reply: Any, lease: Any = None) -> Decision:
    """Read the counting script's array reply ``[allowed, index, remaining, reset_us,
    retry_us, spared, taken_us, wait_us]`` (see lua/driver.lua; trailing zeros left
    out, down to four elements): a nonzero ``spared`` (the 1-based indexes of the shadow
    limits that would have denied, as text) is the hit's ``Decision.shadow`` and
    ``Decision.spared``, a nonzero ``taken_us`` its ``Decision.taken``, and the ``lease``
    (:func:`lease_of`) an allowed hit took its concurrency slots under its
    ``Decision.leases`` (none for :data:`PEEK_LEASE`). A reply of another shape is a
    :class:`BackendError`."""
    try:
        padding = REPLY_PADDING.get(len(reply)) if type(reply) is list else None
        if padding is None:
            raise ValueError(f"unexpected reply {reply!r}")
        fields = reply + padding
        indexes = fields[5]
        fields[5] = 0
        allowed, index, remaining, reset_us, retry_us, _, taken_us, wait_us = map(int, fields)
        if allowed not in (0, 1) or not 0 <= index <= len(limits):
            raise ValueError(f"unexpected reply {reply!r}")
        spared = _spared(client, limits, indexes) if indexes else ()
    except Exception as exc:
        raise failure(exc) from exc
    # Positional, in Decision's field order (as base.decision_from): index 0 when no enforced
    # limit was passed, so nothing is reported.
    return Decision(
        allowed == 1,
        limits[index - 1] if index else None,
        remaining,
        reset_us / 1e6,
        retry_us / 1e6,
        tuple(limits),
        bool(spared),
        False,
        False,
        False,
        False,
        ((client, taken_us),) if taken_us else (),
        ((client, lease.decode()),) if lease and allowed == 1 and lease != PEEK_LEASE else (),
        wait_us / 1e6,
        spared,
    )


def shown_of(limits: Limits, reply: Any) -> Decision:
    """What a response's headers report once a refund is done, from refund.lua's reply
    ``[touched, index, remaining, reset_us]`` (see its header): an allowed decision on
    ``limits`` (no limit for index 0). A reply of another shape is a :class:`BackendError`."""
    try:
        if type(reply) is not list or len(reply) != 4:
            raise ValueError(f"unexpected reply {reply!r}")
        return _shown(limits, reply[1:])
    except Exception as exc:
        raise failure(exc) from exc


def shown_together(groups: Sequence[tuple[str, Limits]], reply: Any) -> list[Decision]:
    """Each group's :func:`shown_of`, from refund_together.lua's reply ``[touched,
    [index, remaining, reset_us], ...]``."""
    try:
        if type(reply) is not list or len(reply) != len(groups) + 1:
            raise ValueError(f"unexpected reply {reply!r}")
        return [
            _shown(limits, one) for (_client, limits), one in zip(groups, reply[1:], strict=True)
        ]
    except Exception as exc:
        raise failure(exc) from exc


def _shown(limits: Limits, triple: Any) -> Decision:
    index, remaining, reset_us = map(int, triple)
    if not 0 <= index <= len(limits) or remaining < 0 or reset_us < 0:
        raise ValueError(f"unexpected reply {triple!r}")
    return Decision(
        True, limits[index - 1] if index else None, remaining, reset_us / 1e6, 0.0, tuple(limits)
    )


def _with_looked(
    groups: Sequence[tuple[str, Limits]], looked: Sequence[Limits]
) -> list[tuple[str, Limits]]:
    """``groups`` with each group's ``looked`` limits (by position) after its own."""
    return [
        (client, (*limits, *looked[n]) if n < len(looked) else tuple(limits))
        for n, (client, limits) in enumerate(groups)
    ]


def _spared(client: str, limits: Limits, indexes: bytes) -> tuple[tuple[str, Limit], ...]:
    """The shadow limits a reply's ``spared`` field names (``b"2,5"``: 1-based indexes)."""
    spared = []
    for text in indexes.split(b","):
        n = int(text)
        if not 1 <= n <= len(limits) or not limits[n - 1].shadow:
            raise ValueError(f"unexpected spared limits {indexes!r}")
        spared.append((client, limits[n - 1]))
    return tuple(spared)


#: Prefix of a usage field counted only when the request is denied (see :meth:`Tally.add`):
#: the first calls of a request counted in several calls, whose outcome the last call counts.
IF_DENIED = "\x01"

#: Seconds between two pushes of a process's :class:`Tally`: what a worker that dies loses
#: at most, and how late another process's report may be.
PUSH_EVERY = 1.0
#: Most distinct counts a :class:`Tally` gathers between two pushes (beyond it new clients
#: count as ``(other)``; totals stay exact); a failed push's batch waits beside them.
MAX_KEPT = 10_000

#: (minute, usage field, client label, outcome letter, requests): one count kept in process
#: while the backend could not answer, pushed with :meth:`.usage_store.UsageStore.push`.
PendingCount = tuple[int, str, str, str, int]


#: (batch id, counts, API key clients' last second): one push of a :class:`Tally`.
Batch = tuple[str, list[PendingCount], dict[str, int]]


class Tally:
    """The decisions one backend made in this process, by minute, usage field, client and
    outcome, until they are pushed (:meth:`.usage_store.UsageStore.push_tally`).

    Thread safe; no I/O. ``clock`` (Unix seconds) names the minutes and says when a push is
    :meth:`due`. A forked child starts empty (its parent pushes what it counted)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, str, str, str], int] = {}
        self._seen: dict[str, int] = {}
        self._unsent: list[Batch] = []
        self._next = 0.0
        self._owner = os.getpid()
        #: Held while a batch taken from this tally is pushed
        #: (:meth:`.usage_store.UsageStore.push_tally`): a report that pushes this process's
        #: counts first waits for the pusher thread's push in flight, so it sees them all.
        self.pushing = threading.Lock()
        #: Whether a push was due when the last decision was counted (:meth:`add`, on the
        #: clock it read anyway): what the request path tests after a call, without reading
        #: the clock again. :meth:`due` says for sure.
        self.waiting = False

    def add(
        self,
        field: str,
        client: str,
        allowed: bool,
        shadow: bool,
        now: float | None,
        limit: Limit | None = None,
    ) -> None:
        """Count one decision under usage ``field`` (a field starting with :data:`IF_DENIED`
        only if it denied): allowed, denied, or ``shadow`` (allowed, a shadow limit would have
        denied); denied by ``limit``, the load shedder's (:data:`~django_throttle.rates.FLEET`
        or :data:`~django_throttle.rates.WORKER`), it is shed too (in the field's totals).
        ``now`` (Unix seconds) stands for the clock, as the decision's did."""
        if field[:1] == IF_DENIED:
            if allowed:
                return
            field = field[1:]
        letter = ("s" if shadow else "a") if allowed else "d"
        when = self.clock() if now is None else now
        key = (int(when // 60), field, client, letter)
        self.waiting = when >= self._next
        with self._lock:
            if self._owner != os.getpid():
                self._forget()
            counts = self._counts
            if key not in counts and len(counts) >= MAX_KEPT:
                key = (key[0], field, "(other)", letter)
            counts[key] = counts.get(key, 0) + 1
            if not allowed and limit is not None and limit.id in SHEDDERS:
                key = (key[0], field, "", "h")
                counts[key] = counts.get(key, 0) + 1
            if client[:4] == "key:" and len(self._seen) < MAX_KEPT:
                second = int(when)
                if second > self._seen.get(client, -1):
                    self._seen[client] = second

    def add_delay(self, field: str, seconds: float) -> None:
        """Count a request served after waiting ``seconds`` for its turn under usage
        ``field``: one more delayed request (``l``) and its wait in milliseconds (``w``), in
        the field's totals (no client: these have no per-client lists)."""
        field = field[1:] if field[:1] == IF_DENIED else field
        when = self.clock()
        minute = int(when // 60)
        self.waiting = when >= self._next
        with self._lock:
            if self._owner != os.getpid():
                self._forget()
            counts = self._counts
            for letter, n in (("l", 1), ("w", max(1, round(seconds * 1000)))):
                key = (minute, field, "", letter)
                if key in counts or len(counts) < MAX_KEPT:
                    counts[key] = counts.get(key, 0) + n

    def refuse(self, field: str, client: str) -> bool:
        """Count a request :meth:`add` counted allowed (or shadow) as denied after all: the
        process refused it after the decision (too many requests waiting for their turn).
        When its count was pushed meanwhile, a correction goes with the next push: one
        allowed less (a negative count, in the exact totals only) and one denied more, in
        this minute. ``False`` in that case."""
        minute = int(self.clock() // 60)
        with self._lock:
            if self._owner != os.getpid():
                self._forget()
            counts = self._counts
            found = next(
                (
                    key
                    for key in (
                        (m, field, client, letter) for m in (minute, minute - 1) for letter in "as"
                    )
                    if counts.get(key, 0) > 0
                ),
                None,
            )
            allowed = found or (minute, field, client, "a")
            counts[allowed] = counts.get(allowed, 0) - 1
            if not counts[allowed]:
                del counts[allowed]
            denied = (allowed[0], field, client, "d")
            counts[denied] = counts.get(denied, 0) + 1
        return found is not None

    def due(self) -> bool:
        """Whether counts wait and :data:`PUSH_EVERY` has passed since the last push."""
        return bool(self._counts or self._unsent) and self.clock() >= self._next

    def push_in(self) -> float | None:
        """Seconds until a push is due (on :attr:`clock`): ``0`` when counts wait and one is
        due now, ``None`` when none waits and none is due (the next :meth:`add` then finds
        one due and says so in :attr:`waiting`). What the pusher thread sleeps for, so that
        counts never wait for a request to be pushed."""
        left = self._next - self.clock()
        if left > 0:
            return left
        return 0.0 if (self._counts or self._unsent) else None

    def take(self) -> Batch | None:
        """What to push now (a batch that failed before, first), or ``None``."""
        with self._lock:
            if self._owner != os.getpid():
                self._forget()
            self._next = self.clock() + PUSH_EVERY
            self.waiting = False
            if self._unsent:
                return self._unsent.pop(0)
            if not self._counts:
                return None
            counts = [(*key, n) for key, n in self._counts.items()]
            batch = (uuid.uuid4().hex, counts, self._seen)
            self._counts, self._seen = {}, {}
            return batch

    def keep(self, batch: Batch) -> None:
        """Keep a batch whose push failed, to try again first. A new batch is only made once
        none waits, so what is kept stays within twice :data:`MAX_KEPT` counts."""
        with self._lock:
            self._unsent.insert(0, batch)
            self.waiting = True

    def _forget(self) -> None:
        self._counts, self._seen, self._unsent = {}, {}, []
        self._owner = os.getpid()
