"""Per-commit cost of the SQL stores by ledger size: ``python benchmarks/sql_commits.py``.

Each commit changes one effect record (as the runner does per move) on a ledger of 1,000 and of
20,000 effects, the sizes taking turns in blocks of 50 commits. Printed per commit: the median wall time (``fsync`` included) and the mean CPU
time of this process (``time.process_time``: Python and the SQLite library, not the wait for the
disk or the PostgreSQL server). A commit's CPU should not grow with the ledger. SQLite always runs
(a temporary directory beside the working tree, or ``--dir``); PostgreSQL when
``LONGRUN_TEST_POSTGRES_DSN`` is set (in a throwaway schema). Standard library only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import stores  # noqa: E402

from longrun import SqliteStore  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,20000", help="ledger sizes, comma-separated (default 1000,20000)")
    parser.add_argument("--commits", type=int, default=400, help="timed commits per size (default 400)")
    parser.add_argument("--dir", default=None, help="where to put the SQLite file")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    workdir = tempfile.mkdtemp(prefix="longrun-sqlbench-", dir=args.dir or os.path.dirname(HERE))
    cleanups = [lambda: shutil.rmtree(workdir, ignore_errors=True)]
    targets = [("SqliteStore", SqliteStore(os.path.join(workdir, "bench.sqlite"), create=True))]
    if os.environ.get("LONGRUN_TEST_POSTGRES_DSN"):
        import run  # the benchmark's throwaway-schema helper

        made = run.postgres_store(workdir)
        if made is not None:
            targets.append(("PostgresStore", made[0]))
            cleanups.append(made[1])
    else:
        print("PostgresStore: not measured (set LONGRUN_TEST_POSTGRES_DSN to include it)")
    started = time.monotonic()
    try:
        print(f"{'store':<14} {'effects':>8} {'commits':>8} {'wall ms/commit':>15} {'CPU ms/commit':>14}")
        for name, store in targets:
            results = stores.commit_costs(store, sizes, args.commits)
            for size in sizes:
                cost = results[size]
                print(f"{name:<14} {size:>8,} {args.commits:>8} {cost['wall_s'] * 1e3:>15.3f} {cost['cpu_s'] * 1e3:>14.3f}")
            small, large = results[min(sizes)], results[max(sizes)]
            print(f"{name:<14} CPU at {max(sizes):,} / at {min(sizes):,}: {large['cpu_s'] / small['cpu_s']:.2f}x")
            store.close()
    finally:
        for cleanup in reversed(cleanups):
            cleanup()
    print(f"(took {time.monotonic() - started:.0f} s; command: python benchmarks/sql_commits.py {' '.join(sys.argv[1:])})".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
