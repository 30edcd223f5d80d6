"""Adversarial tests of the JSON-file store's held descriptors (``stores.jsonfile._handles``, the held
``control`` directories of ``stores.controlfiles``): exclusion, fencing, fresh cancellations, no
leaked or misused descriptor, OS errors, and odd lease files, each tried against a store object
that already holds the task's lock file, lease file and control directory."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import unittest
from typing import Any, Callable
from unittest import mock

from helpers import support
from helpers.descriptors import NOW, HeldTaskCase, descriptors_under, new_state, open_descriptors, started
from longrun import Cancellation, FencedError, JsonFileStore, StorageError
from longrun.errors import CorruptStateError, LongrunError
from longrun.stores import controlfiles, jsonfile
from longrun.stores._fileio import FileIO
from longrun.stores.controlfiles import ControlFiles
from longrun.testing import FaultyIO

WAIT_S = 0.5
"""How long a transaction that must be excluded is watched: still blocked after this, it waits."""


def in_a_child(case: unittest.TestCase, action: Callable[[], object]) -> None:
    """Run ``action`` in a forked child of this process; the test fails unless it returned."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            action()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    case.assertEqual(os.waitstatus_to_exitcode(status), 0, "the child's action raised")


def in_threads(target: Callable[[Any], None], arguments: Any) -> None:
    """Run ``target`` on each of ``arguments`` at once, a thread each, and wait for them all."""
    threads = [threading.Thread(target=target, args=(argument,)) for argument in arguments]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)


class Inside:
    """Runs ``call`` in a thread and tells whether it finished within a wait."""

    def __init__(self, call: Any, name: str = "contender") -> None:
        self.done = threading.Event()
        self.result: list[Any] = []
        self.errors: list[BaseException] = []

        def run() -> None:
            try:
                self.result.append(call())
            except BaseException as exc:  # reported by the test's assertions
                self.errors.append(exc)
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.thread.join(60)


