"""What a limit is and what a check decided: rates as operators write them ("100/min",
"20/15m", "10000/month"), the limits built on them, the decisions a check returns, the calendar
windows a calendar quota resets on, and durations as an operator reads them ("30 d 6 h").

Durations are float seconds and instants are Unix seconds throughout (a calendar window's
boundaries: Unix microseconds); a rate's period is whole seconds. Nothing here reads settings or
does I/O, so every other layer can import it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db import models

__all__ = ["Algorithm", "Decision", "InvalidRate", "Limit", "Rate"]

# Rates as operators write them: the grammar, its units, and the bounds every count shares.

#: Calendar windows a quota can reset on, with the nominal length used for headers and bounds.
CALENDAR_UNITS: dict[str, int] = dict(day=86400, week=7 * 86400, month=31 * 86400, year=366 * 86400)
_CALENDAR_ALIASES = {alias: "month" for alias in ("mo", "mon", "month", "months")} | {
    alias: "year" for alias in ("y", "yr", "year", "years")
}
_UNITS: dict[str, int] = {
    alias: seconds
    for seconds, aliases in (
        (1, ("s", "sec", "second", "seconds")),
        (60, ("m", "min", "minute", "minutes")),
        (3600, ("h", "hour", "hours")),
        (86400, ("d", "day", "days")),
        (7 * 86400, ("w", "week", "weeks")),
    )
    for alias in aliases
}
_CANONICAL = ((86400, "d"), (3600, "h"), (60, "m"), (1, "s"))
#: The units a rate is shown in: those of the admin's rate field help text.
_SHOWN = ((7 * 86400, "week"), (86400, "day"), (3600, "h"), (60, "min"), (1, "s"))
# ASCII only: ``int()`` reads full-width and Arabic-Indic digits too, and a rate stored in
# digits other than those it is shown in says one thing in the row and another on screen.
_PERIOD_RE = re.compile(r"^\s*(?P<mult>[+-]?\d+)?\s*(?P<unit>[A-Za-z]+)\s*$", re.ASCII)
_RATE_RE = re.compile(
    r"^\s*(?P<count>[+-]?\d+)\s*/\s*(?P<period>(?P<mult>\d+)?\s*(?P<unit>[A-Za-z]+))\s*$",
    re.ASCII,
)


def plain_digits(text: str) -> bool:
    """Whether ``text`` writes its number in the digits 0-9, as a rate must: ``int()`` and
    ``float()`` also read full-width and Arabic-Indic digits and ``1_000``, so every number
    field the operator types (the admin's, a policy file's) asks this too, and a number is
    read one way wherever it is written."""
    return text.isascii() and "_" not in text


#: Longest period a rate may name; longer windows belong in a quota system, not a throttle.
MAX_PERIOD = 366 * 86400
#: Largest count, burst or cost: far beyond any real limit, and exact in a Lua double.
MAX_COUNT = 10**9


def parse_period(text: str, *, quoted: str | None = None, calendar: bool = False) -> int:
    """Whole seconds in a period as a rate writes it after its slash: a unit, with a whole
    multiplier or not (``min``, ``30s``, ``15m``, ``2d``, ``1w``); a month or a year has no
    fixed length. Raises :class:`InvalidRate` quoting ``quoted`` (default: ``text``), whose
    hint names month and year too when the caller takes them (``calendar``)."""
    quoted = text if quoted is None else quoted
    match = _PERIOD_RE.match(text)
    if match is None:
        raise InvalidRate(
            f"'{quoted}' is not a period: write a whole number and a unit, e.g. '30s', "
            "'15m', '1h', '2d' or '1w'"
        )
    unit = match["unit"]
    if unit not in _UNITS:
        if unit in _CALENDAR_ALIASES:
            hint = "a calendar month or year has no fixed length"
        elif unit.lower() in _CALENDAR_ALIASES or unit.lower() in _UNITS:
            hint = f"units are lowercase; did you mean '{unit.lower()}'?"
        else:
            hint = "use s, m, h, d or w (or sec, min, hour, day, week)"
            hint += ", or month, year" if calendar else ""
        raise InvalidRate(f"'{quoted}': unknown period unit '{unit}': {hint}")
    multiplier = int(match["mult"]) if match["mult"] is not None else 1
    if multiplier < 1:
        raise InvalidRate(f"'{quoted}': the period multiplier must be at least 1")
    return multiplier * _UNITS[unit]


class InvalidRate(ValueError):
    """A rate or limit that does not say exactly one thing.

    ``field`` names what the operator must change ("rate", "burst", "algorithm" or
    "timezone"), so a form can put the message on that field.
    """

    def __init__(self, message: str, field: str = "rate") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` requests per ``period`` seconds, parsed from text such as ``"100/min"``.

    Accepted forms: ``<count>/<unit>`` and ``<count>/<multiplier><unit>`` (``"20/15m"``), with
    units s, m, h, d (or sec/second(s), min/minute(s), hour(s), day(s)), lowercase, and
    ``w``/``week`` (7 days). ``<count>/month`` and ``<count>/year`` are calendar rates
    (``calendar`` set): their length varies, so only the calendar quota algorithm takes them,
    which resets on the 1st (on 1 January) in the limit's time zone. Anything ambiguous is
    rejected.
    """

    count: int
    period: int
    calendar: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_COUNT:
            raise InvalidRate(f"count must be between 1 and {MAX_COUNT}, not {self.count}")
        if not 1 <= self.period <= MAX_PERIOD:
            raise InvalidRate(f"period must be between 1 s and 366 days, not {self.period} s")
        if self.calendar and CALENDAR_UNITS.get(self.calendar) != self.period:
            raise InvalidRate(f"unknown calendar window {self.calendar!r}")

    @classmethod
    def parse(cls, text: str) -> Rate:
        if not isinstance(text, str):
            raise InvalidRate(f"a rate is text such as '100/min', not {type(text).__name__}")
        match = _RATE_RE.match(text)
        if match is None:
            raise InvalidRate(
                f"'{text}' is not a rate: write <count>/<period>, e.g. '100/min', '10/s', "
                "'5000/day' or '20/15m'"
            )
        count = int(match["count"])
        if count < 1:
            raise InvalidRate(f"'{text}': the count must be a whole number of at least 1")
        unit = match["unit"]
        calendar = _CALENDAR_ALIASES.get(unit)
        if calendar is not None:
            if match["mult"] is not None:
                raise InvalidRate(
                    f"'{text}': a calendar rate counts per one {calendar}, with no multiplier"
                )
            return cls(count, CALENDAR_UNITS[calendar], calendar)
        return cls(count, parse_period(match["period"], quoted=text, calendar=True))

    @property
    def interval(self) -> float:
        """Seconds to earn back one token."""
        return self.period / self.count

    def __str__(self) -> str:
        if self.calendar:
            return f"{self.count}/{self.calendar}"
        # The largest unit the period is a whole number of; every period is whole seconds.
        seconds, unit = next(pair for pair in _CANONICAL if self.period % pair[0] == 0)
        mult = self.period // seconds
        return f"{self.count}/{'' if mult == 1 else mult}{unit}"


