"""The engine's lowest layer: its configuration (checked once, when it is built), the working state
of the invocation under way, the lease and its renewal, the evidence, and the commit path."""

from __future__ import annotations

import concurrent.futures
import logging
import shlex
import threading
from typing import TYPE_CHECKING, Any, Mapping, TypedDict

from .. import _crashpoints
from .._io import is_async_callable
from ..budget import WORK_CHARGE_STEP_S, Limits, RetryPolicy
from ..cancellation import judge_cancellation
from ..canonical import JSONValue, printable
from ..clock import SystemClock
from ..contract import RunContract
from ..envelope import RunState
from ..errors import FencedError, InvalidInputError, SizeLimitError, UnknownActionError, describe_exception
from ..events import EventHook, Reporter
from ..lease import Lease, LeaseKeeper, MonotonicReading
from ..ledger import EffectRecord, VerifiedResults
from ..outcome import TERMINAL, WAITING, RunOutcome, Status
from ..progress import pending_of
from ..protocols import (
    AnyEffectAdapter,
    ApprovalSource,
    CancellationSource,
    Clock,
    MonotonicClock,
    PausingSource,
    Store,
    TimelineClock,
)
from ._evidence import EvidenceLog
from ._plans import Stop, check_parallel, check_timeout, default_owner

if TYPE_CHECKING:
    from .._concurrency import AsyncDriver

log = logging.getLogger("longrun")

__all__ = ["EngineBase", "EngineOptions"]


class EngineOptions(TypedDict, total=False):
    """The engine's options every face takes as keywords (``Runner(...)``, ``@durable(...)``), each
    optional; the defaults are ``Engine``'s."""

    owner: str | None
    """A label for people (the lease's owner); a random ``host:pid:hex`` by default. It does not
    authorize anything: re-entering a live lease takes its secret token."""
    clock: Clock | None
    """``SystemClock()`` by default; tests pass ``testing.FakeClock``."""
    limits: Limits | None
    """The run's budgets and waits (``Limits()`` by default)."""
    retry: RetryPolicy | None
    """The retry policy of every step that does not name its own (``RetryPolicy()`` by default)."""
    lease_ttl_s: float
    """How long the lease lasts unless renewed (30 s); it is renewed every third of that."""
    approvals: ApprovalSource | None
    """Where approvals are read, fresh before each gated effect (the store by default)."""
    cancellations: CancellationSource | None
    """Where the cancellation record is read, fresh before each new effect (the store by default)."""
    on_event: EventHook | None
    """Called with a ``longrun.events.RunEvent`` after each commit that made a transition durable;
    an exception it raises is logged, never breaks the run."""
    timeout_s: float | None
    """Bounds every ``apply``, ``observe`` and call; a step's own overrides it (none by default)."""
    max_parallel: int
    """The most steps in flight at once (16), for steps the face runs in parallel."""


class EngineBase:
    """What every layer of the engine shares: its configuration (checked once, when it is built), the
    working state of the invocation under way, the lease and its renewal, the evidence, and the
    commit path (``_put`` a record, ``_commit`` the state, ``_stop`` the run with a committed status).
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
        # The clock's optional capabilities, declared as Protocols and looked up once.
        self._monotonic_clock = self.clock if isinstance(self.clock, MonotonicClock) else None
        self._timeline_clock = self.clock if isinstance(self.clock, TimelineClock) else None
        self._pausing = self.cancellations if isinstance(self.cancellations, PausingSource) else None
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
        self.cancelled_with: tuple[str, ...] = ()
        """Other tasks whose cancellation record cancels this run too, read through the same source
        after the task's own (a child's ancestors, up to the first detached link); set by the plan."""
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
        self._evidence = EvidenceLog(self.clock)
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

    def _renew(self, lease: Lease) -> Lease:
        return self.store.renew_lease(lease, self.lease_ttl_s, self.clock.now(), monotonic=self._monotonic_reading())

    def _monotonic_reading(self) -> MonotonicReading | None:
        """The reading the store's lease calls and backoffs get if the clock names the timeline of
        its ``monotonic()`` (``SystemClock``: this boot), else None: expiry is then judged by wall clock."""
        clock = self._timeline_clock
        timeline = clock.monotonic_id() if clock is not None else None
        if clock is None or not timeline:
            return None
        return MonotonicReading(timeline, clock.monotonic())

    def _current_lease(self) -> Lease:
        """The lease to write under; raises ``Stop(lease-lost)`` if background renewal failed."""
        assert self._keeper is not None
        if self._keeper.failure is not None:
            self._evidence.observed("lease", f"background renewal failed: {describe_exception(self._keeper.failure)}")
            raise Stop(Status.LEASE_LOST, "nothing on this runner: the lease was lost, no further write was made")
        lease = self._keeper.lease
        if self._keeper.stale(self.lease_ttl_s):
            lease = self._renew(lease)
            self._keeper.replace(lease)
        return lease

    def _monotonic(self) -> float:
        """The clock's ``monotonic()`` if it has one (``FakeClock`` does), else its ``now()``."""
        clock = self._monotonic_clock
        return clock.monotonic() if clock is not None else self.clock.now()

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
            self.store.release_lease(lease, self.clock.now(), monotonic=self._monotonic_reading())
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
            self.store.release_lease(keeper.lease, self.clock.now(), monotonic=self._monotonic_reading())
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
            raise Stop(Status.UNSAFE_TO_CONTINUE, next_action) from None
        self._changed.clear()
        self._dirty = False
        if _crashpoints.ARMED:
            _crashpoints.hit("state.committed", state.revision)
        self._reporter.committed(state)

    def _stop(self, status: Status, next_action: str, *, wake_at: float | None = None) -> Stop:
        """Record a stop in the state (committed) and return the exception that unwinds to ``run``.

        With steps in parallel, the first stop stands unless a later one outranks it (a stop that
        ends or blocks the run outranks one that waits). After one that ends or blocks the run, no
        step starts; after one that waits, steps that do not depend on the waiting one go on."""
        next_action = printable(next_action)  # it may quote control record names and error text
        stop = Stop(status, next_action, wake_at=wake_at)
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

    def _sequential(self) -> bool:
        """Whether no other step of this run is in flight beside the one asking."""
        return self._driver is None or self._driver.active <= 1

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
        """What a payload factory reads: the verified results, as a view (each planning a lookup)."""
        assert self._state is not None
        return VerifiedResults(self._state.effects)

    def _policy(self, record: EffectRecord) -> RetryPolicy:
        return self._policies.get(record.step_id, self.retry)

    @property
    def store_spec(self) -> str:
        """How a command names this engine's store in a next action (``<store>`` if it cannot be named)."""
        spec = getattr(self.store, "spec", None)
        return shlex.quote(spec) if isinstance(spec, str) and spec else "<store>"

    def _outcome(self, status: Status, next_action: str) -> RunOutcome:
        state = self._state
        self._reporter.stopped(
            status, next_action, revision=state.revision if state is not None else 0, epoch=self._lease.epoch if self._lease is not None else 0
        )
        return RunOutcome(
            status=status,
            next_action=next_action,
            task_id=self.task_id,
            results=VerifiedResults(state.effects).copy() if state is not None else {},
            observations=self._evidence.observations.items(),
            inferences=self._evidence.inferences.items(),
            unknowns=tuple(self._evidence.unknowns),
            revision=state.revision if state is not None else 0,
            epoch=self._lease.epoch if self._lease is not None else 0,
            result=self._result,
            wake_at=self._wake_at,
            pending=pending_of(state) if state is not None else (),
        )

