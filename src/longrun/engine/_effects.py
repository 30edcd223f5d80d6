"""One effect from planned to verified, settled by observation, and the recovery procedure.

Module-level step procedures over an ``Invocation`` (see ``engine._steps`` for the rules every step
keeps first). An effect: an observation first where the target may be ahead of the state, the
approval gate, the intent committed before ``apply``, and the outcome settled by observation (a
timed-out apply included). Recovery: the state loaded under the lease, checked against the plan,
and every effect left in flight observed before anything else. Every call of an adapter, and every
read or write of the store, is a yielded request (``engine._ops``).
"""

from __future__ import annotations

import logging
import operator
from itertools import islice, repeat
from dataclasses import replace
from typing import Callable, Sequence

from .. import _crashpoints
from ..adapters import Observation, ObservedState
from ..budget import BudgetCounters, RetryPolicy, describe_wall_gap
from ..canonical import printable
from ..deadline import TaskDeadline, earliest
from ..contract import Step, is_internal
from ..envelope import RunState, recorded_before_queued
from ..errors import PermanentError, StateUnrecoverableError, TransientError, UnknownActionError, describe_exception
from ..lease import Lease
from ..intervention import APPLIED, REOPENABLE, find_reopen, find_resolution, superseded_cancellation
from ..ledger import IN_FLIGHT, EffectRecord, EffectState, check_receipt, raised_into_function
from ..events import record_fields
from ..outcome import TERMINAL, Evidence, Status
from ..protocols import AnyEffectAdapter, LoadResult
from ..recovery import Reconciled, Verdict, settle
from ._config import utc
from ._failures import crashed, died_mid_step
from ._invocation import Invocation, Stop
from ._ops import COMMIT, READ_APPROVALS, RENEW_LEASE, Apply, ApplyTimedOut, CancellationRead, Gather, Load, Observe, ReadCancellation, Steps
from ._steps import failed_for_good, gate, interrupted, ready, start_attempt, step_options, stop, transient

log = logging.getLogger("longrun")

__all__ = ["ON_EXHAUSTED", "effect", "recover", "verified_prefix"]


_VERIFIED_STATE = EffectState.VERIFIED
"""A plain reference: reading an enum member off its class costs a descriptor call each time."""
_VERIFIED = frozenset({EffectState.VERIFIED})
_state_of = operator.attrgetter("state")
_step_id_of = operator.attrgetter("step_id")


def verified_prefix(inv: Invocation, steps: Sequence[Step]) -> int:
    """How many of ``steps``, from the first, are verified: the steps that ``effect`` would
    replay (return at once, changing nothing). A face that makes its steps in order starts at
    the first step after them.

    Found in passes in C, not a lookup and a test per step (a resumed plan may have 100,000):
    when the ledger holds the plan's first steps first, as a run in order leaves it, its keys are
    compared with the plan's step ids as two lists and its states counted in order; otherwise each
    step's record is looked up by id."""
    effects = inv.state.effects
    step_ids = list(map(_step_id_of, steps))
    keys = list(effects)
    shared = min(len(step_ids), len(keys))
    if keys[:shared] == step_ids[:shared]:
        # Every step past ``shared`` has no record: the keys are all among the first ``shared`` ids.
        states = list(map(_state_of, islice(effects.values(), shared)))
    else:
        states = list(map(getattr, map(effects.get, step_ids), repeat("state"), repeat(None)))
    verified = states.count(_VERIFIED_STATE)
    if states[:verified].count(_VERIFIED_STATE) == verified:  # the verified ones are the first ones
        return verified
    return next(index for index, state in enumerate(states) if state is not _VERIFIED_STATE)


_EXHAUSTED_FAILS = frozenset({EffectState.VERIFIED, EffectState.FAILED})
ON_EXHAUSTED = ("stop", "raise")
"""What an effect whose attempts ran out does: stop the run ``limits-exhausted``, or settle ``failed``
(the face raises ``EffectFailed`` into the function, now and on every replay)."""


