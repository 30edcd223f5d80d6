"""Effects in parallel: ``python benchmarks/parallel.py [--quick] [--dir DIR]`` (standard library only).

Prints, every figure measured in the same run on the same disk (a temporary directory beside the
checkout, or ``--dir``), medians of interleaved rounds:

1. Effects per second of one task whose async durable function makes E no-op effects with
   ``asyncio.gather`` and ``max_parallel`` = 1, 4, 16 and 64 (so that many are in flight at once),
   on the JSON-file store and on SQLite, each as a ratio to one sequential writer at the floor: one
   append of 256 B + ``fdatasync`` per effect for the JSON-file store, one committed row per
   transaction (WAL, ``synchronous=FULL``) for SQLite (``floors.py``). Task creation, the lease and
   its release are included, amortized over E effects.
   Beside each, this process's CPU time per effect (``resource.getrusage`` user + system, every
   thread, no disk wait): the ceiling on effects/s that CPU sets. The same at 64 in flight with a
   plain (synchronous) no-op adapter, which the async face runs in worker threads, as a ratio to
   the async adapter's effects/s and CPU.
2. The sequential synchronous face (``run.effect`` in a loop, a plain no-op adapter): seconds and
   CPU per effect and the ratio to the append + ``fdatasync`` floor.
3. A 1 MB payload: seconds per effect of a task of sequential effects that each carry a distinct
   1 MB payload, and the ratio to one ``pwrite`` of 1 MB + ``fdatasync``. The payload is kept as a
   blob (``longrun.stores.blobs``): written once, a new file of 1 MB made durable, so the cost also
   shows beside a second floor, one new 1 MB file written, ``fdatasync``-ed, renamed and its
   directory synced. ``--only large`` runs this section alone.

Unit tests never time anything; this script only prints.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import os
import platform
import resource
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, HERE)

import floors  # noqa: E402
from stores import NoopAdapter  # noqa: E402

import longrun  # noqa: E402
from longrun import JsonFileStore, Observation, Receipt, SqliteStore, Status, Store  # noqa: E402

CONCURRENCY = (1, 4, 16, 64)
MEGABYTE = 1024 * 1024


class AsyncNoop:
    """``NoopAdapter`` with coroutine methods: the async face awaits it, no thread involved."""

    deduplicates = False

    def __init__(self) -> None:
        self.applied: set[str] = set()

    async def apply(self, request: Any) -> Receipt:
        self.applied.add(request.key)
        return Receipt(result=None, evidence="ok")

    async def observe(self, request: Any) -> Observation:
        if request.key in self.applied:
            return Observation.applied("seen")
        return Observation.absent("not seen")


def cpu_seconds() -> float:
    """This process's CPU time so far: user + system, every thread (``resource.getrusage``)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


LAST_CPU_PER_EFFECT = [0.0]
"""The CPU seconds per effect of the latest run measured (around the run itself, as its wall time is)."""


def _finished(outcome: longrun.RunOutcome) -> None:
    if outcome.status is not Status.DONE:
        raise RuntimeError(f"the benchmark run ended {outcome.status.value}: {outcome.next_action}")


def parallel_per_second(store: Store, effects: int, max_parallel: int, adapter: Any = None) -> float:
    """Effects per second for a fresh task of ``effects`` no-op effects awaited together (with
    ``AsyncNoop``, or ``adapter``: a plain one runs in worker threads)."""

    @longrun.durable(
        store=store, adapters={"noop": adapter if adapter is not None else AsyncNoop()}, allowed_actions=("noop",), owner="bench",
        max_parallel=max_parallel,
    )  # fmt: skip
    async def fan_out(run: longrun.AsyncRun, count: int) -> int:
        await asyncio.gather(*(run.effect(f"e/{i}", "noop", {"i": i}) for i in range(count)))
        return count

    gc.collect()
    started, cpu = time.perf_counter(), cpu_seconds()
    outcome = fan_out.run(f"bench-{secrets.token_hex(4)}", effects)
    elapsed = time.perf_counter() - started
    LAST_CPU_PER_EFFECT[0] = (cpu_seconds() - cpu) / effects
    _finished(outcome)
    return effects / elapsed


