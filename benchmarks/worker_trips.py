"""Round trips and CPU per task of a worker on PostgreSQL: ``python benchmarks/worker_trips.py``.

Needs ``LONGRUN_TEST_POSTGRES_DSN`` (a database it may create a throwaway schema in) and a driver.
Records ``--tasks`` tasks of 10 effects (``tests/helpers/fleet_tasks.py``: the fleet benchmark's
function and target), then runs a ``Worker`` in this process (``--concurrency`` tasks at once)
until every one is ``done``, and prints, per task, what reached the server through the store's
connection factory (every connection the worker makes: its task threads', its queue's, its
listener's): statements, the ``BEGIN`` the driver sends before the first statement of each
transaction, and ``COMMIT``/``ROLLBACK``; their sum is the round trips. Also the statements by
kind, the process's CPU per effect (``time.process_time``, the worker's start included, the
waiting loop's few reads too) and effects per second. Standard library and the test helpers only.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from fleet import Schema  # noqa: E402
from helpers.fleet_support import tasks_module  # noqa: E402

from longrun.stores._spec import postgres_connector  # noqa: E402


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kinds: collections.Counter[str] = collections.Counter()

    def add(self, kind: str) -> None:
        with self.lock:
            self.kinds[kind] += 1


class CountingConnection:
    """A DB-API connection that counts what it sends: statements, each transaction's BEGIN, its end."""

    def __init__(self, connection: Any, counts: Counts) -> None:
        object.__setattr__(self, "_connection", connection)
        object.__setattr__(self, "_counts", counts)
        object.__setattr__(self, "_open", False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._connection, name, value)

    def _end(self, kind: str, end: Callable[[], None]) -> None:
        if self._open:
            self._counts.add(kind)
            object.__setattr__(self, "_open", False)
        end()

    def commit(self) -> None:
        self._end("COMMIT", self._connection.commit)

    def rollback(self) -> None:
        self._end("ROLLBACK", self._connection.rollback)

    def cursor(self) -> Any:
        owner, cursor = self, self._connection.cursor()

        class Cursor:
            def __getattr__(self, name: str) -> Any:
                return getattr(cursor, name)

            def execute(self, statement: str, params: Any = None) -> Any:
                if not owner._connection.autocommit and not owner._open:
                    owner._counts.add("BEGIN")
                    object.__setattr__(owner, "_open", True)
                owner._counts.add(" ".join(str(statement).split()[:6])[:70])
                return cursor.execute(statement, params) if params is not None else cursor.execute(statement)

        return Cursor()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100, help="tasks of 10 effects (default 100)")
    parser.add_argument("--concurrency", type=int, default=16, help="tasks at once (default 16)")
    args = parser.parse_args()
    url = os.environ.get("LONGRUN_TEST_POSTGRES_DSN")
    if not url:
        print("set LONGRUN_TEST_POSTGRES_DSN to a database this benchmark may create schemas in")
        return 2
    schema = Schema(url)
    work = tempfile.mkdtemp(prefix="longrun-trips-")
    os.environ.update(LONGRUN_FLEET_STORE=schema.spec(), LONGRUN_FLEET_WORK=work)
    try:
        from longrun import PostgresStore
        from longrun.worker import Worker

        fleet_tasks = tasks_module()
        for n in range(args.tasks):
            fleet_tasks.effects.start(f"t{n}", 10)
        counts = Counts()
        connect = postgres_connector(schema.spec())
        store = PostgresStore(lambda: CountingConnection(connect(), counts))
        worker = Worker(store, [fleet_tasks.effects], concurrency=args.concurrency, poll_s=5.0, claim_ttl_s=30.0)
        watch = schema.connect()
        watch.autocommit = True
        cpu, began = time.process_time(), time.monotonic()
        thread = threading.Thread(target=worker.run, name="worker")
        thread.start()
        while True:
            cursor = watch.cursor()
            cursor.execute("SELECT COUNT(*) FROM longrun_summaries WHERE status = 'done'")
            if cursor.fetchone()[0] >= args.tasks:
                break
            time.sleep(0.02)
        cpu, seconds = time.process_time() - cpu, time.monotonic() - began
        with counts.lock:
            kinds = dict(counts.kinds)
        worker.stop()
        thread.join()
        watch.close()
        store.close()
    finally:
        schema.drop()
        shutil.rmtree(work, ignore_errors=True)
    effects = args.tasks * 10
    begins, ends = kinds.get("BEGIN", 0), kinds.get("COMMIT", 0) + kinds.get("ROLLBACK", 0)
    statements = sum(kinds.values()) - begins - ends
    print(f"worker round trips: {args.tasks} tasks x 10 effects, --concurrency {args.concurrency}, Python {sys.version.split()[0]}")
    print(
        f"  per task: {(statements + begins + ends) / args.tasks:.1f} round trips ({statements / args.tasks:.1f} statements, "
        f"{begins / args.tasks:.1f} BEGIN, {ends / args.tasks:.1f} COMMIT/ROLLBACK)"
    )
    print(f"  {effects / seconds:.0f} effects/s, {cpu * 1e3 / effects:.2f} ms CPU per effect (this process: the worker, its start, the wait)")
    print("  per task, by kind:")
    for kind, count in sorted(kinds.items(), key=lambda item: -item[1]):
        if count / args.tasks >= 0.05:
            print(f"    {count / args.tasks:6.2f}  {kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
