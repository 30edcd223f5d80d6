"""The engine: the recovery procedure and the rules of one step, shared by every face.

A face (``Runner`` for a plan declared up front, ``durable`` for a function whose steps are decided
as it runs) hands ``Engine.run`` a ``Plan``: the digest that pins it, how a recorded state is
checked against it, and how to drive it. The engine takes the task's lease, recovers, lets the plan
drive one step at a time through ``Engine.effect`` / ``Engine.call`` / ``Engine.timer``, and returns
the legal stop as a ``RunOutcome`` with one safe next action. Call it again (after a crash, an
approval, a backoff) and it continues where the durable state says, never repeating a verified
effect.

Durability rules the loop keeps:

- ``started`` (attempt, payload digest, epoch) is committed before ``apply`` is called, always in
  its own commit that precedes the call.
- The verification of effect i is committed together with the start of effect i+1 (or with the
  run's stop), so a sequential run costs one commit per effect. If the process dies in between,
  recovery observes effect i again, finds it applied, and verifies it without re-applying.
- A transient failure's backoff time is committed at once, so a restart honours it.
- Cancellation and approvals are read before every new effect, never cached, through the runner's
  cancellation and approval sources (by default the store; ``longrun.authority`` has strict and
  signed ones). A refused approval record authorizes nothing and its reason is recorded; a refused
  or unreadable cancellation record stops the run ``unsafe-to-continue``, which starts nothing but,
  unlike a cancellation, does not end the run for good on a record nobody can vouch for.
- The lease is renewed in the background while the run holds it; if a renewal fails the runner
  makes no further write and returns ``lease-lost``.

Not guaranteed: that a synchronous adapter call stops when the lease is lost, its timeout passes
or the task is cancelled (threads cannot be killed: the run stops waiting, keeps the lease until the
thread ends, and the call can check ``EffectRequest.cancelled()``; targets should check
``EffectRequest.epoch`` and ``deadline``). Async applies are cancelled.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import datetime
import logging
import math
import os
import secrets
import socket
import threading
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Protocol, Sequence, TypeVar

from . import _crashpoints
from ._io import COMMIT, Apply, ApplyTimedOut, Commit, Gather, Invoke, Observe, Op, Sleep, Steps, call_in_thread, drive, is_async_callable
from .adapters import EffectRequest, Observation, ObservedState
from .approval import Approval, ApprovalRequest, GateVerdict, evaluate_gate
from .budget import WORK_CHARGE_STEP_S, Backoff, BudgetCounters, Limits, RetryPolicy, describe_wall_gap
from .cancellation import judge_cancellation
from .canonical import MAX_VALUE_BYTES, JSONValue, canonical_bytes, digest_of, ensure_json, printable
from .contract import INTERNAL_PREFIX, RunContract, Step, is_internal
from .control import ControlRecord, RefusedRecord
from .envelope import RunState
from .events import EventHook, Reporter
from .errors import (
    CorruptStateError,
    FencedError,
    InvalidInputError,
    LeaseHeldError,
    PayloadError,
    PermanentError,
    SizeLimitError,
    StateUnrecoverableError,
    StorageError,
    TransientError,
    UnknownActionError,
)
from .clock import SystemClock
from .lease import Lease, LeaseKeeper
from .ledger import EffectRecord, EffectState, check_receipt, recordable_result
from .outcome import TERMINAL, WAITING, Evidence, RunOutcome, Status
from .protocols import AnyEffectAdapter, ApprovalSource, CancellationSource, Clock, Store
from .recovery import Reconciled, Verdict, observe_safely, settle

if TYPE_CHECKING:
    from ._concurrency import AsyncDriver

__all__ = ["INTERNAL_PREFIX", "AsyncPlan", "Engine", "Plan", "Stop", "check_timeout", "default_owner", "is_internal", "utc"]

log = logging.getLogger("longrun")

T = TypeVar("T")


def utc(timestamp: float) -> str:
    """A time as UTC ISO 8601 with milliseconds, as next actions print it."""
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat(timespec="milliseconds")


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def check_timeout(value: object, what: str) -> float:
    """A timeout in seconds: a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidInputError(f"{what}: timeout_s must be a finite number > 0, got {value!r}")
    return float(value)


def check_parallel(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"max_parallel must be an integer >= 1, got {value!r}")
    return value


class _Trail:
    """One kind of evidence of a run: every item, up to ``head + tail`` of them; past that the
    first ``head`` and the last ``tail``, with a note of how many between were left out. A run of
    100,000 effects keeps a bounded trail in memory and in its outcome, never the first items'
    context nor the latest."""

    HEAD = 200
    TAIL = 800

    def __init__(self) -> None:
        self._head: list[Evidence] = []
        self._tail: collections.deque[Evidence] = collections.deque(maxlen=self.TAIL)
        self._omitted = 0

    def append(self, item: Evidence) -> None:
        if len(self._head) < self.HEAD:
            self._head.append(item)
            return
        if len(self._tail) == self.TAIL:
            self._omitted += 1
        self._tail.append(item)

    def items(self) -> tuple[Evidence, ...]:
        if not self._omitted:
            return (*self._head, *self._tail)
        gap = Evidence("runner", f"{self._omitted} more items of this kind are left out here", self._tail[0].at)
        return (*self._head, gap, *self._tail)


class _Evidence:
    """Collects one run's observations, inferences and unknowns, stamped by the clock. The first
    two are bounded trails (``_Trail``); unknowns are kept whole, since each may need a person."""

    def __init__(self, clock: Clock):
        self._clock = clock
        self.observations = _Trail()
        self.inferences = _Trail()
        self.unknowns: list[Evidence] = []

    def observed(self, source: str, detail: str) -> Evidence:
        item = Evidence(source, detail, self._clock.now())
        self.observations.append(item)
        return item

    def inferred(self, detail: str) -> None:
        self.inferences.append(Evidence("runner", detail, self._clock.now()))

    def unknown(self, source: str, detail: str) -> Evidence:
        item = Evidence(source, detail, self._clock.now())
        self.unknowns.append(item)
        return item


def _question(record: EffectRecord) -> str:
    question = record.payload.get("question") if isinstance(record.payload, dict) else None
    text = str(question) if question is not None else "?"
    return repr(text if len(text) <= 120 else text[:117] + "...")


def _describe(kind: str, raw: ControlRecord) -> str:
    """One observation line for a control record: which bytes were read, and why it is unusable."""
    text = f"{kind} {raw.name} ({raw.digest or 'no bytes read'})"
    if isinstance(raw, RefusedRecord):
        return f"{text} refused: {raw.error}"
    if raw.error is not None:
        return f"{text} unusable: {raw.error}"
    return text


class Stop(BaseException):
    """Unwinds a face's driving code to ``Engine.run``, which returns it as an outcome.

    A ``BaseException`` so that no broad ``except Exception`` on the way, in the library or in a
    user's durable function, can swallow a stop.
    """

    def __init__(self, status: Status, next_action: str, *, wake_at: float | None = None):
        super().__init__(status.value)
        self.status = status
        self.next_action = next_action
        self.wake_at = wake_at

    def again(self) -> "Stop":
        """The same stop, to raise in another step that may not go on (parallel steps share one)."""
        return Stop(self.status, self.next_action, wake_at=self.wake_at)

    @property
    def waits(self) -> bool:
        """Whether the stop waits for something (a person, a timer, a child): steps in parallel
        that do not depend on the waiting one may still go on."""
        return self.status in WAITING

    def outranks(self, other: "Stop") -> bool:
        """Whether this stop should be the run's outcome rather than ``other``: a stop that ends or
        blocks the run outranks one that waits (for a person, a timer, a child)."""
        return self.status not in WAITING and other.status in WAITING


_Stop = Stop

_MIN_WAIT_S = 0.001
"""A backoff with less than this left is over (see ``Engine._backing_off``)."""

