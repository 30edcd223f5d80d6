"""The PostgreSQL store beyond the shared contract: the server's clock, the database's own fence,
timeouts for a runner frozen inside a transaction, broken connections, schema versions, a runner on it.

Runs when ``LONGRUN_TEST_POSTGRES_DSN`` is set (see ``pg_support``); CI requires it.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
import unittest
import urllib.parse
from typing import Any
from unittest import mock

from helpers import pg_support
from helpers import support
from longrun import (
    CorruptStateError,
    FencedError,
    InvalidInputError,
    LeaseHeldError,
    Limits,
    PostgresStore,
    RunContract,
    Runner,
    SchemaVersionError,
    Status,
    Step,
    StorageError,
    UnknownTaskError,
)
from longrun.canonical import LARGE_VALUE_BYTES
from longrun.errors import NotAStoreError
from longrun.stores import open_store
from longrun.stores._spec import postgres_connector
from longrun.stores._sql import SCHEMA_VERSION
from longrun.testing import FakeClock, OutboxAdapter
from longrun.testing.store_contract import sample_state

HOUR = 3600.0


class PostgresCase(pg_support.SchemaPerTest, support.TempDirTest):
    driver: str | None = None

    def setUp(self) -> None:
        super().setUp()
        self.store = self.open()

    def open(self, **options: Any) -> PostgresStore:
        store = PostgresStore(self.schema.factory(), **options)
        self.addCleanup(store.close)
        return store

    def server_now(self) -> float:
        return self.schema.execute("SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)")[0][0]

    def committed(self, task: str = "t"):
        lease = self.store.acquire_lease(task, "me", 30.0, time.time())
        self.store.load(task, lease=lease)
        state = sample_state(task)
        self.store.commit(lease, state, set(state.effects))
        return lease, state


class ServerClockTests(PostgresCase):
    """Lease expiry comes from the server's clock: a runner's clock, however wrong, changes nothing."""

    def test_a_runner_an_hour_ahead_cannot_take_a_live_lease(self) -> None:
        lease = self.store.acquire_lease("t", "a", 30.0, time.time() - HOUR)
        before, after = self.server_now() - 30.0, self.server_now()
        self.assertTrue(before <= lease.acquired_at <= after + 1, "stamped with the server's time, not the runner's")
        self.assertAlmostEqual(lease.expires_at - lease.acquired_at, 30.0, places=3)
        for skewed in (time.time() + HOUR, time.time() + 24 * HOUR, float(2**40)):
            with self.subTest(now=skewed), self.assertRaises(LeaseHeldError):
                self.open().acquire_lease("t", "b", 30.0, skewed)

    def test_a_runner_an_hour_behind_cannot_keep_a_dead_lease_alive(self) -> None:
        lease = self.store.acquire_lease("t", "a", 0.3, time.time() + HOUR)
        renewed = self.store.renew_lease(lease, 0.3, time.time() + HOUR)  # its renewal does not reach the future
        self.assertLess(renewed.expires_at, self.server_now() + 1.0)
        time.sleep(0.4)  # the server's clock cannot be faked: let 0.3 s of it pass
        taken = self.open().acquire_lease("t", "b", 30.0, time.time() - HOUR)
        self.assertGreater(taken.epoch, lease.epoch)
        with self.assertRaises(FencedError):
            self.store.renew_lease(renewed, 30.0, time.time())

    def test_a_release_stamped_by_a_runner_ahead_ends_the_lease_at_the_servers_now(self) -> None:
        lease = self.store.acquire_lease("t", "a", 30.0, time.time())
        self.store.release_lease(lease, time.time() + HOUR)
        released = self.store.read_lease("t")
        self.assertLessEqual(released.expires_at, self.server_now())
        self.assertEqual(self.open().acquire_lease("t", "b", 30.0, time.time() - HOUR).owner, "b")


class CommitCostTests(PostgresCase):
    def test_a_commit_writes_and_reads_the_changed_record_only(self) -> None:
        lease = self.store.acquire_lease("t", "me", 30.0, time.time())
        self.store.load("t", lease=lease)
        state = sample_state("t", effects=500)
        self.store.commit(lease, state, set(state.effects))
        ledger = support.ReadCountingDict(state.effects)
        state.effects = ledger
        self.store.load("t", lease=lease)
        statements: list[str] = []
        real = self.store._db.run

        def counting(statement: str, params: Any = ()) -> Any:
            statements.append(statement)
            return real(statement, params)

        ledger["step-321"] = dataclasses.replace(ledger["step-321"], evidence="changed")
        ledger.read = 0
        with mock.patch.object(self.store._db, "run", counting):
            self.store.commit(lease, state, {"step-321"})
        self.assertLess(ledger.read, 10, "records of the ledger read by one commit that changed one")
        self.assertEqual(len(statements), 1, statements)
        self.assertTrue(statements[0].startswith("SELECT longrun_commit("), statements)
        self.assertEqual(self.open().load("t").state.to_json(), state.to_json())  # type: ignore[union-attr]


class _Counting:
    """A DB-API connection that counts what reaches the server: statements, COMMITs, ROLLBACKs."""

    def __init__(self, connection: Any, counts: dict[str, int]) -> None:
        self._connection, self._counts = connection, counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._connection, name, value)

    def commit(self) -> None:
        self._counts["commit"] += 1
        self._connection.commit()

    def rollback(self) -> None:
        self._counts["rollback"] += 1
        self._connection.rollback()

    def cursor(self) -> Any:
        cursor, counts = self._connection.cursor(), self._counts

        class Cursor:
            def __getattr__(self, name: str) -> Any:
                return getattr(cursor, name)

            def execute(self, statement: str, params: Any = ()) -> Any:
                counts["execute"] += 1
                # Outside autocommit the driver sends a BEGIN first (or has one open to COMMIT later).
                counts["in transaction"] += not autocommit()
                return cursor.execute(statement, params)

        def autocommit() -> bool:
            return bool(self._connection.autocommit)

        return Cursor()


class OneRoundTripTests(PostgresCase):
    """A commit is one call to the server: one statement, no BEGIN, no COMMIT, fenced by the database in that call."""

    def counted(self) -> tuple[PostgresStore, dict[str, int]]:
        counts = {"execute": 0, "commit": 0, "rollback": 0, "in transaction": 0}
        factory = self.schema.factory()
        return self.open_with(lambda: _Counting(factory(), counts)), counts

    def open_with(self, factory: Any) -> PostgresStore:
        store = PostgresStore(factory)
        self.addCleanup(store.close)
        return store

    def test_a_commit_is_one_statement_and_no_commit(self) -> None:
        store, counts = self.counted()
        lease = store.acquire_lease("t", "me", 30.0, time.time())
        store.load("t", lease=lease)
        state = sample_state("t", effects=20)
        store.commit(lease, state, set(state.effects))
        for number, key in enumerate(list(state.effects)[:3]):
            state.effects[key] = dataclasses.replace(state.effects[key], evidence=f"changed {number}")
            counts.update({name: 0 for name in counts})
            store.commit(lease, state, {key})
            self.assertEqual(counts, {"execute": 1, "commit": 0, "rollback": 0, "in transaction": 0}, f"commit {number}")
        self.assertEqual(self.open().load("t").state.to_json(), state.to_json())  # type: ignore[union-attr]
        rows = self.schema.execute("SELECT status, revision FROM longrun_summaries WHERE task_id = 't'")
        self.assertEqual(rows, [(state.status.value, state.revision)], "the summary row, written by the same call")

    def test_records_with_quotes_backslashes_braces_and_commas_arrive_intact(self) -> None:
        lease, state = self.committed()
        nasty = 'a"b\\c\\"{x,y}, NULL "" \\\\ \u00fc\u2028 \\u0000'
        for number, key in enumerate(list(state.effects)[:2]):
            state.effects[key] = dataclasses.replace(state.effects[key], evidence=nasty * (number + 1))
        self.store.commit(lease, state, set(list(state.effects)[:2]))
        self.assertEqual(self.open().load("t").state.to_json(), state.to_json())  # type: ignore[union-attr]

    def test_the_call_itself_refuses_a_stale_epoch_and_a_wrong_token_and_writes_nothing(self) -> None:
        from longrun.stores.postgres import _COMMIT_CALL

        lease, state = self.committed()
        state.next_action = "a write the database must refuse"
        before = self.schema.execute("SELECT revision, header FROM longrun_states")
        write = self.store._state_write(dataclasses.replace(state, revision=state.revision + 1), None)
        for name, fence in (
            ("a stale epoch", dataclasses.replace(lease, epoch=lease.epoch - 1)),
            ("a newer epoch", dataclasses.replace(lease, epoch=lease.epoch + 1)),
            ("another token", dataclasses.replace(lease, token="f" * 32)),
        ):
            with self.subTest(name):
                row = self.store._db.single(_COMMIT_CALL, self.store._commit_params(write, fence), what="test")
                self.assertEqual(row[0], 1)
                self.assertEqual(self.schema.execute("SELECT revision, header FROM longrun_states"), before)
        row = self.store._db.single(_COMMIT_CALL, self.store._commit_params(write, lease), what="test")
        self.assertEqual(row[0], 0)
        self.assertEqual(self.schema.execute("SELECT revision FROM longrun_states"), [(state.revision + 1,)])

    def test_a_lease_taken_over_makes_the_old_holders_commit_a_fenced_error_that_writes_nothing(self) -> None:
        stale, state = self.committed()
        self.schema.execute("UPDATE longrun_leases SET expires_at = 0")  # expired by the server's clock
        taken = self.open().acquire_lease("t", "other", 30.0, time.time())
        before = self.schema.execute("SELECT revision, header, epoch FROM longrun_states")
        with self.assertRaises(FencedError) as caught:
            self.store.commit(stale, state)
        self.assertEqual((caught.exception.current_epoch, caught.exception.write_epoch), (taken.epoch, stale.epoch))
        self.assertEqual(self.schema.execute("SELECT revision, header, epoch FROM longrun_states"), before)

    def test_a_damaged_lease_row_is_reported_as_before(self) -> None:
        lease, state = self.committed()
        self.schema.execute("UPDATE longrun_leases SET expires_at = 'NaN'")
        with self.assertRaises(CorruptStateError):
            self.store.commit(lease, state)
        self.assertEqual(self.schema.execute("SELECT revision FROM longrun_states"), [(1,)])


    def test_a_driver_without_an_autocommit_switch_commits_the_call_in_a_transaction(self) -> None:
        factory = self.schema.factory()

        class Plain:
            """Only what DB-API 2.0 requires of a connection: no ``autocommit``."""

            def __init__(self) -> None:
                self._connection = factory()
                self.commits = 0

            def cursor(self) -> Any:
                return self._connection.cursor()

            def commit(self) -> None:
                self.commits += 1
                self._connection.commit()

            def rollback(self) -> None:
                self._connection.rollback()

            def close(self) -> None:
                self._connection.close()

        made: list[Plain] = []
        store = self.open_with(lambda: made.append(Plain()) or made[-1])
        lease = store.acquire_lease("t", "me", 30.0, time.time())
        store.load("t", lease=lease)
        state = sample_state("t")
        store.commit(lease, state, set(state.effects))
        state.next_action = "committed through a plain connection"
        commits = made[-1].commits
        self.assertEqual(store.commit(lease, state), 2)
        self.assertEqual(made[-1].commits, commits + 1, "the call, then its COMMIT")
        self.assertEqual(self.open().load("t").state.next_action, state.next_action)  # type: ignore[union-attr]


    def test_a_read_only_load_is_one_statement_in_autocommit(self) -> None:
        lease, state = self.committed()
        store, counts = self.counted()
        store.read_lease("t")  # connected, the schema checked
        counts.update({name: 0 for name in counts})
        self.assertEqual(store.load("t").state.to_json(), state.to_json())  # type: ignore[union-attr]
        self.assertEqual(counts, {"execute": 1, "commit": 0, "rollback": 0, "in transaction": 0})
        with self.assertRaises(UnknownTaskError):
            store.load("nobody")

    def test_a_read_only_load_that_needs_another_read_loads_in_a_transaction(self) -> None:
        # A task recorded but never committed (its quarantine is read), and a record whose payload is
        # kept apart as a blob: the one statement cannot say all, so the load runs as a transaction.
        self.store.acquire_lease("new", "me", 30.0, time.time())
        lease, state = self.committed()
        key = next(iter(state.effects))
        state.effects[key] = dataclasses.replace(state.effects[key], payload={"big": "x" * LARGE_VALUE_BYTES})
        self.store.commit(lease, state, {key})
        store, counts = self.counted()
        store.read_lease("t")  # connected, the schema checked
        counts.update({name: 0 for name in counts})
        self.assertIsNone(store.load("new").state)
        self.assertEqual(counts["commit"], 1, "the read transaction")
        self.assertEqual(store.load("t").state.to_json(), state.to_json())  # type: ignore[union-attr]
        self.assertEqual(counts["commit"], 2)
        self.assertEqual(store.load("t").state.to_json(), state.to_json())  # type: ignore[union-attr]

    def test_a_lease_operation_reads_the_clock_and_the_lease_in_one_statement_and_writes_the_lease_in_one(self) -> None:
        store, counts = self.counted()
        lease = store.acquire_lease("t", "me", 30.0, time.time())
        counts.update({name: 0 for name in counts})
        lease = store.renew_lease(lease, 30.0, time.time())
        # the row lock, the clock with the lease row, the lease write (its epoch floor in the same statement)
        self.assertEqual((counts["execute"], counts["commit"]), (3, 1))
        counts.update({name: 0 for name in counts})
        store.release_lease(lease, time.time())
        self.assertEqual((counts["execute"], counts["commit"]), (3, 1))
        self.assertTrue(self.open().read_lease("t").released)  # type: ignore[union-attr]
        epochs = self.schema.execute("SELECT epoch_floor FROM longrun_tasks WHERE task_id = 't'")
        self.assertEqual(epochs, [(lease.epoch,)], "the epoch floor, raised by the lease write's statement")


class Pg8000OneRoundTripTests(OneRoundTripTests):
    driver = "pg8000"


class DatabaseFenceTests(PostgresCase):
    """The database refuses stale writes even if the check in ``BaseStore`` were skipped."""

    def test_a_stale_state_write_is_refused_by_the_update_itself(self) -> None:
        stale, state = self.committed()
        self.schema.execute("UPDATE longrun_leases SET expires_at = 0")  # expired by the server's clock
        self.open().acquire_lease("t", "other", 30.0, time.time())
        before = self.schema.execute("SELECT revision, header FROM longrun_states")
        with mock.patch.object(self.store, "_fence", lambda lease, operation: lease), self.assertRaises(FencedError):
            self.store.commit(stale, state)
        self.assertEqual(self.schema.execute("SELECT revision, header FROM longrun_states"), before)

    def test_an_epoch_never_moves_backwards(self) -> None:
        lease, _ = self.committed()
        for _ in range(2):
            lease = self.store.acquire_lease("t", "me", 30.0, time.time(), token=lease.token)  # re-entered by its holder
        epoch = self.store.read_lease("t").epoch
        # Pretend the code computed too low an epoch (it read no lease and no floor): the upsert refuses.
        with mock.patch.object(self.store, "_get_lease", lambda task_id: None), mock.patch.object(
            self.store, "_epoch_floor", lambda task_id: 0
        ), self.assertRaises(FencedError):
            self.store.acquire_lease("t", "me", 30.0, time.time())
        self.assertEqual(self.store.read_lease("t").epoch, epoch)

    def test_a_commit_that_fails_at_commit_time_poisons_the_task(self) -> None:
        for when in ("before the call reached the server", "after it committed"):
            with self.subTest(when):
                lease, state = self.committed(task := f"t{len(when)}")
                before = self.schema.execute("SELECT revision FROM longrun_states WHERE task_id = %s", (task,))
                real = self.store._db.one

                def failing(statement: str, params: Any = ()) -> Any:
                    if when.startswith("after"):
                        real(statement, params)
                    raise OSError("the connection dropped")

                with mock.patch.object(self.store._db, "one", failing), self.assertRaises(StorageError):
                    self.store.commit(lease, state)
                self.assertEqual(state.revision, 1)
                with self.assertRaises(StorageError):
                    self.store.commit(lease, state)  # the outcome of that call is unknown: load first
                stored = self.schema.execute("SELECT revision FROM longrun_states WHERE task_id = %s", (task,))
                self.assertEqual(stored, before if when.startswith("before") else [(2,)])
                self.store.load(task, lease=lease)
                self.assertEqual(self.store.commit(lease, state), stored[0][0] + 1)


class SessionTests(PostgresCase):
    def test_a_runner_frozen_inside_a_transaction_loses_its_session_not_the_task(self) -> None:
        lease = self.store.acquire_lease("t", "a", 30.0, time.time())
        self.store.release_lease(lease, time.time())
        frozen = self.open(transaction_timeout_s=0.5)
        outcome: list[BaseException | None] = []

        def freeze() -> None:
            try:
                with frozen._transaction("t", create=False):  # holds the task's row lock ...
                    time.sleep(2.0)  # ... and stops talking, as under SIGSTOP
                outcome.append(None)
            except BaseException as exc:  # asserted below
                outcome.append(exc)

        thread = threading.Thread(target=freeze)
        with mock.patch.object(logging.getLogger("longrun"), "disabled", True):  # it warns of its lost session
            thread.start()
            time.sleep(0.2)
            started = time.monotonic()
            taken = self.open().acquire_lease("t", "b", 30.0, time.time())
            waited = time.monotonic() - started
            thread.join()
        self.assertEqual(taken.owner, "b")
        self.assertLess(waited, 1.7, "the waiter got the lock when the server ended the frozen session")
        self.assertIsInstance(outcome[0], StorageError, "the frozen runner's transaction did not commit")
        self.assertEqual(frozen.read_lease("t").owner, "b", "and its store reconnects on the next call")

    def test_a_waiter_gives_up_after_the_lock_timeout(self) -> None:
        self.store.acquire_lease("t", "a", 30.0, time.time())
        holder = self.open()
        ready, done = threading.Event(), threading.Event()

        def hold() -> None:
            with holder._transaction("t", create=False):
                ready.set()
                done.wait(5)

        thread = threading.Thread(target=hold)
        thread.start()
        ready.wait(5)
        try:
            started = time.monotonic()
            with self.assertRaises(StorageError):
                self.open(transaction_timeout_s=0.3).acquire_lease("t", "b", 30.0, time.time())
            self.assertLess(time.monotonic() - started, 3.0)
        finally:
            done.set()
            thread.join()

    def test_a_broken_connection_is_replaced_on_the_next_call(self) -> None:
        self.committed()
        with self.store._db.session(write=False, what="find the backend"):
            pid = self.store._db.one("SELECT pg_backend_pid()")[0]
        self.schema.execute("SELECT pg_terminate_backend(%s)", (pid,))
        failures = 0
        for _ in range(2):
            try:
                self.assertEqual(self.store.read_lease("t").owner, "me")
            except StorageError:
                failures += 1
        self.assertLessEqual(failures, 1)
        self.assertEqual(self.store.load("t").state.revision, 1)

    def test_an_unreachable_server_is_a_storage_error(self) -> None:
        def refuse() -> Any:
            raise ConnectionRefusedError("connection refused")

        with self.assertRaises(StorageError) as caught:
            PostgresStore(refuse).list_tasks()
        self.assertIsInstance(caught.exception.__cause__, ConnectionRefusedError)
        with self.assertRaises(InvalidInputError):
            PostgresStore("postgresql://not-a-factory")  # type: ignore[arg-type]

    def test_the_repr_never_shows_the_connection_string(self) -> None:
        url = pg_support.dsn() or ""
        store = open_store(url)
        password = urllib.parse.urlsplit(url).password
        self.assertNotIn("@", repr(store))
        if password:
            self.assertNotIn(password, repr(store))


class SchemaTests(PostgresCase):
    def drop_status_counts(self) -> None:
        """Make the database look as schema version 8 left it: no status counts, no triggers."""
        self.schema.execute("DROP TABLE longrun_status_counts")
        self.schema.execute("DROP FUNCTION longrun_count_status CASCADE")  # and its triggers
        self.schema.execute("DELETE FROM longrun_schema WHERE version = 9")

    def test_a_version_8_database_gets_its_status_counts_built_from_the_summary_rows(self) -> None:
        lease, state = self.committed("a")
        self.committed("b")
        done_lease, done = self.committed("c")
        done.status = Status.DONE
        self.store.commit(done_lease, done, ())
        self.store.acquire_lease("n", "me", 30.0, time.time())  # a task with no revision
        self.store.close()
        self.drop_status_counts()
        self.assertEqual(self.schema.execute("SELECT MAX(version) FROM longrun_schema"), [(8,)])
        store = self.open()
        with self.assertLogs("longrun", "INFO") as logs:
            counts = store.status_counts()
        self.assertTrue(any("schema migrated to version 9" in line for line in logs.output), logs.output)
        self.assertEqual(counts, {"running": 2, "done": 1, "new": 1})
        self.assertEqual(self.schema.execute("SELECT MAX(version) FROM longrun_schema"), [(SCHEMA_VERSION,)])
        state.status = Status.FAILED  # the triggers count from here on, in the commit's one call too
        store.load("a", lease=lease)
        store.commit(lease, state, ())
        self.assertEqual(store.status_counts(), {"running": 1, "failed": 1, "done": 1, "new": 1})
        self.assertEqual(store.status_counts(), dict(self.schema.execute("SELECT status, COUNT(*) FROM longrun_summaries GROUP BY status")))

    def test_a_version_6_database_gets_a_summary_row_per_task_built_on_open(self) -> None:
        self.committed("a")
        lease, done = self.committed("b")
        done.status, done.updated_at = Status.DONE, 1_700_000_900.0
        self.store.commit(lease, done, ())
        self.store.acquire_lease("c", "me", 30.0, time.time())
        expected = self.store.list_summaries()
        self.store.close()
        self.drop_status_counts()
        self.schema.execute("DROP TABLE longrun_summaries")
        self.schema.execute("DROP FUNCTION longrun_commit")
        self.schema.execute("DELETE FROM longrun_schema WHERE version >= 7")
        with self.assertLogs("longrun", "INFO") as logs:
            migrated = self.open().list_summaries()
        self.assertTrue(any("schema migrated to version 7" in line for line in logs.output), logs.output)
        self.assertEqual([summary.task_id for summary in migrated], ["b", "a", "c"])
        self.assertEqual(migrated, expected)

    def test_a_version_7_database_gets_the_commit_function_on_open_and_commits_in_one_call(self) -> None:
        lease, state = self.committed()
        self.store.close()
        self.drop_status_counts()
        self.schema.execute("DROP FUNCTION longrun_commit")
        self.schema.execute("DELETE FROM longrun_schema WHERE version >= 8")
        store = self.open()
        with self.assertLogs("longrun", "INFO") as logs:
            self.assertEqual(store.load("t", lease=lease).state.to_json(), state.to_json())  # type: ignore[union-attr]
        self.assertTrue(any("schema migrated to version 8" in line for line in logs.output), logs.output)
        self.assertEqual(self.schema.execute("SELECT MAX(version) FROM longrun_schema"), [(SCHEMA_VERSION,)])
        self.assertEqual(self.schema.execute("SELECT to_regproc('longrun_commit') IS NOT NULL"), [(True,)])
        statements: list[str] = []
        real = store._db.run

        def counting(statement: str, params: Any = ()) -> Any:
            statements.append(statement)
            return real(statement, params)

        state.next_action = "committed after the migration"
        with mock.patch.object(store._db, "run", counting):
            self.assertEqual(store.commit(lease, state), 2)
        self.assertEqual(len(statements), 1, statements)
        self.assertEqual(self.open().load("t").state.next_action, "committed after the migration")  # type: ignore[union-attr]

    def test_a_schema_without_longruns_tables_is_refused_without_create_and_nothing_is_created(self) -> None:
        fresh = pg_support.Schema(self.driver, prefix="lr_bare")
        self.addCleanup(fresh.drop)
        fresh.execute("CREATE TABLE app_table (x INTEGER)")
        store = PostgresStore(fresh.factory(), create=False)
        self.addCleanup(store.close)
        with self.assertRaisesRegex(NotAStoreError, "is not a longrun store: its schema .* holds no longrun_schema table"):
            store.list_tasks()
        self.assertEqual(fresh.execute("SELECT to_regclass('longrun_schema') IS NULL"), [(True,)], "nothing was created")
        created = PostgresStore(fresh.factory())  # create=True, the default: longrun's tables beside the application's
        self.addCleanup(created.close)
        self.assertEqual(created.list_tasks(), [])
        self.assertEqual(store.list_tasks(), [], "now it is a store")

    def test_processes_creating_the_schema_at_once_do_not_collide(self) -> None:
        fresh = pg_support.Schema(self.driver, prefix="lr_fresh")
        self.addCleanup(fresh.drop)
        errors: list[BaseException] = []
        barrier = threading.Barrier(6)

        def start() -> None:
            store = PostgresStore(fresh.factory())
            try:
                barrier.wait()
                store.acquire_lease("t", f"owner-{threading.get_ident()}", 30.0, time.time())
            except LeaseHeldError:
                pass
            except BaseException as exc:  # asserted below
                errors.append(exc)
            finally:
                store.close()

        threads = [threading.Thread(target=start) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual(errors, [])
        self.assertEqual(fresh.execute("SELECT MAX(version) FROM longrun_schema"), [(SCHEMA_VERSION,)])

    def test_a_user_who_may_not_create_tables_uses_the_tables_an_administrator_made(self) -> None:
        lease, state = self.committed()
        role, password = f"lr_dml_{secrets.token_hex(4)}", secrets.token_hex(12)
        try:
            self.schema.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'", schema=False)
        except Exception as exc:  # the DSN's user may not create roles: nothing to test here then
            self.skipTest(f"cannot create a role: {exc}")
        self.addCleanup(self.schema.execute, f"DROP ROLE {role}", schema=False)
        self.addCleanup(self.schema.execute, f"DROP OWNED BY {role}", schema=False)
        self.schema.execute(f"GRANT USAGE ON SCHEMA {self.schema.name} TO {role}")
        self.schema.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {self.schema.name} TO {role}")
        parts = urllib.parse.urlsplit(pg_support.dsn() or "")
        url = parts._replace(netloc=f"{role}:{password}@{parts.hostname}:{parts.port or 5432}").geturl()
        connect = postgres_connector(url, driver=self.schema.driver)

        def factory() -> Any:
            connection = connect()
            connection.cursor().execute(f"SET search_path TO {self.schema.name}")
            connection.commit()
            return connection

        limited = PostgresStore(factory)
        self.addCleanup(limited.close)
        self.assertEqual(limited.load("t").state.to_json(), state.to_json())
        self.store.release_lease(lease, time.time())
        taken = limited.acquire_lease("t", "limited", 30.0, time.time())
        limited.load("t", lease=taken)
        self.assertEqual(limited.commit(taken, state), 2)

    def test_a_newer_schema_is_refused_with_a_clear_error(self) -> None:
        self.committed()
        self.schema.execute("INSERT INTO longrun_schema VALUES (%s, 0, 'future')", (SCHEMA_VERSION + 1,))
        with self.assertRaises(SchemaVersionError) as caught:
            self.open().load("t")
        self.assertIn("newer than this code knows", str(caught.exception))


class OpenStoreTests(PostgresCase):
    def test_a_url_opens_a_store_with_each_driver(self) -> None:
        url = self.schema.spec
        for driver in pg_support.available_drivers():
            with self.subTest(driver=driver):
                with mock.patch("longrun.stores._spec._DRIVERS", (driver,)):
                    store = open_store(url)
                self.addCleanup(store.close)
                self.assertIsInstance(store, PostgresStore)
                store.acquire_lease(f"via-{driver}", "me", 30.0, time.time())
        self.assertEqual(self.store.list_tasks(), [f"via-{driver}" for driver in sorted(pg_support.available_drivers())])


class RunnerOnPostgresTests(PostgresCase):
    def test_a_runner_completes_a_plan_and_resumes_without_repeating(self) -> None:
        outbox = self.path("outbox.jsonl")
        contract = RunContract("job", "write five lines")
        steps = [Step(f"s{i}", "write", {"n": i}) for i in range(5)]
        clock = FakeClock(start=time.time() - 2 * HOUR)  # a runner whose clock is two hours slow
        adapter = OutboxAdapter(outbox, raise_after_apply={"s2"})
        runner = Runner(contract, steps, store=self.store, adapters={"write": adapter}, clock=clock, limits=Limits(max_block_s=0))
        with self.assertLogs("longrun", "WARNING"):  # the runner warns that apply raised, then observes
            outcome = runner.run()
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        again = Runner(contract, steps, store=self.open(), adapters={"write": OutboxAdapter(outbox)}, clock=clock).run()
        self.assertEqual(again.status, Status.DONE)
        self.assertEqual(sorted(OutboxAdapter(outbox).counts().values()), [1] * 5)


class Pg8000Tests(ServerClockTests):
    """The server-clock tests again through the other driver."""

    driver = "pg8000"


if __name__ == "__main__":
    unittest.main()
