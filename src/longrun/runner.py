"""The declared-plan face: ``Runner(contract, steps, ...)`` walks a plan known up front through the engine.

``Runner(contract, steps, store=..., adapters=...).run()`` takes the task's lease, recovers, and
applies the plan's effects in order (or, for steps that say ``after=``, each as soon as the steps
it comes after are verified, up to ``max_parallel`` at once) until the run is done or reaches a legal stop,
which it returns as a ``RunOutcome`` with one safe next action. Call it again (after a crash, an
approval, a backoff) and it continues where the durable state says, never repeating a verified
effect. Every rule of the run lives in ``longrun.engine``; this module only says what the plan is.

The plan may grow: a task started with steps ``[a, b]`` may be run with ``[a, b, c]`` (the new
plan digest is recorded, and pending approval requests are issued again under it). Any other
change (a step changed, removed or reordered, another contract) stops ``plan-mismatch`` before
anything is written.

The durability rules (intent persisted before ``apply``, observation before any retry, fresh
cancellation and approvals, the fenced lease) are the engine's: see ``longrun.engine``.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
from typing import Mapping, Sequence, Unpack

from .budget import Limits
from .canonical import JSONValue
from .clock import SystemClock
from .contract import RunContract, Step, plan_digest, plan_prefix_digests, validate_plan
from .engine import Engine, EngineOptions, Stop, default_owner, is_async_callable, procedures, utc
from .envelope import PlanOutline, RunState
from .errors import InvalidInputError, UnknownActionError
from .ledger import EffectRecord, EffectState
from .outcome import TERMINAL, RunOutcome
from .protocols import AnyEffectAdapter, Clock, Store

__all__ = ["Runner", "SystemClock", "default_owner", "utc"]

_after_of = operator.attrgetter("after")
_action_of = operator.attrgetter("action")


class Runner:
    """Runs a plan declared up front: ``Runner(contract, steps, store=..., adapters=...).run()``.

    Each call of ``run()`` is a recovery followed by as much progress as the run may make now. The
    other keyword arguments configure the engine (``longrun.engine.EngineOptions``: ``owner``,
    ``clock``, ``limits``, ``retry``, ``lease_ttl_s``, the ``approvals`` / ``cancellations`` sources,
    ``on_event``, ``timeout_s``, and ``max_parallel``, the steps in flight at once when the plan
    says ``after=``). ``await runner.arun()`` runs it on the caller's event loop; adapters may
    then be async. ``run()`` with async adapters runs an event loop of its own.
    """

    def __init__(
        self,
        contract: RunContract,
        steps: Sequence[Step],
        *,
        store: Store,
        adapters: Mapping[str, AnyEffectAdapter],
        **options: Unpack[EngineOptions],
    ):
        self.steps = validate_plan(contract, steps)
        adapter_map = adapters if isinstance(adapters, Mapping) else {}
        self.asynchronous = any(is_async_callable(getattr(a, "apply", None)) or is_async_callable(getattr(a, "observe", None)) for a in adapter_map.values())
        self.parallel = list(map(_after_of, self.steps)).count(None) != len(self.steps)  # passes in C: plans are long
        self.engine = Engine(contract, store=store, adapters=adapters, asynchronous=self.asynchronous, **options)
        actions = dict.fromkeys(map(_action_of, self.steps))
        for action in actions:
            if action not in self.engine.config.adapters:
                step = next(step for step in self.steps if step.action == action)
                raise UnknownActionError(
                    f"step {step.step_id!r} uses action {action!r}, which has no adapter (have: {sorted(self.engine.config.adapters)})"
                )
        self.contract = contract
        self.plan_digest = plan_digest(contract, self.steps)
        self.refusals = [reason for reason in map(contract.action_refusal, actions) if reason]

    @property
    def task_id(self) -> str:
        return self.contract.task_id

    @property
    def store(self) -> Store:
        return self.engine.config.store

    @property
    def owner(self) -> str:
        return self.engine.config.owner

    @property
    def clock(self) -> Clock:
        return self.engine.config.clock

    @property
    def limits(self) -> Limits:
        return self.engine.config.limits

    def run(self) -> RunOutcome:
        """Recover and advance the run as far as it may go now; return why it stopped."""
        if self.refusals:
            return self._refuse()
        if self.asynchronous:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return asyncio.run(self.arun())
            raise InvalidInputError("Runner.run with async adapters inside a running event loop: use `await runner.arun()`")
        return self.engine.run(_DeclaredPlan(self))

    async def arun(self) -> RunOutcome:
        """``run``, awaited on the caller's event loop: steps that may run at once do (``after=``),
        async adapters are awaited and synchronous ones run in worker threads."""
        if self.refusals:
            return self._refuse()
        return await self.engine.arun(_DeclaredPlan(self))

    def _refuse(self) -> RunOutcome:
        return self.engine.refuse(self.refusals, "change the plan so every step's action is allowed by the run contract; nothing was run")


def plan_differences(steps: Sequence[Step], state: RunState) -> list[str]:
    """What differs between ``steps`` and the plan ``state`` recorded: steps added, removed or
    reordered, a step's action or payload digest; else the contract or a step's settings."""
    outline = state.plan_outline
    by_id = {step.step_id: step for step in steps}
    differences = []
    if outline is not None:
        removed = [step_id for step_id in outline.steps if step_id not in by_id]
        added = [step.step_id for step in steps if step.step_id not in outline.steps]
        if removed:
            differences.append(f"recorded steps missing from this plan: {removed}")
        if added:
            differences.append(f"steps that are not in the recorded plan: {added}")
        if [sid for sid in outline.steps if sid in by_id] != [step.step_id for step in steps if step.step_id in outline.steps]:
            differences.append(f"the order of the steps (recorded {list(outline.steps)})")
        for step_id, action in zip(outline.steps, outline.actions):
            if step_id in by_id and by_id[step_id].action != action:
                differences.append(f"step {step_id!r}: recorded action {action!r}, this plan {by_id[step_id].action!r}")
    for step in steps:
        record = state.effects.get(step.step_id)
        static = step.static_payload
        if record is not None and static is not None and record.payload_digest != static[1]:
            differences.append(f"step {step.step_id!r}: recorded payload digest {record.payload_digest}, this plan {static[1]}")
    return differences or [
        "no step differs in id, order, action or payload: the run contract (goal, actions, completion evidence) "
        "or a step's settings (key, approval, observe_first, retry) differ"
    ]


class _DeclaredPlan:
    """The ``Plan`` of a ``Runner``: its steps, in order, then ``done``."""

    def __init__(self, runner: Runner):
        self._runner = runner
        self.digest = runner.plan_digest

    def initial(self, engine: Engine, state: RunState) -> None:
        state.plan_outline = PlanOutline.of(self._runner.steps)  # so a reader knows what remains

    def accept(self, engine: Engine, state: RunState) -> None:
        if state.plan_digest == self.digest:
            if state.plan_outline is None and state.status not in TERMINAL:
                # A state written before outlines were recorded: it goes out with the next commit.
                state.plan_outline = PlanOutline.of(self._runner.steps)
            return
        runner = self._runner
        grown_from = None if state.status in TERMINAL else plan_prefix_digests(runner.contract, runner.steps).get(state.plan_digest)
        if grown_from is None or grown_from == len(runner.steps):
            raise engine.record(
                procedures.mismatch,
                f"{'; '.join(plan_differences(runner.steps, state))}; recorded plan digest {state.plan_digest}, this plan's {self.digest}",
                f"run the task with the plan it was started with (digest {state.plan_digest}), or with that plan followed "
                "by new steps; or, to move to a new task id, mark every step observe_first=True and keep its effect key "
                f"(Step(..., key='{engine.config.task_id}/<step id>') unless it has one) so effects already made are observed, not repeated",
            )
        engine.record(procedures.record_plan_growth, state, grown_from, len(runner.steps))
        state.plan_outline = PlanOutline.of(runner.steps)

    def drive(self, engine: Engine) -> None:
        if self._runner.parallel:
            engine.concurrently(lambda driver: self._graph(engine), engine.config.max_parallel)
        else:
            steps = self._runner.steps
            for step in itertools.islice(steps, engine.record(procedures.verified_prefix, steps), None):  # verified ones would return at once
                engine.drive(procedures.effect, step, retry=step.retry, timeout_s=step.timeout_s)
        raise self._finish(engine)

    async def adrive(self, engine: Engine) -> None:
        await self._graph(engine)
        raise await engine.driver.run(engine.steps(procedures.finish, self._required()))

    def _finish(self, engine: Engine) -> Stop:
        return engine.drive(procedures.finish, self._required())

    def _required(self) -> list[str]:
        return list(self._runner.contract.completion_evidence or [step.step_id for step in self._runner.steps])

    async def _graph(self, engine: Engine) -> None:
        """Start every step whose steps before are verified, up to ``max_parallel`` at once (the
        driver's bound), in plan order among the ready ones. A step that waits (for an approval, a
        backoff) holds back only the steps after it; after any other stop or failure nothing more
        starts. The steps in flight settle, then the stop or failure is raised."""
        driver = engine.driver
        steps = self._runner.steps
        waiting_on: dict[str, set[str]] = {}
        followers: dict[str, list[str]] = {step.step_id: [] for step in steps}
        by_id = {step.step_id: step for step in steps}
        for index, step in enumerate(steps):
            before = step.after if step.after is not None else ((steps[index - 1].step_id,) if index else ())
            waiting_on[step.step_id] = set(before)
            for name in before:
                followers[name].append(step.step_id)
        ready = [step.step_id for step in steps if not waiting_on[step.step_id]]
        position = {step.step_id: index for index, step in enumerate(steps)}
        running: dict[asyncio.Task[EffectRecord], str] = {}
        failure: BaseException | None = None
        while ready or running:
            while ready and (failure is None or (isinstance(failure, Stop) and failure.waits)) and len(running) < engine.config.max_parallel:
                step = by_id[ready.pop(0)]
                task = asyncio.ensure_future(driver.step(engine.steps(procedures.effect, step, retry=step.retry, timeout_s=step.timeout_s)))
                running[task] = step.step_id
            if not running:
                break
            finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                step_id = running.pop(task)
                error = task.exception()
                if error is not None:
                    if failure is None or (isinstance(error, Stop) and isinstance(failure, Stop) and error.outranks(failure)):
                        failure = error
                    continue
                for name in followers[step_id]:
                    waiting_on[name].discard(step_id)
                    if not waiting_on[name]:
                        ready.append(name)
            ready.sort(key=position.__getitem__)
        if failure is not None:
            raise failure

    def result(self, state: RunState) -> JSONValue:
        return None

    def progress(self, state: RunState) -> str:
        verified = sum(1 for record in state.effects.values() if record.state is EffectState.VERIFIED)
        return f"{verified} of {len(self._runner.steps)} effects verified"
