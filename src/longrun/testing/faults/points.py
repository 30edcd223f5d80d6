"""The named crash points: the moments a runner process can be SIGKILLed at, and the I/O that names them.

Every file operation of ``JsonFileStore`` goes through its ``FileIO`` object, so ``CrashPointIO``
(a ``FileIO``) names the moments of the write protocols and lets a process SIGKILL itself at one of
them. The engine and the lease code call ``longrun._crashpoints.hit(name)`` at the moments that are
not file operations; that costs one attribute lookup unless the process was started with
``LONGRUN_CRASH_AT`` (``name:N``: SIGKILL at the N-th time the point is reached) or
``LONGRUN_CRASH_TRACE`` (a file each point reached is appended to; ``read_trace`` reads it).

Named crash points (``POINTS``), and the moments they stand for:

==========================  ========================================================================
point                       the moment (the process is SIGKILLed right after it, unless "half")
==========================  ========================================================================
snapshot.temp-opened        a snapshot's temporary file was created (first commit, compaction)
snapshot.temp-half-written  half of the snapshot's bytes are in the temporary file
snapshot.temp-written       all of them are
snapshot.temp-fsynced       the temporary file was fsynced
snapshot.backup-linked      the current snapshot was hard-linked to ``state.json.bak``
snapshot.replaced           the temporary file was renamed onto ``state.json``
snapshot.dir-fsynced        the task directory was fsynced after that rename
new-journal.*               the same six (no backup) for the journal a compaction creates
lease.temp-* ... lease.dir-fsynced   the same six for ``lease.json`` (every acquire, renew, release)
journal.half-written        half of a commit's line is in the journal ("backup/journal written")
journal.written             the whole line is, not yet flushed
journal.synced              ``fdatasync`` returned: the commit is durable
lease.acquired              ``acquire_lease`` returned (epoch issued and written)
lease.renewed               ``renew_lease`` returned
recovery.loaded             the runner loaded the state under its new lease
cancellation.read           the runner read the cancellation record (before every new effect)
approval.consumed           an approval matched and was recorded as consumed (in memory)
attempt.incremented         an effect's attempt counter went up (in memory, not yet durable)
effect.intent-persisted     ``started`` (with the attempt) is durable; the adapter is not yet called
effect.applied              the adapter returned: the effect happened, nothing recorded yet
state.committed             a runner commit returned ("result persisted": an effect's
                            verification is committed with the next start, or with the stop)
call.started                a durable function's call: its attempt is durable, the function not
                            yet called (durable face only)
call.returned               the call returned; its value is in memory, committed with the next
                            step's start or the stop (durable face only)
==========================  ========================================================================

``TALK_POINTS``, reached only by a task that sends, receives or publishes (not in ``POINTS``):
``message.sent`` (the receiver's store holds the message, the send's record is in memory),
``message.imported`` (a message from outside is in the receiver's mailbox, its control record's
consumption and the receive not yet committed),
``message.received`` (the message a receive took is recorded in memory, not yet committed) and
``event.set`` (an event's record is in memory, just before its commit).

``index.before_write`` (not in ``POINTS``): a JSON-file store's commit is durable, the task's
summary row not yet written (``stores.jsonfile._index``).

``deadline.children``, reached only by a durable task that stops ``deadline-exceeded``: its stop
is committed, its unfinished children not yet cancelled (running the task again cancels them).

``BLOB_POINTS``, reached only by a task with a payload or result of 64 KiB or more (a blob, see
``longrun.stores.blobs``; not in ``POINTS``, which every task reaches): ``blob.temp-opened``,
``blob.temp-half-written``, ``blob.temp-written``, ``blob.temp-fsynced`` (its ``fdatasync``),
``blob.replaced`` (renamed to its digest) and ``blob.dir-fsynced`` (the ``blobs`` directory synced:
the blob is durable, the journal line that names it not yet written).
"""

from __future__ import annotations

import os

from ... import _crashpoints
from ...stores import TEMP_MARK, FileIO

__all__ = ["BLOB_POINTS", "CALL_POINTS", "POINTS", "TALK_POINTS", "WRITE_STAGES", "CrashPointIO", "file_kind", "points_for", "read_trace"]

