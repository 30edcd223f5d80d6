"""The continuation rule: from the store alone, a session's one safe next action, or the legal stop
and what would unblock it (``Session.next()``, ``longrun next``). Read-only.

``ContinuationRule`` reads: it loads the task and its recorded run contract, and turns the ledger,
the pending decisions and approvals, the lease and the control records into a ``NextAction``.
``Session`` holds one and adds the commands that write; each command answers with the rule's next
action.
"""

from __future__ import annotations

import shlex
from typing import Callable, Mapping

from ..approval import GateVerdict, evaluate_gate
from ..canonical import JSONValue
from ..clock import SystemClock
from ..contract import ASK_ACTION, INTERNAL_PREFIX
from ..contractfile import ContractStep, SessionContract
from ..engine import utc
from ..envelope import RunState
from ..errors import InvalidInputError, UnknownTaskError
from ..lease import MonotonicReading, boot_clock_id
from ..ledger import EffectRecord, EffectState
from ..outcome import ENDED_UNFINISHED, RunOutcome, Status
from ..protocols import ApprovalSource, CancellationSource, Clock, Store
from ..shell import running_commands
from ._holder import holder_gone
from ._records import (
    NextAction,
    evidence_of,
    payload_text,
    recorded_command,
    step_verified,
    file_evidence,
    recorded_contract,
)

__all__ = ["ContinuationRule"]

_STILL_RUNNING = "is still running (pid"


