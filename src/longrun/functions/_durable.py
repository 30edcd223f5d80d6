"""``@durable`` and ``DurableFunction``: a function made durable, started, resumed or recorded for a worker."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
from types import MappingProxyType
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar, Unpack

from ..canonical import ensure_json
from ..contract import RunContract, check_task_id
from ..engine import Engine, EngineOptions
from ..errors import InvalidInputError, UnknownTaskError
from ..outcome import RunOutcome, Status
from ..protocols import AnyEffectAdapter, Store
from ._plan import FunctionPlan, Recording, run_coroutine
from ._family import cancelled_down
from ._lineage import ChildLink, qualified_name

__all__ = ["DurableFunction", "durable"]


R = TypeVar("R")

class DurableFunction(Generic[R]):
    """A function made durable by ``@durable(...)``: ``fn.run(task_id, *args)`` starts or resumes it.

    Calling ``run`` on a finished task returns ``done`` with the same ``result`` and calls
    nothing. The engine's keyword arguments (store, adapters, limits, retry, lease, clock,
    authority sources) are fixed at decoration; the contract's task id is the one ``run`` gets.
    """

    def __init__(self, fn: Callable[..., Any], contract: RunContract, engine_options: dict[str, Any]):
        self.fn = fn
        self.name = qualified_name(fn)
        self._contract = contract
        self._options = engine_options
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__

    def contract_for(self, task_id: str) -> RunContract:
        return dataclasses.replace(self._contract, task_id=check_task_id(task_id))

    def _plan(
        self,
        task_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        link: ChildLink | None = None,
    ) -> tuple[Engine, FunctionPlan]:
        contract = self.contract_for(task_id)
        self.check_arguments(args, kwargs)
        arguments = ensure_json({"args": list(args), "kwargs": dict(kwargs)}, what=f"arguments of {self.name}")
        assert isinstance(arguments, dict)
        plan = FunctionPlan(self, arguments, contract, link)
        return Engine(contract, **self._options), plan

    def check_arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Refuse arguments the function cannot take (``InvalidInputError`` naming the mismatch), so
        that no task is recorded, started or run that could never call it."""
        try:
            signature = inspect.signature(self.fn)
        except (TypeError, ValueError):  # a callable whose signature Python cannot tell: it is called as it is
            return
        try:
            signature.bind(None, *args, **kwargs)  # None stands for the Run the function gets first
        except TypeError as exc:
            bare = signature.replace(  # the names and defaults say what it takes; annotations would only crowd them
                parameters=[parameter.replace(annotation=inspect.Parameter.empty) for parameter in signature.parameters.values()],
                return_annotation=inspect.Signature.empty,
            )
            raise InvalidInputError(f"{self.name}{bare} cannot take these arguments: {exc}; nothing was recorded") from None

    @property
    def is_async(self) -> bool:
        """Whether the function is ``async def`` (its steps are awaited: ``AsyncRun``)."""
        return inspect.iscoroutinefunction(self.fn)

    def run(self, task_id: str, *args: Any, **kwargs: Any) -> RunOutcome:
        """Start the task with these arguments, or resume it; return why it stopped.

        An async function is run on an event loop of its own (``asyncio.run``); from async code,
        ``await fn.arun(...)`` instead."""
        if self.is_async:
            return run_coroutine(self.arun(task_id, *args, **kwargs), f"{self.name}.run")
        engine, plan = self._plan(task_id, args, kwargs)
        return cancelled_down(engine, engine.run(plan))

    async def arun(self, task_id: str, *args: Any, **kwargs: Any) -> RunOutcome:
        """``run``, awaited: an async function runs on this event loop, a synchronous one in a
        worker thread (so that many tasks can run side by side)."""
        return await self._arun(task_id, args, kwargs, None)

    async def _arun(
        self,
        task_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        link: ChildLink | None,
    ) -> RunOutcome:
        engine, plan = self._plan(task_id, args, kwargs, link=link)
        if not self.is_async:
            outcome = await asyncio.to_thread(engine.run, plan)
        else:
            outcome = await engine.arun(plan)
        if outcome.status is Status.CANCELLED:  # the store's calls block: in a thread, off this loop
            return await asyncio.to_thread(cancelled_down, engine, outcome)
        return outcome

    async def arun_child(
        self,
        task_id: str,
        parent: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        link: ChildLink | None = None,
    ) -> RunOutcome:
        """``run_child``, awaited."""
        return await self._arun(task_id, args, kwargs, link or ChildLink.of(parent))

    def plan_digest(self, task_id: str, *args: Any, **kwargs: Any) -> str:
        """The plan digest a task of this function with these arguments has: what an approval written
        ahead of the first run binds to (the contract, the function's name and the arguments)."""
        return self._plan(task_id, args, kwargs)[1].digest

    def start(self, task_id: str, *args: Any, **kwargs: Any) -> bool:
        """Record the task with these arguments without running it, for a worker to pick up
        (``longrun worker``); ``enqueue`` with priority 0."""
        return self.enqueue(task_id, args, kwargs)

    async def astart(self, task_id: str, *args: Any, **kwargs: Any) -> bool:
        """``start`` from async code: the store's calls block, so they run in a worker thread."""
        return await asyncio.to_thread(self.enqueue, task_id, args, kwargs)

    def enqueue(self, task_id: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *, priority: int = 0) -> bool:
        """Record the task (its first revision, as a first run would commit it, without calling the
        function) and put it in the store's fleet queue with ``priority`` (higher runs first).

        True if this call recorded it; False if it was recorded before with the same function and
        arguments (its priority is set, nothing else changes). Other arguments, or another function
        or plan under the same task id, are refused with ``InvalidInputError``, changing nothing."""
        from ..stores.queue import open_queue  # only a fleet needs the queue's tables

        engine, plan = self._plan(task_id, tuple(args), dict(kwargs or {}))
        queue = open_queue(engine.store)
        try:
            queue.ensure()  # the queue's triggers exist before the first record, so nothing is missed
            created = self._record(engine, plan)
            queue.enqueue(task_id, self.name, priority=priority)
        finally:
            queue.close()
        return created

    def _record(self, engine: Engine, plan: FunctionPlan) -> bool:
        """Commit the task's first revision unless it has one; True if this call did. Refuses another plan."""
        task_id = engine.task_id
        created = False
        for _ in range(100):
            try:
                state = engine.store.load(task_id).state
            except UnknownTaskError:
                state = None
            if state is not None:
                break
            outcome = Recording(plan).record(engine)
            if outcome.status is Status.QUEUED:
                created = True
                break
            if outcome.status is not Status.ALREADY_RUNNING:
                raise InvalidInputError(f"task {task_id!r} could not be recorded: {outcome.status.value}: {outcome.next_action}")
            engine.clock.sleep(0.05)  # another process is recording it: read what it records
        else:
            raise InvalidInputError(f"task {task_id!r} is held by another process that records nothing; try again")
        if state is not None and state.plan_digest != plan.digest:
            raise InvalidInputError(
                f"task {task_id!r} exists with plan digest {state.plan_digest}, not {plan.digest} ({self.name} with these "
                "arguments): it was started with other arguments or by other code; nothing was changed"
            )
        return created

    @property
    def engine_options(self) -> Mapping[str, Any]:
        """The engine's keyword arguments this function was decorated with (read-only)."""
        return MappingProxyType(self._options)

    def with_options(self, **options: Any) -> "DurableFunction[R]":
        """This function with some engine options replaced (``store``, ``adapters``, ``owner``,
        ``cancellations``, ...): same name, so the same tasks and plan digests. A worker runs each
        thread's tasks through its own store connection this way."""
        known = {"store", "adapters", *EngineOptions.__optional_keys__}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidInputError(f"unknown engine options {unknown}; known: {sorted(known)}")
        merged = {**self._options, **options}
        Engine(self._contract, **merged)  # validates them now, not at the first run
        clone = copy.copy(self)
        clone._options = merged
        return clone

    def run_child(
        self,
        task_id: str,
        parent: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        link: ChildLink | None = None,
    ) -> RunOutcome:
        """``run`` for a child task of ``parent`` (``Run.child``): its first record names the parent
        and the rest of ``link`` (its lineage, whether it is detached, whose cancellation reaches it)."""
        link = link or ChildLink.of(parent)
        if self.is_async:
            return run_coroutine(self.arun_child(task_id, parent, args, kwargs, link=link), f"child {task_id!r}")
        engine, plan = self._plan(task_id, args, kwargs, link=link)
        return cancelled_down(engine, engine.run(plan))

    def __repr__(self) -> str:
        return f"<durable function {self.name}>"

