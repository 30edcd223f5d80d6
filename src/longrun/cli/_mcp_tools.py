"""What ``longrun mcp`` offers an agent: a session's commands as MCP tools, its task as resources, the
continuation rule as a prompt.

Each tool is the same call as its CLI twin in ``_session`` (``Session.init``, ``next``, ``exec``,
``checkpoint``, ``done``, ``stop``; ``longrun_status`` is ``status_json``, as ``longrun status
--json``), so it keeps the same guarantees: one engine invocation under the task's fenced lease,
cancellation and approval read fresh, a command's intent durable before it runs and observed after a
kill instead of run again. A result's ``structuredContent`` is the CLI's ``--json`` document, with
its ``exit_code``; an error is the CLI's own error line (``longrun exec: error: ...``), as a tool
error. There is no tool to approve, answer, cancel or repair: those stay with a person, through
``longrun approve`` / ``answer`` / ``cancel`` (or the web console) into the control area; a call
for one is refused with that reason.

With ``control_root``, approvals and cancellations are read from that control area (a strict
``FileControlSource``: only the approver's account can write there) instead of from the store,
which the agent's account can write.

Not guaranteed: anything about work an agent does outside ``longrun_exec`` (a checkpoint records
what the agent says, with its evidence's digest), or that a cancelled tool call stops a command
that is running (it runs to its end or its timeout, as from the shell).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..authority import FileControlSource
from ..canonical import JSONValue
from ..contractfile import MAX_CONTRACT_BYTES, SessionContract, load_contract, parse_contract
from ..errors import ContractFileError, CorruptStateError, InvalidInputError, LongrunError, UnknownTaskError
from ..outcome import ENDED_UNFINISHED, Status
from ..protocols import Store
from ..session import NextAction, Session, SessionResult, recorded_contract
from ._arguments import MAX_REASON_CHARS, path, positive_seconds, step_id, text_argument
from ._common import CliError, ExitCode, checked_task, exit_code_for
from ._session import _result_exit, next_exit

__all__ = [
    "CONTINUE_PROMPT",
    "FORBIDDEN_TOOLS",
    "MAX_OUTPUT_BYTES",
    "ResourceError",
    "SessionTools",
    "ToolResult",
    "UnknownToolError",
    "error_line",
]

MAX_OUTPUT_BYTES = 16 * 1024
"""How much of a command's stdout and of its stderr a ``longrun_exec`` result carries (the end of each)."""

URI_PREFIX = "longrun://"
RESOURCE_KINDS = ("contract", "status", "history")
_MAX_LISTED_TASKS = 200

FORBIDDEN_TOOLS: Mapping[str, str] = {
    "longrun_approve": "an agent cannot approve its own requests: a person approves with `longrun approve STORE TASK --step STEP`",
    "longrun_answer": "an agent cannot answer its own stops: a person answers with `longrun answer STORE TASK decision-N VALUE`",
    "longrun_cancel": "an agent cannot cancel or resolve its own task: a person does, with `longrun cancel STORE TASK`",
    "longrun_repair": "an agent cannot repair its own task's lease: a person does, with `longrun repair STORE TASK --lease`",
}
"""The operator's commands, which are no tools: a call for one is refused with why and who can."""

CONTINUE_PROMPT = """\
You are working on a long task whose progress lives in a longrun store, not in your context. \
Follow the continuation rule:

1. Whenever you start, and after every step, call `longrun_next`. It says, from the store alone, \
the one safe next action. If you lost your context, this call is all you need.
2. `who` says who acts. `agent`: do exactly the step it names. Its `tool` field is the call that \
records it (`longrun_exec` for an external effect, `longrun_checkpoint` for work that is not one, \
`longrun_done` at the end); do a checkpoint's work first (`commands` shows it), then record it. \
`operator`: a person must approve, answer or resolve something (`unblock` says what); tell them \
and end your turn. `time`: wait `retry_after_s` seconds, then call `longrun_next` again. \
`nobody`: the task is finished, or it ended.
3. Every external effect (a deploy, a message, a write to someone else's system) goes through \
`longrun_exec`, which runs it exactly once. If a call was interrupted, make the same call again: \
it observes the target instead of running the command twice. Never run an effect some other way.
4. When a stop rule of the contract applies, or you are blocked or need a decision, call \
`longrun_stop` with the reason and end your turn.
5. When every step is recorded, call `longrun_done`: it checks the contract's completion evidence \
and names what is missing if it refuses.

Never approve your own steps, answer your own stops, or edit the store's files. A checkpoint \
records what you say you did: check the work before recording it.
"""


