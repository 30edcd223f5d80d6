"""The worker in this process (threads), on each store: it runs what is due, wakes what is woken,
bounds an action's applies, and drains between two steps. The crash tests are in test_fleet_crash.py."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
import unittest
from typing import Any, Callable

from helpers import pg_support, support
from longrun import Cancellation, EffectRequest, JsonFileStore, Limits, Observation, Receipt, RetryPolicy, SqliteStore, TransientError, durable
from longrun.approval import Approval
from longrun.errors import InvalidInputError
from longrun.outcome import Status
from longrun.stores import PostgresStore
from longrun.stores.queue import open_queue
from longrun.worker import Worker, WorkerReport

DEADLINE_S = 60.0
"""A liveness guard, not a timing assertion: a test that waits this long has hung."""


class Target:
    """An in-memory target that counts applies and the most applies under way at once."""

    deduplicates = False

    def __init__(self, *, apply_s: float = 0.0, fail_first: bool = False, gate: Callable[[EffectRequest], None] | None = None):
        self.apply_s = apply_s
        self.fail_first = fail_first
        self.gate = gate
        self.applied: dict[str, int] = {}
        self.now = 0
        self.most = 0
        self._lock = threading.Lock()

    def apply(self, request: EffectRequest) -> Receipt:
        if self.fail_first and request.attempt == 1:
            raise TransientError("busy")
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            if self.gate is not None:
                self.gate(request)
            if self.apply_s:
                time.sleep(self.apply_s)
            with self._lock:
                self.applied[request.key] = self.applied.get(request.key, 0) + 1
        finally:
            with self._lock:
                self.now -= 1
        return Receipt(result={"ok": True}, evidence="applied")

    def observe(self, request: EffectRequest) -> Observation:
        with self._lock:
            if request.key in self.applied:
                return Observation.applied("found")
        return Observation.absent("not found")


class WorkerCases:
    """The same cases on every store; a subclass says how to make one."""

    def make_store(self) -> Any:
        raise NotImplementedError

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.store = self.make_store()
        self.addCleanup(lambda: getattr(self.store, "close", lambda: None)())

    def durable(self, target: Target, **options: Any) -> Callable[[Callable[..., Any]], Any]:
        options.setdefault("limits", Limits(max_block_s=0.05))
        options.setdefault("retry", RetryPolicy(base_delay_s=0.3, max_delay_s=0.3, jitter=0.0))
        return durable(store=self.store, adapters={"send": target}, allowed_actions=("send",), lease_ttl_s=5.0, **options)

    def serve(self, functions: list[Any], until: Callable[[], bool], **options: Any) -> WorkerReport:
        """Run a worker in a thread until ``until()`` holds, then stop it; return its report."""
        options.setdefault("poll_s", 0.05)
        options.setdefault("rescan_s", 0.05)
        options.setdefault("claim_ttl_s", 5.0)
        worker = Worker(self.store, functions, **options)
        reports: list[WorkerReport] = []
        thread = threading.Thread(target=lambda: reports.append(asyncio.run(worker.serve())))
        thread.start()
        try:
            deadline = time.monotonic() + DEADLINE_S
            while not until():
                if time.monotonic() > deadline or not thread.is_alive():
                    self.fail("the worker did not get there")  # type: ignore[attr-defined]
                time.sleep(0.02)
        finally:
            worker.stop()
            thread.join(DEADLINE_S)
        self.assertFalse(thread.is_alive())  # type: ignore[attr-defined]
        return reports[0]

    def status(self, task_id: str) -> str:
        from longrun.errors import UnknownTaskError

        try:
            state = self.store.load(task_id).state
        except UnknownTaskError:
            return "unknown"
        return "none" if state is None else str(state.status.value)

    def test_every_enqueued_task_runs_to_done_with_each_effect_once(self) -> None:
        target = Target()

        @self.durable(target)
        def job(run: Any, n: int) -> int:
            for i in range(n):
                run.effect(f"e{i}", "send", {"i": i})
            return n

        for i in range(12):
            job.start(f"t{i}", 3)
        report = self.serve([job], lambda: all(self.status(f"t{i}") == "done" for i in range(12)), concurrency=3)
        self.assertEqual(len(target.applied), 36)  # type: ignore[attr-defined]
        self.assertEqual(set(target.applied.values()), {1})  # type: ignore[attr-defined]
        self.assertGreaterEqual(report.statuses.get("done", 0), 12)  # type: ignore[attr-defined]
        self.assertTrue(all(self.store.read_lease(f"t{i}").released for i in range(12)))  # type: ignore[attr-defined]

    def test_a_retry_runs_again_when_it_is_due(self) -> None:
        target = Target(fail_first=True)

        @self.durable(target)
        def flaky(run: Any) -> str:
            run.effect("once", "send", {"x": 1})
            return "ok"

        flaky.start("f1")
        report = self.serve([flaky], lambda: self.status("f1") == "done")
        self.assertEqual(target.applied, {"f1/once": 1})  # type: ignore[attr-defined]
        self.assertEqual(report.statuses.get("retry-scheduled"), 1)  # type: ignore[attr-defined]

    def test_an_approval_wakes_a_waiting_task_and_a_child_that_ended_wakes_its_parent(self) -> None:
        target = Target()

        @self.durable(target)
        def child(run: Any) -> str:
            run.effect("kid", "send", {"x": 1}, approval=True)
            return "kid done"

        @self.durable(target)
        def parent(run: Any) -> str:
            value = run.child("p-child", child)
            run.effect("after", "send", {"got": value})
            return "parent done"

        parent.start("p")
        self.serve([parent, child], lambda: self.status("p-child") == "awaiting-approval" and self.status("p") == "waiting-on-child")
        state = self.store.load("p-child").state
        request = state.approval_requests["kid"]
        now = time.time()
        self.store.write_approval(
            Approval("a1", "p-child", request.plan_digest, "kid", request.payload_digest, "send", now + 600, "op", now)
        )
        self.serve([parent, child], lambda: self.status("p") == "done")
        self.assertEqual(target.applied, {"p-child/kid": 1, "p/after": 1})  # type: ignore[attr-defined]

    def family(self, target: Target, *, detached: bool) -> tuple[Any, Any]:
        """A parent whose child asks a question, then applies an effect with the answer."""

        @self.durable(target)
        def asker(run: Any) -> str:
            answer = run.ask("who", "to whom?")
            run.effect("send", "send", {"to": answer})
            return str(answer)

        @self.durable(target)
        def parent(run: Any) -> str:
            value = run.child("p-child", asker, **({"detached": True} if detached else {}))
            run.effect("after", "send", {"got": value})
            return "parent done"

        return parent, asker

    def answer(self, request: Any, value: Any) -> None:
        now = time.time()
        self.store.write_approval(Approval.for_request(request, approval_id="an1", approver="op", granted_at=now, expires_at=now + 600, answer=value))

    def test_a_parent_that_ends_cancelled_cancels_the_child_it_started_and_the_child_applies_nothing(self) -> None:
        target = Target()
        parent, asker = self.family(target, detached=False)
        parent.start("p")
        self.serve([parent, asker], lambda: self.status("p-child") == "awaiting-input" and self.status("p") == "waiting-on-child")
        question = self.store.load("p-child").state.approval_requests["who"]
        # Written to the store as any control source's writer would: not through `longrun cancel`.
        self.store.write_cancellation(Cancellation("p", time.time(), "op", "the job is not wanted"))
        self.serve([parent, asker], lambda: self.status("p") == "cancelled")
        self.answer(question, "alice")  # the question is answered after all (the child may have ended already)
        self.serve([parent, asker], lambda: self.status("p-child") in ("cancelled", "done"))
        self.assertEqual(self.status("p-child"), "cancelled")
        # By the record the parent wrote for it, or by reading the parent's own: either names the parent.
        self.assertIn("task 'p' was cancelled", self.store.load("p-child").state.next_action)
        self.assertEqual(target.applied, {}, "the child applied nothing")  # type: ignore[attr-defined]

    def test_a_detached_child_runs_on_after_its_parent_is_cancelled(self) -> None:
        target = Target()
        parent, asker = self.family(target, detached=True)
        parent.start("p")
        self.serve([parent, asker], lambda: self.status("p-child") == "awaiting-input" and self.status("p") == "waiting-on-child")
        self.store.write_cancellation(Cancellation("p", time.time(), "op", "the job is not wanted"))
        self.serve([parent, asker], lambda: self.status("p") == "cancelled")
        self.assertIsNone(self.store.read_cancellation("p-child"))
        self.answer(self.store.load("p-child").state.approval_requests["who"], "alice")
        self.serve([parent, asker], lambda: self.status("p-child") == "done")
        self.assertEqual(target.applied, {"p-child/send": 1})  # type: ignore[attr-defined]
        function_record = self.store.load("p-child").state.effects["longrun.function"]
        self.assertEqual((function_record.payload["parent"], function_record.payload["detached"]), ("p", True))

    def test_a_timer_wakes_the_task_when_it_is_due(self) -> None:
        target = Target()

        @self.durable(target)
        def sleeper(run: Any) -> str:
            run.sleep("nap", 0.5)
            run.effect("after", "send", {"x": 1})
            return "woke"

        sleeper.start("s")
        report = self.serve([sleeper], lambda: self.status("s") == "done")
        self.assertEqual(report.statuses.get("sleeping"), 1)  # type: ignore[attr-defined]
        self.assertEqual(target.applied, {"s/after": 1})  # type: ignore[attr-defined]

    def test_a_function_that_raises_is_tried_again_later_not_at_once(self) -> None:
        target = Target()

        @self.durable(target, retry=RetryPolicy(base_delay_s=60.0, max_delay_s=60.0, jitter=0.0))
        def broken(run: Any) -> str:
            run.effect("first", "send", {"x": 1})
            raise RuntimeError("a bug in the task's code")

        broken.start("b")
        queue = open_queue(self.store)
        self.addCleanup(queue.close)
        with self.assertLogs("longrun", "WARNING") as logs:  # type: ignore[attr-defined]
            self.serve([broken], lambda: queue.entries(["b"])[0].failures == 1)
        self.assertTrue(any("a bug in the task's code" in line for line in logs.output))  # type: ignore[attr-defined]
        entry = queue.entries(["b"])[0]
        self.assertEqual(entry.status, "retry-scheduled")  # type: ignore[attr-defined]
        self.assertEqual(entry.last_error, "RuntimeError: a bug in the task's code")  # type: ignore[attr-defined]
        self.assertGreater(entry.due_in_s, 30.0)  # type: ignore[attr-defined]  # the retry policy's delay, 60 s
        self.assertEqual(target.applied, {"b/first": 1})  # type: ignore[attr-defined]  # committed before it raised
        state = self.store.load("b").state
        self.assertEqual(state.status, Status.RETRY_SCHEDULED)  # type: ignore[attr-defined]
        self.assertEqual((state.last_failure.error_type, state.last_failure.attempt), ("RuntimeError", 1))  # type: ignore[attr-defined]

    def test_a_function_that_keeps_raising_ends_failed_and_the_worker_stops_trying_it(self) -> None:
        calls: list[int] = []

        @self.durable(Target(), limits=Limits(max_block_s=0.05, max_failures=3), retry=RetryPolicy(base_delay_s=0.01, max_delay_s=0.01, jitter=0.0))
        def broken(run: Any) -> str:
            calls.append(1)
            raise RuntimeError("a bug in the task's code")

        broken.start("b")
        queue = open_queue(self.store)
        self.addCleanup(queue.close)
        failed_at: list[float] = []

        def failed_a_while_ago() -> bool:  # a worker that still retried it would call it again meanwhile
            if not failed_at and self.status("b") == "failed":
                failed_at.append(time.monotonic())
            return bool(failed_at) and time.monotonic() - failed_at[0] > 0.3

        with self.assertLogs("longrun", "WARNING"):  # type: ignore[attr-defined]
            report = self.serve([broken], failed_a_while_ago)
        self.assertEqual(len(calls), 3)  # type: ignore[attr-defined]
        self.assertEqual(report.statuses, {"retry-scheduled": 2, "failed": 1})  # type: ignore[attr-defined]
        entry = queue.entries(["b"])[0]
        self.assertEqual((entry.status, entry.due_in_s), ("failed", None))  # type: ignore[attr-defined]
        state = self.store.load("b").state
        self.assertEqual(state.last_failure.attempt, 3)  # type: ignore[attr-defined]
        self.assertIn("--reopen", state.next_action)  # type: ignore[attr-defined]

    def test_a_function_whose_exception_cannot_print_itself_is_tried_again_later_like_any_other(self) -> None:
        class Unprintable(Exception):
            def __str__(self) -> str:
                raise RuntimeError("__str__ failed")

        @self.durable(Target())
        def broken(run: Any) -> str:
            raise Unprintable()

        broken.start("b")
        queue = open_queue(self.store)
        self.addCleanup(queue.close)
        with self.assertLogs("longrun", "WARNING") as logs:  # type: ignore[attr-defined]
            self.serve([broken], lambda: queue.entries(["b"])[0].failures == 1)
        self.assertTrue(any("task b raised Unprintable: <unprintable Unprintable>" in line for line in logs.output))  # type: ignore[attr-defined]
        entry = queue.entries(["b"])[0]
        self.assertEqual((entry.status, entry.last_error), ("retry-scheduled", "Unprintable: <unprintable Unprintable>"))  # type: ignore[attr-defined]

    def test_a_limited_action_has_at_most_k_applies_under_way(self) -> None:
        target = Target(apply_s=0.03)

        @self.durable(target)
        def limited(run: Any, n: int) -> int:
            for i in range(n):
                run.effect(f"a{i}", "send", {"i": i})
            return n

        for i in range(6):
            limited.start(f"l{i}", 3)
        self.serve([limited], lambda: all(self.status(f"l{i}") == "done" for i in range(6)), concurrency=6, limits={"send": 2})
        self.assertEqual(len(target.applied), 18)  # type: ignore[attr-defined]
        self.assertLessEqual(target.most, 2)  # type: ignore[attr-defined]

    def test_a_drain_stops_a_run_between_two_steps_commits_and_releases_the_lease(self) -> None:
        entered, release = threading.Event(), threading.Event()

        def gate(request: EffectRequest) -> None:
            if request.step_id == "e1":
                entered.set()
                release.wait(DEADLINE_S)

        target = Target(gate=gate)

        @self.durable(target)
        def job(run: Any) -> str:
            for i in range(4):
                run.effect(f"e{i}", "send", {"i": i})
            return "done"

        job.start("d")
        worker = Worker(self.store, [job], poll_s=0.05, rescan_s=0.05)
        reports: list[WorkerReport] = []
        thread = threading.Thread(target=lambda: reports.append(asyncio.run(worker.serve())))
        thread.start()
        self.assertTrue(entered.wait(DEADLINE_S))  # type: ignore[attr-defined]
        worker.stop()  # while e1 is being applied
        release.set()
        thread.join(DEADLINE_S)
        self.assertFalse(thread.is_alive())  # type: ignore[attr-defined]
        self.assertEqual(reports[0].drained, 1)  # type: ignore[attr-defined]
        self.assertEqual(target.applied, {"d/e0": 1, "d/e1": 1})  # type: ignore[attr-defined]  # e1 settled, e2 never started
        state = self.store.load("d").state
        self.assertEqual(state.status, Status.RETRY_SCHEDULED)  # type: ignore[attr-defined]
        self.assertEqual(state.effects["e1"].state.value, "verified")  # type: ignore[attr-defined]  # committed, not left to observe
        self.assertNotIn("e2", state.effects)  # type: ignore[attr-defined]
        self.assertTrue(self.store.read_lease("d").released)  # type: ignore[attr-defined]
        queue = open_queue(self.store)
        self.addCleanup(queue.close)
        self.assertLessEqual(queue.entries(["d"])[0].due_in_s, 0.0)  # type: ignore[attr-defined]  # due at once for another worker
        self.serve([job], lambda: self.status("d") == "done")
        self.assertEqual(set(target.applied.values()), {1})  # type: ignore[attr-defined]


    def test_an_async_function_runs_on_the_workers_loop_with_its_effects_in_parallel(self) -> None:
        begun: dict[str, int] = {}
        second = {f"a{i}": threading.Event() for i in range(4)}
        lock = threading.Lock()

        def gate(request: EffectRequest) -> None:
            # The first effect of a task to begin finishes only once another effect of the same task
            # has begun: were the effects run one at a time, it would wait out the deadline alone.
            task = request.key.split("/")[0]
            with lock:
                begun[task] = begun.get(task, 0) + 1
                first = begun[task] == 1
            if first:
                second[task].wait(DEADLINE_S)
            else:
                second[task].set()

        target = Target(gate=gate)

        @self.durable(target)
        async def fan(run: Any, n: int) -> int:
            await asyncio.gather(*(run.effect(f"e{i}", "send", {"i": i}) for i in range(n)))
            return n

        for i in range(4):
            fan.start(f"a{i}", 6)
        report = self.serve([fan], lambda: all(self.status(f"a{i}") == "done" for i in range(4)), concurrency=2)
        self.assertEqual(len(target.applied), 24)  # type: ignore[attr-defined]
        self.assertEqual(set(target.applied.values()), {1})  # type: ignore[attr-defined]
        self.assertGreaterEqual(target.most, 2)  # type: ignore[attr-defined]
        self.assertGreaterEqual(report.statuses.get("done", 0), 4)  # type: ignore[attr-defined]
        self.assertTrue(all(self.store.read_lease(f"a{i}").released for i in range(4)))  # type: ignore[attr-defined]

    def test_a_drain_lets_the_async_effects_in_flight_settle_and_starts_no_more(self) -> None:
        entered, release = threading.Event(), threading.Event()

        def gate(request: EffectRequest) -> None:
            if request.step_id == "b0":
                entered.set()
                release.wait(DEADLINE_S)

        target = Target(gate=gate)

        @self.durable(target)
        async def batches(run: Any) -> str:
            await asyncio.gather(*(run.effect(f"b{i}", "send", {"i": i}) for i in range(3)))
            await asyncio.gather(*(run.effect(f"c{i}", "send", {"i": i}) for i in range(3)))
            return "done"

        batches.start("ad")
        worker = Worker(self.store, [batches], poll_s=0.05, rescan_s=0.05)
        reports: list[WorkerReport] = []
        thread = threading.Thread(target=lambda: reports.append(asyncio.run(worker.serve())))
        thread.start()
        self.assertTrue(entered.wait(DEADLINE_S))  # type: ignore[attr-defined]
        worker.stop()  # while b0 is being applied
        release.set()
        thread.join(DEADLINE_S)
        self.assertFalse(thread.is_alive())  # type: ignore[attr-defined]
        self.assertEqual(reports[0].drained, 1)  # type: ignore[attr-defined]
        self.assertEqual(set(target.applied), {"ad/b0", "ad/b1", "ad/b2"})  # type: ignore[attr-defined]  # no c started
        state = self.store.load("ad").state
        self.assertEqual(state.status, Status.RETRY_SCHEDULED)  # type: ignore[attr-defined]
        self.assertTrue(all(state.effects[f"b{i}"].state.value == "verified" for i in range(3)))  # type: ignore[attr-defined]
        self.assertTrue(self.store.read_lease("ad").released)  # type: ignore[attr-defined]
        self.serve([batches], lambda: self.status("ad") == "done")
        self.assertEqual(len(target.applied), 6)  # type: ignore[attr-defined]
        self.assertEqual(set(target.applied.values()), {1})  # type: ignore[attr-defined]

class ReclaimTests(support.TempDirTest):
    def test_a_row_reclaimed_by_the_worker_that_runs_it_is_run_once_and_finished_under_the_new_claim(self) -> None:
        store = SqliteStore(self.path("a.db"), create=True)
        self.addCleanup(store.close)
        entered, release = threading.Event(), threading.Event()

        def gate(request: EffectRequest) -> None:
            entered.set()
            release.wait(DEADLINE_S)

        target = Target(gate=gate)

        @durable(store=store, adapters={"send": target}, allowed_actions=("send",))
        def job(run: Any) -> str:
            run.effect("e", "send", {})
            return "ok"

        job.start("t")
        queue = open_queue(store)
        self.addCleanup(queue.close)
        worker = Worker(store, [job], name="w", poll_s=60.0)

        async def scenario() -> None:
            pool = concurrent.futures.ThreadPoolExecutor(2)
            loop = asyncio.get_running_loop()

            async def in_queue(call: Callable[..., Any], *args: Any) -> Any:
                return await loop.run_in_executor(None, lambda: call(*args))

            first = queue.claim("w", [job.name], 1, 0.2)[0]
            worker._start(first, pool, in_queue)
            await asyncio.to_thread(entered.wait, DEADLINE_S)
            await asyncio.sleep(0.3)  # its heartbeat was late: the claim lapsed, and the worker claims the row again
            second = queue.claim("w", [job.name], 1, 30.0)[0]
            worker._start(second, pool, in_queue)
            self.assertEqual(len(worker._running), 1)
            release.set()
            await asyncio.gather(*(task for _, task in list(worker._running.values())))
            pool.shutdown()

        asyncio.run(scenario())
        entry = queue.entries(["t"])[0]
        self.assertEqual((entry.status, entry.claimed_by, entry.due_in_s), ("done", None, None))
        self.assertEqual(target.applied, {"t/e": 1})


class SqliteWorkerTests(WorkerCases, support.TempDirTest):
    def make_store(self) -> Any:
        return SqliteStore(os.path.join(self.tmp, "tasks.db"), create=True)


class JsonWorkerTests(WorkerCases, support.TempDirTest):
    def make_store(self) -> Any:
        return JsonFileStore(os.path.join(self.tmp, "store"), create=True)


class PostgresWorkerTests(WorkerCases, pg_support.SchemaPerTest, support.TempDirTest):
    def make_store(self) -> Any:
        return PostgresStore(self.schema.factory())


class OptionsTests(support.TempDirTest):
    def test_with_options_keeps_the_name_and_refuses_unknown_options(self) -> None:
        store = SqliteStore(self.path("a.db"), create=True)
        other = SqliteStore(self.path("b.db"), create=True)

        @durable(store=store, adapters={"send": Target()}, allowed_actions=("send",))
        def job(run: Any) -> str:
            run.effect("e", "send", {})
            return "ok"

        moved = job.with_options(store=other, owner="w/thread", cancellations=other)  # owner was never given
        self.assertEqual(moved.engine_options["owner"], "w/thread")
        self.assertEqual(moved.name, job.name)
        self.assertIs(moved.engine_options["store"], other)
        self.assertIs(job.engine_options["store"], store)
        self.assertEqual(moved.run("t").status, Status.DONE)
        self.assertEqual(other.list_tasks(), ["t"])
        self.assertEqual(store.list_tasks(), [])
        with self.assertRaises(InvalidInputError):
            job.with_options(colour="blue")
        with self.assertRaises(TypeError):
            job.engine_options["store"] = other  # type: ignore[index]

    def test_an_async_function_is_started_from_sync_code_and_from_a_running_loop_with_astart(self) -> None:
        store = SqliteStore(self.path("a.db"), create=True)
        self.addCleanup(store.close)
        target = Target()

        @durable(store=store, adapters={"send": target}, allowed_actions=("send",))
        async def job(run: Any, n: int) -> int:
            await run.effect("e", "send", {"n": n})
            return n

        self.assertTrue(job.start("s", 1))
        self.assertFalse(job.start("s", 1))  # the same arguments again change nothing

        async def from_a_loop() -> bool:
            with self.assertRaises(InvalidInputError) as refused:
                job.start("l", 2)  # asyncio.run cannot nest: refused with what to use instead
            self.assertIn("astart", str(refused.exception))
            return await job.astart("l", 2)

        self.assertTrue(asyncio.run(from_a_loop()))
        for task in ("s", "l"):
            state = store.load(task).state
            self.assertEqual(state.status, Status.QUEUED)  # type: ignore[union-attr]  # recorded, not started
            self.assertEqual(list(state.effects), ["longrun.function"])  # type: ignore[union-attr]  # the record of the call only
        self.assertEqual(target.applied, {})
        with self.assertRaises(InvalidInputError):
            job.start("s", 3)  # other arguments under the same task id

    def test_a_function_the_worker_cannot_run_with_its_options_stops_it_at_start_not_task_by_task(self) -> None:
        from longrun.functions import DurableFunction

        store = SqliteStore(self.path("a.db"), create=True)
        self.addCleanup(store.close)

        @durable(store=store, adapters={"send": Target()}, allowed_actions=("send",))
        def job(run: Any) -> str:
            return "ok"

        class Misconfigured(DurableFunction[Any]):
            def with_options(self, **options: Any) -> "DurableFunction[Any]":
                raise InvalidInputError("unknown engine options ['owner']")

        broken = Misconfigured(job.fn, job.contract_for("x"), dict(job.engine_options))
        with self.assertRaises(InvalidInputError) as refused:
            Worker(store, [job, broken], poll_s=0.05)
        self.assertIn(job.name, str(refused.exception))
        self.assertIn("unknown engine options", str(refused.exception))
        Worker(store, [job], poll_s=0.05)  # the well-configured one alone starts

    def test_a_cancellation_source_that_asks_to_pause_stops_the_run_between_two_steps(self) -> None:
        store = SqliteStore(self.path("a.db"), create=True)
        target = Target()
        pause = threading.Event()

        class Pausing:
            def read_cancellation(self, task_id: str) -> Any:
                return store.read_cancellation(task_id)

            def pause_requested(self, task_id: str) -> bool:
                return pause.is_set()

        def gate(request: EffectRequest) -> None:
            if request.step_id == "e1":
                pause.set()

        target.gate = gate

        @durable(store=store, adapters={"send": target}, allowed_actions=("send",), cancellations=Pausing())
        def job(run: Any) -> str:
            for i in range(3):
                run.effect(f"e{i}", "send", {})
            return "ok"

        outcome = job.run("t")
        self.assertEqual(outcome.status, Status.RETRY_SCHEDULED)
        self.assertIsNotNone(outcome.wake_at)
        self.assertEqual(sorted(target.applied), ["t/e0", "t/e1"])
        self.assertEqual(store.load("t").state.effects["e1"].state.value, "verified")
        pause.clear()
        self.assertEqual(job.run("t").status, Status.DONE)
        self.assertEqual(set(target.applied.values()), {1})


if __name__ == "__main__":
    unittest.main()
