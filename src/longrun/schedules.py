"""Schedules: a durable function started at each slot of a cron expression, once across a fleet.

A ``Schedule`` names a durable function (``module:qualname``), a cron expression (``longrun.cron``),
the time zone its fields are read in, and what to do with slots missed while no worker ran:
``catchup="skip"`` starts only the latest missed slot, ``"backfill"`` starts every one of them,
oldest first (at most ``MAX_BACKFILL`` per pass of a worker; the next pass goes on).

Exactly once per slot: a slot's task id is derived from the schedule's name and the slot's time
(``slot_task_id``: ``NAME.20261201T1415Z``), and a task is recorded once per id (``fn.enqueue`` of
an id already recorded with the same arguments records nothing). Two workers that start the same
slot at once record one task; a worker killed between recording a slot's task and moving the
schedule past it leaves the slot to the next worker, which records nothing new. The task then runs
as every durable task does (one lease holder at a time, each effect once).

The function is called with no argument, or with the slot's time as one argument (an ISO 8601
string in UTC, ``2026-12-01T14:15:00+00:00``), as its signature says (``takes_slot``).

Stored form: ``Schedule.to_json`` (what was asked for) in the store's fleet tables
(``stores.queue``), with the next slot to start and the last task started beside it.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
from typing import Any, Callable

from .canonical import JSONValue
from .cron import Cron, zone
from .errors import CorruptStateError, InvalidInputError, LongrunError, ScheduleError
from .names import SAFE_NAME

__all__ = [
    "CATCHUP", "MAX_BACKFILL", "Schedule", "ScheduleError", "ScheduleState", "arguments_for", "slot_argument", "slot_task_id",
    "takes_slot", "trigger_task_id",
]  # fmt: skip

CATCHUP = ("skip", "backfill")
MAX_BACKFILL = 1000
"""The most missed slots one pass of a worker starts for one schedule (the next pass goes on)."""
MAX_NAME_CHARS = 96
"""A schedule's name leaves room in a task id (128 characters) for the slot's time."""


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name) or len(name) > MAX_NAME_CHARS:
        raise InvalidInputError(
            f"schedule name {name!r} is not valid: use 1-{MAX_NAME_CHARS} of [A-Za-z0-9._-], starting with a letter or digit"
        )
    return name


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    """What a schedule asks for (validated on construction)."""

    name: str
    function: str
    """The durable function's qualified name, ``module:qualname`` (``DurableFunction.name``)."""
    cron: str
    timezone: str = "UTC"
    catchup: str = "skip"
    paused: bool = False

    def __post_init__(self) -> None:
        _check_name(self.name)
        if not isinstance(self.function, str) or ":" not in self.function:
            raise InvalidInputError(f"a schedule's function is a durable function's name, module:qualname, got {self.function!r}")
        Cron.parse(self.cron)
        zone(self.timezone)
        if self.catchup not in CATCHUP:
            raise InvalidInputError(f"catchup is one of {', '.join(CATCHUP)}, got {self.catchup!r}")
        if not isinstance(self.paused, bool):
            raise InvalidInputError(f"paused is True or False, got {self.paused!r}")

    @property
    def parsed(self) -> Cron:
        return Cron.parse(self.cron)

    def next_after(self, after: float) -> float:
        """The first slot strictly after ``after`` (epoch seconds), in this schedule's zone."""
        return self.parsed.next_after(after, zone(self.timezone))

    def due_slots(self, next_slot: float, now: float) -> tuple[list[float], float]:
        """The slots to start when the schedule's next slot is ``next_slot`` and the time is ``now``,
        and the next slot after them: every slot in ``[next_slot, now]`` (at most ``MAX_BACKFILL``)
        when catching up by backfill, else only the latest of them."""
        if next_slot > now:
            return [], next_slot
        cron, tz = self.parsed, zone(self.timezone)
        if self.catchup == "skip":
            latest = next_slot
            while (following := cron.next_after(latest, tz)) <= now:  # skipping is cheap: no task per slot
                latest = following
            slots = [latest]
        else:
            slots = [next_slot, *cron.slots(next_slot, now, tz, limit=MAX_BACKFILL - 1)]
        return slots, cron.next_after(slots[-1], tz)

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "schema_version": 1, "name": self.name, "function": self.function, "cron": self.cron, "timezone": self.timezone,
            "catchup": self.catchup, "paused": self.paused,
        }  # fmt: skip

    @classmethod
    def from_json(cls, document: object) -> "Schedule":
        if not isinstance(document, dict):
            raise CorruptStateError(f"a stored schedule is a JSON object, got {type(document).__name__}")
        if document.get("schema_version") != 1:
            raise CorruptStateError(f"stored schedule {document.get('name')!r}: unknown schema_version {document.get('schema_version')!r}")
        expected = {"schema_version", "name", "function", "cron", "timezone", "catchup", "paused"}
        if set(document) != expected:
            raise CorruptStateError(f"stored schedule {document.get('name')!r}: fields {sorted(document)}, expected {sorted(expected)}")
        try:
            return cls(
                document["name"], document["function"], document["cron"], document["timezone"], document["catchup"], document["paused"]
            )
        except LongrunError as exc:
            raise CorruptStateError(f"stored schedule {document.get('name')!r} is not valid: {exc}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleState:
    """A stored schedule and where it stands."""

    schedule: Schedule
    next_slot: float
    """The next slot to start (epoch seconds); when paused, where it stood."""
    last_slot: float | None
    last_task: str | None

    def to_json(self) -> dict[str, JSONValue]:
        return {
            **self.schedule.to_json(), "next_slot": _iso(self.next_slot), "last_slot": _iso(self.last_slot) if self.last_slot is not None else None,
            "last_task": self.last_task,
        }  # fmt: skip


def _iso(slot: float) -> str:
    return datetime.datetime.fromtimestamp(slot, datetime.timezone.utc).isoformat()


def slot_task_id(name: str, slot: float) -> str:
    """The task id of schedule ``name``'s slot at ``slot`` (epoch seconds): ``NAME.YYYYmmddTHHMMZ``."""
    stamp = datetime.datetime.fromtimestamp(slot, datetime.timezone.utc).strftime("%Y%m%dT%H%MZ")
    return f"{_check_name(name)}.{stamp}"


def trigger_task_id(name: str, at: float) -> str:
    """The task id of a run of schedule ``name`` started by hand at ``at``: ``NAME.manual.YYYYmmddTHHMMSSZ``."""
    stamp = datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{_check_name(name)}.manual.{stamp}"


def slot_argument(slot: float) -> str:
    """What a function that takes the slot gets: its time in ISO 8601, UTC."""
    return _iso(slot)


def takes_slot(fn: Callable[..., Any]) -> bool:
    """Whether ``fn(run, ...)`` takes the slot's time: one argument after the run, else none.
    ``InvalidInputError`` for a function that takes neither."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    for arguments in ((None, "slot"), (None,)):
        try:
            signature.bind(*arguments)
        except TypeError:
            continue
        return len(arguments) == 2
    raise InvalidInputError(f"a scheduled function takes no argument or the slot's time after the run; {fn!r} takes {signature}")


def arguments_for(fn: Callable[..., Any], slot: float) -> tuple[Any, ...]:
    """The arguments a slot's task records: the slot's time, or none (``takes_slot``)."""
    return (slot_argument(slot),) if takes_slot(fn) else ()
