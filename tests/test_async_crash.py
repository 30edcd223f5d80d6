"""Effects in parallel, killed: real processes, SIGKILL, power loss and I/O errors against group commits.

``AsyncKillCase``: an async durable function with 64 effects in flight at once
(``tests/helpers/async_child.py``), each a line in an outbox that records applies durably, is SIGKILLed at
random moments (a random crash point's N-th pass, or a signal from outside after a random delay)
and run again, over and over, on every store. Afterwards every effect is at the target exactly
once, none is lost, and the function's results name the lines the effects wrote. The number of
kills per store is ``LONGRUN_ASYNC_KILLS`` (default 8, 20 under ``LONGRUN_TEST_SCALE=full``, to
keep the file short on a small machine; the figure the guarantee was checked with is 50), and
``LONGRUN_ASYNC_SEED`` varies the random choices.

``GroupCommitFaultTests``: a group commit is one journal record with one ``fdatasync``. Under the
power-loss model (``longrun.testing.faults.power_loss_model``) every crash state of a recorded async run loads
as the state before or after the commit in flight, never half a batch; an I/O error at the N-th
file operation of such a run leaves the state before or after the failed commit, and a run
afterwards applies every effect exactly once.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import random
import shutil
import sys
import unittest
from collections import Counter
from typing import Any

from helpers import forked, pg_support, scale, support
import longrun
from longrun import EffectRequest, EffectState, JsonFileStore, Observation, Receipt, RetryPolicy, Status, Store, StorageError
from longrun.envelope import RunState
from longrun.lease import Lease
from longrun.stores._fileio import FileIO
from longrun.stores._spec import open_store
from longrun.testing import FakeClock, read_outbox
from longrun.testing.faults.power_loss import check_power_loss
from longrun.testing.faults.power_loss_model import RecordingIO
from longrun.testing.faults.store_history import compact_early
from longrun.testing.faults import FaultyIO

CHILD = os.path.join(support.HELPERS, "async_child.py")
KILLED = forked.KILLED
EFFECTS = 64
KILLS = int(os.environ.get("LONGRUN_ASYNC_KILLS", scale.scaled(8, 20)))
SEED = os.environ.get("LONGRUN_ASYNC_SEED", "")

# The points a run with effects in parallel passes through many times.
POINTS = (
    ("recovery.loaded", 1),
    ("cancellation.read", EFFECTS),
    ("attempt.incremented", EFFECTS),
    ("effect.intent-persisted", EFFECTS),
    ("effect.applied", EFFECTS),
    ("state.committed", 8),
    ("lease.acquired", 1),
)


class AsyncKillCase(support.TempDirTest):
    kind = "json"

    def setUp(self) -> None:
        super().setUp()
        self.outbox = self.path("outbox.jsonl")
        self.spec = self.make_spec()
        self.runs: Counter[str] = Counter()
        self.kills: Counter[str] = Counter()
        self.server = forked.Server(self, CHILD, self.path("server.err"))

    def make_spec(self) -> str:
        return self.path("store")

    def load(self, task: str) -> RunState | None:
        """The task's durable state, read by a store of this process (None if it was never created)."""
        store = open_store(self.spec)
        try:
            return store.load(task).state
        except longrun.UnknownTaskError:
            return None
        finally:
            close = getattr(store, "close", None)
            if callable(close):
                close()

    def run_task(self, task: str, adapter: str, *, crash_at: str | None = None, kill_after_s: float | None = None) -> tuple[int, Any]:
        """One run in a forked process. Each run's clock is 100 s past the previous one's, so a
        killed run's 30 s lease has expired for the next without a wait."""
        self.runs[task] += 1
        request = {
            "spec": self.spec, "outbox": self.outbox, "task": task, "count": EFFECTS, "later": 100.0 * self.runs[task],
            "adapter": adapter, "crash_at": crash_at, "kill_after_s": kill_after_s,
        }  # fmt: skip
        reply = self.server.run(request, f"run {self.runs[task]} of {task}")
        if reply["exit"] == KILLED:
            self.kills[task] += 1
        return reply["exit"], reply["outcome"]

    def in_flight(self, task: str) -> int:
        """Effects the durable state shows started but not settled (what the next run must observe)."""
        state = self.load(task)
        return 0 if state is None else sum(record.in_flight for record in state.effects.values())

    def check(self, task: str, outcome: dict[str, Any]) -> None:
        self.assertEqual(outcome["status"], "done", f"{task}: {outcome['next_action']}")
        lines = read_outbox(self.outbox)
        applied = Counter(line["key"] for line in lines if line["task_id"] == task)
        expected = {f"{task}/e/{i}": 1 for i in range(EFFECTS)}
        duplicated = {key: n for key, n in applied.items() if n > 1}
        lost = sorted(set(expected) - set(applied))
        self.assertEqual((duplicated, lost), ({}, []), f"{task}: applied twice / never applied")
        self.assertEqual(applied, expected, task)
        # The results the function returned name the lines its effects wrote, in order.
        for i, result in enumerate(outcome["result"]):
            self.assertEqual(lines[result["line"]]["key"], f"{task}/e/{i}")
        state = self.load(task)
        assert state is not None
        self.assertTrue(all(record.state is EffectState.VERIFIED for record in state.effects.values()), task)

    def test_effects_in_flight_killed_at_random_apply_each_exactly_once(self) -> None:
        rng = random.Random(f"async-kills-{self.kind}{SEED}")
        tasks = 0
        most_in_flight = 0
        while sum(self.kills.values()) < KILLS:
            tasks += 1
            task = f"fan-{tasks}"
            armed_runs = rng.randint(2, 6)  # then it runs unarmed until done
            for _ in range(armed_runs + 20):
                crash_at = kill_after_s = None
                if armed_runs > 0:
                    armed_runs -= 1
                    if rng.random() < 0.6:
                        point, passes = rng.choice(POINTS)
                        crash_at = f"{point}:{rng.randint(1, passes)}"
                    else:
                        kill_after_s = rng.uniform(0.0, 0.4)
                code, outcome = self.run_task(task, rng.choice(("async", "sync")), crash_at=crash_at, kill_after_s=kill_after_s)
                if code == KILLED:
                    most_in_flight = max(most_in_flight, self.in_flight(task))
                    continue
                self.check(task, outcome)  # done (a kill armed for later than the run lasted never came)
                break
            else:
                self.fail(f"{task} did not finish")
        if os.environ.get("LONGRUN_CRASH_REPORT"):
            print(f"\n{self.kind}: {sum(self.kills.values())} kills over {tasks} tasks, at most {most_in_flight} effects in flight at a kill", file=sys.stderr)
        self.assertGreaterEqual(sum(self.kills.values()), KILLS)
        self.assertGreater(most_in_flight, 1, "some kill landed with several effects in flight")


