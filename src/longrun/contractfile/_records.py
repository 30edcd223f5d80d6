"""A run contract's records (``SessionContract``, its steps and limits) and their validation.

One validation serves both the TOML file (``_load``) and the normalized JSON a task records
(``SessionContract.from_json``); ``fail`` says how a problem is reported: ``ContractFileError``
with the file's line, or ``CorruptStateError``.
"""

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NoReturn, Sequence

from ..canonical import JSONValue, digest_of
from ..contract import INTERNAL_PREFIX, STEP_ID_PATTERN, RunContract, check_task_id
from ..errors import CorruptStateError, InvalidInputError

__all__ = [
    "CONTRACT_VERSION",
    "DECISION_PREFIX",
    "FIELDS",
    "MAX_CONTRACT_BYTES",
    "ContractLimits",
    "ContractStep",
    "Fail",
    "Path",
    "SessionContract",
    "build_contract",
]

CONTRACT_VERSION = 1
MAX_CONTRACT_BYTES = 1024 * 1024
DECISION_PREFIX = "decision-"
"""Step ids ``decision-1``, ``decision-2``, ... are the stops a session records (``longrun stop``): reserved."""

_KINDS = ("exec", "checkpoint")
_EVIDENCE = ("file", "note")

Path = tuple[str | int, ...]
"""Where a value sits in the document: ``("steps", 2, "action")``."""


