"""``Engine``: the facade every face drives: one invocation of a task (``run``, ``arun``) at a time.

``run`` and ``arun`` open an ``Invocation``, take the lease, run the recovery procedure, let the
face's ``Plan`` drive its steps, and close with the legal stop as a ``RunOutcome``. The steps
themselves are the module-level procedures of ``engine._steps`` and ``engine._effects``; the
facade hands each to the driver of the invocation under way (``SyncDriver``, or the
``AsyncDriver`` under ``arun`` and in parallel sections) and keeps nothing of its own but the
configuration (``EngineConfig``) and the run's I/O (``RunIO``). Not thread-safe: one invocation
at a time.
"""

from __future__ import annotations

import shlex
from typing import Awaitable, Callable, Mapping, Protocol, Sequence, TypeVar, Unpack

from ..budget import Limits, RetryPolicy
from ..canonical import JSONValue
from ..contract import RunContract, Step
from ..envelope import RunState
from ..errors import FencedError, InvalidInputError, UnknownActionError
from ..events import Reporter
from ..ledger import EffectRecord, EffectState
from ..outcome import RunOutcome, Status
from ..protocols import AnyEffectAdapter, CancellationSource, Clock, Store
from ..telemetry import ProgressReport
from . import _effects, _steps
from ._config import EngineConfig, EngineOptions, check_parallel
from ._drivers import AsyncDriver, SyncDriver, drive
from ._runio import RunIO
from ._invocation import Invocation, Stop
from ._ops import Steps

__all__ = ["AsyncPlan", "Engine", "Plan"]

T = TypeVar("T")

_VERIFIED = EffectState.VERIFIED


class Plan(Protocol):
    """What a face hands the engine: the digest that pins the plan, and how to drive it.

    ``digest`` is what approvals bind to. ``initial`` adds the records a first revision needs;
    ``accept`` checks a recorded state against the plan (raising a ``Stop`` on divergence, and may
    record an allowed change such as a grown plan); ``drive`` makes the steps through the engine
    and ends with ``Engine.finish``; ``result`` is the run's result for the outcome.
    """

    digest: str

    def initial(self, engine: "Engine", state: RunState) -> None: ...

    def accept(self, engine: "Engine", state: RunState) -> None: ...

    def drive(self, engine: "Engine") -> None: ...

    def result(self, state: RunState) -> JSONValue: ...

    def progress(self, state: RunState) -> str: ...


class AsyncPlan(Plan, Protocol):
    """A ``Plan`` the async driver can drive: ``adrive`` awaits its steps (``Engine.arun``)."""

    async def adrive(self, engine: "Engine") -> None: ...


