"""What one ``Runner.run()`` call costs, with and without the observe before its first apply.

``python benchmarks/invocation.py`` (standard library only; ``--quick`` for a smoke run). Every
``run()`` call observes the effect it is about to apply first (and each one after it, until one is
observed absent), so that a state rolled back further than any check can see verifies its effects
instead of repeating them. This prints what that costs per call, on the JSON-file and SQLite
stores, in two shapes of call:

- fresh: a one-effect task from nothing to ``done`` (lease, first revision, the observe, the
  effect's start, apply, its verification, release): the whole fixed cost of a call;
- resume: a call that continues a task whose earlier steps are done and applies one more effect
  (the shape of a recovery trigger that fires every few minutes).

"without" is the same Runner with that one observe skipped (its engine's invocations start with
``observe_next`` off; nothing else differs).
The target is ``stores.NoopAdapter`` (a set lookup), so the difference is the runner's own cost of
the extra observe; at a real target add one ``observe`` call (a read, or a network round trip).
Rounds are interleaved and the table shows medians. Nothing here asserts a time.
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
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))

import stores  # noqa: E402

from longrun import Approval, JsonFileStore, Limits, RunContract, Runner, SqliteStore, Status, Step  # noqa: E402
from longrun.engine import Engine, Invocation  # noqa: E402


class _EngineWithoutEntryObserve(Engine):
    """An engine whose invocations start as if the entry observe had found its effect absent."""

    def _begin(self, digest: str) -> Invocation:
        inv = super()._begin(digest)
        inv.observe_next = False  # the one flag that asks for the observe before the first apply
        return inv


class WithoutEntryObserve(Runner):
    """The Runner with the observe before the first apply of each call skipped (its engine's one method)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.engine.__class__ = _EngineWithoutEntryObserve


def one_call(kind: type[Runner], store: Any, task_id: str, plan: list[Step], applied: set[str]) -> tuple[float, int]:
    """Seconds for one ``run()`` call, and how many observes it made."""
    adapter = stores.NoopAdapter()
    adapter.applied = applied  # the target remembers what earlier calls applied
    contract = RunContract(task_id, "benchmark: one call", allowed_actions=("noop",))
    runner = kind(contract, plan, store=store, adapters={"noop": adapter}, owner="bench", limits=Limits(max_block_s=0))
    started = time.perf_counter()
    outcome = runner.run()
    elapsed = time.perf_counter() - started
    if outcome.status not in (Status.DONE, Status.AWAITING_APPROVAL):
        raise RuntimeError(f"the benchmark call ended {outcome.status.value}: {outcome.next_action}")
    return elapsed, adapter.observed


def fresh(kind: type[Runner], store: Any, number: int) -> tuple[float, int]:
    """A one-effect task from nothing to done."""
    return one_call(kind, store, f"fresh-{kind.__name__}-{number}", [Step("s0", "noop", {"i": 0})], set())


def resume(kind: type[Runner], store: Any, number: int) -> tuple[float, int]:
    """A task of 20 steps: 18 done, the 19th approved: the timed call applies it and stops at the 20th's gate."""
    task_id = f"resume-{kind.__name__}-{number}"
    plan = [Step(f"s{index}", "noop", {"i": index}, approval=index >= 18) for index in range(20)]
    applied: set[str] = set()
    one_call(Runner, store, task_id, plan, applied)  # untimed: stops awaiting the approval of s18
    request = store.load(task_id).state.approval_requests["s18"]
    now = time.time()
    store.write_approval(Approval.for_request(request, approval_id=f"ap-{number}", approver="bench", granted_at=now, expires_at=now + 600))
    return one_call(kind, store, task_id, plan, applied)


def measure(workdir: str, calls: int, where: str) -> None:
    makers: dict[str, Callable[[], Any]] = {
        "JsonFileStore": lambda: JsonFileStore(os.path.join(workdir, "json"), create=True),
        "SqliteStore": lambda: SqliteStore(os.path.join(workdir, "longrun.db"), create=True),
    }
    for name, make in makers.items():
        store = make()
        for label, shape in (("fresh", fresh), ("resume", resume)):
            samples: dict[type[Runner], list[float]] = {Runner: [], WithoutEntryObserve: []}
            observes: dict[type[Runner], int] = {Runner: 0, WithoutEntryObserve: 0}
            for number in range(calls):
                for kind in (Runner, WithoutEntryObserve) if number % 2 == 0 else (WithoutEntryObserve, Runner):
                    elapsed, observed = shape(kind, store, number)
                    samples[kind].append(elapsed)
                    observes[kind] += observed
            with_ms = statistics.median(samples[Runner]) * 1000
            without_ms = statistics.median(samples[WithoutEntryObserve]) * 1000
            extra = (observes[Runner] - observes[WithoutEntryObserve]) / calls
            print(f"{where:<8}{name:<15}{label:<8}{with_ms:>9.2f}{without_ms:>10.2f}{with_ms - without_ms:>+12.2f}{extra:>+15.1f}")
        close = getattr(store, "close", None)
        if callable(close):
            close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (noisier)")
    parser.add_argument("--dir", default=None, help="where to put the files (default: a temporary directory beside the checkout)")
    args = parser.parse_args()
    calls = 10 if args.quick else 60
    places = [("disk", args.dir or os.path.dirname(ROOT))]
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        places.append(("memory", "/dev/shm"))  # fsync costs nothing there: the runner's CPU cost alone
    started = time.perf_counter()
    print("longrun per-invocation cost: Runner.run() with and without the observe before its first apply")
    print(f"{calls} calls of each kind, interleaved; median ms per call; target: a no-op adapter (set lookup)\n")
    print(f"{'files':<8}{'store':<15}{'call':<8}{'with':>9}{'without':>10}{'difference':>12}{'observes/call':>15}")
    for where, parent in places:
        workdir = tempfile.mkdtemp(prefix="longrun-bench-invocation-", dir=parent)
        try:
            measure(workdir, calls, where)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\n'observes/call': the observe calls the check adds to each run() call (the untimed setup of 'resume'")
    print("excluded). 'memory': files in /dev/shm, where fsync is free: what is left is the runner's CPU cost.")
    print(f"(took {time.perf_counter() - started:.0f} s; command: python benchmarks/invocation.py{' --quick' if args.quick else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