@dataclass(frozen=True, slots=True)
class ContractStep:
    """One bounded step: an effect made with ``longrun exec`` or work recorded with ``longrun checkpoint``."""

    step_id: str
    kind: str
    """``exec`` (an external effect, through the ledger) or ``checkpoint`` (work recorded with its evidence)."""
    action: str
    """The action name the contract allows (``[actions] allowed``)."""
    next: str
    """The one next action, in words an agent can act on."""
    produces: str
    """The artifact or change in the world the step leaves behind."""
    approval: bool = False
    command: tuple[str, ...] | None = None
    """exec: the command it runs; checkpoint: the work to do before recording it. An argv."""
    observe: str | None = None
    """exec: a shell command that says whether the effect took place (exit 0 applied, 1 absent, else unknown)."""
    timeout_s: float | None = None
    evidence: str | None = None
    """checkpoint: ``file`` (a file's digest is recorded) or ``note`` (a text)."""
    path: str | None = None
    """checkpoint with file evidence: the file, absolute."""

    def to_json(self) -> dict[str, JSONValue]:
        body: dict[str, JSONValue] = {
            "id": self.step_id,
            "kind": self.kind,
            "action": self.action,
            "next": self.next,
            "produces": self.produces,
            "approval": self.approval,
        }
        if self.command is not None:
            body["command"] = list(self.command)
        for name in ("observe", "timeout_s", "evidence", "path"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        return body


@dataclass(frozen=True, slots=True)
class ContractLimits:
    """How far the session may go; the counters survive restarts (see ``longrun.budget``)."""

    max_attempts: int = 3
    max_steps: int | None = None
    max_elapsed_s: float | None = None
    max_no_progress_s: float | None = None
    approval_ttl_s: float = 86_400.0
    lease_ttl_s: float = 10.0
    """A killed command's lease runs out after this; until then the next command waits for it."""
    timeout_s: float = 3600.0
    """The longest a command may run (``longrun exec --timeout`` or the step's ``timeout_s`` say otherwise)."""
    observe_timeout_s: float = 60.0
    retry_delay_s: float = 1.0
    """After a failed command, the earliest the step may be tried again."""

    def to_json(self) -> dict[str, JSONValue]:
        return {name: getattr(self, name) for name in _LIMIT_NAMES if getattr(self, name) is not None}


_LIMIT_NAMES = (
    "max_attempts", "max_steps", "max_elapsed_s", "max_no_progress_s", "approval_ttl_s", "lease_ttl_s", "timeout_s",
    "observe_timeout_s", "retry_delay_s",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class SessionContract:
    """A validated run contract for a checkpointed session (build it with ``load_contract``)."""

    goal: str
    allowed_actions: tuple[str, ...]
    steps: tuple[ContractStep, ...]
    workdir: str
    """Where commands run and relative paths start: absolute."""
    task_id: str | None = None
    non_goals: tuple[str, ...] = ()
    owner: str | None = None
    forbidden_actions: tuple[str, ...] = ()
    completion_evidence: tuple[str, ...] = ()
    """Step ids that must be recorded before ``done``; empty in the file means every step."""
    limits: ContractLimits = field(default_factory=ContractLimits)
    stop_when: tuple[str, ...] = ()
    """Stop rules: when the agent must stop and ask (``longrun stop``) instead of going on."""

    @property
    def required(self) -> tuple[str, ...]:
        return self.completion_evidence or tuple(step.step_id for step in self.steps)

    def step(self, step_id: str) -> ContractStep:
        for step in self.steps:
            if step.step_id == step_id:
                return step
        raise InvalidInputError(f"the run contract has no step {step_id!r} (steps: {', '.join(s.step_id for s in self.steps)})")

    def run_contract(self, task_id: str) -> RunContract:
        """The engine's ``RunContract`` for a task started from this contract."""
        return RunContract(
            task_id=task_id,
            goal=self.goal,
            non_goals=self.non_goals,
            allowed_actions=self.allowed_actions,
            forbidden_actions=self.forbidden_actions,
            completion_evidence=self.completion_evidence,
        )

    def to_json(self) -> dict[str, JSONValue]:
        task: dict[str, JSONValue] = {"goal": self.goal, "non_goals": list(self.non_goals), "workdir": self.workdir}
        if self.task_id is not None:
            task["id"] = self.task_id
        if self.owner is not None:
            task["owner"] = self.owner
        return {
            "version": CONTRACT_VERSION,
            "task": task,
            "actions": {"allowed": list(self.allowed_actions), "forbidden": list(self.forbidden_actions)},
            "completion": {"evidence": list(self.completion_evidence)},
            "steps": [step.to_json() for step in self.steps],
            "limits": self.limits.to_json(),
            "stop": {"when": list(self.stop_when)},
        }

    @property
    def digest(self) -> str:
        return digest_of(self.to_json(), what="run contract")

    @classmethod
    def from_json(cls, data: object) -> "SessionContract":
        """A contract as a task recorded it; ``CorruptStateError`` if it is not one."""

        def fail(path: Path, message: str) -> NoReturn:
            where = ".".join(str(part) for part in path) or "the document"
            raise CorruptStateError(f"recorded run contract, {where}: {message}")

        return build_contract(data, None, fail)


# -- validation, shared by the TOML file and the recorded JSON ---------------------------------

Fail = Callable[[Path, str], NoReturn]

_TOP = ("version", "task", "actions", "completion", "steps", "limits", "stop")
_TASK = ("id", "goal", "non_goals", "owner", "workdir")
_ACTIONS = ("allowed", "forbidden")
_COMPLETION = ("evidence",)
_STEP = ("id", "kind", "action", "next", "produces", "approval", "command", "observe", "timeout_s", "evidence", "path")
_STOP = ("when",)
FIELDS: dict[str, tuple[str, ...]] = {
    "": _TOP,
    "task": _TASK,
    "actions": _ACTIONS,
    "completion": _COMPLETION,
    "steps": _STEP,
    "limits": _LIMIT_NAMES,
    "stop": _STOP,
}
"""Every key the contract knows, by table (``""`` is the top level): what both templates describe."""


def _table(data: Mapping[str, Any], name: str, fail: Fail, *, required: bool) -> Mapping[str, Any]:
    value = data.get(name)
    if value is None:
        if required:
            fail((), f"the contract needs a [{name}] table")
        return {}
    if not isinstance(value, Mapping):
        fail((name,), f"{name} must be a table ([{name}])")
    _known(value, (name,), FIELDS[name], fail)
    return value


def _known(table: Mapping[str, Any], path: Path, names: Sequence[str], fail: Fail) -> None:
    for key in table:
        if key not in names:
            where = f"[{'.'.join(str(p) for p in path if isinstance(p, str))}]" if path else "the top level"
            fail((*path, key), f"unknown key {key!r} in {where} (known: {', '.join(names)})")


def _text(table: Mapping[str, Any], path: Path, fail: Fail, *, required: bool) -> str | None:
    value = table.get(_leaf(path))
    if value is None:
        if required:
            fail(path[:-1], f"{_dotted(path)} is missing: it must be a non-empty string")
        return None
    if not isinstance(value, str) or not value.strip():
        fail(path, f"{_dotted(path)} must be a non-empty string, got {value!r}")
    if "\x00" in value:
        fail(path, f"{_dotted(path)} holds a NUL character")
    return value


def _texts(table: Mapping[str, Any], path: Path, fail: Fail) -> tuple[str, ...]:
    value = table.get(_leaf(path), [])
    if not isinstance(value, list):
        fail(path, f"{_dotted(path)} must be an array of strings, got {value!r}")
    for item in value:
        if not isinstance(item, str) or not item.strip():
            fail(path, f"{_dotted(path)} must hold non-empty strings, got {item!r}")
    seen: set[str] = set()
    for item in value:
        if item in seen:
            fail(path, f"{_dotted(path)} lists {item!r} twice")
        seen.add(item)
    return tuple(value)


def _number(table: Mapping[str, Any], path: Path, fail: Fail, *, integer: bool = False) -> Any:
    value = table.get(_leaf(path))
    if value is None:
        return None
    kind = "an integer >= 1" if integer else "a number > 0"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        fail(path, f"{_dotted(path)} must be {kind}, got {value!r}")
    if (integer and value < 1) or (not integer and (not math.isfinite(value) or value <= 0)):
        fail(path, f"{_dotted(path)} must be {kind}, got {value!r}")
    return value if integer else float(value)


def _leaf(path: Path) -> str:
    name = path[-1]
    assert isinstance(name, str)
    return name


def _dotted(path: Path) -> str:
    parts: list[str] = []
    for part in path:
        if isinstance(part, int):
            parts[-1] = f"{parts[-1]}[{part + 1}]"
        else:
            parts.append(part)
    return ".".join(parts)


def _action_name(value: str, path: Path, fail: Fail) -> None:
    if value.startswith(INTERNAL_PREFIX) or value != value.strip():
        fail(path, f"action {value!r} is not a usable name (no surrounding spaces; {INTERNAL_PREFIX!r} is reserved)")


def _absolute(value: str, base_dir: str | None, path: Path, fail: Fail) -> str:
    if base_dir is None:
        if not os.path.isabs(value):
            fail(path, f"{_dotted(path)} must be an absolute path in a recorded contract")
        return os.path.normpath(value)
    return os.path.normpath(os.path.join(base_dir, os.path.expanduser(value)))


def _command(step: Mapping[str, Any], path: Path, fail: Fail) -> tuple[str, ...] | None:
    value = step.get("command")
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            fail(path, f"{_dotted(path)} must not be empty")
        return ("sh", "-c", value)
    if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value) or not value[0]:
        fail(path, f"{_dotted(path)} must be a shell command string or a non-empty array of strings (an argv)")
    if any("\x00" in item for item in value):
        fail(path, f"{_dotted(path)} holds a NUL character")
    return tuple(value)


def build_contract(data: object, base_dir: str | None, fail: Fail) -> SessionContract:
    if not isinstance(data, Mapping):
        fail((), "a run contract must be a table")
    _known(data, (), _TOP, fail)
    version = data.get("version", CONTRACT_VERSION)
    if version != CONTRACT_VERSION or isinstance(version, bool):
        fail(("version",), f"version must be {CONTRACT_VERSION} (the only contract format this longrun knows), got {version!r}")

    task = _table(data, "task", fail, required=True)
    goal = _text(task, ("task", "goal"), fail, required=True)
    assert goal is not None
    task_id = _text(task, ("task", "id"), fail, required=False)
    if task_id is not None:
        try:
            check_task_id(task_id)
        except InvalidInputError as exc:
            fail(("task", "id"), str(exc))
    owner = _text(task, ("task", "owner"), fail, required=False)
    workdir_text = _text(task, ("task", "workdir"), fail, required=False)
    if workdir_text is None:
        if base_dir is None:
            fail(("task",), "task.workdir is missing from a recorded contract")
        workdir = base_dir
    else:
        workdir = _absolute(workdir_text, base_dir, ("task", "workdir"), fail)

    actions = _table(data, "actions", fail, required=True)
    allowed = _texts(actions, ("actions", "allowed"), fail)
    if not allowed:
        fail(("actions",) if "allowed" not in actions else ("actions", "allowed"), "actions.allowed must name at least one action")
    forbidden = _texts(actions, ("actions", "forbidden"), fail)
    for name in allowed:
        _action_name(name, ("actions", "allowed"), fail)
    for name in forbidden:
        _action_name(name, ("actions", "forbidden"), fail)
        if name in allowed:
            fail(("actions", "forbidden"), f"action {name!r} is both allowed and forbidden")

    raw_steps = data.get("steps")
    if raw_steps is None:
        fail((), "the contract needs at least one step ([[steps]])")
    if not isinstance(raw_steps, list) or not raw_steps:
        fail(("steps",), "steps must be an array of tables ([[steps]]) with at least one step")
    steps: list[ContractStep] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_steps):
        steps.append(_step(raw, index, allowed, forbidden, base_dir, fail))
        if steps[-1].step_id in seen:
            fail(("steps", index, "id"), f"step id {steps[-1].step_id!r} is used twice")
        seen.add(steps[-1].step_id)

    completion = _table(data, "completion", fail, required=False)
    evidence = _texts(completion, ("completion", "evidence"), fail)
    for name in evidence:
        if name not in seen:
            fail(("completion", "evidence"), f"completion evidence names {name!r}, which is not a step id")

    limits_table = _table(data, "limits", fail, required=False)
    limits = _limits(limits_table, fail)
    stop = _table(data, "stop", fail, required=False)
    stop_when = _texts(stop, ("stop", "when"), fail)

    return SessionContract(
        goal=goal,
        allowed_actions=allowed,
        steps=tuple(steps),
        workdir=workdir,
        task_id=task_id,
        non_goals=_texts(task, ("task", "non_goals"), fail),
        owner=owner,
        forbidden_actions=forbidden,
        completion_evidence=evidence,
        limits=limits,
        stop_when=stop_when,
    )


