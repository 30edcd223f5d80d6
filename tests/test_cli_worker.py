"""``longrun worker`` and ``longrun workers`` as an operator runs them: start, list, drain, refuse bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import unittest

import support
from fleet_support import TESTS, fleet_env, helper

DEADLINE_S = 120.0
"""A liveness guard, not a timing assertion."""


class WorkerCommandTests(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.spec = "sqlite:" + self.path("tasks.db")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "longrun", *args], env=fleet_env(self.spec, self.tmp), cwd=TESTS, capture_output=True,
            text=True, timeout=DEADLINE_S,
        )  # fmt: skip

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
            env=fleet_env(self.spec, self.tmp), cwd=TESTS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
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
        from longrun.stores._queue import open_queue

        queue = open_queue(SqliteStore(self.path("tasks.db")))
        self.addCleanup(queue.close)
        self.assertEqual(queue.claim("w", ["fleet_tasks:effects"], 1, 30.0)[0].task_id, "high")


if __name__ == "__main__":
    unittest.main()
