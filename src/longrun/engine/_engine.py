"""``Engine``: the facade every face drives: one invocation of a task (``run``, ``arun``) at a time.

``run`` and ``arun`` open an ``Invocation``, take the lease, run the recovery procedure, let the
face's ``Plan`` drive its steps, and close with the legal stop as a ``RunOutcome``. The steps
themselves are the module-level procedures of ``engine._steps`` and ``engine._effects``, which a
face names from ``engine.procedures``. The facade's steps API is narrow and the same for every
kind of step: ``steps(procedure, ...)`` binds one to the invocation under way for a driver,
``drive(procedure, ...)`` runs it to its end in this thread, ``record(rule, ...)`` applies a rule
with no I/O; ``driver`` is the async driver under ``arun``. The options are read from
``config`` (``EngineConfig``), the working state from ``invocation``. It keeps nothing of its own
but those and the run's I/O (``RunIO``). Not thread-safe: one invocation at a time.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Concatenate, Mapping, ParamSpec, Protocol, Sequence, TypeVar, Unpack

from ..canonical import JSONValue
from ..contract import RunContract
from ..envelope import RunState
from ..errors import CorruptStateError, FencedError, InvalidInputError, StorageError
from ..events import Reporter
from ..outcome import RunOutcome, Status
from ..protocols import AnyEffectAdapter, Store
from . import _effects, _failures
from ._config import EngineConfig, EngineOptions, check_parallel
from ._drivers import AsyncDriver, RunIO, SyncDriver, drive
from ._invocation import Invocation, Stop
from ._ops import Steps

__all__ = ["AsyncPlan", "Engine", "Plan"]

T = TypeVar("T")
P = ParamSpec("P")


class Plan(Protocol):
    """What a face hands the engine: the digest that pins the plan, and how to drive it.

    ``digest`` is what approvals bind to. ``initial`` adds the records a first revision needs;
    ``accept`` checks a recorded state against the plan (raising a ``Stop`` on divergence, and may
    record an allowed change such as a grown plan); ``drive`` makes the steps through the engine
    and ends with the stop of ``procedures.finish``; ``result`` is the run's result for the outcome.
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
        """Every option, checked once; the faces read the store, the clock, the task id and the rest here."""
        self._reporter = Reporter(contract.task_id, options.get("on_event"))
        self._io = RunIO(self.config)
        self._inv: Invocation | None = None
        self.invocation: Invocation
        """The working state of the invocation under way (its ``state``, ``plan_digest``,
        ``cancelled_with``): set when ``run`` or ``arun`` begins, a plain attribute read at every step."""
        self._sync: SyncDriver | None = None
        self._async: AsyncDriver | None = None

    # -- the steps API of the faces: a procedure of ``engine.procedures`` bound to the invocation -------

    def steps(self, procedure: Callable[Concatenate[Invocation, P], Steps[T]], *args: P.args, **kwargs: P.kwargs) -> Steps[T]:
        """``procedure(invocation, *args, **kwargs)``: a step procedure of the invocation under way,
        for a driver to run (``await engine.driver.step(...)`` or ``engine.run_parallel``)."""
        inv = self._inv
        if inv is None:
            raise InvalidInputError("no invocation is under way")
        return procedure(inv, *args, **kwargs)

    def drive(self, procedure: Callable[Concatenate[Invocation, P], Steps[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """``steps(procedure, ...)`` driven to its end from synchronous code, in this thread."""
        inv, sync = self._inv, self._sync
        if inv is None or sync is None:
            raise InvalidInputError("no invocation is under way")
        with self._io.commit_lock:  # not while the async driver's I/O thread commits this state
            return drive(procedure(inv, *args, **kwargs), sync.perform)

    def record(self, rule: Callable[Concatenate[Invocation, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``rule(invocation, ...)``: a rule that only reads or changes the working state (no I/O:
        ``procedures.plan``, ``complete``, ``mismatch``), under the commit lock."""
        inv = self._inv
        if inv is None:
            raise InvalidInputError("no invocation is under way")
        with self._io.commit_lock:  # not while the async driver's I/O thread commits this state
            return rule(inv, *args, **kwargs)

    @property
    def driver(self) -> AsyncDriver:
        """The async driver of the invocation under way (``Engine.arun``)."""
        if self._async is None:
            raise InvalidInputError("no async invocation is under way: async steps need `await fn.arun(...)` or Runner.arun")
        return self._async

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
            store_spec=config.store_spec,
        )
        self._inv = self.invocation = inv
        self._sync = SyncDriver(self._io, inv)
        self._async = None
        return inv

    def run(self, plan: Plan) -> RunOutcome:
        """Recover and let ``plan`` advance the run as far as it may go now; return why it stopped."""
        with self._reporter.logging():  # what is logged meanwhile in this thread names the run
            return self._run(plan)

    def _run(self, plan: Plan) -> RunOutcome:
        if self.config.asynchronous:
            raise InvalidInputError("this engine has async adapters: use `await engine.arun(plan)`")
        inv = self._begin(plan.digest)
        self._reporter.begin(self.config.owner)
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
            self.drive(self._recover, plan)
            plan.drive(self)
        except Stop as stop:
            final = self._io.settle_stop(inv, stop)  # a stop recorded and not yet committed is, now
            inv.wake_at = final.wake_at
            return final.status, final.next_action
        except Exception as exc:
            if self._records_failure(inv, exc):
                try:
                    self.drive(_failures.raised, exc)
                except Stop:  # the lease was lost meanwhile: nothing could be recorded; the error goes on
                    pass
            else:
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
        self._reporter.begin(self.config.owner)
        async with AsyncDriver(self._io, inv, self.config.max_parallel) as driver:
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
        except Exception as exc:
            await driver.settle()
            if self._records_failure(inv, exc):
                try:
                    await driver.run(_failures.raised(inv, exc))
                except Stop:  # the lease was lost meanwhile: nothing could be recorded; the error goes on
                    pass
            else:
                await driver.call_io(self._io.keep_settled, inv)
            raise
        raise AssertionError("the plan ended without a stop")  # pragma: no cover

    def _records_failure(self, inv: Invocation, exc: Exception) -> bool:
        """Whether ``exc`` is a failure of the plan's own code that is recorded (``engine._failures``):
        not the store's trouble (it could not be recorded), and only while the lease is held."""
        keeper = self._io.keeper
        return (
            inv.counts_failures
            and inv.current is not None
            and keeper is not None
            and keeper.failure is None
            and not isinstance(exc, (StorageError, CorruptStateError))
        )

    def _fenced(self, inv: Invocation, exc: FencedError) -> RunOutcome:
        inv.evidence.observed("store", f"write refused: {exc}")
        inv.evidence.unknown("lease", "another runner took over this task; its progress is not known here")
        return inv.outcome(Status.LEASE_LOST, "nothing on this runner: the newer lease holder continues the run")

    def _close(self, inv: Invocation, plan: Plan, status: Status, next_action: str) -> RunOutcome:
        if inv.current is not None:
            inv.result = plan.result(inv.current)
        return inv.outcome(status, next_action)