class UnknownToolError(Exception):
    """A ``tools/call`` for a tool this server does not have (a JSON-RPC error, not a tool error)."""


class ResourceError(Exception):
    """A resource that cannot be read: an unknown URI or task (a JSON-RPC error)."""


@dataclass(frozen=True, slots=True)
class ToolResult:
    """One tool call's answer: ``text`` for a reader, ``structured`` as the CLI's ``--json`` document."""

    text: str
    structured: dict[str, JSONValue]
    is_error: bool = False

    def to_json(self, *, structured: bool = True) -> dict[str, JSONValue]:
        body: dict[str, JSONValue] = {
            "content": [
                {"type": "text", "text": self.text},
                {"type": "text", "text": json.dumps(self.structured, sort_keys=True, ensure_ascii=False)},
            ],
            "isError": self.is_error,
        }
        if structured:
            body["structuredContent"] = self.structured
        return body


def error_line(command: str, exc: BaseException) -> str:
    """The CLI's error line for ``exc`` (``longrun exec: error: ...``), the same words."""
    from ._main import _error_text  # the one wording of an error, shared with `main`

    return f"longrun {command}: error: {_error_text(exc)}"


class _Output:
    """A command's output as it arrives: echoed to the server's stderr, the end of it kept for the result."""

    def __init__(self, echo: Callable[[bytes], None] | None):
        self._echo = echo
        self._kept = bytearray()
        self.truncated = False
        self._lock = threading.Lock()

    def write(self, chunk: bytes) -> None:
        with self._lock:
            self._kept += chunk
            if len(self._kept) > MAX_OUTPUT_BYTES:
                del self._kept[: len(self._kept) - MAX_OUTPUT_BYTES]
                self.truncated = True
        if self._echo is not None:
            self._echo(chunk)

    def text(self) -> str:
        with self._lock:
            return bytes(self._kept).decode("utf-8", "replace")


_OBJECT: dict[str, JSONValue] = {"type": "object"}


def _schema(properties: Mapping[str, JSONValue], required: Sequence[str] = ()) -> dict[str, JSONValue]:
    return {"type": "object", "properties": dict(properties), "required": list(required), "additionalProperties": False}


_TASK: dict[str, JSONValue] = {"type": "string", "description": "the task id"}
_STEP: dict[str, JSONValue] = {"type": "string", "description": "the step id, as the run contract names it"}


@dataclass(frozen=True, slots=True)
class _Tool:
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


