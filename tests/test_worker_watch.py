"""Controls reach a live worker at once, on each store: an approval, an answer or a cancellation
written to a strict control root, signed or not, or to the store itself, wakes the worker that runs
the task, which then runs it, although the worker's own polls are minutes apart (``worker._watch``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import unittest
from typing import Any, Callable, Iterator

from helpers import pg_support, support
from longrun import Cancellation, JsonFileStore, Limits, SqliteStore, durable
from longrun.approval import Approval
from longrun.authority import FileControlSource, SignedApprovals, SignedCancellations, generate_key_file, load_key, sign_cancellation
from longrun.stores import PostgresStore
from longrun.stores.queue import open_queue
from longrun.worker import Worker, WorkerReport
from test_worker import Target

POLL_S = 600.0
"""The worker's own polls (and, on the JSON-file store, its rescans), set far beyond the test: a
task that proceeds at all was woken by the watch."""
DEADLINE_S = 30.0
"""A liveness guard, not a timing assertion."""


class WatchCases:
    def make_store(self) -> Any:
        raise NotImplementedError

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.store = self.make_store()
        self.addCleanup(lambda: getattr(self.store, "close", lambda: None)())  # type: ignore[attr-defined]
        self.root = os.path.join(self.tmp, "control")  # type: ignore[attr-defined]
        os.mkdir(self.root, 0o755)
        # Strict, as docs/security.md recommends; the approver is this account, deliberately.
        self.control = FileControlSource(self.root, strict=True, approver_uid=os.geteuid())

    @contextlib.contextmanager
    def worker(self, functions: list[Any]) -> Iterator[Worker]:
        worker = Worker(self.store, functions, poll_s=POLL_S, rescan_s=POLL_S, claim_ttl_s=30.0)
        reports: list[WorkerReport] = []
        thread = threading.Thread(target=lambda: reports.append(asyncio.run(worker.serve())))
        thread.start()
        try:
            yield worker
        finally:
            worker.stop()
            thread.join(DEADLINE_S)
        self.assertFalse(thread.is_alive())  # type: ignore[attr-defined]

    def wait(self, until: Callable[[], bool], what: str) -> float:
        started = time.monotonic()
        while not until():
            if time.monotonic() - started > DEADLINE_S:
                self.fail(f"{what}: not within {DEADLINE_S}s")  # type: ignore[attr-defined]
            time.sleep(0.02)
        return time.monotonic() - started

    def parked(self, *task_ids: str) -> None:
        """Wait until each task's row is parked and unclaimed: the worker then waits for its next
        poll, minutes away, unless something wakes it (a run ending would, so none may be under way)."""
        queue = open_queue(self.store)
        try:
            self.wait(
                lambda: all(entry.claimed_by is None and entry.due_in_s is None for entry in queue.entries(list(task_ids)))
                and len(queue.entries(list(task_ids))) == len(task_ids),
                "the rows parked",
            )  # fmt: skip
        finally:
            queue.close()
        time.sleep(0.3)  # the claim loop back to its wait

    def status(self, task_id: str) -> str:
        state = self.store.load(task_id).state
        return "none" if state is None else str(state.status.value)

    def gated(self, target: Target, **sources: Any) -> Any:
        @durable(
            store=self.store, adapters={"send": target}, allowed_actions=("send",), lease_ttl_s=5.0,
            limits=Limits(max_block_s=0.05), **sources,
        )  # fmt: skip
        def pay(run: Any, amount: int) -> str:
            run.effect("pay", "send", {"amount": amount}, approval=True)
            answer = run.ask("receipt", "send a receipt to whom?")
            run.effect("mail", "send", {"to": answer})
            return "paid"

        return pay

    def approval(self, task_id: str, step: str, *, answer: Any = None) -> Approval:
        request = self.store.load(task_id).state.approval_requests[step]
        now = time.time()
        return Approval.for_request(request, approval_id=f"ap-{step}", approver="op", granted_at=now, expires_at=now + 600, answer=answer)

    def proceeds(self, task_id: str, write: Callable[[], None], until: str) -> float:
        """Write a control record while the task waits; the seconds until it reached ``until``."""
        started = time.monotonic()
        write()
        self.wait(lambda: self.status(task_id) == until, f"task {task_id} reaching {until}")
        return time.monotonic() - started

    def test_a_strict_control_root_approval_and_answer_wake_the_live_worker_and_the_task_runs(self) -> None:
        target = Target()
        pay = self.gated(target, approvals=self.control, cancellations=self.control)
        pay.start("t", 10)
        with self.assertLogs("longrun", logging.DEBUG) as logs, self.worker([pay]):
            self.wait(lambda: self.status("t") == "awaiting-approval", "the first run")
            self.parked("t")
            took = self.proceeds("t", lambda: self.control.write_approval(self.approval("t", "pay")), "awaiting-input")
            self.parked("t")
            took_answer = self.proceeds("t", lambda: self.control.write_approval(self.approval("t", "receipt", answer="alice")), "done")
        self.assertEqual(target.applied, {"t/pay": 1, "t/mail": 1})
        self.assertLess(max(took, took_answer), POLL_S / 10)
        woken = [line for line in logs.output if "a control record of task t changed under " + self.root in line]
        self.assertGreaterEqual(len(woken), 2, "woken by the watch of the control root")

    def test_a_signed_cancellation_in_the_control_root_wakes_a_task_waiting_for_approval(self) -> None:
        key_file = os.path.join(self.tmp, "approver.key")  # type: ignore[attr-defined]
        generate_key_file(key_file)
        key = load_key(key_file)
        target = Target()
        pay = self.gated(target, approvals=SignedApprovals(self.control, key), cancellations=SignedCancellations(self.control, key))
        pay.start("c", 10)
        with self.worker([pay]):
            self.wait(lambda: self.status("c") == "awaiting-approval", "the first run")
            unsigned = self.approval("c", "pay")
            self.parked("c")
            self.control.write_approval(unsigned)  # refused by the signature check: the task waits on
            self.wait(lambda: self.store.load("c").state.revision > 2, "the unsigned approval judged")
            self.parked("c")
            took = self.proceeds(
                "c", lambda: self.control.write_cancellation(sign_cancellation(Cancellation("c", time.time(), "op", "not wanted"), key)),
                "cancelled",
            )  # fmt: skip
        self.assertEqual(target.applied, {})
        self.assertLess(took, POLL_S / 10)

    def test_an_approval_and_a_cancellation_written_to_the_store_wake_the_live_worker(self) -> None:
        target = Target()
        pay = self.gated(target)
        pay.start("s", 10)
        pay.start("x", 20)
        with self.worker([pay]):
            self.wait(lambda: self.status("s") == "awaiting-approval" and self.status("x") == "awaiting-approval", "the first runs")
            self.parked("s", "x")
            took = self.proceeds("s", lambda: self.store.write_approval(self.approval("s", "pay")), "awaiting-input")
            self.parked("s", "x")
            took_cancel = self.proceeds("x", lambda: self.store.write_cancellation(Cancellation("x", time.time(), "op", "no")), "cancelled")
        self.assertEqual(target.applied, {"s/pay": 1})
        self.assertLess(max(took, took_cancel), POLL_S / 10)


class SqliteWatchTests(WatchCases, support.TempDirTest):
    def make_store(self) -> Any:
        return SqliteStore(os.path.join(self.tmp, "tasks.db"), create=True)


class JsonWatchTests(WatchCases, support.TempDirTest):
    def make_store(self) -> Any:
        return JsonFileStore(os.path.join(self.tmp, "store"), create=True)


class PostgresWatchTests(WatchCases, pg_support.SchemaPerTest, support.TempDirTest):
    def make_store(self) -> Any:
        return PostgresStore(self.schema.factory())


if __name__ == "__main__":
    unittest.main()