class PausingIO(FileIO):
    """Holds the first ``pwrite`` or ``fdatasync`` made by the thread named ``paused`` until
    ``resume``; also records every pwrite's target path (by /proc) per thread."""

    def __init__(self, on: str = "fdatasync") -> None:
        self.on = on
        self.paused: str | None = None
        self.inside = threading.Event()
        self.resume = threading.Event()
        self.writes: list[tuple[str, str]] = []

    def _maybe_pause(self, operation: str) -> None:
        if operation == self.on and threading.current_thread().name == self.paused:
            self.paused = None
            self.inside.set()
            self.resume.wait(60)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        self.writes.append((threading.current_thread().name, os.readlink(f"/proc/self/fd/{fd}")))
        self._maybe_pause("pwrite")
        return super().pwrite(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        self._maybe_pause("fdatasync")
        super().fdatasync(fd)


# -- 1. exclusion and fencing ------------------------------------------------------------------


class ExclusionTests(HeldTaskCase):
    def test_a_second_store_object_waits_for_a_transaction_on_a_held_lock_descriptor(self) -> None:
        other = JsonFileStore(self.root)
        self.addCleanup(other.close)
        started_other = threading.Event()

        def enter() -> None:
            started_other.set()
            with other._transaction("t", create=False):
                pass

        with self.store._transaction("t", create=False):
            inside = Inside(enter)
            self.assertTrue(started_other.wait(60))
            self.assertFalse(inside.done.wait(WAIT_S), "the other store object entered while this one held the task")
        inside.join()
        self.assertEqual(inside.errors, [])

    def test_a_held_lock_descriptor_waits_for_a_second_store_object(self) -> None:
        other = JsonFileStore(self.root)
        self.addCleanup(other.close)
        with other._transaction("t", create=False):
            inside = Inside(lambda: self.store.commit(self.lease, self.state, ()))
            self.assertFalse(inside.done.wait(WAIT_S), "a commit through the held descriptor ran while another object held the task")
        inside.join()
        self.assertEqual(inside.errors, [])

    def test_threads_sharing_one_store_object_take_turns_through_its_held_descriptor(self) -> None:
        errors: list[BaseException] = []
        revisions: list[int] = []
        lock = threading.Lock()

        def worker(number: int) -> None:
            state = new_state()
            for index in range(20):
                state.next_action = f"{number}-{index}"
                try:
                    revision = self.store.commit(self.lease, state, ())
                except BaseException as exc:  # reported below
                    errors.append(exc)
                    return
                with lock:
                    revisions.append(revision)

        in_threads(worker, range(4))
        self.assertEqual(errors, [])
        self.assertEqual(sorted(revisions), list(range(4, 84)), "every commit got its own revision")
        self.assertEqual(JsonFileStore(self.root).load("t").state.revision, 83)  # type: ignore[union-attr]

    def test_a_forked_child_of_the_same_store_object_waits_for_the_parent_and_the_parent_for_it(self) -> None:
        # Fork first (no thread inside the store), then take turns across the pipe.
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(to_child_w)
                os.close(to_parent_r)
                os.read(to_child_r, 1)  # the parent holds the task now
                start = time.monotonic()
                with self.store._transaction("t", create=False):
                    waited = time.monotonic() - start
                    os.write(to_parent_w, b"1" if waited >= WAIT_S * 0.9 else b"0")
                    os.read(to_child_r, 1)  # hold it until the parent has tried a commit
                    time.sleep(WAIT_S)
                code = 0
            finally:
                os._exit(code)
        os.close(to_child_r)
        os.close(to_parent_w)
        try:
            with self.store._transaction("t", create=False):
                os.write(to_child_w, b"go")
                time.sleep(WAIT_S)
            waited = os.read(to_parent_r, 1)
            self.assertEqual(waited, b"1", "the child entered while the parent held the task through the held descriptor")
            inside = Inside(lambda: self.store.commit(self.lease, self.state, ()))
            os.write(to_child_w, b"g")
            # The child holds the task for WAIT_S after this byte: the commit must not finish first.
            self.assertFalse(inside.done.wait(WAIT_S * 0.5), "the parent committed while its child held the task")
            inside.join()
            self.assertEqual(inside.errors, [])
        finally:
            os.close(to_child_w)
            os.close(to_parent_r)
            _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)

    def test_a_takeover_in_another_process_fences_the_held_lease(self) -> None:
        # Expired by the clock it passes: taken over with a newer epoch.
        in_a_child(self, lambda: JsonFileStore(self.root).acquire_lease("t", "them", 30.0, NOW + 1000.0))
        before = JsonFileStore(self.root).load("t").state.revision  # type: ignore[union-attr]
        with self.assertRaises(FencedError):
            self.store.commit(self.lease, self.state, ())
        self.assertEqual(JsonFileStore(self.root).load("t").state.revision, before)  # type: ignore[union-attr]

    def test_alternating_takeovers_always_fence_the_previous_holder(self) -> None:
        # Every takeover replaces lease.json with a file of about the same size: the held pin must
        # tell each one from the last.
        stores = [self.store, JsonFileStore(self.root)]
        self.addCleanup(stores[1].close)
        lease, state = self.lease, self.state
        holder = 0
        now = NOW
        for round_number in range(30):
            now += 100.0
            contender = 1 - holder
            new_lease = stores[contender].acquire_lease("t", f"o{contender}", 30.0, now)
            self.assertGreater(new_lease.epoch, lease.epoch)
            revision = JsonFileStore(self.root).load("t").state.revision  # type: ignore[union-attr]
            with self.assertRaises(FencedError, msg=f"round {round_number}"):
                stores[holder].commit(lease, state, ())
            self.assertEqual(JsonFileStore(self.root).load("t").state.revision, revision)  # type: ignore[union-attr]
            stores[contender].load("t", lease=new_lease)
            state = new_state()
            stores[contender].commit(new_lease, state, ())
            lease, holder = new_lease, contender


