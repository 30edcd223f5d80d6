"""The drivers (``longrun.engine._drivers``): the async driver never blocks the event loop on the
store or a control source, so the runs of many tasks on one loop wait on their I/O together."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest
from collections import Counter
from typing import Any

from helpers import support  # noqa: F401  (puts src on the path)
from longrun import AsyncRun, EffectRequest, Observation, Receipt, RunContract, Runner, Status, Step, durable
from longrun.control import ControlRecord
from longrun.testing import MemoryStore

STORE_CALL_S = 0.05
CANCELLATION_READ_S = 0.1
TASKS = 16


class SlowStore:
    """A ``MemoryStore`` whose every call takes ``STORE_CALL_S`` more; counts its calls by name."""

    def __init__(self) -> None:
        self._inner = MemoryStore()
        self.calls: Counter[str] = Counter()
        self.threads: set[int] = set()
        """The threads the calls were made in (never an event loop's)."""
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name.startswith("_") or not callable(attribute):
            return attribute

        def slow(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
                self.threads.add(threading.get_ident())
            time.sleep(STORE_CALL_S)
            return attribute(*args, **kwargs)

        return slow


class SlowCancellations:
    """A cancellation source that finds no record after ``CANCELLATION_READ_S``; counts its reads."""

    def __init__(self) -> None:
        self.reads = 0
        self.threads: set[int] = set()
        self._lock = threading.Lock()

    def read_cancellation(self, task_id: str) -> ControlRecord | None:
        with self._lock:
            self.reads += 1
            self.threads.add(threading.get_ident())
        time.sleep(CANCELLATION_READ_S)
        return None


class QuickAdapter:
    """An async target in memory: applies at once, observes what it applied."""

    deduplicates = True

    def __init__(self) -> None:
        self.applied: Counter[str] = Counter()

    async def apply(self, request: EffectRequest) -> Receipt:
        self.applied[request.key] += 1
        return Receipt(evidence="written")

    async def observe(self, request: EffectRequest) -> Observation:
        return Observation.applied("found") if self.applied[request.key] else Observation.absent("not found")


class AsyncDriverIOTests(unittest.TestCase):
    def run_tasks(self, names: list[str]) -> tuple[float, SlowStore, SlowCancellations, QuickAdapter]:
        store, cancellations, adapter = SlowStore(), SlowCancellations(), QuickAdapter()

        async def one(name: str) -> Status:
            runner = Runner(
                RunContract(name, "one effect on a slow store"),
                [Step("send", "send", {"to": name})],
                store=store,  # type: ignore[arg-type]
                cancellations=cancellations,
                adapters={"send": adapter},
            )
            return (await runner.arun()).status

        async def together() -> list[Status]:
            return list(await asyncio.gather(*(one(name) for name in names)))

        started = time.monotonic()
        statuses = asyncio.run(together())
        elapsed = time.monotonic() - started
        self.assertEqual(statuses, [Status.DONE] * len(names))
        return elapsed, store, cancellations, adapter

    def test_slow_store_and_cancellation_reads_of_parallel_tasks_do_not_serialize_on_one_loop(self) -> None:
        alone, store, cancellations, adapter = self.run_tasks(["alone"])
        per_task_calls = sum(store.calls.values())
        self.assertGreaterEqual(per_task_calls, 4, store.calls)  # the lease, the load, commits, the release
        self.assertGreaterEqual(cancellations.reads, 2, "read fresh before the effect and before done")
        together, store, cancellations, adapter = self.run_tasks([f"task-{n}" for n in range(TASKS)])
        # Every task did all of its I/O, and each effect was applied once.
        self.assertEqual(sum(store.calls.values()), TASKS * per_task_calls, store.calls)
        self.assertEqual(set(adapter.applied.values()), {1})
        self.assertEqual(len(adapter.applied), TASKS)
        # Serialized on the loop this would take about TASKS times as long as one task.
        self.assertLess(together, 6 * alone, f"{TASKS} tasks took {together:.2f} s, one alone {alone:.2f} s")

    def run_parents(self, count: int) -> tuple[float, SlowStore, SlowCancellations, int]:
        """``count`` async durable functions on one loop, each starting an async child with one
        effect; the elapsed time, the store, the cancellation source and the loop's thread."""
        store, cancellations, adapter = SlowStore(), SlowCancellations(), QuickAdapter()
        options: dict[str, Any] = {"store": store, "cancellations": cancellations, "adapters": {"send": adapter}}

        @durable(**options)
        async def child(run: AsyncRun, name: str) -> str:
            await run.effect("send", "send", {"to": name})
            return name

        @durable(**options)
        async def parent(run: AsyncRun, name: str) -> str:
            return str(await run.child(f"{name}-child", child, name))

        loop_thread = 0

        async def together() -> list[Status]:
            nonlocal loop_thread
            loop_thread = threading.get_ident()
            outcomes = await asyncio.gather(*(parent.arun(f"parent-{n}", f"p{n}") for n in range(count)))
            return [outcome.status for outcome in outcomes]

        started = time.monotonic()
        statuses = asyncio.run(together())
        elapsed = time.monotonic() - started
        self.assertEqual(statuses, [Status.DONE] * count)
        self.assertEqual(len(adapter.applied), count)
        self.assertEqual(set(adapter.applied.values()), {1})
        return elapsed, store, cancellations, loop_thread

    def test_a_child_start_and_its_cancellation_read_are_performed_off_the_loop(self) -> None:
        # The parent's start of a child reads the store (does the child wait on the parent?), reads
        # its cancellation and commits; none of that may block the loop the other tasks share.
        alone, store, cancellations, loop_thread = self.run_parents(1)
        self.assertGreaterEqual(store.calls["load"], 3, store.calls)  # parent, child, the child's family read
        self.assertGreaterEqual(cancellations.reads, 3, "the parent reads its cancellation before it starts the child")
        self.assertNotIn(loop_thread, store.threads | cancellations.threads, "no store or control call on the loop's thread")
        together, store, cancellations, loop_thread = self.run_parents(TASKS)
        self.assertNotIn(loop_thread, store.threads | cancellations.threads, "no store or control call on the loop's thread")
        self.assertLess(together, 6 * alone, f"{TASKS} parents took {together:.2f} s, one alone {alone:.2f} s")


if __name__ == "__main__":
    unittest.main()
