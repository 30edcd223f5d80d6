"""One store object shared by many threads: every store longrun ships is safe to share.

A thread pool runs 64 tasks (200 under ``LONGRUN_TEST_SCALE=full``) through a single store object
(16 threads; each Runner also renews its lease from a thread of its own). Afterwards a fresh store
object must load every task from its primary state, ``done``, with every effect verified, and the
counting target must have received each effect exactly once.

The JSON-file store keeps a bounded number of journal descriptors open and closes the least
recently used one when it needs another; with more tasks in flight than that bound, the one it
closes may belong to a task another thread is committing. The test lowers the bound below the
number of threads so that this happens on every run (the same as more than 64 tasks in flight).
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
import unittest
from typing import Any, Callable
from unittest import mock

from helpers import pg_support, scale
from helpers import support
from longrun import (
    EffectState,
    JsonFileStore,
    Observation,
    PostgresStore,
    Receipt,
    RunContract,
    Runner,
    RunState,
    SqliteStore,
    Status,
    Step,
)
from longrun.adapters import EffectRequest
from longrun.budget import BudgetCounters
from longrun.stores import jsonfile
from longrun.stores._fileio import FileIO


class CountingTarget:
    """A target shared by every thread: counts each apply per effect key, observes by that count."""

    deduplicates = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.applied: collections.Counter[str] = collections.Counter()

    def apply(self, request: EffectRequest) -> Receipt:
        with self._lock:
            self.applied[request.key] += 1
        return Receipt(result={"key": request.key}, evidence="counted")

    def observe(self, request: EffectRequest) -> Observation:
        with self._lock:
            count = self.applied[request.key]
        if count:
            return Observation.applied(f"applied {count} time(s)", {"key": request.key})
        return Observation.absent("never applied")


class _Shared(support.TempDirTest):
    tasks = scale.scaled(64, 200)
    threads = 16
    steps = 5

    def make_store(self) -> Any:
        raise NotImplementedError

    def run_all(self, store: Any, reopen: Callable[[], Any]) -> None:
        target = CountingTarget()
        plan = [Step(f"s{index}", "write", {"n": index}) for index in range(self.steps)]

        def run(number: int) -> tuple[str, Status]:
            task_id = f"task-{number:03d}"
            # A short lease makes each runner's keeper thread renew while the pool commits.
            runner = Runner(RunContract(task_id, "count"), plan, store=store, adapters={"write": target}, lease_ttl_s=0.6)
            return task_id, runner.run().status

        with concurrent.futures.ThreadPoolExecutor(self.threads) as pool:
            outcomes = dict(pool.map(run, range(self.tasks)))
        self.assertEqual(collections.Counter(outcomes.values()), {Status.DONE: self.tasks})

        fresh = reopen()
        try:
            self.assertEqual(len(fresh.list_tasks()), self.tasks)
            expected_keys = set()
            for task_id in sorted(outcomes):
                loaded = fresh.load(task_id)
                self.assertEqual(loaded.source, "primary", task_id)
                assert loaded.state is not None
                self.assertEqual(loaded.state.status, Status.DONE, task_id)
                self.assertEqual(len(loaded.state.effects), self.steps, task_id)
                for record in loaded.state.effects.values():
                    self.assertEqual(record.state, EffectState.VERIFIED, f"{task_id}/{record.step_id}")
                    expected_keys.add(record.key)
        finally:
            close = getattr(fresh, "close", None)
            if close is not None:
                close()
        self.assertEqual(len(expected_keys), self.tasks * self.steps)
        self.assertEqual(set(target.applied), expected_keys)
        duplicates = {key: count for key, count in target.applied.items() if count != 1}
        self.assertEqual(duplicates, {}, "every effect applied exactly once")


class JsonFileThreadTests(_Shared):
    def test_tasks_on_a_thread_pool_through_one_store_each_land_once(self) -> None:
        root = self.path("root")
        os.makedirs(root)
        store = JsonFileStore(root)
        self.addCleanup(store.close)
        # Fewer descriptors than threads: the store must close only journals no thread is using.
        with mock.patch.object(jsonfile, "MAX_OPEN_JOURNALS", 4):
            self.run_all(store, lambda: JsonFileStore(root))

    def test_the_same_with_the_default_descriptor_bound(self) -> None:
        root = self.path("root")
        os.makedirs(root)
        store = JsonFileStore(root)
        self.addCleanup(store.close)
        self.run_all(store, lambda: JsonFileStore(root))


class PausingIO(FileIO):
    """Holds the first ``fdatasync`` made by the thread named ``paused`` until ``resume`` is set."""

    def __init__(self) -> None:
        self.paused: str | None = None
        self.inside = threading.Event()
        self.resume = threading.Event()

    def fdatasync(self, fd: int) -> None:
        if threading.current_thread().name == self.paused:
            self.paused = None
            self.inside.set()
            self.resume.wait()
        super().fdatasync(fd)


class JsonFileDescriptorTests(support.TempDirTest):
    def test_a_journal_descriptor_is_not_closed_while_another_thread_commits_through_it(self) -> None:
        io = PausingIO()
        root = self.path("root")
        os.makedirs(root)
        store = JsonFileStore(root, io=io)
        self.addCleanup(store.close)
        leases, states = {}, {}
        for task in ("a", "b"):
            leases[task] = store.acquire_lease(task, "me", 30.0, 0.0)
            store.load(task, lease=leases[task])
            states[task] = RunState(task_id=task, plan_digest="sha256:p", budget=BudgetCounters(created_at=0.0), next_action="go")
            store.commit(leases[task], states[task])  # the first commit writes a snapshot and its journal
        errors: list[BaseException] = []

        def commit_a() -> None:
            try:
                states["a"].next_action = "written by the paused thread"
                store.commit(leases["a"], states["a"])
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        with mock.patch.object(jsonfile, "MAX_OPEN_JOURNALS", 1):
            store.commit(leases["a"], states["a"])  # a's journal descriptor is now open
            io.paused = "committer-a"
            thread = threading.Thread(target=commit_a, name="committer-a")
            thread.start()
            self.assertTrue(io.inside.wait(60), "the thread reached its fdatasync")
            # b's commit opens a second descriptor, over the bound of 1: a's is the least recently
            # used, but a thread is inside a's commit, so it must stay open.
            states["b"].next_action = "b"
            store.commit(leases["b"], states["b"])
            io.resume.set()
            thread.join(60)
        self.assertEqual(errors, [])
        fresh = JsonFileStore(root)
        self.assertEqual(fresh.load("a").state.next_action, "written by the paused thread")  # type: ignore[union-attr]
        self.assertEqual(fresh.load("b").state.next_action, "b")  # type: ignore[union-attr]
        self.assertLessEqual(len(store._open_journals), 2)


class PausingAfterTurnStore(JsonFileStore):
    """Holds the thread named ``paused`` just after it leaves a task's turn, until ``resume``."""

    paused: str | None = None

    def _leave_gate(self, task_id: str, gate: Any) -> None:
        super()._leave_gate(task_id, gate)
        if threading.current_thread().name == self.paused:
            self.paused = None
            self.inside.set()
            self.resume.wait()


