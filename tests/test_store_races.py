"""Runner processes racing for the same tasks of one database, killed and frozen past their lease.

Against PostgreSQL: 4 processes, clocks skewed by +1 h and -1 h, every one SIGKILLed or SIGSTOPped
(longer than the 1 s lease) at random moments and replaced when killed. Against SQLite (always
run): the same with 3 processes and true clocks. Afterwards:

- each effect key was applied exactly once (at most once, and every task completed);
- every task's state is ``done``;
- no epoch was issued twice for a task, each process saw its epochs grow, and (PostgreSQL, whose
  lease times come from the server's clock) acquisitions ordered by the server's time have
  strictly increasing epochs.

The workload, kill and stop schedule come from a seeded generator; the seed is in the failure
message. The whole test is bounded in time (the children stop by themselves after a deadline).
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
import unittest
from typing import Any

from helpers import pg_support
from helpers import support
from longrun import PostgresStore, SqliteStore, Status
from longrun.testing import read_outbox

RACER = os.path.join(support.HELPERS, "race_runner.py")
TTL = 1.0


def read_lines(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []


class _Race(support.TempDirTest):
    kills = 10
    """Kills and stops each, alternating; then the racers are left to finish."""
    processes = 4
    tasks = 6
    steps = 6
    skews: tuple[float, ...] = (0.0,)
    seed = 0

    def store_arguments(self) -> list[str]:
        raise NotImplementedError

    def make_store(self) -> Any:
        raise NotImplementedError

    def spawn(self, slot: int) -> subprocess.Popen[bytes]:
        skew = self.skews[slot % len(self.skews)]
        stderr = open(self.path(f"stderr-{slot}-{time.monotonic_ns()}.txt"), "wb")
        self.files.append(stderr)
        child = subprocess.Popen(
            [sys.executable, RACER, self.tmp, "--slot", str(slot), *self.store_arguments(), "--tasks", str(self.tasks),
             "--steps", str(self.steps), "--ttl", str(TTL), "--skew", str(skew), "--seed", str(self.seed), "--deadline", "75"],
            env=support.child_env(),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        self.all_children.append(child)
        return child

    def _reap(self) -> None:
        for child in self.all_children:
            if child.poll() is None:
                with_signal(child, signal.SIGCONT)
                child.kill()
            child.wait()
        for handle in self.files:
            handle.close()

    def all_done(self, store: Any) -> bool:
        try:
            tasks = store.list_tasks()
            if len(tasks) < self.tasks:
                return False
            states = [store.load(task).state for task in tasks]
            return all(state is not None and state.status is Status.DONE for state in states)
        except Exception:  # a reader racing the writers may see a busy database: not done yet
            return False

    def race(self) -> dict[str, int]:
        rng = random.Random(self.seed)
        self.all_children: list[subprocess.Popen[bytes]] = []
        self.files: list[Any] = []
        self.addCleanup(self._reap)
        observer = self.make_store()
        self.addCleanup(observer.close)
        slots = {slot: self.spawn(slot) for slot in range(self.processes)}
        kills = stops = 0
        frozen: dict[int, float] = {}  # pid -> when to SIGCONT it
        started = time.monotonic()
        event = 0
        # Chaos: alternate a SIGKILL (the slot is refilled at once) and a SIGSTOP held past the lease.
        while event < 2 * self.kills and time.monotonic() - started < 45 and not self.all_done(observer):
            time.sleep(rng.uniform(0.25, 0.6))
            now = time.monotonic()
            for pid, until in list(frozen.items()):
                if now >= until:
                    with_signal_pid(pid, signal.SIGCONT)
                    del frozen[pid]
            running = [slot for slot, child in slots.items() if child.poll() is None and child.pid not in frozen]
            if not running:
                continue
            slot = rng.choice(running)
            child = slots[slot]
            if event % 2 == 0:
                child.kill()
                child.wait()
                kills += 1
                slots[slot] = self.spawn(slot)
            else:
                with_signal(child, signal.SIGSTOP)
                frozen[child.pid] = now + TTL + rng.uniform(0.2, 0.8)
                stops += 1
            event += 1
        for pid in frozen:
            with_signal_pid(pid, signal.SIGCONT)
        for child in slots.values():
            try:
                child.wait(timeout=max(1.0, 80 - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                pass
        elapsed = time.monotonic() - started
        context = f"(seed {self.seed}, {kills} kills, {stops} stops, {elapsed:.1f}s, workdir {self.tmp})"
        errors = [line for line in read_lines(self.path("events.jsonl")) if line["event"] == "error"]
        # Each racer left standing ran until it saw every task done, which it can only see under a
        # lease of its own: whatever its clock, no racer was locked out (nor let in early).
        exits = {slot: child.poll() for slot, child in slots.items()}
        self.assertEqual(exits, {slot: 0 for slot in slots}, f"racers did not all finish {context}; errors: {errors[-5:]}")

        # Every effect exactly once: at most once, and every task completed.
        keys = {f"task-{t:02d}/step-{s:02d}" for t in range(self.tasks) for s in range(self.steps)}
        lines = read_outbox(self.path("outbox.jsonl"))
        counts = collections.Counter(line["key"] for line in lines)
        duplicates = {key: count for key, count in counts.items() if count > 1}
        self.assertEqual(duplicates, {}, f"effects applied more than once {context}")
        self.assertEqual(set(counts), keys, f"effects missing {context}; errors: {errors[-5:]}")
        for task in sorted({key.split('/')[0] for key in keys}):
            state = observer.load(task).state
            self.assertIsNotNone(state, task)
            self.assertEqual(state.status, Status.DONE, f"{task} {context}")

        # Epochs: never issued twice, growing in each process, ordered by the store's clock.
        acquisitions = [line for line in read_lines(self.path("events.jsonl")) if line["event"] == "acquired"]
        by_task: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for line in acquisitions:
            by_task[line["task"]].append(line)
        for task, items in by_task.items():
            epochs = [item["epoch"] for item in items]
            self.assertEqual(len(epochs), len(set(epochs)), f"{task}: an epoch was issued twice {context}")
            for pid in {item["pid"] for item in items}:
                mine = [item["epoch"] for item in items if item["pid"] == pid]
                self.assertEqual(mine, sorted(mine), f"{task}: epochs went backwards in process {pid}")
            if self.server_clock:
                ordered = [item["epoch"] for item in sorted(items, key=lambda item: item["acquired_at"])]
                self.assertEqual(ordered, sorted(ordered), f"{task}: epochs not increasing in server-clock order {context}")
            self.assertGreaterEqual(observer.read_lease(task).epoch, max(epochs))
        # The target's own fence: per task, the outbox's epochs never go down.
        for task in by_task:
            epochs = [line["epoch"] for line in lines if line["task_id"] == task]
            self.assertEqual(epochs, sorted(epochs))

        outcomes = collections.Counter(line["status"] for line in read_lines(self.path("events.jsonl")) if line["event"] == "outcome")
        figures = {
            "processes": self.processes, "kills": kills, "stops": stops, "tasks": self.tasks, "effects": len(lines),
            "duplicates": sum(count - 1 for count in counts.values()), "acquisitions": len(acquisitions),
            "refused_stale_applies": len(read_lines(self.path("refused.jsonl"))), "lease_lost": outcomes["lease-lost"],
            "already_running": outcomes["already-running"], "retry_scheduled": outcomes["retry-scheduled"],
            "errors": len(errors), "seconds": round(elapsed, 1),
        }
        # Skewed clocks must neither lock a runner out nor let it in early: every clock won leases,
        # and every lease lost is explained by a freeze (a live runner is never taken over).
        by_skew = collections.Counter(self.skews[line["slot"] % len(self.skews)] for line in acquisitions)
        figures["acquisitions_by_skew"] = dict(sorted(by_skew.items()))  # type: ignore[assignment]
        for skew in set(self.skews):
            self.assertGreater(by_skew[skew], 0, f"no runner with clock skew {skew:+.0f}s ever acquired a lease {context}")
        self.assertLessEqual(outcomes["lease-lost"], stops, f"a runner lost its lease without being frozen {context}")
        self.assertGreaterEqual(kills, 1, f"the race ended before any kill {context}")
        self.assertGreaterEqual(stops, 1, f"the race ended before any stop {context}")
        if os.environ.get("LONGRUN_TEST_RACE_REPORT"):
            print(f"\n{type(self).__name__}: {json.dumps(figures)}", file=sys.stderr)
        return figures

    server_clock = False


def with_signal(child: subprocess.Popen[bytes], sig: int) -> None:
    if child.poll() is None:
        with_signal_pid(child.pid, sig)


def with_signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class SqliteRaceTests(_Race):
    processes = 3
    tasks = 4
    steps = 10
    kills = 5
    seed = 11

    def store_arguments(self) -> list[str]:
        return ["--sqlite", self.path("longrun.db")]

    def make_store(self) -> SqliteStore:
        return SqliteStore(self.path("longrun.db"), create=True)

    def test_sqlite_processes_killed_and_frozen_apply_each_effect_once_and_finish(self) -> None:
        self.race()


class PostgresRaceTests(_Race):
    processes = 4
    tasks = 8
    steps = 12
    kills = 10
    skews = (3600.0, -3600.0, 3600.0, -3600.0)
    seed = 5
    server_clock = True

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        pg_support.check()

    def setUp(self) -> None:
        super().setUp()
        self.schema = pg_support.Schema(prefix="lr_race")
        self.addCleanup(self.schema.drop)

    def store_arguments(self) -> list[str]:
        return ["--postgres-schema", self.schema.name, "--driver", self.schema.driver]

    def make_store(self) -> PostgresStore:
        return PostgresStore(self.schema.factory())

    def test_postgres_racers_with_clocks_skewed_an_hour_apply_each_effect_once_and_finish(self) -> None:
        self.race()


if __name__ == "__main__":
    unittest.main()
