"""Waiting in the process: ``fn.run(task, ..., wait=True, timeout_s=...)`` and ``fn.arun`` run the
task again when what it waits for comes (an approval through the store or a control root, a sleep's
end, a message, a child), hold no lease between runs, and return the waiting outcome at ``timeout_s``.

Every case runs against every store (``JsonFileStore``, ``SqliteStore``, and ``PostgresStore``
when ``LONGRUN_TEST_POSTGRES_DSN`` is set). Cases where another thread or process writes use the
real clock (their timeouts are generous liveness bounds); cases where time must pass use
``FakeClock``, whose ``sleep`` is the wait.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
import time
import unittest
from unittest import mock
from typing import Any, Callable

from helpers import pg_support, support
import longrun
from longrun import Approval, InvalidInputError, JsonFileStore, Limits, PostgresStore, SqliteStore, Status, Store
from longrun.authority import FileControlSource
from longrun.clock import SystemClock
from longrun.functions import _waiting
from longrun.testing import FakeClock, OutboxAdapter

LIVENESS_S = 60.0
"""How long a case waits for something another thread does before it fails (never reached when it works)."""


class WaitCases(support.TempDirTest):
    """The same cases on every store; a subclass makes the store and names its spec for the CLI."""

    def make_store(self) -> tuple[Store, str]:
        raise NotImplementedError

    def setUp(self) -> None:
        super().setUp()
        self.store, self.spec = self.make_store()
        self.clock = FakeClock(time.time())
        # No run "at least every RECHECK_S" here: what ends each wait must be what it watches.
        patch = mock.patch.object(_waiting, "RECHECK_S", 3600.0)
        patch.start()
        self.addCleanup(patch.stop)
        self.outbox = OutboxAdapter(self.path("outbox.jsonl"))

    def durable(self, **options: Any) -> Any:
        settings: dict[str, Any] = dict(store=self.store, clock=self.clock, adapters={"ship": self.outbox}, allowed_actions=("ship",))
        settings.update(options)
        return longrun.durable(**settings)

    def applied(self) -> int:
        """How many times the outbox applied an effect (every task's, every step's)."""
        return sum(self.outbox.counts().values())

    def status_of(self, task_id: str) -> Status | None:
        try:
            state = self.store.load(task_id).state
        except longrun.UnknownTaskError:
            return None
        return None if state is None else state.status

    def when(self, task_id: str, status: Status, then: Callable[[], Any]) -> threading.Thread:
        """In another thread: once ``task_id`` has committed ``status`` and released its lease, call ``then``."""
        errors: list[BaseException] = []

        def watch() -> None:
            try:
                deadline = time.monotonic() + LIVENESS_S
                while time.monotonic() < deadline:
                    lease = self.store.read_lease(task_id) if self.status_of(task_id) is status else None
                    if lease is not None and lease.released:
                        then()
                        return
                    time.sleep(0.02)
                raise AssertionError(f"task {task_id!r} never reached {status.value}")
            except BaseException as exc:  # handed to the test's thread below
                errors.append(exc)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()

        def joined() -> None:
            thread.join(LIVENESS_S)
            if errors:
                raise errors[0]

        self.addCleanup(joined)
        return thread

    def approval(self, task_id: str, step_id: str, *, answer: Any = None) -> Approval:
        """What ``longrun approve`` (or ``answer``) writes, at the real time."""
        state = self.store.load(task_id).state
        assert state is not None
        now = time.time()
        extra: dict[str, Any] = {} if answer is None else {"answer": answer}
        return Approval.for_request(
            state.approval_requests[step_id], approval_id=secrets.token_hex(8), approver="tester", granted_at=now, expires_at=now + 3600, **extra
        )

    def shipper(self, **options: Any) -> Any:
        @self.durable(**options)
        def ship(run: longrun.Run, amount: int) -> Any:
            return run.effect("pay", "ship", {"amount": amount}, approval=True)

        return ship

    # -- what ends a wait ------------------------------------------------------------------------

    def test_an_approval_written_to_the_store_by_another_thread_ends_the_wait(self) -> None:
        ship = self.shipper(clock=SystemClock())
        self.when("t", Status.AWAITING_APPROVAL, lambda: self.store.write_approval(self.approval("t", "pay")))
        outcome = ship.run("t", 5, wait=True, timeout_s=LIVENESS_S)
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(self.applied(), 1)

    def test_an_approval_written_to_the_store_by_another_process_ends_the_wait(self) -> None:
        ship = self.shipper(clock=SystemClock())

        def approve_from_another_process() -> None:
            done = support.run_python(["-m", "longrun", "approve", self.spec, "t", "--yes"])
            self.assertEqual(done.returncode, 0, done.stderr)

        self.when("t", Status.AWAITING_APPROVAL, approve_from_another_process)
        outcome = ship.run("t", 5, wait=True, timeout_s=LIVENESS_S)
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(self.applied(), 1)

    def test_an_answer_from_another_process_ends_the_wait(self) -> None:
        @self.durable(clock=SystemClock())
        def asker(run: longrun.Run) -> Any:
            return run.ask("colour", "which colour?", choices=["red", "blue"])

        def answer_from_another_process() -> None:
            done = support.run_python(["-m", "longrun", "answer", self.spec, "q", "colour", "blue"])
            self.assertEqual(done.returncode, 0, done.stderr)

        self.when("q", Status.AWAITING_INPUT, answer_from_another_process)
        outcome = asker.run("q", wait=True, timeout_s=LIVENESS_S)
        self.assertEqual((outcome.status, outcome.result), (Status.DONE, "blue"))

    def test_an_approval_written_to_a_control_root_by_another_process_ends_the_wait(self) -> None:
        control = self.path("control")
        os.makedirs(control)
        source = FileControlSource(control, approver_uid=os.geteuid())
        ship = self.shipper(clock=SystemClock(), approvals=source)

        def approve_from_another_process() -> None:
            done = support.run_python(["-m", "longrun", "approve", self.spec, "t", "--yes", "--control-root", control])
            self.assertEqual(done.returncode, 0, done.stderr)

        self.when("t", Status.AWAITING_APPROVAL, approve_from_another_process)
        outcome = ship.run("t", 5, wait=True, timeout_s=LIVENESS_S)
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(len(source.read_approvals("t")), 1, "the approval came from the control root")
        self.assertEqual(self.applied(), 1)

    def test_a_sleep_longer_than_max_block_ends_in_the_same_call(self) -> None:
        @self.durable(limits=Limits(max_block_s=1.0))
        def napper(run: longrun.Run) -> str:
            run.sleep("nap", 120.0)
            return "rested"

        self.assertEqual(napper.run("once").status, Status.SLEEPING, "without wait the call returns at the sleep")
        start = self.clock.now()
        outcome = napper.run("n", wait=True)
        self.assertEqual((outcome.status, outcome.result), (Status.DONE, "rested"))
        self.assertGreaterEqual(self.clock.now(), start + 120.0, "the wait ended at the recorded wake time, not before")

    def test_a_message_sent_from_outside_ends_the_wait(self) -> None:
        @self.durable(clock=SystemClock())
        def consumer(run: longrun.Run) -> Any:
            return run.recv("orders")

        self.when("c", Status.AWAITING_INPUT, lambda: consumer.send("c", "orders", {"n": 1}))
        outcome = consumer.run("c", wait=True, timeout_s=LIVENESS_S)
        self.assertEqual((outcome.status, outcome.result), (Status.DONE, {"n": 1}))

    def test_a_message_sent_through_a_control_root_by_another_process_ends_the_wait(self) -> None:
        control = self.path("control")
        os.makedirs(control)
        source = FileControlSource(control, approver_uid=os.geteuid())

        @self.durable(clock=SystemClock(), approvals=source)
        def consumer(run: longrun.Run) -> Any:
            return run.recv("orders")

        def send_from_another_process() -> None:
            done = support.run_python(["-m", "longrun", "send", self.spec, "c", "orders", '{"n": 2}', "--control-root", control])
            self.assertEqual(done.returncode, 0, done.stderr)

        self.when("c", Status.AWAITING_INPUT, send_from_another_process)
        outcome = consumer.run("c", wait=True, timeout_s=LIVENESS_S)
        self.assertEqual((outcome.status, outcome.result), (Status.DONE, {"n": 2}))
        self.assertEqual(len(source.read_approvals("c")), 1, "the message came from the control root")

    def test_a_child_that_finishes_ends_the_parents_wait(self) -> None:
        ship = self.shipper(clock=SystemClock())

        @self.durable(clock=SystemClock())
        def parent(run: longrun.Run) -> Any:
            return {"child": run.child("kid", ship, 7)}

        self.when("kid", Status.AWAITING_APPROVAL, lambda: self.store.write_approval(self.approval("kid", "pay")))
        outcome = parent.run("p", wait=True, timeout_s=LIVENESS_S)
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        kid = ship.run("kid", 7)
        self.assertEqual(kid.status, Status.DONE)
        self.assertEqual(outcome.result, {"child": kid.result}, "the parent returned the child's result")
        self.assertEqual(self.applied(), 1)

    def test_a_child_asleep_past_max_block_wakes_the_parent_at_its_wake_time(self) -> None:
        @self.durable(limits=Limits(max_block_s=1.0))
        def napper(run: longrun.Run) -> str:
            run.sleep("nap", 60.0)
            return "rested"

        @self.durable(limits=Limits(max_block_s=1.0))
        def parent(run: longrun.Run) -> Any:
            return run.child("kid", napper)

        start = self.clock.now()
        outcome = parent.run("p", wait=True)
        self.assertEqual((outcome.status, outcome.result), (Status.DONE, "rested"))
        self.assertGreaterEqual(self.clock.now(), start + 60.0)

    # -- timeout, lease, bad input --------------------------------------------------------------

    def test_timeout_returns_the_waiting_outcome(self) -> None:
        ship = self.shipper()
        start = self.clock.now()
        outcome = ship.run("t", 5, wait=True, timeout_s=30.0)
        self.assertEqual(outcome.status, Status.AWAITING_APPROVAL)
        self.assertGreaterEqual(self.clock.now(), start + 30.0, "it waited the whole timeout")
        self.assertLess(self.clock.now(), start + 30.0 + 5.0, "and not much longer")
        self.assertEqual(self.applied(), 0)
        self.assertEqual(ship.run("t", 5, wait=True, timeout_s=0).status, Status.AWAITING_APPROVAL, "0: one run, no wait")

    def test_the_lease_is_released_while_waiting_and_another_runner_may_run_the_task(self) -> None:
        ship = self.shipper(clock=SystemClock())
        seen: dict[str, Any] = {}

        def second_runner() -> None:
            lease = self.store.read_lease("t")
            seen["released"] = lease is not None and lease.released
            seen["first"] = ship.run("t", 5).status  # takes the lease the waiter gave up
            self.store.write_approval(self.approval("t", "pay"))
            seen["second"] = ship.run("t", 5)

        self.when("t", Status.AWAITING_APPROVAL, second_runner)
        outcome = ship.run("t", 5, wait=True, timeout_s=LIVENESS_S)
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertTrue(seen["released"], "the waiter holds no lease while it waits")
        self.assertEqual(seen["first"], Status.AWAITING_APPROVAL, "a second runner took the lease meanwhile")
        self.assertIn(seen["second"].status, (Status.DONE, Status.ALREADY_RUNNING), "whoever held the lease ran it")
        self.assertEqual(outcome.result, ship.run("t", 5).result, "the waiter returned what the other recorded")
        self.assertEqual(self.applied(), 1, "the effect was made once between the two")

    def test_wait_and_timeout_are_checked_before_anything_runs(self) -> None:
        ship = self.shipper()
        for bad in (dict(timeout_s=5.0), dict(wait=True, timeout_s=-1.0), dict(wait=True, timeout_s=float("nan")), dict(wait="yes")):
            with self.subTest(bad=bad), self.assertRaises(InvalidInputError):
                ship.run("t", 5, **bad)
        self.assertIsNone(self.status_of("t"), "nothing was recorded")

    def test_without_wait_the_call_returns_at_the_wait(self) -> None:
        ship = self.shipper()
        before = self.clock.now()
        self.assertEqual(ship.run("t", 5).status, Status.AWAITING_APPROVAL)
        self.assertEqual(self.clock.now(), before, "no time passed: nothing waited")

    # -- async -----------------------------------------------------------------------------------

    def test_an_async_wait_does_not_block_the_event_loop(self) -> None:
        @self.durable(clock=SystemClock())
        async def aship(run: longrun.AsyncRun, amount: int) -> Any:
            return await run.effect("pay", "ship", {"amount": amount}, approval=True)

        async def main() -> tuple[longrun.RunOutcome, int, int]:
            ticks = 0
            approved_at = waiting_at = -1
            stop = asyncio.Event()

            async def ticker() -> None:
                nonlocal ticks
                while not stop.is_set():
                    ticks += 1
                    await asyncio.sleep(0.01)

            async def approver() -> None:
                nonlocal approved_at, waiting_at
                while await asyncio.to_thread(self.status_of, "a") is not Status.AWAITING_APPROVAL:
                    await asyncio.sleep(0.01)
                waiting_at = ticks
                while ticks < waiting_at + 20:  # a wait that blocked the loop would stop the ticks here: no approval, no end
                    await asyncio.sleep(0.01)
                approved_at = ticks
                await asyncio.to_thread(lambda: self.store.write_approval(self.approval("a", "pay")))

            tick_task = asyncio.create_task(ticker())
            approve_task = asyncio.create_task(approver())
            outcome = await asyncio.wait_for(aship.arun("a", 3, wait=True, timeout_s=LIVENESS_S), LIVENESS_S)
            stop.set()
            await tick_task
            await approve_task
            return outcome, waiting_at, approved_at

        outcome, waiting_at, approved_at = asyncio.run(main())
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertGreaterEqual(waiting_at, 0, "the task was seen waiting")
        self.assertGreaterEqual(approved_at - waiting_at, 20, "the loop ticked while the task waited")
        self.assertEqual(self.applied(), 1)

    def test_an_async_function_waits_from_run_too(self) -> None:
        @self.durable(limits=Limits(max_block_s=1.0))
        async def anap(run: longrun.AsyncRun) -> str:
            await run.sleep("nap", 30.0)
            return "rested"

        outcome = anap.run("n", wait=True)
        self.assertEqual((outcome.status, outcome.result), (Status.DONE, "rested"))


class JsonFileStoreTests(WaitCases):
    def make_store(self) -> tuple[Store, str]:
        root = self.path("store")
        return JsonFileStore(root, create=True), root


class SqliteStoreTests(WaitCases):
    def make_store(self) -> tuple[Store, str]:
        path = self.path("tasks.sqlite")
        store = SqliteStore(path, create=True)
        self.addCleanup(store.close)
        return store, f"sqlite:{path}"


class PostgresStoreTests(WaitCases):
    def make_store(self) -> tuple[Store, str]:
        pg_support.check("psycopg")  # the URL carries the schema as a libpq option, which pg8000 cannot take
        schema = pg_support.Schema("psycopg", prefix="lr_wait")
        self.addCleanup(schema.drop)
        store = PostgresStore(schema.factory())
        self.addCleanup(store.close)
        url = schema.spec
        return store, url


    def test_a_message_wakes_the_waiter_by_notify(self) -> None:
        @self.durable(clock=SystemClock())
        def consumer(run: longrun.Run) -> Any:
            return run.recv("orders")

        self.assertEqual(consumer.run("c").status, Status.AWAITING_INPUT)
        store = self.store
        with _waiting.Waiting("c", store, store, store, SystemClock(), None) as waiting:
            woken = waiting._woken  # the event the listener sets on each NOTIFY
            self.assertTrue(woken.wait(LIVENESS_S), "the listener looks once as soon as it listens")
            woken.clear()
            consumer.send("c", "orders", {"n": 1})
            self.assertTrue(woken.wait(LIVENESS_S), "the message's NOTIFY reached the waiter")


del WaitCases  # only its subclasses run

if __name__ == "__main__":
    unittest.main()
