"""Group 1, named kill points: a runner process SIGKILLs itself at each named crash point.

Each point (``points.POINTS``) at its 1st, 2nd and last occurrence in a 20-step task with two
approvals; after each kill one more process resumes the task. It must find the state the killed
process last committed (or the one in flight), never take the crash for damage, and finish with
every effect applied once and verified.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...stores import TEMP_MARK
from ...stores.jsonfile import JsonFileStore
from .checks import call_counts, check_final, check_revisions, outbox_counts, revisions_of, settled_calls
from .children import Workdir, fork_servers, spawn
from .points import points_for, read_trace
from .results import GroupResult, merge
from .task import APPROVALS, pre_approve

__all__ = ["STEPS", "run"]

STEPS = 20


def _in_flight(state: Any) -> dict[str, Any]:
    return {sid: record for sid, record in state.effects.items() if record.in_flight} if state is not None else {}


def _case(base: str, point: str, occurrence: int, options: list[str], face: str) -> GroupResult:
    task = "fault-task"
    result = GroupResult(1, "")
    where = f"{point}#{occurrence}"
    work = Workdir(base, f"{point}-{occurrence}")
    pre_approve(work.root, task, STEPS, APPROVALS, face=face, call_log=work.calls)
    code, _, err = spawn(work, *options, crash_at=f"{point}:{occurrence}")
    result.cases += 1
    if code != -signal.SIGKILL:
        result.fail(f"{where}: the child was not killed at the point (exit {code}): {err[-300:]}")
        return result
    result.faults += 1
    crash_trace = read_trace(work.trace(0))
    _, commits = revisions_of(crash_trace)
    committed = commits[-1] if commits else 0
    on_disk = JsonFileStore(work.root).load(task)
    state = on_disk.state
    if state is None and committed:
        result.resets += 1
        result.fail(f"{where}: revision {committed} was committed, a load finds no state")
    if state is not None:
        if on_disk.source != "primary" or state.reconcile_all:
            result.fail(f"{where}: a crash was taken for damage: {[item.detail for item in on_disk.observations]}")
        if state.revision not in (committed, committed + 1):
            result.fail(f"{where}: on disk revision {state.revision}, last committed {committed}")
    if any(TEMP_MARK in name for name in _names(work.root)) and state is not None and on_disk.source != "primary":
        result.fail(f"{where}: a temporary file was read as state")
    crash_counts = outbox_counts(work.outbox)
    in_flight = _in_flight(state)
    verified_before = {sid: 1 for sid, record in (state.effects.items() if state else ()) if record.state.value == "verified"}
    settled: dict[str, int] = {}
    settled_calls(state, call_counts(work.calls), settled)
    code, outcome, err = spawn(work, *options)
    if code != 0 or outcome is None:
        result.fail(f"{where}: the resumed runner failed (exit {code}): {err[-400:]}")
        return result
    problems = check_revisions([crash_trace, read_trace(work.trace(1))])
    for problem in problems:
        result.fail(f"{where}: {problem}")
    check_final(result, work, task, STEPS, where, verified_before=verified_before, face=face, settled=settled, interruptions=1, outcome=outcome)
    final = JsonFileStore(work.root).load(task).state
    for sid, record in in_flight.items():
        after = final.effects.get(sid) if final is not None else None
        if after is None:
            continue
        if crash_counts.get(record.key, 0) and after.attempts != record.attempts:
            result.fail(f"{where}: {record.key} had reached the target, yet was applied again (attempt {after.attempts})")
    if not any(name == "recovery.loaded" for name, _, _ in read_trace(work.trace(1))):
        result.fail(f"{where}: the resumed runner never loaded the state")
    return result


def _names(root: str) -> list[str]:
    found = []
    for _, _, names in os.walk(root):
        found.extend(names)
    return found


def run(base: str, *, full: bool, workers: int = 2, face: str = "runner", small: bool = False) -> GroupResult:
    """Named kill points: each point at its 1st, 2nd and last occurrence in a 20-step task.

    Quick counts: the 1st and the last; under the durable face (twice the commits, so twice the
    time) the 1st or the last, in turn from one point to the next. ``small`` (the unit tests'
    default scale): every point still, under either face at the 1st or the last in turn."""
    result = GroupResult(1, "named kill points", face)
    options = ["--face", face, "--steps", str(STEPS), "--approvals", ",".join(map(str, APPROVALS)),
               "--monotonic-step", "4", "--ttl", "10"]  # fmt: skip
    with fork_servers(workers):  # each child forked from a server that imported the task once
        calibration = Workdir(base, "calibration")
        pre_approve(calibration.root, "fault-task", STEPS, APPROVALS, face=face, call_log=calibration.calls)
        code, outcome, err = spawn(calibration, *options)
        if code != 0 or outcome is None or outcome["status"] != "done":
            result.fail(f"the calibration run did not finish (exit {code}, {outcome}): {err[-400:]}")
            return result
        counts: dict[str, int] = {}
        for name, occurrence, _ in read_trace(calibration.trace(0)):
            counts[name] = max(counts.get(name, 0), occurrence)
        cases: list[tuple[str, int]] = []
        points = points_for(face)
        for number, point in enumerate(points):
            last = counts.get(point, 0)
            if not last:
                result.fail(f"point {point} is never reached in a {STEPS}-step task")
                continue
            wanted = {1, 2, last} if full else {1, last} if face == "runner" and not small else {(1, last)[number % 2]}
            cases.extend((point, occurrence) for occurrence in sorted(wanted) if occurrence <= last)
        result.notes.append(f"{len(points)} points, {len(cases)} (point, occurrence) cases")
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for part in pool.map(lambda case: _case(base, case[0], case[1], options, face), cases):
                merge(result, part)
    return result
