"""The engine's step rules: calls, timers, questions and stops, and what every step keeps before it
starts (cancellation read fresh, the budgets, a backoff honoured, the attempt committed first)."""

from __future__ import annotations

from typing import Callable, Sequence

from .. import _crashpoints
from .._io import COMMIT, ApplyTimedOut, Invoke, Sleep, Steps, drive
from ..budget import RetryPolicy
from ..canonical import MAX_VALUE_BYTES, JSONValue, canonical_bytes, digest_of, ensure_json
from ..contract import Step
from ..errors import (
    InvalidInputError,
    PayloadError,
    PermanentError,
    SizeLimitError,
    TransientError,
    describe_exception,
    exception_message,
    exception_type_name,
)
from ..ledger import IN_FLIGHT, EffectRecord, EffectState, recordable_result
from ..outcome import RunOutcome, Status
from ._evidence import EvidenceLog
from ._gate import Gating
from ._plans import Stop, check_timeout, utc

__all__ = ["StepRules"]


_NAMED_STEPS = 20
"""The most required steps the inference of a ``done`` run names one by one."""
_MIN_WAIT_S = 0.001
"""A backoff with less than this left is over (see ``Engine._backing_off``)."""


_SETTLED_CALL = frozenset({EffectState.VERIFIED, EffectState.FAILED})
"""A call's record is settled either way: a recorded exception replays as ``CallFailed``."""


