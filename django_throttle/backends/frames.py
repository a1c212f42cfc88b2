"""One counting (or refund) script call, in plain KEYS and ARGV, and how its reply reads as a
decision.

A call is a :class:`ScriptCall`: the script's digest and source, one key per limit, then the
arguments ``lua/driver.lua`` (or ``lua/refund.lua``) lists in its header. What is the same for
every call of a limit list (its key suffixes, its limit specs, the script) is worked out once
per list and reused (:class:`Calls`), so a request only adds its key prefix, cost and clock.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django_throttle.backends.base import (
    ALGORITHM_CODES,
    CACHED_LISTS,
    DIGEST_SIZE,
    Limits,
    per_shard,
)
from django_throttle.backends.scripts import failure
from django_throttle.calendar import windows
from django_throttle.rates import Algorithm, Decision, Limit

#: ``Encoded.valid_until`` of a limit list without calendar quotas (compared by identity).
FOREVER = math.inf
#: Characters of the client digest in a key (base64url of DIGEST_SIZE bytes).
DIGEST_KEY_CHARS = 4 * DIGEST_SIZE // 3
#: What stands in a shared limit's key for the client digest (never a base64url character).
SHARED_MARK = b"*"
#: Elements of the counting script's array reply (see lua/driver.lua).
REPLY_SIZE = 7


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One counting (or refund) script call: what redis-py's evalsha/eval send."""

    shard: int  # the client's shard (0..shards-1): which cluster slot / breaker
    sha: str  # the script's SHA1 hex digest
    source: str  # its source, for EVAL after NOSCRIPT (the script did not run)
    keys: Sequence[str | bytes]
    args: Sequence[str | bytes | int]


def compact(n: int) -> str:
    """A whole number in its shortest form Lua's ``tonumber`` reads exactly: trailing zeros
    as an exponent when that is shorter (3600000 as ``36e5``). Round rates give round
    intervals, and the spec crosses the wire on every decision."""
    text = str(n)
    digits = text.rstrip("0")
    zeros = len(text) - len(digits)
    return f"{digits}e{zeros}" if zeros >= 3 and digits else text


def limit_spec(limit: Limit, now_us: int | None = None) -> str:
    """``<code>[!]<capacity>:<parameters>``, ``!`` for a shadow limit: the interval in
    microseconds per token (token and leaky bucket, a float; GCRA, whole), the period in whole
    microseconds (windows), or a calendar quota's four window boundaries around ``now_us``
    (Unix microseconds, default now). Whole numbers are written :func:`compact`."""
    code = ALGORITHM_CODES[limit.algorithm]
    if code in "tl":
        interval = limit.interval_us
        text = compact(int(interval)) if interval.is_integer() else repr(interval)
    elif code == "g":
        text = compact(limit.emission_us)
    elif code == "c":
        when = round(time.time() * 1e6) if now_us is None else now_us
        text = ":".join(map(str, windows(limit.calendar_unit, limit.timezone, when)))
    else:
        text = compact(limit.period_us)
    return f"{code}{'!' if limit.shadow else ''}{limit.burst}:{text}"


def key_suffix(limit: Limit) -> str:
    """What follows the client digest in a limit's key: ``<code letter><id>``. The digest has
    a fixed length, so keys never collide, and a limit whose algorithm changes starts afresh."""
    return ALGORITHM_CODES[limit.algorithm] + limit.id


@dataclass(frozen=True, slots=True)
class Encoded:
    """What one limit list adds to every call: its key suffixes and limit specs, and the
    script (digest and source) for its mix of algorithms.

    ``valid_until`` (Unix seconds) is when a calendar quota's window ends and the specs must
    be encoded again; :data:`FOREVER` when the list has none. ``shared`` marks the shared
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


class EncodedCache:
    """Limit lists' encodings, found by the limits a list holds, not by the list: the request
    path builds a new tuple per request for the counters by IP address and username, from
    the same :class:`Limit` objects of the policy snapshot, and each finds the entry its
    first one made (:meth:`Calls.encoded` looks up, in line).

    The first lookup is by the ids of the limits (an entry holds its limits, so those ids
    cannot be reused while it lives); a list of new but equal limits is found by value. At
    most :data:`~.base.CACHED_LISTS` lists are kept (policy reloads leave old limits behind):
    memory stays bounded whatever clients send. Thread-safe (single dict operations).
    """

    def __init__(self) -> None:
        self.by_ids: dict[tuple[int, ...], tuple[tuple[Limit, ...], Encoded]] = {}
        self.by_value: dict[tuple[Limit, ...], Encoded] = {}

    def put(self, limits: Sequence[Limit], value: Encoded) -> None:
        held = tuple(limits)
        if len(self.by_ids) >= CACHED_LISTS or len(self.by_value) >= CACHED_LISTS:
            self.by_ids.clear()
            self.by_value.clear()
        self.by_ids[tuple(map(id, held))] = (held, value)
        self.by_value[held] = value


class Calls:
    """Builds the calls of one script; limit lists are encoded once and cached by the limits
    they hold (:class:`EncodedCache`).

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
        self._cache = EncodedCache()
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
        cache = self._cache
        by_ids = cache.by_ids.get(tuple(map(id, limits)))
        # Equal limits, but other objects (built anew for the call): found by value, and not
        # kept by their ids, which would hold every call's limits until the next clear.
        found = by_ids[1] if by_ids is not None else cache.by_value.get(tuple(limits))
        if found is not None and (
            found.valid_until is FOREVER or (now_us is None and self.clock() < found.valid_until)
        ):
            return found
        encoded = self._encode(limits, now_us)
        if now_us is None or encoded.valid_until is FOREVER:
            cache.put(limits, encoded)
        return encoded

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


def decision_of(client: str, limits: Limits, reply: Any) -> Decision:
    """Read the counting script's array reply ``[allowed, index, remaining, reset_us,
    retry_us, shadow_denied, taken_us]`` (see lua/driver.lua): a nonzero ``taken_us`` is the
    hit's ``Decision.taken``. A reply of another shape is a :class:`BackendError`."""
    try:
        if type(reply) is not list or len(reply) != REPLY_SIZE:
            raise ValueError(f"unexpected reply {reply!r}")
        allowed, index, remaining, reset_us, retry_us, shadow, taken_us = map(int, reply)
        if allowed not in (0, 1) or shadow not in (0, 1) or not 0 <= index <= len(limits):
            raise ValueError(f"unexpected reply {reply!r}")
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
        shadow == 1,
        False,
        False,
        False,
        False,
        ((client, taken_us),) if taken_us else (),
    )
