"""A task's wall-clock deadline: the record a task keeps of it, and the checks of what a caller asks.

A deadline bounds the whole task in wall-clock time (unlike ``Limits.max_elapsed_s``, which counts
work only). It is recorded in the task's state (``RunState.deadline``) by its first run and never
moved by a later one, so a restart, another worker or another process judges the same instant.
``TaskDeadline.at`` is a wall-clock time (seconds since the epoch, by the run's clock);
``source`` says where it came from: ``"limits"`` (``Limits.deadline_s`` after the first run's
start), ``"caller"`` (``fn.run(..., deadline=datetime)``), ``"parent"`` (a child's inherited one),
``"reopen"`` (moved on by ``resume --reopen --add-time``).

A child may only have an earlier deadline than its parent: ``earliest`` picks the earliest of
what is asked, so a later one is clamped to the parent's.

Not guaranteed: the deadline is judged by the clock of the process running the task; clocks of
different machines that disagree move it by their difference.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from typing import Any, Mapping

from . import _fields as f
from .canonical import JSONValue
from .errors import CorruptStateError, InvalidInputError

__all__ = ["DEADLINE_SOURCES", "TaskDeadline", "deadline_timestamp", "earliest"]

DEADLINE_SOURCES = ("limits", "caller", "parent", "reopen")

_SPEC = (
    f.Field("at", f.Kind.NUMBER),
    f.Field("source", f.Kind.TEXT),
    f.Field("recorded_at", f.Kind.NUMBER),
)
_FIELDS = frozenset(field.name for field in _SPEC)


@dataclass(frozen=True, slots=True)
class TaskDeadline:
    """The wall-clock instant by which the task must end (see the module docstring)."""

    at: float
    source: str
    recorded_at: float
    """When the deadline was recorded (or last moved by a reopen), by the run's clock."""

    def __post_init__(self) -> None:
        f.check(_SPEC, self, "task deadline")
        if self.source not in DEADLINE_SOURCES:
            raise InvalidInputError(f"task deadline: source must be one of {DEADLINE_SOURCES}, got {self.source!r}")

    def to_json(self) -> dict[str, JSONValue]:
        return {"at": self.at, "source": self.source, "recorded_at": self.recorded_at}

    @classmethod
    def from_json(cls, data: object) -> "TaskDeadline":
        what = "task deadline"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _FIELDS, what)
        values = f.read(_SPEC, d, what)
        if values["source"] not in DEADLINE_SOURCES:
            raise CorruptStateError(f"{what}: source must be one of {DEADLINE_SOURCES}, got {values['source']!r:.40}")
        return cls(**values)


def deadline_timestamp(deadline: object) -> float:
    """The epoch seconds of ``deadline``, a timezone-aware ``datetime``; ``InvalidInputError`` for
    anything else (a naive datetime is refused: its instant depends on the machine reading it)."""
    if not isinstance(deadline, _dt.datetime):
        raise InvalidInputError(f"deadline must be a timezone-aware datetime, got {type(deadline).__name__}")
    if deadline.tzinfo is None or deadline.tzinfo.utcoffset(deadline) is None:
        raise InvalidInputError(
            f"deadline {deadline.isoformat()} has no time zone: give an aware datetime (e.g. tzinfo=datetime.timezone.utc)"
        )
    at = deadline.timestamp()
    if not math.isfinite(at):
        raise InvalidInputError(f"deadline {deadline.isoformat()} is not a representable instant")
    return at


def earliest(*candidates: tuple[float, str] | None) -> tuple[float, str] | None:
    """The earliest of the ``(at, source)`` pairs given (None ignored), or None if none is."""
    present = [candidate for candidate in candidates if candidate is not None]
    return min(present, key=lambda pair: pair[0]) if present else None
