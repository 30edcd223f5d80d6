"""What recording a declared plan's outline costs, for a 100,000-step plan.

``python benchmarks/outline.py`` (standard library only; ``--steps N`` for another size, ``--rounds R``).
A ``Runner`` records its plan's outline (every step id and action, ``RunState.plan_outline``) with
the first revision, so progress ("4 of 6") is known before the steps are planned. This commits the
same state, with ``N`` effect records, with and without an outline, on the JSON-file and SQLite
stores, and prints the cost of the first commit, of a later commit that leaves the outline alone
(the runner's every commit), of a load by a fresh store object, and the bytes the outline adds.
Rounds alternate with and without; the table shows medians of the CPU time of this process (a
commit's fsync waits are not in it: on a shared machine they are noise). Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from longrun import JsonFileStore, SqliteStore  # noqa: E402
from longrun.envelope import PlanOutline  # noqa: E402
from longrun.ledger import EffectRecord  # noqa: E402
from longrun.testing.store_contract import sample_state  # noqa: E402


def measure(kind: str, steps: int, with_outline: bool, commits: int) -> dict[str, float]:
    directory = tempfile.mkdtemp(prefix="longrun-outline-")
    try:
        def open_store() -> JsonFileStore | SqliteStore:
            path = os.path.join(directory, "s" if kind == "json" else "db")
            return JsonFileStore(path, create=True) if kind == "json" else SqliteStore(path, create=True)

        store = open_store()
        state = sample_state("t", effects=0)
        state.effects = {
            f"s{i}": EffectRecord(f"t/s{i}", f"s{i}", "write", {"n": i}, "sha256:" + "0" * 64) for i in range(steps)
        }
        state.plan_outline = PlanOutline(tuple(state.effects), ("write",) * steps) if with_outline else None
        lease = store.acquire_lease("t", "bench", 3600.0, time.time())
        store.load("t", lease=lease)
        started = time.process_time()
        store.commit(lease, state, set(state.effects))
        first = time.process_time() - started
        later = []
        for index in range(commits):
            state.next_action = f"commit {index}"
            started = time.process_time()
            store.commit(lease, state, ())
            later.append(time.process_time() - started)
        fresh = open_store()
        started = time.process_time()
        fresh.load("t")
        load = time.process_time() - started
        for item in (store, fresh):
            close = getattr(item, "close", None)
            if callable(close):
                close()
        return {"first_ms": first * 1e3, "later_us": statistics.median(later) * 1e6, "load_ms": load * 1e3}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commits", type=int, default=100)
    args = parser.parse_args()
    outline = PlanOutline(tuple(f"s{i}" for i in range(args.steps)), ("write",) * args.steps)
    import json

    size = len(json.dumps(outline.to_json(), separators=(",", ":")))
    print(f"plan outline of {args.steps:,} steps: {size:,} bytes as JSON ({size / max(1, args.steps):.1f} B/step)")
    print(f"{'store':8} {'outline':8} {'first commit ms':>16} {'later commit us':>16} {'load ms':>9}   (CPU time, medians of {args.rounds} rounds)")
    for kind in ("json", "sqlite"):
        results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for with_outline in (False, True):
                results[with_outline].append(measure(kind, args.steps, with_outline, args.commits))
        for with_outline in (False, True):
            rows = results[with_outline]
            figures = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
            print(
                f"{kind:8} {'yes' if with_outline else 'no':8} {figures['first_ms']:16.1f} {figures['later_us']:16.0f} {figures['load_ms']:9.1f}"
            )


if __name__ == "__main__":
    main()
