"""The worker fleet's throughput and latency on PostgreSQL: ``python benchmarks/fleet.py``.

Needs ``LONGRUN_TEST_POSTGRES_DSN`` (a database it may create throwaway schemas in) and a driver.
Prints, all measured in this run, on this machine:

- the database's floor: single-row ``INSERT`` + ``COMMIT`` transactions per second, on 1, 2, 4 and
  8 connections at once (what no fleet on this database can beat, per committed write);
- throughput: tasks and effects per second with 1, 2 and 4 ``longrun worker`` processes
  (``--concurrency 16`` each: 16 tasks at once per worker) running tasks of 10 effects, from the
  workers' start until the last task is ``done`` (workers start in well under a second; that is
  included), the workers' CPU time per effect (on a machine with few cores, CPU, not the database,
  bounds the fleet; for one worker also without its start-up and drain, the CPU of an idle
  worker's), and the effects per second as a ratio to the floor's commits per second with
  as many connections as the workers run tasks at once (at most 8, the floor's widest), measured
  just before each throughput run (targets for one worker: at least 1,500 effects/s and under
  0.5 ms of worker CPU per effect);
- latency, with the workers polling only every 30 s so that only ``NOTIFY`` and the due-time
  index can explain a quick start: a task enqueued while a worker idles (enqueue -> first apply),
  an approval given while a worker idles (approval written -> the gated effect applied), and a
  retry scheduled 1 s after a transient failure (due time -> the retry's apply).

``--sqlite`` adds the throughput rows for the SQLite store (workers on one machine). Standard
library and the test helpers only (``tests/helpers/fleet_tasks.py``: the durable functions and a target
that keeps one outbox per task).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from helpers.fleet_support import Database, Fleet, fleet_env, helper, tasks_module  # noqa: E402

from longrun.stores._spec import postgres_connector  # noqa: E402


class Schema:
    """A throwaway PostgreSQL schema (what ``tests/pg_support.Schema`` does, without unittest)."""

    def __init__(self, url: str):
        self.url = url
        self._connect = postgres_connector(url)
        self.name = f"lr_fleet_{os.getpid()}_{time.monotonic_ns() % 10**9}"
        self.execute(f"CREATE SCHEMA {self.name}", schema=False)

    def connect(self, *, schema: bool = True) -> Any:
        connection = self._connect()
        if schema:
            connection.cursor().execute(f"SET search_path TO {self.name}")
            connection.commit()
        return connection

    def execute(self, statement: str, params: tuple[Any, ...] = (), *, schema: bool = True) -> list[tuple[Any, ...]]:
        connection = self.connect(schema=schema)
        try:
            cursor = connection.cursor()
            cursor.execute(statement, params) if params else cursor.execute(statement)
            rows = [tuple(row) for row in cursor.fetchall()] if cursor.description else []
            connection.commit()
            return rows
        finally:
            connection.close()

    @staticmethod
    def show(url: str) -> tuple[int, int]:
        """The server's max_connections and the connections open now."""
        connection = postgres_connector(url)()
        try:
            cursor = connection.cursor()
            cursor.execute("SELECT CAST(current_setting('max_connections') AS INTEGER)")
            allowed = int(cursor.fetchone()[0])
            cursor.execute("SELECT COUNT(*) FROM pg_stat_activity")
            in_use = int(cursor.fetchone()[0])
            connection.commit()
            return allowed, in_use
        finally:
            connection.close()

    def spec(self) -> str:
        return f"{self.url}{'&' if '?' in self.url else '?'}options=-csearch_path%3D{self.name}"

    def drop(self) -> None:
        self.execute(f"DROP SCHEMA IF EXISTS {self.name} CASCADE", schema=False)


def floor(schema: Schema, connections: int, seconds: float) -> float:
    """Committed single-row transactions per second over ``connections`` connections at once."""
    schema.execute("CREATE TABLE IF NOT EXISTS floor_rows (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)")
    counts = [0] * connections
    stop = threading.Event()

    def run(index: int) -> None:
        connection = schema.connect()
        cursor = connection.cursor()
        try:
            while not stop.is_set():
                cursor.execute("INSERT INTO floor_rows (body) VALUES ('x')")
                connection.commit()
                counts[index] += 1
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(connections)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.monotonic() - started)


def throughput(
    spec: str, database: Database, work: str, workers: int, tasks: int, effects: int, concurrency: int
) -> tuple[float, float, float, float]:
    """(seconds, tasks/s, effects/s, worker CPU ms per effect) for ``workers`` processes to finish
    ``tasks`` enqueued tasks (CPU: user + system time of the worker processes, start to exit)."""
    helper(spec, work, "enqueue", "effects", str(tasks), f"[{effects}]")
    fleet = Fleet(spec, work, concurrency=concurrency, claim_ttl_s=10.0, poll_s=1.0, lease_ttl_s=10.0)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        started = time.monotonic()
        fleet.start(workers)
        while database.done() < tasks:
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        fleet.wait_ready(database)
        fleet.drain()
    finally:
        fleet.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, tasks / elapsed, tasks * effects / elapsed, cpu * 1e3 / (tasks * effects)


