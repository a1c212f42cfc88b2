"""The contract of a usage store: where a backend keeps per-minute usage counts.

The Redis backend counts in the decision's own script call (``lua/usage.lua``, read back by
:class:`~django_throttle.backends.redis_usage.RedisUsage`), and the memory backend the same way
in its in-process store. Reports and the rollup (:mod:`django_throttle.usage.reports`) read
them through this contract.

Minutes are whole minutes since the Unix epoch. Counts per outcome are lists in
:data:`LETTERS` order (allowed, denied, shadow would-deny, failed open, failed closed).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

#: Prefix of a usage field counted only when the request is denied (see lua/driver.lua): the
#: first calls of a request counted in several calls, whose outcome the last call counts.
IF_DENIED = "\x01"

#: One letter per outcome, in report column order: allowed, denied, shadow would-deny,
#: failed open, failed closed. The Lua scripts use the same letters.
LETTERS = "adsoc"
#: Position of each letter's count in a counts list.
SLOT = {letter: i for i, letter in enumerate(LETTERS)}
#: API keys whose last use a store remembers (per shard for Redis: ``lua/usage.lua``'s
#: ``KEYS_SEEN_MAX``); beyond it the least recently used are forgotten.
KEYS_SEEN_MAX = 10_000
#: Seconds a minute's usage counts live in the backend (3 hours): ``manage.py throttle_usage
#: --rollup`` copies them to the database and must run more often (it says when it did not).
#: Longer costs Redis memory for every minute kept, shorter loses minutes to a late cron job.
USAGE_TTL = 3 * 3600
#: Clients kept per minute and outcome (in Redis each key shard keeps its heaviest
#: ``ceil(TOP_CLIENTS / KEY_SHARDS)``). Beyond it a new client replaces the smallest and
#: inherits its count (Space-Saving): a minute's memory is bounded whatever the number of
#: clients, while every client with a noticeable share of the traffic is listed.
TOP_CLIENTS = 1000
#: Allowed requests enter the per-client lists one in this many (chosen by the microseconds of
#: the server clock), each counting that many: the lists' cost per request drops eightfold,
#: and a client's allowed count stays an unbiased estimate. Denied and shadow would-deny
#: requests, and the tier and endpoint totals, are always exact.
CLIENT_SAMPLE = 8

#: (minute, usage field, client label, outcome letter, requests): one count kept in process
#: while the backend could not answer, pushed with :meth:`UsageStore.push`.
PendingCount = tuple[int, str, str, str, int]


@dataclass(slots=True)
class MinuteCounts:
    """One minute's counts. ``totals`` are exact, per usage field (tier and endpoint).
    ``clients`` are the top clients per outcome (heavy hitters, see ``lua/usage.lua``);
    ``full`` says a top list was full that minute, so clients beyond it were folded into the
    counts of those listed and per-client numbers are estimates."""

    totals: dict[str, list[int]] = field(default_factory=dict)
    clients: dict[str, list[int]] = field(default_factory=dict)
    full: bool = False


def add_to(table: dict[str, list[int]], key: str, slot: int, n: int) -> None:
    """Add ``n`` to ``table[key][slot]``, creating the row of zeros when missing."""
    row = table.get(key)
    if row is None:
        row = table[key] = [0] * len(LETTERS)
    row[slot] += n


class UsageStore(ABC):
    """Per-minute usage counts a backend keeps, plus the rollup's bookkeeping.

    ``top_size`` is how many clients one top list holds (per shard and outcome for Redis).
    """

    top_size: int

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections of the store's own (a Redis store may open a reading client)."""

    def keys_last_used(self, prefixes: Iterable[str] | None = None) -> dict[str, int]:
        """The last second (Unix) a decision counted each API key, by key prefix: those of
        ``prefixes`` that were seen (``None``: every key remembered). Kept only while usage
        counting is on. A store that keeps none (this default) knows of no use."""
        return {}

    @abstractmethod
    def now_minute(self) -> int:
        """The current minute on the clock the counts are written with."""

    @abstractmethod
    def read(
        self, minutes: Sequence[int], *, totals: bool = True, clients: bool = True
    ) -> dict[int, MinuteCounts]:
        """The counts of each of ``minutes`` that has any (the others are left out)."""

    @abstractmethod
    def push(self, batch: str, counts: Sequence[PendingCount]) -> None:
        """Add counts kept in process to their minutes, at most once per ``batch`` id (a
        retry after a lost reply is a no-op). Raise ``BackendError`` when it cannot."""

    @abstractmethod
    def watermark(self) -> int | None:
        """The last minute the rollup copied to the database, if known."""

    @abstractmethod
    def advance_watermark(self, minute: int) -> None:
        """Record that every minute up to ``minute`` is in the database (never moves back)."""

    @abstractmethod
    def take_late(self) -> set[int]:
        """Minutes that :meth:`push` wrote to since the last call, and forget them."""

    @abstractmethod
    def return_late(self, minutes: Iterable[int]) -> None:
        """Give back minutes from :meth:`take_late` that the rollup could not copy."""
