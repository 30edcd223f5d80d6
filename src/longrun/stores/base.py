"""The shared base of the stores longrun ships: the fencing, lease and revision rules, written once.

Invariants every store built on ``BaseStore`` keeps (the tests are built to break them):

1. Epochs only grow: each successful ``acquire_lease`` issues ``previous epoch + 1``.
2. Nobody acquires while the current lease is unexpired, whatever owner name it gives, unless it
   presents that lease's secret token (re-entry by its holder), or the store proves the holder
   dead (its kernel lock on this machine is free, see ``_holders``).
3. Every mutating call that carries a lease (commit, renew, release, repairing load) runs inside
   the task's exclusive transaction and is refused with ``FencedError``, changing nothing, unless
   the lease's epoch equals the stored epoch and it carries the stored lease's token (a record
   written before tokens existed has none: the epoch alone decides).
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
7. A state is never silently older than what a record kept apart from it shows was committed.
   Every lease write (acquisition, renewal, release) carries ``Lease.committed_revision``: the
   highest revision whose commit had returned, as far as the record and this store object know.
   ``_witness`` reads that record back (the JSON-file store: ``lease.json``, a file apart from the
   snapshot and journals; the SQLite store: a small file beside the database). A load whose state
   is below the witnessed revision, or that finds no state where the witness shows one was
   committed, raises ``StateUnrecoverableError``: a crash loses at most a write whose sync never
   returned, which no witness ever names, so anything more is damage (a journal cut short, a copy
   restored, a database emptied or that lost its log), never a fresh start. A state rebuilt from
   damage (``LoadResult.source == "backup"``) is held to the witness too, unless every record its
   task can make is an effect whose target can be asked again (``RunState.observable_again``: a
   declared plan), because the rebuilt state observes those step by step; a durable function's or
   a session's lost revisions may hold a call's answer, a person's answer, an approval consumed, a
   timer's wake time or a child's link, which nothing can observe again, so a run on the rebuilt
   state would make them anew and could return another answer. The witness's epoch also floors the next epoch, so a lost lease record cannot
   make an epoch be issued twice. Not caught: a loss of commits made since the last lease write
   (the runner observes before its first apply for that), or a witness lost together with the
   state.
8. A damaged lease record is repaired only by ``repair_lease``: the record is moved aside (never
   deleted) and replaced by a released lease at the highest epoch recorded elsewhere
   (``_epoch_floor``), so the next acquisition's epoch is above every epoch the state records. It
   refuses a record that is not damaged, and one whose holder is alive on this machine.

9. A message's number is taken, and its key looked up, inside the receiver's exclusive
   transaction (``send_message``): numbers follow the order the sends commit, with no gap and no
   repeat, and a key is stored once. Messages are never fenced (anyone may send) and never marked
   consumed here: the receiver records which it took in its own state (``longrun.messages``).
10. A task is deleted (``delete_task``) only inside its exclusive transaction, only if its state
   loads with an ended status (``outcome.TERMINAL``) and its lease is neither live by the store's
   clock nor held by a live process on this machine; its id then starts afresh. Each store's
   ``_delete_task`` says what a crash in the middle leaves: the whole task, or nothing that loads
   as one.

A subclass supplies the primitives: a per-task exclusive transaction, reading and writing the
lease record (and moving a damaged one aside), reading (and repairing) and writing the state, and
the control records, the mailbox, the deletion; a store on this machine's file system also gives
``_holders``.

Beside the rules, the base gives every store the listing (``list_summaries``, ``status_counts``:
by loading every state, which a store with a summary index replaces; ``load_many``: a load per
task, which the SQL stores replace with one transaction) and the recording of new
tasks' first revisions (``record_new``: a lease, a commit and a release per task, which a store
that can write them in one transaction replaces).

One concept, the rules every store keeps, so one module, and a long one: each rule above is
written here once, over primitives, so that no backend restates (and could weaken) one.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
from typing import Collection, Iterable, NamedTuple, Sequence

from .. import _crashpoints
from ..approval import Approval
from ..cancellation import Cancellation
from ..contract import check_task_id
from ..control import ControlRecord
from ..envelope import RunState
from ..errors import (
    CorruptStateError,
    FencedError,
    ForeignStateError,
    InvalidInputError,
    LeaseHeldError,
    LongrunError,
    SchemaVersionError,
    SizeLimitError,
    StateUnrecoverableError,
    StorageError,
    TaskNotFinishedError,
)
from ..lease import RELEASED, Lease, LeaseRepair, MonotonicReading
from ..messages import MAX_MESSAGES, Delivery, Message, check_topic
from ..outcome import TERMINAL
from ..protocols import LoadResult, TaskDeletion
from ..summary import MAX_ERROR_CHARS, NEW, UNREADABLE, SummaryQuery, TaskSummary, summarize
from ._holders import HolderLocks

__all__ = ["BaseStore", "Witness", "lost_records_message"]

log = logging.getLogger("longrun")


class Witness(NamedTuple):
    """What a record kept apart from the task's state shows (see invariant 7)."""

    epoch: int
    """The highest epoch the record names: the next acquisition issues one above it."""
    revision: int
    """A revision known committed: the state must never load below it (0: none known)."""
    source: str
    """Where it was read, for messages."""


