"""``longrun verify``: read-only checks that say whether a task can be resumed safely, by exit code.

Checks, in order: the state validates (checksum, schema, task identity; read without a lease, so
the store reports damage and moves nothing); the plan digest and a revision above 0 are recorded;
every effect record is consistent with its lifecycle and with ``completed_steps``; the in-flight
effects (they are observed before anything else on resume); the recorded status agrees with the
ledger (``done`` only with every effect verified); the lease record (held or expired, its epoch
not below the one the last commit recorded); the control records a resume would act on
(a pending cancellation, a damaged one; for a run awaiting approval, whether an unused approval
that covers the request is already in the store).

Each check ends ``ok``, ``note``, ``action`` (an operator must act first), ``ended`` (the run is
over without finishing) or ``damaged``. The exit code is the worst of them:

====  ===========================================================================================
code  meaning
====  ===========================================================================================
0     safe to resume now, with nobody's help: the run is done (a resume changes nothing), new,
      queued, interrupted or in progress (in-flight effects are observed first), waiting out a
      retry backoff, or awaiting an approval that is already in the store
1     resumable only after an operator acts: awaiting approval, unsafe-to-continue (an effect
      whose outcome is unknown, an over-broad approval), a damaged or unreadable cancellation
      record, or a durable function whose last run failed (its code raised, or its process died
      inside a step: ``retry-scheduled`` with the error, or ``running`` again after a crash):
      it fails again until its cause is fixed
2     usage: bad arguments, unknown task, missing store, unsafe task id
3     damaged: the state (primary or backup), the lease record, or a ledger that contradicts
      itself. When only the primary copy is damaged and the backup validates, the output says so:
      ``longrun resume`` then recovers from the backup (quarantining the damaged copy and
      observing every unverified effect first); exit 3 asks a person to look before it does
4     the run ended without finishing (cancelled, limits-exhausted, deadline-exceeded, blocked, failed): a resume
      changes nothing (``longrun resume --reopen`` reopens it)
====  ===========================================================================================

Not guaranteed: the approval check reads the store's control area and cannot check signatures or
a separate control root; with ``SignedApprovals`` or a ``FileControlSource`` a resume may still
stop ``awaiting-approval`` (which is safe). A lease that has not expired may belong to a runner
that died: only its expiry tells.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from typing import Any, TextIO

from ..cancellation import judge_cancellation
from ..contract import is_internal
from ..envelope import RunState, recorded_before_queued
from ..errors import CorruptStateError, LongrunError
from ..ledger import EffectState, raised_into_function
from ..outcome import ENDED_UNFINISHED, Status
from ..protocols import LoadResult, Store
from ._common import ExitCode, checked_task, format_time, lease_summary, name_store, relative, short_digest, write_json
from ._control import unconsumed_matches
from ._what_ran import last_run_failed

__all__ = ["Check", "cmd_verify", "verify"]

_SEVERITY = {"ok": 0, "note": 0, "action": 1, "ended": 2, "damaged": 3}
_EXIT = {0: ExitCode.OK, 1: ExitCode.NOT_AS_ASKED, 2: ExitCode.ENDED, 3: ExitCode.STORAGE}
_VERDICT = {
    ExitCode.OK: "resumable",
    ExitCode.NOT_AS_ASKED: "needs-operator",
    ExitCode.ENDED: "ended",
    ExitCode.STORAGE: "damaged",
}


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    result: str
    """ok, note, action, ended or damaged."""
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "result": self.result, "detail": self.detail}


class _Checks:
    def __init__(self) -> None:
        self.items: list[Check] = []

    def add(self, name: str, result: str, detail: str) -> None:
        self.items.append(Check(name, result, detail))

    def exit_code(self) -> ExitCode:
        return _EXIT[max((_SEVERITY[item.result] for item in self.items), default=0)]


def _check_load(checks: _Checks, loaded: LoadResult) -> None:
    state = loaded.state
    if state is None:
        checks.add("state", "ok", "no revision committed yet: a resume starts the first step")
        return
    what = f"revision {state.revision} validates (checksum, schema, task identity)"
    if loaded.source == "backup":
        notes = "; ".join(item.detail for item in loaded.observations)
        checks.add(
            "state",
            "damaged",
            f"the primary copy is damaged or rolled back; the backup's {what} ({notes}). Recovery from the backup is "
            "possible: `longrun resume` quarantines the damaged copy and observes every unverified effect before applying "
            "anything; check why the primary was damaged first",
        )
    else:
        checks.add("state", "ok", f"{what}, read from the {loaded.source} copy ({short_digest(loaded.digest)})")


def _check_ledger(checks: _Checks, state: RunState) -> list[str]:
    """Effect records against their lifecycle; returns the in-flight effects' descriptions."""
    problems: list[str] = []
    notes: list[str] = []
    in_flight: list[str] = []
    counts: dict[str, int] = {}
    for step_id, record in state.effects.items():
        counts[record.state.value] = counts.get(record.state.value, 0) + 1
        if record.step_id != step_id:
            problems.append(f"the record under step {step_id!r} names step {record.step_id!r}")
        if record.state in (EffectState.STARTED, EffectState.ACKNOWLEDGED) and record.attempts < 1:
            problems.append(f"{record.key} is {record.state.value} with no attempt counted")
        # An internal record (a durable function's own record, an answer, a timer, a session's
        # checkpoint) has no target to attempt or observe: the engine settles it itself.
        if record.state is EffectState.VERIFIED and record.attempts < 1 and not is_internal(record.action):
            if record.evidence:
                notes.append(
                    f"{record.key} was verified by observation with no attempt counted (a recovery from a backup: the "
                    f"attempt that applied it was in the lost revision): {record.evidence}"
                )
            else:
                problems.append(f"{record.key} is verified with no attempt and no observation behind it")
        if record.state is EffectState.FAILED and state.status is not Status.BLOCKED and not raised_into_function(record):
            problems.append(f"{record.key} failed permanently but the run is {state.status.value}, not blocked")
        if record.epoch > state.lease_epoch:
            problems.append(f"{record.key} started at epoch {record.epoch}, after the last commit's epoch {state.lease_epoch}")
        if record.in_flight:
            in_flight.append(f"{record.key} ({record.state.value}, attempt {record.attempts})")
    recorded = state.to_json()["completed_steps"]
    verified = [step_id for step_id, record in state.effects.items() if record.state is EffectState.VERIFIED]
    if recorded != verified:
        problems.append(f"completed_steps {recorded} disagrees with the verified effects {verified}")
    attempts = sum(record.attempts for record in state.effects.values())
    if attempts != state.budget.attempts_total:
        notes.append(f"the effects count {attempts} attempts, the budget {state.budget.attempts_total}")
    summary = ", ".join(f"{count} {name}" for name, count in sorted(counts.items())) or "none planned yet"
    if problems:
        checks.add("ledger", "damaged", "the effect records contradict themselves: " + "; ".join(problems))
    else:
        checks.add("ledger", "ok", f"{len(state.effects)} effect records ({summary}); completed_steps agrees")
    for note in notes:
        checks.add("ledger", "note", note)
    if in_flight:
        checks.add("in-flight", "note", "will be observed before anything else on resume: " + ", ".join(in_flight))
    return in_flight


