"""Adversarial tests of the JSON-file store's held descriptors (``stores.jsonfile._handles``, the held
``control`` directories of ``stores.controlfiles``): exclusion, fencing, fresh cancellations, no
leaked or misused descriptor, OS errors, and odd lease files, each tried against a store object
that already holds the task's lock file, lease file and control directory."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import os
import threading
import time
import unittest
from typing import Any
from unittest import mock

from helpers import support
from longrun import Cancellation, FencedError, JsonFileStore, RunState, StorageError
from longrun.budget import BudgetCounters
from longrun.errors import CorruptStateError, LongrunError
from longrun.ledger import EffectRecord, EffectState
from longrun.stores import controlfiles, jsonfile
from longrun.stores._fileio import FileIO
from longrun.stores.controlfiles import ControlFiles
from longrun.testing import FaultyIO

WAIT_S = 0.5
"""How long a transaction that must be excluded is watched: still blocked after this, it waits."""
NOW = 1_000_000.0


def new_state(task: str = "t", action: str = "go") -> RunState:
    state = RunState(task_id=task, plan_digest="sha256:p", budget=BudgetCounters(created_at=0.0), next_action=action)
    state.effects["s0"] = EffectRecord(f"{task}/s0", "s0", "write", {"n": 0}, f"sha256:{0:064x}", EffectState.PLANNED, updated_at=1.0)
    return state


def started(store: JsonFileStore, task: str = "t", owner: str = "me", now: float = NOW) -> tuple[Any, RunState]:
    """A lease, a loaded task and three commits: the store object holds the task's lock file, its
    lease file and (after the cancellation read) its control directory."""
    lease = store.acquire_lease(task, owner, 30.0, now)
    store.load(task, lease=lease)
    state = new_state(task)
    for _ in range(3):
        store.commit(lease, state, {"s0"})
    store.read_cancellation(task)
    held = store._handles.get(task)
    assert held is not None and held.lock >= 0 and held.lease >= 0
    return lease, state


def open_descriptors() -> int:
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


def descriptors_under(path: str) -> list[str]:
    gc.collect()
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(path + os.sep):
            found.append(target)
    return found


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


class ExclusionTests(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.root = self.path("root")
        self.store = JsonFileStore(self.root, create=True)
        self.addCleanup(self.store.close)
        self.lease, self.state = started(self.store)

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

        threads = [threading.Thread(target=worker, args=(number,)) for number in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
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
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                other = JsonFileStore(self.root)
                other.acquire_lease("t", "them", 30.0, NOW + 1000.0)  # expired by this clock
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
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


class LockFileReplacedTests(support.TempDirTest):
    """The lock file is the one name every process meets at. Before held descriptors, each
    transaction opened it by name, so a lock file deleted (or replaced) between transactions cost
    nothing: every later transaction met at the new one. A store object that keeps the old one
    open keeps locking an inode nobody else opens."""

    def setUp(self) -> None:
        super().setUp()
        self.root = self.path("root")
        self.store = JsonFileStore(self.root, create=True)
        self.addCleanup(self.store.close)
        self.lease, self.state = started(self.store)
        self.lock_path = os.path.join(self.store.task_dir("t"), jsonfile.LOCK)

    def test_a_deleted_lock_file_still_orders_a_holder_and_a_newcomer(self) -> None:
        os.unlink(self.lock_path)  # an operator "cleaning a stale lock"; no transaction in flight
        other = JsonFileStore(self.root)
        self.addCleanup(other.close)
        with self.store._transaction("t", create=False):
            inside = Inside(lambda: self._enter_and_leave(other))
            excluded = not inside.done.wait(WAIT_S)
        inside.join()
        self.assertTrue(excluded, "another store object locked the task while this one was inside its transaction")

    def test_a_deleted_lock_file_between_transactions_orders_two_fresh_store_objects(self) -> None:
        # The same without held descriptors (the behaviour before them): this passes.
        self.store.close()
        os.unlink(self.lock_path)
        other = JsonFileStore(self.root)
        self.addCleanup(other.close)
        with self.store._transaction("t", create=False):
            inside = Inside(lambda: self._enter_and_leave(other))
            excluded = not inside.done.wait(WAIT_S)
        inside.join()
        self.assertTrue(excluded)

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


if __name__ == "__main__":
    unittest.main()
