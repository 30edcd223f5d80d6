"""Kernel locks that prove, on one machine, whether a lease's holder is still alive.

A store that keeps its data on this machine's file system (the JSON-file and SQLite stores) gives
each task a lock file. The process granted a task's lease takes ``flock(LOCK_EX)`` on it and keeps
the descriptor open for the lease's life, and the lease record names the lock
(``Lease.holder_lock``: this boot's id, the file's device and inode). The kernel drops the lock
when the process ends, however it ends (``kill -9`` included). A contender on the same boot that
finds a live record naming the lock, and that can take the lock itself, knows the holder is gone
and may take the lease at once with the next epoch. A holder that is only paused (SIGSTOP, a
debugger, a swapped-out VM) still holds the lock and is waited for until its lease expires.

Why ``flock`` and not ``fcntl`` record locks: an ``fcntl`` lock belongs to the process, never
conflicts with the same process's own locks, and is dropped when the process closes *any*
descriptor of the file, so another store object in the holder's process could neither see the
lock nor look at it without releasing it. A ``flock`` lock belongs to one open file description:
one per held lease, unaffected by other descriptors of the file, and the same for every thread of
the process (the runner renews its lease from a second thread, which needs nothing from the lock).
Descriptors are opened close-on-exec, so a program the holder starts does not inherit the lock; a
child made by ``fork`` without ``exec`` shares it, which can only make a dead holder look alive
(its lease then ends by expiry, as without the lock).

The locks a process holds are kept in one registry per process, so every store object of the
process knows that the process itself holds a task's lock and never judges its own process dead
(even on a file system where ``flock`` has the per-process semantics of ``fcntl``, as NFS gives
it). A lock is let go when its lease is released, when a write under it is fenced or finds the
lease record damaged (the holder has lost the lease), and when the process exits; a lock whose
file was deleted (its task directory is gone) is let go at the next acquisition.

Every claim and probe is made inside the task's exclusive transaction, so no two processes judge
the same lock at once.

Not guaranteed: anything across machines. A record from another boot, or one that names no lock
(its holder could not take it: an older longrun, a lock still held by a paused earlier holder),
is judged by expiry alone. A holder whose process closes descriptors it does not own (a daemon
that closes every descriptor) looks dead once it has done so.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hmac
import logging
import os
import stat
import threading
from typing import Callable

from ..lease import Lease, boot_clock_id

__all__ = ["HolderLocks"]

log = logging.getLogger("longrun")

_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
_PROBE_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


@dataclasses.dataclass
class _Held:
    fd: int
    path: str
    epoch: int = 0
    token: str | None = None
    """The grant the lock backs: let go only for that grant (a forged lease of the same epoch must
    not make the real holder look dead)."""


_HELD: dict[tuple[int, int], _Held] = {}
"""Every holder lock this process holds, by (device, inode) of the lock file."""
_GUARD = threading.Lock()


def _describe(boot: str, key: tuple[int, int]) -> str:
    return f"{boot}/{key[0]}/{key[1]}"


def _key_of(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)


def _sweep() -> None:
    """Let go of locks on files that were deleted: their tasks are gone, so are their leases."""
    for key, held in list(_HELD.items()):
        try:
            gone = os.fstat(held.fd).st_nlink == 0
        except OSError:
            gone = True
        if gone:
            _close(key)


def _close(key: tuple[int, int]) -> None:
    held = _HELD.pop(key)
    os.close(held.fd)  # closing the only descriptor of the open file description drops the flock


class HolderLocks:
    """A store's view of its tasks' holder locks; ``path_of(task_id)`` names a task's lock file."""

    def __init__(self, path_of: Callable[[str], str], *, make_parent: bool = False):
        self._path_of = path_of
        self._make_parent = make_parent

    def _mine(self, task_id: str) -> tuple[tuple[int, int], _Held] | None:
        """The lock this process holds on the task's lock file, if any."""
        key = _key_of(self._path_of(task_id))
        if key is None:
            return None
        held = _HELD.get(key)
        return (key, held) if held is not None else None

    def claim(self, task_id: str) -> tuple[str | None, bool]:
        """Take this process's lock on the task, or keep the one it holds.

        Returns the lock's description for the lease record (None if it cannot be held: another
        process holds it, no boot id, or the file cannot be opened) and whether it was taken just
        now, which is what proves that its previous holder is gone."""
        boot = boot_clock_id()
        if boot is None:
            return None, False
        path = self._path_of(task_id)
        with _GUARD:
            _sweep()
            mine = self._mine(task_id)
            if mine is not None:
                return _describe(boot, mine[0]), False
            try:
                if self._make_parent:
                    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                fd = os.open(path, _FLAGS, 0o600)
            except OSError as exc:
                # The lease works without it; only a dead holder's lease then waits for its expiry.
                log.warning("cannot open the holder lock %s (%s): this lease will end by expiry only", path, exc)
                return None, False
            try:
                info = os.fstat(fd)
                key = (info.st_dev, info.st_ino)
                if not stat.S_ISREG(info.st_mode) or key in _HELD:
                    os.close(fd)  # not a plain file, or this process holds it under another name
                    return None, False
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    log.warning("cannot lock the holder lock %s (%s): this lease will end by expiry only", path, exc)
                return None, False  # held by another process: alive, or only paused
            _HELD[key] = _Held(fd, path)
            return _describe(boot, key), True

    @staticmethod
    def holder_gone(record: Lease, claim: str | None, newly: bool) -> bool:
        """Whether ``record``'s holder provably died: it held the lock the caller just took."""
        return newly and claim is not None and record.holder_lock == claim

    def assign(self, task_id: str, lease: Lease) -> None:
        """Mark this process's lock on the task as backing ``lease`` (a new grant)."""
        with _GUARD:
            mine = self._mine(task_id)
            if mine is not None:
                mine[1].epoch, mine[1].token = lease.epoch, lease.token

    def let_go(self, task_id: str, lease: Lease | None = None) -> None:
        """Drop this process's lock on the task: for ``lease`` only if it is the grant the lock
        backs, or unconditionally with no lease (a claim that came to nothing)."""
        with _GUARD:
            mine = self._mine(task_id)
            if mine is None:
                return
            key, held = mine
            if lease is not None:
                if held.epoch != lease.epoch or held.token is None or lease.token is None:
                    return
                if not hmac.compare_digest(held.token, lease.token):
                    return
            _close(key)

    def someone_holds(self, task_id: str) -> bool:
        """Whether a process on this machine (this one included) holds the task's lock now."""
        with _GUARD:
            if self._mine(task_id) is not None:
                return True
            try:
                fd = os.open(self._path_of(task_id), _PROBE_FLAGS)
            except FileNotFoundError:
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return True
                raise
            finally:
                os.close(fd)  # also drops the probe's own lock at once
            return False
