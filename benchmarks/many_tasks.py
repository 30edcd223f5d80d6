"""Many tasks in one store: ``python benchmarks/many_tasks.py [--sizes 10000,100000]``.

Fills a store by ``fn.start_many`` (batches of 1,000) up to each size in turn and, at each size,
prints every figure beside its target and a floor measured in the same run, on the same disk or
database:

- ``fn.start_many`` rate while filling (target: at least 5,000 tasks/s); floor: one transaction
  that inserts one 300-byte row per task (executemany), or for the JSON-file store one new file
  per task written and fsynced;
- ``fn.start`` of one more task (target: under 2 ms); floor: one one-row INSERT + COMMIT (SQLite
  in WAL with ``synchronous=FULL``, as the store; PostgreSQL in a table of the store's schema), or
  one new file written, fsynced and its directory fsynced (JSON-file store);
- ``longrun ls --limit 50`` of the whole store and of one status (the command's own function, in
  this process, so the interpreter's start is not counted) and a console page (the task list as
  the console renders it) (target: under 100 ms each); floor: the index query alone (the newest
  50 rows of the summary table, read raw).

Medians of the rounds, interleaved so a busy moment of the machine hits each alike; read the
ratios. SQLite always runs; PostgreSQL when ``LONGRUN_TEST_POSTGRES_DSN`` is set (a throwaway
schema); the JSON-file store at ``--json-sizes`` (its first revisions are written one commit each,
so filling it is slow: 10,000 by default). Standard library only.
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

from longrun import JsonFileStore, SqliteStore, durable  # noqa: E402
from longrun.cli._console_pages import Console  # noqa: E402
from longrun.cli._inspect import cmd_ls  # noqa: E402

ROW = "x" * 300


def work(run: Any, n: int) -> int:
    """The durable function the tasks record (never called here)."""
    return n


class Floors:
    """What one store's figures are measured against, on its own disk or database."""

    def __init__(self, one_commit: Callable[[int], None], many_rows: Callable[[int, int], None], index_page: Callable[[], None]):
        self.one_commit, self.many_rows, self.index_page = one_commit, many_rows, index_page


def timed(action: Callable[[], object]) -> float:
    begin = time.perf_counter()
    action()
    return time.perf_counter() - begin


def measure(name: str, store: Any, floors: Floors, sizes: list[int], rounds: int) -> None:
    import many_tasks  # this module under its own name: a durable function is never one of __main__'s

    fn = durable(store=store)(many_tasks.work)
    console = Console(store, name, read_only=True, approver="bench", sign_key=None, control_root=None)
    filled = 0
    for size in sizes:
        wall = 0.0
        for first in range(filled, size, 1000):
            calls = [(f"bulk-{index}", (index,)) for index in range(first, min(size, first + 1000))]
            wall += timed(lambda: fn.start_many(calls))
        added, filled = size - filled, size
        floor_rate = min(added, 10_000) / timed(lambda: floors.many_rows(size, min(added, 10_000)))
        rate = added / wall
        print(f"{name} @ {size:,} tasks: fn.start_many {rate:,.0f} tasks/s (target >= 5,000/s; floor {floor_rate:,.0f} rows/s, "
              f"{rate / floor_rate:.2f}x of it)")  # fmt: skip
        starts, commits, pages, status_pages, console_pages, index_pages = [], [], [], [], [], []
        for index in range(rounds):
            commits.append(timed(lambda: floors.one_commit(size * 10 + index)))
            starts.append(timed(lambda: fn.start(f"one-{size}-{index}", index)))
            if index % 5 == 0:
                index_pages.append(timed(floors.index_page))
                pages.append(timed(lambda: cmd_ls(store, name, False, io.StringIO(), limit=50)))
                status_pages.append(timed(lambda: cmd_ls(store, name, False, io.StringIO(), limit=50, statuses=["queued"])))
                console_pages.append(timed(lambda: console.task_list({})))
        start, commit = statistics.median(starts), statistics.median(commits)
        floor_page = statistics.median(index_pages)
        print(f"{name} @ {size:,} tasks: fn.start {start * 1e3:.2f} ms (target < 2 ms; floor one commit {commit * 1e3:.2f} ms, "
              f"{start / commit:.2f}x of it); medians of {rounds}")  # fmt: skip
        for what, figures in (("ls --limit 50", pages), ("ls --status queued --limit 50", status_pages), ("console page", console_pages)):
            shown = statistics.median(figures)
            print(f"{name} @ {size:,} tasks: {what} {shown * 1e3:.1f} ms (target < 100 ms; floor the index query "
                  f"{floor_page * 1e3:.2f} ms); medians of {len(figures)}")  # fmt: skip


