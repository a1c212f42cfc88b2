"""Value objects for rate limiting: what a limit is and what a check decided.

Durations are float seconds and instants are Unix seconds throughout. Nothing here reads
settings or does I/O, so every other layer can import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.db import models

__all__ = ["MAX_COUNT", "MAX_WINDOW", "Algorithm", "Decision", "InvalidRate", "Limit", "Rate"]


class Algorithm(models.TextChoices):
    """How a limit counts. Token bucket is the default; the field is ready for more."""

    TOKEN_BUCKET = "token_bucket", "Token bucket"


class InvalidRate(ValueError):
    """A rate string that does not say exactly one thing."""


_UNITS: dict[str, int] = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
}
_CANONICAL = ((86400, "d"), (3600, "h"), (60, "m"), (1, "s"))
_RATE_RE = re.compile(r"^\s*(?P<count>[+-]?\d+)\s*/\s*(?P<mult>\d+)?\s*(?P<unit>[A-Za-z]+)\s*$")
#: Longest period a rate may name; longer windows belong in a quota system, not a throttle.
MAX_PERIOD = 366 * 86400
#: Largest count, burst or cost: far beyond any real limit, and exact in a Lua double.
MAX_COUNT = 10**9
#: Longest an empty bucket may take to fill (burst x period / count): keeps every key's
#: expiry (in ms) far inside what ``SET PX`` accepts.
MAX_WINDOW = 10 * 366 * 86400


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` requests per ``period`` seconds, parsed from text such as ``"100/min"``.

    Accepted forms: ``<count>/<unit>`` and ``<count>/<multiplier><unit>`` (``"20/15m"``), with
    units s, m, h, d (or sec/second(s), min/minute(s), hour(s), day(s)), lowercase. Months and
    years are rejected because their length varies; anything else ambiguous is rejected too.
    """

    count: int
    period: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_COUNT:
            raise InvalidRate(f"count must be between 1 and {MAX_COUNT}, not {self.count}")
        if not 1 <= self.period <= MAX_PERIOD:
            raise InvalidRate(f"period must be between 1 s and 366 days, not {self.period} s")

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
        if unit not in _UNITS:
            if unit.lower() in {"mo", "mon", "month", "months", "y", "yr", "year", "years"}:
                hint = "months and years vary in length; give the period in days"
            elif unit.lower() in _UNITS:
                hint = f"units are lowercase; did you mean '{unit.lower()}'?"
            else:
                hint = "use s, m, h or d (or sec, min, hour, day)"
            raise InvalidRate(f"'{text}': unknown period unit '{unit}': {hint}")
        multiplier = int(match["mult"]) if match["mult"] is not None else 1
        if multiplier < 1:
            raise InvalidRate(f"'{text}': the period multiplier must be at least 1")
        return cls(count, multiplier * _UNITS[unit])

    @property
    def interval(self) -> float:
        """Seconds to earn back one token."""
        return self.period / self.count

    def __str__(self) -> str:
        for seconds, unit in _CANONICAL:
            if self.period % seconds == 0:
                mult = self.period // seconds
                return f"{self.count}/{'' if mult == 1 else mult}{unit}"
        raise AssertionError("unreachable: every period is a whole number of seconds")


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit to enforce: a rate with a burst capacity, counted by one algorithm.

    ``id`` names the counter (stable across restarts, unique per limit, short: it becomes part
    of a Redis key); ``name`` is what users see in the 429 body and the policy headers. A
    ``shadow`` limit is counted but never denies: a would-deny is only reported.
    """

    id: str
    rate: Rate
    burst: int
    algorithm: Algorithm = Algorithm.TOKEN_BUCKET
    name: str = ""
    shadow: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.burst, bool) or not isinstance(self.burst, int):
            raise InvalidRate(f"burst must be a whole number, not {self.burst!r}")
        if not 1 <= self.burst <= MAX_COUNT:
            raise InvalidRate(f"burst must be between 1 and {MAX_COUNT:,}, not {self.burst}")
        if self.window > MAX_WINDOW:
            raise InvalidRate(
                f"burst {self.burst} at {self.rate} takes {self.window / 86400:,.0f} days to "
                f"refill; the most is {MAX_WINDOW // 86400:,} days: lower the burst"
            )

    @classmethod
    def build(
        cls,
        id: str,
        rate: str | Rate,
        burst: int | None = None,
        algorithm: Algorithm | str = Algorithm.TOKEN_BUCKET,
        name: str = "",
        shadow: bool = False,
    ) -> Limit:
        """Make a limit from admin-style values; ``burst`` defaults to the rate's count."""
        parsed = rate if isinstance(rate, Rate) else Rate.parse(rate)
        return cls(
            id=id,
            rate=parsed,
            burst=parsed.count if burst is None else burst,
            algorithm=Algorithm(algorithm),
            name=name or str(parsed),
            shadow=shadow,
        )

    @property
    def capacity(self) -> int:
        return self.burst

    @property
    def window(self) -> float:
        """Seconds an empty bucket takes to fill completely."""
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
    not answer.
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


#: The decision when no limit applies to a request.
UNLIMITED = Decision(allowed=True, limit=None, remaining=0, reset_after=0.0)
