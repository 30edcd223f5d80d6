"""Durable functions killed with SIGKILL: an agent loop resumed until done applies each effect once.

The agent (tests/helpers/durable_child.py) asks a nondeterministic fake model what to do until it says it
is done; its tools make effects through ``OutboxAdapter``; its last mail waits for an approval.
Processes are killed at named crash points (as ``LONGRUN_CRASH_AT`` does) and by a signal from
outside after a random delay, then the task is resumed until done. Afterwards:

- every effect the final state records is applied exactly once at the target, and nothing else;
- every effect's payload is what the *recorded* model answer asked for;
- a model call was repeated only for a step whose record had not been committed when the
  process died (after its ``call.returned``, the process traced no ``state.committed``), so the
  calls number at most the steps plus the kills.

Most processes are forked from a server process (``durable_child.py serve``), which arms the
crash points exactly as the environment would: a hundred kills then cost a fraction of a
second each instead of an interpreter start. The tasks are independent, each in its own store
directory and work directory, and a few are driven at once (``forked.concurrently``), one server
each. One test runs the script the plain way.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import unittest
from collections import Counter, defaultdict
from typing import Any

from helpers import forked, scale, support
from longrun import Approval, EffectState, JsonFileStore, SqliteStore, Store
from longrun.testing import read_outbox

CHILD = os.path.join(support.HELPERS, "durable_child.py")
RANDOM_KILLS = scale.scaled(30, 100)
"""The random kills per store: 100 under ``LONGRUN_TEST_SCALE=full``."""
KILLED = forked.KILLED

# The crash points passed through inside run.effect and run.call (and around them).
POINTS = (
    "recovery.loaded",
    "cancellation.read",
    "call.started",
    "call.returned",
    "attempt.incremented",
    "effect.intent-persisted",
    "effect.applied",
    "approval.consumed",
    "state.committed",
)
# After the approval every call is recorded: only the summary mail and the finish remain.
POINTS_AFTER_APPROVAL = tuple(point for point in POINTS if not point.startswith("call."))
RANDOM_POINTS = (*POINTS, "lease.acquired")


class DurableCrashCase(support.TempDirTest):
    kind = "json"

    def setUp(self) -> None:
        super().setUp()
        self.runs: Counter[str] = Counter()
        self.kills: Counter[str] = Counter()
        self.counting = threading.Lock()
        """Held while ``kills`` changes or is summed: the tasks run in threads."""
        self.servers = forked.Servers(self, CHILD, self.path("server.err"))

    # -- running the agent ----------------------------------------------------------------------

    def root(self, task: str) -> str:
        """The task's store directory: each task has its own, so that tasks can run at once."""
        return self.path("stores", task)

    def work(self, task: str) -> str:
        """The task's work directory (its outbox, model calls, traces)."""
        work = self.path("work", task)
        if not os.path.isdir(work):
            os.makedirs(os.path.join(work, "trace"))
            os.makedirs(self.root(task))
        return work

    def store(self, task: str) -> Store:
        if self.kind == "json":
            return JsonFileStore(self.root(task), create=True)
        store = SqliteStore(os.path.join(self.root(task), "longrun.sqlite"), create=True)
        self.addCleanup(store.close)
        return store

    def total_kills(self) -> int:
        with self.counting:
            return sum(self.kills.values())

    def label(self, task: str) -> str:
        self.runs[task] += 1
        return f"{task}.{self.runs[task]}"

    def run_agent(
        self, task: str, seed: int, max_tools: int, *, crash_at: str | None = None, kill_after_s: float | None = None
    ) -> tuple[int, Any]:
        """One run in a forked process. Each run's clock is 100 s past the previous one's, so a
        killed run's 30 s lease has expired for the next without a wait."""
        label = self.label(task)
        work = self.work(task)
        request = {
            "kind": self.kind, "root": self.root(task), "work": work, "task": task, "seed": seed, "max_tools": max_tools,
            "later": 100.0 * self.runs[task], "label": label, "crash_at": crash_at, "kill_after_s": kill_after_s,
            "trace": os.path.join(work, "trace", label),
        }
        reply = self.servers.run(request, f"run {label}")
        if reply["exit"] == KILLED:
            with self.counting:
                self.kills[task] += 1
        return reply["exit"], reply["outcome"]

    def approve(self, task: str) -> None:
        """What ``longrun approve`` does for the pending summary mail."""
        store = self.store(task)
        state = store.load(task).state
        assert state is not None
        request = state.approval_requests["summary"]
        store.write_approval(
            Approval.for_request(
                request, approval_id=f"ok-{task}", approver="tester", granted_at=request.requested_at, expires_at=request.expires_at
            )
        )

    def drive(self, task: str, seed: int, arm: Any = None, *, max_tools: int = 4, max_runs: int = 60) -> tuple[dict, bool]:
        """Run ``task`` until done, approving the summary when asked. ``arm(phase)`` gives each run's
        ``(crash_at, kill_after_s)``; phase 1 is before the approval, 2 after. Returns the final
        outcome and whether any run was killed."""
        approved = False
        killed = False
        for _ in range(max_runs):
            crash_at, kill_after_s = arm(2 if approved else 1) if arm is not None else (None, None)
            code, outcome = self.run_agent(task, seed, max_tools, crash_at=crash_at, kill_after_s=kill_after_s)
            if code == KILLED:
                killed = True
                continue
            if outcome["status"] == "awaiting-approval" and not approved:
                self.approve(task)
                approved = True
                continue
            self.assertEqual(outcome["status"], "done", f"{task}: {outcome['next_action']}")
            return outcome, killed
        self.fail(f"{task} did not finish in {max_runs} runs")

    # -- what must hold afterwards --------------------------------------------------------------

    def check(self, task: str, outcome: dict) -> None:
        store = self.store(task)
        state = store.load(task).state
        assert state is not None
        effects = state.effects
        tools = outcome["result"]["tools"]
        self.assertTrue(all(record.state is EffectState.VERIFIED for record in effects.values()), task)
        # Each recorded effect exactly once at the target, and nothing else of this task.
        expected = {f"{task}/tool/{i}": 1 for i in range(tools)} | {f"{task}/summary": 1}
        applied = Counter(line["key"] for line in read_outbox(os.path.join(self.work(task), "outbox.jsonl")) if line["task_id"] == task)
        self.assertEqual(applied, expected, task)
        # The effects did what the recorded answers said.
        notes = []
        for i in range(tools):
            answer = effects[f"model/{i}"].result
            self.assertFalse(answer["done"], task)
            self.assertEqual((effects[f"tool/{i}"].action, effects[f"tool/{i}"].payload), (answer["tool"], {"text": answer["text"]}))
            notes.append(answer["text"])
        self.assertTrue(effects[f"model/{tools}"].result["done"], task)
        self.assertEqual(effects["summary"].payload, {"notes": notes}, task)
        self.assertEqual(outcome["result"], {"tools": tools, "notes": notes}, task)
        self.check_calls(task, tools)

    def check_calls(self, task: str, tools: int) -> None:
        callers: dict[int, list[str]] = defaultdict(list)
        with open(os.path.join(self.work(task), "calls")) as handle:
            for line in handle:
                name, step, label = line.split()
                if name == task:
                    callers[int(step)].append(label)
        self.assertEqual(sorted(callers), list(range(tools + 1)), f"{task}: every recorded step called, no other")
        for step, labels in callers.items():
            for earlier, later in zip(labels, labels[1:]):
                self.assertNotEqual(earlier, later, f"{task}: model/{step} called twice in one process")
                self.assertFalse(
                    self.committed_after_return(task, earlier, f"model/{step}"),
                    f"{task}: model/{step} was called again by {later} after {earlier} had committed its record",
                )
        total = sum(len(labels) for labels in callers.values())
        self.assertLessEqual(total, tools + 1 + self.kills[task], task)

    def committed_after_return(self, task: str, label: str, step_id: str) -> bool:
        """Whether process ``label`` traced a commit after its call of ``step_id`` returned."""
        with open(os.path.join(self.work(task), "trace", label)) as handle:
            trace = [line.split() for line in handle]
        returned = [i for i, hit in enumerate(trace) if hit[0] == "call.returned" and hit[2].rpartition("#")[0] == step_id]
        return bool(returned) and any(hit[0] == "state.committed" for hit in trace[returned[-1] + 1 :])

    # -- the tests ------------------------------------------------------------------------------

    def test_killed_at_every_crash_point_in_effects_and_calls_then_resumed(self) -> None:
        """For each point and each phase (before the approval, after it), kill the first run of
        the phase at the point's N-th pass, for N = 1, 2, ... until the run gets through. Seed 0:
        the model asks for three tools unless a kill makes it answer a step again."""
        def every_pass(phase_point: tuple[int, str]) -> int:
            """Kill at the point's 1st, 2nd, ... pass until a run gets through; how many kills fired."""
            phase, point = phase_point
            occurrence = 1
            while True:
                task = f"p{phase}-{point}-{occurrence}"
                armed = {phase: f"{point}:{occurrence}"}
                outcome, killed = self.drive(task, seed=0, arm=lambda current: (armed.pop(current, None), None))
                self.check(task, outcome)
                if not killed:
                    return occurrence - 1
                occurrence += 1

        cases = [(1, point) for point in POINTS if point != "approval.consumed"] + [(2, point) for point in POINTS_AFTER_APPROVAL]
        fired: Counter[str] = Counter()
        for (phase, point), kills in zip(cases, forked.concurrently(every_pass, cases)):
            fired[f"{point}@{phase}"] = kills
        if os.environ.get("LONGRUN_CRASH_REPORT"):
            print(f"\n{self.kind}: kills per point@phase: {dict(sorted(fired.items()))}", file=sys.stderr)
        for point in POINTS:
            self.assertGreater(fired[f"{point}@1"] + fired[f"{point}@2"], 0, f"{point} never fired: {fired}")
        self.assertGreaterEqual(fired["state.committed@1"], 5, fired)
        self.assertGreaterEqual(fired["call.returned@1"], 2, fired)

    def test_random_kills_still_apply_every_effect_once(self) -> None:
        """Longer loops killed at random: a random point's N-th pass, or a SIGKILL from outside
        after a random delay (anywhere: inside a store write, the model, the adapter); ``RANDOM_KILLS``
        kills in all."""
        def numbers() -> Any:
            """Task numbers until the ended tasks were killed ``RANDOM_KILLS`` times."""
            number = 0
            while self.total_kills() < RANDOM_KILLS:
                number += 1
                yield number

        def one_task(number: int) -> None:
            rng = random.Random(f"20261130-{number}")  # each task its own choices, whatever runs beside it
            task = f"random-{number}"
            armed_runs = rng.randint(4, 16)  # then it runs unarmed until done

            def arm(phase: int) -> tuple[str | None, float | None]:
                nonlocal armed_runs
                if armed_runs <= 0:
                    return None, None
                armed_runs -= 1
                if rng.random() < 0.75:
                    return f"{rng.choice(RANDOM_POINTS)}:{rng.randint(1, 4)}", None
                return None, rng.uniform(0.0, 0.05)

            outcome, _ = self.drive(task, seed=number, arm=arm, max_tools=12)
            self.check(task, outcome)

        for _ in forked.concurrently(one_task, numbers()):
            pass
        self.assertGreaterEqual(self.total_kills(), RANDOM_KILLS)