class Engine:
    """The recovery procedure and the per-step rules for one task, driven by a face's ``Plan``.

    ``run(plan)`` is one invocation: lease, load and validate, reconcile, then the plan drives its
    steps through ``effect``, ``call``, ``timer`` and ``ask``, each of which reads cancellation
    fresh, enforces the budgets, persists the intent before acting and settles by observation.
    """

    def __init__(
        self,
        contract: RunContract,
        *,
        store: Store,
        adapters: Mapping[str, AnyEffectAdapter],
        asynchronous: bool = False,
        **options: Unpack[EngineOptions],
    ):
        self.config = EngineConfig.of(contract, store=store, adapters=adapters, asynchronous=asynchronous, **options)
        config = self.config
        self.contract: RunContract = config.contract
        self.task_id: str = config.contract.task_id
        self.store: Store = config.store
        self.cancellations: CancellationSource = config.cancellations
        self.adapters: Mapping[str, AnyEffectAdapter] = config.adapters
        self.owner: str = config.owner
        self.clock: Clock = config.clock
        self.limits: Limits = config.limits
        self.max_parallel: int = config.max_parallel
        self._reporter = Reporter(contract.task_id, options.get("on_event"))
        self._io = RunIO(self.config)
        self._inv: Invocation | None = None
        self._sync: SyncDriver | None = None
        self._async: AsyncDriver | None = None

    # -- configuration, as the faces read it (plain attributes: read on every step) --------------------------

    @property
    def store_spec(self) -> str:
        """How a command names this engine's store in a next action (``<store>`` if it cannot be named)."""
        spec = getattr(self.store, "spec", None)
        return shlex.quote(spec) if isinstance(spec, str) and spec else "<store>"

    @property
    def asynchronous(self) -> bool:
        return self.config.asynchronous

    def adapter_for(self, action: str, *, step_id: str) -> AnyEffectAdapter:
        adapter = self.adapters.get(action)
        if adapter is None:
            raise UnknownActionError(
                f"step {step_id!r} uses action {action!r}, which has no adapter (have: {sorted(self.adapters)})"
            )
        return adapter

    # -- the invocation under way ---------------------------------------------------------------------

    @property
    def invocation(self) -> Invocation:
        if self._inv is None:
            raise InvalidInputError("no invocation is under way")
        return self._inv

    @property
    def state(self) -> RunState:
        """The working state of the invocation under way."""
        inv = self._inv
        if inv is None:
            raise InvalidInputError("no invocation is under way")
        return inv.state

    @property
    def plan_digest(self) -> str:
        """The digest the invocation under way is pinned to (what approvals bind to); a plan may
        adopt the recorded one while it accepts the state (a task recorded under an older name)."""
        return self.invocation.plan_digest

    @plan_digest.setter
    def plan_digest(self, digest: str) -> None:
        self.invocation.plan_digest = digest

    @property
    def cancelled_with(self) -> tuple[str, ...]:
        """Other tasks whose cancellation record cancels this run too (a child's ancestors, up to
        the first detached link), read through the same source after the task's own; set by the plan."""
        return self.invocation.cancelled_with

    @cancelled_with.setter
    def cancelled_with(self, ancestors: tuple[str, ...]) -> None:
        self.invocation.cancelled_with = tuple(ancestors)

    @property
    def driver(self) -> AsyncDriver:
        """The async driver of the invocation under way (``Engine.arun``)."""
        if self._async is None:
            raise InvalidInputError("no async invocation is under way: async steps need `await fn.arun(...)` or Runner.arun")
        return self._async

    def _drive(self, steps: Steps[T]) -> T:
        """A step procedure driven to its end from synchronous code, in this thread."""
        sync = self._sync
        assert sync is not None, "no invocation is under way"
        with self._io.commit_lock:  # not while the async driver's I/O thread commits this state
            return drive(steps, sync.perform)

    # -- the steps, from synchronous code ----------------------------------------------------------------

    def effect(
        self, step: Step, *, retry: RetryPolicy | None = None, timeout_s: float | None = None, on_exhausted: str = "stop"
    ) -> EffectRecord:
        """Make one step's effect verified, or stop; return its verified record (``_effects.effect``;
        with ``on_exhausted="raise"``, its failed record once its attempts ran out)."""
        inv, sync = self._inv, self._sync
        assert inv is not None and sync is not None, "no invocation is under way"
        recorded = inv.state.effects.get(step.step_id)
        if recorded is not None and recorded.state is _VERIFIED:
            return recorded  # replay: nothing to wait for
        with self._io.commit_lock:  # not while the async driver's I/O thread commits this state
            return drive(_effects.effect(inv, step, retry=retry, timeout_s=timeout_s, on_exhausted=on_exhausted), sync.perform)

    def effect_steps(
        self, step: Step, *, retry: RetryPolicy | None = None, timeout_s: float | None = None, on_exhausted: str = "stop"
    ) -> Steps[EffectRecord]:
        """``effect`` as a step procedure, for a driver to run."""
        return _effects.effect(self.invocation, step, retry=retry, timeout_s=timeout_s, on_exhausted=on_exhausted)

    def drive(self, steps: Steps[T]) -> T:
        """Drive a step procedure of the engine (``engine.send``, ``engine.receive``, ...) over
        ``invocation`` to its end from synchronous code; an async face awaits ``driver.step`` instead."""
        return self._drive(steps)

    def verified_prefix(self, steps: Sequence[Step]) -> int:
        return _effects.verified_prefix(self.invocation, steps)

    def call(self, step: Step, invoke: Callable[[], object], *, retry: RetryPolicy | None = None, timeout_s: float | None = None) -> EffectRecord:
        """Run ``invoke`` once for a step that is not an external effect (``_steps.call``)."""
        return self._drive(_steps.call(self.invocation, step, invoke, retry=retry, timeout_s=timeout_s))

    def call_steps(
        self, step: Step, invoke: Callable[[], object], *, retry: RetryPolicy | None = None, timeout_s: float | None = None, awaitable: bool = False
    ) -> Steps[EffectRecord]:
        return _steps.call(self.invocation, step, invoke, retry=retry, timeout_s=timeout_s, awaitable=awaitable)

    def timer(self, step: Step, seconds: float) -> EffectRecord:
        """A durable wait (``_steps.timer``)."""
        return self._drive(_steps.timer(self.invocation, step, seconds))

    def timer_steps(self, step: Step, seconds: float) -> Steps[EffectRecord]:
        return _steps.timer(self.invocation, step, seconds)

    def ask(self, step: Step, choices: Sequence[JSONValue] | None) -> EffectRecord:
        """A person's answer as a value (``_steps.ask``)."""
        return self._drive(_steps.ask(self.invocation, step, choices))

    def ask_steps(self, step: Step, choices: Sequence[JSONValue] | None) -> Steps[EffectRecord]:
        return _steps.ask(self.invocation, step, choices)

    def report_progress(self, done: float, total: float | None, note: str | None) -> ProgressReport:
        """Record how far the run has come (``_steps.report_progress``): state, not a step."""
        return self._drive(_steps.report_progress(self.invocation, done, total, note))

    def report_progress_steps(self, done: float, total: float | None, note: str | None) -> Steps[ProgressReport]:
        return _steps.report_progress(self.invocation, done, total, note)

    def check_cancellation(self) -> None:
        """Read the task's cancellation record fresh and stop if it says so (or cannot be trusted)."""
        self._drive(_steps.check_cancellation(self.invocation))

    def plan(self, step: Step) -> EffectRecord:
        """The step's record, planned now (it goes out with the next commit) unless it exists."""
        with self._io.commit_lock:  # not while the async driver's I/O thread commits this state
            return _steps.plan(self.invocation, step)

    def complete(self, step_id: str, result: JSONValue, *, failed: bool = False) -> EffectRecord:
        """Settle a planned internal step (a child task's result, a function's return value)."""
        with self._io.commit_lock:
            return _steps.complete(self.invocation, step_id, result, failed=failed)

    def wait(self, status: Status, next_action: str, *, wake_at: float | None = None) -> Stop:
        """A stop that waits for something outside the run (a person, a child task): committed."""
        return self._drive(_steps.wait(self.invocation, status, next_action, wake_at=wake_at))

    def finish(self, required: Sequence[str]) -> Stop:
        """The stop ``done``, if every step in ``required`` is verified and nothing is in flight."""
        return self._drive(_steps.finish(self.invocation, required))

    def finish_steps(self, required: Sequence[str]) -> Steps[Stop]:
        return _steps.finish(self.invocation, required)

    def refused_action(self, step_id: str, reason: str) -> Stop:
        """Stop ``unsafe-to-continue`` before a step whose action the contract does not allow."""
        return self._drive(_steps.refused_action(self.invocation, step_id, reason))

    def mismatch(self, detail: str, next_action: str) -> Stop:
        """A ``plan-mismatch`` stop: the code or plan asks for something other than what was recorded."""
        return _steps.mismatch(self.invocation, detail, next_action)

    def record_plan_growth(self, state: RunState, recorded_steps: int, steps: int) -> None:
        """Adopt a plan that appends steps to the recorded one (``_steps.record_plan_growth``)."""
        _steps.record_plan_growth(self.invocation, state, recorded_steps, steps)

    def run_parallel(self, procedures: Sequence[Steps[T]], max_parallel: int) -> list[T]:
        """Run step procedures at once from synchronous code (``Run.map``); their values in order."""
        check_parallel(max_parallel)
        if self._async is not None:
            raise InvalidInputError("steps in parallel are already running: await them instead")
        sync = self._sync
        assert sync is not None
        return sync.parallel(procedures, max_parallel)

    def concurrently(self, work: Callable[[AsyncDriver], Awaitable[T]], max_parallel: int) -> T:
        """Await ``work`` from synchronous code, on an event loop of its own with an async driver
        (adapters run in worker threads). If a step stops the run, the others settle first."""
        check_parallel(max_parallel)
        if self._async is not None:
            raise InvalidInputError("steps in parallel are already running: await them instead")
        sync = self._sync
        assert sync is not None
        return sync.concurrently(work, max_parallel, attach=self._attach)

    def _attach(self, driver: AsyncDriver | None) -> None:
        self._async = driver

    # -- one invocation ---------------------------------------------------------------------------------

    def refuse(self, reasons: Sequence[str], next_action: str) -> RunOutcome:
        """An ``unsafe-to-continue`` outcome decided before the lease is taken: nothing was run."""
        inv = self._begin("")
        for reason in reasons:
            inv.evidence.unknown("contract", reason)
        return inv.outcome(Status.UNSAFE_TO_CONTINUE, next_action)

    def _begin(self, digest: str) -> Invocation:
        config = self.config
        inv = Invocation(
            task_id=config.task_id,
            plan_digest=digest,
            clock=config.clock,
            limits=config.limits,
            retry=config.retry,
            timeout_s=config.timeout_s,
            adapters=config.adapters,
            max_parallel=config.max_parallel,
            reporter=self._reporter,
            monotonic_clock=config.monotonic_clock,
            timeline_clock=config.timeline_clock,
            signed_approvals=self._io.signed_approvals,
            signed_cancellations=self._io.signed_cancellations,
            store_spec=self.store_spec,
        )
        self._inv = inv
        self._sync = SyncDriver(self._io, inv)
        self._async = None
        return inv

    def run(self, plan: Plan) -> RunOutcome:
        """Recover and let ``plan`` advance the run as far as it may go now; return why it stopped."""
        with self._reporter.logging():  # what is logged meanwhile in this thread names the run
            return self._run(plan)

    def _run(self, plan: Plan) -> RunOutcome:
        if self.asynchronous:
            raise InvalidInputError("this engine has async adapters: use `await engine.arun(plan)`")
        inv = self._begin(plan.digest)
        self._reporter.begin(self.owner)
        early = self._io.acquire(inv, plan.progress)
        if early is not None:
            return early
        keeper = self._io.keeper
        assert keeper is not None
        try:
            with keeper:
                status, next_action = self._recover_and_run(inv, plan)
        except FencedError as exc:
            return self._fenced(inv, exc)
        except BaseException:
            self._io.release(inv, quiet=True)
            raise
        if status is not Status.LEASE_LOST:
            self._io.release(inv, quiet=False)
        return self._close(inv, plan, status, next_action)

    def _recover_and_run(self, inv: Invocation, plan: Plan) -> tuple[Status, str]:
        try:
            self._drive(self._recover(inv, plan))
            plan.drive(self)
        except Stop as stop:
            inv.wake_at = stop.wake_at
            return stop.status, stop.next_action
        except Exception:
            self._io.keep_settled(inv)
            raise
        raise AssertionError("the plan ended without a stop")  # pragma: no cover

    def _recover(self, inv: Invocation, plan: Plan) -> Steps[None]:
        lease = self._io.lease
        assert lease is not None
        return _effects.recover(inv, lease, lambda state: plan.initial(self, state), lambda state: plan.accept(self, state))

    async def arun(self, plan: AsyncPlan) -> RunOutcome:
        """``run`` under the async driver: the plan's steps are awaited, parallel ones side by side
        (at most ``max_parallel`` at once), the starts that become ready together share a commit,
        and the store and control I/O of the steps it awaits runs off the event loop."""
        with self._reporter.logging():  # what is logged meanwhile in this task names the run
            return await self._arun(plan)

    async def _arun(self, plan: AsyncPlan) -> RunOutcome:
        inv = self._begin(plan.digest)
        self._reporter.begin(self.owner)
        async with AsyncDriver(self._io, inv, self.max_parallel) as driver:
            early = await driver.call_io(self._io.acquire, inv, plan.progress)
            if early is not None:
                return early
            keeper = self._io.keeper
            assert keeper is not None
            try:
                with keeper:
                    self._async = driver
                    try:
                        status, next_action = await self._arecover_and_run(inv, plan, driver)
                    finally:
                        self._async = None
            except FencedError as exc:
                return self._fenced(inv, exc)
            except BaseException:
                self._io.release(inv, quiet=True)
                raise
            if status is not Status.LEASE_LOST:
                await driver.call_io(lambda: self._io.release(inv, quiet=False))
        return self._close(inv, plan, status, next_action)

    async def _arecover_and_run(self, inv: Invocation, plan: AsyncPlan, driver: AsyncDriver) -> tuple[Status, str]:
        try:
            await driver.run(self._recover(inv, plan))
            await plan.adrive(self)
        except Stop as stop:
            await driver.settle()
            final = await driver.settle_stop(stop)
            inv.wake_at = final.wake_at
            return final.status, final.next_action
        except Exception:
            await driver.settle()
            await driver.call_io(self._io.keep_settled, inv)
            raise
        raise AssertionError("the plan ended without a stop")  # pragma: no cover

    def _fenced(self, inv: Invocation, exc: FencedError) -> RunOutcome:
        inv.evidence.observed("store", f"write refused: {exc}")
        inv.evidence.unknown("lease", "another runner took over this task; its progress is not known here")
        return inv.outcome(Status.LEASE_LOST, "nothing on this runner: the newer lease holder continues the run")

    def _close(self, inv: Invocation, plan: Plan, status: Status, next_action: str) -> RunOutcome:
        if inv.current is not None:
            inv.result = plan.result(inv.current)
        return inv.outcome(status, next_action)