class LockFileReplacedTests(HeldTaskCase):
    """The lock file is the one name every process meets at, and ``flock`` locks a file, not a name:
    a store object that held the descriptor of a lock file since deleted (or replaced) must not go
    on locking an inode nobody else opens. Each transaction checks the name under the lock."""

    def setUp(self) -> None:
        super().setUp()
        self.lock_path = os.path.join(self.store.task_dir("t"), jsonfile.LOCK)

    def newcomer_excluded(self) -> bool:
        """Whether another store object waits while this one is inside a transaction."""
        other = JsonFileStore(self.root)
        self.addCleanup(other.close)
        with self.store._transaction("t", create=False):
            inside = Inside(lambda: self._enter_and_leave(other))
            excluded = not inside.done.wait(WAIT_S)
        inside.join()
        return excluded

    def test_a_deleted_lock_file_still_orders_a_holder_and_a_newcomer(self) -> None:
        os.unlink(self.lock_path)  # an operator "cleaning a stale lock"; no transaction in flight
        self.assertTrue(self.newcomer_excluded(), "another store object locked the task while this one was inside its transaction")

    def test_a_deleted_lock_file_between_transactions_orders_two_fresh_store_objects(self) -> None:
        # The same with nothing held: the store object opens the lock file by name.
        self.store.close()
        os.unlink(self.lock_path)
        self.assertTrue(self.newcomer_excluded())

    def test_a_paused_holder_never_lands_a_commit_after_a_takeover_once_the_lock_file_was_deleted(self) -> None:
        io = PausingIO(on="pwrite")
        store = JsonFileStore(self.root, io=io)
        self.addCleanup(store.close)
        self.store.release_lease(self.lease, NOW)
        lease, state = started(store, owner="paused")
        os.unlink(self.lock_path)
        state.next_action = "written by the paused holder"
        io.paused = "holder"
        holder = Inside(lambda: store.commit(lease, state, ()), name="holder")
        self.assertTrue(io.inside.wait(60), "the holder passed its fence and reached its journal write")
        other = JsonFileStore(self.root)
        self.addCleanup(other.close)
        # The holder's lease is over by the contender's clock (the holder is paused: GC, SIGSTOP).
        contender = Inside(lambda: other.acquire_lease("t", "contender", 30.0, NOW + 1000.0))
        took_over_while_holder_inside = contender.done.wait(WAIT_S)
        io.resume.set()
        holder.join()
        contender.join()
        self.assertEqual(contender.errors, [])
        if took_over_while_holder_inside and not holder.errors:
            new_lease = contender.result[0]
            landed = JsonFileStore(self.root).load("t").state
            assert landed is not None
            self.fail(
                f"the holder's commit at epoch {lease.epoch} landed after the lease was taken over at epoch "
                f"{new_lease.epoch} (the state now reads {landed.next_action!r} at epoch {landed.lease_epoch}, "
                f"revision {landed.revision}): the two lock files let both inside the task at once"
            )

    @staticmethod
    def _enter_and_leave(store: JsonFileStore) -> None:
        with store._transaction("t", create=False):
            pass



# -- 2. cancellations read through a held control directory -------------------------------------


