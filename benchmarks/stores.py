"""longrun's own loops: effects through the ``Runner``, and transitions at large ledger sizes.

``runner_per_effect`` runs a plan of no-op effects (``apply`` returns a ``Receipt``, ``observe``
says applied) through a real ``Runner`` and store, start to ``done``, and returns the wall time per
effect, task creation and lease included.

``LedgerTask`` drives a ``JsonFileStore`` directly, the way the runner does for one effect: one
changed effect record (and the header fields a runner changes with it) per commit. It is how the
100,000-effect sizes are reached in minutes; the Runner itself scans its plan on every step.

``commit_costs`` does the same against any store (the SQL stores in ``sql_commits.py``) and times
each commit twice: wall time, and this process's CPU time (``time.process_time``), which leaves out
the wait for the disk and shows the work the store does per commit.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import secrets
import statistics
import time
import tracemalloc
from typing import Any, Callable

from longrun import JsonFileStore, Observation, Receipt, RunContract, RunState, Status, Step
from longrun.budget import BudgetCounters
from longrun.canonical import digest_of
from longrun.ledger import EffectRecord, EffectState
from longrun.stores import jsonfile

__all__ = ["LedgerTask", "NoopAdapter", "CommitLoop", "commit_costs", "runner_per_effect"]


class NoopAdapter:
    """The cheapest possible target: every effect applies at once, and is observed applied once it
    was (a set lookup). An observation must not claim an effect never applied: the runner observes
    before the first apply of every run and would verify it without applying."""

    deduplicates = False

    def __init__(self) -> None:
        self.applied: set[str] = set()
        self.observed = 0

    def apply(self, request: Any) -> Receipt:
        self.applied.add(request.key)
        return Receipt(result=None, evidence="ok")

    def observe(self, request: Any) -> Observation:
        self.observed += 1
        if request.key in self.applied:
            return Observation.applied("seen")
        return Observation.absent("not seen")


def runner_per_effect(store: Any, steps: int) -> float:
    """Seconds per effect for a fresh task of ``steps`` effects run to ``done`` through the Runner."""
    from longrun import Runner  # the one place the benchmark needs the runner

    task_id = f"bench-{secrets.token_hex(4)}"
    contract = RunContract(task_id, "benchmark: sequential no-op effects", allowed_actions=("noop",))
    plan = [Step(f"s{index}", "noop", {"i": index}) for index in range(steps)]
    runner = Runner(contract, plan, store=store, adapters={"noop": NoopAdapter()}, owner="bench")
    gc.collect()
    started = time.perf_counter()
    outcome = runner.run()
    elapsed = time.perf_counter() - started
    if outcome.status is not Status.DONE:
        raise RuntimeError(f"the benchmark run ended {outcome.status.value}: {outcome.next_action}")
    return elapsed / steps


def ledger_record(index: int, task_id: str) -> EffectRecord:
    """An effect record shaped like the runner's for a verified no-op step."""
    payload = {"i": index}
    return EffectRecord(
        key=f"{task_id}/s{index}", step_id=f"s{index}", action="noop", payload=payload, payload_digest=digest_of(payload),
        state=EffectState.VERIFIED, attempts=1, epoch=1, receipt="ok", evidence="seen", updated_at=1_700_000_000.0 + index,
    )  # fmt: skip


def ledger_state(task_id: str, size: int) -> RunState:
    """A state whose ledger holds ``size`` verified no-op effects."""
    now = time.time()
    state = RunState(
        task_id=task_id, plan_digest="sha256:" + "0" * 64, budget=BudgetCounters(created_at=now, last_progress_at=now),
        created_at=now, next_action="start the first step",
    )  # fmt: skip
    for index in range(size):
        record = ledger_record(index, task_id)
        state.effects[record.step_id] = record
    return state


def transition(state: RunState, number: int) -> str:
    """Change one effect record the way the runner's next move would; returns its step id."""
    step_id = f"s{number % len(state.effects)}"
    record = state.effects[step_id]
    now = time.time()
    if record.state is EffectState.VERIFIED:
        record = dataclasses.replace(record, state=EffectState.STARTED, attempts=record.attempts + 1, updated_at=now)
    else:
        record = dataclasses.replace(record, state=EffectState.VERIFIED, evidence="seen again", updated_at=now)
    state.effects[step_id] = record
    state.updated_at = now
    state.current_step = step_id
    state.next_action = f"observe whether effect {record.key!r} took place"
    return step_id


class CommitLoop:
    """One task with a ledger of ``size`` effects on ``store``, committed one changed record at a time."""

    def __init__(self, store: Any, size: int):
        self.store, self.size = store, size
        self.task_id = f"commits-{size}-{secrets.token_hex(3)}"
        self.lease = store.acquire_lease(self.task_id, "bench", 86_400.0, time.time())
        store.load(self.task_id, lease=self.lease)
        self.state = ledger_state(self.task_id, size)
        store.commit(self.lease, self.state, set(self.state.effects))
        self.walls: list[float] = []
        self.cpus: list[float] = []

    def run(self, commits: int) -> None:
        store, lease, state = self.store, self.lease, self.state
        perf_counter, process_time = time.perf_counter, time.process_time
        for _ in range(commits):
            step_id = transition(state, len(self.walls))
            wall, cpu = perf_counter(), process_time()
            store.commit(lease, state, (step_id,))
            self.cpus.append(process_time() - cpu)
            self.walls.append(perf_counter() - wall)

    def costs(self) -> dict[str, float]:
        """Median wall seconds and mean CPU seconds per commit (process_time ticks coarsely, so a mean)."""
        return {"wall_s": statistics.median(self.walls), "cpu_s": statistics.mean(self.cpus)}


