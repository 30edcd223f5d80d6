"""``longrun mcp`` under SIGKILL: the server and the command it runs are killed at random points, 10 times
(20 under ``LONGRUN_TEST_SCALE=full``), and restarted with nothing but the store; every command runs once and the task ends ``done``.

A scripted agent in this process speaks MCP to the server in JSON lines and only follows
``longrun_next``. Each life, the server is killed one of three ways (fixed seed): at a named crash
point of the tool call it serves (``LONGRUN_CRASH_AT``: lease taken, state loaded, cancellation read,
intent durable, command applied, state committed), while the command of an exec runs, or at a random
time. Every process the server started is killed with it (they carry a marker in their environment),
so a command never outlives its server. A person approves the step that needs it, from outside.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import unittest
from typing import Any

from helpers import scale
from helpers.mcp_support import McpCase, RawClient, ServerGone, run_work

SEED = 20261201
KILLS = scale.scaled(10, 20)
STEPS = 6
MARK = "LONGRUN_TEST_MCP_LIFE"
POINTS = {
    "exec": ["lease.acquired", "recovery.loaded", "cancellation.read", "effect.intent-persisted", "effect.applied", "state.committed"],
    "checkpoint": ["lease.acquired", "recovery.loaded", "state.committed"],
    "done": ["lease.acquired", "recovery.loaded", "cancellation.read", "state.committed"],
}


def marked(mark: str, *, commands_only: bool = False) -> list[int]:
    """Pids of live processes whose environment carries ``MARK=mark`` (a server of this test and what it started)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                items = handle.read().split(b"\0")
        except OSError:
            continue
        if needle in items and (not commands_only or any(item.startswith(b"LONGRUN_COMMAND_OF=") for item in items)):
            found.append(int(name))
    return found


def kill_all(mark: str) -> None:
    for _ in range(50):  # a process may fork while we kill: until none is left
        pids = marked(mark)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    raise AssertionError(f"processes of {mark} survive SIGKILL: {marked(mark)}")


