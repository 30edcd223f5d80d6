"""The SQLite store beyond the shared contract: its file, its settings, its rows, its own fence, a runner on it."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
import stat
import threading
import time
import unittest
from typing import Any
from unittest import mock

from helpers import support
from longrun import (
    CorruptStateError,
    FencedError,
    ForeignStateError,
    InvalidInputError,
    Limits,
    RunContract,
    Runner,
    SchemaVersionError,
    SqliteStore,
    StateUnrecoverableError,
    Status,
    Step,
    StorageError,
)
from longrun.errors import NotAStoreError
from longrun.stores._sql import SCHEMA_VERSION
from longrun.stores.base import Witness
from longrun.lease import MonotonicReading
from longrun.testing import FakeClock, OutboxAdapter
from longrun.testing.store_contract import sample_state


class SqliteCase(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.db = self.path("longrun.db")
        self.store = self.open()

    def open(self, **options: object) -> SqliteStore:
        store = SqliteStore(self.db, create=True, **options)  # type: ignore[arg-type]
        self.addCleanup(store.close)
        return store

    def sql(self, statement: str, params: tuple = ()) -> list[tuple]:
        connection = sqlite3.connect(self.db, isolation_level=None, timeout=30)
        try:
            return list(connection.execute(statement, params).fetchall())
        finally:
            connection.close()

    def committed(self, task: str = "t", effects: int = 3):
        lease = self.store.acquire_lease(task, "me", 30.0, 1000.0)
        self.store.load(task, lease=lease)
        state = sample_state(task, effects=effects)
        self.store.commit(lease, state, set(state.effects))
        return lease, state

    def downgrade(self, version: int) -> None:
        """Make the database look as longrun schema ``version`` left it (its lease rows included)."""
        dropped = {3: ("token", "holder_lock"), 2: ("monotonic_clock", "monotonic_expires_at")}
        if version < 9:
            for change in ("insert", "delete", "update"):
                self.sql(f"DROP TRIGGER longrun_status_counts_{change}")
            self.sql("DROP TABLE longrun_status_counts")
            self.sql("DELETE FROM longrun_schema WHERE version = 9")
        if version < 8:  # version 8 is PostgreSQL's commit function: SQLite records the version only
            self.sql("DELETE FROM longrun_schema WHERE version = 8")
        if version < 7:
            self.sql("DROP TABLE longrun_summaries")
            self.sql("DELETE FROM longrun_schema WHERE version = 7")
        if version < 6:
            self.sql("DROP TABLE longrun_messages")
            self.sql("DELETE FROM longrun_schema WHERE version = 6")
        if version < 5:
            self.sql("DROP TABLE longrun_blobs")
            self.sql("DELETE FROM longrun_schema WHERE version = 5")
        if version < 4:
            self.sql("DROP TABLE longrun_plans")
            self.sql("DELETE FROM longrun_schema WHERE version = 4")
        for newer in sorted(dropped, reverse=True):
            if newer > version:
                for column in dropped[newer]:
                    self.sql(f"ALTER TABLE longrun_leases DROP COLUMN {column}")
                self.sql("DELETE FROM longrun_schema WHERE version = ?", (newer,))


class FileTests(SqliteCase):
    def test_the_database_and_its_journal_files_are_owner_only(self) -> None:
        self.committed()
        names = sorted(name for name in os.listdir(self.tmp) if name.startswith("longrun.db"))
        self.assertIn("longrun.db-wal", names)
        self.assertIn("longrun.db-witness", names)
        self.assertIn("longrun.db-leases", names)  # the holders' lock files, one per task
        for name in names:
            path = self.path(name)
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o700 if os.path.isdir(path) else 0o600, name)
        self.assertEqual(os.listdir(self.path("longrun.db-witness")), ["t.json"])
        self.assertEqual(stat.S_IMODE(os.stat(self.path("longrun.db-witness", "t.json")).st_mode), 0o600)
        locks = os.listdir(self.path("longrun.db-leases"))
        self.assertEqual(locks, ["t.lock"])
        self.assertEqual(stat.S_IMODE(os.stat(self.path("longrun.db-leases", "t.lock")).st_mode), 0o600)

    def test_wal_full_sync_and_a_busy_timeout_are_set(self) -> None:
        self.store.list_tasks()
        connection = self.store._db.connection
        self.assertEqual(connection.execute("PRAGMA journal_mode").fetchone()[0], "wal")
        self.assertEqual(connection.execute("PRAGMA synchronous").fetchone()[0], 2)  # FULL
        self.assertEqual(connection.execute("PRAGMA busy_timeout").fetchone()[0], 30_000)
        self.assertEqual(self.sql("SELECT MAX(version) FROM longrun_schema"), [(SCHEMA_VERSION,)])

    def test_bad_paths_are_refused_clearly(self) -> None:
        with self.assertRaises(InvalidInputError) as caught:
            SqliteStore(self.path("missing", "longrun.db"))
        self.assertIn("does not exist", str(caught.exception))
        with self.assertRaises(InvalidInputError):
            SqliteStore(self.tmp)  # a directory
        os.symlink(self.db, self.path("link.db"))
        with self.assertRaises(InvalidInputError):
            SqliteStore(self.path("link.db"))
        with self.assertRaises(InvalidInputError):
            SqliteStore(self.db, busy_timeout_s=-1)

    def test_a_missing_file_is_created_only_with_create(self) -> None:
        path = self.path("new.db")
        store = SqliteStore(path)
        self.addCleanup(store.close)
        for call in (store.list_tasks, lambda: store.acquire_lease("t", "me", 30.0, 0.0), lambda: store.load("t")):
            with self.assertRaisesRegex(InvalidInputError, "does not exist.*create=True"):
                call()
        self.assertFalse(os.path.exists(path), "nothing is created")
        deep = self.path("a", "b", "new.db")
        created = SqliteStore(deep, create=True)
        self.addCleanup(created.close)
        self.assertFalse(os.path.exists(self.path("a")), "opening the store creates nothing")
        created.acquire_lease("t", "me", 30.0, 0.0)
        for directory in (self.path("a"), self.path("a", "b")):
            self.assertEqual(stat.S_IMODE(os.stat(directory).st_mode), 0o700, directory)
        self.assertEqual(stat.S_IMODE(os.stat(deep).st_mode), 0o600)
        reopened = SqliteStore(deep)  # it exists now: no create needed
        self.addCleanup(reopened.close)
        self.assertEqual(reopened.list_tasks(), ["t"])

    def test_without_create_a_database_of_another_application_is_refused_unchanged(self) -> None:
        other = self.path("other.db")
        connection = sqlite3.connect(other)
        connection.execute("CREATE TABLE invoices (id INTEGER)")
        connection.commit()
        connection.close()
        with open(other, "rb") as handle:
            before = handle.read()
        store = SqliteStore(other)
        self.addCleanup(store.close)
        for name, call in (("list_tasks", store.list_tasks), ("load", lambda: store.load("t")),
                           ("acquire_lease", lambda: store.acquire_lease("t", "me", 30.0, 0.0))):  # fmt: skip
            with self.subTest(call=name), self.assertRaisesRegex(InvalidInputError, "holds no longrun store"):
                call()
        with open(other, "rb") as handle:
            self.assertEqual(handle.read(), before, "not even the journal mode was changed")
        self.assertEqual(os.listdir(self.tmp), ["other.db"], "no -wal, -shm, witness or lock files")
        adopted = SqliteStore(other, create=True)  # asked for: longrun's tables beside the others
        self.addCleanup(adopted.close)
        self.assertEqual(adopted.list_tasks(), [])

    def test_a_file_that_is_not_a_database_is_refused_naming_it_and_left_unchanged(self) -> None:
        with open(self.path("other.db"), "wb") as handle:
            handle.write(b"this is not an SQLite database, just some bytes " * 100)
        with open(self.path("other.db"), "rb") as handle:
            before = handle.read()
        for create in (False, True):
            store = SqliteStore(self.path("other.db"), create=create)
            self.addCleanup(store.close)
            with self.assertRaises(NotAStoreError) as refused:
                store.list_tasks()
            self.assertEqual(refused.exception.path, self.path("other.db"))
        with open(self.path("other.db"), "rb") as handle:
            self.assertEqual(handle.read(), before, "nothing was changed")

    def test_a_newer_schema_is_refused_with_a_clear_error(self) -> None:
        self.committed()
        self.sql("INSERT INTO longrun_schema (version, applied_at, description) VALUES (?, 0, 'future')", (SCHEMA_VERSION + 1,))
        with self.assertRaises(SchemaVersionError) as caught:
            SqliteStore(self.db).load("t")
        self.assertIn("newer than this code knows", str(caught.exception))

    def test_a_closed_store_reopens_on_the_next_call(self) -> None:
        lease, state = self.committed()
        self.store.close()
        self.assertEqual(self.store.load("t").state.to_json(), state.to_json())


class RowTests(SqliteCase):
    def test_a_commit_writes_only_the_changed_effect_rows(self) -> None:
        lease, state = self.committed(effects=200)
        statements: list[str] = []
        real = self.store._db.run

        def counting(statement: str, params: tuple = ()) -> object:
            statements.append(statement)
            return real(statement, params)

        state.effects["step-007"] = dataclasses.replace(state.effects["step-007"], evidence="changed")
        with mock.patch.object(self.store._db, "run", counting):
            self.store.commit(lease, state, {"step-007"})
        effect_writes = [s for s in statements if s.startswith("INSERT INTO longrun_effects")]
        self.assertEqual(len(effect_writes), 1, statements)
        self.assertLess(len(statements), 12, statements)

    def test_a_commit_looks_at_the_changed_records_only_not_the_whole_ledger(self) -> None:
        lease, state = self.committed(effects=2000)
        ledger = support.ReadCountingDict(state.effects)
        state.effects = ledger
        self.store.load("t", lease=lease)  # the store now knows every stored row
        for index in (7, 1500, 7):
            step_id = f"step-{index:03d}"
            ledger[step_id] = dataclasses.replace(ledger[step_id], evidence=f"changed {index}")
            ledger.read = 0
            self.store.commit(lease, state, {step_id})
            self.assertLess(ledger.read, 10, "records of the ledger read by one commit that changed one")
        new = dataclasses.replace(ledger["step-000"], key="t/step-new", step_id="step-new")
        ledger["step-new"] = new  # a new step, at the end of the plan
        ledger.read = 0
        self.store.commit(lease, state, {"step-new"})
        self.assertLess(ledger.read, 10)
        loaded = SqliteStore(self.db).load("t").state
        self.assertEqual(list(loaded.effects), list(state.effects))
        self.assertEqual(loaded.to_json(), state.to_json())

    def test_records_added_or_removed_without_being_named_still_land_in_plan_order(self) -> None:
        lease, state = self.committed(effects=5)
        self.store.load("t", lease=lease)
        template = state.effects["step-000"]
        for name in ("step-new1", "step-new2"):
            state.effects[name] = dataclasses.replace(template, key=f"t/{name}", step_id=name)
        self.store.commit(lease, state, {"step-new2"})  # step-new1 not named: found by the count
        self.assertEqual(list(SqliteStore(self.db).load("t").state.effects), list(state.effects))  # type: ignore[union-attr]
        del state.effects["step-002"]
        self.store.commit(lease, state, ())  # removed without being named: positions shift
        loaded = SqliteStore(self.db).load("t").state
        self.assertEqual(list(loaded.effects), list(state.effects))  # type: ignore[union-attr]
        reordered = dict(reversed(list(state.effects.items())))
        state.effects = reordered
        state.effects["step-last"] = dataclasses.replace(template, key="t/step-last", step_id="step-last")
        self.store.commit(lease, state, {"step-last"})
        self.assertEqual(SqliteStore(self.db).load("t").state.to_json()["effects"][-1]["step_id"], "step-last")  # type: ignore[union-attr]

    def test_a_damaged_effect_row_is_quarantined_by_a_repairing_load_and_never_started_afresh(self) -> None:
        lease, state = self.committed()
        self.sql("UPDATE longrun_effects SET record = replace(record, 'write', 'wrote') WHERE step_id = 'step-001'")
        with self.assertRaises(StateUnrecoverableError) as caught:
            self.store.load("t")
        self.assertIn("step-001", str(caught.exception))
        self.assertEqual(self.sql("SELECT COUNT(*) FROM longrun_quarantine"), [(0,)], "a read-only load moves nothing")
        with self.assertLogs("longrun", "WARNING"), self.assertRaises(StateUnrecoverableError):
            self.store.load("t", lease=lease)
        rows = self.sql("SELECT task_id, kind, name, data FROM longrun_quarantine")
        self.assertEqual(len(rows), 1)
        self.assertEqual(rows[0][:3], ("t", "effect", "longrun_effects/step-001"))
        self.assertIn("wrote", rows[0][3], "the damaged row is kept, not deleted")
        for _ in range(2):
            with self.assertRaises(StateUnrecoverableError):
                self.store.load("t", lease=lease)
        self.assertEqual(len(self.sql("SELECT * FROM longrun_quarantine")), 1, "nothing is moved twice")

    def test_a_missing_effect_row_is_detected(self) -> None:
        self.committed()
        self.sql("DELETE FROM longrun_effects WHERE step_id = 'step-002'")
        with self.assertRaises(StateUnrecoverableError) as caught:
            self.store.load("t")
        self.assertIn("counts 3 effect records", str(caught.exception))

    def test_a_state_header_with_its_rows_gone_is_never_a_fresh_task(self) -> None:
        lease, _ = self.committed()
        self.sql("DELETE FROM longrun_states WHERE task_id = 't'")
        with self.assertRaises(StateUnrecoverableError):
            self.store.load("t", lease=lease)

    def test_an_effect_row_copied_from_another_task_is_foreign(self) -> None:
        self.committed("t")
        self.committed("u")
        self.sql("DELETE FROM longrun_effects WHERE task_id = 'u' AND step_id = 'step-000'")
        self.sql(
            "INSERT INTO longrun_effects SELECT 'u', step_id, position, revision, record, checksum "
            "FROM longrun_effects WHERE task_id = 't' AND step_id = 'step-000'"
        )
        with self.assertRaises(ForeignStateError):
            self.store.load("u")

    def test_a_control_record_stored_as_bytes_is_handed_over_with_an_error(self) -> None:
        self.committed()
        self.sql("INSERT INTO longrun_cancellations VALUES ('t', ?, 0)", (b"\xff\xfe",))
        record = self.store.read_cancellation("t")
        self.assertIsNotNone(record.error)


class DatabaseFenceTests(SqliteCase):
    """The database refuses stale writes even if the check in ``BaseStore`` were skipped."""

    def test_a_stale_state_write_is_refused_by_the_update_itself(self) -> None:
        stale, state = self.committed()
        self.store.acquire_lease("t", "other", 30.0, 5000.0)
        before = self.sql("SELECT revision, header FROM longrun_states")
        with mock.patch.object(self.store, "_fence", lambda lease, operation: lease), self.assertRaises(FencedError):
            self.store.commit(stale, state)
        self.assertEqual(self.sql("SELECT revision, header FROM longrun_states"), before)

    def test_an_epoch_never_moves_backwards(self) -> None:
        self.committed()
        self.store.acquire_lease("t", "me", 30.0, 2000.0)
        self.store.acquire_lease("t", "me", 30.0, 3000.0)
        epoch = self.store.read_lease("t").epoch
        # Pretend the code computed too low an epoch (it read no lease, floor or witness): the upsert refuses.
        with mock.patch.object(self.store, "_get_lease", lambda task_id: None), mock.patch.object(
            self.store, "_epoch_floor", lambda task_id: 0
        ), mock.patch.object(self.store, "_witness", lambda task_id: Witness(0, 0, "none")), self.assertRaises(FencedError):
            self.store.acquire_lease("t", "me", 30.0, 4000.0)
        self.assertEqual(self.store.read_lease("t").epoch, epoch)


    def test_a_lost_lease_row_never_lets_an_epoch_be_issued_twice(self) -> None:
        self.committed()  # the state records epoch 1
        for now in (2000.0, 3000.0, 4000.0):
            latest = self.store.acquire_lease("t", "me", 30.0, now)  # epochs issued without a commit
        self.sql("DELETE FROM longrun_leases")
        self.assertGreater(self.store.acquire_lease("t", "other", 30.0, 5000.0).epoch, latest.epoch)


class ConcurrencyTests(SqliteCase):
    def test_a_writer_waits_for_the_write_lock_then_fails_clearly(self) -> None:
        self.committed()
        holder = sqlite3.connect(self.db, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        impatient = self.open(busy_timeout_s=0.2)
        started = time.monotonic()
        with self.assertRaises(StorageError) as caught:
            impatient.acquire_lease("t", "b", 30.0, 1e9)
        self.assertGreaterEqual(time.monotonic() - started, 0.15)
        self.assertIn("locked", str(caught.exception))
        release = threading.Timer(0.2, lambda: holder.execute("ROLLBACK"))
        release.start()
        patient = self.open(busy_timeout_s=10)
        self.assertEqual(patient.acquire_lease("t", "b", 30.0, 1e9).owner, "b")
        release.join()
        holder.close()

    def test_switching_a_new_file_to_wal_waits_for_a_writer_that_holds_it(self) -> None:
        # SQLite answers the WAL switch with "database is locked" at once, without its busy
        # handler, while another connection holds a write lock on a file not yet in WAL mode
        # (what processes opening a new store at the same moment do to each other).
        path = self.path("fresh.db")
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("CREATE TABLE other (x)")
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("INSERT INTO other VALUES (1)")
        release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
        release.start()
        store = SqliteStore(path, create=True)
        self.addCleanup(store.close)
        started = time.monotonic()
        self.assertEqual(store.list_tasks(), [])
        self.assertGreaterEqual(time.monotonic() - started, 0.2)
        release.join()
        holder.close()
        check = sqlite3.connect(path)
        self.assertEqual(check.execute("PRAGMA journal_mode").fetchone()[0], "wal")
        check.close()

    def test_readers_see_one_snapshot_while_a_writer_commits(self) -> None:
        lease, state = self.committed(effects=50)
        stop = threading.Event()
        failures: list[BaseException] = []

        def write() -> None:
            writer = SqliteStore(self.db)
            try:
                writer.load("t", lease=lease)
                round_number = 0
                while not stop.is_set():
                    round_number += 1
                    for step_id in list(state.effects)[:5]:
                        state.effects[step_id] = dataclasses.replace(state.effects[step_id], evidence=f"round {round_number}")
                    writer.commit(lease, state, set(list(state.effects)[:5]))
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)
            finally:
                writer.close()

        thread = threading.Thread(target=write)
        thread.start()
        try:
            for _ in range(40):
                loaded = self.store.load("t").state  # raises if it ever saw a half-written revision
                self.assertEqual(len(loaded.effects), 50)
        finally:
            stop.set()
            thread.join()
        self.assertEqual(failures, [])


class RunnerOnSqliteTests(SqliteCase):
    def test_a_runner_completes_a_plan_and_resumes_without_repeating(self) -> None:
        outbox = self.path("outbox.jsonl")
        contract = RunContract("job", "write five lines")
        steps = [Step(f"s{i}", "write", {"n": i}) for i in range(5)]
        clock = FakeClock()
        failing = OutboxAdapter(outbox, raise_after_apply={"s2"}, unobservable=set())
        first = Runner(contract, steps, store=self.store, adapters={"write": failing}, clock=clock, limits=Limits(max_block_s=0))
        with self.assertLogs("longrun", "WARNING"):  # the runner warns that apply raised, then observes
            outcome = first.run()
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        again = Runner(contract, steps, store=SqliteStore(self.db), adapters={"write": OutboxAdapter(outbox)}, clock=clock)
        self.assertEqual(again.run().status, Status.DONE)
        self.assertEqual(set(OutboxAdapter(outbox).counts().values()), {1})
        self.assertEqual(len(OutboxAdapter(outbox).counts()), 5)


class LostDatabaseTests(SqliteCase):
    """A database emptied, or that lost its log, is an older consistent database; the witness file
    beside it shows what was committed (``SqliteStore``'s module docstring)."""

    steps = [Step(f"s{i}", "write", {"n": i}) for i in range(5)]

    def run_task(self, store: SqliteStore, adapter: OutboxAdapter):
        runner = Runner(RunContract("job", "write five lines"), self.steps, store=store, adapters={"write": adapter}, clock=FakeClock())
        return runner.run()

    def reopen(self) -> SqliteStore:
        self.store.close()
        return self.open()

    def assert_refused_twice_and_nothing_repeated(self, outbox: str, epoch: int) -> None:
        for _ in range(2):
            adapter = OutboxAdapter(outbox)
            outcome = self.run_task(self.reopen(), adapter)
            self.assertEqual(outcome.status, Status.STATE_UNRECOVERABLE, outcome.next_action)
            self.assertEqual(sum(adapter.calls.values()), 0)
            self.assertEqual(OutboxAdapter(outbox).counts(), {f"job/s{i}": 1 for i in range(5)})
            self.assertGreater(outcome.epoch, epoch, "an epoch is never issued twice")
            self.assertIn("observe_first=True", outcome.next_action)

    def test_a_database_emptied_after_a_finished_task_repeats_nothing(self) -> None:
        outbox = self.path("outbox.jsonl")
        done = self.run_task(self.store, OutboxAdapter(outbox))
        self.assertEqual(done.status, Status.DONE)
        self.store.close()
        self.assertFalse(os.path.exists(self.db + "-wal"), "the last connection folded its log in")
        with open(self.db, "r+b") as handle:
            handle.truncate(0)
        self.assert_refused_twice_and_nothing_repeated(outbox, done.epoch)

    def test_a_database_that_lost_its_log_repeats_nothing(self) -> None:
        outbox = self.path("outbox.jsonl")
        adapter = OutboxAdapter(outbox)
        apply = adapter.apply

        def copy_main_file(request):  # the database file alone, as losing the -wal file leaves it
            if request.step_id == "s3":
                shutil.copyfile(self.db, self.path("without-log.db"))
            return apply(request)

        adapter.apply = copy_main_file  # type: ignore[method-assign]
        done = self.run_task(self.store, adapter)
        self.assertEqual(done.status, Status.DONE)
        self.store.close()
        os.replace(self.path("without-log.db"), self.db)
        for suffix in ("-wal", "-shm"):
            if os.path.exists(self.db + suffix):
                os.unlink(self.db + suffix)
        self.assert_refused_twice_and_nothing_repeated(outbox, done.epoch)

    def test_leases_taken_with_no_commit_after_them_are_no_witness_of_state(self) -> None:
        for now in (1000.0, 2000.0, 3000.0):  # each holder "crashes" before its first commit
            lease = self.reopen().acquire_lease("t", "me", 30.0, now)
        store = self.reopen()
        self.assertIsNone(store.load("t", lease=lease).state)
        self.assertEqual(store._witness("t")[:2], (3, 0))

    def test_a_damaged_witness_is_refused_not_ignored(self) -> None:
        lease, _ = self.committed()
        self.store.release_lease(lease, 1001.0)
        path = self.path("longrun.db-witness", "t.json")
        with open(path, "rb") as handle:
            data = handle.read()
        with open(path, "wb") as handle:
            handle.write(data.replace(b'"revision":1', b'"revision":0'))
        with self.assertRaises(CorruptStateError):
            self.reopen().load("t")


class MonotonicLeaseTests(SqliteCase):
    def test_a_contender_whose_wall_clock_jumped_ahead_does_not_take_a_live_lease(self) -> None:
        from longrun import LeaseHeldError

        holder = self.store.acquire_lease("t", "holder", 30.0, 1000.0, monotonic=MonotonicReading("boot:x", 50.0))
        contender = self.open()
        with self.assertRaises(LeaseHeldError):  # wall clock an hour ahead, monotonic 10 s later
            contender.acquire_lease("t", "contender", 30.0, 1000.0 + 3600, monotonic=MonotonicReading("boot:x", 60.0))
        taken = contender.acquire_lease("t", "contender", 30.0, 1000.0 + 3600, monotonic=MonotonicReading("boot:x", 80.0))
        self.assertEqual(taken.epoch, holder.epoch + 1)
        stored = self.open().read_lease("t")
        self.assertEqual((stored.monotonic_clock, stored.monotonic_expires_at), ("boot:x", 110.0))

    def test_a_version_1_database_is_migrated_and_its_leases_still_load(self) -> None:
        self.store.acquire_lease("t", "holder", 30.0, 1000.0)
        self.store.close()
        self.downgrade(1)
        migrated = self.open()
        lease = migrated.read_lease("t")
        self.assertEqual((lease.owner, lease.monotonic_clock), ("holder", None))
        self.assertEqual(self.sql("SELECT MAX(version) FROM longrun_schema"), [(SCHEMA_VERSION,)])
        self.assertEqual(migrated.acquire_lease("t", "next", 30.0, 2000.0, monotonic=MonotonicReading("boot:y", 1.0)).epoch, 2)

    def test_a_version_2_database_is_migrated_and_a_lease_without_a_token_is_fenced_by_its_epoch(self) -> None:
        self.store.acquire_lease("t", "holder", 30.0, 1000.0)
        self.store.close()
        self.downgrade(2)
        self.sql("UPDATE longrun_leases SET expires_at = 3000.0")  # live at 2000
        migrated = self.open()
        old = migrated.read_lease("t")
        self.assertEqual((old.owner, old.token, old.holder_lock), ("holder", None, None))
        self.assertEqual(self.sql("SELECT MAX(version) FROM longrun_schema"), [(SCHEMA_VERSION,)])
        from longrun import LeaseHeldError

        with self.assertRaises(LeaseHeldError):  # live, and its owner name opens nothing
            migrated.acquire_lease("t", "holder", 30.0, 2000.0)
        renewed = migrated.renew_lease(old, 30.0, 2000.0)  # its holder (running older code) still renews
        self.assertEqual(renewed.epoch, old.epoch)
        taken = self.open().acquire_lease("t", "next", 30.0, 5000.0)
        self.assertEqual(taken.epoch, old.epoch + 1)
        self.assertIsNotNone(taken.token)
        with self.assertRaises(FencedError):
            migrated.renew_lease(old, 30.0, 5000.0)


class PlanOutlineTests(SqliteCase):
    def test_a_version_3_database_is_migrated_and_a_runner_records_the_outline(self) -> None:
        outbox = self.path("outbox.jsonl")
        steps = [Step("a", "send", {"n": 1}), Step("b", "send", {"n": 2}, approval=True)]

        def runner() -> Runner:
            return Runner(RunContract("t", "migrate"), steps, store=self.open(), adapters={"send": OutboxAdapter(outbox)},
                          clock=FakeClock())

        self.assertIs(runner().run().status, Status.AWAITING_APPROVAL)
        self.store.close()
        self.downgrade(3)  # what version 3 left: no outline table, a task with a state
        old = self.open().load("t").state
        self.assertIsNone(old.plan_outline)
        self.assertEqual(self.sql("SELECT MAX(version) FROM longrun_schema"), [(SCHEMA_VERSION,)])
        self.assertEqual(self.sql("SELECT COUNT(*) FROM longrun_plans"), [(0,)])
        self.assertIs(runner().run().status, Status.AWAITING_APPROVAL)
        outline = self.open().load("t").state.plan_outline
        self.assertEqual((outline.steps, outline.actions), (("a", "b"), ("send", "send")))

    def test_the_outline_row_is_written_once_not_with_every_commit(self) -> None:
        lease, state = self.committed()
        self.assertEqual(self.sql("SELECT revision FROM longrun_plans"), [(1,)])
        header = self.sql("SELECT header FROM longrun_states")[0][0]
        self.assertNotIn("plan_outline", header)
        for _ in range(3):
            self.store.commit(lease, state, ())
        self.assertEqual(self.sql("SELECT revision FROM longrun_plans"), [(1,)])
        self.assertEqual(self.open().load("t").state.plan_outline, state.plan_outline)

    def test_a_damaged_outline_row_is_reported_and_set_aside_and_the_state_still_loads(self) -> None:
        lease, state = self.committed()
        self.sql("UPDATE longrun_plans SET body = replace(body, 'later/1', 'later/9')")
        with self.assertLogs("longrun", "WARNING"):
            loaded = self.open().load("t")
        self.assertIsNone(loaded.state.plan_outline)
        self.assertTrue(any("plan outline row" in item.detail for item in loaded.observations))
        self.assertEqual(self.sql("SELECT COUNT(*) FROM longrun_plans"), [(1,)])  # a read moves nothing
        store = self.open()
        lease = store.acquire_lease("t", "me", 30.0, 2000.0)  # the first lease is over
        with self.assertLogs("longrun", "WARNING"):
            store.load("t", lease=lease)
        self.assertEqual(self.sql("SELECT COUNT(*) FROM longrun_plans"), [(0,)])
        self.assertEqual(self.sql("SELECT kind, name FROM longrun_quarantine"), [("plan", "longrun_plans")])


if __name__ == "__main__":
    unittest.main()


class SummaryMigrationTests(SqliteCase):
    def test_a_version_6_database_gets_a_summary_row_per_task_built_on_open(self) -> None:
        _, running = self.committed("a")
        lease, done = self.committed("b")
        done.status, done.updated_at = Status.DONE, 1_700_000_900.0
        self.store.commit(lease, done, ())
        self.store.acquire_lease("c", "me", 30.0, 1000.0)  # a task with no revision
        self.committed("d")
        self.sql("UPDATE longrun_effects SET record = 'damaged' WHERE task_id = 'd' AND step_id = 'step-001'")
        expected = {summary.task_id: summary for summary in self.store.list_summaries()}
        self.store.close()
        self.downgrade(6)
        with self.assertLogs("longrun", "INFO") as logs:
            migrated = self.open().list_summaries()
        self.assertTrue(any("schema migrated to version 7" in line for line in logs.output), logs.output)
        self.assertEqual([summary.task_id for summary in migrated], ["b", "d", "a", "c"])
        for summary in migrated:
            if summary.task_id != "d":
                self.assertEqual(summary, expected[summary.task_id])
        damaged = migrated[1]
        self.assertEqual((damaged.status, damaged.revision), ("running", 1), "as its header row last said")
        self.assertIn("does not validate", damaged.error)
        self.assertEqual(self.sql("SELECT MAX(version) FROM longrun_schema"), [(SCHEMA_VERSION,)])
        self.assertEqual(running.status, Status.RUNNING)

    def test_a_version_7_database_is_migrated_to_version_8_and_keeps_committing(self) -> None:
        lease, state = self.committed()
        self.store.close()
        self.downgrade(7)
        self.assertEqual(self.sql("SELECT MAX(version) FROM longrun_schema"), [(7,)])
        store = self.open()
        with self.assertLogs("longrun", "INFO") as logs:
            self.assertEqual(store.load("t", lease=lease).state.to_json(), state.to_json())  # type: ignore[union-attr]
        self.assertTrue(any("schema migrated to version 8" in line for line in logs.output), logs.output)
        self.assertEqual(self.sql("SELECT MAX(version) FROM longrun_schema"), [(SCHEMA_VERSION,)])
        self.assertEqual(store.commit(lease, state), 2)

    def test_a_version_8_database_gets_its_status_counts_built_from_the_summary_rows(self) -> None:
        lease, state = self.committed("a")
        self.committed("b")
        done_lease, done = self.committed("c")
        done.status = Status.DONE
        self.store.commit(done_lease, done, ())
        self.store.acquire_lease("n", "me", 30.0, 1000.0)  # a task with no revision
        self.store.close()
        self.downgrade(8)
        self.assertEqual(self.sql("SELECT MAX(version) FROM longrun_schema"), [(8,)])
        store = self.open()
        with self.assertLogs("longrun", "INFO") as logs:
            counts = store.status_counts()
        self.assertTrue(any("schema migrated to version 9" in line for line in logs.output), logs.output)
        self.assertEqual(counts, {"running": 2, "done": 1, "new": 1})
        self.assertEqual(self.sql("SELECT MAX(version) FROM longrun_schema"), [(SCHEMA_VERSION,)])
        state.status = Status.FAILED  # the triggers count from here on
        store.commit(lease, state, ())
        store.release_lease(done_lease, 1001.0)
        store.delete_task("c", time.time() + 60)
        self.assertEqual(store.status_counts(), {"running": 1, "failed": 1, "new": 1})
        self.assertEqual(store.status_counts(), dict(self.sql("SELECT status, COUNT(*) FROM longrun_summaries GROUP BY status")))


class BlobTests(SqliteCase):
    def large_state(self, lease: Any) -> Any:  # noqa: ANN401
        from longrun.canonical import digest_of
        from longrun.ledger import EffectRecord, EffectState
        from longrun.testing.store_contract._blobs import large_payload

        state = sample_state("t", effects=1)
        payload = large_payload("p")
        state.effects["big"] = EffectRecord(
            "t/big", "big", "write", payload, digest_of(payload, checked=True), EffectState.STARTED, 1, lease.epoch, updated_at=1.0
        )
        return state

    def test_a_version_4_database_is_migrated_and_takes_a_large_payload_once(self) -> None:
        lease = self.store.acquire_lease("t", "a", 30.0, 1000.0)
        self.store.load("t", lease=lease)
        state = self.large_state(lease)
        del state.effects["big"]
        self.store.commit(lease, state, set(state.effects))
        self.store.close()
        self.downgrade(4)  # what version 4 left: no blobs table, a task with a state
        migrated = self.open()
        self.assertEqual(migrated.load("t").state.to_json(), state.to_json())
        self.assertEqual(self.sql("SELECT MAX(version) FROM longrun_schema"), [(SCHEMA_VERSION,)])
        migrated.load("t", lease=lease)
        state = self.large_state(lease)
        migrated.commit(lease, state, set(state.effects))
        digest = state.effects["big"].payload_digest.removeprefix("sha256:")
        self.assertEqual(self.sql("SELECT digest FROM longrun_blobs WHERE task_id = 't'"), [(digest,)])
        [(record,)] = self.sql("SELECT record FROM longrun_effects WHERE step_id = 'big'")
        self.assertLess(len(record), 4096, "the effect row holds the reference, not the payload")
        for attempt in range(3):  # later commits of the row write the reference, not the bytes
            state.effects["big"] = state.effects["big"].with_changes(attempts=2 + attempt)
            migrated.commit(lease, state, {"big"})
        self.assertEqual(self.sql("SELECT COUNT(*) FROM longrun_blobs"), [(1,)])
        self.assertEqual(self.open().load("t").state.to_json(), state.to_json())

    def test_a_missing_blob_row_is_damage_to_the_effect_row(self) -> None:
        lease = self.store.acquire_lease("t", "a", 30.0, 1000.0)
        self.store.load("t", lease=lease)
        state = self.large_state(lease)
        self.store.commit(lease, state, set(state.effects))
        self.sql("DELETE FROM longrun_blobs")
        with self.assertRaisesRegex(StateUnrecoverableError, "blob .* is missing"):
            self.open().load("t")