def durable(
    *,
    store: Store,
    adapters: Mapping[str, AnyEffectAdapter] | None = None,
    contract: RunContract | None = None,
    allowed_actions: tuple[str, ...] = (),
    forbidden_actions: tuple[str, ...] = (),
    goal: str | None = None,
    **engine_options: Unpack[EngineOptions],
) -> Callable[[Callable[..., R]], DurableFunction[R]]:
    """Make ``fn(run, *args, **kwargs)`` a durable function (see the module docstring).

    An ``async def`` function gets an ``AsyncRun`` and may use async adapters; a synchronous one
    gets a ``Run`` and refuses them here. ``timeout_s`` bounds every ``apply`` and call (a step's
    own overrides it); ``max_parallel`` bounds the steps in flight at once (``asyncio.gather`` in
    an async function, ``run.map`` in a synchronous one).

    ``contract`` is a ``RunContract`` whose task id is replaced by each run's; without one, a
    contract is built from ``goal``, ``allowed_actions`` and ``forbidden_actions``. ``on_event``
    receives a ``longrun.events.RunEvent`` after each commit that made a transition durable.
    """
    if contract is not None and (allowed_actions or forbidden_actions or goal is not None):
        raise InvalidInputError("give either contract= or goal/allowed_actions/forbidden_actions, not both")

    def decorate(fn: Callable[..., R]) -> DurableFunction[R]:
        if not callable(fn):
            raise InvalidInputError(f"@durable needs a function, got {fn!r}")
        name = qualified_name(fn)
        if name.startswith("__main__:"):
            raise InvalidInputError(
                f"@durable function {name.partition(':')[2]!r} is defined in __main__, which no other process can import "
                "(python -c, a REPL, a notebook, or a script named like a standard module), so its tasks could not be "
                "resumed by `longrun resume` or a worker: define it in a module file (not named like a standard module) "
                "and import it, or run that file as a script or with `python -m`"
            )
        base = contract or RunContract(
            "durable-function",
            goal or f"run {qualified_name(fn)} to completion",
            allowed_actions=tuple(allowed_actions),
            forbidden_actions=tuple(forbidden_actions),
        )
        options: dict[str, Any] = dict(
            engine_options, store=store, adapters=dict(adapters or {}), asynchronous=inspect.iscoroutinefunction(fn)
        )
        Engine(base, **options)  # validates the options now, not at the first run
        return DurableFunction(fn, base, options)

    return decorate
