"""The checkpointed session's commands (Level A): ``init``, ``next``, ``exec``, ``checkpoint``, ``done``, ``stop``.

They drive ``longrun.session.Session`` for an agent that has only a terminal. ``next`` is
read-only; the others take the task's lease for one engine invocation each. ``exec`` passes the
command's output through as it arrives (its stdout to stdout, or to stderr under ``--json``, so that
stdout holds only the JSON document).

Exit codes:

====  =========================================================================================
code  meaning
====  =========================================================================================
0     ``next``: there is an action for the agent (``who`` is ``agent``), or the task is done;
      ``exec``, ``checkpoint``: the step is recorded (now or before); ``init``: the task is
      started (or already was, with this contract); ``done``: the run is done; ``stop``: the stop
      is recorded
1     not now: ``next`` says to wait or that a person must act (approve, answer, resolve);
      ``exec`` / ``checkpoint`` stopped short of recording the step (awaiting approval or a
      decision, a failed command to retry later, already-running, unsafe-to-continue);
      ``done`` refused because completion evidence is missing (it names it)
2     usage or bad input: a bad run contract (with its line), an unknown task or step, a step
      taken out of order or with another command than it was recorded with
3     storage error or damaged state
4     the run ended without finishing (cancelled, limits-exhausted, deadline-exceeded, blocked)
====  =========================================================================================
"""

from __future__ import annotations

import os
import shlex
from typing import Sequence, TextIO

from ..outcome import ENDED_UNFINISHED, Status
from ..protocols import Store
from ..session import NextAction, Session, SessionResult
from ..shell import OutputSink
from ._common import CliError, ExitCode, checked_task, close_store, write_json

__all__ = ["cmd_checkpoint", "cmd_done", "cmd_exec", "cmd_init", "cmd_next", "cmd_stop", "create_store", "next_exit", "result_exit"]


def next_exit(action: NextAction) -> ExitCode:
    """``next``'s exit code: 0 for the agent (or done), 1 to wait or for a person, 4 ended."""
    if action.who == "agent" or action.kind == "finished":
        return ExitCode.OK
    if action.kind == "ended":
        return ExitCode.ENDED
    return ExitCode.NOT_AS_ASKED


def _sink(stream: TextIO) -> OutputSink:
    buffer = getattr(stream, "buffer", None)

    def write(chunk: bytes) -> None:
        if buffer is not None:
            stream.flush()
            buffer.write(chunk)
            buffer.flush()
        else:
            stream.write(chunk.decode("utf-8", "replace"))
            stream.flush()

    return write


def _session(store: Store, spec: str, task_id: str, out: TextIO, err: TextIO, as_json: bool) -> Session:
    return Session(store, checked_task(task_id), store_spec=spec, stdout=_sink(err if as_json else out), stderr=_sink(err))


def render_next(action: NextAction) -> list[str]:
    """The lines that show a session's next action (the CLI's text output, and the MCP tools' text)."""
    lines = [f"next ({action.who}): {action.text}"]
    if action.commands:
        where = f" (in {action.cwd})" if action.cwd else ""
        lines.append(f"  run{where}:")
        lines += [f"    {shlex.join(command)}" for command in action.commands]
    if action.unblock:
        lines.append(f"  unblock: {action.unblock}")
    if action.retry_after_s is not None:
        lines.append(f"  ask again in {action.retry_after_s:g}s")
    lines += [f"  note: {note}" for note in action.notes]
    return lines


def _render_next_full(action: NextAction) -> str:
    done = len(action.recorded)
    total = done + len(action.remaining)
    lines = [f"task {action.task_id}: {action.status} ({done} of {total} steps recorded)", f"  goal: {action.goal}"]
    lines += render_next(action)
    for item in action.decisions:
        answer = f"answered {item.get('answer')!r}" if item.get("answered") else "not answered yet"
        lines.append(f"  decision {item.get('step')}: {item.get('question')!r}: {answer}")
    if action.stop_when and action.who == "agent":
        lines.append("  stop (longrun stop ... --reason TEXT) instead if: " + "; ".join(action.stop_when))
    return "\n".join(lines) + "\n"


def result_exit(result: SessionResult, *, expected: Status = Status.RUNNING) -> ExitCode:
    """A command's exit code: 0 if its outcome is ``expected`` (or done, or it ran nothing), 4 ended, else 1."""
    outcome = result.outcome
    if outcome is None or outcome.status in (expected, Status.DONE):
        return ExitCode.OK
    if outcome.status in ENDED_UNFINISHED:
        return ExitCode.ENDED
    return ExitCode.NOT_AS_ASKED