def effect(
    inv: Invocation, step: Step, *, retry: RetryPolicy | None = None, timeout_s: float | None = None, on_exhausted: str = "stop"
) -> Steps[EffectRecord]:
    """Make one step's effect verified, or stop; return its verified record (with
    ``on_exhausted="raise"``: or its ``failed`` record, once its attempts ran out).

    A verified step returns at once (that is replay). Otherwise, in order: cancellation read
    fresh, the budgets, the record planned, a backoff honoured, an observation first where the
    target may be ahead of the state, the approval gate, and then the intent persisted before
    the adapter is called and the outcome settled by observation. ``timeout_s`` (else the
    run's) bounds each ``apply``: a synchronous adapter then runs in a worker thread.
    """
    state = inv.state
    if retry is not None or timeout_s is not None:
        step_options(inv, step, retry, timeout_s)
    raises = on_exhausted == "raise"
    while True:
        record, settled = yield from ready(inv, step, _EXHAUSTED_FAILS if raises else _VERIFIED, exhausted_fails=raises)
        if settled:
            return record
        if state.reconcile_all:
            record = yield from _reconcile_before_start(inv, step, record)
            if record.state is EffectState.VERIFIED:
                continue
        elif record.state is EffectState.PLANNED and (inv.observe_next or (step.observe_first and record.attempts == 0)):
            record = yield from _observe_before_apply(inv, step, record)
            if record.state is EffectState.VERIFIED:
                continue
        if step.approval and record.approval_id is None:
            record, _ = yield from gate(inv, step, record, Status.AWAITING_APPROVAL)
        yield from _execute(inv, step, record)


def _reconcile_before_start(inv: Invocation, step: Step, record: EffectRecord) -> Steps[EffectRecord]:
    """After recovery from a backup, the lost revision may have started this step: observe first."""
    record = record.move(EffectState.UNCERTAIN, inv.clock.now(), last_error="state recovered from a backup: a start may have been lost")
    settled = yield from reconcile(inv, record)
    if settled.verdict is Verdict.UNSAFE:
        raise (yield from unsafe(inv, settled))
    if settled.verdict is Verdict.RETRY and inv.in_flight <= 1:
        # Steps run in order, so nothing after the first step observed absent can have started.
        inv.state.reconcile_all = False
        inv.evidence.inferred("recovery from the backup is reconciled: later steps cannot have started")
    return inv.state.effects[step.step_id]


def _observe_before_apply(inv: Invocation, step: Step, record: EffectRecord) -> Steps[EffectRecord]:
    """Observe a planned effect before applying it: the first apply of this call, or the first
    apply ever of an ``observe_first`` step. Applied: verified (committed with the next start or
    the stop), never applied again. Absent: applied, and the effects after it are not observed
    (steps run in order). Unknown: applied, since the ledger says it never started, except
    for an ``observe_first`` step at a target that does not deduplicate: the run stops
    ``unsafe-to-continue`` rather than guess."""
    state = inv.state
    strict = step.observe_first and record.attempts == 0
    why = "observed before its first apply" if strict else "observed before the first apply of this run"
    # planned -> uncertain -> (verified | planned): the ledger's move for "a start may have been lost".
    probe = record.move(EffectState.UNCERTAIN, inv.clock.now())
    adapter = inv.adapters.get(step.action) or _no_adapter(inv, step)
    observed = yield Observe(adapter, inv.request(record, max(record.attempts, 1)), inv.timeouts.get(step.step_id, inv.timeout_s))
    settled = settle(probe, observed, adapter.deduplicates, inv.clock.now())
    observation = settled.observation
    inv.evidence.observed(f"target:{step.action}", f"{record.key}: {observation.state.value} ({observation.evidence}), {why}")
    if settled.verdict is Verdict.VERIFIED:
        inv.evidence.inferred(f"{record.key} was already applied; verified by observation, it will not be applied again")
        state.budget = state.budget.progressed(inv.clock.now(), inv.take_work())
        inv.put(settled.record)
        return settled.record
    if inv.in_flight <= 1:  # effects in parallel may have started beside one that did not
        inv.observe_next = False
    if observation.state is ObservedState.ABSENT:
        return record
    if settled.verdict is Verdict.UNSAFE and strict:
        inv.evidence.unknown(f"target:{step.action}", f"{settled.reason}; the step is marked observe_first")
        inv.put(replace(settled.record, last_error="observe_first: the target cannot say whether it was already applied"))
        raise (yield from unsafe(inv, settled))
    if settled.verdict is Verdict.RETRY:
        inv.evidence.inferred(f"{record.key} may be applied: {settled.reason}")
    else:
        inv.evidence.inferred(f"{record.key}: the target cannot say whether it was applied; the ledger says it never started")
    return record


def _no_adapter(inv: Invocation, step: Step) -> AnyEffectAdapter:
    """The faces check every action before a run; a plan that grew may name one with no adapter."""
    raise UnknownActionError(f"step {step.step_id!r} uses action {step.action!r}, which has no adapter (have: {sorted(inv.adapters)})")


