"""Group 2, external random kills: a runner process SIGKILLed from outside at random moments.

Fixed seeds; each kills a 40-step task's process several times, a random 5-150 ms after it reached
its first named point, then lets one process finish. No kill may be taken for damage, no committed
state may vanish, and the task ends with every effect applied once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...stores.jsonfile import JsonFileStore
from .checks import call_counts, check_final, check_revisions, settled_calls
from .children import Workdir, child_command, child_env
from .points import read_trace
from .results import GroupResult, merge
from .task import APPROVALS, pre_approve

__all__ = ["STEPS", "run"]

STEPS = 40


def run(base: str, *, full: bool, workers: int = 2, face: str = "runner", small: bool = False) -> GroupResult:
    """A child SIGKILLed from outside at random moments (fixed seeds), resumed until done.

    Each of 36 seeds (quick: 4, under the durable face 2) kills up to 8 (quick: 6) processes of a
    40-step task, each a random 5-150 ms after it reached its first named point (taking the lease;
    a process needs more than that to finish: every apply takes 10 ms), then lets one finish.
    ``small`` (the unit tests' default scale): 2 seeds, under the durable face 1."""
    result = GroupResult(2, "external random kills", face)
    seeds = range(36) if full else range((4 if face == "runner" else 2) // (2 if small else 1))
    kills_per_seed = 8 if full else 6
    mid_run = 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for part, landed in pool.map(lambda seed: _seed(base, seed, kills_per_seed, face), seeds):
            merge(result, part)
            mid_run += landed
    result.notes.append(f"{mid_run} of {result.faults} kills landed after the killed process's first commit")
    return result


def _seed(base: str, seed: int, kills: int, face: str) -> tuple[GroupResult, int]:
    """One seed's figures, and how many of its kills landed after the killed process had committed."""
    result = GroupResult(2, "")
    rng = random.Random(seed)
    task = "fault-task"
    work = Workdir(base, f"seed-{seed}")
    pre_approve(work.root, task, STEPS, APPROVALS, face=face, call_log=work.calls)
    # Random kills may land in the same effect's apply again and again: that is group 9's business
    # (bounded retries), so here the attempts are not what runs out.
    options = ["--face", face, "--steps", str(STEPS), "--approvals", ",".join(map(str, APPROVALS)), "--slow", "0.01",
               "--max-attempts", "1000"]  # fmt: skip
    verified_before: dict[str, int] = {}
    settled: dict[str, int] = {}
    outcome: dict[str, Any] | None = None
    killed = mid_run = 0
    done = False
    for _ in range(kills + 20):
        index = work.children
        work.children += 1
        env = child_env(LONGRUN_CRASH_TRACE=work.trace(index))
        child = subprocess.Popen(
            child_command(work.root, work.outbox, "--offset", str(1e6 * (index + 1)), *options),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        result.cases += 1
        if killed < kills:
            # The delay counts from the child's first named point (taking the lease): on a loaded
            # machine starting Python alone can outlast the whole window, and a kill then tests nothing.
            started = time.monotonic()
            while child.poll() is None and not os.path.exists(work.trace(index)) and time.monotonic() < started + 60:
                time.sleep(0.005)
            try:
                child.wait(timeout=rng.uniform(0.005, 0.15))
            except subprocess.TimeoutExpired:
                child.kill()
                killed += 1
                result.faults += 1
        out, err = child.communicate(timeout=120)
        if child.returncode == -signal.SIGKILL:
            mid_run += any(name == "state.committed" for name, _, _ in read_trace(work.trace(index)))
        if child.returncode == 0:
            last: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
            outcome = last
            if last["status"] == "done":
                done = True
                break
            result.fail(f"seed {seed}: a run stopped {last['status']}: {last['next_action']}")
            break
        if child.returncode != -signal.SIGKILL:
            result.fail(f"seed {seed}: a child failed (exit {child.returncode}): {err[-400:]}")
            break
        loaded = JsonFileStore(work.root).load(task)
        state = loaded.state
        if state is not None:
            if loaded.source != "primary" or state.reconcile_all:
                result.fail(f"seed {seed}: a kill was taken for damage")
            for sid, record in state.effects.items():
                if record.state.value == "verified":
                    verified_before[sid] = 1
            settled_calls(state, call_counts(work.calls), settled)
        elif any(name == "state.committed" for trace in range(work.children) for name, _, _ in read_trace(work.trace(trace))):
            result.resets += 1
            result.fail(f"seed {seed}: committed state vanished after a kill")
    if not done:
        result.fail(f"seed {seed}: the task never completed")
        return result, mid_run
    for problem in check_revisions([read_trace(work.trace(index)) for index in range(work.children)]):
        result.fail(f"seed {seed}: {problem}")
    check_final(result, work, task, STEPS, f"seed {seed}", verified_before=verified_before, face=face, settled=settled,
                 interruptions=killed, outcome=outcome)  # fmt: skip
    return result, mid_run
