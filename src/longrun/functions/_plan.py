"""The plan a durable function hands the engine (``FunctionPlan``), the plan that only records a task
for a worker (``Recording``), and running an async task from synchronous code."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from ..canonical import JSONValue, digest_of, ensure_json
from ..contract import INTERNAL_PREFIX, RunContract, Step
from ..engine import Engine, Stop
from ..envelope import RunState
from ..errors import InvalidInputError
from ..ledger import EffectState
from ..outcome import RunOutcome, Status
from ._run import AsyncRun, Run
from ._lineage import FUNCTION_STEP, ChildLink, TaskFunction, cancelled_with


__all__ = ["FunctionPlan", "Recording", "run_coroutine"]


class FunctionPlan:
    """The ``Plan`` of a durable function: its code is the plan, its arguments pin it."""

    def __init__(
        self,
        function: TaskFunction,
        arguments: dict[str, JSONValue],
        contract: RunContract,
        link: ChildLink | None = None,
    ):
        self._function = function
        self._arguments = arguments
        self._payload: dict[str, JSONValue] = {"function": function.name, **arguments}
        if link is not None:  # a child task names its family; the links are not part of the plan digest
            self._payload.update(link.recorded())
        self.digest = digest_of({"contract": contract.to_json(), "function": function.name, "arguments": arguments})

    def initial(self, engine: Engine, state: RunState) -> None:
        engine.plan(Step(FUNCTION_STEP, FUNCTION_STEP, self._payload))
        engine.cancelled_with = cancelled_with(state)

    def accept(self, engine: Engine, state: RunState) -> None:
        engine.cancelled_with = cancelled_with(state)  # as recorded: a resumed child names no parent in its call
        if state.plan_digest == self.digest:
            return
        recorded = state.effects.get(FUNCTION_STEP)
        what = f"function {recorded.payload.get('function')!r}" if recorded is not None and isinstance(recorded.payload, dict) else "a declared plan"
        raise engine.mismatch(
            f"recorded plan digest {state.plan_digest} ({what}); this run's digest is {self.digest}",
            f"run the task with the function and arguments it was started with (plan digest {state.plan_digest}), "
            "or use `longrun resume <store> <task>`, which reads them from the task",
        )

    def drive(self, engine: Engine) -> None:
        args, kwargs = self._args()
        value = self._function.fn(Run(engine, self._function), *args, **kwargs)
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()  # never awaited: closed, so no "never awaited" warning hides the real error
            raise InvalidInputError(f"{self._function.name} returned an awaitable: async functions need the async face")
        self._returned(engine, value)

    async def adrive(self, engine: Engine) -> None:
        args, kwargs = self._args()
        value = await self._function.fn(AsyncRun(engine, self._function), *args, **kwargs)
        self._settle_result(engine, value)
        raise await engine.driver.run(engine.finish_steps([FUNCTION_STEP]))

    def _args(self) -> tuple[list[JSONValue], dict[str, JSONValue]]:
        args = self._arguments["args"]
        kwargs = self._arguments["kwargs"]
        assert isinstance(args, list) and isinstance(kwargs, dict)
        return args, kwargs

    def _returned(self, engine: Engine, value: object) -> None:
        self._settle_result(engine, value)
        raise engine.finish([FUNCTION_STEP])

    def _settle_result(self, engine: Engine, value: object) -> None:
        result = ensure_json(value, what=f"the return value of {self._function.name}")
        if engine.state.effects[FUNCTION_STEP].state is not EffectState.VERIFIED:
            engine.complete(FUNCTION_STEP, result)

    def progress(self, state: RunState) -> str:
        counts: dict[str, int] = {}
        for record in state.effects.values():
            if record.step_id != FUNCTION_STEP:
                kind = "effects" if not record.action.startswith(INTERNAL_PREFIX) else "other steps"
                counts[kind] = counts.get(kind, 0) + (record.state is EffectState.VERIFIED)
        return ", ".join(f"{count} {kind} verified" for kind, count in counts.items()) or "no step recorded yet"

    def result(self, state: RunState) -> JSONValue:
        record = state.effects.get(FUNCTION_STEP)
        return record.result if record is not None and record.state is EffectState.VERIFIED else None

class Recording:
    """The plan ``DurableFunction.enqueue`` runs: the task's first revision is committed as a first
    run commits it, and the function is not called (a worker or ``run`` calls it later)."""

    def __init__(self, plan: FunctionPlan):
        self._plan = plan
        self.digest = plan.digest

    def initial(self, engine: Engine, state: RunState) -> None:
        self._plan.initial(engine, state)

    def accept(self, engine: Engine, state: RunState) -> None:
        self._plan.accept(engine, state)

    def drive(self, engine: Engine) -> None:
        raise Stop(Status.RUNNING, "nothing yet: a worker runs it (`longrun worker`), or `longrun resume <store> <task>`")

    async def adrive(self, engine: Engine) -> None:
        self.drive(engine)

    def record(self, engine: Engine) -> RunOutcome:
        """Commit the first revision through ``engine`` (an async function's engine runs on a loop of its own)."""
        if engine.asynchronous:
            return run_coroutine(engine.arun(self), f"starting task {engine.task_id!r}", instead="`await fn.astart(...)`")
        return engine.run(self)

    def progress(self, state: RunState) -> str:
        return self._plan.progress(state)

    def result(self, state: RunState) -> JSONValue:
        return None

def run_coroutine(coroutine: Any, what: str, *, instead: str = "`await fn.arun(...)`") -> RunOutcome:
    """Run an async function's task from synchronous code, on an event loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)  # type: ignore[no-any-return]
    coroutine.close()
    raise InvalidInputError(f"{what}: an event loop is running in this thread; use {instead}")
