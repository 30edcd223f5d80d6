"""The state envelope: one versioned, checksummed document that is the run's state of record.

::

    {"format": "longrun.state", "schema_version": 1, "checksum": "sha256:<hex>", "state": {...}}

The checksum is SHA-256 over the canonical JSON of ``state``, so any damage (a torn write, a
flipped bit, a hand edit) is detected on load rather than silently believed. ``decode`` either
returns a fully validated ``RunState`` or raises ``CorruptStateError`` (or its subclasses
``SchemaVersionError`` and ``ForeignStateError``); no ``JSONDecodeError``, ``KeyError`` or
``TypeError`` leaks out. It parses with ``canonical.parse_json`` (size limit ``MAX_STATE_BYTES``,
depth, strict UTF-8, no NaN), and refuses a field no record knows (see ``longrun._fields``).

``RunState`` is the runner's working copy: a mutable aggregate of frozen records. The stores
persist it by what changed: the JSON-file store as a journal line per commit and, now and then, a
whole snapshot; the SQL stores as the header (in this envelope, without the effects) and the
effect rows that changed. The JSON-file store wrote whole envelopes before it kept a journal, and
still reads them. Atomic replacement and backups are the stores' job, not this module's.

``PlanOutline`` is a declared plan's step ids and actions, recorded with the first revision (and
again when the plan grows), so that a reader knows how many steps remain before they are planned.
It is optional: states written before it, and durable functions' states, have none. The key
``plan_outline`` is written only when there is one, so such states encode exactly as before.
The same holds for ``progress`` and ``effect_latency`` (``longrun.telemetry``): what a run records
about itself for people and scrapers, state but not steps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from . import _fields as f
from .approval import ApprovalRequest
from .budget import BudgetCounters
from .canonical import MAX_JSON_DEPTH, JSONValue, canonical_bytes, json_too_deep, parse_json, sha256_hex
from .contract import Step, is_internal
from .deadline import TaskDeadline
from .failures import RunFailure
from .errors import CorruptStateError, ForeignStateError, InvalidInputError, SchemaVersionError, SizeLimitError
from .ledger import EffectRecord, EffectState
from .outcome import Evidence, Status
from .telemetry import EffectLatency, ProgressReport

__all__ = [
    "FORMAT", "MAX_STATE_BYTES", "SCHEMA_VERSION", "PlanOutline", "RunState", "check_loadable", "decode", "encode",
    "recorded_before_queued",
]  # fmt: skip

FORMAT = "longrun.state"
SCHEMA_VERSION = 1
MAX_STATE_BYTES = 256 * 1024 * 1024
MAX_CONTROL_OBSERVATIONS = 50
_STATE_FIELDS = frozenset(
    ("task_id", "plan_digest", "revision", "created_at", "updated_at", "status", "current_step", "next_action",
     "completed_steps", "effects", "budget", "approval_requests", "consumed_approvals", "control_observations",
     "unknowns", "lease", "reconcile_all", "plan_outline", "progress", "effect_latency", "last_failure", "deadline")
)  # fmt: skip
_OUTLINE_SPEC = (
    f.Field("steps", f.Kind.TUPLE, item=f.Kind.STEP),
    f.Field("actions", f.Kind.TUPLE, item=f.Kind.TEXT),
)
"""The one schema of a plan outline: what ``from_json`` reads and the constructor checks."""
_OUTLINE_FIELDS = frozenset(field.name for field in _OUTLINE_SPEC)


def _outline_problem(steps: tuple[str, ...], actions: tuple[str, ...]) -> str | None:
    """What is wrong with an outline whose fields each fit ``_OUTLINE_SPEC``, or None."""
    if len(actions) != len(steps):
        return f"field 'actions' holds {len(actions)} actions for {len(steps)} steps"
    if len(set(steps)) != len(steps):
        return "field 'steps' names a step id twice"
    if not all(actions):
        return "field 'actions' holds an empty action name"
    return None


@dataclass(frozen=True, slots=True)
class PlanOutline:
    """A declared plan as a reader needs it for progress: its step ids and each step's action, in
    plan order. As JSON, ``{"steps": [id, ...], "actions": [action, ...]}``."""

    steps: tuple[str, ...]
    actions: tuple[str, ...]
    """Parallel to ``steps``."""

    def __post_init__(self) -> None:
        f.check(_OUTLINE_SPEC, self, "plan outline")
        problem = _outline_problem(self.steps, self.actions)
        if problem is not None:
            raise InvalidInputError(f"plan outline: {problem}")

    @classmethod
    def of(cls, steps: Sequence[Step]) -> "PlanOutline":
        return cls(tuple(step.step_id for step in steps), tuple(step.action for step in steps))

    def __len__(self) -> int:
        return len(self.steps)

    def to_json(self) -> dict[str, JSONValue]:
        return {"steps": list(self.steps), "actions": list(self.actions)}

    @classmethod
    def from_json(cls, data: object) -> "PlanOutline":
        what = "plan outline"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _OUTLINE_FIELDS, what)
        values = f.read(_OUTLINE_SPEC, d, what)
        problem = _outline_problem(values["steps"], values["actions"])
        if problem is not None:
            raise CorruptStateError(f"{what}: {problem}")
        # Read with the very rules the constructor checks (a plan's every step id): built as read.
        outline = object.__new__(cls)
        for name, value in values.items():
            object.__setattr__(outline, name, value)
        return outline


_HEADER_SPEC = (
    f.Field("task_id", f.Kind.NAME),
    f.Field("plan_digest", f.Kind.TEXT),
    f.Field("created_at", f.Kind.NUMBER),
    f.Field("updated_at", f.Kind.NUMBER),
    f.Field("status", f.Kind.CHOICE, choices=Status),
    f.Field("current_step", f.Kind.TEXT, optional=True),
    f.Field("next_action", f.Kind.TEXT),
    f.Field("consumed_approvals", f.Kind.TEXTS),
    f.Field("reconcile_all", f.Kind.BOOL),
    f.Field("plan_outline", f.Kind.RECORD, optional=True, record=PlanOutline),
    f.Field("progress", f.Kind.RECORD, optional=True, record=ProgressReport),
    f.Field("effect_latency", f.Kind.RECORD, optional=True, record=EffectLatency),
    f.Field("last_failure", f.Kind.RECORD, optional=True, record=RunFailure),
    f.Field("deadline", f.Kind.RECORD, optional=True, record=TaskDeadline),
)
"""The state's own fields, as read (``from_json``) and as checked (``check_header``, ``validate``)."""
_SCALAR_SPEC = tuple(field for field in _HEADER_SPEC if field.kind is not f.Kind.TEXTS)
_REVISION = f.Field("revision", f.Kind.INT, minimum=1)
_LEASE_SPEC = (
    f.Field("owner", f.Kind.TEXT, optional=True),
    f.Field("epoch", f.Kind.INT),
    f.Field("expires_at", f.Kind.NUMBER, optional=True),
)
"""The state's copy of its lease, stored as ``{"lease": {...}}`` and held as ``lease_owner`` etc."""
_LEASE_ATTRIBUTES = tuple(dataclasses.replace(field, name="lease_" + field.name) for field in _LEASE_SPEC)
_LEASE_FIELDS = frozenset(field.name for field in _LEASE_SPEC)
_FAST_HEADER = f.fast_check((*_SCALAR_SPEC, *_LEASE_ATTRIBUTES))
_ENVELOPE_FIELDS = frozenset({"format", "schema_version", "checksum", "state"})


