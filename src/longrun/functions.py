"""The durable-function face: agent code whose steps are decided as it runs, replayed by step id.

::

    @longrun.durable(store=store, adapters={"mail.send": Mailer()}, allowed_actions=("mail.send",))
    def agent(run: longrun.Run, goal: str) -> dict:
        plan = run.call("plan", ask_model, goal)              # recorded once, replayed after a crash
        for i, tool in enumerate(plan["tools"]):
            run.effect(f"tool/{i}", "mail.send", tool)         # the effect ledger, observed before retry
        return {"tools": len(plan["tools"])}

    outcome = agent.run("agent-1", "tidy the inbox")          # starts, or resumes with the recorded arguments

Every ``run()`` executes the function from the top. Each ``run.*`` step whose id is recorded returns
its recorded outcome without doing anything; the first step whose id is not recorded proceeds, so a
loop or a newly inserted step extends the run. Replay is by step id, not by position: the order of
steps may change between versions of the code, their ids may not be reused within one run.

Divergence: a recorded effect whose action or payload digest differs from what the code now asks
for, or a recorded call whose function or argument digest differs (unless the call says
``replay="by-id"``), stops the run ``plan-mismatch`` naming the step and both digests; nothing is
applied. The arguments and the function's name are recorded with the task when it first starts; its
plan digest (what approvals bind to) is the digest of the contract, the function name and those
arguments. Running the task with other arguments stops ``plan-mismatch``.

What the function must keep deterministic between ``run.*`` steps: which step ids it asks for and
with which payloads, given the values the steps returned. Anything nondeterministic (a model's
answer, the time, a random choice, a read) belongs inside ``run.call`` so that it is recorded once.

An exception the function raises (other than a stop, which the engine handles) is committed with
what was settled before it, and re-raised to the caller of ``run()``; the task stays resumable.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import math
import sys
from types import MappingProxyType
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar

from . import _crashpoints
from ._io import is_async_callable
from .budget import Limits, RetryPolicy
from .canonical import JSONValue, digest_of, ensure_json
from .contract import ASK_ACTION, INTERNAL_PREFIX, RunContract, Step, check_step_id, check_task_id
from .engine import Engine, Stop
from .envelope import RunState
from .events import EventHook
from .errors import CallFailed, InvalidInputError, UnknownTaskError
from .ledger import EffectRecord, EffectState
from .outcome import ENDED_UNFINISHED, RunOutcome, Status
from .protocols import AnyEffectAdapter, ApprovalSource, CancellationSource, Clock, Store

__all__ = ["ASK_ACTION", "CALL_ACTION", "CHILD_ACTION", "FUNCTION_STEP", "SLEEP_ACTION", "AsyncRun", "DurableFunction", "Run", "durable"]

FUNCTION_STEP = INTERNAL_PREFIX + "function"
"""The step id (and action) of a durable task's own record: function name, arguments, return value."""
CALL_ACTION = INTERNAL_PREFIX + "call"
SLEEP_ACTION = INTERNAL_PREFIX + "sleep"
CHILD_ACTION = INTERNAL_PREFIX + "child"

R = TypeVar("R")


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


class _Steps:
    """What ``Run`` and ``AsyncRun`` share: step ids, and each step checked against what is recorded."""

    def __init__(self, engine: Engine, function: "DurableFunction[Any]"):
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
            digest = digest_of(step.evaluate_payload({}), what=f"payload of step {step_id!r}")
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

    def _child_record(
        self, task_id: str, function: "DurableFunction[Any]", args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, EffectRecord]:
        """The child's record in this run (planned now if new); a planned one is still to be driven."""
        check_task_id(task_id)
        if not isinstance(function, DurableFunction):
            raise InvalidInputError(f"child {task_id!r}: {function!r} is not a durable function")
        step_id = f"{CHILD_ACTION}:{task_id}"
        if step_id in self._used:
            raise InvalidInputError(f"child task {task_id!r} is used twice in one run of {self._function.name}")
        self._used.add(step_id)
        arguments = ensure_json({"args": list(args), "kwargs": dict(kwargs)}, what=f"arguments of child {task_id!r}")
        payload = {"task": task_id, "function": function.name, "arguments": digest_of(arguments)}
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


