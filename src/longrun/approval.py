"""Scoped approval: a request bound to one effect, and the gate that decides whether an approval covers it.

A step marked ``approval=True`` does not start until an approval names exactly its scope: task id,
plan digest, step id, payload digest and action, and is unexpired. The runner persists an
``ApprovalRequest`` carrying that scope; an operator answers with an ``Approval`` record bound to
the same digests (``python -m longrun approve`` copies them from the request). The gate:

- grants only an approval whose every scope field equals the request's, whose expiry lies in the
  future, and whose id was never consumed; the runner then records the id as consumed in the same
  commit that starts the effect, so one approval authorizes one effect, once. Of several that
  qualify (two writers raced), the first granted is used: the earliest ``granted_at``, then the
  smaller id; never the order a store happens to list them in, so every store and every run picks
  the same one (an answer's value depends on it);
- refuses, and reports ``unsafe-to-continue``, an approval broader than requested (a wildcard or
  missing scope field): someone tried to authorize more than was asked;
- otherwise (missing, expired, replayed, for another plan, step, payload or action) keeps the step
  ``awaiting-approval`` and says why.

An approval may carry a ``signature`` (an HMAC over ``signed_fields()``: the full scope, expiry,
approver, grant time and the id that serves as its nonce). The gate does not check it: who wrote a
record is judged before the gate, by the sources in ``longrun.authority``, which hand over a record
they refuse with its reason in ``error``; the gate reports such a record as not used, so a refused
record never authorizes anything.

Writers refuse a second approval of a request that already has one waiting (``refuse_second``,
which ``longrun approve`` and ``longrun answer`` call before they write; ``ApprovalWaitingError``).
Two writers that race past that check both get in; the gate's order above then decides.

Not guaranteed here: who wrote the approval. With the default source (the store) anyone who can
write to the control area can approve; see ``longrun.authority`` for strict mode and signatures.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from . import _fields as f
from .canonical import JSONValue
from .contract import ASK_ACTION
from .control import ControlRecord
from .errors import ApprovalWaitingError, CorruptStateError

__all__ = [
    "Approval",
    "ApprovalRequest",
    "GateDecision",
    "GateVerdict",
    "SCOPE_FIELDS",
    "evaluate_gate",
    "granted_order",
    "refuse_second",
    "waiting_approvals",
]

SCOPE_FIELDS = ("task_id", "plan_digest", "step_id", "payload_digest", "action")
_SCOPE_SPEC = (
    f.Field("task_id", f.Kind.NAME),
    f.Field("plan_digest", f.Kind.TEXT),
    f.Field("step_id", f.Kind.STEP),
    f.Field("payload_digest", f.Kind.TEXT),
    f.Field("action", f.Kind.TEXT),
)
_REQUEST_SPEC = (*_SCOPE_SPEC, f.Field("requested_at", f.Kind.NUMBER), f.Field("expires_at", f.Kind.NUMBER))
_APPROVAL_SPEC = (
    f.Field("approval_id", f.Kind.NAME),
    *_SCOPE_SPEC,
    f.Field("expires_at", f.Kind.NUMBER),
    f.Field("approver", f.Kind.TEXT),
    f.Field("granted_at", f.Kind.NUMBER),
    f.Field("signature", f.Kind.TEXT, optional=True),
    f.Field("answer", f.Kind.JSON),
)
_REQUEST_FIELDS = frozenset(field.name for field in _REQUEST_SPEC)
_FAST_REQUEST = f.fast_check(_REQUEST_SPEC)
_FAST_APPROVAL = f.fast_check(_APPROVAL_SPEC)
_APPROVAL_FIELDS = frozenset({"schema_version", *(field.name for field in _APPROVAL_SPEC)})
WILDCARDS = frozenset({"*", "any", "all", ""})


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    task_id: str
    plan_digest: str
    step_id: str
    payload_digest: str
    action: str
    requested_at: float
    expires_at: float

    def __post_init__(self) -> None:
        if not _FAST_REQUEST(self):
            f.check(_REQUEST_SPEC, self, "approval request")

    def scope(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in SCOPE_FIELDS}

    def expired(self, now: float) -> bool:
        return now >= self.expires_at

    def to_json(self) -> dict[str, JSONValue]:
        return {**self.scope(), "requested_at": self.requested_at, "expires_at": self.expires_at}

    @classmethod
    def from_json(cls, data: object) -> "ApprovalRequest":
        what = "approval request"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _REQUEST_FIELDS, what)
        return cls(**f.read(_REQUEST_SPEC, d, what))


@dataclass(frozen=True, slots=True)
class Approval:
    """An operator's answer to one request. ``approval_id`` is a nonce: it authorizes once."""

    approval_id: str
    task_id: str
    plan_digest: str
    step_id: str
    payload_digest: str
    action: str
    expires_at: float
    approver: str
    granted_at: float
    signature: str | None = None
    """``hmac-sha256:<key id>:<mac>`` over ``signed_fields()``, or None (see ``longrun.authority``)."""
    answer: JSONValue = None
    """A person's answer to a question (``run.ask``); None for a plain approval of an effect."""

    def __post_init__(self) -> None:
        if not _FAST_APPROVAL(self):
            f.check(_APPROVAL_SPEC, self, "approval record")

    def signed_fields(self) -> dict[str, JSONValue]:
        """Every field but the signature, as a signature covers them (times always as floats).

        ``answer`` is included only when there is one, so a plain approval signs what it always did."""
        fields: dict[str, JSONValue] = {
            "approval_id": self.approval_id,
            "task_id": self.task_id,
            "plan_digest": self.plan_digest,
            "step_id": self.step_id,
            "payload_digest": self.payload_digest,
            "action": self.action,
            "expires_at": float(self.expires_at),
            "approver": self.approver,
            "granted_at": float(self.granted_at),
        }
        if self.answer is not None:
            fields["answer"] = self.answer
        return fields

    def scope_matches(self, request: ApprovalRequest) -> bool:
        """Whether every scope field equals ``request``'s (task, plan, step, payload, action)."""
        return all(getattr(self, name) == getattr(request, name) for name in SCOPE_FIELDS)

    def to_json(self) -> dict[str, JSONValue]:
        """The record as written: ``signed_fields()``, the signature if any, and ``schema_version``
        (not signed: it only says which readers may read the record, and they refuse any other)."""
        body = self.signed_fields()
        body["schema_version"] = f.RECORD_SCHEMA_VERSION
        if self.signature is not None:
            body["signature"] = self.signature
        return body

    @classmethod
    def from_json(cls, data: object) -> "Approval":
        """Validate an approval record (see ``_fields`` for the rules; ``schema_version`` may be absent)."""
        what = "approval record"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _APPROVAL_FIELDS, what)
        f.check_record_version(d, what)
        return cls(**f.read(_APPROVAL_SPEC, d, what))

    @classmethod
    def for_request(
        cls,
        request: ApprovalRequest,
        *,
        approval_id: str,
        approver: str,
        granted_at: float,
        expires_at: float | None = None,
        answer: JSONValue = None,
    ) -> "Approval":
        """An approval (or, with ``answer``, an answer) bound to exactly ``request``'s scope. It lasts
        until ``expires_at``; by default, as long as the request it answers (``request.expires_at``)."""
        if expires_at is None:
            expires_at = request.expires_at
        return cls(
            approval_id=approval_id, approver=approver, granted_at=granted_at, expires_at=expires_at, answer=answer,
            **request.scope(),
        )  # fmt: skip


