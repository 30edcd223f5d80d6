"""Group 3, power loss: every prefix of a recorded history, cut by a modelled power loss.

A 20-commit history (with compactions and lease writes) is recorded through ``RecordingIO``; for
every prefix of its I/O, ``crash_states`` gives what a power loss may leave (unsynced writes
written, dropped, torn or garbled; unsynced names kept or lost). Each must load as the state before
or after the commit in flight, whole, and a loss that garbled nothing must not look like damage.
Then the mutation check: without any one flush of the write protocol, some crash state must break.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from ...errors import CorruptStateError, UnknownTaskError
from ...protocols import LoadResult
from ...stores.jsonfile import JsonFileStore
from .power_loss_model import RecordingIO, crash_states, materialize
from .results import GroupResult
from .store_history import TASK, build_history, content, scratch_base

__all__ = ["check_power_loss", "run"]

COMMITS = 20


def check_power_loss(
    ops: list[tuple[Any, ...]], source_root: str, scratch: str, *, ignore: frozenset[str] = frozenset(), stop_at_first: bool = False
) -> tuple[int, list[str], dict[str, int]]:
    """Every crash state of every prefix: the load must give the before- or the after-state of the
    commit in flight, whole, and a crash that garbled nothing must not look like damage."""
    cases, problems = 0, []
    figures = {"resets": 0, "lost": 0}
    in_flight: tuple[str | None, str] | None = None
    durable: str | None = None
    for prefix in range(len(ops) + 1):
        if prefix and ops[prefix - 1][0] == "mark":
            mark = ops[prefix - 1]
            if mark[1] == "begin":
                in_flight = (mark[3], "")
            else:
                durable, in_flight = mark[3], None
            continue
        allowed = {durable} if in_flight is None else {in_flight[0]}
        if in_flight is not None:
            # the after-state is the content the "end" mark will name
            after = next(op[3] for op in ops[prefix:] if op[0] == "mark" and op[1] == "end")
            allowed.add(after)
        for label, names, contents in crash_states(ops, prefix, ignore_sites=ignore):
            cases += 1
            target = os.path.join(scratch, f"crash-{cases % 2}")
            shutil.rmtree(target, ignore_errors=True)
            materialize(names, contents, source_root, target)
            where = f"after I/O op {prefix} ({ops[prefix - 1][0] if prefix else 'nothing'}), {label}"
            loaded: LoadResult | None = None
            try:
                loaded = JsonFileStore(target).load(TASK)
            except UnknownTaskError:
                loaded = LoadResult(state=None)  # the task's directory itself was lost
            except CorruptStateError as exc:
                problems.append(f"{where}: the committed state became unreadable: {exc}")
                figures["lost"] += 1
            except Exception as exc:  # noqa: BLE001 - anything else leaking is the finding
                problems.append(f"{where}: {type(exc).__name__} leaked: {exc}")
            if loaded is not None:
                seen = content(loaded.state.to_json()) if loaded.state is not None else None
                if seen not in allowed:
                    if seen is None:
                        figures["resets"] += 1
                    else:
                        figures["lost"] += 1
                    problems.append(f"{where}: loaded {'no state' if seen is None else 'a state'} that is neither before nor after the commit in flight")
                elif loaded.state is not None and (loaded.source != "primary" or loaded.state.reconcile_all) and not label.startswith("garbled"):
                    problems.append(f"{where}: a power loss that garbled nothing was taken for damage: {[item.detail for item in loaded.observations][:3]}")
            if problems and stop_at_first:
                return cases, problems, figures
    return cases, problems, figures


def run(base: str, *, full: bool) -> GroupResult:
    """Power loss: every prefix of a recorded 20-commit history, unsynced writes written, dropped,
    torn or garbled, unsynced names kept or lost; then the mutation check."""
    result = GroupResult(3, "power loss (model)")
    source_root = os.path.join(base, "recorded")
    io = RecordingIO()
    build_history(source_root, COMMITS, seed=3, io=io)
    scratch = scratch_base(base)
    try:
        cases, problems, figures = check_power_loss(io.ops, source_root, scratch)
        result.cases += cases
        result.faults += cases
        result.resets += figures["resets"]
        result.lost += figures["lost"]
        for problem in problems:
            result.fail(problem)
        sites = sorted({op[2] for op in io.ops if op[0] in ("sync", "dirsync")})
        result.notes.append(f"{len(io.ops)} I/O operations recorded, {len(sites)} flush sites: {', '.join(sites)}")
        # The mutation check: without any one flush of the protocol, some crash state must break.
        for site in sites:
            mutated_cases, mutated_problems, _ = check_power_loss(io.ops, source_root, scratch, ignore=frozenset({site}), stop_at_first=True)
            result.cases += mutated_cases
            if not mutated_problems:
                result.fail(f"mutation check: removing the flush at {site} breaks nothing the test checks")
            else:
                result.notes.append(f"without the flush at {site}: {mutated_problems[0]}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result
