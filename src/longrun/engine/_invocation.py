"""``Invocation``: the working state of one run of a task, and the ``Stop`` that ends it.

An invocation is what the step procedures read and change: the state of record as it is being
advanced, what changed since the last commit, the evidence, the stop recorded while parallel steps
were in flight, and the work charged to the budget. It has no store, no control source and no
lease keeper: a step that needs one yields a request (``engine._ops``) and a driver performs it.
Its methods are pure bookkeeping; the rules are in the step procedures that take it as their
first argument (``engine._steps``, ``engine._effects``).

Not thread-safe: one invocation's steps run on one thread at a time (the caller's, or the event
loop's); the async driver's I/O thread reads the state only while those steps are held at a
``yield`` (see ``engine._drivers``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from typing import Any, Mapping

from ..adapters import EffectRequest
from ..budget import WORK_CHARGE_STEP_S, Backoff, Limits, RetryPolicy
from ..canonical import JSONValue, printable
from ..envelope import RunState
from ..events import Reporter
from ..lease import MonotonicReading
from ..contract import is_internal
from ..ledger import EffectRecord, EffectState, VerifiedResults
from ..outcome import TERMINAL, WAITING, Evidence, RunOutcome, Status
from ..progress import pending_of
from ..protocols import AnyEffectAdapter, Clock, MonotonicClock, TimelineClock
from ..telemetry import LATENCY_FOLD_S, EffectLatency

__all__ = ["EvidenceLog", "Invocation", "Stop", "Trail"]

Item = tuple[str, str, float] | tuple[str, str, float, tuple[object, ...]]
"""An item of a trail as it is noted: source, detail, time (an ``Evidence`` only when it is read),
and, for an item noted on every effect's path, the values its detail (a ``str.format`` template)
is made of: the text is made when the item is read, and never for the items a long trail leaves out."""


def _evidence(item: Item) -> Evidence:
    if len(item) == 3:
        return Evidence(item[0], item[1], item[2])
    return Evidence(item[0], item[1].format(*item[3]), item[2])


class Trail:
    """One kind of evidence of a run: every item, up to ``HEAD + TAIL`` of them; past that the
    first ``HEAD`` and the last ``TAIL``, with a note of how many between were left out. A run of
    100,000 effects keeps a bounded trail in memory and in its outcome, never the first items'
    context nor the latest. Items are kept as noted and made ``Evidence`` records (checked,
    made printable) when the outcome reads them: most are never read one by one."""

    HEAD = 200
    TAIL = 800

    __slots__ = ("head", "_tail", "_omitted")

    def __init__(self) -> None:
        self.head: list[Item] = []
        """The first items (``EvidenceLog`` appends here while it has room, without a call)."""
        self._tail: collections.deque[Item] = collections.deque(maxlen=self.TAIL)
        self._omitted = 0

    def append(self, item: Item) -> None:
        if len(self.head) < self.HEAD:
            self.head.append(item)
            return
        if len(self._tail) == self.TAIL:
            self._omitted += 1
        self._tail.append(item)

    def items(self) -> tuple[Evidence, ...]:
        head = [_evidence(item) for item in self.head]
        tail = [_evidence(item) for item in self._tail]
        if not self._omitted:
            return (*head, *tail)
        gap = Evidence("runner", f"{self._omitted} more items of this kind are left out here", tail[0].at)
        return (*head, gap, *tail)


class EvidenceLog:
    """Collects one run's observations, inferences and unknowns, stamped by the clock. The first
    two are bounded trails (``Trail``); unknowns are kept whole, since each may need a person."""

    __slots__ = ("_clock", "observations", "inferences", "unknowns")

    def __init__(self, clock: Clock):
        self._clock = clock
        self.observations = Trail()
        self.inferences = Trail()
        self.unknowns: list[Evidence] = []

    def observed(self, source: str, detail: str, *values: object) -> None:
        """Note an observation; with ``values``, ``detail`` is a ``str.format`` template of them,
        filled in when the outcome reads it (see ``Item``)."""
        item: Item = (source, detail, self._clock.now(), values) if values else (source, detail, self._clock.now())
        head = self.observations.head
        if len(head) < Trail.HEAD:  # the common case, without a call
            head.append(item)
        else:
            self.observations.append(item)

    def noted(self, source: str, detail: str) -> Evidence:
        """``observed``, returning the record (for a state that keeps it too)."""
        item = Evidence(source, detail, self._clock.now())
        self.observations.append((item.source, item.detail, item.at))
        return item

    def inferred(self, detail: str, *values: object) -> None:
        """Note an inference (``values``: as for ``observed``)."""
        item: Item = ("runner", detail, self._clock.now(), values) if values else ("runner", detail, self._clock.now())
        head = self.inferences.head
        if len(head) < Trail.HEAD:
            head.append(item)
        else:
            self.inferences.append(item)

    def unknown(self, source: str, detail: str) -> Evidence:
        item = Evidence(source, detail, self._clock.now())
        self.unknowns.append(item)
        return item


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


class Invocation:
    """One run's working state (see the module docstring). Built by ``Engine`` for each ``run``."""

    def __init__(
        self,
        *,
        task_id: str,
        plan_digest: str,
        clock: Clock,
        limits: Limits,
        retry: RetryPolicy,
        timeout_s: float | None,
        adapters: Mapping[str, AnyEffectAdapter],
        max_parallel: int,
        reporter: Reporter,
        monotonic_clock: MonotonicClock | None,
        timeline_clock: TimelineClock | None,
        signed_approvals: bool,
        signed_cancellations: bool,
        store_spec: str = "<store>",
    ):
        self.task_id = task_id
        self.plan_digest = plan_digest
        self.clock = clock
        self.limits = limits
        self.retry = retry
        self.timeout_s = timeout_s
        self.adapters = adapters
        self.max_parallel = max_parallel
        self.reporter = reporter
        self._monotonic_clock = monotonic_clock
        self._timeline_clock = timeline_clock
        self.signed_approvals = signed_approvals
        """Whether the approval source demands signatures (next actions then say ``--sign-key``)."""
        self.signed_cancellations = signed_cancellations
        self.store_spec = store_spec
        """How a command names the store in a next action (``<store>`` if it cannot be named)."""
        self._current: RunState | None = None
        self.state: RunState
        """The state being advanced (``current``, once it is loaded): a plain attribute, read at every step."""
        self.epoch = 0
        """The epoch of the lease this run holds (0 before it holds one)."""
        self.changed: set[str] = set()
        self.dirty = False
        self.evidence = EvidenceLog(clock)
        self.cancellation_checked = False
        self.cancelled_with: tuple[str, ...] = ()
        self.counts_failures = False
        self.deadline_asked: tuple[float, str] | None = None
        """A deadline the caller or a parent asks for (epoch seconds, ``TaskDeadline.source``), set by
        the plan: recorded by the first run with ``Limits.deadline_s`` (the earliest wins)."""
        """Whether the plan's failures are recorded and counted (``engine._failures``); set by the plan."""
        """Other tasks whose cancellation record cancels this run too, read through the same source
        after the task's own (a child's ancestors, up to the first detached link); set by the plan."""
        self.policies: dict[str, RetryPolicy] = {}
        self.timeouts: dict[str, float] = {}
        self.stopping: Stop | None = None
        """The stop a step recorded while others may still be in flight: no new step starts."""
        self.stragglers: list[concurrent.futures.Future[Any]] = []
        """Timed-out attempts still running in a worker thread: the lease is kept until they end."""
        self.cancel_signal = threading.Event()
        """Set when a cancellation is read while the run holds its lease (``EffectRequest.cancelled``)."""
        # The first apply of every call is preceded by an observe of that effect (and of each one
        # after it, until one is observed absent): a state rolled back further than any check can
        # see then finds its effects applied and verifies them instead of repeating them.
        self.observe_next = True
        self.worked_mark = self.monotonic()
        """Monotonic reading up to which this run's work is charged to ``state.budget.worked_s``."""
        self.working = False
        """Whether this run planned, applied or observed a step (else it only read and waited)."""
        self.in_flight = 0
        """Steps in flight under the async driver: more than one means the steps are not sequential
        (no other step is in flight beside the one asking while ``in_flight <= 1``)."""
        self.wake_at: float | None = None
        self.result: JSONValue = None
        self.attempt_started: dict[str, float] = {}
        """When each effect's latest attempt started in this invocation (for ``state.effect_latency``)."""
        self.latencies: list[tuple[str, float]] = []
        """Effect latencies (action, seconds) noted since the state's histogram last took them in
        (``fold_latency``: at most once every ``LATENCY_FOLD_S``, and with the stop's commit)."""
        self._latency_folded_at = clock.now()

    @property
    def current(self) -> RunState | None:
        """The state being advanced; None until it is loaded (or on an early outcome)."""
        return self._current

    @current.setter
    def current(self, state: RunState | None) -> None:
        self._current = state
        if state is not None:
            self.state = state

    # -- bookkeeping -----------------------------------------------------------------------------

    def put(self, record: EffectRecord) -> None:
        """Replace a step's effect record in the working state; it goes out with the next commit."""
        state = self.state
        previous = state.effects.get(record.step_id)
        self.reporter.moved(previous, record)
        lifecycle = record.state
        if lifecycle is EffectState.STARTED:
            self.attempt_started[record.step_id] = record.updated_at
        elif lifecycle is EffectState.VERIFIED and previous is not None and previous.state is not EffectState.VERIFIED:
            self._note_latency(previous, record)
        state.effects[record.step_id] = record
        self.changed.add(record.step_id)
        self.dirty = True

    def _note_latency(self, previous: EffectRecord, record: EffectRecord) -> None:
        """Note a verified effect's time from its attempt's start: the start seen in this invocation,
        else a started record as loaded (its last move was the start). An effect verified without a
        start known (observed first, found applied) adds nothing. Noted as numbers; the state's
        histogram takes them in once ``LATENCY_FOLD_S`` passed since it last did (or at the stop)."""
        started = self.attempt_started.pop(record.step_id, None)
        if started is None and previous.state is EffectState.STARTED:
            started = previous.updated_at
        if started is None or is_internal(record.action):
            return
        now = record.updated_at
        self.latencies.append((record.action, now - started))
        if not 0.0 <= now - self._latency_folded_at < LATENCY_FOLD_S:  # due, or the clock went back
            self.fold_latency()

    def fold_latency(self) -> None:
        """Add the latencies noted so far to the state's histogram (one new record for all of them);
        it goes out with the next commit."""
        if not self.latencies:
            return
        state = self.state
        state.effect_latency = (state.effect_latency or EffectLatency()).observed_many(self.latencies)
        self.latencies = []
        self._latency_folded_at = self.clock.now()
        self.dirty = True

    def monotonic(self) -> float:
        """The clock's ``monotonic()`` if it has one (``FakeClock`` does), else its ``now()``."""
        clock = self._monotonic_clock
        return clock.monotonic() if clock is not None else self.clock.now()

    def monotonic_reading(self) -> MonotonicReading | None:
        """The reading the store's lease calls and backoffs get if the clock names the timeline of
        its ``monotonic()`` (``SystemClock``: this boot), else None: expiry is then judged by wall clock."""
        clock = self._timeline_clock
        timeline = clock.monotonic_id() if clock is not None else None
        if clock is None or not timeline:
            return None
        return MonotonicReading(timeline, clock.monotonic())

    def take_work(self, least: float = WORK_CHARGE_STEP_S) -> float:
        """Seconds of work since the last charge, on the monotonic clock, if at least ``least``;
        otherwise 0 and they stay pending (so quick effects do not change the counters on every commit)."""
        mark = self.monotonic()
        worked = mark - self.worked_mark
        if worked < least:
            if worked < 0:  # a clock without monotonic() was stepped back: nothing to charge
                self.worked_mark = mark
            return 0.0
        self.worked_mark = mark
        return worked

    def waited(self, monotonic_before: float) -> None:
        """A wait since ``monotonic_before`` (a ``monotonic()`` reading) is not work."""
        self.worked_mark += self.monotonic() - monotonic_before

    def record_stop(self, status: Status, next_action: str, wake_at: float | None) -> tuple[Stop, bool]:
        """Record a stop in the state; the stop to raise and whether it must be committed.

        With steps in parallel, the first stop stands unless a later one outranks it (a stop that
        ends or blocks the run outranks one that waits): a stop that does not is not recorded."""
        next_action = printable(next_action)  # it may quote control record names and error text
        stop = Stop(status, next_action, wake_at=wake_at)
        if self.stopping is not None and not stop.outranks(self.stopping):
            self.evidence.inferred(f"a parallel step would also stop the run {status.value}: {next_action}")
            return self.stopping.again(), False
        self.stopping = stop
        state = self.state
        state.status = status
        state.next_action = next_action
        if status in TERMINAL:
            # An ended run asks nothing more of anyone: open approval requests are withdrawn.
            state.approval_requests.clear()
        state.unknowns = list(self.evidence.unknowns)
        if self.working or status not in WAITING:
            state.budget = state.budget.worked(self.take_work(least=0.0))  # a stop charges all of this run's work
        else:  # a run that only read the state and found it must wait: that was waiting, not work
            self.worked_mark = self.monotonic()
        self.dirty = True
        return stop.again(), True

    def results(self) -> Mapping[str, JSONValue]:
        """What a payload factory reads: the verified results, as a view (each planning a lookup)."""
        return VerifiedResults(self.state.effects)

    def policy(self, record: EffectRecord) -> RetryPolicy:
        return self.policies.get(record.step_id, self.retry)

    def request(self, record: EffectRecord, attempt: int, *, deadline_s: float | None = None) -> EffectRequest:
        """What an adapter sees of one attempt of ``record``."""
        return EffectRequest(
            cancel_event=self.cancel_signal,
            task_id=self.task_id,
            step_id=record.step_id,
            action=record.action,
            key=record.key,
            payload=record.payload,
            payload_digest=record.payload_digest,
            attempt=attempt,
            epoch=self.epoch,
            deadline=self.clock.now() + (self.policy(record).deadline_s if deadline_s is None else deadline_s),
        )

    def with_backoff(self, record: EffectRecord) -> EffectRecord:
        """``record`` with the wait before its next attempt: a duration from now, anchored on this
        run's clocks so that a later run can judge it whatever the wall clock does (``budget.Backoff``)."""
        if record.attempts == 0:
            return record.with_changes(not_before=None, backoff=None)
        delay = self.policy(record).delay(record.key, record.attempts)
        backoff = Backoff.begin(delay, self.clock.now(), self.monotonic_reading())
        return record.with_changes(not_before=backoff.until, backoff=backoff)

    def backoff_wait(self, record: EffectRecord, now: float) -> tuple[float, EffectRecord]:
        """Seconds left of ``record``'s backoff, and the record to go on with.

        On the monotonic timeline it was scheduled on, measured there; elsewhere by wall clock, but
        never longer than its duration from now. When the wall clock judged it and is behind the
        scheduled start (stepped back), or this run has a timeline the backoff lacks, the rest of the
        wait is re-anchored on this run's clocks, so later runs measure from here."""
        assert record.not_before is not None
        reading = self.monotonic_reading()
        backoff = record.backoff
        if backoff is None:  # recorded before backoffs kept their duration: the policy's delay bounds it
            duration = self.policy(record).delay(record.key, max(1, record.attempts))
            backoff = Backoff(duration, record.not_before - duration)
        wait = backoff.remaining(now, reading)
        if wait > 0 and not backoff.measured_on(reading) and (reading is not None or now < backoff.scheduled_at):
            backoff = backoff.resumed(now, reading)
            record = record.with_changes(not_before=backoff.until, backoff=backoff)
            self.put(record)
        return wait, record

    def outcome(self, status: Status, next_action: str) -> RunOutcome:
        """The outcome of this invocation, stopped ``status``."""
        state = self.current
        revision = state.revision if state is not None else 0
        self.reporter.stopped(status, next_action, revision=revision, epoch=self.epoch, time=self.clock.now())
        return RunOutcome(
            status=status,
            next_action=next_action,
            task_id=self.task_id,
            results=VerifiedResults(state.effects).copy() if state is not None else {},
            observations=self.evidence.observations.items(),
            inferences=self.evidence.inferences.items(),
            unknowns=tuple(self.evidence.unknowns),
            revision=revision,
            epoch=self.epoch,
            result=self.result,
            wake_at=self.wake_at,
            pending=pending_of(state) if state is not None else (),
            last_failure=state.last_failure if state is not None else None,
        )