class CancellationTests(HeldTaskCase):
    def setUp(self) -> None:
        super().setUp()
        self.assertTrue(self.store._control.holds("t"))
        self.control = os.path.join(self.store.task_dir("t"), "control")

    def assert_reason(self, reason: str) -> None:
        record = self.store.read_cancellation("t")
        self.assertIsNotNone(record, "the cancellation was not seen")
        assert record is not None
        self.assertIsNone(record.error)
        assert isinstance(record.body, dict)
        self.assertEqual(record.body["reason"], reason)

    def test_written_by_control_files_directly(self) -> None:
        ControlFiles(self.root, io=FileIO()).write_cancellation(Cancellation("t", NOW, "op", "direct"))
        self.assert_reason("direct")

    def test_written_by_another_process(self) -> None:
        in_a_child(self, lambda: JsonFileStore(self.root).write_cancellation(Cancellation("t", NOW, "op", "from a child")))
        self.assert_reason("from a child")

    def test_written_by_the_same_store_object_in_a_forked_child(self) -> None:
        in_a_child(self, lambda: self.store.write_cancellation(Cancellation("t", NOW, "op", "child, same object")))
        self.assert_reason("child, same object")

    def test_replaced_twice_then_removed(self) -> None:
        other = JsonFileStore(self.root)
        self.addCleanup(other.close)
        other.write_cancellation(Cancellation("t", NOW, "op", "first"))
        self.assert_reason("first")
        other.write_cancellation(Cancellation("t", NOW, "op", "second"))
        self.assert_reason("second")
        os.unlink(os.path.join(self.control, "cancel.json"))
        self.assertIsNone(self.store.read_cancellation("t"))

    def test_a_symlink_or_fifo_in_place_of_the_record_is_refused_without_hanging(self) -> None:
        target = self.path("outside.json")
        with open(target, "wb") as handle:
            handle.write(b"{}")
        path = os.path.join(self.control, "cancel.json")
        for kind in ("symlink", "fifo", "directory"):
            with self.subTest(kind=kind):
                if kind == "symlink":
                    os.symlink(target, path)
                elif kind == "fifo":
                    os.mkfifo(path, 0o600)
                else:
                    os.mkdir(path)
                try:
                    reader = Inside(lambda: self.store.read_cancellation("t"))
                    self.assertTrue(reader.done.wait(30), "the read hangs")
                    self.assertEqual(reader.errors, [])
                    record = reader.result[0]
                    self.assertIsNotNone(record, "a planted record is not 'no cancellation'")
                    self.assertIsNotNone(record.error)
                finally:
                    if kind == "directory":
                        os.rmdir(path)
                    else:
                        os.unlink(path)

    def test_a_control_directory_missing_at_the_first_read_is_walked_again(self) -> None:
        store = JsonFileStore(self.root)
        self.addCleanup(store.close)
        os.rmdir(os.path.join(self.control, "approvals"))
        os.rmdir(self.control)
        self.assertIsNone(store.read_cancellation("t"))
        self.assertFalse(store._control.holds("t"))
        JsonFileStore(self.root).write_cancellation(Cancellation("t", NOW, "op", "later"))
        record = store.read_cancellation("t")
        self.assertIsNotNone(record)

    def test_eviction_of_held_directories_under_threads_never_reads_another_tasks_record(self) -> None:
        tasks = [f"k{number}" for number in range(8)]
        for task in tasks:
            self.store.acquire_lease(task, "me", 30.0, NOW)
            self.store.write_cancellation(Cancellation(task, NOW, "op", f"reason {task}"))
        errors: list[str] = []

        def reader(offset: int) -> None:
            for index in range(200):
                task = tasks[(index + offset) % len(tasks)]
                record = self.store.read_cancellation(task)
                if record is None or not isinstance(record.body, dict) or record.body.get("reason") != f"reason {task}":
                    errors.append(f"{task}: {record!r}")
                    return

        with mock.patch.object(controlfiles, "MAX_HELD_DIRECTORIES", 2):
            in_threads(reader, range(4))
        self.assertEqual(errors, [])
        self.assertLessEqual(len(self.store._control._held), 2)


# -- 3. descriptors: bounded, closed, never closed under a commit ----------------------------


