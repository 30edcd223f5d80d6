"""``RunIO``: what a run does outside itself besides its adapters, written once for both drivers.

The store (the lease, loads, fenced commits, messages), the cancellation and approval sources, and the
``LeaseKeeper`` that renews the lease in the background. Each method is one blocking piece of I/O
over an ``Invocation``: the synchronous driver calls it in the caller's thread, the async driver
in the invocation's I/O thread (``engine._drivers``). A commit holds ``commit_lock``, so the two
never write one invocation's state at once.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any, Callable

from .. import _crashpoints
from ..cancellation import judge_cancellation
from ..control import ControlRecord
from ..errors import CorruptStateError, FencedError, LeaseHeldError, SizeLimitError, StorageError, describe_exception
from ..lease import Lease, LeaseKeeper
from ..outcome import RunOutcome, Status
from ..protocols import LoadResult, SigningSource
from ._config import EngineConfig, utc
from ._invocation import Invocation, Stop
from ..messages import Delivery, Message
from ._ops import CancellationRead, Load, ReadCancellation, ReadMessages, SendMessage

log = logging.getLogger("longrun")

__all__ = ["RunIO"]


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
        if inv.current is not None and inv.dirty and self.keeper is not None and self.keeper.failure is None:
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
