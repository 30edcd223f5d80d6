"""The rules every step keeps, and the steps that are not effects: calls, timers, questions, stops.

Each procedure is a module-level generator that takes the run's ``Invocation`` first and yields
every request that reaches outside the run (``engine._ops``): the cancellation record and the
approvals are read fresh by yielding ``ReadCancellation`` and ``ReadApprovals``, an attempt is made
durable by yielding ``COMMIT``, the lease to write under is asked for with ``RENEW_LEASE``. A stop
is recorded in the state and committed the same way (``stop``), so these rules hold alike under
the synchronous and the async driver.

Before a step starts: cancellation read fresh, the budgets checked, the record planned, a short
backoff waited out, and the attempt committed before anything is called.

Longer than 500 lines: it is one concept, the rules a step keeps (the stop, the control records,
the readiness, the attempt) with the steps that are nothing but those rules (a call, a timer, a
question); apart, each half would call into the other at every step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence, TypeVar

from .. import _crashpoints
from ..approval import Approval, ApprovalRequest, GateVerdict, evaluate_gate
from ..cancellation import judge_cancellation
from ..canonical import MAX_VALUE_BYTES, JSONValue, canonical_bytes, digest_of, ensure_json
from ..contract import Step
from ..control import ControlRecord, RefusedRecord
from ..envelope import RunState
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
from ..budget import RetryPolicy
from ..intervention import superseded_cancellation
from ..ledger import IN_FLIGHT, EffectRecord, EffectState, recordable_result
from ..messages import SEND_ACTION
from ..outcome import WAITING, Status
from ..telemetry import ProgressReport
from ._config import check_timeout, utc
from ._invocation import Invocation, Stop
from ._ops import COMMIT, READ_APPROVALS, RENEW_LEASE, ApplyTimedOut, CancellationRead, Invoke, ReadCancellation, ReadStore, Sleep, Steps

__all__ = [
    "ask",
    "call",
    "check_cancellation",
    "check_deadline",
    "clamp_to_deadline",
    "complete",
    "failed_for_good",
    "finish",
    "gate",
    "interrupted",
    "mismatch",
    "plan",
    "read_store",
    "ready",
    "record_plan_growth",
    "refused_action",
    "report_progress",
    "start_attempt",
    "step_options",
    "stop",
    "timer",
    "transient",
]


T = TypeVar("T")

_NAMED_STEPS = 20
"""The most required steps the inference of a ``done`` run names one by one."""
_MIN_WAIT_S = 0.001
"""A backoff with less than this left is over (see ``backing_off``)."""


SETTLED_CALL = frozenset({EffectState.VERIFIED, EffectState.FAILED})
"""A call's record is settled either way: a recorded exception replays as ``CallFailed``."""


# -- stops ----------------------------------------------------------------------------------------


def stop(inv: Invocation, status: Status, next_action: str, *, wake_at: float | None = None) -> Steps[Stop]:
    """Record a stop in the state, commit it, and return the exception that unwinds to ``run``
    (``raise (yield from stop(...))``). With steps in parallel, the first stop stands unless a later
    one outranks it; after one that ends or blocks the run no step starts, after one that waits,
    steps that do not depend on the waiting one go on."""
    if status in WAITING:  # a wait ends at the deadline at the latest: the run then stops deadline-exceeded
        wake_at = clamp_to_deadline(inv, wake_at)
    raised, recorded = inv.record_stop(status, next_action, wake_at)
    if recorded:
        yield COMMIT
    return raised


def wait(inv: Invocation, status: Status, next_action: str, *, wake_at: float | None = None) -> Steps[Stop]:
    """A stop that waits for something outside the run (a person, a child task): committed."""
    return (yield from stop(inv, status, next_action, wake_at=wake_at))


