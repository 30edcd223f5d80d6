"""Where the JSON-file store keeps a task's files, the checks every path passes, the locks, and the
descriptors a store object holds on them.

``TaskFiles`` is the store root and the task directories in it: names, the plain-directory checks
(``lstat``), listings, quarantine. ``Gates`` order one store object's threads per task; the
``Transaction`` then takes ``flock(2)`` on the task's lock file among processes (see the
package docstring, "Threads"). Every file-system call goes through the store's
``FileIO``.

Held descriptors (``Handles``): what a store object keeps open per task between transactions. A
commit used to open the task's lock file, lock it, read the lease file whole (open, read,
close) and close the lock file again: five system calls besides its write and flush. Held here:

- the lock file, opened for writing once, then ``flock``-ed, checked and unlocked by each
  transaction (three calls). The check, made with the lock taken, is an ``lstat`` of the lock
  file's name: if it no longer gives the locked file (deleted, or replaced), a newcomer would lock
  another file, so the descriptor is closed and the name opened again. ``flock`` locks belong to
  the open file description, so the descriptor is used by one thread at a time (the task's gate)
  and forgotten in a child after ``fork``, which would otherwise share its locks with the parent.
- the lease file last read, held open only so that its inode cannot be reused. Every lease write
  replaces the file (``write_atomic``: a new inode), so an ``lstat`` that finds the same device,
  inode, size and change times finds the bytes last read (one call instead of three).

A task's descriptors are closed only in the task's turn, or while no thread holds or waits for it
(the same rule as the journal descriptors, ``_writing``); at most ``MAX_OPEN_JOURNALS`` tasks keep
theirs, least recently used closed first.

The limits and tunables are module attributes read when used, so that setting one on the package
(``jsonfile.COMPACT_MIN_BYTES = 0``, as the tests do) takes effect (see the package ``__init__``).

Longer than most modules: it is one concept, a task's files and the exclusive access to them; the
transaction is the gate, the lock file and the held descriptors used together on every commit.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import re
import stat
import threading
import time
import weakref
from typing import Protocol

from ...contract import check_task_id
from ...envelope import MAX_STATE_BYTES
from ...canonical import parse_json
from ...errors import CorruptStateError, InvalidInputError, LongrunError, NotAStoreError, StorageError, UnknownTaskError
from ..blobs import Blob, decode_blob
from .._fileio import TEMP_MARK, FileIO, ensure_dir, ensure_dirs, read_file, read_small, write_atomic, write_new_files
from ..controlfiles import APPROVALS, CANCEL, CONTROL, MAX_APPROVAL_FILES, MAX_RECORD_BYTES

__all__ = [
    "APPROVALS", "BACKUP", "BLOBS", "CANCEL", "COMPACT_MIN_BYTES", "COMPACT_RATIO", "CONTROL", "HOLDER_LOCK", "LEASE", "LOCK",
    "MARKER", "MAX_APPROVAL_FILES", "MAX_JOURNAL_BYTES", "MAX_OPEN_JOURNALS", "MAX_RECORD_BYTES", "MAX_STATE_BYTES", "NONBLOCK",
    "PREALLOCATE_MAX", "PREALLOCATE_MIN", "QUARANTINE", "STATE", "Gate", "Gates", "Handles", "Held", "TaskFiles", "Transaction",
    "Turns", "journal_name", "lease_key",
]  # fmt: skip

STATE = "state.json"
BACKUP = "state.json.bak"
LEASE = "lease.json"
HOLDER_LOCK = "lease.lock"
LOCK = "lock"
QUARANTINE = "quarantine"
BLOBS = "blobs"
MARKER = ".longrun-store"
"""The store marker in the root: says the directory is a longrun store (``TaskFiles.check_store``)."""
MARKER_FORMAT = "longrun-jsonfile-store"
MARKER_BYTES = b'{"format": "longrun-jsonfile-store", "version": 1}\n'
TASK_FILE_NAMES = frozenset({"state.json", "state.json.bak", "lease.json", "lease.lock", "lock", "control", "quarantine"})
"""Names only longrun writes in a task directory: one of them makes a directory a task of an
earlier version's store, written before stores were marked."""
"""The task's blobs: large payloads and results, one file each, named by the SHA-256 of its bytes."""
BLOB_NAME = re.compile(r"[0-9a-f]{64}")
BLOB_QUARANTINE_PREFIX = "blob."
"""A damaged blob in quarantine is ``blob.<digest>.<time>.damaged``."""
MAX_JOURNAL_BYTES = MAX_STATE_BYTES
COMPACT_MIN_BYTES = 1 << 20
"""A journal shorter than this is never compacted: below it, replaying costs less than a snapshot."""
COMPACT_RATIO = 0.5
"""Compact when the journal holds more than this many bytes per byte of snapshot."""
MAX_OPEN_JOURNALS = 64
"""Journal descriptors a store keeps open (least recently committed closed first). A descriptor of
a task that a thread of the store is using is never closed for this bound (see ``Gate``)."""
PREALLOCATE_MIN = 64 * 1024
PREALLOCATE_MAX = 1 << 20
"""A journal is zero-filled ahead of its end by its own size, between these bounds. Writing into
blocks that are already allocated and written lets ``fdatasync`` skip the metadata flush that an
append needs (the file size), which is most of its cost; the padding costs that once per extension."""