def _step(
    raw: object, index: int, allowed: Sequence[str], forbidden: Sequence[str], base_dir: str | None, fail: Fail
) -> ContractStep:
    here: Path = ("steps", index)
    if not isinstance(raw, Mapping):
        fail(here, f"step {index + 1} must be a table")
    _known(raw, here, _STEP, fail)
    step_id = _text(raw, (*here, "id"), fail, required=True)
    assert step_id is not None
    if not STEP_ID_PATTERN.fullmatch(step_id):
        fail((*here, "id"), f"step id {step_id!r} is not valid: use 1-256 of [A-Za-z0-9._:/@+=-], starting with a letter or digit")
    if step_id.startswith(INTERNAL_PREFIX) or re.fullmatch(re.escape(DECISION_PREFIX) + r"\d+", step_id):
        fail((*here, "id"), f"step id {step_id!r} is reserved (ids starting {INTERNAL_PREFIX!r}, and {DECISION_PREFIX}N, are longrun's)")
    kind = _text(raw, (*here, "kind"), fail, required=True)
    if kind not in _KINDS:
        fail((*here, "kind"), f"step {step_id!r}: kind must be one of {', '.join(_KINDS)}, got {kind!r}")
    action = _text(raw, (*here, "action"), fail, required=True)
    assert action is not None and kind is not None
    _action_name(action, (*here, "action"), fail)
    if action in forbidden:
        fail((*here, "action"), f"step {step_id!r} uses action {action!r}, which the contract forbids")
    if action not in allowed:
        fail((*here, "action"), f"step {step_id!r} uses action {action!r}, which is not among the allowed actions {list(allowed)}")
    next_action = _text(raw, (*here, "next"), fail, required=True)
    produces = _text(raw, (*here, "produces"), fail, required=True)
    assert next_action is not None and produces is not None
    approval = raw.get("approval", False)
    if not isinstance(approval, bool):
        fail((*here, "approval"), f"step {step_id!r}: approval must be true or false, got {approval!r}")
    command = _command(raw, (*here, "command"), fail)
    observe = _text(raw, (*here, "observe"), fail, required=False)
    timeout_s = _number(raw, (*here, "timeout_s"), fail)
    evidence = _text(raw, (*here, "evidence"), fail, required=False)
    path_text = _text(raw, (*here, "path"), fail, required=False)
    if kind == "exec":
        for name, value in (("evidence", evidence), ("path", path_text)):
            if value is not None:
                fail((*here, name), f"step {step_id!r}: {name} is for checkpoint steps (an exec step's evidence is its receipt)")
    else:
        for name, value in (("observe", observe), ("timeout_s", timeout_s)):
            if value is not None:
                fail((*here, name), f"step {step_id!r}: {name} is for exec steps")
        if evidence is None:
            fail(here, f"step {step_id!r}: a checkpoint step needs evidence = \"file\" or \"note\"")
        if evidence not in _EVIDENCE:
            fail((*here, "evidence"), f"step {step_id!r}: evidence must be one of {', '.join(_EVIDENCE)}, got {evidence!r}")
        if path_text is not None and evidence != "file":
            fail((*here, "path"), f"step {step_id!r}: path goes with evidence = \"file\"")
    path = _absolute(path_text, base_dir, (*here, "path"), fail) if path_text is not None else None
    return ContractStep(
        step_id=step_id,
        kind=kind,
        action=action,
        next=next_action,
        produces=produces,
        approval=approval,
        command=command,
        observe=observe,
        timeout_s=timeout_s,
        evidence=evidence,
        path=path,
    )


def _limits(table: Mapping[str, Any], fail: Fail) -> ContractLimits:
    defaults = ContractLimits()
    values: dict[str, Any] = {}
    for name in _LIMIT_NAMES:
        integer = name in ("max_attempts", "max_steps")
        value = _number(table, ("limits", name), fail, integer=integer)
        values[name] = getattr(defaults, name) if value is None else value
    return ContractLimits(**values)
