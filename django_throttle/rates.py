"""Value objects for rate limiting: what a limit is and what a check decided.

Durations are float seconds and instants are Unix seconds throughout. Nothing here reads
settings or does I/O, so every other layer can import it. Rates and their grammar live in
:mod:`django_throttle.rate_parsing`, re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import models

from django_throttle.rate_parsing import MAX_COUNT as MAX_COUNT
from django_throttle.rate_parsing import MAX_PERIOD as MAX_PERIOD
from django_throttle.rate_parsing import InvalidRate, Rate
from django_throttle.rate_parsing import rate_text as rate_text

__all__ = ["Algorithm", "Decision", "InvalidRate", "Limit", "Rate"]


class Algorithm(models.TextChoices):
    """How a limit counts (see the README's algorithm table). Stored in the admin's rows."""

    TOKEN_BUCKET = "token_bucket", "Token bucket"
    GCRA = "gcra", "GCRA"
    LEAKY_BUCKET = "leaky_bucket", "Leaky bucket"
    FIXED_WINDOW = "fixed_window", "Fixed window"
    SLIDING_LOG = "sliding_window_log", "Sliding window log"
    SLIDING_COUNTER = "sliding_window_counter", "Sliding window counter"
    CALENDAR = "calendar_quota", "Calendar quota"


#: Algorithms with a burst: a bucket of ``burst`` tokens earned back one per ``interval``.
TOKEN_ALGORITHMS = frozenset({Algorithm.TOKEN_BUCKET, Algorithm.GCRA, Algorithm.LEAKY_BUCKET})
#: Algorithms that count requests per window of ``period``: the capacity is the rate's count.
WINDOW_ALGORITHMS = frozenset(Algorithm) - TOKEN_ALGORITHMS
#: Largest count of a sliding window log: it keeps one entry per request in the window, so
#: memory and script time grow with the limit. Above it, the sliding window counter.
MAX_LOG_COUNT = 10_000
#: GCRA keeps whole microseconds: a rate whose interval rounds off by more than this share
#: would run visibly faster or slower than stated (15000/s would be 14925/s), so it is refused.
GCRA_MAX_ROUNDING = 1e-3
#: Seconds a daylight-saving change can add to a calendar window (two hours, at most, anywhere).
CALENDAR_SLACK = 7200
#: What a calendar quota's rate may say, by its period: one day or one week (one month and
#: one year parse as calendar rates already).
_CALENDAR_BY_PERIOD = {86400: "day", 7 * 86400: "week"}
#: Longest an empty bucket may take to fill (burst x period / count): keeps every key's
#: expiry (in ms) far inside what ``SET PX`` accepts.
MAX_WINDOW = 10 * 366 * 86400


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit to enforce: a rate with a capacity, counted by one algorithm.

    ``id`` names the counter (stable across restarts, unique per limit, short: it becomes part
    of a Redis key); ``name`` is what users see in the 429 body and the policy headers. A
    ``shadow`` limit is counted but never denies: a would-deny is only reported.

    Token algorithms (token bucket, GCRA, leaky bucket) hold ``burst`` tokens and earn one
    back every ``rate.interval`` seconds. Window algorithms (fixed window, sliding log and
    counter, calendar quota) admit ``rate.count`` per window; their ``burst`` is the count.
    A calendar quota's windows follow the calendar in ``timezone`` (an IANA name; empty means
    UTC).

    A ``shared`` limit counts every client together (a global ceiling, e.g. for all anonymous
    clients). Backends keep it per key shard, so that a decision stays in one Redis Cluster
    slot: each shard admits ``ceil(count / shards)`` per period with a burst of
    ``ceil(burst / shards)``, which is exact per shard and approximates the whole.
    """

    id: str
    rate: Rate
    burst: int
    algorithm: Algorithm = Algorithm.TOKEN_BUCKET
    name: str = ""
    shadow: bool = False
    timezone: str = ""
    shared: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.burst, bool) or not isinstance(self.burst, int):
            raise InvalidRate(f"burst must be a whole number, not {self.burst!r}", "burst")
        if not 1 <= self.burst <= MAX_COUNT:
            raise InvalidRate(
                f"burst must be between 1 and {MAX_COUNT:,}, not {self.burst}", "burst"
            )
        algorithm = self.algorithm
        if self.rate.calendar and algorithm != Algorithm.CALENDAR:
            raise InvalidRate(
                f"'{rate_text(self.rate)}': {self.rate.calendar}s vary in length; choose the "
                f"calendar quota algorithm (it resets on the calendar), or give the period in days",
                "algorithm",
            )
        if algorithm in WINDOW_ALGORITHMS and self.burst != self.rate.count:
            raise InvalidRate(
                f"the {algorithm.label.lower()} has no burst: it admits {self.rate.count} per "
                "window; leave the burst empty",
                "burst",
            )
        if algorithm == Algorithm.CALENDAR:
            self._check_calendar()
        elif self.timezone:
            raise InvalidRate("only a calendar quota has a time zone; leave it empty", "timezone")
        if algorithm == Algorithm.SLIDING_LOG and self.rate.count > MAX_LOG_COUNT:
            raise InvalidRate(
                f"a sliding window log keeps every request of its window, so it takes at most "
                f"{MAX_LOG_COUNT:,} per window, not {self.rate.count:,}; use the sliding window "
                "counter for larger limits",
                "algorithm",
            )
        if algorithm == Algorithm.GCRA:
            interval = self.interval_us
            if interval < 1 or abs(round(interval) - interval) > GCRA_MAX_ROUNDING * interval:
                raise InvalidRate(
                    f"GCRA counts whole microseconds: at {rate_text(self.rate)} one request every "
                    f"{interval:.3f} µs would run at {1e6 / max(1, round(interval)):,.1f}/s; "
                    "use the token bucket for this rate",
                    "algorithm",
                )
        if self.window > MAX_WINDOW:
            raise InvalidRate(
                f"burst {self.burst} at {rate_text(self.rate)} takes "
                f"{self.window / 86400:,.0f} days to refill; the most is "
                f"{MAX_WINDOW // 86400:,} days: lower the burst",
                "burst",
            )

    def _check_calendar(self) -> None:
        if not self.calendar_unit:
            raise InvalidRate(
                f"'{rate_text(self.rate)}': a calendar quota counts per day, week, month or "
                "year, e.g. '10000/month' or '500/day'"
            )
        if self.timezone:
            from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

            try:
                ZoneInfo(self.timezone)
            except (ZoneInfoNotFoundError, ValueError):
                raise InvalidRate(
                    f"unknown time zone {self.timezone!r}: use an IANA name such as "
                    "'Europe/Berlin' or 'UTC'",
                    "timezone",
                ) from None

    @classmethod
    def build(
        cls,
        id: str,
        rate: str | Rate,
        burst: int | None = None,
        algorithm: Algorithm | str = Algorithm.TOKEN_BUCKET,
        name: str = "",
        shadow: bool = False,
        timezone: str = "",
        shared: bool = False,
    ) -> Limit:
        """Make a limit from admin-style values; ``burst`` defaults to the rate's count.

        For a calendar quota, ``"500/day"`` and ``"2000/week"`` become calendar rates (midnight,
        Monday midnight): the algorithm is what asks for the alignment, never the text alone.
        """
        parsed = rate if isinstance(rate, Rate) else Rate.parse(rate)
        try:
            chosen = Algorithm(algorithm)
        except ValueError:
            raise InvalidRate(
                f"unknown algorithm {algorithm!r}; use one of "
                + ", ".join(repr(value) for value in Algorithm.values),
                "algorithm",
            ) from None
        if chosen == Algorithm.CALENDAR and parsed.period in _CALENDAR_BY_PERIOD:
            parsed = Rate(parsed.count, parsed.period, _CALENDAR_BY_PERIOD[parsed.period])
        return cls(
            id=id,
            rate=parsed,
            burst=parsed.count if burst is None else burst,
            algorithm=chosen,
            name=name or str(parsed),
            shadow=shadow,
            timezone=timezone,
            shared=shared,
        )

    @property
    def capacity(self) -> int:
        return self.burst

    @property
    def interval_us(self) -> float:
        """Microseconds to earn back one token (token algorithms)."""
        return self.rate.period * 1e6 / self.rate.count

    @property
    def emission_us(self) -> int:
        """GCRA's emission interval: :attr:`interval_us` in whole microseconds."""
        return max(1, round(self.interval_us))

    @property
    def period_us(self) -> int:
        """The window in whole microseconds (window algorithms; nominal for a calendar)."""
        return self.rate.period * 1_000_000

    @property
    def calendar_unit(self) -> str:
        """A calendar quota's window: "day", "week", "month" or "year" ("" for the others)."""
        if self.algorithm != Algorithm.CALENDAR:
            return ""
        return self.rate.calendar or _CALENDAR_BY_PERIOD.get(self.rate.period, "")

    @property
    def window(self) -> float:
        """Seconds an empty limit takes to be whole again: the bucket's refill time for token
        algorithms, the window for window algorithms (for a calendar quota the longest its
        window can last: a clock change lengthens a local day by up to two hours)."""
        if self.algorithm == Algorithm.CALENDAR:
            return float(self.rate.period + CALENDAR_SLACK)
        if self.algorithm in WINDOW_ALGORITHMS:
            return float(self.rate.period)
        if self.algorithm == Algorithm.GCRA:
            return self.burst * self.emission_us / 1e6
        return self.burst * self.rate.period / self.rate.count