@dataclass
class RunState:
    """A task's state of record: what a store commits at each revision and a run recovers from.

    One aggregate per task: the plan digest it is pinned to, the budget counters, the status and
    next action, one ``EffectRecord`` per step (in plan order), the open approval requests and the
    approvals consumed, what control records and observations were seen, and the lease it was
    written under. Mutable (the runner's working copy); everything it holds is a frozen record.
    """

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
    plan_outline: PlanOutline | None = None
    """The declared plan's step ids and actions (None for a durable function, or a state written before it)."""
    progress: ProgressReport | None = None
    """What a durable function last reported with ``run.progress`` (None if it never did)."""
    effect_latency: EffectLatency | None = None
    """How long this task's verified effects took from an attempt's start, per action (None before the first)."""
    last_failure: RunFailure | None = None
    """The last failure of a durable function's run (its code raised, or its process died in a
    step; ``failures``), kept until the run ends ``done``. None when it never failed, and in states
    written before failures were recorded; the key is written only when there is one."""
    deadline: TaskDeadline | None = None
    """The task's wall-clock deadline (``longrun.deadline``), recorded by its first run when one is
    asked and kept across restarts. None when it has none, and in states written before deadlines;
    the key is written only when there is one."""

    def check_header(self) -> None:
        """Refuse (``InvalidInputError``) a state whose own fields the loader would refuse: what a
        commit checks, in time that does not grow with the ledger. The records it holds are frozen
        and checked when they are built (effect records: where their values enter; see ``ledger``),
        and the consumed approval ids come from checked approvals."""
        if not _FAST_HEADER(self):
            f.check((*_SCALAR_SPEC, *_LEASE_ATTRIBUTES), self, "state")

    def validate(self) -> None:
        """``check_header`` and every record's type and key: the whole state as ``from_json`` reads it."""
        self.check_header()
        f.check((*_HEADER_SPEC, _REVISION), self, "state")
        kinds = (
            ("budget", [self.budget], BudgetCounters),
            ("effects", list(self.effects.values()), EffectRecord),
            ("approval_requests", list(self.approval_requests.values()), ApprovalRequest),
            ("control_observations", self.control_observations, Evidence),
            ("unknowns", self.unknowns, Evidence),
        )
        for name, items, kind in kinds:
            for item in items:
                if not isinstance(item, kind):
                    raise InvalidInputError(f"state: field {name!r} must hold {kind.__name__} records, got {type(item).__name__}")
        for step_id, record in self.effects.items():
            if record.step_id != step_id:
                raise InvalidInputError(f"state: the effect record filed under {step_id!r} names step {record.step_id!r}")
        for step_id, request in self.approval_requests.items():
            if request.step_id != step_id:
                raise InvalidInputError(f"state: the approval request filed under {step_id!r} names step {request.step_id!r}")

    @property
    def completed_steps(self) -> list[str]:
        return [step_id for step_id, record in self.effects.items() if record.state is EffectState.VERIFIED]

    @property
    def observable_again(self) -> bool:
        """Whether everything a later revision of this task can record is an effect that its target
        can be asked about again: a declared plan (every record a user action). A durable function
        or a session also records what no target can show again (a call's answer, a person's answer,
        a timer's wake time, a child's link, a checkpoint), so a state of theirs rebuilt from an older
        revision would lose records for good (see ``stores.base``, invariant 7)."""
        if not self.effects:
            return self.plan_outline is not None
        return not any(is_internal(record.action) for record in self.effects.values())

    def note_control(self, evidence: Evidence) -> None:
        self.control_observations.append(evidence)
        del self.control_observations[:-MAX_CONTROL_OBSERVATIONS]

    def to_json(self) -> dict[str, JSONValue]:
        body: dict[str, JSONValue] = {
            "task_id": self.task_id,
            "plan_digest": self.plan_digest,
            "revision": self.revision,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "status": self.status.value,
            "current_step": self.current_step,
            "next_action": self.next_action,
            "completed_steps": list(self.completed_steps),
            "effects": [record.to_json() for record in self.effects.values()],
            "budget": self.budget.to_json(),
            "approval_requests": [request.to_json() for request in self.approval_requests.values()],
            "consumed_approvals": [approval_id for approval_id in self.consumed_approvals],
            "control_observations": [item.to_json() for item in self.control_observations],
            "unknowns": [item.to_json() for item in self.unknowns],
            "lease": {"owner": self.lease_owner, "epoch": self.lease_epoch, "expires_at": self.lease_expires_at},
            "reconcile_all": self.reconcile_all,
        }
        if self.plan_outline is not None:
            body["plan_outline"] = self.plan_outline.to_json()
        if self.progress is not None:
            body["progress"] = self.progress.to_json()
        if self.effect_latency is not None:
            body["effect_latency"] = self.effect_latency.to_json()
        if self.last_failure is not None:
            body["last_failure"] = self.last_failure.to_json()
        if self.deadline is not None:
            body["deadline"] = self.deadline.to_json()
        return body

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
        header = f.read(_HEADER_SPEC, d, what)
        [revision] = f.read((_REVISION,), d, what).values()
        owner, epoch, expires_at = f.read(_LEASE_SPEC, lease, "state lease").values()
        state = cls(
            **header,
            budget=BudgetCounters.from_json(d.get("budget")),
            revision=revision,
            effects=effects,
            approval_requests=requests,
            control_observations=[Evidence.from_json(item) for item in f.get_list(d, "control_observations", what)],
            unknowns=[Evidence.from_json(item) for item in f.get_list(d, "unknowns", what)],
            lease_owner=owner,
            lease_epoch=epoch,
            lease_expires_at=expires_at,
        )
        if list(f.get_str_list(d, "completed_steps", what)) != state.completed_steps:
            raise CorruptStateError("state: completed_steps disagrees with the effect records")
        return state


