"""What the tests of the JSON-file store's held descriptors share: a small state, a task the
store object already holds descriptors for, and the descriptors this process has open."""

from __future__ import annotations

import gc
import os
from typing import Any

from helpers import support
from longrun import JsonFileStore, RunState
from longrun.budget import BudgetCounters
from longrun.ledger import EffectRecord, EffectState

NOW = 1_000_000.0


def new_state(task: str = "t", action: str = "go") -> RunState:
    state = RunState(task_id=task, plan_digest="sha256:p", budget=BudgetCounters(created_at=0.0), next_action=action)
    state.effects["s0"] = EffectRecord(f"{task}/s0", "s0", "write", {"n": 0}, f"sha256:{0:064x}", EffectState.PLANNED, updated_at=1.0)
    return state


def started(store: JsonFileStore, task: str = "t", owner: str = "me", now: float = NOW) -> tuple[Any, RunState]:
    """A lease, a loaded task and three commits (the last ones append to its journal), then a
    cancellation read: the store object holds the task's lock file, lease file and control directory."""
    lease = store.acquire_lease(task, owner, 30.0, now)
    store.load(task, lease=lease)
    state = new_state(task)
    for _ in range(3):
        store.commit(lease, state, {"s0"})
    store.read_cancellation(task)
    held = store._handles.get(task)
    assert held is not None and held.lock >= 0 and held.lease >= 0
    return lease, state


def open_descriptors() -> int:
    gc.collect()  # store objects earlier tests dropped close theirs when collected
    return len(os.listdir("/proc/self/fd"))


def descriptors_under(path: str) -> list[str]:
    """What this process's open descriptors name inside ``path``."""
    gc.collect()
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        if target.startswith(path + os.sep):
            found.append(target)
    return found


class HeldTaskCase(support.TempDirTest):
    """A store under ``root`` whose object already holds task ``t``'s descriptors."""

    def setUp(self) -> None:
        super().setUp()
        self.root = self.path("root")
        self.store = JsonFileStore(self.root, create=True)
        self.addCleanup(self.store.close)
        self.lease, self.state = started(self.store)