def mismatch(inv: Invocation, detail: str, next_action: str) -> Stop:
    """A ``plan-mismatch`` stop: the code or plan asks for something other than what was recorded.
    Not recorded in the state: the state belongs to the plan it was made by.

    ``detail`` says what differed (the function, an argument, a step id, a payload digest, the
    contract); the outcome's next action carries it too, so that whoever reads only that knows."""
    inv.evidence.observed("plan", detail)
    return Stop(Status.PLAN_MISMATCH, f"{next_action} (what differs: {detail})")


def refused_action(inv: Invocation, step_id: str, reason: str) -> Stop:
    """Stop ``unsafe-to-continue`` before a step whose action the contract does not allow.

    A rule with no I/O, so that a face may raise it from wherever it checks (an async face from
    its event loop): the stop is recorded in the state and committed as it unwinds to the facade,
    by the driver of the invocation (``RunIO.settle_stop``)."""
    inv.evidence.unknown("contract", f"step {step_id!r}: {reason}")
    raised, _ = inv.record_stop(
        Status.UNSAFE_TO_CONTINUE,
        f"change the code or the contract: step {step_id!r} asks for an action it may not take ({reason}); nothing was applied",
        None,
    )
    return raised


def finish(inv: Invocation, required: Sequence[str]) -> Steps[Stop]:
    """The stop ``done``, if every step in ``required`` is verified and nothing is in flight."""
    if inv.stopping is not None:  # a parallel step stopped the run, and the plan went on regardless
        raise inv.stopping.again()
    yield from check_cancellation(inv)
    state = inv.state
    effects, verified = state.effects, EffectState.VERIFIED
    missing = [sid for sid in required if (record := effects.get(sid)) is None or record.state is not verified]
    if missing:  # unreachable while every step must be verified before the plan ends; kept as a guard
        raise (yield from stop(inv, Status.UNSAFE_TO_CONTINUE, f"completion evidence missing for {missing}"))
    in_flight = [record.key for record in effects.values() if record.state in IN_FLIGHT]
    if in_flight:
        inv.evidence.unknown("ledger", f"effects still in flight at the end: {in_flight}")
        raise (yield from stop(inv, Status.UNSAFE_TO_CONTINUE, f"check the target for {in_flight[0]!r}; then run again"))
    state.current_step = None
    state.last_failure = None  # a run that finished has no failure to show
    # The steps named while they are few: a plan of 100,000 would make this one item a megabyte.
    named = list(required) if len(required) <= _NAMED_STEPS else f"{len(required)} steps, {list(required[:_NAMED_STEPS])} ..."
    inv.evidence.inferred(f"every required effect is verified: {named}")
    return (yield from stop(inv, Status.DONE, "nothing: every required effect is verified"))


# -- the control records, read fresh ------------------------------------------------------------------


def _describe(kind: str, raw: ControlRecord) -> str:
    """One observation line for a control record: which bytes were read, and why it is unusable."""
    text = f"{kind} {raw.name} ({raw.digest or 'no bytes read'})"
    if isinstance(raw, RefusedRecord):
        return f"{text} refused: {raw.error}"
    if raw.error is not None:
        return f"{text} unusable: {raw.error}"
    return text


def read_store(inv: Invocation, read: Callable[[Any], T]) -> Steps[T]:
    """``read(store)``, performed by the driver (off the event loop under the async one): a face's
    read of records beyond the task's own state, such as the family of a child about to start."""
    value: T = yield ReadStore(read)
    return value