def sequential_per_effect(store: Store, effects: int, payload: Callable[[int], dict[str, Any]]) -> float:
    """Seconds per effect for a fresh task of ``effects`` effects made one after another (sync face)."""

    @longrun.durable(store=store, adapters={"noop": NoopAdapter()}, allowed_actions=("noop",), owner="bench")
    def one_by_one(run: longrun.Run, count: int) -> int:
        for i in range(count):
            run.effect(f"e/{i}", "noop", payload(i))
        return count

    gc.collect()
    started, cpu = time.perf_counter(), cpu_seconds()
    outcome = one_by_one.run(f"bench-{secrets.token_hex(4)}", effects)
    elapsed = time.perf_counter() - started
    LAST_CPU_PER_EFFECT[0] = (cpu_seconds() - cpu) / effects
    _finished(outcome)
    return elapsed / effects


def megabyte_payload(i: int) -> dict[str, Any]:
    """A distinct 1 MB payload (a string of 1,048,576 ASCII characters)."""
    head = f"{i:08d}"
    return {"blob": head + "x" * (MEGABYTE - len(head))}


def new_file_fdatasync(directory: str, ops: int, size: int) -> float:
    """One new file of ``size`` bytes made durable, as a blob is: written to a temporary name,
    ``fdatasync``, renamed, the directory synced. Seconds per file."""
    fdatasync = getattr(os, "fdatasync", os.fsync)
    block = b"y" * size
    started = time.perf_counter()
    for number in range(ops):
        temp = os.path.join(directory, f"new-{number}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, block)
            fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(temp, os.path.join(directory, f"new-{number}"))
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    elapsed = (time.perf_counter() - started) / ops
    for number in range(ops):
        os.unlink(os.path.join(directory, f"new-{number}"))
    return elapsed


def pwrite_fdatasync(directory: str, ops: int, size: int) -> float:
    """``floors.overwrite_fdatasync`` with ``size`` bytes per write: ``pwrite`` them over zeros
    written (and synced) ahead, then ``fdatasync``. Seconds per write."""
    path = os.path.join(directory, "overwrite-large.bin")
    fdatasync = getattr(os, "fdatasync", os.fsync)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    block = b"y" * size
    try:
        os.write(fd, bytes(size))
        os.fsync(fd)
        started = time.perf_counter()
        for _ in range(ops):
            os.pwrite(fd, block, 0)
            fdatasync(fd)
        return (time.perf_counter() - started) / ops
    finally:
        os.close(fd)
        os.unlink(path)


class Row:
    def __init__(self, key: str, measure: Callable[[str], float], *, effects: bool = False):
        self.key, self.measure, self.effects = key, measure, effects
        self.samples: list[float] = []
        self.cpu: list[float] = []
        """This process's CPU seconds per effect (``resource.getrusage``: user + system, every thread, no disk wait)."""

    @property
    def value(self) -> float:
        return statistics.median(self.samples)

    @property
    def cpu_per_effect(self) -> float:
        return statistics.median(self.cpu)


def rows_for(workdir: str, quick: bool, only: str | None = None) -> tuple[list[Row], list[Callable[[], None]]]:
    effects = 128 if quick else 512
    sequential = 200 if quick else 1000
    large = 4 if quick else 16
    ops = 500 if quick else 2000
    json_store = JsonFileStore(os.path.join(workdir, "json"), create=True)
    sqlite_store = SqliteStore(os.path.join(workdir, "bench.sqlite"), create=True)
    cleanups: list[Callable[[], None]] = [json_store.close, sqlite_store.close]
    rows = [
        Row("floor-append", lambda d: floors.append_fdatasync(d, ops)),
        Row("floor-sqlite", lambda d: floors.sqlite_wal_full(d, ops)),
        Row("floor-1mb", lambda d: pwrite_fdatasync(d, max(4, ops // 50), MEGABYTE)),
        Row("floor-1mb-new", lambda d: new_file_fdatasync(d, max(4, ops // 100), MEGABYTE)),
        Row("sequential-json", lambda d: sequential_per_effect(json_store, sequential, lambda i: {"i": i}), effects=True),
        Row("sequential-1mb", lambda d: sequential_per_effect(json_store, large, megabyte_payload), effects=True),
    ]
    if only == "large":
        return [row for row in rows if row.key in ("floor-1mb", "floor-1mb-new", "sequential-1mb")], cleanups
    for name, store in (("json", json_store), ("sqlite", sqlite_store)):
        for level in CONCURRENCY:
            rows.append(Row(f"{name}-{level}", lambda d, s=store, n=level: parallel_per_second(s, effects, n), effects=True))
    rows.append(Row("json-64-plain", lambda d: parallel_per_second(json_store, effects, 64, NoopAdapter()), effects=True))
    return rows, cleanups





def measure(rows: list[Row], workdir: str, rounds: int) -> None:
    for number in range(rounds):
        order = rows[number % len(rows) :] + rows[: number % len(rows)]  # drift favours no row
        for row in order:
            directory = os.path.join(workdir, f"round-{number}-{row.key}")
            os.makedirs(directory)
            row.samples.append(row.measure(directory))
            if row.effects:
                row.cpu.append(LAST_CPU_PER_EFFECT[0])
            shutil.rmtree(directory, ignore_errors=True)
        print(f"  round {number + 1}/{rounds} done", file=sys.stderr, flush=True)


def report_large(by_key: dict[str, Row]) -> None:
    large_s = by_key["sequential-1mb"].value
    floor_large_s = by_key["floor-1mb"].value
    floor_new_s = by_key["floor-1mb-new"].value
    print(
        f"1 MB payload, sync face, JsonFileStore: {large_s * 1e3:.1f} ms per effect = "
        f"{large_s / floor_large_s:.1f}x one pwrite of 1 MB + fdatasync ({floor_large_s * 1e3:.1f} ms; target <= 3x)"
    )
    print(
        f"  = {large_s / floor_new_s:.1f}x one new 1 MB file made durable (write, fdatasync, rename, directory fsync: "
        f"{floor_new_s * 1e3:.1f} ms), what its blob costs at the least; target <= 3x: {'met' if large_s <= 3 * floor_new_s else 'missed'}"
    )
    cpu = by_key["sequential-1mb"].cpu_per_effect
    print(
        f"  CPU time per effect (this process, no disk wait; the payload built by the benchmark included): {cpu * 1e3:.2f} ms "
        f"= {cpu / floor_new_s:.2f}x the new-file floor"
    )
    samples = by_key["sequential-1mb"].samples
    floors = by_key["floor-1mb"].samples
    print("  per round (effect / pwrite floor of the same round): " + ", ".join(f"{s / f:.1f}x" for s, f in zip(samples, floors)))


def report(rows: list[Row], context: dict[str, str], rounds: int) -> None:
    by_key = {row.key: row for row in rows}
    if "floor-append" not in by_key:  # --only large
        print(f"longrun parallel benchmark (1 MB section), {context['when']}, {context['python']}, {context['system']}, {context['cpus']} CPUs")
        print(f"directory {context['dir']} ({context['fs']}); medians of {rounds} interleaved rounds")
        print()
        report_large(by_key)
        return
    append_s = by_key["floor-append"].value
    sqlite_s = by_key["floor-sqlite"].value
    print(f"longrun parallel benchmark, {context['when']}, {context['python']}, {context['system']}, {context['cpus']} CPUs")
    print(f"directory {context['dir']} ({context['fs']}); medians of {rounds} interleaved rounds")
    print()
    print(f"floor, one append of 256 B + fdatasync:          {append_s * 1e6:9.0f} us  = {1 / append_s:8.0f} writes/s")
    print(f"floor, SQLite WAL synchronous=FULL, 1 row/txn:   {sqlite_s * 1e6:9.0f} us  = {1 / sqlite_s:8.0f} commits/s")
    print()
    print("effects per second, one task, async face, no-op async adapter (ratio: to one sequential writer at the floor)")
    print("and this process's CPU time per effect (every thread; no disk wait): the ceiling on effects/s it sets")
    print(f"{'in flight':>10}  {'JsonFileStore':>14} {'x floor':>8} {'CPU/effect':>11}   {'SqliteStore':>12} {'x floor':>8} {'CPU/effect':>11}")
    for level in CONCURRENCY:
        json_row, sqlite_row = by_key[f"json-{level}"], by_key[f"sqlite-{level}"]
        print(
            f"{level:>10}  {json_row.value:>14.0f} {json_row.value * append_s:>7.2f}x {json_row.cpu_per_effect * 1e6:>8.0f} us"
            f"   {sqlite_row.value:>12.0f} {sqlite_row.value * sqlite_s:>7.2f}x {sqlite_row.cpu_per_effect * 1e6:>8.0f} us"
        )
    plain, json_64_row = by_key["json-64-plain"], by_key["json-64"]
    print(
        f"{'64, plain':>10}  {plain.value:>14.0f} {plain.value * append_s:>7.2f}x {plain.cpu_per_effect * 1e6:>8.0f} us"
        f"   (a synchronous no-op adapter in worker threads: {json_64_row.value / plain.value:.2f}x fewer effects/s and "
        f"{plain.cpu_per_effect / json_64_row.cpu_per_effect:.2f}x the CPU of the async one; target <= 1.5x)"
    )
    print()
    sequential = by_key["sequential-json"]
    sequential_s = sequential.value
    print(
        f"sequential, sync face, JsonFileStore: {sequential_s * 1e6:.0f} us per effect = "
        f"{sequential_s / append_s:.2f}x one append + fdatasync (target <= 2x); {sequential.cpu_per_effect * 1e6:.0f} us CPU "
        "per effect (target <= 80 us)"
    )
    report_large(by_key)
    print()
    json_64 = by_key["json-64"].value * append_s
    sqlite_64 = by_key["sqlite-64"].value * sqlite_s
    print(f"target: 64 in flight >= 3x the floor's effects/s on the JSON-file store: {json_64:.2f}x, {'met' if json_64 >= 3 else 'missed'}")
    cpu_64 = json_64_row.cpu_per_effect * 1e6
    print(f"target: 64 in flight <= 60 us CPU per effect on the JSON-file store: {cpu_64:.0f} us, {'met' if cpu_64 <= 60 else 'missed'}")
    print(f"target: 64 in flight >= 2x the floor's effects/s on SQLite: {sqlite_64:.2f}x, {'met' if sqlite_64 >= 2 else 'missed'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer effects and rounds")
    parser.add_argument("--dir", default=None, help="where to put the files (default: a temporary directory beside the checkout)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--only", choices=("large",), default=None, help="run one section alone: large (the 1 MB payload)")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="longrun-parallel-", dir=args.dir or os.path.dirname(ROOT))
    context = {
        "when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "python": f"Python {platform.python_version()}",
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cpus": str(os.cpu_count()),
        "dir": workdir,
        "fs": _filesystem_of(workdir),
    }
    rounds = args.rounds or (1 if args.quick else 3)
    started = time.perf_counter()
    rows, cleanups = rows_for(workdir, args.quick, args.only)
    try:
        measure(rows, workdir, rounds)
        report(rows, context, rounds)
    finally:
        for cleanup in cleanups:
            cleanup()
        shutil.rmtree(workdir, ignore_errors=True)
    flags = (" --quick" if args.quick else "") + (f" --only {args.only}" if args.only else "")
    print(f"\n(benchmark took {time.perf_counter() - started:.0f} s; command: python benchmarks/parallel.py{flags})")
    return 0


def _filesystem_of(path: str) -> str:
    from run import filesystem_of  # the same description benchmarks/run.py prints

    return filesystem_of(path)


if __name__ == "__main__":
    sys.exit(main())
