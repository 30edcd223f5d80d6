"""Child tasks: a parent SIGKILLed after its child finished but before it recorded the result
resumes without running the child's effects again, and the child's record names its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from helpers import support
from longrun import JsonFileStore
from longrun.testing import OutboxAdapter

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

FAMILY = textwrap.dedent(
    """
    import os, sys, longrun
    from longrun.testing import OutboxAdapter
    ROOT = sys.argv[1]
    store = longrun.JsonFileStore(os.path.join(ROOT, "store"), create=True)
    adapters = {"send": OutboxAdapter(os.path.join(ROOT, "outbox.jsonl"))}

    @longrun.durable(store=store, adapters=adapters)
    def child(run, n):
        for i in range(n):
            run.effect(f"send/{i}", "send", {"i": i})
        return {"sent": n}

    @longrun.durable(store=store, adapters=adapters)
    def parent(run):
        done = run.child("kid-1", child, 3)
        run.effect("report", "send", {"child": done})
        return done

    if __name__ == "__main__":
        outcome = parent.run("parent-1")
        print(outcome.status.value, outcome.result)
    """
)


class ChildCrashTests(support.TempDirTest):
    def run_family(self, crash_at: str = "") -> subprocess.CompletedProcess[str]:
        script = self.path("family.py")
        with open(script, "w") as handle:
            handle.write(FAMILY)
        env = {**os.environ, "PYTHONPATH": SRC}
        env.pop("LONGRUN_CRASH_AT", None)
        if crash_at:
            env["LONGRUN_CRASH_AT"] = crash_at
        return subprocess.run(
            [sys.executable, script, self.path("")], capture_output=True, text=True, env=env, timeout=60, check=False
        )

    def test_a_parent_killed_after_its_child_returned_resumes_without_repeating_the_child(self) -> None:
        killed = self.run_family("child.returned:1")
        self.assertEqual(killed.returncode, -signal.SIGKILL, killed.stdout + killed.stderr)
        counts = OutboxAdapter(self.path("outbox.jsonl")).counts()
        self.assertEqual(counts, {f"kid-1/send/{i}": 1 for i in range(3)}, "the child finished before the kill")
        resumed = self.run_family()
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        self.assertEqual(resumed.stdout.split()[0], "done")
        counts = OutboxAdapter(self.path("outbox.jsonl")).counts()
        self.assertEqual(counts, {**{f"kid-1/send/{i}": 1 for i in range(3)}, "parent-1/report": 1}, "nothing applied twice")
        store = JsonFileStore(self.path("store"))
        child_state = store.load("kid-1").state
        parent_state = store.load("parent-1").state
        assert child_state is not None and parent_state is not None
        self.assertEqual(child_state.effects["longrun.function"].payload.get("parent"), "parent-1", "the child names its parent")
        self.assertEqual(parent_state.effects["longrun.child:kid-1"].result, {"sent": 3}, "the parent names the child")



class PlanDigestTests(support.TempDirTest):
    def test_the_digest_an_approval_binds_to_is_known_before_the_first_run(self) -> None:
        import longrun

        store = JsonFileStore(self.path("store"), create=True)

        @longrun.durable(store=store, adapters={"send": OutboxAdapter(self.path("outbox.jsonl"))})
        def greet(run: longrun.Run, name: str) -> str:
            run.effect("hello", "send", {"to": name})
            return name

        before = greet.plan_digest("g1", "ann")
        self.assertNotEqual(before, greet.plan_digest("g1", "bob"), "the arguments are pinned")
        self.assertEqual(greet.run("g1", "ann").status, longrun.Status.DONE)
        state = store.load("g1").state
        assert state is not None
        self.assertEqual(state.plan_digest, before)

if __name__ == "__main__":
    import unittest

    unittest.main()
