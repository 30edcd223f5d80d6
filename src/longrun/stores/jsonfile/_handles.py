"""The descriptors a JSON-file store object keeps open per task between transactions.

A commit used to open the task's lock file, lock it, read the lease file whole (open, read,
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
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import weakref
from typing import Protocol

from ...errors import LongrunError, StorageError
from .._fileio import FileIO
from . import _layout as layout
from ._layout import Gate, Gates, TaskFiles

__all__ = ["Held", "Handles", "Transaction", "Turns", "lease_key"]

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
                excess = len(self._held) - layout.MAX_OPEN_JOURNALS
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
            info = self.files.io.lstat(self.files.path(self.task_id, layout.LOCK))
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
