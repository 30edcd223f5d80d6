"""The fleet's due-time index (``longrun.stores.queue``) on each store: claims, wake-ups, triggers, slots.

The index decides who tries a task, never who holds it; these tests check that it finds every task
that should run (a lapsed claim, a wake-up during a run, a run outside the fleet, an approval, a
child that ended) and that claims never hand one row to two workers at once.
"""

from __future__ import annotations

import os
import threading
import time
import unittest
from typing import Any

from helpers import pg_support, support
from longrun import JsonFileStore, Queue, SqliteStore, durable
from longrun.approval import Approval
from longrun.errors import InvalidInputError
from longrun.cancellation import Cancellation
from longrun.stores import PostgresStore
from longrun.stores.queue import TaskQueue, open_queue
from longrun.testing import OutboxAdapter


class QueueCases:
    """The same cases for every store; a subclass says how to make one."""

    triggers = True

    def make_store(self) -> Any:
        raise NotImplementedError

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.store = self.make_store()
        self.outbox = os.path.join(self.work, "outbox.jsonl")

        @durable(store=self.store, adapters={"send": OutboxAdapter(self.outbox)}, allowed_actions=("send",), lease_ttl_s=5.0)
        def job(run: Any, n: int) -> int:
            for i in range(n):
                run.effect(f"e{i}", "send", {"i": i})
            return n

        @durable(store=self.store, adapters={"send": OutboxAdapter(self.outbox)}, allowed_actions=("send",), lease_ttl_s=5.0)
        def gated(run: Any) -> str:
            run.effect("publish", "send", {"x": 1}, approval=True)
            return "ok"

        self.job, self.gated = job, gated
        self.queue = open_queue(self.store)
        self.addCleanup(self.queue.close)
        self.addCleanup(lambda: getattr(self.store, "close", lambda: None)())

    @property
    def work(self) -> str:
        return self.tmp  # type: ignore[attr-defined,no-any-return]

    def entry(self, task_id: str) -> Any:
        found = self.queue.entries([task_id])
        self.assertEqual(len(found), 1, f"task {task_id} has no row")  # type: ignore[attr-defined]
        return found[0]

    def claim_all(self, worker: str = "w", ttl_s: float = 30.0, queue: TaskQueue | None = None) -> list[Any]:
        return (queue or self.queue).claim(worker, [self.job.name, self.gated.name], 100, ttl_s)

    def test_start_records_the_task_due_now_and_a_second_start_changes_nothing(self) -> None:
        self.assertTrue(self.job.start("t1", 2))
        self.assertFalse(self.job.start("t1", 2))
        with self.assertRaises(Exception) as caught:  # type: ignore[attr-defined]
            self.job.start("t1", 3)
        self.assertIn("other arguments", str(caught.exception))  # type: ignore[attr-defined]
        entry = self.entry("t1")
        self.assertEqual((entry.function, entry.status, entry.claimed_by), (self.job.name, "new", None))  # type: ignore[attr-defined]
        self.assertLessEqual(entry.due_in_s, 0.0)  # type: ignore[attr-defined]
        self.assertEqual(self.store.load("t1").state.plan_digest, self.job.plan_digest("t1", 2))  # type: ignore[attr-defined]
        self.assertEqual(OutboxAdapter(self.outbox).counts(), {})  # type: ignore[attr-defined]  # nothing ran

    def test_start_many_records_and_queues_every_task_and_checks_every_call_first(self) -> None:
        self.assertTrue(self.job.start("t0", 1))
        self.assertEqual(self.job.start_many([("t0", (1,)), ("t1", [2]), ("t2", (3,), {})]), [False, True, True])
        for task_id, n in (("t1", 2), ("t2", 3)):
            self.assertEqual(self.store.load(task_id).state.plan_digest, self.job.plan_digest(task_id, n))  # type: ignore[attr-defined]
            self.assertLessEqual(self.entry(task_id).due_in_s, 0.0)  # type: ignore[attr-defined]
        for calls in ([("t3", 1)], [("t3", (1,)), ("t3", (2,))], [("t3",)], [("../x", (1,))], [("t3", (1,), [])], "t3", [("t3", ("a", "b"))]):
            with self.assertRaises(InvalidInputError, msg=repr(calls)):  # type: ignore[attr-defined]
                self.job.start_many(calls)  # type: ignore[arg-type]
        self.assertNotIn("t3", self.store.list_tasks())  # type: ignore[attr-defined]
        with self.assertRaises(InvalidInputError) as caught:  # type: ignore[attr-defined]
            self.job.start_many([("t4", (4,)), ("t1", (9,)), ("t5", (5,))])
        self.assertIn("other arguments", str(caught.exception))  # type: ignore[attr-defined]
        self.assertEqual(self.store.load("t1").state.plan_digest, self.job.plan_digest("t1", 2))  # type: ignore[attr-defined]
        for task_id in ("t4", "t5"):  # recorded and queued all the same
            self.assertLessEqual(self.entry(task_id).due_in_s, 0.0)  # type: ignore[attr-defined]
        self.assertEqual(self.job.start_many([]), [])  # type: ignore[attr-defined]
        self.assertEqual(OutboxAdapter(self.outbox).counts(), {})  # type: ignore[attr-defined]  # nothing ran
        self.assertEqual(self.job.run("t1", 2).result, 2)  # type: ignore[attr-defined]  # and each runs as started

    def test_due_count_counts_due_unclaimed_rows_and_stops_past_at_most(self) -> None:
        self.assertEqual(self.job.start_many([(f"t{i}", (i,)) for i in range(5)]), [True] * 5)
        self.assertEqual(self.queue.due_count(), 5)  # type: ignore[attr-defined]
        self.assertEqual(self.queue.due_count(at_most=2), 3, "more than 2")  # type: ignore[attr-defined]
        self.assertEqual(self.queue.due_count(at_most=9), 5)  # type: ignore[attr-defined]
        self.queue.claim("w", [self.job.name], 2, 30.0)  # type: ignore[attr-defined]
        self.assertEqual(self.queue.due_count(), 3)  # type: ignore[attr-defined]

    def test_start_records_the_state_a_first_run_records(self) -> None:
        from longrun.functions._plan import Recording

        self.assertTrue(self.job.start("fast", 2))
        engine, plan = self.job._plan("slow", (2,), {})
        self.assertEqual(Recording(plan).record(engine).status.value, "queued")  # type: ignore[attr-defined]

        def shape(task_id: str) -> Any:
            state = self.store.load(task_id).state
            body = state.to_json()
            for name in ("task_id", "plan_digest", "created_at", "updated_at", "budget", "lease"):
                body.pop(name)
            body["next_action"] = body["next_action"].replace(task_id, "T")
            for record in body["effects"]:
                record.pop("updated_at")
                record["key"] = record["key"].replace(task_id, "T")
            return body, state.budget.created_at == state.created_at == state.budget.last_progress_at

        self.assertEqual(shape("fast"), shape("slow"))  # type: ignore[attr-defined]

    def test_a_claimed_row_is_not_claimed_again_until_its_claim_lapses(self) -> None:
        self.job.start("t1", 1)
        first = self.claim_all(ttl_s=0.3)
        self.assertEqual([claim.task_id for claim in first], ["t1"])  # type: ignore[attr-defined]
        self.assertEqual(self.claim_all("other"), [])  # type: ignore[attr-defined]
        time.sleep(0.4)  # the claiming worker died: its claim lapses and the row is due again
        again = self.claim_all("other")
        self.assertEqual([claim.task_id for claim in again], ["t1"])  # type: ignore[attr-defined]
        self.assertFalse(self.queue.finish(first[0], "done"))  # type: ignore[attr-defined]  # the lapsed claim records nothing
        self.assertTrue(self.queue.finish(again[0], "done"))  # type: ignore[attr-defined]
        self.assertIsNone(self.entry("t1").due_in_s)  # type: ignore[attr-defined]

    def test_runs_that_raise_are_counted_across_claims_until_one_does_not(self) -> None:
        self.job.start("t1", 1)
        for expected in (0, 1, 2):
            claim = self.claim_all()[0]
            self.assertEqual(claim.failures, expected)  # type: ignore[attr-defined]
            self.queue.finish(claim, "error", wake_in_s=0.0, error="RuntimeError: boom")
        self.queue.finish(self.claim_all()[0], "retry-scheduled", wake_in_s=0.0)
        self.assertEqual(self.claim_all()[0].failures, 0)  # type: ignore[attr-defined]

    def test_higher_priority_is_claimed_first(self) -> None:
        self.job.enqueue("low", [1], priority=0)
        self.job.enqueue("high", [1], priority=5)
        self.job.enqueue("middle", [1], priority=2)
        order = [self.queue.claim("w", [self.job.name], 1, 30.0)[0].task_id for _ in range(3)]
        self.assertEqual(order, ["high", "middle", "low"])  # type: ignore[attr-defined]

    def test_a_wake_up_during_a_run_makes_the_row_due_when_the_run_parks_it(self) -> None:
        self.gated.start("g1")
        claim = self.claim_all()[0]
        outcome = self.gated.run("g1")
        self.assertEqual(outcome.status.value, "awaiting-approval")  # type: ignore[attr-defined]
        # The approval lands after the run read the approvals but before it records its outcome.
        self.store.write_approval(self.approval("g1"))
        if not self.triggers:
            self.queue.wake("g1")
        self.queue.finish(claim, "awaiting-approval")
        self.assertLessEqual(self.entry("g1").due_in_s, 0.0)  # type: ignore[attr-defined]

    def test_a_child_that_ended_wakes_its_parent_only_if_it_waits_on_a_child(self) -> None:
        self.job.enqueue("parent", [1])
        self.queue.enqueue("kid", self.job.name, parent="parent")
        parent = self.queue.claim("w", [self.job.name], 1, 30.0)[0]
        self.assertEqual(parent.task_id, "parent")  # type: ignore[attr-defined]
        self.queue.finish(parent, "waiting-on-child")
        kid = self.queue.claim("w", [self.job.name], 1, 30.0)[0]
        self.assertEqual((kid.task_id, kid.parent), ("kid", "parent"))  # type: ignore[attr-defined]
        self.queue.finish(kid, "done", wake_parent=True)
        self.assertLessEqual(self.entry("parent").due_in_s, 0.0)  # type: ignore[attr-defined]

    def test_concurrent_claims_never_hand_one_row_to_two_workers(self) -> None:
        for i in range(40):
            self.queue.enqueue(f"t{i}", self.job.name)
        claimed: list[str] = []
        lock = threading.Lock()

        def worker(name: str) -> None:
            queue = open_queue(self.store)
            try:
                while True:
                    got = queue.claim(name, [self.job.name], 3, 30.0)
                    if not got:
                        return
                    with lock:
                        claimed.extend(claim.task_id for claim in got)
            finally:
                queue.close()

        threads = [threading.Thread(target=worker, args=(f"w{n}",)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual(sorted(claimed), sorted(f"t{i}" for i in range(40)))  # type: ignore[attr-defined]

    def test_slots_admit_at_most_k_holders_and_a_lapsed_one_is_free_again(self) -> None:
        holds = [self.queue.acquire_slot("api", 2, "w", 0.3) for _ in range(3)]
        self.assertIsNotNone(holds[0])  # type: ignore[attr-defined]
        self.assertIsNotNone(holds[1])  # type: ignore[attr-defined]
        self.assertIsNone(holds[2])  # type: ignore[attr-defined]
        self.assertEqual(self.queue.slots_held("api"), 2)  # type: ignore[attr-defined]
        assert holds[0] is not None
        self.queue.release_slot(holds[0])
        self.assertIsNotNone(self.queue.acquire_slot("api", 2, "w", 30.0))  # type: ignore[attr-defined]
        time.sleep(0.4)  # the holder of the other slot stopped renewing it
        self.assertIsNotNone(self.queue.acquire_slot("api", 2, "w", 30.0))  # type: ignore[attr-defined]
        self.assertIsNone(self.queue.acquire_slot("api", 2, "w", 30.0))  # type: ignore[attr-defined]

    def test_heartbeats_list_workers_with_the_rows_they_hold(self) -> None:
        self.queue.enqueue("t1", self.job.name)
        self.queue.heartbeat("w1", host="h", pid=1, state="running", concurrency=2, running=1, functions=[self.job.name], heartbeat_s=10.0)
        self.queue.claim("w1", [self.job.name], 1, 30.0)
        [record] = self.queue.workers()
        self.assertEqual((record.name, record.claimed, record.alive, record.functions), ("w1", 1, True, (self.job.name,)))  # type: ignore[attr-defined]
        self.queue.heartbeat("w1", host="h", pid=1, state="stopped", concurrency=2, running=0, functions=[self.job.name], heartbeat_s=10.0)
        self.assertFalse(self.queue.workers()[0].alive)  # type: ignore[attr-defined]

    def approval(self, task_id: str) -> Approval:
        state = self.store.load(task_id).state
        request = state.approval_requests["publish"]
        now = time.time()
        return Approval(
            approval_id=f"a-{task_id}", task_id=task_id, plan_digest=request.plan_digest, step_id="publish",
            payload_digest=request.payload_digest, action="send", approver="op", granted_at=now, expires_at=now + 600,
        )  # fmt: skip


class TriggerCases(QueueCases):
    """What the triggers on the store's own tables do (the SQL stores; the JSON-file store polls)."""

    def test_an_approval_wakes_a_parked_task(self) -> None:
        self.gated.start("g1")
        claim = self.claim_all()[0]
        self.gated.run("g1")
        self.queue.finish(claim, "awaiting-approval")
        self.assertIsNone(self.entry("g1").due_in_s)  # type: ignore[attr-defined]
        self.store.write_approval(self.approval("g1"))
        self.assertLessEqual(self.entry("g1").due_in_s, 0.0)  # type: ignore[attr-defined]

    def test_a_cancellation_wakes_a_parked_task(self) -> None:
        self.gated.start("g1")
        claim = self.claim_all()[0]
        self.gated.run("g1")
        self.queue.finish(claim, "awaiting-approval")
        self.store.write_cancellation(Cancellation(task_id="g1", requested_by="op", reason="no", requested_at=time.time()))
        self.assertLessEqual(self.entry("g1").due_in_s, 0.0)  # type: ignore[attr-defined]

    def test_a_message_wakes_a_parked_task(self) -> None:
        self.gated.start("g1")
        claim = self.claim_all()[0]
        self.gated.run("g1")
        self.queue.finish(claim, "awaiting-input")
        self.assertIsNone(self.entry("g1").due_in_s)  # type: ignore[attr-defined]
        self.gated.send("g1", "orders", {"n": 1})
        self.assertLessEqual(self.entry("g1").due_in_s, 0.0)  # type: ignore[attr-defined]

    def test_fleet_tables_of_version_1_get_the_message_trigger(self) -> None:
        self.queue.ensure()
        self.queue.close()
        self.drop_message_trigger()
        queue = open_queue(self.store)
        self.addCleanup(queue.close)
        queue.ensure()
        self.gated.start("g1")
        claim = queue.claim("w", [self.gated.name], 1, 30.0)[0]
        queue.finish(claim, "awaiting-input")
        self.gated.send("g1", "orders", 1)
        self.assertLessEqual(queue.entries(["g1"])[0].due_in_s, 0.0)  # type: ignore[attr-defined]

    def drop_message_trigger(self) -> None:
        """Make the fleet tables look as version 1 left them: no trigger on the messages, version 1 recorded."""
        raise NotImplementedError

    def test_a_run_outside_the_fleet_gets_a_row_due_when_its_lease_ends(self) -> None:
        self.queue.ensure()  # a worker made the tables and their triggers before this run
        self.assertEqual(self.job.run("outside", 1).status.value, "done")  # type: ignore[attr-defined]
        entry = self.entry("outside")  # made by the trigger on its first record, due once its lease was released
        self.assertEqual(entry.function, self.job.name)  # type: ignore[attr-defined]
        self.assertLessEqual(entry.due_in_s, 0.0)  # type: ignore[attr-defined]
        claim = self.claim_all()[0]
        self.queue.finish(claim, "done")
        lease = self.store.acquire_lease("outside", "someone", 5.0, time.time())  # a run outside the fleet takes it
        self.assertGreater(self.entry("outside").due_in_s, 3.0)  # type: ignore[attr-defined]  # due when that lease expires
        self.store.release_lease(lease, time.time())
        self.assertLessEqual(self.entry("outside").due_in_s, 0.0)  # type: ignore[attr-defined]

    def test_a_worker_that_starts_on_an_older_store_adopts_every_durable_task(self) -> None:
        self.queue.ensure()
        self.queue.close()
        self.drop_fleet_tables()
        self.job.run("done-before", 1)
        self.gated.run("waiting-before")
        queue = open_queue(self.store)
        self.addCleanup(queue.close)
        entries = {entry.task_id: entry for entry in queue.entries()}
        self.assertEqual(sorted(entries), ["done-before", "waiting-before"])  # type: ignore[attr-defined]
        self.assertIsNone(entries["done-before"].due_in_s)  # type: ignore[attr-defined]
        self.assertLessEqual(entries["waiting-before"].due_in_s, 0.0)  # type: ignore[attr-defined]

    def drop_fleet_tables(self) -> None:
        raise NotImplementedError


class SqliteQueueTests(TriggerCases, support.TempDirTest):
    def make_store(self) -> Any:
        return SqliteStore(os.path.join(self.tmp, "tasks.db"), create=True)

    def drop_fleet_tables(self) -> None:
        import sqlite3

        connection = sqlite3.connect(self.store.path)
        names = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'longrun_fleet%'")]
        for name in names:
            connection.execute(f"DROP TRIGGER {name}")
        for table in ("longrun_queue", "longrun_workers", "longrun_slots", "longrun_fleet_meta", "longrun_fleet_schema"):
            connection.execute(f"DROP TABLE {table}")
        connection.commit()
        connection.close()


    def drop_message_trigger(self) -> None:
        import sqlite3

        connection = sqlite3.connect(self.store.path)
        connection.execute("DROP TRIGGER longrun_fleet_messages_insert")
        connection.execute("DELETE FROM longrun_fleet_schema WHERE version > 1")
        connection.commit()
        connection.close()


class JsonQueueTests(QueueCases, support.TempDirTest):
    triggers = False

    def make_store(self) -> Any:
        return JsonFileStore(os.path.join(self.tmp, "store"), create=True)

    def test_a_rescan_adopts_tasks_run_outside_and_wakes_rows_whose_task_changed(self) -> None:
        self.job.run("outside", 1)  # no trigger sees a file: not in the index yet
        self.assertEqual(self.queue.entries(), [])
        self.assertEqual(self.queue.rescan(0.01), 1)
        self.assertIsNone(self.entry("outside").due_in_s)  # done: adopted, parked
        self.gated.start("g1")
        claim = self.claim_all()[0]
        self.gated.run("g1")
        self.queue.finish(claim, "awaiting-approval", fingerprint=self.queue.fingerprint("g1"))
        time.sleep(0.02)
        self.assertEqual(self.queue.rescan(0.01), 0)  # nothing changed: nothing woken
        self.store.write_approval(self.approval("g1"))
        time.sleep(0.02)
        self.assertEqual(self.queue.rescan(10.0), 1)
        self.assertLessEqual(self.entry("g1").due_in_s, 0.0)
        self.assertIsNone(self.queue.rescan(10.0))  # another worker's turn comes after 10 s

    def test_a_rescan_wakes_a_task_sent_a_message(self) -> None:
        self.gated.start("g1")
        claim = self.claim_all()[0]
        self.gated.run("g1")
        self.queue.finish(claim, "awaiting-input", fingerprint=self.queue.fingerprint("g1"))
        time.sleep(0.02)
        self.assertEqual(self.queue.rescan(0.01), 0)
        self.gated.send("g1", "orders", 1)
        time.sleep(0.02)
        self.assertEqual(self.queue.rescan(0.01), 1)
        self.assertLessEqual(self.entry("g1").due_in_s, 0.0)


class PostgresQueueTests(TriggerCases, pg_support.SchemaPerTest, support.TempDirTest):
    def make_store(self) -> Any:
        return PostgresStore(self.schema.factory())

    def drop_fleet_tables(self) -> None:
        for table, trigger in (
            ("longrun_effects", "longrun_fleet_function"), ("longrun_leases", "longrun_fleet_lease"),
            ("longrun_approvals", "longrun_fleet_approval"), ("longrun_cancellations", "longrun_fleet_cancellation"),
            ("longrun_messages", "longrun_fleet_message"),
        ):  # fmt: skip
            self.schema.execute(f"DROP TRIGGER {trigger} ON {table}")
        for table in ("longrun_queue", "longrun_workers", "longrun_slots", "longrun_fleet_meta", "longrun_fleet_schema"):
            self.schema.execute(f"DROP TABLE {table}")

    def drop_message_trigger(self) -> None:
        self.schema.execute("DROP TRIGGER longrun_fleet_message ON longrun_messages")
        self.schema.execute("DELETE FROM longrun_fleet_schema WHERE version > 1")

    def test_a_damaged_function_row_does_not_fail_the_stores_commit(self) -> None:
        self.queue.ensure()
        # A function-step row whose JSON the trigger cannot read: the insert (the store's commit) succeeds.
        self.store.list_tasks()
        self.schema.execute("INSERT INTO longrun_tasks (task_id, created_at) VALUES ('odd', 0)")
        self.schema.execute(
            "INSERT INTO longrun_effects (task_id, step_id, position, revision, record, checksum) "
            "VALUES ('odd', 'longrun.function', 0, 1, 'not json', 'x')"
        )
        self.assertEqual(self.queue.entries(["odd"]), [])

    def test_a_claim_and_a_finish_are_one_statement_each_until_a_named_queue_exists(self) -> None:
        for task_id, priority in (("low", 0), ("high", 5), ("mid", 2)):
            self.job.start(task_id, 1)
            self.queue.enqueue(task_id, self.job.name, priority=priority)
        self.queue.ensure()
        tables = self.queue._tables
        sent: list[tuple[str, bool]] = []
        run = tables.run

        def counted(statement: str, params: Any = ()) -> Any:
            sent.append((statement.split()[0], bool(tables._connection.autocommit)))
            return run(statement, params)

        tables.run = counted  # type: ignore[method-assign]
        claims = self.queue.claim("w", [self.job.name], 2, 30.0)
        self.assertEqual([claim.task_id for claim in claims], ["high", "mid"], "highest priority first, at most the limit")
        self.assertEqual(sent, [("WITH", True)], "one statement in autocommit: no BEGIN, no COMMIT")
        self.assertEqual(self.entry("high").claimed_by, "w")
        self.assertIsNone(self.entry("low").claimed_by)
        sent.clear()
        self.assertTrue(self.queue.finish(claims[0], "done"))
        self.assertEqual(sent, [("UPDATE", True)])
        self.assertIsNone(self.entry("high").claimed_by)
        self.assertFalse(self.queue.finish(claims[0], "done"), "a claim already ended is not held")
        # A named queue defined: the statement claims nothing, and the transaction that judges the
        # queues' limits claims as before.
        self.queue.define_queue(Queue("slow", concurrency=1))
        sent.clear()
        self.assertEqual([claim.task_id for claim in self.queue.claim("w2", [self.job.name], 5, 30.0)], ["low"])
        self.assertEqual(sent[0], ("WITH", True))
        self.assertGreater(len(sent), 1)
        self.assertFalse(any(autocommit for _, autocommit in sent[1:]))
        self.assertEqual(self.entry("mid").claimed_by, "w", "a row claimed by another worker stays its")

    def test_claims_use_the_database_clock(self) -> None:
        self.job.start("t1", 1)
        # A claim's expiry and a row's due time are the server's: compare with the server's clock.
        server_now = float(self.schema.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())")[0][0])
        claim = self.claim_all(ttl_s=30.0)[0]
        due = float(self.schema.execute("SELECT wake_at FROM longrun_queue WHERE task_id = 't1'")[0][0])
        self.assertAlmostEqual(due, server_now + 30.0, delta=5.0)
        self.queue.finish(claim, "retry-scheduled", wake_in_s=100.0)
        self.assertAlmostEqual(self.entry("t1").due_in_s, 100.0, delta=5.0)


if __name__ == "__main__":
    unittest.main()
