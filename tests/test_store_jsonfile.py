"""The JSON-file store: lease and fencing rules, one durable write per commit, snapshot and journal,
backup, quarantine, permissions, bad paths. ``test_journal`` breaks the format byte by byte."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import stat
import unittest

from helpers import support
from longrun import (
    Approval,
    Cancellation,
    CorruptStateError,
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
from longrun.errors import NotAStoreError
from longrun.envelope import encode as encode_legacy
from longrun.ledger import EffectRecord, EffectState
from longrun.stores import jsonfile
from longrun.stores._fileio import FileIO


def new_state(task: str = "t") -> RunState:
    return RunState(task_id=task, plan_digest="sha256:p", budget=BudgetCounters(created_at=0.0), next_action="go")


def effect(index: int, state: EffectState = EffectState.PLANNED, task: str = "t") -> EffectRecord:
    return EffectRecord(f"{task}/s{index}", f"s{index}", "write", {"n": index}, f"sha256:{index:064x}", state, updated_at=1.0)


class CountingIO(FileIO):
    """Counts the calls that change the disk or make it durable, and the bytes written."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.written = 0

    def reset(self) -> None:
        self.calls.clear()
        self.written = 0

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def write(self, fd: int, data: bytes) -> int:
        self._count("write")
        self.written += len(data)
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._count("pwrite")
        self.written += len(data)
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self._count("fsync")
        super().fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self._count("fdatasync")
        super().fdatasync(fd)

    def fsync_dir(self, path: str) -> None:
        self._count("fsync_dir")
        super().fsync_dir(path)

    def replace(self, source: str, destination: str) -> None:
        self._count("replace")
        super().replace(source, destination)