def check_cancellation(inv: Invocation) -> Steps[None]:
    """Read the task's cancellation record fresh (and its ancestors') and stop if it says so, or
    cannot be trusted; stop ``retry-scheduled`` between two steps when the source asks for a pause;
    then stop ``deadline-exceeded`` if the task has a deadline and it passed (``check_deadline``)."""
    state = inv.state
    found: CancellationRead = yield ReadCancellation(inv.cancelled_with)
    if _crashpoints.ARMED:
        _crashpoints.hit("cancellation.read")
    raw = found.record
    if raw is None:
        if found.paused:  # a worker that drains: stop between two steps, committed
            raise (yield from stop(inv, Status.RETRY_SCHEDULED, "run again now: the worker running it stopped between two steps", wake_at=inv.clock.now()))
        if not inv.cancellation_checked:
            inv.evidence.inferred("no cancellation record: new effects are allowed (read again before each one)")
            inv.cancellation_checked = True
        if state.deadline is not None:  # most tasks have none: no call on their every step
            yield from check_deadline(inv)
        return
    whose = found.whose
    if raw.digest and superseded_cancellation(raw.digest) in state.consumed_approvals:
        if not inv.cancellation_checked:
            inv.evidence.inferred(f"cancellation record {raw.name} was superseded by a reopen: it does not cancel the task again")
            inv.cancellation_checked = True
        if state.deadline is not None:
            yield from check_deadline(inv)
        return
    named = "cancellation record" if whose == inv.task_id else f"cancellation record of ancestor task {whose!r}"
    item = inv.evidence.noted("control", _describe(named, raw))
    state.note_control(item)
    judgement = judge_cancellation(raw, whose)
    if judgement.verdict == "refused":
        # Not an operator's word, so not a cancellation (which would end the run for good, in
        # someone's name); but someone wrote in the control area, so nothing new starts either.
        inv.evidence.unknown("control", f"whether an operator asked this run to stop: {judgement.problem}")
        signed = " with `longrun cancel --sign-key`" if inv.signed_cancellations else ""
        raise (
            yield from stop(
                inv,
                Status.UNSAFE_TO_CONTINUE,
                f"inspect the control area: {judgement.problem}; remove it, or cancel{signed} if the run should stop, then run again",
            )
        )
    if judgement.verdict == "damaged":
        # Damaged intent to stop: start nothing, but do not end the run for good on a record
        # nobody can read; an operator decides.
        inv.evidence.unknown("control", f"whether an operator asked this run to stop: {judgement.problem}")
        raise (
            yield from stop(
                inv,
                Status.UNSAFE_TO_CONTINUE,
                f"inspect the control area: {judgement.problem}; remove it, or write a valid cancellation if the run should stop, then run again",
            )
        )
    record = judgement.record
    assert record is not None and judgement.verdict == "cancelled"
    if whose != inv.task_id:
        raise (
            yield from stop(
                inv,
                Status.CANCELLED,
                f"nothing: its ancestor task {whose!r} was cancelled by {record.requested_by}: {record.reason}; "
                "no new effect will start",
            )
        )
    raise (
        yield from stop(
            inv, Status.CANCELLED,
            f"nothing: the run was cancelled by {record.requested_by}: {record.reason}; no new effect will start "
            f"(to go on after all: {_reopen_command(inv)})",
        )  # fmt: skip
    )


def clamp_to_deadline(inv: Invocation, wake_at: float | None) -> float | None:
    """``wake_at``, or the task's deadline if that comes first (or if ``wake_at`` is None)."""
    deadline = inv.state.deadline
    if deadline is None:
        return wake_at
    return deadline.at if wake_at is None or deadline.at < wake_at else wake_at


def check_deadline(inv: Invocation) -> Steps[None]:
    """Stop ``deadline-exceeded`` if the task's recorded deadline has passed (by the run's clock).

    Judged before every step starts (``check_cancellation`` calls it), never while an effect is
    in flight: an effect already started is settled (observed on recovery) before this stop."""
    deadline = inv.state.deadline
    if deadline is None:
        return
    now = inv.clock.now()
    if now < deadline.at:
        return
    inv.evidence.observed("deadline", f"the task's deadline {utc(deadline.at)} ({deadline.source}) passed at {utc(now)}")
    more = _reopen_command(inv, " --add-time S")
    raise (
        yield from stop(
            inv,
            Status.DEADLINE_EXCEEDED,
            f"nothing: the task's deadline {utc(deadline.at)} passed; no new step will start "
            f"(its unfinished children are cancelled; to give it S more seconds: {more})",
        )
    )


def _reopen_command(inv: Invocation, options: str = "") -> str:
    """How an operator reopens a task that ended unfinished (``longrun.intervention``)."""
    signed = " --sign-key <key file>" if inv.signed_approvals else ""
    return f"`longrun resume {inv.store_spec} {inv.task_id} --reopen --reason TEXT{options}{signed}`"