def _execute(inv: Invocation, step: Step, record: EffectRecord) -> Steps[None]:
    state = inv.state
    if inv.in_flight <= 1:
        inv.observe_next = False
    record = yield from start_attempt(inv, step, record, f"observe whether effect {record.key!r} took place")
    attempt = record.attempts
    if _crashpoints.ARMED:
        _crashpoints.hit("effect.intent-persisted", f"{step.step_id}#{attempt}")
    adapter = inv.adapters.get(step.action) or _no_adapter(inv, step)
    timeout_s = inv.timeouts.get(step.step_id, inv.timeout_s)
    request = inv.request(record, attempt, deadline_s=timeout_s)
    try:
        receipt = yield Apply(adapter, request, timeout_s)
    except TransientError as exc:
        yield from transient(inv, step, record, exc)
        return
    except PermanentError as exc:
        raise (yield from failed_for_good(inv, step, record, exc, source=f"adapter:{step.action}")) from None
    except ApplyTimedOut as exc:
        yield from _timed_out(inv, step, record, exc)
        return
    except Exception as exc:  # outcome unknown: recorded as uncertain and observed, never retried blind
        described = describe_exception(exc)  # never trusting the adapter's exception to print itself
        log.warning(
            "task %s: step %s, attempt %d: apply of %s raised %s; observing the target to learn whether it took place",
            inv.task_id, step.step_id, attempt, record.key, described, extra={"task": inv.task_id, **record_fields(record)},
        )  # fmt: skip
        yield RENEW_LEASE
        inv.evidence.observed(f"adapter:{step.action}", f"{record.key} attempt {attempt} raised {described}")
        record = record.move(EffectState.UNCERTAIN, inv.clock.now(), last_error=described)
        inv.put(record)
        yield from _settle(inv, record)
        return
    if _crashpoints.ARMED:
        _crashpoints.hit("effect.applied", f"{step.step_id}#{attempt}")
    # No lease check here: nothing is written before the next commit, which takes the current
    # lease (renewed if late, ``Stop(lease-lost)`` if renewal failed) and is fenced by the store.
    checked = check_receipt(receipt, key=record.key, step_id=step.step_id, already_spent=record.cost + state.budget.cost_spent)
    for problem in checked.problems:  # an adapter bug, or a result too large to keep: evidence, never dropped
        log.warning("task %s: step %s: %s: %s", inv.task_id, step.step_id, record.key, problem, extra={"task": inv.task_id, **record_fields(record)})
        inv.evidence.unknown(f"adapter:{step.action}", problem)
    inv.evidence.observed(f"adapter:{step.action}", "receipt for {} attempt {}: {}", record.key, attempt, checked.evidence)
    cost = checked.cost
    record = record.move(EffectState.ACKNOWLEDGED, inv.clock.now(), receipt=checked.evidence, result=checked.result, cost=record.cost + cost)
    inv.put(record)
    if cost:  # most adapters charge nothing: the counters stay the very same record
        state.budget = state.budget.spent(cost)
    yield from _settle(inv, record)


def _settle(inv: Invocation, record: EffectRecord) -> Steps[None]:
    """Observe an acknowledged or uncertain effect right after ``apply``."""
    settled = yield from reconcile(inv, record)
    if settled.verdict is Verdict.UNSAFE:
        raise (yield from unsafe(inv, settled))
    if settled.verdict is Verdict.RETRY:
        yield COMMIT  # the retry's backoff must survive a restart


