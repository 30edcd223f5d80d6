"""A session's records: the run contract as the task records it, the continuation rule's answer
(``NextAction``), a command's result (``SessionResult``), and checkpoint evidence.

Also the small readers of a session's effect records that both the commands and the continuation
rule use (is a step verified, which command and observe command a step was recorded with).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..canonical import JSONValue, digest_of
from ..contract import INTERNAL_PREFIX
from ..contractfile import SessionContract
from ..envelope import RunState
from ..errors import CorruptStateError, InvalidInputError
from ..ledger import EffectRecord, EffectState
from ..outcome import RunOutcome

__all__ = [
    "CHECKPOINT_ACTION",
    "CONTRACT_STEP",
    "MAX_TEXT_CHARS",
    "NextAction",
    "SessionResult",
    "check_argv",
    "checked_text",
    "evidence_of",
    "file_evidence",
    "payload_text",
    "recorded_command",
    "recorded_contract",
    "session_digest",
    "step_verified",
]

CONTRACT_STEP = INTERNAL_PREFIX + "contract"
"""The step id (and action) of a session's recorded run contract."""
CHECKPOINT_ACTION = INTERNAL_PREFIX + "checkpoint"
"""The action of a recorded checkpoint."""
MAX_TEXT_CHARS = 4096
"""The longest note or stop reason."""


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


def step_verified(state: RunState, step_id: str) -> bool:
    record = state.effects.get(step_id)
    return record is not None and record.state is EffectState.VERIFIED


def recorded_command(record: EffectRecord | None) -> tuple[str, ...] | None:
    if record is None or not isinstance(record.payload, dict):
        return None
    command = record.payload.get("command")
    if isinstance(command, list) and all(isinstance(item, str) for item in command):
        return tuple(str(item) for item in command)
    return None


def payload_text(record: EffectRecord | None, name: str) -> str | None:
    if record is None or not isinstance(record.payload, dict):
        return None
    value = record.payload.get(name)
    return value if isinstance(value, str) else None


def checked_text(value: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{what} must be non-empty text")
    if len(value) > MAX_TEXT_CHARS:
        raise InvalidInputError(f"{what} is {len(value)} characters, over the limit of {MAX_TEXT_CHARS}")
    return value


def check_argv(argv: Sequence[str]) -> None:
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


def evidence_of(record: EffectRecord) -> JSONValue:
    return record.payload.get("evidence") if isinstance(record.payload, dict) else None
