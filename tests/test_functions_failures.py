"""A durable function that keeps failing is seen failing: its errors recorded, retried a bounded number of times.

Its code raising is recorded in the task's state (type, message, traceback, the failure's number in a
row, when) in the commit that schedules the retry (``retry-scheduled`` with the retry time) or ends
it ``failed`` after ``Limits.max_failures`` in a row; a process SIGKILLed inside the same step again
and again counts the same way; progress in between starts the count again. A task recorded for a
worker is ``queued`` until its first run. On every store (PostgreSQL when ``LONGRUN_TEST_POSTGRES_DSN`` is set).
"""

from __future__ import annotations

import json
import os
import unittest
from typing import Any

from helpers import pg_support, support
from helpers.cli_process import run_script
import longrun
from longrun import InvalidInputError, JsonFileStore, Limits, PostgresStore, RetryPolicy, SqliteStore, Status, Store
from longrun.failures import CRASH_TYPE, MAX_TRACEBACK_CHARS, RunFailure
from longrun.ledger import EffectState
from longrun.testing import FakeClock

CHILD = os.path.join(support.HELPERS, "failing_child.py")


class Flaky:
    """A function body's bug, switched off by ``fixed``; ``calls`` counts the runs that reached it."""

    def __init__(self) -> None:
        self.fixed = False
        self.calls = 0


