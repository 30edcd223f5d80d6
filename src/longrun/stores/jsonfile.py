"""The local JSON-file store: one directory per task, for one machine; one fsync per commit.

Layout under ``root`` (directories 0700, files 0600)::

    <task id>/
        state.json          the snapshot: the whole state at one revision (format in ``_journal``)
        journal.<R>.log     the journal: one line per commit after revision R, then zero padding
        state.json.bak      the previous snapshot, a hard link made by each compaction
        journal.<B>.log     the previous snapshot's journal (B = its revision), kept beside it
        lease.json          owner, epoch, expiry, the holder's token, the revision last known committed
                            (the state's witness, ``stores.base`` invariant 7); never deleted, so epochs
                            never restart (a damaged one is moved to quarantine by ``repair_lease``)
        lease.lock          held with flock(2) by the lease's holder for the lease's life, so a
                            contender can tell a dead holder from a paused one (``_holders``)
        lock                flock(2) target: every read-modify-write of the task runs under it
        control/cancel.json
        control/approvals/<approval id>.json
        quarantine/         damaged files, moved aside with a timestamp, never deleted

A commit writes one line naming only what changed (the header fields that differ, the effect
records the caller names in ``changed``) into the journal, then calls ``fdatasync``: O(1) bytes and
one durable write, whatever the size of the ledger. The journal is zero-filled ahead of its end, so
the line overwrites blocks that are already allocated and written: ``fdatasync`` then flushes data
only, not the inode (an append would change the file size, which costs a metadata flush); the
padding is extended, by the journal's own size up to 1 MiB, in one write with the line that needs
it. The journal's name was made durable (directory fsync) when it was created, so no commit needs a
directory fsync. When the journal outgrows half the snapshot (and ``COMPACT_MIN_BYTES``), the
commit is followed by a compaction: a new journal is created, then the state is written as a new
snapshot with ``write_atomic`` (which hard-links the old one to ``state.json.bak``), then journals
older than the backup's are deleted. A compaction costs O(n) after O(n) bytes of commits, so a
commit costs amortized O(1), and a load reads at most a snapshot and half its size in journal.

Invariants (``tests/test_store_jsonfile.py`` and ``tests/test_journal.py`` are built to break them):

1. A commit is durable when it returns: its line is written and ``fdatasync`` returned. It is
   made under the task's exclusive flock after the fencing check, so a stale epoch never lands.
   A failed write puts the padding back (where it can), and the task is poisoned until reloaded.
2. A chain is a snapshot at revision R followed by ``journal.R.log``, whose records end at some
   revision E, followed by ``journal.E.log`` if that exists, and so on. Every file a chain needs is
   durable before anything names it: a snapshot's journal is created before the snapshot is
   published. So a snapshot without its journal means files were lost, not a crash.
3. Load follows the chain from ``state.json``. A torn last line (incomplete: its write was cut
   short, so its fdatasync never returned and the commit was never acknowledged) is dropped, and
   cut off the journal by a repairing load. Anything else that fails validation is damage.
4. On damage (a snapshot or a journal line that fails its checksum or its rules, a snapshot not
   newer than its backup, a journal with records the chain cannot reach) the state is rebuilt from
   the longest valid chain, from ``state.json`` or from ``state.json.bak``, with ``reconcile_all``
   set, so every unverified step is observed before it is applied. A repairing load makes that
   durable: damaged snapshots aside, a new journal, damaged journals aside, then the recovered
   state as a new snapshot at a revision above every revision that may have been committed (a
   damaged journal counts as holding as many as its size allows). If nothing validates it raises
   ``StateUnrecoverableError``, and keeps raising it: never a silent fresh start.
5. A store object remembers what it last wrote (the shadow of the journal) and checks, under the
   lock, that the snapshot is still the one it wrote and that the journal's padding at its end is
   untouched; if another writer changed either, it refuses to commit until the task is loaded again.
6. Every state committed has a snapshot of at most ``MAX_STATE_BYTES``, the most a load reads. A
   snapshot is measured when it is encoded, before any I/O (``SizeLimitError`` if it is over); a
   journal line is appended only while the snapshot's size plus the journal's (an upper bound on
   the next snapshot: each line carries every value it changes) stays within the limit, and
   otherwise the commit writes a snapshot instead, so a compaction never meets a state too large.
   A journal's zero padding stops at ``MAX_JOURNAL_BYTES``: a load reads no larger file.

Reading is hardened against planted and damaged files: every file is opened ``O_NOFOLLOW`` (and
``O_NONBLOCK``, so a FIFO cannot hang a reader) and must be a regular file within its limit
(``MAX_STATE_BYTES`` for snapshots and journals, ``MAX_RECORD_BYTES`` for the lease and control
records, ``MAX_APPROVAL_FILES``); the task directory, ``control``, ``control/approvals`` and
``quarantine`` must be plain directories (``lstat``), so nothing is read from, written to or
quarantined into a place outside the task directory; names read from listings are used only
if they match ``journal.<R>.log`` or end in ``.json``. JSON is parsed by
``canonical.parse_json``. A read-only load changes no byte and no name; only a repairing load
(with the lease) moves damaged files into ``quarantine``. The directory checks are ``lstat``
calls before use: someone who can swap a directory in between can edit the state anyway.

The store root must be a directory, or a symbolic link to a directory owned by this user through a
link owned by this user or root; it is created only with ``create=True``. Inside it, links are
refused as above.

Threads. A store object may be shared by threads. Each task has a gate in the store object (a lock
and a count of the threads that hold or wait for it): a transaction holds its task's gate, then
the flock, so the object's threads take turns per task while other processes are held off by the
flock. The writer, the journal descriptor and the caches of a task are touched only in its turn,
except that the descriptor cache (``MAX_OPEN_JOURNALS``) closes a descriptor only when its task's
count is zero; so a descriptor is never closed, and its number never reused, under a commit.

``changed``: a caller names the step ids whose effect records it replaced since its last commit
(the Runner does). Added and removed records are found even if not named; ``changed=None`` (the
default) means "not known" and makes the store compare every record (correct, O(n)).

Not guaranteed: exclusion across machines (flock on a network file system is not trustworthy; use
a database store), protection from a user who edits the files with the right permissions, or
durability where ``fsync``/``fdatasync`` is ignored. A journal cut exactly at a line boundary, or
damage that looks exactly like a torn last line, loses the commits past the cut, as in any
write-ahead log, unless ``lease.json`` witnessed one of them (then the load refuses, see
``stores.base``). The backup generation is validated when it is needed, not on every load.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import logging
import os
import re
import stat
import threading
import time
from typing import Callable, Collection

from ..approval import Approval
from ..cancellation import Cancellation
from ..canonical import JSONValue, canonical_bytes, parse_json, sha256_hex
from ..contract import check_task_id
from ..control import ControlRecord
from ..envelope import FORMAT as LEGACY_FORMAT
from ..envelope import MAX_STATE_BYTES, RunState
from ..envelope import decode as decode_legacy
from ..errors import (
    CorruptStateError,
    ForeignStateError,
    InvalidInputError,
    LongrunError,
    SchemaVersionError,
    SizeLimitError,
    StateUnrecoverableError,
    StorageError,
    UnknownTaskError,
)
from ..lease import Lease
from ..outcome import Evidence
from ..protocols import LoadResult
from . import _journal as journal
from ._fileio import TEMP_MARK, FileIO, ensure_dir, ensure_dirs, read_file, read_prefix, read_small, write_all_at, write_atomic
from ._holders import HolderLocks
from .base import BaseStore

__all__ = ["JsonFileStore"]

log = logging.getLogger("longrun")

STATE = "state.json"
BACKUP = "state.json.bak"
LEASE = "lease.json"
HOLDER_LOCK = "lease.lock"
LOCK = "lock"
CONTROL = "control"
APPROVALS = "approvals"
CANCEL = "cancel.json"
QUARANTINE = "quarantine"
MAX_RECORD_BYTES = 64 * 1024
MAX_APPROVAL_FILES = 1000
MAX_JOURNAL_BYTES = MAX_STATE_BYTES
COMPACT_MIN_BYTES = 1 << 20
"""A journal shorter than this is never compacted: below it, replaying costs less than a snapshot."""
COMPACT_RATIO = 0.5
"""Compact when the journal holds more than this many bytes per byte of snapshot."""
MAX_OPEN_JOURNALS = 64
"""Journal descriptors a store keeps open (least recently committed closed first). A descriptor of
a task that a thread of the store is using is never closed for this bound (see ``_Gate``)."""
PREALLOCATE_MIN = 64 * 1024
PREALLOCATE_MAX = 1 << 20
"""A journal is zero-filled ahead of its end by its own size, between these bounds. Writing into
blocks that are already allocated and written lets ``fdatasync`` skip the metadata flush that an
append needs (the file size), which is most of its cost; the padding costs that once per extension."""

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_JOURNAL_NAME = re.compile(r"journal\.(0|[1-9][0-9]{0,17})\.log")


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


def journal_name(base: int) -> str:
    return f"journal.{base}.log"


@dataclasses.dataclass
class _Snapshot:
    """A snapshot file that validated."""

    name: str
    raw: journal.RawSnapshot
    size: int
    legacy: bool = False
    """A ``longrun.state`` envelope written before the journal existed: it has no journal."""


@dataclasses.dataclass
class _JournalFile:
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
class _Chain:
    """The state a snapshot and the journals after it add up to."""

    snapshot: _Snapshot
    replay: journal.Replay
    files: list[_JournalFile]
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


@dataclasses.dataclass
class _Writer:
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

    def wants_compaction(self) -> bool:
        due = not self.has_backup or self.journal_end > max(COMPACT_MIN_BYTES, COMPACT_RATIO * self.snapshot_bytes)
        return due and self.journal_end >= self.retry_compaction_at


class _Gate:
    """A task's turn inside one store object: one thread at a time, and a count of the threads that
    hold or wait for it. The count is what makes a journal descriptor safe to close: the store
    closes a task's descriptor only while no thread holds or waits for that task's gate."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class _Transaction:
    """The task's gate and flock held for one read-modify-write (a class, not a generator: it runs
    on every commit). The gate orders this store object's threads, the flock other processes and
    other store objects. OS errors inside become ``StorageError``; closing the descriptor unlocks."""

    __slots__ = ("store", "task_id", "create", "write", "fd", "gate")

    def __init__(self, store: "JsonFileStore", task_id: str, *, create: bool, write: bool):
        self.store, self.task_id, self.create, self.write, self.fd = store, task_id, create, write, -1
        self.gate: _Gate | None = None

    def __enter__(self) -> None:
        self.gate = self.store._enter_gate(self.task_id)
        try:
            self.fd = self.store._open_lock(self.task_id, create=self.create, write=self.write)
            if self.fd >= 0:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX if self.write else fcntl.LOCK_SH)
                except BaseException as exc:
                    os.close(self.fd)
                    if isinstance(exc, OSError) and not isinstance(exc, LongrunError):
                        raise StorageError(f"task {self.task_id!r}: cannot lock: {exc}") from exc
                    raise
        except BaseException:
            self.store._leave_gate(self.task_id, self.gate)
            raise

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        try:
            if self.fd >= 0:
                os.close(self.fd)  # closing the descriptor releases the flock
        finally:
            assert self.gate is not None
            self.store._leave_gate(self.task_id, self.gate)
        if isinstance(exc, OSError) and not isinstance(exc, LongrunError):
            raise StorageError(f"task {self.task_id!r}: {exc}") from exc