class StoreCase(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.store = JsonFileStore(self.path("root"), create=True)
        self.addCleanup(self.store.close)
        # Damage tests provoke recovery warnings on purpose: checked, not printed.
        support.ExpectedWarnings(
            self, r"^task \S+: state recovered from ", r"^task \S+: dropped an incomplete last record ", at_least_one=False
        ).start()

    def file(self, *parts: str) -> str:
        return os.path.join(self.store.root, "t", *parts)

    def read(self, *parts: str) -> bytes:
        with open(self.file(*parts), "rb") as handle:
            return handle.read()

    def files(self) -> dict[str, bytes]:
        """Every regular file of the task but its lock, with its bytes."""
        out = {}
        for name in sorted(os.listdir(self.file())):
            if name != "lock" and os.path.isfile(self.file(name)):
                out[name] = self.read(name)
        return out

    def journals(self) -> list[str]:
        return sorted(name for name in os.listdir(self.file()) if name.startswith("journal."))

    def committed(self, revisions: int = 1, *, effects: int = 0):
        lease = self.store.acquire_lease("t", "me", 30.0, 0.0)
        self.store.load("t", lease=lease)
        state = new_state()
        for index in range(effects):
            state.effects[f"s{index}"] = effect(index)
        for _ in range(revisions):
            self.store.commit(lease, state, set(state.effects))
        return lease, state

    def assert_same_content(self, loaded: RunState, expected: RunState) -> None:
        """Equal but for the revision and ``reconcile_all`` (which a recovery sets)."""
        a, b = loaded.to_json(), expected.to_json()
        for document in (a, b):
            document.pop("revision")
            document.pop("reconcile_all")
        self.assertEqual(a, b)


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
        stale, state = self.committed(3, effects=2)
        self.store.acquire_lease("t", "new", 30.0, 100.0)
        before = self.files()
        for name, call in (
            ("commit", lambda: self.store.commit(stale, state)),
            ("commit of a changed record", lambda: self.store.commit(stale, state, {"s0"})),
            ("renew", lambda: self.store.renew_lease(stale, 30.0, 101.0)),
            ("release", lambda: self.store.release_lease(stale, 101.0)),
            ("repairing load", lambda: self.store.load("t", lease=stale)),
        ):
            with self.subTest(call=name), self.assertRaises(FencedError):
                call()
            self.assertEqual(self.files(), before, "no file of the task changed, journal and lease included")

    def test_a_lease_read_from_cache_still_sees_another_process_acquire(self) -> None:
        lease, state = self.committed(2)
        other = JsonFileStore(self.store.root)  # another process, as far as caches go
        taken = other.acquire_lease("t", "other", 30.0, 100.0)
        with self.assertRaises(FencedError):
            self.store.commit(lease, state)
        self.assertEqual(self.store.read_lease("t"), taken)

    def test_lost_lease_record_does_not_restart_epochs(self) -> None:
        lease, state = self.committed()
        second = self.store.acquire_lease("t", "b", 30.0, 100.0)
        self.store.load("t", lease=second)
        self.store.commit(second, state)
        os.unlink(self.file("lease.json"))
        third = self.store.acquire_lease("t", "c", 30.0, 200.0)
        self.assertGreater(third.epoch, second.epoch)

    def test_a_lost_lease_record_beside_damaged_state_still_never_reissues_an_epoch(self) -> None:
        lease, state = self.committed()
        for now in (100.0, 200.0):  # commits at epochs 2 and 3, in the journal
            lease = self.store.acquire_lease("t", "next", 30.0, now)
            self.store.load("t", lease=lease)
            self.store.commit(lease, state)
        self.assertEqual(lease.epoch, 3)
        os.unlink(self.file("lease.json"))
        with open(self.file("state.json"), "r+b") as handle:
            handle.write(b"garbage")  # the snapshot no longer validates; the journal lines still do
        taken = JsonFileStore(self.store.root).acquire_lease("t", "after", 30.0, 300.0)
        self.assertGreater(taken.epoch, 3)

    def test_a_lease_record_written_before_tokens_still_loads_and_its_epoch_fences(self) -> None:
        from longrun.canonical import canonical_bytes, sha256_hex

        holder = self.store.acquire_lease("t", "old-holder", 30.0, 0.0)
        old = dataclasses.replace(holder, token=None, holder_lock=None)  # what older code held and wrote
        body = old.to_json()
        for document in ({**body, "checksum": "sha256:" + sha256_hex(canonical_bytes(body))}, body):
            with self.subTest(checksum="checksum" in document):
                with open(self.file("lease.json"), "wb") as handle:
                    handle.write(canonical_bytes(document))
                other = JsonFileStore(self.store.root)
                self.assertEqual(other.read_lease("t"), old)
                with self.assertRaises(LeaseHeldError):  # live: no owner name opens it, the old one neither
                    other.acquire_lease("t", "old-holder", 30.0, 1.0)
                renewed = other.renew_lease(old, 30.0, 2.0)  # its holder renews with the epoch alone
                self.assertEqual(renewed.epoch, old.epoch)
        taken = JsonFileStore(self.store.root).acquire_lease("t", "new", 30.0, 100.0)
        self.assertIsNotNone(taken.token)
        with self.assertRaises(FencedError):
            self.store.renew_lease(old, 30.0, 101.0)

    def test_bad_lease_arguments(self) -> None:
        for ttl in (0, -1, float("nan"), True):
            with self.subTest(ttl=ttl), self.assertRaises(InvalidInputError):
                self.store.acquire_lease("t", "a", ttl, 0.0)
        with self.assertRaises(InvalidInputError):
            self.store.acquire_lease("t", "", 1.0, 0.0)
        with self.assertRaises(InvalidInputError):
            self.store.acquire_lease("../t", "a", 1.0, 0.0)


class CommitTests(StoreCase):
    def test_revisions_increase_and_the_backup_chain_holds_every_revision(self) -> None:
        lease, state = self.committed(3)
        self.assertEqual(state.revision, 3)
        self.assertEqual(self.store.load("t").state.revision, 3)
        # The first snapshot became the backup at the second commit; its journal leads on.
        self.assertTrue(os.path.exists(self.file("state.json.bak")))
        self.assertEqual(self.journals(), ["journal.1.log", "journal.2.log"])
        os.unlink(self.file("state.json"))
        recovered = JsonFileStore(self.store.root).load("t")
        self.assertEqual((recovered.source, recovered.state.revision), ("backup", 3), "backup + journals reach the last revision")
        self.assertTrue(recovered.state.reconcile_all)

    def test_a_store_that_never_loaded_reads_the_revision_first(self) -> None:
        lease, state = self.committed(3)
        other = JsonFileStore(self.store.root)
        self.assertEqual(other.commit(lease, state), 4)
        self.assertEqual(JsonFileStore(self.store.root).load("t").state.revision, 4)

    def test_a_commit_is_one_fdatasync_of_one_line_and_rewrites_no_snapshot(self) -> None:
        io = CountingIO()
        store = JsonFileStore(self.path("root"), io=io, create=True)
        lease = store.acquire_lease("t", "me", 30.0, 0.0)
        store.load("t", lease=lease)
        state = new_state()
        for index in range(200):
            state.effects[f"s{index}"] = effect(index, EffectState.VERIFIED)
        store.commit(lease, state, set(state.effects))
        store.commit(lease, state, ())  # the second commit also makes the first backup
        snapshot = self.read("state.json")
        sizes = []
        for index in range(5):
            io.reset()
            state.effects[f"s{index}"] = dataclasses.replace(state.effects[f"s{index}"], evidence=f"seen {index}")
            state.next_action = f"step {index}"
            store.commit(lease, state, {f"s{index}"})
            self.assertEqual(io.calls, {"pwrite": 1, "fdatasync": 1}, "one write, one durable flush, no rename")
            sizes.append(io.written)
        self.assertEqual(self.read("state.json"), snapshot, "the snapshot is not rewritten by a commit")
        self.assertLess(max(sizes), 400, f"a commit writes what changed, not the ledger: {sizes}")
        self.assertEqual(JsonFileStore(self.store.root).load("t").state.to_json(), state.to_json())

    def test_commit_size_does_not_grow_with_the_ledger(self) -> None:
        sizes = {}
        for count in (10, 2000):
            io = CountingIO()
            store = JsonFileStore(self.path(f"root-{count}"), io=io, create=True)
            lease = store.acquire_lease("t", "me", 30.0, 0.0)
            store.load("t", lease=lease)
            state = new_state()
            for index in range(count):
                state.effects[f"s{index}"] = effect(index, EffectState.VERIFIED)
            store.commit(lease, state, set(state.effects))
            store.commit(lease, state, ())
            io.reset()
            state.effects["s5"] = dataclasses.replace(state.effects["s5"], evidence="seen again", updated_at=2.0)
            store.commit(lease, state, {"s5"})
            sizes[count] = io.written
            store.close()
        self.assertEqual(sizes[10], sizes[2000], sizes)

    def test_the_journal_is_compacted_into_a_new_snapshot_and_old_journals_go(self) -> None:
        lease, state = self.committed(2, effects=3)
        original = jsonfile.COMPACT_MIN_BYTES
        jsonfile.COMPACT_MIN_BYTES = 2000
        self.addCleanup(setattr, jsonfile, "COMPACT_MIN_BYTES", original)
        generations = set()
        for round_number in range(60):
            state.next_action = f"round {round_number}"
            state.effects["s1"] = dataclasses.replace(state.effects["s1"], evidence=f"round {round_number}")
            self.store.commit(lease, state, {"s1"})
            generations.add(tuple(self.journals()))
            self.assertLessEqual(len(self.journals()), 2, "the current journal and the backup's, nothing older")
        self.assertGreater(len(generations), 3, "compacted more than once")
        current = int(self.journals()[-1].split(".")[1])
        self.assertEqual(json.loads(self.read("state.json").split(b"\n")[0])["revision"], current)
        backup_revision = json.loads(self.read("state.json.bak").split(b"\n")[0])["revision"]
        self.assertEqual(self.journals(), [f"journal.{backup_revision}.log", f"journal.{current}.log"])
        self.assertEqual(JsonFileStore(self.store.root).load("t").state.to_json(), state.to_json())

    def test_files_are_owner_only_and_no_temporary_is_left(self) -> None:
        lease, _ = self.committed(2)
        self.store.write_cancellation(Cancellation("t", 1.0, "ops", "stop"))
        for directory, _, files in os.walk(self.store.root):
            self.assertEqual(stat.S_IMODE(os.stat(directory).st_mode), 0o700, directory)
            for name in files:
                self.assertEqual(stat.S_IMODE(os.stat(os.path.join(directory, name)).st_mode), 0o600, name)
                self.assertNotIn(".tmp-", name)

    def test_a_failed_write_poisons_the_task_until_it_is_loaded_again(self) -> None:
        class FailingSync(FileIO):
            fail = False

            def fsync(self, fd: int) -> None:
                if self.fail:
                    raise OSError(errno.EIO, "injected")
                super().fsync(fd)

            def fdatasync(self, fd: int) -> None:
                if self.fail:
                    raise OSError(errno.EIO, "injected")
                super().fdatasync(fd)

        io = FailingSync()
        store = JsonFileStore(self.path("root"), io=io, create=True)
        lease = store.acquire_lease("t", "me", 30.0, 0.0)
        store.load("t", lease=lease)
        state = new_state()
        store.commit(lease, state)
        before = self.files()
        io.fail = True
        with self.assertRaises(StorageError) as caught:
            store.commit(lease, state)
        self.assertIsInstance(caught.exception.__cause__, OSError)
        self.assertEqual(self.files(), before, "the journal's padding is put back: every byte as before")
        self.assertEqual(state.revision, 1)
        io.fail = False
        with self.assertRaises(StorageError):
            store.commit(lease, state)  # refused: the store must reload first
        self.assertEqual(self.files(), before)
        store.load("t", lease=lease)
        self.assertEqual(store.commit(lease, state), 2)

    def test_a_store_object_refuses_to_write_over_another_writers_commits(self) -> None:
        lease, state = self.committed(2, effects=1)
        other = JsonFileStore(self.store.root)  # the same lease in a second object: a misuse
        other_state = other.load("t", lease=lease).state
        other_state.next_action = "written by the other object"
        other.commit(lease, other_state)
        before = self.files()
        with self.assertRaises(StorageError):
            self.store.commit(lease, state)
        self.assertEqual(self.files(), before)
        loaded = self.store.load("t", lease=lease).state
        self.assertEqual(loaded.next_action, "written by the other object")

    def test_a_state_object_the_store_does_not_follow_is_written_whole(self) -> None:
        lease, state = self.committed(2, effects=2)
        replacement = new_state()
        replacement.effects["x"] = effect(9)
        replacement.effects["x"] = dataclasses.replace(replacement.effects["x"], step_id="x")
        self.store.commit(lease, replacement)
        self.assertEqual(JsonFileStore(self.store.root).load("t").state.to_json(), replacement.to_json())

    def test_records_changed_without_being_named_are_still_written(self) -> None:
        lease, state = self.committed(2, effects=3)
        state.effects["s7"] = effect(7)
        self.store.commit(lease, state, {"s0"})  # names one step, adds another: the count shows it
        self.assertEqual(JsonFileStore(self.store.root).load("t").state.to_json(), state.to_json())
        state.effects["s1"] = dataclasses.replace(state.effects["s1"], evidence="changed, not named")
        del state.effects["s2"]
        self.store.commit(lease, state)  # a caller that does not say what changed: every record is compared
        self.assertEqual(JsonFileStore(self.store.root).load("t").state.to_json(), state.to_json())

    def test_a_state_written_by_the_previous_format_is_read_and_continued(self) -> None:
        lease = self.store.acquire_lease("t", "me", 30.0, 0.0)
        state = new_state()
        state.effects["s0"] = effect(0, EffectState.VERIFIED)
        state.revision = 7
        with open(self.file("state.json"), "wb") as handle:
            handle.write(encode_legacy(state))
        loaded = self.store.load("t", lease=lease)
        self.assertEqual((loaded.source, loaded.state.revision), ("primary", 7))
        self.assertEqual(self.store.commit(lease, loaded.state), 8)
        reloaded = JsonFileStore(self.store.root).load("t")
        self.assertEqual((reloaded.source, reloaded.state.revision), ("primary", 8))
        self.assertEqual(reloaded.state.effects, state.effects)


class PlanOutlineTests(StoreCase):
    def test_the_outline_is_written_with_the_snapshot_and_again_only_when_it_changes(self) -> None:
        from longrun.envelope import PlanOutline

        lease, state = self.committed(effects=2)
        state.plan_outline = PlanOutline(("s0", "s1", "s2"), ("write", "write", "mail"))
        self.store.commit(lease, state, ())
        for index in range(3):
            state.next_action = f"commit {index}"
            self.store.commit(lease, state, ())
        lines = [line for name in self.journals() for line in self.read(name).rstrip(b"\0").splitlines()[1:]]
        self.assertEqual([json.loads(line.split(b" ", 1)[1])["rev"] for line in lines if b"plan_outline" in line], [2])
        self.assertEqual(JsonFileStore(self.store.root).load("t").state.plan_outline, state.plan_outline)
        history = JsonFileStore(self.store.root).history("t")
        self.assertTrue(any("plan outline recorded (3 steps)" in str(entry["description"]) for entry in history))
        # A store object that loaded the task writes it only if it changes, and a snapshot keeps it.
        store = JsonFileStore(self.store.root)
        lease = store.acquire_lease("t", "me", 30.0, 100.0)  # the first lease is over: a new one, epoch 2
        loaded = store.load("t", lease=lease).state
        loaded.next_action = "after a reload"
        store.commit(lease, loaded, ())
        journal = self.read(self.journals()[-1]).rstrip(b"\0").splitlines()
        self.assertNotIn(b"plan_outline", journal[-1])
        self.assertEqual(JsonFileStore(self.store.root).load("t").state.plan_outline, state.plan_outline)


class DamageTests(StoreCase):
    def test_damaged_snapshot_is_quarantined_and_the_backup_chain_used_with_every_step_observed(self) -> None:
        lease, state = self.committed(3, effects=2)
        with open(self.file("state.json"), "r+b") as handle:
            handle.truncate(20)
        read_only = self.store.load("t")
        self.assertEqual(read_only.source, "backup")
        self.assertEqual(os.listdir(self.file("quarantine")), [], "a read-only load moves nothing")
        result = self.store.load("t", lease=lease)
        self.assertEqual(result.source, "backup")
        self.assertTrue(result.state.reconcile_all)
        self.assert_same_content(result.state, state)
        self.assertGreater(result.state.revision, 3, "a new revision above every one that may have been committed")
        self.assertEqual([name.split(".")[:2] for name in os.listdir(self.file("quarantine"))], [["state", "json"]])
        recovered_revision = result.state.revision
        self.assertEqual(self.store.commit(lease, result.state), recovered_revision + 1)
        reloaded = JsonFileStore(self.store.root).load("t")
        self.assertEqual(reloaded.source, "primary")
        self.assertTrue(reloaded.state.reconcile_all, "the recovery survives a restart until the runner clears it")

    def test_damage_in_the_middle_of_the_journal_recovers_the_records_before_it(self) -> None:
        lease, state = self.committed(2, effects=2)
        seen = []
        for index in range(4):
            state.next_action = f"commit {index}"
            self.store.commit(lease, state)
            seen.append(state.to_json())
        journal = self.journals()[-1]
        lines = self.read(journal).rstrip(b"\0").split(b"\n")
        damaged = bytearray(self.read(journal))
        offset = len(b"\n".join(lines[:3])) + 30  # inside the third record of four
        damaged[offset] ^= 0x01
        with open(self.file(journal), "wb") as handle:
            handle.write(damaged)
        result = self.store.load("t", lease=lease)
        self.assertEqual(result.source, "backup")
        self.assertTrue(result.state.reconcile_all)
        self.assertEqual(result.state.next_action, "commit 1", "the records before the damage are kept")
        self.assertGreater(result.state.revision, state.revision, "the damaged records' revisions are never reused")
        quarantined = os.listdir(self.file("quarantine"))
        self.assertEqual(len(quarantined), 1)
        self.assertTrue(quarantined[0].startswith(journal + "."))
        again = JsonFileStore(self.store.root).load("t")
        self.assertEqual((again.source, again.state.next_action), ("primary", "commit 1"))
        self.assertTrue(again.state.reconcile_all)

    def test_rolled_back_snapshot_is_detected(self) -> None:
        lease, state = self.committed(3)
        shutil.copy(self.file("state.json.bak"), self.file("state.json"))  # an older snapshot put back
        result = self.store.load("t", lease=lease)
        self.assertEqual(result.source, "backup")
        self.assertTrue(result.state.reconcile_all)
        self.assertTrue(any("rolled-back" in name for name in os.listdir(self.file("quarantine"))))

    def test_a_snapshot_older_than_a_journal_with_records_is_detected(self) -> None:
        lease, state = self.committed(2)
        old_snapshot = self.read("state.json")
        os.unlink(self.file("state.json.bak"))
        for index in range(3):
            state.next_action = f"later {index}"
            self.store.commit(lease, state)
        jsonfile_compact = jsonfile.COMPACT_MIN_BYTES
        jsonfile.COMPACT_MIN_BYTES = 0
        self.addCleanup(setattr, jsonfile, "COMPACT_MIN_BYTES", jsonfile_compact)
        before = self.journals()
        while self.journals() == before:  # until a compaction starts a journal past the old snapshot
            state.next_action = f"later {state.revision}"
            self.store.commit(lease, state)
            self.assertLess(state.revision, 100)
        state.next_action = "after the compaction"
        self.store.commit(lease, state)
        with open(self.file("state.json"), "wb") as handle:
            handle.write(old_snapshot)  # put back without its backup
        result = JsonFileStore(self.store.root).load("t")
        self.assertEqual(result.source, "backup", "a journal the chain cannot reach holds records: not clean")
        self.assertTrue(result.state.reconcile_all)
        self.assertGreaterEqual(result.revision_floor, state.revision, "the next commit goes above every committed one")

    def test_both_snapshots_damaged_is_unrecoverable_and_stays_so(self) -> None:
        lease, _ = self.committed(3)
        for name in ("state.json", "state.json.bak"):
            with open(self.file(name), "wb") as handle:
                handle.write(b"garbage")
        for _ in range(2):
            with self.assertRaises(StateUnrecoverableError):
                self.store.load("t", lease=lease)
        self.assertEqual(len(os.listdir(self.file("quarantine"))), 2)
        with self.assertRaises(StateUnrecoverableError):
            JsonFileStore(self.store.root).load("t")
        with self.assertRaises(CorruptStateError):
            JsonFileStore(self.store.root).commit(lease, new_state())  # never a silent fresh start

    def test_lost_snapshots_with_journals_left_are_unrecoverable(self) -> None:
        lease, _ = self.committed(3)
        for name in ("state.json", "state.json.bak"):
            os.unlink(self.file(name))
        with self.assertRaises(StateUnrecoverableError):
            self.store.load("t", lease=lease)

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
        for name in ("state.json.tmp-deadbeef", "journal.9.log.tmp-deadbeef"):
            with open(self.file(name), "wb") as handle:
                handle.write(b"{}")
        result = self.store.load("t", lease=lease)
        self.assertEqual((result.source, result.state.revision), ("primary", 1))
        self.assertFalse(os.path.exists(self.file("state.json.tmp-deadbeef")))
        self.assertFalse(os.path.exists(self.file("journal.9.log.tmp-deadbeef")))


class WitnessTests(StoreCase):
    """``lease.json`` witnesses the revision committed when it was written; a state below it is
    refused (``stores.base``, invariant 7)."""

    def test_the_lease_record_carries_only_revisions_whose_commit_returned(self) -> None:
        lease, _ = self.committed(4)
        self.assertEqual(json.loads(self.read("lease.json")).get("committed_revision"), None, "no lease write since")
        lease = self.store.renew_lease(lease, 30.0, 1.0)
        self.assertEqual(lease.committed_revision, 4)
        self.assertEqual(json.loads(self.read("lease.json"))["committed_revision"], 4)
        self.store.release_lease(lease, 2.0)
        # Another store object that only reads (its revisions may not be durable) witnesses nothing new,
        # and keeps what the record held.
        reader = JsonFileStore(self.store.root)
        taken = reader.acquire_lease("t", "other", 30.0, 100.0)
        reader.load("t", lease=taken)
        self.assertEqual(taken.committed_revision, 4)
        loaded = reader.load("t", lease=taken).state
        loaded.next_action = "more"
        self.assertEqual(reader.commit(taken, loaded), 5)
        reader.release_lease(taken, 101.0)
        self.assertEqual(reader.read_lease("t").committed_revision, 5)

    def test_a_journal_cut_below_the_witnessed_revision_is_unrecoverable_and_writes_nothing(self) -> None:
        lease, state = self.committed(2, effects=2)
        for index in range(4):
            state.next_action = f"commit {index}"
            self.store.commit(lease, state)
        self.store.release_lease(lease, 1.0)
        journal = self.journals()[-1]
        content = self.read(journal).split(b"\0")[0]
        with open(self.file(journal), "wb") as handle:
            handle.write(content[: content.index(b"\n", content.index(b"\n") + 1) + 1])  # the meta and one record
        before = self.files()
        with self.assertRaises(StateUnrecoverableError) as caught:
            JsonFileStore(self.store.root).load("t")
        self.assertIn("revision 6 was committed", str(caught.exception))
        store = JsonFileStore(self.store.root)
        lease = store.acquire_lease("t", "me", 30.0, 100.0)
        for _ in range(2):
            with self.assertRaises(StateUnrecoverableError):
                store.load("t", lease=lease)
        with self.assertRaises(StorageError):
            store.commit(lease, new_state())  # never written over
        after = self.files()
        self.assertEqual({name: data for name, data in after.items() if name != "lease.json"}, {
            name: data for name, data in before.items() if name != "lease.json"
        })
        self.assertEqual(json.loads(after["lease.json"])["committed_revision"], 6, "the witness stays")

    def test_state_files_deleted_under_a_lease_that_witnessed_a_commit_are_unrecoverable(self) -> None:
        lease, _ = self.committed(3)
        self.store.release_lease(lease, 1.0)
        for name in os.listdir(self.file()):
            if name.startswith(("state.json", "journal.")):
                os.unlink(self.file(name))
        with self.assertRaises(StateUnrecoverableError) as caught:
            JsonFileStore(self.store.root).load("t")
        self.assertIn("has no state", str(caught.exception))

    def test_a_lease_taken_with_no_commit_after_it_is_no_witness_of_state(self) -> None:
        # The crash a load must accept: a lease acquired, then nothing committed (every epoch).
        for now in (0.0, 100.0, 200.0):
            lease = JsonFileStore(self.store.root, create=True).acquire_lease("t", "me", 30.0, now)
        self.assertEqual(JsonFileStore(self.store.root).load("t", lease=lease).state, None)

    def test_damage_recovered_from_the_backup_chain_is_not_held_to_the_witness(self) -> None:
        lease, state = self.committed(2, effects=2)
        for index in range(4):
            state.next_action = f"commit {index}"
            self.store.commit(lease, state)
        lease = self.store.renew_lease(lease, 30.0, 1.0)
        journal = self.journals()[-1]
        damaged = bytearray(self.read(journal))
        damaged[damaged.index(b"\n", damaged.index(b"\n") + 1) + 30] ^= 0x01  # inside the second record
        with open(self.file(journal), "wb") as handle:
            handle.write(damaged)
        with self.assertLogs("longrun", "WARNING"):
            result = JsonFileStore(self.store.root).load("t")
        self.assertEqual(result.source, "backup")
        self.assertTrue(result.state.reconcile_all, "every unverified step is observed first instead")


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

    def test_a_missing_root_is_a_typed_error_and_nothing_is_created(self) -> None:
        for missing in (self.path("store"), self.path("absent", "store")):
            store = JsonFileStore(missing)
            with self.assertRaisesRegex(InvalidInputError, "does not exist.*create=True"):
                store.acquire_lease("t", "me", 30.0, 0.0)
            self.assertEqual(os.listdir(self.tmp), [])
            with self.assertRaisesRegex(UnknownTaskError, "the store root .* does not exist"):
                store.load("t")
            self.assertEqual(store.list_tasks(), [])

    def test_create_makes_the_root_and_its_parents_owner_only_on_the_first_lease(self) -> None:
        root = self.path("new", "deeper", "store")
        store = JsonFileStore(root, create=True)
        self.assertFalse(os.path.exists(self.path("new")), "opening a store creates nothing")
        self.assertEqual(store.list_tasks(), [])
        lease = store.acquire_lease("t", "me", 30.0, 0.0)
        store.commit(lease, new_state())
        for path in (self.path("new"), self.path("new", "deeper"), root):
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o700, path)
        self.assertEqual(JsonFileStore(root).load("t").state.revision, 1)  # type: ignore[union-attr]
        with open(self.path("file"), "w"):
            pass
        with self.assertRaisesRegex(NotAStoreError, "not a directory"):
            JsonFileStore(self.path("file"), create=True)

    def test_a_symlinked_root_to_a_directory_of_this_user_is_used(self) -> None:
        os.makedirs(self.path("real"))
        os.symlink(self.path("real"), self.path("linked"))
        store = JsonFileStore(self.path("linked"))
        lease = store.acquire_lease("t", "me", 30.0, 0.0)
        store.load("t", lease=lease)
        store.commit(lease, new_state())
        self.assertEqual(JsonFileStore(self.path("real")).load("t").state.revision, 1)  # type: ignore[union-attr]
        self.assertEqual(JsonFileStore(self.path("linked")).list_tasks(), ["t"])
        os.symlink(self.path("nowhere"), self.path("dangling"))
        with self.assertRaisesRegex(StorageError, "symbolic link to nothing"):
            JsonFileStore(self.path("dangling"), create=True).acquire_lease("t", "me", 30.0, 0.0)
        self.assertFalse(os.path.lexists(self.path("nowhere")), "nothing is created through a dangling link")
        # Inside the store, links stay refused: the task directory, and control/ (a security check).
        os.makedirs(self.path("elsewhere"))
        os.symlink(self.path("elsewhere"), self.path("real", "u"))
        with self.assertRaises(StorageError):
            store.acquire_lease("u", "me", 30.0, 0.0)
        control = self.path("real", "t", "control")
        shutil.rmtree(control)
        os.symlink(self.path("elsewhere"), control)
        with self.assertRaises(StorageError):
            store.write_cancellation(Cancellation("t", 0.0, "a", "b"))
        self.assertEqual(os.listdir(self.path("elsewhere")), [])

    @unittest.skipUnless(hasattr(os, "geteuid") and os.geteuid() == 0, "chown to another uid needs root")
    def test_a_symlinked_root_to_another_users_directory_is_refused(self) -> None:
        other = 54321
        os.makedirs(self.path("theirs"))
        os.chown(self.path("theirs"), other, -1)
        os.symlink(self.path("theirs"), self.path("to-theirs"))
        with self.assertRaisesRegex(StorageError, "owned by this user"):
            JsonFileStore(self.path("to-theirs")).acquire_lease("t", "me", 30.0, 0.0)
        self.assertEqual(os.listdir(self.path("theirs")), [])
        os.makedirs(self.path("mine"))
        os.symlink(self.path("mine"), self.path("their-link"))
        os.lchown(self.path("their-link"), other, -1)  # someone else's link could be re-pointed at will
        with self.assertRaisesRegex(StorageError, "link owned by this user or root"):
            JsonFileStore(self.path("their-link")).acquire_lease("t", "me", 30.0, 0.0)

    def test_symlinks_are_refused(self) -> None:
        os.makedirs(self.path("elsewhere"))
        os.makedirs(self.store.root)
        os.symlink(self.path("elsewhere"), os.path.join(self.store.root, "t"))
        with self.assertRaises(StorageError):
            self.store.acquire_lease("t", "me", 30.0, 0.0)
        self.assertEqual(os.listdir(self.path("elsewhere")), [])
        other = JsonFileStore(self.path("root2"), create=True)
        lease = other.acquire_lease("t", "me", 30.0, 0.0)
        os.symlink(self.path("elsewhere"), os.path.join(other.root, "t", "state.json"))
        with self.assertRaises(StorageError):
            other.load("t", lease=lease)
        os.unlink(os.path.join(other.root, "t", "state.json"))
        other.commit(lease, new_state())
        journal = sorted(name for name in os.listdir(os.path.join(other.root, "t")) if name.startswith("journal."))[0]
        os.unlink(os.path.join(other.root, "t", journal))
        os.symlink(self.path("elsewhere"), os.path.join(other.root, "t", journal))
        with self.assertRaises(StorageError):
            JsonFileStore(self.path("root2")).load("t", lease=lease)

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


