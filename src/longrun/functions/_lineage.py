"""What a durable task records of itself and its family, and what a parent needs of a child's function.

The internal step ids and actions of a durable task's records; how a task record names the code
that runs it (``qualified_name``). A child's function record names its parent (``parent``) and its
whole lineage (``ancestors``, nearest first), and ``detached: true`` if it was started with
``run.child(..., detached=True)``. A task that asks for itself or any ancestor as its child would
wait on itself for ever; it is refused with ``ChildCycleError`` before anything is planned, as is
a new child that already waits on the task through its own unfinished children (a task started on
its own records no lineage). ``ChildFunction`` is what ``run.child`` needs of the function it is
given (a ``DurableFunction`` is one), so the steps need not import the face above them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from ..canonical import JSONValue
from ..contract import INTERNAL_PREFIX
from ..envelope import RunState
from ..errors import ChildCycleError
from ..outcome import RunOutcome

__all__ = [
    "CALL_ACTION",
    "CHILD_ACTION",
    "FUNCTION_STEP",
    "SLEEP_ACTION",
    "ChildFunction",
    "ChildLink",
    "TaskFunction",
    "cancelled_with",
    "check_no_cycle",
    "lineage",
    "qualified_name",
]


FUNCTION_STEP = INTERNAL_PREFIX + "function"
"""The step id (and action) of a durable task's own record: function name, arguments, return value."""

CALL_ACTION = INTERNAL_PREFIX + "call"

SLEEP_ACTION = INTERNAL_PREFIX + "sleep"

CHILD_ACTION = INTERNAL_PREFIX + "child"

def qualified_name(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a function: how a task record names the code that runs it."""
    target = getattr(fn, "__wrapped__", fn)
    module = getattr(target, "__module__", None) or "?"
    if module == "__main__":
        # Run with ``python -m package.module``: the name it is imported by elsewhere (a resume, a
        # worker). A script run by path has no such name; its tasks resume only from that script.
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = getattr(spec, "name", None) or module
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__
    return f"{module}:{qualname}"

def lineage(state: RunState | None) -> tuple[str, ...]:
    """The task's ancestors as its function record names them, nearest first; () for a root task."""
    record = state.effects.get(FUNCTION_STEP) if state is not None else None
    payload = record.payload if record is not None else None
    if not isinstance(payload, dict):
        return ()
    ancestors = payload.get("ancestors")
    if isinstance(ancestors, list) and all(isinstance(task, str) for task in ancestors):
        return tuple(str(task) for task in ancestors)
    parent = payload.get("parent")  # recorded before the lineage was: the parent alone
    return (parent,) if isinstance(parent, str) else ()


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
    payload = record.payload if record is not None else None
    if not isinstance(payload, dict) or payload.get("detached") is True:
        return ()
    named = payload.get("cancelled_with")
    if isinstance(named, list) and all(isinstance(task, str) for task in named):
        return tuple(str(task) for task in named)
    parent = payload.get("parent")  # recorded before the list was: the parent alone
    return (parent,) if isinstance(parent, str) else ()


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


@runtime_checkable
class ChildFunction(Protocol):
    """What ``run.child`` needs of the function it is given: a ``DurableFunction``."""

    @property
    def name(self) -> str: ...

    def run_child(
        self, task_id: str, parent: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, link: ChildLink | None = None
    ) -> RunOutcome: ...

    async def arun_child(
        self, task_id: str, parent: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, link: ChildLink | None = None
    ) -> RunOutcome: ...


class TaskFunction(Protocol):
    """What a durable task's plan and its ``Run`` need of the task's function: a ``DurableFunction``."""

    @property
    def name(self) -> str: ...

    @property
    def fn(self) -> Callable[..., Any]: ...