def _question(record: EffectRecord) -> str:
    question = record.payload.get("question") if isinstance(record.payload, dict) else None
    text = str(question) if question is not None else "?"
    return repr(text if len(text) <= 120 else text[:117] + "...")


def gate(inv: Invocation, step: Step, record: EffectRecord, waiting: Status) -> Steps[tuple[EffectRecord, Approval]]:
    """Read the approval records fresh and consume the one approval that matches the step
    exactly, or stop ``waiting`` (``awaiting-approval`` or ``awaiting-input``)."""
    state = inv.state
    now = inv.clock.now()
    request = state.approval_requests.get(step.step_id)
    if (
        request is None
        or request.expired(now)
        or request.payload_digest != record.payload_digest
        or request.plan_digest != inv.plan_digest
    ):
        request = ApprovalRequest(
            task_id=inv.task_id,
            plan_digest=inv.plan_digest,
            step_id=step.step_id,
            payload_digest=record.payload_digest,
            action=step.action,
            requested_at=now,
            expires_at=now + inv.limits.approval_ttl_s,
        )
        state.approval_requests[step.step_id] = request
        inv.dirty = True
    records: list[ControlRecord] = yield READ_APPROVALS
    refused = 0
    for raw in records:
        refused += isinstance(raw, RefusedRecord)
        state.note_control(inv.evidence.noted("control", _describe("approval record", raw)))
    decision = evaluate_gate(request, records, frozenset(state.consumed_approvals), now)
    if decision.verdict is GateVerdict.GRANTED:
        assert decision.approval is not None
        approval = decision.approval
        for reason in decision.reasons:
            inv.evidence.inferred(reason)
        inv.evidence.inferred(f"approval {approval.approval_id} by {approval.approver} matches step {step.step_id!r} exactly; consumed once")
        state.consumed_approvals.append(approval.approval_id)
        del state.approval_requests[step.step_id]
        record = replace(record, approval_id=approval.approval_id)
        inv.put(record)
        if _crashpoints.ARMED:
            _crashpoints.hit("approval.consumed", step.step_id)
        return record, approval
    for reason in decision.reasons:
        inv.evidence.unknown("approval", reason)
    if decision.verdict is GateVerdict.REFUSED:
        raise (
            yield from stop(
                inv,
                Status.UNSAFE_TO_CONTINUE,
                f"remove the over-broad approval records for step {step.step_id!r} and approve exactly the pending request",
            )
        )
    signed = " --sign-key <key file>" if inv.signed_approvals else ""
    note = f" ({refused} approval record{'s' if refused != 1 else ''} refused: see the unknowns)" if refused else ""
    if waiting is Status.AWAITING_INPUT:
        raise (
            yield from stop(
                inv,
                Status.AWAITING_INPUT,
                f"answer the question of step {step.step_id!r} ({_question(record)}) with "
                f"`longrun answer {inv.store_spec} {inv.task_id} {step.step_id} VALUE{signed}`, then run again{note}",
            )
        )
    raise (
        yield from stop(
            inv,
            Status.AWAITING_APPROVAL,
            f"approve step {step.step_id!r} (action {step.action!r}, payload {record.payload_digest}) "
            f"with `longrun approve {inv.store_spec} {inv.task_id} --step {step.step_id}{signed}`, then run again{note}",
        )
    )


# -- what every step keeps before it starts -----------------------------------------------------------


def step_options(inv: Invocation, step: Step, retry: RetryPolicy | None, timeout_s: float | None) -> None:
    """A step's own retry policy and timeout, which override the run's for it."""
    if retry is not None:
        inv.policies[step.step_id] = retry
    if timeout_s is not None:
        inv.timeouts[step.step_id] = check_timeout(timeout_s, f"step {step.step_id!r}")


