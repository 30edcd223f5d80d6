"""The local JSON-file store: one directory per task, for one machine.

Layout under ``root`` (directories 0700, files 0600)::

    <task id>/
        state.json          the current envelope (see ``longrun.envelope``)
        state.json.bak      the previous committed envelope, a hard link kept by each commit
        lease.json          owner, epoch, expiry; never deleted, so epochs never restart
        lock                flock(2) target: every read-modify-write of the task runs under it
        control/cancel.json
        control/approvals/<approval id>.json
        quarantine/         damaged files, moved aside with a timestamp, never deleted

Guarantees: a commit is one ``write_atomic`` (temp file, fsync, link backup, replace, fsync the
directory) made under the task's lock after the fencing check, so processes on one machine are
serialized and a stale epoch never lands. Load prefers ``state.json``; if it is damaged it is
quarantined and the run continues from the validated backup with every unverified effect
observed before it is applied; if both are damaged the load raises ``StateUnrecoverableError``.

Not guaranteed: exclusion across machines (flock on a network file system is not trustworthy;
use a database store), or protection from a user who edits the files with the right permissions.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from typing import Collection, Iterator

from ..approval import Approval
from ..cancellation import Cancellation
from ..canonical import canonical_bytes, sha256_hex
from ..contract import check_task_id
from ..control import ControlRecord
from ..envelope import MAX_STATE_BYTES, RunState, decode, encode
from ..errors import (
    CorruptStateError,
    ForeignStateError,
    LongrunError,
    SchemaVersionError,
    StateUnrecoverableError,
    StorageError,
    UnknownTaskError,
)
from ..lease import Lease
from ..outcome import Evidence
from ..protocols import LoadResult
from ._fileio import TEMP_MARK, FileIO, ensure_dir, read_file, write_atomic
from .base import BaseStore

__all__ = ["JsonFileStore"]

STATE = "state.json"
BACKUP = "state.json.bak"
LEASE = "lease.json"
LOCK = "lock"
CONTROL = "control"
APPROVALS = "approvals"
CANCEL = "cancel.json"
QUARANTINE = "quarantine"
MAX_RECORD_BYTES = 64 * 1024
MAX_APPROVAL_FILES = 1000


class JsonFileStore(BaseStore):
    def __init__(self, root: str | os.PathLike[str], *, io: FileIO | None = None):
        super().__init__()
        self.root = os.path.abspath(os.fspath(root))
        self.io = io if io is not None else FileIO()

    def __repr__(self) -> str:
        return f"JsonFileStore({self.root!r})"

    # -- paths --------------------------------------------------------------------------------

    def task_dir(self, task_id: str) -> str:
        return os.path.join(self.root, check_task_id(task_id))

    def _exists(self, task_id: str) -> bool:
        try:
            info = os.lstat(self.task_dir(task_id))
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise StorageError(f"{self.task_dir(task_id)} is not a plain directory (symlinks are refused)")
        return True

    # -- transaction: flock on the task's lock file -------------------------------------------

    @contextlib.contextmanager
    def _transaction(self, task_id: str, *, create: bool, write: bool = True) -> Iterator[None]:
        directory = self.task_dir(task_id)
        try:
            if create:
                ensure_dir(self.io, self.root)
                ensure_dir(self.io, directory)
                ensure_dir(self.io, os.path.join(directory, CONTROL))
                ensure_dir(self.io, os.path.join(directory, CONTROL, APPROVALS))
                ensure_dir(self.io, os.path.join(directory, QUARANTINE))
            elif not self._exists(task_id):
                raise UnknownTaskError(f"no task {task_id!r} in {self.root}")
            lock_path = os.path.join(directory, LOCK)
            try:
                # Readers take a shared lock through a read-only descriptor, so an operator's
                # `status` works on a store it cannot write and never creates files.
                fd = self.io.open(lock_path, os.O_RDWR | os.O_CREAT if write else os.O_RDONLY, 0o600)
            except FileNotFoundError:
                fd = -1  # a reader of a task whose lock file is gone: there is no writer to exclude
        except LongrunError:
            raise
        except OSError as exc:
            raise StorageError(f"cannot open task {task_id!r} in {self.root}: {exc}") from exc
        try:
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
            try:
                yield
            except LongrunError:
                raise
            except OSError as exc:
                raise StorageError(f"task {task_id!r}: {exc}") from exc
        finally:
            if fd >= 0:
                os.close(fd)  # closing the descriptor releases the flock

    # -- lease --------------------------------------------------------------------------------

    def _get_lease(self, task_id: str) -> Lease | None:
        data = read_file(self.io, os.path.join(self.task_dir(task_id), LEASE), MAX_RECORD_BYTES)
        if data is None:
            return None
        try:
            lease = Lease.from_json(json.loads(data))
        except (ValueError, RecursionError) as exc:
            raise CorruptStateError(f"lease record of {task_id!r} is damaged: {exc}") from exc
        if lease.task_id != task_id:
            raise ForeignStateError(f"lease record in {task_id!r} names task {lease.task_id!r}")
        return lease

    def _put_lease(self, lease: Lease) -> None:
        write_atomic(self.io, self.task_dir(lease.task_id), LEASE, canonical_bytes(lease.to_json()))

    def _epoch_floor(self, task_id: str) -> int:
        state = self._get_state(task_id, repair=False).state
        return state.lease_epoch if state is not None else 0

    # -- state --------------------------------------------------------------------------------

    def _read_envelope(self, task_id: str, name: str) -> tuple[RunState | None, bytes | None, CorruptStateError | None]:
        data = read_file(self.io, os.path.join(self.task_dir(task_id), name), MAX_STATE_BYTES)
        if data is None:
            return None, None, None
        try:
            return decode(data, expected_task=task_id), data, None
        except (ForeignStateError, SchemaVersionError):
            raise  # well-formed but not ours to repair: refuse, move nothing
        except CorruptStateError as exc:
            return None, data, exc

    def _quarantine(self, task_id: str, name: str, reason: str) -> str:
        directory = self.task_dir(task_id)
        target_name = f"{name}.{time.time_ns()}.{reason}"
        self.io.replace(os.path.join(directory, name), os.path.join(directory, QUARANTINE, target_name))
        self.io.fsync_dir(os.path.join(directory, QUARANTINE))
        self.io.fsync_dir(directory)
        return os.path.join(QUARANTINE, target_name)

    def _quarantined_states(self, task_id: str) -> list[str]:
        try:
            names = os.listdir(os.path.join(self.task_dir(task_id), QUARANTINE))
        except FileNotFoundError:
            return []
        return sorted(name for name in names if name.startswith(STATE))

    def _sweep_temporaries(self, task_id: str) -> None:
        directory = self.task_dir(task_id)
        for name in os.listdir(directory):
            if TEMP_MARK in name:
                self.io.unlink(os.path.join(directory, name))

    def _get_state(self, task_id: str, *, repair: bool) -> LoadResult:
        if not self._exists(task_id):
            return LoadResult(state=None)
        if repair:
            self._sweep_temporaries(task_id)
        primary, primary_bytes, primary_error = self._read_envelope(task_id, STATE)
        backup, backup_bytes, backup_error = self._read_envelope(task_id, BACKUP)
        now = time.time()
        notes: list[Evidence] = []
        moved: list[str] = []

        def set_aside(name: str, reason: str, why: str) -> None:
            notes.append(Evidence("store", f"{name} {why}", now))
            if repair:
                moved.append(self._quarantine(task_id, name, reason))
                notes.append(Evidence("store", f"{name} quarantined to {moved[-1]}", now))

        if primary is not None:
            if backup is not None and backup.revision >= primary.revision:
                # The backup is always an older revision; a newer one means state.json was rolled back.
                set_aside(STATE, "rolled-back", f"(revision {primary.revision}) is older than its backup (revision {backup.revision})")
                return self._from_backup(task_id, backup, backup_bytes, notes, moved, floor=backup.revision + 1)
            if backup_error is not None:
                set_aside(BACKUP, "damaged", f"is damaged: {backup_error}")
            assert primary_bytes is not None
            notes.append(Evidence("store", f"{STATE} revision {primary.revision} validated", now))
            return LoadResult(
                state=primary,
                source="primary",
                digest="sha256:" + sha256_hex(primary_bytes),
                observations=tuple(notes),
                quarantined=tuple(moved),
                revision_floor=primary.revision,
            )
        if primary_error is not None:
            set_aside(STATE, "damaged", f"is damaged: {primary_error}")
        elif backup is None and backup_error is None:
            quarantined = self._quarantined_states(task_id)
            if quarantined:
                # Damaged state was set aside earlier and nothing valid replaced it: starting afresh
                # here would repeat every effect the lost state recorded.
                raise StateUnrecoverableError(
                    f"task {task_id!r} has no valid state but its quarantine holds {quarantined}; "
                    "restore a validated state.json or retire the task id"
                )
            return LoadResult(state=None, observations=tuple(notes))
        else:
            notes.append(Evidence("store", f"{STATE} is missing but a backup exists", now))
        if backup is None:
            if backup_error is not None:
                set_aside(BACKUP, "damaged", f"is damaged: {backup_error}")
            raise StateUnrecoverableError(
                f"task {task_id!r}: neither {STATE} nor {BACKUP} validates; damaged files "
                + ("were quarantined" if repair else "were left in place (read-only load)")
            )
        # The damaged primary was at most one revision past the backup; skip that revision number.
        return self._from_backup(task_id, backup, backup_bytes, notes, moved, floor=backup.revision + 1)

    def _from_backup(
        self, task_id: str, backup: RunState, data: bytes | None, notes: list[Evidence], moved: list[str], *, floor: int
    ) -> LoadResult:
        backup.reconcile_all = True
        notes.append(
            Evidence("store", f"recovered from {BACKUP} revision {backup.revision}; every unverified step will be observed first", time.time())
        )
        return LoadResult(
            state=backup,
            source="backup",
            digest="sha256:" + sha256_hex(data or b""),
            observations=tuple(notes),
            quarantined=tuple(moved),
            revision_floor=floor,
        )

    def _put_state(self, state: RunState, changed: Collection[str]) -> None:
        write_atomic(self.io, self.task_dir(state.task_id), STATE, encode(state), backup=BACKUP)

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
            return ControlRecord(name=name, body=json.loads(data), digest=digest)
        except (ValueError, RecursionError) as exc:
            return ControlRecord(name=name, error=f"not valid JSON: {exc}", digest=digest)

    def read_cancellation(self, task_id: str) -> ControlRecord | None:
        if not self._exists(task_id):
            raise UnknownTaskError(f"no task {task_id!r} in {self.root}")
        return self._read_control(os.path.join(self.task_dir(task_id), CONTROL, CANCEL), CANCEL)

    def write_cancellation(self, record: Cancellation) -> None:
        self._write_control(record.task_id, os.path.join(CONTROL), CANCEL, record.to_json())

    def read_approvals(self, task_id: str) -> tuple[ControlRecord, ...]:
        if not self._exists(task_id):
            raise UnknownTaskError(f"no task {task_id!r} in {self.root}")
        directory = os.path.join(self.task_dir(task_id), CONTROL, APPROVALS)
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

    def _write_control(self, task_id: str, subdir: str, name: str, body: object) -> None:
        if not self._exists(task_id):
            raise UnknownTaskError(f"no task {task_id!r} in {self.root}")
        directory = os.path.join(self.task_dir(task_id), subdir)
        try:
            ensure_dir(self.io, directory)
            write_atomic(self.io, directory, name, canonical_bytes(body))
        except OSError as exc:
            if isinstance(exc, LongrunError):
                raise
            raise StorageError(f"cannot write {subdir}/{name} for {task_id!r}: {exc}") from exc

    # -- listing ------------------------------------------------------------------------------

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
