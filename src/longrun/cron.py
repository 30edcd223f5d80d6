"""Cron expressions: the standard five fields, parsed once, and the slots they name in a time zone.

``Cron.parse("*/15 9-17 * * mon-fri")`` reads minute, hour, day of month, month and day of week,
each a ``*``, a number, a range ``a-b``, a step ``*/n``, ``a-b/n`` or ``a/n`` (from ``a`` to the
field's end), or a comma list of those; months may be named ``jan``-``dec`` and days ``sun``-``sat``
(case-insensitive; day 7 is Sunday too). ``@yearly``, ``@annually``, ``@monthly``, ``@weekly``,
``@daily``, ``@midnight`` and ``@hourly`` stand for their usual expressions. When both the day of
month and the day of week are restricted (neither starts with ``*``), a day matches if *either*
does (``0 0 1,15 * fri``: the 1st, the 15th and every Friday), as every standard cron does.

``cron.next_after(t, zone)`` is the first slot strictly after ``t`` (seconds since the epoch, UTC):
the fields are matched against the wall clock of ``zone`` (a ``zoneinfo.ZoneInfo``, or UTC).
Daylight-saving time, stated once:

- a slot whose wall time does not exist (the hour skipped when clocks go forward) is skipped:
  ``30 2 * * *`` in Europe/Berlin has no slot on the last Sunday of March;
- a slot whose wall time happens twice (the hour repeated when clocks go back) runs once, at its
  first occurrence (``fold=0``): ``30 1 * * *`` in America/New_York fires once on the first Sunday
  of November, at 01:30 EDT, not again at 01:30 EST.

``zone("UTC")`` needs nothing installed; other names need the system's time-zone database or the
``tzdata`` package (``ZoneNotFoundError``, a ``InvalidInputError``, says so). Not guaranteed: a
slot is a minute; seconds are always zero.
"""

from __future__ import annotations

import dataclasses
import datetime
import zoneinfo

from .errors import CronError, ZoneNotFoundError

__all__ = ["Cron", "CronError", "ZoneNotFoundError", "zone"]

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
_MONTHS = {name: number for number, name in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), start=1)}
_DAYS = {name: number for number, name in enumerate("sun mon tue wed thu fri sat".split())}
_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}  # fmt: skip
_SEARCH_YEARS = 9
"""How far ahead a slot is looked for: past any leap day (``0 0 29 2 *``), so an expression that
finds none in that time has none (``0 0 30 2 *``)."""


def zone(name: str) -> datetime.tzinfo:
    """The time zone ``name``: UTC without any database, any other through ``zoneinfo``."""
    if not isinstance(name, str) or not name:
        raise ZoneNotFoundError(f"a time zone is a name such as 'UTC' or 'Europe/Berlin', got {name!r}")
    if name.upper() in ("UTC", "Z", "ETC/UTC"):
        return datetime.timezone.utc
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ZoneNotFoundError(
            f"time zone {name!r} is not known on this machine ({exc}); check the name, or install the tzdata package"
        ) from None


def _number(text: str, names: dict[str, int], field: str, low: int, high: int) -> int:
    lowered = text.lower()
    if lowered in names:
        return names[lowered]
    if not text.isdigit():
        raise CronError(f"{field} field: {text!r} is not a number{' or a name' if names else ''}")
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"{field} field: {value} is outside {low}-{high}")
    return value


def _field(text: str, field: str, low: int, high: int) -> frozenset[int]:
    names = _MONTHS if field == "month" else _DAYS if field == "day of week" else {}
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"{field} field {text!r}: an empty list item")
        span, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) < 1:
                raise CronError(f"{field} field: step {step_text!r} is not a whole number >= 1")
            step = int(step_text)
        if span == "*":
            start, end = low, high
        elif "-" in span:
            first, _, last = span.partition("-")
            start, end = _number(first, names, field, low, high), _number(last, names, field, low, high)
            if start > end:
                raise CronError(f"{field} field: range {span!r} runs backwards")
        else:
            start = _number(span, names, field, low, high)
            end = high if slash else start  # "a/n": from a to the field's end, every n
        values.update(range(start, end + 1, step))
    if field == "day of week" and 7 in values:
        values = (values - {7}) | {0}
    return frozenset(values)


@dataclasses.dataclass(frozen=True, slots=True)
class Cron:
    """A parsed cron expression (``Cron.parse``): the values each field allows."""

    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """0 is Sunday."""
    either_day: bool
    """Both day fields are restricted: a day matches if either matches (the standard OR rule)."""

    @classmethod
    def parse(cls, expression: str) -> "Cron":
        if not isinstance(expression, str):
            raise CronError(f"a cron expression is a string, got {type(expression).__name__}")
        text = _MACROS.get(expression.strip().lower(), expression)
        parts = text.split()
        if len(parts) != 5:
            raise CronError(
                f"cron expression {expression!r} has {len(parts)} fields; it needs 5: minute hour day-of-month month day-of-week"
            )
        minutes, hours, days, months, weekdays = (_field(part, *spec) for part, spec in zip(parts, _FIELDS))
        parsed = cls(expression.strip(), minutes, hours, days, months, weekdays, not parts[2].startswith("*") and not parts[4].startswith("*"))
        if parsed._next_local(datetime.datetime(2000, 1, 1)) is None:
            raise CronError(f"cron expression {expression!r} names no time that exists (such as the 30th of February)")
        return parsed

    def _day_matches(self, day: datetime.date) -> bool:
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        return (in_month or in_week) if self.either_day else (in_month and in_week)

    def _next_local(self, after: datetime.datetime) -> datetime.datetime | None:
        """The first naive wall time strictly after ``after`` (naive) that the fields match, or None."""
        moment = after.replace(second=0, microsecond=0) + datetime.timedelta(minutes=1)
        horizon = after.year + _SEARCH_YEARS
        while moment.year <= horizon:
            if moment.month not in self.months:
                year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
                moment = datetime.datetime(year, month, 1)
                continue
            if not self._day_matches(moment.date()):
                moment = datetime.datetime.combine(moment.date() + datetime.timedelta(days=1), datetime.time())
                continue
            if moment.hour not in self.hours:
                moment = moment.replace(minute=0) + datetime.timedelta(hours=1)
                continue
            if moment.minute not in self.minutes:
                moment += datetime.timedelta(minutes=1)
                continue
            return moment
        return None

    def next_after(self, after: float, tz: datetime.tzinfo = datetime.timezone.utc) -> float:
        """The first slot strictly after ``after`` (epoch seconds), matched on ``tz``'s wall clock,
        as epoch seconds (see the module docstring for the hours daylight-saving time skips or repeats)."""
        local = datetime.datetime.fromtimestamp(after, tz).replace(tzinfo=None)
        while True:
            candidate = self._next_local(local)
            if candidate is None:
                raise CronError(f"cron expression {self.expression!r} has no slot in the {_SEARCH_YEARS} years after {local.isoformat()}")
            instant = candidate.replace(tzinfo=tz, fold=0)
            exists = instant.astimezone(datetime.timezone.utc).astimezone(tz).replace(tzinfo=None) == candidate
            stamp = instant.timestamp()
            if exists and stamp > after:
                return stamp
            local = candidate  # skipped by a clock going forward, or met again after one went back

    def slots(self, after: float, until: float, tz: datetime.tzinfo = datetime.timezone.utc, *, limit: int = 10_000) -> list[float]:
        """Every slot in ``(after, until]``, oldest first, at most ``limit`` of them."""
        found: list[float] = []
        moment = after
        while len(found) < limit:
            moment = self.next_after(moment, tz)
            if moment > until:
                break
            found.append(moment)
        return found
