"""Reading a task's state files: snapshots, journals, and the chains they form. Nothing here writes.

A chain is a snapshot at revision R, then ``journal.R.log`` up to some revision E, then
``journal.E.log`` and so on (the package docstring, invariant 2). ``walk`` follows one and stops at
the first problem; what to make of the problem is ``_recovery``'s business. ``history`` reads the
recent timeline the journals still hold.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import stat

from ...envelope import FORMAT as LEGACY_FORMAT
from ...envelope import RunState
from ...envelope import decode as decode_legacy
from ...errors import CorruptStateError, ForeignStateError, SchemaVersionError
from .. import _journal as journal
from ..blobs import BlobRef, decode_blob
from .._fileio import read_file, read_prefix
from . import _layout as layout
from ._layout import BACKUP, BLOBS, STATE, TaskFiles

__all__ = [
    "BlobReader", "Chain", "JournalFile", "Snapshot", "backup_revision", "epoch_floor", "history", "read_journal", "read_snapshot",
    "stray_journals", "walk",
]  # fmt: skip


@dataclasses.dataclass
class Snapshot:
    """A snapshot file that validated."""

    name: str
    raw: journal.RawSnapshot
    size: int
    legacy: bool = False
    """A ``longrun.state`` envelope written before the journal existed: it has no journal."""


@dataclasses.dataclass
class JournalFile:
    """A journal file as read: its checksum-valid lines, and how many of them the chain applied."""

    name: str
    base: int
    found: journal.Scan
    applied: int = 0
    """Records applied to the chain (fewer than ``found.bodies`` if a record broke the chain's rules)."""
    problem: str | None = None
    """None, "torn" or "damaged"; see ``_journal.scan``."""
    problem_at: int = 0

    @property
    def end(self) -> int:
        """Byte offset just past the last record applied (the meta line counts)."""
        return self.found.offsets[self.applied] if self.found.offsets else 0


@dataclasses.dataclass
class Chain:
    """The state a snapshot and the journals after it add up to."""

    snapshot: Snapshot
    replay: journal.Replay
    files: list[JournalFile]
    problem: str | None = None
    """None, "torn" (the last line was cut short: fine), "damaged" or "missing" (its journal is gone)."""
    state: RunState | None = None
    error: CorruptStateError | None = None
    """Why the records did not build a valid state, if they did not."""

    @property
    def end(self) -> int:
        return self.replay.revision

    @property
    def records(self) -> int:
        return sum(item.applied for item in self.files)

    def digest(self) -> str:
        digest = hashlib.sha256(self.snapshot.raw.meta)
        digest.update(b"".join(self.snapshot.raw.line_checksums))
        for item in self.files:
            digest.update(b"".join(item.found.checksums[: item.applied]))
        return "sha256:" + digest.hexdigest()


class BlobReader:
    """Resolves the blob references of one load (a ``journal.BlobFetch``): each blob read and
    checked once, however many rows and chains name it; ``seen`` lists what it read, for the writer."""

    def __init__(self, files: TaskFiles, task_id: str):
        self.files = files
        self.task_id = task_id
        self.values: dict[str, object] = {}
        self.seen: list[tuple[object, BlobRef]] = []
        self.damaged: dict[str, str] = {}
        """The blob files (by digest) that exist but fail their reference: why each failed."""
        self._checked = False

    def __call__(self, ref: BlobRef, what: str) -> object:
        value = self.values.get(ref.sha256)
        if value is not None:
            return value
        if not self._checked:
            info = self.files.lstat(self.task_id, BLOBS)
            if info is not None and not stat.S_ISDIR(info.st_mode):  # never read through a planted link
                raise CorruptStateError(f"{BLOBS} in task {self.task_id!r} is not a plain directory")
            self._checked = True
        try:
            data = self.files.read_blob(self.task_id, ref.sha256)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EFBIG, errno.ELOOP):
                raise
            raise CorruptStateError(f"{what}: blob {ref.sha256} cannot be read: {exc}") from None
        try:
            value = decode_blob(ref, data, what)
        except CorruptStateError as exc:
            if data is not None:  # there, but not the bytes its digest names: damage to set aside
                self.damaged[ref.sha256] = str(exc)
            raise
        self.values[ref.sha256] = value
        self.seen.append((value, ref))
        return value


def read_snapshot(files: TaskFiles, task_id: str, name: str) -> tuple[Snapshot | None, CorruptStateError | None]:
    """A validated snapshot, or the error that says why it is damaged; (None, None) if absent.

    Foreign and newer-schema files are raised, not returned: they are well-formed but not ours
    to repair, so nothing is moved."""
    data = read_file(files.io, os.path.join(files.task_dir(task_id), name), layout.MAX_STATE_BYTES)
    if data is None:
        return None, None
    try:
        if data.startswith(b'{"checksum":') and b'"format":"%s"' % LEGACY_FORMAT.encode() in data[:200]:
            return _legacy(name, data, task_id), None
        return Snapshot(name, journal.decode_snapshot(data, task_id=task_id), len(data)), None
    except (ForeignStateError, SchemaVersionError):
        raise
    except CorruptStateError as exc:
        return None, exc


def _legacy(name: str, data: bytes, task_id: str) -> Snapshot:
    state = decode_legacy(data, expected_task=task_id)
    lines = journal.encode_snapshot(state)
    return Snapshot(name, journal.decode_snapshot(b"".join(lines), task_id=task_id), len(data), legacy=True)


