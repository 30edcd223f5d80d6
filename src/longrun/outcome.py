"""What a run returns: one status, one safe next action, results, and the evidence split three ways.

``observations`` are things actually read (state bytes and their digest, receipts, target
observations, control records), each with its source and time. ``inferences`` are conclusions the
runner drew from them. ``unknowns`` are what it could not establish: unverified outcomes, stale
authority, ambiguous ownership. An operator reading an outcome can tell which is which.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import _fields as f
from .canonical import JSONValue, printable
from .failures import RunFailure

__all__ = ["ENDED_UNFINISHED", "Evidence", "PendingRequest", "RunOutcome", "Status", "TERMINAL", "WAITING"]


class Status(str, enum.Enum):
    RUNNING = "running"
    DONE = "done"
    AWAITING_APPROVAL = "awaiting-approval"
    CANCELLED = "cancelled"
    ALREADY_RUNNING = "already-running"
    RETRY_SCHEDULED = "retry-scheduled"
    LIMITS_EXHAUSTED = "limits-exhausted"
    BLOCKED = "blocked"
    UNSAFE_TO_CONTINUE = "unsafe-to-continue"
    STATE_UNRECOVERABLE = "state-unrecoverable"
    PLAN_MISMATCH = "plan-mismatch"
    LEASE_LOST = "lease-lost"
    SLEEPING = "sleeping"
    AWAITING_INPUT = "awaiting-input"
    WAITING_ON_CHILD = "waiting-on-child"
    FAILED = "failed"
    """The durable function failed ``Limits.max_failures`` times in a row (its code raised, or its
    process died inside a step): final until an operator reopens it (``RunState.last_failure`` says why)."""
    DEADLINE_EXCEEDED = "deadline-exceeded"
    """The task's wall-clock deadline (``RunState.deadline``) passed: it stopped after settling the
    effects in flight, and its unfinished children were cancelled. Final until an operator reopens it."""
    QUEUED = "queued"
    """Recorded (``fn.start``, ``fn.enqueue``) and not started yet: a worker or a resume starts it."""

    def __str__(self) -> str:
        return self.value


TERMINAL = frozenset(
    {Status.DONE, Status.CANCELLED, Status.LIMITS_EXHAUSTED, Status.BLOCKED, Status.FAILED, Status.DEADLINE_EXCEEDED}
)
"""Statuses recorded as final: running the task again changes nothing."""

ENDED_UNFINISHED = TERMINAL - {Status.DONE}
"""Final statuses other than ``done``: the run is over without its work finished."""

WAITING = frozenset(
    {Status.AWAITING_APPROVAL, Status.AWAITING_INPUT, Status.RETRY_SCHEDULED, Status.SLEEPING, Status.WAITING_ON_CHILD}
)
"""Statuses in which the run waits on something outside it (a person, a timer, another task). Waiting
is not work: a run that only found it must go on waiting charges nothing to the time budgets."""


_EVIDENCE_SPEC = (f.Field("source", f.Kind.TEXT), f.Field("detail", f.Kind.TEXT), f.Field("at", f.Kind.NUMBER))
_EVIDENCE_FIELDS = frozenset(field.name for field in _EVIDENCE_SPEC)
_FAST_EVIDENCE = f.fast_check(_EVIDENCE_SPEC)


@dataclass(frozen=True, slots=True)
class Evidence:
    """One thing read or concluded, with its source and time. ``source`` and ``detail`` are
    diagnostic text: a lone surrogate in them (from a file name or an exception message) is kept
    as its ``\\udcXX`` escape, so that an evidence record can always be stored and read back."""

    source: str
    detail: str
    at: float

    def __post_init__(self) -> None:
        if _FAST_EVIDENCE(self):
            return
        source, detail = self.source, self.detail
        if isinstance(source, str):
            object.__setattr__(self, "source", printable(source))
        if isinstance(detail, str):
            object.__setattr__(self, "detail", printable(detail))
        f.check(_EVIDENCE_SPEC, self, "evidence record")

    def to_json(self) -> dict[str, JSONValue]:
        return {"source": self.source, "detail": self.detail, "at": self.at}

    @classmethod
    def from_json(cls, data: object) -> "Evidence":
        what = "evidence record"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _EVIDENCE_FIELDS, what)
        return cls(**f.read(_EVIDENCE_SPEC, d, what))

    def __str__(self) -> str:
        return f"[{self.source} @ {self.at:.3f}] {self.detail}"


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """A request the run waits for a person to answer: an approval of one effect, or a question.

    ``kind`` is ``"approval"`` (answer with ``longrun approve`` or ``Approval.for_request``) or
    ``"question"`` (``run.ask``; answer with ``longrun answer``). An approval or answer binds the
    task, ``plan_digest``, ``step_id``, ``payload_digest`` and ``action`` exactly, and counts only
    until ``expires_at`` (after which the next run asks again, with a new expiry). ``payload`` is the
    effect's payload as recorded (for a question, ``{"question": ..., "choices": ...}``);
    ``question`` and ``choices`` are set for a question only (``choices`` None when any answer goes).
    """

    kind: str
    step_id: str
    action: str
    payload: Mapping[str, JSONValue]
    payload_digest: str
    plan_digest: str
    requested_at: float
    expires_at: float
    question: str | None = None
    choices: tuple[JSONValue, ...] | None = None

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "kind": self.kind,
            "step_id": self.step_id,
            "action": self.action,
            "payload": dict(self.payload),
            "payload_digest": self.payload_digest,
            "plan_digest": self.plan_digest,
            "requested_at": self.requested_at,
            "expires_at": self.expires_at,
            "question": self.question,
            "choices": None if self.choices is None else list(self.choices),
        }


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What one run returned: its status, the one safe next action, the results of the verified
    steps, and the evidence (observations, inferences, unknowns; see the module docstring)."""

    status: Status
    next_action: str
    task_id: str
    results: Mapping[str, JSONValue] = field(default_factory=dict)
    observations: tuple[Evidence, ...] = ()
    inferences: tuple[Evidence, ...] = ()
    unknowns: tuple[Evidence, ...] = ()
    revision: int = 0
    epoch: int = 0
    result: JSONValue = None
    """A durable function's return value once it is ``done`` (None for a declared plan)."""
    wake_at: float | None = None
    """When a waiting run (backoff, timer) may continue, if a time is known."""
    pending: tuple[PendingRequest, ...] = ()
    """The approvals and questions the run waits for, in the order they were asked (empty when
    nothing waits for a person)."""
    last_failure: RunFailure | None = None
    """The task's last recorded failure (its code raised, or its process died in a step), if the
    task has one: the error, how many failures in a row, when it runs again (``retry_at``)."""

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "status": self.status.value,
            "next_action": self.next_action,
            "task_id": self.task_id,
            "results": dict(self.results),
            "observations": [item.to_json() for item in self.observations],
            "inferences": [item.to_json() for item in self.inferences],
            "unknowns": [item.to_json() for item in self.unknowns],
            "revision": self.revision,
            "epoch": self.epoch,
            "result": self.result,
            "wake_at": self.wake_at,
            "pending": [request.to_json() for request in self.pending],
            "last_failure": None if self.last_failure is None else self.last_failure.to_json(),
        }