log = logging.getLogger("longrun")

NONBLOCK = getattr(os, "O_NONBLOCK", 0)
JOURNAL_NAME = re.compile(r"journal\.(0|[1-9][0-9]{0,17})\.log")
STATE_FILE_PREFIXES = (STATE, "journal.")
"""Names of the files that hold state (snapshots, their backups and journals), also in quarantine."""


def journal_name(base: int) -> str:
    return f"journal.{base}.log"


class TaskFiles:
    """The store root and its task directories, reached through ``io``."""

    def __init__(self, root: str, io: FileIO, *, create: bool):
        self.root = root
        self.io = io
        self.create = create
        self._dirs: dict[str, str] = {}
        self._marked = False

    def check_store(self) -> None:
        """Refuse a root that exists and is not a longrun store (``NotAStoreError`` naming it).

        A store is a directory that holds the marker (``MARKER``), or is empty, or (written by an
        earlier version, before stores were marked) holds a task directory with a file only
        longrun writes; the marker is written into such a store when a task is first created in it
        (``ensure_root``). A missing root is left to ``create``. Reads only, through a plain
        ``FileIO`` rather than the store's: opening a store is not one of its operations, so an
        injected ``io`` (``FaultyIO``, a crash test's) counts from the store's first call."""
        io = FileIO()
        try:
            info = io.stat(self.root)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise StorageError(f"cannot check the store root {self.root}: {exc}") from exc
        if not stat.S_ISDIR(info.st_mode):
            raise NotAStoreError(f"{self.root} is not a longrun store: it is not a directory", path=self.root)
        try:
            marker = read_small(io, os.path.join(self.root, MARKER), 4096)
            if marker is not None:
                self._check_marker(marker)
                return
            names = sorted(name for name in io.listdir(self.root) if not name.startswith("."))
            if not names or any(self._is_task_of_an_earlier_store(io, name) for name in names):
                return
        except LongrunError:
            raise
        except OSError as exc:
            raise StorageError(f"cannot check the store root {self.root}: {exc}") from exc
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise NotAStoreError(
            f"{self.root} is not a longrun store: it holds no store marker ({MARKER}) and no task longrun wrote "
            f"(it holds {shown}); name the store's directory, or a new or empty one to make a store there",
            path=self.root,
        )

    def _check_marker(self, data: bytes) -> None:
        try:
            marker = parse_json(data, what=f"store marker {os.path.join(self.root, MARKER)}", max_bytes=4096)
        except CorruptStateError as exc:
            raise NotAStoreError(f"{self.root} is not a longrun store: {exc}", path=self.root) from None
        found = marker.get("format") if isinstance(marker, dict) else None
        if found != MARKER_FORMAT:
            raise NotAStoreError(
                f"{self.root} is not a longrun JSON-file store: its marker says format {found!r}, not {MARKER_FORMAT!r}", path=self.root
            )
        self._marked = True

    def _is_task_of_an_earlier_store(self, io: FileIO, name: str) -> bool:
        try:
            check_task_id(name)
            entries = io.listdir(os.path.join(self.root, name))
        except (LongrunError, NotADirectoryError, FileNotFoundError, PermissionError):
            return False
        return any(entry in TASK_FILE_NAMES or JOURNAL_NAME.fullmatch(entry) for entry in entries)

    def mark(self) -> None:
        """Write the store marker into the root unless it holds one (a new store, or one an earlier
        version wrote, adopted now), durably, before the first task is created through this object."""
        if self._marked:
            return
        if read_small(self.io, os.path.join(self.root, MARKER), 4096) is None:
            write_atomic(self.io, self.root, MARKER, MARKER_BYTES)
        self._marked = True

    def task_dir(self, task_id: str) -> str:
        directory = self._dirs.get(task_id)
        if directory is None:
            # Validated once per task id; the hot path (every commit) then costs a lookup.
            directory = os.path.join(self.root, check_task_id(task_id))
            if len(self._dirs) < 10_000:
                self._dirs[task_id] = directory
        return directory

    def path(self, task_id: str, name: str) -> str:
        return self.task_dir(task_id) + os.sep + name

    def lstat(self, task_id: str, name: str) -> os.stat_result | None:
        """The ``lstat`` of a file in the task directory, or None if it does not exist."""
        try:
            return self.io.lstat(self.path(task_id, name))
        except FileNotFoundError:
            return None

    def inode(self, task_id: str, name: str) -> int | None:
        info = self.lstat(task_id, name)
        return None if info is None else info.st_ino

    def exists(self, task_id: str) -> bool:
        try:
            info = self.io.lstat(self.task_dir(task_id))
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise StorageError(f"{self.task_dir(task_id)} is not a plain directory (symlinks are refused)")
        return True

    def unknown(self, task_id: str) -> UnknownTaskError:
        try:
            root_is_dir = stat.S_ISDIR(self.io.stat(self.root).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            root_is_dir = False
        where = "" if root_is_dir else f" (the store root {self.root} does not exist)"
        return UnknownTaskError(f"no task {task_id!r} in {self.root}{where}")

    def missing_root(self) -> InvalidInputError:
        return InvalidInputError(f"store root {self.root} does not exist; create it, or open the store with create=True")

    def ensure_root(self) -> None:
        """Check the root before a task is created in it; make it if missing and ``create``.

        A plain directory is used as it is. A symbolic link is followed only to a directory owned
        by this user, through a link owned by this user or root: anyone else could point it at a
        directory of their choosing. Everything else is refused (``StorageError``)."""
        try:
            info = self.io.lstat(self.root)
        except FileNotFoundError:
            if not self.create:
                raise self.missing_root() from None
            ensure_dirs(self.io, self.root)  # owner-only, each made durable in its parent
            self.mark()
            return
        if stat.S_ISDIR(info.st_mode):
            self.mark()
            return
        if stat.S_ISLNK(info.st_mode):
            try:
                target = self.io.stat(self.root)
            except FileNotFoundError:
                raise StorageError(f"store root {self.root} is a symbolic link to nothing") from None
            user = os.geteuid()
            if stat.S_ISDIR(target.st_mode) and target.st_uid == user and info.st_uid in (user, 0):
                self.mark()
                return
            raise StorageError(
                f"store root {self.root} is a symbolic link, accepted only to a directory owned by this user "
                f"(uid {user}) through a link owned by this user or root"
            )
        raise StorageError(f"store root {self.root} exists and is not a directory")

    def open_lock(self, task_id: str, *, create: bool, write: bool) -> int:
        """Open (and make, with ``create``) the task's lock file; -1 for a reader of a task whose
        lock file is gone."""
        directory = self.task_dir(task_id)
        try:
            if create:
                self.ensure_root()
                ensure_dir(self.io, directory)
                ensure_dir(self.io, os.path.join(directory, CONTROL))
                ensure_dir(self.io, os.path.join(directory, CONTROL, APPROVALS))
                ensure_dir(self.io, os.path.join(directory, QUARANTINE))
            elif not self.exists(task_id):
                raise self.unknown(task_id)
            lock_path = directory + os.sep + LOCK
            try:
                # Readers take a shared lock through a read-only descriptor, so an operator's
                # `status` works on a store it cannot write and never creates files.
                # O_NONBLOCK: a FIFO planted as the lock file must not hang a reader.
                return self.io.open(lock_path, os.O_RDWR | os.O_CREAT if write else os.O_RDONLY | NONBLOCK, 0o600)
            except FileNotFoundError:
                return -1  # a reader of a task whose lock file is gone: there is no writer to exclude
        except LongrunError:
            raise
        except OSError as exc:
            raise StorageError(f"cannot open task {task_id!r} in {self.root}: {exc}") from exc

    def journals(self, task_id: str) -> dict[int, str]:
        """The task's journal files by base revision; other names are ignored."""
        journals = {}
        for name in self.io.listdir(self.task_dir(task_id)):
            match = JOURNAL_NAME.fullmatch(name)
            if match:
                journals[int(match.group(1))] = name
        return journals

    def state_files(self, task_id: str) -> list[str]:
        """Every snapshot and journal name in the task directory and (as ``quarantine/<name>``) in
        its quarantine, temporary files left out."""
        names = [name for name in self.io.listdir(self.task_dir(task_id)) if name.startswith(STATE_FILE_PREFIXES)]
        names += [os.path.join(QUARANTINE, name) for name in self.quarantined_states(task_id)]
        return [name for name in names if TEMP_MARK not in name]

    def quarantined_states(self, task_id: str) -> list[str]:
        try:
            names = self.io.listdir(os.path.join(self.task_dir(task_id), QUARANTINE))
        except FileNotFoundError:
            return []
        return sorted(name for name in names if name.startswith(STATE_FILE_PREFIXES))

    def sweep_temporaries(self, task_id: str) -> None:
        directory = self.task_dir(task_id)
        for name in self.io.listdir(directory):
            if TEMP_MARK in name:
                self.io.unlink(os.path.join(directory, name))
        blobs = os.path.join(directory, BLOBS)
        try:
            names = self.io.listdir(blobs)
        except FileNotFoundError:
            return
        for name in names:
            if TEMP_MARK in name:
                self.io.unlink(os.path.join(blobs, name))

    # -- blobs -------------------------------------------------------------------------------

    def read_blob(self, task_id: str, digest: str) -> bytes | None:
        """The bytes of the blob file named ``digest`` (unchecked), or None if there is none."""
        path = os.path.join(self.task_dir(task_id), BLOBS, digest)
        try:
            return read_file(self.io, path, MAX_STATE_BYTES)
        except FileNotFoundError:  # the blobs directory itself is gone
            return None

    def write_blobs(self, task_id: str, blobs: list[Blob]) -> list[str]:
        """Make the blobs durable: each file written and synced, renamed into place, then the blobs
        directory synced once (made, and synced in the task directory, if missing). A file already
        named by a blob's digest is kept only if its bytes match that digest: a damaged one is
        moved to quarantine first and the blob written afresh. Returns where damaged ones went."""
        directory = os.path.join(self.task_dir(task_id), BLOBS)
        ensure_dir(self.io, directory)
        moved = []
        for blob in blobs:
            if self.lstat(task_id, os.path.join(BLOBS, blob.ref.sha256)) is None:
                continue
            try:
                decode_blob(blob.ref, self.read_blob(task_id, blob.ref.sha256), "a blob written again")
            except CorruptStateError as exc:
                moved.append(self.quarantine_blob(task_id, blob.ref.sha256))
                log.warning("task %s: %s; moved to %s and written again", task_id, exc, moved[-1])
        write_new_files(self.io, directory, [(blob.ref.sha256, blob.pieces) for blob in blobs])
        return moved

    def quarantine_blob(self, task_id: str, digest: str) -> str:
        """Move the blob file ``digest`` into the task's quarantine (durably, never deleted), so that a
        later write of the same content makes a fresh file; returns its new relative name."""
        directory = self.task_dir(task_id)
        ensure_dir(self.io, os.path.join(directory, QUARANTINE))
        target_name = f"{BLOB_QUARANTINE_PREFIX}{digest}.{time.time_ns()}.damaged"
        self.io.replace(os.path.join(directory, BLOBS, digest), os.path.join(directory, QUARANTINE, target_name))
        self.io.fsync_dir(os.path.join(directory, QUARANTINE))
        self.io.fsync_dir(os.path.join(directory, BLOBS))
        return os.path.join(QUARANTINE, target_name)

    def blob_names(self, task_id: str) -> list[str]:
        """The names of the task's blob files (temporary files left out)."""
        try:
            names = self.io.listdir(os.path.join(self.task_dir(task_id), BLOBS))
        except FileNotFoundError:
            return []
        return [name for name in names if BLOB_NAME.fullmatch(name)]

    def delete_blobs(self, task_id: str, names: list[str]) -> None:
        directory = os.path.join(self.task_dir(task_id), BLOBS)
        for name in names:
            self.io.unlink(os.path.join(directory, name))

    def quarantine(self, task_id: str, name: str, reason: str) -> str:
        """Move a file of the task into its quarantine (durably); returns its new relative name."""
        directory = self.task_dir(task_id)
        ensure_dir(self.io, os.path.join(directory, QUARANTINE))  # never a link out of the task directory
        target_name = f"{name}.{time.time_ns()}.{reason}"
        self.io.replace(os.path.join(directory, name), os.path.join(directory, QUARANTINE, target_name))
        self.io.fsync_dir(os.path.join(directory, QUARANTINE))
        self.io.fsync_dir(directory)
        return os.path.join(QUARANTINE, target_name)

    def list_tasks(self) -> list[str]:
        try:
            names = self.io.listdir(self.root)
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
            try:
                info = self.io.lstat(os.path.join(self.root, name))
            except FileNotFoundError:
                continue  # deleted while listed
            except OSError as exc:
                raise StorageError(f"cannot list {self.root}: {exc}") from exc
            if stat.S_ISDIR(info.st_mode):  # a plain directory: links are not tasks
                tasks.append(name)
        return tasks


# -- locking -------------------------------------------------------------------------------------


class Gate:
    """A task's turn inside one store object: one thread at a time, and a count of the threads that
    hold or wait for it. The count is what makes a journal descriptor safe to close: the store
    closes a task's descriptor only while no thread holds or waits for that task's gate."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class Gates:
    """The tasks a thread of one store object holds or waits for; a gate goes when its count is 0.

    ``mutex`` guards the gates and also the store's journal-descriptor cache (see ``_writing``),
    so a descriptor is closed only while no thread holds or waits for its task."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self._gates: dict[str, Gate] = {}

    def busy(self, task_id: str) -> bool:
        """Whether a thread holds or waits for the task's gate; call with ``mutex`` held."""
        return task_id in self._gates

    def enter(self, task_id: str) -> Gate:
        """Wait for the task's turn among this store object's threads."""
        with self.mutex:
            gate = self._gates.get(task_id)
            if gate is None:
                gate = self._gates[task_id] = Gate()
            gate.users += 1  # counted before waiting: from here on its descriptor stays open
        try:
            gate.lock.acquire()
        except BaseException:
            self._uncount(task_id, gate)
            raise
        return gate

    def leave(self, task_id: str, gate: Gate) -> None:
        gate.lock.release()
        with self.mutex:  # ``_uncount``, without the call: every transaction leaves a gate
            gate.users -= 1
            if gate.users == 0:
                del self._gates[task_id]

    def _uncount(self, task_id: str, gate: Gate) -> None:
        with self.mutex:
            gate.users -= 1
            if gate.users == 0:
                del self._gates[task_id]


# -- the descriptors held between transactions, and the transaction ------------------------------


LeaseKey = tuple[int, int, int, int, int]


def lease_key(info: os.stat_result) -> LeaseKey:
    """What identifies a lease file's content without reading it (see the module docstring)."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class Held:
    """One task's held descriptors (-1: none) and what was read through the lease descriptor."""

    __slots__ = ("lock", "lock_file", "lease", "lease_key", "lease_data")

    def __init__(self) -> None:
        self.lock = -1
        self.lock_file: tuple[int, int] | None = None
        """The device and inode of the lock file ``lock`` was opened on."""
        self.lease = -1
        self.lease_key: LeaseKey | None = None
        self.lease_data: bytes | None = None

    def descriptors(self) -> list[int]:
        return [fd for fd in (self.lock, self.lease) if fd >= 0]


_all: weakref.WeakSet["Handles"] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for handles in list(_all):
        handles.forget_inherited()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _close_all(io: FileIO, held: dict[str, Held]) -> None:
    for entry in held.values():
        for fd in entry.descriptors():
            with contextlib.suppress(OSError):  # our own descriptor, at collection: nothing to lose
                io.close(fd)
    held.clear()


class Handles:
    """The held descriptors of one store object, by task (``gates.mutex`` guards the map)."""

    def __init__(self, io: FileIO, gates: Gates):
        self.io = io
        self.gates = gates
        self._held: collections.OrderedDict[str, Held] = collections.OrderedDict()
        _all.add(self)
        weakref.finalize(self, _close_all, io, self._held)  # a store object dropped without ``close``

    def __len__(self) -> int:
        return len(self._held)

    def get(self, task_id: str) -> Held | None:
        """The task's held descriptors, most recently used now; call in the task's turn."""
        with self.gates.mutex:
            held = self._held.get(task_id)
            if held is not None:
                self._held.move_to_end(task_id)
            return held

    def make(self, task_id: str) -> Held:
        """The task's entry, made if missing; call in the task's turn. Idle tasks beyond the bound
        have their descriptors closed."""
        idle: list[Held] = []
        with self.gates.mutex:
            held = self._held.get(task_id)
            if held is None:
                held = self._held[task_id] = Held()
                excess = len(self._held) - MAX_OPEN_JOURNALS
                for other in list(self._held):
                    if excess <= 0:
                        break
                    if other == task_id or self.gates.busy(other):
                        continue
                    idle.append(self._held.pop(other))
                    excess -= 1
        for entry in idle:
            self._close(entry.descriptors())
        return held

    def drop(self, task_id: str) -> None:
        """Close the task's descriptors; call in the task's turn (or with no thread in it)."""
        with self.gates.mutex:
            held = self._held.pop(task_id, None)
        if held is not None:
            self._close(held.descriptors())

    def tasks(self) -> list[str]:
        with self.gates.mutex:
            return list(self._held)

    def forget_inherited(self) -> None:
        """In a child after ``fork``: close the copies without unlocking (the locks are the
        parent's) and forget them, so the child opens descriptors of its own."""
        held = list(self._held.values())
        self._held.clear()
        for entry in held:
            for fd in entry.descriptors():
                with contextlib.suppress(OSError):
                    self.io.close(fd)

    def _close(self, fds: list[int]) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):  # closing a descriptor we own: nothing to lose
                self.io.close(fd)