class GateVerdict(str, enum.Enum):
    GRANTED = "granted"
    AWAITING = "awaiting"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class GateDecision:
    verdict: GateVerdict
    approval: Approval | None = None
    reasons: tuple[str, ...] = field(default=())


def _broader_fields(body: Mapping[str, Any]) -> list[str]:
    broad = []
    for name in SCOPE_FIELDS:
        value = body.get(name)
        if not isinstance(value, str) or value.strip().lower() in WILDCARDS or "*" in value:
            broad.append(name)
    if body.get("expires_at") is None:
        broad.append("expires_at")
    return broad


def evaluate_gate(
    request: ApprovalRequest, records: Iterable[ControlRecord], consumed: frozenset[str] | set[str], now: float
) -> GateDecision:
    """Decide whether any of ``records`` authorizes ``request`` now (see the module docstring)."""
    reasons: list[str] = []
    refusals: list[str] = []
    candidates: list[Approval] = []
    for raw in records:
        if raw.error is not None:
            reasons.append(f"approval {raw.name} not used: {raw.error}")
            continue
        body = raw.body
        if not isinstance(body, Mapping):
            reasons.append(f"approval {raw.name}: not a JSON object")
            continue
        step_id = body.get("step_id")
        if isinstance(step_id, str) and step_id != request.step_id and "*" not in step_id and step_id.strip():
            continue  # an approval for another step: not ours to judge
        broad = _broader_fields(body)
        if broad:
            refusals.append(f"approval {raw.name} is broader than requested (open scope: {', '.join(broad)})")
            continue
        try:
            approval = Approval.from_json(body)
        except CorruptStateError as exc:
            reasons.append(f"approval {raw.name}: {exc}")
            continue
        mismatched = [name for name in SCOPE_FIELDS if getattr(approval, name) != getattr(request, name)]
        if mismatched:
            reasons.append(f"approval {approval.approval_id} does not match the request in {', '.join(mismatched)}")
        elif approval.approval_id in consumed:
            reasons.append(f"approval {approval.approval_id} was already consumed")
        elif now >= approval.expires_at:
            reasons.append(f"approval {approval.approval_id} expired at {approval.expires_at:.3f}")
        else:
            candidates.append(approval)
    granted = min(candidates, key=granted_order) if candidates else None
    for other in candidates:
        if other is not granted and granted is not None:
            reasons.append(f"approval {other.approval_id} also matches; {granted.approval_id}, granted first, is used")
    # A broader-than-requested record refuses the step even beside an exact one: someone tried to
    # authorize more than was asked, and an operator should look before anything runs.
    if refusals:
        return GateDecision(GateVerdict.REFUSED, None, tuple(refusals + reasons))
    if granted is not None:
        return GateDecision(GateVerdict.GRANTED, granted, tuple(reasons))
    if not reasons:
        if request.action == ASK_ACTION:
            reasons.append(f"no answer yet to the question of step {request.step_id!r}")
        else:
            reasons.append(f"no approval yet for step {request.step_id!r}")
    return GateDecision(GateVerdict.AWAITING, None, tuple(reasons))


