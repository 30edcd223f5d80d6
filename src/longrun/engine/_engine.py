"""``Engine``: one invocation of a task (``run``, ``arun``) and the recovery procedure that begins it."""

from __future__ import annotations

import operator
import threading

from .. import _crashpoints
from .._io import Gather, Steps, drive
from ..budget import BudgetCounters, describe_wall_gap
from ..contract import is_internal
from ..envelope import RunState
from ..errors import CorruptStateError, FencedError, InvalidInputError, LeaseHeldError, StateUnrecoverableError, StorageError
from ..lease import Lease, LeaseKeeper
from ..ledger import IN_FLIGHT
from ..outcome import TERMINAL, RunOutcome, Status
from ..recovery import Reconciled, Verdict
from ._effects import EffectRules
from ._evidence import EvidenceLog
from ._plans import AsyncPlan, Plan, Stop, utc

__all__ = ["Engine"]

_state_of = operator.attrgetter("state")


class Engine(EffectRules):
    """The recovery procedure and the per-step rules for one task, driven by a face's ``Plan``.
    
    ``Engine`` holds what every face shares: the store, the adapters, the clock, the limits and
    retry policy, the lease, and the authority sources. ``run(plan)`` is one invocation: lease,
    load and validate, reconcile, then the plan drives its steps through ``effect``, ``call`` and
    ``timer``, each of which reads cancellation fresh, enforces the budgets, persists the intent
    before acting and settles by observation. Not thread-safe: one invocation at a time.
    """

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
        from .._concurrency import AsyncDriver

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
        self._evidence = EvidenceLog(self.clock)
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
                self.task_id, self.owner, self.lease_ttl_s, self.clock.now(), monotonic=self._monotonic_reading()
            )
        except LeaseHeldError as exc:
            holder = exc.holder if isinstance(exc.holder, Lease) else None
            self._evidence.observed("store", str(exc))
            self._evidence.unknown("lease", "whether the current lease holder is alive and making progress")
            until = ""
            if holder is not None:
                now = self.clock.now()
                until = f" at {utc(now + max(0.0, holder.remaining(now, self._monotonic_reading())))}"
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
                f"repair the lease record with `longrun repair {self.store_spec} {self.task_id} --lease` (it keeps the damaged "
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

    def _recover_and_run(self, plan: Plan) -> tuple[Status, str]:
        try:
            drive(self._recover(plan), self._perform)
            plan.drive(self)
        except Stop as stop:
            self._wake_at = stop.wake_at
            return stop.status, stop.next_action
        except Exception:
            self.keep_settled()
            raise
        raise AssertionError("the plan ended without a stop")  # pragma: no cover

    def recover_steps(self, plan: Plan) -> Steps[None]:
        """The recovery procedure (load, validate, observe everything in flight) as a step procedure."""
        return self._recover(plan)

    def _recover(self, plan: Plan) -> Steps[None]:
        assert self._lease is not None
        self._worked_mark = self._monotonic()  # this run's work is charged from here
        try:
            loaded = self.store.load(self.task_id, lease=self._lease)
        except StateUnrecoverableError as exc:
            self._evidence.observed("store", str(exc))
            self._evidence.unknown("store", "which effects took place after the last readable revision")
            raise Stop(
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
            raise Stop(state.status, state.next_action)
        in_flight = []
        records = list(state.effects.values())
        if IN_FLIGHT.isdisjoint(map(_state_of, records)):  # as after a clean stop: one pass in C, not one call a record
            records = []
        for record in records:
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