def ready(
    inv: Invocation, step: Step, settled: frozenset[EffectState], *, exhausted_fails: bool = False
) -> Steps[tuple[EffectRecord, bool]]:
    """The step's record and True if it is settled (replayed as it is); else the record ready
    for its next attempt: cancellation read fresh, the budgets checked, the record planned,
    and a short backoff waited out (then everything again: a wait is a new moment).

    ``exhausted_fails``: a step whose own attempts ran out is settled ``failed`` (the face raises
    ``EffectFailed``: ``on_exhausted="raise"``) instead of stopping the run ``limits-exhausted``."""
    state = inv.state
    while True:
        record = state.effects.get(step.step_id)
        if record is not None and record.state in settled:
            return record, True
        yield from check_cancellation(inv)
        state.current_step = step.step_id
        now = inv.clock.now()
        failed = yield from _check_budget(inv, record, exhausted_fails)
        if failed is not None:
            return failed, True
        if record is None:
            record = plan(inv, step, now)
        if record.not_before is None or not (yield from _backing_off(inv, record, now)):
            return record, False


def _check_budget(inv: Invocation, record: EffectRecord | None, exhausted_fails: bool = False) -> Steps[EffectRecord | None]:
    """Stop ``limits-exhausted`` if the run's budget or the step's attempts ran out; with
    ``exhausted_fails``, a step whose attempts ran out is settled ``failed`` and returned instead."""
    exhausted = inv.state.budget.exhausted(inv.limits, pending_s=inv.monotonic() - inv.worked_mark)
    if exhausted is None and record is not None:
        exhausted = inv.limits.attempts_exhausted(record.key, record.attempts, record.last_error)
        if exhausted is not None and exhausted_fails and record.state is EffectState.PLANNED:
            inv.evidence.observed("budget", f"{exhausted}; raised into the function (on_exhausted='raise')")
            failure: JSONValue = {
                "type": "EffectFailed",
                "attempts": record.attempts,
                "last_error": record.last_error or "no error was recorded",
            }
            failed = record.move(EffectState.FAILED, inv.clock.now(), result=failure, not_before=None, backoff=None)
            inv.put(failed)  # committed with the next step's start or the stop: replayed as recorded
            return failed
    if exhausted is not None:
        inv.evidence.observed("budget", exhausted)
        more = _reopen_command(inv, " --add-attempts N")
        raise (yield from stop(inv, Status.LIMITS_EXHAUSTED, f"review why the budget ran out ({exhausted}); the run is over (to give it more: {more})"))
    return None


def _backing_off(inv: Invocation, record: EffectRecord, now: float) -> Steps[bool]:
    """True after waiting out ``record``'s short backoff (the caller starts over); stops for a long one."""
    wait_s, record = inv.backoff_wait(record, now)
    if wait_s < _MIN_WAIT_S:
        # Over, or as good as over: a remainder this small can be below what a clock reading near
        # 1.7e9 s can represent, so sleeping it would not move the clock and the wait never ends.
        return False
    if wait_s > inv.limits.max_block_s:
        raise (
            yield from stop(
                inv,
                Status.RETRY_SCHEDULED,
                f"run again at or after {utc(now + wait_s)} (effect {record.key!r} backs off after attempt {record.attempts})",
                wake_at=now + wait_s,
            )
        )
    yield Sleep(wait_s)
    return True


def plan(inv: Invocation, step: Step, now: float | None = None) -> EffectRecord:
    """The step's record, planned now (it goes out with the next commit) unless it exists."""
    if now is None:
        existing = inv.state.effects.get(step.step_id)
        if existing is not None:
            return existing
        now = inv.clock.now()
    inv.working = True
    static = step.static_payload
    if static is not None:
        payload, digest = static
    else:
        try:
            payload = step.evaluate_payload(inv.results())
        except InvalidInputError:
            raise
        except Exception as exc:  # the factory is user code (an LLM call, say): name it and keep the cause
            raise PayloadError(f"the payload factory of step {step.step_id!r} raised {describe_exception(exc)}") from exc
        digest = digest_of(payload, what=f"step {step.step_id!r} payload", max_bytes=MAX_VALUE_BYTES, checked=True)
    record = EffectRecord(
        key=step.effect_key(inv.task_id),
        step_id=step.step_id,
        action=step.action,
        payload=payload,
        payload_digest=digest,
        updated_at=now,
    )
    inv.put(record)
    return record


