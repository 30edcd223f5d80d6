"""What ran: a durable task's function, recorded arguments, result, last failure, parent and children, for people.

``what_ran`` reads them from the task's state (its function record, its child records and
``RunState.last_failure``) as one JSON object, which ``status --json``, ``ls --json`` and the console
show as it is; ``what_ran_lines`` renders it as ``status``, ``ls --long`` and the console print it.
The arguments and the result are printed as canonical JSON cut at ``MAX_SHOWN_CHARS`` with the cut
said (``--json`` has them whole). A declared plan or a session has no function record: their
``function`` is None, and only the last failure (if any) is shown.

Also here: ``failure_lines`` (the last failure, with its traceback for ``status``), ``last_run_failed``
(what ``verify`` asks) and ``queue_position`` (a ``queued`` task's place in the fleet queue, read
only when the queue's tables exist, since a read never creates them).
"""

from __future__ import annotations

import fnmatch
import json
from typing import Sequence

from ..canonical import JSONValue
from ..contract import INTERNAL_PREFIX
from ..envelope import RunState
from ..errors import LongrunError
from ..failures import RunFailure
from ..ledger import EffectState
from ..outcome import Status
from ..protocols import Store
from ._common import format_time, relative
from ._payload import safe_text

__all__ = [
    "MAX_SHOWN_CHARS",
    "failure_lines",
    "function_matches",
    "last_run_failed",
    "queue_position",
    "shown_value",
    "what_ran",
    "what_ran_lines",
]

MAX_SHOWN_CHARS = 2_000
"""The most of the arguments (or of the result) a text view prints; ``--json`` has them whole."""
_FUNCTION_STEP = INTERNAL_PREFIX + "function"
_CHILD_ACTION = INTERNAL_PREFIX + "child"
# As ``functions.FUNCTION_STEP`` and ``CHILD_ACTION`` name them: importing the face would import the
# engine into every read-only command.


def shown_value(value: JSONValue, limit: int = MAX_SHOWN_CHARS) -> str:
    """``value`` as compact JSON, cut at ``limit`` characters with the cut said."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), sort_keys=True)
    text = safe_text(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]} ... [{len(text) - limit} more characters; --json shows them all]"


def what_ran(state: RunState | None) -> dict[str, JSONValue]:
    """The task's function, arguments, result, parent, children and last failure as JSON (see the module docstring)."""
    body: dict[str, JSONValue] = {
        "function": None, "args": None, "kwargs": None, "result": None, "done": False, "parent": None,
        "children": [], "last_failure": None,
    }  # fmt: skip
    if state is None:
        return body
    record = state.effects.get(_FUNCTION_STEP)
    payload = record.payload if record is not None else None
    if isinstance(payload, dict):
        function = payload.get("function")
        body["function"] = function if isinstance(function, str) else None
        body["args"] = payload.get("args")
        body["kwargs"] = payload.get("kwargs")
        parent = payload.get("parent")
        body["parent"] = parent if isinstance(parent, str) else None
        assert record is not None
        if record.state is EffectState.VERIFIED:
            body["done"] = True
            body["result"] = record.result
    children: list[JSONValue] = []
    for child in state.effects.values():
        if child.action != _CHILD_ACTION or not isinstance(child.payload, dict):
            continue
        children.append(
            {
                "task": child.payload.get("task"),
                "function": child.payload.get("function"),
                "state": child.state.value,
                "detached": child.payload.get("detached") is True,
            }
        )
    body["children"] = children
    body["last_failure"] = state.last_failure.to_json() if state.last_failure is not None else None
    return body


def last_run_failed(state: RunState) -> bool:
    """Whether the task's last run failed: it is ``failed``, or its latest commit recorded a failure
    (a ``retry-scheduled`` after its code raised, or a crash found by a run that went no further)."""
    failure = state.last_failure
    if state.status is Status.FAILED:
        return True
    return failure is not None and failure.revision == state.revision and state.status in (Status.RETRY_SCHEDULED, Status.RUNNING)


def failure_lines(failure: RunFailure, now: float, *, indent: str = "  ", traceback: bool = False) -> list[str]:
    """The last failure: what, when, how many in a row, when it runs again; the traceback if asked."""
    head = f"{indent}last error   {safe_text(failure.summary())}"
    lines = [head, f"{indent}             at {format_time(failure.at)} ({relative(failure.at, now)}), lease epoch {failure.epoch}"]
    if failure.retry_at is not None:
        lines.append(f"{indent}             next attempt at or after {format_time(failure.retry_at)} ({relative(failure.retry_at, now)})")
    elif failure.failed_for_good:
        lines.append(f"{indent}             no more attempts: {failure.attempt} failures in a row reached max_failures")
    if traceback and failure.traceback:
        lines.append(f"{indent}  traceback")
        lines += [f"{indent}    {safe_text(line)}" for line in failure.traceback.rstrip("\n").splitlines()]
    return lines


def what_ran_lines(view: dict[str, JSONValue], *, indent: str = "  ", limit: int = MAX_SHOWN_CHARS) -> list[str]:
    """``function``, ``arguments``, ``result``, ``parent`` and ``children`` lines (none for a task
    with no function record)."""
    function = view.get("function")
    if not isinstance(function, str):
        return []
    lines = [
        f"{indent}function     {safe_text(function)}",
        f"{indent}arguments    args {shown_value(view.get('args'), limit)}, kwargs {shown_value(view.get('kwargs'), limit)}",
        f"{indent}result       {shown_value(view.get('result'), limit) if view.get('done') else '(not returned yet)'}",
    ]
    parent = view.get("parent")
    if isinstance(parent, str):
        lines.append(f"{indent}parent       {safe_text(parent)}")
    children = view.get("children")
    if isinstance(children, list) and children:
        shown = []
        for child in children:
            if isinstance(child, dict):
                detached = ", detached" if child.get("detached") else ""
                shown.append(f"{child.get('task')} ({child.get('function')}, {child.get('state')}{detached})")
        lines.append(f"{indent}children     {safe_text('; '.join(shown))}")
    return lines


def function_matches(function: object, wanted: Sequence[str]) -> bool:
    """``ls --function``: the recorded ``module:qualname`` is one of ``wanted``, given whole, by its
    qualname alone, or as a glob (``billing:*``)."""
    if not isinstance(function, str):
        return False
    qualname = function.partition(":")[2]
    return any(function == name or qualname == name or fnmatch.fnmatchcase(function, name) for name in wanted)


def queue_position(store: Store, task_id: str) -> int | None:
    """A ``queued`` task's place in the fleet queue (1: claimed next); None where the store keeps no
    queue, or it cannot be read. Called for queued tasks only: recording one made the queue's tables."""
    from ..stores.queue import open_queue

    try:
        queue = open_queue(store)
    except LongrunError:
        return None
    try:
        return queue.position(task_id)
    except LongrunError:
        return None
    finally:
        queue.close()