_TOOLS: tuple[_Tool, ...] = (
    _Tool(
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
    _Tool(
        "longrun_next",
        "The one safe next action",
        "The continuation rule: from the store alone, exactly one safe next action for the agent (with `tool`, the call "
        "that records it), or the legal stop and what would unblock it. Call it whenever you start and after every step. "
        "Read-only. Twin of `longrun next`.",
        {},
        read_only=True,
        cli="next",
    ),
    _Tool(
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
    _Tool(
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
    _Tool(
        "longrun_done",
        "Finish the task",
        "Check the run contract's completion evidence against what was recorded: end the run done, or refuse, naming "
        "what is missing, and write nothing. Twin of `longrun done`.",
        {},
        cli="done",
    ),
    _Tool(
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
    _Tool(
        "longrun_status",
        "The task's state",
        "The task's state, lease, effects, pending approval requests and its one next action, as `longrun status "
        "--json` shows them, with `next` (the continuation rule's answer). Read-only.",
        {},
        read_only=True,
        cli="status",
    ),
)

_REASON = text_argument(MAX_REASON_CHARS, "the reason")
_NOTE = text_argument(MAX_REASON_CHARS, "the note")


def _argument(name: str, check: Callable[[str], Any], value: str) -> Any:
    """``check(value)`` with argparse's words for a bad argument (``argument STEP: ...``)."""
    try:
        return check(value)
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"argument {name}: {exc}", ExitCode.USAGE) from None


class SessionTools:
    """The tools, resources and prompt of ``longrun mcp`` over one store (see the module docstring).

    ``task`` pins the server to one task (its tools then need no ``task`` argument and refuse
    another). ``echo`` receives a command's output as it arrives (the server's stderr).
    """

    def __init__(
        self,
        store: Store,
        spec: str,
        *,
        task: str | None = None,
        control_root: str | None = None,
        echo: Callable[[bytes], None] | None = None,
    ):
        self.store = store
        self.spec = spec
        self.task = checked_task(task) if task is not None else None
        self.control: FileControlSource | None = None
        if control_root is not None:
            if not os.path.isdir(control_root):
                raise CliError(f"control root {control_root!r} is not an existing directory", ExitCode.USAGE)
            self.control = FileControlSource(control_root)  # strict: only the approver's account writes there
        self._echo = echo

    # -- tools ----------------------------------------------------------------------------------

    def tool_list(self, *, structured: bool = True) -> list[JSONValue]:
        tools: list[JSONValue] = []
        for tool in _TOOLS:
            properties = dict(tool.properties)
            required = list(tool.required)
            if self.task is None:
                properties = {"task": _TASK, **properties}
                required = ["task", *required]
            else:
                properties = {"task": {**_TASK, "description": f"the task id (this server serves {self.task} only)"}, **properties}
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

    def call(self, name: str, arguments: object) -> ToolResult:
        """Call tool ``name``; a refusal or an error comes back as a tool error with the CLI's words."""
        if name in FORBIDDEN_TOOLS:
            message = f"longrun {name.removeprefix('longrun_')}: error: refused: {FORBIDDEN_TOOLS[name]}"
            return ToolResult(message, {"error": message, "exit_code": int(ExitCode.USAGE)}, is_error=True)
        tool = next((item for item in _TOOLS if item.name == name), None)
        if tool is None:
            raise UnknownToolError(f"unknown tool {name!r}: this server has {', '.join(item.name for item in _TOOLS)}")
        try:
            args = self._checked_arguments(tool, arguments)
            task = self._task(args)
            return getattr(self, "_" + tool.cli)(task, args)  # type: ignore[no-any-return]
        except (CliError, LongrunError, OSError) as exc:
            message = error_line(tool.cli, exc)
            return ToolResult(message, {"error": message, "exit_code": int(exit_code_for(exc))}, is_error=True)

    def _checked_arguments(self, tool: _Tool, arguments: object) -> dict[str, Any]:
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

    def _task(self, args: Mapping[str, Any]) -> str:
        task = args.get("task")
        if self.task is not None:
            if task is not None and task != self.task:
                raise CliError(f"this server serves task {self.task!r} only (longrun mcp ... --task {self.task}), not {task!r}", ExitCode.USAGE)
            return self.task
        if task is None:
            raise CliError("the following arguments are required: task", ExitCode.USAGE)
        return checked_task(str(task))

    def _session(self, task: str, output: _Output | None = None) -> Session:
        sink = output.write if output is not None else self._echo
        return Session(
            self.store, task, store_spec=self.spec, stdout=sink, stderr=sink,
            approvals=self.control, cancellations=self.control,
        )  # fmt: skip

    def _answer(self, result: SessionResult, code: ExitCode, head: Sequence[str], extra: Mapping[str, JSONValue] | None = None) -> ToolResult:
        body: dict[str, JSONValue] = {**result.to_json(), "exit_code": int(code)}
        next_json = body.get("next")
        if isinstance(next_json, dict):
            next_json["tool"] = self._suggested(result.next)
        if extra:
            body.update(extra)
        lines = list(head)
        outcome = result.outcome
        if outcome is not None and code is not ExitCode.OK:
            lines.append(f"stopped: {outcome.status.value}: {outcome.next_action}")
            lines += [f"  unknown: [{item.source}] {item.detail}" for item in outcome.unknowns]
        lines += [f"note: {note}" for note in result.notes]
        lines.append(f"next ({result.next.who}): {result.next.text}")
        failed = outcome is not None and (outcome.status in _FAILED or outcome.status in ENDED_UNFINISHED)
        return ToolResult("\n".join(lines), body, is_error=failed)

    def _init(self, task: str, args: Mapping[str, Any]) -> ToolResult:
        contract: SessionContract
        source: str | None
        if "contract_path" in args:
            contract_path = _argument("contract_path", path, args["contract_path"])
            contract = load_contract(contract_path)
            source = os.path.abspath(contract_path)
        else:
            text = str(args["contract"])
            if len(text.encode("utf-8", "surrogatepass")) > MAX_CONTRACT_BYTES:
                raise ContractFileError("<contract>", None, f"the contract is larger than {MAX_CONTRACT_BYTES} bytes")
            contract = parse_contract(text, source="<contract>", base_dir=os.getcwd())
            source = None
        result = self._session(task).init(contract, source=source)
        what = "started" if result.created else "unchanged"
        return self._answer(result, _result_exit(result), [f"task {task}: {what} ({len(contract.steps)} steps; goal: {contract.goal})"])

    def _next(self, task: str, args: Mapping[str, Any]) -> ToolResult:
        action = self._session(task).next()
        code = next_exit(action)
        body: dict[str, JSONValue] = {**action.to_json(), "exit_code": int(code), "tool": self._suggested(action)}
        return ToolResult(_render_next(action), body)

    def _exec(self, task: str, args: Mapping[str, Any]) -> ToolResult:
        step = _argument("STEP", step_id, args["step"])
        observe = _argument("observe", _REASON, args["observe"]) if "observe" in args else None
        timeout = _argument("timeout_s", positive_seconds, repr(float(args["timeout_s"]))) if "timeout_s" in args else None
        argv = list(args.get("argv") or ()) or None
        output = _Output(self._echo)
        result = self._session(task, output).exec(step, argv, observe=observe, timeout_s=timeout, approval=bool(args.get("approval", False)))
        record = result.record
        head: list[str] = []
        if record is not None and result.step is not None:
            head.append(f"step {result.step}: {record.state.value}" + (f" (attempt {record.attempts})" if record.attempts else ""))
            if record.evidence:
                head.append(f"  observed: {record.evidence}")
            if record.last_error and record.state.value != "verified":
                head.append(f"  last error: {record.last_error}")
        captured = output.text()
        if captured:
            head.append("output" + (" (its end)" if output.truncated else "") + ":\n" + captured.rstrip("\n"))
        extra: dict[str, JSONValue] = {"output": captured, "output_truncated": output.truncated}
        return self._answer(result, _result_exit(result), head, extra)

    def _checkpoint(self, task: str, args: Mapping[str, Any]) -> ToolResult:
        step = _argument("STEP", step_id, args["step"])
        evidence = _argument("evidence_file", path, args["evidence_file"]) if "evidence_file" in args else None
        note = _argument("note", _NOTE, args["note"]) if "note" in args else None
        result = self._session(task).checkpoint(step, evidence_file=evidence, note=note)
        record = result.record
        head = [f"step {result.step}: {record.state.value}"] if record is not None and result.step is not None else []
        return self._answer(result, _result_exit(result), head)

    def _done(self, task: str, args: Mapping[str, Any]) -> ToolResult:
        result = self._session(task).done()
        if result.missing:
            line = f"longrun done: not done: not recorded yet: {', '.join(result.missing)} (completion evidence, or steps begun)"
            answer = self._answer(result, ExitCode.NOT_AS_ASKED, [f"task {task}: not done: not recorded yet: {', '.join(result.missing)}; nothing was written"])
            return ToolResult(line + "\n" + answer.text, answer.structured, is_error=True)
        status = result.outcome.status.value if result.outcome is not None else "done"
        return self._answer(result, _result_exit(result, expected=Status.DONE), [f"task {task}: {status}"])

    def _stop(self, task: str, args: Mapping[str, Any]) -> ToolResult:
        reason = _argument("reason", _REASON, args["reason"])
        result = self._session(task).stop(reason)
        code = _result_exit(result, expected=Status.AWAITING_INPUT)
        if result.outcome is not None and result.outcome.status is Status.RUNNING:
            code = ExitCode.OK
        head = [f"task {task}: stop recorded as {result.step}: a person answers it with `longrun answer`"] if result.step else []
        return self._answer(result, code, head)

    def _status(self, task: str, args: Mapping[str, Any]) -> ToolResult:
        body = self.status_document(task)
        next_json = body.get("next")
        text = f"task {task}: {body.get('status')} (revision {body.get('revision')}); next: {body.get('next_action')}"
        if isinstance(next_json, dict):
            text += f"\nnext ({next_json.get('who')}): {next_json.get('next_action')}"
        return ToolResult(text, {**body, "exit_code": int(ExitCode.OK)})

    def _suggested(self, action: NextAction) -> dict[str, JSONValue] | None:
        """The tool call that does what ``action`` says the agent records next, or None."""
        if action.who != "agent":
            return None
        for command in action.commands:
            words = list(command)
            if len(words) < 4 or words[0] != "longrun" or words[1] not in ("exec", "checkpoint", "done"):
                continue
            arguments: dict[str, JSONValue] = {"task": action.task_id}
            if words[1] == "done":
                return {"name": "longrun_done", "arguments": arguments}
            if len(words) < 5:
                return None
            arguments["step"] = words[4]
            rest = words[5:]
            if words[1] == "exec":
                if "--" in rest:
                    arguments["argv"] = list(rest[rest.index("--") + 1 :])
                return {"name": "longrun_exec", "arguments": arguments}
            if rest[:1] == ["--evidence"] and len(rest) == 2:
                arguments["evidence_file"] = rest[1]
            elif rest[:1] == ["--note"] and len(rest) == 2:
                arguments["note"] = rest[1]
            return {"name": "longrun_checkpoint", "arguments": arguments}
        return None

    # -- resources ------------------------------------------------------------------------------

    def status_document(self, task: str) -> dict[str, JSONValue]:
        """``longrun status --json``'s document, with ``next``: the continuation rule's answer (None if not a session)."""
        from ._inspect import status_json

        loaded = self.store.load(task)
        lease = self.store.read_lease(task)
        body = json.loads(json.dumps(status_json(task, loaded, lease, time.time()), default=str))
        assert isinstance(body, dict)
        body["next"] = None
        if loaded.state is not None and recorded_contract(loaded.state) is not None:
            action = self._session(task).next()
            body["next"] = {**action.to_json(), "tool": self._suggested(action)}
        return body

    def fingerprint(self, task: str) -> str:
        """What a subscriber is told about when it changes: the revision, the status and the next action."""
        try:
            state = self.store.load(task).state
            if state is None:
                return "new"
            contract = recorded_contract(state)
            action = self._session(task).next().to_json() if contract is not None else None
            return json.dumps([state.revision, state.status.value, action], sort_keys=True)
        except UnknownTaskError:
            return "unknown"
        except (LongrunError, OSError) as exc:
            return f"unreadable: {exc}"

    def tasks(self) -> list[str]:
        """The session tasks the resources cover: the pinned task, or the store's sessions (at most 200)."""
        if self.task is not None:
            return [self.task]
        found = []
        for task in sorted(self.store.list_tasks()):
            try:
                state = self.store.load(task).state
            except (LongrunError, OSError):
                continue
            if state is not None and recorded_contract(state) is not None:
                found.append(task)
            if len(found) >= _MAX_LISTED_TASKS:
                break
        return found

    def resource_list(self) -> list[JSONValue]:
        resources: list[JSONValue] = []
        for task in self.tasks():
            for kind in RESOURCE_KINDS:
                resources.append(
                    {"uri": f"{URI_PREFIX}{task}/{kind}", "name": f"{task} {kind}", "title": _RESOURCE_TITLES[kind].format(task=task),
                     "description": _RESOURCE_DESCRIPTIONS[kind], "mimeType": "application/json"}
                )  # fmt: skip
        return resources

    @staticmethod
    def resource_templates() -> list[JSONValue]:
        return [
            {"uriTemplate": f"{URI_PREFIX}{{task}}/{kind}", "name": kind, "title": _RESOURCE_TITLES[kind].format(task="a task"),
             "description": _RESOURCE_DESCRIPTIONS[kind], "mimeType": "application/json"}
            for kind in RESOURCE_KINDS
        ]  # fmt: skip

    def parse_uri(self, uri: object) -> tuple[str, str]:
        """``longrun://TASK/KIND`` as (task, kind); else ``ResourceError``."""
        match = re.fullmatch(r"longrun://([^/]+)/([a-z]+)", uri) if isinstance(uri, str) else None
        if match is None or match.group(2) not in RESOURCE_KINDS:
            raise ResourceError(f"not a longrun resource: {str(uri)[:200]!r} (longrun://TASK/contract, /status or /history)")
        try:
            task = checked_task(match.group(1))
        except InvalidInputError as exc:
            raise ResourceError(str(exc)) from None
        if self.task is not None and task != self.task:
            raise ResourceError(f"this server serves task {self.task!r} only, not {task!r}")
        return task, match.group(2)

    def read_resource(self, uri: str) -> dict[str, JSONValue]:
        task, kind = self.parse_uri(uri)
        try:
            if kind == "status":
                value: JSONValue = self.status_document(task)
            elif kind == "history":
                from ._history import timeline

                value = json.loads(json.dumps(timeline(self.store, task, time.time())[1], default=str))
            else:
                state = self.store.load(task).state
                contract = recorded_contract(state) if state is not None else None
                if state is None or contract is None:
                    raise ResourceError(f"task {task!r} is not a checkpointed session (it records no run contract)")
                value = {"task_id": task, "plan_digest": state.plan_digest, "contract": contract.to_json()}
        except UnknownTaskError:
            raise ResourceError(f"no task {task!r} in the store") from None
        except CorruptStateError as exc:
            raise ResourceError(error_line(kind, exc)) from None
        text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
        return {"uri": uri, "mimeType": "application/json", "text": text}

    # -- the prompt -----------------------------------------------------------------------------

    @staticmethod
    def prompt_list() -> list[JSONValue]:
        return [
            {
                "name": "longrun_continue",
                "title": "Continue a durable task",
                "description": "The continuation rule: how to work on a longrun task through these tools, and what never to do.",
                "arguments": [{"name": "task", "description": "the task id, to name it in the instructions", "required": False}],
            }
        ]

    def get_prompt(self, name: object, arguments: object) -> dict[str, JSONValue]:
        if name != "longrun_continue":
            raise ResourceError(f"unknown prompt {str(name)[:100]!r}: this server has longrun_continue")
        task = arguments.get("task") if isinstance(arguments, dict) else None
        task = task if isinstance(task, str) and task else self.task
        text = CONTINUE_PROMPT
        if task is not None:
            text = f"Your task is {shlex.quote(task)}: pass it as `task` to every longrun tool.\n\n" + text
        return {
            "description": "The continuation rule of a longrun task",
            "messages": [{"role": "user", "content": {"type": "text", "text": text}}],
        }


_FAILED = frozenset({Status.UNSAFE_TO_CONTINUE, Status.PLAN_MISMATCH, Status.STATE_UNRECOVERABLE, Status.LEASE_LOST})
"""Stops a tool call reports as a tool error: the call could not do what was asked, and only a person can
resolve it (the run-ended statuses count too)."""

_RESOURCE_TITLES = {"contract": "Run contract of {task}", "status": "Status of {task}", "history": "History of {task}"}
_RESOURCE_DESCRIPTIONS = {
    "contract": "the run contract the task recorded with its first revision, and its plan digest",
    "status": "the task's state, lease, effects and pending approvals (as `longrun status --json`), and `next`, the one safe next action",
    "history": "the task's timeline: commits, effect moves, approvals, control records read (as `longrun history --json`)",
}


def _render_next(action: NextAction) -> str:
    lines = [f"next ({action.who}): {action.text}"]
    if action.commands:
        where = f" (in {action.cwd})" if action.cwd else ""
        lines.append(f"  commands{where}:")
        lines += [f"    {shlex.join(command)}" for command in action.commands]
    if action.unblock:
        lines.append(f"  unblock: {action.unblock}")
    if action.retry_after_s is not None:
        lines.append(f"  ask again in {action.retry_after_s:g}s")
    lines += [f"  note: {note}" for note in action.notes]
    return "\n".join(lines)