def start_attempt(inv: Invocation, step: Step, record: EffectRecord, next_action: str) -> Steps[EffectRecord]:
    """Record the next attempt as started (attempt number, epoch, budget) and commit it, before
    anything is called: the intent is durable, and the attempt counts even if the process dies.
    Under the async driver the starts of steps that become ready together share one commit."""
    state = inv.state
    if inv.stopping is not None and not inv.stopping.waits:
        raise inv.stopping.again()  # a parallel step ended or blocked the run: nothing new starts
    now = inv.clock.now()
    lease = yield RENEW_LEASE
    inv.working = True
    attempt = record.attempts + 1
    record = record.move(EffectState.STARTED, now, attempts=attempt, epoch=lease.epoch, not_before=None, backoff=None, last_error=None)
    inv.put(record)
    if _crashpoints.ARMED:
        _crashpoints.hit("attempt.incremented", f"{step.step_id}#{attempt}")
    state.budget = state.budget.started(now)
    state.status = Status.RUNNING
    state.next_action = next_action
    yield COMMIT
    return record


def failed_for_good(inv: Invocation, step: Step, record: EffectRecord, exc: PermanentError, *, source: str) -> Steps[Stop]:
    """``PermanentError``: the step did not happen and never will; the run stops ``blocked``."""
    yield RENEW_LEASE
    message = exception_message(exc)
    inv.put(record.move(EffectState.FAILED, inv.clock.now(), last_error=f"permanent: {message}"))
    inv.evidence.observed(source, f"{record.key} attempt {record.attempts} failed permanently: {message}")
    again = _reopen_command(inv)
    return (
        yield from stop(
            inv, Status.BLOCKED, f"fix the cause of the permanent failure of step {step.step_id!r} ({message}); the run is over (after the fix: {again})"
        )
    )


def transient(inv: Invocation, step: Step, record: EffectRecord, exc: Exception) -> Steps[None]:
    """A failure that certainly did not happen: planned again after a backoff, committed at once."""
    yield RENEW_LEASE
    message = exception_message(exc)
    inv.evidence.observed(f"adapter:{step.action}", f"{record.key} attempt {record.attempts} failed transiently: {message}")
    record = record.move(EffectState.PLANNED, inv.clock.now(), last_error=f"transient: {message}")
    inv.put(inv.with_backoff(record))
    yield COMMIT


# -- steps that are not effects -------------------------------------------------------------------


