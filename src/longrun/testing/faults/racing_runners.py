"""Group 6, racing runners: processes race for one task while they are SIGKILLed and frozen at random.

Four processes (``race_main``) run one 50-step task until it is done, whoever holds the lease; at
random moments one is SIGKILLed (and replaced) or SIGSTOPped past its lease and later thawed. The
log of every lease and state write (``RaceLogIO``) must show epochs that only grow and revisions
written under the current epoch without a gap; every effect is applied once.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time

from ...functions import FUNCTION_STEP
from ...outcome import Status
from ...stores.jsonfile import JsonFileStore
from .checks import call_counts, check_calls, check_race_log, outbox_counts
from .children import SRC, child_env, race_command
from .results import GroupResult, merge
from .task import call_log_of, function_result

__all__ = ["run"]


def run(base: str, *, full: bool, face: str = "runner", small: bool = False) -> GroupResult:
    """4 runner processes race for one 50-step task, SIGKILLed and SIGSTOPped (past the lease) at
    random; 3 seeds (the durable face at quick counts, and either face when ``small``: 1)."""
    result = GroupResult(6, "racing runners", face)
    for seed in range(3 if full or (face == "runner" and not small) else 1):
        merge(result, _race(base, seed, events=24 if full else 10, face=face))
    return result


def _race(base: str, seed: int, *, events: int, processes: int = 4, steps: int = 50, ttl: float = 1.0, face: str = "runner") -> GroupResult:
    result = GroupResult(6, "")
    rng = random.Random(seed)
    work = os.path.join(base, f"race-{seed}")
    os.makedirs(work)
    children: list[subprocess.Popen[bytes]] = []
    killed: set[int] = set()
    stopped: dict[int, float] = {}

    def spawn() -> subprocess.Popen[bytes]:
        child = subprocess.Popen(
            race_command(work, "--face", face, "--steps", str(steps), "--ttl", str(ttl), "--seed", str(seed)),
            env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=SRC,
        )
        children.append(child)
        return child

    live = [spawn() for _ in range(processes)]
    try:
        for _ in range(events):
            time.sleep(rng.uniform(0.1, 0.3))
            for pid, until in list(stopped.items()):
                if time.monotonic() >= until:
                    os.kill(pid, signal.SIGCONT)
                    del stopped[pid]
            running = [child for child in live if child.poll() is None and child.pid not in stopped]
            if not running:
                break
            victim = rng.choice(running)
            result.faults += 1
            if rng.random() < 0.5:
                victim.kill()
                victim.wait()
                killed.add(victim.pid)
                live.remove(victim)
                live.append(spawn())
            else:
                os.kill(victim.pid, signal.SIGSTOP)
                stopped[victim.pid] = time.monotonic() + ttl * rng.uniform(1.2, 1.6)
        while stopped:
            pid, until = min(stopped.items(), key=lambda item: item[1])
            time.sleep(max(0.0, until - time.monotonic()))
            os.kill(pid, signal.SIGCONT)
            del stopped[pid]
        deadline = time.monotonic() + 120
        for child in live:
            child.wait(timeout=max(1.0, deadline - time.monotonic()))
            if child.returncode != 0:
                result.fail(f"seed {seed}: a racer ended with exit code {child.returncode}")
    finally:
        for child in children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGCONT)
                child.kill()
                child.wait()
    result.cases += len(children)
    with open(os.path.join(work, "writes.jsonl")) as handle:
        entries = [json.loads(line) for line in handle if line.endswith("\n")]
    problems, writes = check_race_log(entries, killed)
    for problem in problems:
        result.fail(f"seed {seed}: {problem}")
    loaded = JsonFileStore(os.path.join(work, "store")).load("race-task")
    state = loaded.state
    if state is None:
        result.resets += 1
        result.fail(f"seed {seed}: no state")
        return result
    if state.revision != writes:
        result.fail(f"seed {seed}: final revision {state.revision}, {writes} writes were accepted")
    counts = outbox_counts(os.path.join(work, "outbox.jsonl"))
    result.duplicates += sum(count - 1 for count in counts.values() if count > 1)
    missing = {f"race-task/step-{i:03d}" for i in range(steps)} - set(counts)
    result.lost += len(missing)
    if state.status is not Status.DONE or missing:
        result.fail(f"seed {seed}: ended {state.status.value} with {len(missing)} effects never applied")
    if face == "durable":
        # A call runs again only when its process lost the task before committing its value: each
        # such loss is followed by a new epoch (a kill or a freeze past the lease, or a slow renewal).
        epochs = len({entry["epoch"] for entry in entries if entry["event"] == "lease"})
        runs = call_counts(call_log_of(os.path.join(work, "outbox.jsonl")))
        check_calls(result, runs, state, steps, f"seed {seed}", settled={}, interruptions=max(0, epochs - 1))
        result.notes.append(f"seed {seed}: {sum(runs.values())} call runs for {steps} calls under {epochs} epochs")
        if state.effects.get(FUNCTION_STEP) is None or state.effects[FUNCTION_STEP].result != function_result(steps):
            result.fail(f"seed {seed}: the function's result is not recorded")
    result.notes.append(f"seed {seed}: {len(children)} processes, {len(killed)} SIGKILLed, {writes} revisions, "
                        f"{sum(1 for entry in entries if entry['event'] == 'lease')} lease writes")  # fmt: skip
    return result
