"""The engine's effect rules: one effect from planned to verified, observed before any retry."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Sequence

from .. import _crashpoints
from .._io import COMMIT, Apply, ApplyTimedOut, Observe, Steps, drive
from ..adapters import ObservedState
from ..budget import RetryPolicy
from ..canonical import printable
from ..contract import Step
from ..errors import PermanentError, TransientError, describe_exception
from ..ledger import EffectRecord, EffectState, check_receipt
from ..outcome import Status
from ..recovery import Verdict, settle
from ._plans import utc
from ._steps import StepRules

log = logging.getLogger("longrun")

__all__ = ["EffectRules"]


_VERIFIED_STATE = EffectState.VERIFIED
"""A plain reference: reading an enum member off its class costs a descriptor call each time."""


_VERIFIED = frozenset({EffectState.VERIFIED})


class EffectRules(StepRules):
    """One effect, from planned to verified: an observation first where the target may be ahead of
    the state, the approval gate, the intent committed before ``apply``, and the outcome settled by
    observation (a timed-out apply included).
    """

    def effect(self, step: Step, *, retry: RetryPolicy | None = None, timeout_s: float | None = None) -> EffectRecord:
        """Make one step's effect verified, or stop; return its verified record.

        A verified step returns at once (that is replay). Otherwise, in order: cancellation read
        fresh, the budgets, the record planned, a backoff honoured, an observation first where the
        target may be ahead of the state, the approval gate, and then the intent persisted before
        the adapter is called and the outcome settled by observation. ``timeout_s`` (else the
        run's) bounds each ``apply``: the adapter then runs in a worker thread (see ``_execute``).
        """
        recorded = self.state.effects.get(step.step_id)
        if recorded is not None and recorded.state is _VERIFIED_STATE:
            return recorded  # replay: nothing to wait for
        return drive(self.effect_steps(step, retry=retry, timeout_s=timeout_s), self._perform)

    def verified_prefix(self, steps: Sequence[Step]) -> int:
        """How many of ``steps``, from the first, are verified: the steps that ``effect`` would
        replay (return at once, changing nothing), found with a lookup and a state test each. A
        face that makes its steps in order starts at the first step after them."""
        effects = self.state.effects
        for index, step in enumerate(steps):
            record = effects.get(step.step_id)
            if record is None or record.state is not _VERIFIED_STATE:
                return index
        return len(steps)

    def effect_steps(
        self, step: Step, *, retry: RetryPolicy | None = None, timeout_s: float | None = None
    ) -> Steps[EffectRecord]:
        """``effect`` as a step procedure, for a driver to run (``effect`` drives it in this thread)."""
        state = self.state
        self._step_options(step, retry, timeout_s)
        while True:
            record, settled = yield from self._ready(step, _VERIFIED)
            if settled:
                return record
            if state.reconcile_all:
                record = yield from self._reconcile_before_start(step, record)
                if record.state is EffectState.VERIFIED:
                    continue
            elif record.state is EffectState.PLANNED and (self._observe_next or (step.observe_first and record.attempts == 0)):
                record = yield from self._observe_before_apply(step, record)
                if record.state is EffectState.VERIFIED:
                    continue
            if step.approval and record.approval_id is None:
                record = self._authorize(step, record)
            yield from self._execute(step, record)

    def _reconcile_before_start(self, step: Step, record: EffectRecord) -> Steps[EffectRecord]:
        """After recovery from a backup, the lost revision may have started this step: observe first."""
        assert self._state is not None
        record = record.move(
            EffectState.UNCERTAIN, self.clock.now(), last_error="state recovered from a backup: a start may have been lost"
        )
        settled = yield from self._reconcile(record)
        if settled.verdict is Verdict.UNSAFE:
            raise self._unsafe(settled)
        if settled.verdict is Verdict.RETRY and self._sequential():
            # Steps run in order, so nothing after the first step observed absent can have started.
            self._state.reconcile_all = False
            self._evidence.inferred("recovery from the backup is reconciled: later steps cannot have started")
        return self._state.effects[step.step_id]

    def _observe_before_apply(self, step: Step, record: EffectRecord) -> Steps[EffectRecord]:
        """Observe a planned effect before applying it: the first apply of this call, or the first
        apply ever of an ``observe_first`` step. Applied: verified (committed with the next start or
        the stop), never applied again. Absent: applied, and the effects after it are not observed
        (steps run in order). Unknown: applied, since the ledger says it never started, except
        for an ``observe_first`` step at a target that does not deduplicate: the run stops
        ``unsafe-to-continue`` rather than guess."""
        assert self._state is not None
        strict = step.observe_first and record.attempts == 0
        why = "observed before its first apply" if strict else "observed before the first apply of this run"
        # planned -> uncertain -> (verified | planned): the ledger's move for "a start may have been lost".
        probe = record.move(EffectState.UNCERTAIN, self.clock.now())
        adapter = self.adapter_for(step.action, step_id=step.step_id)
        observed = yield Observe(adapter, self._request(record, max(record.attempts, 1)), self._timeouts.get(step.step_id, self.timeout_s))
        settled = settle(probe, observed, adapter.deduplicates, self.clock.now())
        observation = settled.observation
        self._evidence.observed(f"target:{step.action}", f"{record.key}: {observation.state.value} ({observation.evidence}), {why}")
        if settled.verdict is Verdict.VERIFIED:
            self._evidence.inferred(f"{record.key} was already applied; verified by observation, it will not be applied again")
            self._state.budget = self._state.budget.progressed(self.clock.now(), self._take_work())
            self._put(settled.record)
            return settled.record
        if self._sequential():  # effects in parallel may have started beside one that did not
            self._observe_next = False
        if observation.state is ObservedState.ABSENT:
            return record
        if settled.verdict is Verdict.UNSAFE and strict:
            self._evidence.unknown(f"target:{step.action}", f"{settled.reason}; the step is marked observe_first")
            self._put(replace(settled.record, last_error="observe_first: the target cannot say whether it was already applied"))
            raise self._unsafe(settled)
        if settled.verdict is Verdict.RETRY:
            self._evidence.inferred(f"{record.key} may be applied: {settled.reason}")
        else:
            self._evidence.inferred(f"{record.key}: the target cannot say whether it was applied; the ledger says it never started")
        return record

    def _execute(self, step: Step, record: EffectRecord) -> Steps[None]:
        state = self._state
        assert state is not None and self._keeper is not None
        if self._sequential():
            self._observe_next = False
        record = yield from self._start_attempt(step, record, f"observe whether effect {record.key!r} took place")
        attempt = record.attempts
        if _crashpoints.ARMED:
            _crashpoints.hit("effect.intent-persisted", f"{step.step_id}#{attempt}")
        adapter = self.adapter_for(step.action, step_id=step.step_id)
        timeout_s = self._timeouts.get(step.step_id, self.timeout_s)
        request = self._request(record, attempt, deadline_s=timeout_s)
        try:
            receipt = yield Apply(adapter, request, timeout_s)
        except TransientError as exc:
            yield from self._transient(step, record, exc)
            return
        except PermanentError as exc:
            raise self._failed_for_good(step, record, exc, source=f"adapter:{step.action}") from None
        except ApplyTimedOut as exc:
            yield from self._timed_out(step, record, exc)
            return
        except Exception as exc:  # outcome unknown: recorded as uncertain and observed, never retried blind
            described = describe_exception(exc)  # never trusting the adapter's exception to print itself
            log.warning("apply of %s raised %s; observing", record.key, described)
            self._current_lease()
            self._evidence.observed(f"adapter:{step.action}", f"{record.key} attempt {attempt} raised {described}")
            record = record.move(EffectState.UNCERTAIN, self.clock.now(), last_error=described)
            self._put(record)
            yield from self._settle(step, record)
            return
        if _crashpoints.ARMED:
            _crashpoints.hit("effect.applied", f"{step.step_id}#{attempt}")
        self._current_lease()
        checked = check_receipt(receipt, key=record.key, step_id=step.step_id, already_spent=record.cost + state.budget.cost_spent)
        for problem in checked.problems:  # an adapter bug, or a result too large to keep: evidence, never dropped
            log.warning("%s: %s", record.key, problem)
            self._evidence.unknown(f"adapter:{step.action}", problem)
        self._evidence.observed(f"adapter:{step.action}", f"receipt for {record.key} attempt {attempt}: {checked.evidence}")
        cost = checked.cost
        record = record.move(EffectState.ACKNOWLEDGED, self.clock.now(), receipt=checked.evidence, result=checked.result, cost=record.cost + cost)
        self._put(record)
        state.budget = state.budget.spent(cost)
        yield from self._settle(step, record)

    def _settle(self, step: Step, record: EffectRecord) -> Steps[None]:
        """Observe an acknowledged or uncertain effect right after ``apply``."""
        settled = yield from self._reconcile(record)
        if settled.verdict is Verdict.UNSAFE:
            raise self._unsafe(settled)
        if settled.verdict is Verdict.RETRY:
            yield COMMIT  # the retry's backoff must survive a restart

    def _timed_out(self, step: Step, record: EffectRecord, exc: ApplyTimedOut) -> Steps[None]:
        """An ``apply`` past its timeout: uncertain, and observed. An async one was cancelled, so it
        settles like any unknown outcome. A synchronous one may still be running in its thread: it is
        verified if the target already shows it, and otherwise never applied again by this run, which
        stops; the lease is kept until that thread ends, so no other run can start it meanwhile."""
        self._current_lease()
        self._evidence.observed(f"adapter:{step.action}", f"{record.key} attempt {record.attempts} {exc}")
        record = record.move(EffectState.UNCERTAIN, self.clock.now(), last_error=printable(f"timeout: {exc}"))
        self._put(record)
        if exc.pending is None:
            yield from self._settle(step, record)
            return
        self._stragglers.append(exc.pending)
        adapter = self.adapter_for(step.action, step_id=step.step_id)
        observed = yield Observe(adapter, self._request(record, record.attempts), self._timeouts.get(step.step_id, self.timeout_s))
        self._evidence.observed(f"target:{step.action}", f"{record.key}: {observed.state.value} ({observed.evidence})")
        if observed.state is ObservedState.APPLIED:
            settled = settle(record, observed, adapter.deduplicates, self.clock.now())
            self._evidence.inferred(f"{record.key} verified by observation; it will not be applied again")
            assert self._state is not None
            self._state.budget = self._state.budget.progressed(self.clock.now(), self._take_work())
            self._put(settled.record)
            return
        self._put(replace(record, evidence=observed.evidence))
        self._evidence.unknown(f"adapter:{step.action}", f"{record.key}: the timed-out attempt may still reach the target")
        wake_at = self.clock.now() + self._policy(record).delay(record.key, record.attempts)
        raise self._stop(
            Status.RETRY_SCHEDULED,
            f"run again at or after {utc(wake_at)}: effect {record.key!r} timed out after {exc.timeout_s:g} s and its "
            "attempt may still be running here (this run keeps the lease until it ends); the next run observes it "
            "before anything is applied again",
            wake_at=wake_at,
        )