class JsonFileStore(BaseStore):
    """The store in a directory of task directories (see the module docstring for the layout).

    ``root`` must exist, unless ``create=True``: then it is made (with any missing parents,
    owner-only) when a lease is first taken. Without it, taking a lease in a missing root raises
    ``InvalidInputError`` and creates nothing, so a path that names the wrong place (a typo, a
    volume that is not mounted) cannot start every task afresh in a new, empty store. Reading a
    missing root finds no task (``UnknownTaskError``, an empty ``list_tasks``). Opening the store
    touches nothing. ``root`` may be a symbolic link to a plain directory owned by this user (the
    link itself owned by this user or root); links inside the store are refused.

    One store object may be shared by threads (the Runner renews its lease from a thread of its
    own; a pool may run many tasks through one store). Its threads take turns per task, inside the
    flock that orders processes, and a journal descriptor is closed only when no thread holds or
    waits for its task. Different tasks proceed in parallel.
    """

    def __init__(self, root: str | os.PathLike[str], *, io: FileIO | None = None, create: bool = False):
        super().__init__()
        self.root = os.path.abspath(os.fspath(root))
        self.io = io if io is not None else FileIO()
        self.create = bool(create)
        self._writers: dict[str, _Writer] = {}
        self._mutex = threading.Lock()
        """Guards ``_gates`` and ``_open_journals`` (and a writer's ``fd`` while it is evicted)."""
        self._gates: dict[str, _Gate] = {}
        """The tasks a thread of this store object holds or waits for; a gate goes when its count is 0."""
        self._open_journals: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._leases: dict[str, tuple[bytes, Lease]] = {}
        self._dirs: dict[str, str] = {}
        self._holders = HolderLocks(lambda task_id: os.path.join(self.task_dir(task_id), HOLDER_LOCK))

    def __repr__(self) -> str:
        return f"JsonFileStore({self.root!r})"

    def close(self) -> None:
        """Close the journal descriptors this store keeps open. The store stays usable.

        Safe while other threads use the store: a task's descriptor is closed in that task's turn,
        so this waits for a commit in flight on it to end."""
        with self._mutex:
            open_now = list(self._open_journals)
        for task_id in open_now:
            gate = self._enter_gate(task_id)
            try:
                self._close_journal(task_id)
            finally:
                self._leave_gate(task_id, gate)

    def __enter__(self) -> "JsonFileStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- paths --------------------------------------------------------------------------------

    def task_dir(self, task_id: str) -> str:
        directory = self._dirs.get(task_id)
        if directory is None:
            # Validated once per task id; the hot path (every commit) then costs a lookup.
            directory = os.path.join(self.root, check_task_id(task_id))
            if len(self._dirs) < 10_000:
                self._dirs[task_id] = directory
        return directory

    def _exists(self, task_id: str) -> bool:
        try:
            info = os.lstat(self.task_dir(task_id))
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise StorageError(f"{self.task_dir(task_id)} is not a plain directory (symlinks are refused)")
        return True

    def _unknown(self, task_id: str) -> UnknownTaskError:
        where = "" if os.path.isdir(self.root) else f" (the store root {self.root} does not exist)"
        return UnknownTaskError(f"no task {task_id!r} in {self.root}{where}")

    # -- transaction: flock on the task's lock file -------------------------------------------

    def _transaction(self, task_id: str, *, create: bool, write: bool = True) -> "_Transaction":
        return _Transaction(self, task_id, create=create, write=write)

    def _enter_gate(self, task_id: str) -> _Gate:
        """Wait for the task's turn among this store object's threads (see ``_Gate``)."""
        with self._mutex:
            gate = self._gates.get(task_id)
            if gate is None:
                gate = self._gates[task_id] = _Gate()
            gate.users += 1  # counted before waiting: from here on its descriptor stays open
        try:
            gate.lock.acquire()
        except BaseException:
            self._uncount(task_id, gate)
            raise
        return gate

    def _leave_gate(self, task_id: str, gate: _Gate) -> None:
        gate.lock.release()
        self._uncount(task_id, gate)

    def _uncount(self, task_id: str, gate: _Gate) -> None:
        with self._mutex:
            gate.users -= 1
            if gate.users == 0:
                del self._gates[task_id]

    def _open_lock(self, task_id: str, *, create: bool, write: bool) -> int:
        """Open (and make, with ``create``) the task's lock file; -1 for a reader of a task whose
        lock file is gone."""
        directory = self.task_dir(task_id)
        try:
            if create:
                self._ensure_root()
                ensure_dir(self.io, directory)
                ensure_dir(self.io, os.path.join(directory, CONTROL))
                ensure_dir(self.io, os.path.join(directory, CONTROL, APPROVALS))
                ensure_dir(self.io, os.path.join(directory, QUARANTINE))
            elif not self._exists(task_id):
                raise self._unknown(task_id)
            lock_path = directory + os.sep + LOCK
            try:
                # Readers take a shared lock through a read-only descriptor, so an operator's
                # `status` works on a store it cannot write and never creates files.
                # O_NONBLOCK: a FIFO planted as the lock file must not hang a reader.
                return self.io.open(lock_path, os.O_RDWR | os.O_CREAT if write else os.O_RDONLY | _NONBLOCK, 0o600)
            except FileNotFoundError:
                return -1  # a reader of a task whose lock file is gone: there is no writer to exclude
        except LongrunError:
            raise
        except OSError as exc:
            raise StorageError(f"cannot open task {task_id!r} in {self.root}: {exc}") from exc

    def _missing_root(self) -> InvalidInputError:
        return InvalidInputError(
            f"store root {self.root} does not exist; create it, or open the store with create=True"
        )

    def _ensure_root(self) -> None:
        """Check the root before a task is created in it; make it if missing and ``create``.

        A plain directory is used as it is. A symbolic link is followed only to a directory owned
        by this user, through a link owned by this user or root: anyone else could point it at a
        directory of their choosing. Everything else is refused (``StorageError``)."""
        try:
            info = os.lstat(self.root)
        except FileNotFoundError:
            if not self.create:
                raise self._missing_root() from None
            ensure_dirs(self.io, self.root)  # owner-only, each made durable in its parent
            return
        if stat.S_ISDIR(info.st_mode):
            return
        if stat.S_ISLNK(info.st_mode):
            try:
                target = os.stat(self.root)
            except FileNotFoundError:
                raise StorageError(f"store root {self.root} is a symbolic link to nothing") from None
            user = os.geteuid()
            if stat.S_ISDIR(target.st_mode) and target.st_uid == user and info.st_uid in (user, 0):
                return
            raise StorageError(
                f"store root {self.root} is a symbolic link, accepted only to a directory owned by this user "
                f"(uid {user}) through a link owned by this user or root"
            )
        raise StorageError(f"store root {self.root} exists and is not a directory")

    # -- lease --------------------------------------------------------------------------------

    def _get_lease(self, task_id: str) -> Lease | None:
        data = read_small(self.io, self.task_dir(task_id) + os.sep + LEASE, MAX_RECORD_BYTES)
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

    def _put_lease(self, lease: Lease) -> None:
        body = lease.to_json()
        data = canonical_bytes({**body, "checksum": "sha256:" + sha256_hex(canonical_bytes(body))})
        write_atomic(self.io, self.task_dir(lease.task_id), LEASE, data)
        self._leases[lease.task_id] = (data, lease)

    def _epoch_floor(self, task_id: str) -> int:
        """The highest epoch any stored revision names, read line by line without repairing: both
        snapshots (their header and effect rows) and every journal, in the task directory and in
        its quarantine, counting each line whose checksum holds even in a damaged file."""
        directory = self.task_dir(task_id)
        floor = 0
        for name in (STATE, BACKUP):
            snapshot, _ = self._read_snapshot(task_id, name)
            if snapshot is not None:
                epoch = snapshot.raw.header.get("lease_epoch")
                floor = max(floor, epoch if type(epoch) is int else 0)
        names = [name for name in self.io.listdir(directory) if name.startswith((STATE, "journal."))]
        try:
            quarantined = self.io.listdir(os.path.join(directory, QUARANTINE))
        except FileNotFoundError:
            quarantined = []
        names += [os.path.join(QUARANTINE, name) for name in quarantined if name.startswith((STATE, "journal."))]
        for name in names:
            if TEMP_MARK in name:
                continue
            data = read_file(self.io, os.path.join(directory, name), MAX_STATE_BYTES)
            if data is not None:
                floor = max(floor, journal.highest_epoch(data))
        return floor

    def _set_lease_aside(self, task_id: str, reason: str) -> str:
        self._leases.pop(task_id, None)
        return self._quarantine(task_id, LEASE, reason)

    # -- reading ------------------------------------------------------------------------------

    def _journals(self, task_id: str) -> dict[int, str]:
        journals = {}
        for name in self.io.listdir(self.task_dir(task_id)):
            match = _JOURNAL_NAME.fullmatch(name)
            if match:
                journals[int(match.group(1))] = name
        return journals

    def _read_snapshot(self, task_id: str, name: str) -> tuple[_Snapshot | None, CorruptStateError | None]:
        """A validated snapshot, or the error that says why it is damaged; (None, None) if absent.

        Foreign and newer-schema files are raised, not returned: they are well-formed but not ours
        to repair, so nothing is moved."""
        data = read_file(self.io, os.path.join(self.task_dir(task_id), name), MAX_STATE_BYTES)
        if data is None:
            return None, None
        try:
            if data.startswith(b'{"checksum":') and b'"format":"%s"' % LEGACY_FORMAT.encode() in data[:200]:
                return self._legacy(name, data, task_id), None
            return _Snapshot(name, journal.decode_snapshot(data, task_id=task_id), len(data)), None
        except (ForeignStateError, SchemaVersionError):
            raise
        except CorruptStateError as exc:
            return None, exc

    @staticmethod
    def _legacy(name: str, data: bytes, task_id: str) -> _Snapshot:
        state = decode_legacy(data, expected_task=task_id)
        lines = journal.encode_snapshot(state)
        return _Snapshot(name, journal.decode_snapshot(b"".join(lines), task_id=task_id), len(data), legacy=True)

    def _backup_revision(self, task_id: str) -> tuple[int | None, CorruptStateError | None]:
        """The revision ``state.json.bak`` names, from its first line only (validated)."""
        head = read_prefix(self.io, os.path.join(self.task_dir(task_id), BACKUP), 64 * 1024)
        if head is None:
            return None, None
        try:
            first, newline, _ = head.partition(b"\n")
            if first.startswith(b'{"checksum":') and LEGACY_FORMAT.encode() in first[:200]:
                snapshot, error = self._read_snapshot(task_id, BACKUP)
                return (snapshot.raw.revision, None) if snapshot is not None else (None, error)
            if not newline:
                raise CorruptStateError(f"{BACKUP} has no complete first line")
            return journal.snapshot_revision(first, task_id=task_id), None
        except (ForeignStateError, SchemaVersionError):
            raise
        except CorruptStateError as exc:
            return None, exc

    def _read_journal(self, task_id: str, name: str, base: int) -> _JournalFile | None:
        data = read_file(self.io, os.path.join(self.task_dir(task_id), name), MAX_JOURNAL_BYTES)
        if data is None:
            return None
        found = journal.scan(data, padded=True)
        item = _JournalFile(name, base, found, problem=found.problem, problem_at=found.problem_at)
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

    def _walk(self, task_id: str, snapshot: _Snapshot, journals: dict[int, str]) -> _Chain:
        """Follow the chain from a snapshot through its journals, stopping at the first problem."""
        chain = _Chain(snapshot, journal.Replay(snapshot.raw), [])
        seen: set[str] = set()
        while True:
            name = journals.get(chain.end)
            if name is None or name in seen:
                if not chain.files and not snapshot.legacy:
                    chain.problem = "missing"
                break
            seen.add(name)
            item = self._read_journal(task_id, name, chain.end)
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
            chain.state = chain.replay.build()
        except CorruptStateError as exc:
            chain.error = exc
        return chain

    def _stray_journals(self, task_id: str, journals: dict[int, str], chain: _Chain) -> tuple[list[str], list[str]]:
        """Journals above the chain's start that it did not reach: (with records, without any)."""
        visited = {item.name for item in chain.files}
        loaded: list[str] = []
        empty: list[str] = []
        for base, name in sorted(journals.items()):
            if base <= chain.snapshot.raw.revision or name in visited:
                continue
            item = self._read_journal(task_id, name, base)
            if item is None:
                continue
            (loaded if item.found.bodies or item.problem == "damaged" else empty).append(name)
        return loaded, empty

    def _quarantined_states(self, task_id: str) -> list[str]:
        try:
            names = self.io.listdir(os.path.join(self.task_dir(task_id), QUARANTINE))
        except FileNotFoundError:
            return []
        return sorted(name for name in names if name.startswith((STATE, "journal.")))

    def _sweep_temporaries(self, task_id: str) -> None:
        directory = self.task_dir(task_id)
        for name in self.io.listdir(directory):
            if TEMP_MARK in name:
                self.io.unlink(os.path.join(directory, name))

    def _quarantine(self, task_id: str, name: str, reason: str) -> str:
        directory = self.task_dir(task_id)
        ensure_dir(self.io, os.path.join(directory, QUARANTINE))  # never a link out of the task directory
        target_name = f"{name}.{time.time_ns()}.{reason}"
        self.io.replace(os.path.join(directory, name), os.path.join(directory, QUARANTINE, target_name))
        self.io.fsync_dir(os.path.join(directory, QUARANTINE))
        self.io.fsync_dir(directory)
        return os.path.join(QUARANTINE, target_name)

    def _inode(self, task_id: str, name: str) -> int | None:
        try:
            return os.lstat(os.path.join(self.task_dir(task_id), name)).st_ino
        except FileNotFoundError:
            return None

    # -- load ---------------------------------------------------------------------------------

    def _get_state(self, task_id: str, *, repair: bool) -> LoadResult:
        if not self._exists(task_id):
            return LoadResult(state=None)
        if repair:
            self._sweep_temporaries(task_id)
            self._drop_writer(task_id)
        with journal.no_gc():
            return self._load(task_id, repair=repair)

    def _load(self, task_id: str, *, repair: bool) -> LoadResult:
        now = time.time()
        notes: list[Evidence] = []
        moved: list[str] = []
        journals = self._journals(task_id)
        primary, primary_error = self._read_snapshot(task_id, STATE)
        backup_revision, backup_error = self._backup_revision(task_id)

        def set_aside(name: str, reason: str, why: str) -> None:
            notes.append(Evidence("store", f"{name} {why}", now))
            if repair:
                moved.append(self._quarantine(task_id, name, reason))
                notes.append(Evidence("store", f"{name} quarantined to {moved[-1]}", now))

        rolled_back = (
            primary is not None
            and backup_revision is not None
            and backup_revision >= primary.raw.revision
            # The same file under both names is the moment inside a compaction between linking the
            # backup and replacing the snapshot, not a rollback.
            and self._inode(task_id, STATE) != self._inode(task_id, BACKUP)
        )
        chain = self._walk(task_id, primary, journals) if primary is not None else None
        if chain is not None and not rolled_back:
            stray, _ = self._stray_journals(task_id, journals, chain)
            if chain.problem in (None, "torn") and chain.state is not None and not stray:
                if backup_error is not None:
                    set_aside(BACKUP, "damaged", f"is damaged: {backup_error}")
                return self._clean(task_id, chain, notes, moved, repair=repair, has_backup=backup_revision is not None)

        # Damage somewhere: rebuild from the longest valid chain, observing every unverified step.
        if primary_error is not None:
            notes.append(Evidence("store", f"{STATE} is damaged: {primary_error}", now))
        elif rolled_back:
            assert primary is not None
            notes.append(
                Evidence("store", f"{STATE} (revision {primary.raw.revision}) is not newer than its backup (revision {backup_revision}): rolled back", now)
            )
        elif primary is None:
            notes.append(Evidence("store", f"{STATE} is missing", now))
        if chain is not None and not rolled_back:
            notes.append(Evidence("store", self._describe_problem(chain), now))
        candidates = [chain] if chain is not None else []  # a rolled-back snapshot is still valid data
        backup = None
        if backup_revision is not None:
            backup, error = self._read_snapshot(task_id, BACKUP)
            backup_error = backup_error or error
        if backup is not None:
            candidates.append(self._walk(task_id, backup, journals))
        if backup_error is not None:
            notes.append(Evidence("store", f"{BACKUP} is damaged: {backup_error}", now))
        if not candidates:
            return self._nothing_valid(task_id, journals, primary_error, backup_error, notes, set_aside, repair=repair)
        # The longest chain wins; on a tie the one from state.json, unless that one was rolled back.
        best = max(
            candidates,
            key=lambda item: (item.end if item.state is not None else item.snapshot.raw.revision, item is chain and not rolled_back),
        )
        if best.state is None:  # checksum-valid records that do not build a valid state: the snapshot alone
            notes.append(Evidence("store", f"the journal after {best.snapshot.name} does not build a valid state: {best.error}", now))
            again, _ = self._read_snapshot(task_id, best.snapshot.name)  # the walk changed the first copy
            if again is None:
                return self._nothing_valid(task_id, journals, primary_error, backup_error, notes, set_aside, repair=repair)
            best = _Chain(again, journal.Replay(again.raw), [], problem="damaged")
            best.state = best.replay.build()
        return self._recovered(
            task_id, best, candidates, journals, notes, moved, set_aside,
            primary=primary, primary_damaged=primary_error is not None or rolled_back, backup_damaged=backup_error is not None,
            backup_revision=backup_revision, repair=repair,
        )  # fmt: skip

    @staticmethod
    def _describe_problem(chain: _Chain) -> str:
        name = chain.snapshot.name
        if chain.problem == "missing":
            return f"the journal of {name} (revision {chain.snapshot.raw.revision}) is missing"
        if chain.state is None:
            return f"the records after {name} do not build a valid state: {chain.error}"
        damaged = next((item for item in chain.files if item.problem == "damaged"), None)
        if damaged is not None:
            return f"{damaged.name} is damaged at byte {damaged.problem_at} (after revision {chain.end})"
        return f"a journal the chain from {name} does not reach holds records"

    def _clean(
        self, task_id: str, chain: _Chain, notes: list[Evidence], moved: list[str], *, repair: bool, has_backup: bool
    ) -> LoadResult:
        now = time.time()
        state = chain.state
        assert state is not None
        last = chain.files[-1] if chain.files else None
        detail = f"{STATE} revision {chain.snapshot.raw.revision}"
        if chain.records:
            detail += f" and {chain.records} journal record{'s' if chain.records != 1 else ''} validated: revision {chain.end}"
        else:
            detail += " validated"
        notes.insert(0, Evidence("store", detail, now))
        if last is not None and last.problem == "torn":
            cut = last.found.content_end - last.end
            log.warning("task %s: dropped an incomplete last record (%d bytes) of %s", task_id, cut, last.name)
            notes.append(
                Evidence("store", f"dropped an incomplete last record ({cut} bytes) of {last.name}: its write was cut short, so it was never acknowledged", now)
            )
        if repair:
            if last is not None and last.problem == "torn":
                self._cut_torn_tail(task_id, last)
            self._set_writer(task_id, state, chain, has_backup=has_backup)
        return LoadResult(
            state=state,
            source="primary",
            digest=chain.digest(),
            observations=tuple(notes),
            quarantined=tuple(moved),
            revision_floor=chain.end,
        )

    def _nothing_valid(
        self,
        task_id: str,
        journals: dict[int, str],
        primary_error: CorruptStateError | None,
        backup_error: CorruptStateError | None,
        notes: list[Evidence],
        set_aside: Callable[[str, str, str], None],
        *,
        repair: bool,
    ) -> LoadResult:
        """Neither snapshot validates (or neither exists)."""
        if primary_error is None and backup_error is None:
            with_records = [
                name for base, name in journals.items() if (item := self._read_journal(task_id, name, base)) is not None
                and (item.found.bodies or item.problem == "damaged")
            ]  # fmt: skip
            quarantined = self._quarantined_states(task_id)
            if with_records or quarantined:
                # Damaged state was set aside earlier, or its snapshots were lost, and nothing valid
                # replaced it: starting afresh would repeat every effect the lost state recorded.
                raise StateUnrecoverableError(
                    f"task {task_id!r} has no valid state (neither {STATE} nor {BACKUP} exists) but "
                    f"{'its quarantine holds ' + str(quarantined) if quarantined else 'journals ' + str(with_records) + ' hold records'}; "
                    f"restore a validated {STATE} or retire the task id"
                )
            return LoadResult(state=None, observations=tuple(notes))  # a task that never committed
        if primary_error is not None:
            set_aside(STATE, "damaged", "is set aside")
        if backup_error is not None:
            set_aside(BACKUP, "damaged", "is set aside")
        raise StateUnrecoverableError(
            f"task {task_id!r}: neither {STATE} nor {BACKUP} validates; damaged files "
            + ("were quarantined" if repair else "were left in place (read-only load)")
        )

    def _recovered(
        self,
        task_id: str,
        best: _Chain,
        candidates: list[_Chain],
        journals: dict[int, str],
        notes: list[Evidence],
        moved: list[str],
        set_aside: Callable[[str, str, str], None],
        *,
        primary: _Snapshot | None,
        primary_damaged: bool,
        backup_damaged: bool,
        backup_revision: int | None,
        repair: bool,
    ) -> LoadResult:
        now = time.time()
        state = best.state
        assert state is not None
        state.reconcile_all = True
        # Every revision that may have been committed lies at or below the floor: the chains' ends,
        # the snapshots' revisions and, for every journal not read to a clean end, as many
        # revisions as its bytes could hold.
        floor = max(best.end, backup_revision or 0, primary.raw.revision if primary else 0)
        # Revisions in a journal are contiguous from its base, so one read to a clean (or torn) end
        # held exactly base + applied; of any other, each record takes at least MIN_RECORD_BYTES.
        read_cleanly = {item.name: item.base + item.applied for chain in candidates for item in chain.files if item.problem != "damaged"}
        directory = self.task_dir(task_id)
        for base, name in journals.items():
            if name in read_cleanly:
                floor = max(floor, read_cleanly[name])
                continue
            try:
                size = os.lstat(os.path.join(directory, name)).st_size
            except FileNotFoundError:
                continue
            floor = max(floor, base + size // journal.MIN_RECORD_BYTES + 1)
        what = f"{best.snapshot.name} revision {best.snapshot.raw.revision}"
        if best.records:
            what += f" and {best.records} journal records (revision {best.end})"
        notes.append(Evidence("store", f"recovered from {what}; every unverified step will be observed first", now))
        log.warning("task %s: state recovered from %s; every unverified step will be observed first", task_id, what)
        digest = best.digest()
        if not repair:
            return LoadResult(state, "backup", digest, tuple(notes), tuple(moved), revision_floor=floor)
        # Make the recovery durable before moving anything the next load could need, in this order:
        # damaged snapshots aside (so the new snapshot does not link one as its backup), a new
        # journal, damaged and unreachable journals aside, then the recovered state as a snapshot
        # at a revision no commit can have used.
        state.revision = floor + 1
        lines = journal.encode_snapshot(state)
        if primary_damaged and os.path.lexists(os.path.join(directory, STATE)):
            set_aside(STATE, "rolled-back" if primary is not None else "damaged", "is set aside")
        if backup_damaged and os.path.lexists(os.path.join(directory, BACKUP)):
            set_aside(BACKUP, "damaged", "is set aside")
        new_journal = journal_name(state.revision)
        write_atomic(self.io, directory, new_journal, journal.encode_journal_meta(task_id, state.revision))
        reached = {item.name for chain in candidates for item in chain.files if item.problem != "damaged"}
        for base, name in sorted(journals.items()):
            if name == new_journal or not os.path.lexists(os.path.join(directory, name)):
                continue
            item = None if name in reached else self._read_journal(task_id, name, base)
            if name in reached or item is None:
                continue
            if item.problem == "damaged":
                set_aside(name, "damaged", f"is damaged at byte {item.problem_at}")
            elif item.found.bodies and base > best.snapshot.raw.revision:
                set_aside(name, "unreachable", "holds records the chain does not reach")
        keep_primary = primary is not None and not primary_damaged
        write_atomic(self.io, directory, STATE, lines, backup=BACKUP if keep_primary else None)
        has_backup = keep_primary or (backup_revision is not None and not backup_damaged)
        self._set_new_generation(task_id, state, lines, has_backup=has_backup)
        return LoadResult(state, "backup", digest, tuple(notes), tuple(moved), revision_floor=state.revision)

    def _cut_torn_tail(self, task_id: str, item: _JournalFile) -> None:
        path = os.path.join(self.task_dir(task_id), item.name)
        if item.end == 0:  # not even its first line: write it again
            meta = journal.encode_journal_meta(task_id, item.base)
            write_atomic(self.io, self.task_dir(task_id), item.name, meta)
            item.found.offsets = [len(meta)]
            item.found.size = len(meta)
            return
        fd = self.io.open(path, os.O_WRONLY)
        try:
            self.io.truncate(fd, item.end)
            self.io.fdatasync(fd)
        finally:
            self.io.close(fd)
        item.found.size = item.end

    # -- the writer: what this store object last wrote, and where to append -------------------

    def _set_writer(self, task_id: str, state: RunState, chain: _Chain, *, has_backup: bool) -> None:
        self._drop_writer(task_id)
        last = chain.files[-1] if chain.files else None
        snapshot_inode = self._inode(task_id, STATE)
        if last is None or snapshot_inode is None:
            return  # nothing to append to (a legacy snapshot): the next commit writes a snapshot
        journal_inode = self._inode(task_id, last.name)
        if journal_inode is None:
            return
        self._writers[task_id] = _Writer(
            shadow=journal.Shadow(state),
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

    def _set_new_generation(self, task_id: str, state: RunState, lines: list[bytes], *, has_backup: bool) -> None:
        """Follow the snapshot just written at ``state.revision`` and its new, empty journal."""
        self._drop_writer(task_id)
        name = journal_name(state.revision)
        snapshot_inode = self._inode(task_id, STATE)
        journal_inode = self._inode(task_id, name)
        if snapshot_inode is None or journal_inode is None:
            raise StorageError(f"task {task_id!r}: {STATE} or {name} vanished right after it was written")
        self._writers[task_id] = _Writer(
            shadow=journal.Shadow(state),
            revision=state.revision,
            snapshot_inode=snapshot_inode,
            snapshot_revision=state.revision,
            snapshot_bytes=sum(len(line) for line in lines),
            has_backup=has_backup,
            journal=name,
            journal_inode=journal_inode,
            journal_end=len(journal.encode_journal_meta(task_id, state.revision)),
            allocated=os.lstat(os.path.join(self.task_dir(task_id), name)).st_size,
        )

    def _close_journal(self, task_id: str) -> None:
        """Close the task's journal descriptor; called in the task's turn (its gate held)."""
        with self._mutex:
            self._open_journals.pop(task_id, None)
            writer = self._writers.get(task_id)
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
        excess = len(self._open_journals) - MAX_OPEN_JOURNALS
        for task_id in list(self._open_journals):
            if excess <= 0:
                break
            if task_id in self._gates:
                continue
            del self._open_journals[task_id]
            writer = self._writers.get(task_id)
            if writer is not None and writer.fd >= 0:
                fd, writer.fd = writer.fd, -1
                with contextlib.suppress(OSError):
                    self.io.close(fd)
            excess -= 1

    def _drop_writer(self, task_id: str) -> None:
        self._close_journal(task_id)
        self._writers.pop(task_id, None)

    def _unchanged(self, task_id: str, writer: _Writer) -> bool:
        """Whether the snapshot on disk is still the one this store last wrote or read.

        Every new snapshot is a new file, so this catches another writer's compaction or repair;
        ``_append`` catches another writer's records (they fill the padding this store expects).
        The journal itself is not stat'ed here: on kernels with multigrain timestamps, asking for
        a file's times makes its next write update them finely, which costs the following
        ``fdatasync`` a metadata flush (measured: about 60 us, a third of the commit)."""
        try:
            return os.lstat(self.task_dir(task_id) + os.sep + STATE).st_ino == writer.snapshot_inode
        except FileNotFoundError:
            return False

    # -- commit -------------------------------------------------------------------------------

    def _put_state(self, state: RunState, changed: Collection[str] | None) -> None:
        task_id = state.task_id
        writer = self._writers.get(task_id)
        try:
            if writer is not None and not self._unchanged(task_id, writer):
                raise StorageError(
                    f"task {task_id!r} changed on disk since this store last wrote it (another store "
                    "object or process with the same lease?); load it again before writing"
                )
            record = None
            if writer is not None and writer.shadow.tracks(state) and writer.revision + 1 == state.revision:
                record = writer.shadow.record_for(state, changed)
            line = journal.frame(record) if record is not None else None
            if line is None or writer is None or writer.snapshot_bytes + writer.journal_end + len(line) > MAX_STATE_BYTES:
                # Nothing to append to, or the state may be near the limit a load reads (invariant
                # 6): a snapshot, measured exactly before anything is written.
                self._publish(task_id, state, writer)
                return
            self._append(task_id, writer, line)
            writer.revision = state.revision
        except BaseException:
            self._drop_writer(task_id)
            raise
        if writer.wants_compaction():
            self._compact(task_id, state, writer)

    def _append(self, task_id: str, writer: _Writer, line: bytes) -> None:
        fd = writer.fd
        if fd < 0:
            path = os.path.join(self.task_dir(task_id), writer.journal)
            fd = self.io.open(path, os.O_RDWR)
            if os.fstat(fd).st_ino != writer.journal_inode:
                self.io.close(fd)
                raise StorageError(f"task {task_id!r}: {writer.journal} was replaced while this store held it")
            with self._mutex:
                writer.fd = fd
                self._open_journals[task_id] = None
                if len(self._open_journals) > MAX_OPEN_JOURNALS:
                    self._close_idle_journals()
        else:
            with self._mutex:
                self._open_journals.move_to_end(task_id)
        end = writer.journal_end
        # Padding is zeros; anything else at our end means another writer used this journal.
        if self.io.pread(fd, 1, end) not in (b"", b"\0"):
            raise StorageError(f"task {task_id!r}: {writer.journal} holds records this store did not write; load it again")
        if end + len(line) > writer.allocated:
            padding = min(PREALLOCATE_MAX, max(PREALLOCATE_MIN, end))
            # A load reads no journal file larger than MAX_JOURNAL_BYTES, padding included.
            padding = max(0, min(padding, MAX_JOURNAL_BYTES - end - len(line)))
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

    def _publish(self, task_id: str, state: RunState, writer: _Writer | None) -> None:
        """Commit ``state`` as a new snapshot at ``state.revision`` with a new, empty journal.

        Used when there is nothing to append to (the first commit, a state object this store does
        not follow) and by compaction (then ``state.revision`` is already in the journal)."""
        lines = journal.encode_snapshot(state)  # first: a value that cannot be encoded fails before any I/O
        directory = self.task_dir(task_id)
        if writer is None:
            demoted = self._check_before_publish(task_id, state)
        else:
            demoted = writer.snapshot_revision
        name = journal_name(state.revision)
        write_atomic(self.io, directory, name, [journal.encode_journal_meta(task_id, state.revision), bytes(PREALLOCATE_MIN)])
        has_backup = os.path.lexists(os.path.join(directory, STATE))
        write_atomic(self.io, directory, STATE, lines, backup=BACKUP if has_backup else None)
        self._set_new_generation(task_id, state, lines, has_backup=has_backup)
        if demoted is not None:
            # Journals before the backup's serve neither snapshot any more. The commit has landed,
            # so a failure here is only logged: it leaves files no chain reads, for the next time.
            try:
                for base, old in self._journals(task_id).items():
                    if base < demoted:
                        self.io.unlink(os.path.join(directory, old))
            except OSError as exc:
                log.info("task %s: could not delete old journals: %s", task_id, exc)

    def _check_before_publish(self, task_id: str, state: RunState) -> int | None:
        """Before a store object that holds no writer replaces ``state.json``, make sure the task's
        files are whole (so that a damaged snapshot is never linked over a good backup). Returns the
        revision of the snapshot that becomes the backup, if any."""
        with journal.no_gc():
            journals = self._journals(task_id)
            primary, error = self._read_snapshot(task_id, STATE)
            if primary is None and error is None:
                backup_revision, backup_error = self._backup_revision(task_id)
                if backup_revision is not None or backup_error is not None or self._quarantined_states(task_id):
                    raise StorageError(f"task {task_id!r} has no {STATE} but other state files: load it with the lease first")
                return None
            chain = self._walk(task_id, primary, journals) if primary is not None else None
        if chain is None or chain.problem not in (None, "torn") or chain.state is None:
            raise StorageError(f"task {task_id!r} has damaged state; load it with the lease (which repairs it) before writing")
        if chain.end >= state.revision:
            raise StorageError(f"task {task_id!r} is at revision {chain.end} on disk; load it again before writing")
        return chain.snapshot.raw.revision

    def _compact(self, task_id: str, state: RunState, writer: _Writer) -> None:
        """Write the state (already durable in the journal) as a new snapshot. A failure costs only
        time: the commit has landed, so it is logged, and the store keeps appending and tries again."""
        try:
            self._publish(task_id, state, writer)
        except (OSError, SizeLimitError) as exc:  # the size: never (invariant 6), but the commit has landed
            log.warning("task %s: compaction failed (%s); the commit is durable, compaction will be retried", task_id, exc)
            try:
                unchanged = self._writers.get(task_id) is writer and self._unchanged(task_id, writer)
            except OSError:
                unchanged = False
            if unchanged:
                writer.retry_compaction_at = writer.journal_end + COMPACT_MIN_BYTES
            else:
                self._drop_writer(task_id)  # the snapshot changed: the next commit reads the disk again

    # -- control records ----------------------------------------------------------------------

    def _read_control(self, path: str, name: str) -> ControlRecord | None:
        try:
            data = read_file(self.io, path, MAX_RECORD_BYTES)
        except OSError as exc:
            return ControlRecord(name=name, error=f"unreadable: {exc}")
        if data is None:
            return None
        digest = "sha256:" + sha256_hex(data)
        try:
            body = parse_json(data, what="the record", max_bytes=MAX_RECORD_BYTES, unique_keys=True)
        except CorruptStateError as exc:
            return ControlRecord(name=name, error=str(exc), digest=digest)
        return ControlRecord(name=name, body=body, digest=digest)

    def _control_dir(self, task_id: str, *parts: str) -> str | None:
        """``control`` (and below) of a task if every part is a plain directory; None if one is
        missing. A symbolic link (or anything else) in place of one raises ``OSError``: records are
        read only from inside the task directory."""
        directory = self.task_dir(task_id)
        for part in parts:
            directory = os.path.join(directory, part)
            try:
                info = os.lstat(directory)
            except FileNotFoundError:
                return None
            if not stat.S_ISDIR(info.st_mode):
                raise OSError(errno.ENOTDIR, "is not a plain directory (symbolic links are refused)", directory)
        return directory

    def read_cancellation(self, task_id: str) -> ControlRecord | None:
        if not self._exists(task_id):
            raise self._unknown(task_id)
        try:
            directory = self._control_dir(task_id, CONTROL)
        except OSError as exc:
            return ControlRecord(name=CANCEL, error=f"unreadable: {exc}")  # damaged intent to stop: the runner stops
        if directory is None:
            return None
        return self._read_control(os.path.join(directory, CANCEL), CANCEL)

    def write_cancellation(self, record: Cancellation) -> None:
        self._write_control(record.task_id, os.path.join(CONTROL), CANCEL, record.to_json())

    def read_approvals(self, task_id: str) -> tuple[ControlRecord, ...]:
        if not self._exists(task_id):
            raise self._unknown(task_id)
        try:
            directory = self._control_dir(task_id, CONTROL, APPROVALS)
        except OSError as exc:
            return (ControlRecord(name=f"{APPROVALS}/", error=f"unreadable: {exc}; no approval in it counts"),)
        if directory is None:
            return ()
        try:
            names = sorted(name for name in os.listdir(directory) if name.endswith(".json") and TEMP_MARK not in name)
        except FileNotFoundError:
            return ()
        except OSError as exc:
            raise StorageError(f"cannot list approvals of {task_id!r}: {exc}") from exc
        if len(names) > MAX_APPROVAL_FILES:
            raise StorageError(f"task {task_id!r} has {len(names)} approval files, over the limit of {MAX_APPROVAL_FILES}")
        records = []
        for name in names:
            record = self._read_control(os.path.join(directory, name), f"{APPROVALS}/{name}")
            if record is not None:
                records.append(record)
        return tuple(records)

    def write_approval(self, approval: Approval) -> None:
        name = check_task_id(approval.approval_id, what="approval id") + ".json"
        self._write_control(approval.task_id, os.path.join(CONTROL, APPROVALS), name, approval.to_json())

    def _write_control(self, task_id: str, subdir: str, name: str, body: JSONValue) -> None:
        if not self._exists(task_id):
            raise self._unknown(task_id)
        directory = self.task_dir(task_id)
        try:
            for part in subdir.split(os.sep):  # each level checked: a linked ``control`` must not lead out
                directory = os.path.join(directory, part)
                ensure_dir(self.io, directory)
            write_atomic(self.io, directory, name, canonical_bytes(body))
        except OSError as exc:
            if isinstance(exc, LongrunError):
                raise
            raise StorageError(f"cannot write {subdir}/{name} for {task_id!r}: {exc}") from exc

    # -- listing ------------------------------------------------------------------------------

    def history(self, task_id: str) -> list[dict[str, object]]:
        """The commits the store still holds for a task, oldest first, read-only.

        Each entry: ``revision``, ``epoch``, ``at`` (the commit's ``updated_at``), ``changes`` (one
        phrase per changed effect or header field) and ``description``. Compaction deletes journals
        older than the previous generation, so this is the recent timeline, not the task's whole
        life; the state itself still says where every effect ended. A damaged line ends its
        journal's part of the timeline (``load`` says why).
        """
        entries: dict[int, dict[str, object]] = {}
        with self._transaction(task_id, create=False, write=False):
            for base, name in sorted(self._journals(task_id).items()):
                found = self._read_journal(task_id, name, base)
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

    def list_tasks(self) -> list[str]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StorageError(f"cannot list {self.root}: {exc}") from exc
        tasks = []
        for name in sorted(names):
            try:
                check_task_id(name)
            except LongrunError:
                continue  # not a task directory (the root may hold other files)
            if os.path.isdir(os.path.join(self.root, name)) and not os.path.islink(os.path.join(self.root, name)):
                tasks.append(name)
        return tasks