def call(
    inv: Invocation,
    step: Step,
    invoke: Callable[[], object],
    *,
    retry: RetryPolicy | None = None,
    timeout_s: float | None = None,
    awaitable: bool = False,
) -> Steps[EffectRecord]:
    """Run ``invoke`` once for a step that is not an external effect; return its settled record.

    A recorded call returns its record without calling anything: ``verified`` with the value
    it returned, or ``failed`` with the exception it raised (``result`` holds its type and
    message). The attempt is committed before ``invoke`` runs, so retry budgets survive a
    restart; a call the process died in is simply called again (a call has nothing to
    observe). ``TransientError`` backs off and retries; ``PermanentError`` stops ``blocked``.
    A call that runs past ``timeout_s`` counts as a transient failure.
    """
    state = inv.state
    step_options(inv, step, retry, timeout_s)
    while True:
        record, settled = yield from ready(inv, step, SETTLED_CALL)
        if settled:
            return record
        record = yield from start_attempt(inv, step, record, f"call step {step.step_id!r} again (it was interrupted)")
        attempt = record.attempts
        if _crashpoints.ARMED:
            _crashpoints.hit("call.started", f"{step.step_id}#{attempt}")
        try:
            # A value that cannot be recorded is the call's failure, like an exception it raised:
            # replay must return exactly what the call returned, so no stand-in will do.
            value = yield Invoke(invoke, inv.timeouts.get(step.step_id, inv.timeout_s), awaitable)
            result = ensure_json(value, what=f"the value returned by step {step.step_id!r}")
            if recordable_result(result, what=f"the value returned by step {step.step_id!r}")[1] is not None:
                size = len(canonical_bytes(result))
                raise SizeLimitError(
                    f"the value returned by step {step.step_id!r} is {size} bytes encoded, over MAX_VALUE_BYTES "
                    f"({MAX_VALUE_BYTES}): return a reference (a path, a digest) instead",
                    size=size, limit=MAX_VALUE_BYTES, limit_name="MAX_VALUE_BYTES",
                )  # fmt: skip
        except (TransientError, ApplyTimedOut) as exc:
            yield from transient(inv, step, record, exc)
            continue
        except PermanentError as exc:
            raise (yield from failed_for_good(inv, step, record, exc, source=f"call:{step.step_id}")) from None
        except Exception as exc:  # recorded as the call's outcome: replayed identically, never retried
            yield RENEW_LEASE
            # Described without trusting its __str__: one that raises is still the call's outcome.
            described = describe_exception(exc)
            failure: JSONValue = {"type": exception_type_name(exc), "message": exception_message(exc)}
            record = record.move(EffectState.FAILED, inv.clock.now(), result=failure, last_error=described)
            inv.evidence.observed(f"call:{step.step_id}", f"attempt {attempt} raised {described}")
            inv.put(record)
            return record
        if _crashpoints.ARMED:
            _crashpoints.hit("call.returned", f"{step.step_id}#{attempt}")
        yield RENEW_LEASE
        now = inv.clock.now()
        record = record.move(EffectState.VERIFIED, now, result=result, receipt="returned")
        state.budget = state.budget.progressed(now, inv.take_work())
        inv.put(record)  # committed with the next step's start, or the stop
        return record


def timer(inv: Invocation, step: Step, seconds: float) -> Steps[EffectRecord]:
    """A durable wait: the wake time is recorded when the step is first reached.

    Within ``Limits.max_block_s`` the run waits; a longer wait stops the run ``sleeping``
    with ``wake_at``. Run it again at or after that time and the step completes.
    """
    state = inv.state
    record = state.effects.get(step.step_id)
    if record is not None and record.state is EffectState.VERIFIED:
        return record
    yield from check_cancellation(inv)
    state.current_step = step.step_id
    now = inv.clock.now()
    if record is None:
        record = plan(inv, step, now).with_changes(not_before=now + seconds)
        inv.put(record)
    wake_at = record.not_before if record.not_before is not None else now
    wake_at = clamp_to_deadline(inv, wake_at) or wake_at  # a sleep past the deadline ends at it
    if now < wake_at:
        wait_s = wake_at - now
        if wait_s > inv.limits.max_block_s:
            raise (yield from stop(inv, Status.SLEEPING, f"run again at or after {utc(wake_at)} (step {step.step_id!r} sleeps until then)", wake_at=wake_at))
        yield COMMIT  # the wake time outlives a process that stops during the wait
        yield Sleep(wait_s)
        yield from check_deadline(inv)
        now = inv.clock.now()
    record = record.move(EffectState.STARTED, now).move(EffectState.VERIFIED, now, not_before=None)
    inv.put(record)
    return record


