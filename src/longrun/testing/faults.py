"""The crash-consistency and fault-injection suite: break longrun's promises on purpose, count what broke.

Run it with ``python -m longrun.testing.faults --report`` (from a checkout: ``PYTHONPATH=src``). It
prints one line per group: cases run, faults injected, duplicated effects, verified effects lost,
silent resets (the last three must be zero). ``--quick`` runs the smaller counts the unit tests use;
``--group N`` runs one group. The unit tests (``tests/test_faults_*.py``) run each group at the quick
scale and assert every figure; ``LONGRUN_FAULTS_FULL=1`` makes them run the full counts.

Two faces. The groups that drive the engine (1, 2, 6, 7, 8, 9) run once per face, one line each:
``runner``, the task as a declared plan (``Runner``), and ``durable``, the same task as a durable
function (``fault_function``: per step, ``run.call`` of a deterministic computation that logs each
invocation to an ``O_APPEND`` file, then ``run.effect`` of the same outbox write with the call's
value in its payload). ``--face`` picks one. For the durable face the checks add: every call's
recorded result is replayed, never recomputed once its record is committed (a call runs again
only if the process died between its start and the commit that records its value, so invocations
<= calls + kills), and the function's return value is recorded when the task is done.

The seam. Every file operation of ``JsonFileStore`` goes through its ``FileIO`` object
(``stores._fileio``), so the file-level faults here are ``FileIO`` subclasses and need nothing
from the library: ``FaultyIO`` fails the N-th call (or every call from the N-th) with a chosen
errno; ``CrashPointIO`` names the moments of the write protocols and lets a child process SIGKILL
itself at one of them; ``RecordingIO`` records what reached the disk for the power-loss model
(``_powerloss``). The runner and the lease code call ``longrun._crashpoints.hit(name)`` at the
moments that are not file operations; that costs one attribute lookup unless the process was
started with ``LONGRUN_CRASH_AT`` or ``LONGRUN_CRASH_TRACE``.

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

Not covered: faults in the database stores' own storage (SQLite and PostgreSQL have their own
suites), and power loss on a real machine (the model in ``_powerloss`` stands in for it).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno as errno_module
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from .. import _crashpoints
from ..stores._fileio import TEMP_MARK, FileIO

if TYPE_CHECKING:
    from ..functions import DurableFunction, Run

__all__ = ["CrashPointIO", "FaultyIO", "GroupResult", "POINTS", "main", "run_groups"]

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
CALL_POINTS = frozenset(("call.started", "call.returned"))
"""Points only a durable function reaches (a declared plan has no calls)."""
FACES = ("runner", "durable")
"""The faces a task runs under: a declared plan (``Runner``) or a durable function."""
FACED_GROUPS = frozenset((1, 2, 6, 7, 8, 9))
"""The groups that drive the engine, run once per face; the others test the store alone."""


def points_for(face: str) -> tuple[str, ...]:
    """The named points a task reaches under ``face``."""
    return POINTS if face == "durable" else tuple(point for point in POINTS if point not in CALL_POINTS)


def full_scale() -> bool:
    """Whether the unit tests run the full counts (``LONGRUN_FAULTS_FULL=1``)."""
    return os.environ.get("LONGRUN_FAULTS_FULL", "") not in ("", "0")


@dataclasses.dataclass
class GroupResult:
    """One group's figures. ``failures`` says what broke; the last three counters must stay zero."""

    group: int
    name: str
    face: str = ""
    """``runner`` or ``durable`` for a group run once per face; empty for the store groups."""
    cases: int = 0
    faults: int = 0
    duplicates: int = 0
    lost: int = 0
    resets: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def fail(self, message: str) -> None:
        if len(self.failures) < 50:
            self.failures.append(message)

    @property
    def ok(self) -> bool:
        return not self.failures and not self.duplicates and not self.lost and not self.resets

    @property
    def label(self) -> str:
        return f"{self.name} ({self.face})" if self.face else self.name

    def line(self) -> str:
        return (
            f"{self.group:>2}  {self.label:<34} {self.cases:>7} {self.faults:>8} {self.duplicates:>10} {self.lost:>8} "
            f"{self.resets:>7}  {'ok' if self.ok else 'FAILED'}"
        )


HEADER = f"{'#':>2}  {'group':<34} {'cases':>7} {'faults':>8} {'duplicates':>10} {'lost':>8} {'resets':>7}  result"


# -- the I/O seam -----------------------------------------------------------------------------