def _emit(result: SessionResult, code: ExitCode, as_json: bool, out: TextIO, head: list[str]) -> int:
    if as_json:
        write_json(out, {**result.to_json(), "exit_code": int(code)})
        return code
    lines = list(head)
    outcome = result.outcome
    if outcome is not None and code is not ExitCode.OK:
        lines.append(f"  stopped: {outcome.status.value}: {outcome.next_action}")
        lines += [f"    unknown: [{item.source}] {item.detail}" for item in outcome.unknowns]
    lines += [f"  note: {note}" for note in result.notes]
    lines += render_next(result.next)
    out.write("\n".join(lines) + "\n")
    return code


def _step_line(result: SessionResult) -> list[str]:
    record = result.record
    if record is None or result.step is None:
        return []
    line = f"step {result.step}: {record.state.value}" + (f" (attempt {record.attempts})" if record.attempts else "")
    if record.receipt:
        line += f"; receipt: {record.receipt}"
    lines = [line]
    if record.evidence:
        lines.append(f"  observed: {record.evidence}")
    if record.last_error and record.state.value != "verified":
        lines.append(f"  last error: {record.last_error}")
    return lines


def create_store(spec: str) -> None:
    """``init --create-store``: make an empty store where ``spec`` names one that does not exist yet."""
    if spec.startswith(("sqlite:", "postgresql://", "postgres://")):
        from ..stores import open_store as open_spec

        store = open_spec(spec, create=True)
        try:
            store.list_tasks()  # the SQL stores create their tables on first use
        finally:
            close_store(store)
        return
    if os.path.exists(spec) and not os.path.isdir(spec):
        raise CliError(f"{spec!r} exists and is not a directory", ExitCode.USAGE)
    from ..stores import JsonFileStore

    JsonFileStore(spec, create=True).create_root()  # the directory, with the store marker


def cmd_init(store: Store, spec: str, task_id: str, contract_path: str, as_json: bool, out: TextIO, err: TextIO) -> int:
    from ..contractfile import load_contract

    contract = load_contract(contract_path)
    result = _session(store, spec, task_id, out, err, as_json).init(contract, source=os.path.abspath(contract_path))
    code = result_exit(result)
    what = "started" if result.created else "unchanged"
    head = [f"task {task_id}: {what} from {contract_path} ({len(contract.steps)} steps; goal: {contract.goal})"]
    return _emit(result, code, as_json, out, head)


def cmd_next(store: Store, spec: str, task_id: str, as_json: bool, out: TextIO, err: TextIO) -> int:
    action = _session(store, spec, task_id, out, err, as_json).next()
    code = next_exit(action)
    if as_json:
        write_json(out, {**action.to_json(), "exit_code": int(code)})
    else:
        out.write(_render_next_full(action))
    return code


def cmd_exec(
    store: Store,
    spec: str,
    task_id: str,
    step_id: str,
    command: Sequence[str],
    *,
    observe: str | None,
    timeout_s: float | None,
    approval: bool,
    as_json: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    session = _session(store, spec, task_id, out, err, as_json)
    result = session.exec(step_id, list(command) or None, observe=observe, timeout_s=timeout_s, approval=approval)
    return _emit(result, result_exit(result), as_json, out, _step_line(result))


def cmd_checkpoint(
    store: Store,
    spec: str,
    task_id: str,
    step_id: str,
    *,
    evidence: str | None,
    note: str | None,
    as_json: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    result = _session(store, spec, task_id, out, err, as_json).checkpoint(step_id, evidence_file=evidence, note=note)
    return _emit(result, result_exit(result), as_json, out, _step_line(result))


def cmd_done(store: Store, spec: str, task_id: str, as_json: bool, out: TextIO, err: TextIO) -> int:
    result = _session(store, spec, task_id, out, err, as_json).done()
    if result.missing:
        code = ExitCode.NOT_AS_ASKED
        head = [f"task {task_id}: not done: not recorded yet: {', '.join(result.missing)}; nothing was written"]
    else:
        code = result_exit(result, expected=Status.DONE)
        status = result.outcome.status.value if result.outcome is not None else "done"
        head = [f"task {task_id}: {status}"]
    if result.missing and not as_json:
        err.write(f"longrun done: not done: not recorded yet: {', '.join(result.missing)} (completion evidence, or steps begun)\n")
    return _emit(result, code, as_json, out, head)


def cmd_stop(store: Store, spec: str, task_id: str, reason: str, as_json: bool, out: TextIO, err: TextIO) -> int:
    result = _session(store, spec, task_id, out, err, as_json).stop(reason)
    code = result_exit(result, expected=Status.AWAITING_INPUT)
    if result.outcome is not None and result.outcome.status is Status.RUNNING:
        code = ExitCode.OK
    head = [f"task {task_id}: stop recorded as {result.step}: a person answers it with `longrun answer`"] if result.step else []
    return _emit(result, code, as_json, out, head)
