"""Resume of a long task: ``python benchmarks/resume.py [--size N] [--stores json,sqlite,postgres]`` (standard library only).

A task whose ledger already holds N verified effects (written directly through the store, as a run
would leave it: the plan's digest and its outline recorded; on the JSON-file store a snapshot with
its backup, and a journal) is resumed by a ``Runner`` whose plan has those N steps and one more.
Printed for each store, each the median of three resumes of three such tasks by fresh store objects
(warm page cache): the seconds from building the ``Runner`` to the first new ``apply`` call, beside
the target (under 0.3 s), split into building the ``Runner`` (plan validation and digest) and the
run up to the apply (lease, load, replay of the verified steps); the CPU time of the same span
(``time.process_time``: what the figure would be on a machine no other work loads); and, for the
JSON-file store, the memory the loaded state holds per verified effect (``tracemalloc``, after a
load). PostgreSQL is measured when ``LONGRUN_TEST_POSTGRES_DSN`` is set (in a throwaway schema).

Then the same for a durable function (``--function-size N``, 0 to skip): a function that makes N+1
effects in a loop is SIGKILLed in a child process while its N-th effect is acknowledged, then
resumed (three such tasks): the seconds from ``run`` to the first new ``apply``,
which replays the N calls by step id, each checked against its recorded payload digest.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import tracemalloc
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
sys.path.insert(0, HERE)

from stores import NoopAdapter, ledger_state  # noqa: E402

from longrun import JsonFileStore, Observation, Receipt, Run, RunContract, Runner, SqliteStore, Status, Step, durable  # noqa: E402
from longrun.functions import DurableFunction  # noqa: E402
from longrun.contract import plan_digest  # noqa: E402
from longrun.envelope import PlanOutline  # noqa: E402


class FirstApply(NoopAdapter):
    """Notes when the first new effect is applied (wall and CPU), then behaves as a no-op target."""

    def __init__(self) -> None:
        super().__init__()
        self.first_apply_at: float | None = None
        self.first_apply_cpu: float | None = None

    def apply(self, request: Any) -> Receipt:
        if self.first_apply_at is None:
            self.first_apply_at = time.perf_counter()
            self.first_apply_cpu = time.process_time()
        return super().apply(request)


TARGET_S = 0.3
TARGET_SIZE = 100_000
"""The target: a resume of ``TARGET_SIZE`` verified effects to the first new apply in under ``TARGET_S``."""


def build(store: Any, task_id: str, size: int) -> tuple[RunContract, list[Step]]:
    contract = RunContract(task_id, "benchmark: resume a long task", allowed_actions=("noop",))
    plan = [Step(f"s{index}", "noop", {"i": index}) for index in range(size + 1)]
    state = ledger_state(task_id, size)
    state.plan_digest = plan_digest(contract, plan)
    state.plan_outline = PlanOutline.of(plan)
    lease = store.acquire_lease(task_id, "bench", 30.0, time.time())
    store.commit(lease, state)
    state.updated_at = time.time()
    store.commit(lease, state, ())  # as a run leaves it: on the JSON-file store a snapshot with its backup, and a journal
    store.release_lease(lease, time.time())
    return contract, plan


def resume_once(store: Any, contract: RunContract, size: int) -> tuple[float, float, float]:
    """(seconds to build the Runner, seconds from there to the first new apply, CPU seconds of both)."""
    plan = [Step(f"s{index}", "noop", {"i": index}) for index in range(size + 1)]
    adapter = FirstApply()
    adapter.applied.update(f"{contract.task_id}/s{index}" for index in range(size))
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    runner = Runner(contract, plan, store=store, adapters={"noop": adapter}, owner="bench")
    built = time.perf_counter()
    outcome = runner.run()
    if outcome.status is not Status.DONE or adapter.first_apply_at is None or adapter.first_apply_cpu is None:
        raise RuntimeError(f"the resume ended {outcome.status.value}: {outcome.next_action}")
    return built - started, adapter.first_apply_at - built, adapter.first_apply_cpu - cpu


class KillAtVerify(NoopAdapter):
    """A no-op target that SIGKILLs its process when ``key`` is observed for its verification."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key

    def observe(self, request: Any) -> Observation:
        if request.key == self.key:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().observe(request)


def agent(store: JsonFileStore, adapter: NoopAdapter) -> DurableFunction[int]:
    @durable(store=store, adapters={"noop": adapter}, allowed_actions=("noop",), owner="bench")
    def loop(run: Run, count: int) -> int:
        for index in range(count):
            run.effect(f"e/{index}", "noop", {"i": index})
        return count

    return loop


def function_task(root: str, size: int) -> None:
    """A task of ``agent`` with ``size`` effects done, the last acknowledged but not verified."""
    pid = os.fork()
    if pid == 0:
        try:
            agent(JsonFileStore(root, create=True), KillAtVerify(f"fn/e/{size - 1}")).run("fn", size + 1)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        raise RuntimeError(f"the first run was to be killed; it ended with status {status}")


