"""The effect ledger: one record per side effect, and the only legal moves between its states.

Lifecycle::

    planned -> started -> acknowledged -> verified
                       -> uncertain    -> verified
    started/acknowledged/uncertain -> planned   (observed absent: a retry is allowed)
    planned/started -> failed                   (the adapter raised PermanentError)
    planned -> uncertain                        (a start may be lost or made elsewhere: observe it)

Guarantees this module enforces: a record changes only by ``EffectRecord.move``, which refuses any
move not drawn above, so a verified effect can never go back to planned and be applied again.
``started`` carries the attempt number, the payload digest and the fencing epoch of the writer.
Not guaranteed here: durability. The runner commits records through a store before and after
each adapter call; this module only says which records are legal.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Any, Mapping

from . import _fields as f
from .budget import Backoff
from .canonical import JSONValue
from .errors import CorruptStateError, LongrunError

__all__ = ["EffectRecord", "EffectState", "IllegalTransitionError"]


class EffectState(str, enum.Enum):
    PLANNED = "planned"
    STARTED = "started"
    ACKNOWLEDGED = "acknowledged"
    UNCERTAIN = "uncertain"
    VERIFIED = "verified"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


_MOVES: dict[EffectState, frozenset[EffectState]] = {
    # planned -> uncertain only to observe before an apply: the state came from a backup (a lost revision
    # may have started it), or it is the first apply of a run or of an ``observe_first`` step.
    EffectState.PLANNED: frozenset({EffectState.STARTED, EffectState.FAILED, EffectState.UNCERTAIN}),
    EffectState.STARTED: frozenset(
        {EffectState.ACKNOWLEDGED, EffectState.UNCERTAIN, EffectState.VERIFIED, EffectState.PLANNED, EffectState.FAILED}
    ),
    EffectState.ACKNOWLEDGED: frozenset({EffectState.VERIFIED, EffectState.UNCERTAIN, EffectState.PLANNED}),
    EffectState.UNCERTAIN: frozenset({EffectState.VERIFIED, EffectState.PLANNED}),
    EffectState.VERIFIED: frozenset(),
    EffectState.FAILED: frozenset(),
}

IN_FLIGHT = frozenset({EffectState.STARTED, EffectState.ACKNOWLEDGED, EffectState.UNCERTAIN})
"""States whose outcome at the target is not yet known to the ledger: reconcile before anything else."""


_FIELDS = frozenset(
    ("key", "step_id", "action", "payload", "payload_digest", "state", "attempts", "epoch", "result", "cost", "receipt",
     "evidence", "last_error", "not_before", "approval_id", "updated_at", "backoff")
)  # fmt: skip


class IllegalTransitionError(LongrunError):
    """A ledger move that the lifecycle does not allow; a bug in the caller, never retried."""


@dataclass(frozen=True, slots=True)
class EffectRecord:
    key: str
    step_id: str
    action: str
    payload: dict[str, JSONValue]
    payload_digest: str
    state: EffectState = EffectState.PLANNED
    attempts: int = 0
    epoch: int = 0
    """The fencing epoch under which the latest attempt started."""
    result: JSONValue = None
    cost: float = 0.0
    receipt: str | None = None
    """The adapter's acknowledgement evidence for the latest attempt, if it returned one."""
    evidence: str | None = None
    """What observation said about the effect, latest first."""
    last_error: str | None = None
    not_before: float | None = None
    """Wall-clock time before which the next attempt does not start, as scheduled (see ``backoff``)."""
    approval_id: str | None = None
    updated_at: float = 0.0
    backoff: Backoff | None = None
    """The wait ``not_before`` was scheduled as, anchored on the clocks it began by: how a later run
    judges it (``Backoff.remaining``). None in records written before backoffs kept their duration."""

    def move(self, state: EffectState, at: float, **changes: Any) -> "EffectRecord":
        if state not in _MOVES[self.state]:
            raise IllegalTransitionError(f"effect {self.key!r}: {self.state.value} -> {state.value} is not allowed")
        return self.with_changes(state=state, updated_at=at, **changes)

    def with_changes(self, **changes: Any) -> "EffectRecord":
        """``dataclasses.replace`` without its per-call introspection: this is on every effect's path.

        Only field names are accepted; values are not re-validated (records are built from checked
        parts, and ``from_json`` validates what is read back).
        """
        unknown = changes.keys() - _FIELD_NAMES
        if unknown:
            raise TypeError(f"EffectRecord has no field(s) {sorted(unknown)}")
        copy = object.__new__(EffectRecord)
        for name in _FIELD_ORDER:
            object.__setattr__(copy, name, changes[name] if name in changes else getattr(self, name))
        return copy

    @property
    def in_flight(self) -> bool:
        return self.state in IN_FLIGHT

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "key": self.key,
            "step_id": self.step_id,
            "action": self.action,
            "payload": self.payload,
            "payload_digest": self.payload_digest,
            "state": self.state.value,
            "attempts": self.attempts,
            "epoch": self.epoch,
            "result": self.result,
            "cost": self.cost,
            "receipt": self.receipt,
            "evidence": self.evidence,
            "last_error": self.last_error,
            "not_before": self.not_before,
            "approval_id": self.approval_id,
            "updated_at": self.updated_at,
            "backoff": self.backoff.to_json() if self.backoff is not None else None,
        }

    @classmethod
    def from_json(cls, data: object) -> "EffectRecord":
        what = "effect record"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _FIELDS, what)
        payload = d.get("payload")
        if not isinstance(payload, dict):
            raise CorruptStateError(f"{what}: field 'payload' must be a JSON object")
        return cls(
            key=f.get_str(d, "key", what),
            step_id=f.get_step_id(d, "step_id", what),
            action=f.get_str(d, "action", what),
            payload=payload,
            payload_digest=f.get_str(d, "payload_digest", what),
            state=f.get_enum(d, "state", what, EffectState),
            attempts=f.get_int(d, "attempts", what),
            epoch=f.get_int(d, "epoch", what),
            result=d.get("result"),
            cost=f.get_float(d, "cost", what),
            receipt=f.get_str(d, "receipt", what, optional=True),
            evidence=f.get_str(d, "evidence", what, optional=True),
            last_error=f.get_str(d, "last_error", what, optional=True),
            not_before=f.get_float(d, "not_before", what, optional=True),
            approval_id=f.get_str(d, "approval_id", what, optional=True),
            updated_at=f.get_float(d, "updated_at", what),
            backoff=Backoff.from_json(backoff) if (backoff := d.get("backoff")) is not None else None,
        )


_FIELD_ORDER = tuple(field.name for field in fields(EffectRecord))
_FIELD_NAMES = frozenset(_FIELD_ORDER)