def _timed_out(inv: Invocation, step: Step, record: EffectRecord, exc: ApplyTimedOut) -> Steps[None]:
    """An ``apply`` past its timeout: uncertain, and observed. An async one was cancelled, so it
    settles like any unknown outcome. A synchronous one may still be running in its thread: it is
    verified if the target already shows it, and otherwise never applied again by this run, which
    stops; the lease is kept until that thread ends, so no other run can start it meanwhile."""
    yield RENEW_LEASE
    inv.evidence.observed(f"adapter:{step.action}", f"{record.key} attempt {record.attempts} {exc}")
    record = record.move(EffectState.UNCERTAIN, inv.clock.now(), last_error=printable(f"timeout: {exc}"))
    inv.put(record)
    if exc.pending is None:
        yield from _settle(inv, record)
        return
    inv.stragglers.append(exc.pending)
    adapter = inv.adapters.get(step.action) or _no_adapter(inv, step)
    observed = yield Observe(adapter, inv.request(record, record.attempts), inv.timeouts.get(step.step_id, inv.timeout_s))
    inv.evidence.observed(f"target:{step.action}", f"{record.key}: {observed.state.value} ({observed.evidence})")
    if observed.state is ObservedState.APPLIED:
        settled = settle(record, observed, adapter.deduplicates, inv.clock.now())
        inv.evidence.inferred(f"{record.key} verified by observation; it will not be applied again")
        inv.state.budget = inv.state.budget.progressed(inv.clock.now(), inv.take_work())
        inv.put(settled.record)
        return
    inv.put(replace(record, evidence=observed.evidence))
    inv.evidence.unknown(f"adapter:{step.action}", f"{record.key}: the timed-out attempt may still reach the target")
    wake_at = inv.clock.now() + inv.policy(record).delay(record.key, record.attempts)
    raise (
        yield from stop(
            inv,
            Status.RETRY_SCHEDULED,
            f"run again at or after {utc(wake_at)}: effect {record.key!r} timed out after {exc.timeout_s:g} s and its "
            "attempt may still be running here (this run keeps the lease until it ends); the next run observes it "
            "before anything is applied again",
            wake_at=wake_at,
        )
    )


def reconcile(inv: Invocation, record: EffectRecord) -> Steps[Reconciled]:
    """Settle an effect whose outcome the ledger does not know by observing it (``recovery.settle``)."""
    inv.working = True
    adapter = inv.adapters.get(record.action)
    if adapter is None:
        # An effect this code no longer has an adapter for cannot be observed: never guessed.
        observation = Observation.unknown(f"no adapter for action {record.action!r} to observe it with")
        uncertain = record if record.state is EffectState.UNCERTAIN else record.move(EffectState.UNCERTAIN, inv.clock.now())
        settled = Reconciled(uncertain, Verdict.UNSAFE, observation, f"outcome of {record.key!r} is unknown: {observation.evidence}")
    else:
        observed = yield Observe(adapter, inv.request(record, max(record.attempts, 1)), inv.timeouts.get(record.step_id, inv.timeout_s))
        settled = settle(record, observed, adapter.deduplicates, inv.clock.now(), observer=f"{type(adapter).__name__}.observe")
    observation = settled.observation
    inv.evidence.observed(f"target:{record.action}", "{}: {} ({})", record.key, observation.state.value, observation.evidence)
    record = settled.record
    if settled.verdict is Verdict.VERIFIED:
        inv.evidence.inferred("{} verified by observation; it will not be applied again", record.key)
        inv.state.budget = inv.state.budget.progressed(inv.clock.now(), inv.take_work())
    elif settled.verdict is Verdict.RETRY:
        inv.evidence.inferred(f"{record.key} may be applied again: {settled.reason}")
        record = inv.with_backoff(record)
    else:
        inv.evidence.unknown(f"target:{record.action}", settled.reason)
    inv.put(record)
    return settled


def unsafe(inv: Invocation, settled: Reconciled) -> Steps[Stop]:
    return (
        yield from stop(
            inv,
            Status.UNSAFE_TO_CONTINUE,
            f"check the target for effect {settled.record.key!r} ({settled.reason}) and record what you find: "
            f"`longrun resolve {inv.store_spec} {inv.task_id} {settled.record.step_id} --applied|--absent --evidence TEXT`"
            f"{' --sign-key <key file>' if inv.signed_approvals else ''}; then run again (without a resolution it is "
            "observed again before anything is applied)",
        )
    )


