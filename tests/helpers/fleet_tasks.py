"""Durable functions for the fleet tests and benchmark, imported by ``longrun worker --import fleet_tasks``.

Where they keep things comes from the environment: ``LONGRUN_FLEET_STORE`` (a store spec for
``open_store``) and ``LONGRUN_FLEET_WORK`` (a directory for the target's files). The target,
``FleetTarget``, keeps one append-only outbox per task (``WORK/outbox/<task>.jsonl``), so a test
counts every apply; it fences stale epochs per task as the README asks of a real target (the
newest epoch that observed or applied a task's effects; an older one is refused), and it can log
every apply's start and end (``WORK/concurrency.log``) for the concurrency-limit test.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from typing import Any

import longrun
from longrun import EffectRequest, Limits, Observation, PermanentError, Receipt, RetryPolicy, TransientError
from longrun.stores import open_store

STORE_VARIABLE = "LONGRUN_FLEET_STORE"
WORK_VARIABLE = "LONGRUN_FLEET_WORK"
LEASE_TTL_S = float(os.environ.get("LONGRUN_FLEET_LEASE_TTL_S", "3"))


def work(*parts: str) -> str:
    return os.path.join(os.environ[WORK_VARIABLE], *parts)


class FleetTarget:
    """A local target: one outbox file per task, fenced by epoch, optionally slow or failing once."""

    deduplicates = False

    def __init__(self, *, log_concurrency: bool = False, apply_s: float = 0.0, fail_first: bool = False):
        self.log_concurrency = log_concurrency
        self.apply_s = apply_s
        self.fail_first = fail_first

    def _open(self, task_id: str) -> int:
        os.makedirs(work("outbox"), exist_ok=True)
        fd = os.open(work("outbox", task_id + ".jsonl"), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    @staticmethod
    def _lines(fd: int) -> list[dict[str, Any]]:
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        return [json.loads(line) for line in b"".join(chunks).splitlines() if line.strip()]

    def _fence(self, fd: int, request: EffectRequest, *, refuse: bool) -> list[dict[str, Any]]:
        lines = self._lines(fd)
        newest = max((int(line["epoch"]) for line in lines), default=0)
        if refuse and request.epoch < newest:
            raise PermanentError(f"stale epoch {request.epoch} < {newest}: the target fences this write")
        if request.epoch > newest:  # this epoch has looked: an older holder may no longer apply
            os.write(fd, (json.dumps({"fence": True, "epoch": request.epoch}) + "\n").encode())
        return lines

    def _log(self, mark: str, request: EffectRequest) -> None:
        fd = os.open(work("concurrency.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, f"{mark} {request.key} {os.getpid()}\n".encode())
        finally:
            os.close(fd)

    def apply(self, request: EffectRequest) -> Receipt:
        if self.fail_first and request.attempt == 1:
            fd = os.open(work("failures.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, f"{request.key} {time.time():.6f}\n".encode())
            finally:
                os.close(fd)
            raise TransientError(f"the target is busy for {request.key}")
        if self.log_concurrency:
            self._log("+", request)
        try:
            if self.apply_s:
                time.sleep(self.apply_s)
            fd = self._open(request.task_id)
            try:
                lines = self._fence(fd, request, refuse=True)
                entry = {"key": request.key, "epoch": request.epoch, "pid": os.getpid(), "at": time.time()}
                os.write(fd, (json.dumps(entry) + "\n").encode())
            finally:
                os.close(fd)
        finally:
            if self.log_concurrency:
                self._log("-", request)
        return Receipt(result={"n": len(lines)}, evidence=f"outbox of {request.task_id}")

    def observe(self, request: EffectRequest) -> Observation:
        fd = self._open(request.task_id)
        try:
            lines = self._fence(fd, request, refuse=False)
        finally:
            os.close(fd)
        if any(line.get("key") == request.key for line in lines):
            return Observation.applied(f"the outbox of {request.task_id} holds {request.key}")
        return Observation.absent(f"no outbox line holds {request.key}")


def outbox_times() -> dict[str, float]:
    """Effect key -> when it was (first) applied, by this machine's clock."""
    times: dict[str, float] = {}
    directory = work("outbox")
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        with open(os.path.join(directory, name), "rb") as handle:
            for line in handle:
                entry = json.loads(line)
                if "key" in entry:
                    times.setdefault(entry["key"], float(entry["at"]))
    return times


def outbox_counts() -> dict[str, int]:
    """Effect key -> how many times it was applied, over every task's outbox."""
    counts: dict[str, int] = {}
    directory = work("outbox")
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        with open(os.path.join(directory, name), "rb") as handle:
            for line in handle:
                entry = json.loads(line)
                if "key" in entry:
                    counts[entry["key"]] = counts.get(entry["key"], 0) + 1
    return counts