def lost_records_message(task_id: str, rebuilt: int, committed: int, evidence: str, quarantined: Collection[str] = ()) -> str:
    """Why a state rebuilt from damage at revision ``rebuilt`` may not be loaded when ``evidence``
    shows revision ``committed``: its task records what no target can show again (invariant 7)."""
    moved = f"; the damaged files were moved to {', '.join(quarantined)}" if quarantined else ""
    return (
        f"task {task_id!r}: the state can only be rebuilt at revision {rebuilt}, but {evidence} shows that revision "
        f"{committed} was committed, and this task records what no target can show again (a call's answer, a "
        "person's answer, an approval consumed, a timer's wake time, a child's link): a run on the rebuilt state "
        f"would make them anew and could change a recorded answer, so it is not loaded{moved}. Restore the damaged "
        "or missing files (a blob, a journal, a snapshot) from a copy, or retire the task id"
    )


class BaseStore:
    """Implements the ``Store`` protocol over a handful of primitives (see the module docstring)."""

    _reads_take_a_snapshot = False
    """A read-only transaction sees a snapshot while writers go on (SQLite's WAL readers): a
    read-only load then reads the witness before the state (see ``load``)."""

    spec: str | None = None
    """The string that names this store to ``open_store`` and the command line (a directory,
    ``sqlite:PATH``, a PostgreSQL URL without its password), which next actions quote; None if
    the store cannot be named so (a PostgreSQL store built from a connection factory)."""

    _holders: HolderLocks | None = None
    """The kernel locks that prove a holder's liveness on this machine (``_holders``); None for a
    store shared across machines, whose leases end by expiry only."""

    def __init__(self) -> None:
        self._revisions: dict[str, int] = {}
        self._committed: dict[str, int] = {}
        """Per task, the highest revision whose commit returned through this store object: only
        these (never a revision merely read, whose sync may not have returned) go into a witness."""
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

    def _witness(self, task_id: str) -> Witness:
        """The epoch and committed revision a record apart from the state shows, called inside the
        task's transaction. The default reads the lease record; a store whose lease record lives
        with its state (a database) keeps the witness elsewhere, or has none (revision 0)."""
        try:
            lease = self._get_lease(task_id)
        except CorruptStateError:
            # A damaged record witnesses nothing; a run stops state-unrecoverable on it until it is
            # repaired (invariant 8), and the repair writes the epoch floor.
            return Witness(0, 0, "a damaged lease record")
        if lease is None:
            return Witness(0, 0, "no lease record")
        return Witness(lease.epoch, lease.committed_revision, "the lease record")

    def _set_lease_aside(self, task_id: str, reason: str) -> str:
        """Move the damaged lease record aside (never delete it); return where it went."""
        raise NotImplementedError

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

    def list_summaries(
        self,
        *,
        statuses: Iterable[str] = (),
        functions: Iterable[str] = (),
        parent: str | None = None,
        match: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[TaskSummary]:
        """The tasks' summaries (``longrun.summary``) that pass the filters, newest first (see
        ``SummaryQuery``), ``offset`` skipped, at most ``limit``. Bad filters raise ``InvalidInputError``.

        This default loads every task's state: O(tasks), and always exactly the committed state.
        A store that keeps a summary row per task in each commit's own transaction (the SQL
        stores) answers from an index instead, in O(page). A task whose state cannot be read
        here is listed with the status ``unreadable`` and the reason as its error."""
        query = SummaryQuery.of(
            statuses=statuses, functions=functions, parent=parent, match=match, since=since, until=until, limit=limit, offset=offset
        )
        return query.select(self._summary(task_id) for task_id in self.list_tasks())

    def status_counts(self) -> dict[str, int]:
        """How many tasks have each status (``longrun.summary``: a ``Status`` value or ``new``);
        statuses no task has are left out. This default loads every task; the SQL stores count rows."""
        counts: dict[str, int] = {}
        for summary in self.list_summaries():
            counts[summary.status] = counts.get(summary.status, 0) + 1
        return counts

    def count_summaries(
        self,
        *,
        statuses: Iterable[str] = (),
        functions: Iterable[str] = (),
        parent: str | None = None,
        match: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> int:
        """How many tasks pass the filters of ``list_summaries`` (bad ones: ``InvalidInputError``).
        This default lists them; a store with a summary index counts its rows."""
        return len(self.list_summaries(statuses=statuses, functions=functions, parent=parent, match=match, since=since, until=until))

    def function_names(self) -> list[str]:
        """The durable functions the tasks run (``module:name``), sorted, once each. This default
        lists every summary; a store with a summary index walks its function index, one seek a name."""
        return sorted({summary.function for summary in self.list_summaries() if summary.function})

    RECORDER = "longrun record"
    """The lease owner named by the first revision ``record_new`` writes."""

    def record_new(self, states: Sequence[RunState], now: float) -> list[bool]:
        """Write each state as the first revision of a task that has none; True for each one written.

        A task that already exists (it has a state, or its lease is held, or merely a row) is left
        as it is, False: the caller reads it (a first run that records it is under way, or it was
        recorded before). Every state is checked before anything is written (``InvalidInputError``,
        nothing written); the states are changed as a commit changes them (revision 1, the
        recorder's epoch and owner). This default takes each task's lease, commits and releases it:
        every rule of a commit holds. A store that can do better writes them all in one transaction
        (the SQL stores: without a lease, as no one can hold a task that does not exist yet)."""
        self._check_new(states)
        created = []
        for state in states:
            try:
                lease = self.acquire_lease(state.task_id, self.RECORDER, 30.0, now)
            except LeaseHeldError:
                created.append(False)
                continue
            try:
                if self.load(state.task_id, lease=lease).state is not None:
                    created.append(False)
                else:
                    self.commit(lease, state, None)
                    created.append(True)
            finally:
                self.release_lease(lease, now)
        return created

    @staticmethod
    def _check_new(states: Sequence[RunState]) -> None:
        if isinstance(states, (str, bytes)) or not isinstance(states, Sequence):
            raise InvalidInputError("record_new takes a sequence of states")
        seen: set[str] = set()
        for state in states:
            if not isinstance(state, RunState):
                raise InvalidInputError(f"record_new takes RunState objects, got {type(state).__name__}")
            check_task_id(state.task_id)
            if state.task_id in seen:
                raise InvalidInputError(f"task {state.task_id!r} is given twice; nothing was recorded")
            seen.add(state.task_id)
            if state.revision != 0:
                raise InvalidInputError(f"task {state.task_id!r}: a first revision is built at revision 0, not {state.revision}")
            state.check_header()  # what ``commit`` checks, before anything is written
            for record in state.effects.values():
                record.check_types()

    def _summary(self, task_id: str) -> TaskSummary:
        try:
            state = self.load(task_id).state
        except LongrunError as exc:
            return TaskSummary(task_id, UNREADABLE, error=str(exc)[:MAX_ERROR_CHARS])
        return summarize(state) if state is not None else TaskSummary(task_id, NEW)

    def _delete_task(self, task_id: str) -> list[str]:
        """Remove the task, inside its exclusive transaction, so that a crash leaves the whole task
        or nothing that loads as one; return what was removed. ``_after_delete`` runs after."""
        raise NotImplementedError

    def _after_delete(self, task_id: str) -> None:
        """Clean-up once the task's transaction has ended (files set aside by ``_delete_task``)."""

    def _message_with_key(self, task_id: str, key: str) -> Message | None:
        """The task's message with ``key``, if any; called inside the task's exclusive transaction."""
        raise NotImplementedError

    def _last_message_seq(self, task_id: str) -> int:
        """The highest sequence number of the task's messages (0: none); inside its exclusive transaction."""
        raise NotImplementedError

    def _put_message(self, message: Message) -> None:
        """Store ``message`` (its ``seq`` assigned) durably; inside the task's exclusive transaction."""
        raise NotImplementedError

    def _get_messages(self, task_id: str, topic: str | None) -> list[Message]:
        """The task's messages (of ``topic``, or all), in any order; inside a task transaction."""
        raise NotImplementedError

    # -- messages: the mailbox rules, once -------------------------------------------------------

    def send_message(self, message: Message) -> Delivery:
        """See ``Store.send_message``: the key is looked up and the number assigned inside the
        receiver's exclusive transaction, so two senders cannot take one number or both store a key."""
        if not isinstance(message, Message):
            raise InvalidInputError(f"send_message needs a Message, got {type(message).__name__}")
        check_task_id(message.task_id)
        with self._transaction(message.task_id, create=False):
            existing = self._message_with_key(message.task_id, message.key)
            if existing is not None:
                return Delivery(existing.seq, duplicate=True)
            seq = self._last_message_seq(message.task_id) + 1
            if seq > MAX_MESSAGES:
                raise SizeLimitError(
                    f"task {message.task_id!r} already holds {MAX_MESSAGES} messages (MAX_MESSAGES); nothing was sent",
                    size=seq, limit=MAX_MESSAGES, limit_name="MAX_MESSAGES",
                )  # fmt: skip
            self._put_message(Message(message.task_id, message.topic, message.value, message.key, message.sender, message.sent_at, seq))
        return Delivery(seq)

    def read_messages(self, task_id: str, topic: str | None = None) -> tuple[Message, ...]:
        check_task_id(task_id)
        if topic is not None:
            check_topic(topic)
        with self._transaction(task_id, create=False, write=False):
            found = self._get_messages(task_id, topic)
        for message in found:
            if message.task_id != task_id:
                raise ForeignStateError(f"a message in the mailbox of {task_id!r} names task {message.task_id!r}")
        return tuple(sorted(found, key=lambda message: message.seq))

    # -- the rules, once ----------------------------------------------------------------------

    @staticmethod
    def _check_ttl(ttl_s: float) -> None:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not ttl_s > 0:
            raise InvalidInputError(f"lease ttl must be a positive number of seconds, got {ttl_s!r}")

    def _fence(self, lease: Lease, *, operation: str) -> Lease:
        try:
            current = self._get_lease(lease.task_id)
        except CorruptStateError:
            self._let_go(lease)  # the holder cannot prove it holds the lease any more
            raise
        if current is None or current.epoch != lease.epoch:
            self._let_go(lease)
            raise FencedError(
                f"{operation} for task {lease.task_id!r} refused: it carries epoch {lease.epoch}, "
                f"the store's current epoch is {current.epoch if current else 'none'}",
                current_epoch=current.epoch if current else None,
                write_epoch=lease.epoch,
            )
        if not self._holds(current, lease.token):
            self._let_go(lease)
            raise FencedError(
                f"{operation} for task {lease.task_id!r} refused: it carries epoch {lease.epoch} but not "
                "that lease's token (only the holder it was granted to may write under it)",
                current_epoch=current.epoch,
                write_epoch=lease.epoch,
            )
        return current

    @staticmethod
    def _holds(current: Lease, token: str | None) -> bool:
        """Whether ``token`` is ``current``'s secret. A record written before tokens has none: then
        the epoch alone decides, as it did when that record was written."""
        if current.token is None:
            return True
        return isinstance(token, str) and hmac.compare_digest(token.encode(), current.token.encode())

    def _let_go(self, lease: Lease) -> None:
        if self._holders is not None:
            self._holders.let_go(lease.task_id, lease)

    @staticmethod
    def _monotonic_expiry(monotonic: MonotonicReading | None, ttl_s: float) -> dict[str, object]:
        """The lease fields that record its expiry on the caller's monotonic timeline, if it has one."""
        if monotonic is None:
            return {}
        return {"monotonic_clock": monotonic.timeline, "monotonic_expires_at": monotonic.seconds + ttl_s}

    def acquire_lease(
        self,
        task_id: str,
        owner: str,
        ttl_s: float,
        now: float,
        *,
        monotonic: MonotonicReading | None = None,
        token: str | None = None,
    ) -> Lease:
        """Take the task's lease with the next epoch and a new secret token, unless it is live.

        Live means unexpired by the store's clock (``_clock(now)``), or, when the record and
        ``monotonic`` are on the same monotonic timeline, by that timeline alone (``Lease.remaining``).
        A live lease is taken only by a caller that presents its ``token`` (its holder re-entering),
        or when the store proves its holder dead (``_holders``). ``owner`` is only a label."""
        check_task_id(task_id)
        self._check_ttl(ttl_s)
        if not isinstance(owner, str) or not owner:
            raise InvalidInputError("lease owner must be a non-empty string")
        if token is not None and not isinstance(token, str):
            raise InvalidInputError("a lease token must be a string (the token of the lease to re-enter)")
        with self._transaction(task_id, create=True):
            now = self._clock(now)
            current = self._get_lease(task_id)
            claim, newly = self._holders.claim(task_id) if self._holders is not None else (None, False)
            try:
                if current is not None and not current.expired(now, monotonic):
                    reentry = token is not None and current.token is not None and self._holds(current, token)
                    if not reentry and not HolderLocks.holder_gone(current, claim, newly):
                        raise LeaseHeldError(
                            f"task {task_id!r} is leased to {current.owner!r} (epoch {current.epoch}) "
                            f"for {current.remaining(now, monotonic):.1f}s more",
                            holder=current.without_token(),
                        )
                    if not reentry:
                        log.warning(
                            "task %s: the holder of its lease at epoch %d (%s) is gone from this machine "
                            "(its lock was free); taken over at once",
                            task_id, current.epoch, current.owner,
                        )  # fmt: skip
                witness = self._witness(task_id)
                floor = max(current.epoch if current is not None else self._epoch_floor(task_id), witness.epoch)
                lease = Lease(
                    task_id=task_id, owner=owner, epoch=floor + 1, acquired_at=now, expires_at=now + ttl_s,
                    token=secrets.token_hex(16), holder_lock=claim,
                    committed_revision=self._committed_revision(task_id, current),
                    **self._monotonic_expiry(monotonic, ttl_s),  # type: ignore[arg-type]
                )  # fmt: skip
                self._put_lease(lease)
            except BaseException:
                if newly and self._holders is not None:
                    self._holders.let_go(task_id)
                raise
            if self._holders is not None and claim is not None:
                self._holders.assign(task_id, lease)
        log.debug("lease on %s acquired by %s at epoch %d", task_id, owner, lease.epoch, extra={"task": task_id, "epoch": lease.epoch})
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
                token=current.token, holder_lock=current.holder_lock,
                **self._monotonic_expiry(monotonic, ttl_s),  # type: ignore[arg-type]
                committed_revision=self._committed_revision(lease.task_id, current),
            )  # fmt: skip
            self._put_lease(renewed)
        log.debug("lease on %s renewed by %s at epoch %d", lease.task_id, lease.owner, lease.epoch, extra={"task": lease.task_id, "epoch": lease.epoch})
        if _crashpoints.ARMED:
            _crashpoints.hit("lease.renewed", lease.epoch)
        return renewed

    def release_lease(self, lease: Lease, now: float, *, monotonic: MonotonicReading | None = None) -> None:
        with self._transaction(lease.task_id, create=False):
            now = self._clock(now)
            current = self._fence(lease, operation="lease release")
            # A released lease records the expiry RELEASED, over on every clock: judged by a wall clock
            # stepped back after the release, an expiry of "now" would look live again.
            self._put_lease(
                Lease(
                    lease.task_id, current.owner, lease.epoch, current.acquired_at, RELEASED,
                    token=current.token,
                    committed_revision=self._committed_revision(lease.task_id, current),
                )
            )  # fmt: skip
        log.debug("lease on %s released at epoch %d", lease.task_id, lease.epoch, extra={"task": lease.task_id, "epoch": lease.epoch})
        self._let_go(lease)

    def _committed_revision(self, task_id: str, current: Lease | None) -> int:
        """What the next lease record witnesses: the most it or this store object knows committed."""
        return max(current.committed_revision if current is not None else 0, self._committed.get(task_id, 0))

    def read_lease(self, task_id: str) -> Lease | None:
        """The task's lease record as anyone may see it: without its holder's token."""
        check_task_id(task_id)
        with self._transaction(task_id, create=False, write=False):
            lease = self._get_lease(task_id)
        return lease.without_token() if lease is not None else None

    def repair_lease(self, task_id: str, now: float, *, repaired_by: str = "longrun repair") -> LeaseRepair:
        """Replace a damaged lease record by a released lease that no epoch already used can follow.

        The damaged record is moved aside (``_set_lease_aside``, never deleted). The new record is
        released (acquired at ``now``, expired since the clock's epoch, whatever a runner's clock
        says), names ``repaired_by`` as its owner, and carries the highest epoch the store records
        anywhere else (``_epoch_floor``: the state, its journal, the database's floor) and a token
        nobody holds, so the next acquisition gets a strictly higher epoch and no earlier holder
        can write under it. Refused with ``InvalidInputError`` if the record is not damaged (or missing: the next
        acquisition already starts above the floor), with ``SchemaVersionError`` if it was written
        by a newer longrun, and with ``LeaseHeldError`` if a process on this machine still holds
        the task's lock (stop it first). A holder on another machine cannot be seen: its writes
        are then refused by the new token and epoch, and it stops ``lease-lost``."""
        check_task_id(task_id)
        if not isinstance(repaired_by, str) or not repaired_by:
            raise InvalidInputError("repaired_by must be a non-empty string")
        with self._transaction(task_id, create=False):
            now = self._clock(now)
            try:
                current = self._get_lease(task_id)
            except SchemaVersionError:
                raise  # well formed, from a newer longrun: not damage, not ours to replace
            except (CorruptStateError, ForeignStateError) as exc:
                damage = str(exc)
            else:
                what = "has no lease record" if current is None else f"has a valid lease record (epoch {current.epoch})"
                raise InvalidInputError(f"task {task_id!r} {what}: the lease is not damaged, nothing to repair")
            if self._holders is not None and self._holders.someone_holds(task_id):
                raise LeaseHeldError(
                    f"task {task_id!r}: a process on this machine holds the lease's lock, so its holder is alive; "
                    "stop it (or let it finish) before repairing the lease record"
                )
            floor = self._epoch_floor(task_id)
            quarantined = self._set_lease_aside(task_id, "damaged")
            # Expired for every clock (a runner's wall clock may lag the operator's): no one holds it.
            lease = Lease(task_id, repaired_by, floor, acquired_at=now, expires_at=RELEASED, token=secrets.token_hex(16))
            self._put_lease(lease)
        log.warning(
            "task %s: damaged lease record moved to %s; a released lease at epoch %d written (%s)", task_id, quarantined, floor, damage
        )
        return LeaseRepair(lease=lease.without_token(), quarantined=quarantined, damage=damage)

    def delete_task(self, task_id: str, now: float) -> TaskDeletion:
        """Delete a task whose run has ended and whose lease is not live (see ``Store.delete_task``).

        Checked and done inside the task's exclusive transaction, so no run can take the lease in
        between: the lease must be released or expired by the store's clock (``_clock(now)``) and
        not held by a live process on this machine (``LeaseHeldError``), and the state must load
        with a terminal status (``TaskNotFinishedError``; a damaged state raises as a load does).
        What a crash in the middle leaves is each store's ``_delete_task``'s to say."""
        check_task_id(task_id)
        with self._transaction(task_id, create=False):
            now = self._clock(now)
            lease = self._get_lease(task_id)
            if lease is not None and not lease.expired(now, None):
                raise LeaseHeldError(
                    f"task {task_id!r} is leased to {lease.owner!r} (epoch {lease.epoch}) for "
                    f"{lease.remaining(now, None):.1f}s more; nothing was deleted",
                    holder=lease.without_token(),
                )
            if self._holders is not None and self._holders.someone_holds(task_id):
                raise LeaseHeldError(f"task {task_id!r}: a process on this machine holds its lease's lock; nothing was deleted")
            state = self._get_state(task_id, repair=False).state
            status = state.status.value if state is not None else "new"
            if state is None or state.status not in TERMINAL:
                raise TaskNotFinishedError(
                    f"task {task_id!r} is {status}, not ended (done, cancelled, limits-exhausted or blocked): "
                    "only a task whose run has ended can be deleted; nothing was deleted",
                    status=status,
                )
            removed = self._delete_task(task_id)
        for cache in (self._revisions, self._committed, self._poisoned):
            cache.pop(task_id, None)
        self._after_delete(task_id)
        log.info("task %s deleted (%s at revision %d)", task_id, status, state.revision, extra={"task": task_id})
        return TaskDeletion(task_id, status, state.revision, tuple(removed))

    def load(self, task_id: str, *, lease: Lease | None = None) -> LoadResult:
        """Read the task's state. With a lease (checked), damaged files are also quarantined."""
        check_task_id(task_id)
        early = None
        if lease is None and self._reads_take_a_snapshot:
            # A reader that does not block writers may see a state older than a witness written
            # since its snapshot began: read the witness first, in a transaction of its own.
            with self._transaction(task_id, create=False, write=False):
                early = self._witness(task_id)
        with self._transaction(task_id, create=False, write=lease is not None):
            if lease is not None:
                self._fence(lease, operation="state repair")
            result = self._get_state(task_id, repair=lease is not None)
            witness = early if early is not None else self._witness(task_id)
        try:
            self._check_witness(task_id, result, witness)
        except StateUnrecoverableError as exc:
            self._poisoned[task_id] = exc  # nothing may be written over it, by this object either
            raise
        if lease is not None:
            self._revisions[task_id] = max(result.revision_floor, result.state.revision if result.state else 0)
            self._poisoned.pop(task_id, None)
        return result

    def load_many(self, task_ids: Sequence[str]) -> list[LoadResult | LongrunError]:
        """Read-only loads of ``task_ids``, in order: each task's ``LoadResult``, or the
        ``LongrunError`` its ``load`` raised (an unknown task's ``UnknownTaskError``, a damaged
        one's ``StateUnrecoverableError``...). A bad task id raises ``InvalidInputError`` before
        anything is read. This default loads each; the SQL stores read every task's rows in one
        transaction of a few queries (what a page of ``longrun ls`` costs), and leave each result's
        ``digest`` empty."""
        ids = [check_task_id(task_id) for task_id in task_ids]
        results: list[LoadResult | LongrunError] = []
        for task_id in ids:
            try:
                results.append(self.load(task_id))
            except LongrunError as exc:
                results.append(exc)
        return results

    @staticmethod
    def _check_witness(task_id: str, result: LoadResult, witness: Witness) -> None:
        """Invariant 7: refuse a state older than its witness, and a missing one it says existed."""
        if witness.revision <= 0:
            return
        if result.source == "backup" and (result.state is None or result.state.observable_again):
            return  # every revision lost held effects only: the rebuilt state observes them step by step
        if result.state is None:
            raise StateUnrecoverableError(
                f"task {task_id!r} has no state, but {witness.source} shows that revision {witness.revision} was "
                "committed: the state was lost (deleted, emptied, or a database that lost committed transactions), "
                "which no crash can do; nothing was changed. Restore the state, or retire the task id"
            )
        if result.source == "backup" and result.state.revision < witness.revision:
            raise StateUnrecoverableError(lost_records_message(task_id, result.state.revision, witness.revision, witness.source))
        if result.state.revision < witness.revision:
            raise StateUnrecoverableError(
                f"task {task_id!r}: the state loaded at revision {result.state.revision}, but {witness.source} shows "
                f"that revision {witness.revision} was committed: the state was rolled back further than a crash can "
                "take it (a journal cut short, an older copy restored, a database log lost); nothing was changed. "
                "Restore the lost state, or retire the task id"
            )

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
                    stored = self._get_state(task_id, repair=False).state
                    known = stored.revision if stored is not None else 0
                state.revision = known + 1
                state.lease_epoch = lease.epoch
                state.lease_owner = lease.owner
                state.lease_expires_at = lease.expires_at
                writing = True
                self._put_state(state, changed)
                # Inside the task's transaction: another thread's commit to the task, waiting for
                # it, must count from this revision (if the COMMIT below fails, the task is
                # poisoned until a load sets this again).
                self._revisions[task_id] = state.revision
            # A database store's write lands at the end of the transaction (its COMMIT), so a
            # failure there is a failed write too and must poison the task like one.
        except BaseException as exc:
            if writing:
                state.revision = previous_revision
                if not isinstance(exc, InvalidInputError):  # refused before any write (see _put_state)
                    self._poisoned[task_id] = exc
            raise
        if state.revision > self._committed.get(task_id, 0):  # its commit returned: a witness may name it
            self._committed[task_id] = state.revision
        return state.revision
