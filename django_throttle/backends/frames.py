"""The arguments of one counting call (a :class:`ScriptCall`), and how its reply reads as a
decision.

A decision is one ``EVALSHA`` whose constant parts (script digest, limit specs) are encoded once
per limit list and reused, so a request only adds its keys, cost, usage field and client.
redis-py's own clients send it (see :mod:`.redis`).
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
    DIGEST_SIZE,
    Limits,
    LimitsCache,
    decision_from,
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
#: Usage keys a counting call declares after its limits' (see lua/usage.lua): the shard's
#: totals and top lists (allowed, denied, shadow) of the minute, its key-use and late sets.
USAGE_KEYS = 6
USAGE_SUFFIXES = (b"u%d", b"ta%d", b"td%d", b"ts%d", b"k", b"l")


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
class ScriptCall:
    """One counting (or refund) script call: what redis-py's evalsha/eval send."""

    shard: int  # the client's shard (0..shards-1): which cluster slot / breaker
    sha: str  # the script's SHA1 hex digest
    source: str  # its source, for EVAL after NOSCRIPT (the script did not run)
    keys: Sequence[str | bytes]
    args: Sequence[str | bytes | int]


@dataclass(frozen=True, slots=True)
class Encoded:
    """What one limit list adds to every call: key suffixes, the script's digest and the
    specs (ARGV after the first).

    ``valid_until`` (Unix seconds) is when a calendar quota's window ends and the specs must
    be encoded again; :data:`FOREVER` when the list has none. ``shared`` marks the shared
    limits (empty when there are none, the usual case): their keys carry the shard's tag and
    :data:`SHARED_MARK` instead of the client's tag. ``source`` is the script's source, the
    one object every list of that mix of algorithms shares (only an EVAL, after NOSCRIPT,
    sends it): an entry costs a few hundred bytes, not a copy of the script.
    """

    suffixes: tuple[bytes, ...]
    sha: str
    specs: tuple[bytes, ...]
    source: str
    valid_until: float = FOREVER
    shared: tuple[bool, ...] = ()


class Calls:
    """Builds calls of one script; limit lists are encoded once and cached by the limits they
    hold (:class:`~.base.LimitsCache`: a list built per request from the policy's limits
    finds its entry).

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
        #: This process's reading of the server's clock (Unix seconds): what names the usage
        #: keys' minute and places a calendar quota's windows before the script reads TIME.
        self.clock = clock
        self._cache: LimitsCache[Encoded] = LimitsCache()
        # Bounded by hand, not functools.lru_cache: its wrapper costs a decision tens of ns.
        self._fields: dict[str, bytes] = {}
        self._usage: dict[tuple[bytes, int], tuple[bytes, ...]] = {}
        self._scripts: dict[frozenset[str], tuple[bytes, bytes]] = {}

    def script(self, limits: Sequence[Limit]) -> tuple[bytes, bytes]:
        """The digest and source of the script for ``limits``' mix of algorithms."""
        codes = frozenset(ALGORITHM_CODES[limit.algorithm] for limit in limits)
        found = self._scripts.get(codes)
        if found is None:
            source = self.source_for(codes).encode()
            found = self._scripts[codes] = (hashlib.sha1(source).hexdigest().encode(), source)
        return found

    def encoded(self, limits: Sequence[Limit], now_us: int | None = None) -> Encoded:
        """The list's encoding, cached. One with calendar quotas is made again once its
        window has passed, and for a test's ``now_us`` (then not cached: real time keeps its
        own)."""
        found = self._cache.get(limits)
        if found is not None and (
            found.valid_until is FOREVER or (now_us is None and self.clock() < found.valid_until)
        ):
            return found
        encoded = self._encode(limits, now_us)
        if now_us is None or encoded.valid_until is FOREVER:
            self._cache.put(limits, encoded)
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
            sha=sha.decode(),
            source=source.decode(),
            specs=tuple(
                limit_spec(per_shard(limit, self.shards), now_us).encode() for limit in limits
            ),
            valid_until=until,
            shared=shared if any(shared) else (),
        )

    @staticmethod
    def op(cost: int | None, now_us: int | None, peek: bool = False) -> bytes:
        """The cost (1, the usual cost, is sent as nothing), or for a peek ``p`` and the cost
        it asks about (``None`` or 0: none); ``@now`` in tests."""
        if peek or cost is None:
            text = b"p" + str(cost).encode() if cost else b"p"
        else:
            text = b"" if cost == 1 and type(cost) is int else str(cost).encode()
        return text if now_us is None else b"%s@%d" % (text, now_us)

    def field(self, field: str | None) -> bytes:
        """``\n<field>\n`` to put between the op and the client, ``b""`` for none."""
        if not field:
            return b""
        framed = self._fields.get(field)
        if framed is None:
            if len(self._fields) >= 4096:
                self._fields.clear()
            framed = self._fields[field] = b"\n" + field.replace("\n", " ").encode() + b"\n"
        return framed

    def usage_keys(self, shard: bytes, now_us: int | None) -> tuple[bytes, ...]:
        """The usage keys of shard tag ``shard`` for the minute of ``now_us`` (default
        :attr:`clock`: the keys must be named before the script reads the server's),
        cached per shard and minute."""
        minute = int(self.clock() if now_us is None else now_us / 1e6) // 60
        framed = self._usage.get((shard, minute))
        if framed is None:
            if len(self._usage) >= 4096:
                self._usage.clear()
            framed = self._usage[shard, minute] = tuple(
                shard + (suffix % minute if b"%" in suffix else suffix) for suffix in USAGE_SUFFIXES
            )
        return framed

    def command(
        self,
        encoded: Encoded,
        shard: int,
        tag: bytes,
        op: bytes,
        field: bytes,
        client: bytes,
        now_us: int | None = None,
    ) -> ScriptCall:
        """The whole call: one key per limit (``tag + suffix``), with a usage field the usage
        keys; ARGV[1] (op, and with a usage field the field and the client), then the specs."""
        prefix = tag[:-DIGEST_KEY_CHARS]
        if encoded.shared:
            keys = [
                (prefix + SHARED_MARK if shared else tag) + suffix
                for suffix, shared in zip(encoded.suffixes, encoded.shared, strict=True)
            ]
        else:
            keys = [tag + suffix for suffix in encoded.suffixes]
        if field:
            keys.extend(self.usage_keys(prefix, now_us))
            op = op + field + client.replace(b"\n", b" ")
        return ScriptCall(shard, encoded.sha, encoded.source, keys, (op, *encoded.specs))


def decision_of(client: str, limits: Limits, reply: Any) -> Decision:
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