@unittest.skipUnless(os.path.isdir("/proc/self"), "finding a server's commands needs /proc")
class ServerKillTests(McpCase):
    # Each command takes a moment, so that a kill can land while it runs; a killed holder's lease runs out quickly.
    contract_text = (
        McpCase.contract_text.replace("lease_ttl_s = 1\n", "lease_ttl_s = 0.5\n")
        .replace('command = "echo a >> target.txt"', 'command = "sleep 0.2; echo a >> target.txt"')
        .replace('command = "echo b >> target.txt"', 'command = "sleep 0.2; echo b >> target.txt"')
    )

    def life(self, rng: random.Random, number: int, advice: dict[str, Any], behind: bool) -> str | None:
        """One server's life under a scripted agent; how it was killed, or None if it was not."""
        mark = f"{self.tmp}:{number}"
        env = {**self.env(), MARK: mark, "LONGRUN_CRASH_TRACE": self.path("trace")}
        kind, step = advice["kind"], advice["step"]
        points = [point for point in POINTS.get(kind, []) if not behind or point != "state.committed"]
        how: str
        if kind == "exec" and step not in self.killed_running:
            how = "during-command"  # the first kill at each exec step: its command dies with the server
        elif kind == "exec" and step not in self.applied_at:
            how = "point:effect.applied"  # then right after the command ran, before its receipt is recorded
        elif points and (behind or rng.random() < 0.5):
            how = "point:" + rng.choice(points)
        elif kind == "exec" and rng.random() < 0.6:
            how = "during-command"
        else:
            how = f"after:{rng.uniform(0.05, 1.0):.3f}"
        if how.startswith("point:"):
            env["LONGRUN_CRASH_AT"] = how.removeprefix("point:") + ":1"
        client = RawClient(self.server_argv(), env=env, cwd=self.work, stderr=self.stderr_file())
        stop = threading.Event()
        killed: list[str] = []

        def killer() -> None:
            if how.startswith("after:"):
                if stop.wait(float(how.removeprefix("after:"))):
                    return
            elif how == "during-command":
                while not marked(mark, commands_only=True):
                    if stop.wait(0.005):
                        return
            else:
                return
            killed.append(how)
            kill_all(mark)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        gone = False
        try:
            client.initialize()
            self.agent(client, steps=1)  # one step a life: the kills spread over the whole task
        except ServerGone:
            gone = True
        finally:
            stop.set()
            thread.join()
        if not gone and not killed:
            self.assertEqual(client.close(), 0, self.server_log())
            return None
        client.process.wait(timeout=60)
        kill_all(mark)  # the server killed itself at a crash point: its command goes too
        client.close()
        returncode = client.process.returncode
        self.assertEqual(returncode, -signal.SIGKILL, f"the server ended by itself ({returncode}): {self.server_log()}")
        if how == "point:effect.applied":
            self.applied_at.add(str(step))
        if killed == ["during-command"]:
            self.killed_running.add(str(step))
        return killed[0] if killed else how

    def agent(self, client: RawClient, *, steps: int = 100) -> None:
        """Follow ``longrun_next`` through the tools for ``steps`` steps, or until it is not the agent's turn."""
        for _ in range(steps):
            advice = client.call("longrun_next")["structuredContent"]
            if advice["who"] != "agent":
                return
            suggested = advice["tool"]
            self.assertIsNotNone(suggested, advice)
            if suggested["name"] == "longrun_checkpoint":
                for command in advice["commands"]:
                    if command[:2] != ["longrun", "checkpoint"]:
                        run_work(command, advice["cwd"], self.env())
            result = client.call(suggested["name"], suggested["arguments"])
            self.assertLess(result["structuredContent"]["exit_code"], 2, result["content"][0]["text"])
        if steps == 100:
            raise AssertionError("the agent never stopped")

    def test_the_server_killed_again_and_again_with_its_commands_every_command_runs_once_and_the_task_ends_done(self) -> None:
        self.init()
        rng = random.Random(SEED)
        self.applied_at: set[str] = set()
        self.killed_running: set[str] = set()
        kills: dict[str, int] = {}
        approvals = lives = 0
        while True:
            lives += 1
            self.assertLess(lives, 300, f"the agent keeps stopping short: {self.server_log()}")
            advice = self.next(code=None)
            if advice["kind"] == "finished":
                break
            if advice["who"] == "operator":
                self.assertIn("longrun approve", advice["unblock"], advice)
                self.cli_json("approve", self.store, "t1", "--step", advice["step"], "--yes")  # a person, from outside
                approvals += 1
                continue
            if advice["who"] == "time":
                time.sleep(float(advice["retry_after_s"] or 0.2))
                continue
            self.assertEqual(advice["who"], "agent", advice)
            total = sum(kills.values())
            progress = len(advice["recorded"])
            ahead = total >= KILLS * (progress + 2) / (STEPS + 1)  # keep kills for the steps still to come
            owed = advice["kind"] == "exec" and not {advice["step"]} <= self.killed_running & self.applied_at
            if total >= KILLS or (ahead and not owed):
                client = RawClient(self.server_argv(), env=self.env(), cwd=self.work, stderr=self.stderr_file())
                client.initialize()
                self.agent(client, steps=1)
                self.assertEqual(client.close(), 0, self.server_log())
                continue
            behind = total < KILLS * (progress + 1) / (STEPS + 1)
            how = self.life(rng, lives, advice, behind)
            if how is not None:
                kind = how.split(":")[0] if not how.startswith("point:") else how
                kills[kind] = kills.get(kind, 0) + 1
        self.assertEqual(sum(kills.values()), KILLS, kills)
        self.assertEqual(self.killed_running, {"append-a", "append-b"}, "each command was killed while it ran, with its server")
        self.assertEqual(self.applied_at, {"append-a", "append-b"}, "each command's server was killed right after it applied")
        self.assertEqual(approvals, 1, "one approval, asked once, used once")
        self.assertEqual(self.lines(), ["a", "b"], f"every command ran exactly once (kills: {kills})")
        status = self.cli_json("status", self.store, "t1")
        self.assertEqual(status["status"], "done")
        self.assertTrue(all(record["state"] == "verified" for record in status["effects"]))
        self.assertEqual(self.cli_json("verify", self.store, "t1")["verdict"], "finished")


if __name__ == "__main__":
    unittest.main()
