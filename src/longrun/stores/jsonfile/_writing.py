"""Committing to the JSON-file store: a journal line, or a new snapshot; compaction; and what a
store object remembers of what it wrote (invariants 1, 5 and 6 of the package docstring).

``Writers`` holds, per task, the journal's shadow, where the journal ends and how far it is
zero-filled (``Writer``), and the journal descriptors the store keeps open. It is touched only in
the task's turn (its ``Gate``), except that the descriptor cache closes a descriptor only while no
thread holds or waits for its task.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import weakref
from typing import Collection

from ...envelope import RunState
from ...errors import SizeLimitError, StorageError
from .. import _journal as journal
from ..blobs import BlobCodec, BlobRef, large_values
from .._fileio import FileIO, lexists, write_all_at, write_atomic
from . import _layout as layout
from ._layout import BACKUP, STATE, Gates, TaskFiles, journal_name
from ._reading import Chain, backup_revision, read_snapshot, walk

__all__ = ["Writer", "Writers"]

log = logging.getLogger("longrun")


@dataclasses.dataclass
class Writer:
    """What a store object knows of a task it commits to: the journal's shadow and where it ends."""

    shadow: journal.Shadow
    revision: int
    snapshot_inode: int
    snapshot_revision: int
    snapshot_bytes: int
    has_backup: bool
    journal: str
    journal_inode: int
    journal_end: int
    """Where the next record goes: the end of the content."""
    allocated: int
    """The journal file's size: content plus zero padding."""
    fd: int = -1
    retry_compaction_at: int = 0
    referenced: set[str] | None = None
    """The blobs (hex) that the snapshot and every revision since reference, while known (a writer
    that followed a load does not know): what the next compaction, which makes this snapshot the
    backup, must keep."""


def _close_journals(io: FileIO, writers: dict[str, Writer]) -> None:
    for writer in writers.values():
        fd, writer.fd = writer.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):  # our own descriptor, at collection: nothing to lose
                io.close(fd)