def commit_costs(store: Any, sizes: list[int], commits: int, block: int = 50) -> dict[int, dict[str, float]]:
    """Per-commit costs at each ledger size, measured in interleaved blocks so that every size
    meets the same disk weather."""
    loops = [CommitLoop(store, size) for size in sizes]
    gc.collect()
    done = 0
    while done < commits:
        for loop in loops:
            loop.run(min(block, commits - done))
        done += block
    return {loop.size: loop.costs() for loop in loops}


class LedgerTask:
    """A task whose ledger holds ``size`` effects, committed one changed record per transition."""

    def __init__(self, size: int, root: str):
        self.size = size
        self.root = root
        self.task_id = f"ledger-{size}"
        self.store = JsonFileStore(root, create=True)
        self.times: list[float] = []
        self.compactions = 0
        self.compaction_times: list[float] = []
        self._next = 0

    def build(self) -> None:
        self.lease = self.store.acquire_lease(self.task_id, "bench", 86_400.0, time.time())
        self.store.load(self.task_id, lease=self.lease)
        now = time.time()
        state = RunState(
            task_id=self.task_id, plan_digest="sha256:" + "0" * 64, budget=BudgetCounters(created_at=now, last_progress_at=now),
            created_at=now, next_action="start the first step",
        )  # fmt: skip
        for index in range(self.size):
            record = ledger_record(index, self.task_id)
            state.effects[record.step_id] = record
        self.state = state
        self.store.commit(self.lease, state, set(state.effects))
        self.store.commit(self.lease, state, ())  # the second commit also writes the first backup
        self._inode = self._snapshot_inode()

    def _snapshot_inode(self) -> int:
        # Stat'ing the snapshot is free; stat'ing the journal would cost its next fdatasync a flush.
        return os.lstat(os.path.join(self.root, self.task_id, jsonfile.STATE)).st_ino

    def transitions(self, count: int) -> None:
        state, store, lease = self.state, self.store, self.lease
        perf_counter = time.perf_counter
        for _ in range(count):
            step_id = f"s{self._next % self.size}"
            self._next += 1
            record = state.effects[step_id]
            now = time.time()
            if record.state is EffectState.VERIFIED:
                record = dataclasses.replace(record, state=EffectState.STARTED, attempts=record.attempts + 1, updated_at=now)
            else:
                record = dataclasses.replace(record, state=EffectState.VERIFIED, evidence="seen again", updated_at=now)
            state.effects[step_id] = record
            state.updated_at = now
            state.current_step = step_id
            state.next_action = f"observe whether effect {record.key!r} took place"
            started = perf_counter()
            store.commit(lease, state, (step_id,))
            elapsed = perf_counter() - started
            self.times.append(elapsed)
            inode = self._snapshot_inode()
            if inode != self._inode:
                self._inode = inode
                self.compactions += 1
                self.compaction_times.append(elapsed)

    # -- what the journal holds right now (the store's own bookkeeping, read for the report) --

    def _writer(self) -> Any:
        return self.store._writers[self.task_id]

    def compaction_threshold(self) -> float:
        writer = self._writer()
        return max(jsonfile.COMPACT_MIN_BYTES, jsonfile.COMPACT_RATIO * writer.snapshot_bytes)

    def fill_journal(self, fraction: float) -> None:
        """Commit until the journal holds ``fraction`` of what triggers a compaction: the longest
        journal a load ever replays is just under that."""
        while self._writer().journal_end < fraction * self.compaction_threshold():
            self.transitions(100)

    def files(self) -> dict[str, int]:
        writer = self._writer()
        directory = os.path.join(self.root, self.task_id)
        apparent = allocated = 0
        for name in os.listdir(directory):
            info = os.lstat(os.path.join(directory, name))
            if os.path.isfile(os.path.join(directory, name)):
                apparent += info.st_size
                allocated += info.st_blocks * 512
        return {
            "snapshot": writer.snapshot_bytes,
            "journal": writer.journal_end,
            "all_files": apparent,
            "allocated": allocated,
        }

    def time_load(self, repeats: int = 3) -> float:
        """Median seconds for a fresh store object to load the task (read-only, warm page cache)."""
        times = []
        for _ in range(repeats):
            gc.collect()
            store = JsonFileStore(self.root)
            started = time.perf_counter()
            result = store.load(self.task_id)
            times.append(time.perf_counter() - started)
            if result.source != "primary" or result.state is None or len(result.state.effects) != self.size:
                raise RuntimeError(f"ledger {self.size}: the benchmark's own task did not load cleanly")
            del result
        return statistics.median(times)

    def load_peak_memory(self) -> int:
        """Peak bytes allocated by Python while loading (tracemalloc; run apart from the timing)."""
        gc.collect()
        tracemalloc.start()
        try:
            JsonFileStore(self.root).load(self.task_id)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    def summary(self) -> dict[str, float]:
        times = sorted(self.times)
        return {
            "amortized_s": sum(times) / len(times),
            "median_s": statistics.median(times),
            "p99_s": times[int(len(times) * 0.99)],
            "transitions": len(times),
            "compactions": self.compactions,
            "compaction_s": max(self.compaction_times) if self.compaction_times else 0.0,
        }


def interleave(tasks: list[LedgerTask], block: int, until: Callable[[], bool]) -> None:
    """Run blocks of transitions on every task in turn until ``until()``: each size sees the same
    stretch of disk weather, so their ratio is not an artifact of when each ran."""
    while not until():
        for task in tasks:
            task.transitions(block)
