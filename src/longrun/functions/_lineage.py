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

import os
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
    "main_module_name",
    "qualified_name",
]


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
    deadline_at: float | None = None
    """The parent's recorded deadline, which the child inherits (None if detached or it has none):
    not recorded in the link, but as the child's own deadline (``RunState.deadline``)."""

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

    @property
    def version(self) -> str:
        """The code version a task records when it starts (``durable(version=...)``)."""
        ...