class Turns(Protocol):
    """How a transaction takes and leaves a task's turn: the store's own methods, so that a
    subclass can watch them (the thread tests pause a thread there)."""

    def _enter_gate(self, task_id: str) -> Gate: ...

    def _leave_gate(self, task_id: str, gate: Gate) -> None: ...


class Transaction:
    """The task's gate and flock held for one read-modify-write (a class, not a generator: it runs
    on every commit). The gate orders this store object's threads, the flock other processes and
    other store objects. A writer locks the task's held lock descriptor (opened on first use) and
    unlocks it at the end; a reader opens a read-only descriptor of its own and closes it. OS
    errors inside become ``StorageError``, and drop the task's held descriptors, so that the next
    transaction opens its files again by name."""

    __slots__ = ("turns", "files", "handles", "task_id", "create", "write", "fd", "kept", "gate")

    def __init__(self, turns: Turns, files: TaskFiles, handles: Handles, task_id: str, *, create: bool, write: bool):
        self.turns, self.files, self.handles, self.task_id = turns, files, handles, task_id
        self.create, self.write, self.fd, self.kept = create, write, -1, False
        self.gate: Gate | None = None

    def __enter__(self) -> None:
        self.gate = self.turns._enter_gate(self.task_id)
        try:
            held = self.handles.get(self.task_id) if self.write else None
            if held is not None and held.lock >= 0:
                self.fd, self.kept = held.lock, True
                self._lock()
                if not self._still_named(held):
                    # The lock file was deleted or replaced: a newcomer locks the file the name
                    # gives, so this descriptor excludes nobody any more. Closed (which unlocks),
                    # and the file the name gives is opened and locked instead.
                    self.handles.drop(self.task_id)
                    self.fd, self.kept = -1, False
            if not self.kept:
                self.fd = self.files.open_lock(self.task_id, create=self.create, write=self.write)
                if self.fd >= 0:
                    self._lock()
                    if self.write:
                        self._keep()
        except BaseException:
            self.turns._leave_gate(self.task_id, self.gate)
            raise

    def _lock(self) -> None:
        try:
            self.files.io.flock(self.fd, fcntl.LOCK_EX if self.write else fcntl.LOCK_SH)
        except BaseException as exc:
            self._let_go()
            if isinstance(exc, OSError) and not isinstance(exc, LongrunError):
                raise StorageError(f"task {self.task_id!r}: cannot lock: {exc}") from exc
            raise

    def _still_named(self, held: Held) -> bool:
        """Whether the lock file's name still gives the file this descriptor locks (checked with
        the lock taken, as lock files are: its inode cannot be reused while it is open)."""
        try:
            info = self.files.io.lstat(self.files.path(self.task_id, LOCK))
        except FileNotFoundError:
            return False
        except BaseException as exc:
            self._let_go()
            if isinstance(exc, OSError) and not isinstance(exc, LongrunError):
                raise StorageError(f"task {self.task_id!r}: cannot check its lock file: {exc}") from exc
            raise
        return (info.st_dev, info.st_ino) == held.lock_file

    def _keep(self) -> None:
        """Keep the descriptor just opened and locked for the transactions to come."""
        try:
            info = self.files.io.fstat(self.fd)
        except BaseException as exc:
            self._let_go()
            if isinstance(exc, OSError) and not isinstance(exc, LongrunError):
                raise StorageError(f"task {self.task_id!r}: cannot check its lock file: {exc}") from exc
            raise
        held = self.handles.make(self.task_id)
        held.lock, held.lock_file = self.fd, (info.st_dev, info.st_ino)
        self.kept = True

    def _let_go(self) -> None:
        """Close this transaction's descriptor after a failure (closing unlocks it)."""
        if self.kept:
            self.handles.drop(self.task_id)
        else:
            self.files.io.close(self.fd)
        self.fd, self.kept = -1, False

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        try:
            if self.fd >= 0:
                if not self.kept:
                    self.files.io.close(self.fd)  # closing the descriptor releases the flock
                elif isinstance(exc, OSError):
                    self.handles.drop(self.task_id)  # closing releases the flock too
                else:
                    try:
                        self.files.io.flock(self.fd, fcntl.LOCK_UN)
                    except OSError as unlock_error:
                        self.handles.drop(self.task_id)  # closing releases it
                        raise StorageError(f"task {self.task_id!r}: cannot unlock: {unlock_error}") from unlock_error
        finally:
            assert self.gate is not None
            self.turns._leave_gate(self.task_id, self.gate)
        if isinstance(exc, OSError) and not isinstance(exc, LongrunError):
            raise StorageError(f"task {self.task_id!r}: {exc}") from exc
