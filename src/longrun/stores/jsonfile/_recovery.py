"""Loading a task from the JSON-file store: the chain from ``state.json`` when it is whole, the
longest valid chain when it is not, and, for a repairing load, making the recovery durable
(invariants 3 and 4 of the package docstring). A rebuild that lacks a revision known committed
(by the journals, or by the lease record's witness) is refused for a task whose records are not
all effects (``RunState.observable_again``): its lost revisions may hold answers nothing can
observe again (``stores.base`` invariant 7).

``Load`` is one load of one task: what it read, the evidence it gathered, and, when repairing, the
files it moved aside. A read-only load changes no byte and no name.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

from ...errors import CorruptStateError, StateUnrecoverableError
from ...outcome import Evidence
from ...protocols import LoadResult
from .. import _journal as journal
from ..blobs import BlobRef
from .._fileio import write_atomic
from ..base import Witness, lost_records_message
from ._layout import BACKUP, BLOBS, STATE, TaskFiles, journal_name
from ._reading import BlobReader, Chain, JournalFile, backup_revision, holds_records, read_journal, read_snapshot, stray_journals, walk
from ._writing import Writers

__all__ = ["Load"]

log = logging.getLogger("longrun")


class Load:
    """One load of one task: read everything once, then judge it (``result``).

    With ``repair`` (a load under the lease), damaged files are moved to quarantine and a recovered
    state is written as a new snapshot, and ``writers`` follows what the load validated or wrote."""

    def __init__(
        self, files: TaskFiles, writers: Writers, task_id: str, *, repair: bool, witness: Callable[[], Witness] | None = None
    ):
        self.files = files
        self.witness = witness
        """Reads the lease record's witness (``stores.base`` invariant 7), when damage makes it matter."""
        self.writers = writers
        self.task_id = task_id
        self.repair = repair
        self.now = time.time()
        self.notes: list[Evidence] = []
        self.moved: list[str] = []
        self.journals = files.journals(task_id)
        self.primary, self.primary_error = read_snapshot(files, task_id, STATE)
        self.backup_revision, self.backup_error = backup_revision(files, task_id)
        self.rolled_back = (
            self.primary is not None
            and self.backup_revision is not None
            and self.backup_revision >= self.primary.raw.revision
            # The same file under both names is the moment inside a compaction between linking the
            # backup and replacing the snapshot, not a rollback.
            and files.inode(task_id, STATE) != files.inode(task_id, BACKUP)
        )
        self.blobs = BlobReader(files, task_id)
        self.chain = walk(files, task_id, self.primary, self.journals, self.blobs) if self.primary is not None else None
        """The chain from ``state.json``, if it validated."""

    def note(self, text: str) -> None:
        self.notes.append(Evidence("store", text, self.now))

    def set_aside(self, name: str, reason: str, why: str) -> None:
        """Say what is wrong with ``name`` and, when repairing, move it to quarantine."""
        self.note(f"{name} {why}")
        if self.repair:
            self.moved.append(self.files.quarantine(self.task_id, name, reason))
            self.note(f"{name} quarantined to {self.moved[-1]}")

    def result(self) -> LoadResult:
        chain, primary = self.chain, self.primary
        if chain is not None and not self.rolled_back:
            stray, _ = stray_journals(self.files, self.task_id, self.journals, chain)
            if chain.problem in (None, "torn") and chain.state is not None and not stray:
                if self.backup_error is not None:
                    self.set_aside(BACKUP, "damaged", f"is damaged: {self.backup_error}")
                return self._clean(chain)

        # Damage somewhere: rebuild from the longest valid chain, observing every unverified step.
        if self.primary_error is not None:
            self.note(f"{STATE} is damaged: {self.primary_error}")
        elif self.rolled_back:
            assert primary is not None
            self.note(
                f"{STATE} (revision {primary.raw.revision}) is not newer than its backup (revision {self.backup_revision}): rolled back"
            )
        elif primary is None:
            self.note(f"{STATE} is missing")
        if chain is not None and not self.rolled_back:
            self.note(_describe_problem(chain))
        candidates = [chain] if chain is not None else []  # a rolled-back snapshot is still valid data
        backup = None
        if self.backup_revision is not None:
            backup, error = read_snapshot(self.files, self.task_id, BACKUP)
            self.backup_error = self.backup_error or error
        if backup is not None:
            candidates.append(walk(self.files, self.task_id, backup, self.journals, self.blobs))
        if self.backup_error is not None:
            self.note(f"{BACKUP} is damaged: {self.backup_error}")
        if not candidates:
            return self._nothing_valid()
        # The longest chain wins; on a tie the one from state.json, unless that one was rolled back.
        best = max(
            candidates,
            key=lambda item: (item.end if item.state is not None else item.snapshot.raw.revision, item is chain and not self.rolled_back),
        )
        if best.state is None:  # checksum-valid records that do not build a valid state: the snapshot alone
            self.note(f"the journal after {best.snapshot.name} does not build a valid state: {best.error}")
            alone = None
            # The newest snapshot that builds alone; one whose blob is missing or damaged does not.
            for candidate in sorted(candidates, key=lambda item: item.snapshot.raw.revision, reverse=True):
                again, _ = read_snapshot(self.files, self.task_id, candidate.snapshot.name)  # the walk changed the first copy
                if again is None:
                    continue
                rebuilt = Chain(again, journal.Replay(again.raw), [], problem="damaged")
                try:
                    rebuilt.state = rebuilt.replay.build(self.blobs)
                except CorruptStateError as exc:
                    self.note(f"{again.name} alone does not build a valid state either: {exc}")
                    continue
                alone = rebuilt
                break
            if alone is None:
                self._set_blobs_aside()
                raise StateUnrecoverableError(
                    f"task {self.task_id!r}: no snapshot builds a valid state ({best.error}); nothing was changed. "
                    "Restore the missing blob or state, or retire the task id"
                )
            best = alone
        floor = self._floor(best, candidates)
        self._refuse_lost_records(best, self._floor(best, candidates, proven=True))
        return self._recovered(best, candidates, floor)

    def _clean(self, chain: Chain) -> LoadResult:
        state = chain.state
        assert state is not None
        last = chain.files[-1] if chain.files else None
        detail = f"{STATE} revision {chain.snapshot.raw.revision}"
        if chain.records:
            detail += f" and {chain.records} journal record{'s' if chain.records != 1 else ''} validated: revision {chain.end}"
        else:
            detail += " validated"
        self.notes.insert(0, Evidence("store", detail, self.now))
        if last is not None and last.problem == "torn":
            cut = last.found.content_end - last.end
            log.warning("task %s: dropped an incomplete last record (%d bytes) of %s", self.task_id, cut, last.name)
            self.note(f"dropped an incomplete last record ({cut} bytes) of {last.name}: its write was cut short, so it was never acknowledged")
        if self.repair:
            if last is not None and last.problem == "torn":
                self._cut_torn_tail(last)
            self.writers.blobs_read(self.task_id, self.blobs.seen)
            self.writers.follow_chain(self.task_id, state, chain, has_backup=self.backup_revision is not None)
        return LoadResult(
            state=state,
            source="primary",
            digest=chain.digest(),
            observations=tuple(self.notes),
            quarantined=tuple(self.moved),
            revision_floor=chain.end,
        )

    def _nothing_valid(self) -> LoadResult:
        """Neither snapshot validates (or neither exists)."""
        task_id = self.task_id
        if self.primary_error is None and self.backup_error is None:
            with_records = [
                name for base, name in self.journals.items()
                if (item := read_journal(self.files, task_id, name, base)) is not None and holds_records(item)
            ]  # fmt: skip
            quarantined = self.files.quarantined_states(task_id)
            if with_records or quarantined:
                # Damaged state was set aside earlier, or its snapshots were lost, and nothing valid
                # replaced it: starting afresh would repeat every effect the lost state recorded.
                raise StateUnrecoverableError(
                    f"task {task_id!r} has no valid state (neither {STATE} nor {BACKUP} exists) but "
                    f"{'its quarantine holds ' + str(quarantined) if quarantined else 'journals ' + str(with_records) + ' hold records'}; "
                    f"restore a validated {STATE} or retire the task id"
                )
            return LoadResult(state=None, observations=tuple(self.notes))  # a task that never committed
        if self.primary_error is not None:
            self.set_aside(STATE, "damaged", "is set aside")
        if self.backup_error is not None:
            self.set_aside(BACKUP, "damaged", "is set aside")
        raise StateUnrecoverableError(
            f"task {task_id!r}: neither {STATE} nor {BACKUP} validates; damaged files "
            + ("were quarantined" if self.repair else "were left in place (read-only load)")
        )

    def _floor(self, best: Chain, candidates: list[Chain], *, proven: bool = False) -> int:
        """The highest revision that may have been committed: the chains' ends, the snapshots'
        revisions and, for every journal, the revisions its records (and, past damage, its bytes)
        could hold. With ``proven``, only what whole records show was written: bytes past damage
        may be a write that power loss garbled before its sync returned, never acknowledged, so
        they may number the next revision but never prove that a commit was lost."""
        primary = self.primary
        floor = max(best.end, self.backup_revision or 0, primary.raw.revision if primary else 0)
        # Revisions in a journal are contiguous from its base, so one read to a clean (or torn) end
        # held exactly base + its records; past damage, each record takes at least MIN_RECORD_BYTES
        # of content (the zero padding ahead of a journal's end holds none: counting it took a
        # revision thousands above the last commit).
        read_cleanly = {item.name: item.base + item.applied for chain in candidates for item in chain.files if item.problem != "damaged"}
        for base, name in self.journals.items():
            if name in read_cleanly:
                floor = max(floor, read_cleanly[name])
                continue
            item = read_journal(self.files, self.task_id, name, base)
            if item is None:
                continue
            found = item.found
            held = base + len(found.bodies)
            if item.problem == "damaged" and not proven:
                held += max(found.content_end - item.problem_at, 0) // journal.MIN_RECORD_BYTES + 1
            floor = max(floor, held)
        return floor

    def _refuse_lost_records(self, best: Chain, proven: int) -> None:
        """Stop ``StateUnrecoverableError`` if the rebuilt state lacks a revision that may have been
        committed and its task records what no target can show again (``stores.base`` invariant 7):
        the lost revisions may hold a call's or a person's answer, so a run on it could change one."""
        state = best.state
        assert state is not None
        if state.observable_again:
            return
        committed, evidence = proven, "the task's journal"
        if self.witness is not None:
            witness = self.witness()
            if witness.revision > committed:
                committed, evidence = witness.revision, witness.source
        if committed <= best.end:
            return  # the rebuilt chain reaches every revision known: nothing was lost
        self._set_blobs_aside()
        raise StateUnrecoverableError(lost_records_message(self.task_id, best.end, committed, evidence, self.moved))

    def _set_blobs_aside(self) -> None:
        """Name every blob that failed its digest and, when repairing, move it to quarantine (never
        deleted): a later write of the same content then makes a fresh file, not one kept damaged."""
        for digest, why in self.blobs.damaged.items():
            self.note(f"blob {digest} is damaged: {why}")
            if self.repair and self.files.lstat(self.task_id, os.path.join(BLOBS, digest)) is not None:
                self.moved.append(self.files.quarantine_blob(self.task_id, digest))
                self.note(f"blob {digest} quarantined to {self.moved[-1]}")
        self.blobs.damaged.clear()

    def _recovered(self, best: Chain, candidates: list[Chain], floor: int) -> LoadResult:
        task_id, files = self.task_id, self.files
        state = best.state
        assert state is not None
        state.reconcile_all = True
        primary = self.primary
        primary_damaged = self.primary_error is not None or self.rolled_back
        backup_damaged = self.backup_error is not None
        self._set_blobs_aside()
        what = f"{best.snapshot.name} revision {best.snapshot.raw.revision}"
        if best.records:
            what += f" and {best.records} journal records (revision {best.end})"
        self.note(f"recovered from {what}; every unverified step will be observed first")
        log.warning("task %s: state recovered from %s; every unverified step will be observed first", task_id, what)
        digest = best.digest()
        if not self.repair:
            return LoadResult(state, "backup", digest, tuple(self.notes), tuple(self.moved), revision_floor=floor)
        # Make the recovery durable before moving anything the next load could need, in this order:
        # damaged snapshots aside (so the new snapshot does not link one as its backup), a new
        # journal, damaged and unreachable journals aside, then the recovered state as a snapshot
        # at a revision no commit can have used.
        state.revision = floor + 1
        self.writers.blobs_read(task_id, self.blobs.seen)
        introduced: list[BlobRef] = []
        lines = journal.encode_snapshot(state, self.writers.codec(task_id), introduced)
        if primary_damaged and files.lstat(task_id, STATE) is not None:
            self.set_aside(STATE, "rolled-back" if primary is not None else "damaged", "is set aside")
        if backup_damaged and files.lstat(task_id, BACKUP) is not None:
            self.set_aside(BACKUP, "damaged", "is set aside")
        directory = files.task_dir(task_id)
        new_journal = journal_name(state.revision)
        write_atomic(files.io, directory, new_journal, journal.encode_journal_meta(task_id, state.revision))
        reached = {item.name for chain in candidates for item in chain.files if item.problem != "damaged"}
        for base, name in sorted(self.journals.items()):
            if name == new_journal or name in reached or files.lstat(task_id, name) is None:
                continue
            item = read_journal(files, task_id, name, base)
            if item is None:
                continue
            if item.problem == "damaged":
                self.set_aside(name, "damaged", f"is damaged at byte {item.problem_at}")
            elif item.found.bodies and base > best.snapshot.raw.revision:
                self.set_aside(name, "unreachable", "holds records the chain does not reach")
        keep_primary = primary is not None and not primary_damaged
        self.writers.store_blobs(task_id, introduced)  # read and checked by this load: normally nothing to write
        write_atomic(files.io, directory, STATE, lines, backup=BACKUP if keep_primary else None)
        has_backup = keep_primary or (self.backup_revision is not None and not backup_damaged)
        self.writers.follow_new_generation(task_id, state, lines, has_backup=has_backup)
        return LoadResult(state, "backup", digest, tuple(self.notes), tuple(self.moved), revision_floor=state.revision)

    def _cut_torn_tail(self, item: JournalFile) -> None:
        task_id, io = self.task_id, self.files.io
        if item.end == 0:  # not even its first line: write it again
            meta = journal.encode_journal_meta(task_id, item.base)
            write_atomic(io, self.files.task_dir(task_id), item.name, meta)
            item.found.offsets = [len(meta)]
            item.found.size = len(meta)
            return
        fd = io.open(os.path.join(self.files.task_dir(task_id), item.name), os.O_WRONLY)
        try:
            io.truncate(fd, item.end)
            io.fdatasync(fd)
        finally:
            io.close(fd)
        item.found.size = item.end


def _describe_problem(chain: Chain) -> str:
    name = chain.snapshot.name
    if chain.problem == "missing":
        return f"the journal of {name} (revision {chain.snapshot.raw.revision}) is missing"
    if chain.state is None:
        return f"the records after {name} do not build a valid state: {chain.error}"
    damaged = next((item for item in chain.files if item.problem == "damaged"), None)
    if damaged is not None:
        return f"{damaged.name} is damaged at byte {damaged.problem_at} (after revision {chain.end})"
    return f"a journal the chain from {name} does not reach holds records"
