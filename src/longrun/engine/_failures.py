"""The failures of a run, recorded: the plan's own code raised, or the process died inside a step.

A plan that counts failures (a durable function: ``Invocation.counts_failures``) has each one
recorded in the task's state as a ``failures.RunFailure`` in the same commit that decides what
comes next: ``retry-scheduled`` with the time of the next attempt (backoff by the run's retry
policy), or ``failed`` once ``Limits.max_failures`` came in a row. ``raised`` records an exception
from the plan's code (the engine re-raises it to the caller); ``crashed`` records a run found dead
mid-step: the recovery procedure calls it when the state it loads is still ``running`` (the run
that wrote it never recorded a stop) and the stores have just issued this run a new lease epoch.

Not guaranteed: that a crash is told from a lease lost while paused (both leave the state
``running``), nor that a run dying before its first commit is counted (it leaves nothing behind).
"""

from __future__ import annotations

from ..envelope import RunState, recorded_before_queued
from ..failures import CRASH_TYPE, RunFailure, next_attempt
from ..ledger import EffectState
from ..outcome import Status
from ._invocation import Invocation, Stop
from ._ops import COMMIT, RENEW_LEASE, Steps
from ._steps import stop

__all__ = ["crashed", "died_mid_step", "raised", "settled_steps"]

_SETTLED = frozenset({EffectState.VERIFIED, EffectState.FAILED})


def settled_steps(state: RunState) -> int:
    """Steps settled so far (verified, or a call that failed and replays as recorded): progress."""
    return sum(1 for record in state.effects.values() if record.state in _SETTLED)


def died_mid_step(inv: Invocation, state: RunState) -> bool:
    """Whether ``state``, as loaded, was left by a run that never recorded its stop (see the module docstring)."""
    return inv.counts_failures and state.status is Status.RUNNING and not recorded_before_queued(state)


def _where(state: RunState) -> str | None:
    step = state.current_step
    if step is not None:
        return step
    started = [record.step_id for record in state.effects.values() if record.state is not EffectState.VERIFIED and record.attempts]
    return started[-1] if started else None


def _next_action(inv: Invocation, failure: RunFailure) -> str:
    task = f"{inv.store_spec} {inv.task_id}"
    if failure.failed_for_good:
        fix = "find why the process dies there (out of memory, a crash in native code, a kill)" if failure.kind == "crash" else "fix the code"
        return (
            f"{fix}, then `longrun resume {task} --reopen`: it failed {failure.attempt} times in a row "
            f"({failure.error_type}: {failure.message}; `longrun status {task}` shows {'where' if failure.kind == 'crash' else 'the traceback'})"
        )
    return (
        f"nothing: a worker runs it again at or after the retry time (failure {failure.attempt} of "
        f"{failure.max_failures} in a row: {failure.error_type}: {failure.message}); fix the code if it keeps failing, "
        f"or run it now with `longrun resume {task}`"
    )


def _failure_stop(inv: Invocation, failure: RunFailure) -> Steps[Stop]:
    """Record ``failure`` with the stop it decides (``failed``, or ``retry-scheduled``) in one commit."""
    state = inv.state
    state.last_failure = failure
    inv.dirty = True
    status = Status.FAILED if failure.failed_for_good else Status.RETRY_SCHEDULED
    raised_stop = yield from stop(inv, status, _next_action(inv, failure), wake_at=failure.retry_at)
    if inv.dirty:  # a parallel step's stop outranked this one: the failure is committed under it
        yield COMMIT
    return raised_stop


def _attempt(inv: Invocation, state: RunState, failures: int = 1) -> tuple[int, int]:
    progress = settled_steps(state)
    return min(next_attempt(state.last_failure, progress, failures), inv.limits.max_failures), progress


def raised(inv: Invocation, exc: BaseException) -> Steps[Stop]:
    """The plan's own code raised ``exc``: record it and schedule the retry (or end ``failed``)."""
    lease = yield RENEW_LEASE
    state = inv.state
    now = inv.clock.now()
    attempt, progress = _attempt(inv, state)
    max_failures = inv.limits.max_failures
    retry_at = None
    if attempt < max_failures:
        retry_at = now + inv.retry.delay(f"{inv.task_id}/failure", attempt)
    failure = RunFailure.of_exception(
        exc, attempt=attempt, max_failures=max_failures, at=now, epoch=lease.epoch, revision=state.revision + 1,
        progress=progress, step=_where(state), retry_at=retry_at,
    )  # fmt: skip
    inv.evidence.observed("function", f"the code raised {failure.summary()}")
    return (yield from _failure_stop(inv, failure))


def _between(previous_epoch: int, epoch: int) -> str:
    lost = epoch - previous_epoch - 1
    return f", and {lost} run(s) after it died before recording anything" if lost > 0 else ""


def crashed(inv: Invocation, previous_epoch: int) -> Steps[None]:
    """The loaded state is ``running``: the run at epoch ``previous_epoch`` died mid-step (or lost
    its lease). Record it as a failure; stop ``failed`` if that makes ``max_failures`` in a row.

    Every lease epoch issued since ``previous_epoch`` before this run's belongs to a run that took
    the task over and died before it could commit anything (such as this record): each counts too."""
    lease = yield RENEW_LEASE
    state = inv.state
    now = inv.clock.now()
    attempt, progress = _attempt(inv, state, max(1, lease.epoch - previous_epoch))
    step = _where(state)
    where = f" inside step {step!r}" if step else ""
    failure = RunFailure(
        kind="crash", error_type=CRASH_TYPE,
        message=f"the run at lease epoch {previous_epoch} ended{where} without recording a stop (its process died or lost "
        f"its lease){_between(previous_epoch, lease.epoch)}; this run took over at epoch {lease.epoch}",
        traceback="", attempt=attempt, max_failures=inv.limits.max_failures, at=now, epoch=lease.epoch,
        revision=state.revision + 1, progress=progress, step=step,
    )  # fmt: skip
    inv.evidence.observed("lease", f"the previous run {failure.summary()}")
    if failure.failed_for_good:
        raise (yield from _failure_stop(inv, failure))
    state.last_failure = failure
    inv.dirty = True
    yield COMMIT
