"""The engine's gate: the cancellation record and the approvals, read fresh before each new step."""

from __future__ import annotations

from dataclasses import replace

from .. import _crashpoints
from ..approval import Approval, ApprovalRequest, GateVerdict, evaluate_gate
from ..cancellation import judge_cancellation
from ..contract import Step
from ..control import ControlRecord, RefusedRecord
from ..ledger import EffectRecord
from ..outcome import Status
from ..protocols import SigningSource


def _question(record: EffectRecord) -> str:
    question = record.payload.get("question") if isinstance(record.payload, dict) else None
    text = str(question) if question is not None else "?"
    return repr(text if len(text) <= 120 else text[:117] + "...")


def _describe(kind: str, raw: ControlRecord) -> str:
    """One observation line for a control record: which bytes were read, and why it is unusable."""
    text = f"{kind} {raw.name} ({raw.digest or 'no bytes read'})"
    if isinstance(raw, RefusedRecord):
        return f"{text} refused: {raw.error}"
    if raw.error is not None:
        return f"{text} unusable: {raw.error}"
    return text

from ._reconcile import Reconciling

__all__ = ["Gating"]


class Gating(Reconciling):
    """The control records read fresh before each new step: a cancellation (``check_cancellation``)
    and the approval gate (``_gate``), which consumes the one approval that matches a step exactly.
    """

    def check_cancellation(self) -> None:
        """Read the task's cancellation record fresh and stop if it says so (or cannot be trusted)."""
        self._check_cancellation()

    def _check_cancellation(self) -> None:
        assert self._state is not None
        raw = self.cancellations.read_cancellation(self.task_id)
        whose, named = self.task_id, "cancellation record"
        for ancestor in self.cancelled_with if raw is None else ():
            # Read through the same source as the task's own, so a signed or strictly owned record
            # of a parent reaches its children exactly as it reaches the parent.
            raw = self.cancellations.read_cancellation(ancestor)
            if raw is not None:
                whose, named = ancestor, f"cancellation record of ancestor task {ancestor!r}"
                break
        if _crashpoints.ARMED:
            _crashpoints.hit("cancellation.read")
        if raw is None:
            if self._pausing is not None and self._pausing.pause_requested(self.task_id):  # a worker that drains: stop between two steps, committed
                raise self._stop(Status.RETRY_SCHEDULED, "run again now: the worker running it stopped between two steps", wake_at=self.clock.now())
            if not self._cancellation_checked:
                self._evidence.inferred("no cancellation record: new effects are allowed (read again before each one)")
                self._cancellation_checked = True
            return
        item = self._evidence.observed("control", _describe(named, raw))
        self._state.note_control(item)
        judgement = judge_cancellation(raw, whose)
        if judgement.verdict == "refused":
            # Not an operator's word, so not a cancellation (which would end the run for good, in
            # someone's name); but someone wrote in the control area, so nothing new starts either.
            self._evidence.unknown("control", f"whether an operator asked this run to stop: {judgement.problem}")
            signed = " with `longrun cancel --sign-key`" if isinstance(self.cancellations, SigningSource) and self.cancellations.requires_signature else ""
            raise self._stop(
                Status.UNSAFE_TO_CONTINUE,
                f"inspect the control area: {judgement.problem}; remove it, or cancel{signed} if the run should stop, then run again",
            )
        if judgement.verdict == "damaged":
            # Damaged intent to stop: start nothing, but do not end the run for good on a record
            # nobody can read; an operator decides.
            self._evidence.unknown("control", f"whether an operator asked this run to stop: {judgement.problem}")
            raise self._stop(
                Status.UNSAFE_TO_CONTINUE,
                f"inspect the control area: {judgement.problem}; remove it, or write a valid cancellation if the run should stop, then run again",
            )
        record = judgement.record
        assert record is not None and judgement.verdict == "cancelled"
        if whose != self.task_id:
            raise self._stop(
                Status.CANCELLED,
                f"nothing: its ancestor task {whose!r} was cancelled by {record.requested_by}: {record.reason}; "
                "no new effect will start",
            )
        raise self._stop(
            Status.CANCELLED, f"nothing: the run was cancelled by {record.requested_by}: {record.reason}; no new effect will start"
        )

    def _authorize(self, step: Step, record: EffectRecord) -> EffectRecord:
        return self._gate(step, record, Status.AWAITING_APPROVAL)[0]

    def _gate(self, step: Step, record: EffectRecord, waiting: Status) -> tuple[EffectRecord, Approval]:
        """Read the approval sources fresh and consume the one approval that matches the step
        exactly, or stop ``waiting`` (``awaiting-approval`` or ``awaiting-input``)."""
        state = self._state
        assert state is not None
        now = self.clock.now()
        request = state.approval_requests.get(step.step_id)
        if (
            request is None
            or request.expired(now)
            or request.payload_digest != record.payload_digest
            or request.plan_digest != self.plan_digest
        ):
            request = ApprovalRequest(
                task_id=self.task_id,
                plan_digest=self.plan_digest,
                step_id=step.step_id,
                payload_digest=record.payload_digest,
                action=step.action,
                requested_at=now,
                expires_at=now + self.limits.approval_ttl_s,
            )
            state.approval_requests[step.step_id] = request
            self._dirty = True
        records = self.approvals.read_approvals(self.task_id)
        refused = 0
        for raw in records:
            refused += isinstance(raw, RefusedRecord)
            state.note_control(self._evidence.observed("control", _describe("approval record", raw)))
        decision = evaluate_gate(request, records, frozenset(state.consumed_approvals), now)
        if decision.verdict is GateVerdict.GRANTED:
            assert decision.approval is not None
            approval = decision.approval
            for reason in decision.reasons:
                self._evidence.inferred(reason)
            self._evidence.inferred(
                f"approval {approval.approval_id} by {approval.approver} matches step {step.step_id!r} exactly; consumed once"
            )
            state.consumed_approvals.append(approval.approval_id)
            del state.approval_requests[step.step_id]
            record = replace(record, approval_id=approval.approval_id)
            self._put(record)
            if _crashpoints.ARMED:
                _crashpoints.hit("approval.consumed", step.step_id)
            return record, approval
        for reason in decision.reasons:
            self._evidence.unknown("approval", reason)
        if decision.verdict is GateVerdict.REFUSED:
            raise self._stop(
                Status.UNSAFE_TO_CONTINUE,
                f"remove the over-broad approval records for step {step.step_id!r} and approve exactly the pending request",
            )
        signed = " --sign-key <key file>" if isinstance(self.approvals, SigningSource) and self.approvals.requires_signature else ""
        note = f" ({refused} approval record{'s' if refused != 1 else ''} refused: see the unknowns)" if refused else ""
        if waiting is Status.AWAITING_INPUT:
            raise self._stop(
                Status.AWAITING_INPUT,
                f"answer the question of step {step.step_id!r} ({_question(record)}) with "
                f"`longrun answer {self.store_spec} {self.task_id} {step.step_id} VALUE{signed}`, then run again{note}",
            )
        raise self._stop(
            Status.AWAITING_APPROVAL,
            f"approve step {step.step_id!r} (action {step.action!r}, payload {record.payload_digest}) "
            f"with `longrun approve {self.store_spec} {self.task_id} --step {step.step_id}{signed}`, then run again{note}",
        )