_VERIFIED_STATE = EffectState.VERIFIED
"""A plain reference: reading an enum member off its class costs a descriptor call each time."""
_VERIFIED = frozenset({EffectState.VERIFIED})
_SETTLED_CALL = frozenset({EffectState.VERIFIED, EffectState.FAILED})
"""A call's record is settled either way: a recorded exception replays as ``CallFailed``."""


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

    ``Engine`` holds what every face shares: the store, the adapters, the clock, the limits and
    retry policy, the lease, and the authority sources. ``run(plan)`` is one invocation: lease,
    load and validate, reconcile, then the plan drives its steps through ``effect``, ``call`` and
    ``timer``, each of which reads cancellation fresh, enforces the budgets, persists the intent
    before acting and settles by observation. Not thread-safe: one invocation at a time.
    """

    def __init__(
        self,
        contract: RunContract,
        *,
        store: Store,
        adapters: Mapping[str, AnyEffectAdapter],
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
        asynchronous: bool = False,
    ):
        if not isinstance(contract, RunContract):
            raise InvalidInputError("contract must be a RunContract")
        self.contract = contract
        self._reporter = Reporter(contract.task_id, on_event)
        if not isinstance(adapters, Mapping):
            raise InvalidInputError("adapters must map action names to EffectAdapter objects")
        # The Protocol check is once per action, not once per step (a plan may have 100,000 steps).
        for action, adapter in adapters.items():
            if not all(hasattr(adapter, name) for name in ("apply", "observe", "deduplicates")):
                raise InvalidInputError(f"adapter for {action!r} lacks apply, observe or deduplicates")
            if not asynchronous and (is_async_callable(adapter.apply) or is_async_callable(adapter.observe)):
                raise InvalidInputError(
                    f"adapter for {action!r} is async (its apply or observe is a coroutine function): run it with the "
                    "async face (an async durable function, or Runner.arun)"
                )
        if isinstance(lease_ttl_s, bool) or not isinstance(lease_ttl_s, (int, float)) or not lease_ttl_s > 0:
            raise InvalidInputError(f"lease_ttl_s must be a positive number, got {lease_ttl_s!r}")
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise InvalidInputError("owner must be a non-empty string")
        if approvals is not None and not isinstance(approvals, ApprovalSource):
            raise InvalidInputError("approvals must be an ApprovalSource (a read_approvals(task_id) method)")
        if cancellations is not None and not isinstance(cancellations, CancellationSource):
            raise InvalidInputError("cancellations must be a CancellationSource (a read_cancellation(task_id) method)")
        if limits is not None and not isinstance(limits, Limits):
            raise InvalidInputError("limits must be a Limits")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidInputError("retry must be a RetryPolicy")
        self.store = store
        self.approvals: ApprovalSource = approvals if approvals is not None else store
        self.cancellations: CancellationSource = cancellations if cancellations is not None else store
        self.adapters = dict(adapters)
        self.owner = owner or default_owner()
        self.clock: Clock = clock or SystemClock()
        self.limits = limits or Limits()
        self.retry = retry or RetryPolicy()
        self.lease_ttl_s = float(lease_ttl_s)
        self.timeout_s = None if timeout_s is None else check_timeout(timeout_s, "the run")
        self.max_parallel = check_parallel(max_parallel)
        self.asynchronous = asynchronous
        self.plan_digest = ""
        self._lease: Lease | None = None
        self._keeper: LeaseKeeper | None = None
        self._state: RunState | None = None
        self._dirty = False
        self._changed: set[str] = set()
        self._cancellation_checked = False
        self._policies: dict[str, RetryPolicy] = {}
        self._timeouts: dict[str, float] = {}
        self._stopping: Stop | None = None
        """The stop a step recorded while others may still be in flight: no new step starts."""
        self._stragglers: list[concurrent.futures.Future[Any]] = []
        """Timed-out attempts still running in a worker thread: the lease is kept until they end."""
        self._driver: AsyncDriver | None = None
        self.cancel_signal = threading.Event()
        """Set when a cancellation is read while the run holds its lease (``EffectRequest.cancelled``)."""
        self._observe_next = True
        self._evidence = _Evidence(self.clock)
        self._worked_mark = 0.0
        """Monotonic reading up to which this run's work is charged to ``state.budget.worked_s``."""
        self._working = False
        """Whether this run planned, applied or observed a step (else it only read and waited)."""
        self._wake_at: float | None = None
        self._result: JSONValue = None

    @property
    def task_id(self) -> str:
        return self.contract.task_id

    @property
    def state(self) -> RunState:
        """The working state of the invocation under way."""
        assert self._state is not None, "no invocation is under way"
        return self._state

    def adapter_for(self, action: str, *, step_id: str) -> AnyEffectAdapter:
        adapter = self.adapters.get(action)
        if adapter is None:
            raise UnknownActionError(
                f"step {step_id!r} uses action {action!r}, which has no adapter (have: {sorted(self.adapters)})"
            )
        return adapter

    # -- the public entry point ---------------------------------------------------------------

    def run(self, plan: Plan) -> RunOutcome:
        """Recover and let ``plan`` advance the run as far as it may go now; return why it stopped."""
        if self.asynchronous:
            raise InvalidInputError("this engine has async adapters: use `await engine.arun(plan)`")
        early = self._open(plan)
        if early is not None:
            return early
        assert self._keeper is not None
        try:
            with self._keeper:
                status, next_action = self._recover_and_run(plan)
        except FencedError as exc:
            return self._fenced(exc)
        except BaseException:
            self._release(quiet=True)
            raise
        return self._close(plan, status, next_action)

    async def arun(self, plan: AsyncPlan) -> RunOutcome:
        """``run`` under the async driver: the plan's steps are awaited, parallel ones side by side
        (at most ``max_parallel`` at once), and the starts that become ready together share a commit."""
        from ._concurrency import AsyncDriver

        early = self._open(plan)
        if early is not None:
            return early
        assert self._keeper is not None
        try:
            with self._keeper:
                async with AsyncDriver(self, self.max_parallel) as driver:
                    status, next_action = await driver.recover_and_run(plan)
        except FencedError as exc:
            return self._fenced(exc)
        except BaseException:
            self._release(quiet=True)
            raise
        return self._close(plan, status, next_action)

    def _open(self, plan: Plan) -> RunOutcome | None:
        """Begin an invocation: reset, take the lease; an outcome if the lease cannot be taken."""
        self._evidence = _Evidence(self.clock)
        self._state = None
        self._dirty = False
        self._changed = set()
        self._cancellation_checked = False
        self._working = False
        self._policies = {}
        # The first apply of every call is preceded by an observe of that effect (and of each one
        # after it, until one is observed absent): a state rolled back further than any check can
        # see then finds its effects applied and verifies them instead of repeating them.
        self._observe_next = True
        self._wake_at = None
        self._result = None
        self._timeouts = {}
        self._stopping = None
        self._stragglers = []
        self.cancel_signal = threading.Event()
        self.plan_digest = plan.digest
        self._reporter.begin(self.owner)
        try:
            self._lease = self.store.acquire_lease(
                self.task_id, self.owner, self.lease_ttl_s, self.clock.now(), **self._monotonic_reading()
            )
        except LeaseHeldError as exc:
            holder = exc.holder if isinstance(exc.holder, Lease) else None
            self._evidence.observed("store", str(exc))
            self._evidence.unknown("lease", "whether the current lease holder is alive and making progress")
            until = ""
            if holder is not None:
                now = self.clock.now()
                until = f" at {utc(now + max(0.0, holder.remaining(now, self._monotonic_reading().get('monotonic'))))}"
            progress = ""
            try:  # the holder's progress, for the outcome: a read-only load takes no lease and moves nothing
                self._state = self.store.load(self.task_id).state
            except (CorruptStateError, StorageError) as load_error:
                self._evidence.unknown("store", f"the task's progress could not be read: {load_error}")
            if self._state is not None:
                progress = f"; so far revision {self._state.revision}, {plan.progress(self._state)}"
            return self._outcome(
                Status.ALREADY_RUNNING,
                f"wait for the current owner to finish or for its lease to expire{until}, then run again{progress}",
            )
        except CorruptStateError as exc:
            self._evidence.observed("store", f"the lease record cannot be read: {exc}")
            self._evidence.unknown("lease", "who holds the task's lease, and at which epoch")
            return self._outcome(
                Status.STATE_UNRECOVERABLE,
                f"repair the lease record with `longrun repair <store> {self.task_id} --lease` (it keeps the damaged "
                "record aside and the next run gets an epoch above every one recorded), then run again",
            )
        self._evidence.observed("store", f"lease acquired by {self.owner} at epoch {self._lease.epoch}")
        self._keeper = LeaseKeeper(
            self._lease, self._renew, self.lease_ttl_s / 3, self._monotonic, on_renewed=self._watch_cancellation
        )
        return None

    def _fenced(self, exc: FencedError) -> RunOutcome:
        self._evidence.observed("store", f"write refused: {exc}")
        self._evidence.unknown("lease", "another runner took over this task; its progress is not known here")
        return self._outcome(Status.LEASE_LOST, "nothing on this runner: the newer lease holder continues the run")

    def _close(self, plan: Plan, status: Status, next_action: str) -> RunOutcome:
        if status is not Status.LEASE_LOST:
            self._release(quiet=False)
        if self._state is not None:
            self._result = plan.result(self._state)
        return self._outcome(status, next_action)

    # -- lease --------------------------------------------------------------------------------

    def _renew(self, lease: Lease) -> Lease:
        return self.store.renew_lease(lease, self.lease_ttl_s, self.clock.now(), **self._monotonic_reading())

    def _monotonic_reading(self) -> dict[str, tuple[str, float]]:
        """``{"monotonic": (timeline, reading)}`` for the store's lease calls if the clock names the
        timeline of its ``monotonic()`` (``SystemClock``: this boot), else nothing: the store then
        judges expiry by wall clock, and a store written before this keyword still works."""
        monotonic_id: Callable[[], str | None] | None = getattr(self.clock, "monotonic_id", None)
        timeline = monotonic_id() if callable(monotonic_id) else None
        monotonic: Callable[[], float] | None = getattr(self.clock, "monotonic", None)
        if not timeline or not callable(monotonic):
            return {}
        return {"monotonic": (timeline, monotonic())}

    def _current_lease(self) -> Lease:
        """The lease to write under; raises ``_Stop(lease-lost)`` if background renewal failed."""
        assert self._keeper is not None
        if self._keeper.failure is not None:
            self._evidence.observed("lease", f"background renewal failed: {self._keeper.failure}")
            raise _Stop(Status.LEASE_LOST, "nothing on this runner: the lease was lost, no further write was made")
        lease = self._keeper.lease
        if self._keeper.stale(self.lease_ttl_s):
            lease = self._renew(lease)
            self._keeper.replace(lease)
        return lease

    def _monotonic(self) -> float:
        """The clock's ``monotonic()`` if it has one (``FakeClock`` does), else its ``now()``."""
        monotonic: Callable[[], float] | None = getattr(self.clock, "monotonic", None)
        return monotonic() if callable(monotonic) else self.clock.now()

    def _release(self, *, quiet: bool) -> None:
        lease = self._keeper.lease if self._keeper is not None else self._lease
        if lease is None:
            return
        running = [future for future in self._stragglers if not future.done()]
        if running:
            # A timed-out attempt is still running in a worker thread: no other run may start this
            # task (and apply the effect again) before it ends, so the lease is kept, and renewed,
            # until then. If this process exits first, the lease simply expires.
            log.info("%s: keeping the lease until %d timed-out attempt(s) end", self.task_id, len(running))
            threading.Thread(
                target=self._release_after, args=(lease, running), name=f"longrun-straggler-{self.task_id}", daemon=True
            ).start()
            return
        try:
            self.store.release_lease(lease, self.clock.now(), **self._monotonic_reading())
        except FencedError as exc:
            log.info("lease on %s was already taken over: %s", self.task_id, exc)
        except Exception:
            if not quiet:
                raise
            log.exception("releasing the lease on %s failed while another error propagates", self.task_id)

    def _release_after(self, lease: Lease, running: list[concurrent.futures.Future[Any]]) -> None:
        keeper = LeaseKeeper(lease, self._renew, self.lease_ttl_s / 3, self._monotonic)
        with keeper:
            concurrent.futures.wait(running)
        if keeper.failure is not None:
            return  # the lease is gone already: nothing to release
        try:
            self.store.release_lease(keeper.lease, self.clock.now(), **self._monotonic_reading())
        except FencedError as exc:
            log.info("lease on %s was already taken over: %s", self.task_id, exc)
        except Exception:  # a background thread has no caller to raise to: logged with its traceback
            log.exception("releasing the lease on %s after its timed-out attempts ended failed", self.task_id)

    def _watch_cancellation(self) -> None:
        """Called by the lease keeper after each renewal: a cancellation written while an effect
        runs reaches it (``EffectRequest.cancelled()``; async applies are cancelled)."""
        if self.cancel_signal.is_set():
            return
        raw = self.cancellations.read_cancellation(self.task_id)
        if raw is None or judge_cancellation(raw, self.task_id).verdict != "cancelled":
            return  # anything else is judged by the run itself before its next step
        log.info("%s: cancellation read while steps run; signalling them", self.task_id)
        self.cancel_signal.set()
        driver = self._driver
        if driver is not None:
            driver.signal_cancelled()

    # -- what the drivers call ----------------------------------------------------------------

    def perform(self, op: Op) -> Any:
        """Wait for ``op`` in this thread (the synchronous driver; the async one for what it does not await)."""
        if isinstance(op, Commit):
            self.flush()
            return None
        if isinstance(op, Observe):
            return observe_safely(op.adapter, op.request)
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
        from ._concurrency import AsyncDriver

        check_parallel(max_parallel)
        if self._driver is not None:
            raise InvalidInputError("steps in parallel are already running: await them instead")

        async def main() -> T:
            async with AsyncDriver(self, max_parallel) as driver:
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

    def _sequential(self) -> bool:
        """Whether no other step of this run is in flight beside the one asking."""
        return self._driver is None or self._driver.active <= 1

    # -- persistence --------------------------------------------------------------------------

    def _put(self, record: EffectRecord) -> None:
        """Replace a step's effect record in the working state; it goes out with the next commit."""
        assert self._state is not None
        self._reporter.moved(self._state.effects.get(record.step_id), record)
        self._state.effects[record.step_id] = record
        self._changed.add(record.step_id)
        self._dirty = True

    def _commit(self) -> None:
        state = self._state
        assert state is not None
        lease = self._current_lease()
        state.updated_at = self.clock.now()
        state.budget = state.budget.worked(self._take_work())
        try:
            self.store.commit(lease, state, frozenset(self._changed))
        except SizeLimitError as exc:
            # Nothing was written: the state would be too large to read back. Record the stop on the
            # last durable state instead (a load reads it); whatever this run did since is in flight
            # there, and the next run observes it again before anything else.
            self._evidence.unknown("store", str(exc))
            next_action = (
                f"make the run's state smaller: it would be over {exc.limit_name} ({exc.limit} bytes) at step "
                f"{state.current_step!r}; keep large payloads and results outside it (pass references), then run again"
            )
            durable = self.store.load(self.task_id, lease=lease).state
            if durable is not None:
                durable.status, durable.next_action = Status.UNSAFE_TO_CONTINUE, next_action
                durable.unknowns = list(self._evidence.unknowns)
                durable.updated_at = self.clock.now()
                self._state = durable
                self._changed.clear()
                self.store.commit(lease, durable, frozenset())
            raise _Stop(Status.UNSAFE_TO_CONTINUE, next_action) from None
        self._changed.clear()
        self._dirty = False
        if _crashpoints.ARMED:
            _crashpoints.hit("state.committed", state.revision)
        self._reporter.committed(state)

    def _stop(self, status: Status, next_action: str, *, wake_at: float | None = None) -> _Stop:
        """Record a stop in the state (committed) and return the exception that unwinds to ``run``.

        With steps in parallel, the first stop stands unless a later one outranks it (a stop that
        ends or blocks the run outranks one that waits). After one that ends or blocks the run, no
        step starts; after one that waits, steps that do not depend on the waiting one go on."""
        next_action = printable(next_action)  # it may quote control record names and error text
        stop = _Stop(status, next_action, wake_at=wake_at)
        if self._stopping is not None and not stop.outranks(self._stopping):
            self._evidence.inferred(f"a parallel step would also stop the run {status.value}: {next_action}")
            return self._stopping.again()
        self._stopping = stop
        state = self._state
        assert state is not None
        state.status = status
        state.next_action = next_action
        if status in TERMINAL:
            # An ended run asks nothing more of anyone: open approval requests are withdrawn.
            state.approval_requests.clear()
        state.unknowns = list(self._evidence.unknowns)
        if self._working or status not in WAITING:
            state.budget = state.budget.worked(self._take_work(least=0.0))  # a stop charges all of this run's work
        else:  # a run that only read the state and found it must wait: that was waiting, not work
            self._worked_mark = self._monotonic()
        self._commit()
        return stop.again()

    # -- the procedure ------------------------------------------------------------------------

    def _recover_and_run(self, plan: Plan) -> tuple[Status, str]:
        try:
            drive(self._recover(plan), self._perform)
            plan.drive(self)
        except _Stop as stop:
            self._wake_at = stop.wake_at
            return stop.status, stop.next_action
        except Exception:
            self.keep_settled()
            raise
        raise AssertionError("the plan ended without a stop")  # pragma: no cover

    def keep_settled(self) -> None:
        """The plan's own code raised (a durable function's bug, say). What is settled so far is
        kept, so a corrected function resumes from it; the error goes to the caller."""
        if self._state is not None and self._dirty and self._keeper is not None and self._keeper.failure is None:
            self._commit()

    def recover_steps(self, plan: Plan) -> Steps[None]:
        """The recovery procedure (load, validate, observe everything in flight) as a step procedure."""
        return self._recover(plan)

    def woke_at(self, wake_at: float | None) -> None:
        """When the stopped run should run again (the outcome's ``wake_at``)."""
        self._wake_at = wake_at

    def policy_deadline(self, step_id: str) -> float:
        """The retry policy's per-call deadline for a step, the async driver's bound on an apply."""
        return self._policies.get(step_id, self.retry).deadline_s

    def _recover(self, plan: Plan) -> Steps[None]:
        assert self._lease is not None
        self._worked_mark = self._monotonic()  # this run's work is charged from here
        try:
            loaded = self.store.load(self.task_id, lease=self._lease)
        except StateUnrecoverableError as exc:
            self._evidence.observed("store", str(exc))
            self._evidence.unknown("store", "which effects took place after the last readable revision")
            raise _Stop(
                Status.STATE_UNRECOVERABLE,
                "inspect the state (the observations say what is damaged, rolled back or missing; damaged files are "
                "quarantined) and the target before anything else; do not restart this task from scratch: to go on "
                "under a new task id, mark every step observe_first=True and keep its effect key "
                f"(Step(..., key='{self.task_id}/<step id>') unless it has one) so effects already made are observed, not repeated",
            ) from None
        if _crashpoints.ARMED:
            _crashpoints.hit("recovery.loaded", loaded.state.revision if loaded.state is not None else 0)
        for item in loaded.observations:
            self._evidence.observations.append(item)
        now = self.clock.now()
        if loaded.state is None:
            self._state = RunState(
                task_id=self.task_id,
                plan_digest=self.plan_digest,
                budget=BudgetCounters(created_at=now, last_progress_at=now),
                created_at=now,
                next_action="start the first step",
            )
            plan.initial(self, self._state)
            self._commit()
            self._evidence.inferred("no state existed: this is the task's first run")
            return
        state = loaded.state
        self._state = state
        self._evidence.observed(
            "store", f"state from {loaded.source}, revision {state.revision}, bytes {loaded.digest}, status {state.status.value}"
        )
        self._evidence.observed("clock", describe_wall_gap(state.updated_at, now))
        plan.accept(self, state)
        if state.status in TERMINAL:
            self._evidence.inferred(f"the run already ended {state.status.value}; nothing more will be applied")
            raise _Stop(state.status, state.next_action)
        in_flight = []
        for record in list(state.effects.values()):
            if not record.in_flight:
                continue
            if is_internal(record.action):
                self._interrupted(record)
            else:
                in_flight.append(record)
        # Every effect in flight is observed (at once, bounded, under the async driver) before anything else.
        verdicts: list[Reconciled] = yield Gather(tuple(self._reconcile(record) for record in in_flight), self.max_parallel)
        unsafe = [settled for settled in verdicts if settled.verdict is Verdict.UNSAFE]
        if len(in_flight) == 1 and verdicts[0].verdict is Verdict.RETRY:
            self._observe_next = False  # the effect this call applies first has just been observed
        if unsafe:
            raise self._unsafe(unsafe[0])
        if self._dirty:
            self._commit()

    def refused_action(self, step_id: str, reason: str) -> _Stop:
        """Stop ``unsafe-to-continue`` before a step whose action the contract does not allow."""
        self._evidence.unknown("contract", f"step {step_id!r}: {reason}")
        return self._stop(Status.UNSAFE_TO_CONTINUE, f"change the code or the contract: step {step_id!r} asks for an action it may not take ({reason}); nothing was applied")

    def mismatch(self, detail: str, next_action: str) -> _Stop:
        """A ``plan-mismatch`` stop: the code or plan asks for something other than what was recorded."""
        self._evidence.observed("plan", detail)
        return _Stop(Status.PLAN_MISMATCH, next_action)

    def plan(self, step: Step) -> EffectRecord:
        """The step's record, planned now (it goes out with the next commit) unless it exists."""
        record = self.state.effects.get(step.step_id)
        return record if record is not None else self._plan(step, self.clock.now())

    def complete(self, step_id: str, result: JSONValue, *, failed: bool = False) -> EffectRecord:
        """Settle a planned internal step (a child task's result, a function's return value)."""
        now = self.clock.now()
        record = self.state.effects[step_id].move(EffectState.STARTED, now)
        if failed:
            record = record.move(EffectState.FAILED, now, result=result, last_error=str(result))
        else:
            record = record.move(EffectState.VERIFIED, now, result=result)
            self.state.budget = self.state.budget.progressed(now, self._take_work())
        self._put(record)
        return record

    def record_plan_growth(self, state: RunState, recorded_steps: int, steps: int) -> None:
        """Adopt a plan that appends steps to the recorded one: its digest is recorded now, and
        approval requests issued under the old digest are dropped, to be issued again under it."""
        self._evidence.observed("plan", f"recorded plan digest {state.plan_digest} ({recorded_steps} steps)")
        self._evidence.inferred(f"the plan grew from {recorded_steps} to {steps} steps by appending; recorded steps are unchanged")
        state.plan_digest = self.plan_digest
        for step_id in [sid for sid, request in state.approval_requests.items() if request.plan_digest != self.plan_digest]:
            del state.approval_requests[step_id]
        self._dirty = True

    def _interrupted(self, record: EffectRecord) -> None:
        """A call the process died in: calls have no effect to observe, so it may simply run again."""
        self._evidence.inferred(f"call {record.step_id!r} was interrupted (attempt {record.attempts}); it will be called again")
        self._put(record.move(EffectState.PLANNED, self.clock.now(), last_error="interrupted: the process stopped during the call"))

    def _request(self, record: EffectRecord, attempt: int, *, deadline_s: float | None = None) -> EffectRequest:
        assert self._keeper is not None
        return EffectRequest(
            cancel_event=self.cancel_signal,
            task_id=self.task_id,
            step_id=record.step_id,
            action=record.action,
            key=record.key,
            payload=record.payload,
            payload_digest=record.payload_digest,
            attempt=attempt,
            epoch=self._keeper.lease.epoch,
            deadline=self.clock.now() + (self._policy(record).deadline_s if deadline_s is None else deadline_s),
        )

    def _reconcile(self, record: EffectRecord) -> Steps[Reconciled]:
        assert self._state is not None
        self._working = True
        adapter = self.adapters.get(record.action)
        if adapter is None:
            # An effect this code no longer has an adapter for cannot be observed: never guessed.
            observation = Observation.unknown(f"no adapter for action {record.action!r} to observe it with")
            uncertain = record if record.state is EffectState.UNCERTAIN else record.move(EffectState.UNCERTAIN, self.clock.now())
            settled = Reconciled(uncertain, Verdict.UNSAFE, observation, f"outcome of {record.key!r} is unknown: {observation.evidence}")
        else:
            observed = yield Observe(adapter, self._request(record, max(record.attempts, 1)))
            settled = settle(record, observed, adapter.deduplicates, self.clock.now())
        self._evidence.observed(f"target:{record.action}", f"{record.key}: {settled.observation.state.value} ({settled.observation.evidence})")
        record = settled.record
        if settled.verdict is Verdict.VERIFIED:
            self._evidence.inferred(f"{record.key} verified by observation; it will not be applied again")
            self._state.budget = self._state.budget.progressed(self.clock.now(), self._take_work())
        elif settled.verdict is Verdict.RETRY:
            self._evidence.inferred(f"{record.key} may be applied again: {settled.reason}")
            record = self._with_backoff(record)
        else:
            self._evidence.unknown(f"target:{record.action}", settled.reason)
        self._put(record)
        return settled

    def _unsafe(self, settled: Reconciled) -> _Stop:
        return self._stop(
            Status.UNSAFE_TO_CONTINUE,
            f"check the target for effect {settled.record.key!r} and resolve it by hand; then run again "
            "(it will be observed again before anything is applied)",
        )

    def _policy(self, record: EffectRecord) -> RetryPolicy:
        return self._policies.get(record.step_id, self.retry)

    def _with_backoff(self, record: EffectRecord) -> EffectRecord:
        """``record`` with the wait before its next attempt: a duration from now, anchored on this
        run's clocks so that a later run can judge it whatever the wall clock does (``budget.Backoff``)."""
        if record.attempts == 0:
            return record.with_changes(not_before=None, backoff=None)
        delay = self._policy(record).delay(record.key, record.attempts)
        backoff = Backoff.begin(delay, self.clock.now(), self._monotonic_reading().get("monotonic"))
        return record.with_changes(not_before=backoff.until, backoff=backoff)

    def _backoff_wait(self, record: EffectRecord, now: float) -> tuple[float, EffectRecord]:
        """Seconds left of ``record``'s backoff, and the record to go on with.

        On the monotonic timeline it was scheduled on, measured there; elsewhere by wall clock, but
        never longer than its duration from now. When the wall clock judged it and is behind the
        scheduled start (stepped back), or this run has a timeline the backoff lacks, the rest of the
        wait is re-anchored on this run's clocks, so later runs measure from here."""
        assert record.not_before is not None
        reading = self._monotonic_reading().get("monotonic")
        backoff = record.backoff
        if backoff is None:  # recorded before backoffs kept their duration: the policy's delay bounds it
            duration = self._policy(record).delay(record.key, max(1, record.attempts))
            backoff = Backoff(duration, record.not_before - duration)
        wait = backoff.remaining(now, reading)
        if wait > 0 and not backoff.measured_on(reading) and (reading is not None or now < backoff.scheduled_at):
            backoff = backoff.resumed(now, reading)
            record = record.with_changes(not_before=backoff.until, backoff=backoff)
            self._put(record)
        return wait, record

    def _take_work(self, least: float = WORK_CHARGE_STEP_S) -> float:
        """Seconds of work since the last charge, on the monotonic clock, if at least ``least``;
        otherwise 0 and they stay pending (so quick effects do not change the counters on every commit)."""
        mark = self._monotonic()
        worked = mark - self._worked_mark
        if worked < least:
            if worked < 0:  # a clock without monotonic() was stepped back: nothing to charge
                self._worked_mark = mark
            return 0.0
        self._worked_mark = mark
        return worked

    def _wait_without_charge(self, seconds: float) -> None:
        """Sleep ``seconds``; waiting for a timer is not work."""
        slept_from = self._monotonic()
        self.clock.sleep(seconds)
        self._worked_mark += self._monotonic() - slept_from

    def _results(self) -> Mapping[str, JSONValue]:
        assert self._state is not None
        return MappingProxyType(
            {sid: rec.result for sid, rec in self._state.effects.items() if rec.state is EffectState.VERIFIED}
        )

    def check_cancellation(self) -> None:
        """Read the task's cancellation record fresh and stop if it says so (or cannot be trusted)."""
        self._check_cancellation()

    def _check_cancellation(self) -> None:
        assert self._state is not None
        raw = self.cancellations.read_cancellation(self.task_id)
        if _crashpoints.ARMED:
            _crashpoints.hit("cancellation.read")
        if raw is None:
            pause: Callable[[str], bool] | None = getattr(self.cancellations, "pause_requested", None)
            if callable(pause) and pause(self.task_id):  # a worker that drains: stop between two steps, committed
                raise self._stop(Status.RETRY_SCHEDULED, "run again now: the worker running it stopped between two steps", wake_at=self.clock.now())
            if not self._cancellation_checked:
                self._evidence.inferred("no cancellation record: new effects are allowed (read again before each one)")
                self._cancellation_checked = True
            return
        item = self._evidence.observed("control", _describe("cancellation record", raw))
        self._state.note_control(item)
        judgement = judge_cancellation(raw, self.task_id)
        if judgement.verdict == "refused":
            # Not an operator's word, so not a cancellation (which would end the run for good, in
            # someone's name); but someone wrote in the control area, so nothing new starts either.
            self._evidence.unknown("control", f"whether an operator asked this run to stop: {judgement.problem}")
            signed = " with `longrun cancel --sign-key`" if getattr(self.cancellations, "requires_signature", False) else ""
            raise self._stop(
                Status.UNSAFE_TO_CONTINUE,
                f"inspect the control area: {judgement.problem}; remove it, or cancel{signed} if the run should stop, then run again",
            )
        if judgement.verdict == "damaged":
            # Damaged intent to stop: start nothing, but do not end the run for good on a record
            # nobody can read; an operator decides.
            self._evidence.unknown("control", f"whether an operator asked this run to stop: {judgement.problem}")
            raise self._stop(
                Status.UNSAFE_TO_CONTINUE,
                f"inspect the control area: {judgement.problem}; remove it, or write a valid cancellation if the run should stop, then run again",
            )
        record = judgement.record
        assert record is not None and judgement.verdict == "cancelled"
        raise self._stop(
            Status.CANCELLED, f"nothing: the run was cancelled by {record.requested_by}: {record.reason}; no new effect will start"
        )

    # -- the steps a plan drives ---------------------------------------------------------------

    def effect(self, step: Step, *, retry: RetryPolicy | None = None, timeout_s: float | None = None) -> EffectRecord:
        """Make one step's effect verified, or stop; return its verified record.

        A verified step returns at once (that is replay). Otherwise, in order: cancellation read
        fresh, the budgets, the record planned, a backoff honoured, an observation first where the
        target may be ahead of the state, the approval gate, and then the intent persisted before
        the adapter is called and the outcome settled by observation. ``timeout_s`` (else the
        run's) bounds each ``apply``: the adapter then runs in a worker thread (see ``_execute``).
        """
        recorded = self.state.effects.get(step.step_id)
        if recorded is not None and recorded.state is _VERIFIED_STATE:
            return recorded  # replay: nothing to wait for
        return drive(self.effect_steps(step, retry=retry, timeout_s=timeout_s), self._perform)

    def effect_steps(
        self, step: Step, *, retry: RetryPolicy | None = None, timeout_s: float | None = None
    ) -> Steps[EffectRecord]:
        """``effect`` as a step procedure, for a driver to run (``effect`` drives it in this thread)."""
        state = self.state
        if retry is not None:
            self._policies[step.step_id] = retry
        if timeout_s is not None:
            self._timeouts[step.step_id] = check_timeout(timeout_s, f"step {step.step_id!r}")
        while True:
            record, settled = yield from self._ready(step, _VERIFIED)
            if settled:
                return record
            if state.reconcile_all:
                record = yield from self._reconcile_before_start(step, record)
                if record.state is EffectState.VERIFIED:
                    continue
            elif record.state is EffectState.PLANNED and (self._observe_next or (step.observe_first and record.attempts == 0)):
                record = yield from self._observe_before_apply(step, record)
                if record.state is EffectState.VERIFIED:
                    continue
            if step.approval and record.approval_id is None:
                record = self._authorize(step, record)
            yield from self._execute(step, record)

    def call(
        self, step: Step, invoke: Callable[[], object], *, retry: RetryPolicy | None = None, timeout_s: float | None = None
    ) -> EffectRecord:
        """Run ``invoke`` once for a step that is not an external effect; return its settled record.

        A recorded call returns its record without calling anything: ``verified`` with the value
        it returned, or ``failed`` with the exception it raised (``result`` holds its type and
        message). The attempt is committed before ``invoke`` runs, so retry budgets survive a
        restart; a call the process died in is simply called again (a call has nothing to
        observe). ``TransientError`` backs off and retries; ``PermanentError`` stops ``blocked``.
        A call that runs past ``timeout_s`` counts as a transient failure.
        """
        return drive(self.call_steps(step, invoke, retry=retry, timeout_s=timeout_s), self._perform)

    def call_steps(
        self,
        step: Step,
        invoke: Callable[[], object],
        *,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
        awaitable: bool = False,
    ) -> Steps[EffectRecord]:
        """``call`` as a step procedure, for a driver to run."""
        state = self.state
        if retry is not None:
            self._policies[step.step_id] = retry
        if timeout_s is not None:
            self._timeouts[step.step_id] = check_timeout(timeout_s, f"step {step.step_id!r}")
        while True:
            record, settled = yield from self._ready(step, _SETTLED_CALL)
            if settled:
                return record
            record = yield from self._start_attempt(step, record, f"call step {step.step_id!r} again (it was interrupted)")
            attempt = record.attempts
            if _crashpoints.ARMED:
                _crashpoints.hit("call.started", f"{step.step_id}#{attempt}")
            try:
                # A value that cannot be recorded is the call's failure, like an exception it raised:
                # replay must return exactly what the call returned, so no stand-in will do.
                value = yield Invoke(invoke, self._timeouts.get(step.step_id, self.timeout_s), awaitable)
                result = ensure_json(value, what=f"the value returned by step {step.step_id!r}")
                if recordable_result(result, what=f"the value returned by step {step.step_id!r}")[1] is not None:
                    size = len(canonical_bytes(result))
                    raise SizeLimitError(
                        f"the value returned by step {step.step_id!r} is {size} bytes encoded, over MAX_VALUE_BYTES "
                        f"({MAX_VALUE_BYTES}): return a reference (a path, a digest) instead",
                        size=size, limit=MAX_VALUE_BYTES, limit_name="MAX_VALUE_BYTES",
                    )  # fmt: skip
            except (TransientError, ApplyTimedOut) as exc:
                yield from self._transient(step, record, exc)
                continue
            except PermanentError as exc:
                raise self._failed_for_good(step, record, exc, source=f"call:{step.step_id}") from None
            except Exception as exc:  # recorded as the call's outcome: replayed identically, never retried
                self._current_lease()
                failure: JSONValue = {"type": type(exc).__name__, "message": printable(str(exc))}
                record = record.move(
                    EffectState.FAILED, self.clock.now(), result=failure, last_error=printable(f"{type(exc).__name__}: {exc}")
                )
                self._evidence.observed(f"call:{step.step_id}", f"attempt {attempt} raised {type(exc).__name__}: {exc}")
                self._put(record)
                return record
            if _crashpoints.ARMED:
                _crashpoints.hit("call.returned", f"{step.step_id}#{attempt}")
            self._current_lease()
            now = self.clock.now()
            record = record.move(EffectState.VERIFIED, now, result=result, receipt="returned")
            state.budget = state.budget.progressed(now, self._take_work())
            self._put(record)  # committed with the next step's start, or the stop
            return record

    def timer(self, step: Step, seconds: float) -> EffectRecord:
        """A durable wait: the wake time is recorded when the step is first reached.

        Within ``Limits.max_block_s`` the engine waits; a longer wait stops the run ``sleeping``
        with ``wake_at``. Run it again at or after that time and the step completes.
        """
        return drive(self.timer_steps(step, seconds), self._perform)

    def timer_steps(self, step: Step, seconds: float) -> Steps[EffectRecord]:
        """``timer`` as a step procedure, for a driver to run."""
        state = self.state
        record = state.effects.get(step.step_id)
        if record is not None and record.state is EffectState.VERIFIED:
            return record
        self._check_cancellation()
        state.current_step = step.step_id
        now = self.clock.now()
        if record is None:
            record = self._plan(step, now).with_changes(not_before=now + seconds)
            self._put(record)
        wake_at = record.not_before if record.not_before is not None else now
        if now < wake_at:
            wait = wake_at - now
            if wait > self.limits.max_block_s:
                raise self._stop(Status.SLEEPING, f"run again at or after {utc(wake_at)} (step {step.step_id!r} sleeps until then)", wake_at=wake_at)
            yield COMMIT  # the wake time outlives a process that stops during the wait
            yield Sleep(wait)
            now = self.clock.now()
        record = record.move(EffectState.STARTED, now).move(EffectState.VERIFIED, now, not_before=None)
        self._put(record)
        return record

    def ask(self, step: Step, choices: Sequence[JSONValue] | None) -> EffectRecord:
        """A person's answer as a value: an approval of the question (bound to task, plan, step and
        the question's digest, single use, through the approval sources) that carries the answer.

        Without an answer the run stops ``awaiting-input``. An answer that is not among
        ``choices`` is consumed, recorded as refused, and asked again."""
        state = self.state
        while True:
            record = state.effects.get(step.step_id)
            if record is not None and record.state is EffectState.VERIFIED:
                return record
            self._check_cancellation()
            state.current_step = step.step_id
            if record is None:
                record = self._plan(step, self.clock.now())
            record, approval = self._gate(step, record, Status.AWAITING_INPUT)
            if choices is not None and approval.answer not in list(choices):
                self._evidence.unknown("answer", f"answer {approval.answer!r} by {approval.approver} is not one of {list(choices)!r}")
                self._put(record.with_changes(approval_id=None, last_error=f"answer {approval.answer!r} is not a choice"))
                continue
            now = self.clock.now()
            self._evidence.observed("answer", f"step {step.step_id!r} answered by {approval.approver}")
            record = record.move(EffectState.STARTED, now).move(EffectState.VERIFIED, now, result=approval.answer)
            state.budget = state.budget.progressed(now, self._take_work())
            self._put(record)
            return record

    def wait(self, status: Status, next_action: str, *, wake_at: float | None = None) -> _Stop:
        """A stop that waits for something outside the run (a person, a child task): committed."""
        return self._stop(status, next_action, wake_at=wake_at)

    def finish(self, required: Sequence[str]) -> _Stop:
        """The stop ``done``, if every step in ``required`` is verified and nothing is in flight."""
        if self._stopping is not None:  # a parallel step stopped the run, and the plan went on regardless
            raise self._stopping.again()
        self._check_cancellation()
        state = self.state
        missing = [sid for sid in required if state.effects.get(sid) is None or state.effects[sid].state is not EffectState.VERIFIED]
        if missing:  # unreachable while every step must be verified before the plan ends; kept as a guard
            raise self._stop(Status.UNSAFE_TO_CONTINUE, f"completion evidence missing for {missing}")
        in_flight = [record.key for record in state.effects.values() if record.in_flight]
        if in_flight:
            self._evidence.unknown("ledger", f"effects still in flight at the end: {in_flight}")
            raise self._stop(Status.UNSAFE_TO_CONTINUE, f"check the target for {in_flight[0]!r}; then run again")
        state.current_step = None
        self._evidence.inferred(f"every required effect is verified: {list(required)}")
        return self._stop(Status.DONE, "nothing: every required effect is verified")

    def refuse(self, reasons: Sequence[str], next_action: str) -> RunOutcome:
        """An ``unsafe-to-continue`` outcome decided before the lease is taken: nothing was run."""
        self._evidence = _Evidence(self.clock)
        self._state = None
        self._lease = None
        for reason in reasons:
            self._evidence.unknown("contract", reason)
        return self._outcome(Status.UNSAFE_TO_CONTINUE, next_action)

    def _ready(self, step: Step, settled: frozenset[EffectState]) -> Steps[tuple[EffectRecord, bool]]:
        """The step's record and True if it is settled (replayed as it is); else the record ready
        for its next attempt: cancellation read fresh, the budgets checked, the record planned,
        and a short backoff waited out (then everything again: a wait is a new moment)."""
        state = self.state
        while True:
            record = state.effects.get(step.step_id)
            if record is not None and record.state in settled:
                return record, True
            self._check_cancellation()
            state.current_step = step.step_id
            now = self.clock.now()
            self._check_budget(record, now)
            if record is None:
                record = self._plan(step, now)
            if not (yield from self._backing_off(record, now)):
                return record, False

    def _check_budget(self, record: EffectRecord | None, now: float) -> None:
        state = self.state
        exhausted = state.budget.exhausted(self.limits, pending_s=self._monotonic() - self._worked_mark)
        if exhausted is None and record is not None:
            exhausted = self.limits.attempts_exhausted(record.key, record.attempts, record.last_error)
        if exhausted is not None:
            self._evidence.observed("budget", exhausted)
            raise self._stop(Status.LIMITS_EXHAUSTED, f"review why the budget ran out ({exhausted}); the run is over")

    def _backing_off(self, record: EffectRecord, now: float) -> Steps[bool]:
        """True after waiting out a short backoff (the caller starts over); stops for a long one."""
        if record.not_before is None:
            return False
        wait, record = self._backoff_wait(record, now)
        if wait < _MIN_WAIT_S:
            # Over, or as good as over: a remainder this small can be below what a clock reading near
            # 1.7e9 s can represent, so sleeping it would not move the clock and the wait never ends.
            return False
        if wait > self.limits.max_block_s:
            raise self._stop(
                Status.RETRY_SCHEDULED,
                f"run again at or after {utc(now + wait)} (effect {record.key!r} backs off after attempt {record.attempts})",
                wake_at=now + wait,
            )
        yield Sleep(wait)
        return True

    def _plan(self, step: Step, now: float) -> EffectRecord:
        assert self._state is not None
        self._working = True
        static = step.static_payload
        if static is not None:
            payload, digest = static
        else:
            try:
                payload = step.evaluate_payload(self._results())
            except InvalidInputError:
                raise
            except Exception as exc:  # the factory is user code (an LLM call, say): name it and keep the cause
                raise PayloadError(f"the payload factory of step {step.step_id!r} raised {type(exc).__name__}: {exc}") from exc
            digest = digest_of(payload, what=f"step {step.step_id!r} payload", max_bytes=MAX_VALUE_BYTES, checked=True)
        record = EffectRecord(
            key=step.effect_key(self.task_id),
            step_id=step.step_id,
            action=step.action,
            payload=payload,
            payload_digest=digest,
            updated_at=now,
        )
        self._put(record)
        return record

    def _reconcile_before_start(self, step: Step, record: EffectRecord) -> Steps[EffectRecord]:
        """After recovery from a backup, the lost revision may have started this step: observe first."""
        assert self._state is not None
        record = record.move(
            EffectState.UNCERTAIN, self.clock.now(), last_error="state recovered from a backup: a start may have been lost"
        )
        settled = yield from self._reconcile(record)
        if settled.verdict is Verdict.UNSAFE:
            raise self._unsafe(settled)
        if settled.verdict is Verdict.RETRY and self._sequential():
            # Steps run in order, so nothing after the first step observed absent can have started.
            self._state.reconcile_all = False
            self._evidence.inferred("recovery from the backup is reconciled: later steps cannot have started")
        return self._state.effects[step.step_id]

    def _observe_before_apply(self, step: Step, record: EffectRecord) -> Steps[EffectRecord]:
        """Observe a planned effect before applying it: the first apply of this call, or the first
        apply ever of an ``observe_first`` step. Applied: verified (committed with the next start or
        the stop), never applied again. Absent: applied, and the effects after it are not observed
        (steps run in order). Unknown: applied, since the ledger says it never started, except
        for an ``observe_first`` step at a target that does not deduplicate: the run stops
        ``unsafe-to-continue`` rather than guess."""
        assert self._state is not None
        strict = step.observe_first and record.attempts == 0
        why = "observed before its first apply" if strict else "observed before the first apply of this run"
        # planned -> uncertain -> (verified | planned): the ledger's move for "a start may have been lost".
        probe = record.move(EffectState.UNCERTAIN, self.clock.now())
        adapter = self.adapter_for(step.action, step_id=step.step_id)
        observed = yield Observe(adapter, self._request(record, max(record.attempts, 1)))
        settled = settle(probe, observed, adapter.deduplicates, self.clock.now())
        observation = settled.observation
        self._evidence.observed(f"target:{step.action}", f"{record.key}: {observation.state.value} ({observation.evidence}), {why}")
        if settled.verdict is Verdict.VERIFIED:
            self._evidence.inferred(f"{record.key} was already applied; verified by observation, it will not be applied again")
            self._state.budget = self._state.budget.progressed(self.clock.now(), self._take_work())
            self._put(settled.record)
            return settled.record
        if self._sequential():  # effects in parallel may have started beside one that did not
            self._observe_next = False
        if observation.state is ObservedState.ABSENT:
            return record
        if settled.verdict is Verdict.UNSAFE and strict:
            self._evidence.unknown(f"target:{step.action}", f"{settled.reason}; the step is marked observe_first")
            self._put(replace(settled.record, last_error="observe_first: the target cannot say whether it was already applied"))
            raise self._unsafe(settled)
        if settled.verdict is Verdict.RETRY:
            self._evidence.inferred(f"{record.key} may be applied: {settled.reason}")
        else:
            self._evidence.inferred(f"{record.key}: the target cannot say whether it was applied; the ledger says it never started")
        return record

    def _authorize(self, step: Step, record: EffectRecord) -> EffectRecord:
        return self._gate(step, record, Status.AWAITING_APPROVAL)[0]

    def _gate(self, step: Step, record: EffectRecord, waiting: Status) -> tuple[EffectRecord, Approval]:
        """Read the approval sources fresh and consume the one approval that matches the step
        exactly, or stop ``waiting`` (``awaiting-approval`` or ``awaiting-input``)."""
        state = self._state
        assert state is not None
        now = self.clock.now()
        request = state.approval_requests.get(step.step_id)
        if (
            request is None
            or request.expired(now)
            or request.payload_digest != record.payload_digest
            or request.plan_digest != self.plan_digest
        ):
            request = ApprovalRequest(
                task_id=self.task_id,
                plan_digest=self.plan_digest,
                step_id=step.step_id,
                payload_digest=record.payload_digest,
                action=step.action,
                requested_at=now,
                expires_at=now + self.limits.approval_ttl_s,
            )
            state.approval_requests[step.step_id] = request
            self._dirty = True
        records = self.approvals.read_approvals(self.task_id)
        refused = 0
        for raw in records:
            refused += isinstance(raw, RefusedRecord)
            state.note_control(self._evidence.observed("control", _describe("approval record", raw)))
        decision = evaluate_gate(request, records, frozenset(state.consumed_approvals), now)
        if decision.verdict is GateVerdict.GRANTED:
            assert decision.approval is not None
            approval = decision.approval
            for reason in decision.reasons:
                self._evidence.inferred(reason)
            self._evidence.inferred(
                f"approval {approval.approval_id} by {approval.approver} matches step {step.step_id!r} exactly; consumed once"
            )
            state.consumed_approvals.append(approval.approval_id)
            del state.approval_requests[step.step_id]
            record = replace(record, approval_id=approval.approval_id)
            self._put(record)
            if _crashpoints.ARMED:
                _crashpoints.hit("approval.consumed", step.step_id)
            return record, approval
        for reason in decision.reasons:
            self._evidence.unknown("approval", reason)
        if decision.verdict is GateVerdict.REFUSED:
            raise self._stop(
                Status.UNSAFE_TO_CONTINUE,
                f"remove the over-broad approval records for step {step.step_id!r} and approve exactly the pending request",
            )
        signed = " --sign-key <key file>" if getattr(self.approvals, "requires_signature", False) else ""
        note = f" ({refused} approval record{'s' if refused != 1 else ''} refused: see the unknowns)" if refused else ""
        if waiting is Status.AWAITING_INPUT:
            raise self._stop(
                Status.AWAITING_INPUT,
                f"answer the question of step {step.step_id!r} ({_question(record)}) with "
                f"`longrun answer <store> {self.task_id} {step.step_id} VALUE{signed}`, then run again{note}",
            )
        raise self._stop(
            Status.AWAITING_APPROVAL,
            f"approve step {step.step_id!r} (action {step.action!r}, payload {record.payload_digest}) "
            f"with `longrun approve <store> {self.task_id} --step {step.step_id}{signed}`, then run again{note}",
        )

    def _start_attempt(self, step: Step, record: EffectRecord, next_action: str) -> Steps[EffectRecord]:
        """Record the next attempt as started (attempt number, epoch, budget) and commit it, before
        anything is called: the intent is durable, and the attempt counts even if the process dies.
        Under the async driver the starts of steps that become ready together share one commit."""
        state = self.state
        if self._stopping is not None and not self._stopping.waits:
            raise self._stopping.again()  # a parallel step ended or blocked the run: nothing new starts
        now = self.clock.now()
        lease = self._current_lease()
        self._working = True
        attempt = record.attempts + 1
        record = record.move(EffectState.STARTED, now, attempts=attempt, epoch=lease.epoch, not_before=None, backoff=None, last_error=None)
        self._put(record)
        if _crashpoints.ARMED:
            _crashpoints.hit("attempt.incremented", f"{step.step_id}#{attempt}")
        state.budget = state.budget.started(now)
        state.status = Status.RUNNING
        state.next_action = next_action
        yield COMMIT
        return record

    def _failed_for_good(self, step: Step, record: EffectRecord, exc: PermanentError, *, source: str) -> _Stop:
        """``PermanentError``: the step did not happen and never will; the run stops ``blocked``."""
        self._current_lease()
        self._put(record.move(EffectState.FAILED, self.clock.now(), last_error=printable(f"permanent: {exc}")))
        self._evidence.observed(source, f"{record.key} attempt {record.attempts} failed permanently: {exc}")
        return self._stop(Status.BLOCKED, f"fix the cause of the permanent failure of step {step.step_id!r} ({exc}); the run is over")

    def _execute(self, step: Step, record: EffectRecord) -> Steps[None]:
        state = self._state
        assert state is not None and self._keeper is not None
        if self._sequential():
            self._observe_next = False
        record = yield from self._start_attempt(step, record, f"observe whether effect {record.key!r} took place")
        attempt = record.attempts
        if _crashpoints.ARMED:
            _crashpoints.hit("effect.intent-persisted", f"{step.step_id}#{attempt}")
        adapter = self.adapter_for(step.action, step_id=step.step_id)
        timeout_s = self._timeouts.get(step.step_id, self.timeout_s)
        request = self._request(record, attempt, deadline_s=timeout_s)
        try:
            receipt = yield Apply(adapter, request, timeout_s)
        except TransientError as exc:
            yield from self._transient(step, record, exc)
            return
        except PermanentError as exc:
            raise self._failed_for_good(step, record, exc, source=f"adapter:{step.action}") from None
        except ApplyTimedOut as exc:
            yield from self._timed_out(step, record, exc)
            return
        except Exception as exc:  # outcome unknown: recorded as uncertain and observed, never retried blind
            log.warning("apply of %s raised %r; observing", record.key, exc)
            self._current_lease()
            self._evidence.observed(f"adapter:{step.action}", f"{record.key} attempt {attempt} raised {type(exc).__name__}: {exc}")
            record = record.move(EffectState.UNCERTAIN, self.clock.now(), last_error=printable(f"{type(exc).__name__}: {exc}"))
            self._put(record)
            yield from self._settle(step, record)
            return
        if _crashpoints.ARMED:
            _crashpoints.hit("effect.applied", f"{step.step_id}#{attempt}")
        self._current_lease()
        checked = check_receipt(receipt, key=record.key, step_id=step.step_id, already_spent=record.cost + state.budget.cost_spent)
        for problem in checked.problems:  # an adapter bug, or a result too large to keep: evidence, never dropped
            log.warning("%s: %s", record.key, problem)
            self._evidence.unknown(f"adapter:{step.action}", problem)
        self._evidence.observed(f"adapter:{step.action}", f"receipt for {record.key} attempt {attempt}: {checked.evidence}")
        cost = checked.cost
        record = record.move(EffectState.ACKNOWLEDGED, self.clock.now(), receipt=checked.evidence, result=checked.result, cost=record.cost + cost)
        self._put(record)
        state.budget = state.budget.spent(cost)
        yield from self._settle(step, record)

    def _settle(self, step: Step, record: EffectRecord) -> Steps[None]:
        """Observe an acknowledged or uncertain effect right after ``apply``."""
        settled = yield from self._reconcile(record)
        if settled.verdict is Verdict.UNSAFE:
            raise self._unsafe(settled)
        if settled.verdict is Verdict.RETRY:
            yield COMMIT  # the retry's backoff must survive a restart
        # A verification is committed with the next step's start (or the stop): one commit per effect.

    def _timed_out(self, step: Step, record: EffectRecord, exc: ApplyTimedOut) -> Steps[None]:
        """An ``apply`` past its timeout: uncertain, and observed. An async one was cancelled, so it
        settles like any unknown outcome. A synchronous one may still be running in its thread: it is
        verified if the target already shows it, and otherwise never applied again by this run, which
        stops; the lease is kept until that thread ends, so no other run can start it meanwhile."""
        self._current_lease()
        self._evidence.observed(f"adapter:{step.action}", f"{record.key} attempt {record.attempts} {exc}")
        record = record.move(EffectState.UNCERTAIN, self.clock.now(), last_error=printable(f"timeout: {exc}"))
        self._put(record)
        if exc.pending is None:
            yield from self._settle(step, record)
            return
        self._stragglers.append(exc.pending)
        adapter = self.adapter_for(step.action, step_id=step.step_id)
        observed = yield Observe(adapter, self._request(record, record.attempts))
        self._evidence.observed(f"target:{step.action}", f"{record.key}: {observed.state.value} ({observed.evidence})")
        if observed.state is ObservedState.APPLIED:
            settled = settle(record, observed, adapter.deduplicates, self.clock.now())
            self._evidence.inferred(f"{record.key} verified by observation; it will not be applied again")
            assert self._state is not None
            self._state.budget = self._state.budget.progressed(self.clock.now(), self._take_work())
            self._put(settled.record)
            return
        self._put(replace(record, evidence=observed.evidence))
        self._evidence.unknown(f"adapter:{step.action}", f"{record.key}: the timed-out attempt may still reach the target")
        wake_at = self.clock.now() + self._policy(record).delay(record.key, record.attempts)
        raise self._stop(
            Status.RETRY_SCHEDULED,
            f"run again at or after {utc(wake_at)}: effect {record.key!r} timed out after {exc.timeout_s:g} s and its "
            "attempt may still be running here (this run keeps the lease until it ends); the next run observes it "
            "before anything is applied again",
            wake_at=wake_at,
        )

    def _transient(self, step: Step, record: EffectRecord, exc: Exception) -> Steps[None]:
        assert self._state is not None
        self._current_lease()
        self._evidence.observed(f"adapter:{step.action}", f"{record.key} attempt {record.attempts} failed transiently: {exc}")
        record = record.move(EffectState.PLANNED, self.clock.now(), last_error=printable(f"transient: {exc}"))
        record = self._with_backoff(record)
        self._put(record)
        yield COMMIT

    # -- the outcome --------------------------------------------------------------------------

    def _outcome(self, status: Status, next_action: str) -> RunOutcome:
        state = self._state
        self._reporter.stopped(
            status, next_action, revision=state.revision if state is not None else 0, epoch=self._lease.epoch if self._lease is not None else 0
        )
        return RunOutcome(
            status=status,
            next_action=next_action,
            task_id=self.task_id,
            results=dict(self._results()) if state is not None else {},
            observations=self._evidence.observations.items(),
            inferences=self._evidence.inferences.items(),
            unknowns=tuple(self._evidence.unknowns),
            revision=state.revision if state is not None else 0,
            epoch=self._lease.epoch if self._lease is not None else 0,
            result=self._result,
            wake_at=self._wake_at,
        )
