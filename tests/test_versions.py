"""Code versions: each task records its function's version when it starts; a worker with
``version_policy="same"`` runs only tasks of its version; ``longrun status`` shows it. On each store."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import threading
import time
import unittest
from typing import Any

from helpers import pg_support, support
from longrun import JsonFileStore, Limits, SqliteStore, durable
from longrun.cli import main
from longrun.errors import InvalidInputError
from longrun.functions import FUNCTION_STEP
from longrun.stores import PostgresStore
from longrun.stores.queue import open_queue
from longrun.worker import Worker

DEADLINE_S = 60.0
"""A liveness guard, not a timing assertion."""


def greet(run: Any, name: str) -> str:
    return str(run.call("greeting", lambda: f"hello {name}"))


class VersionCases:
    def make_store(self) -> Any:
        raise NotImplementedError

    def spec(self) -> str:
        raise NotImplementedError

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.store = self.make_store()
        self.addCleanup(lambda: getattr(self.store, "close", lambda: None)())  # type: ignore[attr-defined]

    def version_of(self, task_id: str) -> object:
        state = self.store.load(task_id).state
        return state.effects[FUNCTION_STEP].payload.get("version")

    def test_a_task_records_the_given_version_or_a_digest_of_the_module_source(self) -> None:
        t: Any = self
        given = durable(store=self.store, version="2026.12-a", limits=Limits(max_block_s=0.05))(greet)
        given.run("v-given", "ada")
        t.assertEqual(self.version_of("v-given"), "2026.12-a")
        default = durable(store=self.store)(greet)
        with open(__file__, "rb") as handle:
            digest = "source-" + hashlib.sha256(handle.read()).hexdigest()[:12]
        t.assertEqual(default.version, digest)
        default.start("v-default", "bob")
        t.assertEqual(self.version_of("v-default"), digest)
        # New code (another version) resumes a task: it keeps the version it started with.
        t.assertEqual(default.run("v-given", "ada").result, "hello ada")
        t.assertEqual(self.version_of("v-given"), "2026.12-a")
        for bad in ("", "has space", "x" * 65, 7):
            with t.assertRaises(InvalidInputError):
                durable(store=self.store, version=bad)(greet)  # type: ignore[arg-type]

    def test_status_shows_the_version(self) -> None:
        t: Any = self
        durable(store=self.store, version="v7")(greet).start("shown", "cy")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            t.assertEqual(main(["status", self.spec(), "shown"]), 0)
        t.assertIn("  code version v7", out.getvalue())
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["status", self.spec(), "shown", "--json"])
        t.assertEqual(json.loads(out.getvalue())["code_version"], "v7")

    def serve(self, worker: Worker, done: Any) -> None:
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            deadline = time.monotonic() + DEADLINE_S
            while not done():
                if time.monotonic() > deadline:
                    raise AssertionError("the worker did not get there")
                time.sleep(0.05)
        finally:
            worker.stop()
            thread.join(DEADLINE_S)

    def test_a_worker_of_policy_same_runs_only_tasks_of_its_version(self) -> None:
        t: Any = self
        old = durable(store=self.store, version="v1")(greet)
        new = durable(store=self.store, version="v2")(greet)
        old.start("old-task", "ann")
        new.start("new-task", "ben")
        queue = open_queue(self.store)
        t.addCleanup(queue.close)

        def row(task_id: str) -> Any:
            return next(entry for entry in queue.entries() if entry.task_id == task_id)

        same = Worker(self.store, [new], version_policy="same", poll_s=0.05, rescan_s=0.05)
        self.serve(same, lambda: row("new-task").status == "done" and row("old-task").status == "other-version")
        t.assertEqual(self.store.load("old-task").state.status.value, "queued")  # recorded, never run by v2
        t.assertEqual(self.store.load("new-task").state.status.value, "done")
        t.assertGreater(row("old-task").due_in_s, 1.0)  # left for another worker, looked at again later
        queue.wake("old-task")
        same_old = Worker(self.store, [old], version_policy="same", poll_s=0.05, rescan_s=0.05)
        self.serve(same_old, lambda: row("old-task").status == "done")
        t.assertEqual(old.run("old-task", "ann").result, "hello ann")
        with t.assertRaises(InvalidInputError):
            Worker(self.store, [new], version_policy="newest")


class SqliteVersionTests(VersionCases, support.TempDirTest):
    def make_store(self) -> Any:
        return SqliteStore(os.path.join(self.tmp, "tasks.db"), create=True)

    def spec(self) -> str:
        return "sqlite:" + os.path.join(self.tmp, "tasks.db")


class JsonVersionTests(VersionCases, support.TempDirTest):
    def make_store(self) -> Any:
        return JsonFileStore(os.path.join(self.tmp, "store"), create=True)

    def spec(self) -> str:
        return os.path.join(self.tmp, "store")


class PostgresVersionTests(VersionCases, pg_support.SchemaPerTest, support.TempDirTest):
    def make_store(self) -> Any:
        return PostgresStore(self.schema.factory())

    def spec(self) -> str:
        return self.schema.spec


if __name__ == "__main__":
    unittest.main()
