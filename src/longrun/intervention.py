"""An operator's interventions in a task, as control records: the outcome of an uncertain effect as
a person saw it (``resolve``), and the reopening of a task that ended unfinished (``reopen``).

Both travel as ``approval.Approval`` records with an action of their own (``RESOLVE_ACTION``,
``REOPEN_ACTION``) and their details in ``answer``. So they go through every control source an
approval goes through (the store, a strict ``FileControlSource``, ``SignedApprovals``, whose
signature covers every field, the details included); each record's id is used once (the engine
records it among the state's consumed approvals in the commit that acts on it); and the approval
gate never takes one for the approval of an effect (its action is not the effect's action).

A **resolution** binds the task, the plan digest, the step, the effect's key and its payload
digest. The engine acts on it at the start of the next run, before it observes anything, and only
while that effect is in flight (started, acknowledged or uncertain): ``applied`` makes the effect
verified (with ``result`` as its recorded result when one is given, else the one recorded), so it
is never applied again; ``absent`` plans it again, so the run applies it again. The person's word
is recorded as an observation (source ``person:<name>``, the time it was given, the evidence text)
in the outcome, in the effect record's evidence and among the control records the state keeps,
which ``longrun history`` shows.

A **fork** (``DurableFunction.fork``) is recorded in both tasks: the fork's function record names its
origin (``forked_from``: the task and the step it starts at; ``origin_of``), and the origin holds a
verified record of its own per fork (step id ``FORK_PREFIX`` + the fork's task id, action
``FORK_ACTION``; ``forks_of``).

A **reopen** binds the task, the plan digest, the status it reopens and the revision that recorded
that status: a reopen written for one ending does not reopen a later one. The engine acts on it
when a run finds the task in that status (``REOPENABLE``: every terminal status but ``done``): the
run goes on, with ``add_attempts`` more attempts for every effect not verified (and for the run's
step budget; an effect that failed for good is planned again) and ``add_time_s`` more seconds of
work under both time limits. A cancelled task's cancellation record is superseded: its digest is
kept among the consumed records (``superseded_cancellation``), so that the same record, still in
the control area, never cancels the task again; a new cancellation (other bytes) does.

Not guaranteed here: who the person is (the name is what the writer says, as for an approval; a
signature shows that the writer held the key), nor that what they saw at the target was so.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol

from . import _fields as f
from .approval import Approval
from .canonical import JSONValue, digest_of, ensure_json
from .contract import INTERNAL_PREFIX
from .control import ControlRecord
from .envelope import RunState
from .errors import CorruptStateError, InvalidInputError, ReopenRefusedError, ResolveRefusedError, UnknownStepError, UnknownTaskError
from .ledger import EffectRecord
from .outcome import ENDED_UNFINISHED, Status
from .protocols import Store

__all__ = [
    "ABSENT",
    "APPLIED",
    "FORK_ACTION",
    "FORK_PREFIX",
    "INTERVENTION_TTL_S",
    "REOPENABLE",
    "REOPEN_ACTION",
    "REOPEN_STEP",
    "RESOLVE_ACTION",
    "ApprovalWriter",
    "Signer",
    "Reopen",
    "Resolution",
    "reopen",
    "resolve",
    "find_reopen",
    "forks_of",
    "origin_of",
    "find_resolution",
    "reopen_approval",
    "resolution_approval",
    "superseded_cancellation",
]

RESOLVE_ACTION = INTERNAL_PREFIX + "resolve"
"""The action of a resolution record (its step id is the effect's)."""
REOPEN_ACTION = INTERNAL_PREFIX + "reopen"
"""The action of a reopen record."""
REOPEN_STEP = INTERNAL_PREFIX + "reopen"
"""The step id a reopen record names (it concerns the whole task, no step)."""
APPLIED = "applied"
ABSENT = "absent"
INTERVENTION_TTL_S = 7 * 86_400.0
"""How long a resolution or a reopen counts, unless the writer says otherwise."""
MAX_EVIDENCE_CHARS = 4000

FORK_ACTION = INTERNAL_PREFIX + "fork"
FORK_PREFIX = INTERNAL_PREFIX + "fork/"
"""The step id of an origin's record of one fork is this prefix and the fork's task id."""

REOPENABLE = ENDED_UNFINISHED
"""The statuses a reopen takes a task out of: every terminal status but ``done``."""

_SUPERSEDED = "cancellation:"

_RESOLUTION_SPEC = (
    f.Field("outcome", f.Kind.TEXT),
    f.Field("key", f.Kind.TEXT),
    f.Field("evidence", f.Kind.TEXT),
    f.Field("result", f.Kind.JSON),
)
_RESOLUTION_FIELDS = frozenset(field.name for field in _RESOLUTION_SPEC)
_REOPEN_SPEC = (
    f.Field("status", f.Kind.TEXT),
    f.Field("revision", f.Kind.INT),
    f.Field("reason", f.Kind.TEXT),
    f.Field("add_attempts", f.Kind.INT),
    f.Field("add_time_s", f.Kind.NUMBER),
)
_REOPEN_FIELDS = frozenset(field.name for field in _REOPEN_SPEC)


def _text(value: str, what: str) -> None:
    if not value.strip():
        raise InvalidInputError(f"{what} must not be empty")
    if len(value) > MAX_EVIDENCE_CHARS:
        raise InvalidInputError(f"{what} is {len(value)} characters, over the limit of {MAX_EVIDENCE_CHARS}")


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a person found at the target for one effect: ``outcome`` is ``"applied"`` or
    ``"absent"``; ``key`` the effect's key; ``evidence`` what they checked; ``result`` the result
    to record for an applied effect (None: keep the one recorded)."""

    outcome: str
    key: str
    evidence: str
    result: JSONValue = None

    def __post_init__(self) -> None:
        f.check(_RESOLUTION_SPEC, self, "resolution")
        if self.outcome not in (APPLIED, ABSENT):
            raise InvalidInputError(f"a resolution's outcome is {APPLIED!r} or {ABSENT!r}, not {self.outcome!r}")
        _text(self.evidence, "a resolution's evidence")
        if self.outcome == ABSENT and self.result is not None:
            raise InvalidInputError("a result is recorded only for an effect that was applied, not for one found absent")
        ensure_json(self.result, what="the resolution's result")

    def to_json(self) -> dict[str, JSONValue]:
        return {"outcome": self.outcome, "key": self.key, "evidence": self.evidence, "result": self.result}

    @classmethod
    def from_json(cls, data: object) -> "Resolution":
        what = "resolution"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _RESOLUTION_FIELDS, what)
        try:
            return cls(**f.read(_RESOLUTION_SPEC, d, what))
        except InvalidInputError as exc:
            raise CorruptStateError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class Reopen:
    """An operator's reopening of a task that ended ``status`` at ``revision``, and why; with
    ``add_attempts`` more attempts and ``add_time_s`` more seconds of work (see the module docstring)."""

    status: str
    revision: int
    reason: str
    add_attempts: int = 0
    add_time_s: float = 0.0

    def __post_init__(self) -> None:
        f.check(_REOPEN_SPEC, self, "reopen")
        if self.status not in {status.value for status in REOPENABLE}:
            raise InvalidInputError(f"status {self.status!r} is not one a reopen takes a task out of")
        _text(self.reason, "a reopen's reason")
        if self.add_attempts < 0 or not self.add_time_s >= 0 or self.add_time_s == float("inf"):
            raise InvalidInputError("a reopen adds a non-negative number of attempts and a finite, non-negative time")

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "status": self.status, "revision": self.revision, "reason": self.reason,
            "add_attempts": self.add_attempts, "add_time_s": float(self.add_time_s),
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: object) -> "Reopen":
        what = "reopen"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _REOPEN_FIELDS, what)
        try:
            return cls(**f.read(_REOPEN_SPEC, d, what))
        except InvalidInputError as exc:
            raise CorruptStateError(str(exc)) from None


# -- writing -------------------------------------------------------------------------------------


def resolution_approval(
    state: RunState,
    step_id: str,
    outcome: str,
    evidence: str,
    *,
    approval_id: str,
    by: str,
    at: float,
    result: JSONValue = None,
    key: str | None = None,
    payload_digest: str | None = None,
    ttl_s: float = INTERVENTION_TTL_S,
) -> Approval:
    """The record that resolves ``step_id``'s effect in ``state`` as ``outcome``. Refused with
    ``UnknownStepError`` if the task has no such step, and ``ResolveRefusedError`` if its effect
    is not in flight, is one of the engine's own steps, or is not the one the caller expects
    (``key``, ``payload_digest``: what the person was shown)."""
    record = state.effects.get(step_id)
    if record is None:
        known = ", ".join(sorted(s for s in state.effects if not s.startswith(INTERNAL_PREFIX))[:20]) or "none"
        raise UnknownStepError(f"task {state.task_id!r} has no step {step_id!r} (its effects: {known}); nothing was written")
    if record.action.startswith(INTERNAL_PREFIX):
        raise ResolveRefusedError(f"step {step_id!r} is not an effect ({record.action}): only an effect's outcome is resolved; nothing was written")
    if not record.in_flight:
        raise ResolveRefusedError(
            f"step {step_id!r} of task {state.task_id!r} is {record.state.value}, not in flight: there is no uncertain outcome "
            "to resolve; nothing was written"
        )
    if key is not None and key != record.key:
        raise ResolveRefusedError(f"step {step_id!r} has effect key {record.key!r}, not {key!r}; nothing was written")
    if payload_digest is not None and payload_digest != record.payload_digest:
        raise ResolveRefusedError(
            f"step {step_id!r} now records payload {record.payload_digest}, not the {payload_digest} that was checked; "
            "nothing was written: look at it again"
        )
    resolution = Resolution(outcome, record.key, evidence, result)
    return Approval(
        approval_id=approval_id, task_id=state.task_id, plan_digest=state.plan_digest, step_id=step_id,
        payload_digest=record.payload_digest, action=RESOLVE_ACTION, expires_at=at + ttl_s, approver=by, granted_at=at,
        answer=resolution.to_json(),
    )  # fmt: skip


def reopen_approval(
    state: RunState,
    reason: str,
    *,
    approval_id: str,
    by: str,
    at: float,
    add_attempts: int = 0,
    add_time_s: float = 0.0,
    ttl_s: float = INTERVENTION_TTL_S,
) -> Approval:
    """The record that reopens the task ``state`` records; ``ReopenRefusedError`` unless it ended
    in a status a reopen takes it out of (``REOPENABLE``)."""
    if state.status not in REOPENABLE:
        allowed = ", ".join(sorted(status.value for status in REOPENABLE))
        why = "it is finished" if state.status is Status.DONE else "it has not ended (run it again instead)"
        raise ReopenRefusedError(
            f"task {state.task_id!r} is {state.status.value}: only a task that ended {allowed} is reopened, and {why}; "
            "nothing was written"
        )
    if state.status is Status.DEADLINE_EXCEEDED and not (isinstance(add_time_s, (int, float)) and add_time_s > 0):
        raise ReopenRefusedError(
            f"task {state.task_id!r} ended deadline-exceeded: a reopen needs a new deadline, given as --add-time S "
            "(S seconds after the later of its old deadline and the reopen); nothing was written"
        )
    reopen = Reopen(state.status.value, state.revision, reason, add_attempts, float(add_time_s))
    body = reopen.to_json()
    return Approval(
        approval_id=approval_id, task_id=state.task_id, plan_digest=state.plan_digest, step_id=REOPEN_STEP,
        payload_digest=digest_of(body), action=REOPEN_ACTION, expires_at=at + ttl_s, approver=by, granted_at=at, answer=body,
    )  # fmt: skip


class ApprovalWriter(Protocol):
    """Where an intervention is written: a store, or a ``FileControlSource`` (a control root)."""

    def write_approval(self, approval: Approval) -> object: ...


def _loaded(store: Store, task_id: str) -> RunState:
    state = store.load(task_id).state  # UnknownTaskError for a task the store does not hold
    if state is None:
        raise UnknownTaskError(f"task {task_id!r} has no committed state yet; nothing was written")
    return state


Signer = Callable[[Approval], Approval]
"""Signs a record before it is written: ``functools.partial(longrun.authority.sign_approval, key=key)``."""


def _write(store: Store, approval: Approval, write_to: ApprovalWriter | None, sign: Signer | None) -> Approval:
    if sign is not None:
        approval = sign(approval)
    (write_to if write_to is not None else store).write_approval(approval)
    return approval


def resolve(
    store: Store,
    task_id: str,
    step_id: str,
    *,
    applied: bool,
    evidence: str,
    by: str,
    result: JSONValue = None,
    key: str | None = None,
    payload_digest: str | None = None,
    write_to: ApprovalWriter | None = None,
    sign: Signer | None = None,
) -> Approval:
    """Record, as ``by``, that the in-flight effect of ``step_id`` was found applied (``applied=True``,
    with ``result`` as its result if given) or absent at its target, having checked ``evidence``.
    The record is read from ``store`` and written there, or to ``write_to`` (a ``FileControlSource``),
    signed by ``sign`` if given (``functools.partial(longrun.authority.sign_approval, key=key)``); the task's next run acts on it, once. Returns the record.
    ``key`` and ``payload_digest``, when given, must be the effect's (what the person checked)."""
    state = _loaded(store, task_id)
    approval = resolution_approval(
        state, step_id, APPLIED if applied else ABSENT, evidence, approval_id=secrets.token_hex(16), by=by, at=time.time(),
        result=result, key=key, payload_digest=payload_digest,
    )  # fmt: skip
    return _write(store, approval, write_to, sign)


def reopen(
    store: Store,
    task_id: str,
    reason: str,
    *,
    by: str,
    add_attempts: int = 0,
    add_time_s: float = 0.0,
    write_to: ApprovalWriter | None = None,
    sign: Signer | None = None,
) -> Approval:
    """Record, as ``by`` and for ``reason``, that the task (which ended in a ``REOPENABLE`` status)
    is to go on, with ``add_attempts`` more attempts and ``add_time_s`` more seconds of work; written
    like ``resolve``. The task's next run acts on it, once. Returns the record."""
    state = _loaded(store, task_id)
    approval = reopen_approval(
        state, reason, approval_id=secrets.token_hex(16), by=by, at=time.time(), add_attempts=add_attempts, add_time_s=add_time_s
    )
    return _write(store, approval, write_to, sign)


# -- reading (the engine) ------------------------------------------------------------------------


def _candidates(
    records: Iterable[ControlRecord], action: str, state: RunState, step_id: str, now: float
) -> tuple[list[Approval], list[str]]:
    """The valid, unexpired, unconsumed records of ``action`` for ``step_id`` of the task, and why
    each other record of that action and step was not used."""
    found: list[Approval] = []
    reasons: list[str] = []
    consumed = set(state.consumed_approvals)
    for raw in records:
        body = raw.body
        if raw.error is not None:
            if body is None or isinstance(body, Mapping) and body.get("action") == action and body.get("step_id") == step_id:
                reasons.append(f"control record {raw.name} not used: {raw.error}")
            continue
        if not isinstance(body, Mapping) or body.get("action") != action or body.get("step_id") != step_id:
            continue
        try:
            approval = Approval.from_json(body)
        except CorruptStateError as exc:
            reasons.append(f"control record {raw.name}: {exc}")
            continue
        what = f"{'resolution' if action == RESOLVE_ACTION else 'reopen'} {approval.approval_id} by {approval.approver}"
        bound = (("task", state.task_id, approval.task_id), ("plan digest", state.plan_digest, approval.plan_digest))
        mismatched = [name for name, ours, theirs in bound if ours != theirs]
        if mismatched:
            reasons.append(f"{what} not used: it does not match the task in {', '.join(mismatched)}")
        elif approval.approval_id in consumed:
            reasons.append(f"{what} not used: it was already used")
        elif now >= approval.expires_at:
            reasons.append(f"{what} not used: it expired at {approval.expires_at:.3f}")
        else:
            found.append(approval)
    return sorted(found, key=lambda approval: (float(approval.granted_at), approval.approval_id)), reasons


def find_resolution(
    records: Iterable[ControlRecord], state: RunState, record: EffectRecord, now: float
) -> tuple[tuple[Approval, Resolution] | None, list[str]]:
    """The first-granted resolution that binds ``record`` exactly (task, plan digest, step, key,
    payload digest), unused and unexpired, and why each other one for that step was not used."""
    candidates, reasons = _candidates(records, RESOLVE_ACTION, state, record.step_id, now)
    chosen: tuple[Approval, Resolution] | None = None
    for approval in candidates:
        what = f"resolution {approval.approval_id} by {approval.approver}"
        try:
            resolution = Resolution.from_json(approval.answer)
        except CorruptStateError as exc:
            reasons.append(f"{what} not used: {exc}")
            continue
        if resolution.key != record.key:
            reasons.append(f"{what} not used: it names effect key {resolution.key!r}, not {record.key!r}")
        elif approval.payload_digest != record.payload_digest:
            reasons.append(f"{what} not used: it binds payload {approval.payload_digest}, but the effect records {record.payload_digest}")
        elif chosen is None:
            chosen = (approval, resolution)
        else:
            reasons.append(f"{what} also matches; {chosen[0].approval_id}, given first, is used")
    return chosen, reasons


def find_reopen(records: Iterable[ControlRecord], state: RunState, now: float) -> tuple[tuple[Approval, Reopen] | None, list[str]]:
    """The first-granted reopen of the ending ``state`` records (its status and revision), unused
    and unexpired, and why each other reopen of the task was not used."""
    candidates, reasons = _candidates(records, REOPEN_ACTION, state, REOPEN_STEP, now)
    chosen: tuple[Approval, Reopen] | None = None
    for approval in candidates:
        what = f"reopen {approval.approval_id} by {approval.approver}"
        try:
            reopen = Reopen.from_json(approval.answer)
        except CorruptStateError as exc:
            reasons.append(f"{what} not used: {exc}")
            continue
        if approval.payload_digest != digest_of(approval.answer):
            reasons.append(f"{what} not used: its digest does not match what it says")
        elif reopen.status != state.status.value or reopen.revision != state.revision:
            reasons.append(
                f"{what} not used: it reopens the task as it was at revision {reopen.revision} ({reopen.status}), "
                f"not as it is (revision {state.revision}, {state.status.value})"
            )
        elif chosen is None:
            chosen = (approval, reopen)
    return chosen, reasons


def superseded_cancellation(digest: str) -> str:
    """How the state's consumed records name a cancellation record (by the digest of its bytes) that a
    reopen superseded: that record never cancels the task again."""
    return _SUPERSEDED + digest


def origin_of(state: RunState | None) -> dict[str, JSONValue] | None:
    """``{"task": ..., "step": ...}`` if the task is a fork (its function record says so); else None."""
    for record in state.effects.values() if state is not None else ():
        if record.action.startswith(INTERNAL_PREFIX):
            forked = record.payload.get("forked_from")
            if isinstance(forked, dict):
                return forked
        break  # a durable task's function record is its first
    return None


def forks_of(state: RunState | None) -> list[dict[str, JSONValue]]:
    """The forks the task records, oldest first: ``{"task": ..., "step": ...}`` each."""
    if state is None:
        return []
    return [dict(record.payload) for step_id, record in state.effects.items() if step_id.startswith(FORK_PREFIX)]
