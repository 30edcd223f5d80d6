"""What both faces of a durable function share: the step ids claimed once per run, divergence
from the record, and how each kind of step is built and its record replayed.

A child's function record names its parent (``parent``) and its whole lineage (``ancestors``,
nearest first), and ``detached: true`` if it was started with ``run.child(..., detached=True)``.
A task that asks for itself or any ancestor as its child would wait on itself for ever; it is
refused with ``ChildCycleError`` before anything is planned, as is a new child that already waits
on the task through its own unfinished children (a task started on its own records no lineage)."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .. import _crashpoints
from ..canonical import JSONValue, digest_of, ensure_json
from ..contract import ASK_ACTION, INTERNAL_PREFIX, Step, check_step_id, check_task_id
from ..engine import Engine
from ..envelope import RunState
from ..errors import CallFailed, ChildCycleError, InvalidInputError
from ..ledger import EffectRecord, EffectState
from ..outcome import ENDED_UNFINISHED, RunOutcome, Status

if TYPE_CHECKING:
    from ._durable import DurableFunction

__all__ = ["CALL_ACTION", "CHILD_ACTION", "FUNCTION_STEP", "SLEEP_ACTION", "ChildLink", "RunSteps", "cancelled_with", "check_no_cycle", "lineage", "main_module_name", "qualified_name"]


FUNCTION_STEP = INTERNAL_PREFIX + "function"
"""The step id (and action) of a durable task's own record: function name, arguments, return value."""

CALL_ACTION = INTERNAL_PREFIX + "call"

SLEEP_ACTION = INTERNAL_PREFIX + "sleep"

CHILD_ACTION = INTERNAL_PREFIX + "child"