class FaultyIO(FileIO):
    """Fails the ``fail_at``-th I/O call (and, if ``persistent``, every later one) with ``OSError(error)``.

    Counts every operation that can fail on a real disk: open, read, pread, write, pwrite, fsync,
    fdatasync, truncate, replace, link, unlink, mkdir, listdir, the directory fsync, lstat, stat,
    fstat, chmod, fchmod and flock (``open_at`` and ``listdir_at`` count as open and listdir).
    ``kinds`` restricts counting to some of them. It also watches the rule a store must keep after a failed
    flush (SQLite's pager, and PostgreSQL's "fsyncgate"): a file whose fsync failed is never fsynced
    again and reported durable; ``synced_after_failure`` names any that was.
    """

    OPERATIONS = ("open", "read", "pread", "write", "pwrite", "fsync", "fdatasync", "truncate", "replace", "link",
                  "unlink", "mkdir", "listdir", "fsync_dir", "lstat", "stat", "fstat", "chmod", "fchmod", "flock")  # fmt: skip

    def __init__(self, fail_at: int = 0, error: int = errno_module.EIO, *, persistent: bool = False, kinds: Iterable[str] | None = None):
        self.fail_at = fail_at
        self.error = error
        self.persistent = persistent
        self.kinds = frozenset(kinds) if kinds is not None else None
        self.calls = 0
        self.injected = 0
        self.injected_operations: list[str] = []
        self.paths: dict[int, str] = {}
        self.failed_syncs: set[str] = set()
        self.synced_after_failure: list[str] = []

    def _tick(self, operation: str, target: str = "") -> None:
        if self.kinds is not None and operation not in self.kinds:
            return
        self.calls += 1
        if self.fail_at and (self.calls == self.fail_at or (self.persistent and self.calls > self.fail_at)):
            self.injected += 1
            self.injected_operations.append(operation)
            if operation in ("fsync", "fdatasync"):
                self.failed_syncs.add(target)
            raise OSError(self.error, f"injected {os.strerror(self.error)} at I/O call {self.calls} ({operation})", target)

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        self._tick("open", path)
        fd = super().open(path, flags, mode)
        self.paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        self.paths.pop(fd, None)
        super().close(fd)

    def read(self, fd: int, size: int) -> bytes:
        self._tick("read", self.paths.get(fd, ""))
        return super().read(fd, size)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self._tick("pread", self.paths.get(fd, ""))
        return super().pread(fd, size, offset)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self._tick("write", self.paths.get(fd, ""))
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        self._tick("pwrite", self.paths.get(fd, ""))
        return super().pwrite(fd, data, offset)

    def _sync(self, operation: str, fd: int, call: Callable[[int], None]) -> None:
        path = self.paths.get(fd, "")
        self._tick(operation, path)
        if path in self.failed_syncs:
            self.synced_after_failure.append(path)
        call(fd)

    def fsync(self, fd: int) -> None:
        self._sync("fsync", fd, super().fsync)

    def fdatasync(self, fd: int) -> None:
        self._sync("fdatasync", fd, super().fdatasync)

    def truncate(self, fd: int, length: int) -> None:
        self._tick("truncate", self.paths.get(fd, ""))
        super().truncate(fd, length)

    def replace(self, source: str, destination: str) -> None:
        self._tick("replace", destination)
        super().replace(source, destination)

    def link(self, source: str, destination: str) -> None:
        self._tick("link", destination)
        super().link(source, destination)

    def unlink(self, path: str) -> None:
        self._tick("unlink", path)
        super().unlink(path)

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        self._tick("mkdir", path)
        super().mkdir(path, mode)

    def listdir(self, path: str) -> list[str]:
        self._tick("listdir", path)
        return super().listdir(path)

    def fsync_dir(self, path: str) -> None:
        self._tick("fsync_dir", path)
        super().fsync_dir(path)

    def open_at(self, dir_fd: int | None, name: str, flags: int, mode: int = 0o600, *, follow: bool = False) -> int:
        path = name if dir_fd is None else os.path.join(self.paths.get(dir_fd, ""), name)
        self._tick("open", path)
        fd = super().open_at(dir_fd, name, flags, mode, follow=follow)
        self.paths[fd] = path
        return fd

    def listdir_at(self, dir_fd: int) -> list[str]:
        self._tick("listdir", self.paths.get(dir_fd, ""))
        return super().listdir_at(dir_fd)

    def lstat(self, path: str, *, dir_fd: int | None = None) -> os.stat_result:
        self._tick("lstat", path if dir_fd is None else os.path.join(self.paths.get(dir_fd, ""), path))
        return super().lstat(path, dir_fd=dir_fd)

    def stat(self, path: str) -> os.stat_result:
        self._tick("stat", path)
        return super().stat(path)

    def fstat(self, fd: int) -> os.stat_result:
        self._tick("fstat", self.paths.get(fd, ""))
        return super().fstat(fd)

    def chmod(self, path: str, mode: int) -> None:
        self._tick("chmod", path)
        super().chmod(path, mode)

    def fchmod(self, fd: int, mode: int) -> None:
        self._tick("fchmod", self.paths.get(fd, ""))
        super().fchmod(fd, mode)

    def flock(self, fd: int, operation: int) -> None:
        self._tick("flock", self.paths.get(fd, ""))
        super().flock(fd, operation)


def _kind(name: str) -> str | None:
    """Which write protocol a file name belongs to (for the crash point names)."""
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
    """Names the moments of the file write protocols as crash points (see the module docstring).

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
        kind = _kind(os.path.basename(path))
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
        if self._kinds.get(fd) == "journal":
            self._hit("journal.synced")

    def replace(self, source: str, destination: str) -> None:
        super().replace(source, destination)
        kind = _kind(os.path.basename(source))
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


# -- the child: a runner in its own process ----------------------------------------------------


GOAL = "a fault-injection task that writes numbered lines to an outbox"


def plan(task: str, steps: int, approvals: Sequence[int] = ()) -> tuple[Any, list[Any]]:
    from ..contract import RunContract, Step

    contract = RunContract(task, GOAL)
    return contract, [Step(f"step-{i:03d}", "write", {"n": i}, approval=i in approvals) for i in range(steps)]


# -- the same task as a durable function -------------------------------------------------------


def computed_value(n: int) -> int:
    """What the durable face's call ``call-NNN`` returns: deterministic, so a replay is checkable."""
    return (n * 7919 + 13) % 1009


call_pace: tuple[float, str] = (0.0, "")
"""Seconds each call of ``fault_computation`` takes, and a file it appends to first (set by a child)."""


