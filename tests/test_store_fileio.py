"""The ``FileIO`` seam (``longrun.stores._fileio``): every file-system call of the JSON-file store and
of the control files goes through it, so the fault tests reach every one of them."""

from __future__ import annotations

import dataclasses
import gc
import errno
import fcntl
import os
import sys
import unittest
from typing import Any, Callable
from unittest import mock

from helpers import support
from longrun import Approval, Cancellation, JsonFileStore, StorageError
from longrun.authority import FileControlSource
from longrun.stores._fileio import FileIO
from longrun.testing import faults
from longrun.testing.store_contract import sample_state

TASK = "t"
NOW = 1_800_000_000.0

# The system calls a file store can make; each is wrapped to see who calls it.
_OS_CALLS = ("open", "close", "read", "write", "pread", "pwrite", "fsync", "ftruncate", "replace", "rename", "link",
             "unlink", "mkdir", "rmdir", "listdir", "scandir", "lstat", "stat", "fstat", "chmod", "fchmod")  # fmt: skip


def _allowed(code: Any) -> bool:
    """The seam's own methods, and the holder locks (a per-process registry of kernel locks, outside
    any store's I/O); not the helpers beside the seam, which must call it too."""
    if code.co_filename.endswith("_fileio.py"):
        return str(code.co_qualname).startswith("FileIO.")
    return bool(code.co_filename.endswith("_holders.py"))


def approval(approval_id: str = "ap-1") -> Approval:
    return Approval(approval_id, TASK, "sha256:p", "step-001", "sha256:d", "write", NOW + 3600, "op", NOW)


def store_sequence(root: str, io: FileIO) -> None:
    """Everything a runner and an operator do to a task in a JSON-file store, from a missing root."""
    store = JsonFileStore(root, io=io, create=True)
    lease = store.acquire_lease(TASK, "me", 3600.0, NOW)
    store.load(TASK, lease=lease)
    state = sample_state(TASK, effects=3)
    store.commit(lease, state, set(state.effects))
    for number in range(3):
        step_id = f"step-{number:03d}"
        state.effects[step_id] = dataclasses.replace(state.effects[step_id], evidence=f"round {number}")
        store.commit(lease, state, {step_id})
    store.write_approval(approval())
    store.write_cancellation(Cancellation(TASK, NOW, "op", "stop"))
    store.read_approvals(TASK)
    store.read_cancellation(TASK)
    store.history(TASK)
    store.list_tasks()
    lease = store.renew_lease(lease, 3600.0, NOW + 1)
    store.release_lease(lease, NOW + 2)
    JsonFileStore(root, io=io).load(TASK)  # a second store object: a read-only load from scratch
    store.close()
    try:
        store.load("nosuch")
    except LookupError:
        pass
    dropped = JsonFileStore(root, io=io)  # dropped without close: its descriptors close when collected
    lease = dropped.acquire_lease(TASK, "me", 3600.0, NOW + 3)
    dropped.commit(lease, dropped.load(TASK, lease=lease).state or state, None)
    dropped.read_cancellation(TASK)
    del dropped
    gc.collect()


def control_source_sequence(root: str, io: FileIO) -> None:
    """The operator's writes and the runner's reads through a control area of its own (``root``
    must exist)."""
    source = FileControlSource(root, strict=False, io=io)
    source.write_approval(approval())
    source.write_cancellation(Cancellation(TASK, NOW, "op", "stop"))
    source.read_approvals(TASK)
    source.read_cancellation(TASK)


