"""What ran, and why it failed, from the command line: ``status``, ``ls`` (``--long``, ``--function``,
``--match``), ``--json``, ``history``, ``watch`` and ``verify``'s exit codes, on every store.

The tasks are made in this process (a durable function that raises, one that finishes, one recorded
for a worker); the commands run as ``python -m longrun`` in a child process, as a user runs them.
"""

from __future__ import annotations

import json
import unittest
from typing import Any

from helpers import pg_support
from helpers.cli_case import CliCase, cli
import longrun
from longrun import Limits, RetryPolicy, Status, Store
from longrun.stores import open_store


def make_functions(store: Store) -> tuple[Any, Any]:
    retry = RetryPolicy(base_delay_s=30.0, max_delay_s=30.0, jitter=0.0)

    @longrun.durable(store=store, limits=Limits(max_failures=2), retry=retry)
    def charge(run: longrun.Run, customer: str, *, note: str = "") -> dict[str, Any]:
        amount = run.call("price", len, customer)
        raise ValueError(f"card declined for {customer} ({amount})")

    @longrun.durable(store=store)
    def report(run: longrun.Run, week: int) -> dict[str, Any]:
        return {"week": week, "pages": run.call("count", abs, -week)}

    return charge, report


class FailureCliCases(CliCase):
    def spec(self) -> str:
        return self.store_dir

    def setUp(self) -> None:
        super().setUp()
        store = open_store(self.spec())
        self.addCleanup(lambda: getattr(store, "close", lambda: None)())
        self.store = store
        self.charge, self.report = make_functions(store)
        with self.assertRaises(ValueError):
            self.charge.run("charge-ada", "ada", note="n" * 5000)  # failure 1 of 2: retry-scheduled
        for _ in range(2):
            with self.assertRaises(ValueError):
                self.charge.run("charge-bob", "bob")  # failure 2 of 2: failed
        self.assertEqual(self.report.run("report-48", 48).status, Status.DONE)
        self.assertTrue(self.report.start("report-49", 49))  # queued

    def run_cli(self, *args: str, code: int = 0) -> str:
        result = cli(*args)
        self.assert_exit(result, code)
        return str(result.stdout)

    def test_status_shows_the_function_its_arguments_result_and_last_error_with_its_traceback(self) -> None:
        text = self.run_cli("status", self.spec(), "charge-bob")
        self.assertIn("status       failed", text)
        self.assertIn(f"function     {self.charge.name}", text)
        self.assertTrue(self.charge.name.endswith("test_cli_failures:make_functions.<locals>.charge"))
        self.assertIn('arguments    args ["bob"], kwargs {}', text)
        self.assertIn("result       (not returned yet)", text)
        self.assertIn("last error   ValueError: card declined for bob (3) (failure 2 of 2 in a row, last step 'price')", text)
        self.assertIn('raise ValueError(f"card declined for {customer} ({amount})")', text)
        self.assertRegex(text, r"next action  fix the code, then `longrun resume \S+ charge-bob --reopen`")
        long_arguments = self.run_cli("status", self.spec(), "charge-ada")
        self.assertIn("more characters; --json shows them all]", long_arguments, "the cut is said")
        self.assertIn("next attempt at or after", long_arguments)
        done = self.run_cli("status", self.spec(), "report-48")
        self.assertIn('result       {"pages": 48, "week": 48}', done)
        self.assertNotIn("last error", done)
        queued = self.run_cli("status", self.spec(), "report-49")
        # Position 1 but where the store's triggers queued the other tasks too (SQLite, PostgreSQL): ada is due first.
        self.assertRegex(queued, r"status       queued \(recorded, not started yet; position [12] in the queue\)")

    def test_status_json_has_what_ran_and_the_last_failure_in_full(self) -> None:
        body = json.loads(self.run_cli("status", self.spec(), "charge-ada", "--json"))
        self.assertEqual(body["status"], "retry-scheduled")
        self.assertTrue(body["last_run_failed"])
        failure = body["last_failure"]
        self.assertEqual((failure["error_type"], failure["attempt"], failure["max_failures"]), ("ValueError", 1, 2))
        self.assertIn("Traceback", failure["traceback"])
        self.assertIsNotNone(failure["retry_at"])
        ran = body["what_ran"]
        self.assertEqual(ran["kwargs"], {"note": "n" * 5000}, "in full")
        self.assertEqual((ran["args"], ran["last_failure"]), (["ada"], failure))
        queued = json.loads(self.run_cli("status", self.spec(), "report-49", "--json"))
        self.assertEqual(queued["status"], "queued")
        self.assertIn(queued["queue_position"], (1, 2))

    def test_ls_filters_by_function_and_id_glob_and_long_shows_what_ran(self) -> None:
        rows = json.loads(self.run_cli("ls", self.spec(), "--json"))
        by_task = {row["task_id"]: row for row in rows}
        self.assertEqual(
            {task: row["status"] for task, row in by_task.items()},
            {"charge-ada": "retry-scheduled", "charge-bob": "failed", "report-48": "done", "report-49": "queued"},
        )
        self.assertEqual(by_task["charge-bob"]["last_error"], "ValueError: card declined for bob (3) (failure 2 of 2 in a row, last step 'price')")
        self.assertTrue(by_task["charge-ada"]["last_run_failed"])
        self.assertFalse(by_task["report-48"]["last_run_failed"])
        self.assertEqual(by_task["report-48"]["what_ran"]["result"], {"pages": 48, "week": 48})
        only = lambda *args: sorted(row["task_id"] for row in json.loads(self.run_cli("ls", self.spec(), "--json", *args)))  # noqa: E731
        self.assertEqual(only("--function", "make_functions.<locals>.report"), ["report-48", "report-49"])
        self.assertEqual(only("--function", "*test_cli_failures:*charge"), ["charge-ada", "charge-bob"])
        self.assertEqual(only("--function", self.report.name), ["report-48", "report-49"])
        self.assertEqual(only("--match", "*-4?"), ["report-48", "report-49"])
        self.assertEqual(only("--match", "charge-*", "--status", "failed"), ["charge-bob"])
        self.assertEqual(only("--function", "nothing:here"), [])
        text = self.run_cli("ls", self.spec(), "--long")
        self.assertIn("retry-scheduled (failure 1 of 2)", text)
        self.assertIn(f"    function     {self.report.name}", text)
        self.assertIn('    result       {"pages": 48, "week": 48}', text)
        self.assertIn("    last error   ValueError: card declined for bob", text)
        self.assertIn("... [", text)  # ada's long note, cut
        self.assertIn("no tasks matching the filters", self.run_cli("ls", self.spec(), "--match", "zzz*"))

    def test_verify_exits_4_for_failed_1_when_the_last_run_failed_and_0_for_queued(self) -> None:
        failed = json.loads(self.run_cli("verify", self.spec(), "charge-bob", "--json", code=4))
        self.assertEqual(failed["verdict"], "ended")
        retrying = json.loads(self.run_cli("verify", self.spec(), "charge-ada", "--json", code=1))
        status_check = [check for check in retrying["checks"] if check["name"] == "status"]
        self.assertIn("the last run failed (ValueError: card declined for ada", status_check[0]["detail"])
        self.run_cli("verify", self.spec(), "report-49", code=0)
        self.run_cli("verify", self.spec(), "report-48", code=0)

    def test_the_console_shows_what_ran_and_the_last_error_and_filters_by_function_and_id(self) -> None:
        from longrun.cli._console_pages import Console

        console = Console(self.store, self.spec(), read_only=True, approver="alice", sign_key=None, control_root=None)
        page = console.task_page("charge-bob", {})
        self.assertIn(self.charge.name.replace("<", "&lt;").replace(">", "&gt;"), page)
        self.assertIn("args [&quot;bob&quot;]", page)
        self.assertIn("ValueError: card declined for bob (3) (failure 2 of 2 in a row, last step &#x27;price&#x27;)", page)
        self.assertIn("raise ValueError(f&quot;card declined for {customer} ({amount})&quot;)", page)  # the traceback, escaped
        self.assertIn("--reopen", page)
        done = console.task_page("report-48", {})
        self.assertIn("{&quot;pages&quot;: 48, &quot;week&quot;: 48}", done)
        listing = console.task_list({"function": ["*charge"]})
        self.assertIn("charge-ada", listing)
        self.assertNotIn("report-48", listing)
        self.assertIn("ValueError: card declined for ada", listing)
        self.assertIn("report-49", console.task_list({"match": ["report-4?"], "status": ["queued"]}))
        self.assertNotIn("report-48", console.task_list({"match": ["report-4?"], "status": ["queued"]}))

    def test_history_and_watch_show_the_last_error(self) -> None:
        self.assertIn("failure", self.run_cli("history", self.spec(), "charge-bob"))
        entries = json.loads(self.run_cli("history", self.spec(), "charge-bob", "--json"))
        [failure] = [entry for entry in entries if entry["kind"] == "failure"]
        self.assertIn("ValueError: card declined for bob", failure["detail"])
        lines = [json.loads(line) for line in self.run_cli("watch", self.spec(), "charge-bob", "--json", code=4).splitlines()]
        kinds = [line["kind"] for line in lines]
        self.assertIn("failure", kinds)
        self.assertEqual(lines[-1]["kind"], "stopped")
        self.assertEqual(lines[-1]["last_failure"]["error_type"], "ValueError")


class JsonFileFailureCliTests(FailureCliCases):
    pass


class SqliteFailureCliTests(FailureCliCases):
    def spec(self) -> str:
        return "sqlite:" + self.path("longrun.sqlite")



class PostgresFailureCliTests(FailureCliCases):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        pg_support.check()

    def setUp(self) -> None:
        self.schema = pg_support.Schema()
        self.addCleanup(self.schema.drop)
        super().setUp()

    def spec(self) -> str:
        return self.schema.spec


del FailureCliCases  # only its subclasses run


if __name__ == "__main__":
    unittest.main()