class ContinuationRule:
    """One task's state and run contract, read from the store, and its next action. Holds no state
    of its own between calls: every answer is read fresh."""

    def __init__(
        self,
        store: Store,
        task_id: str,
        *,
        store_spec: str,
        clock: Clock,
        approvals: ApprovalSource,
        cancellations: CancellationSource,
    ):
        self.store = store
        self.task_id = task_id
        self.store_spec = store_spec
        self.clock = clock
        self.approvals = approvals
        self.cancellations = cancellations

    # -- reading ------------------------------------------------------------------------------

    def load(self) -> RunState | None:
        try:
            return self.store.load(self.task_id).state
        except UnknownTaskError:
            return None

    def recorded(self) -> tuple[RunState, SessionContract]:
        try:
            state = self.store.load(self.task_id).state
        except UnknownTaskError:
            raise UnknownTaskError(
                f"no task {self.task_id!r} in the store: start it with `longrun init {self.store_spec} {self.task_id} --contract FILE`"
            ) from None
        if state is None:
            raise InvalidInputError(
                f"task {self.task_id!r} has no committed state: run `longrun init {self.store_spec} {self.task_id} --contract FILE` again"
            )
        contract = recorded_contract(state)
        if contract is None:
            raise InvalidInputError(f"task {self.task_id!r} is not a checkpointed session (it records no run contract): see `longrun status`")
        return state, contract

    def monotonic_reading(self) -> MonotonicReading | None:
        timeline = boot_clock_id()
        monotonic: Callable[[], float] | None = getattr(self.clock, "monotonic", None)
        if timeline is None or not isinstance(self.clock, SystemClock) or not callable(monotonic):
            return None
        return MonotonicReading(timeline, monotonic())

    # -- the continuation rule ------------------------------------------------------------------

    def next(self) -> NextAction:
        """Exactly one safe next action, or the legal stop and what would unblock it (``longrun next``). Read-only."""
        state, contract = self.recorded()
        return self.action(state, contract)

    def _common(self, contract: SessionContract, state: RunState) -> dict[str, object]:
        recorded = tuple(step.step_id for step in contract.steps if step_verified(state, step.step_id))
        remaining = tuple(step.step_id for step in contract.steps if not step_verified(state, step.step_id))
        return {
            "task_id": self.task_id,
            "status": state.status.value,
            "recorded": recorded,
            "remaining": remaining,
            "goal": contract.goal,
            "stop_when": contract.stop_when,
        }

    def _action(self, common: Mapping[str, object], **fields: object) -> NextAction:
        return NextAction(**{**common, **fields})  # type: ignore[arg-type]

    def waiting(self, outcome: RunOutcome, contract: SessionContract) -> NextAction:
        state = self.load()
        common = self._common(contract, state) if state is not None else {"task_id": self.task_id, "status": "new", "goal": contract.goal}
        return self._action(common, kind="wait", who="time", text=outcome.next_action, retry_after_s=1.0)

    def _exec_argv(self, step: ContractStep, record: EffectRecord | None, spec: str) -> tuple[str, ...] | None:
        base = ("longrun", "exec", spec, self.task_id, step.step_id)
        if step.command is not None:
            return base
        recorded = recorded_command(record)
        return (*base, "--", *recorded) if recorded is not None else None

    def step_action(self, contract: SessionContract, state: RunState, spec: str) -> NextAction:
        """The agent's next step from the ledger alone: an interrupted one, else the first not recorded, else done."""
        common = self._common(contract, state)
        for step in contract.steps:
            record = state.effects.get(step.step_id)
            if record is not None and record.in_flight:
                return self._interrupted(contract, state, step, record, spec, common)
        for step in contract.steps:
            record = state.effects.get(step.step_id)
            if record is None or record.state is not EffectState.VERIFIED:
                return self._todo(contract, state, step, record, spec, common)
        argv = ("longrun", "done", spec, self.task_id)
        return self._action(
            common,
            kind="done",
            who="agent",
            text=f"every step is recorded: finish with `{shlex.join(argv)}` (it checks the completion evidence: "
            f"{', '.join(contract.required)})",
            commands=(argv,),
            cwd=contract.workdir,
        )

    def _exec_evidence(self, step: ContractStep, record: EffectRecord | None) -> str:
        observe = payload_text(record, "observe") or step.observe
        if observe:
            return f"exit status 0 (its stdout and stderr digests are the receipt), and the observe command `{observe}` exiting 0"
        return "exit status 0 (its stdout and stderr digests are the receipt; with no observe command nothing else is checked)"

    def _todo(
        self,
        contract: SessionContract,
        state: RunState,
        step: ContractStep,
        record: EffectRecord | None,
        spec: str,
        common: Mapping[str, object],
    ) -> NextAction:
        notes: list[str] = []
        if record is not None and record.attempts and record.last_error:
            notes.append(
                f"attempt {record.attempts} of {contract.limits.max_attempts} failed ({record.last_error}): "
                "find and fix the cause before running it again"
            )
        if step.kind == "exec":
            argv = self._exec_argv(step, record, spec)
            command = step.command or recorded_command(record)
            approval = step.approval or bool(record is not None and isinstance(record.payload, dict) and record.payload.get("approval"))
            if approval and not (record is not None and record.approval_id) and step.step_id not in state.approval_requests:
                notes.append(
                    "it needs approval: the first exec records the request and stops awaiting-approval; "
                    "once an operator has approved, run the same exec again"
                )
            if argv is not None and command is not None:
                text = f"run step `{step.step_id}` ({step.next}): `{shlex.join(command)}`, through the ledger: `{shlex.join(argv)}`"
            else:
                text = (
                    f"run step `{step.step_id}`: {step.next}, as one command through the ledger: "
                    f"`longrun exec {shlex.quote(spec)} {self.task_id} {step.step_id} [--observe CMD] -- COMMAND ARGS...`"
                )
            evidence = self._exec_evidence(step, record)
            return self._action(
                common,
                kind="exec",
                who="agent",
                text=f"{text}; evidence required: {evidence}",
                step=step.step_id,
                commands=(argv,) if argv is not None else (),
                cwd=contract.workdir,
                evidence=evidence,
                notes=tuple(notes),
            )
        record_argv: tuple[str, ...] | None = None
        base = ("longrun", "checkpoint", spec, self.task_id, step.step_id)
        if step.evidence == "file":
            evidence = f"the SHA-256 of {step.path or 'the file it produces'}"
            if step.path is not None:
                record_argv = (*base, "--evidence", step.path)
            template = shlex.join(record_argv) if record_argv else f"{shlex.join(base)} --evidence FILE"
        else:
            evidence = "a note saying what was done and how you know"
            record_argv = (*base, "--note", f"done: {step.next}")
            template = f"{shlex.join(base)} --note TEXT"
        if step.approval and not (record is not None and record.approval_id) and step.step_id not in state.approval_requests:
            notes.append("it needs approval: the first checkpoint records the request; once approved, record it again with the same evidence")
        work = f" (`{shlex.join(step.command)}`)" if step.command is not None else ""
        commands: list[tuple[str, ...]] = []
        if step.command is not None:
            commands.append(step.command)
        if record_argv is not None:
            commands.append(record_argv)
        return self._action(
            common,
            kind="checkpoint",
            who="agent",
            text=f"do step `{step.step_id}`: {step.next}{work}; it produces {step.produces}; once it has succeeded, record it: "
            f"`{template}`; evidence required: {evidence}",
            step=step.step_id,
            commands=tuple(commands),
            cwd=contract.workdir,
            evidence=evidence,
            notes=tuple(notes),
        )

    def _interrupted(
        self,
        contract: SessionContract,
        state: RunState,
        step: ContractStep,
        record: EffectRecord,
        spec: str,
        common: Mapping[str, object],
    ) -> NextAction:
        if step.kind != "exec":
            return self._todo(contract, state, step, record, spec, common)
        argv = self._exec_argv(step, record, spec)
        assert argv is not None  # an in-flight exec record holds its command
        observe = payload_text(record, "observe") or step.observe
        how = (
            f"it observes first (`{observe}`) and does not run a command that took effect again"
            if observe
            else "it has no observe command, so its outcome cannot be checked and the task will stop unsafe-to-continue; "
            "add --observe CMD (exit 0 if the effect took place, 1 if not) to settle it"
        )
        return self._action(
            common,
            kind="exec",
            who="agent",
            text=f"step `{step.step_id}` was interrupted (attempt {record.attempts}, {record.state.value}): "
            f"run it again with `{shlex.join(argv)}`; {how}",
            step=step.step_id,
            commands=(argv,),
            cwd=contract.workdir,
            evidence=self._exec_evidence(step, record),
        )

    def _decisions(self, state: RunState, now: float) -> list[dict[str, JSONValue]]:
        decisions: list[dict[str, JSONValue]] = []
        pending = [record for record in state.effects.values() if record.action == ASK_ACTION]
        if not pending:
            return decisions
        records = None
        for record in pending:
            question = record.payload.get("question") if isinstance(record.payload, dict) else None
            item: dict[str, JSONValue] = {"step": record.step_id, "question": question, "answered": False, "answer": None}
            if record.state is EffectState.VERIFIED:
                item.update(answered=True, answer=record.result)
            else:
                request = state.approval_requests.get(record.step_id)
                if request is not None:
                    records = records if records is not None else self.approvals.read_approvals(self.task_id)
                    verdict = evaluate_gate(request, records, frozenset(state.consumed_approvals), now)
                    if verdict.verdict is GateVerdict.GRANTED and verdict.approval is not None:
                        item.update(answered=True, answer=verdict.approval.answer, by=verdict.approval.approver)
            decisions.append(item)
        return decisions

    def action(self, state: RunState, contract: SessionContract) -> NextAction:
        now = self.clock.now()
        spec = self.store_spec
        common = dict(self._common(contract, state))
        decisions = self._decisions(state, now)
        common["decisions"] = tuple(decisions)
        status = state.status
        if status is Status.DONE:
            return self._action(common, kind="finished", who="nobody", text="nothing: the task is done (its completion evidence is recorded)")
        if status in ENDED_UNFINISHED:
            return self._action(
                common,
                kind="ended",
                who="nobody",
                text=f"nothing: the run ended {status.value} ({state.next_action})",
                unblock="nothing continues this task: a new run contract under a new task id",
            )
        step_action = self.step_action(contract, state, spec)
        cancellation = self.cancellations.read_cancellation(self.task_id)
        if cancellation is not None and not any(
            record.in_flight for sid, record in state.effects.items() if not sid.startswith(INTERNAL_PREFIX)
        ):
            return self._action(
                common,
                kind="ended",
                who="nobody",
                text=f"stop: a cancellation record ({cancellation.name}) is in the control area: start no new step; "
                "the next longrun command on this task records the end",
                unblock="an operator who did not mean it removes the record",
            )
        notes: list[str] = list(step_action.notes)
        lease = self.store.read_lease(self.task_id)
        if lease is not None and not lease.expired(now, self.monotonic_reading()):
            remaining = lease.remaining(now, self.monotonic_reading())
            if not holder_gone(lease):
                return self._action(
                    common,
                    kind="wait",
                    who="time",
                    text=f"wait: another longrun command ({lease.owner}) is working on this task (its lease runs until "
                    f"{utc(now + remaining)} unless renewed); then run `longrun next {spec} {self.task_id}` again",
                    retry_after_s=round(min(max(remaining, 0.2), 2.0), 3),
                )
            notes.append(
                f"the command that held this task ({lease.owner}) is gone; the next command waits up to "
                f"{remaining:.1f}s for its lease to expire"
            )
        for item in decisions:
            if not item["answered"]:
                command = f"longrun answer {shlex.quote(spec)} {self.task_id} {item['step']} VALUE"
                return self._action(
                    common,
                    kind="stop",
                    who="operator",
                    text=f"stop: waiting for a decision on {item['question']!r} ({item['step']}); start no step until it is answered",
                    step=str(item["step"]),
                    unblock=f"a person answers with `{command}`; then run `longrun next {spec} {self.task_id}` again",
                )
            if not step_verified(state, str(item["step"])):
                notes.append(f"{item['step']} was answered: {item['answer']!r} (it is recorded by the next command)")
        if status is Status.UNSAFE_TO_CONTINUE:
            blocked = self._unsafe(contract, state, step_action, common)
            if blocked is not None:
                return blocked
        step_id = step_action.step
        request = state.approval_requests.get(step_id) if step_id is not None else None
        if request is not None and step_action.kind in ("exec", "checkpoint"):
            verdict = evaluate_gate(request, self.approvals.read_approvals(self.task_id), frozenset(state.consumed_approvals), now)
            if verdict.verdict is GateVerdict.GRANTED and verdict.approval is not None:
                notes.append(f"approved by {verdict.approval.approver} (approval {verdict.approval.approval_id}): run the step to use it")
            elif verdict.verdict is GateVerdict.REFUSED:
                return self._action(
                    common,
                    kind="stop",
                    who="operator",
                    text=f"stop: an approval record for step `{step_id}` is broader than requested ({'; '.join(verdict.reasons)})",
                    step=step_id,
                    unblock=f"an operator removes it and approves exactly the request: `longrun approve {spec} {self.task_id} --step {step_id}`",
                )
            else:
                command = f"longrun approve {shlex.quote(spec)} {self.task_id} --step {step_id}"
                return self._action(
                    common,
                    kind="wait",
                    who="operator",
                    text=f"wait: step `{step_id}` needs approval (action {request.action}, payload {request.payload_digest}); "
                    "start nothing else",
                    step=step_id,
                    unblock=f"an operator checks the request with `longrun status {shlex.quote(spec)} {self.task_id}` and runs `{command}`; "
                    f"then run `longrun next {spec} {self.task_id}` again",
                )
        record = state.effects.get(step_id) if step_id is not None else None
        if record is not None and record.not_before is not None and record.not_before > now and not record.in_flight:
            wait = record.not_before - now
            return self._action(
                common,
                kind="wait",
                who="time",
                text=f"wait until {utc(record.not_before)} (step `{step_id}` failed: {record.last_error}); then: {step_action.text}",
                step=step_id,
                retry_after_s=round(wait, 3),
                notes=tuple(notes),
            )
        return self._action(
            common,
            **{name: getattr(step_action, name) for name in ("kind", "who", "text", "step", "commands", "cwd", "evidence")},
            notes=tuple(notes),
        )

    def _unsafe(
        self, contract: SessionContract, state: RunState, step_action: NextAction, common: Mapping[str, object]
    ) -> NextAction | None:
        """The legal stop ``unsafe-to-continue``, or None when re-running the step would settle it now."""
        spec = self.store_spec
        for step in contract.steps:
            record = state.effects.get(step.step_id)
            if record is None or record.state is not EffectState.UNCERTAIN or step.kind != "exec":
                continue
            if _STILL_RUNNING in (record.evidence or ""):
                running = running_commands(record.key)
                if running:
                    return self._action(
                        common,
                        kind="wait",
                        who="time",
                        text=f"wait: the command of step `{step.step_id}` from an earlier attempt is still running (pid "
                        f"{', '.join(map(str, running))}); once it has ended, run `longrun next {spec} {self.task_id}` again",
                        step=step.step_id,
                        retry_after_s=1.0,
                    )
                return None  # it has ended: exec observes it now
            base = shlex.join(("longrun", "exec", spec, self.task_id, step.step_id))
            command = "" if step.command is not None else " -- " + shlex.join(recorded_command(record) or ())
            observe = payload_text(record, "observe") or step.observe
            how = (
                f"make its observe command (`{observe}`) able to tell, or check the target by hand; then run `{base}{command}` again"
                if observe
                else f"check the target by hand; then run `{base} --observe CMD{command}` with an observe command that says "
                "whether it took effect (exit 0 if it did, 1 if not)"
            )
            return self._action(
                common,
                kind="stop",
                who="operator",
                text=f"stop: the outcome of step `{step.step_id}`'s command is unknown ({record.evidence or record.last_error}); "
                "do not run it again blindly",
                step=step.step_id,
                unblock=how,
            )
        return self._action(
            common,
            kind="stop",
            who="operator",
            text=f"stop: the task is unsafe to continue: {state.next_action}",
            unblock=state.next_action,
        )

    def evidence_drift(self, state: RunState, contract: SessionContract) -> tuple[str, ...]:
        """Notes on checkpointed files that changed or went since they were recorded (a checkpoint is not truth)."""
        notes = []
        for step in contract.steps:
            record = state.effects.get(step.step_id)
            evidence = evidence_of(record) if record is not None and record.state is EffectState.VERIFIED else None
            if not isinstance(evidence, dict) or evidence.get("kind") != "file" or not isinstance(evidence.get("path"), str):
                continue
            try:
                now = file_evidence(str(evidence["path"]))
            except InvalidInputError:
                notes.append(f"step {step.step_id!r}: the evidence file {evidence['path']} is gone since it was recorded")
                continue
            if now["sha256"] != evidence.get("sha256"):
                notes.append(
                    f"step {step.step_id!r}: the evidence file {evidence['path']} changed since it was recorded "
                    f"({evidence.get('sha256')}, now {now['sha256']})"
                )
        return tuple(notes)