def fault_computation(n: int, call_log: str) -> int:
    """The durable face's call: logs each invocation (one ``O_APPEND`` write, so it survives the
    SIGKILL that may follow) and returns ``computed_value(n)``."""
    fd = os.open(call_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, f"call-{n:03d} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    seconds, signal_path = call_pace
    if signal_path:
        with open(signal_path, "a") as handle:
            handle.write(f"call-{n:03d}\n")
    if seconds:
        time.sleep(seconds)
    return computed_value(n)


def step_payload(n: int, face: str) -> dict[str, int]:
    """The payload of effect ``step-NNN``: the durable face writes the call's value with it."""
    return {"n": n, "computed": computed_value(n)} if face == "durable" else {"n": n}


def fault_function(run: "Run", steps: int, approvals: list[int], call_log: str) -> dict[str, int]:
    """The fault task as a durable function: per step a recorded call, then the outbox write that
    carries the call's value (the same effect keys as the declared plan, ``TASK/step-NNN``)."""
    total = 0
    for n in range(steps):
        value = run.call(f"call-{n:03d}", fault_computation, n, call_log)
        run.effect(f"step-{n:03d}", "write", {"n": n, "computed": value}, approval=n in approvals)
        total += value
    return {"steps": steps, "total": total}


def function_result(steps: int) -> dict[str, int]:
    """What ``fault_function`` returns for a ``steps``-step task."""
    return {"steps": steps, "total": sum(computed_value(n) for n in range(steps))}


def durable_task(store: Any, adapters: dict[str, Any], **options: Any) -> "DurableFunction[dict[str, int]]":
    """``fault_function`` made durable over ``store`` (the engine's options as keywords)."""
    from ..contract import RunContract
    from ..functions import durable

    return durable(store=store, adapters=adapters, contract=RunContract("fault-task", GOAL), **options)(fault_function)


def durable_arguments(steps: int, approvals: Sequence[int], call_log: str) -> tuple[int, list[int], str]:
    """The arguments a child runs ``fault_function`` with (recorded with the task: every child of
    one case must pass the same)."""
    return steps, list(approvals), call_log


def pre_approve(root: str, task: str, steps: int, approvals: Sequence[int], *, face: str = "runner", call_log: str = "") -> None:
    """Write an approval for every gated step before the run starts, as an operator would later."""
    from ..approval import Approval
    from ..canonical import digest_of
    from ..contract import plan_digest
    from ..stores.jsonfile import JsonFileStore

    os.makedirs(os.path.join(root, task), mode=0o700, exist_ok=True)
    store = JsonFileStore(root, create=True)
    if face == "durable":
        function = durable_task(store, {})
        # The digest a durable task's approvals bind to: the contract, the function's name, its arguments.
        digest = function.plan_digest(task, *durable_arguments(steps, approvals, call_log))
    else:
        contract, plan_steps = plan(task, steps, approvals)
        digest = plan_digest(contract, plan_steps)
    for index in approvals:
        store.write_approval(
            Approval(
                approval_id=f"pre-{index}", task_id=task, plan_digest=digest, step_id=f"step-{index:03d}",
                payload_digest=digest_of(step_payload(index, face)), action="write", expires_at=time.time() + 1e10,
                approver="fault-suite", granted_at=time.time(),
            )
        )  # fmt: skip


class ShiftedClock:
    """The real clocks moved forward by ``offset`` (so a crashed child's lease is over for the next one)
    on this boot's monotonic timeline; with ``step``, each ``monotonic()`` reading also adds ``step``
    seconds, so that the runner renews its lease on its own every few commits."""

    def __init__(self, offset: float, step: float = 0.0):
        from ..lease import boot_clock_id

        self.offset, self.step, self.ticks = offset, step, 0
        self._timeline = boot_clock_id() or "fault-suite"

    def now(self) -> float:
        return time.time() + self.offset

    def monotonic(self) -> float:
        self.ticks += 1
        return time.monotonic() + self.offset + self.ticks * self.step

    def monotonic_id(self) -> str:
        return self._timeline

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(min(seconds, 0.05))


class _SlowAdapter:
    """Before applying, sleeps (a window for outside kills) and touches ``signal`` if given."""

    def __init__(self, inner: Any, seconds: float, signal_path: str):
        self.inner, self.seconds, self.signal_path = inner, seconds, signal_path
        self.deduplicates = inner.deduplicates

    def apply(self, request: Any) -> Any:
        if self.signal_path:
            with open(self.signal_path, "a") as handle:
                handle.write(f"{request.step_id} {request.attempt}\n")
        if self.seconds:
            time.sleep(self.seconds)
        return self.inner.apply(request)

    def observe(self, request: Any) -> Any:
        return self.inner.observe(request)


def child_main(argv: Sequence[str]) -> int:
    from ..budget import Limits, RetryPolicy
    from ..runner import Runner
    from ..stores import jsonfile
    from ._fixtures import OutboxAdapter

    global call_pace
    parser = argparse.ArgumentParser(prog="longrun.testing.faults child")
    parser.add_argument("root")
    parser.add_argument("outbox")
    parser.add_argument("--face", choices=FACES, default="runner", help="a declared plan, or the same task as a durable function")
    parser.add_argument("--task", default="fault-task")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--approvals", default="")
    parser.add_argument("--offset", type=float, default=0.0)
    parser.add_argument("--monotonic-step", type=float, default=0.0)
    parser.add_argument("--ttl", type=float, default=30.0)
    parser.add_argument("--max-attempts", type=int, default=3)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--signal", default="")
    parser.add_argument("--slow-call", type=float, default=0.0, help="seconds each call takes (durable face)")
    parser.add_argument("--call-signal", default="", help="a file each call appends to first (durable face)")
    parser.add_argument("--dedup", action="store_true")
    args = parser.parse_args(argv)
    jsonfile.COMPACT_MIN_BYTES = 0  # compact within a short task: every write protocol runs
    approvals = [int(item) for item in args.approvals.split(",") if item]
    adapter: Any = OutboxAdapter(args.outbox, deduplicates=args.dedup)
    if args.slow or args.signal:
        adapter = _SlowAdapter(adapter, args.slow, args.signal)
    options: dict[str, Any] = dict(
        store=jsonfile.JsonFileStore(args.root, io=CrashPointIO(), create=True),
        adapters={"write": adapter},
        clock=ShiftedClock(args.offset, args.monotonic_step),
        limits=Limits(max_attempts=args.max_attempts, max_block_s=0.0),
        retry=RetryPolicy(base_delay_s=0.0, max_delay_s=0.0, jitter=0.0),
        lease_ttl_s=args.ttl,
    )
    if args.face == "durable":
        call_pace = (args.slow_call, args.call_signal)
        function = durable_task(**options)
        outcome = function.run(args.task, *durable_arguments(args.steps, approvals, call_log_of(args.outbox)))
    else:
        contract, steps = plan(args.task, args.steps, approvals)
        outcome = Runner(contract, steps, **options).run()
    print(json.dumps({"status": outcome.status.value, "revision": outcome.revision, "epoch": outcome.epoch,
                      "next_action": outcome.next_action, "result": outcome.result}))  # fmt: skip
    return 0


def call_log_of(outbox: str) -> str:
    """The file the durable face's calls log their invocations to, next to the outbox."""
    return outbox + ".calls"


class RaceLogIO(FileIO):
    """Logs, in the order they happen, every lease write and every state write a racing runner makes.

    Each line is written before the write it announces and under the task's lock (every lease and
    state write is made under it), so the log's order is the order of the writes. A process killed
    between its line and its write leaves a line for a write that may not have landed; the checker
    (``check_race_log``) settles which did from what followed."""

    def __init__(self, path: str):
        self.path = path
        self._journals: set[int] = set()

    def _log(self, entry: dict[str, Any]) -> None:
        entry["pid"] = os.getpid()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
        finally:
            os.close(fd)

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        fd = super().open(path, flags, mode)
        if _kind(os.path.basename(path)) == "journal":
            self._journals.add(fd)
        return fd

    def close(self, fd: int) -> None:
        self._journals.discard(fd)
        super().close(fd)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        if fd in self._journals and data[:1] not in (b"", b"\0"):
            line = bytes(data).split(b"\n", 1)[0]
            try:
                record = json.loads(line[17:])
                self._log({"event": "commit", "rev": record["rev"], "epoch": record["epoch"]})
            except (ValueError, KeyError, TypeError):
                self._log({"event": "unparsed journal write"})
        return super().pwrite(fd, data, offset)

    def replace(self, source: str, destination: str) -> None:
        name = os.path.basename(destination)
        if name in ("lease.json", "state.json") and TEMP_MARK in source:
            with open(source, "rb") as handle:
                data = handle.read()
            if name == "lease.json":
                lease = json.loads(data)
                self._log({"event": "lease", "epoch": lease["epoch"], "owner": lease["owner"]})
            else:
                meta, header = data.split(b"\n")[:2]
                self._log({"event": "snapshot", "rev": json.loads(meta)["revision"], "epoch": json.loads(header[17:])["lease_epoch"]})
        super().replace(source, destination)


def race_main(argv: Sequence[str]) -> int:
    """A racing runner: runs the task until it is done, whoever holds the lease."""
    from ..budget import Limits, RetryPolicy
    from ..errors import LongrunError
    from ..outcome import Status
    from ..runner import Runner, SystemClock
    from ..stores import jsonfile
    from ._fixtures import OutboxAdapter

    parser = argparse.ArgumentParser(prog="longrun.testing.faults race")
    parser.add_argument("workdir")
    parser.add_argument("--face", choices=FACES, default="runner")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=float, default=90.0)
    parser.add_argument("--slow", type=float, default=0.04, help="seconds each apply takes")
    args = parser.parse_args(argv)
    jsonfile.COMPACT_MIN_BYTES = 0
    rng = random.Random(args.seed * 1000 + os.getpid())
    contract, steps = plan("race-task", args.steps)
    store = jsonfile.JsonFileStore(os.path.join(args.workdir, "store"), io=RaceLogIO(os.path.join(args.workdir, "writes.jsonl")), create=True)
    outbox = os.path.join(args.workdir, "outbox.jsonl")
    adapter = _SlowAdapter(OutboxAdapter(outbox), args.slow, "")
    stop_at = time.monotonic() + args.deadline
    while time.monotonic() < stop_at:
        options: dict[str, Any] = dict(
            store=store, adapters={"write": adapter}, owner=f"racer:{os.getpid()}", clock=SystemClock(),
            limits=Limits(max_attempts=10_000, max_block_s=0.0), retry=RetryPolicy(base_delay_s=0.0, max_delay_s=0.0, jitter=0.0),
            lease_ttl_s=args.ttl,
        )  # fmt: skip
        try:
            if args.face == "durable":
                outcome = durable_task(**options).run("race-task", *durable_arguments(args.steps, (), call_log_of(outbox)))
            else:
                outcome = Runner(contract, steps, **options).run()
        except (LongrunError, OSError):
            time.sleep(0.05)
            continue
        if outcome.status is Status.DONE:
            return 0
        if outcome.status not in (Status.ALREADY_RUNNING, Status.LEASE_LOST, Status.RETRY_SCHEDULED):
            print(json.dumps({"status": outcome.status.value, "next_action": outcome.next_action}))
            return 3
        time.sleep(rng.uniform(0.02, 0.1))
    return 4


