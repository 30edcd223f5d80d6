"""Running one claimed task: the function as the worker runs it, its recorded arguments, and when
the task is due next from the run's outcome (a ``Disposition`` the queue row records).

``ClaimRunner`` runs a task for a ``Worker``, which holds one: in a pool thread (``fn.run``) or on
the worker's event loop (``fn.arun``). Each thread has a store object of its own, the function runs with
the worker's name as its lease owner, the drain wired into its cancellation source, its limited
actions and the clock offset. A run whose function raised is tried again when the task's state
says (``RunState.last_failure.retry_at``, the run's retry policy), and never once it is ``failed``;
a run that raised for another reason (the store, bad options) after a growing delay.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from typing import Any, Mapping

from ..clock import SystemClock
from ..errors import LongrunError, UnknownTaskError, describe_exception
from ..functions import FUNCTION_STEP, DurableFunction
from ..outcome import TERMINAL, RunOutcome, Status
from ..protocols import CancellationSource, Clock, SigningSource, Store
from ..stores.queue import Claim
from ..stores.postgres import PostgresStore
from ..stores.sqlite import SqliteStore
from ._limits import LimitedAdapter, SlotKeeper

__all__ = ["ERROR_BACKOFF_S", "PARKED", "ClaimRunner", "Disposition"]

log = logging.getLogger("longrun")

PARKED = frozenset({Status.AWAITING_APPROVAL, Status.AWAITING_INPUT, Status.UNSAFE_TO_CONTINUE, Status.PLAN_MISMATCH, Status.STATE_UNRECOVERABLE})
"""Outcomes that wait for a person: the row sleeps until a control record (or a rescan) wakes it."""
ERROR_BACKOFF_S = (5.0, 600.0)
"""A run that raised without its state recording the failure (a storage error, bad options) is tried again after
``5 s * 2**(failures - 1)``, at most 10 minutes, counting the runs in a row that raised on any worker
(the queue row keeps the count): a fixed deployment picks it up, a broken one does not spin."""


@dataclasses.dataclass(frozen=True, slots=True)
class Disposition:
    status: str
    wake_in_s: float | None = None
    wake_at: float | None = None
    error: str | None = None
    wake_parent: bool = False


class _SkewedClock:
    """Another clock shifted by ``offset_s`` (a testing aid: a worker machine whose wall clock is off)."""

    def __init__(self, inner: Clock, offset_s: float):
        self._inner = inner
        self._offset_s = offset_s

    def now(self) -> float:
        return self._inner.now() + self._offset_s

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)

    def __getattr__(self, name: str) -> Any:  # monotonic(), monotonic_id(): the skew is the wall clock's only
        return getattr(self._inner, name)


class _Draining:
    """A cancellation source that also says when the worker is draining (``Engine`` asks it between steps)."""

    def __init__(self, inner: CancellationSource, stopping: threading.Event):
        self._inner = inner
        self._stopping = stopping
        self.requires_signature = isinstance(inner, SigningSource) and inner.requires_signature

    def read_cancellation(self, task_id: str) -> Any:
        return self._inner.read_cancellation(task_id)

    def pause_requested(self, task_id: str) -> bool:
        return self._stopping.is_set()


def _clone_store(store: Store) -> Store:
    """A store object of its own for one thread: SQL stores run one transaction at a time per object."""
    if isinstance(store, PostgresStore):
        return PostgresStore(store.connect, transaction_timeout_s=store.transaction_timeout_s)
    if isinstance(store, SqliteStore):
        return SqliteStore(store.path, busy_timeout_s=store.busy_timeout_s, create=store.create)
    return store  # the JSON-file store runs different tasks in parallel through one object


class ClaimRunner:
    """Runs one claimed task at a time per thread for the worker named ``name`` (see the module
    docstring). ``stopping`` is the worker's drain; ``slots`` is set once the worker holds its action
    slots' queue; ``drained`` counts the runs the drain stopped between two steps."""

    def __init__(
        self,
        store: Store,
        functions: Mapping[str, DurableFunction[Any]],
        *,
        name: str,
        limits: Mapping[str, int],
        clock_offset_s: float,
        stopping: threading.Event,
    ):
        self.store = store
        self.functions = functions
        self.name = name
        self.limits = limits
        self.clock_offset_s = clock_offset_s
        self.slots: SlotKeeper | None = None
        self.drained = 0
        self._stopping = stopping
        self._local = threading.local()
        self._stores: list[Store] = []
        self._stores_lock = threading.Lock()

    def close_stores(self) -> None:
        """Close the store objects made for the threads (not the worker's own)."""
        with self._stores_lock:
            for store in self._stores:
                if store is not self.store:
                    close = getattr(store, "close", None)
                    if callable(close):
                        close()

    # -- running one task ---------------------------------------------------------------------

    def _thread_store(self) -> Store:
        store: Store | None = getattr(self._local, "store", None)
        if store is None:
            store = _clone_store(self.store)
            self._local.store = store
            self._local.variants = {}
            with self._stores_lock:
                self._stores.append(store)
        return store

    def _variant(self, function: DurableFunction[Any], store: Store) -> DurableFunction[Any]:
        """``function`` as this worker runs it: this thread's store, the worker's name as the lease
        owner, the drain wired into its cancellation source, its limited actions, the clock offset."""
        variants: dict[str, DurableFunction[Any]] = self._local.__dict__.setdefault("variants", {})
        variant = variants.get(function.name)
        if variant is None:
            variant = variants[function.name] = function.with_options(**self.overrides(function, store))
        return variant

    def overrides(self, function: DurableFunction[Any], store: Store) -> dict[str, Any]:
        """The engine options this worker runs ``function`` with, over those it was decorated with."""
        options = function.engine_options
        overrides: dict[str, Any] = {
            "store": store,
            "owner": f"{self.name}/{threading.current_thread().name}",
            "cancellations": _Draining(options.get("cancellations") or store, self._stopping),
        }
        if options.get("approvals") is None:
            overrides["approvals"] = store
        if self.limits and self.slots is not None:
            adapters = dict(options.get("adapters") or {})
            for action, limit in self.limits.items():
                if action in adapters:
                    adapters[action] = LimitedAdapter(adapters[action], action, limit, self.slots)
            overrides["adapters"] = adapters
        if self.clock_offset_s:
            overrides["clock"] = _SkewedClock(options.get("clock") or SystemClock(), self.clock_offset_s)
        return overrides

    def prepare(self, claim: Claim) -> tuple[DurableFunction[Any], list[Any], dict[str, Any]] | Disposition:
        """The task's function (as this worker runs it) and recorded arguments; or why it is not run."""
        store = self._thread_store()
        try:
            state = store.load(claim.task_id).state
        except UnknownTaskError:
            return Disposition("missing", error="the queue names a task the store does not hold")
        except LongrunError as exc:
            return self.failed(claim, describe_exception(exc))
        record = state.effects.get(FUNCTION_STEP) if state is not None else None
        payload = record.payload if record is not None else None
        if state is None or not isinstance(payload, dict) or payload.get("function") != claim.function:
            return Disposition("not-runnable", error=f"the task records no run of {claim.function}")
        if state.status in TERMINAL:
            return Disposition(state.status.value, wake_parent=True)
        args, kwargs = payload.get("args"), payload.get("kwargs")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return Disposition("not-runnable", error="the task's function record is malformed")
        return self._variant(self.functions[claim.function], store), args, kwargs

    def run_sync(self, claim: Claim) -> Disposition:
        try:
            prepared = self.prepare(claim)
            if isinstance(prepared, Disposition):
                return prepared
            variant, args, kwargs = prepared
            outcome = variant.run(claim.task_id, *args, **kwargs)
        except Exception as exc:  # the function's own code raised (recorded in its state), or its options are bad
            return self.raised(claim, exc)
        return self._disposition(claim, variant, outcome)

    async def run_async(
        self, claim: Claim, variant: DurableFunction[Any], args: list[Any], kwargs: dict[str, Any]
    ) -> Disposition:
        try:
            outcome = await variant.arun(claim.task_id, *args, **kwargs)
        except Exception as exc:
            return await asyncio.to_thread(self.raised, claim, exc)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._disposition, claim, variant, outcome)

    def raised(self, claim: Claim, exc: Exception) -> Disposition:
        """A run raised. If the task's state recorded it as the function's failure (the latest
        commit did), the state says what comes next: ``failed`` (no retry), or ``retry-scheduled`` at
        the recorded time. Otherwise (the store failed, the options are bad) the queue's own backoff."""
        try:
            state = self._thread_store().load(claim.task_id).state
        except LongrunError:
            state = None
        failure = state.last_failure if state is not None else None
        if state is None or failure is None or failure.revision != state.revision or state.status not in (Status.FAILED, Status.RETRY_SCHEDULED):
            return self.failed(claim, describe_exception(exc), exc)
        log.warning(
            "worker %s: task %s raised %s", self.name, claim.task_id, failure.summary(),
            exc_info=exc if not isinstance(exc, LongrunError) else None, extra={"task": claim.task_id, "worker": self.name},
        )  # fmt: skip
        error = f"{failure.error_type}: {failure.message}"[:2000]
        if state.status is Status.FAILED:
            return Disposition(Status.FAILED.value, error=error, wake_parent=True)
        clock: Clock = self.functions[claim.function].engine_options.get("clock") or SystemClock()
        wake_in = 0.0 if failure.retry_at is None else max(0.0, failure.retry_at - (clock.now() + self.clock_offset_s))
        return Disposition(Status.RETRY_SCHEDULED.value, wake_in_s=wake_in, error=error)

    def failed(self, claim: Claim, error: str, exc: BaseException | None = None) -> Disposition:
        failures = min(claim.failures, 16) + 1  # this run's failure, after those the row counts
        delay = min(ERROR_BACKOFF_S[1], ERROR_BACKOFF_S[0] * 2 ** (failures - 1))
        log.warning(
            "worker %s: task %s raised %s; trying it again in %.0fs", self.name, claim.task_id, error, delay,
            exc_info=exc if exc is not None and not isinstance(exc, LongrunError) else None,
            extra={"task": claim.task_id, "worker": self.name},
        )  # fmt: skip
        return Disposition("error", wake_in_s=delay, error=error[:2000])

    def _disposition(self, claim: Claim, variant: DurableFunction[Any], outcome: RunOutcome) -> Disposition:
        """When the task is due next, from its outcome (times relative to the function's own clock)."""
        status = outcome.status
        clock: Clock = variant.engine_options.get("clock") or SystemClock()
        if status is Status.RETRY_SCHEDULED and outcome.next_action.startswith("run again now: the worker"):
            self.drained += 1
        if status in TERMINAL:
            return Disposition(status.value, wake_parent=True)
        if status in PARKED and not (status is Status.AWAITING_INPUT and outcome.wake_at is not None):
            return Disposition(status.value)
        if status in (Status.RETRY_SCHEDULED, Status.SLEEPING, Status.WAITING_ON_CHILD, Status.AWAITING_INPUT):
            # awaiting-input with a wake time: a receive whose timeout ends then (a message wakes it sooner)
            if outcome.wake_at is None:
                return Disposition(status.value, wake_in_s=None if status is Status.WAITING_ON_CHILD else 0.0)
            return Disposition(status.value, wake_in_s=max(0.0, outcome.wake_at - clock.now()))
        if status in (Status.ALREADY_RUNNING, Status.LEASE_LOST):
            # Someone else holds the lease (a worker frozen past its claim, a run outside the fleet):
            # try again when it ends, by the store's own lease clock.
            try:
                lease = self._thread_store().read_lease(claim.task_id)
            except LongrunError:
                lease = None
            if lease is None or lease.released:
                return Disposition(status.value, wake_in_s=0.2)
            return Disposition(status.value, wake_at=lease.expires_at)
        return Disposition(status.value, wake_in_s=0.0)