class DescriptorTests(support.TempDirTest):
    def test_many_cycles_leak_nothing(self) -> None:
        root = self.path("root")
        store = JsonFileStore(root, create=True)
        self.addCleanup(store.close)
        before = -1
        now = NOW
        for cycle in range(60):
            if cycle == 1:
                before = open_descriptors()
            now += 1.0
            lease = store.acquire_lease("t", "me", 30.0, now)
            store.load("t", lease=lease)
            state = new_state(action=f"cycle {cycle}")
            store.commit(lease, state, ())
            store.read_cancellation("t")
            store.release_lease(lease, now)
            store.close()
        self.assertLessEqual(open_descriptors(), before)
        self.assertEqual(descriptors_under(root), [])

    def test_store_objects_dropped_without_close_in_a_loop_leak_nothing(self) -> None:
        root = self.path("root")
        JsonFileStore(root, create=True).acquire_lease("t", "me", 30.0, NOW)
        before = -1
        now = NOW
        for cycle in range(40):
            if cycle == 1:
                before = open_descriptors()
            now += 100.0
            store = JsonFileStore(root)
            lease = store.acquire_lease("t", "me", 30.0, now)
            store.load("t", lease=lease)
            store.commit(lease, new_state(action=str(cycle)), ())
            store.read_cancellation("t")
            store.release_lease(lease, now)
            del store
        self.assertLessEqual(open_descriptors(), before)
        self.assertEqual(descriptors_under(root), [])

    def test_eviction_while_another_thread_is_paused_inside_a_commit_never_moves_its_write(self) -> None:
        root = self.path("root")
        io = PausingIO(on="pwrite")
        store = JsonFileStore(root, io=io, create=True)
        self.addCleanup(store.close)
        leases, states = {}, {}
        tasks = ["a"] + [f"b{number}" for number in range(6)]
        for task in tasks:
            leases[task], states[task] = started(store, task)
        with mock.patch.object(jsonfile, "MAX_OPEN_JOURNALS", 1), mock.patch.object(controlfiles, "MAX_HELD_DIRECTORIES", 1):
            store.commit(leases["a"], states["a"], ())  # a: the most recently used
            states["a"].next_action = "written by the paused thread"
            io.paused = "committer-a"
            committer = Inside(lambda: store.commit(leases["a"], states["a"], ()), name="committer-a")
            self.assertTrue(io.inside.wait(60))
            held = store._handles.get("a")
            assert held is not None
            lock_target = os.readlink(f"/proc/self/fd/{held.lock}")
            for round_number in range(3):
                for task in tasks[1:]:  # every other task, over and over: a is the one to evict
                    states[task].next_action = f"{task} {round_number}"
                    store.commit(leases[task], states[task], ())
                    store.read_cancellation(task)
            self.assertEqual(os.readlink(f"/proc/self/fd/{held.lock}"), lock_target, "a's lock descriptor was closed under its commit")
            io.resume.set()
            committer.join()
        self.assertEqual(committer.errors, [])
        for name, target in io.writes:
            task = "a" if name == "committer-a" else None
            if task is not None:
                self.assertIn(os.sep + "a" + os.sep, target)
        fresh = JsonFileStore(root)
        for task in tasks:
            loaded = fresh.load(task)
            self.assertEqual(loaded.source, "primary")
            assert loaded.state is not None
            self.assertEqual(loaded.state.next_action, states[task].next_action)
        self.assertEqual(os.listdir(os.path.join(root, "a", "quarantine")), [])

    def test_threads_on_many_tasks_over_the_bound_each_land_in_their_own_task(self) -> None:
        root = self.path("root")
        store = JsonFileStore(root, create=True)
        self.addCleanup(store.close)
        tasks = [f"t{number}" for number in range(8)]
        leases = {task: started(store, task)[0] for task in tasks}
        errors: list[BaseException] = []
        final: dict[str, str] = {}

        def worker(task: str) -> None:
            state = new_state(task)
            try:
                for index in range(25):
                    state.next_action = f"{task} {index}"
                    store.commit(leases[task], state, ())
                    store.read_cancellation(task)
                final[task] = state.next_action
            except BaseException as exc:  # reported below
                errors.append(exc)

        with mock.patch.object(jsonfile, "MAX_OPEN_JOURNALS", 2), mock.patch.object(controlfiles, "MAX_HELD_DIRECTORIES", 2):
            in_threads(worker, tasks)
        self.assertEqual(errors, [])
        fresh = JsonFileStore(root)
        for task in tasks:
            loaded = fresh.load(task)
            self.assertEqual(loaded.source, "primary", task)
            assert loaded.state is not None
            self.assertEqual((loaded.state.task_id, loaded.state.next_action, loaded.state.revision), (task, final[task], 3 + 25))


