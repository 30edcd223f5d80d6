"""The engine's layer the drivers call: ``perform`` for the synchronous driver, ``concurrently``
for steps side by side from synchronous code, and the stop of steps in parallel."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence, TypeVar, cast

from .._io import Apply, ApplyTimedOut, Commit, Gather, Invoke, Observe, Op, Sleep, Steps, call_in_thread, drive
from ..errors import InvalidInputError
from ..outcome import Status
from ..recovery import observe_safely, timed_out_observation

from ._base import EngineBase
from ._plans import Stop, check_parallel

if TYPE_CHECKING:
    from .._concurrency import AsyncDriver
    from ._engine import Engine

T = TypeVar("T")

__all__ = ["Driving"]


class Driving(EngineBase):
    """What the drivers call: ``perform`` waits for an operation a step procedure yields (the
    synchronous driver), ``concurrently`` runs step procedures side by side from synchronous code,
    and the async driver attaches itself and settles the stop of steps in parallel.
    """

    def perform(self, op: Op) -> Any:
        """Wait for ``op`` in this thread (the synchronous driver; the async one for what it does not await)."""
        if isinstance(op, Commit):
            self.flush()
            return None
        if isinstance(op, Observe):
            if op.timeout_s is None:
                return observe_safely(op.adapter, op.request)
            adapter, request = op.adapter, op.request
            try:
                return call_in_thread(lambda: observe_safely(adapter, request), op.timeout_s)
            except ApplyTimedOut as exc:
                return timed_out_observation(request, exc.timeout_s)
        if isinstance(op, Apply):
            adapter = op.adapter
            request = op.request
            if op.timeout_s is None:
                return adapter.apply(request)
            return call_in_thread(lambda: adapter.apply(request), op.timeout_s)
        if isinstance(op, Invoke):
            return op.fn() if op.timeout_s is None else call_in_thread(op.fn, op.timeout_s)
        if isinstance(op, Sleep):
            self._wait_without_charge(op.seconds)
            return None
        assert isinstance(op, Gather)
        if len(op.steps) > 1 and self._driver is None:
            # Several effects left in flight (by parallel steps): observed at once, in worker threads.
            return self.run_parallel(op.steps, op.limit)
        return [drive(steps, self.perform) for steps in op.steps]

    _perform = perform

    def flush(self) -> None:
        """Commit what the steps changed, if anything (a group commit under the async driver)."""
        if self._dirty:
            self._commit()

    @property
    def driver(self) -> "AsyncDriver":
        """The async driver of the invocation under way (``Engine.arun``)."""
        if self._driver is None:
            raise InvalidInputError("no async invocation is under way: async steps need `await fn.arun(...)` or Runner.arun")
        return self._driver

    def run_parallel(self, procedures: Sequence[Steps[T]], max_parallel: int) -> list[T]:
        """Run step procedures at once from synchronous code (``Run.map``); their values in order."""

        async def together(driver: AsyncDriver) -> list[T]:
            return list(await asyncio.gather(*(driver.step(steps) for steps in procedures)))

        return self.concurrently(together, max_parallel)

    def concurrently(self, work: Callable[["AsyncDriver"], Awaitable[T]], max_parallel: int) -> T:
        """Await ``work`` from synchronous code, on an event loop of its own with an async driver
        (adapters run in worker threads). If a step stops the run, the others settle first."""
        from .._concurrency import AsyncDriver

        check_parallel(max_parallel)
        if self._driver is not None:
            raise InvalidInputError("steps in parallel are already running: await them instead")

        async def main() -> T:
            async with AsyncDriver(cast("Engine", self), max_parallel) as driver:  # this layer is always part of an Engine
                return await driver.settled(work(driver))

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(main())
        raise InvalidInputError("parallel steps cannot run from synchronous code inside a running event loop: use the async face")

    def attach(self, driver: "AsyncDriver | None") -> None:
        """The async driver running this invocation's steps now, or None when it is done."""
        self._driver = driver

    @property
    def stopping(self) -> Stop | None:
        """The stop a step recorded while others were in flight (see ``Stop.outranks``)."""
        return self._stopping

    def settle_stop(self, raised: Stop) -> Stop:
        """After parallel steps settled: the run's stop, with what they changed committed under it.

        ``raised`` is the stop that came out of the steps. A stop that was never recorded (a lost
        lease, a plan mismatch) stands as it is, with nothing more written; otherwise the recorded
        one (the first, unless a later one outranked it) is committed again with the settled steps."""
        recorded = self._stopping
        if recorded is None or raised.status is Status.LEASE_LOST or (raised.status is not recorded.status and raised.outranks(recorded)):
            return raised
        state = self._state
        assert state is not None
        if self._dirty or state.status is not recorded.status or state.next_action != recorded.next_action:
            state.status, state.next_action = recorded.status, recorded.next_action
            self._commit()
        return recorded

    def note_straggler(self, future: concurrent.futures.Future[Any]) -> None:
        self._stragglers.append(future)

    def waited(self, monotonic_before: float) -> None:
        """A wait since ``monotonic_before`` (a ``monotonic_now()`` reading) is not work."""
        self._worked_mark += self._monotonic() - monotonic_before

    def monotonic_now(self) -> float:
        return self._monotonic()