def check_race_log(entries: list[dict[str, Any]], killed: set[int]) -> tuple[list[str], int]:
    """Check the order of lease and state writes; return the problems and the number of revisions written.

    A line whose process was SIGKILLed right after it (its last line) may announce a write that never
    landed: a lease write did not land if the next lease write issues the same epoch again, a
    state write did not if the next one writes the same revision again."""
    last_of: dict[int, int] = {}
    for index, entry in enumerate(entries):
        last_of[entry["pid"]] = index
    landed = []
    for index, entry in enumerate(entries):
        maybe = entry["pid"] in killed and last_of[entry["pid"]] == index
        if maybe and entry["event"] in ("lease", "commit", "snapshot"):
            key = "epoch" if entry["event"] == "lease" else "rev"
            same = [item for item in entries[index + 1 :] if (item["event"] == "lease") == (entry["event"] == "lease")
                    and item["event"] != "unparsed journal write"][:1]  # fmt: skip
            if same and same[0][key] == entry[key] and not (entry["event"] == "snapshot" and same[0]["event"] == "commit"):
                continue  # it never landed: the next writer reissued it
        landed.append(entry)
    problems = []
    epoch, owner, revision, writes = 0, None, 0, 0
    for entry in landed:
        event = entry["event"]
        if event == "lease":
            if entry["epoch"] != epoch or entry["owner"] != owner:
                if entry["epoch"] <= epoch:
                    problems.append(f"a lease acquisition issued epoch {entry['epoch']}, not above {epoch}")
            epoch, owner = max(epoch, entry["epoch"]), entry["owner"]
        elif event in ("commit", "snapshot"):
            if entry["epoch"] != epoch:
                problems.append(f"revision {entry['rev']} was written with epoch {entry['epoch']}, the highest issued is {epoch}")
            if entry["rev"] == revision + 1:
                revision, writes = revision + 1, writes + 1
            elif not (event == "snapshot" and entry["rev"] == revision):
                problems.append(f"{event} of revision {entry['rev']} after revision {revision}")
        else:
            problems.append(f"a journal write the log could not read: {entry}")
    return problems, writes


def _child_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LONGRUN_CRASH_")}
    env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def _child_command(root: str, outbox: str, *options: str) -> list[str]:
    return [sys.executable, "-m", "longrun.testing.faults", "child", root, outbox, *options]


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


def _outbox_counts(path: str) -> dict[str, int]:
    from ._fixtures import read_outbox

    counts: dict[str, int] = {}
    for line in read_outbox(path):
        counts[line["key"]] = counts.get(line["key"], 0) + 1
    return counts


