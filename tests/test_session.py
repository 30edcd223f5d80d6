"""The checkpointed session from the shell: init, next, exec, checkpoint, done, stop, and the CLI around them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import unittest
from typing import Any

import helpers  # noqa: F401  (puts src on sys.path)
from helpers import scale
from helpers.session_support import SessionCase

FUZZ_CASES = scale.scaled(100, 300)
"""The odd command lines the argument fuzzer tries: 300 under ``LONGRUN_TEST_SCALE=full``."""

from longrun.session import holder_gone
from longrun.lease import Lease


class FollowNext(SessionCase):
    """Do what ``longrun next`` says until it says nothing is left (an operator approves when asked)."""

    def follow(self, task: str = "t1", *, store: str | None = None, limit: int = 40) -> dict[str, Any]:
        store = store or self.store
        for _ in range(limit):
            action = self.cli_json("next", store, task, code=None)
            if action["who"] == "agent":
                for command in action["commands"]:
                    if command[0] == "longrun":
                        self.cli(*command[1:])
                    else:
                        subprocess.run(command, cwd=action["cwd"], check=True, env=self.env())
            elif action["who"] == "operator" and "longrun approve" in (action["unblock"] or ""):
                self.cli_json("approve", store, task, "--step", action["step"], "--yes")
            elif action["who"] == "time":
                time.sleep(action["retry_after_s"])
            else:
                return action
        raise AssertionError("the task did not finish by following `longrun next`")


class SessionFlowTests(FollowNext):
    def test_next_alone_leads_an_agent_through_the_contract_and_each_command_lands_once(self) -> None:
        self.init()
        first = self.next(code=0)
        self.assertEqual((first["kind"], first["who"], first["step"]), ("checkpoint", "agent", "notes"))
        self.assertEqual(first["commands"][0], ["sh", "-c", "echo plan > notes.txt"])
        self.assertEqual(first["commands"][1][:5], ["longrun", "checkpoint", self.store, "t1", "notes"])
        self.assertEqual(first["cwd"], self.work)
        self.assertEqual(first["remaining"], ["notes", "append-a", "check-a", "report", "append-b", "wrap-up"])
        self.assertIn("SHA-256", first["evidence"])
        end = self.follow()
        self.assertEqual((end["kind"], end["who"], end["status"]), ("finished", "nobody", "done"))
        self.assertEqual(self.lines(), ["a", "b"], "each command applied once")
        verify = self.cli_json("verify", self.store, "t1")
        self.assertEqual(verify["verdict"], "finished", verify)
        status = self.cli_json("status", self.store, "t1")
        kinds = {record["step_id"]: (record["action"], record["state"]) for record in status["effects"]}
        self.assertEqual(kinds["append-a"], ("append", "verified"))
        self.assertEqual(kinds["notes"], ("longrun.checkpoint", "verified"))
        self.assertEqual(kinds["longrun.contract"], ("longrun.contract", "verified"))
        history, out, _ = self.cli("history", self.store, "t1")
        self.assertEqual(history, 0)
        self.assertIn("append-b", out)
        self.assertEqual(self.cli("done", self.store, "t1")[0], 0, "done again changes nothing")

    def test_an_exec_whose_step_is_recorded_runs_nothing_and_writes_nothing(self) -> None:
        self.init()
        self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", self.write("notes.txt", "plan\n"))
        ran = self.cli_json("exec", self.store, "t1", "append-a")
        self.assertEqual(ran["record"]["state"], "verified")
        self.assertEqual(ran["record"]["result"]["exit_status"], 0)
        self.assertTrue(ran["record"]["result"]["stdout"]["sha256"].startswith("sha256:"))
        self.assertEqual(ran["next"]["step"], "check-a")
        revision = self.revision()
        again = self.cli_json("exec", self.store, "t1", "append-a")
        self.assertIsNone(again["status"])
        self.assertIn("already recorded", again["notes"][0])
        self.assertEqual(self.revision(), revision)
        self.assertEqual(self.lines(), ["a"])

    def test_refusals_name_the_problem_and_write_nothing(self) -> None:
        self.init()
        revision = self.revision()
        cases = [
            (("exec", self.store, "t1", "append-b"), 2, "comes after notes, append-a"),
            (("checkpoint", self.store, "t1", "append-a", "--note", "x"), 2, "is an exec step"),
            (("exec", self.store, "t1", "notes"), 2, "is a checkpoint step"),
            (("exec", self.store, "t1", "nope"), 2, "no step 'nope'"),
            (("exec", self.store, "t1", "append-a", "--", "sh", "-c", "echo z >> target.txt"), 2, "the run contract gives step"),
            (("checkpoint", self.store, "t1", "notes", "--note", "x"), 2, "recorded with a file"),
            (("checkpoint", self.store, "t1", "notes", "--evidence", self.write("other.txt", "x")), 2, "notes.txt (the run contract says so)"),
            (("checkpoint", self.store, "t1", "notes", "--evidence", os.path.join(self.work, "missing.txt")), 2, "cannot read"),
            (("next", self.store, "t2"), 2, "longrun init"),
            (("done", self.store, "t1"), 1, "not recorded yet: notes, append-a, report, append-b"),
            (("exec", self.store, "t1", "append-a", "sh", "-c", "x"), 2, "after --"),
            (("resume", self.store, "t1"), 2, "is a checkpointed session: `longrun next"),
        ]
        for args, code, message in cases:
            with self.subTest(args=args[0:4]):
                result, out, err = self.cli(*args)
                self.assertEqual(result, code, out + err)
                self.assertIn(message, out + err)
        self.assertEqual(self.revision(), revision)
        self.assertEqual(self.lines(), [])
        self.assertFalse(os.path.exists(os.path.join(self.store, "t2")), "an unknown task is not created")

    def test_init_again_with_the_same_contract_changes_nothing_and_another_is_refused(self) -> None:
        self.init()
        revision = self.revision()
        again = self.cli_json("init", self.store, "t1", "--contract", self.contract)
        self.assertFalse(again["created"])
        self.assertEqual(self.revision(), revision)
        self.write("other.toml", self.contract_text.replace("append line a to", "append the line a to"))
        code, _, err = self.cli("init", self.store, "t1", "--contract", os.path.join(self.work, "other.toml"))
        self.assertEqual(code, 2)
        self.assertIn("another run contract", err)
        self.assertIn("the run contract differs from the one the task was started with in: steps", err)
        code, _, err = self.cli("init", self.store, "t9", "--contract", self.contract)
        self.assertEqual(code, 0, "another task id is another task")

    def test_a_stop_blocks_every_command_until_a_person_answers_it(self) -> None:
        self.init()
        stopped = self.cli_json("stop", self.store, "t1", "--reason", "is the plan right?")
        self.assertEqual((stopped["status"], stopped["step"]), ("awaiting-input", "decision-1"))
        waiting = self.next(code=1)
        self.assertEqual((waiting["kind"], waiting["who"]), ("stop", "operator"))
        self.assertIn(f"longrun answer {self.store} t1 decision-1 VALUE", waiting["unblock"])
        self.assertEqual(waiting["decisions"][0]["question"], "is the plan right?")
        blocked = self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", self.write("notes.txt", "p\n"), code=1)
        self.assertEqual(blocked["status"], "awaiting-input")
        self.assertEqual(self.cli("answer", self.store, "t1", "decision-1", "yes")[0], 0)
        answered = self.next(code=0)
        self.assertEqual(answered["who"], "agent")
        self.assertEqual((answered["decisions"][0]["answered"], answered["decisions"][0]["answer"]), (True, "yes"))
        recorded = self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", os.path.join(self.work, "notes.txt"))
        self.assertEqual(recorded["record"]["state"], "verified")
        second = self.cli_json("stop", self.store, "t1", "--reason", "and now?")
        self.assertEqual(second["step"], "decision-2")

    def test_approval_binds_to_the_recorded_command_and_is_asked_of_an_operator(self) -> None:
        self.init()
        self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", self.write("notes.txt", "plan\n"))
        self.cli_json("exec", self.store, "t1", "append-a")
        self.cli_json("checkpoint", self.store, "t1", "check-a", "--note", "a is there")
        self.write("report.txt", "1\n")
        self.cli_json("checkpoint", self.store, "t1", "report", "--evidence", os.path.join(self.work, "report.txt"))
        asked = self.cli_json("exec", self.store, "t1", "append-b", code=1)
        self.assertEqual(asked["status"], "awaiting-approval")
        waiting = self.next(code=1)
        self.assertEqual((waiting["kind"], waiting["who"], waiting["step"]), ("wait", "operator", "append-b"))
        self.assertIn(f"longrun approve {self.store} t1 --step append-b", waiting["unblock"])
        self.assertEqual(self.lines(), ["a"], "nothing ran before the approval")
        self.cli_json("approve", self.store, "t1", "--step", "append-b", "--yes")
        self.assertIn("approved by", " ".join(self.next(code=0)["notes"]))
        self.cli_json("exec", self.store, "t1", "append-b")
        self.assertEqual(self.lines(), ["a", "b"])

    def test_a_checkpoint_that_needs_approval_is_bound_to_its_evidence(self) -> None:
        self.contract_text = self.contract_text.replace('path = "notes.txt"\n', 'path = "notes.txt"\napproval = true\n')
        self.write("run-contract.toml", self.contract_text)
        self.init()
        notes = self.write("notes.txt", "plan\n")
        asked = self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", notes, code=1)
        self.assertEqual((asked["status"], asked["record"]["state"]), ("awaiting-approval", "planned"))
        self.assertEqual(self.next(code=1)["who"], "operator")
        self.cli_json("approve", self.store, "t1", "--step", "notes", "--yes")
        self.write("notes.txt", "another plan\n")
        code, _, err = self.cli("checkpoint", self.store, "t1", "notes", "--evidence", notes)
        self.assertEqual(code, 2, "the approval is for the evidence as it was")
        self.assertIn("put back what was asked to be approved", err)
        self.write("notes.txt", "plan\n")
        recorded = self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", notes)
        self.assertEqual(recorded["record"]["state"], "verified")
        self.assertIsNotNone(recorded["record"]["approval_id"])
        self.assertEqual(recorded["next"]["step"], "append-a")

    def test_a_failed_command_comes_back_to_the_agent_and_counts_an_attempt(self) -> None:
        self.contract_text = self.contract_text.replace('command = "echo a >> target.txt"', 'command = "test -f ready && echo a >> target.txt"')
        self.contract_text = self.contract_text.replace('observe = "test -f target.txt && grep -qx a target.txt"\n', "", 1)
        self.write("run-contract.toml", self.contract_text)
        self.init()
        self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", self.write("notes.txt", "plan\n"))
        failed = self.cli_json("exec", self.store, "t1", "append-a", code=1)
        self.assertEqual(failed["status"], "retry-scheduled")
        self.assertEqual((failed["record"]["state"], failed["record"]["attempts"]), ("planned", 1))
        self.assertIn("exit status 1", failed["record"]["last_error"])
        advice = self.next(code=None)
        self.assertIn("attempt 1 of 30 failed", " ".join(advice["notes"]) + advice["next_action"])
        self.write("ready", "")
        time.sleep(0.25)  # the contract's retry delay: not a timing assertion, the wait the contract asks for
        ran = self.cli_json("exec", self.store, "t1", "append-a")
        self.assertEqual((ran["record"]["state"], ran["record"]["attempts"]), ("verified", 2))
        self.assertEqual(self.lines(), ["a"])

    def test_the_contracts_attempt_budget_ends_the_task_when_a_command_keeps_failing(self) -> None:
        self.contract_text = self.contract_text.replace('command = "echo a >> target.txt"', 'command = "exit 3"').replace(
            "max_attempts = 30", "max_attempts = 2"
        )
        self.write("run-contract.toml", self.contract_text)
        self.init()
        self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", self.write("notes.txt", "plan\n"))
        failed = self.cli_json("exec", self.store, "t1", "append-a", code=1)
        self.assertEqual((failed["status"], failed["record"]["attempts"]), ("retry-scheduled", 1))
        time.sleep(0.25)  # the contract's retry delay: the wait it asks for, not a timing assertion
        ended = self.cli_json("exec", self.store, "t1", "append-a", code=4)
        self.assertEqual((ended["status"], ended["record"]["attempts"]), ("limits-exhausted", 2), "the last attempt failed: over")
        self.assertEqual(self.cli_json("exec", self.store, "t1", "append-a", code=4)["record"]["attempts"], 2, "no third attempt")
        advice = self.next(code=4)
        self.assertEqual((advice["kind"], advice["who"]), ("ended", "nobody"))

    def test_a_command_that_times_out_is_unknown_without_an_observe_command(self) -> None:
        self.contract_text = self.contract_text.replace(
            'command = "echo a >> target.txt"\nobserve = "test -f target.txt && grep -qx a target.txt"\n', ""
        )
        self.write("run-contract.toml", self.contract_text)
        self.init()
        self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", self.write("notes.txt", "plan\n"))
        command = ["sh", "-c", "echo a >> target.txt; sleep 30"]
        stopped = self.cli_json("exec", self.store, "t1", "append-a", "--timeout", "0.5", "--", *command, code=1)
        self.assertEqual(stopped["status"], "unsafe-to-continue")
        self.assertIn("timeout", stopped["record"]["last_error"])
        advice = self.next(code=1)
        self.assertEqual((advice["kind"], advice["who"], advice["step"]), ("stop", "operator", "append-a"))
        self.assertIn("--observe CMD", advice["unblock"])
        settled = self.cli_json("exec", self.store, "t1", "append-a", "--observe", "grep -qx a target.txt", "--", *command)
        self.assertEqual(settled["record"]["state"], "verified", "observed applied: not run again")
        self.assertEqual(self.lines(), ["a"])

    def test_done_refuses_while_a_begun_step_is_not_recorded_even_if_the_evidence_is(self) -> None:
        self.contract_text = self.contract_text.replace(
            'evidence = ["notes", "append-a", "report", "append-b"]', 'evidence = ["notes"]'
        ).replace('command = "echo a >> target.txt"', 'command = "exit 3"')
        self.write("run-contract.toml", self.contract_text)
        self.init()
        self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", self.write("notes.txt", "plan\n"))
        self.assertEqual(self.cli_json("exec", self.store, "t1", "append-a", code=1)["status"], "retry-scheduled")
        revision = self.revision()
        code, out, err = self.cli("done", self.store, "t1")
        self.assertEqual(code, 1, out + err)
        self.assertIn("append-a", err)
        self.assertEqual(self.revision(), revision)

    def test_cancellation_ends_the_session(self) -> None:
        self.init()
        self.assertEqual(self.cli("cancel", self.store, "t1", "--reason", "not needed")[0], 0)
        self.assertEqual(self.next(code=4)["kind"], "ended")
        self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", self.write("notes.txt", "p\n"))
        ended = self.cli_json("exec", self.store, "t1", "append-a", code=4)
        self.assertEqual(ended["status"], "cancelled")
        self.assertEqual(self.lines(), [])
        self.assertEqual((self.next(code=4)["kind"]), "ended")

    def test_done_refuses_while_evidence_is_missing_and_warns_of_changed_files(self) -> None:
        self.init()
        end = self.follow_until_done_is_next()
        self.assertEqual(end["kind"], "done")
        with open(os.path.join(self.work, "notes.txt"), "a") as handle:
            handle.write("edited after the checkpoint\n")
        done = self.cli_json("done", self.store, "t1")
        self.assertEqual(done["status"], "done")
        self.assertTrue(any("notes.txt changed since it was recorded" in note for note in done["notes"]), done["notes"])

    def follow_until_done_is_next(self) -> dict[str, Any]:
        for _ in range(30):
            action = self.next(code=None)
            if action["kind"] == "done":
                return action
            if action["who"] == "operator":
                self.cli_json("approve", self.store, "t1", "--step", action["step"], "--yes")
                continue
            for command in action["commands"]:
                if command[0] == "longrun":
                    self.cli(*command[1:])
                else:
                    subprocess.run(command, cwd=action["cwd"], check=True)
        raise AssertionError("done never came next")

    def test_ls_and_status_show_the_next_action_in_words(self) -> None:
        self.init()
        code, out, _ = self.cli("ls", self.store, "--json")
        listing = json.loads(out)
        self.assertEqual((code, listing[0]["status"]), (0, "running"))
        self.assertIn("do step `notes`", listing[0]["next_action"])
        text = self.cli("status", self.store, "t1")[1]
        self.assertIn("contract", text)


class ConcurrencyTests(SessionCase):
    contract_text = SessionCase.contract_text.replace(
        'command = "echo a >> target.txt"', 'command = "touch started; while [ ! -f go ]; do sleep 0.02; done; echo a >> target.txt"'
    )

    def test_a_second_exec_on_the_task_is_already_running(self) -> None:
        self.init()
        self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", self.write("notes.txt", "plan\n"))
        first = subprocess.Popen(
            [sys.executable, "-m", "longrun", "exec", self.store, "t1", "append-a", "--json"],
            env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            while not os.path.exists(os.path.join(self.work, "started")):
                self.assertIsNone(first.poll(), "the first exec ended early")
                time.sleep(0.02)
            second = self.cli_json("exec", self.store, "t1", "append-a", code=1)
            self.assertEqual(second["status"], "already-running")
            advice = self.next(code=1)
            self.assertEqual((advice["kind"], advice["who"]), ("wait", "time"))
        finally:
            self.write("go", "")
            out, err = first.communicate(timeout=60)
        self.assertEqual(first.returncode, 0, err)
        self.assertEqual(json.loads(out)["record"]["state"], "verified")
        self.assertEqual(self.lines(), ["a"])

    def test_a_lease_holder_is_gone_only_if_its_process_is(self) -> None:
        import socket

        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait()
        host = socket.gethostname()
        gone = Lease("t", f"{host}:{child.pid}:ab", 1, 0.0, 1.0)
        self.assertTrue(holder_gone(gone))
        self.assertFalse(holder_gone(Lease("t", f"{host}:{os.getppid()}:ab", 1, 0.0, 1.0)), "a live process")
        self.assertFalse(holder_gone(Lease("t", f"elsewhere:{child.pid}:ab", 1, 0.0, 1.0)), "another machine")
        self.assertFalse(holder_gone(Lease("t", "operator-label", 1, 0.0, 1.0)))


class OtherStoreTests(FollowNext):
    def test_a_session_on_sqlite(self) -> None:
        spec = "sqlite:" + os.path.join(self.work, "tasks.db")
        self.cli_json("init", spec, "t1", "--contract", self.contract, "--create-store")
        self.assertEqual(self.follow(store=spec)["kind"], "finished")
        self.assertEqual(self.lines(), ["a", "b"])
        self.assertEqual(self.cli_json("verify", spec, "t1")["verdict"], "finished")

    def test_a_session_on_postgresql(self) -> None:
        from helpers import pg_support

        pg_support.check("psycopg")  # the URL carries the schema as a libpq option, which pg8000 cannot take
        schema = pg_support.Schema("psycopg", prefix="lr_session")
        self.addCleanup(schema.drop)
        spec = schema.spec
        self.cli_json("init", spec, "t1", "--contract", self.contract, "--create-store")
        self.assertEqual(self.follow(store=spec)["kind"], "finished")
        self.assertEqual(self.lines(), ["a", "b"])


class ArgumentFuzzTests(SessionCase):
    def test_odd_arguments_get_an_exit_code_never_a_traceback(self) -> None:
        import random

        self.init()
        self.write("notes.txt", "plan\n")
        rng = random.Random(4242)
        weird = [
            "", "\x00", "a\x00b", "x" * 5000, "../..", "/", "-", "--", "nan", "inf", "-1", "0", "1e400", "3600",
            "\udcff", "ünï", "*", "t1", "notes", "append-a", "decision-1", "\n", "a\x01b", "--json", "-y",
            os.path.join(self.work, "notes.txt"), self.contract,
        ]  # fmt: skip
        options = {
            "init": ["--contract", "--create-store"],
            "exec": ["--observe", "--timeout", "--approval"],
            "checkpoint": ["--evidence", "--note"],
            "stop": ["--reason"],
        }
        # Relative names land in the temporary directory; no store outside it (init --create-store may make one).
        stores = [name for name in weird if name not in ("/", "../..") and not os.path.isabs(name)]
        self.addCleanup(os.chdir, os.getcwd())
        os.chdir(self.work)
        for case in range(FUZZ_CASES):
            command = rng.choice(["init", "next", "exec", "checkpoint", "done", "stop"])
            argv = [command, self.store if rng.random() < 0.8 else rng.choice(stores), "t1" if rng.random() < 0.7 else rng.choice(weird)]
            if command in ("exec", "checkpoint"):
                argv.append(rng.choice(["notes", "append-a", "report", *weird]))
            for _ in range(rng.randint(0, 3)):
                option = rng.choice(options.get(command, ["--json"]))
                argv.append(option)
                if option not in ("--json", "--approval", "--create-store"):
                    argv.append(rng.choice(weird))
            if command == "exec" and rng.random() < 0.5:
                argv += ["--", *rng.sample(weird, rng.randint(1, 3))]
            with self.subTest(case=case, argv=repr(argv)[:300]):
                code, out, err = self.cli(*argv)
                self.assertIn(code, (0, 1, 2, 3, 4), err[-2000:])
                self.assertNotIn("Traceback", err)
        self.assertEqual(self.lines(), [], "no odd command reached the target")

    def test_a_command_that_cannot_be_given_to_a_program_is_refused_before_anything_is_recorded(self) -> None:
        self.contract_text = self.contract_text.replace('command = "echo a >> target.txt"\n', "", 1)
        self.write("run-contract.toml", self.contract_text)
        self.init()
        self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", self.write("notes.txt", "plan\n"))
        revision = self.revision()
        for command in (["sh", "-c", "echo a\x00b"], ["echo", "\udcff"], [""]):
            with self.subTest(command=command):
                code, out, err = self.cli("exec", self.store, "t1", "append-a", "--", *command)
                self.assertEqual(code, 2, out + err)
        self.assertEqual(self.revision(), revision)
        ran = self.cli_json("exec", self.store, "t1", "append-a", "--", "sh", "-c", "echo a >> target.txt")
        self.assertEqual(ran["record"]["state"], "verified")


class BadContractTests(SessionCase):
    def test_a_bad_contract_creates_nothing(self) -> None:
        cases = {
            "missing goal": self.contract_text.replace('goal = "two lines land in target.txt exactly once each, with notes and a report"\n', ""),
            "allowed and forbidden": self.contract_text.replace('forbidden = ["delete"]', 'forbidden = ["delete", "append"]'),
            "duplicate step ids": self.contract_text.replace('id = "report"', 'id = "notes"'),
            "unknown key": self.contract_text.replace("[limits]\n", "[limits]\nmax_cost = 5\n"),
        }
        for name, text in cases.items():
            with self.subTest(name):
                path = self.write("bad.toml", text)
                code, out, err = self.cli("init", self.store, "t1", "--contract", path, "--create-store")
                self.assertEqual(code, 2, out + err)
                self.assertRegex(err, r"^longrun init: error: bad\.toml, line \d+: ")
                self.assertFalse(os.path.exists(self.store), "nothing is created")


if __name__ == "__main__":
    unittest.main()
