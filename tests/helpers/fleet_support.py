"""Worker processes for the fleet crash tests and the fleet benchmark: spawn, SIGKILL, SIGSTOP, drain.

A ``Fleet`` runs ``longrun worker STORE --import fleet_tasks`` processes, each in a numbered slot
(a slot keeps its clock offset across respawns), and checks afterwards what must hold: every task
``done``, every effect applied once at the target, and no task leased to two runners at once in
the database's order (``fleet_lease_log``, written by a trigger inside each lease write).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from typing import Any, Callable

from helpers import support

TASKS_DIR = support.HELPERS
"""Where ``fleet_tasks`` lives: on the workers' ``PYTHONPATH``, and their working directory."""


def tasks_module() -> Any:
    """``fleet_tasks`` imported under the name the workers know it by (``fleet_tasks:effects``), so
    that a function started here names the function a worker runs."""
    if TASKS_DIR not in sys.path:
        sys.path.insert(0, TASKS_DIR)
    return importlib.import_module("fleet_tasks")


def fleet_env(spec: str, work: str, **extra: str) -> dict[str, str]:
    env = support.child_env()
    env["PYTHONPATH"] = os.pathsep.join([support.SRC, TASKS_DIR])
    env["LONGRUN_FLEET_STORE"] = spec
    env["LONGRUN_FLEET_WORK"] = work
    env.update(extra)
    return env


def helper(spec: str, work: str, *args: str, timeout: float = 600.0, **extra: str) -> None:
    """``python -m fleet_tasks ARGS`` (prepare, enqueue) with the fleet's environment."""
    result = subprocess.run(
        [sys.executable, "-m", "fleet_tasks", *args], env=fleet_env(spec, work, **extra), capture_output=True, text=True,
        timeout=timeout, cwd=TASKS_DIR,
    )  # fmt: skip
    if result.returncode != 0:
        raise AssertionError(f"fleet_tasks {args} failed:\n{result.stdout}{result.stderr}")