def recover(inv: Invocation, lease: Lease, initial: Callable[[RunState], None], accept: Callable[[RunState], None]) -> Steps[None]:
    """The recovery procedure: load the state under ``lease``, start it (``initial``) or check it
    against the plan (``accept``), and observe every effect left in flight before anything else."""
    inv.worked_mark = inv.monotonic()  # this run's work is charged from here
    try:
        loaded: LoadResult = yield Load(lease)
    except StateUnrecoverableError as exc:
        inv.evidence.observed("store", str(exc))
        inv.evidence.unknown("store", "which effects took place after the last readable revision")
        raise Stop(
            Status.STATE_UNRECOVERABLE,
            "inspect the state (the observations say what is damaged, rolled back or missing; damaged files are "
            "quarantined) and the target before anything else; do not restart this task from scratch: to go on "
            "under a new task id, mark every step observe_first=True and keep its effect key "
            f"(Step(..., key='{inv.task_id}/<step id>') unless it has one) so effects already made are observed, not repeated",
        ) from None
    if _crashpoints.ARMED:
        _crashpoints.hit("recovery.loaded", loaded.state.revision if loaded.state is not None else 0)
    for item in loaded.observations:
        inv.evidence.observations.append((item.source, item.detail, item.at))
    now = inv.clock.now()
    if loaded.state is None:
        inv.current = RunState(
            task_id=inv.task_id,
            plan_digest=inv.plan_digest,
            budget=BudgetCounters(created_at=now, last_progress_at=now),
            created_at=now,
            next_action="start the first step",
        )
        inv.reporter.loaded(inv.state, lease.epoch)
        initial(inv.state)
        _record_deadline(inv, inv.state, now)
        inv.dirty = True
        yield COMMIT
        inv.evidence.inferred("no state existed: this is the task's first run")
        return
    state = loaded.state
    inv.current = state
    inv.reporter.loaded(state, lease.epoch)
    inv.evidence.observed(
        "store", f"state from {loaded.source}, revision {state.revision}, bytes {loaded.digest}, status {state.status.value}"
    )
    inv.evidence.observed("clock", describe_wall_gap(state.updated_at, now))
    accept(state)
    died = died_mid_step(inv, state)  # as loaded: before a reopen makes an ended task running again
    previous_epoch = state.lease_epoch
    if state.status in TERMINAL:
        if not (state.status in REOPENABLE and (yield from _reopened(inv, state))):
            inv.evidence.inferred(f"the run already ended {state.status.value}; nothing more will be applied")
            raise Stop(state.status, state.next_action)
        state.last_failure = None  # reopened: the failures in a row are counted again from none
    if state.status is Status.QUEUED or (inv.counts_failures and recorded_before_queued(state)):
        # Its first run starts now: recorded so, a run that dies before its first step is a crash.
        state.status = Status.RUNNING
        state.next_action = "resume it: its first run is under way, or ended before its first step"
        _record_deadline(inv, state, now)
        inv.dirty = True
    in_flight = []
    records = list(state.effects.values())
    if IN_FLIGHT.isdisjoint(map(_state_of, records)):  # as after a clean stop: one pass in C, not one call a record
        records = []
    for record in records:
        if not record.in_flight:
            continue
        if is_internal(record.action):
            interrupted(inv, record)
        else:
            in_flight.append(record)
    if in_flight:
        in_flight = yield from _resolved_by_hand(inv, in_flight)
    # Every effect in flight is observed (at once, bounded, under the async driver) before anything else.
    verdicts: list[Reconciled] = yield Gather(tuple(reconcile(inv, record) for record in in_flight), inv.max_parallel)
    unsafe_ones = [settled for settled in verdicts if settled.verdict is Verdict.UNSAFE]
    if len(in_flight) == 1 and verdicts[0].verdict is Verdict.RETRY:
        inv.observe_next = False  # the effect this call applies first has just been observed
    if unsafe_ones:
        raise (yield from unsafe(inv, unsafe_ones[0]))
    if died:
        yield from crashed(inv, previous_epoch)  # committed with whatever the recovery changed
    elif inv.dirty:
        yield COMMIT


def _record_deadline(inv: Invocation, state: RunState, now: float) -> None:
    """Record the task's deadline as its first run starts: the earliest of ``Limits.deadline_s``
    from now and what the caller or the parent asks (``Invocation.deadline_asked``). Recorded once:
    a later run keeps it whatever it is asked (a reopen with ``--add-time`` moves it on)."""
    if state.deadline is not None:
        return
    from_limits = (now + inv.limits.deadline_s, "limits") if inv.limits.deadline_s is not None else None
    chosen = earliest(from_limits, inv.deadline_asked)
    if chosen is None:
        return
    at, source = chosen
    state.deadline = TaskDeadline(at, source, now)
    inv.evidence.inferred(f"the task's deadline is {utc(at)} ({source}): recorded, kept across restarts")


