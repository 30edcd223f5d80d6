"""The worker: a long-running process that runs every runnable task of the durable functions it knows.

A worker claims due rows of the store's fleet queue (``stores.queue``), at most ``concurrency``
at a time, and runs each claimed task once (``fn.run`` in a thread of its pool; an async function,
``fn.arun``, on its event loop), then records the outcome in the row: when the task is due next
(a retry or a timer by the database's clock), or parked until something wakes it (an approval, an
answer, a cancellation, a child that ended). It renews its claims and its heartbeat while it runs.

What keeps a task held by one runner at a time is the task's lease, fenced by its epoch, exactly
as for any run: a claim only decides which worker tries. A worker that dies leaves claims that
lapse after ``claim_ttl_s``; the row is then due again, and whoever claims it takes the lease when
it expires (a newer epoch, observing every effect in flight first, as always).

Stopping: ``stop()`` (SIGTERM or SIGINT under ``run()``) drains. Nothing new is claimed; each run
under way stops at its next step boundary, between two effects (the effect in flight settles
first), commits ``retry-scheduled`` with "run again now" and releases its lease; its row is due
at once for another worker; then the worker exits. A run waiting out a short backoff or timer
(at most ``Limits.max_block_s``) finishes that wait first.

Not guaranteed: that a function's code between two steps is cut short (it runs to its next
``run.*`` call), or that a child task driven by its parent's run drains by itself (the parent stops
at its next step after the child's run returns).

Waking: a row made due at once (an approval, an answer or a cancellation written to the store, a
child that ended) wakes idle workers through PostgreSQL's ``NOTIFY``; elsewhere, and for control
records written as files under a control root or the JSON-file store, a ``_watch.ControlWatch``
thread looks at most every 250 ms (the queue's change counter, the roots' directory times) and
wakes the task whose record arrived, so it runs within a second rather than at the next poll.

How one claimed task is run, and when it is due next, is ``_runs.ClaimRunner``, which a ``Worker`` holds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import os
import signal
import socket
import threading
from typing import Any, Awaitable, Callable, Iterable, Mapping, TypeVar

from ..errors import InvalidInputError, LongrunError, describe_exception
from ..functions import DurableFunction
from ..protocols import Store
from ..stores.queue import Claim, TaskQueue, open_queue
from ._limits import SlotKeeper
from ._runs import ClaimRunner, Disposition
from ._watch import ControlWatch, watch_roots

__all__ = ["Worker", "WorkerReport"]

log = logging.getLogger("longrun")

T = TypeVar("T")

FORGET_WORKERS_S = 7 * 86400.0
"""A worker starting deletes the rows of workers silent for longer than this (a week)."""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerReport:
    """What a worker did before it stopped."""

    name: str
    runs: int
    statuses: Mapping[str, int]
    """Outcome status -> how many runs ended so (``error`` for runs that raised)."""
    drained: int
    """Runs that were stopped between two steps by the drain."""


class Worker:
    """Runs the tasks of ``functions`` found due in ``store``'s fleet queue (see the module docstring).

    ``store`` is where the tasks live; each task is run against it (a store object per thread),
    whatever store the function was decorated with. ``limits`` maps an action to the most applies
    of it allowed at once across the fleet (``LimitedAdapter``). ``claim_ttl_s`` is how long a claim
    outlives a worker that stopped renewing it (make it about the functions' ``lease_ttl_s``);
    ``poll_s`` how often the queue is read when no notification comes; ``rescan_s`` how often a
    store without triggers (the JSON-file store) is searched for tasks run outside the fleet.
    ``clock_offset_s`` shifts the wall clock the functions run with (a testing aid).
    """

    def __init__(
        self,
        store: Store,
        functions: Iterable[DurableFunction[Any]],
        *,
        concurrency: int = 4,
        name: str | None = None,
        limits: Mapping[str, int] | None = None,
        claim_ttl_s: float = 30.0,
        poll_s: float = 1.0,
        rescan_s: float = 2.0,
        slot_ttl_s: float = 30.0,
        clock_offset_s: float = 0.0,
    ):
        self.functions: dict[str, DurableFunction[Any]] = {}
        for function in functions:
            if not isinstance(function, DurableFunction):
                raise InvalidInputError(f"{function!r} is not a @longrun.durable function")
            self.functions[function.name] = function
        if not self.functions:
            raise InvalidInputError("a worker needs at least one durable function to run")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= 1024:
            raise InvalidInputError(f"concurrency must be an integer in [1, 1024], got {concurrency!r}")
        for label, value in (("claim_ttl_s", claim_ttl_s), ("poll_s", poll_s), ("rescan_s", rescan_s), ("slot_ttl_s", slot_ttl_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InvalidInputError(f"{label} must be a positive number of seconds, got {value!r}")
        self.limits = dict(limits or {})
        for action, limit in self.limits.items():
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise InvalidInputError(f"the limit of action {action!r} must be an integer >= 1, got {limit!r}")
        self.store = store
        self.concurrency = concurrency
        self.host = socket.gethostname()
        self.name = name or f"{self.host}:{os.getpid()}"
        if not isinstance(self.name, str) or not self.name or len(self.name) > 256:
            raise InvalidInputError(f"a worker name is 1-256 characters, got {self.name!r}")
        self.claim_ttl_s = float(claim_ttl_s)
        self.poll_s = float(poll_s)
        self.rescan_s = float(rescan_s)
        self.slot_ttl_s = float(slot_ttl_s)
        self.clock_offset_s = float(clock_offset_s)
        self._stopping = threading.Event()
        self._runner = ClaimRunner(
            store, self.functions, name=self.name, limits=self.limits, clock_offset_s=self.clock_offset_s, stopping=self._stopping
        )
        self._queue = open_queue(store)
        self._slot_queue: TaskQueue | None = None
        self._running: dict[str, tuple[Claim, asyncio.Task[None]]] = {}
        for function in self.functions.values():  # a deployment mistake fails here, not task by task later
            try:
                function.with_options(**self._runner.overrides(function, store))
            except (LongrunError, TypeError) as exc:
                self._queue.close()
                raise InvalidInputError(f"worker {self.name} cannot run {function.name} with its options: {describe_exception(exc)}") from exc
        self._statuses: dict[str, int] = {}
        self._runs = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    # -- control ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Drain: claim nothing new, stop each run at its next step boundary, then return. Thread-safe."""
        if not self._stopping.is_set():
            log.info("worker %s: draining (%d runs under way)", self.name, len(self._running))
        self._stopping.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            loop.call_soon_threadsafe(wake.set)

    def run(self) -> WorkerReport:
        """Serve until SIGTERM or SIGINT (or ``stop()``), drain, and return what was done."""
        return asyncio.run(self.serve(handle_signals=threading.current_thread() is threading.main_thread()))

    async def serve(self, *, handle_signals: bool = False) -> WorkerReport:
        loop = asyncio.get_running_loop()
        self._loop, self._wake = loop, asyncio.Event()
        if handle_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.stop)
        queue_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="longrun-queue")
        pool = concurrent.futures.ThreadPoolExecutor(self.concurrency, thread_name_prefix="longrun-task")
        listening = threading.Event()
        listener: threading.Thread | None = None
        listen_queue: TaskQueue | None = None
        watcher: threading.Thread | None = None
        watch_queue: TaskQueue | None = None
        heartbeat: asyncio.Task[None] | None = None

        async def in_queue(call: Callable[..., T], *args: Any) -> T:
            return await loop.run_in_executor(queue_thread, lambda: call(*args))

        try:
            await in_queue(self._queue.ensure)
            await in_queue(self._queue.forget_workers, FORGET_WORKERS_S)
            if self.limits:
                self._slot_queue = open_queue(self.store)
                self._runner.slots = SlotKeeper(self._slot_queue, self.name, ttl_s=self.slot_ttl_s)
            if self._queue.notifies:
                listen_queue = open_queue(self.store)
                woken = lambda: loop.call_soon_threadsafe(self._nudge)  # noqa: E731
                listener = threading.Thread(
                    target=listen_queue.listen, args=(woken, listening), name="longrun-listen", daemon=True
                )
                listener.start()
            watch = self._control_watch()
            if watch is not None:
                watch_queue = watch.queue
                woken_by_watch = lambda: loop.call_soon_threadsafe(self._nudge)  # noqa: E731
                watcher = threading.Thread(target=watch.run, args=(woken_by_watch, listening), name="longrun-watch", daemon=True)
                watcher.start()
            await in_queue(self._heartbeat, "running")
            log.info(
                "worker %s: serving %s, up to %d at once", self.name, ", ".join(sorted(self.functions)), self.concurrency,
                extra={"worker": self.name},
            )  # fmt: skip
            heartbeat = asyncio.create_task(self._keep_alive(in_queue))
            await self._claim_loop(in_queue, pool)
            if self._running:
                await in_queue(self._heartbeat, "draining")
                await asyncio.gather(*(task for _, task in list(self._running.values())), return_exceptions=True)
        finally:
            self._stopping.set()
            listening.set()
            if heartbeat is not None:
                heartbeat.cancel()
                await asyncio.gather(heartbeat, return_exceptions=True)
            try:
                await in_queue(self._heartbeat, "stopped")
            except LongrunError as exc:
                log.warning("worker %s: could not record that it stopped: %s", self.name, exc)
            await asyncio.to_thread(
                self._close, [pool, queue_thread], [listener, watcher], [self._queue, self._slot_queue, listen_queue, watch_queue]
            )
            if handle_signals:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
        log.info("worker %s: stopped after %d runs", self.name, self._runs, extra={"worker": self.name})
        return WorkerReport(self.name, self._runs, dict(self._statuses), self._runner.drained)

    def _close(
        self, pools: list[concurrent.futures.ThreadPoolExecutor], threads: list[threading.Thread | None], queues: list[TaskQueue | None]
    ) -> None:
        for pool in pools:
            pool.shutdown(wait=True)
        for thread in threads:
            if thread is not None:
                thread.join(timeout=5.0)
        for queue in queues:
            if queue is not None:
                queue.close()
        self._runner.close_stores()

    def _control_watch(self) -> ControlWatch | None:
        """The watch of the queue's change counter and of the functions' control roots (``_watch``),
        or None where notifications are enough (PostgreSQL, no control files to watch)."""
        sources: list[object] = []
        for function in self.functions.values():
            options = function.engine_options
            sources += [options.get("approvals") or self.store, options.get("cancellations") or self.store]
        roots = watch_roots(sources)
        if self._queue.notifies and not roots:
            return None
        store_roots = watch_roots([self.store])
        return ControlWatch(open_queue(self.store), sorted(self.functions), roots, store_roots=store_roots, sweep_s=self.rescan_s)

    def _nudge(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- the loops ----------------------------------------------------------------------------

    async def _claim_loop(self, in_queue: Callable[..., Awaitable[Any]], pool: concurrent.futures.Executor) -> None:
        assert self._wake is not None
        names = sorted(self.functions)
        trouble = 0
        while not self._stopping.is_set():
            self._wake.clear()
            free = self.concurrency - len(self._running)
            timeout = self.poll_s
            try:
                if not self._queue.in_store:
                    await in_queue(self._queue.rescan, self.rescan_s)
                if free > 0:
                    claims: list[Claim] = await in_queue(self._queue.claim, self.name, names, free, self.claim_ttl_s)
                    for claim in claims:
                        self._start(claim, pool, in_queue)
                    if len(claims) == free:
                        continue  # more may be due: claim again once a run ends, or now
                    due_in = await in_queue(self._queue.next_due_in, names)
                    if due_in is not None:
                        timeout = min(timeout, max(due_in, 0.02))
                    if not self._queue.in_store:
                        timeout = min(timeout, self.rescan_s)
                trouble = 0
            except LongrunError as exc:  # the database is away: keep the runs going, try again later
                trouble += 1
                timeout = min(30.0, 0.5 * 2**trouble)
                log.warning("worker %s: the queue could not be read (%s); trying again in %.1fs", self.name, exc, timeout)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    async def _keep_alive(self, in_queue: Callable[..., Awaitable[Any]]) -> None:
        interval = self.claim_ttl_s / 3
        while True:
            await asyncio.sleep(interval)
            claims = [claim for claim, _ in self._running.values()]
            try:
                lost = await in_queue(self._queue.extend, claims, self.claim_ttl_s)
                for claim in lost:
                    log.info("worker %s: its claim on task %s lapsed; the task's lease still decides who runs it", self.name, claim.task_id)
                await in_queue(self._heartbeat, "draining" if self._stopping.is_set() else "running")
            except LongrunError as exc:
                log.warning("worker %s: heartbeat failed: %s", self.name, exc)

    def _heartbeat(self, state: str) -> None:
        self._queue.heartbeat(
            self.name, host=self.host, pid=os.getpid(), state=state, concurrency=self.concurrency,
            running=len(self._running), functions=sorted(self.functions), heartbeat_s=self.claim_ttl_s / 3,
        )  # fmt: skip

    def _start(self, claim: Claim, pool: concurrent.futures.Executor, in_queue: Callable[..., Awaitable[Any]]) -> None:
        running = self._running.get(claim.task_id)
        if running is not None:
            # This worker's own claim lapsed (a late heartbeat) and it claimed the row again: the run
            # under way goes on under the new claim, which its finish then ends.
            self._running[claim.task_id] = (claim, running[1])
            return
        task = asyncio.create_task(self._run_claim(claim, pool, in_queue), name=f"longrun-{claim.task_id}")
        self._running[claim.task_id] = (claim, task)

    async def _run_claim(self, claim: Claim, pool: concurrent.futures.Executor, in_queue: Callable[..., Awaitable[Any]]) -> None:
        loop = asyncio.get_running_loop()
        try:
            function = self.functions[claim.function]
            if function.is_async:
                try:
                    prepared = await loop.run_in_executor(pool, self._runner.prepare, claim)
                except Exception as exc:
                    prepared = self._runner.failed(claim, describe_exception(exc), exc)
                disposition = prepared if isinstance(prepared, Disposition) else await self._runner.run_async(claim, *prepared)
            else:
                disposition = await loop.run_in_executor(pool, self._runner.run_sync, claim)
            self._runs += 1
            self._statuses[disposition.status] = self._statuses.get(disposition.status, 0) + 1
            claim = self._running.get(claim.task_id, (claim,))[0]  # the newest claim on the row
            for attempt in range(5):
                try:
                    finish = functools.partial(
                        self._queue.finish, claim, disposition.status, wake_in_s=disposition.wake_in_s,
                        wake_at=disposition.wake_at, error=disposition.error, wake_parent=disposition.wake_parent,
                        fingerprint=self._fingerprint(claim.task_id),
                    )  # fmt: skip
                    await in_queue(finish)
                    break
                except LongrunError as exc:  # the claim lapses if this never lands: the task is due again then
                    log.warning("worker %s: recording the run of %s failed (%s)", self.name, claim.task_id, exc)
                    await asyncio.sleep(min(5.0, 0.2 * 2**attempt))
        finally:
            self._running.pop(claim.task_id, None)
            self._nudge()

    def _fingerprint(self, task_id: str) -> str | None:
        if self._queue.in_store:
            return None
        try:
            return self._queue.fingerprint(task_id)
        except LongrunError:
            return None  # the next rescan looks again
