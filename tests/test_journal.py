"""The snapshot + journal format of the JSON-file store, attacked byte by byte.

Every test here damages or interrupts the files and checks what a load then says: a version that
was committed (whole, never a mix), or a recovery that observes every unverified step first, or a
typed ``CorruptStateError``; never a silent reset to nothing and never a leaked ``JSONDecodeError``
or ``KeyError``. Nothing here is timed: "linear" is checked by counting work.

The cuts and bit flips go through every byte under ``LONGRUN_TEST_SCALE=full``; by default through
every third byte and every byte next to a line's end, where a record's boundary lies (``offsets``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import unittest
import unittest.mock
from typing import Any, Callable

from helpers import scale, support
from longrun import CorruptStateError, JsonFileStore, RunState
from longrun.approval import ApprovalRequest
from longrun.budget import Backoff, BudgetCounters
from longrun.lease import MonotonicReading
from longrun.ledger import EffectRecord, EffectState
from longrun.outcome import Evidence, Status
from longrun.stores import _journal, jsonfile
from longrun.stores._fileio import FileIO
from longrun.testing import copy_keeping_links

TASK = "t"


def base_state() -> RunState:
    state = RunState(task_id=TASK, plan_digest="sha256:" + "ab" * 32, budget=BudgetCounters(created_at=1.0), next_action="start")
    for index in range(3):
        state.effects[f"s{index}"] = EffectRecord(
            f"{TASK}/s{index}", f"s{index}", "write", {"n": index, "text": "ünïcødé ✓\n\"quoted\""}, f"sha256:{index:064x}",
            updated_at=1.0,
        )  # fmt: skip
    return state


def mutate(state: RunState, step: int, rng: random.Random) -> set[str]:
    """Change the state the way a runner does; return the step ids whose records changed."""
    changed: set[str] = set()
    state.updated_at = 10.0 + step
    state.next_action = f"action {step}"
    choice = rng.randrange(8)
    if choice == 0:
        step_id = f"s{len(state.effects)}"
        state.effects[step_id] = EffectRecord(f"{TASK}/{step_id}", step_id, "write", {"n": step, "l": [1, 2.5, None]}, "sha256:" + "1" * 64)
        changed.add(step_id)
    elif choice == 1:
        state.note_control(Evidence("control", f"approval record {step}", float(step)))
    elif choice == 2:
        state.budget = dataclasses.replace(state.budget, attempts_total=state.budget.attempts_total + 1, cost_spent=step / 4).worked(step / 8)
    elif choice == 3:
        request = ApprovalRequest(TASK, state.plan_digest, f"s{step % 3}", "sha256:" + "2" * 64, "write", 1.0, 2.0 + step)
        state.approval_requests[request.step_id] = request
    elif choice == 4 and state.approval_requests:
        step_id = next(iter(state.approval_requests))
        del state.approval_requests[step_id]
        state.consumed_approvals.append(f"ap-{step}")
    elif choice == 5:
        state.unknowns = [Evidence("target:write", f"unknown {step}", float(step))]
        state.status = rng.choice([Status.RUNNING, Status.AWAITING_APPROVAL])
    for _ in range(rng.randrange(3)):
        step_id = rng.choice(list(state.effects))
        record = state.effects[step_id]
        backoff = None if rng.random() < 0.5 else Backoff.begin(step / 2, 100.0, MonotonicReading("boot:b", float(step)) if step % 2 else None)
        state.effects[step_id] = dataclasses.replace(
            record,
            attempts=record.attempts + 1,
            state=rng.choice(list(EffectState)),
            result={"r": step} if rng.random() < 0.5 else None,
            evidence=f"seen {step}",
            not_before=None if backoff is None else backoff.until,
            backoff=backoff,
            updated_at=20.0 + step,
        )
        changed.add(step_id)
    return changed


RECOVERY_WARNINGS = (
    r"^task \S+: state recovered from ",
    r"^task \S+: dropped an incomplete last record ",
    r"^task \S+: compaction failed ",
)
"""What a load or commit of a damaged task logs: the same words as the observations it returns."""


def offsets(data: bytes, end: int) -> list[int]:
    """The offsets below ``end`` a sweep over ``data`` damages: all of them at the full scale; by
    default every third, and the two on either side of each newline (a record's boundary)."""
    if scale.FULL:
        return list(range(end))
    chosen = set(range(0, end, 3))
    for index, byte in enumerate(data[:end]):
        if byte == 0x0A:
            chosen.update(offset for offset in (index - 1, index, index + 1, index + 2) if 0 <= offset < end)
    return sorted(chosen)


class JournalCase(support.TempDirTest):

    def setUp(self) -> None:
        super().setUp()
        self.root = self.path("root")
        self.committed: dict[int, dict[str, Any]] = {}
        # These tests damage the files on purpose; the warnings are checked, not printed.
        support.ExpectedWarnings(self, *RECOVERY_WARNINGS, at_least_one=False).start()

    def task_file(self, name: str, root: str | None = None) -> str:
        return os.path.join(root or self.root, TASK, name)

    def read(self, name: str, root: str | None = None) -> bytes:
        with open(self.task_file(name, root), "rb") as handle:
            return handle.read()

    def write(self, name: str, data: bytes, root: str | None = None) -> None:
        with open(self.task_file(name, root), "wb") as handle:
            handle.write(data)

    def journals(self, root: str | None = None) -> list[str]:
        names = [name for name in os.listdir(os.path.join(root or self.root, TASK)) if name.startswith("journal.")]
        return sorted(names, key=lambda name: int(name.split(".")[1]))

    def build(self, commits: int, *, seed: int = 7) -> tuple[JsonFileStore, Any, RunState]:
        """A task with a snapshot, its backup and ``commits`` commits after it, each remembered."""
        store = JsonFileStore(self.root, create=True)
        self.addCleanup(store.close)
        lease = store.acquire_lease(TASK, "me", 3600.0, 0.0)
        store.load(TASK, lease=lease)
        state = base_state()
        rng = random.Random(seed)
        store.commit(lease, state, set(state.effects))
        self.committed[state.revision] = state.to_json()
        for step in range(commits + 1):
            changed = mutate(state, step, rng)
            store.commit(lease, state, changed)
            self.committed[state.revision] = state.to_json()
        return store, lease, state

    def copy_of(self, name: str) -> str:
        target = self.path(name)
        shutil.rmtree(target, ignore_errors=True)
        copy_keeping_links(self.root, target)
        return target

    @staticmethod
    def content(document: dict[str, Any]) -> dict[str, Any]:
        document = dict(document)
        document.pop("revision")
        document.pop("reconcile_all")
        return document

    def assert_committed_or_typed_error(self, load: Callable[[], Any], where: str) -> Any:
        """The load gives a version that was committed (whole), a recovery of one, or a typed error."""
        try:
            result = load()
        except CorruptStateError:
            return None
        except Exception as exc:  # noqa: BLE001 - the point is that nothing else may escape
            self.fail(f"{where}: {type(exc).__name__} leaked: {exc}")
        state = result.state
        self.assertIsNotNone(state, f"{where}: a silent reset to no state")
        seen = state.to_json()
        if result.source == "primary" and not state.reconcile_all:
            self.assertIn(state.revision, self.committed, f"{where}: revision {state.revision} was never committed")
            self.assertEqual(seen, self.committed[state.revision], f"{where}: not the committed version")
        else:
            # A recovery, now (source "backup") or made durable earlier (a recovery snapshot).
            self.assertIn(result.source, ("backup", "primary"), where)
            self.assertTrue(state.reconcile_all, f"{where}: a recovery must observe every unverified step first")
            matches = [rev for rev, document in self.committed.items() if self.content(document) == self.content(seen)]
            self.assertTrue(matches, f"{where}: the recovered state is no committed version")
            self.assertGreaterEqual(result.revision_floor, max(matches), where)
        return result


class TornTailTests(JournalCase):
    def test_a_torn_last_record_is_dropped_then_cut_off_by_a_repairing_load(self) -> None:
        store, lease, state = self.build(6)
        name = self.journals()[-1]
        data = bytearray(self.read(name))
        end = data.index(0)
        last = data.rindex(b"\n", 0, end - 1) + 1
        data[last + (end - last) // 2 : end] = bytes(end - (last + (end - last) // 2))  # its second half never landed
        self.write(name, bytes(data))
        result = JsonFileStore(self.root).load(TASK)
        self.assertEqual(result.source, "primary", "a torn write is not damage")
        self.assertEqual(result.state.to_json(), self.committed[state.revision - 1])
        self.assertEqual(result.revision_floor, state.revision - 1, "the torn record was never acknowledged")
        self.assertTrue(any("dropped an incomplete last record" in item.detail for item in result.observations))
        fresh = JsonFileStore(self.root)
        loaded = fresh.load(TASK, lease=lease)
        self.assertEqual(os.listdir(self.task_file("quarantine")), [])
        self.assertEqual(self.read(name).rstrip(b"\0")[-1:], b"\n", "the torn bytes were cut")
        loaded.state.next_action = "after the torn write"
        self.assertEqual(fresh.commit(lease, loaded.state), state.revision)
        again = JsonFileStore(self.root).load(TASK)
        self.assertEqual((again.source, again.state.next_action), ("primary", "after the torn write"))

    def test_a_whole_last_record_with_a_bad_checksum_is_damage_not_a_torn_write(self) -> None:
        store, lease, state = self.build(4)
        name = self.journals()[-1]
        data = bytearray(self.read(name))
        end = data.index(0)
        data[end - 5] ^= 0x20  # inside the last record, whose newline did land
        self.write(name, bytes(data))
        result = JsonFileStore(self.root).load(TASK)
        self.assertEqual(result.source, "backup")
        self.assertTrue(result.state.reconcile_all, "it may have been acknowledged: observe before applying")
        self.assertGreaterEqual(result.revision_floor, state.revision)

    def test_a_last_record_whose_newline_was_damaged_is_not_taken_for_torn(self) -> None:
        store, lease, state = self.build(4)
        name = self.journals()[-1]
        data = bytearray(self.read(name))
        data[data.index(0) - 1] = ord("x")
        self.write(name, bytes(data))
        self.assertEqual(JsonFileStore(self.root).load(TASK).source, "backup")


class TruncationTests(JournalCase):
    def test_truncating_the_journal_at_every_byte_gives_a_committed_version(self) -> None:
        self.build(12)
        name = self.journals()[-1]
        original = self.read(name)
        content_end = original.index(0)
        target = self.copy_of("cut")
        for offset in offsets(original, content_end + 1) + [content_end, content_end + 100, len(original)]:
            self.write(name, original[:offset], target)
            result = self.assert_committed_or_typed_error(lambda: JsonFileStore(target).load(TASK), f"cut at {offset}")
            if result is not None:
                self.assertEqual(result.source, "primary", f"cut at {offset}: a shorter journal is a committed prefix")

    def test_after_a_cut_journal_a_repairing_load_and_commit_leave_a_clean_task(self) -> None:
        self.build(8)
        name = self.journals()[-1]
        original = self.read(name)
        for offset in range(0, original.index(0) + 1, 23):
            target = self.copy_of("cut")
            self.write(name, original[:offset], target)
            store = JsonFileStore(target)
            lease = store.acquire_lease(TASK, "next", 3600.0, 10_000.0)
            loaded = store.load(TASK, lease=lease)
            loaded.state.next_action = f"resumed after a cut at {offset}"
            store.commit(lease, loaded.state)
            store.close()
            again = JsonFileStore(target).load(TASK)
            self.assertEqual((again.source, again.state.next_action), ("primary", f"resumed after a cut at {offset}"))

    def test_truncating_the_snapshot_at_every_byte_recovers_from_the_backup_or_refuses(self) -> None:
        self.build(5)
        original = self.read("state.json")
        target = self.copy_of("cut")
        for offset in offsets(original, len(original)) + [len(original) - 1]:
            self.write("state.json", original[:offset], target)
            result = self.assert_committed_or_typed_error(lambda: JsonFileStore(target).load(TASK), f"cut at {offset}")
            self.assertIsNotNone(result, f"cut at {offset}: the backup and its journals still hold the state")
            self.assertEqual(result.source, "backup", f"cut at {offset}")

    def test_truncating_both_snapshots_is_refused_never_reset(self) -> None:
        self.build(3)
        target = self.copy_of("cut")
        for offset in (0, 1, 40, 200):
            for name in ("state.json", "state.json.bak"):
                self.write(name, self.read(name)[:offset], target)
            with self.assertRaises(CorruptStateError):
                JsonFileStore(target).load(TASK)


class BitFlipTests(JournalCase):
    def flips(self, name: str, positions: list[int]) -> None:
        original = self.read(name)
        clean = JsonFileStore(self.root).load(TASK).state.to_json()
        target = self.copy_of("flip")
        for offset in positions:
            damaged = bytearray(original)
            damaged[offset] ^= 1 << (offset % 8)
            self.write(name, bytes(damaged), target)
            where = f"{name} byte {offset}"
            result = self.assert_committed_or_typed_error(lambda: JsonFileStore(target).load(TASK), where)
            if result is None:
                continue
            if result.source == "primary":
                # Only one flip may leave a valid-looking file: the first padding byte turned into
                # a one-byte "torn write". Nothing was lost, and the load says what it dropped.
                self.assertEqual(result.state.to_json(), clean, where)
                self.assertTrue(any("dropped" in item.detail for item in result.observations), where)
        self.write(name, original, target)

    def test_a_flipped_bit_in_any_byte_of_the_snapshot_is_detected(self) -> None:
        self.build(4)
        data = self.read("state.json")
        self.flips("state.json", offsets(data, len(data)) + [len(data) - 1])

    def test_a_flipped_bit_in_any_byte_of_the_journal_is_detected(self) -> None:
        self.build(6)
        name = self.journals()[-1]
        data = self.read(name)
        end = data.index(0)
        self.flips(name, offsets(data, end + 40) + [end])

    def test_a_damaged_backup_is_found_when_it_is_needed(self) -> None:
        self.build(3)
        data = bytearray(self.read("state.json.bak"))
        data[len(data) // 2] ^= 0x04
        self.write("state.json.bak", bytes(data))
        self.assertEqual(JsonFileStore(self.root).load(TASK).source, "primary", "the backup is only read when needed")
        self.write("state.json", b"")
        with self.assertRaises(CorruptStateError):
            JsonFileStore(self.root).load(TASK)


class Crash(BaseException):
    """The process dies here (raised by the I/O layer; copies the files as the crash leaves them)."""


class CrashingIO(FileIO):
    """Counts every I/O call; at call ``at`` copies the store's files aside and raises ``Crash``."""

    def __init__(self, at: int, on_crash: Callable[[], None]):
        self.at, self.count, self.on_crash = at, 0, on_crash

    def _tick(self) -> None:
        self.count += 1
        if self.count == self.at:
            self.on_crash()
            raise Crash()

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        self._tick()
        return super().open(path, flags, mode)

    def write(self, fd: int, data: bytes) -> int:
        self._tick()
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._tick()
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self._tick()
        super().fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self._tick()
        super().fdatasync(fd)

    def truncate(self, fd: int, length: int) -> None:
        self._tick()
        super().truncate(fd, length)

    def replace(self, source: str, destination: str) -> None:
        self._tick()
        super().replace(source, destination)

    def link(self, source: str, destination: str) -> None:
        self._tick()
        super().link(source, destination)

    def unlink(self, path: str) -> None:
        self._tick()
        super().unlink(path)

    def fsync_dir(self, path: str) -> None:
        self._tick()
        super().fsync_dir(path)


class CrashWindowTests(JournalCase):
    def crash_everywhere(self, action: Callable[[JsonFileStore], None], check: Callable[[str, int], None]) -> int:
        """Run ``action`` on a copy of the task once per I/O call, dying at that call; ``check`` the copy."""
        template = self.copy_of("template")
        at = 0
        while True:
            at += 1
            self.assertLess(at, 500, "the action never completed")
            work = self.path("work")
            shutil.rmtree(work, ignore_errors=True)
            copy_keeping_links(template, work)
            crashed = self.path("crashed")
            shutil.rmtree(crashed, ignore_errors=True)
            store = JsonFileStore(work, io=CrashingIO(at, lambda: copy_keeping_links(work, crashed)))
            try:
                action(store)
            except Crash:
                check(crashed, at)
                continue
            finally:
                store.close()
            check(work, at)
            return at

    def test_a_crash_at_any_point_of_a_compaction_loses_nothing_and_flags_no_damage(self) -> None:
        store, lease, state = self.build(3)
        original = jsonfile.COMPACT_MIN_BYTES
        jsonfile.COMPACT_MIN_BYTES = 0
        self.addCleanup(setattr, jsonfile, "COMPACT_MIN_BYTES", original)
        rng = random.Random(99)
        while True:  # commit until the next commit compacts, without committing it
            journal_end, snapshot_bytes = store._writers[TASK].journal_end, store._writers[TASK].snapshot_bytes
            if journal_end > 0.25 * snapshot_bytes:
                break
            store.commit(lease, state, mutate(state, state.revision, rng))
            self.committed[state.revision] = state.to_json()
        store.close()
        before = state.revision
        changed = mutate(state, 1000, rng)
        after = state.to_json()
        after["revision"] = before + 1
        after["lease"]["epoch"] = 2
        after["lease"]["owner"] = "next"
        after["lease"]["expires_at"] = 10_000.0 + 3600.0

        def action(crashing: JsonFileStore) -> None:
            next_lease = crashing.acquire_lease(TASK, "next", 3600.0, 10_000.0)
            loaded = crashing.load(TASK, lease=next_lease).state
            for step_id in changed:
                loaded.effects[step_id] = state.effects[step_id]
            for field in dataclasses.fields(RunState):
                if field.name not in ("effects", "revision", "lease_owner", "lease_epoch", "lease_expires_at"):
                    setattr(loaded, field.name, getattr(state, field.name))
            crashing.commit(next_lease, loaded, changed)
            self.assertNotEqual(crashing._writers[TASK].snapshot_revision, before, "this commit compacted")

        def check(root: str, at: int) -> None:
            result = JsonFileStore(root).load(TASK)
            self.assertEqual(result.source, "primary", f"crash at I/O call {at}: {[e.detail for e in result.observations]}")
            self.assertFalse(result.state.reconcile_all)
            seen = result.state.to_json()
            if seen["revision"] == before + 1:
                self.assertEqual(self.content(seen), self.content(after), f"crash at I/O call {at}")
            else:
                self.assertEqual(seen, self.committed[before], f"crash at I/O call {at}")
            follow = JsonFileStore(root)
            lease = follow.acquire_lease(TASK, "after", 3600.0, 20_000.0)
            resumed = follow.load(TASK, lease=lease).state
            resumed.next_action = "after the crash"
            follow.commit(lease, resumed)
            follow.close()
            final = JsonFileStore(root).load(TASK)
            self.assertEqual((final.source, final.state.next_action), ("primary", "after the crash"), f"crash at I/O call {at}")

        calls = self.crash_everywhere(action, check)
        self.assertGreater(calls, 15, "the compaction's every step was a crash point")

    def test_a_crash_at_any_point_of_the_first_commit_leaves_no_state_or_the_first(self) -> None:
        os.makedirs(self.root)
        JsonFileStore(self.root).acquire_lease(TASK, "me", 1.0, 0.0)

        def action(store: JsonFileStore) -> None:
            lease = store.acquire_lease(TASK, "next", 3600.0, 100.0)
            store.load(TASK, lease=lease)
            store.commit(lease, base_state(), {"s0", "s1", "s2"})

        def check(root: str, at: int) -> None:
            result = JsonFileStore(root).load(TASK)
            self.assertIn(result.source, ("none", "primary"), f"crash at I/O call {at}")
            if result.state is not None:
                self.assertEqual(self.content(result.state.to_json())["effects"], self.content(base_state().to_json())["effects"])

        self.crash_everywhere(action, check)

    def test_a_crash_at_any_point_of_a_repair_keeps_the_recovery_observed(self) -> None:
        store, lease, state = self.build(6)
        name = self.journals()[-1]
        data = bytearray(self.read(name))
        lines_end = data.index(0)
        data[lines_end - 40] ^= 0x01  # the last record is damaged
        self.write(name, bytes(data))
        floors: list[int] = []

        def action(crashing: JsonFileStore) -> None:
            next_lease = crashing.acquire_lease(TASK, "next", 3600.0, 10_000.0)
            crashing.load(TASK, lease=next_lease)

        def check(root: str, at: int) -> None:
            result = self.assert_committed_or_typed_error(lambda: JsonFileStore(root).load(TASK), f"crash at I/O call {at}")
            self.assertIsNotNone(result, f"crash at I/O call {at}")
            self.assertTrue(result.state.reconcile_all, f"crash at I/O call {at}: the recovery was forgotten")
            self.assertGreaterEqual(result.revision_floor, state.revision, f"crash at I/O call {at}")
            floors.append(result.revision_floor)

        self.crash_everywhere(action, check)
        self.assertGreater(floors[-1], state.revision, "the repaired state is a revision no commit used")


class LinearLoadTests(JournalCase):
    """Load is linear in what it reads: counted, not timed."""

    def count_load(self, effects: int, commits: int) -> dict[str, int]:
        root = self.path(f"root-{effects}-{commits}")
        store = JsonFileStore(root, create=True)
        lease = store.acquire_lease(TASK, "me", 3600.0, 0.0)
        store.load(TASK, lease=lease)
        state = base_state()
        state.effects.clear()
        for index in range(effects):
            step_id = f"s{index}"
            state.effects[step_id] = EffectRecord(f"{TASK}/{step_id}", step_id, "write", {"n": index}, "sha256:" + "0" * 64)
        store.commit(lease, state, set(state.effects))
        store.commit(lease, state, ())
        for index in range(commits):
            step_id = f"s{index % effects}"
            state.effects[step_id] = dataclasses.replace(state.effects[step_id], attempts=index, updated_at=float(index))
            store.commit(lease, state, {step_id})
        store.close()
        counts = {"applied": 0, "records_built": 0, "bytes_read": 0}
        real_apply, real_row = _journal.Replay.apply_record, _journal.record_from_row

        def apply(replay: _journal.Replay, record: Any) -> None:
            counts["applied"] += 1
            real_apply(replay, record)

        def record_from_row(row: object, fetch: Any = None) -> EffectRecord:
            counts["records_built"] += 1
            return real_row(row, fetch)

        class ReadCounter(FileIO):
            def read(self, fd: int, size: int) -> bytes:
                data = super().read(fd, size)
                counts["bytes_read"] += len(data)
                return data

        _journal.Replay.apply_record = apply  # type: ignore[method-assign]
        _journal.record_from_row = record_from_row  # type: ignore[assignment]  # where build_state looks it up
        try:
            JsonFileStore(root, io=ReadCounter()).load(TASK)
        finally:
            _journal.Replay.apply_record = real_apply  # type: ignore[method-assign]
            _journal.record_from_row = real_row  # type: ignore[assignment]
        directory = os.path.join(root, TASK)
        counts["files"] = sum(os.path.getsize(os.path.join(directory, name)) for name in ("state.json", self.journals(root)[-1]))
        return counts

    def test_each_record_is_applied_once_and_each_effect_built_once(self) -> None:
        small = self.count_load(effects=50, commits=400)
        large = self.count_load(effects=100, commits=800)
        for counts, (effects, commits) in ((small, (50, 400)), (large, (100, 800))):
            self.assertEqual(counts["applied"], commits, "every journal record is applied exactly once")
            self.assertEqual(counts["records_built"], effects, "every effect record is built once, not once per change")
            self.assertLessEqual(counts["bytes_read"], counts["files"] + 64 * 1024 + 1024, "each file is read once")


class FakeCollector:
    """Stands in for the ``gc`` module: a switch, so the test never turns the real collector off."""

    def __init__(self) -> None:
        self.enabled = True

    def isenabled(self) -> bool:
        return self.enabled

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True


class CollectorPauseTests(unittest.TestCase):
    def test_overlapping_pauses_keep_the_collector_off_until_the_last_one_ends(self) -> None:
        collector = FakeCollector()
        with unittest.mock.patch.object(_journal, "gc", collector):
            first, second = _journal.no_gc(), _journal.no_gc()
            first.__enter__()
            second.__enter__()  # another thread's load starts while the first is decoding
            self.assertFalse(collector.enabled)
            first.__exit__(None, None, None)
            self.assertFalse(collector.enabled, "the second load is still decoding")
            second.__exit__(None, None, None)
            self.assertTrue(collector.enabled, "back on once every pause ended")
            collector.enabled = False  # a program that turned it off itself keeps it off
            with _journal.no_gc():
                pass
            self.assertFalse(collector.enabled)


class RoundTripTests(JournalCase):
    def test_random_commits_through_compactions_always_load_as_committed(self) -> None:
        original = jsonfile.COMPACT_MIN_BYTES
        jsonfile.COMPACT_MIN_BYTES = 1500
        self.addCleanup(setattr, jsonfile, "COMPACT_MIN_BYTES", original)
        for seed in range(4):
            root = self.path(f"root-{seed}")
            store = JsonFileStore(root, create=True)
            lease = store.acquire_lease(TASK, "me", 3600.0, 0.0)
            store.load(TASK, lease=lease)
            state = base_state()
            rng = random.Random(seed)
            store.commit(lease, state, set(state.effects))
            for step in range(120):
                store.commit(lease, state, mutate(state, step, rng))
                if step % 7 == 0 or step == 119:
                    loaded = JsonFileStore(root).load(TASK)
                    self.assertEqual(loaded.source, "primary")
                    self.assertEqual(loaded.state.to_json(), state.to_json(), f"seed {seed} step {step}")
                    self.assertEqual(list(loaded.state.effects), list(state.effects), "plan order")
                if step == 60:  # a new owner picks the task up half way, from what it loads
                    store.close()
                    store = JsonFileStore(root)
                    lease = store.acquire_lease(TASK, "second", 3600.0, 10_000.0)
                    state = store.load(TASK, lease=lease).state
            store.close()

    def test_the_bounded_observation_list_is_extended_not_rewritten(self) -> None:
        store, lease, state = self.build(1)
        for index in range(60):
            state.note_control(Evidence("control", f"record {index}", float(index)))
            store.commit(lease, state)
        last = self.read(self.journals()[-1]).rstrip(b"\0").split(b"\n")[-2]
        self.assertIn(b'"extend"', last)
        self.assertLess(len(last), 300, "one observation added, one dropped: not fifty rewritten")
        self.assertEqual(JsonFileStore(self.root).load(TASK).state.to_json(), state.to_json())



def row_line(value: dict[str, Any]) -> list[list[Any]]:
    """A snapshot's line of effect records as columns, as the rows a version 1 snapshot holds."""
    columns = [column if isinstance(column, list) else [column["all"]] * value["n"] for column in value["columns"]]
    return [list(row) for row in zip(*columns)]


def rows_format(lines: list[bytes]) -> list[bytes]:
    """A snapshot's lines as version 1 wrote them: effect records as rows, one JSON list each."""
    meta = json.loads(lines[0])
    del meta["checksum"]
    meta["schema_version"] = 1
    rows = [_journal.frame(row_line(json.loads(_journal.line_body(line.rstrip(b"\n"))))) for line in lines[2:]]
    return [_journal.meta_line(meta), lines[1], *rows]


def first_format(data: bytes, *, snapshot: bool) -> bytes:
    """A snapshot or journal as written before effect rows had a backoff and budgets worked time
    (a snapshot's records as rows, as version 1 wrote them)."""
    later = ("budget.worked_s", "budget.worked_at_progress_s")
    content = data.rstrip(b"\0")
    lines = content.split(b"\n")
    meta = json.loads(lines[0])
    if snapshot:
        del meta["checksum"]
        meta["fields"] = meta["fields"][:-1]
        meta["schema_version"] = 1
        lines[0] = _journal.meta_line(meta).rstrip(b"\n")
    for index in range(1, len(lines) - 1):
        value = json.loads(_journal.line_body(lines[index]))
        if snapshot and index == 1:
            value = {key: item for key, item in value.items() if key not in later}
        elif snapshot:
            value = [row[:-1] for row in row_line(value)]
        else:
            value["set"] = {key: item for key, item in value.get("set", {}).items() if key not in later}
            value["effects"] = {key: row[:-1] if isinstance(row, list) else row for key, row in value.get("effects", {}).items()}
        lines[index] = _journal.frame(value).rstrip(b"\n")
    rewritten = b"\n".join(lines)
    if snapshot:
        return rewritten
    return rewritten + bytes(max(0, len(data) - len(rewritten)))  # a journal keeps its zero padding


class SnapshotDecodeTests(unittest.TestCase):
    """Rows a snapshot's checksums let through but the format forbids: refused wherever they stand."""

    def snapshot_lines(self, effects: int) -> list[bytes]:
        state = base_state()
        state.effects.clear()
        for index in range(effects):
            step_id = f"s{index}"
            state.effects[step_id] = EffectRecord(f"{TASK}/{step_id}", step_id, "write", {"n": index}, "sha256:" + "0" * 64)
        state.revision = 4
        return _journal.encode_snapshot(state)

    def decode_with(self, lines: list[bytes], line: int, change: Callable[[Any], None]) -> _journal.RawSnapshot:
        body = json.loads(lines[line].split(b" ", 1)[1])
        change(body)
        changed = [*lines[:line], _journal.frame(body), *lines[line + 1 :]]
        return _journal.decode_snapshot(b"".join(changed), task_id=TASK)

    def test_a_malformed_column_or_a_step_named_twice_is_refused_in_any_row_line(self) -> None:
        lines = self.snapshot_lines(2500)  # meta, header, then lines of 1000, 1000 and 500 records as columns
        self.assertEqual(len(lines), 5)
        self.assertEqual(json.loads(lines[0])["schema_version"], _journal.SNAPSHOT_SCHEMA_VERSION)
        raw = _journal.decode_snapshot(b"".join(lines), task_id=TASK)
        self.assertEqual(_journal.Replay(raw).build().effects, self.state_of(2500).effects)
        steps = 1  # the step id column
        cases: dict[str, tuple[Callable[[Any], None], str]] = {
            "a line without its columns": (lambda line: line.pop("columns"), "must be a JSON object"),
            "a line with a key more": (lambda line: line.__setitem__("rows", 1), "must be a JSON object"),
            "a count that is not the columns'": (lambda line: line.__setitem__("n", line["n"] + 1), "holds"),
            "a count that is not a number": (lambda line: line.__setitem__("n", "1000"), "malformed"),
            "a column one value short": (lambda line: line["columns"][steps].pop(), "holds"),
            "a column too few": (lambda line: line["columns"].pop(), "malformed"),
            "a column neither values nor one value": (lambda line: line["columns"].__setitem__(2, "write"), "malformed"),
            "a one-value column with a key more": (lambda line: line["columns"][2].__setitem__("n", 1), "malformed"),
            "a step id that is not text": (lambda line: line["columns"][steps].__setitem__(7, 7), "malformed"),
            "one step id for every record": (lambda line: line["columns"].__setitem__(steps, {"all": "s7"}), "two effect records for step"),
            "a step id twice in one line": (lambda line: line["columns"][steps].__setitem__(9, line["columns"][steps][3]), "two effect records for step"),
            "a step id of an earlier line": (lambda line: line["columns"][steps].__setitem__(-1, "s0"), "two effect records for step 's0'"),
        }
        for line in (2, 3, 4):
            for case, (change, message) in cases.items():
                with self.subTest(line=line, case=case), self.assertRaises(CorruptStateError) as caught:
                    self.decode_with(lines, line, change)
                self.assertIn(message, str(caught.exception))
        with self.assertRaises(CorruptStateError):
            self.decode_with(lines, 3, lambda line: line.update(n=0, columns=[[] for _ in line["columns"]]))  # fewer than the meta says

    def state_of(self, effects: int) -> RunState:
        raw = _journal.decode_snapshot(b"".join(self.snapshot_lines(effects)), task_id=TASK)
        return _journal.Replay(raw).build()

    def test_a_bad_value_in_a_column_is_refused_naming_its_field_unless_a_journal_record_replaced_it(self) -> None:
        lines = self.snapshot_lines(1500)
        self.assertIn(b'{"all":"write"}', lines[3], "a column of one value is written once")
        cases: dict[str, tuple[int, Any, str]] = {
            "attempts below zero": (6, -1, "attempts"),
            "attempts a bool": (6, True, "attempts"),
            "an epoch of a float": (7, 1.0, "epoch"),
            "a state that is none": (5, "lost", "state"),
            "a payload that is a list": (3, [1], "payload"),
            "a cost that is text": (9, "0", "cost"),
            "a receipt that is a number": (10, 5, "receipt"),
            "a backoff that is not one": (16, {"seconds": -1}, "backoff"),
        }
        for case, (column, value, field) in cases.items():
            for as_one_value in (False, True):
                def change(line: Any) -> None:
                    if as_one_value:
                        line["columns"][column] = {"all": value}
                    else:
                        values = line["columns"][column]
                        values = values if isinstance(values, list) else [values["all"]] * line["n"]
                        values[7] = value
                        line["columns"][column] = values

                raw = self.decode_with(lines, 3, change)  # a checksum-valid line: refused when built
                with self.subTest(case=case, as_one_value=as_one_value), self.assertRaises(CorruptStateError) as caught:
                    _journal.Replay(raw).build()
                self.assertIn(field, str(caught.exception))
                step_id = f"s{1000 + 7}"
                replay = _journal.Replay(self.decode_with(lines, 3, change))
                if as_one_value:
                    continue  # every record of the line is bad: replacing one leaves the others
                record = self.state_of(1500).effects[step_id]
                replay.apply_record({"rev": replay.revision + 1, "epoch": 0, "effects": {step_id: _journal.row_of(record)}})
                self.assertEqual(replay.build().effects[step_id], record, "the bad row was replaced: never read")

    def test_the_highest_epoch_is_read_from_a_column_of_one_value_or_of_many(self) -> None:
        state = base_state()
        state.effects = {step_id: record.with_changes(epoch=3) for step_id, record in state.effects.items()}
        self.assertIn(b'{"all":3}', b"".join(_journal.encode_snapshot(state)))
        self.assertEqual(_journal.highest_epoch(b"".join(_journal.encode_snapshot(state))), 3)
        state.effects["s1"] = state.effects["s1"].with_changes(epoch=9)
        self.assertEqual(_journal.highest_epoch(b"".join(_journal.encode_snapshot(state))), 9)
        self.assertEqual(_journal.highest_epoch(b"".join(rows_format(_journal.encode_snapshot(state)))), 9)

    def test_a_snapshot_of_rows_as_version_1_wrote_it_loads(self) -> None:
        lines = rows_format(self.snapshot_lines(2500))
        self.assertEqual(json.loads(lines[0])["schema_version"], 1)
        self.assertIsInstance(json.loads(lines[2].split(b" ", 1)[1])[0], list)
        raw = _journal.decode_snapshot(b"".join(lines), task_id=TASK)
        self.assertEqual(_journal.Replay(raw).build().effects, self.state_of(2500).effects)

    def test_a_malformed_row_or_a_step_named_twice_is_refused_in_any_row_line_of_a_version_1_snapshot(self) -> None:
        lines = rows_format(self.snapshot_lines(2500))  # meta, header, then row lines of 1000, 1000 and 500 rows
        self.assertEqual(len(lines), 5)
        self.assertEqual(len(_journal.decode_snapshot(b"".join(lines), task_id=TASK).rows), 2500)
        cases: dict[str, tuple[Callable[[list[Any]], None], str]] = {
            "a row that is not a list": (lambda rows: rows.__setitem__(7, {"step_id": "s7"}), "malformed"),
            "a row one value short": (lambda rows: rows[7].pop(), "malformed"),
            "a row one value long": (lambda rows: rows[7].append(None), "malformed"),
            "a step id that is not text": (lambda rows: rows[7].__setitem__(1, 7), "malformed"),
            "a step id twice in one line": (lambda rows: rows[9].__setitem__(1, rows[3][1]), "two effect records for step"),
            "a step id of an earlier line": (lambda rows: rows[-1].__setitem__(1, "s0"), "two effect records for step 's0'"),
        }
        for line in (2, 3, 4):
            for case, (change, message) in cases.items():
                with self.subTest(line=line, case=case), self.assertRaises(CorruptStateError) as caught:
                    self.decode_with(lines, line, change)
                self.assertIn(message, str(caught.exception))
        with self.assertRaises(CorruptStateError):
            self.decode_with(lines, 3, lambda rows: rows.clear())  # fewer rows than the meta says

    def test_an_effect_filed_under_a_step_id_that_is_not_one_or_not_its_own_is_refused(self) -> None:
        raw = _journal.decode_snapshot(b"".join(self.snapshot_lines(1500)), task_id=TASK)
        self.assertEqual(len(_journal.build_state(raw.header, raw.revision, raw.rows, columns=raw.columns).effects), 1500)
        as_rows = {step_id: raw.columns.row(position) for step_id, position in raw.rows.items()}
        self.assertEqual(len(_journal.build_state(raw.header, raw.revision, as_rows).effects), 1500)
        for bad in ("", "-s", "s\n1", "s" * 257, "tâche"):
            rows = dict(as_rows)
            rows[bad] = [*rows.pop("s1200")]
            rows[bad][1] = bad
            with self.subTest(step_id=bad), self.assertRaises(CorruptStateError) as caught:
                _journal.build_state(raw.header, raw.revision, rows)
            self.assertIn("is not valid", str(caught.exception))
        rows = dict(as_rows)
        rows["s1200"] = rows["s1201"]
        with self.assertRaises(CorruptStateError) as caught:
            _journal.build_state(raw.header, raw.revision, rows)
        self.assertIn("effect record filed under 's1200' names step 's1201'", str(caught.exception))


class FirstFormatTests(JournalCase):
    def test_rows_and_headers_written_before_backoffs_and_worked_time_load_and_go_on(self) -> None:
        store = JsonFileStore(self.root, create=True)
        lease = store.acquire_lease(TASK, "me", 3600.0, 0.0)
        store.load(TASK, lease=lease)
        state = base_state()
        store.commit(lease, state, set(state.effects))
        state.effects["s3"] = EffectRecord(f"{TASK}/s3", "s3", "write", {"n": 3}, "sha256:" + "3" * 64, not_before=50.0)
        state.effects["s0"] = state.effects["s0"].with_changes(attempts=2, last_error="transient: busy")
        store.commit(lease, state, {"s3", "s0"})  # a journal line with a whole row and one with changed fields
        store.close()
        for name in os.listdir(os.path.join(self.root, TASK)):
            if name.startswith("state.json") or name.startswith("journal."):
                self.write(name, first_format(self.read(name), snapshot=name.startswith("state.json")))
        self.assertNotIn(b"backoff", self.read("state.json"))
        loaded = JsonFileStore(self.root).load(TASK)
        self.assertEqual(loaded.source, "primary")
        self.assertEqual(loaded.state.to_json(), state.to_json())
        self.assertIsNone(loaded.state.effects["s3"].backoff)
        # A writer of this version carries on from the old files, and what it writes loads back.
        store = JsonFileStore(self.root, create=True)
        lease = store.acquire_lease(TASK, "next", 3600.0, 10_000.0)
        state = store.load(TASK, lease=lease).state
        backoff = Backoff.begin(2.0, 60.0, MonotonicReading("boot:x", 5.0))
        state.effects["s3"] = state.effects["s3"].with_changes(not_before=backoff.until, backoff=backoff)
        state.budget = state.budget.worked(4.0)
        store.commit(lease, state, {"s3"})
        store.close()
        again = JsonFileStore(self.root).load(TASK).state
        self.assertEqual(again.to_json(), state.to_json())
        self.assertEqual((again.effects["s3"].backoff, again.budget.worked_s), (backoff, 4.0))


if __name__ == "__main__":
    unittest.main()