def recorded_before_queued(state: RunState) -> bool:
    """Whether ``state`` is a task recorded for a worker (``fn.start``) by a version that recorded it
    ``running`` rather than ``queued``, and never run since: it reads as ``queued``, and no run of it
    died. (A durable function's first run records another next action, so its state is not this.)"""
    return (
        state.status is Status.RUNNING
        and state.revision == 1
        and state.budget.attempts_total == 0
        and state.next_action == "start the first step"
    )


_ENVELOPE_HEAD = b'{"checksum":"sha256:'
_ENVELOPE_MIDDLE = b'",' + canonical_bytes({"format": FORMAT, "schema_version": SCHEMA_VERSION})[1:-1] + b',"state":'


def encode(state: RunState, *, record_json: Callable[[EffectRecord], JSONValue] | None = None) -> bytes:
    """The envelope of ``state``; ``record_json``, if given, writes each effect record (a store
    that keeps large values apart writes them as references, see ``stores.blobs``)."""
    body = state.to_json()
    if record_json is not None:
        body["effects"] = [record_json(record) for record in state.effects.values()]
    encoded = canonical_bytes(body, what="state")
    # The envelope's canonical encoding, with the body's encoding spliced in rather than made
    # twice: its keys sort as written here, "state" last (a test holds it equal to canonical_bytes).
    return b"".join((_ENVELOPE_HEAD, sha256_hex(encoded).encode("ascii"), _ENVELOPE_MIDDLE, encoded, b"}\n"))