class JsonFileStoreCrashTests(DurableCrashCase):
    kind = "json"

    def test_the_script_run_plainly_with_LONGRUN_CRASH_AT(self) -> None:
        """The one-run mode, killed through the environment as a worker would be, then resumed."""
        task = "plain"

        def run(*extra: str, crash_at: str | None = None) -> tuple[int, Any]:
            label = self.label(task)
            env = support.child_env()
            env["LONGRUN_CRASH_TRACE"] = os.path.join(self.work(task), "trace", label)
            if crash_at:
                env["LONGRUN_CRASH_AT"] = crash_at
            command = [sys.executable, CHILD, "run", self.kind, self.root(task), self.work(task), task, "3"]
            command += ["--later", str(100.0 * self.runs[task]), "--label", label]
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
            if result.returncode == KILLED:
                self.kills[task] += 1
            return result.returncode, json.loads(result.stdout) if result.stdout.strip() else None

        self.assertEqual(run(crash_at="call.returned:1")[0], KILLED)
        self.assertEqual(run(crash_at="effect.applied:1")[0], KILLED)
        code, outcome = run()
        self.assertEqual((code, outcome["status"]), (0, "awaiting-approval"))
        self.approve(task)
        self.assertEqual(run(crash_at="effect.applied:1")[0], KILLED)
        code, outcome = run()
        self.assertEqual((code, outcome["status"]), (0, "done"))
        self.check(task, outcome)


class SqliteStoreCrashTests(DurableCrashCase):
    kind = "sqlite"


del DurableCrashCase  # only its subclasses run


if __name__ == "__main__":
    unittest.main()
