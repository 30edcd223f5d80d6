"""What ``longrun mcp`` offers an agent besides its tools: a task's contract, status and history as
``longrun://TASK/...`` resources, and the continuation rule as a prompt.

The resources are read-only views of what ``longrun status --json`` and ``longrun history --json``
show (with ``next``, the continuation rule's answer), and of the run contract the task recorded.
A server pinned to one task (``--task``) offers that task's only; otherwise the store's session tasks,
at most 200 in a listing (any task's resource can still be read by its URI).
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import time

from ..canonical import JSONValue
from ..errors import CorruptStateError, InvalidInputError, LongrunError, UnknownTaskError
from ..session import recorded_contract
from ._common import checked_task
from ._mcp_tools import SessionTools, error_line

__all__ = ["CONTINUE_PROMPT", "RESOURCE_KINDS", "ResourceError", "SessionResources"]

log = logging.getLogger("longrun")

URI_PREFIX = "longrun://"
RESOURCE_KINDS = ("contract", "status", "history")
_MAX_LISTED_TASKS = 200

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


class ResourceError(Exception):
    """A resource that cannot be read: an unknown URI or task (a JSON-RPC error)."""


class SessionResources:
    """The resources and the prompt of ``longrun mcp``, over the store and task of ``tools``."""

    def __init__(self, tools: SessionTools):
        self.tools = tools
        self.store = tools.store
        self.task = tools.task

    def tasks(self) -> list[str]:
        """The session tasks the resources cover: the pinned task, or the store's sessions (at most 200)."""
        if self.task is not None:
            return [self.task]
        found = []
        for task in sorted(self.store.list_tasks()):
            try:
                state = self.store.load(task).state
            except (LongrunError, OSError) as exc:  # listed by `longrun ls` as DAMAGED; its URIs still answer why
                log.warning("mcp: task %s is not listed among the resources: its state cannot be read (%s)", task, exc)
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
                value: JSONValue = self.tools.status_document(task)
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


_RESOURCE_TITLES = {"contract": "Run contract of {task}", "status": "Status of {task}", "history": "History of {task}"}
_RESOURCE_DESCRIPTIONS = {
    "contract": "the run contract the task recorded with its first revision, and its plan digest",
    "status": "the task's state, lease, effects and pending approvals (as `longrun status --json`), and `next`, the one safe next action",
    "history": "the task's timeline: commits, effect moves, approvals, control records read (as `longrun history --json`)",
}
