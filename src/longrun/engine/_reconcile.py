"""The engine's reconciling layer: an effect settled by observation, the request an adapter sees,
backoffs anchored on this run's clocks, and the records a face settles itself."""

from __future__ import annotations


from .._io import Observe, Steps
from ..adapters import EffectRequest, Observation
from ..budget import Backoff
from ..canonical import JSONValue
from ..envelope import RunState
from ..ledger import EffectRecord, EffectState
from ..outcome import Status
from ..recovery import Reconciled, Verdict, settle
from ._driving import Driving
from ._plans import Stop

__all__ = ["Reconciling"]


class Reconciling(Driving):
    """Settling an effect by observation (``_reconcile``), the request an adapter sees, backoffs
    anchored on this run's clocks, and the records a face settles itself (``complete``).
    """

    def keep_settled(self) -> None:
        """The plan's own code raised (a durable function's bug, say). What is settled so far is
        kept, so a corrected function resumes from it; the error goes to the caller."""
        if self._state is not None and self._dirty and self._keeper is not None and self._keeper.failure is None:
            self._commit()

    def woke_at(self, wake_at: float | None) -> None:
        """When the stopped run should run again (the outcome's ``wake_at``)."""
        self._wake_at = wake_at

    def policy_deadline(self, step_id: str) -> float:
        """The retry policy's per-call deadline for a step, the async driver's bound on an apply."""
        return self._policies.get(step_id, self.retry).deadline_s

    def refused_action(self, step_id: str, reason: str) -> Stop:
        """Stop ``unsafe-to-continue`` before a step whose action the contract does not allow."""
        self._evidence.unknown("contract", f"step {step_id!r}: {reason}")
        return self._stop(Status.UNSAFE_TO_CONTINUE, f"change the code or the contract: step {step_id!r} asks for an action it may not take ({reason}); nothing was applied")

    def mismatch(self, detail: str, next_action: str) -> Stop:
        """A ``plan-mismatch`` stop: the code or plan asks for something other than what was recorded.

        ``detail`` says what differed (the function, an argument, a step id, a payload digest, the
        contract); the outcome's next action carries it too, so that whoever reads only that knows."""
        self._evidence.observed("plan", detail)
        return Stop(Status.PLAN_MISMATCH, f"{next_action} (what differs: {detail})")

    def complete(self, step_id: str, result: JSONValue, *, failed: bool = False) -> EffectRecord:
        """Settle a planned internal step (a child task's result, a function's return value)."""
        now = self.clock.now()
        record = self.state.effects[step_id].move(EffectState.STARTED, now)
        if failed:
            record = record.move(EffectState.FAILED, now, result=result, last_error=str(result))
        else:
            record = record.move(EffectState.VERIFIED, now, result=result)
            self.state.budget = self.state.budget.progressed(now, self._take_work())
        self._put(record)
        return record

    def record_plan_growth(self, state: RunState, recorded_steps: int, steps: int) -> None:
        """Adopt a plan that appends steps to the recorded one: its digest is recorded now, and
        approval requests issued under the old digest are dropped, to be issued again under it."""
        self._evidence.observed("plan", f"recorded plan digest {state.plan_digest} ({recorded_steps} steps)")
        self._evidence.inferred(f"the plan grew from {recorded_steps} to {steps} steps by appending; recorded steps are unchanged")
        state.plan_digest = self.plan_digest
        for step_id in [sid for sid, request in state.approval_requests.items() if request.plan_digest != self.plan_digest]:
            del state.approval_requests[step_id]
        self._dirty = True

    def _interrupted(self, record: EffectRecord) -> None:
        """A call the process died in: calls have no effect to observe, so it may simply run again."""
        self._evidence.inferred(f"call {record.step_id!r} was interrupted (attempt {record.attempts}); it will be called again")
        self._put(record.move(EffectState.PLANNED, self.clock.now(), last_error="interrupted: the process stopped during the call"))

    def _request(self, record: EffectRecord, attempt: int, *, deadline_s: float | None = None) -> EffectRequest:
        assert self._keeper is not None
        return EffectRequest(
            cancel_event=self.cancel_signal,
            task_id=self.task_id,
            step_id=record.step_id,
            action=record.action,
            key=record.key,
            payload=record.payload,
            payload_digest=record.payload_digest,
            attempt=attempt,
            epoch=self._keeper.lease.epoch,
            deadline=self.clock.now() + (self._policy(record).deadline_s if deadline_s is None else deadline_s),
        )

    def _reconcile(self, record: EffectRecord) -> Steps[Reconciled]:
        assert self._state is not None
        self._working = True
        adapter = self.adapters.get(record.action)
        if adapter is None:
            # An effect this code no longer has an adapter for cannot be observed: never guessed.
            observation = Observation.unknown(f"no adapter for action {record.action!r} to observe it with")
            uncertain = record if record.state is EffectState.UNCERTAIN else record.move(EffectState.UNCERTAIN, self.clock.now())
            settled = Reconciled(uncertain, Verdict.UNSAFE, observation, f"outcome of {record.key!r} is unknown: {observation.evidence}")
        else:
            timeout_s = self._timeouts.get(record.step_id, self.timeout_s)
            observed = yield Observe(adapter, self._request(record, max(record.attempts, 1)), timeout_s)
            settled = settle(record, observed, adapter.deduplicates, self.clock.now(), observer=f"{type(adapter).__name__}.observe")
        self._evidence.observed(f"target:{record.action}", f"{record.key}: {settled.observation.state.value} ({settled.observation.evidence})")
        record = settled.record
        if settled.verdict is Verdict.VERIFIED:
            self._evidence.inferred(f"{record.key} verified by observation; it will not be applied again")
            self._state.budget = self._state.budget.progressed(self.clock.now(), self._take_work())
        elif settled.verdict is Verdict.RETRY:
            self._evidence.inferred(f"{record.key} may be applied again: {settled.reason}")
            record = self._with_backoff(record)
        else:
            self._evidence.unknown(f"target:{record.action}", settled.reason)
        self._put(record)
        return settled

    def _unsafe(self, settled: Reconciled) -> Stop:
        return self._stop(
            Status.UNSAFE_TO_CONTINUE,
            f"check the target for effect {settled.record.key!r} and resolve it by hand ({settled.reason}); then run "
            "again (it will be observed again before anything is applied)",
        )

    def _with_backoff(self, record: EffectRecord) -> EffectRecord:
        """``record`` with the wait before its next attempt: a duration from now, anchored on this
        run's clocks so that a later run can judge it whatever the wall clock does (``budget.Backoff``)."""
        if record.attempts == 0:
            return record.with_changes(not_before=None, backoff=None)
        delay = self._policy(record).delay(record.key, record.attempts)
        backoff = Backoff.begin(delay, self.clock.now(), self._monotonic_reading())
        return record.with_changes(not_before=backoff.until, backoff=backoff)

    def _backoff_wait(self, record: EffectRecord, now: float) -> tuple[float, EffectRecord]:
        """Seconds left of ``record``'s backoff, and the record to go on with.

        On the monotonic timeline it was scheduled on, measured there; elsewhere by wall clock, but
        never longer than its duration from now. When the wall clock judged it and is behind the
        scheduled start (stepped back), or this run has a timeline the backoff lacks, the rest of the
        wait is re-anchored on this run's clocks, so later runs measure from here."""
        assert record.not_before is not None
        reading = self._monotonic_reading()
        backoff = record.backoff
        if backoff is None:  # recorded before backoffs kept their duration: the policy's delay bounds it
            duration = self._policy(record).delay(record.key, max(1, record.attempts))
            backoff = Backoff(duration, record.not_before - duration)
        wait = backoff.remaining(now, reading)
        if wait > 0 and not backoff.measured_on(reading) and (reading is not None or now < backoff.scheduled_at):
            backoff = backoff.resumed(now, reading)
            record = record.with_changes(not_before=backoff.until, backoff=backoff)
            self._put(record)
        return wait, record

