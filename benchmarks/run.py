"""longrun's durability benchmark: ``python benchmarks/run.py`` from a checkout (standard library only).

Prints one table, everything measured in the same run on the same disk (a temporary directory
beside the working tree, or ``--dir``):

1. Per durably recorded step: the floors (append + fdatasync; write temp + fsync + rename + fsync
   directory; SQLite WAL with synchronous=FULL; overwrite of preallocated zeros + fdatasync),
   longrun's Runner with a no-op adapter on each store longrun ships that can run here, and the
   peers that are installed (LangGraph + SqliteSaver, DBOS on SQLite; DBOS on PostgreSQL, in the
   row after the PostgresStore's, when the PostgreSQL store runs), each as a ratio to the
   append + fdatasync floor. Measured in interleaved rounds; the table shows medians.
2. Per transition at ledger sizes of 10 to 100,000 effects (a direct store loop, one changed effect
   record per commit, amortized over a full compaction cycle), recovery time with an empty journal
   and with the longest journal a load can meet, bytes on disk per effect, and peak memory.
3. The performance targets, each met or missed, with the figures.

``--quick`` is a smoke run (sizes up to 10,000, fewer rounds); its figures are noisier.
Peers are optional: install ``langgraph langgraph-checkpoint-sqlite dbos`` into the interpreter
that runs this to include them; PostgreSQL runs when ``LONGRUN_TEST_POSTGRES_DSN`` is set and
``psycopg`` or ``pg8000`` imports (in a throwaway schema), and DBOS on the same server when
``dbos`` and ``psycopg`` import (its system database in a throwaway database the peer creates and
drops). Unit tests never time anything.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))

import floors  # noqa: E402
import stores  # noqa: E402

from longrun import JsonFileStore  # noqa: E402


def filesystem_of(path: str) -> str:
    """The mount that holds ``path`` (device and type), from /proc/mounts where there is one."""
    try:
        with open("/proc/mounts") as handle:
            mounts = [line.split() for line in handle]
    except OSError:
        return "unknown file system"
    path = os.path.realpath(path)
    best = max((m for m in mounts if path == m[1] or path.startswith(m[1].rstrip("/") + "/")), key=lambda m: len(m[1]), default=None)
    return f"{best[2]} on {best[0]}" if best else "unknown file system"


# -- per durably recorded step ------------------------------------------------------------------


class Row:
    def __init__(self, key: str, label: str, measure: Callable[[str], float] | None, *, rounds: int | None = None, note: str = ""):
        self.key, self.label, self.measure, self.rounds, self.note = key, label, measure, rounds, note
        self.samples: list[float] = []

    @property
    def value(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


def peer_row(key: str, steps: int, quick: bool) -> Row:
    row = Row(key, key, None)

    def measure(directory: str) -> float:
        completed = subprocess.run(
            [sys.executable, os.path.join(HERE, "peers.py"), key, str(steps), directory],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
        result = json.loads(lines[-1]) if lines else {"skipped": f"exited {completed.returncode}: {completed.stderr[-300:]}"}
        if "skipped" in result:
            row.note = result["skipped"]
            row.measure = None
            raise LookupError(result["skipped"])
        row.label = f"peer: {result['label']}, {steps}-step loop"
        row.note = result.get("detail", "")
        return float(result["per_step_s"])

    row.measure = measure
    return row


def postgres_store(directory: str) -> tuple[Any, Callable[[], None]] | None:
    """A PostgresStore in a throwaway schema, or None (with the reason printed by the caller)."""
    from longrun.stores._spec import postgres_connector
    from longrun.stores.postgres import PostgresStore

    url = os.environ["LONGRUN_TEST_POSTGRES_DSN"]
    connect = postgres_connector(url)
    schema = f"lr_bench_{os.getpid()}_{int(time.time())}"

    def run(statement: str) -> None:
        connection = connect()
        try:
            connection.cursor().execute(statement)
            connection.commit()
        finally:
            connection.close()

    run(f"CREATE SCHEMA {schema}")

    def factory() -> Any:
        connection = connect()
        connection.cursor().execute(f"SET search_path TO {schema}")
        connection.commit()
        return connection

    store = PostgresStore(factory)
    return store, lambda: run(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def per_step_rows(workdir: str, quick: bool) -> tuple[list[Row], list[Callable[[], None]]]:
    ops = 500 if quick else 2000
    cleanups: list[Callable[[], None]] = []
    json_store = JsonFileStore(os.path.join(workdir, "runner-json"), create=True)
    cleanups.append(json_store.close)
    rows = [
        Row("append", "floor: append 256 B + fdatasync", lambda d: floors.append_fdatasync(d, ops)),
        Row("replace", "floor: write temp + fsync + rename + fsync dir", lambda d: floors.atomic_replace(d, ops // 4)),
        Row("sqlite", "floor: sqlite3 WAL, synchronous=FULL, 1 row/commit", lambda d: floors.sqlite_wal_full(d, ops)),
        Row("overwrite", "floor: pwrite into preallocated zeros + fdatasync", lambda d: floors.overwrite_fdatasync(d, ops)),
        Row("runner-100", "longrun Runner + JsonFileStore, 100-effect plan", lambda d: stores.runner_per_effect(json_store, 100)),
        Row("runner-1000", "longrun Runner + JsonFileStore, 1,000-effect plan", lambda d: stores.runner_per_effect(json_store, 1000)),
    ]
    if not quick:
        rows.append(
            Row("runner-10000", "longrun Runner + JsonFileStore, 10,000-effect plan", lambda d: stores.runner_per_effect(json_store, 10_000), rounds=1)
        )
    if importlib.util.find_spec("longrun.stores.sqlite") is not None:
        from longrun.stores.sqlite import SqliteStore

        sqlite_store = SqliteStore(os.path.join(workdir, "runner.sqlite"), create=True)
        cleanups.append(getattr(sqlite_store, "close", lambda: None))
        rows.append(Row("runner-sqlite", "longrun Runner + SqliteStore, 1,000-effect plan", lambda d: stores.runner_per_effect(sqlite_store, 1000)))
    else:
        rows.append(Row("runner-sqlite", "longrun Runner + SqliteStore", None, note="longrun.stores.sqlite is not in this checkout"))
    postgres_label = "longrun Runner + PostgresStore, 1,000-effect plan"
    if not os.environ.get("LONGRUN_TEST_POSTGRES_DSN"):
        rows.append(Row("runner-postgres", postgres_label, None, note="set LONGRUN_TEST_POSTGRES_DSN to include it"))
    elif not (importlib.util.find_spec("psycopg") or importlib.util.find_spec("pg8000")):
        rows.append(Row("runner-postgres", postgres_label, None, note="neither psycopg nor pg8000 is installed"))
    else:
        try:
            made = postgres_store(workdir)
        except Exception as exc:  # noqa: BLE001 - reported in the table, not fatal
            rows.append(Row("runner-postgres", postgres_label, None, note=f"could not connect: {exc}"[:120]))
        else:
            assert made is not None
            pg_store, drop = made
            cleanups.append(drop)
            rows.append(Row("runner-postgres", postgres_label, lambda d: stores.runner_per_effect(pg_store, 1000)))
    # Beside the PostgresStore row: the same loop through DBOS with its system database on that server.
    rows.append(peer_row("dbos-postgres", 100 if quick else 300, quick))
    rows.append(peer_row("langgraph", 200 if quick else 500, quick))
    rows.append(peer_row("dbos", 100 if quick else 300, quick))
    return rows, cleanups


def measure_rounds(rows: list[Row], workdir: str, rounds: int) -> None:
    for round_number in range(rounds):
        # Rotate the order each round so slow drift of the disk does not favour one row.
        order = rows[round_number % len(rows) :] + rows[: round_number % len(rows)]
        for row in order:
            if row.measure is None or (row.rounds is not None and len(row.samples) >= row.rounds):
                continue
            directory = os.path.join(workdir, f"round-{round_number}-{row.key}")
            os.makedirs(directory, exist_ok=True)
            try:
                row.samples.append(row.measure(directory))
            except LookupError:
                pass  # a peer that is not installed: its note says so
            shutil.rmtree(directory, ignore_errors=True)
        print(f"  round {round_number + 1}/{rounds} done", file=sys.stderr, flush=True)


# -- the ledger sizes ------------------------------------------------------------------------


def ledger_sizes(workdir: str, sizes: list[int]) -> list[dict[str, Any]]:
    tasks = [stores.LedgerTask(size, os.path.join(workdir, f"ledger-{size}")) for size in sizes]
    for task in tasks:
        task.build()
        print(f"  ledger of {task.size:,} effects built", file=sys.stderr, flush=True)
    empty = {task.size: task.time_load() for task in tasks}
    largest = tasks[-1]
    # A full compaction cycle of the largest ledger, every size in step with it.
    stores.interleave(tasks, 200, lambda: largest.compactions >= 1)
    print(f"  {len(largest.times):,} transitions per size, interleaved", file=sys.stderr, flush=True)
    results = []
    for task in tasks:
        summary = task.summary()
        task.fill_journal(0.95)  # the longest journal a load meets: just under the compaction trigger
        files = task.files()
        results.append(
            {
                "size": task.size,
                **summary,
                "recovery_empty_s": empty[task.size],
                "recovery_full_s": task.time_load(),
                "journal_bytes": files["journal"],
                "snapshot_bytes": files["snapshot"],
                "snapshot_journal_per_effect": (files["snapshot"] + files["journal"]) / task.size,
                "all_files_per_effect": files["all_files"] / task.size,
                "allocated_per_effect": files["allocated"] / task.size,
                "load_peak_bytes": task.load_peak_memory(),
            }
        )
        task.store.close()
        print(f"  ledger of {task.size:,} effects measured", file=sys.stderr, flush=True)
    return results


# -- the report ------------------------------------------------------------------------------


def us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.0f}"


def print_report(rows: list[Row], ledgers: list[dict[str, Any]], context: dict[str, str], rounds: int) -> dict[str, Any]:
    by_key = {row.key: row for row in rows}
    floor = by_key["append"].value
    print()
    print(f"longrun durability benchmark  {context['when']}")
    print(f"{context['python']}, {context['system']}, {context['cpus']} CPUs; files in {context['dir']} ({context['fs']})")
    print()
    print(f"Per durably recorded step (median of {rounds} interleaved rounds)")
    print(f"  {'':58} {'us/step':>9} {'x append+fdatasync':>19}")
    for row in rows:
        value = row.value
        if value is None:
            print(f"  {row.label:58} {'skipped':>9}   {row.note}")
            continue
        ratio = f"{value / floor:.2f}" if floor else "-"
        note = f"   {row.note}" if row.note else ""
        single = " (1 round)" if row.rounds == 1 else ""
        print(f"  {row.label:58} {us(value):>9} {ratio:>19}{note}{single}")
    print("  not measured: Restate (needs its server), AWS Lambda Powertools idempotency (needs a")
    print("  persistence layer of its own over SQLite).")
    print()
    print("Per transition by ledger size (direct store loop: one changed effect record per commit;")
    print("amortized = every commit timed, compactions included, over a full compaction cycle of the largest)")
    base = ledgers[0]["amortized_s"] if ledgers else None
    print(
        f"  {'effects':>9} {'amortized':>10} {'median':>7} {'p99':>7} {'x 10':>6} {'compactions':>12} "
        f"{'recovery':>9} {'recovery':>9} {'snapshot+':>10} {'all files':>10} {'load peak':>10}"
    )
    print(
        f"  {'':>9} {'us':>10} {'us':>7} {'us':>7} {'':>6} {'(slowest ms)':>12} "
        f"{'empty ms':>9} {'full ms':>9} {'journal B/e':>10} {'B/effect':>10} {'MiB':>10}"
    )
    for item in ledgers:
        print(
            f"  {item['size']:>9,} {us(item['amortized_s']):>10} {us(item['median_s']):>7} {us(item['p99_s']):>7} "
            f"{item['amortized_s'] / base:>6.2f} {item['compactions']:>4} ({item['compaction_s'] * 1e3:>5.0f}) "
            f"{item['recovery_empty_s'] * 1e3:>9.1f} {item['recovery_full_s'] * 1e3:>9.1f} "
            f"{item['snapshot_journal_per_effect']:>10,.0f} {item['all_files_per_effect']:>10,.0f} {item['load_peak_bytes'] / 2**20:>10.1f}"
        )
    print("  recovery: a fresh store object loads the task (warm page cache), with the journal just compacted")
    print("  (empty) and just under the compaction trigger (full: the longest a load ever replays). Bytes at")
    print("  'full': snapshot + journal content; all files adds the backup snapshot, its journal and padding.")
    print(f"  peak RSS of this benchmark process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")
    return targets(by_key, ledgers, floor)


def targets(by_key: dict[str, Row], ledgers: list[dict[str, Any]], floor: float | None) -> dict[str, Any]:
    print()
    print("Targets")
    verdicts: dict[str, Any] = {}

    def line(name: str, figure: str, met: bool | None) -> None:
        verdicts[name] = met
        mark = "n/a" if met is None else ("met" if met else "MISSED")
        print(f"  {name:58} {figure:>24}  {mark}")

    for key in ("runner-100", "runner-1000", "runner-10000"):
        value = by_key[key].value if key in by_key else None
        if value is not None and floor:
            line(f"Runner per effect <= 1.3x append+fdatasync ({key[7:]} plan)", f"{value / floor:.2f}x", value / floor <= 1.3)
    sizes = {item["size"]: item for item in ledgers}
    if 10 in sizes and 100_000 in sizes:
        ratio = sizes[100_000]["amortized_s"] / sizes[10]["amortized_s"]
        line("Per transition at 100,000 effects <= 1.2x at 10", f"{ratio:.2f}x", ratio <= 1.2)
        recovery = sizes[100_000]["recovery_full_s"]
        line("Recovery of 100,000 effects < 1 s (longest journal)", f"{recovery:.2f} s", recovery < 1.0)
        per_effect = sizes[100_000]["snapshot_journal_per_effect"]
        line("Journal + snapshot < 400 B/effect at 100,000", f"{per_effect:,.0f} B", per_effect < 400)
        every = sizes[100_000]["all_files_per_effect"]
        print(f"  {'  (all files, with the backup generation and padding)':58} {every:>22,.0f} B  (reported)")
    peers = [row for key, row in by_key.items() if key in ("langgraph", "dbos") and row.value is not None]
    ours = by_key["runner-1000"].value
    if peers and ours:
        fastest = min(peers, key=lambda row: row.value)  # type: ignore[arg-type,return-value]
        speedup = fastest.value / ours  # type: ignore[operator]
        line(f">= 2x faster than the fastest peer measured ({fastest.key})", f"{speedup:.1f}x", speedup >= 2.0)
    else:
        line(">= 2x faster than the fastest peer measured", "no peer installed", None)
    postgres, dbos_postgres = by_key["runner-postgres"].value, by_key["dbos-postgres"].value
    if postgres and dbos_postgres:
        print(f"  {'  (on PostgreSQL: DBOS per step / PostgresStore per effect)':58} {dbos_postgres / postgres:>23.1f}x  (reported)")
    return verdicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: smaller sizes, fewer rounds")
    parser.add_argument("--dir", default=None, help="where to put the files (default: a temporary directory beside the checkout)")
    parser.add_argument("--json", default=None, help="also write every figure to this JSON file")
    args = parser.parse_args()
    parent = args.dir or os.path.dirname(ROOT)
    workdir = tempfile.mkdtemp(prefix="longrun-bench-", dir=parent)
    context = {
        "when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "python": f"Python {platform.python_version()}",
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cpus": str(os.cpu_count()),
        "dir": workdir,
        "fs": filesystem_of(workdir),
    }
    rounds = 2 if args.quick else 5
    sizes = [10, 1000, 10_000] if args.quick else [10, 1000, 10_000, 100_000]
    started = time.perf_counter()
    cleanups: list[Callable[[], None]] = []
    try:
        print("per-step rows ...", file=sys.stderr, flush=True)
        rows, cleanups = per_step_rows(workdir, args.quick)
        measure_rounds(rows, workdir, rounds)
        print("ledger sizes ...", file=sys.stderr, flush=True)
        ledgers = ledger_sizes(workdir, sizes)
        verdicts = print_report(rows, ledgers, context, rounds)
    finally:
        for cleanup in cleanups:
            try:
                cleanup()
            except Exception as exc:  # noqa: BLE001 - cleanup must not hide the results
                print(f"cleanup failed: {exc}", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n(benchmark took {time.perf_counter() - started:.0f} s; command: python benchmarks/run.py{' --quick' if args.quick else ''})")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {"context": context, "per_step": {row.key: {"label": row.label, "samples_s": row.samples, "note": row.note} for row in rows},
                 "ledgers": ledgers, "targets": verdicts},
                handle, indent=2,
            )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
