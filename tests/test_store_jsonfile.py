"""The JSON-file store: lease and fencing rules, atomic commits, backup, quarantine, permissions, bad paths."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import unittest

import support
from longrun import (
    Approval,
    Cancellation,
    FencedError,
    ForeignStateError,
    InvalidInputError,
    JsonFileStore,
    LeaseHeldError,
    RunState,
    StateUnrecoverableError,
    StorageError,
    UnknownTaskError,
)
from longrun.budget import BudgetCounters
from longrun.stores._fileio import FileIO


def new_state(task: str = "t") -> RunState:
    return RunState(task_id=task, plan_digest="sha256:p", budget=BudgetCounters(created_at=0.0), next_action="go")


class StoreCase(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.store = JsonFileStore(self.path("root"))

    def file(self, *parts: str) -> str:
        return os.path.join(self.store.root, "t", *parts)

    def read(self, *parts: str) -> bytes:
        with open(self.file(*parts), "rb") as handle:
            return handle.read()

    def committed(self, revisions: int = 1):
        lease = self.store.acquire_lease("t", "me", 30.0, 0.0)
        self.store.load("t", lease=lease)
        state = new_state()
        for _ in range(revisions):
            self.store.commit(lease, state)
        return lease, state


class LeaseTests(StoreCase):
    def test_epochs_increase_and_a_live_lease_excludes_another_owner(self) -> None:
        first = self.store.acquire_lease("t", "a", 10.0, 0.0)
        with self.assertRaises(LeaseHeldError) as caught:
            self.store.acquire_lease("t", "b", 10.0, 5.0)
        self.assertEqual(caught.exception.holder, first)
        second = self.store.acquire_lease("t", "b", 10.0, 10.0)  # expired exactly at 10.0
        self.assertEqual((first.epoch, second.epoch), (1, 2))
        self.store.release_lease(second, 11.0)
        third = self.store.acquire_lease("t", "c", 10.0, 11.0)
        self.assertEqual(third.epoch, 3)

    def test_every_mutating_call_with_a_stale_epoch_is_fenced_and_changes_nothing(self) -> None:
        stale, state = self.committed()
        self.store.acquire_lease("t", "new", 30.0, 100.0)
        before = {name: self.read(name) for name in ("state.json", "lease.json")}
        for name, call in (
            ("commit", lambda: self.store.commit(stale, state)),
            ("renew", lambda: self.store.renew_lease(stale, 30.0, 101.0)),
            ("release", lambda: self.store.release_lease(stale, 101.0)),
            ("repairing load", lambda: self.store.load("t", lease=stale)),
        ):
            with self.subTest(call=name), self.assertRaises(FencedError):
                call()
            self.assertEqual({n: self.read(n) for n in before}, before)

    def test_lost_lease_record_does_not_restart_epochs(self) -> None:
        lease, state = self.committed()
        second = self.store.acquire_lease("t", "b", 30.0, 100.0)
        self.store.load("t", lease=second)
        self.store.commit(second, state)
        os.unlink(self.file("lease.json"))
        third = self.store.acquire_lease("t", "c", 30.0, 200.0)
        self.assertGreater(third.epoch, second.epoch)

    def test_bad_lease_arguments(self) -> None:
        for ttl in (0, -1, float("nan"), True):
            with self.subTest(ttl=ttl), self.assertRaises(InvalidInputError):
                self.store.acquire_lease("t", "a", ttl, 0.0)
        with self.assertRaises(InvalidInputError):
            self.store.acquire_lease("t", "", 1.0, 0.0)
        with self.assertRaises(InvalidInputError):
            self.store.acquire_lease("../t", "a", 1.0, 0.0)


class CommitTests(StoreCase):
    def test_revisions_increase_and_the_backup_holds_the_previous_revision(self) -> None:
        lease, state = self.committed(3)
        self.assertEqual(state.revision, 3)
        self.assertEqual(self.store.load("t").state.revision, 3)
        from longrun.envelope import decode

        self.assertEqual(decode(self.read("state.json.bak")).revision, 2)
        other = JsonFileStore(self.store.root)  # a store that never loaded reads the revision first
        self.assertEqual(other.commit(lease, state), 4)

    def test_files_are_owner_only_and_no_temporary_is_left(self) -> None:
        lease, _ = self.committed(2)
        self.store.write_cancellation(Cancellation("t", 1.0, "ops", "stop"))
        for directory, _, files in os.walk(self.store.root):
            self.assertEqual(stat.S_IMODE(os.stat(directory).st_mode), 0o700, directory)
            for name in files:
                self.assertEqual(stat.S_IMODE(os.stat(os.path.join(directory, name)).st_mode), 0o600, name)
                self.assertNotIn(".tmp-", name)

    def test_a_failed_write_poisons_the_task_until_it_is_loaded_again(self) -> None:
        class FailingFsync(FileIO):
            fail = False

            def fsync(self, fd: int) -> None:
                if self.fail:
                    raise OSError(errno.EIO, "injected")
                super().fsync(fd)

        io = FailingFsync()
        store = JsonFileStore(self.path("root"), io=io)
        lease = store.acquire_lease("t", "me", 30.0, 0.0)
        store.load("t", lease=lease)
        state = new_state()
        store.commit(lease, state)
        before = self.read("state.json")
        io.fail = True
        with self.assertRaises(StorageError) as caught:
            store.commit(lease, state)
        self.assertIsInstance(caught.exception.__cause__, OSError)
        self.assertEqual(self.read("state.json"), before)
        self.assertEqual(state.revision, 1)
        io.fail = False
        with self.assertRaises(StorageError):
            store.commit(lease, state)  # refused: the store must reload first
        self.assertEqual(self.read("state.json"), before)
        store.load("t", lease=lease)
        self.assertEqual(store.commit(lease, state), 2)


class DamageTests(StoreCase):
    def test_damaged_state_is_quarantined_and_the_backup_used_with_every_step_observed(self) -> None:
        lease, state = self.committed(3)
        with open(self.file("state.json"), "r+b") as handle:
            handle.truncate(20)
        read_only = self.store.load("t")
        self.assertEqual(read_only.source, "backup")
        self.assertEqual(os.listdir(self.file("quarantine")), [], "a read-only load moves nothing")
        result = self.store.load("t", lease=lease)
        self.assertEqual(result.source, "backup")
        self.assertTrue(result.state.reconcile_all)
        self.assertEqual(result.state.revision, 2)
        self.assertEqual(len(os.listdir(self.file("quarantine"))), 1)
        self.assertEqual(self.store.commit(lease, result.state), 4, "revision 3 may have been committed: skipped")

    def test_rolled_back_state_file_is_detected(self) -> None:
        lease, state = self.committed(3)
        shutil.copy(self.file("state.json"), self.path("rev3"))
        self.store.commit(lease, state)
        os.replace(self.file("state.json.bak"), self.path("rev3b"))
        shutil.copy(self.path("rev3b"), self.file("state.json.bak"))
        shutil.copy(self.path("rev3"), self.file("state.json"))  # state.json now equals the backup's revision
        result = self.store.load("t", lease=lease)
        self.assertEqual(result.source, "backup")
        self.assertTrue(any("rolled-back" in name for name in os.listdir(self.file("quarantine"))))

    def test_both_damaged_is_unrecoverable_and_stays_so(self) -> None:
        lease, _ = self.committed(3)
        for name in ("state.json", "state.json.bak"):
            with open(self.file(name), "wb") as handle:
                handle.write(b"garbage")
        for _ in range(2):
            with self.assertRaises(StateUnrecoverableError):
                self.store.load("t", lease=lease)
        self.assertEqual(len(os.listdir(self.file("quarantine"))), 2)

    def test_foreign_state_is_refused_and_not_moved(self) -> None:
        self.committed(2)
        other = JsonFileStore(self.path("root"))
        lease = other.acquire_lease("u", "me", 30.0, 0.0)
        other.load("u", lease=lease)
        shutil.copy(self.file("state.json"), os.path.join(other.root, "u", "state.json"))
        with self.assertRaises(ForeignStateError):
            other.load("u", lease=lease)
        self.assertTrue(os.path.exists(os.path.join(other.root, "u", "state.json")))
        self.assertEqual(os.listdir(os.path.join(other.root, "u", "quarantine")), [])

    def test_temporary_files_are_never_read_as_state(self) -> None:
        lease, state = self.committed(1)
        with open(self.file("state.json.tmp-deadbeef"), "wb") as handle:
            handle.write(b"{}")
        result = self.store.load("t", lease=lease)
        self.assertEqual(result.state.revision, 1)
        self.assertFalse(os.path.exists(self.file("state.json.tmp-deadbeef")))


class PathTests(StoreCase):
    def test_unknown_task_is_a_typed_error(self) -> None:
        with self.assertRaises(UnknownTaskError):
            self.store.read_lease("nope")
        with self.assertRaises(UnknownTaskError):
            self.store.load("nope")
        with self.assertRaises(UnknownTaskError):
            self.store.write_cancellation(Cancellation("nope", 0.0, "a", "b"))
        with self.assertRaises(LookupError):  # also a builtin LookupError, for generic handlers
            self.store.write_approval(Approval("ap", "nope", "p", "s", "d", "a", 1.0, "ops", 0.0))
        with self.assertRaises(UnknownTaskError):
            self.store.read_cancellation("nope")
        with self.assertRaises(UnknownTaskError):
            self.store.read_approvals("nope")

    def test_symlinks_are_refused(self) -> None:
        os.makedirs(self.path("elsewhere"))
        os.makedirs(self.store.root)
        os.symlink(self.path("elsewhere"), os.path.join(self.store.root, "t"))
        with self.assertRaises(StorageError):
            self.store.acquire_lease("t", "me", 30.0, 0.0)
        self.assertEqual(os.listdir(self.path("elsewhere")), [])
        other = JsonFileStore(self.path("root2"))
        lease = other.acquire_lease("t", "me", 30.0, 0.0)
        os.symlink(self.path("elsewhere"), os.path.join(other.root, "t", "state.json"))
        with self.assertRaises(StorageError):
            other.load("t", lease=lease)

    def test_path_like_names_are_refused_everywhere(self) -> None:
        self.committed(1)
        for call in (
            lambda: self.store.load("../t"),
            lambda: self.store.read_lease("t/../../x"),
            lambda: self.store.write_approval(Approval("../x", "t", "p", "s", "d", "a", 1.0, "ops", 0.0)),
        ):
            with self.assertRaises(InvalidInputError):
                call()

    def test_list_tasks(self) -> None:
        self.committed(1)
        os.makedirs(os.path.join(self.store.root, ".not-a-task"))
        self.assertEqual(self.store.list_tasks(), ["t"])
        self.assertEqual(JsonFileStore(self.path("missing")).list_tasks(), [])


if __name__ == "__main__":
    unittest.main()
