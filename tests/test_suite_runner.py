"""The suite's own runner, ``python -m tests``: every module's tests counted once, every failure
reported and failing the run, a worker that dies failing only its module."""

from __future__ import annotations

import os
import re
import signal
import textwrap

from helpers.support import TempDirTest, run_python

MODULES = {
    "test_passes": """
        import unittest
        class Passes(unittest.TestCase):
            def test_one(self): pass
            def test_two(self): pass
            @unittest.skip("for a reason")
            def test_skipped(self): pass
    """,
    "test_fails": """
        import unittest
        class Fails(unittest.TestCase):
            def test_assertion(self): self.assertEqual(1, 2)
            def test_exception(self): raise RuntimeError("boom")
            @unittest.expectedFailure
            def test_expected(self): self.fail("known")
    """,
    "test_dies": """
        import os, signal, unittest
        class Dies(unittest.TestCase):
            def test_kills_its_process(self): os.kill(os.getpid(), signal.SIGKILL)
    """,
    "test_skips_itself": """
        import unittest
        raise unittest.SkipTest("needs something missing")
    """,
    "test_breaks_on_import": """
        raise RuntimeError("broken at import")
    """,
    "test_dies_mid_report": """
        import os, signal, sys, time, unittest
        class DiesMidReport(unittest.TestCase):
            def test_leaves_half_a_report_and_a_child_holding_the_pipe(self):
                reports = int(sys.argv[sys.argv.index("--worker") + 1].split(",")[1])
                os.write(reports, b'{"module": "half')
                child = os.fork()
                if child == 0:  # keeps the report pipe open; not the run's output, which the test reads to its end
                    null = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(null, 1)
                    os.dup2(null, 2)
                    time.sleep(300)
                    os._exit(0)
                with open(os.path.join(os.path.dirname(__file__), "child.pid"), "w") as handle:
                    handle.write(str(child))
                os.kill(os.getpid(), signal.SIGKILL)
    """,
    "test_after": """
        import os, unittest
        class After(unittest.TestCase):
            def test_runs_after_a_death(self): open(os.path.join(os.path.dirname(__file__), "after-ran"), "w").close()
    """,
}


class SuiteRunnerTests(TempDirTest):
    def write(self, names: list[str]) -> None:
        for name in names:
            with open(self.path(name + ".py"), "w", encoding="utf-8") as handle:
                handle.write(textwrap.dedent(MODULES[name]))

    def run_suite(self, *args: str) -> tuple[int, str]:
        result = run_python(["-m", "tests", "--dir", self.tmp, *args], timeout=120)
        return result.returncode, result.stderr

    def unittest_ran(self, pattern: str = "test*.py") -> str:
        """What ``python -m unittest discover`` says it ran, in this Python (3.12 stopped counting
        some skipped tests as run)."""
        result = run_python(["-m", "unittest", "discover", "-s", self.tmp, "-t", self.tmp, "-p", pattern], timeout=120)
        match = re.search(r"^Ran (\d+) tests? in", result.stderr, re.MULTILINE)
        assert match, result.stderr
        return match.group(0)

    def test_a_passing_run_counts_every_test_as_unittest_does_and_exits_0(self) -> None:
        self.write(["test_passes", "test_skips_itself"])
        code, errors = self.run_suite("--workers", "2")
        self.assertEqual(code, 0, errors)
        self.assertIn(self.unittest_ran(), errors)
        self.assertIn("OK (skipped=2)", errors)

    def test_failures_errors_a_dead_worker_and_a_broken_import_each_fail_the_run(self) -> None:
        self.write([name for name in MODULES if name != "test_dies_mid_report"])
        code, errors = self.run_suite("--workers", "2", "-v")
        self.assertEqual(code, 1, errors)
        self.assertIn("FAILED (failures=2, errors=2, skipped=2, expected failures=1)", errors)
        for failed in (
            "failed: test_fails.Fails.test_assertion",
            "failed: test_fails.Fails.test_exception",
            "failed: test_dies",
            "failed: test_breaks_on_import.load",
        ):
            self.assertIn(failed, errors)
        self.assertIn("its worker process ended with status -9", errors)
        self.assertIn("RuntimeError: broken at import", errors)
        self.assertIn("test_one (test_passes.Passes.test_one) ... ok", errors, "-v prints a line per test")
        self.assertTrue(os.path.exists(self.path("after-ran")), "a fresh worker ran the modules left")

    def test_a_worker_killed_mid_report_with_a_child_holding_its_pipe_fails_its_module_without_a_hang(self) -> None:
        self.write(["test_dies_mid_report", "test_after"])
        self.addCleanup(self.kill_child)
        code, errors = self.run_suite("--workers", "1")  # a hang would end in the run's timeout
        self.assertEqual(code, 1, errors)
        self.assertIn("failed: test_dies_mid_report", errors)
        self.assertIn("its worker process ended with status -9", errors)
        self.assertTrue(os.path.exists(self.path("after-ran")), "a fresh worker ran the module left")

    def kill_child(self) -> None:
        try:
            with open(self.path("child.pid"), encoding="utf-8") as handle:
                os.kill(int(handle.read()), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            pass

    def test_one_worker_runs_the_named_modules_only(self) -> None:
        self.write(["test_passes", "test_fails"])
        code, errors = self.run_suite("--workers", "1", "test_passes")
        self.assertEqual(code, 0, errors)
        self.assertIn(self.unittest_ran("test_passes.py"), errors)
        self.assertIn("(1 worker process)", errors)
        self.assertNotIn("test_fails", errors)

    def test_modules_that_share_effect_keys_run_in_one_unit_and_every_module_once(self) -> None:
        import importlib

        runner = importlib.import_module("tests.__main__")
        names = ["test_b", "test_mcp", "test_a", "test_session", "test_fleet_crash"]
        units = runner.ordered(names)
        self.assertEqual(sorted(name for unit in units for name in unit), sorted(names))
        self.assertIn(["test_session", "test_mcp"], units, "one worker runs them one after another")
        self.assertEqual(units[0], ["test_fleet_crash"], "the slowest first")

    def test_an_unknown_module_is_a_usage_error(self) -> None:
        self.write(["test_passes"])
        code, errors = self.run_suite("test_missing")
        self.assertEqual(code, 2, errors)
        self.assertIn("no such test module", errors)
        self.assertIn("test_missing", errors)
