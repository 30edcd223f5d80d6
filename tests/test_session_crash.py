"""Checkpointed sessions under SIGKILL: an exec observes instead of running twice; an agent with no memory finishes.

Real processes are killed: at named crash points inside ``longrun exec``, the runner alone while its
command runs on, and a scripted agent (``scripted_agent.sh``: it only runs ``longrun next --json``
and does what it says) killed with its whole process group at random moments (fixed seed), 10
times (30 under ``LONGRUN_TEST_SCALE=full``), restarted each time with nothing but the store.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import unittest
from typing import IO

from helpers import scale, support
from helpers.cli_process import run_longrun
from helpers.session_support import SessionCase


AGENT = os.path.join(support.HELPERS, "scripted_agent.sh")
SEED = 20261130
KILLS = scale.scaled(10, 30)
STEPS = 6
EXEC_STEPS = {"append-a", "append-b"}
"""The steps whose command is an effect: each is killed once right after its command applied."""
POINTS = {
    "exec": ["lease.acquired", "recovery.loaded", "cancellation.read", "effect.intent-persisted", "effect.applied", "state.committed"],
    "checkpoint": ["lease.acquired", "recovery.loaded", "state.committed"],
    "done": ["lease.acquired", "recovery.loaded", "cancellation.read", "state.committed"],
}
"""The named points (``longrun._crashpoints``) each kind of command passes, that a kill may aim at."""


def _kill(agent: subprocess.Popen[bytes]) -> None:
    """SIGKILL the agent's process group: the agent, its longrun command and that command's children."""
    os.killpg(agent.pid, signal.SIGKILL)
    agent.wait()
    return None


class CrashPointTests(SessionCase):

    def longrun(self, *args: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
        env = self.env()
        if crash_at is not None:
            env["LONGRUN_CRASH_AT"] = crash_at
        return run_longrun(args, env=env, cwd=None)  # a process of its own, forked: the crash point SIGKILLs it

    def ready_for_append_a(self) -> None:
        self.init()
        self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", self.write("notes.txt", "plan\n"))

    def test_killed_after_the_intent_is_durable_the_command_runs_once_on_the_next_exec(self) -> None:
        self.ready_for_append_a()
        killed = self.longrun("exec", self.store, "t1", "append-a", crash_at="effect.intent-persisted:1")
        self.assertEqual(killed.returncode, -signal.SIGKILL, killed.stderr)
        self.assertEqual(self.lines(), [], "killed before the command started")
        advice = self.next(code=0)
        self.assertEqual((advice["kind"], advice["step"]), ("exec", "append-a"))
        self.assertIn("was interrupted", advice["next_action"])
        self.assertIn("observes first", advice["next_action"])
        again = self.cli_json("exec", self.store, "t1", "append-a")
        self.assertEqual((again["record"]["state"], again["record"]["attempts"]), ("verified", 2))
        self.assertEqual(self.lines(), ["a"])

    def test_killed_after_the_command_ran_the_next_exec_observes_and_does_not_run_it_again(self) -> None:
        self.ready_for_append_a()
        killed = self.longrun("exec", self.store, "t1", "append-a", crash_at="effect.applied:1")
        self.assertEqual(killed.returncode, -signal.SIGKILL, killed.stderr)
        self.assertEqual(self.lines(), ["a"])
        again = self.cli_json("exec", self.store, "t1", "append-a")
        self.assertEqual((again["record"]["state"], again["record"]["attempts"]), ("verified", 1), "observed, not run again")
        self.assertIn("grep -qx a target.txt` exited 0", again["record"]["evidence"])
        self.assertEqual(self.lines(), ["a"])

    def test_without_an_observe_command_an_interrupted_command_stops_the_task_until_someone_can_tell(self) -> None:
        self.contract_text = self.contract_text.replace('observe = "test -f target.txt && grep -qx a target.txt"\n', "", 1)
        self.write("run-contract.toml", self.contract_text)
        self.ready_for_append_a()
        self.assertEqual(self.longrun("exec", self.store, "t1", "append-a", crash_at="effect.applied:1").returncode, -signal.SIGKILL)
        interrupted = self.next(code=0)
        self.assertIn("no observe command", interrupted["next_action"])
        stopped = self.cli_json("exec", self.store, "t1", "append-a", code=1)
        self.assertEqual(stopped["status"], "unsafe-to-continue")
        advice = self.next(code=1)
        self.assertEqual((advice["kind"], advice["who"]), ("stop", "operator"))
        self.assertIn("--observe CMD", advice["unblock"])
        self.assertEqual(self.cli_json("exec", self.store, "t1", "append-a", code=1)["status"], "unsafe-to-continue", "never a guess")
        settled = self.cli_json("exec", self.store, "t1", "append-a", "--observe", "grep -qx a target.txt")
        self.assertEqual((settled["record"]["state"], settled["record"]["attempts"]), ("verified", 1))
        self.assertEqual(self.lines(), ["a"])


class OrphanTests(SessionCase):

    contract_text = SessionCase.contract_text.replace(
        'command = "echo a >> target.txt"', 'command = "touch started; while [ ! -f go ]; do sleep 0.02; done; echo a >> target.txt"'
    )

    def test_a_command_that_outlives_its_killed_runner_is_unknown_while_it_runs_never_absent(self) -> None:
        self.init()
        self.cli_json("checkpoint", self.store, "t1", "notes", "--evidence", self.write("notes.txt", "plan\n"))
        runner = subprocess.Popen(
            [sys.executable, "-m", "longrun", "exec", self.store, "t1", "append-a"],
            env=self.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            while not os.path.exists(os.path.join(self.work, "started")):
                self.assertIsNone(runner.poll())
                time.sleep(0.02)
            os.kill(runner.pid, signal.SIGKILL)  # the runner alone: its command runs on in its own process group
            runner.wait()
            stopped = self.cli_json("exec", self.store, "t1", "append-a", code=1)
            self.assertEqual(stopped["status"], "unsafe-to-continue")
            self.assertIn("is still running", stopped["record"]["evidence"])
            advice = self.next(code=1)
            self.assertEqual((advice["kind"], advice["who"]), ("wait", "time"))
        finally:
            self.write("go", "")
        for _ in range(500):  # the orphan sees "go" within 20 ms; the bound only keeps a broken test from hanging
            if self.next(code=None)["who"] == "agent":
                break
            time.sleep(0.05)
        settled = self.cli_json("exec", self.store, "t1", "append-a")
        self.assertEqual((settled["record"]["state"], settled["record"]["attempts"]), ("verified", 1))
        self.assertEqual(self.lines(), ["a"])


class ScriptedAgentTests(SessionCase):

    # A killed command's lease runs out after this; the next command waits for it (a shorter wait, a quicker test).
    contract_text = SessionCase.contract_text.replace("lease_ttl_s = 1\n", "lease_ttl_s = 0.5\n")
    def life(self, env: dict[str, str], rng: random.Random, kills: int, log: IO[bytes]) -> tuple[int | None, str | None]:
        """Start the agent and kill its process group at a random point: (None if it was killed, else
        its exit code; the named point the kill landed at, if any).

        Most kills aim at a named point (``longrun._crashpoints``) of the longrun command the agent
        runs next: lease taken, state loaded, cancellation read, intent durable, command applied,
        state committed. ``LONGRUN_CRASH_AT`` makes that longrun process SIGKILL itself exactly
        there; the harness, which sees the point in the trace (``LONGRUN_CRASH_TRACE``), then
        SIGKILLs the rest of the group. The other kills land at a random time. While fewer kills
        have landed than the task's progress warrants, no commit is aimed at, so all ``KILLS`` land
        before the end. The first kill at each exec step lands right after its command was applied,
        before the receipt is recorded: the hardest point for exactly once. The last kills are kept
        for that: once every kill left is owed to an exec step not yet killed so, the life is aimed
        at the next apply, which only an exec step makes."""
        advice = self.next(code=None)
        progress = len(advice["recorded"])
        behind = kills < KILLS * (progress + 1) / (STEPS + 1)
        points = [point for point in POINTS.get(advice["kind"], []) if not behind or point != "state.committed"]
        life_env = dict(env)
        target: tuple[bytes, bytes] | None = None
        first_at_exec = advice["kind"] == "exec" and advice["step"] not in self.applied_at
        owed = KILLS - kills <= len(EXEC_STEPS - self.applied_at)
        if owed or (points and (behind or first_at_exec or rng.random() < 0.7)):
            name = "effect.applied" if first_at_exec or owed else rng.choice(points)
            occurrence = rng.randint(1, 2) if name == "state.committed" and advice["kind"] == "exec" else 1
            life_env["LONGRUN_CRASH_AT"] = f"{name}:{occurrence}"
            target = (name.encode(), str(occurrence).encode())
        trace = env["LONGRUN_CRASH_TRACE"]
        offset = os.path.getsize(trace) if os.path.exists(trace) else 0
        agent = subprocess.Popen(
            ["sh", AGENT], cwd=self.work, env=life_env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
        if target is None:
            try:
                return agent.wait(timeout=rng.uniform(0.3, 1.0)), None
            except subprocess.TimeoutExpired:
                return _kill(agent), None
        # An apply aimed at from an earlier step is reached only after the agent has done the steps before it.
        deadline = time.monotonic() + (60.0 if target[0] == b"effect.applied" else 5.0)
        reached: list[bytes] | None = None
        while agent.poll() is None and time.monotonic() < deadline and reached is None:
            with open(trace, "a+b") as handle:
                handle.seek(offset)
                hits = [line.split() for line in handle.read().splitlines() if line.strip()]
            reached = next((hit for hit in hits if tuple(hit[:2]) == target), None)
            time.sleep(0.002)
        if agent.poll() is not None:
            return agent.returncode, None
        if reached is not None and target[0] == b"effect.applied":
            self.applied_at.add(reached[2].decode().rpartition("#")[0])  # the detail: STEP#ATTEMPT
        return _kill(agent), target[0].decode() if reached is not None else None

    def test_an_agent_killed_again_and_again_finishes_with_every_command_applied_once(self) -> None:
        self.init()
        rng = random.Random(SEED)
        env = {**self.env(), "STORE": self.store, "TASK": "t1", "PYTHON": sys.executable, "LONGRUN_CRASH_TRACE": self.path("trace")}
        log_path = self.path("agent.log")
        kills = approvals = lives = 0
        points: dict[str, int] = {}
        self.applied_at: set[str] = set()
        with open(log_path, "ab") as log:
            while True:
                lives += 1
                self.assertLess(lives, 300, "the agent keeps stopping short")
                if kills < KILLS:
                    code, point = self.life(env, rng, kills, log)
                    if code is None:
                        kills += 1
                        if point is not None:
                            points[point] = points.get(point, 0) + 1
                        continue
                else:
                    agent = subprocess.Popen(["sh", AGENT], cwd=self.work, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
                    code = agent.wait(timeout=120)
                if code == 0:
                    break
                self.assertEqual(code, 10, self.tail(log_path))
                advice = self.next(code=1)  # a person must act: the operator approves what is asked
                self.assertEqual(advice["who"], "operator", advice)
                self.assertIn("longrun approve", advice["unblock"])
                self.cli_json("approve", self.store, "t1", "--step", advice["step"], "--yes")
                approvals += 1
        self.assertEqual(kills, KILLS)
        self.assertEqual(self.applied_at, EXEC_STEPS, "each command was killed right after it applied, once")
        self.assertGreaterEqual(sum(points.values()), KILLS // 2, f"most kills land at named points: {points}")
        self.assertEqual(approvals, 1, "one approval, asked once, used once")
        self.assertEqual(self.lines(), ["a", "b"], "every command applied exactly once at the target")
        self.assertEqual(self.next(code=0)["kind"], "finished")
        status = self.cli_json("status", self.store, "t1")
        self.assertEqual(status["status"], "done")
        effects = {record["step_id"]: record for record in status["effects"]}
        self.assertTrue(all(record["state"] == "verified" for record in effects.values()))
        self.assertEqual(effects["report"]["payload"]["evidence"]["path"], os.path.join(self.work, "report.txt"))
        done = self.cli_json("done", self.store, "t1")
        self.assertIsNone(done["status"], "already done: done accepts the evidence and changes nothing")
        verify = self.cli_json("verify", self.store, "t1")
        self.assertEqual(verify["verdict"], "finished", verify)

    def tail(self, path: str) -> str:
        with open(path, "rb") as handle:
            return handle.read()[-3000:].decode("utf-8", "replace")


if __name__ == "__main__":
    unittest.main()
