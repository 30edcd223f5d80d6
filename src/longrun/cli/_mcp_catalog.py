"""The tools of ``longrun mcp`` as a host sees them: names, words, input schemas, and the check of a call's
arguments against them (in argparse's words, as the CLI says them).

There is no tool for what only a person may do (approve, answer, cancel, repair): ``FORBIDDEN_TOOLS``
names them, with the reason a call for one is refused and the command a person runs instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..canonical import JSONValue
from ._common import CliError, ExitCode

__all__ = ["FORBIDDEN_TOOLS", "TOOLS", "Tool", "checked_arguments", "tool_entries"]

FORBIDDEN_TOOLS: Mapping[str, str] = {
    "longrun_approve": "an agent cannot approve its own requests: a person approves with `longrun approve STORE TASK --step STEP`",
    "longrun_answer": "an agent cannot answer its own stops: a person answers with `longrun answer STORE TASK decision-N VALUE`",
    "longrun_cancel": "an agent cannot cancel or resolve its own task: a person does, with `longrun cancel STORE TASK`",
    "longrun_repair": "an agent cannot repair its own task's lease: a person does, with `longrun repair STORE TASK --lease`",
}
"""The operator's commands, which are no tools: a call for one is refused with why and who can."""

_OBJECT: dict[str, JSONValue] = {"type": "object"}


def _schema(properties: Mapping[str, JSONValue], required: Sequence[str] = ()) -> dict[str, JSONValue]:
    return {"type": "object", "properties": dict(properties), "required": list(required), "additionalProperties": False}


_TASK: dict[str, JSONValue] = {"type": "string", "description": "the task id"}
_STEP: dict[str, JSONValue] = {"type": "string", "description": "the step id, as the run contract names it"}


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool: its name, its words for a host, its arguments' schema, and the CLI command it is the twin of."""

    name: str
    title: str
    description: str
    properties: Mapping[str, JSONValue]
    required: tuple[str, ...] = ()
    read_only: bool = False
    idempotent: bool = True
    open_world: bool = False
    cli: str = ""
    one_of: tuple[tuple[str, ...], ...] = field(default=())


TOOLS: tuple[Tool, ...] = (
    Tool(
        "longrun_init",
        "Start a task from a run contract",
        "Validate a run contract (TOML, as in templates/run-contract.toml), given as text or as a path on the server's "
        "machine, and start the task from it: the contract is recorded with the task's first revision and pinned by its "
        "plan digest. The same contract again changes nothing; another is refused. A bad contract is refused with the "
        "line that holds the problem, and nothing is created. Twin of `longrun init`.",
        {
            "contract": {"type": "string", "description": "the run contract as TOML text (relative paths start at the server's working directory)"},
            "contract_path": {"type": "string", "description": "or: the path of the run-contract file"},
        },
        one_of=(("contract", "contract_path"),),
        cli="init",
    ),
    Tool(
        "longrun_next",
        "The one safe next action",
        "The continuation rule: from the store alone, exactly one safe next action for the agent (with `tool`, the call "
        "that records it), or the legal stop and what would unblock it. Call it whenever you start and after every step. "
        "Read-only. Twin of `longrun next`.",
        {},
        read_only=True,
        cli="next",
    ),
    Tool(
        "longrun_exec",
        "Run a step's command exactly once",
        "Run an exec step's command through the effect ledger: the intent is durable before the command starts, the "
        "step's action must be allowed by the contract, cancellation and approval are read fresh, the lease is held. "
        "Called again after an interruption, it observes (the observe command: exit 0 applied, 1 absent) instead of "
        "running the command twice. The result carries the end of the command's output. Twin of `longrun exec`.",
        {
            "step": _STEP,
            "argv": {
                "type": "array", "items": {"type": "string"},
                "description": "the command and its arguments, when the run contract does not give the step's command",
            },  # fmt: skip
            "observe": {"type": "string", "description": "a shell command: exit 0 if the effect took place, 1 if not"},
            "timeout_s": {"type": "number", "exclusiveMinimum": 0, "description": "kill the command after this long (its outcome is then observed)"},
            "approval": {"type": "boolean", "description": "gate the command on a person's approval (also if the contract says so)"},
        },
        ("step",),
        idempotent=False,
        open_world=True,
        cli="exec",
    ),
    Tool(
        "longrun_checkpoint",
        "Record a step that is not an external effect",
        "Record a checkpoint step (a file written, a test run) with its evidence: `evidence_file` records a file's "
        "SHA-256, `note` a note saying what was done and how you know. Do the step's work first. A checkpoint is "
        "recorded once. Twin of `longrun checkpoint`.",
        {
            "step": _STEP,
            "evidence_file": {"type": "string", "description": "the file the step produced (a path on the server's machine)"},
            "note": {"type": "string", "description": "what was done and how you know"},
        },
        ("step",),
        one_of=(("evidence_file", "note"),),
        cli="checkpoint",
    ),
    Tool(
        "longrun_done",
        "Finish the task",
        "Check the run contract's completion evidence against what was recorded: end the run done, or refuse, naming "
        "what is missing, and write nothing. Twin of `longrun done`.",
        {},
        cli="done",
    ),
    Tool(
        "longrun_stop",
        "Record a legal stop for a person",
        "Record a stop: a question for a person (step decision-N). Until a person answers it (`longrun answer`), every "
        "call stops awaiting-input. Use it when a stop rule applies, or when you are blocked or need a decision. Twin "
        "of `longrun stop`.",
        {"reason": {"type": "string", "description": "why: what is blocked or must be decided"}},
        ("reason",),
        idempotent=False,
        cli="stop",
    ),
    Tool(
        "longrun_status",
        "The task's state",
        "The task's state, lease, effects, pending approval requests and its one next action, as `longrun status "
        "--json` shows them, with `next` (the continuation rule's answer). Read-only.",
        {},
        read_only=True,
        cli="status",
    ),
)