class Run(_Steps):
    """What a durable function receives as its first argument: the steps it may take.

    ``effect`` makes a side effect through the ledger; ``map`` makes several at once; ``call``
    records a read, a computation or a model's answer; ``sleep`` waits durably; ``ask`` waits for a
    person's answer; ``child`` runs another durable task to completion.
    Each takes a step id first: unique within one run of the function, stable across runs.
    """

    def effect(
        self,
        step_id: str,
        action: str,
        payload: Mapping[str, Any],
        *,
        approval: bool = False,
        observe_first: bool = False,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
    ) -> JSONValue:
        """Make a side effect through the ledger, exactly as a declared step; return its result.

        ``started`` is durable before the adapter is called; an interrupted effect is observed
        before any retry; ``approval=True`` gates it on a scoped approval; ``observe_first=True``
        observes before the first apply (for effects an earlier system or task may have made).
        ``retry`` and ``timeout_s`` override the run's for this effect: past ``timeout_s`` the
        effect is uncertain and observed (``apply`` then runs in a worker thread).
        """
        step = self._effect_step(step_id, action, payload, approval, observe_first)
        return self._engine.effect(step, retry=retry, timeout_s=timeout_s).result

    def map(
        self,
        step_prefix: str,
        action: str,
        payloads: Sequence[Mapping[str, Any]],
        *,
        approval: bool = False,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
        max_parallel: int | None = None,
    ) -> list[JSONValue]:
        """Make one effect per payload at once (step ids ``<step_prefix>/0``, ``/1``, ...), at most
        ``max_parallel`` at a time (else the function's); return their results in order.

        Each is an ``effect`` with its own key, digest, approval and attempts; the adapters run in
        worker threads, and the starts that become ready together share one commit. If one stops
        the run (say, it awaits approval), the others in flight settle and nothing new starts."""
        if not isinstance(step_prefix, str) or not step_prefix:
            raise InvalidInputError("map needs a non-empty step prefix")
        steps = [
            self._effect_step(f"{step_prefix}/{index}", action, payload, approval, False) for index, payload in enumerate(payloads)
        ]
        engine = self._engine
        records = engine.run_parallel(
            [engine.effect_steps(step, retry=retry, timeout_s=timeout_s) for step in steps],
            max_parallel if max_parallel is not None else engine.max_parallel,
        )
        return [record.result for record in records]

    def call(
        self,
        step_id: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        replay: str = "strict",
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call ``fn(*args, **kwargs)`` once and record its JSON result; replay it afterwards.

        ``TransientError`` (and running past ``timeout_s``) is retried with backoff under the
        persistent attempt counter; ``PermanentError`` stops the run ``blocked``; any other
        exception is recorded and raised into the function as ``CallFailed``, identically on every
        replay. ``replay="by-id"`` accepts a recorded result even if the arguments changed (say, a
        timestamp among them).
        """
        if inspect.iscoroutinefunction(fn):
            raise InvalidInputError(f"step {step_id!r}: {qualified_name(fn)} is async; call it from an async durable function")
        step = self._call_step(step_id, fn, args, kwargs, replay)
        record = self._engine.call(step, lambda: fn(*args, **kwargs), retry=retry, timeout_s=timeout_s)
        return self._call_result(step_id, record)

    def sleep(self, step_id: str, seconds: float) -> None:
        """Wait ``seconds`` durably: the wake time is recorded when the step is first reached.

        A wait longer than ``Limits.max_block_s`` stops the run ``sleeping`` with ``wake_at``; run
        the task again at or after that time (a worker does it by itself)."""
        self._engine.timer(self._sleep_step(step_id, seconds), float(seconds))

    def ask(self, step_id: str, question: str, *, choices: Sequence[JSONValue] | None = None) -> JSONValue:
        """A person's answer, as a value. Until it is given the run stops ``awaiting-input``.

        ``longrun answer STORE TASK STEP VALUE`` records it, bound to the task, the plan, the step and
        the question's digest, single use, through the same sources as approvals (the store, strict
        files, signed records). With ``choices``, an answer outside them is refused and asked again."""
        return self._ask(step_id, question, choices)

    def child(self, task_id: str, function: "DurableFunction[Any]", *args: Any, **kwargs: Any) -> Any:
        """Start or resume another durable task (its own lease and ledger) and return its result.

        While the child is not done, this run stops ``waiting-on-child`` with the child's next
        action; run it again once the child has moved on. A child that ended without finishing is
        raised into the function as ``CallFailed``. The parent's record names the child task."""
        step_id, record = self._child_record(task_id, function, args, kwargs)
        if record.state is EffectState.PLANNED:
            record = self._child_settled(step_id, task_id, function.run_child(task_id, self.task_id, args, kwargs))
        return self._child_result(step_id, record)