STORE = open_store(os.environ[STORE_VARIABLE]) if STORE_VARIABLE in os.environ else None
_common: dict[str, Any] = dict(
    store=STORE,
    lease_ttl_s=LEASE_TTL_S,
    limits=Limits(max_block_s=0.2, max_attempts=5, max_failures=1000),  # workers killed at random: never failed for it
    retry=RetryPolicy(base_delay_s=1.0, max_delay_s=2.0, jitter=0.0),
)

if STORE is not None:

    @longrun.durable(adapters={"send": FleetTarget()}, allowed_actions=("send",), **_common)
    def effects(run: longrun.Run, n: int) -> int:
        """``n`` effects in a row."""
        for i in range(n):
            run.effect(f"e{i}", "send", {"i": i})
        return n

    @longrun.durable(adapters={"send": FleetTarget()}, allowed_actions=("send",), **_common)
    def gated(run: longrun.Run) -> str:
        """One effect, then one that waits for an approval."""
        run.effect("draft", "send", {"text": "draft"})
        run.effect("publish", "send", {"text": "publish"}, approval=True)
        return "published"

    @longrun.durable(adapters={"send": FleetTarget(fail_first=True)}, allowed_actions=("send",), **_common)
    def flaky(run: longrun.Run) -> str:
        """An effect whose first attempt fails transiently: a retry is scheduled a second later."""
        run.effect("once", "send", {"x": 1})
        return "ok"

    @longrun.durable(adapters={"send": FleetTarget()}, allowed_actions=("send",), **_common)
    def sleeper(run: longrun.Run, seconds: float) -> str:
        """A durable timer between two effects."""
        run.effect("before", "send", {"x": 1})
        run.sleep("nap", seconds)
        run.effect("after", "send", {"x": 2})
        return "woke"

    @longrun.durable(adapters={"send": FleetTarget()}, allowed_actions=("send",), **_common)
    def child(run: longrun.Run, name: str) -> str:
        """A child that waits for an approval before its one effect."""
        run.effect("child-effect", "send", {"name": name}, approval=True)
        return f"child {name} done"

    @longrun.durable(adapters={"send": FleetTarget()}, allowed_actions=("send",), **_common)
    def parent(run: longrun.Run, name: str) -> str:
        """Runs a child task to completion, then makes its own effect."""
        value = run.child(f"{name}-child", child, name)
        run.effect("parent-effect", "send", {"child": value})
        return "parent done"

    @longrun.durable(
        adapters={"api": FleetTarget(log_concurrency=True, apply_s=0.05)}, allowed_actions=("api",), **_common
    )
    def limited(run: longrun.Run, n: int) -> int:
        """``n`` effects on the action the limit test bounds."""
        for i in range(n):
            run.effect(f"a{i}", "api", {"i": i})
        return n

    @longrun.durable(adapters={"send": FleetTarget()}, allowed_actions=("send",), **_common)
    def broken(run: longrun.Run) -> str:
        """A function whose own code raises after its first effect."""
        run.effect("first", "send", {"x": 1})
        raise RuntimeError("the function's own bug")

    @longrun.durable(adapters={"send": FleetTarget(apply_s=0.3)}, allowed_actions=("send",), **_common)
    def ticker(run: longrun.Run, slot: str) -> str:
        """A scheduled function: one slow effect per slot (``longrun schedule add ... --function fleet_tasks:ticker``)."""
        run.effect("tick", "send", {"slot": slot})
        return slot

    RATED = longrun.Queue("rated", rate=(4, 2.0))
    """A named queue: at most 4 starts in any 2 seconds across the fleet (the workers define it on import)."""

    @longrun.durable(adapters={"send": FleetTarget(apply_s=0.05)}, allowed_actions=("send",), **_common)
    def rated(run: longrun.Run, n: int) -> int:
        """One effect; its tasks are enqueued in the ``rated`` queue."""
        run.effect("once", "send", {"n": n})
        return n


START_LOG_SQL = {
    "postgresql": [
        """CREATE TABLE IF NOT EXISTS fleet_start_log (seq BIGSERIAL PRIMARY KEY, queue_name TEXT, started_at DOUBLE PRECISION)""",
        """CREATE OR REPLACE FUNCTION fleet_log_start() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
            INSERT INTO fleet_start_log (queue_name, started_at) VALUES (NEW.queue_name, NEW.started_at); RETURN NULL; END $$""",
        "DROP TRIGGER IF EXISTS fleet_log_start ON longrun_queue_starts",
        "CREATE TRIGGER fleet_log_start AFTER INSERT ON longrun_queue_starts FOR EACH ROW EXECUTE FUNCTION fleet_log_start()",
    ],
    "sqlite": [
        "CREATE TABLE IF NOT EXISTS fleet_start_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, queue_name TEXT, started_at REAL)",
        """CREATE TRIGGER IF NOT EXISTS fleet_log_start AFTER INSERT ON longrun_queue_starts BEGIN
            INSERT INTO fleet_start_log (queue_name, started_at) VALUES (NEW.queue_name, NEW.started_at); END""",
    ],
}
"""A test-only log of every start a named queue admitted (the rate limiter prunes its own table)."""