def startup_cpu(spec: str, database: Database, work: str, workers: int, concurrency: int) -> float:
    """Seconds of CPU (user + system) ``workers`` processes spend starting and draining with nothing
    to run: interpreter, imports, connections, schema checks. ``throughput`` counts it too; the
    steady-state figure subtracts it (what a long-lived worker spends per effect)."""
    fleet = Fleet(spec, work, concurrency=concurrency, claim_ttl_s=10.0, poll_s=1.0, lease_ttl_s=10.0)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        fleet.start(workers)
        fleet.wait_ready(database)
        fleet.drain()
    finally:
        fleet.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def wait(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("gave up waiting: the fleet did not do what was asked")
        time.sleep(0.002)


def latency(spec: str, work: str, rounds: int) -> dict[str, list[float]]:
    """Seconds from an event to the apply it should cause, ``rounds`` times each, one idle worker."""
    os.environ.update(fleet_env(spec, work))
    fleet_tasks = tasks_module()  # reads the store and the work directory from the environment now

    from longrun.approval import Approval

    store = fleet_tasks.STORE
    assert store is not None
    helper(spec, work, "prepare")
    fleet = Fleet(spec, work, concurrency=4, claim_ttl_s=10.0, poll_s=30.0, lease_ttl_s=10.0)
    results: dict[str, list[float]] = {"enqueue": [], "approval": [], "retry": []}
    try:
        fleet.start(1)
        for n in range(rounds):
            time.sleep(0.3)  # the worker is idle: nothing due, its next poll 30 s away
            started = time.time()
            fleet_tasks.effects.start(f"new{n}", 1)
            wait(lambda: f"new{n}/e0" in fleet_tasks.outbox_times())
            results["enqueue"].append(fleet_tasks.outbox_times()[f"new{n}/e0"] - started)
        for n in range(rounds):
            fleet_tasks.gated.start(f"gate{n}")
        wait(lambda: all(f"gate{n}/draft" in fleet_tasks.outbox_times() for n in range(rounds)))
        time.sleep(0.5)
        for n in range(rounds):
            wait(lambda: (store.load(f"gate{n}").state.status.value == "awaiting-approval"))  # type: ignore[union-attr]
            time.sleep(0.3)
            request = store.load(f"gate{n}").state.approval_requests["publish"]  # type: ignore[union-attr]
            now = time.time()
            approval = Approval(
                f"ap{n}", f"gate{n}", request.plan_digest, "publish", request.payload_digest, "send", now + 600, "bench", now
            )
            started = time.time()
            store.write_approval(approval)
            wait(lambda: f"gate{n}/publish" in fleet_tasks.outbox_times())
            results["approval"].append(fleet_tasks.outbox_times()[f"gate{n}/publish"] - started)
        for n in range(rounds):
            fleet_tasks.flaky.start(f"flaky{n}")
            wait(lambda: f"flaky{n}/once" in fleet_tasks.outbox_times())
        failures = {}
        with open(os.path.join(work, "failures.log")) as handle:
            for line in handle:
                key, at = line.split()
                failures[key] = float(at)
        applied = fleet_tasks.outbox_times()
        for n in range(rounds):
            key = f"flaky{n}/once"
            results["retry"].append(applied[key] - (failures[key] + 1.0))  # the backoff is 1 s, no jitter
        fleet.wait_ready(_Ready(store))  # type: ignore[arg-type]
        fleet.drain()
    finally:
        fleet.close()
        getattr(store, "close", lambda: None)()
    return results


class _Ready:
    """``Fleet.wait_ready`` reads the workers table through SQL; here through the queue."""

    def __init__(self, store: Any):
        self.store = store

    def rows(self, statement: str) -> list[tuple[Any, ...]]:
        from longrun.stores.queue import open_queue

        queue = open_queue(self.store)
        try:
            return [(record.pid,) for record in queue.workers() if record.state != "stopped"]
        finally:
            queue.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300, help="tasks per throughput run (default 300)")
    parser.add_argument("--effects", type=int, default=10, help="effects per task (default 10)")
    parser.add_argument("--rounds", type=int, default=10, help="latency samples of each kind (default 10)")
    parser.add_argument("--sqlite", action="store_true", help="also measure the SQLite store's throughput")
    parser.add_argument("--concurrency", type=int, default=16, help="tasks at once per worker (default 16)")
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated (default 1,2,4)")
    parser.add_argument("--no-latency", action="store_true", help="skip the latency section")
    args = parser.parse_args()
    url = os.environ.get("LONGRUN_TEST_POSTGRES_DSN")
    if not url:
        print("set LONGRUN_TEST_POSTGRES_DSN to a database this benchmark may create schemas in")
        return 2
    began = time.monotonic()
    print(f"longrun fleet benchmark  {time.strftime('%Y-%m-%d %H:%M')}; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print("(workers, the database server and this script share the machine)\n")
    worker_counts = [int(count) for count in args.workers.split(",")]
    schema = Schema(url)
    try:
        print("PostgreSQL floor: single-row INSERT + COMMIT")
        for connections in (1, 2, 4, 8):
            print(f"  {connections} connection{'s' if connections > 1 else ' '} at once   {floor(schema, connections, 3.0):8.0f} commits/s")
    finally:
        schema.drop()
    print(f"\nThroughput: {args.tasks} tasks x {args.effects} effects, --concurrency {args.concurrency} per worker")
    print(
        f"  {'store':<11} {'workers':>7} {'seconds':>8} {'tasks/s':>8} {'effects/s':>10} {'worker CPU ms/effect':>21} "
        f"{'floor commits/s':>16} {'x floor':>8}"
    )
    for workers in worker_counts:
        # Each worker holds a connection per task it runs, plus its queue's, its listener's and the
        # function module's: a fleet wider than the server's max_connections cannot be measured.
        needed = workers * (args.concurrency + 4)
        allowed, in_use = Schema.show(url)
        if needed > allowed - in_use:
            print(
                f"  {'PostgreSQL':<11} {workers:>7}  not run: it needs about {needed} connections, the server has "
                f"{allowed - in_use} free (max_connections {allowed}, {in_use} in use)"
            )
            continue
        schema = Schema(url)
        work = tempfile.mkdtemp(prefix="longrun-fleetbench-")
        try:
            connections = min(8, workers * args.concurrency)
            floor_rate = floor(schema, connections, 2.0)
            spec = schema.spec()
            helper(spec, work, "prepare")
            database = Database(spec, schema)
            seconds, tasks_s, effects_s, cpu = throughput(spec, database, work, workers, args.tasks, args.effects, args.concurrency)
            print(
                f"  {'PostgreSQL':<11} {workers:>7} {seconds:>8.1f} {tasks_s:>8.1f} {effects_s:>10.0f} {cpu:>21.2f} "
                f"{floor_rate:>16.0f} {effects_s / floor_rate:>7.2f}x"
            )
            if workers == 1:
                started = startup_cpu(spec, database, work, workers, args.concurrency)
                steady = cpu - started * 1e3 / (args.tasks * args.effects)
                print(
                    f"  one worker: {effects_s:.0f} effects/s (target >= 1,500: {'met' if effects_s >= 1500 else 'missed'}), "
                    f"{cpu:.2f} ms CPU per effect (target < 0.5: {'met' if cpu < 0.5 else 'missed'}); "
                    f"of which start-up and drain {started:.2f} s CPU (an idle worker's), {steady:.2f} ms per effect without it"
                )
        finally:
            schema.drop()
            shutil.rmtree(work, ignore_errors=True)
    if args.sqlite:
        for workers in worker_counts:
            work = tempfile.mkdtemp(prefix="longrun-fleetbench-", dir=ROOT)
            try:
                spec = "sqlite:" + os.path.join(work, "tasks.db")
                helper(spec, work, "prepare")
                seconds, tasks_s, effects_s, cpu = throughput(spec, Database(spec), work, workers, args.tasks, args.effects, args.concurrency)
                print(f"  {'SQLite':<11} {workers:>7} {seconds:>8.1f} {tasks_s:>8.1f} {effects_s:>10.0f} {cpu:>21.2f}")
            finally:
                shutil.rmtree(work, ignore_errors=True)
    if args.no_latency:
        print(f"\n(took {time.monotonic() - began:.0f} s; command: python benchmarks/fleet.py {' '.join(sys.argv[1:])})".rstrip())
        return 0
    schema = Schema(url)
    work = tempfile.mkdtemp(prefix="longrun-fleetbench-")
    try:
        results = latency(schema.spec(), work, args.rounds)
    finally:
        schema.drop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nLatency, one idle worker polling every 30 s ({args.rounds} samples each), ms")
    print(f"  {'event -> apply':<44} {'median':>7} {'max':>7}")
    labels = {
        "enqueue": "fn.start called -> its first effect applied",
        "approval": "approval written -> the gated effect applied",
        "retry": "retry due (1 s after a failure) -> applied",
    }
    for kind, samples in results.items():
        print(f"  {labels[kind]:<44} {statistics.median(samples) * 1e3:>7.0f} {max(samples) * 1e3:>7.0f}")
    print(f"\n(took {time.monotonic() - began:.0f} s; command: python benchmarks/fleet.py {' '.join(sys.argv[1:])})".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