def granted_order(approval: Approval) -> tuple[float, str]:
    """The order in which approvals of one request count: the first granted, then the smaller id."""
    return (float(approval.granted_at), approval.approval_id)


def waiting_approvals(
    request: ApprovalRequest, records: Iterable[ControlRecord], consumed: frozenset[str] | set[str] | list[str], now: float
) -> list[Approval]:
    """The valid, unexpired, unconsumed approvals of ``records`` that cover ``request`` exactly, in
    the order the gate would use them (``granted_order``)."""
    used = set(consumed)
    found = []
    for raw in records:
        if raw.error is not None:
            continue
        try:
            approval = Approval.from_json(raw.body)
        except CorruptStateError:
            continue
        if approval.approval_id not in used and now < approval.expires_at and approval.scope_matches(request):
            found.append(approval)
    return sorted(found, key=granted_order)


def refuse_second(
    request: ApprovalRequest,
    records: Iterable[ControlRecord],
    consumed: frozenset[str] | set[str] | list[str],
    now: float,
    *,
    counts: Callable[[Approval], bool] | None = None,
) -> None:
    """``ApprovalWaitingError`` if an approval (or an answer) of ``request`` is already waiting,
    unused: what a writer calls before it writes another. It names the one waiting. ``counts``
    keeps only the records the runner would believe (a writer that signs counts only records
    signed with its key: an unsigned one that a signed source refuses does not block it)."""
    waiting = [approval for approval in waiting_approvals(request, records, consumed, now) if counts is None or counts(approval)]
    if not waiting:
        return
    first = waiting[0]
    if first.answer is not None or request.action == ASK_ACTION:
        what = f"an answer ({_shown_answer(first.answer)}, by {first.approver}, approval {first.approval_id})"
        rule = "the first answer written is the one the run reads"
    else:
        what = f"an approval (approval {first.approval_id}, by {first.approver})"
        rule = "one approval authorizes the effect, once"
    more = f", and {len(waiting) - 1} more" if len(waiting) > 1 else ""
    raise ApprovalWaitingError(
        f"step {request.step_id!r} of task {request.task_id!r} already has {what}{more} waiting, not yet used: {rule}; "
        "nothing was written",
        waiting=first.approval_id,
    )



def _shown_answer(answer: JSONValue) -> str:
    text = json.dumps(answer, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."
