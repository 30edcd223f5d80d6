"""The checkpointed session (Level A): an agent with only a terminal keeps a run contract, checkpoints and exact-once commands.

An agent (often a model with a shell, not a program of its own) works through the bounded steps
of a run contract (``longrun.contractfile``), one command at a time, and keeps its progress in the
store rather than in its context. Its continuation rule is ``Session.next()`` (``longrun next``):
from the store alone, with no chat history, exactly one safe next action, or the legal stop and
what would unblock it.

Each command is one engine invocation (``Engine.run``) on the same ``RunState`` and ledger the other
faces keep, so ``status``, ``history``, ``verify``, ``approve``, ``answer`` and ``cancel`` work on a
session's task unchanged:

- ``init`` records the contract with the task's first revision: an internal step
  ``longrun.contract`` holds its normalized JSON, and the plan digest (what approvals bind to) is a
  digest over it. Running ``init`` again with the same contract changes nothing; with another it is
  refused.
- ``exec`` makes one step's command an effect (``Engine.effect`` with ``shell.CommandAdapter``):
  the step's action must be allowed by the contract, cancellation and approval are read fresh, the
  lease is held (a second ``exec`` on the task is ``already-running``), ``started`` is durable
  before the command runs, and after a crash the next ``exec`` observes (the observe command)
  instead of running it again. A command that fails comes back to the agent: the step may be tried
  again after ``retry_delay_s``, within ``max_attempts``.
- ``checkpoint`` records work that is not an external effect with its evidence (a file's SHA-256 or
  a note), as a verified internal step (``longrun.checkpoint``) committed in one write; a step that
  needs approval goes through the approval gate first, bound to that evidence.
- ``done`` ends the run ``done`` when the contract's completion evidence is recorded (and no step
  that was begun is left unrecorded), and refuses, naming what is missing, otherwise.
- ``stop`` records a legal stop: a question for a person (a ``longrun.ask`` step ``decision-N``),
  answered with ``longrun answer``. Until it is answered every command stops ``awaiting-input``.

Steps are taken in the contract's order. A task's recorded status between commands is ``running``
with the next action in words, so ``longrun ls`` and ``longrun status`` show it.

Not guaranteed: that the agent runs what ``next`` says (a checkpoint records what the agent says it
did, with the evidence's digest: it is not proof that the work is right), or anything about commands
run outside ``longrun exec``. Only effects made through ``exec`` are in the ledger.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import socket
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from .approval import GateVerdict, evaluate_gate
from .budget import Limits, RetryPolicy
from .canonical import JSONValue, digest_of
from .clock import SystemClock
from .contract import ASK_ACTION, INTERNAL_PREFIX, Step, check_task_id
from .contractfile import DECISION_PREFIX, ContractStep, SessionContract
from .engine import Engine, Stop, default_owner, utc
from .envelope import RunState
from .errors import CorruptStateError, InvalidInputError, UnknownTaskError
from .lease import Lease, MonotonicReading, boot_clock_id
from .ledger import EffectRecord, EffectState
from .outcome import ENDED_UNFINISHED, RunOutcome, Status
from .protocols import ApprovalSource, CancellationSource, Clock, EffectAdapter, Store
from .shell import CheckpointAdapter, CommandAdapter, OutputSink, describe_evidence, running_commands

__all__ = [
    "CHECKPOINT_ACTION",
    "CONTRACT_STEP",
    "MAX_TEXT_CHARS",
    "NextAction",
    "Session",
    "SessionResult",
    "holder_gone",
    "recorded_contract",
    "session_digest",
]

log = logging.getLogger("longrun")

CONTRACT_STEP = INTERNAL_PREFIX + "contract"
"""The step id (and action) of a session's recorded run contract."""
CHECKPOINT_ACTION = INTERNAL_PREFIX + "checkpoint"
"""The action of a recorded checkpoint."""
MAX_TEXT_CHARS = 4096
"""The longest note or stop reason."""
_DECISION = re.compile(re.escape(DECISION_PREFIX) + r"(\d+)")
_STILL_RUNNING = "is still running (pid"


