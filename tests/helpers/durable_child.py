"""A durable agent loop in its own process, for tests that SIGKILL it (tests/test_functions_crash.py).

One run, the way a worker runs a task (crash target from ``LONGRUN_CRASH_AT``, as always)::

    python durable_child.py run KIND ROOT WORK TASK SEED [--max-tools N] [--later S] [--label L]

prints the outcome as one JSON line. Or a fork server, so that a test can kill a hundred processes
without paying a hundred interpreter starts::

    python durable_child.py serve

reads one JSON request per line (``kind root work task seed max_tools later label``, and ``crash_at``
("name:N") or ``kill_after_s``), forks a process that arms the crash points as ``LONGRUN_CRASH_AT``
and ``LONGRUN_CRASH_TRACE`` would, runs the task once and reports; then answers one JSON line
``{"exit": returncode, "outcome": outcome or null}`` (a SIGKILLed process exits -9).

The agent asks a fake model what to do next until it says it is done: a variable number of steps.
The model is nondeterministic the way a real one is: its answer depends on how often it was asked
before (each call is one ``O_APPEND`` line in ``WORK/calls``: task, step, run label), so a call
repeated after a crash may answer otherwise (the answer to the n-th asking of a step is seeded by
the task's seed, the step and n), and only the recorded answer may drive the run. Its
tools make effects through ``OutboxAdapter`` (``WORK/outbox.jsonl``); the final summary mail waits
for an approval. ``KIND`` is ``json`` or ``sqlite``.
"""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src"))  # run by path: longrun from src
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests: for helpers

import longrun  # noqa: E402
from longrun import JsonFileStore, Limits, RetryPolicy, SqliteStore  # noqa: E402
from longrun.testing import OutboxAdapter  # noqa: E402

from helpers import forked  # noqa: E402
from helpers.clocks import LaterClock  # noqa: E402

ACTIONS = ("mail.send", "note.write")


class Model:
    """The fake model. ``calls`` is the file each call appends a line to."""

    calls = ""
    label = ""


def think(task: str, seed: int, step: int, notes: list[str], max_tools: int) -> dict[str, Any]:
    """What to do after ``notes``: a tool call, or done (after at least one tool call and at most
    ``max_tools``). Nondeterministic across repeated calls."""
    try:
        with open(Model.calls, "rb") as handle:
            asked_before = sum(1 for line in handle if line.startswith(f"{task} {step} ".encode()))
    except FileNotFoundError:
        asked_before = 0
    fd = os.open(Model.calls, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, f"{task} {step} {Model.label}\n".encode())
    finally:
        os.close(fd)
    rng = random.Random(f"{seed}:{step}:{asked_before}")
    done = step >= max_tools or (step > 0 and rng.random() < 1.5 / max_tools)
    return {"done": done, "tool": rng.choice(ACTIONS), "text": f"note {rng.randrange(10_000)} after {len(notes)}"}


def agent_loop(run: longrun.Run, seed: int, max_tools: int) -> dict[str, Any]:
    notes: list[str] = []
    step = 0
    while True:
        decision = run.call(f"model/{step}", think, run.task_id, seed, step, notes, max_tools)
        if decision["done"]:
            break
        run.effect(f"tool/{step}", decision["tool"], {"text": decision["text"]})
        notes.append(decision["text"])
        step += 1
    run.effect("summary", "mail.send", {"notes": notes}, approval=True)
    return {"tools": step, "notes": notes}


def make_store(kind: str, root: str) -> longrun.Store:
    if kind == "json":
        return JsonFileStore(root, create=True)
    if kind == "sqlite":
        return SqliteStore(os.path.join(root, "longrun.sqlite"), create=True)
    raise SystemExit(f"unknown store kind {kind!r}")


def run_once(
    kind: str, root: str, work: str, task: str, seed: int, max_tools: int, later: float, label: str
) -> longrun.RunOutcome:
    Model.calls = os.path.join(work, "calls")
    Model.label = label
    outbox = OutboxAdapter(os.path.join(work, "outbox.jsonl"))
    store = make_store(kind, root)
    agent = longrun.durable(
        store=store,
        adapters={action: outbox for action in ACTIONS},
        allowed_actions=ACTIONS,
        clock=LaterClock(later),
        # Kills may land in the same effect many times: the attempt budget is not what is tested.
        limits=Limits(max_attempts=1000, max_failures=1000),  # killed again and again: never failed for it
        retry=RetryPolicy(base_delay_s=0.0, jitter=0.0),
    )(agent_loop)
    try:
        return agent.run(task, seed, max_tools)
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()


def run_request(request: dict[str, Any]) -> Any:
    return run_once(
        request["kind"], request["root"], request["work"], request["task"], request["seed"],
        request["max_tools"], request["later"], request["label"],
    )  # fmt: skip


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        return forked.serve(run_request)
    if argv[:1] == ["run"] and len(argv) >= 6:
        kind, root, work, task, seed = argv[1:6]
        options = dict(zip(argv[6::2], argv[7::2]))
        outcome = run_once(
            kind, root, work, task, int(seed), int(options.get("--max-tools", 4)), float(options.get("--later", 0)),
            options.get("--label", "run"),
        )
        print(json.dumps(outcome.to_json()), flush=True)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