def ask(inv: Invocation, step: Step, choices: Sequence[JSONValue] | None) -> Steps[EffectRecord]:
    """A person's answer as a value: an approval of the question (bound to task, plan, step and
    the question's digest, single use, through the approval sources) that carries the answer.

    Without an answer the run stops ``awaiting-input``. An answer that is not among
    ``choices`` is consumed, recorded as refused, and asked again."""
    state = inv.state
    while True:
        record = state.effects.get(step.step_id)
        if record is not None and record.state is EffectState.VERIFIED:
            return record
        yield from check_cancellation(inv)
        state.current_step = step.step_id
        if record is None:
            record = plan(inv, step, inv.clock.now())
        record, approval = yield from gate(inv, step, record, Status.AWAITING_INPUT)
        if choices is not None and approval.answer not in list(choices):
            inv.evidence.unknown("answer", f"answer {approval.answer!r} by {approval.approver} is not one of {list(choices)!r}")
            inv.put(record.with_changes(approval_id=None, last_error=f"answer {approval.answer!r} is not a choice"))
            continue
        now = inv.clock.now()
        inv.evidence.observed("answer", f"step {step.step_id!r} answered by {approval.approver}")
        record = record.move(EffectState.STARTED, now).move(EffectState.VERIFIED, now, result=approval.answer)
        state.budget = state.budget.progressed(now, inv.take_work())
        inv.put(record)
        return record


def complete(inv: Invocation, step_id: str, result: JSONValue, *, failed: bool = False) -> EffectRecord:
    """Settle a planned internal step (a child task's result, a function's return value)."""
    now = inv.clock.now()
    state = inv.state
    record = state.effects[step_id].move(EffectState.STARTED, now)
    if failed:
        record = record.move(EffectState.FAILED, now, result=result, last_error=str(result))
    else:
        record = record.move(EffectState.VERIFIED, now, result=result)
        state.budget = state.budget.progressed(now, inv.take_work())
    inv.put(record)
    return record


PROGRESS_COMMIT_S = 1.0
"""A progress report commits by itself when the state's last commit is at least this old; a
report made sooner rides on the next commit (a step's start or end, the stop)."""


def report_progress(inv: Invocation, done: float, total: float | None, note: str | None) -> Steps[ProgressReport]:
    """Record a durable function's progress in the state (``RunState.progress``): not a step, so
    nothing a replay compares. It goes out with the next commit, or commits now if the last one
    is ``PROGRESS_COMMIT_S`` old (never while a stop is being settled)."""
    for name, value in (("done", done), ("total", total)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise InvalidInputError(f"run.progress: {name} must be a number, got {type(value).__name__}")
    if note is not None and not isinstance(note, str):
        raise InvalidInputError(f"run.progress: note must be a string, got {type(note).__name__}")
    state = inv.state
    now = inv.clock.now()
    previous = state.progress
    report = ProgressReport.first(done, total, note, now) if previous is None else previous.then(done, total, note, now)
    state.progress = report
    inv.dirty = True
    if inv.stopping is None and now - state.updated_at >= PROGRESS_COMMIT_S:
        yield COMMIT
    return report


def record_plan_growth(inv: Invocation, state: RunState, recorded_steps: int, steps: int) -> None:
    """Adopt a plan that appends steps to the recorded one: its digest is recorded now, and
    approval requests issued under the old digest are dropped, to be issued again under it."""
    inv.evidence.observed("plan", f"recorded plan digest {state.plan_digest} ({recorded_steps} steps)")
    inv.evidence.inferred(f"the plan grew from {recorded_steps} to {steps} steps by appending; recorded steps are unchanged")
    state.plan_digest = inv.plan_digest
    for step_id in [sid for sid, request in state.approval_requests.items() if request.plan_digest != inv.plan_digest]:
        del state.approval_requests[step_id]
    inv.dirty = True


def interrupted(inv: Invocation, record: EffectRecord) -> None:
    """A call the process died in: calls have no effect to observe, so it may simply run again.
    So may a send: its key makes a copy the receiver already holds a duplicate, stored once."""
    if record.action == SEND_ACTION:
        inv.evidence.inferred(f"send {record.step_id!r} was interrupted (attempt {record.attempts}); it is sent again under the same key")
        inv.put(record.move(EffectState.PLANNED, inv.clock.now(), last_error="interrupted: the process stopped during the send"))
        return
    inv.evidence.inferred(f"call {record.step_id!r} was interrupted (attempt {record.attempts}); it will be called again")
    inv.put(record.move(EffectState.PLANNED, inv.clock.now(), last_error="interrupted: the process stopped during the call"))