def _check_status(checks: _Checks, store: Store, state: RunState, task_id: str, now: float) -> None:
    status = state.status
    unfinished = [record.key for record in state.effects.values() if record.state is not EffectState.VERIFIED and not raised_into_function(record)]
    if status is Status.DONE:
        if unfinished or state.approval_requests:
            checks.add("status", "damaged", f"the run is recorded done but these effects are not verified: {unfinished}")
        else:
            handled = sum(raised_into_function(record) for record in state.effects.values())
            settled = f"{len(state.effects) - handled} effects verified, {handled} failed into the function, which handled it" if handled else f"all {len(state.effects)} effects verified"
            checks.add("status", "ok", f"finished cleanly: {settled}; a resume changes nothing")
        return
    failure = state.last_failure
    if status is Status.FAILED and failure is not None:
        checks.add("status", "ended", f"failed, and will not continue until reopened: {failure.summary()}")
        return
    if status in ENDED_UNFINISHED:
        checks.add("status", "ended", f"the run ended {status.value} and will not continue: {state.next_action}")
        return
    if failure is not None and last_run_failed(state):
        when = f"; the next attempt at or after {format_time(failure.retry_at)} ({relative(failure.retry_at, now)})" if failure.retry_at else ""
        checks.add(
            "status",
            "action",
            f"{status.value}: the last run failed ({failure.summary()}){when}; it fails again until its cause is fixed",
        )
    elif status is Status.QUEUED or recorded_before_queued(state):
        checks.add("status", "ok", "queued: recorded and not started yet; a worker or a resume starts it")
    elif status is Status.RUNNING:
        checks.add("status", "ok", "running, or interrupted mid-run: a resume continues from the last commit")
    elif status is Status.RETRY_SCHEDULED:
        waits = [record.not_before for record in state.effects.values() if record.not_before is not None]
        when = f" at or after {format_time(max(waits))} ({relative(max(waits), now)})" if waits else ""
        checks.add("status", "ok", f"retry scheduled: a resume retries{when}")
    elif status is Status.AWAITING_APPROVAL:
        _check_approvals(checks, store, state, now)
    else:  # unsafe-to-continue, or a status a runner never records
        unknowns = "; ".join(item.detail for item in state.unknowns)
        checks.add(
            "status",
            "action",
            f"stopped {status.value}: {state.next_action}" + (f" (unknowns: {unknowns})" if unknowns else ""),
        )
    _check_cancellation(checks, store, task_id)


