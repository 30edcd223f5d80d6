"""The JSON-file store's summary index (``stores.jsonfile._index``): rows follow commits, a crash
between a commit's journal write and its row write is read again from the files once the writer
is gone (SIGKILL of a real process), a missing, damaged or older index is rebuilt, a listing loads
no task it does not have to, and an index that cannot be written costs a slower listing, not a task."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import unittest
from unittest import mock

from helpers import support
from longrun import JsonFileStore, RunState, StorageError
from longrun.budget import BudgetCounters
from longrun.outcome import Status
from longrun.stores.jsonfile._index import INDEX_FILE, SummaryIndex

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
NOW = 1_700_000_000.0


def state(task_id: str, status: Status = Status.RUNNING, updated_at: float = NOW) -> RunState:
    made = RunState(task_id=task_id, plan_digest="sha256:p", budget=BudgetCounters(created_at=0.0), next_action="go")
    made.status, made.updated_at = status, updated_at
    return made


def commit(store: JsonFileStore, task_id: str, status: Status = Status.RUNNING, updated_at: float = NOW, *, release: bool = True) -> None:
    lease = store.acquire_lease(task_id, "tester", 30.0, NOW)
    store.load(task_id, lease=lease)
    store.commit(lease, state(task_id, status, updated_at), None)
    if release:
        store.release_lease(lease, NOW)


class SummaryIndexTests(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.root = os.path.join(self.tmp, "store")
        self.store = JsonFileStore(self.root, create=True)
        self.addCleanup(self.store.close)

    def rows(self) -> dict[str, tuple[str, int, int]]:
        """The index file's rows as stored: task -> (status, revision, dirty)."""
        with sqlite3.connect(os.path.join(self.root, INDEX_FILE)) as connection:
            return {row[0]: (row[1], row[2], row[3]) for row in connection.execute("SELECT task_id, status, revision, dirty FROM summaries")}

    def test_rows_follow_commits_and_are_settled_at_release(self) -> None:
        commit(self.store, "a", Status.DONE)
        lease = self.store.acquire_lease("b", "tester", 30.0, NOW)
        self.store.load("b", lease=lease)
        self.store.commit(lease, state("b", Status.SLEEPING, NOW + 1), None)
        self.assertEqual(self.rows(), {"a": ("done", 1, 0), "b": ("sleeping", 1, 1)}, "b's lease is held: its row stays marked")
        self.assertEqual([(s.task_id, s.status) for s in self.store.list_summaries()], [("b", "sleeping"), ("a", "done")])
        self.store.release_lease(lease, NOW)
        self.assertEqual(self.rows()["b"], ("sleeping", 1, 0))
        self.assertEqual(self.store.status_counts(), {"done": 1, "sleeping": 1})

    def test_a_running_holder_writes_its_row_at_most_once_an_interval_and_catches_up_at_release(self) -> None:
        lease = self.store.acquire_lease("r", "tester", 30.0, NOW)
        self.store.load("r", lease=lease)
        self.store.commit(lease, state("r"), None)
        with (
            mock.patch("longrun.stores.jsonfile._store.INDEX_ROW_INTERVAL_S", 3600.0),
            mock.patch.object(SummaryIndex, "put", autospec=True, side_effect=SummaryIndex.put) as puts,
        ):
            for step in range(20):
                current = self.store.load("r", lease=lease).state
                assert current is not None
                current.updated_at, current.next_action = NOW + step, f"step {step}"
                self.store.commit(lease, current, None)
            self.assertEqual((puts.call_count, self.rows()["r"]), (0, ("running", 1, 1)), "no row write per running commit")
            self.assertEqual([s.status for s in self.store.list_summaries()], ["running"])
            current = self.store.load("r", lease=lease).state
            assert current is not None
            current.status = Status.SLEEPING
            self.store.commit(lease, current, None)
            self.assertEqual((puts.call_count, self.rows()["r"]), (1, ("sleeping", 22, 1)), "a status change is written at once")
            current = self.store.load("r", lease=lease).state
            assert current is not None
            current.status, current.next_action = Status.RUNNING, "again"
            self.store.commit(lease, current, None)
            self.store.commit(lease, current, None)  # running, as the row says: not written yet
            self.assertEqual(self.rows()["r"], ("running", 23, 1))
            self.store.release_lease(lease, NOW)
        self.assertEqual(self.rows()["r"], ("running", 24, 0), "the release wrote the last commit's row and settled it")
        self.assertEqual(self.store.list_summaries()[0].next_action, "again")

    def test_a_listing_loads_no_task_once_the_index_is_built(self) -> None:
        for index in range(30):
            commit(self.store, f"t{index:02d}", Status.DONE, NOW + index)
        reader = JsonFileStore(self.root)
        self.addCleanup(reader.close)
        with mock.patch.object(JsonFileStore, "_get_state", autospec=True, side_effect=JsonFileStore._get_state) as loads:
            page = reader.list_summaries(limit=5, statuses=["done"])
            counts = reader.status_counts()
        self.assertEqual([summary.task_id for summary in page], ["t29", "t28", "t27", "t26", "t25"])
        self.assertEqual(counts, {"done": 30})
        self.assertEqual(loads.call_count, 0, "every row was settled by its writer")

    def test_a_missing_damaged_or_older_index_is_rebuilt_from_the_files(self) -> None:
        commit(self.store, "a", Status.DONE)
        commit(self.store, "b", Status.CANCELLED, NOW + 1)
        self.store.close()
        path = os.path.join(self.root, INDEX_FILE)
        expected = [("b", "cancelled", 1), ("a", "done", 1)]
        os.remove(path)
        with self.assertLogs("longrun", "INFO") as logs:
            self.assertEqual([(s.task_id, s.status, s.revision) for s in JsonFileStore(self.root).list_summaries()], expected)
        self.assertIn("summary index built from 2 tasks", "\n".join(logs.output))
        with sqlite3.connect(path) as connection:
            connection.execute("UPDATE meta SET value = '0' WHERE name = 'version'")
            connection.execute("UPDATE summaries SET status = 'waiting'")
        self.assertEqual([(s.task_id, s.status, s.revision) for s in JsonFileStore(self.root).list_summaries()], expected)
        for suffix in ("-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        with open(path, "wb") as damaged:
            damaged.write(b"not a database" * 100)
        with self.assertLogs("longrun", "WARNING") as logs:
            self.assertEqual([(s.task_id, s.status, s.revision) for s in JsonFileStore(self.root).list_summaries()], expected)
        self.assertIn("is damaged", "\n".join(logs.output))
        self.assertTrue([name for name in os.listdir(self.root) if name.startswith(INDEX_FILE + ".damaged.")], "set aside, not deleted")

    def test_a_version_1_index_gets_its_status_counts_built_in_place_and_kept_by_each_write(self) -> None:
        commit(self.store, "a", Status.DONE)
        commit(self.store, "b", Status.CANCELLED, NOW + 1)
        commit(self.store, "c", Status.DONE, NOW + 2)
        self.store.close()
        path = os.path.join(self.root, INDEX_FILE)
        with sqlite3.connect(path) as connection:  # what version 1 left: no counts, no triggers
            connection.execute("DROP TABLE status_counts")  # its triggers go with it
            connection.execute("UPDATE meta SET value = '1' WHERE name = 'version'")
        store = JsonFileStore(self.root)
        with mock.patch.object(JsonFileStore, "load", side_effect=AssertionError("the rows are kept, not rebuilt")):
            self.assertEqual(store.status_counts(), {"done": 2, "cancelled": 1})
        commit(store, "d", Status.FAILED, NOW + 3)
        self.assertEqual(store.status_counts(), {"done": 2, "cancelled": 1, "failed": 1})
        with sqlite3.connect(path) as connection:
            self.assertEqual(connection.execute("SELECT value FROM meta WHERE name = 'version'").fetchall(), [("2",)])
            rows = dict(connection.execute("SELECT status, COUNT(*) FROM summaries GROUP BY status").fetchall())
        self.assertEqual(store.status_counts(), rows)

    def test_a_deleted_task_leaves_the_index_even_if_the_deletion_was_cut_short(self) -> None:
        commit(self.store, "a", Status.DONE)
        commit(self.store, "b", Status.DONE)
        self.store.delete_task("a", NOW)
        self.assertEqual(set(self.rows()), {"b"})
        # A crash after the rename and before the row's deletion: the row is marked, the directory gone.
        self.store._index.mark("b")
        os.rename(os.path.join(self.root, "b"), os.path.join(self.root, ".deleted.b.0000"))
        self.assertEqual(self.store.list_summaries(), [])
        self.assertEqual(self.rows(), {})

    def test_an_index_that_cannot_be_written_costs_a_slower_listing_and_refuses_new_leases(self) -> None:
        commit(self.store, "a", Status.DONE)
        self.store.close()
        path = os.path.join(self.root, INDEX_FILE)
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        os.mkdir(path)
        store = JsonFileStore(self.root)
        self.addCleanup(store.close)
        with self.assertLogs("longrun", "WARNING") as logs:
            self.assertEqual([(s.task_id, s.status) for s in store.list_summaries()], [("a", "done")])
        self.assertIn("loads every task instead", "\n".join(logs.output))
        with self.assertRaises(StorageError):
            store.acquire_lease("c", "tester", 30.0, NOW)  # no write may go unmarked
        self.assertIsNone(store.read_lease("c") if os.path.isdir(os.path.join(self.root, "c")) else None)


CHILD = textwrap.dedent(
    """
    import sys
    from longrun import JsonFileStore, RunState
    from longrun.budget import BudgetCounters
    from longrun.outcome import Status
    store = JsonFileStore(sys.argv[1], create=True)
    lease = store.acquire_lease("t", "child", 30.0, 1_700_000_000.0)
    store.load("t", lease=lease)
    state = RunState(task_id="t", plan_digest="sha256:p", budget=BudgetCounters(created_at=0.0), next_action="go")
    store.commit(lease, state, None)           # revision 1, running: indexed
    state.status = Status.DONE
    store.commit(lease, state, None)           # revision 2, done: killed before its row is written
    print("not killed", flush=True)
    """
)


class CrashBetweenTheTwoWritesTests(support.TempDirTest):
    def test_a_sigkill_between_the_journal_write_and_the_row_write_shows_the_committed_status(self) -> None:
        root = os.path.join(self.tmp, "store")
        env = {**os.environ, "PYTHONPATH": SRC, "LONGRUN_CRASH_AT": "index.before_write:2"}
        child = subprocess.run([sys.executable, "-c", CHILD, root], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(child.returncode, -9, child.stdout + child.stderr)
        with sqlite3.connect(os.path.join(root, INDEX_FILE)) as connection:
            row = connection.execute("SELECT status, revision, dirty FROM summaries WHERE task_id = 't'").fetchone()
        self.assertEqual(row, ("running", 1, 1), "the row trails the files by the killed commit, and is marked")
        store = JsonFileStore(root)
        self.addCleanup(store.close)
        self.assertEqual([(s.status, s.revision) for s in store.list_summaries()], [("done", 2)], "read again from the files")
        self.assertEqual(store.status_counts(), {"done": 1})
        with sqlite3.connect(os.path.join(root, INDEX_FILE)) as connection:
            self.assertEqual(connection.execute("SELECT dirty FROM summaries").fetchall(), [(0,)], "settled: its writer is gone")


if __name__ == "__main__":
    unittest.main()