class JsonFileStoreKillTests(AsyncKillCase):
    kind = "json"


class SqliteStoreKillTests(AsyncKillCase):
    kind = "sqlite"

    def make_spec(self) -> str:
        return "sqlite:" + self.path("longrun.sqlite")


class PostgresStoreKillTests(AsyncKillCase):
    kind = "postgres"

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        pg_support.check()

    def make_spec(self) -> str:
        schema = pg_support.Schema()
        self.addCleanup(schema.drop)
        return schema.spec


del AsyncKillCase  # only its subclasses run


# -- group commits under the power-loss model and I/O errors (the JSON-file store's file seam) -----

TASK = "t"  # the task the power-loss checker loads
BATCH = 16


def content(state: RunState | None) -> str | None:
    """A state as the checker compares it: everything but the revision number."""
    if state is None:
        return None
    document = state.to_json()
    document.pop("revision", None)
    document.pop("reconcile_all", None)
    return json.dumps(document, sort_keys=True)


class MarkedStore(JsonFileStore):
    """Marks each commit in the I/O trace (``RecordingIO.mark``) with the state before and after it,
    as the power-loss checker reads them; keeps the last durable state and the one in flight."""

    def __init__(self, root: str, io: FileIO):
        super().__init__(root, io=io, create=True)
        self.commits = 0
        self.durable: str | None = None
        self.attempted: str | None = None
        self.batches: list[int] = []
        """Effects that moved to ``started`` in each commit."""
        self._started: set[str] = set()

    def _mark(self, *label: object) -> None:
        if isinstance(self.io, RecordingIO):
            self.io.mark(*label)

    def commit(self, lease: Lease, state: RunState, changed: Any = None) -> int:
        self.commits += 1
        started = {sid for sid, record in state.effects.items() if record.state is EffectState.STARTED}
        self.batches.append(len(started - self._started))
        self._mark("begin", self.commits, self.durable)
        state.lease_epoch, state.lease_owner, state.lease_expires_at = lease.epoch, lease.owner, lease.expires_at
        self.attempted = content(state)  # what the commit writes (it records the lease it writes under)
        revision = super().commit(lease, state, changed)
        self.durable = content(state)
        self._started = started
        self._mark("end", self.commits, self.durable)
        return revision