FORMAT_V1 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "format-v1")


class StoreMarkerTests(support.TempDirTest):
    """A store is marked; a directory that is not one is refused; an earlier version's store is adopted."""

    def marker(self, root: str) -> str:
        return os.path.join(root, jsonfile.MARKER)

    def test_a_new_store_is_marked_when_its_first_task_is_created(self) -> None:
        root = self.path("a", "store")
        store = JsonFileStore(root, create=True)
        self.assertFalse(os.path.exists(root), "opening touches nothing")
        store.acquire_lease("t", "me", 30.0, 0.0)
        with open(self.marker(root), "rb") as handle:
            self.assertEqual(json.loads(handle.read()), {"format": "longrun-jsonfile-store", "version": 1})
        self.assertEqual(store.list_tasks(), ["t"], "the marker is not a task")
        self.assertEqual(JsonFileStore(root).list_tasks(), ["t"])

    def test_a_directory_that_is_not_a_store_is_refused_naming_it_and_nothing_is_written(self) -> None:
        checkout = self.path("checkout")
        for name in ("docs", "src", "tests"):
            os.makedirs(os.path.join(checkout, name, "inner"))
        with open(os.path.join(checkout, "README.md"), "w") as handle:
            handle.write("# a project\n")
        before = sorted(os.walk(checkout))
        for create in (False, True):
            with self.subTest(create=create):
                with self.assertRaises(NotAStoreError) as caught:
                    JsonFileStore(checkout, create=create)
                self.assertEqual(caught.exception.path, checkout)
                self.assertIn(f"{checkout} is not a longrun store", str(caught.exception))
                self.assertIsInstance(caught.exception, InvalidInputError)
        with open(self.path("file"), "w") as handle:
            handle.write("x")
        with self.assertRaisesRegex(NotAStoreError, "not a directory"):
            JsonFileStore(self.path("file"))
        os.makedirs(self.path("other"))
        with open(self.marker(self.path("other")), "w") as handle:
            handle.write('{"format": "something-else"}')
        with self.assertRaisesRegex(NotAStoreError, "format 'something-else'"):
            JsonFileStore(self.path("other"))
        self.assertEqual(sorted(os.walk(checkout)), before)

    def test_an_empty_directory_is_a_new_store(self) -> None:
        os.makedirs(self.path("empty"))
        store = JsonFileStore(self.path("empty"))
        self.assertEqual(store.list_tasks(), [])
        store.acquire_lease("t", "me", 30.0, 0.0)
        self.assertTrue(os.path.exists(self.marker(self.path("empty"))))

    def test_a_store_written_by_an_earlier_version_is_recognised_and_marked_by_its_first_writer(self) -> None:
        root = self.path("store")
        os.makedirs(root)
        shutil.copytree(os.path.join(FORMAT_V1, "v1-task"), os.path.join(root, "v1-task"))
        with open(os.path.join(root, "outbox.jsonl"), "w") as handle:
            handle.write("")  # a file of the application's beside the tasks does not hide them
        reader = JsonFileStore(root)
        self.assertEqual(reader.list_tasks(), ["v1-task"])
        self.assertIsNotNone(reader.load("v1-task").state)
        self.assertFalse(os.path.exists(self.marker(root)), "a reader writes nothing")
        JsonFileStore(root).acquire_lease("new-task", "me", 30.0, 0.0)
        self.assertTrue(os.path.exists(self.marker(root)), "adopted by its first writer")
        self.assertEqual(JsonFileStore(root).list_tasks(), ["new-task", "v1-task"])


