"""Redis backend: every limit of a request checked in one EVALSHA, on the server's clock.

Keys are ``<prefix>:{<shard>}<client digest><code><limit id>`` (``t`` token bucket, ``g``
GCRA, ``l`` leaky bucket, ``f`` fixed window, ``w`` sliding log, ``s`` sliding counter, ``c``
calendar quota): the hash tag is the shard, so all keys of one call, and that shard's usage
counters, share a Redis Cluster slot. A shared limit's key has ``*`` in place of the client digest,
``<prefix>:{<shard>}*<suffix>``: one state per shard for every client of that shard, still in
the calling client's slot, each enforcing its share of the capacity (:func:`.base.per_shard`).
Scripts ship as ``.lua`` files in this package (assembled by :mod:`.scripts`) and run by
EVALSHA; on NOSCRIPT (the script did not run) they are sent once more with EVAL, which carries
the source. Nothing else is ever replayed, because a call that timed out may already have
counted: the clients it builds (:func:`.wire.build_client`) have retries off, short timeouts
and a bounded pool, and every failure (redis-py's errors, socket errors, a garbled reply)
surfaces as :class:`BackendError`; an error reply of the counting script itself (an argument
it refuses) as :class:`~.base.ArgumentRefused`, which is our bug and no outage (see
:func:`.wire.failure`). Counting calls are framed once per limit list (:mod:`.frames`) and sent
on connections made like the client's (:mod:`.wire`); ``async def`` views use
:mod:`.redis_async`.
"""

from __future__ import annotations

import hashlib
import re
from base64 import urlsafe_b64encode
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import redis

from django_throttle import events
from django_throttle.backends.base import (
    DIGEST_SIZE,
    Backend,
    Limits,
    Now,
    Taken,
    Usage,
    decision_from,
    per_shard,
)
from django_throttle.backends.frames import (
    DIGEST_KEY_CHARS,
    SHARED_MARK,
    Calls,
    key_suffix,
    limit_spec,
)
from django_throttle.backends.redis_async import AsyncConnections
from django_throttle.backends.scripts import (
    REFUND_FILES,
    RETIME_FILES,
    SCRIPT_FILES,
    call_backend,
    evalsha_all,
    files_for,
    load_script,
)
from django_throttle.backends.wire import Connections, build_client, failure
from django_throttle.conf import app_settings
from django_throttle.rates import Decision, Limit

__all__ = ["RedisBackend"]

#: The policy version key outlives any sane gap between edits; missing simply means "reload".
POLICY_VERSION_TTL = 30 * 86400
#: Keys asked of each SCAN step, and so at most this many per retime script call.
RETIME_BATCH = 1000
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