def _check_approvals(checks: _Checks, store: Store, state: RunState, now: float) -> None:
    waiting = []
    for request in state.approval_requests.values():
        covered = unconsumed_matches(store, request, state.consumed_approvals, now)
        if covered:
            checks.add(
                "approval",
                "ok",
                f"step {request.step_id} awaits approval and the store holds unused approval {covered[0]} that covers it: "
                "a resume applies the effect (unless the runner accepts only signed records or reads another control area)",
            )
        else:
            waiting.append(request.step_id)
    if waiting or not state.approval_requests:
        checks.add(
            "status",
            "action",
            f"awaiting approval of step {', '.join(waiting) or '(no open request)'}: {state.next_action}",
        )


def _check_cancellation(checks: _Checks, store: Store, task_id: str) -> None:
    try:
        raw = store.read_cancellation(task_id)
    except LongrunError as exc:
        checks.add("control", "action", f"the cancellation record cannot be read ({exc}); a resume stops unsafe-to-continue")
        return
    if raw is None:
        checks.add("control", "ok", "no cancellation record")
        return
    judgement = judge_cancellation(raw, task_id)
    record = judgement.record
    if judgement.verdict != "cancelled" or record is None:
        checks.add(
            "control",
            "action",
            f"cancellation record {raw.name} ({raw.digest or 'no bytes'}) is unusable ({judgement.problem}): a resume stops "
            "unsafe-to-continue until someone removes it or writes a valid one",
        )
        return
    signed = "signed" if record.signature else "unsigned (a runner that accepts only signed records stops unsafe-to-continue on it)"
    checks.add(
        "control",
        "note",
        f"cancellation by {record.requested_by} at {format_time(record.requested_at)} ({record.reason}), {signed}: "
        "the next run starts no new effect and ends cancelled",
    )


def _check_lease(checks: _Checks, store: Store, state: RunState | None, task_id: str, now: float) -> None:
    try:
        lease = store.read_lease(task_id)
    except CorruptStateError as exc:
        checks.add(
            "lease",
            "damaged",
            f"the lease record is damaged: {exc}; `longrun repair {shlex.quote(getattr(store, 'spec', None) or '<store>')} {task_id} --lease` sets it aside and lets "
            "the next run in at a newer epoch",
        )
        return
    if lease is None:
        detail = "no lease record"
        if state is not None and state.lease_epoch:
            detail += f"; the next runner continues above the epoch the state records ({state.lease_epoch})"
        checks.add("lease", "note" if state is not None else "ok", detail)
        return
    if state is not None and lease.epoch < state.lease_epoch:
        checks.add(
            "lease",
            "damaged",
            f"the lease record's epoch {lease.epoch} is below epoch {state.lease_epoch} of the last commit: the record went back",
        )
        return
    if lease.expired(now):
        checks.add("lease", "ok", f"no live owner: {lease_summary(lease, now)}")
    else:
        checks.add(
            "lease",
            "note",
            f"{lease_summary(lease, now)}; a runner may be working on the task now, and a resume before the expiry "
            "returns already-running",
        )