class HistoryTests(support.TempDirTest):
    def test_history_lists_the_commits_the_journal_holds_with_what_changed(self) -> None:
        from longrun import Approval, Runner, RunContract, Step
        from longrun.testing import FakeClock, OutboxAdapter

        store = JsonFileStore(self.path("root"), create=True)
        clock = FakeClock()
        steps = [Step("a", "write", {}), Step("b", "write", {}, approval=True)]

        def run():
            clock.advance(1)
            return Runner(RunContract("t", "g"), steps, store=store, adapters={"write": OutboxAdapter(self.path("o"))}, clock=clock).run()

        run()
        request = store.load("t").state.approval_requests["b"]
        store.write_approval(Approval.for_request(request, approval_id="ap-1", approver="ops", granted_at=clock.now(), expires_at=clock.now() + 60))
        run()
        history = store.history("t")
        revisions = [entry["revision"] for entry in history]
        self.assertEqual(revisions, list(range(revisions[0], revisions[0] + len(revisions))), "contiguous")
        self.assertEqual(revisions[-1], store.load("t").state.revision)
        text = " | ".join(entry["description"] for entry in history)
        for phrase in ("a: started", "a: state -> verified", "b: planned", "status -> awaiting-approval",
                       "approval consumed: ap-1", "b: state -> started", "status -> done"):
            self.assertIn(phrase, text)
        self.assertEqual(history[-1]["at"], clock.now(), "the time of the commit (carried forward when unchanged)")
        with self.assertRaises(UnknownTaskError):
            store.history("nope")


if __name__ == "__main__":
    unittest.main()
