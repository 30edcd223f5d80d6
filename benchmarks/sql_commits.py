"""Per-commit cost of the SQL stores by ledger size: ``python benchmarks/sql_commits.py``.

Each commit changes one effect record (as the runner does per move) on a ledger of 1,000 and of
20,000 effects, the sizes taking turns in blocks of 50 commits. Printed per commit: the median wall time (``fsync`` included) and the mean CPU
time of this process (``time.process_time``: Python and the SQLite library, not the wait for the
disk or the PostgreSQL server). A commit's CPU should not grow with the ledger. SQLite always runs
(a temporary directory beside the working tree, or ``--dir``); PostgreSQL when
``LONGRUN_TEST_POSTGRES_DSN`` is set (in a throwaway schema). Standard library only.

With PostgreSQL, a second table sets the store beside the database's floor, every figure measured
in this run on the same connection kind (the store's driver), in interleaved rounds (medians):

- the floor: one single-row ``INSERT`` + ``COMMIT`` on one connection (seconds per commit, and
  commits per second);
- the round trips of one commit of one changed record, counted at the driver (statements sent, and
  ``COMMIT``/``ROLLBACK`` calls; a statement outside autocommit also costs the driver's ``BEGIN``);
- a sequential durable effect (a durable function making no-op effects one after another, sync
  face), as a ratio to the floor's seconds per commit (target: at most 2x);
- 200 effects gathered (``asyncio.gather``, async no-op adapter, ``max_parallel`` 16, the default),
  effects per second as a ratio to the floor's commits per second (target: at least 1x).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import parallel  # noqa: E402
import stores  # noqa: E402

from longrun import SqliteStore  # noqa: E402


class _Counted:
    """A DB-API connection that counts what it sends: statements (and whether a transaction was
    open for them, which costs the driver a BEGIN), COMMITs and ROLLBACKs."""

    def __init__(self, connection: Any, counts: dict[str, int]) -> None:
        object.__setattr__(self, "_connection", connection)
        object.__setattr__(self, "_counts", counts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._connection, name, value)

    def commit(self) -> None:
        self._counts["COMMIT"] += 1
        self._connection.commit()

    def rollback(self) -> None:
        self._counts["ROLLBACK"] += 1
        self._connection.rollback()

    def cursor(self) -> Any:
        return _CountedCursor(self._connection, self._connection.cursor(), self._counts)


class _CountedCursor:
    def __init__(self, connection: Any, cursor: Any, counts: dict[str, int]) -> None:
        self._connection, self._cursor, self._counts = connection, cursor, counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def execute(self, statement: str, params: Any = ()) -> Any:
        self._counts["statements"] += 1
        self._counts["in a transaction"] += not self._connection.autocommit
        return self._cursor.execute(statement, params)


def round_trips(factory: Callable[[], Any]) -> dict[str, int]:
    """What one commit of one changed record sends, counted at the driver (the third such commit)."""
    from longrun.stores.postgres import PostgresStore

    counts = {"statements": 0, "in a transaction": 0, "COMMIT": 0, "ROLLBACK": 0}
    store = PostgresStore(lambda: _Counted(factory(), counts))
    try:
        loop = stores.CommitLoop(store, 100)
        loop.run(2)
        counts.update({name: 0 for name in counts})
        loop.run(1)
        return dict(counts)
    finally:
        store.close()


def postgres_floor(factory: Callable[[], Any], commits: int) -> float:
    """Seconds per single-row INSERT + COMMIT on one connection (the store's own driver)."""
    connection = factory()
    try:
        cursor = connection.cursor()
        cursor.execute("CREATE TABLE IF NOT EXISTS floor_rows (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)")
        connection.commit()
        started = time.perf_counter()
        for _ in range(commits):
            cursor.execute("INSERT INTO floor_rows (body) VALUES ('x')")
            connection.commit()
        return (time.perf_counter() - started) / commits
    finally:
        connection.close()


def postgres_beside_floor(store: Any, factory: Callable[[], Any], rounds: int, effects: int) -> None:
    """The second table (see the module docstring): medians of ``rounds`` interleaved rounds."""
    counts = round_trips(factory)
    floors: list[float] = []
    sequential: list[float] = []
    gathered: list[float] = []
    cpu = {"sequential": 0.0, "gathered": 0.0}
    for _ in range(rounds):
        floors.append(postgres_floor(factory, effects))
        started = time.process_time()
        sequential.append(parallel.sequential_per_effect(store, effects, lambda i: {"i": i}))
        cpu["sequential"] += (time.process_time() - started) / (effects * rounds)
        started = time.process_time()
        gathered.append(parallel.parallel_per_second(store, 200, 16))
        cpu["gathered"] += (time.process_time() - started) / (200 * rounds)
    floor_s, sequential_s, gathered_rate = statistics.median(floors), statistics.median(sequential), statistics.median(gathered)
    print(f"\nPostgreSQL beside its floor (medians of {rounds} interleaved rounds)")
    print(f"  floor: one-row INSERT + COMMIT, one connection   {floor_s * 1e6:9.0f} us = {1 / floor_s:7.0f} commits/s")
    print(
        f"  one commit of one changed record sends           {counts['statements']} statement(s), "
        f"{counts['in a transaction']} inside a transaction (each costs a BEGIN), {counts['COMMIT']} COMMIT, {counts['ROLLBACK']} ROLLBACK"
    )
    print(
        f"  sequential durable effect (sync face)            {sequential_s * 1e6:9.0f} us = "
        f"{sequential_s / floor_s:5.2f}x the floor (target <= 2x: {'met' if sequential_s <= 2 * floor_s else 'missed'})"
    )
    print(
        f"  200 effects gathered (async, max_parallel 16)    {gathered_rate:9.0f} effects/s = "
        f"{gathered_rate * floor_s:5.2f}x the floor's rate (target >= 1x: {'met' if gathered_rate * floor_s >= 1 else 'missed'})"
    )
    print(
        f"  this process's CPU per effect (time.process_time): sequential {cpu['sequential'] * 1e6:.0f} us, "
        f"gathered {cpu['gathered'] * 1e6:.0f} us"
    )
    print("  per round (sequential / floor, gathered x floor): " + ", ".join(
        f"{s / f:.2f}x / {g * f:.2f}x" for f, s, g in zip(floors, sequential, gathered)
    ))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,20000", help="ledger sizes, comma-separated (default 1000,20000)")
    parser.add_argument("--commits", type=int, default=400, help="timed commits per size (default 400)")
    parser.add_argument("--dir", default=None, help="where to put the SQLite file")
    parser.add_argument("--rounds", type=int, default=5, help="PostgreSQL rounds beside the floor (default 5)")
    parser.add_argument("--effects", type=int, default=300, help="sequential effects (and floor commits) per round (default 300)")
    parser.add_argument("--only-floor", action="store_true", help="PostgreSQL beside its floor only (skip the ledger sizes)")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    workdir = tempfile.mkdtemp(prefix="longrun-sqlbench-", dir=args.dir or os.path.dirname(HERE))
    cleanups = [lambda: shutil.rmtree(workdir, ignore_errors=True)]
    targets = [("SqliteStore", SqliteStore(os.path.join(workdir, "bench.sqlite"), create=True))]
    postgres: tuple[Any, Callable[[], Any]] | None = None
    if os.environ.get("LONGRUN_TEST_POSTGRES_DSN"):
        import run  # the benchmark's throwaway-schema helper

        made = run.postgres_store(workdir)
        if made is not None:
            targets.append(("PostgresStore", made[0]))
            cleanups.append(made[1])
            postgres = made[0], made[0].connect
    else:
        print("PostgresStore: not measured (set LONGRUN_TEST_POSTGRES_DSN to include it)")
    started = time.monotonic()
    try:
        print(f"{'store':<14} {'effects':>8} {'commits':>8} {'wall ms/commit':>15} {'CPU ms/commit':>14}")
        for name, store in targets if not args.only_floor else []:
            results = stores.commit_costs(store, sizes, args.commits)
            for size in sizes:
                cost = results[size]
                print(f"{name:<14} {size:>8,} {args.commits:>8} {cost['wall_s'] * 1e3:>15.3f} {cost['cpu_s'] * 1e3:>14.3f}")
            small, large = results[min(sizes)], results[max(sizes)]
            print(f"{name:<14} CPU at {max(sizes):,} / at {min(sizes):,}: {large['cpu_s'] / small['cpu_s']:.2f}x")
        if postgres is not None:
            postgres_beside_floor(postgres[0], postgres[1], args.rounds, args.effects)
        for _, store in targets:
            store.close()
    finally:
        for cleanup in reversed(cleanups):
            cleanup()
    print(f"(took {time.monotonic() - started:.0f} s; command: python benchmarks/sql_commits.py {' '.join(sys.argv[1:])})".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
