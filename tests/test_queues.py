"""Named queues on each store: concurrency across workers and per worker, the rate limiter, delay,
priorities, the dedup id held while its task has not ended, and ``longrun queues``. A rate limit
held by a fleet of worker processes is in test_fleet_crash.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
import time
import unittest
from typing import Any

from helpers import pg_support, support
from longrun import JsonFileStore, Limits, Queue, SqliteStore, durable
from longrun.cli import main
from longrun.errors import CorruptStateError, DuplicateTaskError, InvalidInputError, UnknownTaskError
from longrun.stores import PostgresStore
from longrun.stores.queue import open_queue
from longrun.worker import Worker

DEADLINE_S = 60.0
"""A liveness guard, not a timing assertion."""


class QueueRecordTests(unittest.TestCase):
    def test_the_record_round_trips_and_bad_limits_are_refused(self) -> None:
        queue = Queue("api", concurrency=4, per_worker=2, rate=(100, 60), priority=False)
        self.assertEqual(Queue.from_json(json.loads(json.dumps(queue.to_json()))), queue)
        self.assertEqual(queue.rate, (100, 60.0))
        for bad in (dict(concurrency=0), dict(per_worker=True), dict(rate=(0, 60)), dict(rate=(5, -1)), dict(rate=(5,))):
            with self.subTest(bad=bad):
                with self.assertRaises(InvalidInputError):
                    Queue("api", **bad)  # type: ignore[arg-type]
        with self.assertRaises(InvalidInputError):
            Queue("../api")
        with self.assertRaises(CorruptStateError):
            Queue.from_json({**queue.to_json(), "concurrency": -1})


class Gate:
    """A target whose applies count how many run at once, held open until released."""

    deduplicates = False

    def __init__(self, hold_s: float = 0.15) -> None:
        self.hold_s = hold_s
        self.now = 0
        self.most = 0
        self.applied: dict[str, int] = {}
        self._lock = threading.Lock()

    def apply(self, request: Any) -> Any:
        from longrun import Receipt

        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(self.hold_s)
        with self._lock:
            self.now -= 1
            self.applied[request.key] = self.applied.get(request.key, 0) + 1
        return Receipt(result={"ok": True}, evidence="counted")

    def observe(self, request: Any) -> Any:
        from longrun import Observation

        return Observation.applied("found") if request.key in self.applied else Observation.absent("none")


class QueueCases:
    def make_store(self) -> Any:
        raise NotImplementedError

    def spec(self) -> str:
        raise NotImplementedError

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.store = self.make_store()
        self.addCleanup(lambda: getattr(self.store, "close", lambda: None)())  # type: ignore[attr-defined]
        self.queue = open_queue(self.store)
        self.addCleanup(self.queue.close)  # type: ignore[attr-defined]
        self.gate = Gate()

        @durable(store=self.store, adapters={"send": self.gate}, allowed_actions=("send",), limits=Limits(max_block_s=0.05))
        def job(run: Any, n: int) -> int:
            run.effect("work", "send", {"n": n})
            return n

        self.job = job

    def status(self, task_id: str) -> str:
        try:
            state = self.store.load(task_id).state
        except UnknownTaskError:
            return "none"
        return state.status.value if state is not None else "none"

    def serve(self, workers: list[Worker], done: Any) -> None:
        threads = [threading.Thread(target=worker.run) for worker in workers]
        for thread in threads:
            thread.start()
        try:
            deadline = time.monotonic() + DEADLINE_S
            while not done():
                if time.monotonic() > deadline:
                    raise AssertionError("the workers did not finish")
                time.sleep(0.05)
        finally:
            for worker in workers:
                worker.stop()
            for thread in threads:
                thread.join(DEADLINE_S)

    def test_a_queue_must_be_defined_and_a_queue_without_priorities_refuses_one(self) -> None:
        t: Any = self
        with t.assertRaises(InvalidInputError) as caught:
            self.job.enqueue("a", (1,), queue="nowhere")
        t.assertIn("no queue named 'nowhere'", str(caught.exception))
        t.assertEqual(self.status("a"), "none")  # nothing was recorded
        t.assertTrue(self.job.enqueue("b", (1,), queue=Queue("fifo", priority=False)))
        with t.assertRaises(InvalidInputError):
            self.job.enqueue("c", (1,), queue="fifo", priority=5)
        t.assertEqual(self.queue.named_queues(), {"fifo": Queue("fifo", priority=False)})

    def test_concurrency_counts_running_tasks_of_the_queue_across_workers(self) -> None:
        t: Any = self
        api = Queue("api", concurrency=2)
        for i in range(6):
            self.job.enqueue(f"api-{i}", (i,), queue=api)
        workers = [Worker(self.store, [self.job], concurrency=4, poll_s=0.05, rescan_s=0.05, name=f"w{k}") for k in range(2)]
        self.serve(workers, lambda: all(self.status(f"api-{i}") == "done" for i in range(6)))
        t.assertEqual(self.gate.most, 2)  # 8 threads free, the queue's 2 places full
        t.assertEqual(set(self.gate.applied.values()), {1})

    def test_per_worker_bounds_one_worker(self) -> None:
        t: Any = self
        for i in range(3):
            self.job.enqueue(f"one-{i}", (i,), queue=Queue("single", per_worker=1))
        self.serve([Worker(self.store, [self.job], concurrency=4, poll_s=0.05, rescan_s=0.05)], lambda: all(self.status(f"one-{i}") == "done" for i in range(3)))
        t.assertEqual(self.gate.most, 1)

    def test_the_rate_limit_admits_at_most_n_starts_per_period_across_workers(self) -> None:
        t: Any = self
        for i in range(8):
            self.job.enqueue(f"r-{i}", (i,), queue=Queue("rated", rate=(3, 3600)))
        first = self.queue.claim("w1", [self.job.name], 8, 30.0)
        second = self.queue.claim("w2", [self.job.name], 8, 30.0)
        t.assertEqual((len(first), len(second)), (3, 0))
        t.assertTrue(self.queue.limited)
        stats = {entry["queue"]: entry for entry in self.queue.queue_stats()}
        t.assertEqual((stats["rated"]["depth"], stats["rated"]["running"]), (5, 3))

    def test_delay_and_priority_order_what_is_claimed(self) -> None:
        t: Any = self
        self.job.enqueue("later", (1,), delay_s=3600)
        self.job.enqueue("low", (2,), queue=Queue("ranked"), priority=1)
        self.job.enqueue("high", (3,), queue="ranked", priority=9)
        claims = self.queue.claim("w1", [self.job.name], 10, 30.0)
        t.assertEqual([claim.task_id for claim in claims], ["high", "low"])
        later = next(entry for entry in self.queue.entries() if entry.task_id == "later")
        t.assertGreater(later.due_in_s or 0.0, 3000)  # recorded, due only after its delay

    def test_a_dedup_id_is_refused_while_its_holder_has_not_ended_and_freed_when_it_ends(self) -> None:
        t: Any = self
        mail = Queue("mail")
        t.assertTrue(self.job.enqueue("first", (1,), queue=mail, dedup_id="order-7"))
        t.assertFalse(self.job.enqueue("first", (1,), queue="mail", dedup_id="order-7"))  # the holder itself: nothing new
        with t.assertRaises(DuplicateTaskError) as caught:
            self.job.enqueue("second", (2,), queue="mail", dedup_id="order-7")
        t.assertEqual(caught.exception.holder, "first")
        t.assertIn("held by task 'first'", str(caught.exception))
        t.assertEqual(self.status("second"), "none")
        t.assertTrue(self.job.enqueue("elsewhere", (3,), dedup_id="order-7"))  # another queue, another id space
        t.assertEqual(self.job.run("first", 1).status.value, "done")
        t.assertTrue(self.job.enqueue("second", (2,), queue="mail", dedup_id="order-7"))
        with t.assertRaises(DuplicateTaskError) as again:
            self.job.enqueue("third", (4,), queue="mail", dedup_id="order-7")
        t.assertEqual(again.exception.holder, "second")

    def test_longrun_queues_shows_depth_running_oldest_wait_and_limits(self) -> None:
        t: Any = self
        self.job.enqueue("q-1", (1,), queue=Queue("api", concurrency=4, per_worker=2, rate=(100, 60)))
        self.job.enqueue("q-2", (2,))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            t.assertEqual(main(["queues", self.spec(), "--json"]), 0)
        shown = {entry["queue"]: entry for entry in json.loads(out.getvalue())}
        t.assertEqual(shown["api"]["depth"], 1)
        t.assertEqual(shown["api"]["limits"], {"concurrency": 4, "per_worker": 2, "rate": [100, 60.0], "priority": True})
        t.assertEqual(shown[""]["depth"], 1)
        t.assertIsInstance(shown["api"]["oldest_wait_s"], float)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["queues", self.spec()])
        t.assertIn("concurrency 4, per worker 2, rate 100/60s", out.getvalue())


class SqliteQueueTests(QueueCases, support.TempDirTest):
    def make_store(self) -> Any:
        return SqliteStore(os.path.join(self.tmp, "tasks.db"), create=True)

    def spec(self) -> str:
        return "sqlite:" + os.path.join(self.tmp, "tasks.db")


class JsonQueueTests(QueueCases, support.TempDirTest):
    def make_store(self) -> Any:
        return JsonFileStore(os.path.join(self.tmp, "store"), create=True)

    def spec(self) -> str:
        return os.path.join(self.tmp, "store")


class PostgresQueueTests(QueueCases, pg_support.SchemaPerTest, support.TempDirTest):
    def make_store(self) -> Any:
        return PostgresStore(self.schema.factory())

    def spec(self) -> str:
        return self.schema.spec


if __name__ == "__main__":
    unittest.main()
