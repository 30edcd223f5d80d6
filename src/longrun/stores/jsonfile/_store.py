"""``JsonFileStore``: the ``BaseStore`` primitives over the parts of this package.

The store object owns the task locks' turns (``_enter_gate``/``_leave_gate``), the lease record,
and what it remembers between calls (its writers, the lease bytes last parsed); it hands loading
to ``_recovery``, committing to ``_writing``, control records to ``controlfiles``, the
timeline to ``_reading``, and the summary index (listings in O(page)) to ``_index``, whose
protocol it follows: a row marked before a lease lets a process write, written after each commit,
settled at release, verified from the files by a reader once its writer is gone.

One concept, the store object over its parts, and a long module: each ``stores.base`` primitive
is a few lines handing over to its part, and the listing's methods (the index read, its rebuild,
a row verified from the files) sit beside the lease and state writes whose index protocol they
complete.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import secrets
import time
from typing import Collection, Iterable

from ...approval import Approval
from ...cancellation import Cancellation
from ...canonical import canonical_bytes, parse_json, sha256_hex
from ...control import ControlRecord
from ...envelope import RunState
from ... import _crashpoints
from ...errors import CorruptStateError, ForeignStateError, LongrunError, SchemaVersionError, StorageError, UnknownTaskError
from ...lease import RELEASED, Lease
from ...messages import Message
from ...protocols import LoadResult
from ...outcome import Status
from ...summary import MAX_ERROR_CHARS, NEW, UNREADABLE, SummaryQuery, TaskSummary, summarize
from .. import _journal as journal
from .._fileio import FileIO, read_small, read_small_fd, remove_tree, write_atomic
from .._holders import HolderLocks
from .._queue_sql import delete_side_row
from ..base import BaseStore
from ..controlfiles import ControlFiles
from ._index import SummaryIndex
from ._layout import HOLDER_LOCK, LEASE, MAX_RECORD_BYTES, NONBLOCK, Gate, Gates, Handles, Held, TaskFiles, Transaction, lease_key
from ._mailbox import Mailbox
from ._reading import epoch_floor, history
from ._recovery import Load
from ._writing import Writer, Writers

__all__ = ["JsonFileStore"]

log = logging.getLogger("longrun")

INDEX_ROW_INTERVAL_S = 1.0
"""How often, at most, a running task's summary row is written while its holder lives and commits."""


def _checked_lease(document: object) -> object:
    """A lease file's fields without its checksum, which must match them.

    The checksum (SHA-256 over the canonical JSON of the other fields) makes a flipped digit in the
    epoch or the expiry damage rather than a different lease; without it a bit flip could lower the
    epoch and let the store issue one twice. A file written before the checksum existed has none
    and is read as it is (damage to the key's name leaves an unknown field, which is refused)."""
    if not isinstance(document, dict) or "checksum" not in document:
        return document
    body = {key: value for key, value in document.items() if key != "checksum"}
    try:
        expected = "sha256:" + sha256_hex(canonical_bytes(body))
    except (TypeError, ValueError) as exc:
        raise CorruptStateError(f"lease record cannot be re-encoded: {exc}") from exc
    if document["checksum"] != expected:
        raise CorruptStateError("lease record checksum does not match its content")
    return body