def _reopened(inv: Invocation, state: RunState) -> Steps[bool]:
    """Act on an operator's reopen of the ending ``state`` records (``longrun.intervention``), if
    one is waiting: the status is cleared, the budgets widened as it says, a cancellation record
    superseded, and the reopen recorded as the operator's word; True if the run goes on."""
    records = yield READ_APPROVALS
    found, reasons = find_reopen(records, state, inv.clock.now())
    for reason in reasons:
        inv.evidence.unknown("control", reason)
    if found is None:
        return False
    approval, reopen = found
    now = inv.clock.now()
    detail = (
        f"{approval.approver} reopened the task at {utc(approval.granted_at)} (it had ended {reopen.status} at revision "
        f"{reopen.revision}; reopen {approval.approval_id}): {reopen.reason}"
    )
    if reopen.add_attempts or reopen.add_time_s:
        detail += f"; {reopen.add_attempts} more attempts, {reopen.add_time_s:g} s more work"
    if state.status is Status.CANCELLED:
        found_cancel: CancellationRead = yield ReadCancellation(inv.cancelled_with)
        if found_cancel.record is not None and found_cancel.record.digest:
            state.consumed_approvals.append(superseded_cancellation(found_cancel.record.digest))
            detail += f"; cancellation record {found_cancel.record.name} ({found_cancel.record.digest}) is superseded"
    state.consumed_approvals.append(approval.approval_id)
    state.note_control(inv.evidence.noted(f"person:{approval.approver}", detail))
    budget = state.budget
    budget = replace(budget, attempts_total=max(0, budget.attempts_total - reopen.add_attempts))
    for record in list(state.effects.values()):
        if record.state is EffectState.VERIFIED or is_internal(record.action) and record.state is EffectState.FAILED or raised_into_function(record):
            continue  # a call's recorded exception, an EffectFailed the function handled: replayed as recorded
        fewer = max(0, record.attempts - reopen.add_attempts)
        if record.state is EffectState.FAILED:  # failed for good, and the operator says to try again
            # An approval authorized one attempt that failed: trying again asks again.
            inv.put(record.with_changes(state=EffectState.PLANNED, attempts=fewer, approval_id=None, not_before=None, backoff=None, updated_at=now))
        elif fewer != record.attempts:
            inv.put(record.with_changes(attempts=fewer, updated_at=now))
    if reopen.add_time_s:
        # Less work counted: S more under max_elapsed_s, and S more under max_no_progress_s (the work
        # since the last progress shrinks by S, to no less than none).
        worked = max(0.0, budget.worked_s - reopen.add_time_s)
        budget = replace(budget, worked_s=worked, worked_at_progress_s=min(budget.worked_at_progress_s, worked))
    state.budget = budget
    if state.status is Status.DEADLINE_EXCEEDED and state.deadline is not None and reopen.add_time_s:
        # The new deadline: S seconds after the later of the old one and the reopen.
        moved = max(state.deadline.at, now) + reopen.add_time_s
        state.deadline = TaskDeadline(moved, "reopen", now)
        inv.evidence.inferred(f"the task's deadline moves to {utc(moved)} (reopened with {reopen.add_time_s:g} s more)")
    state.status = Status.RUNNING
    state.next_action = "run the task again: it was reopened"
    inv.evidence.inferred(f"reopen {approval.approval_id} consumed once; the run goes on")
    inv.dirty = True
    return True


def _resolved_by_hand(inv: Invocation, in_flight: list[EffectRecord]) -> Steps[list[EffectRecord]]:
    """Settle each effect in flight that a person resolved (``longrun resolve``) as they recorded
    it, before anything is observed: applied is verified, absent planned again. Returns the effects
    still to observe."""
    records = yield READ_APPROVALS
    state = inv.state
    remaining = []
    for record in in_flight:
        now = inv.clock.now()
        found, reasons = find_resolution(records, state, record, now)
        for reason in reasons:
            inv.evidence.unknown("control", reason)
        if found is None:
            remaining.append(record)
            continue
        approval, resolution = found
        detail = (
            f"{approval.approver} checked the target at {utc(approval.granted_at)} and recorded effect {record.key!r} as "
            f"{resolution.outcome} (resolution {approval.approval_id}): {resolution.evidence}"
        )
        state.consumed_approvals.append(approval.approval_id)
        state.note_control(Evidence(f"person:{approval.approver}", detail, approval.granted_at))
        inv.evidence.observations.append((f"person:{approval.approver}", detail, approval.granted_at))
        uncertain = record if record.state is EffectState.UNCERTAIN else record.move(EffectState.UNCERTAIN, now)
        if resolution.outcome == APPLIED:
            result = resolution.result if resolution.result is not None else record.result
            inv.put(uncertain.move(EffectState.VERIFIED, now, result=result, evidence=detail))
            state.budget = state.budget.progressed(now, inv.take_work())
            inv.evidence.inferred(f"{record.key} verified by a person's observation; it will not be applied again")
        else:
            inv.put(uncertain.move(EffectState.PLANNED, now, evidence=detail))
            inv.evidence.inferred(f"{record.key} was found absent by a person; it will be applied again")
    return remaining