class AsyncRun(_Steps):
    """What an ``async`` durable function receives: ``Run``'s steps, awaited.

    Steps awaited together run at once (``asyncio.gather(*(run.effect(...) for ...))``), at most
    ``max_parallel`` at a time, each with its own key, digest, approval and attempts; the starts
    that become ready together share one commit. Adapters may be async (``apply`` and ``observe``
    coroutines) or synchronous (run in worker threads). If one step stops the run, the others in
    flight settle, and nothing new starts.
    """

    async def effect(
        self,
        step_id: str,
        action: str,
        payload: Mapping[str, Any],
        *,
        approval: bool = False,
        observe_first: bool = False,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
    ) -> JSONValue:
        """``Run.effect``, awaited. Past ``timeout_s`` (else the run's, else the retry policy's
        ``deadline_s``) the apply is cancelled, and the effect is uncertain and observed."""
        step = self._effect_step(step_id, action, payload, approval, observe_first)
        engine = self._engine
        record = await engine.driver.step(engine.effect_steps(step, retry=retry, timeout_s=timeout_s))
        return record.result

    async def call(
        self,
        step_id: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        replay: str = "strict",
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """``Run.call``, awaited; ``fn`` may be a coroutine function (awaited) or a plain one (run in
        a worker thread, so that it does not block the other steps)."""
        step = self._call_step(step_id, fn, args, kwargs, replay)
        engine = self._engine
        steps = engine.call_steps(step, lambda: fn(*args, **kwargs), retry=retry, timeout_s=timeout_s, awaitable=is_async_callable(fn))
        return self._call_result(step_id, await engine.driver.step(steps))

    async def sleep(self, step_id: str, seconds: float) -> None:
        """``Run.sleep``, awaited."""
        step = self._sleep_step(step_id, seconds)
        engine = self._engine
        await engine.driver.step(engine.timer_steps(step, float(seconds)))

    async def ask(self, step_id: str, question: str, *, choices: Sequence[JSONValue] | None = None) -> JSONValue:
        """``Run.ask``: reads the answer (it never waits for a person; without one the run stops)."""
        return self._ask(step_id, question, choices)

    async def child(self, task_id: str, function: "DurableFunction[Any]", *args: Any, **kwargs: Any) -> Any:
        """``Run.child``, awaited: an async child runs on this event loop, a synchronous one in a thread."""
        step_id, record = self._child_record(task_id, function, args, kwargs)
        if record.state is EffectState.PLANNED:
            outcome = await function.arun_child(task_id, self.task_id, args, kwargs)
            record = self._child_settled(step_id, task_id, outcome)
        return self._child_result(step_id, record)


class _FunctionPlan:
    """The ``Plan`` of a durable function: its code is the plan, its arguments pin it."""

    def __init__(
        self, function: "DurableFunction[Any]", arguments: dict[str, JSONValue], contract: RunContract, parent: str | None = None
    ):
        self._function = function
        self._arguments = arguments
        self._payload: dict[str, JSONValue] = {"function": function.name, **arguments}
        if parent is not None:  # a child task names its parent; the link is not part of the plan digest
            self._payload["parent"] = parent
        self.digest = digest_of({"contract": contract.to_json(), "function": function.name, "arguments": arguments})

    def initial(self, engine: Engine, state: RunState) -> None:
        engine.plan(Step(FUNCTION_STEP, FUNCTION_STEP, self._payload))

    def accept(self, engine: Engine, state: RunState) -> None:
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
        self._returned(engine, await self._function.fn(AsyncRun(engine, self._function), *args, **kwargs))

    def _args(self) -> tuple[list[JSONValue], dict[str, JSONValue]]:
        args = self._arguments["args"]
        kwargs = self._arguments["kwargs"]
        assert isinstance(args, list) and isinstance(kwargs, dict)
        return args, kwargs

    def _returned(self, engine: Engine, value: object) -> None:
        result = ensure_json(value, what=f"the return value of {self._function.name}")
        if engine.state.effects[FUNCTION_STEP].state is not EffectState.VERIFIED:
            engine.complete(FUNCTION_STEP, result)
        raise engine.finish([FUNCTION_STEP])

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


class _Recording:
    """The plan ``DurableFunction.enqueue`` runs: the task's first revision is committed as a first
    run commits it, and the function is not called (a worker or ``run`` calls it later)."""

    def __init__(self, plan: _FunctionPlan):
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
            return _run_coroutine(engine.arun(self), f"starting task {engine.task_id!r}", instead="`await fn.astart(...)`")
        return engine.run(self)

    def progress(self, state: RunState) -> str:
        return self._plan.progress(state)

    def result(self, state: RunState) -> JSONValue:
        return None


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
        self, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, parent: str | None = None
    ) -> tuple[Engine, _FunctionPlan]:
        contract = self.contract_for(task_id)
        arguments = ensure_json({"args": list(args), "kwargs": dict(kwargs)}, what=f"arguments of {self.name}")
        assert isinstance(arguments, dict)
        return Engine(contract, **self._options), _FunctionPlan(self, arguments, contract, parent)

    @property
    def is_async(self) -> bool:
        """Whether the function is ``async def`` (its steps are awaited: ``AsyncRun``)."""
        return inspect.iscoroutinefunction(self.fn)

    def run(self, task_id: str, *args: Any, **kwargs: Any) -> RunOutcome:
        """Start the task with these arguments, or resume it; return why it stopped.

        An async function is run on an event loop of its own (``asyncio.run``); from async code,
        ``await fn.arun(...)`` instead."""
        if self.is_async:
            return _run_coroutine(self.arun(task_id, *args, **kwargs), f"{self.name}.run")
        engine, plan = self._plan(task_id, args, kwargs)
        return engine.run(plan)

    async def arun(self, task_id: str, *args: Any, **kwargs: Any) -> RunOutcome:
        """``run``, awaited: an async function runs on this event loop, a synchronous one in a
        worker thread (so that many tasks can run side by side)."""
        return await self._arun(task_id, args, kwargs, None)

    async def _arun(self, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any], parent: str | None) -> RunOutcome:
        engine, plan = self._plan(task_id, args, kwargs, parent=parent)
        if not self.is_async:
            return await asyncio.to_thread(engine.run, plan)
        return await engine.arun(plan)

    async def arun_child(self, task_id: str, parent: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> RunOutcome:
        """``run_child``, awaited."""
        return await self._arun(task_id, args, kwargs, parent)

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
        from .stores._queue import open_queue  # only a fleet needs the queue's tables

        engine, plan = self._plan(task_id, tuple(args), dict(kwargs or {}))
        queue = open_queue(engine.store)
        try:
            queue.ensure()  # the queue's triggers exist before the first record, so nothing is missed
            created = self._record(engine, plan)
            queue.enqueue(task_id, self.name, priority=priority)
        finally:
            queue.close()
        return created

    def _record(self, engine: Engine, plan: _FunctionPlan) -> bool:
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
            outcome = _Recording(plan).record(engine)
            if outcome.status is Status.RUNNING:
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
        unknown = sorted(set(options) - set(self._options))
        if unknown:
            raise InvalidInputError(f"unknown engine options {unknown}; known: {sorted(self._options)}")
        merged = {**self._options, **options}
        Engine(self._contract, **merged)  # validates them now, not at the first run
        clone = copy.copy(self)
        clone._options = merged
        return clone

    def run_child(self, task_id: str, parent: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> RunOutcome:
        """``run`` for a child task of ``parent`` (``Run.child``): its first record names the parent."""
        if self.is_async:
            return _run_coroutine(self.arun_child(task_id, parent, args, kwargs), f"child {task_id!r}")
        engine, plan = self._plan(task_id, args, kwargs, parent=parent)
        return engine.run(plan)

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
    owner: str | None = None,
    clock: Clock | None = None,
    limits: Limits | None = None,
    retry: RetryPolicy | None = None,
    lease_ttl_s: float = 30.0,
    approvals: ApprovalSource | None = None,
    cancellations: CancellationSource | None = None,
    on_event: EventHook | None = None,
    timeout_s: float | None = None,
    max_parallel: int = 16,
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
        base = contract or RunContract(
            "durable-function",
            goal or f"run {qualified_name(fn)} to completion",
            allowed_actions=tuple(allowed_actions),
            forbidden_actions=tuple(forbidden_actions),
        )
        options: dict[str, Any] = dict(
            store=store,
            adapters=dict(adapters or {}),
            owner=owner,
            clock=clock,
            limits=limits,
            retry=retry,
            lease_ttl_s=lease_ttl_s,
            approvals=approvals,
            cancellations=cancellations,
            on_event=on_event,
            timeout_s=timeout_s,
            max_parallel=max_parallel,
            asynchronous=inspect.iscoroutinefunction(fn),
        )
        Engine(base, **options)  # validates the options now, not at the first run
        return DurableFunction(fn, base, options)

    return decorate


def _run_coroutine(coroutine: Any, what: str, *, instead: str = "`await fn.arun(...)`") -> RunOutcome:
    """Run an async function's task from synchronous code, on an event loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)  # type: ignore[no-any-return]
    coroutine.close()
    raise InvalidInputError(f"{what}: an event loop is running in this thread; use {instead}")
