"""``longrun worker`` and ``longrun workers`` as an operator runs them: start, list, drain, refuse bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import unittest

from helpers import support
from helpers.cli_process import run_longrun
from helpers.fleet_support import TASKS_DIR, fleet_env, helper, tasks_module

DEADLINE_S = 120.0
"""A liveness guard, not a timing assertion."""


class WorkerCommandTests(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.spec = "sqlite:" + self.path("tasks.db")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_longrun(args, env=fleet_env(self.spec, self.tmp), cwd=TASKS_DIR, timeout=DEADLINE_S)

    def wait_for(self, condition: object, what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not condition():  # type: ignore[operator]
            if time.monotonic() > deadline:
                self.fail(f"gave up waiting for {what}")
            time.sleep(0.1)

    def test_a_worker_runs_what_start_recorded_is_listed_and_drains_on_sigterm(self) -> None:
        helper(self.spec, self.tmp, "enqueue", "effects", "3", "[2]")
        worker = subprocess.Popen(
            [sys.executable, "-m", "longrun", "worker", self.spec, "--import", "fleet_tasks", "--name", "w-one", "--poll", "0.2", "--json"],
            env=fleet_env(self.spec, self.tmp), cwd=TASKS_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.addCleanup(lambda: worker.poll() is None and worker.kill())

        def all_done() -> bool:
            listed = self.cli("ls", self.spec, "--json")
            return listed.returncode == 0 and [task["status"] for task in json.loads(listed.stdout)] == ["done"] * 3

        self.wait_for(all_done, "every task done")
        listing = self.cli("workers", self.spec, "--json")
        self.assertEqual(listing.returncode, 0, listing.stderr)
        [record] = json.loads(listing.stdout)
        self.assertEqual((record["name"], record["state"], record["alive"], record["pid"]), ("w-one", "running", True, worker.pid))
        self.assertIn("fleet_tasks:effects", record["functions"])
        text = self.cli("workers", self.spec)
        self.assertIn("w-one", text.stdout)
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=DEADLINE_S)
        self.assertEqual(worker.returncode, 0, err)
        report = json.loads(out)
        self.assertEqual(report["statuses"], {"done": 3})
        after = self.cli("workers", self.spec, "--json")
        self.assertEqual(after.returncode, 1, "no worker is alive")
        self.assertEqual(json.loads(after.stdout)[0]["state"], "stopped")

    def test_sigterm_mid_task_stops_it_between_two_effects_and_another_worker_finishes_it(self) -> None:
        helper(self.spec, self.tmp, "enqueue", "limited", "1", "[30]", "long")  # 30 effects of 50 ms each
        command = [sys.executable, "-m", "longrun", "worker", self.spec, "--import", "fleet_tasks", "--poll", "0.2", "--json"]
        first = subprocess.Popen(command, env=fleet_env(self.spec, self.tmp), cwd=TASKS_DIR, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.addCleanup(lambda: first.poll() is None and first.kill())
        fleet_tasks = tasks_module()

        os.environ["LONGRUN_FLEET_WORK"] = self.tmp
        self.wait_for(lambda: len(fleet_tasks.outbox_counts()) >= 3, "a few effects applied")
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=DEADLINE_S)
        self.assertEqual(first.returncode, 0, err)
        self.assertEqual(json.loads(out)["drained"], 1)
        applied = len(fleet_tasks.outbox_counts())
        self.assertLess(applied, 30, "the task was stopped, not run to the end")
        status = json.loads(self.cli("status", self.spec, "long0", "--json").stdout)
        self.assertEqual(status["status"], "retry-scheduled")
        self.assertIn("run again now", status["next_action"])
        self.assertEqual(status["store_lease"]["expires_at"], 0.0, "the lease was released")
        verified = [record["step_id"] for record in status["effects"] if record["action"] == "api" and record["state"] == "verified"]
        self.assertEqual(len(verified), applied, "every applied effect was settled and committed before the stop")
        second = subprocess.Popen(command, env=fleet_env(self.spec, self.tmp), cwd=TASKS_DIR, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.addCleanup(lambda: second.poll() is None and second.kill())
        self.wait_for(lambda: json.loads(self.cli("status", self.spec, "long0", "--json").stdout)["status"] == "done", "done")
        second.send_signal(signal.SIGTERM)
        second.communicate(timeout=DEADLINE_S)
        counts = fleet_tasks.outbox_counts()
        self.assertEqual((len(counts), set(counts.values())), (30, {1}))

    def test_bad_worker_arguments_are_usage_errors(self) -> None:
        helper(self.spec, self.tmp, "prepare")
        with open(self.path("plain.py"), "w") as handle:
            handle.write("VALUE = 1\n")
        cases = [
            ("worker", self.spec, "--import", "plain", "--path", self.tmp),
            ("worker", self.spec, "--import", "no_such_module_here"),
            ("worker", self.spec, "--import", "fleet_tasks", "--limit", "nosuchaction=2"),
            ("worker", self.spec, "--import", "fleet_tasks", "--limit", "send=0"),
            ("worker", self.spec, "--import", "fleet_tasks", "--concurrency", "0"),
            ("worker", "sqlite:" + self.path("missing.db"), "--import", "fleet_tasks"),
            ("start", "fleet_tasks:effects", "t1", "--priority", "high"),
        ]
        for args in cases:
            with self.subTest(args=args):
                result = self.cli(*args)
                self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
                self.assertNotIn("Traceback", result.stderr)
        self.assertFalse(os.path.exists(self.path("missing.db")))

    def test_start_takes_a_priority_that_orders_the_queue(self) -> None:
        for task, priority in (("low", "0"), ("high", "7")):
            result = self.cli("start", "fleet_tasks:effects", task, "--args", "[1]", "--priority", priority, "--json")
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(json.loads(result.stdout)["priority"], int(priority))
        from longrun import SqliteStore
        from longrun.stores.queue import open_queue

        queue = open_queue(SqliteStore(self.path("tasks.db")))
        self.addCleanup(queue.close)
        self.assertEqual(queue.claim("w", ["fleet_tasks:effects"], 1, 30.0)[0].task_id, "high")


if __name__ == "__main__":
    unittest.main()
