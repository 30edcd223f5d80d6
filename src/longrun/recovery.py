"""The recovery procedure, and the one rule for an effect whose outcome the ledger does not know.

Every ``Runner.run`` call is a recovery; a first run is just one with nothing to recover. In order:

1. Take the task's lease, or stop ``already-running`` having done nothing.
2. Load and validate the state: schema, task identity, checksum, plan digest, revision, backup.
   Damaged files are quarantined; a damaged primary is replaced by the validated backup with every
   unverified step observed before it may be applied (``RunState.reconcile_all``); if nothing
   validates, or the state is older than the revision its lease record witnessed as committed,
   stop ``state-unrecoverable``.
3. Reconcile every started, acknowledged or uncertain effect by observation before anything else
   (``reconcile`` below): applied becomes verified and is never re-applied; absent allows a retry;
   unknown allows a retry only if the adapter deduplicates, else the run stops
   ``unsafe-to-continue`` with the effect listed among the unknowns.
4. Read cancellation, authority and approvals fresh.
5. Enforce the budgets (attempts, steps, elapsed, cost, no progress), counted across restarts.
6. Pick the one next authorized action.
7. Observe the effect first if it is the call's first apply (and each one after it until one is
   absent: a state rolled back past every check then verifies instead of repeating), or the first
   apply ever of an ``observe_first`` step. Persist the intent (``started``, with attempt, payload
   digest and epoch), then execute it.
8. Persist the acknowledgement or the uncertainty, observe, persist the verification; continue
   until done or a legal stop.

Steps 1-2 live in the store (``stores.base``), 3 here, and 4-8 in ``runner``.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, replace

from .adapters import EffectRequest, Observation, ObservedState
from .errors import describe_exception
from .ledger import EffectRecord, EffectState, recordable_result
from .protocols import EffectAdapter

__all__ = ["Reconciled", "Verdict", "as_observation", "observe_safely", "reconcile", "settle", "timed_out_observation"]

log = logging.getLogger("longrun")


class Verdict(str, enum.Enum):
    VERIFIED = "verified"
    RETRY = "retry"
    """The effect did not take place (or the target deduplicates): it may be applied again."""
    UNSAFE = "unsafe"
    """The outcome cannot be established and re-applying could duplicate it."""


@dataclass(frozen=True, slots=True)
class Reconciled:
    record: EffectRecord
    verdict: Verdict
    observation: Observation
    reason: str


def _request_fields(request: EffectRequest) -> dict[str, object]:
    """The log fields of a record about an adapter call (``events.LOG_FIELDS``)."""
    return {
        "task": request.task_id, "step": request.step_id, "key": request.key, "action": request.action,
        "attempt": request.attempt, "epoch": request.epoch or None,
    }  # fmt: skip


def observe_safely(adapter: EffectAdapter, request: EffectRequest) -> Observation:
    """``adapter.observe``, with any exception turned into an ``unknown`` observation that names it."""
    try:
        observation: object = adapter.observe(request)
    except Exception as exc:  # the failure becomes evidence (an unknown), it is not dropped
        return as_observation(request, exc)
    return as_observation(request, observation)


def timed_out_observation(request: EffectRequest, timeout_s: float) -> Observation:
    """What an ``observe`` that did not answer within ``timeout_s`` tells: nothing, so unknown."""
    log.warning(
        "task %s: step %s: observe of %s did not answer within %g s; its outcome stays unknown",
        request.task_id, request.step_id, request.key, timeout_s, extra=_request_fields(request),
    )  # fmt: skip
    return Observation.unknown(f"observe did not answer within {timeout_s:g} s")


def as_observation(request: EffectRequest, returned: object) -> Observation:
    """What an ``observe`` call returned, or the exception it raised, as an ``Observation``."""
    if isinstance(returned, Exception):
        # An Observation the adapter built wrongly (a dict as evidence, a result that is not JSON)
        # raises InvalidInputError inside observe: an adapter bug, so the outcome is unknown.
        described = describe_exception(returned)  # the adapter's exception may not even print itself
        log.warning(
            "task %s: step %s: observe of %s failed: %s; its outcome stays unknown",
            request.task_id, request.step_id, request.key, described, extra=_request_fields(request),
        )  # fmt: skip
        return Observation.unknown(f"observe raised {described}")
    if not isinstance(returned, Observation):
        return Observation.unknown(f"observe returned {type(returned).__name__}, not an Observation")
    return returned


def reconcile(record: EffectRecord, adapter: EffectAdapter, request: EffectRequest, now: float) -> Reconciled:
    """Settle an in-flight effect (started, acknowledged or uncertain) by observing the target."""
    return settle(record, observe_safely(adapter, request), adapter.deduplicates, now, observer=f"{type(adapter).__name__}.observe")


def settle(record: EffectRecord, observation: Observation, deduplicates: bool, now: float, *, observer: str = "observe") -> Reconciled:
    """The verdict on an in-flight effect given what the target says (``observation``).

    ``observer`` names the observe that answered (``"Mailer.observe"``), for the reason given when
    it answers absent after an ``apply`` that returned a receipt: either the effect was lost at the
    target, or the adapter's ``observe`` does not confirm an apply that succeeded (a step with
    nothing to observe, whose ``observe`` always answers absent). That reason is kept as the
    record's ``last_error``, so a run that retries it until its attempts are spent says why."""
    if observation.state is ObservedState.APPLIED:
        result = observation.result if observation.result is not None else record.result
        omitted = None
        if result is not None:  # most effects have none: nothing to measure, no message to make
            result, omitted = recordable_result(result, what=f"the result of step {record.step_id!r}")
        evidence = observation.evidence
        if omitted is not None:  # the effect took place and is recorded; its result is too large to keep
            log.warning("step %s: %s: %s", record.step_id, record.key, omitted, extra={"step": record.step_id, "key": record.key, "action": record.action})
            evidence = f"{evidence}; {omitted}"
        verified = record.move(EffectState.VERIFIED, now, result=result, evidence=evidence)
        return Reconciled(verified, Verdict.VERIFIED, observation, f"observed applied: {observation.evidence}")
    if observation.state is ObservedState.ABSENT and record.receipt is None:
        retry = record.move(EffectState.PLANNED, now, evidence=observation.evidence)
        return Reconciled(retry, Verdict.RETRY, observation, f"observed absent: {observation.evidence}")
    last_error = record.last_error
    if observation.state is ObservedState.ABSENT:
        reason = last_error = (
            f"{observer} answered absent after a successful apply of step {record.step_id!r} "
            f"(apply returned a receipt: {record.receipt}; observe said: {observation.evidence}); "
            "an observe must confirm an apply that succeeded"
        )
    else:
        reason = f"outcome of {record.key!r} is unknown: {observation.evidence}"
    if deduplicates:
        retry = record.move(EffectState.PLANNED, now, evidence=observation.evidence, last_error=last_error)
        return Reconciled(retry, Verdict.RETRY, observation, reason + "; the target deduplicates, so it may be sent again")
    if record.state is EffectState.UNCERTAIN:
        uncertain = replace(record, evidence=observation.evidence, updated_at=now, last_error=last_error)
    else:
        uncertain = record.move(EffectState.UNCERTAIN, now, evidence=observation.evidence, last_error=last_error)
    return Reconciled(uncertain, Verdict.UNSAFE, observation, reason)