class _Workdir:
    """A scratch directory for one case; files the checks read are named here."""

    def __init__(self, base: str, name: str):
        self.dir = os.path.join(base, name)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.root = os.path.join(self.dir, "store")
        self.outbox = os.path.join(self.dir, "outbox.jsonl")
        self.children = 0

    def trace(self, index: int) -> str:
        return os.path.join(self.dir, f"trace-{index}.txt")

    @property
    def calls(self) -> str:
        return call_log_of(self.outbox)


def call_counts(path: str) -> dict[str, int]:
    """Invocations per call id in a durable face's call log (a line cut by a kill is skipped)."""
    counts: dict[str, int] = {}
    try:
        with open(path) as handle:
            text = handle.read()
    except FileNotFoundError:
        return counts
    for line in text.split("\n")[:-1]:
        call_id = line.split(" ", 1)[0]
        counts[call_id] = counts.get(call_id, 0) + 1
    return counts


def settled_calls(state: Any, counts: dict[str, int], into: dict[str, int]) -> None:
    """Note, for each call whose value a committed state records, how often it had run by then:
    it must never run again (``check_calls``)."""
    if state is None:
        return
    for step_id, record in state.effects.items():
        if step_id.startswith("call-") and record.state.value in ("verified", "failed") and step_id not in into:
            into[step_id] = counts.get(step_id, 0)


def _revisions_of(trace: list[tuple[str, int, str]]) -> tuple[int | None, list[int]]:
    loaded = next((int(detail) for name, _, detail in trace if name == "recovery.loaded" and detail.isdigit()), None)
    commits = [int(detail) for name, _, detail in trace if name == "state.committed" and detail.isdigit()]
    return loaded, commits


def check_revisions(traces: list[list[tuple[str, int, str]]]) -> list[str]:
    """Across processes run one after another: each loads the revision the previous one last
    committed (or the one in flight when it died), and commits the next ones without a gap."""
    problems = []
    last: int | None = 0
    for index, trace in enumerate(traces):
        loaded, commits = _revisions_of(trace)
        if loaded is None:
            continue  # died before it loaded anything
        if last is not None and loaded not in (last, last + 1):
            problems.append(f"process {index} loaded revision {loaded}, the previous one last committed {last}")
        expected = loaded
        for revision in commits:
            if revision != expected + 1:
                problems.append(f"process {index} committed revision {revision} after {expected}")
            expected = revision
        last = expected
    return problems


def check_calls(
    result: GroupResult, counts: dict[str, int], state: Any, steps: int, where: str, *, settled: dict[str, int], interruptions: int
) -> None:
    """The durable face's calls: each ran, each recorded value is the computed one, none ran again
    once its record was committed (``settled``), and no more than one extra run per interruption
    (a kill, or a takeover) of the process that held the task."""
    again = 0
    for call_id, before in sorted(settled.items()):
        if counts.get(call_id, 0) != before:
            again += counts.get(call_id, 0) - before
            result.fail(f"{where}: {call_id} ran again after its value was committed ({before} -> {counts.get(call_id, 0)} runs)")
    expected = {f"call-{n:03d}" for n in range(steps)}
    never = sorted(expected - set(counts))
    if never:
        result.fail(f"{where}: calls that never ran: {never[:5]}")
    total = sum(counts.values())
    result.duplicates += max(again, total - steps - interruptions)
    if total > steps + interruptions:
        result.fail(f"{where}: {total} call runs for {steps} calls and {interruptions} interruptions: "
                    f"{sorted(call_id for call_id, count in counts.items() if count > 1)[:5]} ran more than once")  # fmt: skip
    if state is None:
        return
    for n in range(steps):
        record = state.effects.get(f"call-{n:03d}")
        if record is not None and record.state.value == "verified" and record.result != computed_value(n):
            result.lost += 1
            result.fail(f"{where}: call-{n:03d} recorded {record.result!r}, it returned {computed_value(n)}")