def session_digest(contract: SessionContract) -> str:
    """The plan digest of a session's task: it pins the whole run contract, so approvals bind to it."""
    return digest_of({"session": contract.to_json()}, what="run contract")


def recorded_contract(state: RunState) -> SessionContract | None:
    """The run contract a session's task recorded, or None if the task is not a session."""
    record = state.effects.get(CONTRACT_STEP)
    if record is None or record.action != CONTRACT_STEP:
        return None
    payload = record.payload
    if not isinstance(payload, dict):
        raise CorruptStateError(f"task {state.task_id!r}: its run-contract record is not a JSON object")
    return SessionContract.from_json(payload.get("contract"))


def holder_gone(lease: Lease) -> bool:
    """True if the lease's holder was a process on this machine that no longer runs.

    Owners are ``host:pid:token`` (``engine.default_owner``). A pid that is gone (or a zombie) cannot
    be holding the task; anything else, including a pid now used by another process, counts as alive,
    which only makes a caller wait for the lease to expire."""
    parts = lease.owner.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    if lease.monotonic_clock is not None and lease.monotonic_clock != boot_clock_id():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    fields = stat.rsplit(b")", 1)[-1].split()
    return bool(fields) and fields[0] in (b"Z", b"X")


@dataclass(frozen=True, slots=True)
class NextAction:
    """The continuation rule's answer: one safe next action, or the legal stop and what would unblock it.

    ``who`` acts next: ``agent`` (run ``commands`` in order, in ``cwd``), ``operator`` (a person must
    approve, answer or resolve something: ``unblock`` says what), ``time`` (wait ``retry_after_s``,
    then ask again), or ``nobody`` (the task is finished or ended).
    """

    task_id: str
    kind: str
    """exec, checkpoint, done (the agent's), wait, stop, finished, ended."""
    who: str
    text: str
    status: str
    step: str | None = None
    commands: tuple[tuple[str, ...], ...] = ()
    cwd: str | None = None
    evidence: str | None = None
    unblock: str | None = None
    retry_after_s: float | None = None
    notes: tuple[str, ...] = ()
    decisions: tuple[Mapping[str, JSONValue], ...] = ()
    recorded: tuple[str, ...] = ()
    remaining: tuple[str, ...] = ()
    goal: str = ""
    stop_when: tuple[str, ...] = ()

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "task_id": self.task_id,
            "kind": self.kind,
            "who": self.who,
            "next_action": self.text,
            "status": self.status,
            "step": self.step,
            "commands": [list(command) for command in self.commands],
            "cwd": self.cwd,
            "evidence": self.evidence,
            "unblock": self.unblock,
            "retry_after_s": self.retry_after_s,
            "notes": list(self.notes),
            "decisions": [dict(item) for item in self.decisions],
            "recorded": list(self.recorded),
            "remaining": list(self.remaining),
            "goal": self.goal,
            "stop_when": list(self.stop_when),
        }


@dataclass(frozen=True, slots=True)
class SessionResult:
    """What a session command did: the engine's outcome (None if it refused before running), the
    step's record as it now stands, and the next action."""

    next: NextAction
    outcome: RunOutcome | None = None
    step: str | None = None
    record: EffectRecord | None = None
    created: bool = False
    missing: tuple[str, ...] = ()
    """``done``: steps not recorded yet (the completion evidence, and any step begun), so nothing was written."""
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "status": self.outcome.status.value if self.outcome is not None else None,
            "step": self.step,
            "record": self.record.to_json() if self.record is not None else None,
            "created": self.created,
            "missing": list(self.missing),
            "notes": list(self.notes),
            "outcome": self.outcome.to_json() if self.outcome is not None else None,
            "next": self.next.to_json(),
        }


def _verified(state: RunState, step_id: str) -> bool:
    record = state.effects.get(step_id)
    return record is not None and record.state is EffectState.VERIFIED


def _recorded_command(record: EffectRecord | None) -> tuple[str, ...] | None:
    if record is None or not isinstance(record.payload, dict):
        return None
    command = record.payload.get("command")
    if isinstance(command, list) and all(isinstance(item, str) for item in command):
        return tuple(str(item) for item in command)
    return None