def resume_function_once(root: str, size: int) -> float:
    adapter = FirstApply()
    adapter.applied.update(f"fn/e/{index}" for index in range(size))
    function = agent(JsonFileStore(root), adapter)
    gc.collect()
    started = time.perf_counter()
    outcome = function.run("fn", size + 1)
    if outcome.status is not Status.DONE or adapter.first_apply_at is None:
        raise RuntimeError(f"the resume ended {outcome.status.value}: {outcome.next_action}")
    return adapter.first_apply_at - started


def function_resume(base: str, size: int) -> float:
    samples = []
    for round_ in range(3):  # a task each: a copy would hide from the resume that its holder is gone
        root = os.path.join(base, f"function{round_}")
        function_task(root, size)
        samples.append(resume_function_once(root, size))
    return statistics.median(samples)


def open_stores(names: list[str], base: str) -> list[tuple[str, Callable[[], Any], Callable[[], None]]]:
    """(name, a factory of fresh store objects on one store, cleanup) for each store asked for."""
    opened: list[tuple[str, Callable[[], Any], Callable[[], None]]] = []
    for name in names:
        if name == "json":
            root = os.path.join(base, "store")
            opened.append(("JsonFileStore", lambda root=root: JsonFileStore(root, create=True), lambda: None))
        elif name == "sqlite":
            path = os.path.join(base, "resume.sqlite")
            opened.append(("SqliteStore", lambda path=path: SqliteStore(path, create=True), lambda: None))
        elif name == "postgres":
            if not os.environ.get("LONGRUN_TEST_POSTGRES_DSN"):
                print("PostgresStore: not measured (set LONGRUN_TEST_POSTGRES_DSN to include it)")
                continue
            import run  # the benchmark's throwaway-schema helper

            made = run.postgres_store(base)
            if made is None:
                continue
            first, cleanup = made
            # One transaction writes (and one reads) all of a task's rows: more than the default
            # 10 s a transaction may idle on a loaded machine.
            opened.append(("PostgresStore", lambda first=first: type(first)(first.connect, transaction_timeout_s=600.0), cleanup))
        else:
            raise SystemExit(f"unknown store {name!r}: json, sqlite or postgres")
    return opened


def measure(name: str, new_store: Callable[[], Any], size: int) -> None:
    samples = []
    for round_ in range(3):  # a task each: a resume finishes its task
        task_id = f"resume-{round_}"
        writer = new_store()
        contract, _ = build(writer, task_id, size)
        writer.close()
        store = new_store()
        samples.append(resume_once(store, contract, size))
        store.close()
    build_s = statistics.median(sample[0] for sample in samples)
    run_s = statistics.median(sample[1] for sample in samples)
    total_s = statistics.median(sample[0] + sample[1] for sample in samples)
    cpu_s = statistics.median(sample[2] for sample in samples)
    def verdict(seconds: float) -> str:
        if size != TARGET_SIZE:
            return f"(the target is for {TARGET_SIZE:,} effects)"
        return "met" if seconds < TARGET_S else "missed"

    print(f"{name}: resume of a task with {size:,} verified effects to its first new apply (median of 3)")
    print(f"  Runner built (plan checked and digested)   {build_s:8.3f} s")
    print(f"  run() to the first new apply                {run_s:8.3f} s")
    print(f"  total                                       {total_s:8.3f} s   target < {TARGET_S} s: {verdict(total_s)}")
    print(f"  total, CPU time of this process             {cpu_s:8.3f} s   target < {TARGET_S} s: {verdict(cpu_s)}")
    if name == "JsonFileStore":
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        loaded = new_store().load("resume-0").state  # finished, so one more record than it had
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert loaded is not None and len(loaded.effects) == size + 1
        print(f"  memory held by the loaded state             {held / size:8.0f} bytes per verified effect")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--function-size", type=int, default=20_000)
    parser.add_argument("--stores", default="json,sqlite,postgres", help="which stores, comma-separated (default json,sqlite,postgres)")
    args = parser.parse_args()
    size = args.size
    base = tempfile.mkdtemp(prefix="longrun-resume-", dir=os.path.dirname(HERE))
    print(f"longrun resume benchmark, {time.strftime('%Y-%m-%d %H:%M')}, Python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f}")
    opened = open_stores(args.stores.split(","), base)
    try:
        for name, new_store, _ in opened:
            measure(name, new_store, size)
        if args.function_size > 0:
            function_s = function_resume(base, args.function_size)
            count = args.function_size
            print(f"resume of a durable function's task with {count:,} verified effects to its first new apply (median of 3)")
            print(f"  run() to the first new apply                {function_s:8.3f} s   = {function_s / count * 1e6:.1f} us per replayed step")
    finally:
        for _, _, cleanup in opened:
            cleanup()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
