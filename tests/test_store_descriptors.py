"""The descriptors a JSON-file store object keeps open between calls: the task's lock file, the
lease file last read, the ``control`` directory. Each cuts system calls from every commit or
cancellation read; each must still see what other processes and store objects write."""

from __future__ import annotations

import collections
import fcntl
import os
import time
import unittest
from typing import Any, Callable
from unittest import mock

from helpers import support
from helpers.descriptors import descriptors_under, new_state, open_descriptors, started
from longrun import Cancellation, FencedError, InvalidInputError, JsonFileStore, RunState, StorageError
from longrun.stores import controlfiles, jsonfile
from longrun.stores._fileio import FileIO
from longrun.stores.controlfiles import ControlFiles

COUNTED = (
    "open", "open_at", "lstat", "stat", "fstat", "flock", "read", "pread", "pwrite", "write", "fdatasync", "fsync",
    "close", "listdir", "listdir_at", "replace", "link", "unlink", "mkdir", "truncate", "chmod", "fchmod", "fsync_dir",
)  # fmt: skip


class CallCounting(FileIO):
    """Counts every call the store makes through its ``FileIO``, by method."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()


def _counted(name: str) -> Callable[..., Any]:
    def method(self: CallCounting, *args: Any, **kwargs: Any) -> Any:
        self.calls[name] += 1
        return getattr(super(CallCounting, self), name)(*args, **kwargs)

    return method


for _name in COUNTED:
    setattr(CallCounting, _name, _counted(_name))


class HeldDescriptorTests(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.io = CallCounting()
        self.store = JsonFileStore(self.path("root"), io=self.io, create=True)
        self.addCleanup(self.store.close)

    def started(self, task: str = "t") -> tuple[Any, RunState]:
        return started(self.store, task, now=time.time())

    def test_a_commit_locks_a_held_descriptor_and_checks_the_lock_and_lease_files_with_one_lstat_each(self) -> None:
        lease, state = self.started()
        for index in range(5):
            self.io.calls.clear()
            state.next_action = f"step {index}"
            self.store.commit(lease, state, ())
            self.assertEqual(
                dict(self.io.calls),
                {"flock": 2, "lstat": 3, "pread": 1, "pwrite": 1, "fdatasync": 1},
                "lock and unlock; the lock file, the lease and the snapshot checked by lstat; then the write",
            )

    def test_a_cancellation_read_is_one_openat_through_the_held_control_directory(self) -> None:
        self.started()
        self.io.calls.clear()
        self.assertIsNone(self.store.read_cancellation("t"))
        self.assertEqual(dict(self.io.calls), {"open_at": 1})

    def test_a_cancellation_written_after_the_directory_is_held_is_read_fresh(self) -> None:
        self.started()
        other = JsonFileStore(self.store.root)
        self.addCleanup(other.close)
        other.write_cancellation(Cancellation("t", time.time(), "operator", "stop now"))
        record = self.store.read_cancellation("t")
        self.assertIsNotNone(record)
        assert record is not None
        self.assertIsNone(record.error)
        self.assertIsInstance(record.body, dict)
        assert isinstance(record.body, dict)
        self.assertEqual(record.body["reason"], "stop now")

    def test_a_lease_taken_over_by_another_store_object_fences_the_next_commit(self) -> None:
        lease, state = self.started()
        other = JsonFileStore(self.store.root)
        self.addCleanup(other.close)
        # Expired by the clock passed in: a new holder takes the task with a newer epoch.
        self.store.release_lease(lease, time.time())
        taken = other.acquire_lease("t", "them", 30.0, time.time())
        self.assertGreater(taken.epoch, lease.epoch)
        with self.assertRaises(FencedError):
            self.store.commit(lease, state, ())

    def test_a_lease_file_rewritten_in_place_with_other_bytes_is_read_again(self) -> None:
        lease, state = self.started()
        path = os.path.join(self.store.task_dir("t"), jsonfile.LEASE)
        with open(path, "r+b") as handle:  # same inode, new size and times: not the bytes last read
            handle.write(b"{}")
            handle.truncate()
        with self.assertRaises(Exception) as raised:
            self.store.commit(lease, state, ())
        self.assertNotIsInstance(raised.exception, AssertionError)
        self.assertIn("lease", str(raised.exception).lower())

    def test_close_closes_every_held_descriptor_and_the_store_stays_usable(self) -> None:
        before = open_descriptors()
        lease, state = self.started()
        self.assertGreater(open_descriptors(), before)
        self.store.close()
        self.assertEqual(open_descriptors(), before + 1, "all but the lease holder's lock, held for the lease's life")
        state.next_action = "after close"
        self.store.commit(lease, state, ())
        self.assertEqual(JsonFileStore(self.store.root).load("t").state.next_action, "after close")

    def test_a_store_object_dropped_without_close_closes_its_descriptors_when_collected(self) -> None:
        store = JsonFileStore(self.path("dropped"), create=True)
        lease = store.acquire_lease("t", "me", 30.0, time.time())
        store.load("t", lease=lease)
        state = new_state()
        for _ in range(3):
            store.commit(lease, state, {"s0"})
        store.read_cancellation("t")
        store.release_lease(lease, time.time())
        held = descriptors_under(self.path("dropped"))
        # journal, lock, control (the lease pin went with the release), and the summary index's
        # connection (its file, WAL and shared memory: one per store object, whatever the tasks)
        self.assertEqual(len(held), 6, held)
        del store
        self.assertEqual(descriptors_under(self.path("dropped")), [], "all closed when the store object is collected")

    def test_held_descriptors_are_bounded_by_task(self) -> None:
        with mock.patch.object(jsonfile, "MAX_OPEN_JOURNALS", 2), mock.patch.object(controlfiles, "MAX_HELD_DIRECTORIES", 2):
            before = open_descriptors()
            for task in ("a", "b", "c", "d", "e"):
                self.started(task)
            self.assertLessEqual(len(self.store._handles), 2)
            # Two tasks' journal, lock file, lease file and control directory, each held lease's
            # holder lock (held for the lease's life, whatever the bound), and the summary index's
            # connection (three: one per store object).
            self.assertLessEqual(open_descriptors() - before, 2 * 4 + 5 + 3)

    def test_a_failed_write_drops_the_held_descriptors_so_the_next_transaction_opens_the_files_by_name(self) -> None:
        lease, state = self.started()
        self.assertEqual(len(self.store._handles), 1)
        with mock.patch.object(CallCounting, "fdatasync", side_effect=OSError(5, "injected")):
            with self.assertRaises(StorageError):
                self.store.commit(lease, state, ())
        self.assertEqual(len(self.store._handles), 0)
        self.store.load("t", lease=lease)
        self.io.calls.clear()
        self.store.commit(lease, state, ())
        self.assertGreaterEqual(self.io.calls["open"], 1, "the lock file is opened again")

    def test_a_child_after_fork_locks_a_descriptor_of_its_own(self) -> None:
        lease, state = self.started()
        held = self.store._handles.get("t")
        assert held is not None
        fcntl.flock(held.lock, fcntl.LOCK_EX)  # the parent holds the lock through its held descriptor
        try:
            pid = os.fork()
            if pid == 0:  # the child: its transaction must wait for the parent's lock
                try:
                    with self.store._transaction("t", create=False):
                        os._exit(0)
                finally:
                    os._exit(3)
            time.sleep(0.5)
            done, status = os.waitpid(pid, os.WNOHANG)
            self.assertEqual(done, 0, f"the child locked the task while the parent held it (status {status})")
        finally:
            fcntl.flock(held.lock, fcntl.LOCK_UN)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)

    def test_strict_control_files_refuse_to_hold_directories(self) -> None:
        with self.assertRaises(InvalidInputError):
            ControlFiles(self.path("control"), io=FileIO(), strict=True, hold_directories=True)


if __name__ == "__main__":
    unittest.main()