def canonical_rate(text: str) -> str:
    """``text`` as the admin stores a rate: ``str(Rate.parse(text))``, one spelling per rate
    (``' 5 / min '``, ``'5/60s'`` and ``'+5/1m'`` are all ``'5/m'``); anything that is no
    rate unchanged, for the rate field's validator to explain. The admin's form and a
    policy file's import both store this, and an export writes it, so a rate reads one way
    whichever way it came in, and export and import round trips are stable."""
    try:
        return str(Rate.parse(text))
    except InvalidRate:
        return text


def rate_text(rate: Rate | str) -> str:
    """``rate`` as the app shows it to people, one way everywhere (admin lists and captions,
    the inspector, explain, the commands, the 429 body's limit name): in the units of the
    admin's rate field help text, ``100/min``, ``10/s``, ``1000/h``, ``5000/day``,
    ``20/15min``, ``10000/month``. Stored text that is not a rate is shown as written.

    ``str(rate)`` stays the short canonical form the admin stores (``100/m``); both parse to
    the same rate."""
    if isinstance(rate, Rate):
        parsed = rate
    else:
        try:
            parsed = Rate.parse(rate)
        except InvalidRate:
            return rate
    if parsed.calendar:
        return f"{parsed.count}/{parsed.calendar}"
    seconds, unit = next(pair for pair in _SHOWN if parsed.period % pair[0] == 0)
    mult = parsed.period // seconds
    return f"{parsed.count}/{'' if mult == 1 else mult}{unit}"


def limit_text(rate: Rate, algorithm: str) -> str:
    """What a limit of ``rate`` counted by ``algorithm`` allows, as its name says it to people
    (the 429 body's ``limit``, explain, the inspector, the usage tools): :func:`rate_text`,
    but a concurrency limit's "2 in flight" (its count is requests at the same time; its
    period is only the lease, which no client meets: "2/min" would read as two a minute)."""
    if algorithm == Algorithm.CONCURRENCY:
        return f"{rate.count} in flight"
    return rate_text(rate)


