"""``longrun start`` (record, or ``--run``) and ``longrun resume STORE TASK`` for durable functions, as subprocesses."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
import unittest

import helpers  # noqa: F401  (puts src on sys.path)
from helpers.cli_process import run_longrun
from helpers.support import MEMORY_TMP
from longrun import JsonFileStore
from longrun.testing import read_outbox

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

MODULE = textwrap.dedent(
    """
    import os, longrun
    from longrun.testing import OutboxAdapter
    ROOT = os.environ["TASKS_DIR"]
    store = longrun.JsonFileStore(ROOT, create=True)

    @longrun.durable(store=store, adapters={"mail.send": OutboxAdapter(os.path.join(ROOT, "outbox.jsonl"))})
    def greet(run, names, greeting="hi"):
        for name in names:
            run.effect(f"mail/{name}", "mail.send", {"to": name, "text": greeting})
        return {"sent": len(names)}

    @longrun.durable(store=store, adapters={"mail.send": OutboxAdapter(os.path.join(ROOT, "outbox.jsonl"))})
    def pick(run):
        colour = run.ask("colour", "which colour?", choices=["red", "blue"])
        count = run.ask("count", "how many?")
        run.effect("send", "mail.send", {"colour": colour, "count": count})
        return {"colour": colour, "count": count}

    @longrun.durable(store=store, limits=longrun.Limits(max_failures=2), retry=longrun.RetryPolicy(base_delay_s=60.0, jitter=0.0))
    def broken(run, name):
        run.call("lookup", str.upper, name)
        raise LookupError(f"no account for {name}")

    def not_durable():
        return None

    if __name__ == "__main__":
        import sys
        print(greet.run(sys.argv[1], ["cy"]).status.value)
    """
)


class StartAndResumeTests(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory(dir=MEMORY_TMP)
        self.addCleanup(self.dir.cleanup)
        self.code = os.path.join(self.dir.name, "code")
        self.tasks = os.path.join(self.dir.name, "tasks")
        os.makedirs(self.code)
        os.makedirs(self.tasks)
        with open(os.path.join(self.code, "agents.py"), "w") as handle:
            handle.write(MODULE)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": SRC, "TASKS_DIR": self.tasks}
        return run_longrun(args, env=env, cwd=None)

    def test_start_records_the_task_without_running_it_and_resume_runs_it(self) -> None:
        started = self.cli("start", "agents:greet", "g1", "--args", '[["ann"]]', "--path", self.code, "--json")
        self.assertEqual(started.returncode, 0, started.stderr)
        self.assertEqual(json.loads(started.stdout), {"task_id": "g1", "function": "agents:greet", "created": True, "priority": 0})
        self.assertFalse(os.path.exists(os.path.join(self.tasks, "outbox.jsonl")), "nothing ran")
        again = self.cli("start", "agents:greet", "g1", "--args", '[["ann"]]', "--path", self.code)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("already recorded", again.stdout)
        other = self.cli("start", "agents:greet", "g1", "--args", '[["zed"]]', "--path", self.code)
        self.assertEqual(other.returncode, 2, other.stderr)
        self.assertIn("other arguments", other.stderr)
        resumed = self.cli("resume", self.tasks, "g1", "--path", self.code, "--json")
        self.assertEqual(json.loads(resumed.stdout)["result"], {"sent": 1}, resumed.stderr)
        self.assertEqual(len(read_outbox(os.path.join(self.tasks, "outbox.jsonl"))), 1)

    def test_a_function_that_raises_reports_its_recorded_failure_retry_scheduled_then_failed(self) -> None:
        first = self.cli("start", "agents:broken", "b1", "--args", '["ada"]', "--path", self.code, "--run", "--json")
        self.assertEqual(first.returncode, 1, first.stderr)  # not finished: a later run continues it
        body = json.loads(first.stdout)
        self.assertEqual((body["status"], body["last_failure"]["error_type"], body["last_failure"]["attempt"]), ("retry-scheduled", "LookupError", 1))
        self.assertEqual(body["wake_at"], body["last_failure"]["retry_at"])
        self.assertEqual(body["results"], {"lookup": "ADA"})
        second = self.cli("resume", self.tasks, "b1", "--path", self.code)
        self.assertEqual(second.returncode, 4, second.stderr)  # failed: running it again changes nothing
        self.assertIn("task b1: failed", second.stdout)
        self.assertIn("last error    LookupError: no account for ada (failure 2 of 2 in a row", second.stdout)
        self.assertIn(f"longrun resume {self.tasks} b1 --reopen", second.stdout)
        self.assertIn('raise LookupError(f"no account for {name}")', second.stderr, "the recorded traceback")
        third = self.cli("resume", self.tasks, "b1", "--path", self.code, "--json")
        self.assertEqual((third.returncode, json.loads(third.stdout)["status"]), (4, "failed"))

    def test_start_run_runs_the_task_and_resume_reads_function_and_arguments_from_the_store(self) -> None:
        started = self.cli("start", "agents:greet", "g1", "--args", '[["ann", "bob"]]', "--kwargs", '{"greeting": "yo"}',
                           "--path", self.code, "--json", "--run")  # fmt: skip
        self.assertEqual(started.returncode, 0, started.stderr)
        self.assertEqual(json.loads(started.stdout)["result"], {"sent": 2})
        resumed = self.cli("resume", self.tasks, "g1", "--path", self.code, "--json")
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        self.assertEqual(json.loads(resumed.stdout)["status"], "done")
        self.assertEqual(json.loads(resumed.stdout)["result"], {"sent": 2})
        sent = read_outbox(os.path.join(self.tasks, "outbox.jsonl"))
        self.assertEqual(sorted(item["payload"]["to"] for item in sent), ["ann", "bob"], "each effect applied once")

    def test_start_run_with_other_arguments_stops_plan_mismatch_and_applies_nothing(self) -> None:
        self.assertEqual(self.cli("start", "agents:greet", "g1", "--args", '[["ann"]]', "--path", self.code, "--run").returncode, 0)
        other = self.cli("start", "agents:greet", "g1", "--args", '[["zed"]]', "--path", self.code, "--json", "--run")
        self.assertEqual(other.returncode, 1, other.stderr)
        self.assertEqual(json.loads(other.stdout)["status"], "plan-mismatch")
        self.assertEqual(len(read_outbox(os.path.join(self.tasks, "outbox.jsonl"))), 1)

    def test_questions_wait_for_answers_bound_to_their_step_and_refuse_answers_outside_the_choices(self) -> None:
        def status(result: subprocess.CompletedProcess[str]) -> str:
            self.assertEqual(result.stderr, "")
            return str(json.loads(result.stdout)["status"])

        self.assertEqual(status(self.cli("start", "agents:pick", "p1", "--path", self.code, "--json", "--run")), "awaiting-input")
        approve = self.cli("approve", self.tasks, "p1", "--step", "colour", "--yes")
        self.assertEqual(approve.returncode, 2, "a question is answered, not approved")
        green = self.cli("answer", self.tasks, "p1", "colour", "green")
        self.assertEqual(green.returncode, 2, "refused when written, not only at the next run")
        self.assertIn('"green" is not one of the choices of step \'colour\': ["red", "blue"]; nothing was written', green.stderr)
        self.assertEqual(self.cli("answer", self.tasks, "p1", "colour", "red").returncode, 0)
        resumed = self.cli("resume", self.tasks, "p1", "--path", self.code, "--json")
        self.assertIn("'count'", json.loads(resumed.stdout)["next_action"])
        wrong_step = self.cli("answer", self.tasks, "p1", "colour", "blue")
        self.assertNotEqual(wrong_step.returncode, 0, "no question is pending for that step")
        self.assertEqual(self.cli("answer", self.tasks, "p1", "count", "3").returncode, 0)
        done = self.cli("resume", self.tasks, "p1", "--path", self.code, "--json")
        self.assertEqual(status(done), "done")
        self.assertEqual(json.loads(done.stdout)["result"], {"colour": "red", "count": 3}, "3 is read as JSON")
        again = self.cli("resume", self.tasks, "p1", "--path", self.code, "--json")
        self.assertEqual(json.loads(again.stdout)["result"], {"colour": "red", "count": 3})
        self.assertEqual(len(read_outbox(os.path.join(self.tasks, "outbox.jsonl"))), 1)
        # Answers and the function's own record are settled by the engine, with no attempt at a target:
        # a finished durable task is not damaged.
        verify = self.cli("verify", self.tasks, "p1", "--json")
        self.assertEqual(verify.returncode, 0, verify.stdout)
        ledger = [check for check in json.loads(verify.stdout)["checks"] if check["name"] == "ledger"]
        self.assertEqual([check["result"] for check in ledger], ["ok"], ledger)

    def test_a_task_started_with_python_dash_m_records_the_module_name_so_resume_finds_it(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, self.code]), "TASKS_DIR": self.tasks}
        started = subprocess.run(
            [sys.executable, "-m", "agents", "m1"], capture_output=True, text=True, env=env, timeout=60, check=False
        )
        self.assertEqual(started.stdout.strip(), "done", started.stderr)
        record = JsonFileStore(self.tasks).load("m1").state
        assert record is not None
        self.assertEqual(record.effects["longrun.function"].payload["function"], "agents:greet", "not __main__:greet")
        resumed = self.cli("resume", self.tasks, "m1", "--path", self.code, "--json")
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        self.assertEqual(json.loads(resumed.stdout)["result"], {"sent": 1})

    def test_a_task_started_by_running_the_script_by_path_records_its_module_name_so_resume_finds_it(self) -> None:
        env = {**os.environ, "PYTHONPATH": SRC, "TASKS_DIR": self.tasks}
        started = subprocess.run(
            [sys.executable, os.path.join(self.code, "agents.py"), "s1"], capture_output=True, text=True, env=env,
            timeout=60, check=False, cwd=self.dir.name,
        )  # fmt: skip
        self.assertEqual(started.stdout.strip(), "done", started.stderr)
        record = JsonFileStore(self.tasks).load("s1").state
        assert record is not None
        self.assertEqual(record.effects["longrun.function"].payload["function"], "agents:greet", "not __main__:greet")
        resumed = self.cli("resume", self.tasks, "s1", "--path", self.code, "--json")
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        self.assertEqual(json.loads(resumed.stdout)["result"], {"sent": 1})

    def test_a_task_an_earlier_version_recorded_under_main_goes_on_when_its_script_runs_again(self) -> None:
        script = textwrap.dedent(
            """
            import os, sys, longrun
            from longrun.testing import OutboxAdapter
            ROOT = os.environ["TASKS_DIR"]
            store = longrun.JsonFileStore(ROOT, create=True)

            @longrun.durable(store=store, adapters={"mail.send": OutboxAdapter(os.path.join(ROOT, "outbox.jsonl"))})
            def greet(run, names):
                for name in names:
                    run.effect(f"mail/{name}", "mail.send", {"to": name}, approval=name == "bob")
                return len(names)

            if sys.argv[2] == "old":
                greet.name = "__main__:greet"  # as an earlier version recorded a script's function
            print(greet.run(sys.argv[1], ["ann", "bob"]).status.value)
            """
        )
        with open(os.path.join(self.code, "legacy.py"), "w") as handle:
            handle.write(script)
        env = {**os.environ, "PYTHONPATH": SRC, "TASKS_DIR": self.tasks}

        def run(version: str) -> str:
            result = subprocess.run(
                [sys.executable, os.path.join(self.code, "legacy.py"), "l1", version], capture_output=True, text=True,
                env=env, timeout=60, check=False,
            )  # fmt: skip
            return result.stdout.strip() + result.stderr

        self.assertEqual(run("old"), "awaiting-approval")
        self.assertEqual(self.cli("approve", self.tasks, "l1", "--yes").returncode, 0)
        self.assertEqual(run("new"), "done")
        self.assertEqual(sorted(item["key"] for item in read_outbox(os.path.join(self.tasks, "outbox.jsonl"))), ["l1/mail/ann", "l1/mail/bob"])

    def test_a_durable_function_no_other_process_can_import_is_refused_at_decoration_naming_the_fix(self) -> None:
        code = "import longrun\n@longrun.durable(store=longrun.JsonFileStore('tasks', create=True))\ndef agent(run):\n    pass\n"
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC},
            timeout=60, check=False, cwd=self.dir.name,
        )  # fmt: skip
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("InvalidInputError: @durable function 'agent' is defined in __main__", result.stderr)
        self.assertIn("define it in a module file", result.stderr)

    def test_a_plan_mismatch_names_the_argument_that_differs_and_its_next_action_works_when_followed(self) -> None:
        self.assertEqual(self.cli("start", "agents:greet", "g1", "--args", '[["ann"]]', "--path", self.code).returncode, 0)
        other = self.cli("start", "agents:greet", "g1", "--args", '[["zed"]]', "--kwargs", '{"greeting": "yo"}',
                         "--path", self.code, "--json", "--run")  # fmt: skip
        outcome = json.loads(other.stdout)
        self.assertEqual(outcome["status"], "plan-mismatch")
        self.assertIn("argument 'names': recorded ['ann'], this run ['zed']", outcome["next_action"])
        self.assertIn("argument 'greeting': recorded not given, this run 'yo'", outcome["next_action"])
        self.assertNotIn("the function:", outcome["next_action"])
        self.assertNotIn("run contract", outcome["next_action"])
        command = shlex.split(outcome["next_action"].split("`")[1])
        self.assertEqual(command, ["longrun", "resume", os.path.abspath(self.tasks), "g1"])
        followed = subprocess.run(
            [sys.executable, "-m", *command, "--json"], capture_output=True, text=True, cwd=self.code,
            env={**os.environ, "PYTHONPATH": SRC, "TASKS_DIR": self.tasks}, timeout=60, check=False,
        )  # fmt: skip
        self.assertEqual(followed.returncode, 0, followed.stderr)
        self.assertEqual(json.loads(followed.stdout)["result"], {"sent": 1})
        self.assertEqual([item["payload"]["to"] for item in read_outbox(os.path.join(self.tasks, "outbox.jsonl"))], ["ann"])

    def test_status_leaves_the_tasks_own_record_out_of_its_effects_table_and_a_question_waits_for_an_answer(self) -> None:
        asked = self.cli("start", "agents:pick", "p1", "--path", self.code, "--json", "--run")
        outcome = json.loads(asked.stdout)
        self.assertEqual(outcome["status"], "awaiting-input")
        unknowns = [item["detail"] for item in outcome["unknowns"]]
        self.assertIn("no answer yet to the question of step 'colour'", unknowns)
        self.assertFalse([detail for detail in unknowns if "approval" in detail], unknowns)
        self.assertIn(f"longrun answer {os.path.abspath(self.tasks)} p1 colour VALUE", outcome["next_action"])
        [pending] = outcome["pending"]
        self.assertEqual((pending["kind"], pending["question"], pending["choices"]), ("question", "which colour?", ["red", "blue"]))
        status = self.cli("status", self.tasks, "p1")
        self.assertEqual(status.returncode, 0, status.stderr)
        self.assertIn("effects      1 in the order first recorded (1 question) (not shown: the task's own function record", status.stdout)
        self.assertNotIn("longrun.function", status.stdout)
        effects = json.loads(self.cli("status", self.tasks, "p1", "--json").stdout)["effects"]
        self.assertEqual({entry["step_id"]: entry["kind"] for entry in effects}, {"longrun.function": "function", "colour": "question"})

    def test_bad_inputs_are_usage_errors_that_create_nothing(self) -> None:
        cases = [
            ("start", "agents:greet", "g1", "--args", "{", "--path", self.code),
            ("start", "agents:greet", "g1", "--args", '{"a": 1}', "--path", self.code),
            ("start", "agents:not_durable", "g1", "--path", self.code),
            ("start", "agents:greet", "../escape", "--path", self.code),
            ("resume", self.tasks, "no-such-task", "--path", self.code),
        ]
        for args in cases:
            with self.subTest(args=args):
                result = self.cli(*args)
                self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
                self.assertIn("error", result.stderr)
                self.assertNotIn("Traceback", result.stderr)
        self.assertEqual(sorted(os.listdir(self.tasks)), [])

    def test_start_refuses_arguments_the_function_cannot_take_naming_the_mismatch_and_records_nothing(self) -> None:
        cases = {
            '[["ann"], "yo", 3]': "too many positional arguments",
            "[]": "missing a required argument: 'names'",
        }
        for args_json, mismatch in cases.items():
            for run in ((), ("--run",)):
                with self.subTest(args=args_json, run=run):
                    result = self.cli("start", "agents:greet", "g1", "--args", args_json, "--path", self.code, *run)
                    self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
                    self.assertIn("agents:greet(run, names, greeting='hi') cannot take these arguments", result.stderr)
                    self.assertIn(mismatch, result.stderr)
        unknown = self.cli("start", "agents:greet", "g1", "--args", '[["ann"]]', "--kwargs", '{"tone": "dry"}', "--path", self.code)
        self.assertEqual(unknown.returncode, 2)
        self.assertIn("unexpected keyword argument 'tone'", unknown.stderr)
        self.assertEqual(JsonFileStore(self.tasks).list_tasks(), [], "nothing was recorded")

    def test_an_error_message_says_a_thing_once(self) -> None:
        result = self.cli("start", "agents:greet", "g1", "--args", "[1,2", "--path", self.code)
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stderr.count("not valid JSON"), 1, result.stderr)
        self.assertEqual(result.stderr.count("--args"), 1, result.stderr)


if __name__ == "__main__":
    unittest.main()
