"""The Runner: the recovery procedure and the effect loop, composed over the adapter and store seams.

``Runner(contract, steps, store=..., adapters=...).run()`` takes the task's lease, recovers, and
applies the plan's effects one at a time until the run is done or reaches a legal stop, which it
returns as a ``RunOutcome`` with one safe next action. Call it again (after a crash, an approval, a
backoff) and it continues where the durable state says, never repeating a verified effect.

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

Not guaranteed: that an adapter call stops when the lease is lost or a deadline passes (threads
cannot be killed; targets should check ``EffectRequest.epoch`` and ``deadline``).
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import secrets
import socket
import time
from dataclasses import replace
from types import MappingProxyType
from typing import Mapping, Sequence

from . import _crashpoints
from .adapters import EffectRequest, Receipt
from .approval import ApprovalRequest, GateVerdict, evaluate_gate
from .authority import RefusedRecord, SignedApprovals, SignedCancellations
from .budget import BudgetCounters, Limits, RetryPolicy
from .cancellation import Cancellation
from .canonical import MAX_VALUE_BYTES, JSONValue, digest_of, printable
from .contract import RunContract, Step, plan_digest, validate_plan
from .control import ControlRecord
from .envelope import RunState
from .errors import (
    CorruptStateError,
    FencedError,
    InvalidInputError,
    LeaseHeldError,
    PayloadError,
    PermanentError,
    SizeLimitError,
    StateUnrecoverableError,
    TransientError,
    UnknownActionError,
)
from .lease import Lease, LeaseKeeper, boot_clock_id
from .ledger import EffectRecord, EffectState, recordable_result
from .outcome import TERMINAL, Evidence, RunOutcome, Status
from .protocols import ApprovalSource, CancellationSource, Clock, EffectAdapter, Store
from .recovery import Reconciled, Verdict, reconcile

__all__ = ["Runner", "SystemClock"]

log = logging.getLogger("longrun")


class SystemClock:
    """The real wall clock, and the system's monotonic clock for measuring durations."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def monotonic_id(self) -> str | None:
        """The timeline ``monotonic()`` is on: this boot of this machine (see ``longrun.lease``)."""
        return boot_clock_id()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