def _payload_text(record: EffectRecord | None, name: str) -> str | None:
    if record is None or not isinstance(record.payload, dict):
        return None
    value = record.payload.get(name)
    return value if isinstance(value, str) else None


def _text(value: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{what} must be non-empty text")
    if len(value) > MAX_TEXT_CHARS:
        raise InvalidInputError(f"{what} is {len(value)} characters, over the limit of {MAX_TEXT_CHARS}")
    return value


def _check_argv(argv: Sequence[str]) -> None:
    """A command that can be recorded and run: an argv of text with no NUL bytes, the first not empty."""
    if not argv or not argv[0]:
        raise InvalidInputError("the command is empty")
    for item in argv:
        if "\x00" in item:
            raise InvalidInputError(f"the command's argument {item[:40]!r} holds a NUL byte, which no program can be given")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInputError(f"the command's argument {item[:40]!r} is not text (bytes that are not UTF-8)") from None


def file_evidence(path: str) -> dict[str, JSONValue]:
    """A file as checkpoint evidence: its absolute path, SHA-256 and size."""
    full = os.path.abspath(path)
    digest = hashlib.sha256()
    size = 0
    try:
        with open(full, "rb") as handle:
            while chunk := handle.read(1024 * 1024):
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise InvalidInputError(f"cannot read the evidence file {path!r}: {exc.strerror or exc}") from None
    return {"kind": "file", "path": full, "sha256": "sha256:" + digest.hexdigest(), "bytes": size}


class _SessionPlan:
    """The engine ``Plan`` of one session command: the digest pins the contract; ``drive`` is the command."""

    def __init__(self, contract: SessionContract, drive: Callable[[Engine], None], *, create: bool = False, source: str | None = None):
        self.digest = session_digest(contract)
        self.created = False
        self._contract = contract
        self._drive = drive
        self._create = create
        self._source = source

    def initial(self, engine: Engine, state: RunState) -> None:
        if not self._create:
            raise engine.mismatch("the task has no state", "start the task with `longrun init <store> TASK --contract FILE`")
        payload: dict[str, JSONValue] = {"contract": self._contract.to_json(), "file": self._source}
        engine.plan(Step(CONTRACT_STEP, CONTRACT_STEP, payload))
        engine.complete(CONTRACT_STEP, {"contract_digest": self._contract.digest})
        self.created = True

    def accept(self, engine: Engine, state: RunState) -> None:
        if state.plan_digest != self.digest:
            raise engine.mismatch(
                f"recorded plan digest {state.plan_digest}; the run contract's digest is {self.digest}",
                "the task was started with another run contract: a changed contract needs a new task id",
            )

    def drive(self, engine: Engine) -> None:
        self._drive(engine)

    def progress(self, state: RunState) -> str:
        steps = [step.step_id for step in self._contract.steps]
        done = sum(1 for sid in steps if (record := state.effects.get(sid)) is not None and record.state is EffectState.VERIFIED)
        return f"{done} of {len(steps)} contract steps recorded"

    def result(self, state: RunState) -> JSONValue:
        return None


def _settle_decisions(engine: Engine) -> None:
    """Every recorded stop must be answered before anything else: an unanswered one stops ``awaiting-input``."""
    for record in list(engine.state.effects.values()):
        if record.action == ASK_ACTION and record.state is not EffectState.VERIFIED:
            payload = record.payload if isinstance(record.payload, dict) else {}
            engine.ask(Step(record.step_id, ASK_ACTION, payload), None)


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
        store_spec: str = "<store>",
        stdout: OutputSink | None = None,
        stderr: OutputSink | None = None,
        clock: Clock | None = None,
        owner: str | None = None,
        approvals: ApprovalSource | None = None,
        cancellations: CancellationSource | None = None,
    ):
        self.store = store
        self.task_id = check_task_id(task_id)
        self.store_spec = store_spec
        self.clock: Clock = clock or SystemClock()
        self.owner = owner or default_owner()
        self.approvals: ApprovalSource = approvals if approvals is not None else store
        self.cancellations: CancellationSource = cancellations if cancellations is not None else store
        self._stdout = stdout
        self._stderr = stderr

    # -- reading ------------------------------------------------------------------------------

    def _load(self) -> RunState | None:
        try:
            return self.store.load(self.task_id).state
        except UnknownTaskError:
            return None

    def _session(self) -> tuple[RunState, SessionContract]:
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

    def _monotonic_reading(self) -> MonotonicReading | None:
        timeline = boot_clock_id()
        monotonic: Callable[[], float] | None = getattr(self.clock, "monotonic", None)
        if timeline is None or not isinstance(self.clock, SystemClock) or not callable(monotonic):
            return None
        return MonotonicReading(timeline, monotonic())

    def _run(self, engine: Engine, plan: _SessionPlan, contract: SessionContract) -> RunOutcome:
        """``engine.run(plan)``; if a process that died holds the lease, wait for it to expire (once)."""
        deadline = time.monotonic() + contract.limits.lease_ttl_s + 2.0
        while True:
            outcome = engine.run(plan)
            if outcome.status is not Status.ALREADY_RUNNING:
                return outcome
            lease = self.store.read_lease(self.task_id)
            if lease is None or not holder_gone(lease):
                return outcome
            wait = max(0.0, lease.remaining(self.clock.now(), self._monotonic_reading()))
            if time.monotonic() + wait > deadline:
                return outcome
            log.warning("the lease on %s belongs to %s, which is gone: waiting %.1fs for it to expire", self.task_id, lease.owner, wait)
            time.sleep(wait + 0.02)

    def _guard_order(self, engine: Engine, contract: SessionContract, step_id: str) -> None:
        missing = self._before(contract, engine.state, step_id)
        if missing:
            raise engine.mismatch(
                f"step {step_id!r} asked for before {missing} were recorded",
                f"take the steps in order: `longrun next {self.store_spec} {self.task_id}` says which one is next",
            )

    @staticmethod
    def _before(contract: SessionContract, state: RunState, step_id: str) -> list[str]:
        missing = []
        for step in contract.steps:
            if step.step_id == step_id:
                break
            if not _verified(state, step.step_id):
                missing.append(step.step_id)
        return missing

    def _after(self, step_id: str | None, outcome: RunOutcome | None, *, notes: Sequence[str] = (), created: bool = False) -> SessionResult:
        state, contract = self._session()
        record = state.effects.get(step_id) if step_id is not None else None
        return SessionResult(self._next(state, contract), outcome, step_id, record, created=created, notes=tuple(notes))

    # -- the commands ---------------------------------------------------------------------------

    def init(self, contract: SessionContract, *, source: str | None = None) -> SessionResult:
        """Start the task from ``contract`` (``longrun init``); with the same contract again, change nothing."""
        if contract.task_id is not None and contract.task_id != self.task_id:
            raise InvalidInputError(f"the run contract is for task {contract.task_id!r}, not {self.task_id!r}")
        state = self._load()
        if state is not None:
            recorded = recorded_contract(state)
            if recorded is None:
                raise InvalidInputError(f"task {self.task_id!r} already exists and is not a checkpointed session; choose another task id")
            if state.plan_digest != session_digest(contract):
                raise InvalidInputError(
                    f"task {self.task_id!r} was started with another run contract (plan digest {state.plan_digest}, this "
                    f"file's {session_digest(contract)}); a changed contract needs a new task id"
                )
            return self._after(None, None, notes=("the task was already started with this run contract: nothing changed",))

        plan: _SessionPlan

        def drive(engine: Engine) -> None:
            if plan.created:
                raise engine.wait(Status.RUNNING, self._step_action(contract, engine.state, "<store>").text)
            raise Stop(engine.state.status, engine.state.next_action)  # another init got there first

        plan = _SessionPlan(contract, drive, create=True, source=source)
        outcome = self._run(self._engine(contract), plan, contract)
        if outcome.status is Status.ALREADY_RUNNING:
            return SessionResult(self._waiting(outcome, contract), outcome)
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
        state, contract = self._session()
        step = contract.step(step_id)
        if step.kind != "exec":
            raise InvalidInputError(
                f"step {step_id!r} is a checkpoint step: do its work, then record it with "
                f"`longrun checkpoint {self.store_spec} {self.task_id} {step_id} ...`"
            )
        argv = tuple(command) if command else None
        if argv is not None:
            _check_argv(argv)
        if step.command is not None and argv is not None and argv != step.command:
            raise InvalidInputError(
                f"the run contract gives step {step_id!r} the command `{shlex.join(step.command)}`, not `{shlex.join(argv)}`; "
                "run it as the contract says (or without a command)"
            )
        record = state.effects.get(step_id)
        recorded = _recorded_command(record)
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
            _text(observe, "the observe command")
            _check_argv((observe,))
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
            _settle_decisions(engine)
            self._guard_order(engine, contract, step_id)
            current = engine.state.effects.get(step_id)
            needs_approval = wants_approval
            if current is not None and current.state is not EffectState.VERIFIED:
                if _recorded_command(current) != argv:
                    raise engine.mismatch(f"step {step_id!r} was recorded with another command meanwhile", "run `longrun next` again")
                needs_approval = needs_approval or bool(isinstance(current.payload, dict) and current.payload.get("approval"))
            refusal = engine.contract.action_refusal(step.action)
            if refusal is not None:
                raise engine.refused_action(step_id, refusal)
            engine.effect(Step(step_id, step.action, payload, approval=needs_approval), retry=self._step_retry(contract))
            raise engine.wait(Status.RUNNING, self._step_action(contract, engine.state, "<store>").text)

        outcome = self._run(self._engine(contract, adapter), _SessionPlan(contract, drive), contract)
        return self._after(step_id, outcome)

    def checkpoint(self, step_id: str, *, evidence_file: str | None = None, note: str | None = None) -> SessionResult:
        """Record a checkpoint step's evidence (``longrun checkpoint``)."""
        state, contract = self._session()
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
            evidence = {"kind": "note", "text": _text(note, "the note")}
        payload: dict[str, JSONValue] = {"evidence": evidence}
        digest = digest_of(payload)
        record = state.effects.get(step_id)
        if record is not None and record.state is EffectState.VERIFIED:
            if record.payload_digest == digest:
                return self._after(step_id, None, notes=(f"step {step_id!r} was already recorded with this evidence: nothing changed",))
            raise InvalidInputError(
                f"step {step_id!r} is already recorded with {describe_evidence(_evidence_of(record))}; a checkpoint is recorded once"
            )
        if record is not None and record.payload_digest != digest:
            raise InvalidInputError(
                f"step {step_id!r} waits for approval of {describe_evidence(_evidence_of(record))}; this is "
                f"{describe_evidence(evidence)}: put back what was asked to be approved"
            )
        missing = self._before(contract, state, step_id)
        if missing:
            raise InvalidInputError(
                f"step {step_id!r} comes after {', '.join(missing)}, not recorded yet: "
                f"`longrun next {self.store_spec} {self.task_id}` says what to do now"
            )

        def drive(engine: Engine) -> None:
            _settle_decisions(engine)
            self._guard_order(engine, contract, step_id)
            current = engine.state.effects.get(step_id)
            if current is not None and current.payload_digest != digest:
                raise engine.mismatch(f"step {step_id!r} was recorded with other evidence meanwhile", "run `longrun next` again")
            if current is None or current.state is not EffectState.VERIFIED:
                if step.approval:
                    engine.effect(Step(step_id, CHECKPOINT_ACTION, payload, approval=True), retry=self._step_retry(contract))
                else:  # planned and verified in one commit: an interrupted checkpoint leaves nothing behind
                    engine.plan(Step(step_id, CHECKPOINT_ACTION, payload))
                    engine.complete(step_id, evidence)
            raise engine.wait(Status.RUNNING, self._step_action(contract, engine.state, "<store>").text)

        outcome = self._run(self._engine(contract), _SessionPlan(contract, drive), contract)
        return self._after(step_id, outcome)

    def done(self) -> SessionResult:
        """End the run ``done`` if the contract's completion evidence is recorded (``longrun done``)."""
        state, contract = self._session()
        if state.status is Status.DONE:
            return self._after(None, None, notes=("the task is already done",))
        missing = self._unfinished(contract, state)
        if missing:
            return SessionResult(self._next(state, contract), None, missing=missing)

        def drive(engine: Engine) -> None:
            _settle_decisions(engine)
            still = self._unfinished(contract, engine.state)
            if still:
                raise engine.mismatch(f"completion evidence missing for {still}", "run `longrun next` again")
            raise engine.finish(list(contract.required))

        outcome = self._run(self._engine(contract), _SessionPlan(contract, drive), contract)
        state, contract = self._session()
        return self._after(None, outcome, notes=self._evidence_drift(state, contract))

    @staticmethod
    def _unfinished(contract: SessionContract, state: RunState) -> tuple[str, ...]:
        """What ``done`` waits for: the completion evidence, and every step begun (it has a record) but not recorded."""
        begun = {step.step_id for step in contract.steps if step.step_id in state.effects}
        return tuple(
            step.step_id
            for step in contract.steps
            if (step.step_id in contract.required or step.step_id in begun) and not _verified(state, step.step_id)
        )

    def stop(self, reason: str) -> SessionResult:
        """Record a legal stop: a question for a person (``longrun stop``), answered with ``longrun answer``."""
        _text(reason, "the reason")
        _, contract = self._session()
        decided: list[str] = []

        def drive(engine: Engine) -> None:
            numbers = [int(match.group(1)) for sid in engine.state.effects if (match := _DECISION.fullmatch(sid))]
            step_id = f"{DECISION_PREFIX}{max(numbers, default=0) + 1}"
            engine.plan(Step(step_id, ASK_ACTION, {"question": reason, "choices": None}))
            decided.append(step_id)
            _settle_decisions(engine)
            raise engine.wait(Status.RUNNING, self._step_action(contract, engine.state, "<store>").text)

        outcome = self._run(self._engine(contract), _SessionPlan(contract, drive), contract)
        return self._after(decided[0] if decided and outcome.status is Status.AWAITING_INPUT else None, outcome)

    # -- the continuation rule ------------------------------------------------------------------

    def next(self) -> NextAction:
        """Exactly one safe next action, or the legal stop and what would unblock it (``longrun next``). Read-only."""
        state, contract = self._session()
        return self._next(state, contract)

    def _common(self, contract: SessionContract, state: RunState) -> dict[str, object]:
        recorded = tuple(step.step_id for step in contract.steps if _verified(state, step.step_id))
        remaining = tuple(step.step_id for step in contract.steps if not _verified(state, step.step_id))
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

    def _waiting(self, outcome: RunOutcome, contract: SessionContract) -> NextAction:
        state = self._load()
        common = self._common(contract, state) if state is not None else {"task_id": self.task_id, "status": "new", "goal": contract.goal}
        return self._action(common, kind="wait", who="time", text=outcome.next_action, retry_after_s=1.0)

    def _exec_argv(self, step: ContractStep, record: EffectRecord | None, spec: str) -> tuple[str, ...] | None:
        base = ("longrun", "exec", spec, self.task_id, step.step_id)
        if step.command is not None:
            return base
        recorded = _recorded_command(record)
        return (*base, "--", *recorded) if recorded is not None else None

    def _step_action(self, contract: SessionContract, state: RunState, spec: str) -> NextAction:
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
        observe = _payload_text(record, "observe") or step.observe
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
            command = step.command or _recorded_command(record)
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
        observe = _payload_text(record, "observe") or step.observe
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

    def _next(self, state: RunState, contract: SessionContract) -> NextAction:
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
        step_action = self._step_action(contract, state, spec)
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
        if lease is not None and not lease.expired(now, self._monotonic_reading()):
            remaining = lease.remaining(now, self._monotonic_reading())
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
            if not _verified(state, str(item["step"])):
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
            command = "" if step.command is not None else " -- " + shlex.join(_recorded_command(record) or ())
            observe = _payload_text(record, "observe") or step.observe
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

    def _evidence_drift(self, state: RunState, contract: SessionContract) -> tuple[str, ...]:
        """Notes on checkpointed files that changed or went since they were recorded (a checkpoint is not truth)."""
        notes = []
        for step in contract.steps:
            record = state.effects.get(step.step_id)
            evidence = _evidence_of(record) if record is not None and record.state is EffectState.VERIFIED else None
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


def _evidence_of(record: EffectRecord) -> JSONValue:
    return record.payload.get("evidence") if isinstance(record.payload, dict) else None

