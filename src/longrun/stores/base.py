"""The shared base of the stores longrun ships: the fencing, lease and revision rules, written once.

Invariants every store built on ``BaseStore`` keeps (the tests are built to break them):

1. Epochs only grow: each successful ``acquire_lease`` issues ``previous epoch + 1``.
2. A second owner cannot acquire while the current lease is unexpired.
3. Every mutating call that carries a lease (commit, renew, release, repairing load) runs inside
   the task's exclusive transaction and is refused with ``FencedError``, changing nothing, unless
   the lease's epoch equals the stored epoch.
4. Revisions only grow: each commit gets a revision above every revision that may have been
   committed before, including one lost to damage.
5. After a failed write the store refuses further commits for that task until it is re-loaded,
   because the bytes on disk may no longer be what it believes (SQLite's pager error state). A
   write fails also when the transaction around it fails to commit (a database's COMMIT).
   A commit refused as invalid input (``InvalidInputError``: a field the loader would refuse,
   ``SizeLimitError``: a state it could not read back) writes nothing and is not a failed write:
   ``_put_state`` encodes and checks everything before its first write.
6. Lease expiry is judged by ``_clock``, read inside the task's transaction: the caller's ``now``
   unless the store has a better clock (a database server's), so runners on machines whose clocks
   disagree cannot both hold an unexpired lease. If the lease record carries an expiry on a
   monotonic timeline (``Lease.monotonic_clock``) and the caller passes a ``monotonic`` reading on
   the same timeline, that decides instead (see ``longrun.lease``): a wall clock that jumps cannot
   hand a live lease to a contender.

A subclass supplies the primitives: a per-task exclusive transaction, reading and writing the
lease record, reading (and repairing) and writing the state, and the control records.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Collection

from .. import _crashpoints
from ..approval import Approval
from ..cancellation import Cancellation
from ..contract import check_task_id
from ..control import ControlRecord
from ..envelope import RunState
from ..errors import FencedError, InvalidInputError, LeaseHeldError, StorageError
from ..lease import Lease, MonotonicReading
from ..protocols import LoadResult

__all__ = ["BaseStore"]

log = logging.getLogger("longrun")


class BaseStore:
    """Implements the ``Store`` protocol over a handful of primitives (see the module docstring)."""

    def __init__(self) -> None:
        self._revisions: dict[str, int] = {}
        self._poisoned: dict[str, BaseException] = {}

    # -- primitives a subclass provides -------------------------------------------------------

    def _transaction(self, task_id: str, *, create: bool, write: bool = True) -> contextlib.AbstractContextManager[None]:
        """Exclusive (``write``) or shared access to one task; ``create`` makes the task if missing,
        otherwise a missing task raises ``UnknownTaskError``."""
        raise NotImplementedError

    def _get_lease(self, task_id: str) -> Lease | None:
        raise NotImplementedError

    def _put_lease(self, lease: Lease) -> None:
        raise NotImplementedError

    def _clock(self, now: float) -> float:
        """The time to judge and stamp leases by, called inside the task's transaction.

        The default trusts the caller's ``now``; a store shared by several machines returns its
        own clock (the database server's), so that a runner's skewed clock cannot expire a live
        lease early or keep a dead one alive."""
        return now

    def _epoch_floor(self, task_id: str) -> int:
        """The highest epoch recorded anywhere but the lease record (used if that record is lost)."""
        return 0

    def _get_state(self, task_id: str, *, repair: bool) -> LoadResult:
        raise NotImplementedError

    def _put_state(self, state: RunState, changed: Collection[str] | None) -> None:
        """Write ``state``. Raises ``InvalidInputError`` (or ``SizeLimitError``, naming the limit) for
        a state the store's loader could not read back, and then only before anything is written."""
        raise NotImplementedError

    def read_cancellation(self, task_id: str) -> ControlRecord | None:
        raise NotImplementedError

    def write_cancellation(self, record: Cancellation) -> None:
        raise NotImplementedError

    def read_approvals(self, task_id: str) -> tuple[ControlRecord, ...]:
        raise NotImplementedError

    def write_approval(self, approval: Approval) -> None:
        raise NotImplementedError

    def list_tasks(self) -> list[str]:
        raise NotImplementedError

    # -- the rules, once ----------------------------------------------------------------------

    @staticmethod
    def _check_ttl(ttl_s: float) -> None:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not ttl_s > 0:
            raise InvalidInputError(f"lease ttl must be a positive number of seconds, got {ttl_s!r}")

    def _fence(self, lease: Lease, *, operation: str) -> Lease:
        current = self._get_lease(lease.task_id)
        if current is None or current.epoch != lease.epoch:
            raise FencedError(
                f"{operation} for task {lease.task_id!r} refused: it carries epoch {lease.epoch}, "
                f"the store's current epoch is {current.epoch if current else 'none'}",
                current_epoch=current.epoch if current else None,
                write_epoch=lease.epoch,
            )
        return current

    @staticmethod
    def _monotonic_expiry(monotonic: MonotonicReading | None, ttl_s: float) -> dict[str, object]:
        """The lease fields that record its expiry on the caller's monotonic timeline, if it has one."""
        if monotonic is None:
            return {}
        timeline, reading = monotonic
        return {"monotonic_clock": timeline, "monotonic_expires_at": reading + ttl_s}

    def acquire_lease(
        self, task_id: str, owner: str, ttl_s: float, now: float, *, monotonic: MonotonicReading | None = None
    ) -> Lease:
        """Take the task's lease with the next epoch, unless another owner's lease is live.

        Live means unexpired by the store's clock (``_clock(now)``), or, when the record and
        ``monotonic`` are on the same monotonic timeline, by that timeline alone (``Lease.remaining``)."""
        check_task_id(task_id)
        self._check_ttl(ttl_s)
        if not isinstance(owner, str) or not owner:
            raise InvalidInputError("lease owner must be a non-empty string")
        with self._transaction(task_id, create=True):
            now = self._clock(now)
            current = self._get_lease(task_id)
            if current is not None and current.owner != owner and not current.expired(now, monotonic):
                raise LeaseHeldError(
                    f"task {task_id!r} is leased to {current.owner!r} (epoch {current.epoch}) "
                    f"for {current.remaining(now, monotonic):.1f}s more",
                    holder=current,
                )
            floor = current.epoch if current is not None else self._epoch_floor(task_id)
            lease = Lease(
                task_id=task_id, owner=owner, epoch=floor + 1, acquired_at=now, expires_at=now + ttl_s,
                **self._monotonic_expiry(monotonic, ttl_s),  # type: ignore[arg-type]
            )  # fmt: skip
            self._put_lease(lease)
        log.debug("lease on %s acquired by %s at epoch %d", task_id, owner, lease.epoch)
        if _crashpoints.ARMED:
            _crashpoints.hit("lease.acquired", lease.epoch)
        return lease

    def renew_lease(self, lease: Lease, ttl_s: float, now: float, *, monotonic: MonotonicReading | None = None) -> Lease:
        self._check_ttl(ttl_s)
        with self._transaction(lease.task_id, create=False):
            now = self._clock(now)
            current = self._fence(lease, operation="lease renewal")
            if current.owner != lease.owner:
                raise FencedError(f"lease on {lease.task_id!r} at epoch {lease.epoch} belongs to {current.owner!r}")
            renewed = Lease(
                lease.task_id, lease.owner, lease.epoch, current.acquired_at, now + ttl_s,
                **self._monotonic_expiry(monotonic, ttl_s),  # type: ignore[arg-type]
            )  # fmt: skip
            self._put_lease(renewed)
        if _crashpoints.ARMED:
            _crashpoints.hit("lease.renewed", lease.epoch)
        return renewed

    def release_lease(self, lease: Lease, now: float, *, monotonic: MonotonicReading | None = None) -> None:
        with self._transaction(lease.task_id, create=False):
            now = self._clock(now)
            current = self._fence(lease, operation="lease release")
            ended: dict[str, object] = {}
            if monotonic is not None and current.monotonic_clock == monotonic[0] and current.monotonic_expires_at is not None:
                ended = {"monotonic_clock": monotonic[0], "monotonic_expires_at": min(monotonic[1], current.monotonic_expires_at)}
            # Without a reading on the record's timeline the record drops it: the wall-clock expiry
            # (now, at the latest) then decides, so a release always ends the lease.
            self._put_lease(
                Lease(lease.task_id, current.owner, lease.epoch, current.acquired_at, min(now, current.expires_at), **ended)  # type: ignore[arg-type]
            )

    def read_lease(self, task_id: str) -> Lease | None:
        check_task_id(task_id)
        with self._transaction(task_id, create=False, write=False):
            return self._get_lease(task_id)

    def load(self, task_id: str, *, lease: Lease | None = None) -> LoadResult:
        """Read the task's state. With a lease (checked), damaged files are also quarantined."""
        check_task_id(task_id)
        with self._transaction(task_id, create=False, write=lease is not None):
            if lease is not None:
                self._fence(lease, operation="state repair")
            result = self._get_state(task_id, repair=lease is not None)
        if lease is not None:
            self._revisions[task_id] = max(result.revision_floor, result.state.revision if result.state else 0)
            self._poisoned.pop(task_id, None)
        return result

    def commit(self, lease: Lease, state: RunState, changed: Collection[str] | None = None) -> int:
        """Durably write ``state`` as the task's next revision, fenced by ``lease``. Returns the revision.

        A state the loader would refuse is refused here with ``InvalidInputError`` (``SizeLimitError``
        if it is too large to read back), and nothing is written."""
        task_id = state.task_id
        if lease.task_id != task_id:
            raise InvalidInputError(f"lease for {lease.task_id!r} cannot commit state of {task_id!r}")
        state.check_header()
        for step_id in state.effects if changed is None else changed:
            record = state.effects.get(step_id)
            if record is not None:
                record.check_types()
        poisoned = self._poisoned.get(task_id)
        if poisoned is not None:
            raise StorageError(
                f"task {task_id!r}: an earlier write failed ({poisoned}); load the task again before writing"
            ) from poisoned
        previous_revision = state.revision
        writing = False
        try:
            with self._transaction(task_id, create=False):
                self._fence(lease, operation="state write")
                known = self._revisions.get(task_id)
                if known is None:
                    known = self._get_state(task_id, repair=False).state
                    known = known.revision if known is not None else 0
                state.revision = known + 1
                state.lease_epoch = lease.epoch
                state.lease_owner = lease.owner
                state.lease_expires_at = lease.expires_at
                writing = True
                self._put_state(state, changed)
            # A database store's write lands at the end of the transaction (its COMMIT), so a
            # failure there is a failed write too and must poison the task like one.
        except BaseException as exc:
            if writing:
                state.revision = previous_revision
                if not isinstance(exc, InvalidInputError):  # refused before any write (see _put_state)
                    self._poisoned[task_id] = exc
            raise
        self._revisions[task_id] = state.revision
        return state.revision