class StepRules(Gating):
    """The steps a plan drives besides effects (``call``, ``timer``, ``ask``, ``wait``, ``finish``),
    and the rules every step keeps before it starts: cancellation read fresh, the budgets, the record
    planned, a backoff honoured, the attempt committed before anything is called.
    """

    def plan(self, step: Step) -> EffectRecord:
        """The step's record, planned now (it goes out with the next commit) unless it exists."""
        record = self.state.effects.get(step.step_id)
        return record if record is not None else self._plan(step, self.clock.now())

    def call(
        self, step: Step, invoke: Callable[[], object], *, retry: RetryPolicy | None = None, timeout_s: float | None = None
    ) -> EffectRecord:
        """Run ``invoke`` once for a step that is not an external effect; return its settled record.

        A recorded call returns its record without calling anything: ``verified`` with the value
        it returned, or ``failed`` with the exception it raised (``result`` holds its type and
        message). The attempt is committed before ``invoke`` runs, so retry budgets survive a
        restart; a call the process died in is simply called again (a call has nothing to
        observe). ``TransientError`` backs off and retries; ``PermanentError`` stops ``blocked``.
        A call that runs past ``timeout_s`` counts as a transient failure.
        """
        return drive(self.call_steps(step, invoke, retry=retry, timeout_s=timeout_s), self._perform)

    def call_steps(
        self,
        step: Step,
        invoke: Callable[[], object],
        *,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
        awaitable: bool = False,
    ) -> Steps[EffectRecord]:
        """``call`` as a step procedure, for a driver to run."""
        state = self.state
        self._step_options(step, retry, timeout_s)
        while True:
            record, settled = yield from self._ready(step, _SETTLED_CALL)
            if settled:
                return record
            record = yield from self._start_attempt(step, record, f"call step {step.step_id!r} again (it was interrupted)")
            attempt = record.attempts
            if _crashpoints.ARMED:
                _crashpoints.hit("call.started", f"{step.step_id}#{attempt}")
            try:
                # A value that cannot be recorded is the call's failure, like an exception it raised:
                # replay must return exactly what the call returned, so no stand-in will do.
                value = yield Invoke(invoke, self._timeouts.get(step.step_id, self.timeout_s), awaitable)
                result = ensure_json(value, what=f"the value returned by step {step.step_id!r}")
                if recordable_result(result, what=f"the value returned by step {step.step_id!r}")[1] is not None:
                    size = len(canonical_bytes(result))
                    raise SizeLimitError(
                        f"the value returned by step {step.step_id!r} is {size} bytes encoded, over MAX_VALUE_BYTES "
                        f"({MAX_VALUE_BYTES}): return a reference (a path, a digest) instead",
                        size=size, limit=MAX_VALUE_BYTES, limit_name="MAX_VALUE_BYTES",
                    )  # fmt: skip
            except (TransientError, ApplyTimedOut) as exc:
                yield from self._transient(step, record, exc)
                continue
            except PermanentError as exc:
                raise self._failed_for_good(step, record, exc, source=f"call:{step.step_id}") from None
            except Exception as exc:  # recorded as the call's outcome: replayed identically, never retried
                self._current_lease()
                # Described without trusting its __str__: one that raises is still the call's outcome.
                described = describe_exception(exc)
                failure: JSONValue = {"type": exception_type_name(exc), "message": exception_message(exc)}
                record = record.move(EffectState.FAILED, self.clock.now(), result=failure, last_error=described)
                self._evidence.observed(f"call:{step.step_id}", f"attempt {attempt} raised {described}")
                self._put(record)
                return record
            if _crashpoints.ARMED:
                _crashpoints.hit("call.returned", f"{step.step_id}#{attempt}")
            self._current_lease()
            now = self.clock.now()
            record = record.move(EffectState.VERIFIED, now, result=result, receipt="returned")
            state.budget = state.budget.progressed(now, self._take_work())
            self._put(record)  # committed with the next step's start, or the stop
            return record

    def timer(self, step: Step, seconds: float) -> EffectRecord:
        """A durable wait: the wake time is recorded when the step is first reached.

        Within ``Limits.max_block_s`` the engine waits; a longer wait stops the run ``sleeping``
        with ``wake_at``. Run it again at or after that time and the step completes.
        """
        return drive(self.timer_steps(step, seconds), self._perform)

    def timer_steps(self, step: Step, seconds: float) -> Steps[EffectRecord]:
        """``timer`` as a step procedure, for a driver to run."""
        state = self.state
        record = state.effects.get(step.step_id)
        if record is not None and record.state is EffectState.VERIFIED:
            return record
        self._check_cancellation()
        state.current_step = step.step_id
        now = self.clock.now()
        if record is None:
            record = self._plan(step, now).with_changes(not_before=now + seconds)
            self._put(record)
        wake_at = record.not_before if record.not_before is not None else now
        if now < wake_at:
            wait = wake_at - now
            if wait > self.limits.max_block_s:
                raise self._stop(Status.SLEEPING, f"run again at or after {utc(wake_at)} (step {step.step_id!r} sleeps until then)", wake_at=wake_at)
            yield COMMIT  # the wake time outlives a process that stops during the wait
            yield Sleep(wait)
            now = self.clock.now()
        record = record.move(EffectState.STARTED, now).move(EffectState.VERIFIED, now, not_before=None)
        self._put(record)
        return record

    def ask(self, step: Step, choices: Sequence[JSONValue] | None) -> EffectRecord:
        """A person's answer as a value: an approval of the question (bound to task, plan, step and
        the question's digest, single use, through the approval sources) that carries the answer.

        Without an answer the run stops ``awaiting-input``. An answer that is not among
        ``choices`` is consumed, recorded as refused, and asked again."""
        state = self.state
        while True:
            record = state.effects.get(step.step_id)
            if record is not None and record.state is EffectState.VERIFIED:
                return record
            self._check_cancellation()
            state.current_step = step.step_id
            if record is None:
                record = self._plan(step, self.clock.now())
            record, approval = self._gate(step, record, Status.AWAITING_INPUT)
            if choices is not None and approval.answer not in list(choices):
                self._evidence.unknown("answer", f"answer {approval.answer!r} by {approval.approver} is not one of {list(choices)!r}")
                self._put(record.with_changes(approval_id=None, last_error=f"answer {approval.answer!r} is not a choice"))
                continue
            now = self.clock.now()
            self._evidence.observed("answer", f"step {step.step_id!r} answered by {approval.approver}")
            record = record.move(EffectState.STARTED, now).move(EffectState.VERIFIED, now, result=approval.answer)
            state.budget = state.budget.progressed(now, self._take_work())
            self._put(record)
            return record

    def wait(self, status: Status, next_action: str, *, wake_at: float | None = None) -> Stop:
        """A stop that waits for something outside the run (a person, a child task): committed."""
        return self._stop(status, next_action, wake_at=wake_at)

    def finish(self, required: Sequence[str]) -> Stop:
        """The stop ``done``, if every step in ``required`` is verified and nothing is in flight."""
        if self._stopping is not None:  # a parallel step stopped the run, and the plan went on regardless
            raise self._stopping.again()
        self._check_cancellation()
        state = self.state
        effects, verified = state.effects, EffectState.VERIFIED
        missing = [sid for sid in required if (record := effects.get(sid)) is None or record.state is not verified]
        if missing:  # unreachable while every step must be verified before the plan ends; kept as a guard
            raise self._stop(Status.UNSAFE_TO_CONTINUE, f"completion evidence missing for {missing}")
        in_flight = [record.key for record in effects.values() if record.state in IN_FLIGHT]
        if in_flight:
            self._evidence.unknown("ledger", f"effects still in flight at the end: {in_flight}")
            raise self._stop(Status.UNSAFE_TO_CONTINUE, f"check the target for {in_flight[0]!r}; then run again")
        state.current_step = None
        # The steps named while they are few: a plan of 100,000 would make this one item a megabyte.
        named = list(required) if len(required) <= _NAMED_STEPS else f"{len(required)} steps, {list(required[:_NAMED_STEPS])} ..."
        self._evidence.inferred(f"every required effect is verified: {named}")
        return self._stop(Status.DONE, "nothing: every required effect is verified")

    def refuse(self, reasons: Sequence[str], next_action: str) -> RunOutcome:
        """An ``unsafe-to-continue`` outcome decided before the lease is taken: nothing was run."""
        self._evidence = EvidenceLog(self.clock)
        self._state = None
        self._lease = None
        for reason in reasons:
            self._evidence.unknown("contract", reason)
        return self._outcome(Status.UNSAFE_TO_CONTINUE, next_action)

    def _step_options(self, step: Step, retry: RetryPolicy | None, timeout_s: float | None) -> None:
        """A step's own retry policy and timeout, which override the run's for it."""
        if retry is not None:
            self._policies[step.step_id] = retry
        if timeout_s is not None:
            self._timeouts[step.step_id] = check_timeout(timeout_s, f"step {step.step_id!r}")

    def _ready(self, step: Step, settled: frozenset[EffectState]) -> Steps[tuple[EffectRecord, bool]]:
        """The step's record and True if it is settled (replayed as it is); else the record ready
        for its next attempt: cancellation read fresh, the budgets checked, the record planned,
        and a short backoff waited out (then everything again: a wait is a new moment)."""
        state = self.state
        while True:
            record = state.effects.get(step.step_id)
            if record is not None and record.state in settled:
                return record, True
            self._check_cancellation()
            state.current_step = step.step_id
            now = self.clock.now()
            self._check_budget(record, now)
            if record is None:
                record = self._plan(step, now)
            if not (yield from self._backing_off(record, now)):
                return record, False

    def _check_budget(self, record: EffectRecord | None, now: float) -> None:
        state = self.state
        exhausted = state.budget.exhausted(self.limits, pending_s=self._monotonic() - self._worked_mark)
        if exhausted is None and record is not None:
            exhausted = self.limits.attempts_exhausted(record.key, record.attempts, record.last_error)
        if exhausted is not None:
            self._evidence.observed("budget", exhausted)
            raise self._stop(Status.LIMITS_EXHAUSTED, f"review why the budget ran out ({exhausted}); the run is over")

    def _backing_off(self, record: EffectRecord, now: float) -> Steps[bool]:
        """True after waiting out a short backoff (the caller starts over); stops for a long one."""
        if record.not_before is None:
            return False
        wait, record = self._backoff_wait(record, now)
        if wait < _MIN_WAIT_S:
            # Over, or as good as over: a remainder this small can be below what a clock reading near
            # 1.7e9 s can represent, so sleeping it would not move the clock and the wait never ends.
            return False
        if wait > self.limits.max_block_s:
            raise self._stop(
                Status.RETRY_SCHEDULED,
                f"run again at or after {utc(now + wait)} (effect {record.key!r} backs off after attempt {record.attempts})",
                wake_at=now + wait,
            )
        yield Sleep(wait)
        return True

    def _plan(self, step: Step, now: float) -> EffectRecord:
        assert self._state is not None
        self._working = True
        static = step.static_payload
        if static is not None:
            payload, digest = static
        else:
            try:
                payload = step.evaluate_payload(self._results())
            except InvalidInputError:
                raise
            except Exception as exc:  # the factory is user code (an LLM call, say): name it and keep the cause
                raise PayloadError(f"the payload factory of step {step.step_id!r} raised {describe_exception(exc)}") from exc
            digest = digest_of(payload, what=f"step {step.step_id!r} payload", max_bytes=MAX_VALUE_BYTES, checked=True)
        record = EffectRecord(
            key=step.effect_key(self.task_id),
            step_id=step.step_id,
            action=step.action,
            payload=payload,
            payload_digest=digest,
            updated_at=now,
        )
        self._put(record)
        return record

    def _start_attempt(self, step: Step, record: EffectRecord, next_action: str) -> Steps[EffectRecord]:
        """Record the next attempt as started (attempt number, epoch, budget) and commit it, before
        anything is called: the intent is durable, and the attempt counts even if the process dies.
        Under the async driver the starts of steps that become ready together share one commit."""
        state = self.state
        if self._stopping is not None and not self._stopping.waits:
            raise self._stopping.again()  # a parallel step ended or blocked the run: nothing new starts
        now = self.clock.now()
        lease = self._current_lease()
        self._working = True
        attempt = record.attempts + 1
        record = record.move(EffectState.STARTED, now, attempts=attempt, epoch=lease.epoch, not_before=None, backoff=None, last_error=None)
        self._put(record)
        if _crashpoints.ARMED:
            _crashpoints.hit("attempt.incremented", f"{step.step_id}#{attempt}")
        state.budget = state.budget.started(now)
        state.status = Status.RUNNING
        state.next_action = next_action
        yield COMMIT
        return record

    def _failed_for_good(self, step: Step, record: EffectRecord, exc: PermanentError, *, source: str) -> Stop:
        """``PermanentError``: the step did not happen and never will; the run stops ``blocked``."""
        self._current_lease()
        message = exception_message(exc)
        self._put(record.move(EffectState.FAILED, self.clock.now(), last_error=f"permanent: {message}"))
        self._evidence.observed(source, f"{record.key} attempt {record.attempts} failed permanently: {message}")
        return self._stop(Status.BLOCKED, f"fix the cause of the permanent failure of step {step.step_id!r} ({message}); the run is over")

    def _transient(self, step: Step, record: EffectRecord, exc: Exception) -> Steps[None]:
        assert self._state is not None
        self._current_lease()
        message = exception_message(exc)
        self._evidence.observed(f"adapter:{step.action}", f"{record.key} attempt {record.attempts} failed transiently: {message}")
        record = record.move(EffectState.PLANNED, self.clock.now(), last_error=f"transient: {message}")
        record = self._with_backoff(record)
        self._put(record)
        yield COMMIT