class RedisBackend(Backend):
    """Counts in Redis (single server or anything speaking its protocol with EVALSHA).

    A ``client`` passed in is used as it is: give it short timeouts and no retries. Counting
    calls use its pool (:class:`.wire.Connections`), ``async def`` ones a ``redis.asyncio``
    pool with the same options (:class:`.redis_async.AsyncConnections`).
    """

    def __init__(self, client: redis.Redis | None = None) -> None:
        self._owns_client = client is None
        self.client = client if client is not None else build_client()
        self.prefix = app_settings.KEY_PREFIX
        self.shards = app_settings.KEY_SHARDS
        self._tags = tuple(tag.encode() for tag in self.shard_tags())
        self._calls = Calls(partial(self._script_for, SCRIPT_FILES), self.shards)
        self._refunds = Calls(partial(self._script_for, REFUND_FILES), self.shards)
        pool = self.client.connection_pool
        self._connections = Connections(pool)
        self._async_connections = AsyncConnections(pool)
        source = load_script(RETIME_FILES)
        self._retime = (hashlib.sha1(source.encode()).hexdigest(), source)
        self._version_key = f"{self.prefix}:policy-version"

    def _script_for(self, files: Sequence[str], codes: frozenset[str]) -> str:
        """The source of ``files`` defining only the algorithms ``codes`` need."""
        return load_script(files_for(files, codes), self.shards)

    def shard_tags(self) -> tuple[str, ...]:
        """Every shard's key prefix, ``"<prefix>:{<n>}"``: one Redis Cluster slot each."""
        return tuple(f"{self.prefix}:{{{n}}}" for n in range(self.shards))

    def key(self, client: str, limit: Limit) -> str:
        """The key of ``client``'s state of ``limit`` (for a shared limit, its shard's)."""
        tag = self._client_tag(client)
        if limit.shared:
            tag = tag[:-DIGEST_KEY_CHARS] + SHARED_MARK
        return tag.decode() + key_suffix(limit)

    def _client_tag(self, client: str) -> bytes:
        """``<prefix>:{<shard>}<digest>``, the start of every key of this client: a 96-bit
        digest in 16 base64url characters (user-controlled text never shapes a key), the
        shard taken from the same digest."""
        # Inline rather than base.shard_of: on every call, one more function call shows.
        digest = hashlib.blake2b(client.encode(), digest_size=DIGEST_SIZE).digest()
        shard = (digest[0] << 8 | digest[1]) % self.shards
        return self._tags[shard] + urlsafe_b64encode(digest)

    def count(
        self, client: str, limits: Limits, cost: int, now: Now, usage: Usage, peek: bool = False
    ) -> Decision:
        request = self._request(client, limits, cost, now, usage, peek=peek)
        return self._decision(client, limits, self._connections.call(*request))

    async def acount(
        self, client: str, limits: Limits, cost: int, now: Now, usage: Usage, peek: bool = False
    ) -> Decision:
        """:meth:`count` on ``redis.asyncio``: the same script and bytes, no thread."""
        request = self._request(client, limits, cost, now, usage, peek=peek)
        return self._decision(client, limits, await self._async_connections.call(*request))

    def refund(
        self, client: str, limits: Limits, cost: int = 1, *, now: Now = None, taken_at: Taken = None
    ) -> None:
        """One EVALSHA of refund.lua over the keys the hit used (same framing, same slot);
        ``taken_at`` travels as ARGV[1]'s ``#<taken>``."""
        if limits:
            self._connections.call(*self._request(client, limits, cost, now, None, True, taken_at))

    async def arefund(
        self, client: str, limits: Limits, cost: int = 1, *, now: Now = None, taken_at: Taken = None
    ) -> None:
        """:meth:`refund` on ``redis.asyncio``, as :meth:`acount`."""
        if limits:
            request = self._request(client, limits, cost, now, None, True, taken_at)
            await self._async_connections.call(*request)

    def reset(self, client: str, limits: Limits) -> None:
        if limits:
            call_backend(self.client.delete, *(self.key(client, limit) for limit in limits))

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
            call_backend(pipe.execute)

    def retime(self, limits: Limits, *, now: Now = None, previous: Limits | None = None) -> int:
        """SCAN each limit's keys (never KEYS: no long server stall) and re-time them in
        batches, one small script call per batch. ``previous[i]``, the limit before the edit,
        lets GCRA keep the tokens used when its rate changed; one of another algorithm kept
        other keys and is ignored.

        Not Cluster-ready yet: one batch mixes slots; on a cluster, scan each primary and
        group a batch's keys by slot.
        """
        touched = 0
        now_us = None if now is None else round(now * 1e6)
        when = "" if now_us is None else str(now_us)
        olds = previous if previous is not None else [None] * len(limits)
        for limit, old in zip(limits, olds, strict=True):
            pattern = "{}:{{*}}{}{}".format(
                _GLOB_SPECIAL.sub(r"\\\1", self.prefix),
                # A shared limit's keys have "*" where the others have the client digest.
                "\\*" if limit.shared else "?" * DIGEST_KEY_CHARS,
                _GLOB_SPECIAL.sub(r"\\\1", key_suffix(limit)),
            )
            same = old is not None and old.algorithm == limit.algorithm
            args = (
                limit_spec(per_shard(limit, self.shards), now_us),
                when,
                limit_spec(per_shard(old, self.shards), now_us) if same and old is not None else "",
            )
            cursor = 0
            while True:
                cursor, keys = call_backend(
                    self.client.scan, cursor=cursor, match=pattern, count=RETIME_BATCH
                )
                if keys:
                    touched += int(evalsha_all(self.client, *self._retime, [(keys, args)])[0])
                if not cursor:
                    break
        return touched

    def get_policy_version(self) -> str | None:
        value = call_backend(self.client.get, self._version_key)
        return None if value is None else value.decode() if isinstance(value, bytes) else value

    def bump_policy_version(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.incr(self._version_key)
        pipe.expire(self._version_key, POLICY_VERSION_TTL)
        call_backend(pipe.execute)

    def close(self) -> None:
        self._connections.disconnect()
        if self._owns_client:
            self.client.connection_pool.disconnect()

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
    ) -> tuple[bytes, Callable[[], bytes]]:
        """The EVALSHA to send (of the counting script, or with ``refund`` of refund.lua),
        and how to build its EVAL twin if the script is missing. ``peek``: decide on
        ``cost``, write nothing. What cannot be framed (a client no UTF-8 encodes) is a
        :class:`BackendError`."""
        calls = self._refunds if refund else self._calls
        now_us = None if now is None else round(now * 1e6)
        try:
            encoded = calls.encoded(limits, now_us)
            tag = self._client_tag(client)
            op = calls.op(cost, now_us, peek)
            if taken_at is not None:
                op += b"#%d" % taken_at
            field = calls.field(usage)
            label = client.encode()
            body = calls.body(encoded, tag, op, field, label, now_us=now_us)
        except Exception as exc:
            raise failure(exc) from exc

        def fallback() -> bytes:
            # Redis lost the script (restart, failover, SCRIPT FLUSH): EVAL loads it again.
            events.send(events.script_loaded, type(self))
            return calls.body(encoded, tag, op, field, label, False, now_us)

        return body, fallback

    @staticmethod
    def _decision(client: str, limits: Limits, reply: Any) -> Decision:
        """Parse ``"<status + 4 x index> <remaining> <reset>[ <retry>| @<now>]"`` (see
        driver.lua): an allowed hit's ``@<now>`` (base 36) is its ``Decision.taken``. A reply
        of another shape is a :class:`BackendError`."""
        try:
            parts: list[bytes] = reply.split() if type(reply) is bytes else []
            code, remaining, reset_us = int(parts[0]), int(parts[1]), int(parts[2])
            status, index = code & 3, code >> 2
            allowed = status & 1 == 1
            extra = parts[3] if len(parts) == 4 else b""
            if (
                len(parts) not in (3, 4)
                or not 0 <= index <= len(limits)
                or code < 0
                or (allowed and extra[:1] not in (b"", b"@"))
                or (not allowed and not extra)
            ):
                raise ValueError(f"unexpected reply {reply!r}")
            taken = ((client, int(extra[1:], 36)),) if extra and allowed else ()
            retry_us = int(extra) if extra and not allowed else 0
        except Exception as exc:
            raise failure(exc) from exc
        return decision_from(
            limits, allowed, index - 1, remaining, reset_us, retry_us, status >= 2, taken
        )