# -- 4. OS errors -------------------------------------------------------------------------------


class OsErrorTests(support.TempDirTest):
    def test_an_error_at_each_call_of_a_commit_leaves_a_before_or_after_state_and_a_usable_store(self) -> None:
        # SQLite's way: fail the N-th call of a commit through held descriptors, N = 1, 2, ...
        for fail_at in range(1, 12):
            with self.subTest(fail_at=fail_at):
                root = self.path(f"root{fail_at}")
                io = FaultyIO(kinds={"flock", "lstat", "open", "read", "fstat", "pread", "pwrite", "fdatasync"})
                store = JsonFileStore(root, io=io, create=True)
                self.addCleanup(store.close)
                lease, state = started(store)
                before = JsonFileStore(root).load("t").state
                assert before is not None
                state.next_action = "the failing commit"
                io.calls, io.fail_at = 0, fail_at
                try:
                    store.commit(lease, state, ())
                    failed = False
                except StorageError:
                    failed = True
                io.fail_at = 0
                after = JsonFileStore(root).load("t").state
                assert after is not None
                if failed:
                    self.assertIn(
                        (after.revision, after.next_action),
                        [(before.revision, before.next_action), (before.revision + 1, "the failing commit")],
                    )
                else:
                    self.assertEqual((after.revision, after.next_action), (before.revision + 1, "the failing commit"))
                # Usable after a reload: the next commit lands on top of whatever is there.
                store.load("t", lease=lease)
                state.next_action = "after"
                revision = store.commit(lease, state, ())
                self.assertEqual(revision, after.revision + 1)
                self.assertEqual(JsonFileStore(root).load("t").state.next_action, "after")  # type: ignore[union-attr]
                # And still fenced after a takeover.
                JsonFileStore(root).acquire_lease("t", "them", 30.0, NOW + 1000.0)
                with self.assertRaises(FencedError):
                    store.commit(lease, state, ())

    def test_an_error_on_every_lease_read_call_then_a_takeover_is_still_fenced(self) -> None:
        for kind in ("lstat", "open", "fstat", "read"):
            with self.subTest(kind=kind):
                root = self.path(f"root-{kind}")
                io = FaultyIO(kinds={kind})
                store = JsonFileStore(root, io=io, create=True)
                self.addCleanup(store.close)
                lease, state = started(store)
                JsonFileStore(root).acquire_lease("t", "them", 30.0, NOW + 1000.0)  # replaces lease.json
                io.calls, io.fail_at = 0, 1
                with contextlib.suppress(StorageError, FencedError):
                    store.commit(lease, state, ())
                io.fail_at = 0
                revision = JsonFileStore(root).load("t").state.revision  # type: ignore[union-attr]
                with self.assertRaises(LongrunError):
                    store.commit(lease, state, ())
                with self.assertRaises(FencedError):
                    store.load("t", lease=lease)
                self.assertEqual(JsonFileStore(root).load("t").state.revision, revision)  # type: ignore[union-attr]


# -- 5. lease file edge cases ------------------------------------------------------------------


