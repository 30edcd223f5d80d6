"""Many tasks in one store: ``python benchmarks/many_tasks.py [--tasks 100000]``.

Fills a store with ``--tasks`` durable-function tasks by ``fn.start_many`` (batches of 1,000) and
prints its rate, then, in interleaved rounds, one ``fn.start`` beside the floor (one one-row
INSERT + COMMIT of the same database: SQLite in WAL with ``synchronous=FULL`` in a file beside the
store; PostgreSQL in a table of the store's schema), and ``longrun ls --limit 50`` (the command's
own function, in this process, so the interpreter's start is not counted), of the whole store and
of one status. Medians of the rounds; the machine may be shared, so read the ratios. SQLite always
runs (a temporary directory beside the working tree, or ``--dir``); PostgreSQL when
``LONGRUN_TEST_POSTGRES_DSN`` is set (in a throwaway schema). Standard library only.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
sys.path.insert(0, HERE)

from longrun import SqliteStore, durable  # noqa: E402
from longrun.cli._inspect import cmd_ls  # noqa: E402


def work(run: Any, n: int) -> int:
    """The durable function the tasks record (never called here)."""
    return n


def measure(name: str, store: Any, floor: Callable[[int], None], tasks: int, rounds: int) -> None:
    import many_tasks  # this module under its own name: a durable function is never one of __main__'s

    fn = durable(store=store)(many_tasks.work)
    started = time.perf_counter()
    cpu = time.process_time()
    for first in range(0, tasks, 1000):
        fn.start_many([(f"bulk-{index}", (index,)) for index in range(first, min(tasks, first + 1000))])
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"{name}: fn.start_many of {tasks:,} tasks: {tasks / wall:,.0f} tasks/s ({wall / tasks * 1e6:.0f} us each, {cpu / tasks * 1e6:.0f} us CPU)")
    starts, floors, pages, status_pages = [], [], [], []
    for index in range(rounds):
        begin = time.perf_counter()
        floor(index)
        floors.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        fn.start(f"one-{index}", index)
        starts.append(time.perf_counter() - begin)
        if index % 10 == 0:
            begin = time.perf_counter()
            cmd_ls(store, name, False, io.StringIO(), limit=50)
            pages.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            cmd_ls(store, name, False, io.StringIO(), limit=50, statuses=["running"])
            status_pages.append(time.perf_counter() - begin)
    start, base = statistics.median(starts), statistics.median(floors)
    print(f"{name}: fn.start {start * 1e3:.2f} ms = {start / base:.2f}x the floor (one-row INSERT + COMMIT, {base * 1e3:.2f} ms); medians of {rounds}")
    print(f"{name}: ls --limit 50 at {tasks + rounds:,} tasks: {statistics.median(pages) * 1e3:.1f} ms; "
          f"ls --status running --limit 50: {statistics.median(status_pages) * 1e3:.1f} ms (medians of {len(pages)})")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks to fill the store with (default 100,000)")
    parser.add_argument("--rounds", type=int, default=200, help="fn.start rounds (default 200)")
    parser.add_argument("--dir", default=None, help="where to put the SQLite files")
    parser.add_argument("--only", choices=("sqlite", "postgres"), default=None)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="longrun-manybench-", dir=args.dir or os.path.dirname(HERE))
    try:
        if args.only != "postgres":
            store = SqliteStore(os.path.join(workdir, "tasks.sqlite"), create=True)
            floor_db = sqlite3.connect(os.path.join(workdir, "floor.sqlite"), isolation_level=None)
            floor_db.execute("PRAGMA journal_mode=WAL")
            floor_db.execute("PRAGMA synchronous=FULL")
            floor_db.execute("CREATE TABLE floor (k TEXT PRIMARY KEY, v TEXT)")

            def sqlite_floor(index: int) -> None:
                floor_db.execute("BEGIN IMMEDIATE")
                floor_db.execute("INSERT INTO floor VALUES (?, ?)", (f"k{index}", "x" * 200))
                floor_db.execute("COMMIT")

            measure("SqliteStore", store, sqlite_floor, args.tasks, args.rounds)
            store.close()
        if args.only != "sqlite" and os.environ.get("LONGRUN_TEST_POSTGRES_DSN"):
            import run  # the benchmark's throwaway-schema helper

            made = run.postgres_store(workdir)
            if made is not None:
                store, cleanup = made
                try:
                    connection = store.connect()
                    connection.cursor().execute("CREATE TABLE floor (k TEXT PRIMARY KEY, v TEXT)")
                    connection.commit()

                    def postgres_floor(index: int) -> None:
                        connection.cursor().execute("INSERT INTO floor VALUES (%s, %s)", (f"k{index}", "x" * 200))
                        connection.commit()

                    measure("PostgresStore", store, postgres_floor, args.tasks, args.rounds)
                    connection.close()
                    store.close()
                finally:
                    cleanup()
        elif args.only != "sqlite":
            print("PostgresStore: not measured (set LONGRUN_TEST_POSTGRES_DSN to include it)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
