"""A tool-using agent as a durable function: killed mid-run, resumed, approved, finished.

    python examples/agent_loop.py [--dir D]

The agent asks a model what to do next until the model says it is done, so the number of steps is
not known in advance. The model here is a stand-in that answers at random, as a real one may answer
differently each time it is asked; ``run.call`` records each answer, so a resumed agent replays the
decisions it already made instead of asking again. The tools send mail (appended to a local
mailbox file) and write files; each tool call is ``run.effect``, an entry in the effect ledger that
is observed at its target before anything is retried. The last step, mailing a summary, waits for
a person's approval.

``main()``: (1) a worker process runs the agent and is killed with SIGKILL right after its second
tool call reached its target, before the run could record it; (2) the agent runs again: it replays
the recorded answers, finds the interrupted tool call done at the target and does not repeat it,
and goes on until it asks for approval; (3) an operator approves with ``longrun approve``; (4) the
agent runs again and finishes; (5) running the finished task again does nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

try:
    import longrun
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    import longrun

from longrun import EffectRequest, JsonFileStore, Observation, Receipt

GOAL = "tell the team what changed in release 2.4"
TEAM = ("ana@example.com", "ben@example.com", "chen@example.com")
LEASE_TTL_S = 1.0  # short, so that the demo can take over from the killed worker quickly

# -- the model --------------------------------------------------------------------------------------


def ask_model(goal: str, history: list[str]) -> dict[str, Any]:
    """A stand-in for a language model: the next tool call, or ``{"tool": "done"}``. Unseeded, so
    asking twice may give two answers; it logs each call so the demo can count them."""
    with open(os.environ["AGENT_MODEL_LOG"], "a") as log:
        log.write(f"asked after {len(history)} tool calls\n")
    rng = random.Random()
    if len(history) >= 5 or (len(history) >= 2 and rng.random() < 0.4):
        return {"tool": "done"}
    if rng.random() < 0.5:
        to = rng.choice(TEAM)
        return {"tool": "mail.send", "args": {"to": to, "subject": "Release 2.4", "body": f"Hi {to.split('@')[0]}, {goal}."}}
    return {"tool": "file.write", "args": {"name": f"note-{len(history)}.md", "text": f"# Release 2.4\n\nNote {rng.randrange(1000)}\n"}}


# -- the tools' targets -----------------------------------------------------------------------------


def crash_point() -> None:
    """In the demo's worker, SIGKILL this process once the N-th tool call has reached its target."""
    left = os.environ.get("AGENT_CRASH_AFTER")
    if left is not None:
        os.environ["AGENT_CRASH_AFTER"] = str(int(left) - 1)
        if int(left) == 1:
            print("  [worker] a tool call reached its target; the worker dies before recording it", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


class Mailbox:
    """Sends mail by appending it to a mailbox file (a stand-in for a mail server). Each message
    carries the effect's key and payload digest, like a Message-ID, so ``observe`` can read back
    whether it was sent."""

    deduplicates = False

    def __init__(self, path: str):
        self.path = path

    def apply(self, request: EffectRequest) -> Receipt:
        message = {"key": request.key, "digest": request.payload_digest, **request.payload}
        with open(self.path, "a") as mailbox:
            mailbox.write(json.dumps(message) + "\n")
            mailbox.flush()
            os.fsync(mailbox.fileno())
        crash_point()
        return Receipt(result={"to": request.payload["to"]}, evidence=f"appended to {self.path}")

    def observe(self, request: EffectRequest) -> Observation:
        try:
            with open(self.path) as mailbox:
                sent = [json.loads(line) for line in mailbox]
        except FileNotFoundError:
            sent = []
        for message in sent:
            if message["key"] == request.key:
                if message["digest"] != request.payload_digest:
                    return Observation.unknown(f"{request.key} was sent with another payload")
                return Observation.applied(f"the mailbox holds {request.key}", {"to": message["to"]})
        return Observation.absent(f"no message {request.key} in the mailbox")


class Workspace:
    """Writes files in a directory (atomically). ``observe``: the file exists with this text."""

    deduplicates = False

    def __init__(self, directory: str):
        self.directory = directory

    def _path(self, request: EffectRequest) -> str:
        return os.path.join(self.directory, os.path.basename(str(request.payload["name"])))

    def apply(self, request: EffectRequest) -> Receipt:
        path = self._path(request)
        with open(path + ".tmp", "w") as handle:
            handle.write(str(request.payload["text"]))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(path + ".tmp", path)
        crash_point()
        return Receipt(result={"file": os.path.basename(path)}, evidence=f"wrote {path}")

    def observe(self, request: EffectRequest) -> Observation:
        path = self._path(request)
        try:
            with open(path, "rb") as handle:
                digest = hashlib.sha256(handle.read()).hexdigest()
        except FileNotFoundError:
            return Observation.absent(f"{path} does not exist")
        if digest != hashlib.sha256(str(request.payload["text"]).encode()).hexdigest():
            return Observation.unknown(f"{path} holds other text")
        return Observation.applied(f"{path} holds the text", {"file": os.path.basename(path)})


# -- the agent --------------------------------------------------------------------------------------


def make_agent(directory: str) -> longrun.DurableFunction[dict[str, Any]]:
    store = JsonFileStore(os.path.join(directory, "store"), create=True)
    os.makedirs(os.path.join(directory, "workspace"), exist_ok=True)
    tools: dict[str, longrun.EffectAdapter] = {
        "mail.send": Mailbox(os.path.join(directory, "mailbox.jsonl")),
        "file.write": Workspace(os.path.join(directory, "workspace")),
    }

    @longrun.durable(store=store, adapters=tools, allowed_actions=tuple(tools), lease_ttl_s=LEASE_TTL_S)
    def agent(run: longrun.Run, goal: str) -> dict[str, Any]:
        history: list[str] = []
        while True:
            decision = run.call(f"model/{len(history)}", ask_model, goal, history)
            if decision["tool"] == "done":
                break
            run.effect(f"tool/{len(history)}", decision["tool"], decision["args"])
            history.append(f"{decision['tool']} {json.dumps(decision['args'])}")
        summary = {"to": "lead@example.com", "subject": f"Done: {goal}", "body": "\n".join(history)}
        run.effect("send-summary", "mail.send", summary, approval=True)
        return {"tool_calls": len(history)}

    return agent


# -- the demo ---------------------------------------------------------------------------------------


def lines(path: str) -> list[str]:
    try:
        with open(path) as handle:
            return handle.read().splitlines()
    except FileNotFoundError:
        return []


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", help="where to keep the store, the mailbox and the files (default: a temporary directory)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    directory = args.dir or tempfile.mkdtemp(prefix="longrun-agent-")
    os.environ["AGENT_MODEL_LOG"] = os.path.join(directory, "model-calls.log")
    agent = make_agent(directory)
    if args.worker:
        print(f"  [worker] {agent.run('agent-1', GOAL).status.value}")
        return 0
    mailbox = os.path.join(directory, "mailbox.jsonl")

    print(f"1. the agent starts in a worker process, which is killed after its 2nd tool call ({directory})")
    worker = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", "--dir", directory],
        env={**os.environ, "AGENT_CRASH_AFTER": "2", "PYTHONPATH": os.path.dirname(os.path.dirname(longrun.__file__))},
    )
    print(f"   worker exit status {worker.returncode} (SIGKILL is {-signal.SIGKILL})")

    print(f"2. after {LEASE_TTL_S:g} s the dead worker's lease has expired; the agent runs again")
    time.sleep(LEASE_TTL_S)
    outcome = agent.run("agent-1", GOAL)
    recovered = next(item.detail for item in outcome.inferences if "verified by observation" in item.detail)
    print(f"   recovery: {recovered}")
    print(f"   status: {outcome.status.value}")
    print(f"   next: {outcome.next_action}")

    print("3. an operator approves the summary mail with `longrun approve`")
    approve = subprocess.run(
        [sys.executable, "-m", "longrun", "approve", os.path.join(directory, "store"), "agent-1",
         "--step", "send-summary", "--approver", "ops-lead", "--yes"],
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(longrun.__file__))},
        capture_output=True, text=True,
    )
    print(f"   longrun approve exit status {approve.returncode}")

    print("4. the agent runs again and finishes")
    outcome = agent.run("agent-1", GOAL)
    print(f"   status: {outcome.status.value}; result: {outcome.result}")

    print("5. running the finished task again does nothing")
    asked = len(lines(os.environ["AGENT_MODEL_LOG"]))
    again = agent.run("agent-1", GOAL)
    print(f"   status: {again.status.value}; the model was asked {len(lines(os.environ['AGENT_MODEL_LOG'])) - asked} more times")

    keys = [json.loads(line)["key"] for line in lines(mailbox)]
    files = sorted(os.listdir(os.path.join(directory, "workspace")))
    print(f"   mails sent: {len(keys)} ({len(set(keys))} distinct); files written: {files}")
    decisions = outcome.result["tool_calls"] + 1 if isinstance(outcome.result, dict) and isinstance(outcome.result["tool_calls"], int) else "?"
    print(f"   model calls: {asked}, for {decisions} decisions")
    ok = outcome.status.value == "done" and again.result == outcome.result and len(keys) == len(set(keys))
    return 0 if ok and worker.returncode == -signal.SIGKILL and approve.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
