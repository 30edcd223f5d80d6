"""Control records as files: the one reader and writer of approval and cancellation files.

Layout under a root (a ``JsonFileStore`` root, or a control area of its own)::

    <root>/<task id>/control/cancel.json
    <root>/<task id>/control/approvals/<approval id>.json

``ControlFiles`` reads and writes that layout, for the JSON-file store and for
``FileControlSource`` (the control source of ``longrun.authority``, usually a control area that an
approver account owns); every file-system call goes through a ``FileIO``.

Reading walks down from the root on open descriptors (``openat`` semantics, then ``fstat``), so the
directory checked is the directory read and the file checked is the file read. Below the root every
component must be a plain directory and the record a regular file: a symbolic link is never
followed (the root itself may be a link, except in strict mode). A record over
``MAX_RECORD_BYTES``, and one ``canonical.parse_json`` refuses (deep nesting, NaN, duplicate keys,
bad UTF-8), comes back with ``error`` set, never as an exception: a damaged record is evidence for
the runner to weigh (a damaged cancellation still means "stop"). A listing that fails, or that
names more than ``MAX_APPROVAL_FILES`` approval files, raises ``StorageError``. A missing task
directory or record is simply no record; a missing root is a refusal, so that a mistyped path
cannot hide an operator's cancellation.

Strict mode (after OpenSSH's ``StrictModes``) also asks who may have written: the record and every
directory from it up to the root must be owned by the approver account or root (uid 0) and
writable by neither group nor others. ``approver_uid=None`` means the owner of the root, read on
every call; since that default would let the runner's own account approve itself, a root owned by
this process's own (non-root) account is then refused as a whole. A record or directory that fails
a check is *refused* in strict mode (a ``RefusedRecord``: nobody vouches for it) and *unreadable*
otherwise (a ``ControlRecord`` whose ``error`` says why). A refused directory refuses everything in
it: one record for the approvals directory, and for a cancellation a record that stops the run.

Writing makes the missing directories (``dir_mode``) and replaces the record with ``write_atomic``
(``file_mode``): owner-only in a store; readable by others in a control area that another account
writes and the runner reads. A write needs the root to exist. It then touches the root's times, so
that a worker watching the root (``longrun.worker``) sees at once that a record arrived.

Not checked: the directories above the root, and ACL entries beyond the mode bits. The checks on
directories while writing are ``lstat`` calls before use: someone who can swap a directory in
between can write the records anyway.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import stat
import threading
import weakref
from typing import Generator

from ..approval import Approval
from ..cancellation import Cancellation
from ..canonical import canonical_bytes, sha256_hex
from ..contract import check_task_id
from ..control import MAX_RECORD_BYTES, ControlRecord, RefusedRecord, parse_control_record
from ..errors import InvalidInputError, LongrunError, StorageError
from ._fileio import TEMP_MARK, FileIO, ensure_dir, read_upto, write_atomic

__all__ = ["APPROVALS", "CANCEL", "CONTROL", "MAX_APPROVAL_FILES", "MAX_RECORD_BYTES", "ControlFiles", "FileControlSource"]

CONTROL = "control"
APPROVALS = "approvals"
CANCEL = "cancel.json"
log = logging.getLogger("longrun")

MAX_APPROVAL_FILES = 1000
MAX_HELD_DIRECTORIES = 64
"""The task ``control`` directories a ``ControlFiles`` made with ``hold_directories`` keeps open."""

_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
"""A FIFO planted in place of a record must not hang the reader; it then fails the regular-file check."""


def _close_held(io: FileIO, held: dict[str, int]) -> None:
    for fd in held.values():
        with contextlib.suppress(OSError):  # our own descriptor, at collection: nothing to lose
            io.close(fd)
    held.clear()


class _Refused(Exception):
    """Internal: a component of the control area failed a check; becomes a refused or unreadable record."""


class ControlFiles:
    """Reads and writes the control records under ``root`` (see the module docstring).

    ``strict`` turns on the owner and mode checks, against ``approver_uid`` (None: the root's
    owner). ``dir_mode`` and ``file_mode`` are the modes of what a write creates.

    ``hold_directories`` (not with ``strict``, whose checks are made on every read): a task's
    ``control`` directory, once walked to, stays open (``MAX_HELD_DIRECTORIES`` tasks, least
    recently read closed first), and its cancellation is read through it, one ``openat`` when
    there is none instead of eight calls. A record written into that directory is read fresh as
    before; a ``control`` directory replaced by another one is not seen until ``close``. A store
    uses it for the cancellation read before every effect; ``close`` closes what it holds.
    """

    def __init__(
        self,
        root: str,
        *,
        io: FileIO,
        strict: bool = False,
        approver_uid: int | None = None,
        dir_mode: int = 0o700,
        file_mode: int = 0o600,
        hold_directories: bool = False,
    ):
        if strict and hold_directories:
            raise InvalidInputError("hold_directories is refused in strict mode: its checks are made on every read")
        self.root = root
        self.io = io
        self.strict = strict
        self.approver_uid = approver_uid
        self.dir_mode = dir_mode
        self.file_mode = file_mode
        self.hold_directories = hold_directories
        self._held: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._held_lock = threading.Lock()
        """Guards ``_held``; held while a read uses a held descriptor, so none is closed under it."""
        weakref.finalize(self, _close_held, io, self._held)  # an object dropped without ``close``

    def holds(self, task_id: str) -> bool:
        """Whether the task's ``control`` directory is held open (see ``hold_directories``)."""
        return task_id in self._held

    def forget(self, task_id: str) -> None:
        """Close the task's held ``control`` directory, if held (the task was deleted: a task made
        again under its id has a directory of its own)."""
        with self._held_lock:
            fd = self._held.pop(task_id, None)
        if fd is not None:
            self.io.close(fd)

    def close(self) -> None:
        """Close the directories held open; the object stays usable."""
        with self._held_lock:
            held = list(self._held.values())
            self._held.clear()
        for fd in held:
            self.io.close(fd)

    # -- reading ------------------------------------------------------------------------------

    def read_cancellation(self, task_id: str) -> ControlRecord | None:
        check_task_id(task_id)
        label = f"{task_id}/{CONTROL}/{CANCEL}"
        if self.hold_directories:
            with self._held_lock:
                held = self._held.get(task_id)
                if held is not None:
                    self._held.move_to_end(task_id)
                    return self._read(held, CANCEL, label, CANCEL, -1)
        try:
            with self._walk(task_id, (CONTROL,), hold=self.hold_directories) as (directory, approver):
                if directory is None:
                    return None
                return self._read(directory, CANCEL, label, CANCEL, approver)
        except _Refused as exc:
            return self._refusal(CANCEL, str(exc))

    def read_approvals(self, task_id: str) -> tuple[ControlRecord, ...]:
        check_task_id(task_id)
        try:
            with self._walk(task_id, (CONTROL, APPROVALS)) as (directory, approver):
                if directory is None:
                    return ()
                try:
                    names = sorted(n for n in self.io.listdir_at(directory) if n.endswith(".json") and TEMP_MARK not in n)
                except OSError as exc:
                    raise StorageError(f"cannot list the approvals of {task_id!r} in {self.root}: {exc}") from exc
                if len(names) > MAX_APPROVAL_FILES:
                    raise StorageError(f"task {task_id!r} has {len(names)} approval files, over the limit of {MAX_APPROVAL_FILES}")
                records = []
                for name in names:
                    record = self._read(directory, name, f"{task_id}/{CONTROL}/{APPROVALS}/{name}", f"{APPROVALS}/{name}", approver)
                    if record is not None:
                        records.append(record)
                return tuple(records)
        except _Refused as exc:
            return (self._refusal(f"{APPROVALS}/", f"{exc}; no approval in it counts"),)

    def _refusal(self, record_name: str, reason: str) -> ControlRecord:
        # Strict mode vouches for the area, so what fails its checks is refused; otherwise nobody
        # vouches for anything, and an odd entry is merely unreadable.
        if self.strict:
            return RefusedRecord(name=record_name, error=reason)
        return ControlRecord(name=record_name, error=f"unreadable: {reason}")

    def _check(self, info: os.stat_result, label: str, approver: int) -> None:
        if not self.strict:
            return
        if info.st_uid not in (approver, 0):
            raise _Refused(f"{label} is owned by uid {info.st_uid}, not by the approver (uid {approver}) or root")
        writable = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if info.st_mode & bit]
        if writable:
            raise _Refused(f"{label} is writable by {' and '.join(writable)} (mode {stat.S_IMODE(info.st_mode):04o})")

    def _approver(self, root: int, label: str) -> int:
        """The approver's uid, after checking the root (strict mode only; -1 otherwise)."""
        if not self.strict:
            return -1
        info = self.io.fstat(root)
        approver = self.approver_uid
        if approver is None:
            approver = info.st_uid
            if approver != 0 and approver == os.geteuid():
                raise _Refused(
                    f"{label} is owned by this runner's own account (uid {approver}), which would let the runner "
                    "approve itself; give the control root to the approver account or pass approver_uid"
                )
        self._check(info, label, approver)
        return approver

    def _is_symlink(self, name: str, dir_fd: int | None) -> bool:
        try:
            return stat.S_ISLNK(self.io.lstat(name, dir_fd=dir_fd).st_mode)
        except OSError:
            return False

    def _open_dir(self, name: str, parent: int | None, label: str, *, follow: bool = False) -> int | None:
        try:
            return self.io.open_at(parent, name, os.O_RDONLY | _DIRECTORY, follow=follow)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if self._is_symlink(name, parent):
                raise _Refused(f"{label} is a symbolic link (symbolic links are refused)") from None
            if exc.errno == errno.ENOTDIR:
                raise _Refused(f"{label} is not a directory") from None
            raise StorageError(f"cannot open {label}: {exc}") from exc

    @contextlib.contextmanager
    def _walk(self, task_id: str, below: tuple[str, ...], *, hold: bool = False) -> Generator[tuple[int | None, int], None, None]:
        """Open (and in strict mode check) the root, the task directory and ``below``; yields the
        last directory's descriptor (None if one is missing) and the approver's uid. With ``hold``,
        that last directory, when reached, is kept open for the task (``hold_directories``)."""
        opened: list[int] = []
        try:
            label = f"the control root {self.root}"
            root = self._open_dir(self.root, None, label, follow=not self.strict)
            if root is None:
                raise _Refused(f"{label} does not exist")
            opened.append(root)
            approver = self._approver(root, label)
            path = task_id
            directory: int | None = root
            for name in (task_id, *below):
                if name != task_id:
                    path = f"{path}/{name}"
                assert directory is not None
                directory = self._open_dir(name, directory, f"directory {path}")
                if directory is None:
                    break
                opened.append(directory)
                if self.strict:
                    self._check(self.io.fstat(directory), f"directory {path}", approver)
            yield directory, approver
            if hold and directory is not None and len(opened) == len(below) + 2:
                self._hold(task_id, opened.pop())
        finally:
            for fd in reversed(opened):
                self.io.close(fd)

    def _hold(self, task_id: str, fd: int) -> None:
        closing = []
        with self._held_lock:
            if task_id in self._held:
                closing.append(fd)  # another thread held it first
            else:
                self._held[task_id] = fd
                while len(self._held) > MAX_HELD_DIRECTORIES:
                    closing.append(self._held.popitem(last=False)[1])
        for old in closing:
            self.io.close(old)

    def _read(self, directory: int, name: str, label: str, record_name: str, approver: int) -> ControlRecord | None:
        try:
            fd = self.io.open_at(directory, name, os.O_RDONLY | _NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if self._is_symlink(name, directory):
                return self._refusal(record_name, f"{label} is a symbolic link (symbolic links are refused)")
            return ControlRecord(name=record_name, error=f"unreadable: {exc}")
        try:
            info = self.io.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return self._refusal(record_name, f"{label} is not a regular file")
            try:
                self._check(info, label, approver)
            except _Refused as exc:
                return RefusedRecord(name=record_name, error=str(exc))
            if info.st_size > MAX_RECORD_BYTES:
                return ControlRecord(name=record_name, error=f"unreadable: {label} is {info.st_size} bytes, over the {MAX_RECORD_BYTES}-byte limit")
            data = read_upto(self.io, fd, MAX_RECORD_BYTES + 1)
        except OSError as exc:
            return ControlRecord(name=record_name, error=f"unreadable: {exc}")
        finally:
            self.io.close(fd)
        if len(data) > MAX_RECORD_BYTES:
            digest = "sha256:" + sha256_hex(data)
            return ControlRecord(name=record_name, error=f"unreadable: {label} grew over the {MAX_RECORD_BYTES}-byte limit while read", digest=digest)
        return parse_control_record(record_name, data)

    # -- writing ------------------------------------------------------------------------------

    def write_approval(self, approval: Approval) -> str:
        """Write ``approval``; return the file's path."""
        name = check_task_id(approval.approval_id, what="approval id") + ".json"
        return self._write(approval.task_id, (CONTROL, APPROVALS), name, canonical_bytes(approval.to_json()))

    def write_cancellation(self, record: Cancellation) -> str:
        """Write ``record`` (replacing an earlier one); return the file's path."""
        return self._write(record.task_id, (CONTROL,), CANCEL, canonical_bytes(record.to_json()))

    def _write(self, task_id: str, below: tuple[str, ...], name: str, data: bytes) -> str:
        directory = os.path.join(self.root, check_task_id(task_id))
        path = os.path.join(directory, *below, name)
        try:
            root = self.io.lstat(self.root) if self.strict else self.io.stat(self.root)
            if not stat.S_ISDIR(root.st_mode):
                raise OSError(errno.ENOTDIR, "is not a directory", self.root)
            ensure_dir(self.io, directory, self.dir_mode)
            for part in below:  # each level checked: a linked ``control`` must not lead out
                directory = os.path.join(directory, part)
                ensure_dir(self.io, directory, self.dir_mode)
            write_atomic(self.io, directory, name, data, mode=self.file_mode)
        except LongrunError:
            raise
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc}") from exc
        self._signal()
        return path

    def _signal(self) -> None:
        """Touch the root's times, so that a worker watching only the root (one ``stat`` per look)
        sees that a record arrived. A root this account may not touch is only noted: the record is
        written, and the worker's slower sweep of the task directories finds it."""
        try:
            self.io.utime(self.root)
        except OSError as exc:
            log.debug("control root %s: its times could not be touched (%s); workers find the record on their next sweep", self.root, exc)