class FailureCases(support.TempDirTest):
    """In one process, with a fake clock; a subclass says which store."""

    def make_store(self) -> Store:
        return JsonFileStore(self.path("store"), create=True)

    def setUp(self) -> None:
        super().setUp()
        self.clock = FakeClock()
        self.store = self.make_store()

    def durable(self, **options: Any) -> Any:
        options.setdefault("limits", Limits(max_failures=3))
        return longrun.durable(
            store=self.store, clock=self.clock, retry=RetryPolicy(base_delay_s=10.0, max_delay_s=100.0, jitter=0.0), **options
        )

    def state(self, task_id: str) -> longrun.RunState:
        state = self.store.load(task_id).state
        assert state is not None
        return state

    def broken(self, flaky: Flaky) -> Any:
        @self.durable()
        def agent(run: longrun.Run, name: str) -> str:
            looked_up = run.call("lookup", str.upper, name)
            flaky.calls += 1
            if not flaky.fixed:
                raise KeyError(f"no record for {looked_up}")
            return str(looked_up)

        return agent

    def test_a_function_raising_every_time_is_retry_scheduled_then_failed_with_its_error_recorded(self) -> None:
        flaky = Flaky()
        agent = self.broken(flaky)
        for attempt in (1, 2):
            start = self.clock.now()
            with self.assertRaises(KeyError):
                agent.run("t", "ada")  # the caller sees its exception, as before
            state = self.state("t")
            self.assertEqual(state.status, Status.RETRY_SCHEDULED, "never running between attempts")
            failure = state.last_failure
            assert failure is not None
            self.assertEqual((failure.kind, failure.error_type, failure.message), ("exception", "KeyError", "'no record for ADA'"))
            self.assertIn('raise KeyError(f"no record for {looked_up}")', failure.traceback)
            self.assertEqual((failure.attempt, failure.max_failures, failure.at), (attempt, 3, start))
            self.assertEqual(failure.retry_at, start + 10.0 * 2 ** (attempt - 1), "the run's retry policy")
            self.assertEqual(failure.revision, state.revision, "recorded in the commit that scheduled the retry")
            self.assertIn("a worker runs it again", state.next_action)
            self.clock.advance(100)
        with self.assertRaises(KeyError):
            agent.run("t", "ada")
        state = self.state("t")
        self.assertEqual(state.status, Status.FAILED)
        assert state.last_failure is not None
        self.assertEqual((state.last_failure.attempt, state.last_failure.retry_at), (3, None))
        self.assertIn(f"longrun resume {self.store_spec()} t --reopen", state.next_action)
        self.assertEqual(flaky.calls, 3)
        self.assertEqual(state.effects["lookup"].state, EffectState.VERIFIED, "what was settled is kept")
        # Failed is final: another run calls nothing and says why.
        outcome = agent.run("t", "ada")
        self.assertEqual(outcome.status, Status.FAILED)
        self.assertEqual(outcome.last_failure, state.last_failure)
        self.assertEqual(outcome.to_json()["last_failure"], state.last_failure.to_json())  # type: ignore[union-attr]
        self.assertEqual(flaky.calls, 3)
        reloaded = self.state("t")
        self.assertEqual(reloaded.last_failure, state.last_failure, "the store keeps it whole")

    def store_spec(self) -> str:
        spec = getattr(self.store, "spec", None)
        return spec if isinstance(spec, str) else "<store>"

    def test_an_async_function_raising_is_recorded_the_same_way(self) -> None:
        @self.durable()
        async def agent(run: longrun.AsyncRun) -> None:
            await run.call("lookup", str.upper, "ada")
            raise RuntimeError("async bug")

        for attempt, status in ((1, Status.RETRY_SCHEDULED), (2, Status.RETRY_SCHEDULED), (3, Status.FAILED)):
            with self.assertRaises(RuntimeError):
                agent.run("t")
            state = self.state("t")
            assert state.last_failure is not None
            self.assertEqual((state.status, state.last_failure.attempt, state.last_failure.message), (status, attempt, "async bug"))
        self.assertEqual(agent.run("t").status, Status.FAILED)

    def test_a_failed_task_reopened_after_a_fix_finishes_and_a_reopen_counts_failures_from_none(self) -> None:
        flaky = Flaky()
        agent = self.broken(flaky)
        for _ in range(3):
            with self.assertRaises(KeyError):
                agent.run("t", "ada")
        self.assertEqual(self.state("t").status, Status.FAILED)
        with self.assertRaises(KeyError):  # reopened, still broken: failure 1 of 3 again, not failed at once
            agent.reopen("t", "try once more", by="operator")
        state = self.state("t")
        assert state.last_failure is not None
        self.assertEqual((state.status, state.last_failure.attempt), (Status.RETRY_SCHEDULED, 1))
        flaky.fixed = True
        outcome = agent.run("t", "ada")
        self.assertEqual((outcome.status, outcome.result, outcome.last_failure), (Status.DONE, "ADA", None))

    def test_a_fixed_function_finishes_and_its_failure_is_cleared(self) -> None:
        flaky = Flaky()
        agent = self.broken(flaky)
        with self.assertRaises(KeyError):
            agent.run("t", "ada")
        flaky.fixed = True
        outcome = agent.run("t", "ada")
        self.assertEqual((outcome.status, outcome.result, outcome.last_failure), (Status.DONE, "ADA", None))
        self.assertIsNone(self.state("t").last_failure)

    def test_progress_between_failures_starts_the_count_again(self) -> None:
        progress = {"steps": 0}

        @self.durable()
        def agent(run: longrun.Run) -> None:
            for i in range(progress["steps"]):
                run.call(f"step/{i}", int, i)
            raise RuntimeError(f"stuck after {progress['steps']} steps")

        attempts = []
        for steps in (0, 0, 1, 2, 2):  # a new step settled before the 3rd and 4th failures
            progress["steps"] = steps
            with self.assertRaises(RuntimeError):
                agent.run("t")
            failure = self.state("t").last_failure
            assert failure is not None
            attempts.append(failure.attempt)
        self.assertEqual(attempts, [1, 2, 1, 1, 2])
        self.assertEqual(self.state("t").status, Status.RETRY_SCHEDULED)
        with self.assertRaises(RuntimeError):
            agent.run("t")
        self.assertEqual(self.state("t").status, Status.FAILED, "three in a row without progress")

    def test_a_long_traceback_and_message_are_bounded(self) -> None:
        @self.durable()
        def agent(run: longrun.Run, depth: int) -> None:
            def deep(n: int) -> None:  # two functions in turn: Python folds only a frame repeated as it is
                if n == 0:
                    raise ValueError("x" * 100_000)
                deeper(n - 1)

            def deeper(n: int) -> None:
                deep(n)

            deep(depth)

        with self.assertRaises(ValueError):
            agent.run("t", 300)
        failure = self.state("t").last_failure
        assert failure is not None
        self.assertLessEqual(len(failure.traceback), MAX_TRACEBACK_CHARS + 40)
        self.assertTrue(failure.traceback.startswith("["), failure.traceback[:60])  # says what was cut
        last = failure.traceback.rstrip("\n").splitlines()[-1]
        self.assertTrue(last.startswith("ValueError: xxx") and last.endswith("characters cut]"), last[-80:])  # the end is kept, cut
        self.assertIn("in deep", failure.traceback)
        self.assertLess(len(failure.message), 2_100)
        self.assertIn("characters cut", failure.message)

    def test_a_recorded_task_is_queued_until_its_first_run(self) -> None:
        @self.durable()
        def agent(run: longrun.Run, n: int) -> int:
            return int(run.call("double", int, n * 2))

        self.assertTrue(agent.start("t", 2))
        state = self.state("t")
        self.assertEqual(state.status, Status.QUEUED)
        self.assertIn("a worker runs it", state.next_action)
        self.assertFalse(agent.start("t", 2), "recorded before: nothing changes")
        self.assertEqual(self.state("t").status, Status.QUEUED)
        outcome = agent.run("t", 2)
        self.assertEqual((outcome.status, outcome.result), (Status.DONE, 4))

    def test_the_limit_is_validated(self) -> None:
        for bad in (0, -1, 1.5, True, None):
            with self.assertRaises(InvalidInputError):
                Limits(max_failures=bad)  # type: ignore[arg-type]
        self.assertEqual(Limits().max_failures, 5)

    def test_a_failure_record_round_trips_and_a_bad_one_is_refused(self) -> None:
        failure = RunFailure(
            kind="crash", error_type=CRASH_TYPE, message="died", traceback="", attempt=2, max_failures=5, at=1.0,
            epoch=3, revision=4, progress=0, step="lookup",
        )  # fmt: skip
        self.assertEqual(RunFailure.from_json(failure.to_json()), failure)
        for change in ({"kind": "oops"}, {"attempt": 6}, {"attempt": 0}, {"extra": 1}, {"message": 3}):
            with self.assertRaises(longrun.CorruptStateError, msg=change):
                RunFailure.from_json({**failure.to_json(), **change})