class Algorithm(models.TextChoices):
    """How a limit counts (see the README's algorithm table). Stored in the admin's rows."""

    TOKEN_BUCKET = "token_bucket", "Token bucket"
    GCRA = "gcra", "GCRA"
    LEAKY_BUCKET = "leaky_bucket", "Leaky bucket"
    FIXED_WINDOW = "fixed_window", "Fixed window"
    SLIDING_LOG = "sliding_window_log", "Sliding window log"
    SLIDING_COUNTER = "sliding_window_counter", "Sliding window counter"
    CALENDAR = "calendar_quota", "Calendar quota"
    CONCURRENCY = "concurrency", "Concurrency (requests in flight)"


#: Algorithms with a burst: a bucket of ``burst`` tokens earned back one per ``interval``.
TOKEN_ALGORITHMS = frozenset({Algorithm.TOKEN_BUCKET, Algorithm.GCRA, Algorithm.LEAKY_BUCKET})
#: Algorithms that count requests per window of ``period``: the capacity is the rate's count.
WINDOW_ALGORITHMS = frozenset(
    {
        Algorithm.FIXED_WINDOW,
        Algorithm.SLIDING_LOG,
        Algorithm.SLIDING_COUNTER,
        Algorithm.CALENDAR,
    }
)
#: The algorithms that limit a rate (every one but :attr:`Algorithm.CONCURRENCY`), in
#: :class:`Algorithm`'s order.
RATE_ALGORITHMS = tuple(a for a in Algorithm if a != Algorithm.CONCURRENCY)
#: The id of the fleet's in-flight limit: the shared concurrency limit the load shedder adds
#: to every checked request (its name is the request's criticality). A request it refuses was
#: shed: 503, not 429. Row limits' ids are a letter and a number, so none is this.
FLEET = "fleet"
#: The id of the limit a worker's own shedder reports (this process is saturated: its busy
#: threads or its event loop's lag), named by the request's criticality. A request it
#: refuses was shed too: 503.
WORKER = "worker"
#: Largest count of a sliding window log: it keeps one entry per request in the window, so
#: memory and script time grow with the limit. Above it, the sliding window counter.
MAX_LOG_COUNT = 10_000
#: GCRA keeps whole microseconds: a rate whose interval rounds off by more than this share
#: would run visibly faster or slower than stated (15000/s would be 14925/s), so it is refused.
GCRA_MAX_ROUNDING = 1e-3
#: Seconds a daylight-saving change can add to a calendar window (two hours, at most, anywhere).
CALENDAR_SLACK = 7200
#: The length a calendar quota's window is said to have, by unit (the IETF ``RateLimit-Policy``
#: field's ``w``): a day, a week, 30 days, 365 days. A real window may differ (a 31-day month,
#: the day the clocks change), which the ``RateLimit`` field's ``t`` tells exactly.
NOMINAL_CALENDAR = {"day": 86400, "week": 7 * 86400, "month": 30 * 86400, "year": 365 * 86400}
#: What a calendar quota's rate may say, by its period: one day or one week (one month and
#: one year parse as calendar rates already).
_CALENDAR_BY_PERIOD = {86400: "day", 7 * 86400: "week"}
#: Longest an empty bucket may take to fill (burst x period / count): keeps every key's
#: expiry (in ms) far inside what ``SET PX`` accepts.
MAX_WINDOW = 10 * 366 * 86400
#: Longest a delaying limit without a ``max_wait`` makes a request wait, in seconds, whatever
#: its burst implies (``1/h`` with a burst of 10 would imply ten hours): a sync view sleeps
#: in its thread meanwhile, gunicorn kills a worker silent for 30 s and nginx gives up on a
#: response after 60 s, so a longer wait would end in a killed worker or a 504 after the
#: turn was taken. A request that would wait longer is refused (429) with the time after
#: which its wait would be within it. Set ``max_wait`` for longer waits.
DEFAULT_MAX_WAIT = 10


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
    UTC). A concurrency limit holds at most ``rate.count`` requests in flight at once, each
    under a lease of ``rate.period`` seconds (renewed while it runs, given back when its
    response ends: a killed worker's slot is free again within the period); its ``burst`` is
    the count.

    A GCRA limit with a ``delay`` (a whole number) shapes traffic instead of only rejecting
    it, as nginx's ``limit_req`` does: of the ``burst`` requests it admits at once, the first
    ``delay + 1`` are served at once and the others wait their turn, one ``rate.interval``
    apart (the turn is reserved as the request is counted, so requests waiting together are
    spaced exactly); one that would wait longer than ``max_wait`` seconds (default: as long as
    the burst implies, at most :data:`DEFAULT_MAX_WAIT`) or come beyond the burst is refused,
    nothing reserved. nginx's
    ``burst=B delay=D`` is ``burst=B + 1, delay=D`` here: this burst counts the request at
    the rate too. ``delay=0`` paces every request after the first; ``delay=burst - 1`` never
    waits (nginx's ``nodelay``, the plain GCRA).

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
    delay: int | None = None
    max_wait: float | None = None

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
        if algorithm == Algorithm.CONCURRENCY and self.burst != self.rate.count:
            raise InvalidRate(
                f"a concurrency limit has no burst: it holds {self.rate.count} requests in "
                "flight at once; leave the burst empty",
                "burst",
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
        if self.delay is not None or self.max_wait is not None:
            self._check_delay()
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

    def _check_delay(self) -> None:
        if self.algorithm != Algorithm.GCRA:
            raise InvalidRate(
                "only a GCRA limit delays requests; choose GCRA, or leave delay empty", "delay"
            )
        delay = self.delay
        if isinstance(delay, bool) or not isinstance(delay, int):
            raise InvalidRate(f"delay must be a whole number, not {delay!r}", "delay")
        if not 0 <= delay < self.burst:
            raise InvalidRate(
                f"delay must be between 0 and the burst less one ({self.burst - 1}), not {delay}: "
                "of the burst's requests, delay + 1 are served at once",
                "delay",
            )
        wait = self.max_wait
        if wait is not None and (
            isinstance(wait, bool)
            or not isinstance(wait, int | float)
            or not 1e-6 <= wait <= MAX_WINDOW
        ):
            raise InvalidRate(
                f"the longest wait must be between a microsecond and {MAX_WINDOW:,} seconds, "
                f"not {wait!r}",
                "max_wait",
            )

    @property
    def max_wait_us(self) -> int:
        """The longest wait of a delaying limit in whole microseconds (at least 1): its
        ``max_wait``, else what its burst implies, at most :data:`DEFAULT_MAX_WAIT`."""
        if self.max_wait is not None:
            return max(1, round(self.max_wait * 1e6))
        return max(1, min(self.burst * self.emission_us, DEFAULT_MAX_WAIT * 1_000_000))

    def _check_calendar(self) -> None:
        if not self.calendar_unit:
            raise InvalidRate(
                f"'{rate_text(self.rate)}': a calendar quota counts per day, week, month or "
                "year, e.g. '10000/month' or '500/day'"
            )
        if self.timezone:
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
        delay: int | None = None,
        max_wait: float | None = None,
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
            delay=delay,
            max_wait=max_wait,
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
    def nominal_window(self) -> float:
        """The window as a user reads the limit: :attr:`window`, but a calendar quota's unit
        (:data:`NOMINAL_CALENDAR`: 86,400 s for a day, 30 days for a month) without the slack
        for clock changes."""
        if self.algorithm == Algorithm.CALENDAR:
            return float(NOMINAL_CALENDAR.get(self.calendar_unit, self.rate.period))
        return self.window

    @property
    def window(self) -> float:
        """Seconds an empty limit takes to be whole again: the bucket's refill time for token
        algorithms, the window for window algorithms (for a calendar quota the longest its
        window can last: a clock change lengthens a local day by up to two hours)."""
        if self.algorithm == Algorithm.CALENDAR:
            return float(self.rate.period + CALENDAR_SLACK)
        if self.algorithm in WINDOW_ALGORITHMS or self.algorithm == Algorithm.CONCURRENCY:
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
    ``leases`` names, for an allowed hit with a concurrency limit, each backend call that
    took a slot: (client, lease id), which ``Backend.release`` gives back and
    ``Backend.renew`` keeps. ``wait`` is, for an allowed request, the seconds until the turn
    a delaying limit reserved for it (``Limit.delay``); 0 when it may proceed at once.
    ``spared`` names, for an allowed hit, each shadow limit that would have denied it:
    (client, limit). Such a limit is left unchanged (it never holds a request back), so it
    took nothing, and a refund of the hit leaves it out: given back, it would be credited
    tokens never taken, and would report fewer would-denies than happened.
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
    leases: tuple[tuple[str, str], ...] = ()
    wait: float = 0.0
    spared: tuple[tuple[str, Limit], ...] = ()

    @property
    def shed(self) -> bool:
        """Refused by the load shedder (the fleet's in-flight capacity, :data:`FLEET`, or the
        worker's own saturation, :data:`WORKER`), not by a limit of the client's: answered
        503, not 429."""
        return not self.allowed and self.limit is not None and self.limit.id in (FLEET, WORKER)


#: The decision when no limit applies to a request.
UNLIMITED = Decision(allowed=True, limit=None, remaining=0, reset_after=0.0)


# Calendar windows for calendar quotas: "10,000 requests per month, reset on the 1st". A
# window starts at local midnight (a day), Monday midnight (a week), the 1st at midnight (a
# month) or 1 January (a year) in the quota's time zone, so it follows daylight saving time: the
# day the clocks go forward is 23 hours long. Both backends take the same boundaries from here:
# the Redis script receives them with the limit (it cannot read time zones), and picks the
# window that holds the server's clock.


def windows(unit: str, tz: str, now_us: int) -> tuple[int, int, int, int]:
    """Boundaries ``b0 < b1 <= now_us < b2 < b3`` in Unix microseconds: the previous window's
    start, the current one's, the next one's and the one after (``tz`` empty means UTC)."""
    tz = tz or "UTC"
    start = _step(unit, datetime.fromtimestamp(now_us // 1_000_000, ZoneInfo(tz)).date(), 0)
    bounds = _bounds(unit, tz, start)
    if now_us < bounds[1]:  # the second is rounded down; the microseconds are not past b1
        bounds = _bounds(unit, tz, _step(unit, start, -1))
    elif now_us >= bounds[2]:
        bounds = _bounds(unit, tz, _step(unit, start, 1))
    return bounds


@lru_cache(maxsize=1024)
def _bounds(unit: str, tz: str, start: date) -> tuple[int, int, int, int]:
    zone = ZoneInfo(tz)
    b0, b1, b2, b3 = (_midnight_us(_step(unit, start, n), zone) for n in (-1, 0, 1, 2))
    return b0, b1, b2, b3


def _step(unit: str, day: date, n: int) -> date:
    """The first day of the window ``n`` windows after the one holding ``day`` (``n`` = 0:
    that window's own first day)."""
    if unit == "day":
        return day + timedelta(days=n)
    if unit == "week":
        return day - timedelta(days=day.weekday()) + timedelta(weeks=n)
    if unit == "month":
        months = day.year * 12 + day.month - 1 + n
        return date(months // 12, months % 12 + 1, 1)
    if unit == "year":
        return date(day.year + n, 1, 1)
    raise ValueError(f"unknown calendar window {unit!r}: day, week, month or year")


def _midnight_us(day: date, zone: ZoneInfo) -> int:
    """The first instant of ``day`` in ``zone``, in Unix microseconds. Where midnight does not
    exist (a zone that springs forward at 00:00), PEP 495 reads the gap with the offset from
    before the transition: that is the transition itself, the day's first real instant."""
    midnight = datetime(day.year, day.month, day.day, tzinfo=zone)
    return round(midnight.timestamp()) * 1_000_000  # whole seconds: the float is exact


# Durations as an operator reads them: "30 d 6 h", "58 min", "12 s", "0.3 s". Float seconds
# go in; at most two units come out, the larger first, rounded up at the smaller unit shown
# (waits under ten seconds keep a tenth), so a wait is never shown shorter than it is ("0 s"
# only for none at all; 90 s is "2 min", never "1 min").

_MINUTE = 60
_HOUR = 60 * _MINUTE
_DAY = 24 * _HOUR


def format_duration(seconds: float) -> str:
    """``seconds`` in the one or two largest units that fit (negative counts as none), rounded
    up in its last unit: a wait (``Retry-After``, a limit whole again) is never shown shorter
    than it is, so waiting what the admin says always suffices."""
    seconds = max(0.0, float(seconds))
    if seconds < 10:
        tenths = math.ceil(round(seconds * 10, 6))
        return f"{tenths // 10} s" if tenths % 10 == 0 else f"{tenths / 10:.1f} s"
    # round(..., 6) first: float noise (3600.0000001 s) never adds a unit.
    if math.ceil(round(seconds, 6)) < _MINUTE:
        return f"{math.ceil(round(seconds, 6))} s"
    minutes = math.ceil(round(seconds / _MINUTE, 6))
    if minutes < 60:
        return f"{minutes} min"
    if minutes < 24 * 60:
        hours, minutes = divmod(minutes, 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(math.ceil(round(seconds / _HOUR, 6)), 24)
    return f"{days} d {hours} h" if hours else f"{days} d"
