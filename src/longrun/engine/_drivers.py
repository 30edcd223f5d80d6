"""The two drivers that perform what the step procedures yield, as equals.

Both perform the store and control requests through the run's ``RunIO``, written once: the store (the
lease, loads, fenced commits, messages), the cancellation and approval sources, and the ``LeaseKeeper`` that
renews the lease in the background, each method one blocking piece of I/O over an ``Invocation``.
A commit holds ``RunIO.commit_lock``, so the two drivers never write one invocation's state at once.
``SyncDriver`` performs each request at once in the calling thread. ``AsyncDriver`` performs the
same requests on the running event loop, as an equal, and never blocks the loop on I/O:

- Store and control I/O runs in the invocation's own I/O thread (one per invocation, so one run's
  loads, reads and commits stay in the order its steps asked for them, while the runs of other
  tasks on the same loop go on; a thread per store object would instead serialize every task that
  shares a store, which is how a worker runs its tasks). While a commit is in that thread no step
  of the invocation resumes, so the state it encodes does not change under it.
- What can be batched is: the commits that steps ask for while the loop is busy are one group
  commit (the ``started`` records of effects that become ready together reach the store in one
  journal record and one ``fdatasync``, or one transaction), and so are the reads of the
  cancellation record and of the approvals (one read made after every asking step asked is fresh
  for each of them).
- An async adapter's ``apply`` and ``observe`` are awaited; a synchronous one's run in a worker
  thread (at most ``max_parallel``), so a blocking adapter does not stop the others. Each ``apply``
  is bounded by its timeout (the step's ``timeout_s``, else the run's, else the retry policy's
  ``deadline_s``): an async one is cancelled when it passes, a thread cannot be and is waited for
  before the lease is let go. Either way the effect is uncertain and observed before anything else.
- A cancellation read by the lease keeper cancels the async applies in flight.

Longer than most modules: it is one concept, how a request is performed (the I/O written once in
``RunIO``, and the two ways of waiting for it); apart, each driver would reach into the other's
module for every store and control request.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import inspect
import logging
import threading
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from .. import _crashpoints
from ..cancellation import judge_cancellation
from ..clock import SystemClock
from ..control import ControlRecord
from ..errors import CorruptStateError, FencedError, InvalidInputError, LeaseHeldError, SizeLimitError, StorageError, describe_exception
from ..lease import Lease, LeaseKeeper
from ..messages import Delivery, Message
from ..outcome import RunOutcome, Status
from ..protocols import LoadResult, SigningSource
from ..recovery import as_observation, observe_safely, timed_out_observation
from ._config import EngineConfig, utc
from ._invocation import Invocation, Stop
from ._ops import (
    Apply,
    ApplyInterrupted,
    ApplyTimedOut,
    CancellationRead,
    Commit,
    Gather,
    Invoke,
    Load,
    Observe,
    Op,
    ReadApprovals,
    ReadCancellation,
    ReadMessages,
    ReadStore,
    RenewLease,
    SendMessage,
    Sleep,
    Steps,
    is_async_callable,
)

log = logging.getLogger("longrun")

__all__ = ["AsyncDriver", "RunIO", "SyncDriver", "call_in_thread", "drive"]

T = TypeVar("T")


class RunIO:
    """The store, the control sources and the lease keeper of one engine (see the module docstring)."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.store = config.store
        self.keeper: LeaseKeeper | None = None
        self.lease: Lease | None = None
        self.commit_lock = threading.RLock()
        """Held for each commit: the async driver's I/O thread and synchronous code on the loop
        (a face's step between awaited ones) never write one invocation's state at once."""
        self.on_cancelled: Callable[[], None] | None = None
        """Called from the lease keeper's thread when it reads a cancellation (the async driver's)."""

    @property
    def signed_approvals(self) -> bool:
        source = self.config.approvals
        return isinstance(source, SigningSource) and source.requires_signature

    @property
    def signed_cancellations(self) -> bool:
        source = self.config.cancellations
        return isinstance(source, SigningSource) and source.requires_signature

    # -- the lease -------------------------------------------------------------------------------

    def acquire(self, inv: Invocation, progress: Callable[[Any], str]) -> RunOutcome | None:
        """Take the task's lease and start its keeper; an outcome if it cannot be taken."""
        config = self.config
        self.keeper = None
        self.lease = None
        try:
            lease = self.store.acquire_lease(inv.task_id, config.owner, config.lease_ttl_s, config.clock.now(), monotonic=inv.monotonic_reading())
        except LeaseHeldError as exc:
            holder = exc.holder if isinstance(exc.holder, Lease) else None
            inv.evidence.observed("store", str(exc))
            inv.evidence.unknown("lease", "whether the current lease holder is alive and making progress")
            until = ""
            if holder is not None:
                now = config.clock.now()
                until = f" at {utc(now + max(0.0, holder.remaining(now, inv.monotonic_reading())))}"
            so_far = ""
            try:  # the holder's progress, for the outcome: a read-only load takes no lease and moves nothing
                inv.current = self.store.load(inv.task_id).state
            except (CorruptStateError, StorageError) as load_error:
                inv.evidence.unknown("store", f"the task's progress could not be read: {load_error}")
            if inv.current is not None:
                so_far = f"; so far revision {inv.current.revision}, {progress(inv.current)}"
            return inv.outcome(
                Status.ALREADY_RUNNING,
                f"wait for the current owner to finish or for its lease to expire{until}, then run again{so_far}",
            )
        except CorruptStateError as exc:
            inv.evidence.observed("store", f"the lease record cannot be read: {exc}")
            inv.evidence.unknown("lease", "who holds the task's lease, and at which epoch")
            return inv.outcome(
                Status.STATE_UNRECOVERABLE,
                f"repair the lease record with `longrun repair {inv.store_spec} {inv.task_id} --lease` (it keeps the damaged "
                "record aside and the next run gets an epoch above every one recorded), then run again",
            )
        self.lease = lease
        inv.epoch = lease.epoch
        inv.evidence.observed("store", f"lease acquired by {config.owner} at epoch {lease.epoch}")
        self.keeper = LeaseKeeper(
            lease, lambda held: self._renew(inv, held), config.lease_ttl_s / 3, inv.monotonic, on_renewed=lambda: self._watch_cancellation(inv)
        )
        return None

    def _renew(self, inv: Invocation, lease: Lease) -> Lease:
        config = self.config
        return self.store.renew_lease(lease, config.lease_ttl_s, config.clock.now(), monotonic=inv.monotonic_reading())

    def current_lease(self, inv: Invocation) -> Lease:
        """The lease to write under; raises ``Stop(lease-lost)`` if background renewal failed."""
        keeper = self.keeper
        assert keeper is not None
        if keeper.failure is not None:
            inv.evidence.observed("lease", f"background renewal failed: {describe_exception(keeper.failure)}")
            raise Stop(Status.LEASE_LOST, "nothing on this runner: the lease was lost, no further write was made")
        lease = keeper.lease
        if keeper.stale(self.config.lease_ttl_s):
            lease = self._renew(inv, lease)
            keeper.replace(lease)
        return lease

    def release(self, inv: Invocation, *, quiet: bool) -> None:
        """Let the lease go, unless a timed-out attempt still runs (then it is kept until that ends)."""
        lease = self.keeper.lease if self.keeper is not None else self.lease
        if lease is None:
            return
        running = [future for future in inv.stragglers if not future.done()]
        if running:
            # A timed-out attempt is still running in a worker thread: no other run may start this
            # task (and apply the effect again) before it ends, so the lease is kept, and renewed,
            # until then. If this process exits first, the lease simply expires.
            log.info("%s: keeping the lease until %d timed-out attempt(s) end", inv.task_id, len(running))
            threading.Thread(
                target=self._release_after, args=(inv, lease, running), name=f"longrun-straggler-{inv.task_id}", daemon=True
            ).start()
            return
        try:
            self.store.release_lease(lease, self.config.clock.now(), monotonic=inv.monotonic_reading())
        except FencedError as exc:
            log.info("lease on %s was already taken over: %s", inv.task_id, exc)
        except Exception:
            if not quiet:
                raise
            log.exception("releasing the lease on %s failed while another error propagates", inv.task_id)

    def _release_after(self, inv: Invocation, lease: Lease, running: list[concurrent.futures.Future[Any]]) -> None:
        keeper = LeaseKeeper(lease, lambda held: self._renew(inv, held), self.config.lease_ttl_s / 3, inv.monotonic)
        with keeper:
            concurrent.futures.wait(running)
        if keeper.failure is not None:
            return  # the lease is gone already: nothing to release
        try:
            self.store.release_lease(keeper.lease, self.config.clock.now(), monotonic=inv.monotonic_reading())
        except FencedError as exc:
            log.info("lease on %s was already taken over: %s", inv.task_id, exc)
        except Exception:  # a background thread has no caller to raise to: logged with its traceback
            log.exception("releasing the lease on %s after its timed-out attempts ended failed", inv.task_id)

    def _watch_cancellation(self, inv: Invocation) -> None:
        """Called by the lease keeper after each renewal: a cancellation written while an effect
        runs reaches it (``EffectRequest.cancelled()``; async applies are cancelled)."""
        if inv.cancel_signal.is_set():
            return
        raw = self.config.cancellations.read_cancellation(inv.task_id)
        if raw is None or judge_cancellation(raw, inv.task_id).verdict != "cancelled":
            return  # anything else is judged by the run itself before its next step
        log.info("%s: cancellation read while steps run; signalling them", inv.task_id)
        inv.cancel_signal.set()
        on_cancelled = self.on_cancelled
        if on_cancelled is not None:
            on_cancelled()

    # -- the state and the control records ---------------------------------------------------------

    def load(self, inv: Invocation, op: Load) -> LoadResult:
        return self.store.load(inv.task_id, lease=op.lease)

    def read_cancellation(self, inv: Invocation, op: ReadCancellation) -> CancellationRead:
        """The task's cancellation record, else its ancestors' (through the same source, so a signed
        or strictly owned record of a parent reaches its children exactly as it reaches the parent)."""
        source = self.config.cancellations
        for whose in (inv.task_id, *op.ancestors):
            raw = source.read_cancellation(whose)
            if raw is not None:
                return CancellationRead(whose, raw)
        pausing = self.config.pausing
        return CancellationRead(inv.task_id, None, paused=pausing is not None and pausing.pause_requested(inv.task_id))

    def read_approvals(self, inv: Invocation) -> list[ControlRecord]:
        return list(self.config.approvals.read_approvals(inv.task_id))

    def send_message(self, inv: Invocation, op: SendMessage) -> Delivery:
        return self.store.send_message(op.message)

    def read_messages(self, inv: Invocation, op: ReadMessages) -> tuple[Message, ...]:
        return self.store.read_messages(inv.task_id, op.topic)

    def flush(self, inv: Invocation) -> None:
        """Commit what the steps changed, if anything."""
        if inv.dirty:
            self.commit(inv)

    def commit(self, inv: Invocation) -> None:
        """Commit the working state under the current lease (fenced by the store)."""
        with self.commit_lock:
            lease = self.current_lease(inv)
            state = inv.state
            if inv.latencies and inv.stopping is not None:  # a stop's commit carries every latency noted
                inv.fold_latency()
            state.updated_at = self.config.clock.now()
            state.budget = state.budget.worked(inv.take_work())
            try:
                self.store.commit(lease, state, frozenset(inv.changed))
            except SizeLimitError as exc:
                # Nothing was written: the state would be too large to read back. Record the stop on the
                # last durable state instead (a load reads it); whatever this run did since is in flight
                # there, and the next run observes it again before anything else.
                inv.evidence.unknown("store", str(exc))
                next_action = (
                    f"make the run's state smaller: it would be over {exc.limit_name} ({exc.limit} bytes) at step "
                    f"{state.current_step!r}; keep large payloads and results outside it (pass references), then run again"
                )
                durable = self.store.load(inv.task_id, lease=lease).state
                if durable is not None:
                    durable.status, durable.next_action = Status.UNSAFE_TO_CONTINUE, next_action
                    durable.unknowns = list(inv.evidence.unknowns)
                    durable.updated_at = self.config.clock.now()
                    inv.current = durable
                    inv.changed.clear()
                    self.store.commit(lease, durable, frozenset())
                raise Stop(Status.UNSAFE_TO_CONTINUE, next_action) from None
            if _crashpoints.ARMED:
                _crashpoints.hit("state.committed", state.revision)
            inv.changed.clear()
            inv.dirty = False
            inv.reporter.committed(state)

    def keep_settled(self, inv: Invocation) -> None:
        """The plan's own code raised (a durable function's bug, say). What is settled so far is
        kept, so a corrected function resumes from it; the error goes to the caller."""
        if inv.current is not None and (inv.dirty or inv.latencies) and self.keeper is not None and self.keeper.failure is None:
            inv.fold_latency()
            self.commit(inv)

    def settle_stop(self, inv: Invocation, raised: Stop) -> Stop:
        """After parallel steps settled: the run's stop, with what they changed committed under it.

        ``raised`` is the stop that came out of the steps. A stop that was never recorded (a lost
        lease, a plan mismatch) stands as it is, with nothing more written; otherwise the recorded
        one (the first, unless a later one outranked it) is committed again with the settled steps."""
        recorded = inv.stopping
        if recorded is None or raised.status is Status.LEASE_LOST or (raised.status is not recorded.status and raised.outranks(recorded)):
            return raised
        state = inv.state
        if inv.dirty or state.status is not recorded.status or state.next_action != recorded.next_action:
            state.status, state.next_action = recorded.status, recorded.next_action
            self.commit(inv)
        return recorded