class Fleet:
    def __init__(self, spec: str, work: str, *, concurrency: int = 4, claim_ttl_s: float = 2.0, poll_s: float = 0.5,
                 lease_ttl_s: float = 2.0, extra_args: tuple[str, ...] = (), verbose: bool = False):  # fmt: skip
        self.spec = spec
        self.work = work
        self.concurrency = concurrency
        self.claim_ttl_s = claim_ttl_s
        self.poll_s = poll_s
        self.lease_ttl_s = lease_ttl_s
        self.extra_args = extra_args
        self.verbose = verbose
        self.slots: dict[int, subprocess.Popen[str]] = {}
        self.offsets: dict[int, float] = {}
        self.generation: dict[int, int] = {}
        self.finished: list[tuple[int, int | None]] = []
        """(slot, exit code) of each process that ended by SIGTERM (a drain)."""
        self.kills = 0
        self.stops = 0

    def spawn(self, slot: int, *, offset_s: float | None = None) -> subprocess.Popen[str]:
        if offset_s is not None:
            self.offsets[slot] = offset_s
        generation = self.generation.get(slot, 0) + 1
        self.generation[slot] = generation
        env = fleet_env(
            self.spec, self.work, LONGRUN_FLEET_LEASE_TTL_S=str(self.lease_ttl_s),
            LONGRUN_WORKER_CLOCK_OFFSET_S=str(self.offsets.get(slot, 0.0)),
        )  # fmt: skip
        log = open(os.path.join(self.work, f"worker-{slot}-{generation}.log"), "w")
        command = [
            sys.executable, "-m", "longrun", *(["-v"] if self.verbose else []), "worker", self.spec, "--import", "fleet_tasks",
            "--concurrency", str(self.concurrency), "--claim-ttl", str(self.claim_ttl_s), "--poll", str(self.poll_s),
            "--name", f"w{slot}", "--json", *self.extra_args,
        ]  # fmt: skip
        process = subprocess.Popen(command, env=env, cwd=TASKS_DIR, stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        self.slots[slot] = process
        return process

    def start(self, count: int, offsets: dict[int, float] | None = None) -> None:
        for slot in range(count):
            self.spawn(slot, offset_s=(offsets or {}).get(slot, 0.0))

    def kill(self, slot: int) -> None:
        process = self.slots[slot]
        process.send_signal(signal.SIGKILL)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
        self.kills += 1
        self.spawn(slot)

    def freeze(self, slot: int, seconds: float) -> None:
        process = self.slots[slot]
        process.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        process.send_signal(signal.SIGCONT)
        self.stops += 1

    def chaos(self, rng: random.Random, kills: int, stops: int, done: Callable[[], bool], *,
              pause_s: tuple[float, float] = (0.3, 1.2), stop_s: tuple[float, float] = (1.0, 2.5)) -> None:  # fmt: skip
        """SIGKILL (and respawn) ``kills`` times and SIGSTOP ``stops`` times, at random, while work remains."""
        actions = ["kill"] * kills + ["stop"] * stops
        rng.shuffle(actions)
        for action in actions:  # all of them, even once the work is done: a drain must still end well
            time.sleep(rng.uniform(*pause_s))
            slot = rng.choice(sorted(self.slots))
            if action == "kill":
                self.kill(slot)
            else:
                self.freeze(slot, rng.uniform(*stop_s))

    def wait_ready(self, database: "Database", timeout: float = 120.0) -> None:
        """Until every worker process has recorded its first heartbeat (its signal handlers are set):
        a SIGTERM before that ends a process that has claimed nothing, by the default action."""
        deadline = time.monotonic() + timeout
        while True:
            running = {int(pid) for (pid,) in database.rows("SELECT pid FROM longrun_workers WHERE state <> 'stopped'")}
            if all(process.pid in running for process in self.slots.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"workers did not start:\n{self.logs()}")
            time.sleep(0.1)

    def drain(self, timeout: float = 120.0) -> list[dict[str, Any]]:
        """SIGTERM every worker; each must exit 0 after draining. Returns their JSON reports."""
        for process in self.slots.values():
            process.send_signal(signal.SIGTERM)
        reports = []
        for slot, process in self.slots.items():
            out, _ = process.communicate(timeout=timeout)
            self.finished.append((slot, process.returncode))
            if process.returncode == 0 and out.strip():
                reports.append(json.loads(out))
        return reports

    def close(self) -> None:
        for process in self.slots.values():
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()

    def logs(self) -> str:
        text = []
        for name in sorted(os.listdir(self.work)):
            if name.startswith("worker-") and name.endswith(".log"):
                with open(os.path.join(self.work, name)) as handle:
                    text.append(f"== {name}\n" + handle.read()[-3000:])
        return "\n".join(text)


def overlapping_leases(rows: list[tuple[Any, ...]], *, by_time: bool = True) -> list[str]:
    """From ``fleet_lease_log`` rows (task, epoch, owner, acquired_at, expires_at, monotonic_clock,
    monotonic_expires_at) in the database's order: every acquisition whose predecessor was neither
    released nor expired by then, and every epoch that did not grow.

    Expiry is judged as the store judges it: on the monotonic timeline both grants share when they
    share one (the acquirer's reading is its expiry less the TTL), else by the wall times. The two
    can disagree by the time a renewal waited for the task's row lock: its monotonic reading is taken
    before the wait, its wall expiry stamped after it."""
    problems = []
    last: dict[str, tuple[int, float, str, str | None, float | None]] = {}
    for task_id, epoch, owner, acquired_at, expires_at, monotonic_clock, monotonic_expires_at in rows:
        previous = last.get(task_id)
        if previous is not None and epoch != previous[0]:
            if epoch < previous[0]:
                problems.append(f"{task_id}: epoch {epoch} after {previous[0]}")
            elif by_time and previous[1] != 0.0:
                shared = monotonic_clock is not None and monotonic_clock == previous[3] and previous[4] is not None
                if shared:
                    acquired, ran_until = monotonic_expires_at - (expires_at - acquired_at), previous[4]
                    timeline = f"monotonic {monotonic_clock}"
                else:
                    acquired, ran_until, timeline = acquired_at, previous[1], "wall clock"
                if ran_until > acquired + 1e-6:
                    problems.append(
                        f"{task_id}: epoch {epoch} ({owner}) acquired at {acquired:.3f} while epoch {previous[0]} "
                        f"({previous[2]}) ran until {ran_until:.3f} ({timeline})"
                    )
        last[task_id] = (int(epoch), float(expires_at), str(owner), monotonic_clock, monotonic_expires_at)
    return problems


class Database:
    """Read-only SQL on the fleet's database, for the checks (PostgreSQL through a test schema, or
    SQLite); for a JSON-file store, its side file ``.fleet.sqlite`` and the store's own API."""

    def __init__(self, spec: str, schema: Any = None):
        self.spec = spec
        self.schema = schema
        self.json = schema is None and not spec.startswith("sqlite:")

    def rows(self, statement: str) -> list[tuple[Any, ...]]:
        if self.schema is not None:
            return self.schema.execute(statement)  # type: ignore[no-any-return]
        path = os.path.join(self.spec, ".fleet.sqlite") if self.json else self.spec[len("sqlite:"):]
        connection = sqlite3.connect(path, timeout=60)
        try:
            return [tuple(row) for row in connection.execute(statement).fetchall()]
        finally:
            connection.close()

    def done(self) -> int:
        return self.statuses().get("done", 0)

    def statuses(self) -> dict[str, int]:
        if self.json:
            from longrun import JsonFileStore

            store = JsonFileStore(self.spec)
            counts: dict[str, int] = {}
            for task_id in store.list_tasks():
                state = store.load(task_id).state
                status = state.status.value if state is not None else "none"
                counts[status] = counts.get(status, 0) + 1
            return counts
        return {str(status): int(count) for status, count in self.rows("SELECT status, COUNT(*) FROM longrun_states GROUP BY status")}

    def lease_log(self) -> list[tuple[Any, ...]] | None:
        """None for the JSON-file store: no trigger can log its lease writes."""
        if self.json:
            return None
        return self.rows(
            "SELECT task_id, epoch, owner, acquired_at, expires_at, monotonic_clock, monotonic_expires_at "
            "FROM fleet_lease_log ORDER BY seq"
        )