def _utc(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat(timespec="milliseconds")


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class _Evidence:
    """Collects one run's observations, inferences and unknowns, stamped by the clock."""

    def __init__(self, clock: Clock):
        self._clock = clock
        self.observations: list[Evidence] = []
        self.inferences: list[Evidence] = []
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


def _describe(kind: str, raw: ControlRecord) -> str:
    """One observation line for a control record: which bytes were read, and why it is unusable."""
    text = f"{kind} {raw.name} ({raw.digest or 'no bytes read'})"
    if isinstance(raw, RefusedRecord):
        return f"{text} refused: {raw.error}"
    if raw.error is not None:
        return f"{text} unusable: {raw.error}"
    return text


class _Stop(BaseException):
    """Internal: unwinds the loop to return an outcome. Never escapes ``Runner.run``.

    A ``BaseException`` so that no broad ``except Exception`` on the way can swallow a stop.
    """

    def __init__(self, status: Status, next_action: str):
        super().__init__(status.value)
        self.status = status
        self.next_action = next_action


class Runner:
    def __init__(
        self,
        contract: RunContract,
        steps: Sequence[Step],
        *,
        store: Store,
        adapters: Mapping[str, EffectAdapter],
        owner: str | None = None,
        clock: Clock | None = None,
        limits: Limits | None = None,
        retry: RetryPolicy | None = None,
        lease_ttl_s: float = 30.0,
        approvals: ApprovalSource | None = None,
        cancellations: CancellationSource | None = None,
    ):
        self.contract = contract
        self.steps = validate_plan(contract, steps)
        if not isinstance(adapters, Mapping):
            raise InvalidInputError("adapters must map action names to EffectAdapter objects")
        for step in self.steps:
            adapter = adapters.get(step.action)
            if adapter is None:
                raise UnknownActionError(
                    f"step {step.step_id!r} uses action {step.action!r}, which has no adapter (have: {sorted(adapters)})"
                )
            if not isinstance(adapter, EffectAdapter):
                raise InvalidInputError(f"adapter for {step.action!r} lacks apply, observe or deduplicates")
        if isinstance(lease_ttl_s, bool) or not isinstance(lease_ttl_s, (int, float)) or not lease_ttl_s > 0:
            raise InvalidInputError(f"lease_ttl_s must be a positive number, got {lease_ttl_s!r}")
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise InvalidInputError("owner must be a non-empty string")
        if approvals is not None and not isinstance(approvals, ApprovalSource):
            raise InvalidInputError("approvals must be an ApprovalSource (a read_approvals(task_id) method)")
        if cancellations is not None and not isinstance(cancellations, CancellationSource):
            raise InvalidInputError("cancellations must be a CancellationSource (a read_cancellation(task_id) method)")
        self.store = store
        self.approvals: ApprovalSource = approvals if approvals is not None else store
        self.cancellations: CancellationSource = cancellations if cancellations is not None else store
        self.adapters = dict(adapters)
        self.owner = owner or default_owner()
        self.clock: Clock = clock or SystemClock()
        self.limits = limits or Limits()
        self.retry = retry or RetryPolicy()
        self.lease_ttl_s = float(lease_ttl_s)
        self.plan_digest = plan_digest(contract, self.steps)
        self.refusals = [
            reason for reason in (contract.action_refusal(step.action) for step in self.steps) if reason is not None
        ]
        self._lease: Lease | None = None
        self._keeper: LeaseKeeper | None = None
        self._state: RunState | None = None
        self._dirty = False
        self._changed = set()
        self._cursor = 0
        self._cancellation_checked = False
        self._evidence = _Evidence(self.clock)

    @property
    def task_id(self) -> str:
        return self.contract.task_id

    # -- the public entry point ---------------------------------------------------------------

    def run(self) -> RunOutcome:
        """Recover and advance the run as far as it may go now; return why it stopped."""
        self._evidence = _Evidence(self.clock)
        self._state = None
        self._dirty = False
        self._changed: set[str] = set()
        self._cursor = 0
        self._cancellation_checked = False
        if self.refusals:
            for reason in self.refusals:
                self._evidence.unknown("contract", reason)
            return self._outcome(
                Status.UNSAFE_TO_CONTINUE,
                "change the plan so every step's action is allowed by the run contract; nothing was run",
            )
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
                until = f" at {_utc(now + max(0.0, holder.remaining(now, self._monotonic_reading().get('monotonic'))))}"
            return self._outcome(
                Status.ALREADY_RUNNING,
                f"wait for the current owner to finish or for its lease to expire{until}, then run again",
            )
        self._evidence.observed("store", f"lease acquired by {self.owner} at epoch {self._lease.epoch}")
        self._keeper = LeaseKeeper(self._lease, self._renew, self.lease_ttl_s / 3, self._monotonic)
        try:
            with self._keeper:
                status, next_action = self._recover_and_run()
        except FencedError as exc:
            self._evidence.observed("store", f"write refused: {exc}")
            self._evidence.unknown("lease", "another runner took over this task; its progress is not known here")
            return self._outcome(Status.LEASE_LOST, "nothing on this runner: the newer lease holder continues the run")
        except BaseException:
            self._release(quiet=True)
            raise
        if status is not Status.LEASE_LOST:
            self._release(quiet=False)
        return self._outcome(status, next_action)

    # -- lease --------------------------------------------------------------------------------

    def _renew(self, lease: Lease) -> Lease:
        return self.store.renew_lease(lease, self.lease_ttl_s, self.clock.now(), **self._monotonic_reading())

    def _monotonic_reading(self) -> dict[str, tuple[str, float]]:
        """``{"monotonic": (timeline, reading)}`` for the store's lease calls if the clock names the
        timeline of its ``monotonic()`` (``SystemClock``: this boot), else nothing: the store then
        judges expiry by wall clock, and a store written before this keyword still works."""
        timeline = getattr(self.clock, "monotonic_id", None)
        timeline = timeline() if callable(timeline) else None
        monotonic = getattr(self.clock, "monotonic", None)
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
        if self._monotonic() - self._keeper.renewed_at > self.lease_ttl_s / 2:
            lease = self._renew(lease)
            self._keeper.replace(lease)
        return lease

    def _monotonic(self) -> float:
        """The clock's ``monotonic()`` if it has one (``FakeClock`` does), else its ``now()``."""
        monotonic = getattr(self.clock, "monotonic", None)
        return monotonic() if callable(monotonic) else self.clock.now()

    def _release(self, *, quiet: bool) -> None:
        lease = self._keeper.lease if self._keeper is not None else self._lease
        if lease is None:
            return
        try:
            self.store.release_lease(lease, self.clock.now(), **self._monotonic_reading())
        except FencedError as exc:
            log.info("lease on %s was already taken over: %s", self.task_id, exc)
        except Exception:
            if not quiet:
                raise
            log.exception("releasing the lease on %s failed while another error propagates", self.task_id)

    # -- persistence --------------------------------------------------------------------------

    def _put(self, record: EffectRecord) -> None:
        """Replace a step's effect record in the working state; it goes out with the next commit."""
        assert self._state is not None
        self._state.effects[record.step_id] = record
        self._changed.add(record.step_id)
        self._dirty = True

    def _commit(self) -> None:
        state = self._state
        assert state is not None
        lease = self._current_lease()
        state.updated_at = self.clock.now()
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

    def _stop(self, status: Status, next_action: str) -> _Stop:
        """Record a stop in the state (committed) and return the exception that unwinds to ``run``."""
        state = self._state
        assert state is not None
        next_action = printable(next_action)  # it may quote control record names and error text
        state.status = status
        state.next_action = next_action
        if status in TERMINAL:
            # An ended run asks nothing more of anyone: open approval requests are withdrawn.
            state.approval_requests.clear()
        state.unknowns = list(self._evidence.unknowns)
        self._commit()
        return _Stop(status, next_action)

    # -- the procedure ------------------------------------------------------------------------

    def _recover_and_run(self) -> tuple[Status, str]:
        try:
            self._recover()
            self._advance()
        except _Stop as stop:
            return stop.status, stop.next_action
        raise AssertionError("the effect loop ended without a stop")  # pragma: no cover

    def _recover(self) -> None:
        assert self._lease is not None
        try:
            loaded = self.store.load(self.task_id, lease=self._lease)
        except StateUnrecoverableError as exc:
            self._evidence.observed("store", str(exc))
            self._evidence.unknown("store", "which effects took place after the last readable revision")
            raise _Stop(
                Status.STATE_UNRECOVERABLE,
                "inspect the quarantined state files and the target before anything else; do not restart this task from scratch",
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
            self._commit()
            self._evidence.inferred("no state existed: this is the task's first run")
            return
        state = loaded.state
        self._state = state
        self._evidence.observed(
            "store", f"state from {loaded.source}, revision {state.revision}, bytes {loaded.digest}, status {state.status.value}"
        )
        if state.plan_digest != self.plan_digest:
            self._evidence.observed("store", f"recorded plan digest {state.plan_digest}")
            raise _Stop(
                Status.PLAN_MISMATCH,
                f"run the task with the plan it was started with (digest {state.plan_digest}) or use a new task id",
            )
        if state.status in TERMINAL:
            self._evidence.inferred(f"the run already ended {state.status.value}; nothing more will be applied")
            raise _Stop(state.status, state.next_action)
        unsafe = []
        for step in self.steps:
            record = state.effects.get(step.step_id)
            if record is not None and record.in_flight:
                settled = self._reconcile(step, record)
                if settled.verdict is Verdict.UNSAFE:
                    unsafe.append(settled)
        if unsafe:
            raise self._unsafe(unsafe[0])
        if self._dirty:
            self._commit()

    def _request(self, step: Step, record: EffectRecord, attempt: int) -> EffectRequest:
        assert self._keeper is not None
        return EffectRequest(
            task_id=self.task_id,
            step_id=step.step_id,
            action=step.action,
            key=record.key,
            payload=record.payload,
            payload_digest=record.payload_digest,
            attempt=attempt,
            epoch=self._keeper.lease.epoch,
            deadline=self.clock.now() + self.retry.deadline_s,
        )

    def _reconcile(self, step: Step, record: EffectRecord) -> Reconciled:
        assert self._state is not None
        adapter = self.adapters[step.action]
        settled = reconcile(record, adapter, self._request(step, record, max(record.attempts, 1)), self.clock.now())
        self._evidence.observed(f"target:{step.action}", f"{record.key}: {settled.observation.state.value} ({settled.observation.evidence})")
        record = settled.record
        if settled.verdict is Verdict.VERIFIED:
            self._evidence.inferred(f"{record.key} verified by observation; it will not be applied again")
            self._state.budget = self._state.budget.progressed(self.clock.now())
        elif settled.verdict is Verdict.RETRY:
            self._evidence.inferred(f"{record.key} may be applied again: {settled.reason}")
            record = replace(record, not_before=self._backoff_until(record))
        else:
            self._evidence.unknown(f"target:{step.action}", settled.reason)
        self._put(record)
        return settled

    def _unsafe(self, settled: Reconciled) -> _Stop:
        return self._stop(
            Status.UNSAFE_TO_CONTINUE,
            f"check the target for effect {settled.record.key!r} and resolve it by hand; then run again "
            "(it will be observed again before anything is applied)",
        )

    def _backoff_until(self, record: EffectRecord) -> float | None:
        if record.attempts == 0:
            return None
        return self.clock.now() + self.retry.delay(record.key, record.attempts)

    def _results(self) -> Mapping[str, JSONValue]:
        assert self._state is not None
        return MappingProxyType(
            {sid: rec.result for sid, rec in self._state.effects.items() if rec.state is EffectState.VERIFIED}
        )

    def _check_cancellation(self) -> None:
        assert self._state is not None
        raw = self.cancellations.read_cancellation(self.task_id)
        if _crashpoints.ARMED:
            _crashpoints.hit("cancellation.read")
        if raw is None:
            if not self._cancellation_checked:
                self._evidence.inferred("no cancellation record: new effects are allowed (read again before each one)")
                self._cancellation_checked = True
            return
        item = self._evidence.observed("control", _describe("cancellation record", raw))
        self._state.note_control(item)
        if isinstance(raw, RefusedRecord):
            # Not an operator's word, so not a cancellation (which would end the run for good, in
            # someone's name); but someone wrote in the control area, so nothing new starts either.
            self._evidence.unknown(
                "control", f"whether an operator asked this run to stop: cancellation record {raw.name} was refused ({raw.error})"
            )
            signed = " with `longrun cancel --sign-key`" if isinstance(self.cancellations, SignedCancellations) else ""
            raise self._stop(
                Status.UNSAFE_TO_CONTINUE,
                f"inspect the control area: cancellation record {raw.name} was refused ({raw.error}); remove it, "
                f"or cancel{signed} if the run should stop, then run again",
            )
        problem = None
        if raw.error is not None:
            problem = f"cancellation record {raw.name} is damaged ({raw.error})"
        else:
            try:
                record = Cancellation.from_json(raw.body)
            except CorruptStateError as exc:
                problem = f"cancellation record {raw.name} is malformed ({exc})"
            else:
                if record.task_id != self.task_id:
                    problem = f"cancellation record {raw.name} names task {record.task_id!r}"
        if problem is not None:
            # Damaged intent to stop: start nothing, but do not end the run for good on a record
            # nobody can read; an operator decides.
            self._evidence.unknown("control", f"whether an operator asked this run to stop: {problem}")
            raise self._stop(
                Status.UNSAFE_TO_CONTINUE,
                f"inspect the control area: {problem}; remove it, or write a valid cancellation if the run should stop, then run again",
            )
        raise self._stop(
            Status.CANCELLED, f"nothing: the run was cancelled by {record.requested_by}: {record.reason}; no new effect will start"
        )

    def _next_step(self) -> Step | None:
        """The first step not yet verified. A verified effect never changes again, so the cursor
        only moves forward: finding the next step costs O(1) amortized, not O(plan)."""
        assert self._state is not None
        effects = self._state.effects
        while self._cursor < len(self.steps):
            record = effects.get(self.steps[self._cursor].step_id)
            if record is None or record.state is not EffectState.VERIFIED:
                return self.steps[self._cursor]
            self._cursor += 1
        return None

    def _advance(self) -> None:
        state = self._state
        assert state is not None
        while True:
            self._check_cancellation()
            step = self._next_step()
            if step is None:
                self._finish()
            assert step is not None
            state.current_step = step.step_id
            record = state.effects.get(step.step_id)
            now = self.clock.now()
            exhausted = state.budget.exhausted(self.limits, now)
            if exhausted is None and record is not None and record.attempts >= self.limits.max_attempts:
                exhausted = f"effect {record.key!r} used all {self.limits.max_attempts} attempts (last error: {record.last_error})"
            if exhausted is not None:
                self._evidence.observed("budget", exhausted)
                raise self._stop(Status.LIMITS_EXHAUSTED, f"review why the budget ran out ({exhausted}); the run is over")
            if record is None:
                record = self._plan(step, now)
            if record.not_before is not None and now < record.not_before:
                wait = record.not_before - now
                if wait > self.limits.max_block_s:
                    raise self._stop(
                        Status.RETRY_SCHEDULED,
                        f"run again at or after {_utc(record.not_before)} (effect {record.key!r} backs off after attempt {record.attempts})",
                    )
                self.clock.sleep(wait)
                continue  # read cancellation afresh after waiting
            if state.reconcile_all:
                record = self._reconcile_before_start(step, record)
                if record.state is EffectState.VERIFIED:
                    continue
            if step.approval and record.approval_id is None:
                record = self._authorize(step, record)
            self._execute(step, record)

    def _plan(self, step: Step, now: float) -> EffectRecord:
        assert self._state is not None
        try:
            payload = step.evaluate_payload(self._results() if step.dynamic else {})
        except InvalidInputError:
            raise
        except Exception as exc:  # the factory is user code (an LLM call, say): name it and keep the cause
            raise PayloadError(f"the payload factory of step {step.step_id!r} raised {type(exc).__name__}: {exc}") from exc
        record = EffectRecord(
            key=step.effect_key(self.task_id),
            step_id=step.step_id,
            action=step.action,
            payload=payload,
            payload_digest=digest_of(payload, what=f"step {step.step_id!r} payload", max_bytes=MAX_VALUE_BYTES),
            updated_at=now,
        )
        self._put(record)
        return record

    def _reconcile_before_start(self, step: Step, record: EffectRecord) -> EffectRecord:
        """After recovery from a backup, the lost revision may have started this step: observe first."""
        assert self._state is not None
        record = record.move(
            EffectState.UNCERTAIN, self.clock.now(), last_error="state recovered from a backup: a start may have been lost"
        )
        settled = self._reconcile(step, record)
        if settled.verdict is Verdict.UNSAFE:
            raise self._unsafe(settled)
        if settled.verdict is Verdict.RETRY:
            # Steps run in order, so nothing after the first step observed absent can have started.
            self._state.reconcile_all = False
            self._evidence.inferred("recovery from the backup is reconciled: later steps cannot have started")
        return self._state.effects[step.step_id]

    def _authorize(self, step: Step, record: EffectRecord) -> EffectRecord:
        state = self._state
        assert state is not None
        now = self.clock.now()
        request = state.approval_requests.get(step.step_id)
        if request is None or request.expired(now) or request.payload_digest != record.payload_digest:
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
            return record
        for reason in decision.reasons:
            self._evidence.unknown("approval", reason)
        if decision.verdict is GateVerdict.REFUSED:
            raise self._stop(
                Status.UNSAFE_TO_CONTINUE,
                f"remove the over-broad approval records for step {step.step_id!r} and approve exactly the pending request",
            )
        signed = " --sign-key <key file>" if isinstance(self.approvals, SignedApprovals) else ""
        note = f" ({refused} approval record{'s' if refused != 1 else ''} refused: see the unknowns)" if refused else ""
        raise self._stop(
            Status.AWAITING_APPROVAL,
            f"approve step {step.step_id!r} (action {step.action!r}, payload {record.payload_digest}) "
            f"with `longrun approve <store> {self.task_id} --step {step.step_id}{signed}`, then run again{note}",
        )

    def _execute(self, step: Step, record: EffectRecord) -> None:
        state = self._state
        assert state is not None and self._keeper is not None
        now = self.clock.now()
        lease = self._current_lease()
        attempt = record.attempts + 1
        record = record.move(EffectState.STARTED, now, attempts=attempt, epoch=lease.epoch, not_before=None, last_error=None)
        self._put(record)
        if _crashpoints.ARMED:
            _crashpoints.hit("attempt.incremented", f"{step.step_id}#{attempt}")
        state.budget = state.budget.started(now)
        state.status = Status.RUNNING
        state.next_action = f"observe whether effect {record.key!r} took place"
        self._commit()  # the intent is durable before the adapter is called
        if _crashpoints.ARMED:
            _crashpoints.hit("effect.intent-persisted", f"{step.step_id}#{attempt}")
        adapter = self.adapters[step.action]
        request = self._request(step, record, attempt)
        try:
            receipt = adapter.apply(request)
        except TransientError as exc:
            self._transient(step, record, exc)
            return
        except PermanentError as exc:
            self._current_lease()
            self._put(record.move(EffectState.FAILED, self.clock.now(), last_error=printable(f"permanent: {exc}")))
            self._evidence.observed(f"adapter:{step.action}", f"{record.key} attempt {attempt} failed permanently: {exc}")
            raise self._stop(Status.BLOCKED, f"fix the cause of the permanent failure of step {step.step_id!r} ({exc}); the run is over")
        except Exception as exc:  # outcome unknown: recorded as uncertain and observed, never retried blind
            log.warning("apply of %s raised %r; observing", record.key, exc)
            self._current_lease()
            self._evidence.observed(f"adapter:{step.action}", f"{record.key} attempt {attempt} raised {type(exc).__name__}: {exc}")
            record = record.move(EffectState.UNCERTAIN, self.clock.now(), last_error=printable(f"{type(exc).__name__}: {exc}"))
            self._put(record)
            self._settle(step, record)
            return
        if _crashpoints.ARMED:
            _crashpoints.hit("effect.applied", f"{step.step_id}#{attempt}")
        self._current_lease()
        if not isinstance(receipt, Receipt):
            receipt = Receipt(evidence=f"apply returned {type(receipt).__name__}, not a Receipt")
        cost = receipt.cost
        if (
            isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0
            or not math.isfinite(record.cost + state.budget.cost_spent + cost)
        ):
            # An adapter bug: recorded, not charged (a NaN would also poison every later commit).
            self._evidence.unknown(f"adapter:{step.action}", f"receipt for {record.key} reports an invalid cost {cost!r}; not charged")
            cost = 0.0
        cost = float(cost)
        self._evidence.observed(f"adapter:{step.action}", f"receipt for {record.key} attempt {attempt}: {receipt.evidence or 'no evidence'}")
        result, omitted = recordable_result(receipt.result, what=f"the result of step {step.step_id!r}")
        if omitted is not None:  # the effect took place and is recorded; its result is too large to keep
            log.warning("%s: %s", record.key, omitted)
            self._evidence.unknown(f"adapter:{step.action}", omitted)
        record = record.move(
            EffectState.ACKNOWLEDGED,
            self.clock.now(),
            receipt=receipt.evidence or "acknowledged",
            result=result,
            cost=record.cost + cost,
        )
        self._put(record)
        state.budget = state.budget.spent(cost)
        self._settle(step, record)

    def _settle(self, step: Step, record: EffectRecord) -> None:
        """Observe an acknowledged or uncertain effect right after ``apply``."""
        settled = self._reconcile(step, record)
        if settled.verdict is Verdict.UNSAFE:
            raise self._unsafe(settled)
        if settled.verdict is Verdict.RETRY:
            self._commit()  # the retry's backoff must survive a restart
        # A verification is committed with the next step's start (or the stop): one commit per effect.

    def _transient(self, step: Step, record: EffectRecord, exc: TransientError) -> None:
        assert self._state is not None
        self._current_lease()
        self._evidence.observed(f"adapter:{step.action}", f"{record.key} attempt {record.attempts} failed transiently: {exc}")
        record = record.move(EffectState.PLANNED, self.clock.now(), last_error=printable(f"transient: {exc}"))
        record = replace(record, not_before=self._backoff_until(record))
        self._put(record)
        self._commit()

    def _finish(self) -> None:
        state = self._state
        assert state is not None
        required = self.contract.completion_evidence or tuple(step.step_id for step in self.steps)
        missing = [sid for sid in required if state.effects.get(sid) is None or state.effects[sid].state is not EffectState.VERIFIED]
        if missing:  # unreachable while every step must be verified before the loop ends; kept as a guard
            raise self._stop(Status.UNSAFE_TO_CONTINUE, f"completion evidence missing for {missing}")
        state.current_step = None
        self._evidence.inferred(f"every required effect is verified: {list(required)}")
        raise self._stop(Status.DONE, "nothing: every required effect is verified")

    # -- the outcome --------------------------------------------------------------------------

    def _outcome(self, status: Status, next_action: str) -> RunOutcome:
        state = self._state
        return RunOutcome(
            status=status,
            next_action=next_action,
            task_id=self.task_id,
            results=dict(self._results()) if state is not None else {},
            observations=tuple(self._evidence.observations),
            inferences=tuple(self._evidence.inferences),
            unknowns=tuple(self._evidence.unknowns),
            revision=state.revision if state is not None else 0,
            epoch=self._lease.epoch if self._lease is not None else 0,
        )
