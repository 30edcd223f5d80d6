"""A read-only load while the task is being run: never taken for a rolled-back state.

A SQLite reader does not block writers: its snapshot may predate a commit, and the witness file
that names that commit may be written before the reader looks at it. A worker (or ``longrun
status``) reading a task another process runs must get the older revision, not
``StateUnrecoverableError`` (which would also refuse that store object's writes to the task).
"""

from __future__ import annotations

import os
import time
import unittest

from helpers import support
from longrun import BudgetCounters, RunState, SqliteStore
from longrun.protocols import LoadResult


class ReadOnlyLoadRaceTests(support.TempDirTest):
    def test_a_commit_and_lease_write_between_the_readers_snapshot_and_its_witness_read_is_no_rollback(self) -> None:
        path = os.path.join(self.tmp, "tasks.db")
        writer = SqliteStore(path, create=True)
        reader = SqliteStore(path)
        self.addCleanup(writer.close)
        self.addCleanup(reader.close)
        now = time.time()
        lease = writer.acquire_lease("t", "runner", 30.0, now)
        state = RunState(
            task_id="t", plan_digest="sha256:" + "0" * 64, budget=BudgetCounters(created_at=now, last_progress_at=now), created_at=now
        )
        writer.commit(lease, state)
        lease = writer.renew_lease(lease, 30.0, time.time())  # the witness names revision 1

        real = SqliteStore._get_state

        def racing(store: SqliteStore, task_id: str, *, repair: bool) -> LoadResult:
            result = real(store, task_id, repair=repair)  # the reader's snapshot: revision 1
            if store is reader:  # meanwhile the runner commits revision 2 and renews its lease
                writer.commit(lease, state)
                writer.renew_lease(lease, 30.0, time.time())
            return result

        SqliteStore._get_state = racing  # type: ignore[method-assign]
        try:
            loaded = reader.load("t")
        finally:
            SqliteStore._get_state = real  # type: ignore[method-assign]
        assert loaded.state is not None
        self.assertEqual(loaded.state.revision, 1)
        self.assertEqual(reader.load("t").state.revision, 2)  # type: ignore[union-attr]


if __name__ == "__main__":
    unittest.main()
