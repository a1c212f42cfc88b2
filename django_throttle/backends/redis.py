"""Redis backend: every limit of a request checked in one EVALSHA, on the server's clock.

Keys are ``<prefix>:{<shard>}<client digest><code><limit id>`` (``t`` token bucket, ``g``
GCRA, ``l`` leaky bucket, ``f`` fixed window, ``w`` sliding log, ``s`` sliding counter, ``c``
calendar quota): the hash tag is the shard, so all keys of one call, and that shard's usage
counters, share a Redis Cluster slot. A shared limit's key has ``*`` in place of the client digest,
``<prefix>:{<shard>}*<suffix>``: one state per shard for every client of that shard, still in
the calling client's slot, each enforcing its share of the capacity (:func:`.base.per_shard`).
Scripts ship as ``.lua`` files in this package (assembled by :mod:`.scripts`) and run by
EVALSHA through redis-py's own clients (``Redis``, ``RedisCluster``, Sentinel's
``master_for``, and their ``redis.asyncio`` twins for ``async def`` views); on NOSCRIPT (the
script did not run) they are sent once more with EVAL, which carries the source. Nothing else
is ever replayed, because a call that timed out may already have counted: the clients it builds
(:func:`.redis_clients.build_client`) have retries off, short timeouts and a bounded pool, and
every failure (redis-py's errors, socket errors, a garbled reply) surfaces as
:class:`BackendError`; an error reply of the counting script itself (an argument it refuses)
as :class:`~.base.ArgumentRefused`, which is our bug and no outage (see
:func:`.scripts.failure`). :mod:`.redis_single` sends the calls to one server or a
Sentinel-managed primary, :mod:`.redis_cluster` across a cluster's primaries.
"""

from __future__ import annotations

import hashlib
import time
from base64 import urlsafe_b64encode
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, Protocol

import redis
from redis.cluster import RedisCluster

from django_throttle.backends.base import (
    DIGEST_SIZE,
    Backend,
    BackendError,
    Limits,
    NodeUnavailable,
    Now,
    Taken,
    Usage,
    per_shard,
)
from django_throttle.backends.frames import (
    DIGEST_KEY_CHARS,
    SHARED_MARK,
    Calls,
    ScriptCall,
    decision_of,
    key_suffix,
    limit_spec,
)
from django_throttle.backends.redis_acl import glob_escape
from django_throttle.backends.redis_clients import build_client, client_for, client_options
from django_throttle.backends.redis_cluster import ClusterRoute, PrimaryHealth
from django_throttle.backends.redis_shard_tags import number_tags, spread_tags
from django_throttle.backends.redis_single import OneServer
from django_throttle.backends.scripts import (
    REFUND_FILES,
    RETIME_FILES,
    SCRIPT_FILES,
    Call,
    call_backend,
    failure,
    files_for,
    load_script,
)
from django_throttle.backends.usage_base import Tally
from django_throttle.conf import app_settings, is_cluster_url
from django_throttle.rates import Decision, Limit

__all__ = ["RedisBackend"]

#: The policy version key outlives any sane gap between edits; missing simply means "reload".
POLICY_VERSION_TTL = 30 * 86400
#: Keys asked of each SCAN step, and so at most this many per retime script call.
RETIME_BATCH = 1000
#: The socket timeouts of a client made for long reads.
_TIMEOUTS = ("socket_timeout", "socket_connect_timeout")


class Route(Protocol):
    """Where a backend's script calls go, and all it asks of them: one server or a
    Sentinel-managed primary (:class:`.redis_single.OneServer`), a cluster's primaries
    (:class:`.redis_cluster.ClusterRoute`), or this process's memory
    (:class:`.memory.InProcess`). The backend's keys, scripts and replies are the same on
    each, so a route decides only where a call runs."""

    @property
    def client(self) -> Any:
        """The client the backend's other commands (``GET``, pipelines, ``SCAN``) go to."""

    def call(self, call: ScriptCall) -> Any:
        """The script's reply to ``call``, untouched; a failure as :func:`.scripts.failure`
        makes it. Never sent twice, except ``EVAL`` after ``NOSCRIPT`` (nothing ran)."""

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