def sqlite_floors(workdir: str, store_path: str) -> Floors:
    floor_db = sqlite3.connect(os.path.join(workdir, "floor.sqlite"), isolation_level=None)
    floor_db.execute("PRAGMA journal_mode=WAL")
    floor_db.execute("PRAGMA synchronous=FULL")
    floor_db.execute("CREATE TABLE floor (k TEXT PRIMARY KEY, v TEXT)")
    reader = sqlite3.connect(store_path, isolation_level=None)

    def one_commit(index: int) -> None:
        floor_db.execute("BEGIN IMMEDIATE")
        floor_db.execute("INSERT INTO floor VALUES (?, ?)", (f"k{index}", ROW))
        floor_db.execute("COMMIT")

    def many_rows(size: int, count: int) -> None:
        floor_db.execute("BEGIN IMMEDIATE")
        floor_db.executemany("INSERT INTO floor VALUES (?, ?)", [(f"m{size}-{index}", ROW) for index in range(count)])
        floor_db.execute("COMMIT")

    def index_page() -> None:
        reader.execute("SELECT * FROM longrun_summaries ORDER BY updated_at DESC, task_id DESC LIMIT 50").fetchall()

    return Floors(one_commit, many_rows, index_page)


def json_floors(workdir: str, root: str) -> Floors:
    directory = os.path.join(workdir, "floor-files")
    os.mkdir(directory)
    reader: list[sqlite3.Connection] = []

    def write_one(name: str, *, directory_too: bool) -> None:
        fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, ROW.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if directory_too:
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def many_rows(size: int, count: int) -> None:
        for index in range(count):
            write_one(f"m{size}-{index}", directory_too=False)

    def index_page() -> None:
        if not reader:
            reader.append(sqlite3.connect(os.path.join(root, ".summaries.sqlite"), isolation_level=None))
        reader[0].execute("SELECT * FROM summaries ORDER BY updated_at DESC, task_id DESC LIMIT 50").fetchall()

    return Floors(lambda index: write_one(f"k{index}", directory_too=True), many_rows, index_page)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="store sizes to measure at, in order (default 10000,100000)")
    parser.add_argument("--json-sizes", default="10000", help="the JSON-file store's sizes (default 10000)")
    parser.add_argument("--rounds", type=int, default=50, help="fn.start rounds at each size (default 50)")
    parser.add_argument("--dir", default=None, help="where to put the store files")
    parser.add_argument("--only", choices=("sqlite", "postgres", "json"), default=None)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",") if size]
    json_sizes = [int(size) for size in args.json_sizes.split(",") if size]
    workdir = tempfile.mkdtemp(prefix="longrun-manybench-", dir=args.dir or os.path.dirname(HERE))
    try:
        if args.only in (None, "sqlite"):
            path = os.path.join(workdir, "tasks.sqlite")
            store = SqliteStore(path, create=True)
            store.list_tasks()  # the schema, before the floor's reader opens the file
            measure("SqliteStore", store, sqlite_floors(workdir, path), sizes, args.rounds)
            store.close()
        if args.only in (None, "json"):
            root = os.path.join(workdir, "tasks-json")
            json_store = JsonFileStore(root, create=True)
            json_store.create_root()
            measure("JsonFileStore", json_store, json_floors(workdir, root), json_sizes, args.rounds)
            json_store.close()
        if args.only in (None, "postgres") and os.environ.get("LONGRUN_TEST_POSTGRES_DSN"):
            import run  # the benchmark's throwaway-schema helper

            made = run.postgres_store(workdir)
            if made is not None:
                pg_store, cleanup = made
                try:
                    connection = pg_store.connect()
                    connection.cursor().execute("CREATE TABLE floor (k TEXT PRIMARY KEY, v TEXT)")
                    connection.commit()
                    pg_store.list_tasks()

                    def one_commit(index: int) -> None:
                        connection.cursor().execute("INSERT INTO floor VALUES (%s, %s)", (f"k{index}", ROW))
                        connection.commit()

                    def many_rows(size: int, count: int) -> None:
                        connection.cursor().executemany("INSERT INTO floor VALUES (%s, %s)", [(f"m{size}-{index}", ROW) for index in range(count)])
                        connection.commit()

                    def index_page() -> None:
                        cursor = connection.cursor()
                        cursor.execute("SELECT * FROM longrun_summaries ORDER BY updated_at DESC NULLS LAST, task_id DESC LIMIT 50")
                        cursor.fetchall()
                        connection.commit()

                    measure("PostgresStore", pg_store, Floors(one_commit, many_rows, index_page), sizes, args.rounds)
                    connection.close()
                    pg_store.close()
                finally:
                    cleanup()
        elif args.only == "postgres":
            print("PostgresStore: not measured (set LONGRUN_TEST_POSTGRES_DSN to include it)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