class SameTaskTests(support.TempDirTest):
    def test_two_threads_committing_one_task_get_growing_revisions(self) -> None:
        root = self.path("root")
        os.makedirs(root)
        store = PausingAfterTurnStore(root)
        store.inside, store.resume = threading.Event(), threading.Event()
        self.addCleanup(store.close)
        lease = store.acquire_lease("t", "me", 30.0, 0.0)
        store.load("t", lease=lease)
        first = RunState(task_id="t", plan_digest="sha256:p", budget=BudgetCounters(created_at=0.0), next_action="first")
        store.commit(lease, first)
        second = RunState(task_id="t", plan_digest="sha256:p", budget=BudgetCounters(created_at=0.0), next_action="second")
        revisions: list[int] = []
        store.paused = "committer"
        thread = threading.Thread(target=lambda: revisions.append(store.commit(lease, first)), name="committer")
        thread.start()
        self.assertTrue(store.inside.wait(60))
        # The first commit has landed and left the task's turn; the second must build on it.
        revisions.append(store.commit(lease, second))
        store.resume.set()
        thread.join(60)
        self.assertEqual(sorted(revisions), [2, 3])
        loaded = JsonFileStore(root).load("t")
        self.assertEqual((loaded.source, loaded.state.revision, loaded.state.next_action), ("primary", 3, "second"))  # type: ignore[union-attr]


class SqliteThreadTests(_Shared):
    def test_tasks_on_a_thread_pool_through_one_store_each_land_once(self) -> None:
        path = self.path("tasks.db")
        store = SqliteStore(path, create=True)
        self.addCleanup(store.close)
        self.run_all(store, lambda: SqliteStore(path))


class PostgresThreadTests(pg_support.SchemaPerTest, _Shared):
    tasks = 60
    threads = 8

    def test_tasks_on_a_thread_pool_through_one_store_each_land_once(self) -> None:
        store = PostgresStore(self.schema.factory())
        self.addCleanup(store.close)
        self.run_all(store, lambda: PostgresStore(self.schema.factory()))


if __name__ == "__main__":
    unittest.main()