def verify(store: Store, task_id: str, now: float) -> tuple[dict[str, Any], ExitCode]:
    """Every check on ``task_id`` and the exit code they add up to (see the module docstring)."""
    checks = _Checks()
    state: RunState | None = None
    in_flight: list[str] = []
    try:
        loaded = store.load(task_id)  # no lease: the store reports damage and moves nothing
    except CorruptStateError as exc:  # UnknownTaskError and StorageError propagate: exit 2 or 3
        checks.add("state", "damaged", f"the state does not validate and cannot be recovered by the runner: {exc}")
    else:
        state = loaded.state
        _check_load(checks, loaded)
    if state is not None:
        if state.task_id != task_id:
            checks.add("identity", "damaged", f"the state names task {state.task_id!r}")
        if state.plan_digest.startswith("sha256:") and len(state.plan_digest) == 71:
            checks.add("plan", "ok", f"plan digest recorded: {state.plan_digest}")
        else:
            checks.add("plan", "damaged", f"the recorded plan digest {state.plan_digest!r} is not a SHA-256 digest")
        if state.revision > 0:
            checks.add("revision", "ok", f"revision {state.revision} (> 0)")
        else:
            checks.add("revision", "damaged", f"revision {state.revision} is not above 0")
        in_flight = _check_ledger(checks, state)
    _check_lease(checks, store, state, task_id, now)
    if state is not None:
        _check_status(checks, store, state, task_id, now)
    elif not any(item.result == "damaged" for item in checks.items):
        _check_cancellation(checks, store, task_id)
    code = checks.exit_code()
    verdict = "finished" if code is ExitCode.OK and state is not None and state.status is Status.DONE else _VERDICT[code]
    report = {
        "task_id": task_id,
        "verdict": verdict,
        "exit_code": int(code),
        "status": state.status.value if state is not None else None,
        "revision": state.revision if state is not None else 0,
        "next_action": state.next_action if state is not None else None,
        "in_flight": in_flight,
        "checks": [item.to_json() for item in checks.items],
        "checked_at": now,
    }
    return report, code


_VERDICT_TEXT = {
    "finished": "finished cleanly: nothing left to resume",
    "resumable": "safe to resume now",
    "needs-operator": "resumable only after an operator acts",
    "ended": "the run ended without finishing: a resume changes nothing",
    "damaged": "damaged: a person must look before anything resumes",
}


def cmd_verify(store: Store, label: str, task_id: str, as_json: bool, out: TextIO) -> int:
    task_id = checked_task(task_id)
    now = time.time()
    report, code = verify(store, task_id, now)
    report["store"] = label
    if report["next_action"]:
        report["next_action"] = name_store(report["next_action"], label)
    for item in report["checks"]:
        if item["name"] == "status":  # the checks that quote the recorded next action
            item["detail"] = name_store(item["detail"], label)
    if as_json:
        write_json(out, report)
        return code
    lines = [f"verify task {task_id} in {label}"]
    width = max(len(item["name"]) for item in report["checks"])
    for item in report["checks"]:
        mark = item["result"] if item["result"] in ("ok", "note") else item["result"].upper()
        lines.append(f"  {mark:<8} {item['name']:<{width}}  {item['detail']}")
    lines.append(f"result: {_VERDICT_TEXT[report['verdict']]} (exit {int(code)})")
    if report["next_action"]:
        lines.append(f"next action recorded: {report['next_action']}")
    out.write("\n".join(lines) + "\n")
    return code