def backup_revision(files: TaskFiles, task_id: str) -> tuple[int | None, CorruptStateError | None]:
    """The revision ``state.json.bak`` names, from its first line only (validated)."""
    head = read_prefix(files.io, os.path.join(files.task_dir(task_id), BACKUP), 64 * 1024)
    if head is None:
        return None, None
    try:
        first, newline, _ = head.partition(b"\n")
        if first.startswith(b'{"checksum":') and LEGACY_FORMAT.encode() in first[:200]:
            snapshot, error = read_snapshot(files, task_id, BACKUP)
            return (snapshot.raw.revision, None) if snapshot is not None else (None, error)
        if not newline:
            raise CorruptStateError(f"{BACKUP} has no complete first line")
        return journal.snapshot_revision(first, task_id=task_id), None
    except (ForeignStateError, SchemaVersionError):
        raise
    except CorruptStateError as exc:
        return None, exc


def read_journal(files: TaskFiles, task_id: str, name: str, base: int) -> JournalFile | None:
    """The journal ``name`` as read, with its problem if any; None if it does not exist."""
    data = read_file(files.io, os.path.join(files.task_dir(task_id), name), layout.MAX_JOURNAL_BYTES)
    if data is None:
        return None
    found = journal.scan(data, padded=True)
    item = JournalFile(name, base, found, problem=found.problem, problem_at=found.problem_at)
    if found.meta is None:
        item.problem, item.problem_at = "torn", 0  # its first line never completed: no records
        found.bodies, found.checksums, found.offsets = [], [], []
        return item
    try:
        named = journal.journal_base(found.meta, task_id=task_id)
    except (ForeignStateError, SchemaVersionError):
        raise
    except CorruptStateError:
        named = -1
    if named != base:
        item.problem, item.problem_at = "damaged", 0
        found.bodies, found.checksums, found.offsets = [], [], []
    return item


def walk(files: TaskFiles, task_id: str, snapshot: Snapshot, journals: dict[int, str], blobs: BlobReader | None = None) -> Chain:
    """Follow the chain from a snapshot through its journals, stopping at the first problem; blob
    references are resolved (and checked) by ``blobs``: a missing or damaged one is damage."""
    chain = Chain(snapshot, journal.Replay(snapshot.raw), [])
    seen: set[str] = set()
    while True:
        name = journals.get(chain.end)
        if name is None or name in seen:
            if not chain.files and not snapshot.legacy:
                chain.problem = "missing"
            break
        seen.add(name)
        item = read_journal(files, task_id, name, chain.end)
        if item is None:
            chain.problem = "missing" if not chain.files else chain.problem
            break
        chain.files.append(item)
        item.applied, error = chain.replay.apply_all(item.found.bodies)
        if error is not None:
            item.problem, item.problem_at = "damaged", item.found.offsets[item.applied]
        if item.problem is not None:
            chain.problem = item.problem
            break
    try:
        chain.state = chain.replay.build(blobs if blobs is not None else BlobReader(files, task_id))
    except CorruptStateError as exc:
        chain.error = exc
    return chain


def holds_records(item: JournalFile) -> bool:
    """Whether a journal holds something a chain could have needed: records, or damage."""
    return bool(item.found.bodies) or item.problem == "damaged"


def stray_journals(files: TaskFiles, task_id: str, journals: dict[int, str], chain: Chain) -> tuple[list[str], list[str]]:
    """Journals above the chain's start that it did not reach: (with records, without any)."""
    visited = {item.name for item in chain.files}
    loaded: list[str] = []
    empty: list[str] = []
    for base, name in sorted(journals.items()):
        if base <= chain.snapshot.raw.revision or name in visited:
            continue
        item = read_journal(files, task_id, name, base)
        if item is None:
            continue
        (loaded if holds_records(item) else empty).append(name)
    return loaded, empty


def epoch_floor(files: TaskFiles, task_id: str) -> int:
    """The highest epoch any stored revision names, read line by line without repairing: both
    snapshots (their header and effect rows) and every journal, in the task directory and in
    its quarantine, counting each line whose checksum holds even in a damaged file."""
    directory = files.task_dir(task_id)
    floor = 0
    for name in (STATE, BACKUP):
        snapshot, _ = read_snapshot(files, task_id, name)
        if snapshot is not None:
            epoch = snapshot.raw.header.get("lease_epoch")
            floor = max(floor, epoch if type(epoch) is int else 0)
    for name in files.state_files(task_id):
        data = read_file(files.io, os.path.join(directory, name), layout.MAX_STATE_BYTES)
        if data is not None:
            floor = max(floor, journal.highest_epoch(data))
    return floor


def history(files: TaskFiles, task_id: str) -> list[dict[str, object]]:
    """The commits the journals still hold, oldest first (see ``JsonFileStore.history``); the
    caller holds the task's lock."""
    entries: dict[int, dict[str, object]] = {}
    for base, name in sorted(files.journals(task_id).items()):
        found = read_journal(files, task_id, name, base)
        if found is None:
            continue
        for body in found.found.bodies:
            try:
                entry = journal.describe_record(body)
            except CorruptStateError:
                break
            entries[entry["revision"]] = entry
    timeline = [entries[revision] for revision in sorted(entries)]
    last_at = None
    for entry in timeline:  # a commit names updated_at only when it changed: carry it forward
        if entry["at"] is None:
            entry["at"] = last_at
        last_at = entry["at"]
    return timeline