class SeamTests(support.TempDirTest):
    def callers_outside_the_seam(self, sequence: Callable[[str, FileIO], None], *, make_root: bool = False) -> list[str]:
        """Run ``sequence`` with every ``os`` file-system call (and ``flock``) wrapped; return the
        calls made from anywhere but the seam."""
        bypasses: list[str] = []
        if make_root:
            os.mkdir(self.path("root"))

        def wrap(module: Any, name: str) -> Any:
            real = getattr(module, name)

            def call(*args: Any, **kwargs: Any) -> Any:
                caller = sys._getframe(1).f_code
                if not _allowed(caller):
                    bypasses.append(f"{module.__name__}.{name} from {os.path.basename(caller.co_filename)}:{caller.co_name}")
                return real(*args, **kwargs)

            return call

        patches = [mock.patch.object(os, name, wrap(os, name)) for name in _OS_CALLS]
        patches.append(mock.patch.object(fcntl, "flock", wrap(fcntl, "flock")))
        for patch in patches:
            patch.start()
        try:
            sequence(self.path("root"), FileIO())
        finally:
            for patch in reversed(patches):
                patch.stop()
        return sorted(set(bypasses))

    def test_the_json_file_store_makes_every_file_system_call_through_its_io(self) -> None:
        self.assertEqual(self.callers_outside_the_seam(store_sequence), [])

    def test_the_control_source_makes_every_file_system_call_through_its_io(self) -> None:
        self.assertEqual(self.callers_outside_the_seam(control_source_sequence, make_root=True), [])


class FaultReachTests(support.TempDirTest):
    """Each kind of call that once bypassed ``FileIO`` is now failed by ``FaultyIO``, at every
    position, and each failure comes out as a typed error (or a record that says it is unreadable)."""

    def setUp(self) -> None:
        super().setUp()
        # A compaction that fails is logged (the commit has landed); a recovered load too.
        support.ExpectedWarnings(self, "compaction failed", "recovered from", "dropped an incomplete", at_least_one=False).start()

    def fail_every_call_of(self, kind: str, sequence: Callable[[str, FileIO], None], *, make_root: bool = False) -> int:
        injected = 0
        for n in range(1, 500):
            io = faults.FaultyIO(n, errno.EIO, kinds={kind})
            root = self.path(f"{kind}-{n}")
            if make_root:
                os.mkdir(root)
            try:
                sequence(root, io)
            except StorageError as exc:
                causes = []
                cause: BaseException | None = exc
                while cause is not None:
                    causes.append(cause)
                    cause = cause.__cause__
                self.assertTrue(
                    any(isinstance(item, OSError) and "injected" in str(item) for item in causes),
                    f"{kind} call {n}: {exc!r} is not caused by the injected error",
                )
            if not io.injected:
                return injected
            self.assertEqual(io.injected_operations, [kind])
            injected += 1
        self.fail(f"{kind}: the sequence never completed")

    def test_each_newly_routed_call_of_the_store_is_injected(self) -> None:
        for kind in ("lstat", "stat", "fstat", "chmod", "flock", "listdir"):
            with self.subTest(kind=kind):
                self.assertGreater(self.fail_every_call_of(kind, store_sequence), 0, f"no {kind} call was reached")

    def test_each_call_of_the_control_source_is_injected(self) -> None:
        for kind in ("open", "fstat", "listdir", "fchmod", "write", "fsync", "replace"):
            with self.subTest(kind=kind):
                reached = self.fail_every_call_of(kind, control_source_sequence, make_root=True)
                self.assertGreater(reached, 0, f"no {kind} call was reached")

    def test_listing_tasks_and_approvals_fails_with_the_injected_error(self) -> None:
        io = faults.FaultyIO(kinds={"listdir"})
        store = JsonFileStore(self.path("root"), io=io, create=True)
        store.acquire_lease(TASK, "me", 3600.0, NOW)
        store.write_approval(approval())
        for name, call in (("list_tasks", store.list_tasks), ("read_approvals", lambda: store.read_approvals(TASK))):
            with self.subTest(call=name):
                io.fail_at = io.calls + 1
                with self.assertRaises(StorageError) as caught:
                    call()
                self.assertEqual(caught.exception.__cause__.errno, errno.EIO)  # type: ignore[union-attr]

    def test_a_failed_write_of_the_control_source_leaves_no_record(self) -> None:
        root = self.path("control")
        os.mkdir(root)
        source = FileControlSource(root, strict=False, io=faults.FaultyIO(1, errno.ENOSPC, kinds={"fsync"}))
        with self.assertRaises(StorageError) as caught:
            source.write_approval(approval())
        self.assertEqual(caught.exception.__cause__.errno, errno.ENOSPC)  # type: ignore[union-attr]
        self.assertEqual(FileControlSource(root, strict=False).read_approvals(TASK), ())


if __name__ == "__main__":
    unittest.main()