@dataclass(frozen=True, slots=True)
class Decision:
    """What one check decided, with everything the response headers need.

    ``limit`` is the limit reported to the client: the one that denied with the longest wait,
    or, when all allowed, the one with the fewest tokens left (``None`` when nothing applied).
    ``remaining`` is whole tokens left after this request, ``reset_after`` seconds until that
    limit is full again, ``retry_after`` seconds after which the same request would be allowed
    (0 when allowed). ``shadow`` says a shadow limit would have denied (the request was not
    held back by it); ``failed_open`` marks a request let through because the backend could
    not answer. ``taken`` names, for an allowed hit, each backend call that took its tokens:
    (client, the instant in whole microseconds on the backend's clock); a refund given that
    instant (``Backend.refund(..., taken_at=)``) gives back exactly what that call took.
    """

    allowed: bool
    limit: Limit | None
    remaining: int
    reset_after: float
    retry_after: float = 0.0
    limits: tuple[Limit, ...] = ()
    shadow: bool = False
    failed_open: bool = False
    unavailable: bool = False
    local: bool = False
    unidentified: bool = False
    taken: tuple[tuple[str, int], ...] = ()


#: The decision when no limit applies to a request.
UNLIMITED = Decision(allowed=True, limit=None, remaining=0, reset_after=0.0)