class WorldTarget:
    """An async target that lives outside the store (it survives the store's faults): counts applies."""

    deduplicates = False

    def __init__(self) -> None:
        self.applied: Counter[str] = Counter()

    async def apply(self, request: EffectRequest) -> Receipt:
        await asyncio.sleep(0)
        self.applied[request.key] += 1
        return Receipt(result={"n": request.payload["n"]})

    async def observe(self, request: EffectRequest) -> Observation:
        if self.applied[request.key]:
            return Observation.applied("held", {"n": request.payload["n"]})
        return Observation.absent("not held")


def fan_out_function(store: Store, target: WorldTarget, *, later: float = 0.0) -> Any:
    """The function; ``later`` shifts its clock (a lease a failed release left behind has expired)."""

    @longrun.durable(
        store=store,
        adapters={"t": target},
        allowed_actions=("t",),
        clock=FakeClock(1_700_000_000.0 + later),
        retry=RetryPolicy(base_delay_s=0.0, jitter=0.0),
    )
    async def fan_out(run: longrun.AsyncRun, count: int) -> list[Any]:
        return list(await asyncio.gather(*(run.effect(f"e/{i}", "t", {"n": i}) for i in range(count))))

    return fan_out


class GroupCommitFaultTests(support.TempDirTest):

    def test_power_loss_during_group_commits_leaves_each_batch_whole_or_absent(self) -> None:
        """Every crash state of every prefix of a recorded run of 16 effects in parallel (with
        compactions) loads as the state before or after the commit in flight."""
        support.ExpectedWarnings(self, r"dropped an incomplete last record", r"state recovered from", at_least_one=False).start()
        root = self.path("recorded")
        io = RecordingIO()
        target = WorldTarget()
        with compact_early():
            store = MarkedStore(root, io)
            outcome = fan_out_function(store, target).run(TASK, BATCH)
            store.close()
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertGreater(max(store.batches), 1, f"some commit carried several starts: {store.batches}")
        self.assertLess(store.commits, BATCH // 2, "the starts were committed in groups")
        scratch = self.path("scratch")
        os.makedirs(scratch)
        cases, problems, figures = check_power_loss(io.ops, root, scratch)
        self.assertGreater(cases, 100)
        self.assertEqual(problems[:5], [])
        self.assertEqual(figures, {"resets": 0, "lost": 0})

    def test_an_io_error_at_each_operation_of_a_parallel_run_leaves_each_batch_whole_or_absent(self) -> None:
        """Fail the N-th file operation (N = 1, 2, ... until a run gets through) of a run of 16
        effects in parallel: a fresh store then reads the state before or after the commit that
        failed, and a run afterwards applies every effect exactly once."""
        support.ExpectedWarnings(
            self,
            r"injected",  # the store reports the faults it absorbed (a failed compaction, say)
            r"dropped an incomplete last record",
            r"state recovered from",
            r"releasing the lease",
        ).start()
        expected = Counter({f"{TASK}/e/{i}": 1 for i in range(BATCH)})
        faults = 0
        for error in (errno.EIO, errno.ENOSPC):
            n = 0
            while True:
                n += 1
                self.assertLess(n, 2000, "the run never got through")
                root = self.path(f"case-{error}-{n}")
                io = FaultyIO(n, error)
                target = WorldTarget()
                store = MarkedStore(root, io)
                try:
                    with compact_early():
                        outcome: longrun.RunOutcome | None = fan_out_function(store, target).run(TASK, BATCH)
                except StorageError:
                    outcome = None
                finally:
                    store.close()
                where = f"errno {errno.errorcode[error]} at I/O call {n} ({io.injected_operations})"
                self.assertEqual(io.synced_after_failure, [], where)
                if not io.injected:
                    self.assertIsNotNone(outcome)
                    assert outcome is not None
                    self.assertEqual(outcome.status, Status.DONE, where)
                    self.assertEqual(target.applied, expected)
                    break
                faults += 1
                try:
                    loaded = JsonFileStore(root).load(TASK).state
                except longrun.UnknownTaskError:
                    loaded = None
                self.assertIn(content(loaded), {store.durable, store.attempted}, f"{where}: half a batch, or a lost one")
                resumed = fan_out_function(JsonFileStore(root, create=True), target, later=100.0).run(TASK, BATCH)
                self.assertEqual(resumed.status, Status.DONE, f"{where}: {resumed.next_action}")
                self.assertEqual(target.applied, expected, f"{where}: every effect exactly once")
                shutil.rmtree(root)
        self.assertGreater(faults, 20)


if __name__ == "__main__":
    unittest.main()