class LeaseFileTests(HeldTaskCase):
    def setUp(self) -> None:
        super().setUp()
        self.lease_path = os.path.join(self.store.task_dir("t"), jsonfile.LEASE)

    def revision(self) -> int:
        return JsonFileStore(self.root).load("t").state.revision  # type: ignore[union-attr]

    def test_a_deleted_lease_file_means_no_lease(self) -> None:
        os.unlink(self.lease_path)
        before = self.revision()
        with self.assertRaises(FencedError):
            self.store.commit(self.lease, self.state, ())
        self.assertIsNone(self.store.read_lease("t"))
        self.assertEqual(self.revision(), before)

    def test_a_lease_quarantined_by_another_store_objects_repair_fences_the_holder(self) -> None:
        with open(self.lease_path, "r+b") as handle:  # damage, then another object repairs it
            handle.seek(5)
            handle.write(b"#")
        with self.assertRaises(CorruptStateError):  # the holder lets its holder lock go
            self.store.commit(self.lease, self.state, ())
        other = JsonFileStore(self.root)
        self.addCleanup(other.close)
        with self.assertLogs("longrun", "WARNING"):
            other.repair_lease("t", NOW)
        before = self.revision()
        with self.assertRaises(FencedError):
            self.store.commit(self.lease, self.state, ())
        self.assertEqual(self.revision(), before)

    def test_a_lease_quarantined_by_this_store_object_then_rewritten(self) -> None:
        with open(self.lease_path, "r+b") as handle:
            handle.seek(5)
            handle.write(b"#")
        with self.assertRaises(CorruptStateError):
            self.store.commit(self.lease, self.state, ())
        with self.assertLogs("longrun", "WARNING"):
            self.store.repair_lease("t", NOW)
        with self.assertRaises(FencedError):
            self.store.commit(self.lease, self.state, ())
        lease = self.store.acquire_lease("t", "me", 30.0, NOW + 1.0)
        self.store.load("t", lease=lease)
        self.store.commit(lease, self.state, ())

    def test_a_symlink_fifo_or_directory_in_place_of_the_lease_is_refused_without_hanging(self) -> None:
        saved = self.lease_path + ".saved"
        before = self.revision()
        for kind in ("symlink", "fifo", "directory"):
            with self.subTest(kind=kind):
                os.rename(self.lease_path, saved)
                if kind == "symlink":
                    os.symlink(saved, self.lease_path)  # the very bytes of the lease, through a link
                elif kind == "fifo":
                    os.mkfifo(self.lease_path, 0o600)
                else:
                    os.mkdir(self.lease_path)
                try:
                    committer = Inside(lambda: self.store.commit(self.lease, self.state, ()))
                    self.assertTrue(committer.done.wait(30), "the commit hangs on the lease file")
                    self.assertEqual(len(committer.errors), 1, "a commit through a planted lease file succeeded")
                    self.assertIsInstance(committer.errors[0], LongrunError)
                    reader = Inside(lambda: self.store.read_lease("t"))
                    self.assertTrue(reader.done.wait(30), "the read hangs on the lease file")
                    self.assertEqual(len(reader.errors), 1)
                finally:
                    if kind == "directory":
                        os.rmdir(self.lease_path)
                    else:
                        os.unlink(self.lease_path)
                    os.rename(saved, self.lease_path)
                self.assertEqual(self.revision(), before)
        self.store.load("t", lease=self.lease)
        self.store.commit(self.lease, self.state, ())
        self.assertEqual(self.revision(), before + 1)

    def test_a_lease_rewritten_in_place_with_a_different_size_is_noticed(self) -> None:
        other = JsonFileStore(self.root)
        self.addCleanup(other.close)
        old_inode = self.lease_path + ".old"
        os.link(self.lease_path, old_inode)
        new_lease = other.acquire_lease("t", "a-longer-owner-name", 30.0, NOW + 1000.0)
        with open(self.lease_path, "rb") as handle:
            newer = handle.read()
        other.close()
        # Put the old lease's inode back (the one the store holds), then overwrite it in place
        # with the newer record, whose size differs.
        os.replace(old_inode, self.lease_path)
        held = self.store._handles.get("t")
        assert held is not None and held.lease >= 0
        self.assertEqual(os.stat(self.lease_path).st_ino, os.fstat(held.lease).st_ino)
        with open(self.lease_path, "r+b") as handle:
            handle.write(newer)
            handle.truncate()
        self.assertNotEqual(len(newer), held.lease_key[2] if held.lease_key else -1)
        before = self.revision()
        with self.assertRaises(FencedError):
            self.store.commit(self.lease, self.state, ())
        self.assertEqual(self.revision(), before)
        self.assertEqual(self.store.read_lease("t").epoch, new_lease.epoch)  # type: ignore[union-attr]


if __name__ == "__main__":
    unittest.main()
