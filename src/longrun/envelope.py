"""The state envelope: one versioned, checksummed document that is the run's state of record.

::

    {"format": "longrun.state", "schema_version": 1, "checksum": "sha256:<hex>", "state": {...}}

The checksum is SHA-256 over the canonical JSON of ``state``, so any damage (a torn write, a
flipped bit, a hand edit) is detected on load rather than silently believed. ``decode`` either
returns a fully validated ``RunState`` or raises ``CorruptStateError`` (or its subclasses
``SchemaVersionError`` and ``ForeignStateError``); no ``JSONDecodeError``, ``KeyError`` or
``TypeError`` leaks out. It parses with ``canonical.parse_json`` (size limit ``MAX_STATE_BYTES``,
depth, strict UTF-8, no NaN), and refuses a field no record knows (see ``longrun._fields``).

``RunState`` is the runner's working copy: a mutable aggregate of frozen records. Stores persist
it whole (the JSON-file store) or by the records that changed. Atomic replacement and the backup
are the store's job, not this module's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import _fields as f
from .approval import ApprovalRequest
from .budget import BudgetCounters
from .canonical import JSONValue, canonical_bytes, parse_json, sha256_hex
from .errors import CorruptStateError, ForeignStateError, SchemaVersionError
from .ledger import EffectRecord, EffectState
from .outcome import Evidence, Status

__all__ = ["FORMAT", "MAX_STATE_BYTES", "SCHEMA_VERSION", "RunState", "decode", "encode"]

FORMAT = "longrun.state"
SCHEMA_VERSION = 1
MAX_STATE_BYTES = 256 * 1024 * 1024
MAX_CONTROL_OBSERVATIONS = 50
_STATE_FIELDS = frozenset(
    ("task_id", "plan_digest", "revision", "created_at", "updated_at", "status", "current_step", "next_action",
     "completed_steps", "effects", "budget", "approval_requests", "consumed_approvals", "control_observations",
     "unknowns", "lease", "reconcile_all")
)  # fmt: skip
_LEASE_FIELDS = frozenset({"owner", "epoch", "expires_at"})
_ENVELOPE_FIELDS = frozenset({"format", "schema_version", "checksum", "state"})


@dataclass
class RunState:
    task_id: str
    plan_digest: str
    budget: BudgetCounters
    revision: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    status: Status = Status.RUNNING
    current_step: str | None = None
    next_action: str = ""
    effects: dict[str, EffectRecord] = field(default_factory=dict)
    """Keyed by step id, in plan order."""
    approval_requests: dict[str, ApprovalRequest] = field(default_factory=dict)
    consumed_approvals: list[str] = field(default_factory=list)
    control_observations: list[Evidence] = field(default_factory=list)
    unknowns: list[Evidence] = field(default_factory=list)
    lease_owner: str | None = None
    lease_epoch: int = 0
    lease_expires_at: float | None = None
    reconcile_all: bool = False
    """Set when the state was recovered from a backup: every unverified step is observed before it is applied."""

    @property
    def completed_steps(self) -> list[str]:
        return [step_id for step_id, record in self.effects.items() if record.state is EffectState.VERIFIED]

    def note_control(self, evidence: Evidence) -> None:
        self.control_observations.append(evidence)
        del self.control_observations[:-MAX_CONTROL_OBSERVATIONS]

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "task_id": self.task_id,
            "plan_digest": self.plan_digest,
            "revision": self.revision,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "status": self.status.value,
            "current_step": self.current_step,
            "next_action": self.next_action,
            "completed_steps": [step_id for step_id in self.completed_steps],
            "effects": [record.to_json() for record in self.effects.values()],
            "budget": self.budget.to_json(),
            "approval_requests": [request.to_json() for request in self.approval_requests.values()],
            "consumed_approvals": [approval_id for approval_id in self.consumed_approvals],
            "control_observations": [item.to_json() for item in self.control_observations],
            "unknowns": [item.to_json() for item in self.unknowns],
            "lease": {"owner": self.lease_owner, "epoch": self.lease_epoch, "expires_at": self.lease_expires_at},
            "reconcile_all": self.reconcile_all,
        }

    @classmethod
    def from_json(cls, data: object) -> "RunState":
        what = "state"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _STATE_FIELDS, what)
        effects: dict[str, EffectRecord] = {}
        for raw in f.get_list(d, "effects", what):
            record = EffectRecord.from_json(raw)
            if record.step_id in effects:
                raise CorruptStateError(f"state: step {record.step_id!r} has two effect records")
            effects[record.step_id] = record
        requests = {}
        for raw in f.get_list(d, "approval_requests", what):
            request = ApprovalRequest.from_json(raw)
            requests[request.step_id] = request
        lease = f.require_mapping(d.get("lease"), "state lease")
        f.check_fields(lease, _LEASE_FIELDS, "state lease")
        state = cls(
            task_id=f.get_id(d, "task_id", what),
            plan_digest=f.get_str(d, "plan_digest", what),
            budget=BudgetCounters.from_json(d.get("budget")),
            revision=f.get_int(d, "revision", what, minimum=1),
            created_at=f.get_float(d, "created_at", what),
            updated_at=f.get_float(d, "updated_at", what),
            status=f.get_enum(d, "status", what, Status),
            current_step=f.get_str(d, "current_step", what, optional=True),
            next_action=f.get_str(d, "next_action", what),
            effects=effects,
            approval_requests=requests,
            consumed_approvals=list(f.get_str_list(d, "consumed_approvals", what)),
            control_observations=[Evidence.from_json(item) for item in f.get_list(d, "control_observations", what)],
            unknowns=[Evidence.from_json(item) for item in f.get_list(d, "unknowns", what)],
            lease_owner=f.get_str(lease, "owner", "state lease", optional=True),
            lease_epoch=f.get_int(lease, "epoch", "state lease"),
            lease_expires_at=f.get_float(lease, "expires_at", "state lease", optional=True),
            reconcile_all=f.get_bool(d, "reconcile_all", what),
        )
        if list(f.get_str_list(d, "completed_steps", what)) != state.completed_steps:
            raise CorruptStateError("state: completed_steps disagrees with the effect records")
        return state


def encode(state: RunState) -> bytes:
    body = state.to_json()
    return canonical_bytes(
        {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "checksum": "sha256:" + sha256_hex(canonical_bytes(body)),
            "state": body,
        }
    ) + b"\n"


def decode(data: bytes, *, expected_task: str | None = None) -> RunState:
    """Validate and parse envelope bytes; raise ``CorruptStateError`` (or a subclass) on any defect."""
    document = parse_json(data, what="state", max_bytes=MAX_STATE_BYTES)
    envelope = f.require_mapping(document, "state envelope")
    if envelope.get("format") != FORMAT:
        raise CorruptStateError(f"not a longrun state envelope (format {envelope.get('format')!r:.40})")
    version = envelope.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise SchemaVersionError(
            f"state schema version {version!r:.20} is not supported (this code reads version {SCHEMA_VERSION})"
        )
    f.check_fields(envelope, _ENVELOPE_FIELDS, "state envelope")
    body = envelope.get("state")
    checksum = envelope.get("checksum")
    try:
        actual = "sha256:" + sha256_hex(canonical_bytes(body))
    except (TypeError, ValueError, RecursionError) as exc:
        raise CorruptStateError(f"state body cannot be re-encoded: {exc}") from exc
    if checksum != actual:
        raise CorruptStateError("state checksum does not match its content")
    state = RunState.from_json(body)
    if expected_task is not None and state.task_id != expected_task:
        raise ForeignStateError(f"state belongs to task {state.task_id!r}, not {expected_task!r}")
    return state