LEASE_LOG_SQL = {
    "postgresql": [
        """CREATE TABLE IF NOT EXISTS fleet_lease_log (seq BIGSERIAL PRIMARY KEY, task_id TEXT, epoch BIGINT, owner TEXT,
            acquired_at DOUBLE PRECISION, expires_at DOUBLE PRECISION, monotonic_clock TEXT,
            monotonic_expires_at DOUBLE PRECISION, logged_at DOUBLE PRECISION DEFAULT EXTRACT(EPOCH FROM clock_timestamp()))""",
        """CREATE OR REPLACE FUNCTION fleet_log_lease() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
            INSERT INTO fleet_lease_log (task_id, epoch, owner, acquired_at, expires_at, monotonic_clock, monotonic_expires_at)
            VALUES (NEW.task_id, NEW.epoch, NEW.owner, NEW.acquired_at, NEW.expires_at, NEW.monotonic_clock,
                    NEW.monotonic_expires_at); RETURN NULL; END $$""",
        "DROP TRIGGER IF EXISTS fleet_log_lease ON longrun_leases",
        "CREATE TRIGGER fleet_log_lease AFTER INSERT OR UPDATE ON longrun_leases FOR EACH ROW EXECUTE FUNCTION fleet_log_lease()",
    ],
    "sqlite": [
        """CREATE TABLE IF NOT EXISTS fleet_lease_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT, epoch INTEGER,
            owner TEXT, acquired_at REAL, expires_at REAL, monotonic_clock TEXT, monotonic_expires_at REAL, logged_at REAL)""",
        """CREATE TRIGGER IF NOT EXISTS fleet_log_lease_insert AFTER INSERT ON longrun_leases BEGIN
            INSERT INTO fleet_lease_log (task_id, epoch, owner, acquired_at, expires_at, monotonic_clock, monotonic_expires_at)
            VALUES (NEW.task_id, NEW.epoch, NEW.owner, NEW.acquired_at, NEW.expires_at, NEW.monotonic_clock,
                    NEW.monotonic_expires_at); END""",
        """CREATE TRIGGER IF NOT EXISTS fleet_log_lease_update AFTER UPDATE ON longrun_leases BEGIN
            INSERT INTO fleet_lease_log (task_id, epoch, owner, acquired_at, expires_at, monotonic_clock, monotonic_expires_at)
            VALUES (NEW.task_id, NEW.epoch, NEW.owner, NEW.acquired_at, NEW.expires_at, NEW.monotonic_clock,
                    NEW.monotonic_expires_at); END""",
    ],
}
"""A test-only log of every lease write, in the database's own order (``seq``), for the check that
no task was held by two runners at once."""


def _execute(statements: list[str]) -> None:
    from longrun.stores.queue import open_queue

    queue = open_queue(STORE)  # type: ignore[arg-type]
    queue.ensure()
    with queue._tables.session("install the lease log"):
        for statement in statements:
            queue._tables.run(statement)
    queue.close()


def main(argv: list[str]) -> None:
    """``prepare`` (tables, the lease log), ``enqueue FUNCTION COUNT ARGS_JSON [PREFIX]`` and ``schedule NAME MINUTES``."""
    command = argv[0]
    if command == "prepare":
        spec = os.environ[STORE_VARIABLE]
        if spec.startswith("sqlite:"):
            _execute(LEASE_LOG_SQL["sqlite"] + START_LOG_SQL["sqlite"])
        elif spec.startswith(("postgresql:", "postgres:")):
            _execute(LEASE_LOG_SQL["postgresql"] + START_LOG_SQL["postgresql"])
        else:  # a JSON-file store: no trigger sees its files; the fleet's side file is SQLite
            _execute(START_LOG_SQL["sqlite"])
    elif command == "enqueue":
        function = globals()[argv[1]]
        arguments = json.loads(argv[3])
        prefix = argv[4] if len(argv) > 4 else "t"
        for i in range(int(argv[2])):
            function.start(f"{prefix}{i}", *arguments)
    elif command == "enqueue-rated":  # enqueue-rated COUNT: tasks r0.. of rated, in the rated queue
        for i in range(int(argv[1])):
            rated.enqueue(f"r{i}", (i,), queue=RATED)
    elif command == "schedule":  # schedule NAME MINUTES: ticker every minute, backfilled from MINUTES ago
        from longrun.schedules import Schedule
        from longrun.stores.queue import open_queue

        queue = open_queue(STORE)  # type: ignore[arg-type]
        try:
            queue.add_schedule(Schedule(argv[1], ticker.name, "* * * * *", "UTC", "backfill"), since=queue.clock() - 60 * int(argv[2]))
        finally:
            queue.close()
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