class FileControlSource:
    """Approvals and cancellations read from files under ``control_root``, in a store's layout::

        <control_root>/<task id>/control/cancel.json
        <control_root>/<task id>/control/approvals/<approval id>.json

    An ``ApprovalSource`` and a ``CancellationSource`` (``longrun.protocols``), read through
    ``ControlFiles`` (see the module docstring for the walk, the limits and what comes back).

    ``control_root`` may be a ``JsonFileStore`` root, but for strict mode to mean anything it is
    usually a separate directory that the approver account owns, because the runner's account
    owns every task directory of its store. ``longrun approve|cancel --control-root DIR`` writes
    there (directories 0755, files 0644: the runner reads, only the approver writes). This is the
    one place longrun creates anything but owner-only (0700/0600): the control area belongs to
    another account than the runner's, which must be able to read it, and strict mode's checks are
    about who can *write* (group and others never can), not who can read; a record holds no secret.

    Strict mode (the default) refuses a record unless the file, ``control/approvals``,
    ``control``, the task directory and the control root are each owned by ``approver_uid`` or
    root (uid 0), writable by neither group nor others, and not symbolic links; the file must be a
    regular file. ``approver_uid=None`` means the owner of the control root, read on every call;
    since that default would let the runner's own account approve itself, a control root owned
    by this process's own (non-root) account is then refused as a whole. Pass ``approver_uid``
    explicitly to accept that deliberately. A refused file comes back as a ``RefusedRecord``; a
    refused directory refuses everything in it. A missing control root is refused the same way: a
    mistyped path must not hide an operator's cancellation.

    Not strict: no owner or mode checks, and what fails a check is merely unreadable; symbolic
    links below the root are refused all the same, as in the stores. ``io`` is the ``FileIO`` every
    call goes through.
    """

    def __init__(
        self, control_root: str | os.PathLike[str], *, strict: bool = True, approver_uid: int | None = None, io: FileIO | None = None
    ):
        if approver_uid is not None and (isinstance(approver_uid, bool) or not isinstance(approver_uid, int) or approver_uid < 0):
            raise InvalidInputError(f"approver_uid must be a non-negative integer uid, got {approver_uid!r}")
        root = os.fspath(control_root)
        if not isinstance(root, str) or not root or "\0" in root:
            raise InvalidInputError(f"control root {root!r:.80} is not a usable path")
        self.control_root = os.path.abspath(root)
        self.strict = bool(strict)
        self.approver_uid = approver_uid
        self._files = ControlFiles(
            self.control_root, io=io if io is not None else FileIO(), strict=self.strict, approver_uid=approver_uid,
            dir_mode=0o755, file_mode=0o644,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"FileControlSource({self.control_root!r}, strict={self.strict}, approver_uid={self.approver_uid})"

    def read_approvals(self, task_id: str) -> tuple[ControlRecord, ...]:
        return self._files.read_approvals(task_id)

    def read_cancellation(self, task_id: str) -> ControlRecord | None:
        return self._files.read_cancellation(task_id)

    def watch_roots(self) -> tuple[str, ...]:
        """The control root, which a worker watches for new records (``protocols.WatchedSource``)."""
        return (self.control_root,)

    def write_approval(self, approval: Approval) -> str:
        """Write ``approval`` as the calling account; return the file's path. The root must exist."""
        return self._files.write_approval(approval)

    def write_cancellation(self, record: Cancellation) -> str:
        """Write ``record`` as the calling account; return the file's path. The root must exist."""
        return self._files.write_cancellation(record)
