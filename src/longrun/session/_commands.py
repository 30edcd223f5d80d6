"""``Session``: a checkpointed session's commands (``init``, ``exec``, ``checkpoint``, ``done``,
``stop``), each one engine invocation on the task's state and ledger.

The continuation rule (``next``) and the reading it needs are ``_next.ContinuationRule``, which a
``Session`` holds and answers each command with; see the package docstring for what each command guarantees.
"""

from __future__ import annotations

import logging
import re
import shlex
import time
from typing import Sequence

from ..budget import Limits, RetryPolicy
from ..canonical import JSONValue, digest_of
from ..clock import SystemClock
from ..contract import ASK_ACTION, Step, check_task_id
from ..contractfile import DECISION_PREFIX, SessionContract
from ..engine import Engine, procedures, Stop, default_owner
from ..envelope import RunState
from ..errors import InvalidInputError
from ..ledger import EffectState
from ..outcome import RunOutcome, Status
from ..protocols import ApprovalSource, CancellationSource, Clock, EffectAdapter, Store
from ..shell import CheckpointAdapter, CommandAdapter, OutputSink, describe_evidence
from ._holder import holder_gone
from ._next import ContinuationRule
from ._plan import SessionPlan, contract_difference, settle_decisions
from ._records import (
    CHECKPOINT_ACTION,
    NextAction,
    SessionResult,
    check_argv,
    evidence_of,
    recorded_command,
    checked_text,
    step_verified,
    file_evidence,
    recorded_contract,
    session_digest,
)

__all__ = ["Session"]

log = logging.getLogger("longrun")
_DECISION = re.compile(re.escape(DECISION_PREFIX) + r"(\d+)")



def _spec_of(store: Store) -> str:
    """How next actions name ``store`` when the caller did not say (``<store>`` if it cannot be named)."""
    spec = getattr(store, "spec", None)
    return shlex.quote(spec) if isinstance(spec, str) and spec else "<store>"