WRITE_STAGES = ("temp-opened", "temp-half-written", "temp-written", "temp-fsynced", "replaced", "dir-fsynced")
POINTS: tuple[str, ...] = (
    *(f"snapshot.{stage}" for stage in WRITE_STAGES),
    "snapshot.backup-linked",
    *(f"new-journal.{stage}" for stage in WRITE_STAGES),
    *(f"lease.{stage}" for stage in WRITE_STAGES),
    "journal.half-written",
    "journal.written",
    "journal.synced",
    "lease.acquired",
    "lease.renewed",
    "recovery.loaded",
    "cancellation.read",
    "approval.consumed",
    "attempt.incremented",
    "effect.intent-persisted",
    "effect.applied",
    "state.committed",
    "call.started",
    "call.returned",
)
BLOB_POINTS = tuple(f"blob.{stage}" for stage in WRITE_STAGES)
TALK_POINTS = ("message.sent", "message.imported", "message.received", "event.set")
"""The moments of a blob's write (``stores.blobs``): only a task with a large value reaches them."""
CALL_POINTS = frozenset(("call.started", "call.returned"))
"""Points only a durable function reaches (a declared plan has no calls)."""


def points_for(face: str) -> tuple[str, ...]:
    """The named points a task reaches under ``face`` (``runner`` or ``durable``)."""
    return POINTS if face == "durable" else tuple(point for point in POINTS if point not in CALL_POINTS)


def file_kind(name: str, directory: str = "") -> str | None:
    """Which write protocol a file name belongs to (for the crash point names); a file in a
    ``blobs`` directory is a blob."""
    if os.path.basename(directory.rstrip(os.sep)) == "blobs":
        return "blob"
    if name.startswith("state.json.bak"):
        return "backup"
    if name.startswith("state.json"):
        return "snapshot"
    if name.startswith("lease.json"):
        return "lease"
    if name.startswith("journal."):
        return "new-journal" if TEMP_MARK in name else "journal"
    return None


class CrashPointIO(FileIO):
    """Names the moments of the file write protocols as crash points (see ``POINTS``).

    ``write`` and ``pwrite`` land in two halves with the "half-written" point between them, so a
    SIGKILL there leaves exactly half the bytes written."""

    def __init__(self) -> None:
        self._kinds: dict[int, str] = {}
        self._last_replaced: dict[str, str] = {}

    @staticmethod
    def _hit(name: str) -> None:
        if _crashpoints.ARMED:
            _crashpoints.hit(name)

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        fd = super().open(path, flags, mode)
        kind = file_kind(os.path.basename(path), os.path.dirname(path))
        if kind is not None and (TEMP_MARK in path or kind == "journal"):
            self._kinds[fd] = kind
            if TEMP_MARK in path and kind != "backup":
                self._hit(f"{kind}.temp-opened")
        return fd

    def close(self, fd: int) -> None:
        self._kinds.pop(fd, None)
        super().close(fd)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        kind = self._kinds.get(fd)
        if kind is None or len(data) < 2:
            return super().write(fd, data)
        half = len(data) // 2
        written = super().write(fd, data[:half])
        if written < half:
            return written
        self._hit(f"{kind}.temp-half-written")
        written += super().write(fd, data[half:])
        self._hit(f"{kind}.temp-written")
        return written

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        if self._kinds.get(fd) != "journal" or len(data) < 2:
            return super().pwrite(fd, data, offset)
        half = len(data) // 2
        written = super().pwrite(fd, data[:half], offset)
        if written < half:
            return written
        self._hit("journal.half-written")
        written += super().pwrite(fd, data[half:], offset + half)
        self._hit("journal.written")
        return written

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        kind = self._kinds.get(fd)
        if kind is not None and kind != "journal":
            self._hit(f"{kind}.temp-fsynced")

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        kind = self._kinds.get(fd)
        if kind == "journal":
            self._hit("journal.synced")
        elif kind == "blob":
            self._hit("blob.temp-fsynced")

    def replace(self, source: str, destination: str) -> None:
        super().replace(source, destination)
        kind = file_kind(os.path.basename(source), os.path.dirname(source))
        if kind == "backup":
            self._hit("snapshot.backup-linked")
        elif kind is not None and TEMP_MARK in source:
            self._last_replaced[os.path.dirname(destination)] = kind
            self._hit(f"{kind}.replaced")

    def fsync_dir(self, path: str) -> None:
        super().fsync_dir(path)
        kind = self._last_replaced.pop(path.rstrip(os.sep), None)
        if kind is not None:
            self._hit(f"{kind}.dir-fsynced")


def read_trace(path: str) -> list[tuple[str, int, str]]:
    """A crash-point trace: (point, occurrence, detail) per line; a line cut by the kill is skipped."""
    try:
        with open(path) as handle:
            text = handle.read()
    except FileNotFoundError:
        return []
    out = []
    for line in text.split("\n")[:-1]:
        parts = line.split(" ", 2)
        if len(parts) >= 2 and parts[1].isdigit():
            out.append((parts[0], int(parts[1]), parts[2] if len(parts) > 2 else ""))
    return out