class RedisBackend(Backend):
    """Counts in Redis (single server, Sentinel-managed primary or Redis Cluster; anything
    speaking its protocol with EVALSHA).

    A ``client`` passed in (``redis.Redis`` or ``RedisCluster``) is used as it is: give it
    short timeouts and no retries (see :mod:`.redis_clients`). Counting calls go through its
    own command path; ``async def`` ones through a ``redis.asyncio`` twin with the same
    options, one per event loop (:mod:`.redis_single`, :mod:`.redis_cluster`).

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
        #: Key shards (default ``DJANGO_THROTTLE_KEY_SHARDS``).
        self.shards = shards or app_settings.KEY_SHARDS
        #: On a cluster the shards' hash tags spread their slots evenly (.redis_shard_tags);
        #: a route handed in is never a cluster (the setting's URL is not its server).
        self._spread = route is None and (
            isinstance(client, RedisCluster)
            or (client is None and is_cluster_url(app_settings.REDIS_URL))
        )
        self._tags = tuple(tag.encode() for tag in self.shard_tags())
        self._calls = Calls(partial(self._script_for, SCRIPT_FILES), self.shards, self.local_time)
        self._refunds = Calls(partial(self._script_for, REFUND_FILES), self.shards, self.local_time)
        self._route: Route
        if route is not None:
            self._route = route
        elif client is None and is_cluster_url(app_settings.REDIS_URL):
            # Built on first use: a cluster client asks for the slot map as it is made.
            url, options = client_options()
            self._route = ClusterRoute(
                build_client,  # type: ignore[arg-type]
                self.shard_tags(),
                lambda timeout: client_for(url, {**options, **dict.fromkeys(_TIMEOUTS, timeout)}),
                sender=type(self),
            )
        else:
            given = client if client is not None else build_client()
            if isinstance(given, RedisCluster):
                self._route = ClusterRoute(lambda: given, self.shard_tags(), sender=type(self))
            else:
                self._route = OneServer(given, type(self))
        #: This process's count of the decisions made with a usage field, until pushed
        #: (:class:`.usage_base.Tally`): the counting call itself counts no usage.
        self.usage_tally = Tally(self.local_time)
        source = load_script(RETIME_FILES)
        self._retime = (hashlib.sha1(source.encode()).hexdigest(), source)
        self._version_key = f"{self.prefix}:policy-version"

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
        return load_script(files_for(files, codes), self.shards)

    def shard_tags(self) -> tuple[str, ...]:
        """Every shard's key prefix, ``"<prefix>:{<tag>}"``: one Redis Cluster slot each. The
        tags are the shard numbers on one server, and on a cluster numbers whose slots are
        spread evenly over the slot range (:mod:`.redis_shard_tags`)."""
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
        decision = decision_of(client, limits, self._route.call(call))
        if usage:
            self.usage_tally.add(usage, client, decision.allowed, decision.shadow, now)
        return decision

    def count(
        self, client: str, limits: Limits, cost: int, now: Now, usage: Usage, peek: bool = False
    ) -> Decision:
        call = self._request(client, limits, cost, now, usage, peek=peek)
        decision = decision_of(client, limits, self._route.call(call))
        if usage and not peek:
            self.usage_tally.add(usage, client, decision.allowed, decision.shadow, now)
        return decision

    async def acount(
        self, client: str, limits: Limits, cost: int, now: Now, usage: Usage, peek: bool = False
    ) -> Decision:
        """:meth:`count` on ``redis.asyncio``: the same script call, no thread."""
        call = self._request(client, limits, cost, now, usage, peek=peek)
        decision = decision_of(client, limits, await self._route.acall(call))
        if usage and not peek:
            self.usage_tally.add(usage, client, decision.allowed, decision.shadow, now)
        return decision

    def refund(
        self, client: str, limits: Limits, cost: int = 1, *, now: Now = None, taken_at: Taken = None
    ) -> None:
        """One EVALSHA of refund.lua over the keys the hit used (same slot); ``taken_at``
        travels as ARGV[1]'s ``#<taken>``."""
        if limits:
            self._route.call(self._request(client, limits, cost, now, None, True, taken_at))

    async def arefund(
        self, client: str, limits: Limits, cost: int = 1, *, now: Now = None, taken_at: Taken = None
    ) -> None:
        """:meth:`refund` on ``redis.asyncio``, as :meth:`acount`."""
        if limits:
            call = self._request(client, limits, cost, now, None, True, taken_at)
            await self._route.acall(call)

    def reset(self, client: str, limits: Limits) -> None:
        if limits:
            self._call(self.client.delete, *(self.key(client, limit) for limit in limits))

    def reset_shared(self, limits: Limits) -> None:
        """Delete every shard's key of these shared limits: one ``DEL`` per key (each shard
        is a Cluster slot of its own), pipelined."""
        keys = [
            (tag + SHARED_MARK).decode() + key_suffix(limit)
            for limit in limits
            if limit.shared
            for tag in self._tags
        ]
        if keys:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.delete(key)
            self._call(pipe.execute)

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
        pipe.incr(self._version_key)
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
    ) -> ScriptCall:
        """The call of the counting script (or with ``refund`` of refund.lua) for ``client``'s
        keys of ``limits``, in the arguments the script's header lists. ``peek``: decide on
        ``cost``, write nothing. ``usage`` is counted in the process (:attr:`usage_tally`),
        never sent. Every argument is bounded here (a cost outside [0, MAX_COUNT] is our
        caller's bug, refused by the script as such); what cannot be encoded (a client no
        UTF-8 encodes) is a :class:`BackendError`."""
        calls = self._refunds if refund else self._calls
        now_us = None if now is None else round(now * 1e6)
        when = b"" if now_us is None else b"%d" % now_us
        try:
            encoded = calls.encoded(limits, now_us)
            shard, tag = self._client_tag(client)
            keys = calls.keys(encoded, tag)
            if refund:
                taken = b"" if taken_at is None else b"%d" % taken_at
                head = (str(1 if cost is None else cost).encode(), when, taken)
            else:
                head = (str(cost or 0).encode(), b"1" if peek else b"0", when)
        except Exception as exc:
            raise failure(exc) from exc
        return ScriptCall(shard, encoded.sha, encoded.source, keys, (*head, *encoded.specs))
