"""Cancellation: an operator's request that a run start no new effect.

The runner reads the cancellation record fresh from the store before every new effect and right
after recovery; it never caches it. An effect already in flight is still reconciled by observation,
but nothing new starts, and the run ends ``cancelled`` (terminal, recorded in the state).

A record that cannot be parsed, or names another task, is damaged intent to stop: the run starts
nothing new and stops ``unsafe-to-continue`` (not terminal), so nobody's unreadable record ends a
run for good. A record may carry a ``signature`` over ``signed_fields()``; when the runner is
configured to authenticate cancellations (``longrun.authority``), a record that does not verify is
treated the same way: the run stops ``unsafe-to-continue`` instead of ending on a forger's word.

A record carries ``schema_version`` (not signed); one without it (written before it existed) is
read as version 1, one with any other version is refused (``SchemaVersionError``), like a field
the record does not know (see ``longrun._fields``).

Not guaranteed: that an adapter call already running is interrupted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from . import _fields as f
from .canonical import JSONValue
from .control import ControlRecord, RefusedRecord
from .errors import CorruptStateError

__all__ = ["Cancellation", "CancellationJudgement", "judge_cancellation"]


_SPEC = (
    f.Field("task_id", f.Kind.NAME),
    f.Field("requested_at", f.Kind.NUMBER),
    f.Field("requested_by", f.Kind.TEXT),
    f.Field("reason", f.Kind.TEXT),
    f.Field("signature", f.Kind.TEXT, optional=True),
)
_FIELDS = frozenset({"schema_version", *(field.name for field in _SPEC)})
_FAST = f.fast_check(_SPEC)


@dataclass(frozen=True, slots=True)
class Cancellation:
    task_id: str
    requested_at: float
    requested_by: str
    reason: str
    signature: str | None = None
    """``hmac-sha256:<key id>:<mac>`` over ``signed_fields()``, or None (see ``longrun.authority``)."""

    def __post_init__(self) -> None:
        if not _FAST(self):
            f.check(_SPEC, self, "cancellation record")

    def signed_fields(self) -> dict[str, JSONValue]:
        """Every field but the signature, as a signature covers them (the time always as a float)."""
        return {
            "task_id": self.task_id,
            "requested_at": float(self.requested_at),
            "requested_by": self.requested_by,
            "reason": self.reason,
        }

    def to_json(self) -> dict[str, JSONValue]:
        body: dict[str, JSONValue] = {
            "schema_version": f.RECORD_SCHEMA_VERSION,
            "task_id": self.task_id,
            "requested_at": self.requested_at,
            "requested_by": self.requested_by,
            "reason": self.reason,
        }
        if self.signature is not None:
            body["signature"] = self.signature
        return body

    @classmethod
    def from_json(cls, data: object) -> "Cancellation":
        what = "cancellation record"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _FIELDS, what)
        f.check_record_version(d, what)
        return cls(**f.read(_SPEC, d, what))


@dataclass(frozen=True, slots=True)
class CancellationJudgement:
    """What a cancellation record read fresh means for a run: the one rule, for the engine and ``verify``.

    ``verdict``: ``"none"`` (no record: new effects may start), ``"cancelled"`` (an operator's valid
    record for this task: start nothing, end the run ``cancelled``), ``"refused"`` (a source would not
    vouch for it) or ``"damaged"`` (unreadable, malformed, or for another task): both of these start
    nothing and stop ``unsafe-to-continue``, since nobody's unverifiable word ends a run for good.
    """

    verdict: str
    record: Cancellation | None = None
    problem: str | None = None


def judge_cancellation(raw: ControlRecord | None, task_id: str) -> CancellationJudgement:
    if raw is None:
        return CancellationJudgement("none")
    if isinstance(raw, RefusedRecord):
        return CancellationJudgement("refused", problem=f"cancellation record {raw.name} was refused ({raw.error})")
    if raw.error is not None:
        return CancellationJudgement("damaged", problem=f"cancellation record {raw.name} is damaged ({raw.error})")
    try:
        record = Cancellation.from_json(raw.body)
    except CorruptStateError as exc:
        return CancellationJudgement("damaged", problem=f"cancellation record {raw.name} is malformed ({exc})")
    if record.task_id != task_id:
        return CancellationJudgement("damaged", record, f"cancellation record {raw.name} names task {record.task_id!r}")
    return CancellationJudgement("cancelled", record)