def qualified_name(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a function: how a task record names the code that runs it.

    A function of the script being run (module ``__main__``) is named by the module name the script
    is importable by elsewhere (a resume, a worker): ``main_module_name()``; ``__main__`` only if it
    has none."""
    target = getattr(fn, "__wrapped__", fn)
    module = getattr(target, "__module__", None) or "?"
    if module == "__main__":
        module = main_module_name() or module
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__
    return f"{module}:{qualname}"

def _family(state: RunState | None, field: str) -> tuple[str, ...]:
    """The task ids the function record names under ``field``; a record written before the field
    was names the parent alone; () for a root task."""
    record = state.effects.get(FUNCTION_STEP) if state is not None else None
    payload = record.payload if record is not None else None
    if not isinstance(payload, dict):
        return ()
    named = payload.get(field)
    if isinstance(named, list) and all(isinstance(task, str) for task in named):
        return tuple(str(task) for task in named)
    parent = payload.get("parent")
    return (parent,) if isinstance(parent, str) else ()


def lineage(state: RunState | None) -> tuple[str, ...]:
    """The task's ancestors as its function record names them, nearest first; () for a root task."""
    return _family(state, "ancestors")


@dataclass(frozen=True, slots=True)
class ChildLink:
    """What a child task's function record says of its family (none of it is in the plan digest)."""

    parent: str
    ancestors: tuple[str, ...]
    """The parent first, then its ancestors."""
    detached: bool = False
    cancelled_with: tuple[str, ...] = ()
    """The tasks whose cancellation cancels the child: () if detached."""

    @classmethod
    def of(cls, parent: str) -> "ChildLink":
        """The link of a child whose parent is a root task."""
        return cls(parent, (parent,), False, (parent,))

    def recorded(self) -> dict[str, JSONValue]:
        fields: dict[str, JSONValue] = {"parent": self.parent, "ancestors": list(self.ancestors)}
        if self.detached:
            fields["detached"] = True
        else:
            fields["cancelled_with"] = list(self.cancelled_with)
        return fields


def cancelled_with(state: RunState | None) -> tuple[str, ...]:
    """The tasks whose cancellation cancels this one, as its function record names them: its
    parent and those whose cancellation reaches the parent; () for a root or a detached child."""
    record = state.effects.get(FUNCTION_STEP) if state is not None else None
    if record is not None and isinstance(record.payload, dict) and record.payload.get("detached") is True:
        return ()
    return _family(state, "cancelled_with")


def check_no_cycle(task_id: str, child: str, ancestors: tuple[str, ...]) -> None:
    """``ChildCycleError`` if ``child`` is ``task_id`` itself or one of its ``ancestors``."""
    chain = (task_id, *ancestors)
    if child not in chain:
        return
    what = "itself" if child == task_id else f"its ancestor {child!r}"
    shown = " <- ".join(repr(task) for task in chain)
    raise ChildCycleError(
        f"task {task_id!r} asks for {what} as its child (lineage {shown}): it would wait on itself for ever; "
        "nothing was started: give the child another task id",
        child=child,
        lineage=chain,
    )


def main_module_name() -> str | None:
    """The name the running ``__main__`` module can be imported by from another process, or None.

    Run with ``python -m package.module``: that name (``__main__.__spec__``). Run as a script by its
    path: the dotted path of the file relative to the first ``sys.path`` entry that holds it (for
    ``python tasks/agents.py``, ``agents``, found with ``--path tasks`` or from that directory),
    provided every part is an identifier and no other module of that name is loaded or in the
    standard library (importing it would find that one). None for ``python -c``, a REPL or a
    notebook (code with no file to import), or a script named like a standard module."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if isinstance(name, str) and name and name != "__main__":
        return name
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return None
    path = os.path.realpath(path)
    for entry in sys.path:
        root = os.path.realpath(entry or os.curdir)
        relative = os.path.relpath(path, root)
        if relative.startswith(os.pardir + os.sep) or os.path.isabs(relative):
            continue
        parts = relative[: -len(".py")].split(os.sep)
        if parts and parts[-1] == "__init__":
            parts.pop()
        if not parts or not all(part.isidentifier() for part in parts):
            continue
        candidate = ".".join(parts)
        loaded = sys.modules.get(candidate)
        loaded_file = getattr(loaded, "__file__", None)
        if parts[0] in sys.stdlib_module_names or parts[0] in sys.builtin_module_names:
            return None  # an import of that name finds the standard library's module
        if loaded is not None and (not isinstance(loaded_file, str) or os.path.realpath(loaded_file) != path):
            return None  # another module of that name is loaded: an import would return it
        return candidate
    return None

class RunSteps:
    """What ``Run`` and ``AsyncRun`` share: step ids, and each step checked against what is recorded."""

    def __init__(self, engine: Engine, function: DurableFunction[Any]):
        self._engine = engine
        self._function = function
        self._used: set[str] = set()

    @property
    def task_id(self) -> str:
        return self._engine.task_id

    def _claim(self, step_id: str) -> str:
        check_step_id(step_id)
        if step_id.startswith(INTERNAL_PREFIX):
            raise InvalidInputError(f"step id {step_id!r}: ids starting with {INTERNAL_PREFIX!r} are reserved")
        if step_id in self._used:
            raise InvalidInputError(f"step id {step_id!r} is used twice in one run of {self._function.name}")
        self._used.add(step_id)
        return step_id

    def _diverged(self, step_id: str, what: str, recorded: str, now: str) -> BaseException:
        return self._engine.mismatch(
            f"step {step_id!r}: recorded {what} {recorded}, the code now asks for {now}",
            f"restore the code that recorded step {step_id!r} ({what} {recorded}), or give the changed step a new id; "
            "nothing was applied",
        )

    def _effect_step(
        self, step_id: str, action: str, payload: Mapping[str, Any], approval: bool, observe_first: bool
    ) -> Step:
        self._claim(step_id)
        engine = self._engine
        if not isinstance(action, str) or action.startswith(INTERNAL_PREFIX):
            raise InvalidInputError(f"step {step_id!r}: action {action!r} is not a user action")
        engine.adapter_for(action, step_id=step_id)
        refusal = engine.contract.action_refusal(action)
        if refusal is not None:
            raise engine.refused_action(step_id, refusal)
        step = Step(step_id, action, payload, approval=approval, observe_first=observe_first)
        recorded = engine.state.effects.get(step_id)
        if recorded is not None:
            if recorded.action != action:
                raise self._diverged(step_id, "action", repr(recorded.action), repr(action))
            static = step.static_payload  # the digest the step made when it was built
            digest = static[1] if static is not None else digest_of(step.evaluate_payload({}), what=f"payload of step {step_id!r}")
            if recorded.payload_digest != digest:
                raise self._diverged(step_id, "payload digest", recorded.payload_digest, digest)
        return step

    def _call_step(self, step_id: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], replay: str) -> Step:
        self._claim(step_id)
        if replay not in ("strict", "by-id"):
            raise InvalidInputError(f"step {step_id!r}: replay must be 'strict' or 'by-id', got {replay!r}")
        if not callable(fn):
            raise InvalidInputError(f"step {step_id!r}: {fn!r} is not callable")
        arguments = ensure_json({"args": list(args), "kwargs": dict(kwargs)}, what=f"arguments of step {step_id!r}")
        payload = {"function": qualified_name(fn), "arguments": digest_of(arguments)}
        step = Step(step_id, CALL_ACTION, payload)
        recorded = self._engine.state.effects.get(step_id)
        if recorded is not None:
            if recorded.action != CALL_ACTION:
                raise self._diverged(step_id, "action", repr(recorded.action), "a call")
            if replay == "strict" and recorded.payload_digest != digest_of(payload):
                raise self._diverged(step_id, "call digest", recorded.payload_digest, digest_of(payload))
        return step

    @staticmethod
    def _call_result(step_id: str, record: EffectRecord) -> Any:
        if record.state is EffectState.FAILED:
            failure = record.result if isinstance(record.result, dict) else {}
            raise CallFailed(step_id, str(failure.get("type", "Exception")), str(failure.get("message", record.last_error)))
        return record.result

    def _sleep_step(self, step_id: str, seconds: float) -> Step:
        self._claim(step_id)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            raise InvalidInputError(f"step {step_id!r}: seconds must be a finite number >= 0, got {seconds!r}")
        recorded = self._engine.state.effects.get(step_id)
        if recorded is not None and recorded.action != SLEEP_ACTION:
            raise self._diverged(step_id, "action", repr(recorded.action), "a sleep")
        return Step(step_id, SLEEP_ACTION, {"seconds": seconds})

    def _ask(self, step_id: str, question: str, choices: Sequence[JSONValue] | None) -> JSONValue:
        self._claim(step_id)
        if not isinstance(question, str) or not question.strip():
            raise InvalidInputError(f"step {step_id!r}: the question must be a non-empty string")
        listed = None if choices is None else ensure_json(list(choices), what=f"choices of step {step_id!r}")
        payload: dict[str, JSONValue] = {"question": question, "choices": listed}
        recorded = self._engine.state.effects.get(step_id)
        if recorded is not None:
            if recorded.action != ASK_ACTION:
                raise self._diverged(step_id, "action", repr(recorded.action), "a question")
            if recorded.payload_digest != digest_of(payload):
                raise self._diverged(step_id, "question digest", recorded.payload_digest, digest_of(payload))
        choice_list = listed if isinstance(listed, list) else None
        return self._engine.ask(Step(step_id, ASK_ACTION, payload), choice_list).result

    def _link(self, detached: bool) -> ChildLink:
        """What a child this task starts records of its family: this task, its lineage, and whose
        cancellation reaches the child (this task's and whose reaches this task, unless detached)."""
        state = self._engine.state
        reached = () if detached else (self.task_id, *cancelled_with(state))
        return ChildLink(self.task_id, (self.task_id, *lineage(state)), detached, reached)

    def _child_record(
        self, task_id: str, function: DurableFunction[Any], args: tuple[Any, ...], kwargs: dict[str, Any], detached: bool
    ) -> tuple[str, EffectRecord]:
        """The child's record in this run (planned now if new); a planned one is still to be driven."""
        from ._durable import DurableFunction  # the face above, imported when a child is asked for

        check_task_id(task_id)
        if not isinstance(function, DurableFunction):
            raise InvalidInputError(f"child {task_id!r}: {function!r} is not a durable function")
        if not isinstance(detached, bool):
            raise InvalidInputError(f"child {task_id!r}: detached must be True or False, got {detached!r}")
        check_no_cycle(self.task_id, task_id, lineage(self._engine.state))
        step_id = f"{CHILD_ACTION}:{task_id}"
        if step_id not in self._engine.state.effects:  # a new child: does it (through its own children) wait on this task?
            from ._family import waiting_path

            path = waiting_path(self._engine.store, task_id, self.task_id)
            if path:
                shown = " -> ".join(repr(task) for task in (self.task_id, *path))
                raise ChildCycleError(
                    f"task {self.task_id!r} asks for {task_id!r} as its child, which waits on it ({shown}): both would "
                    "wait for ever; nothing was started: give the child another task id",
                    child=task_id,
                    lineage=(self.task_id, *lineage(self._engine.state)),
                )
        if step_id in self._used:
            raise InvalidInputError(f"child task {task_id!r} is used twice in one run of {self._function.name}")
        self._used.add(step_id)
        arguments = ensure_json({"args": list(args), "kwargs": dict(kwargs)}, what=f"arguments of child {task_id!r}")
        payload: dict[str, JSONValue] = {"task": task_id, "function": function.name, "arguments": digest_of(arguments)}
        if detached:  # only then: the digest of a child recorded before the option existed is unchanged
            payload["detached"] = True
        engine = self._engine
        recorded = engine.state.effects.get(step_id)
        if recorded is not None and recorded.payload_digest != digest_of(payload):
            raise self._diverged(step_id, "child digest", recorded.payload_digest, digest_of(payload))
        record = engine.plan(Step(step_id, CHILD_ACTION, payload))
        if record.state is EffectState.PLANNED:
            engine.check_cancellation()  # a cancelled parent drives its child no further
        return step_id, record

    def _child_settled(self, step_id: str, task_id: str, outcome: RunOutcome) -> EffectRecord:
        engine = self._engine
        if _crashpoints.ARMED:
            _crashpoints.hit("child.returned", task_id)
        if outcome.status is Status.DONE:
            return engine.complete(step_id, outcome.result)
        if outcome.status in ENDED_UNFINISHED:
            failure: JSONValue = {"type": "ChildEnded", "message": f"child task {task_id!r} ended {outcome.status.value}"}
            return engine.complete(step_id, failure, failed=True)
        raise engine.wait(
            Status.WAITING_ON_CHILD,
            f"child task {task_id!r} is {outcome.status.value} ({outcome.next_action}); run this task again after it",
            wake_at=outcome.wake_at,
        )

    @staticmethod
    def _child_result(step_id: str, record: EffectRecord) -> Any:
        if record.state is EffectState.FAILED:
            failure_record = record.result if isinstance(record.result, dict) else {}
            raise CallFailed(step_id, str(failure_record.get("type", "ChildEnded")), str(failure_record.get("message", "")))
        return record.result
