"""The async driver: the engine's step procedures awaited, many at once, with group commit.

``Engine.arun`` (and ``Run.map``, and a declared plan with parallel steps) runs the same step
procedures as the synchronous driver; only the waiting differs (``longrun._io``):

- An async adapter's ``apply`` and ``observe`` are awaited; a synchronous one's run in a worker
  thread (at most ``max_parallel``), so a blocking adapter does not stop the others.
- Each ``apply`` is bounded by its timeout (the step's ``timeout_s``, else the run's, else the retry
  policy's ``deadline_s``): an async one is cancelled when it passes, a thread cannot be and is
  waited for before the lease is let go (``Engine._release``). Either way the effect is uncertain
  and is observed before anything else happens to it.
- Commits that steps ask for while the event loop is busy are made together: the first asks for
  a flush after every step that is ready now has run, and each waits for it. So the ``started``
  records of effects that become ready together reach the store in one commit (one journal record
  and one ``fdatasync``, or one transaction), and no step waits for another's adapter.
- A cancellation read by the lease keeper cancels the async applies in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from typing import TYPE_CHECKING, Any, Awaitable, Callable, TypeVar

from ._io import Apply, ApplyInterrupted, ApplyTimedOut, Commit, Gather, Invoke, Observe, Op, Sleep, Steps, is_async_callable
from .clock import SystemClock
from .recovery import as_observation, timed_out_observation

if TYPE_CHECKING:
    from .engine import AsyncPlan, Engine
    from .outcome import Status

__all__ = ["AsyncDriver"]

T = TypeVar("T")


class AsyncDriver:
    """Runs one invocation's step procedures on the running event loop (see the module docstring)."""

    def __init__(self, engine: "Engine", max_parallel: int):
        self.engine = engine
        self.max_parallel = max_parallel
        self.active = 0
        """Steps in flight (entered ``step``): more than one means the steps are not sequential."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limit: asyncio.Semaphore | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._batch: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._applying: set[asyncio.Future[Any]] = set()

    async def __aenter__(self) -> "AsyncDriver":
        self._loop = asyncio.get_running_loop()
        self._limit = asyncio.Semaphore(self.max_parallel)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.max_parallel, thread_name_prefix="longrun-step")
        self.engine.attach(self)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.engine.attach(None)
        if self._pool is not None:
            self._pool.shutdown(wait=False)  # a timed-out thread goes on; Engine._release waits for it

    # -- running steps -------------------------------------------------------------------------

    async def recover_and_run(self, plan: "AsyncPlan") -> tuple["Status", str]:
        """``Engine._recover_and_run`` for an async plan: recover, drive, settle every step in flight."""
        from .engine import Stop

        engine = self.engine
        try:
            await self.run(engine.recover_steps(plan))
            await plan.adrive(engine)
        except Stop as stop:
            await self.settle()
            final = engine.settle_stop(stop)
            engine.woke_at(final.wake_at)
            return final.status, final.next_action
        except Exception:
            await self.settle()
            engine.keep_settled()
            raise
        raise AssertionError("the plan ended without a stop")  # pragma: no cover

    async def step(self, steps: Steps[T]) -> T:
        """One step procedure of a parallel section: at most ``max_parallel`` run at once, and
        the run waits for it to settle before it returns (``settle``)."""
        assert self._limit is not None
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self.active += 1
        try:
            async with self._limit:
                return await self.run(steps)
        finally:
            self.active -= 1
            if task is not None:
                self._tasks.discard(task)

    async def settled(self, work: Awaitable[T]) -> T:
        """Await ``work`` (steps in parallel); if it fails, first let the steps still in flight
        settle. A stop comes out as the run's stop (``Engine.settle_stop``)."""
        from .engine import Stop

        try:
            return await work
        except Stop as stop:
            await self.settle()
            raise self.engine.settle_stop(stop) from None
        except Exception:
            await self.settle()
            raise

    async def settle(self) -> None:
        """Wait until every step still in flight (a sibling of one that stopped the run) has settled.
        Their outcomes are in the state; their exceptions were raised to whoever awaited them."""
        current = asyncio.current_task()
        while True:
            pending = [task for task in self._tasks if task is not current and not task.done()]
            if not pending:
                return
            await asyncio.wait(pending)

    async def run(self, steps: Steps[T]) -> T:
        """Drive one step procedure, awaiting what it waits for (``longrun._io.drive``, awaited)."""
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = steps.throw(error) if error is not None else steps.send(value)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            error = None
            value = None
            try:
                value = await self._perform(op)
            except BaseException as exc:  # thrown into the procedure where the wait was asked for
                error = exc

    # -- performing --------------------------------------------------------------------------------

    async def _perform(self, op: Op) -> Any:
        engine = self.engine
        if isinstance(op, Commit):
            await self._commit()
            return None
        if isinstance(op, Apply):
            timeout_s = op.timeout_s if op.timeout_s is not None else engine.policy_deadline(op.request.step_id)
            return await self._bounded(op.adapter.apply, op.request, timeout_s, cancellable=True)
        if isinstance(op, Observe):
            timeout_s = op.timeout_s if op.timeout_s is not None else engine.policy_deadline(op.request.step_id)
            try:
                returned: object = await self._bounded(op.adapter.observe, op.request, timeout_s, cancellable=False)
            except ApplyTimedOut as exc:
                return timed_out_observation(op.request, exc.timeout_s)
            except Exception as exc:  # becomes an unknown observation that names it
                returned = exc
            return as_observation(op.request, returned)
        if isinstance(op, Invoke):
            return await self._invoke(op)
        if isinstance(op, Sleep):
            await self._sleep(op.seconds)
            return None
        assert isinstance(op, Gather)
        limit = asyncio.Semaphore(max(1, op.limit))

        async def one(steps: Steps[Any]) -> Any:
            async with limit:
                return await self.run(steps)

        return list(await asyncio.gather(*(one(steps) for steps in op.steps)))

    async def _bounded(self, fn: Callable[[Any], Any], request: Any, timeout_s: float | None, *, cancellable: bool) -> Any:
        """``fn(request)``: awaited if async, else in a worker thread; ``ApplyTimedOut`` past
        ``timeout_s``; ``ApplyInterrupted`` if a cancellation cancelled it."""
        assert self._loop is not None and self._pool is not None
        thread: concurrent.futures.Future[Any] | None = None
        inner: asyncio.Future[Any]
        if is_async_callable(fn):
            inner = asyncio.ensure_future(fn(request))
            if cancellable:  # a thread cannot be cancelled: it sees EffectRequest.cancelled() instead
                self._applying.add(inner)
        else:
            thread = self._pool.submit(fn, request)
            inner = asyncio.wrap_future(thread)
        try:
            # Awaited in this task (``asyncio.timeout``, not ``asyncio.wait``: about half the cost,
            # three times per effect). A timeout or a cancellation of this task cancels ``inner``.
            async with asyncio.timeout(timeout_s):
                return await inner
        except TimeoutError:
            if inner.done() and not inner.cancelled():
                return inner.result()  # it finished as the time ran out: its outcome stands
            inner.cancel()
            if thread is not None and not thread.done():
                self.engine.note_straggler(thread)
                self._retire_pool()
                raise ApplyTimedOut(timeout_s or 0.0, pending=thread) from None
            raise ApplyTimedOut(timeout_s or 0.0) from None
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if inner.cancelled() and current is not None and current.cancelling() == 0:
                # Not this task: a cancellation of the run reached the apply (``signal_cancelled``).
                raise ApplyInterrupted("the apply was cancelled: the task was cancelled while it ran") from None
            inner.cancel()
            raise
        finally:
            self._applying.discard(inner)

    def _retire_pool(self) -> None:
        """A timed-out call goes on in its worker thread, which the pool cannot have back: the
        steps after it (the observe of that very effect first) get a fresh pool, else with
        ``max_parallel`` such threads (or one, at ``max_parallel=1``) they would wait for a thread
        that may never end. The old pool's threads end when their calls do."""
        assert self._pool is not None
        retired = self._pool
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.max_parallel, thread_name_prefix="longrun-step")
        retired.shutdown(wait=False)

    async def _invoke(self, op: Invoke) -> Any:
        assert self._pool is not None
        if op.awaitable:
            awaitable = op.fn()
            assert inspect.isawaitable(awaitable)
            try:
                return await asyncio.wait_for(_awaited(awaitable), op.timeout_s)
            except asyncio.TimeoutError:
                raise ApplyTimedOut(op.timeout_s or 0.0) from None
        future = asyncio.wrap_future(self._pool.submit(op.fn))
        try:
            return await asyncio.wait_for(asyncio.shield(future), op.timeout_s)
        except asyncio.TimeoutError:
            if not future.done():
                self._retire_pool()
            raise ApplyTimedOut(op.timeout_s or 0.0) from None

    async def _sleep(self, seconds: float) -> None:
        engine = self.engine
        if not isinstance(engine.clock, SystemClock):
            engine.perform(Sleep(seconds))  # a test clock moves at once
            return
        mark = engine.monotonic_now()
        await asyncio.sleep(seconds)
        engine.waited(mark)

    async def _commit(self) -> None:
        """Join the next group commit (made once every step that is ready now has had its turn)."""
        assert self._loop is not None
        if self._batch is None:
            self._batch = self._loop.create_future()
            self._batch.add_done_callback(_retrieve)
            self._loop.call_soon(self._flush)
        await asyncio.shield(self._batch)

    def _flush(self) -> None:
        batch, self._batch = self._batch, None
        assert batch is not None
        try:
            self.engine.flush()
        except BaseException as exc:  # every step that waited on this commit raises its failure
            batch.set_exception(exc)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        else:
            batch.set_result(None)

    def signal_cancelled(self) -> None:
        """From the lease keeper's thread: cancel the async applies in flight."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._cancel_applies)

    def _cancel_applies(self) -> None:
        for inner in list(self._applying):
            inner.cancel()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _retrieve(future: asyncio.Future[None]) -> None:
    """Mark a group commit's failure as seen: the steps that waited on it raise it themselves."""
    if not future.cancelled():
        future.exception()