class JsonFileFailureTests(FailureCases):
    pass


class SqliteFailureTests(FailureCases):
    def make_store(self) -> Store:
        store = SqliteStore(self.path("longrun.sqlite"), create=True)
        self.addCleanup(store.close)
        return store


class PostgresFailureTests(FailureCases):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        pg_support.check()

    def make_store(self) -> Store:
        schema = pg_support.Schema()
        self.addCleanup(schema.drop)
        store = PostgresStore(schema.factory())
        self.addCleanup(store.close)
        return store


class CrashLoopCases(support.TempDirTest):
    """Each run in a process of its own (tests/helpers/failing_child.py), SIGKILLed inside a step."""

    in_memory = True

    def spec(self) -> str:
        return self.path("store")

    def open(self) -> Store:
        from longrun.stores import open_store

        store = open_store(self.spec())
        self.addCleanup(lambda: getattr(store, "close", lambda: None)())
        return store

    def run_child(self, task: str, mode: str, run: int, max_failures: int) -> tuple[int, Any]:
        later = str(100.0 * run)  # each run's clock past the previous one's lease: no wait for its expiry
        # A process of its own, forked from the fork server (longrun imported once for all runs).
        process = run_script(CHILD, [self.spec(), task, mode, later, str(max_failures), self.path(f"{task}.calls")], cwd=None, timeout=120)
        outcome = json.loads(process.stdout) if process.stdout.strip() else None
        if process.returncode not in (0, -9):
            self.fail(f"the child exited {process.returncode}: {process.stderr}")
        return process.returncode, outcome

    def test_n_sigkills_inside_one_step_end_the_task_failed(self) -> None:
        codes = [self.run_child("t", "kill", run, 3)[0] for run in range(1, 4)]
        self.assertEqual(codes, [-9, -9, -9], "each run was killed inside the step")
        state = self.open().load("t").state
        assert state is not None
        self.assertEqual(state.status, Status.RUNNING, "killed mid-step: nothing recorded a stop")
        code, outcome = self.run_child("t", "kill", 4, 3)
        self.assertEqual((code, outcome["status"]), (0, "failed"), "the run that finds the third crash stops it")
        self.assertIn("--reopen", outcome["next_action"])
        state = self.open().load("t").state
        assert state is not None and state.last_failure is not None
        failure = state.last_failure
        self.assertEqual((state.status, failure.kind, failure.error_type), (Status.FAILED, "crash", CRASH_TYPE))
        self.assertEqual((failure.attempt, failure.step), (3, "work/0"))
        with open(self.path("t.calls")) as handle:
            self.assertEqual(handle.read().split(), ["0", "0", "0"], "the failed task was not called a fourth time")
        self.assertEqual(self.run_child("t", "kill", 5, 3), (0, {"status": "failed", "next_action": state.next_action}))

    def test_a_kill_before_the_crash_is_recorded_counts_too_by_the_lease_epochs(self) -> None:
        # The first run is killed in the step; the three after it are killed in the same step before
        # any records a thing but the crash it found: every epoch taken over counts.
        for run in range(1, 3):
            self.assertEqual(self.run_child("t", "kill", run, 5)[0], -9)
        state = self.open().load("t").state
        assert state is not None and state.last_failure is not None
        self.assertEqual(state.last_failure.attempt, 1)
        self.assertEqual(self.run_child("t", "kill", 3, 5)[0], -9)
        state = self.open().load("t").state
        assert state is not None and state.last_failure is not None
        self.assertEqual(state.last_failure.attempt, 2)

    def test_progress_between_kills_starts_the_count_again(self) -> None:
        # Each of three steps is killed twice before it returns: six kills, never three in a row.
        outcomes = [self.run_child("t", "kill-then-progress", run, 3) for run in range(1, 9)]
        codes = [code for code, _ in outcomes]
        self.assertEqual(codes.count(-9), 6, codes)
        self.assertEqual(outcomes[-1], (0, {"status": "done", "next_action": "nothing: every required effect is verified"}))
        state = self.open().load("t").state
        assert state is not None
        self.assertEqual(state.status, Status.DONE)


class JsonFileCrashLoopTests(CrashLoopCases):
    pass


class SqliteCrashLoopTests(CrashLoopCases):
    def spec(self) -> str:
        return "sqlite:" + self.path("longrun.sqlite")


class PostgresCrashLoopTests(CrashLoopCases):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        pg_support.check()

    def setUp(self) -> None:
        super().setUp()
        self.schema = pg_support.Schema()
        self.addCleanup(self.schema.drop)

    def spec(self) -> str:
        return self.schema.spec


del FailureCases, CrashLoopCases  # only their subclasses run


if __name__ == "__main__":
    unittest.main()
