"""Rates as operators write them ("100/min", "20/15m", "10000/month"): the grammar, its units,
and the bounds every count shares.

Periods are whole seconds. Internal: import :class:`Rate` and :class:`InvalidRate` from
:mod:`django_throttle.rates`, which builds limits on top; nothing here reads settings or does
I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
_PERIOD_RE = re.compile(r"^\s*(?P<mult>[+-]?\d+)?\s*(?P<unit>[A-Za-z]+)\s*$")
_RATE_RE = re.compile(
    r"^\s*(?P<count>[+-]?\d+)\s*/\s*(?P<period>(?P<mult>\d+)?\s*(?P<unit>[A-Za-z]+))\s*$"
)
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
