"""What ``longrun mcp`` offers an agent as tools: a session's commands, each the call its CLI twin makes
(the task's resources and the continuation rule as a prompt are in ``_mcp_resources``).

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
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..authority import FileControlSource
from ..canonical import JSONValue
from ..contractfile import MAX_CONTRACT_BYTES, SessionContract, load_contract, parse_contract
from ..errors import ContractFileError, LongrunError, UnknownTaskError
from ..outcome import ENDED_UNFINISHED, Status
from ..protocols import Store
from ..session import NextAction, Session, SessionResult, recorded_contract
from ._arguments import MAX_REASON_CHARS, path, positive_seconds, step_id, text_argument
from ._common import CliError, ExitCode, checked_task, error_text, exit_code_for
from ._mcp_catalog import FORBIDDEN_TOOLS, TOOLS, checked_arguments, tool_entries
from ._session import next_exit, render_next, result_exit

__all__ = [
    "MAX_OUTPUT_BYTES",
    "SessionTools",
    "ToolResult",
    "UnknownToolError",
    "error_line",
]

MAX_OUTPUT_BYTES = 16 * 1024
"""How much of a command's output (stdout and stderr, as they came) a ``longrun_exec`` result carries: its end."""

class UnknownToolError(Exception):
    """A ``tools/call`` for a tool this server does not have (a JSON-RPC error, not a tool error)."""


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
    return f"longrun {command}: error: {error_text(exc)}"


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


_REASON = text_argument(MAX_REASON_CHARS, "the reason")
_NOTE = text_argument(MAX_REASON_CHARS, "the note")


def _argument(name: str, check: Callable[[str], Any], value: str) -> Any:
    """``check(value)`` with argparse's words for a bad argument (``argument STEP: ...``)."""
    try:
        return check(value)
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"argument {name}: {exc}", ExitCode.USAGE) from None


class SessionTools:
    """The tools of ``longrun mcp`` over one store, and what its resources read (see the module docstring).

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
        return tool_entries(self.task, structured=structured)

    def call(self, name: str, arguments: object) -> ToolResult:
        """Call tool ``name``; a refusal or an error comes back as a tool error with the CLI's words."""
        if name in FORBIDDEN_TOOLS:
            message = f"longrun {name.removeprefix('longrun_')}: error: refused: {FORBIDDEN_TOOLS[name]}"
            return ToolResult(message, {"error": message, "exit_code": int(ExitCode.USAGE)}, is_error=True)
        tool = next((item for item in TOOLS if item.name == name), None)
        if tool is None:
            raise UnknownToolError(f"unknown tool {name!r}: this server has {', '.join(item.name for item in TOOLS)}")
        try:
            args = checked_arguments(tool, arguments)
            task = self._task(args)
            return getattr(self, "_" + tool.cli)(task, args)  # type: ignore[no-any-return]
        except (CliError, LongrunError, OSError) as exc:
            message = error_line(tool.cli, exc)
            return ToolResult(message, {"error": message, "exit_code": int(exit_code_for(exc))}, is_error=True)

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
        return self._answer(result, result_exit(result), [f"task {task}: {what} ({len(contract.steps)} steps; goal: {contract.goal})"])

    def _next(self, task: str, args: Mapping[str, Any]) -> ToolResult:
        action = self._session(task).next()
        code = next_exit(action)
        body: dict[str, JSONValue] = {**action.to_json(), "exit_code": int(code), "tool": self._suggested(action)}
        return ToolResult("\n".join(render_next(action)), body)

    def _exec(self, task: str, args: Mapping[str, Any]) -> ToolResult:
        step = _argument("STEP", step_id, args["step"])
        observe = _argument("observe", _REASON, args["observe"]) if "observe" in args else None
        timeout = _argument("timeout_s", positive_seconds, _number_text(args["timeout_s"])) if "timeout_s" in args else None
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
        return self._answer(result, result_exit(result), head, extra)

    def _checkpoint(self, task: str, args: Mapping[str, Any]) -> ToolResult:
        step = _argument("STEP", step_id, args["step"])
        evidence = _argument("evidence_file", path, args["evidence_file"]) if "evidence_file" in args else None
        note = _argument("note", _NOTE, args["note"]) if "note" in args else None
        result = self._session(task).checkpoint(step, evidence_file=evidence, note=note)
        record = result.record
        head = [f"step {result.step}: {record.state.value}"] if record is not None and result.step is not None else []
        return self._answer(result, result_exit(result), head)

    def _done(self, task: str, args: Mapping[str, Any]) -> ToolResult:
        result = self._session(task).done()
        if result.missing:
            line = f"longrun done: not done: not recorded yet: {', '.join(result.missing)} (completion evidence, or steps begun)"
            answer = self._answer(result, ExitCode.NOT_AS_ASKED, [f"task {task}: not done: not recorded yet: {', '.join(result.missing)}; nothing was written"])
            return ToolResult(line + "\n" + answer.text, answer.structured, is_error=True)
        status = result.outcome.status.value if result.outcome is not None else "done"
        return self._answer(result, result_exit(result, expected=Status.DONE), [f"task {task}: {status}"])

    def _stop(self, task: str, args: Mapping[str, Any]) -> ToolResult:
        reason = _argument("reason", _REASON, args["reason"])
        result = self._session(task).stop(reason)
        code = result_exit(result, expected=Status.AWAITING_INPUT)
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
        """The tool call that does what ``action`` says the agent records next, or None.

        Where the contract leaves an argument to the agent (an exec step's command, a checkpoint's
        evidence file), ``missing`` names it: the call is refused without it.
        """
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
        if action.step is not None and action.kind in ("exec", "checkpoint"):
            missing = "argv" if action.kind == "exec" else "evidence_file"
            return {"name": f"longrun_{action.kind}", "arguments": {"task": action.task_id, "step": action.step}, "missing": [missing]}
        return None

    # -- what the resources read --------------------------------------------------------------

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

_FAILED = frozenset({Status.UNSAFE_TO_CONTINUE, Status.PLAN_MISMATCH, Status.STATE_UNRECOVERABLE, Status.LEASE_LOST})
"""Stops a tool call reports as a tool error: the call could not do what was asked, and only a person can
resolve it (the run-ended statuses count too)."""

def _number_text(value: float) -> str:
    """A JSON number as the CLI would have read it; an integer too large for a float stays as it is."""
    try:
        return repr(float(value))
    except OverflowError:
        return str(value)