class Writers:
    """The writers of one store object, by task, and its cache of open journal descriptors."""

    def __init__(self, files: TaskFiles, gates: Gates):
        self.files = files
        self.io = files.io
        self.gates = gates
        self.writers: dict[str, Writer] = {}
        self.open_journals: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Tasks whose journal descriptor is open, least recently committed first (``gates.mutex``)."""
        self.codecs: dict[str, BlobCodec] = {}
        """Per task, its large values as this store object knows them (``_blobs``)."""
        weakref.finalize(self, _close_journals, self.io, self.writers)  # a store object dropped without ``close``

    # -- blobs -----------------------------------------------------------------------------------

    def codec(self, task_id: str) -> BlobCodec:
        codec = self.codecs.get(task_id)
        if codec is None:
            codec = self.codecs[task_id] = BlobCodec()
        return codec

    def blobs_read(self, task_id: str, seen: list[tuple[object, BlobRef]]) -> None:
        """A load read (and checked) these blobs: they are stored, and their values need no encoding."""
        codec = self.codec(task_id)
        for value, ref in seen:
            codec.read(value, ref)

    def store_blobs(self, task_id: str, refs: list[BlobRef]) -> None:
        """Make durable every blob among ``refs`` not known stored: before anything that names them."""
        if not refs:
            return
        codec = self.codec(task_id)
        blobs = codec.to_write(refs)
        if blobs:
            self.files.write_blobs(task_id, blobs)
            codec.written(blobs)

    # -- following what is on disk -------------------------------------------------------------

    def follow_chain(self, task_id: str, state: RunState, chain: Chain, *, has_backup: bool) -> None:
        """Follow the chain a load just validated, so the next commit appends to its last journal."""
        self.drop(task_id)
        last = chain.files[-1] if chain.files else None
        snapshot_inode = self.files.inode(task_id, STATE)
        if last is None or snapshot_inode is None:
            return  # nothing to append to (a legacy snapshot): the next commit writes a snapshot
        journal_inode = self.files.inode(task_id, last.name)
        if journal_inode is None:
            return
        self.writers[task_id] = Writer(
            shadow=journal.Shadow(state, self.codec(task_id)),
            revision=chain.end,
            snapshot_inode=snapshot_inode,
            snapshot_revision=chain.snapshot.raw.revision,
            snapshot_bytes=chain.snapshot.size,
            has_backup=has_backup,
            journal=last.name,
            journal_inode=journal_inode,
            journal_end=last.end,
            allocated=last.found.size,
        )

    def follow_new_generation(
        self, task_id: str, state: RunState, lines: list[bytes], *, has_backup: bool, referenced: list[BlobRef] | None = None
    ) -> None:
        """Follow the snapshot just written at ``state.revision`` and its new, empty journal
        (``referenced``: the blobs the snapshot references)."""
        self.drop(task_id)
        name = journal_name(state.revision)
        snapshot_inode = self.files.inode(task_id, STATE)
        journal_info = self.files.lstat(task_id, name)
        if snapshot_inode is None or journal_info is None:
            raise StorageError(f"task {task_id!r}: {STATE} or {name} vanished right after it was written")
        self.writers[task_id] = Writer(
            shadow=journal.Shadow(state, self.codec(task_id)),
            referenced={ref.sha256 for ref in referenced or ()},
            revision=state.revision,
            snapshot_inode=snapshot_inode,
            snapshot_revision=state.revision,
            snapshot_bytes=sum(len(line) for line in lines),
            has_backup=has_backup,
            journal=name,
            journal_inode=journal_info.st_ino,
            journal_end=len(journal.encode_journal_meta(task_id, state.revision)),
            allocated=journal_info.st_size,
        )

    def unchanged(self, task_id: str, writer: Writer) -> bool:
        """Whether the snapshot on disk is still the one this store last wrote or read.

        Every new snapshot is a new file, so this catches another writer's compaction or repair;
        ``_append`` catches another writer's records (they fill the padding this store expects).
        The journal itself is not stat'ed here: on kernels with multigrain timestamps, asking for
        a file's times makes its next write update them finely, which costs the following
        ``fdatasync`` a metadata flush (measured: about 60 us, a third of the commit)."""
        try:
            return self.io.lstat(self.files.path(task_id, STATE)).st_ino == writer.snapshot_inode
        except FileNotFoundError:
            return False

    # -- journal descriptors -------------------------------------------------------------------

    def close_journal(self, task_id: str) -> None:
        """Close the task's journal descriptor; called in the task's turn (its gate held)."""
        with self.gates.mutex:
            self.open_journals.pop(task_id, None)
            writer = self.writers.get(task_id)
            fd = -1
            if writer is not None:
                fd, writer.fd = writer.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                self.io.close(fd)

    def _close_idle_journals(self) -> None:
        """Close the least recently used descriptors beyond ``MAX_OPEN_JOURNALS``, with the mutex
        held. A task some thread holds or waits for is skipped, however old its descriptor: closing
        it would pull the descriptor from under that thread's write (and the number, reused by the
        next open, would send its bytes into another file). So the bound is exceeded, at most by the
        number of tasks in flight, rather than broken."""
        excess = len(self.open_journals) - layout.MAX_OPEN_JOURNALS
        for task_id in list(self.open_journals):
            if excess <= 0:
                break
            if self.gates.busy(task_id):
                continue
            del self.open_journals[task_id]
            writer = self.writers.get(task_id)
            if writer is not None and writer.fd >= 0:
                fd, writer.fd = writer.fd, -1
                with contextlib.suppress(OSError):
                    self.io.close(fd)
            excess -= 1

    def drop(self, task_id: str) -> None:
        """Forget the task: the next commit reads the disk again."""
        self.close_journal(task_id)
        self.writers.pop(task_id, None)
        codec = self.codecs.get(task_id)
        if codec is not None:
            codec.forget_stored()

    # -- commit --------------------------------------------------------------------------------

    def commit(self, state: RunState, changed: Collection[str] | None) -> None:
        """Write ``state`` as its revision: one journal line where one will do, else a snapshot."""
        task_id = state.task_id
        writer = self.writers.get(task_id)
        try:
            if writer is not None and not self.unchanged(task_id, writer):
                raise StorageError(
                    f"task {task_id!r} changed on disk since this store last wrote it (another store "
                    "object or process with the same lease?); load it again before writing"
                )
            record = None
            if writer is not None and writer.shadow.tracks(state) and writer.revision + 1 == state.revision:
                record = writer.shadow.record_for(state, changed)
            line = journal.frame(record) if record is not None else None
            if line is None or writer is None or writer.snapshot_bytes + writer.journal_end + len(line) > layout.MAX_STATE_BYTES:
                # Nothing to append to, or the state may be near the limit a load reads (invariant
                # 6): a snapshot, measured exactly before anything is written.
                self._publish(task_id, state, writer)
                return
            # The blobs the line names are durable (their directory synced) before the line is written.
            introduced = writer.shadow.introduced
            if introduced:  # most commits name no large value
                self.store_blobs(task_id, introduced)
                if writer.referenced is not None:
                    writer.referenced.update([ref.sha256 for ref in introduced])
            self._append(task_id, writer, line)
            writer.revision = state.revision
        except BaseException:
            self.drop(task_id)
            raise
        # Compaction is due without a backup, or once the journal outgrows the snapshot's share
        # (and not before a failed one's retry point).
        end = writer.journal_end
        if (not writer.has_backup or end > max(layout.COMPACT_MIN_BYTES, layout.COMPACT_RATIO * writer.snapshot_bytes)) and end >= writer.retry_compaction_at:
            self._compact(task_id, state, writer)

    def _append(self, task_id: str, writer: Writer, line: bytes) -> None:
        fd = writer.fd
        if fd < 0:
            fd = self.io.open(self.files.path(task_id, writer.journal), os.O_RDWR)
            if self.io.fstat(fd).st_ino != writer.journal_inode:
                self.io.close(fd)
                raise StorageError(f"task {task_id!r}: {writer.journal} was replaced while this store held it")
            with self.gates.mutex:
                writer.fd = fd
                self.open_journals[task_id] = None
                if len(self.open_journals) > layout.MAX_OPEN_JOURNALS:
                    self._close_idle_journals()
        else:
            with self.gates.mutex:
                self.open_journals.move_to_end(task_id)
        end = writer.journal_end
        # Padding is zeros; anything else at our end means another writer used this journal.
        if self.io.pread(fd, 1, end) not in (b"", b"\0"):
            raise StorageError(f"task {task_id!r}: {writer.journal} holds records this store did not write; load it again")
        if end + len(line) > writer.allocated:
            padding = min(layout.PREALLOCATE_MAX, max(layout.PREALLOCATE_MIN, end))
            # A load reads no journal file larger than MAX_JOURNAL_BYTES, padding included.
            padding = max(0, min(padding, layout.MAX_JOURNAL_BYTES - end - len(line)))
            data = line + bytes(padding)
        else:
            padding, data = 0, line
        try:
            write_all_at(self.io, fd, data, end)
            self.io.fdatasync(fd)
        except BaseException:
            # Put the padding back where possible, so a reload sees the previous revision; if even
            # that fails, a reload sees a torn or an unacknowledged last line, both of which are
            # safe (the runner applies nothing until a commit returns).
            with contextlib.suppress(OSError):
                if writer.allocated > end:
                    write_all_at(self.io, fd, bytes(min(len(data), writer.allocated - end)), end)
                self.io.truncate(fd, writer.allocated)
            raise
        writer.journal_end = end + len(line)
        if padding:
            writer.allocated = writer.journal_end + padding

    def _publish(self, task_id: str, state: RunState, writer: Writer | None) -> None:
        """Commit ``state`` as a new snapshot at ``state.revision`` with a new, empty journal.

        Used when there is nothing to append to (the first commit, a state object this store does
        not follow) and by compaction (then ``state.revision`` is already in the journal)."""
        codec = self.codec(task_id)
        referenced: list[BlobRef] = []
        # First: a value that cannot be encoded fails before any I/O. Large values are references.
        lines = journal.encode_snapshot(state, codec, referenced)
        directory = self.files.task_dir(task_id)
        if writer is None:
            demoted = self._check_before_publish(task_id, state)
        else:
            demoted = writer.snapshot_revision
        self.store_blobs(task_id, referenced)  # normally all stored already: a compaction writes no blob
        name = journal_name(state.revision)
        write_atomic(self.io, directory, name, [journal.encode_journal_meta(task_id, state.revision), bytes(layout.PREALLOCATE_MIN)])
        has_backup = lexists(self.io, os.path.join(directory, STATE))
        write_atomic(self.io, directory, STATE, lines, backup=BACKUP if has_backup else None)
        keep = writer.referenced if writer is not None else None
        self.follow_new_generation(task_id, state, lines, has_backup=has_backup, referenced=referenced)
        codec.keep_only(large_values(state.effects.values()))
        if keep is not None:
            self._delete_orphans(task_id, keep | {ref.sha256 for ref in referenced})
        if demoted is not None:
            # Journals before the backup's serve neither snapshot any more. The commit has landed,
            # so a failure here is only logged: it leaves files no chain reads, for the next time.
            try:
                for base, old in self.files.journals(task_id).items():
                    if base < demoted:
                        self.io.unlink(os.path.join(directory, old))
            except OSError as exc:
                log.info("task %s: could not delete old journals: %s", task_id, exc)

    def _delete_orphans(self, task_id: str, keep: set[str]) -> None:
        """Delete the blobs that neither the new snapshot nor its backup's chain references: left by
        a crash before their commit, or by records since replaced. Only a writer that saw every
        revision since the backup-to-be was written knows ``keep``; the commit has landed, so a
        failure is only logged."""
        try:
            orphans = [name for name in self.files.blob_names(task_id) if name not in keep]
            self.files.delete_blobs(task_id, orphans)
        except OSError as exc:
            log.info("task %s: could not delete unreferenced blobs: %s", task_id, exc)
            return
        codec = self.codecs.get(task_id)
        if codec is not None:
            codec.stored.difference_update(orphans)

    def _check_before_publish(self, task_id: str, state: RunState) -> int | None:
        """Before a store object that holds no writer replaces ``state.json``, make sure the task's
        files are whole (so that a damaged snapshot is never linked over a good backup). Returns the
        revision of the snapshot that becomes the backup, if any."""
        with journal.no_gc():
            journals = self.files.journals(task_id)
            primary, error = read_snapshot(self.files, task_id, STATE)
            if primary is None and error is None:
                revision, backup_error = backup_revision(self.files, task_id)
                if revision is not None or backup_error is not None or self.files.quarantined_states(task_id):
                    raise StorageError(f"task {task_id!r} has no {STATE} but other state files: load it with the lease first")
                return None
            chain = walk(self.files, task_id, primary, journals) if primary is not None else None
        if chain is None or chain.problem not in (None, "torn") or chain.state is None:
            raise StorageError(f"task {task_id!r} has damaged state; load it with the lease (which repairs it) before writing")
        if chain.end >= state.revision:
            raise StorageError(f"task {task_id!r} is at revision {chain.end} on disk; load it again before writing")
        return chain.snapshot.raw.revision

    def _compact(self, task_id: str, state: RunState, writer: Writer) -> None:
        """Write the state (already durable in the journal) as a new snapshot. A failure costs only
        time: the commit has landed, so it is logged, and the store keeps appending and tries again."""
        try:
            self._publish(task_id, state, writer)
        except (OSError, SizeLimitError) as exc:  # the size: never (invariant 6), but the commit has landed
            log.warning("task %s: compaction failed (%s); the commit is durable, compaction will be retried", task_id, exc)
            try:
                unchanged = self.writers.get(task_id) is writer and self.unchanged(task_id, writer)
            except OSError:
                unchanged = False
            if unchanged:
                writer.retry_compaction_at = writer.journal_end + layout.COMPACT_MIN_BYTES
            else:
                self.drop(task_id)  # the snapshot changed: the next commit reads the disk again
