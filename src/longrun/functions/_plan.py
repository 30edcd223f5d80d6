"""The plan a durable function hands the engine (``FunctionPlan``), the plan that only records a task
for a worker (``Recording``), and running an async task from synchronous code."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from ..canonical import MAX_VALUE_BYTES, JSONValue, digest_of, ensure_json
from ..contract import INTERNAL_PREFIX, RunContract, Step
from ..deadline import TaskDeadline, earliest
from ..engine import Engine, Stop, procedures
from ..envelope import RunState
from ..errors import InvalidInputError
from ..budget import BudgetCounters
from ..ledger import EffectRecord, EffectState
from ..outcome import RunOutcome, Status
from ._run import AsyncRun, Run
from ._lineage import FUNCTION_STEP, ChildLink, TaskFunction, cancelled_with


__all__ = ["FunctionPlan", "Recording", "run_coroutine"]


class _NotGiven:
    def __repr__(self) -> str:
        return "not given"


_NOT_GIVEN = _NotGiven()

FIRST_RUN_UNDER_WAY = "resume it: its first run is under way, or ended before its first step"
"""The next action a durable function's first revision records (a first run that died before its
first step is then told from a task recorded for a worker by an earlier version, see
``envelope.recorded_before_queued``)."""


def _short(value: object) -> str:
    """A value as a message shows it: its repr, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class FunctionPlan:
    """The ``Plan`` of a durable function: its code is the plan, its arguments pin it."""

    def __init__(
        self,
        function: TaskFunction,
        arguments: dict[str, JSONValue],
        contract: RunContract,
        link: ChildLink | None = None,
        deadline_at: float | None = None,
    ):
        self._function = function
        # The deadline asked of the first run: the caller's, and a child's parent's (the earliest wins).
        self._deadline_asked = earliest(
            (deadline_at, "caller") if deadline_at is not None else None,
            (link.deadline_at, "parent") if link is not None and link.deadline_at is not None else None,
        )
        self._arguments = arguments
        self._contract = contract
        # The version is recorded, not part of the plan digest: a task goes on under new code
        # (replay by step id decides), and a worker may choose by it (``--version-policy``).
        self._payload: dict[str, JSONValue] = {"function": function.name, **arguments, "version": function.version}
        if link is not None:  # a child task names its family; the links are not part of the plan digest
            self._payload.update(link.recorded())
        # ``arguments`` is the plain JSON ``ensure_json`` returned (``DurableFunction._plan``), and a
        # contract's JSON is plain: validated once, not again for the digest.
        self.digest = digest_of({"contract": contract.to_json(), "function": function.name, "arguments": arguments}, checked=True)

    def initial(self, engine: Engine, state: RunState) -> None:
        engine.record(procedures.plan, Step(FUNCTION_STEP, FUNCTION_STEP, self._payload))
        engine.invocation.cancelled_with = cancelled_with(state)
        engine.invocation.counts_failures = True
        engine.invocation.deadline_asked = self._deadline_asked
        state.next_action = FIRST_RUN_UNDER_WAY

    def first_state(self, task_id: str, now: float, store_spec: str) -> RunState:
        """The state a first run records before it calls the function (``initial`` on a new state):
        what ``Store.record_new`` writes for ``fn.start`` without running the engine. A test holds
        it equal to what the engine records."""
        # The payload is plain JSON already (its arguments checked by ``ensure_json`` where they
        # entered, the rest this module's strings): it is encoded once, for its digest and its size
        # limit, as ``Step`` would; a ``Step`` (which checks it again and builds the plan digest's
        # parts, which no durable function uses) and a second check of the record are not made.
        payload = self._payload
        digest = digest_of(payload, what=f"step {FUNCTION_STEP!r} payload", max_bytes=MAX_VALUE_BYTES, checked=True)
        record = EffectRecord.from_checked(
            (f"{task_id}/{FUNCTION_STEP}", FUNCTION_STEP, FUNCTION_STEP, payload, digest, EffectState.PLANNED, 0, 0, None, 0.0,
             None, None, None, None, None, now, None)
        )  # fmt: skip
        asked = self._deadline_asked
        return RunState(
            task_id=task_id,
            plan_digest=self.digest,
            budget=BudgetCounters(created_at=now, last_progress_at=now),
            created_at=now,
            updated_at=now,
            status=Status.QUEUED,
            next_action=queued_action(store_spec, task_id),
            effects={FUNCTION_STEP: record},
            deadline=TaskDeadline(asked[0], asked[1], now) if asked is not None else None,
        )

    def accept(self, engine: Engine, state: RunState) -> None:
        engine.invocation.cancelled_with = cancelled_with(state)  # as recorded: a resumed child names no parent in its call
        engine.invocation.counts_failures = True
        engine.invocation.deadline_asked = self._deadline_asked  # recorded only by the first run (a queued task's)
        if state.status is Status.QUEUED and state.deadline is not None:
            # A deadline recorded when the task was queued (fn.start or enqueue with deadline=) is
            # recorded again as its first run starts, with the limits' from now: the earliest wins.
            queued = (state.deadline.at, state.deadline.source) if state.deadline.source != "limits" else None
            engine.invocation.deadline_asked = earliest(self._deadline_asked, queued)
            state.deadline = None
        if state.plan_digest == self.digest:
            return
        recorded = state.effects.get(FUNCTION_STEP)
        payload = recorded.payload if recorded is not None else None
        name, args, kwargs = (payload.get("function"), payload.get("args"), payload.get("kwargs")) if payload else (None, None, None)
        config = engine.config
        task = f"{config.store_spec} {config.task_id}"
        if not isinstance(name, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
            raise engine.record(
                procedures.mismatch,
                f"the task runs a declared plan or a session (recorded plan digest {state.plan_digest}), not {self._function.name}",
                f"run task {config.task_id!r} with the code that started it (`longrun status {task}` shows it), or give "
                f"{self._function.name} a new task id",
            )
        recorded_arguments: dict[str, JSONValue] = {"args": args, "kwargs": kwargs}
        if self._recorded_as_main(name) and digest_of(
            {"contract": self._contract.to_json(), "function": name, "arguments": self._arguments}
        ) == state.plan_digest:
            # Recorded by an earlier version, which named a script's function __main__:...: the
            # same script goes on under that name (the digest its approvals are bound to).
            self.digest = engine.invocation.plan_digest = state.plan_digest
            return
        arguments = self._argument_differences(args, kwargs)
        same_contract = digest_of({"contract": self._contract.to_json(), "function": name, "arguments": recorded_arguments}) == state.plan_digest
        differences = [
            *([f"the function: recorded {name}, this run {self._function.name}"] if name != self._function.name else []),
            *arguments,
            *([] if same_contract else ["the run contract (goal, allowed or forbidden actions) is not the one it was started with"]),
        ]
        detail = "; ".join(differences) or "the plan digest"
        if differences == arguments:
            # Only the arguments differ: the task's own record holds the ones it was started with.
            action = f"resume it with its recorded arguments: `longrun resume {task}` (or call run with them)"
        else:
            action = f"restore the code that started it ({name}, with its contract), then `longrun resume {task}`"
        raise engine.record(
            procedures.mismatch,
            f"task {config.task_id!r} was started differently ({detail}); recorded plan digest {state.plan_digest}, this run's {self.digest}",
            f"{action}; or give this run a new task id. Nothing was run",
        )

    def _recorded_as_main(self, name: str) -> bool:
        target = getattr(self._function.fn, "__wrapped__", self._function.fn)
        return getattr(target, "__module__", None) == "__main__" and name == "__main__:" + self._function.name.partition(":")[2]

    def _argument_differences(self, args: list[JSONValue], kwargs: dict[str, JSONValue]) -> list[str]:
        """Which arguments differ from the recorded ones, by parameter name when the signature tells."""
        now_args, now_kwargs = self._args()
        if args == now_args and kwargs == now_kwargs:
            return []
        try:
            signature = inspect.signature(self._function.fn)
            before = signature.bind(None, *args, **kwargs).arguments
            after = signature.bind(None, *now_args, **now_kwargs).arguments
        except (TypeError, ValueError):  # the recorded arguments no longer fit the function: show them whole
            return [f"the arguments: recorded {_short([args, kwargs])}, this run {_short([now_args, now_kwargs])}"]
        names = dict.fromkeys([*before, *after])
        return [
            f"argument {name!r}: recorded {_short(before.get(name, _NOT_GIVEN))}, this run {_short(after.get(name, _NOT_GIVEN))}"
            for name in names
            if before.get(name, _NOT_GIVEN) != after.get(name, _NOT_GIVEN)
        ]

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
        raise await engine.driver.run(engine.steps(procedures.finish, [FUNCTION_STEP]))

    def _args(self) -> tuple[list[JSONValue], dict[str, JSONValue]]:
        args = self._arguments["args"]
        kwargs = self._arguments["kwargs"]
        assert isinstance(args, list) and isinstance(kwargs, dict)
        return args, kwargs

    def _returned(self, engine: Engine, value: object) -> None:
        self._settle_result(engine, value)
        raise engine.drive(procedures.finish, [FUNCTION_STEP])

    def _settle_result(self, engine: Engine, value: object) -> None:
        result = ensure_json(value, what=f"the return value of {self._function.name}")
        if engine.invocation.state.effects[FUNCTION_STEP].state is not EffectState.VERIFIED:
            engine.record(procedures.complete, FUNCTION_STEP, result)

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

def queued_action(store_spec: str, task_id: str) -> str:
    """The next action of a task recorded and not yet started (``queued``)."""
    return (
        f"nothing yet: a worker runs it (`longrun worker {store_spec} --import MODULE`), "
        f"or `longrun resume {store_spec} {task_id}`"
    )


class Recording:
    """The plan ``DurableFunction.enqueue`` runs: the task's first revision is committed as a first
    run commits it, and the function is not called (a worker or ``run`` calls it later)."""

    def __init__(self, plan: FunctionPlan):
        self._plan = plan
        self.digest = plan.digest

    def initial(self, engine: Engine, state: RunState) -> None:
        self._plan.initial(engine, state)
        state.status = Status.QUEUED
        state.next_action = queued_action(engine.config.store_spec, engine.config.task_id)

    def accept(self, engine: Engine, state: RunState) -> None:
        self._plan.accept(engine, state)

    def drive(self, engine: Engine) -> None:
        raise Stop(Status.QUEUED, queued_action(engine.config.store_spec, engine.config.task_id))

    async def adrive(self, engine: Engine) -> None:
        self.drive(engine)

    def record(self, engine: Engine) -> RunOutcome:
        """Commit the first revision through ``engine`` (an async function's engine runs on a loop of its own)."""
        if engine.config.asynchronous:
            return run_coroutine(engine.arun(self), f"starting task {engine.config.task_id!r}", instead="`await fn.astart(...)`")
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