def tool_entries(task: str | None, *, structured: bool = True) -> list[JSONValue]:
    """``tools/list``'s entries; ``task`` is the task a server is pinned to (then ``task`` is optional)."""
    tools: list[JSONValue] = []
    for tool in TOOLS:
        properties = dict(tool.properties)
        required = list(tool.required)
        if task is None:
            properties = {"task": _TASK, **properties}
            required = ["task", *required]
        else:
            properties = {"task": {**_TASK, "description": f"the task id (this server serves {task} only)"}, **properties}
        entry: dict[str, JSONValue] = {
            "name": tool.name,
            "title": tool.title,
            "description": tool.description,
            "inputSchema": _schema(properties, required),
            "annotations": {
                "title": tool.title,
                "readOnlyHint": tool.read_only,
                "destructiveHint": False,
                "idempotentHint": tool.idempotent,
                "openWorldHint": tool.open_world,
            },
        }
        if structured:
            entry["outputSchema"] = _OBJECT
        tools.append(entry)
    return tools


def checked_arguments(tool: Tool, arguments: object) -> dict[str, Any]:
    """``arguments`` as ``tool``'s schema wants them (nulls dropped); else ``CliError`` in argparse's words."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise CliError("the arguments must be a JSON object", ExitCode.USAGE)
    known = {"task", *tool.properties}
    unknown = sorted(str(key) for key in arguments if key not in known)
    if unknown:
        raise CliError(f"unrecognized arguments: {', '.join(unknown)} (this tool takes {', '.join(sorted(known))})", ExitCode.USAGE)
    for key, value in arguments.items():
        expected = ({"task": _TASK} | dict(tool.properties))[key]
        assert isinstance(expected, dict)
        kind = expected.get("type")
        if value is None:
            continue
        fits = {
            "string": isinstance(value, str),
            "boolean": isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "array": isinstance(value, list) and all(isinstance(item, str) for item in value),
        }[str(kind)]
        if not fits:
            what = {"string": "text", "boolean": "true or false", "number": "a number", "array": "an array of text"}[str(kind)]
            raise CliError(f"argument {key}: must be {what}", ExitCode.USAGE)
    given = {key for key, value in arguments.items() if value is not None}
    missing = [key for key in tool.required if key not in given]
    if missing:
        raise CliError(f"the following arguments are required: {', '.join(missing)}", ExitCode.USAGE)
    for group in tool.one_of:
        present = [key for key in group if key in given]
        if len(present) != 1:
            raise CliError(f"give exactly one of: {', '.join(group)}", ExitCode.USAGE)
    return {key: value for key, value in arguments.items() if value is not None}
