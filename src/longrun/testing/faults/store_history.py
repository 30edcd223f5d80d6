"""What the store-level fault groups (3, 4, 5, 7, 8) damage: a task's history in a JSON-file store.

A history is ``TASK`` committed again and again, each commit changing it the way a runner does
(``evolve``), with compaction from the first bytes on (``compact_early``) so that every write
protocol runs within a few commits. ``content`` is what a check compares: a state without what a
recovery may legitimately change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import tempfile
from typing import Any, Generator

from ...envelope import RunState
from ...ledger import EffectState
from ...outcome import Evidence
from ...stores import jsonfile
from ...stores.jsonfile import JsonFileStore
from .. import copy_keeping_links
from ..store_contract import sample_state
from .power_loss_model import RecordingIO

__all__ = ["TASK", "build_history", "compact_early", "content", "copy_tree", "evolve", "scratch_base"]

TASK = "t"


@contextlib.contextmanager
def compact_early() -> Generator[None, None, None]:
    """Compaction within a handful of commits, so every write protocol runs in a short history."""
    original = jsonfile.COMPACT_MIN_BYTES
    jsonfile.COMPACT_MIN_BYTES = 0
    try:
        yield
    finally:
        jsonfile.COMPACT_MIN_BYTES = original


def evolve(state: RunState, step: int, rng: random.Random) -> set[str]:
    """Change a state the way a runner does (an effect moves, a list grows...); return the changed step ids."""
    state.updated_at = 1_700_001_000.0 + step
    state.next_action = f"action {step}"
    changed = set()
    step_id = rng.choice(sorted(state.effects))
    record = state.effects[step_id]
    state.effects[step_id] = dataclasses.replace(
        record, attempts=record.attempts + 1, state=rng.choice(list(EffectState)), evidence=f"seen {step}", updated_at=2e9 + step
    )
    changed.add(step_id)
    if step % 4 == 0:
        state.note_control(Evidence("control", f"approval record {step}", float(step)))
    if step % 5 == 0:
        state.consumed_approvals.append(f"ap-{step}")
    if step % 3 == 0:
        state.budget = dataclasses.replace(state.budget, attempts_total=state.budget.attempts_total + 1)
    return changed


def content(document: dict[str, Any]) -> str:
    """A state document without what a recovery may change (its revision, ``reconcile_all``), as text to compare."""
    document = dict(document)
    document.pop("revision", None)
    document.pop("reconcile_all", None)
    return json.dumps(document, sort_keys=True)


def scratch_base(base: str) -> str:
    """A directory for the many small crash states: in memory (``/dev/shm``) where there is one."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return tempfile.mkdtemp(prefix="longrun-faults-", dir="/dev/shm")
    return tempfile.mkdtemp(prefix="scratch-", dir=base)


def build_history(root: str, commits: int = 17, *, seed: int = 4, io: RecordingIO | None = None) -> tuple[dict[int, str], str]:
    """``TASK`` in a new JSON-file store at ``root``, committed ``commits`` times (compacted on the
    way, its lease renewed every 7 commits and once more at the end): the content committed at each
    revision (``content``), and the last one. With ``io`` (the power-loss group), the store's I/O is
    recorded there, each commit marked in the trace (``begin`` and ``end``, with the content before
    and after it), and the lease is released at the end instead."""
    committed: dict[int, str] = {}
    with compact_early():
        store = JsonFileStore(root, io=io, create=True)
        lease = store.acquire_lease(TASK, "holder", 3600.0, 1_700_000_000.0)
        store.load(TASK, lease=lease)
        state = sample_state(TASK, effects=6)
        state.revision = 0
        rng = random.Random(seed)
        for number in range(1, commits + 1):
            changed = evolve(state, number, rng) if number > 1 else set(state.effects)
            if io is not None:
                io.mark("begin", number, committed.get(number - 1))
            store.commit(lease, state, changed)
            committed[state.revision] = content(state.to_json())
            if io is not None:
                io.mark("end", number, committed[state.revision])
            if number % 7 == 0:
                lease = store.renew_lease(lease, 3600.0, 1_700_000_000.0 + number)
        if io is not None:
            store.release_lease(lease, 1_700_000_100.0)
        else:
            store.renew_lease(lease, 3600.0, 1_700_000_000.0 + commits + 1)
        store.close()
    return committed, committed[max(committed)]


def copy_tree(source: str, target: str) -> None:
    """Replace ``target`` by a copy of ``source`` that keeps its hard links (as a crash leaves them)."""
    shutil.rmtree(target, ignore_errors=True)
    copy_keeping_links(source, target)
