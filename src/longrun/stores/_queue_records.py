"""The records the fleet's tables hand out: a worker's claim, a row of the index, a worker's row, a slot held."""

from __future__ import annotations

import dataclasses

from ..canonical import JSONValue

__all__ = ["Claim", "QueueEntry", "SlotHold", "WorkerRecord"]


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """A worker's claim on one due task: the right to try it until ``TaskQueue.finish``."""

    task_id: str
    function: str
    token: str
    nudge: int
    """The row's wake-up count when claimed: one that changed during the run wakes it again."""
    parent: str | None = None
    priority: int = 0
    failures: int = 0
    """How many runs in a row raised before this claim (any worker's): the next backoff grows with it."""


@dataclasses.dataclass(frozen=True, slots=True)
class QueueEntry:
    """One row of the index, as ``TaskQueue.entries`` reads it (times relative to the database's clock)."""

    task_id: str
    function: str
    parent: str | None
    priority: int
    due_in_s: float | None
    """Seconds until it is due (negative: overdue); None: parked until something wakes it."""
    status: str
    claimed_by: str | None
    runs: int
    failures: int
    last_error: str | None

    def to_json(self) -> dict[str, JSONValue]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A worker's row: who it is, and when it last said it was alive (by the database's clock)."""

    name: str
    host: str
    pid: int
    state: str
    """running, draining or stopped (a worker that died keeps the state it had: see ``alive``)."""
    concurrency: int
    running: int
    """Tasks it held at its last heartbeat."""
    claimed: int
    """Rows it holds an unexpired claim on now."""
    heartbeat_age_s: float
    alive: bool
    """Its last heartbeat is younger than three heartbeat intervals and it has not stopped."""
    functions: tuple[str, ...]
    started_at: float

    def to_json(self) -> dict[str, JSONValue]:
        document = dataclasses.asdict(self)
        document["functions"] = list(self.functions)
        return document


@dataclasses.dataclass(frozen=True, slots=True)
class SlotHold:
    """One of an action's K slots, held until released or, if its holder stops renewing it, expired."""

    action: str
    slot: int
    token: str