def _check_final(
    result: GroupResult, work: _Workdir, task: str, steps: int, where: str, *, verified_before: dict[str, int],
    face: str = "runner", settled: dict[str, int] | None = None, interruptions: int = 0, outcome: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """The run is done: every effect applied exactly once and verified, none of the verified lost;
    under the durable face also every call replayed (``check_calls``) and the function's result recorded."""
    from ..functions import FUNCTION_STEP
    from ..stores.jsonfile import JsonFileStore

    counts = _outbox_counts(work.outbox)
    expected = {f"{task}/step-{i:03d}" for i in range(steps)}
    duplicates = sum(count - 1 for count in counts.values() if count > 1)
    if duplicates:
        result.duplicates += duplicates
        result.fail(f"{where}: applied twice: {sorted(key for key, count in counts.items() if count > 1)}")
    missing = expected - set(counts)
    loaded = JsonFileStore(work.root).load(task)
    state = loaded.state
    if state is None:
        result.resets += 1
        result.fail(f"{where}: no state after the run")
        return
    unverified = sorted(sid for sid, record in state.effects.items() if record.state.value != "verified")
    lost = {key for key in verified_before if key in missing} | {
        f"{task}/{sid}" for sid in verified_before if f"{task}/{sid}" in unverified
    }
    records = 2 * steps + 1 if face == "durable" else steps  # the durable face: a call per step, and the function's own record
    if missing or unverified or len(state.effects) != records:
        result.lost += len(lost) or len(missing)
        result.fail(f"{where}: missing from the outbox {sorted(missing)[:5]}, unverified {unverified[:5]}")
    if state.status.value != "done":
        result.fail(f"{where}: the task ended {state.status.value}, not done")
    if face == "durable":
        check_calls(result, call_counts(work.calls), state, steps, where, settled=settled or {}, interruptions=interruptions)
        record = state.effects.get(FUNCTION_STEP)
        if record is None or record.state.value != "verified" or record.result != function_result(steps):
            result.fail(f"{where}: the function's result is not recorded: {record and (record.state.value, record.result)}")
        if outcome is not None and outcome.get("result") != function_result(steps):
            result.fail(f"{where}: the last run returned {outcome.get('result')!r}, not the function's result")


# -- group 1: named kill points -----------------------------------------------------------------

GROUP1_STEPS = 20
GROUP1_APPROVALS = (5, 12)


def _spawn(work: _Workdir, *options: str, crash_at: str = "", timeout: float = 120.0) -> tuple[int, dict[str, Any] | None, str]:
    index = work.children
    work.children += 1
    env = _child_env(LONGRUN_CRASH_TRACE=work.trace(index), **({"LONGRUN_CRASH_AT": crash_at} if crash_at else {}))
    offset = str(1e6 * (index + 1))  # each child is far past the leases of the ones before it
    completed = subprocess.run(
        _child_command(work.root, work.outbox, "--offset", offset, *options), env=env, capture_output=True, text=True, timeout=timeout
    )
    outcome = None
    if completed.stdout.strip():
        try:
            outcome = json.loads(completed.stdout.strip().splitlines()[-1])
        except ValueError:
            outcome = None
    return completed.returncode, outcome, completed.stderr


def _in_flight(state: Any) -> dict[str, Any]:
    return {sid: record for sid, record in state.effects.items() if record.in_flight} if state is not None else {}


def _group1_case(base: str, point: str, occurrence: int, options: list[str], face: str) -> GroupResult:
    from ..stores.jsonfile import JsonFileStore

    task = "fault-task"
    result = GroupResult(1, "")
    where = f"{point}#{occurrence}"
    work = _Workdir(base, f"{point}-{occurrence}")
    pre_approve(work.root, task, GROUP1_STEPS, GROUP1_APPROVALS, face=face, call_log=work.calls)
    code, _, err = _spawn(work, *options, crash_at=f"{point}:{occurrence}")
    result.cases += 1
    if code != -signal.SIGKILL:
        result.fail(f"{where}: the child was not killed at the point (exit {code}): {err[-300:]}")
        return result
    result.faults += 1
    crash_trace = read_trace(work.trace(0))
    _, commits = _revisions_of(crash_trace)
    committed = commits[-1] if commits else 0
    on_disk = JsonFileStore(work.root).load(task)
    state = on_disk.state
    if state is None and committed:
        result.resets += 1
        result.fail(f"{where}: revision {committed} was committed, a load finds no state")
    if state is not None:
        if on_disk.source != "primary" or state.reconcile_all:
            result.fail(f"{where}: a crash was taken for damage: {[item.detail for item in on_disk.observations]}")
        if state.revision not in (committed, committed + 1):
            result.fail(f"{where}: on disk revision {state.revision}, last committed {committed}")
    if any(TEMP_MARK in name for name in _names(work.root)) and state is not None and on_disk.source != "primary":
        result.fail(f"{where}: a temporary file was read as state")
    crash_counts = _outbox_counts(work.outbox)
    in_flight = _in_flight(state)
    verified_before = {sid: 1 for sid, record in (state.effects.items() if state else ()) if record.state.value == "verified"}
    settled: dict[str, int] = {}
    settled_calls(state, call_counts(work.calls), settled)
    code, outcome, err = _spawn(work, *options)
    if code != 0 or outcome is None:
        result.fail(f"{where}: the resumed runner failed (exit {code}): {err[-400:]}")
        return result
    problems = check_revisions([crash_trace, read_trace(work.trace(1))])
    for problem in problems:
        result.fail(f"{where}: {problem}")
    _check_final(result, work, task, GROUP1_STEPS, where, verified_before=verified_before, face=face, settled=settled, interruptions=1, outcome=outcome)
    final = JsonFileStore(work.root).load(task).state
    for sid, record in in_flight.items():
        after = final.effects.get(sid) if final is not None else None
        if after is None:
            continue
        if crash_counts.get(record.key, 0) and after.attempts != record.attempts:
            result.fail(f"{where}: {record.key} had reached the target, yet was applied again (attempt {after.attempts})")
    if not any(name == "recovery.loaded" for name, _, _ in read_trace(work.trace(1))):
        result.fail(f"{where}: the resumed runner never loaded the state")
    return result


def _names(root: str) -> list[str]:
    found = []
    for _, _, names in os.walk(root):
        found.extend(names)
    return found


def _merge(into: GroupResult, part: GroupResult) -> None:
    into.cases += part.cases
    into.faults += part.faults
    into.duplicates += part.duplicates
    into.lost += part.lost
    into.resets += part.resets
    for failure in part.failures:
        into.fail(failure)
    into.notes.extend(part.notes)


def group1(base: str, *, full: bool, workers: int = 2, face: str = "runner") -> GroupResult:
    """Named kill points: each point at its 1st, 2nd and last occurrence in a 20-step task.

    Quick counts: the 1st and the last; under the durable face (twice the commits, so twice the
    time) the 1st or the last, in turn from one point to the next."""
    result = GroupResult(1, "named kill points", face)
    options = ["--face", face, "--steps", str(GROUP1_STEPS), "--approvals", ",".join(map(str, GROUP1_APPROVALS)),
               "--monotonic-step", "4", "--ttl", "10"]  # fmt: skip
    calibration = _Workdir(base, "calibration")
    pre_approve(calibration.root, "fault-task", GROUP1_STEPS, GROUP1_APPROVALS, face=face, call_log=calibration.calls)
    code, outcome, err = _spawn(calibration, *options)
    if code != 0 or outcome is None or outcome["status"] != "done":
        result.fail(f"the calibration run did not finish (exit {code}, {outcome}): {err[-400:]}")
        return result
    counts: dict[str, int] = {}
    for name, occurrence, _ in read_trace(calibration.trace(0)):
        counts[name] = max(counts.get(name, 0), occurrence)
    cases: list[tuple[str, int]] = []
    points = points_for(face)
    for number, point in enumerate(points):
        last = counts.get(point, 0)
        if not last:
            result.fail(f"point {point} is never reached in a {GROUP1_STEPS}-step task")
            continue
        wanted = {1, 2, last} if full else {1, last} if face == "runner" else {(1, last)[number % 2]}
        cases.extend((point, occurrence) for occurrence in sorted(wanted) if occurrence <= last)
    result.notes.append(f"{len(points)} points, {len(cases)} (point, occurrence) cases")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for part in pool.map(lambda case: _group1_case(base, case[0], case[1], options, face), cases):
            _merge(result, part)
    return result


# -- group 2: external random kills ---------------------------------------------------------------


GROUP2_STEPS = 40


def group2(base: str, *, full: bool, workers: int = 2, face: str = "runner") -> GroupResult:
    """A child SIGKILLed from outside at random moments (fixed seeds), resumed until done.

    Each of 36 seeds (quick: 4, under the durable face 2) kills up to 8 (quick: 6) processes of a
    40-step task, each a random 5-150 ms after it reached its first named point (taking the lease;
    a process needs more than that to finish: every apply takes 10 ms), then lets one finish."""
    result = GroupResult(2, "external random kills", face)
    seeds = range(36) if full else range(4 if face == "runner" else 2)
    kills_per_seed = 8 if full else 6
    mid_run = 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for part, landed in pool.map(lambda seed: _group2_seed(base, seed, kills_per_seed, face), seeds):
            _merge(result, part)
            mid_run += landed
    result.notes.append(f"{mid_run} of {result.faults} kills landed after the killed process's first commit")
    return result


def _group2_seed(base: str, seed: int, kills: int, face: str) -> tuple[GroupResult, int]:
    """One seed's figures, and how many of its kills landed after the killed process had committed."""
    from ..stores.jsonfile import JsonFileStore

    result = GroupResult(2, "")
    rng = random.Random(seed)
    task = "fault-task"
    work = _Workdir(base, f"seed-{seed}")
    pre_approve(work.root, task, GROUP2_STEPS, GROUP1_APPROVALS, face=face, call_log=work.calls)
    # Random kills may land in the same effect's apply again and again: that is group 9's business
    # (bounded retries), so here the attempts are not what runs out.
    options = ["--face", face, "--steps", str(GROUP2_STEPS), "--approvals", ",".join(map(str, GROUP1_APPROVALS)), "--slow", "0.01",
               "--max-attempts", "1000"]  # fmt: skip
    verified_before: dict[str, int] = {}
    settled: dict[str, int] = {}
    outcome: dict[str, Any] | None = None
    killed = mid_run = 0
    done = False
    for _ in range(kills + 20):
        index = work.children
        work.children += 1
        env = _child_env(LONGRUN_CRASH_TRACE=work.trace(index))
        child = subprocess.Popen(
            _child_command(work.root, work.outbox, "--offset", str(1e6 * (index + 1)), *options),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        result.cases += 1
        if killed < kills:
            # The delay counts from the child's first named point (taking the lease): on a loaded
            # machine starting Python alone can outlast the whole window, and a kill then tests nothing.
            started = time.monotonic()
            while child.poll() is None and not os.path.exists(work.trace(index)) and time.monotonic() < started + 60:
                time.sleep(0.005)
            try:
                child.wait(timeout=rng.uniform(0.005, 0.15))
            except subprocess.TimeoutExpired:
                child.kill()
                killed += 1
                result.faults += 1
        out, err = child.communicate(timeout=120)
        if child.returncode == -signal.SIGKILL:
            mid_run += any(name == "state.committed" for name, _, _ in read_trace(work.trace(index)))
        if child.returncode == 0:
            last: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
            outcome = last
            if last["status"] == "done":
                done = True
                break
            result.fail(f"seed {seed}: a run stopped {last['status']}: {last['next_action']}")
            break
        if child.returncode != -signal.SIGKILL:
            result.fail(f"seed {seed}: a child failed (exit {child.returncode}): {err[-400:]}")
            break
        loaded = JsonFileStore(work.root).load(task)
        state = loaded.state
        if state is not None:
            if loaded.source != "primary" or state.reconcile_all:
                result.fail(f"seed {seed}: a kill was taken for damage")
            for sid, record in state.effects.items():
                if record.state.value == "verified":
                    verified_before[sid] = 1
            settled_calls(state, call_counts(work.calls), settled)
        elif any(name == "state.committed" for trace in range(work.children) for name, _, _ in read_trace(work.trace(trace))):
            result.resets += 1
            result.fail(f"seed {seed}: committed state vanished after a kill")
    if not done:
        result.fail(f"seed {seed}: the task never completed")
        return result, mid_run
    for problem in check_revisions([read_trace(work.trace(index)) for index in range(work.children)]):
        result.fail(f"seed {seed}: {problem}")
    _check_final(result, work, task, GROUP2_STEPS, f"seed {seed}", verified_before=verified_before, face=face, settled=settled,
                 interruptions=killed, outcome=outcome)  # fmt: skip
    return result, mid_run


# -- group 9: retries across restarts ------------------------------------------------------------


def group9(base: str, *, full: bool, face: str = "runner") -> GroupResult:
    """max_attempts 3 and the process killed during every attempt: never a 4th, ends limits-exhausted.

    Each schedule kills one process per attempt at a given moment, then runs one more process:
    after the intent is durable (before the adapter), inside the adapter before the target is
    reached, and alternately before the counter is durable (which must not count: that attempt
    never reached the adapter) and after. The durable face runs the same schedules (its call runs
    first and is replayed), and the same for the call itself: after its attempt is durable, inside
    the call, and after it returned but before its value was committed (each attempt counts)."""
    from ..stores.jsonfile import JsonFileStore

    result = GroupResult(9, "retries across restarts", face)
    schedules = [
        ["effect.intent-persisted"] * 3,
        ["in-adapter"] * 3,
        ["attempt.incremented", "effect.intent-persisted"] * 3,
    ]
    if full:
        schedules += [["effect.intent-persisted", "attempt.incremented", "in-adapter", "attempt.incremented", "in-adapter"]]
    if face == "durable":
        if not full:  # quick: the one effect schedule whose kills also lose a call's value
            schedules = [["attempt.incremented", "effect.intent-persisted"] * 3]
        schedules += [["call.started"] * 3, ["in-call"] * 3]
        if full:
            schedules += [["call.returned"] * 3, ["call.started", "in-call", "call.returned"]]
    for number, schedule in enumerate(schedules):
        task = "fault-task"
        work = _Workdir(base, f"retry-{number}")
        signal_path = os.path.join(work.dir, "attempts.txt")
        where = f"schedule {schedule}"
        options = ["--face", face, "--steps", "1", "--max-attempts", "3"]
        calls = any(point in CALL_POINTS or point == "in-call" for point in schedule)
        target, intent = ("call-000", "call.started") if calls else ("step-000", "effect.intent-persisted")
        counted = 0
        settled: dict[str, int] = {}
        for point in [*schedule, ""]:
            if point in ("in-adapter", "in-call"):
                index = work.children
                work.children += 1
                started = _line_count(signal_path)
                slow = ["--slow", "30", "--signal", signal_path] if point == "in-adapter" else ["--slow-call", "30", "--call-signal", signal_path]
                child = subprocess.Popen(
                    _child_command(work.root, work.outbox, "--offset", str(1e6 * (index + 1)), *options, *slow),
                    env=_child_env(LONGRUN_CRASH_TRACE=work.trace(index)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                )  # fmt: skip
                deadline = time.monotonic() + 60
                while child.poll() is None and _line_count(signal_path) == started and time.monotonic() < deadline:
                    time.sleep(0.01)
                child.kill()
                _, err = child.communicate()
                code, outcome = child.returncode, None
            else:
                code, outcome, err = _spawn(work, *options, crash_at=f"{point}:1" if point else "")
            result.cases += 1
            state = JsonFileStore(work.root).load(task).state
            record = state.effects.get(target) if state is not None else None
            attempts = record.attempts if record is not None else 0
            if point:
                if code != -signal.SIGKILL:
                    result.fail(f"{where}: the child was not killed at {point} (exit {code}): {err[-300:]}")
                    break
                result.faults += 1
                counted += point != "attempt.incremented"
                if attempts != counted:
                    result.fail(f"{where}: after a kill at {point} the state counts {attempts} attempts, expected {counted}")
                settled_calls(state, call_counts(work.calls), settled)
            elif code != 0 or outcome is None or outcome["status"] != "limits-exhausted":
                result.fail(f"{where}: the last run ended {outcome and outcome['status']} (exit {code}), not limits-exhausted")
        final = JsonFileStore(work.root).load(task).state
        if final is None or final.status.value != "limits-exhausted":
            result.fail(f"{where}: the state ended {final and final.status.value}")
        elif final.effects[target].attempts != 3:
            result.fail(f"{where}: {final.effects[target].attempts} attempts recorded, not 3")
        intents = sum(1 for index in range(work.children) for name, _, _ in read_trace(work.trace(index)) if name == intent)
        if intents > 3:
            result.duplicates += intents - 3
            result.fail(f"{where}: {intents} attempts were started, more than 3")
        if _outbox_counts(work.outbox):
            result.fail(f"{where}: the target was reached although every attempt was killed before it")
        if calls:
            runs = call_counts(work.calls).get(target, 0)
            ran = sum(1 for point in schedule if point in ("in-call", "call.returned"))
            if runs != ran:
                result.duplicates += max(0, runs - ran)
                result.fail(f"{where}: the call ran {runs} times, {ran} attempts reached it")
        elif face == "durable":
            check_calls(result, call_counts(work.calls), final, 1, where, settled=settled, interruptions=len(schedule))
    return result


def _line_count(path: str) -> int:
    try:
        with open(path) as handle:
            return sum(1 for line in handle if line.strip())
    except FileNotFoundError:
        return 0


# -- the report ---------------------------------------------------------------------------------


def _groups() -> dict[int, Callable[..., GroupResult]]:
    from . import _fault_groups

    return {
        1: group1,
        2: group2,
        3: _fault_groups.group3,
        4: _fault_groups.group4,
        5: _fault_groups.group5,
        6: _fault_groups.group6,
        7: _fault_groups.group7,
        8: _fault_groups.group8,
        9: group9,
    }


def run_group(number: int, *, full: bool, base: str | None = None, face: str = "runner") -> GroupResult:
    """Run one group in a scratch directory (removed afterwards unless ``base`` is given); the
    groups in ``FACED_GROUPS`` run under ``face``, the others under neither."""
    if face not in FACES:
        raise ValueError(f"face must be one of {FACES}, got {face!r}")
    if face != "runner" and number not in FACED_GROUPS:
        raise ValueError(f"group {number} tests the store alone: it has no {face} face")
    own = base is None
    base = base or tempfile.mkdtemp(prefix=f"longrun-faults-{number}-")
    logger = logging.getLogger("longrun")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # the damage is on purpose; its warnings would drown the figures
    try:
        group = _groups()[number]
        return group(base, full=full, face=face) if number in FACED_GROUPS else group(base, full=full)
    finally:
        logger.setLevel(level)
        if own:
            shutil.rmtree(base, ignore_errors=True)


def run_groups(numbers: Iterable[int], *, full: bool, out: Any = None, faces: Sequence[str] = FACES) -> list[GroupResult]:
    """Run the groups, each faced one once per face in ``faces``; write one line per run to ``out``."""
    out = out or sys.stdout
    results = []
    out.write(HEADER + "\n")
    out.flush()
    for number in numbers:
        for face in faces if number in FACED_GROUPS else ("runner",):
            started = time.monotonic()
            result = run_group(number, full=full, face=face)
            results.append(result)
            out.write(result.line() + f"  {time.monotonic() - started:.0f}s\n")
            out.flush()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "child":
        return child_main(argv[1:])
    if argv and argv[0] == "race":
        return race_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m longrun.testing.faults", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--report", action="store_true", help="run the groups and print one line per group")
    parser.add_argument("--quick", action="store_true", help="the smaller counts the unit tests use")
    parser.add_argument("--group", type=int, action="append", help="run only this group (repeatable)")
    parser.add_argument("--face", choices=FACES, action="append", help="run the faced groups under this face only (repeatable)")
    parser.add_argument("--verbose", action="store_true", help="print each group's notes and failures")
    args = parser.parse_args(argv)
    if not args.report:
        parser.print_help()
        return 2
    groups = args.group or list(range(1, 10))
    started = time.monotonic()
    print(f"longrun fault-injection report ({'quick' if args.quick else 'full'} counts), Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    results = run_groups(groups, full=not args.quick, faces=args.face or FACES)
    for result in results:
        if args.verbose or not result.ok:
            for note in result.notes:
                print(f"   group {result.group}{f' ({result.face})' if result.face else ''} note: {note}")
            for failure in result.failures:
                print(f"   group {result.group}{f' ({result.face})' if result.face else ''} FAILURE: {failure}")
    total = GroupResult(0, "total")
    for result in results:
        _merge(total, result)
    print(f"total: {total.cases} cases, {total.faults} faults injected, {total.duplicates} duplicates, "
          f"{total.lost} verified effects lost, {total.resets} silent resets ({time.monotonic() - started:.0f} s)")  # fmt: skip
    return 0 if all(result.ok for result in results) else 1


if __name__ == "__main__":
    # Run as the module's own name, not as ``__main__``: a durable function is recorded by its
    # qualified name, which must be the same in every child and in the parent that pre-approves it.
    from longrun.testing import faults as named

    sys.exit(named.main())