class JsonFileStore(BaseStore):
    """A store that keeps each task in a directory of its own, for the processes of one machine.

    A commit is one journal line and one ``fdatasync``; the package docstring
    (``longrun.stores.jsonfile``) gives the layout, the invariants and what is not guaranteed.

    ``root`` must exist, unless ``create=True``: then it is made (with any missing parents,
    owner-only) when a lease is first taken, with the store marker (``.longrun-store``). A root
    that exists and is not a store (no marker, not empty, and no task directory longrun wrote) is
    refused here with ``NotAStoreError`` naming it, whatever ``create`` says; a store an earlier
    version wrote (no marker, but its tasks) is used, and marked when a task is first created. Without it, taking a lease in a missing root raises
    ``InvalidInputError`` and creates nothing, so a path that names the wrong place (a typo, a
    volume that is not mounted) cannot start every task afresh in a new, empty store. Reading a
    missing root finds no task (``UnknownTaskError``, an empty ``list_tasks``). Opening the store
    touches nothing. ``root`` may be a symbolic link to a plain directory owned by this user (the
    link itself owned by this user or root); links inside the store are refused.

    ``io`` is the one way the store reaches the file system (``FileIO``; the fault and crash tests
    pass one that fails or records calls).

    One store object may be shared by threads (the Runner renews its lease from a thread of its
    own; a pool may run many tasks through one store). Its threads take turns per task, inside the
    flock that orders processes, and a journal descriptor is closed only when no thread holds or
    waits for its task. Different tasks proceed in parallel. ``close`` (or leaving a ``with``
    block) closes the descriptors it keeps; the store stays usable.
    """

    def __init__(self, root: str | os.PathLike[str], *, io: FileIO | None = None, create: bool = False):
        super().__init__()
        self.root = os.path.abspath(os.fspath(root))
        self.spec = self.root
        self.io = io if io is not None else FileIO()
        self.create = bool(create)
        self._files = TaskFiles(self.root, self.io, create=self.create)
        self._files.check_store()
        self._gates = Gates()
        self._writing = Writers(self._files, self._gates)
        self._handles = Handles(self.io, self._gates)
        self._control = ControlFiles(self.root, io=self.io, hold_directories=True)
        self._mailbox = Mailbox(self.root, self.io)
        self._leases: dict[str, tuple[bytes, Lease]] = {}
        self._deleting: dict[str, str] = {}
        """Task id -> the directory its deletion set aside, between ``_delete_task`` and ``_after_delete``."""
        self._holders = HolderLocks(lambda task_id: os.path.join(self.task_dir(task_id), HOLDER_LOCK))
        self._index = SummaryIndex(self.root, repr(self), self.list_tasks, self.io)
        self._index_marked: dict[str, int] = {}
        """Per task, the lease epoch whose writes this object marked in the index (``_index``, step 1)."""
        self._index_synced: dict[str, int] = {}
        self._index_rows: dict[str, tuple[TaskSummary, float]] = {}
        """Per task, the row this object last wrote and when (``time.monotonic``) the next one is due."""
        self._index_behind: dict[str, tuple[int, float, str]] = {}
        """Per task, the revision, time and next action of a running commit whose row is not yet written."""
        """Per task, the lease epoch in which this object's last commit also wrote the task's row."""

    def __repr__(self) -> str:
        return f"JsonFileStore({self.root!r})"

    def create_root(self) -> None:
        """Make the root and its store marker now (``create=True``), rather than with the first task:
        what ``longrun init --create-store`` does. An existing store is left as it is (an earlier
        version's gets its marker)."""
        self._files.ensure_root()

    @property
    def _writers(self) -> dict[str, Writer]:
        """What this store object last wrote, by task (read by tests and benchmarks)."""
        return self._writing.writers

    @property
    def _open_journals(self) -> collections.OrderedDict[str, None]:
        return self._writing.open_journals

    def close(self) -> None:
        """Close the descriptors this store keeps open (journals, lock and lease files, control
        directories). The store stays usable.

        Safe while other threads use the store: a task's descriptors are closed in that task's
        turn, so this waits for a commit in flight on it to end."""
        with self._gates.mutex:
            open_now = set(self._writing.open_journals)
        for task_id in sorted(open_now | set(self._handles.tasks())):
            gate = self._enter_gate(task_id)
            try:
                self._writing.close_journal(task_id)
                self._handles.drop(task_id)
            finally:
                self._leave_gate(task_id, gate)
        self._control.close()
        self._index.close()

    def __enter__(self) -> "JsonFileStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def task_dir(self, task_id: str) -> str:
        """The task's directory (the task id is checked first: it must be a safe path component)."""
        return self._files.task_dir(task_id)

    # -- transaction: the task's turn among threads, then flock among processes ----------------

    def _transaction(self, task_id: str, *, create: bool, write: bool = True) -> Transaction:
        return Transaction(self, self._files, self._handles, task_id, create=create, write=write)

    def _enter_gate(self, task_id: str) -> Gate:
        """Wait for the task's turn among this store object's threads (see ``Gate``)."""
        return self._gates.enter(task_id)

    def _leave_gate(self, task_id: str, gate: Gate) -> None:
        self._gates.leave(task_id, gate)

    # -- lease --------------------------------------------------------------------------------

    def _get_lease(self, task_id: str) -> Lease | None:
        data = self._lease_bytes(task_id)
        if data is None:
            return None
        # The record is read on every commit (the fence); parsing it again is only needed when its
        # bytes differ from the ones last parsed, so the check compares bytes, never timestamps.
        cached = self._leases.get(task_id)
        if cached is not None and cached[0] == data:
            return cached[1]
        try:
            document = parse_json(data, what="lease record", max_bytes=MAX_RECORD_BYTES, unique_keys=True)
            lease = Lease.from_json(_checked_lease(document))
        except SchemaVersionError:
            raise
        except CorruptStateError as exc:
            raise CorruptStateError(f"lease record of {task_id!r} is damaged: {exc}") from exc
        if lease.task_id != task_id:
            raise ForeignStateError(f"lease record in {task_id!r} names task {lease.task_id!r}")
        self._leases[task_id] = (data, lease)
        return lease

    def _lease_bytes(self, task_id: str) -> bytes | None:
        """The lease file's bytes (None: no lease file), read in the task's turn.

        A store object that holds the task's lock descriptor also holds the lease file it last
        read (``_layout.Handles``): while an ``lstat`` finds that very file unchanged, its bytes are the
        ones read then, and the read costs one call instead of three."""
        held = self._handles.get(task_id)
        if held is None:
            return read_small(self.io, self._files.path(task_id, LEASE), MAX_RECORD_BYTES)
        path = self._files.path(task_id, LEASE)
        if held.lease_key is not None:
            try:
                info = self.io.lstat(path)
            except FileNotFoundError:
                info = None
            # ``lease_key(info)``, spelled out: this runs on every commit.
            if info is not None and (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns) == held.lease_key:
                return held.lease_data
        self._unpin_lease(held)
        try:
            fd = self.io.open(path, os.O_RDONLY | NONBLOCK)
        except FileNotFoundError:
            return None
        try:
            info = self.io.fstat(fd)
            data = read_small_fd(self.io, fd, path, MAX_RECORD_BYTES)
        except BaseException:
            self.io.close(fd)
            raise
        # Pinned: the inode cannot be reused while this descriptor is open.
        held.lease, held.lease_key, held.lease_data = fd, lease_key(info), data
        return data

    def _unpin_lease(self, held: Held) -> None:
        fd, held.lease, held.lease_key, held.lease_data = held.lease, -1, None, None
        if fd >= 0:
            self.io.close(fd)

    def _put_lease(self, lease: Lease) -> None:
        task_id = lease.task_id
        released = lease.expires_at == RELEASED
        if not released and self._index_marked.get(task_id) != lease.epoch:
            # Before the lease that lets a process write: a crash after any of its writes leaves the row marked.
            self._index.mark(task_id)
            self._index_marked[task_id] = lease.epoch
            self._index_synced.pop(task_id, None)
            self._index_rows.pop(task_id, None)
            self._index_behind.pop(task_id, None)
        self._write_lease(lease)
        self._index_catch_up(task_id, lease.epoch)  # a renewal or the release: the row catches up with the last commit
        if released:
            self._index_marked.pop(task_id, None)
            self._index_rows.pop(task_id, None)
            if self._index_synced.pop(task_id, None) == lease.epoch:
                try:
                    self._index.settle(task_id)
                except StorageError as exc:
                    log.warning("%s (the row stays marked: the next listing reads the task's files)", exc, extra={"task": task_id})

    def _write_lease(self, lease: Lease) -> None:
        body = lease.to_json()
        data = canonical_bytes({**body, "checksum": "sha256:" + sha256_hex(canonical_bytes(body))})
        held = self._handles.get(lease.task_id)
        if held is not None:
            self._unpin_lease(held)  # a new file: the next read reads and pins it
        write_atomic(self.io, self.task_dir(lease.task_id), LEASE, data)
        self._leases[lease.task_id] = (data, lease)

    def _epoch_floor(self, task_id: str) -> int:
        return epoch_floor(self._files, task_id)

    def _set_lease_aside(self, task_id: str, reason: str) -> str:
        self._leases.pop(task_id, None)
        held = self._handles.get(task_id)
        if held is not None:
            self._unpin_lease(held)
        return self._files.quarantine(task_id, LEASE, reason)

    # -- state --------------------------------------------------------------------------------

    def _get_state(self, task_id: str, *, repair: bool) -> LoadResult:
        if not self._files.exists(task_id):
            return LoadResult(state=None)
        if repair:
            self._files.sweep_temporaries(task_id)
            self._writing.drop(task_id)
        with journal.no_gc():
            return Load(self._files, self._writing, task_id, repair=repair, witness=lambda: self._witness(task_id)).result()

    def _put_state(self, state: RunState, changed: Collection[str] | None) -> None:
        self._writing.commit(state, changed)
        task_id = state.task_id
        written = self._index_rows.get(task_id)
        if (
            written is not None and state.status is Status.RUNNING and written[0].status == Status.RUNNING.value
            and time.monotonic() < written[1] and state.lease_epoch == self._index_marked.get(task_id)
        ):  # fmt: skip
            # A running task's row is written at most once per INDEX_ROW_INTERVAL_S while its holder
            # lives (it stays marked; the release writes the last commit's): no index write per effect.
            self._index_behind[task_id] = (state.revision, state.updated_at, state.next_action)
            return
        self._index_put(task_id, summarize(state), state.lease_epoch)

    def _index_put(self, task_id: str, summary: TaskSummary, epoch: int) -> None:
        """Write the task's row after a durable commit: a failure is logged, never raised, and leaves the row marked."""
        self._index_behind.pop(task_id, None)
        if _crashpoints.ARMED:
            _crashpoints.hit("index.before_write", summary.revision)
        try:
            self._index.put(summary)
        except StorageError as exc:
            self._index_synced.pop(task_id, None)
            self._index_rows.pop(task_id, None)
            log.warning("%s (the row stays marked: the next listing reads the task's files)", exc, extra={"task": task_id})
        else:
            self._index_synced[task_id] = epoch
            self._index_rows[task_id] = (summary, time.monotonic() + INDEX_ROW_INTERVAL_S)

    def _index_catch_up(self, task_id: str, epoch: int) -> None:
        """Write the row of the last commit a running holder left unwritten (at a renewal or the release)."""
        behind = self._index_behind.get(task_id)
        written = self._index_rows.get(task_id)
        if behind is not None and written is not None:
            revision, updated_at, next_action = behind
            self._index_put(task_id, dataclasses.replace(written[0], revision=revision, updated_at=updated_at, next_action=next_action), epoch)

    # -- control records ----------------------------------------------------------------------

    def _known(self, task_id: str) -> None:
        """Raise ``UnknownTaskError`` unless the task exists (control records need no lock)."""
        try:
            if self._files.exists(task_id):
                return
            unknown = self._files.unknown(task_id)
        except LongrunError:
            raise
        except OSError as exc:
            raise StorageError(f"cannot open task {task_id!r} in {self.root}: {exc}") from exc
        raise unknown

    def read_cancellation(self, task_id: str) -> ControlRecord | None:
        if not self._control.holds(task_id):  # held: the task was there when it was first read
            self._known(task_id)
        return self._control.read_cancellation(task_id)

    def write_cancellation(self, record: Cancellation) -> None:
        self._known(record.task_id)
        self._control.write_cancellation(record)

    def read_approvals(self, task_id: str) -> tuple[ControlRecord, ...]:
        self._known(task_id)
        return self._control.read_approvals(task_id)

    def write_approval(self, approval: Approval) -> None:
        self._known(approval.task_id)
        self._control.write_approval(approval)

    def watch_roots(self) -> tuple[str, ...]:
        """The store root: its tasks' control records are files under it (``protocols.WatchedSource``)."""
        return (self.root,)

    # -- deletion -----------------------------------------------------------------------------

    DELETED_PREFIX = ".deleted."
    """A task directory being deleted is first renamed to ``.deleted.<task id>.<random>`` in the root."""

    def _delete_task(self, task_id: str) -> list[str]:
        """One rename takes the whole task directory out of the store (to a dot name, which is never
        a task id: no listing or load reads it), made durable by an fsync of the root; its files are
        removed after the transaction (``_after_delete``). A crash before the rename's fsync leaves
        the task whole; after it, at most a ``.deleted.*`` directory that nothing reads, removed by
        hand or left."""
        directory = self.task_dir(task_id)
        self._index.mark(task_id)  # a crash after the rename leaves a marked row, which a listing then deletes
        trash = os.path.join(self.root, f"{self.DELETED_PREFIX}{task_id}.{secrets.token_hex(4)}")
        try:
            self.io.replace(directory, trash)
            self.io.fsync_dir(self.root)
        except OSError as exc:
            raise StorageError(f"cannot delete task {task_id!r} in {self.root}: {exc}") from exc
        self._deleting[task_id] = trash
        try:
            self._index.remove(task_id)
        except StorageError as exc:
            log.warning("%s (the row stays marked: the next listing removes it)", exc, extra={"task": task_id})
        return [directory + os.sep]

    def _after_delete(self, task_id: str) -> None:
        trash = self._deleting.pop(task_id, None)
        gate = self._enter_gate(task_id)
        try:
            self._writing.drop(task_id)
            self._handles.drop(task_id)
        finally:
            self._leave_gate(task_id, gate)
        self._control.forget(task_id)
        self._leases.pop(task_id, None)
        self._index_marked.pop(task_id, None)
        self._index_synced.pop(task_id, None)
        self._index_rows.pop(task_id, None)
        self._index_behind.pop(task_id, None)
        if trash is not None:
            try:
                remove_tree(self.io, trash)
            except OSError as exc:
                raise StorageError(f"task {task_id!r} is deleted, but its files in {trash} could not all be removed: {exc}") from exc
        delete_side_row(self.root, task_id)
    # -- messages (``_mailbox``; the task's flock is held by ``BaseStore``) ----------------------

    def _message_with_key(self, task_id: str, key: str) -> Message | None:
        return self._mailbox.with_key(task_id, key)

    def _last_message_seq(self, task_id: str) -> int:
        return self._mailbox.last_seq(task_id)

    def _put_message(self, message: Message) -> None:
        self._mailbox.put(message)

    def _get_messages(self, task_id: str, topic: str | None) -> list[Message]:
        return self._mailbox.read(task_id, topic)

    # -- listing ------------------------------------------------------------------------------

    def history(self, task_id: str) -> list[dict[str, object]]:
        """The commits the store still holds for a task, oldest first, read-only.

        Each entry: ``revision``, ``epoch``, ``at`` (the commit's ``updated_at``), ``changes`` (one
        phrase per changed effect or header field) and ``description``. Compaction deletes journals
        older than the previous generation, so this is the recent timeline, not the task's whole
        life; the state itself still says where every effect ended. A damaged line ends its
        journal's part of the timeline (``load`` says why).
        """
        with self._transaction(task_id, create=False, write=False):
            return history(self._files, task_id)

    def list_tasks(self) -> list[str]:
        return self._files.list_tasks()

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
        """``BaseStore.list_summaries`` from the summary index (``_index``): O(page), after the rows
        a crashed writer left marked are read again from their files. If the index cannot be used
        (its file cannot be written), every task is loaded instead, and a warning says why."""
        query = SummaryQuery.of(
            statuses=statuses, functions=functions, parent=parent, match=match, since=since, until=until, limit=limit, offset=offset
        )
        if not os.path.isdir(self.root):
            return []
        try:
            self._refresh_index()
            return self._index.query(query)
        except StorageError as exc:
            log.warning("%s; this listing loads every task instead", exc)
            return query.select(self._summary(task_id) for task_id in self.list_tasks())

    def status_counts(self) -> dict[str, int]:
        """How many tasks have each status, counted in the summary index (see ``list_summaries``)."""
        if not os.path.isdir(self.root):
            return {}
        try:
            self._refresh_index()
            return self._index.counts()
        except StorageError as exc:
            log.warning("%s; this count loads every task instead", exc)
            return super().status_counts()

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
        """``BaseStore.count_summaries``, counted in the summary index (see ``list_summaries``)."""
        query = SummaryQuery.of(statuses=statuses, functions=functions, parent=parent, match=match, since=since, until=until)
        if not os.path.isdir(self.root):
            return 0
        try:
            self._refresh_index()
            return self._index.count(query)
        except StorageError as exc:
            log.warning("%s; this count loads every task instead", exc)
            return len(query.select(self._summary(task_id) for task_id in self.list_tasks()))

    def function_names(self) -> list[str]:
        """``BaseStore.function_names`` from the summary index's function index."""
        if not os.path.isdir(self.root):
            return []
        try:
            self._refresh_index()
            return self._index.function_names()
        except StorageError as exc:
            log.warning("%s; this listing loads every task instead", exc)
            return super().function_names()

    def _refresh_index(self) -> None:
        """Build the index from every task if it was never built; verify the rows whose writer is gone."""
        if not self._index.built():
            tasks = self.list_tasks()
            for task_id in tasks:
                self._verify(task_id)
            self._index.set_built()
            log.info("%r: summary index built from %d tasks", self, len(tasks))
        for task_id in self._index.dirty():
            if not self._held(task_id):
                self._verify(task_id)

    def _held(self, task_id: str) -> bool:
        """Whether a process on this machine holds the task's holder lock (``_holders``): its writer lives."""
        assert self._holders is not None  # this store always has them (``__init__``)
        return self._holders.someone_holds(task_id)

    def _verify(self, task_id: str) -> None:
        """Write the task's row from its files, under its shared flock (no commit lands meanwhile), and
        clear its mark unless a live lease may still write (a holder on this machine, or a lease
        that names no holder lock and is not released); delete the row of a task that is gone."""
        try:
            if not self._files.exists(task_id):
                self._index.verified(None, task_id, settle=True)
                return
            with self._transaction(task_id, create=False, write=False):
                settle = True
                try:
                    result = self._get_state(task_id, repair=False)
                    self._check_witness(task_id, result, self._witness(task_id))
                    summary = summarize(result.state) if result.state is not None else TaskSummary(task_id, NEW)
                except LongrunError as exc:
                    summary = TaskSummary(task_id, UNREADABLE, error=str(exc)[:MAX_ERROR_CHARS])
                    settle = False  # read again by the next listing: the damage may be repaired, or the error passing
                if settle:
                    try:
                        lease = self._get_lease(task_id)
                    except LongrunError:
                        lease = None
                    if lease is not None and lease.expires_at != RELEASED:
                        # A lease not released may still write: settled only if its holder is provably gone.
                        settle = lease.holder_lock is not None and not self._held(task_id)
                self._index.verified(summary, task_id, settle=settle)
        except UnknownTaskError:
            self._index.verified(None, task_id, settle=True)