class Session:
    """A checkpointed session's task in a store (see the module docstring).

    ``store_spec`` is how the caller names the store; the commands ``next`` hands back use it. The
    output of ``exec``'s command goes to ``stdout`` and ``stderr`` as it arrives. ``approvals`` and
    ``cancellations`` are the engine's authority sources (the store by default).
    """

    def __init__(
        self,
        store: Store,
        task_id: str,
        *,
        store_spec: str | None = None,
        stdout: OutputSink | None = None,
        stderr: OutputSink | None = None,
        clock: Clock | None = None,
        owner: str | None = None,
        approvals: ApprovalSource | None = None,
        cancellations: CancellationSource | None = None,
    ):
        self.store = store
        self.task_id = check_task_id(task_id)
        self.store_spec = store_spec if store_spec is not None else _spec_of(store)
        self.clock: Clock = clock or SystemClock()
        self.owner = owner or default_owner()
        self.approvals: ApprovalSource = approvals if approvals is not None else store
        self.cancellations: CancellationSource = cancellations if cancellations is not None else store
        self._stdout = stdout
        self._stderr = stderr
        self._rule = ContinuationRule(
            store,
            self.task_id,
            store_spec=self.store_spec,
            clock=self.clock,
            approvals=self.approvals,
            cancellations=self.cancellations,
        )

    def next(self) -> NextAction:
        """Exactly one safe next action, or the legal stop and what would unblock it (``longrun next``). Read-only."""
        return self._rule.next()

    # -- the engine -----------------------------------------------------------------------------

    def _engine(self, contract: SessionContract, command: CommandAdapter | None = None) -> Engine:
        limits = contract.limits
        adapter = command or CommandAdapter(stdout=self._stdout, stderr=self._stderr, observe_timeout_s=limits.observe_timeout_s)
        adapters: dict[str, EffectAdapter] = {step.action: adapter for step in contract.steps if step.kind == "exec"}
        adapters[CHECKPOINT_ACTION] = CheckpointAdapter()
        return Engine(
            contract.run_contract(self.task_id),
            store=self.store,
            adapters=adapters,
            owner=self.owner,
            clock=self.clock,
            limits=Limits(
                max_attempts=limits.max_attempts,
                max_steps=limits.max_steps,
                max_elapsed_s=limits.max_elapsed_s,
                max_no_progress_s=limits.max_no_progress_s,
                # Shorter than the retry delay: a command that failed comes back to the agent
                # (retry-scheduled) instead of being run again within the same call.
                max_block_s=limits.retry_delay_s / 2,
                approval_ttl_s=limits.approval_ttl_s,
            ),
            # An interrupted command observed absent is run again at once; a failed one waits retry_delay_s.
            retry=RetryPolicy(base_delay_s=0.0, jitter=0.0, deadline_s=limits.timeout_s),
            lease_ttl_s=limits.lease_ttl_s,
            approvals=self.approvals,
            cancellations=self.cancellations,
        )

    @staticmethod
    def _step_retry(contract: SessionContract) -> RetryPolicy:
        delay = contract.limits.retry_delay_s
        return RetryPolicy(base_delay_s=delay, max_delay_s=delay, multiplier=1.0, jitter=0.0, deadline_s=contract.limits.timeout_s)

    def _run(self, engine: Engine, plan: SessionPlan, contract: SessionContract) -> RunOutcome:
        """``engine.run(plan)``; if a process that died holds the lease, wait for it to expire (once)."""
        deadline = time.monotonic() + contract.limits.lease_ttl_s + 2.0
        while True:
            outcome = engine.run(plan)
            if outcome.status is not Status.ALREADY_RUNNING:
                return outcome
            lease = self.store.read_lease(self.task_id)
            if lease is None or not holder_gone(lease):
                return outcome
            wait = max(0.0, lease.remaining(self.clock.now(), self._rule.monotonic_reading()))
            if time.monotonic() + wait > deadline:
                return outcome
            log.warning("the lease on %s belongs to %s, which is gone: waiting %.1fs for it to expire", self.task_id, lease.owner, wait)
            time.sleep(wait + 0.02)

    def _guard_order(self, engine: Engine, contract: SessionContract, step_id: str) -> None:
        missing = self._before(contract, engine.invocation.state, step_id)
        if missing:
            raise engine.record(
                procedures.mismatch,
                f"step {step_id!r} asked for before {missing} were recorded",
                f"take the steps in order: `longrun next {self.store_spec} {self.task_id}` says which one is next",
            )

    @staticmethod
    def _before(contract: SessionContract, state: RunState, step_id: str) -> list[str]:
        missing = []
        for step in contract.steps:
            if step.step_id == step_id:
                break
            if not step_verified(state, step.step_id):
                missing.append(step.step_id)
        return missing

    def _after(self, step_id: str | None, outcome: RunOutcome | None, *, notes: Sequence[str] = (), created: bool = False) -> SessionResult:
        state, contract = self._rule.recorded()
        record = state.effects.get(step_id) if step_id is not None else None
        return SessionResult(self._rule.action(state, contract), outcome, step_id, record, created=created, notes=tuple(notes))

    # -- the commands ---------------------------------------------------------------------------

    def init(self, contract: SessionContract, *, source: str | None = None) -> SessionResult:
        """Start the task from ``contract`` (``longrun init``); with the same contract again, change nothing."""
        if contract.task_id is not None and contract.task_id != self.task_id:
            raise InvalidInputError(f"the run contract is for task {contract.task_id!r}, not {self.task_id!r}")
        state = self._rule.load()
        if state is not None:
            recorded = recorded_contract(state)
            if recorded is None:
                raise InvalidInputError(f"task {self.task_id!r} already exists and is not a checkpointed session; choose another task id")
            if state.plan_digest != session_digest(contract):
                raise InvalidInputError(
                    f"task {self.task_id!r} was started with another run contract ({contract_difference(state, contract)}; "
                    f"plan digest {state.plan_digest}, this file's {session_digest(contract)}); a changed contract needs a new task id"
                )
            return self._after(None, None, notes=("the task was already started with this run contract: nothing changed",))

        plan: SessionPlan

        def drive(engine: Engine) -> None:
            if plan.created:
                raise engine.drive(procedures.wait, Status.RUNNING, self._rule.step_action(contract, engine.invocation.state, self.store_spec).text)
            raise Stop(engine.invocation.state.status, engine.invocation.state.next_action)  # another init got there first

        plan = SessionPlan(contract, drive, create=True, source=source)
        outcome = self._run(self._engine(contract), plan, contract)
        if outcome.status is Status.ALREADY_RUNNING:
            return SessionResult(self._rule.waiting(outcome, contract), outcome)
        return self._after(None, outcome, created=plan.created)

    def exec(
        self,
        step_id: str,
        command: Sequence[str] | None = None,
        *,
        observe: str | None = None,
        timeout_s: float | None = None,
        approval: bool = False,
    ) -> SessionResult:
        """Run an exec step's command as an effect through the ledger (``longrun exec``)."""
        state, contract = self._rule.recorded()
        step = contract.step(step_id)
        if step.kind != "exec":
            raise InvalidInputError(
                f"step {step_id!r} is a checkpoint step: do its work, then record it with "
                f"`longrun checkpoint {self.store_spec} {self.task_id} {step_id} ...`"
            )
        argv = tuple(command) if command else None
        if argv is not None:
            check_argv(argv)
        if step.command is not None and argv is not None and argv != step.command:
            raise InvalidInputError(
                f"the run contract gives step {step_id!r} the command `{shlex.join(step.command)}`, not `{shlex.join(argv)}`; "
                "run it as the contract says (or without a command)"
            )
        record = state.effects.get(step_id)
        recorded = recorded_command(record)
        argv = argv or step.command or recorded
        if argv is None:
            raise InvalidInputError(
                f"step {step_id!r} needs its command: `longrun exec {self.store_spec} {self.task_id} {step_id} -- COMMAND ARGS...`"
            )
        if recorded is not None and argv != recorded:
            raise InvalidInputError(
                f"step {step_id!r} is recorded ({record.state.value if record else ''}) with the command `{shlex.join(recorded)}`; "
                f"its attempts and approval belong to that command: run it again, not `{shlex.join(argv)}`"
            )
        if record is not None and record.state is EffectState.VERIFIED:
            return self._after(step_id, None, notes=(f"step {step_id!r} was already recorded (verified): nothing was run",))
        missing = self._before(contract, state, step_id)
        if missing:
            raise InvalidInputError(
                f"step {step_id!r} comes after {', '.join(missing)}, not recorded yet: "
                f"`longrun next {self.store_spec} {self.task_id}` says what to do now"
            )
        if observe is not None:
            checked_text(observe, "the observe command")
            check_argv((observe,))
        if timeout_s is not None and not timeout_s > 0:
            raise InvalidInputError(f"the timeout must be a positive number of seconds, got {timeout_s!r}")
        wants_approval = approval or step.approval
        payload: dict[str, JSONValue] = {
            "command": list(argv),
            "cwd": contract.workdir,
            "timeout_s": timeout_s or step.timeout_s or contract.limits.timeout_s,
            "observe": observe or step.observe,
            "approval": wants_approval,
        }
        adapter = CommandAdapter(
            stdout=self._stdout,
            stderr=self._stderr,
            observe={step_id: observe} if observe else {},
            timeouts={step_id: timeout_s} if timeout_s else {},
            observe_timeout_s=contract.limits.observe_timeout_s,
        )

        def drive(engine: Engine) -> None:
            settle_decisions(engine)
            self._guard_order(engine, contract, step_id)
            current = engine.invocation.state.effects.get(step_id)
            needs_approval = wants_approval
            if current is not None and current.state is not EffectState.VERIFIED:
                if recorded_command(current) != argv:
                    raise engine.record(procedures.mismatch, f"step {step_id!r} was recorded with another command meanwhile", "run `longrun next` again")
                needs_approval = needs_approval or bool(isinstance(current.payload, dict) and current.payload.get("approval"))
            refusal = engine.config.contract.action_refusal(step.action)
            if refusal is not None:
                raise engine.record(procedures.refused_action, step_id, refusal)
            engine.drive(procedures.effect, Step(step_id, step.action, payload, approval=needs_approval), retry=self._step_retry(contract))
            raise engine.drive(procedures.wait, Status.RUNNING, self._rule.step_action(contract, engine.invocation.state, self.store_spec).text)

        outcome = self._run(self._engine(contract, adapter), SessionPlan(contract, drive), contract)
        return self._after(step_id, outcome)

    def checkpoint(self, step_id: str, *, evidence_file: str | None = None, note: str | None = None) -> SessionResult:
        """Record a checkpoint step's evidence (``longrun checkpoint``)."""
        state, contract = self._rule.recorded()
        step = contract.step(step_id)
        if step.kind != "checkpoint":
            raise InvalidInputError(
                f"step {step_id!r} is an exec step: run it through the ledger with "
                f"`longrun exec {self.store_spec} {self.task_id} {step_id} ...`"
            )
        if (evidence_file is None) == (note is None):
            raise InvalidInputError("give the checkpoint's evidence: --evidence FILE or --note TEXT (one of them)")
        evidence: dict[str, JSONValue]
        if evidence_file is not None:
            if step.evidence != "file":
                raise InvalidInputError(f"step {step_id!r} is recorded with a note (--note TEXT), as its run contract says")
            evidence = file_evidence(evidence_file)
            if step.path is not None and evidence["path"] != step.path:
                raise InvalidInputError(f"step {step_id!r}'s evidence is the file {step.path} (the run contract says so), not {evidence['path']}")
        else:
            assert note is not None
            if step.evidence != "note":
                raise InvalidInputError(
                    f"step {step_id!r} is recorded with a file (--evidence {step.path or 'FILE'}), as its run contract says"
                )
            evidence = {"kind": "note", "text": checked_text(note, "the note")}
        payload: dict[str, JSONValue] = {"evidence": evidence}
        digest = digest_of(payload)
        record = state.effects.get(step_id)
        if record is not None and record.state is EffectState.VERIFIED:
            if record.payload_digest == digest:
                return self._after(step_id, None, notes=(f"step {step_id!r} was already recorded with this evidence: nothing changed",))
            raise InvalidInputError(
                f"step {step_id!r} is already recorded with {describe_evidence(evidence_of(record))}; a checkpoint is recorded once"
            )
        if record is not None and record.payload_digest != digest:
            raise InvalidInputError(
                f"step {step_id!r} waits for approval of {describe_evidence(evidence_of(record))}; this is "
                f"{describe_evidence(evidence)}: put back what was asked to be approved"
            )
        missing = self._before(contract, state, step_id)
        if missing:
            raise InvalidInputError(
                f"step {step_id!r} comes after {', '.join(missing)}, not recorded yet: "
                f"`longrun next {self.store_spec} {self.task_id}` says what to do now"
            )

        def drive(engine: Engine) -> None:
            settle_decisions(engine)
            self._guard_order(engine, contract, step_id)
            current = engine.invocation.state.effects.get(step_id)
            if current is not None and current.payload_digest != digest:
                raise engine.record(procedures.mismatch, f"step {step_id!r} was recorded with other evidence meanwhile", "run `longrun next` again")
            if current is None or current.state is not EffectState.VERIFIED:
                if step.approval:
                    engine.drive(procedures.effect, Step(step_id, CHECKPOINT_ACTION, payload, approval=True), retry=self._step_retry(contract))
                else:  # planned and verified in one commit: an interrupted checkpoint leaves nothing behind
                    engine.record(procedures.plan, Step(step_id, CHECKPOINT_ACTION, payload))
                    engine.record(procedures.complete, step_id, evidence)
            raise engine.drive(procedures.wait, Status.RUNNING, self._rule.step_action(contract, engine.invocation.state, self.store_spec).text)

        outcome = self._run(self._engine(contract), SessionPlan(contract, drive), contract)
        return self._after(step_id, outcome)

    def done(self) -> SessionResult:
        """End the run ``done`` if the contract's completion evidence is recorded (``longrun done``)."""
        state, contract = self._rule.recorded()
        if state.status is Status.DONE:
            return self._after(None, None, notes=("the task is already done",))
        missing = self._unfinished(contract, state)
        if missing:
            return SessionResult(self._rule.action(state, contract), None, missing=missing)

        def drive(engine: Engine) -> None:
            settle_decisions(engine)
            still = self._unfinished(contract, engine.invocation.state)
            if still:
                raise engine.record(procedures.mismatch, f"completion evidence missing for {still}", "run `longrun next` again")
            raise engine.drive(procedures.finish, list(contract.required))

        outcome = self._run(self._engine(contract), SessionPlan(contract, drive), contract)
        state, contract = self._rule.recorded()
        return self._after(None, outcome, notes=self._rule.evidence_drift(state, contract))

    @staticmethod
    def _unfinished(contract: SessionContract, state: RunState) -> tuple[str, ...]:
        """What ``done`` waits for: the completion evidence, and every step begun (it has a record) but not recorded."""
        begun = {step.step_id for step in contract.steps if step.step_id in state.effects}
        return tuple(
            step.step_id
            for step in contract.steps
            if (step.step_id in contract.required or step.step_id in begun) and not step_verified(state, step.step_id)
        )

    def stop(self, reason: str) -> SessionResult:
        """Record a legal stop: a question for a person (``longrun stop``), answered with ``longrun answer``."""
        checked_text(reason, "the reason")
        _, contract = self._rule.recorded()
        decided: list[str] = []

        def drive(engine: Engine) -> None:
            numbers = [int(match.group(1)) for sid in engine.invocation.state.effects if (match := _DECISION.fullmatch(sid))]
            step_id = f"{DECISION_PREFIX}{max(numbers, default=0) + 1}"
            engine.record(procedures.plan, Step(step_id, ASK_ACTION, {"question": reason, "choices": None}))
            decided.append(step_id)
            settle_decisions(engine)
            raise engine.drive(procedures.wait, Status.RUNNING, self._rule.step_action(contract, engine.invocation.state, self.store_spec).text)

        outcome = self._run(self._engine(contract), SessionPlan(contract, drive), contract)
        return self._after(decided[0] if decided and outcome.status is Status.AWAITING_INPUT else None, outcome)