def check_loadable(data: bytes, what: str) -> None:
    """Refuse to write stored JSON that no load reads back: nested deeper than ``MAX_JSON_DEPTH``
    (``InvalidInputError``) or longer than ``MAX_STATE_BYTES`` (``SizeLimitError``). A store calls
    it on what it is about to write, before its first write."""
    if json_too_deep(data):
        raise InvalidInputError(f"{what} would nest deeper than {MAX_JSON_DEPTH} levels, which no load reads")
    if len(data) > MAX_STATE_BYTES:
        raise SizeLimitError(
            f"{what} would be {len(data)} bytes encoded, over {MAX_STATE_BYTES}, the most a load reads "
            "(MAX_STATE_BYTES); nothing was written. Keep large payloads and results outside the state",
            size=len(data),
            limit=MAX_STATE_BYTES,
            limit_name="MAX_STATE_BYTES",
        )


def decode(data: bytes, *, expected_task: str | None = None, resolve: Callable[[object], object] | None = None) -> RunState:
    """Validate and parse envelope bytes; raise ``CorruptStateError`` (or a subclass) on any defect.
    ``resolve``, if given, turns each stored effect record into what ``EffectRecord.from_json``
    reads (after the checksum is checked; see ``encode``)."""
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
    if resolve is not None and isinstance(body, dict) and isinstance(body.get("effects"), list):
        body = {**body, "effects": [resolve(raw) for raw in body["effects"]]}
    state = RunState.from_json(body)
    if expected_task is not None and state.task_id != expected_task:
        raise ForeignStateError(f"state belongs to task {state.task_id!r}, not {expected_task!r}")
    return state