def drive(steps: Steps[T], perform: Callable[[Op], Any]) -> T:
    """Run a step procedure to its end, performing each request with ``perform`` in this thread.

    Whatever ``perform`` raises (an adapter's exception, a stop from a commit) is thrown into the
    procedure at the ``yield`` that asked for it, as if the call had been made there."""
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
            value = perform(op)
        except BaseException as exc:  # thrown into the procedure, where the call was asked for
            error = exc


def call_in_thread(fn: Callable[[], T], timeout_s: float) -> T:
    """``fn()`` in a worker thread, waiting at most ``timeout_s``; ``ApplyTimedOut`` after that.

    A thread cannot be stopped: on a timeout it goes on running, and the error says so."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="longrun-apply")
    future = pool.submit(fn)
    pool.shutdown(wait=False)
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise ApplyTimedOut(timeout_s, pending=future) from None


class SyncDriver:
    """Performs each request at once, in the calling thread."""

    def __init__(self, io: RunIO, inv: Invocation):
        self.io = io
        self.inv = inv

    def run(self, steps: Steps[T]) -> T:
        return drive(steps, self.perform)

    def perform(self, op: Op) -> Any:
        io, inv = self.io, self.inv
        if isinstance(op, Commit):
            if inv.dirty:  # else nothing changed since the last commit
                io.commit(inv)
            return None
        if isinstance(op, RenewLease):
            return io.current_lease(inv)
        if isinstance(op, ReadCancellation):
            return io.read_cancellation(inv, op)
        if isinstance(op, ReadApprovals):
            return io.read_approvals(inv)
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
            apply_request = op.request
            if op.timeout_s is None:
                return adapter.apply(apply_request)
            return call_in_thread(lambda: adapter.apply(apply_request), op.timeout_s)
        if isinstance(op, Invoke):
            return op.fn() if op.timeout_s is None else call_in_thread(op.fn, op.timeout_s)
        if isinstance(op, Sleep):
            slept_from = inv.monotonic()
            self.io.config.clock.sleep(op.seconds)  # waiting for a timer is not work
            inv.waited(slept_from)
            return None
        if isinstance(op, Load):
            return io.load(inv, op)
        if isinstance(op, ReadStore):
            return op.read(io.config.store)
        if isinstance(op, SendMessage):
            return io.send_message(inv, op)
        if isinstance(op, ReadMessages):
            return io.read_messages(inv, op)
        assert isinstance(op, Gather)
        if len(op.steps) > 1:
            # Several effects left in flight (by parallel steps): observed at once, in worker threads.
            return self.parallel(op.steps, op.limit)
        return [drive(steps, self.perform) for steps in op.steps]

    def parallel(self, procedures: Sequence[Steps[T]], max_parallel: int) -> list[T]:
        """Run step procedures at once from synchronous code (``Run.map``); their values in order."""

        async def together(driver: AsyncDriver) -> list[T]:
            return list(await asyncio.gather(*(driver.step(steps) for steps in procedures)))

        return self.concurrently(together, max_parallel)

    def concurrently(self, work: Callable[["AsyncDriver"], Awaitable[T]], max_parallel: int, attach: Callable[["AsyncDriver | None"], None] | None = None) -> T:
        """Await ``work`` from synchronous code, on an event loop of its own with an async driver
        (adapters run in worker threads). If a step stops the run, the others settle first."""

        async def main() -> T:
            async with AsyncDriver(self.io, self.inv, max_parallel) as driver:
                if attach is not None:
                    attach(driver)
                try:
                    return await driver.settled(work(driver))
                finally:
                    if attach is not None:
                        attach(None)

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(main())
        raise InvalidInputError("parallel steps cannot run from synchronous code inside a running event loop: use the async face")


class AsyncDriver:
    """Performs one invocation's requests on the running event loop (see the module docstring)."""

    def __init__(self, io: RunIO, inv: Invocation, max_parallel: int):
        self.io = io
        self.inv = inv
        self.max_parallel = max_parallel
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limit: asyncio.Semaphore | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._io_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._batch: asyncio.Future[None] | None = None
        self._committing: asyncio.Future[None] | None = None
        self._reads: dict[object, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._async_functions: dict[Any, bool] = {}
        self._outcomes: collections.deque[tuple[asyncio.Future[Any], Any, BaseException | None]] = collections.deque()
        """Outcomes of synchronous adapter calls, handed back from their threads (``_hand_back``)."""
        self._outcomes_lock = threading.Lock()
        self._delivery_due = False
        self._applying: set[asyncio.Task[Any]] = set()
        """The step tasks awaiting an async ``apply`` now (``signal_cancelled`` cancels them)."""
        self._interrupted: set[asyncio.Task[Any]] = set()
        """Those of them that ``signal_cancelled`` cancelled (and nobody else, unless they say so)."""

    async def __aenter__(self) -> "AsyncDriver":
        self._loop = asyncio.get_running_loop()
        self._limit = asyncio.Semaphore(self.max_parallel)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.max_parallel, thread_name_prefix="longrun-step")
        self._io_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"longrun-io-{self.inv.task_id}")
        self.io.on_cancelled = self.signal_cancelled
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.io.on_cancelled = None
        if self._pool is not None:
            self._pool.shutdown(wait=False)  # a timed-out thread goes on; RunIO.release waits for it
        if self._io_pool is not None:
            self._io_pool.shutdown(wait=False)  # every request it ran was awaited

    async def call_io(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the invocation's I/O thread, in the order asked."""
        assert self._loop is not None and self._io_pool is not None
        return await self._loop.run_in_executor(self._io_pool, fn, *args)

    # -- running steps -------------------------------------------------------------------------

    async def step(self, steps: Steps[T]) -> T:
        """One step procedure of a parallel section: at most ``max_parallel`` run at once, and
        the run waits for it to settle before it returns (``settle``)."""
        assert self._limit is not None
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self.inv.in_flight += 1
        try:
            async with self._limit:
                return await self.run(steps)
        finally:
            self.inv.in_flight -= 1
            if task is not None:
                self._tasks.discard(task)

    async def settled(self, work: Awaitable[T]) -> T:
        """Await ``work`` (steps in parallel); if it fails, first let the steps still in flight
        settle. A stop comes out as the run's stop (``RunIO.settle_stop``)."""
        try:
            return await work
        except Stop as stop:
            await self.settle()
            raise (await self.settle_stop(stop)) from None
        except Exception:
            await self.settle()
            raise

    async def settle_stop(self, raised: Stop) -> Stop:
        return await self.call_io(self.io.settle_stop, self.inv, raised)

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
        """Drive one step procedure, awaiting what it waits for (``drive``, awaited)."""
        value: Any = None
        error: BaseException | None = None
        while True:
            while self._committing is not None:  # the state is being encoded in the I/O thread: do not change it
                await asyncio.wait((self._committing,))
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
        io, inv = self.io, self.inv
        if isinstance(op, Commit):
            await self._commit()
            return None
        if isinstance(op, ReadCancellation):
            return await self._read(op, lambda: io.read_cancellation(inv, op))
        if isinstance(op, ReadApprovals):
            return await self._read(op, lambda: io.read_approvals(inv))
        if isinstance(op, RenewLease):
            keeper = io.keeper
            if keeper is not None and keeper.failure is None and not keeper.stale(io.config.lease_ttl_s):
                return keeper.lease  # nothing to renew: no I/O
            return await self.call_io(io.current_lease, inv)
        if isinstance(op, Apply):
            timeout_s = op.timeout_s if op.timeout_s is not None else inv.policies.get(op.request.step_id, inv.retry).deadline_s
            return await self._bounded(op.adapter.apply, op.request, timeout_s, cancellable=True)
        if isinstance(op, Observe):
            timeout_s = op.timeout_s if op.timeout_s is not None else inv.policies.get(op.request.step_id, inv.retry).deadline_s
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
        if isinstance(op, Load):
            return await self.call_io(io.load, inv, op)
        if isinstance(op, ReadStore):
            return await self.call_io(op.read, io.config.store)
        if isinstance(op, SendMessage):
            return await self.call_io(io.send_message, inv, op)
        if isinstance(op, ReadMessages):
            return await self.call_io(io.read_messages, inv, op)
        assert isinstance(op, Gather)
        limit = asyncio.Semaphore(max(1, op.limit))

        async def one(steps: Steps[Any]) -> Any:
            async with limit:
                return await self.run(steps)

        return list(await asyncio.gather(*(one(steps) for steps in op.steps)))

    async def _read(self, key: object, read: Callable[[], T]) -> T:
        """A control read shared by every step that asks for it in this turn of the loop: it is made
        after they all asked, so it is fresh for each."""
        assert self._loop is not None
        pending = self._reads.get(key)
        if pending is None:
            pending = self._loop.create_future()
            pending.add_done_callback(_retrieve)
            self._reads[key] = pending
            self._loop.call_soon(self._start_read, key, pending, read)
        return await asyncio.shield(pending)

    def _start_read(self, key: object, pending: asyncio.Future[Any], read: Callable[[], Any]) -> None:
        assert self._loop is not None and self._io_pool is not None
        del self._reads[key]  # a step that asks from now on gets a read of its own, made later
        running = self._loop.run_in_executor(self._io_pool, read)
        running.add_done_callback(lambda done: _pass_on(done, pending))

    async def _bounded(self, fn: Callable[[Any], Any], request: Any, timeout_s: float | None, *, cancellable: bool) -> Any:
        """``fn(request)``: awaited if async, else in a worker thread; ``ApplyTimedOut`` past
        ``timeout_s``; ``ApplyInterrupted`` if a cancellation cancelled it."""
        if self._is_async(fn):
            return await self._awaited_call(fn, request, timeout_s, cancellable=cancellable)
        assert self._loop is not None and self._pool is not None
        inner = self._loop.create_future()
        thread = self._pool.submit(self._in_thread, fn, request, inner)
        limit = asyncio.timeout(timeout_s)
        try:
            # Awaited in this task (``asyncio.timeout``, not ``asyncio.wait``: about half the cost,
            # three times per effect). A timeout or a cancellation of this task cancels ``inner``.
            async with limit:
                return await inner
        except TimeoutError:
            if not limit.expired():
                raise  # the adapter's own TimeoutError: its outcome, as it raised it
            if thread.done() and not thread.cancelled():
                return thread.result()  # it finished as the time ran out: its outcome stands
            if not thread.done():
                self.inv.stragglers.append(thread)
                self._retire_pool()
                raise ApplyTimedOut(timeout_s or 0.0, pending=thread) from None
            raise ApplyTimedOut(timeout_s or 0.0) from None

    def _in_thread(self, fn: Callable[[Any], T], request: Any, waiter: asyncio.Future[T]) -> T:
        """``fn(request)`` in a worker thread; its outcome goes back to the loop with those of the
        other calls that end meanwhile, in one hand-off (``_hand_back``), not a wake-up of the loop
        and a chain of callbacks per call. Returned (or raised) too, for the thread's own future."""
        try:
            result = fn(request)
        except BaseException as exc:
            self._hand_back(waiter, None, exc)
            raise
        self._hand_back(waiter, result, None)
        return result

    def _hand_back(self, waiter: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        self._outcomes.append((waiter, result, error))
        with self._outcomes_lock:
            if self._delivery_due:
                return  # a delivery is scheduled and has not begun: it takes this outcome too
            self._delivery_due = True
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is closed: nobody awaits the outcome any more
            pass

    def _deliver(self) -> None:
        """On the loop: every outcome handed back so far, to the steps that await them."""
        with self._outcomes_lock:
            self._delivery_due = False
        outcomes = self._outcomes
        while outcomes:
            waiter, result, error = outcomes.popleft()
            if waiter.done():  # the step stopped waiting (a timeout, a cancellation)
                continue
            if error is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(result)

    def _is_async(self, fn: Callable[[Any], Any]) -> bool:
        """``is_async_callable(fn)``, asked once per adapter method (by its function) in this run."""
        key = getattr(fn, "__func__", fn)
        try:
            known = self._async_functions.get(key)
        except TypeError:  # an unhashable callable: asked each time
            return is_async_callable(fn)
        if known is None:
            known = self._async_functions[key] = is_async_callable(fn)
        return known

    async def _awaited_call(self, fn: Callable[[Any], Any], request: Any, timeout_s: float | None, *, cancellable: bool) -> Any:
        """An async ``fn(request)``, awaited in the step's own task (no task of its own to create,
        schedule and wait for, three times per effect): a timeout cancels this task's await of it,
        and a cancellation of the run (``signal_cancelled``) cancels this task while it awaits an
        apply, which comes out as ``ApplyInterrupted`` (a cancellation from anywhere else goes on)."""
        task = asyncio.current_task()
        assert task is not None
        limit = asyncio.timeout(timeout_s)
        if cancellable:
            self._applying.add(task)
        try:
            async with limit:
                return await fn(request)
        except TimeoutError:
            if not limit.expired():
                raise  # the adapter's own TimeoutError: its outcome, as it raised it
            raise ApplyTimedOut(timeout_s or 0.0) from None
        except asyncio.CancelledError:
            if task in self._interrupted:
                self._interrupted.discard(task)
                if task.uncancel() == 0:  # nobody else cancelled this task: the run's cancellation did
                    raise ApplyInterrupted("the apply was cancelled: the task was cancelled while it ran") from None
            raise
        finally:
            if cancellable:
                self._applying.discard(task)
                if task in self._interrupted:  # the adapter swallowed the cancellation: withdrawn
                    self._interrupted.discard(task)
                    task.uncancel()

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
        clock = self.io.config.clock
        inv = self.inv
        mark = inv.monotonic()
        if not isinstance(clock, SystemClock):
            clock.sleep(seconds)  # a test clock moves at once
        else:
            await asyncio.sleep(seconds)
        inv.waited(mark)

    async def _commit(self) -> None:
        """Join the next group commit (made once every step that is ready now has had its turn)."""
        assert self._loop is not None
        if self._batch is None:
            self._batch = self._loop.create_future()
            self._batch.add_done_callback(_retrieve)
            self._loop.call_soon(self._flush)
        await asyncio.shield(self._batch)

    def _flush(self) -> None:
        assert self._loop is not None and self._io_pool is not None
        batch, self._batch = self._batch, None
        assert batch is not None
        self._committing = batch
        running = self._loop.run_in_executor(self._io_pool, self.io.flush, self.inv)
        running.add_done_callback(lambda done: self._flushed(done, batch))

    def _flushed(self, done: asyncio.Future[None], batch: asyncio.Future[None]) -> None:
        if self._committing is batch:
            self._committing = None
        _pass_on(done, batch)  # every step that waited on this commit raises its failure

    def signal_cancelled(self) -> None:
        """From the lease keeper's thread: cancel the async applies in flight."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._cancel_applies)

    def _cancel_applies(self) -> None:
        for task in self._applying - self._interrupted:
            self._interrupted.add(task)
            task.cancel()


def _pass_on(done: asyncio.Future[Any], to: asyncio.Future[Any]) -> None:
    """The outcome of ``done`` (a call in a thread) as the outcome of ``to``."""
    if to.done():
        return
    if done.cancelled():
        to.cancel()
        return
    error = done.exception()
    if error is not None:
        to.set_exception(error)
    else:
        to.set_result(done.result())


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a shared request's failure as seen: the steps that waited on it raise it themselves."""
    if not future.cancelled():
        future.exception()
