"""Async durable functions, effects in parallel and group commit, in one process.

The store-dependent cases run against every store (``JsonFileStore``, ``SqliteStore``, and
``PostgresStore`` when ``LONGRUN_TEST_POSTGRES_DSN`` is set); the face checks run once. Deadlines
and cancellation that reach a running effect are in ``DeadlineCases`` (real time, short waits,
outcomes asserted, never durations).
"""

from __future__ import annotations

import asyncio
import gc
import secrets
import threading
import time
import unittest
import warnings
from collections import Counter
from typing import Any

from helpers import pg_support, support
import longrun
from longrun import (
    Approval,
    Cancellation,
    EffectRequest,
    InvalidInputError,
    JsonFileStore,
    Observation,
    PermanentError,
    PostgresStore,
    Receipt,
    RetryPolicy,
    SqliteStore,
    Status,
    Store,
)
from longrun.ledger import EffectState
from longrun.testing import FakeClock


class Crash(BaseException):
    """Stands for the process dying inside ``apply``: nothing in the engine or the function catches it."""


class Target:
    """What both fakes share: per-key counts of applies and observes, the peak of applies in flight."""

    deduplicates = False

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.calls: Counter[str] = Counter()
        """``apply`` calls per key (whatever became of them)."""
        self.applied: Counter[str] = Counter()
        """Effects that reached the target, per key: a count above 1 is a duplicate."""
        self.observed: Counter[str] = Counter()
        self.in_flight = 0
        self.peak = 0
        self._lock = threading.Lock()

    def _enter(self, request: EffectRequest) -> None:
        with self._lock:
            self.calls[request.key] += 1
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _record(self, request: EffectRequest) -> Receipt:
        with self._lock:
            self.applied[request.key] += 1
        return Receipt(result={"n": request.payload.get("n")}, evidence=f"applied {request.key}")

    def _look(self, request: EffectRequest) -> Observation:
        with self._lock:
            self.observed[request.key] += 1
            if self.applied[request.key]:
                return Observation.applied(f"the target holds {request.key}", {"n": request.payload.get("n")})
        return Observation.absent(f"the target has no {request.key}")

    def total(self) -> int:
        return sum(self.applied.values())


class AsyncTarget(Target):
    """An async target: ``apply`` awaits ``delay`` seconds, then records the effect."""

    async def apply(self, request: EffectRequest) -> Receipt:
        self._enter(request)
        try:
            await asyncio.sleep(self.delay)
            return self._record(request)
        finally:
            self._leave()

    async def observe(self, request: EffectRequest) -> Observation:
        return self._look(request)


class ThreadTarget(Target):
    """A synchronous target (the async engine runs it in worker threads): ``apply`` blocks ``delay``
    seconds. With ``meet=2``, the first apply also waits (up to 5 s) until a second one is in
    flight: whether applies overlap then does not depend on how busy the machine is."""

    def __init__(self, delay: float = 0.0, *, meet: int = 1):
        super().__init__(delay)
        self.meet = meet
        self._met = threading.Condition()

    def apply(self, request: EffectRequest) -> Receipt:
        self._enter(request)
        try:
            with self._met:
                self._met.notify_all()
                self._met.wait_for(lambda: self.peak >= self.meet, timeout=5)
            time.sleep(self.delay)
            return self._record(request)
        finally:
            self._leave()

    def observe(self, request: EffectRequest) -> Observation:
        return self._look(request)


class CrashingTarget(AsyncTarget):
    """While ``armed``: every apply waits until ``expected`` applies are in flight (so every start
    is durable), the even-numbered ones reach the target, then all of them "die" (``Crash``)."""

    def __init__(self, expected: int):
        super().__init__()
        self.expected = expected
        self.armed = True
        self._all_in: asyncio.Event | None = None

    async def apply(self, request: EffectRequest) -> Receipt:
        if not self.armed:
            return await super().apply(request)
        self._enter(request)
        if self._all_in is None:
            self._all_in = asyncio.Event()
        if self.in_flight >= self.expected:
            self._all_in.set()
        await self._all_in.wait()
        if request.payload["n"] in range(0, self.expected, 2):
            self._record(request)
        self._leave()
        raise Crash(request.key)


class AsyncCase(support.TempDirTest):
    """A fresh store and a fake clock for each test."""

    def make_store(self) -> Store:
        return JsonFileStore(self.path("store"), create=True)

    def setUp(self) -> None:
        super().setUp()
        self.clock = FakeClock()
        self.store = self.make_store()

    def durable(self, adapters: dict[str, Any], **options: Any) -> Any:
        settings: dict[str, Any] = dict(
            store=self.store,
            adapters=adapters,
            allowed_actions=tuple(adapters),
            clock=self.clock,
            retry=RetryPolicy(base_delay_s=0.0, jitter=0.0),
        )
        settings.update(options)
        return longrun.durable(**settings)

    def state(self, task_id: str) -> longrun.RunState:
        state = self.store.load(task_id).state
        assert state is not None
        return state

    def approve(self, task_id: str, step_id: str) -> Approval:
        request = self.state(task_id).approval_requests[step_id]
        now = self.clock.now()
        approval = Approval.for_request(
            request, approval_id=secrets.token_hex(8), approver="tester", granted_at=now, expires_at=now + 3600
        )
        self.store.write_approval(approval)
        return approval

    def gatherer(self, target: Target, **options: Any) -> Any:
        """An async function that makes ``count`` effects at once and returns their results."""

        @self.durable({"t": target}, **options)
        async def fan_out(run: longrun.AsyncRun, count: int) -> list[Any]:
            return list(await asyncio.gather(*(run.effect(f"e/{i}", "t", {"n": i}) for i in range(count))))

        return fan_out

    def keys(self, task_id: str, count: int, prefix: str = "e/") -> list[str]:
        return [f"{task_id}/{prefix}{i}" for i in range(count)]


class StoreCases(AsyncCase):
    """What depends on what the store keeps and how it commits: run for every store."""

    def check_gather(self, target: Target) -> None:
        fan_out = self.gatherer(target)
        outcome = fan_out.run("fan", 24)
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(outcome.result, [{"n": i} for i in range(24)], "results in the order asked for")
        self.assertEqual(target.applied, Counter({key: 1 for key in self.keys("fan", 24)}), "each applied once")
        self.assertEqual(target.calls, target.applied, "no apply call was made twice")
        self.assertGreater(target.peak, 1, "the effects ran side by side")
        again = fan_out.run("fan", 24)
        self.assertEqual((again.status, again.result), (Status.DONE, outcome.result))
        self.assertEqual(target.total(), 24, "the replay applied nothing")
        fresh = self.gatherer(target)  # a new process with the same code: it replays from the store alone
        self.assertEqual(fresh.run("fan", 24).result, outcome.result)
        self.assertEqual(target.total(), 24)
        self.assertTrue(all(record.state is EffectState.VERIFIED for record in self.state("fan").effects.values()))

    def test_an_action_the_contract_does_not_allow_stops_unsafe_committed_and_applies_nothing(self) -> None:
        # The refusal is recorded where the face checks it (on the loop, no I/O) and committed by the
        # async driver as the stop unwinds.
        target = AsyncTarget()

        @self.durable({"t": target, "mail.send": target}, allowed_actions=("t",))
        async def agent(run: longrun.AsyncRun) -> None:
            await run.effect("note", "t", {"n": 1})
            await run.effect("mail", "mail.send", {"n": 2})

        outcome = agent.run("refused")
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE, outcome.next_action)
        self.assertIn("'mail'", outcome.next_action)
        self.assertEqual(target.calls, Counter({"refused/note": 1}))
        state = self.state("refused")
        self.assertEqual((state.status, state.next_action), (Status.UNSAFE_TO_CONTINUE, outcome.next_action))
        self.assertNotIn("mail", state.effects)

    def test_gather_of_async_effects_applies_each_once_and_replays_without_applying(self) -> None:
        self.check_gather(AsyncTarget(delay=0.01))

    def test_gather_of_sync_adapters_runs_them_in_threads_each_once(self) -> None:
        self.check_gather(ThreadTarget(delay=0.02, meet=2))

    def test_group_commit_needs_far_fewer_revisions_than_effects(self) -> None:
        """32 effects at once: their starts (and their verifications) go out together, so the
        store sees a few revisions, not one or two per effect as a sequential run makes."""
        target = AsyncTarget(delay=0.01)
        outcome = self.gatherer(target).run("group", 32)
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(target.total(), 32)
        revisions = self.state("group").revision
        self.assertLess(revisions, 32 // 2, f"{revisions} store revisions for 32 effects in parallel")

        # The same 32 effects one after another (the baseline the figure above is far below).
        sequential_target = AsyncTarget()

        @self.durable({"t": sequential_target})
        async def one_by_one(run: longrun.AsyncRun, count: int) -> int:
            for i in range(count):
                await run.effect(f"e/{i}", "t", {"n": i})
            return count

        self.assertEqual(one_by_one.run("sequential", 32).status, Status.DONE)
        self.assertGreaterEqual(self.state("sequential").revision, 32)

    def test_run_map_in_a_sync_function_runs_effects_at_once_in_order(self) -> None:
        target = ThreadTarget(delay=0.02, meet=2)
        single = ThreadTarget()

        @self.durable({"t": target, "single": single})
        def mapper(run: longrun.Run, count: int) -> list[Any]:
            first = run.effect("first", "single", {"n": -1})
            results = run.map("m", "t", [{"n": i} for i in range(count)], max_parallel=8)
            return [first, *results]

        outcome = mapper.run("map", 20)
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(outcome.result, [{"n": -1}, *({"n": i} for i in range(20))])
        self.assertEqual(target.applied, Counter({key: 1 for key in self.keys("map", 20, "m/")}))
        self.assertEqual(single.applied, Counter({"map/first": 1}))
        self.assertLessEqual(target.peak, 8)
        self.assertGreater(target.peak, 1)
        # Threads finish one by one, so commits group less than awaited effects do; still fewer than
        # one per effect (a sequential run makes at least one per effect, plus the first and the last).
        self.assertLess(self.state("map").revision, 20, "the map's starts and verifications share commits")
        self.assertEqual(mapper.run("map", 20).result, outcome.result)
        self.assertEqual(target.total() + single.total(), 21, "the replay applied nothing")

    def test_approval_on_one_of_many_stops_after_the_others_settle_then_completes(self) -> None:
        target = AsyncTarget(delay=0.01)

        @self.durable({"t": target})
        async def fan_out(run: longrun.AsyncRun, count: int) -> list[Any]:
            return list(
                await asyncio.gather(*(run.effect(f"e/{i}", "t", {"n": i}, approval=(i == 3)) for i in range(count)))
            )

        outcome = fan_out.run("gate", 8)
        self.assertEqual(outcome.status, Status.AWAITING_APPROVAL, outcome.next_action)
        self.assertIn("'e/3'", outcome.next_action)
        others = [key for key in self.keys("gate", 8) if key != "gate/e/3"]
        self.assertEqual(target.applied, Counter({key: 1 for key in others}), "the others settled; the gated one waits")
        state = self.state("gate")
        self.assertEqual(state.status, Status.AWAITING_APPROVAL)
        self.assertEqual(state.effects["e/3"].state, EffectState.PLANNED)
        self.assertEqual(
            {sid for sid, record in state.effects.items() if sid.startswith("e/") and record.state is EffectState.VERIFIED},
            {f"e/{i}" for i in range(8) if i != 3},
            "the settled ones are durable before the run stops",
        )
        self.assertEqual(fan_out.run("gate", 8).status, Status.AWAITING_APPROVAL, "still not approved")
        self.assertEqual(target.total(), 7)
        self.approve("gate", "e/3")
        done = fan_out.run("gate", 8)
        self.assertEqual(done.status, Status.DONE, done.next_action)
        self.assertEqual(done.result, [{"n": i} for i in range(8)])
        self.assertEqual(target.applied, Counter({key: 1 for key in self.keys("gate", 8)}))

    def test_a_cancellation_written_before_the_run_starts_nothing(self) -> None:
        target = AsyncTarget()

        @self.durable({"t": target})
        async def later(run: longrun.AsyncRun, count: int) -> list[Any]:
            await run.sleep("wait", 3600)  # the first run only creates the task and sleeps
            return list(await asyncio.gather(*(run.effect(f"e/{i}", "t", {"n": i}) for i in range(count))))

        self.assertEqual(later.run("cancelled", 16).status, Status.SLEEPING)
        self.store.write_cancellation(Cancellation("cancelled", self.clock.now(), "tester", "not today"))
        self.clock.advance(4000)  # the effects could start now
        outcome = later.run("cancelled", 16)
        self.assertEqual(outcome.status, Status.CANCELLED, outcome.next_action)
        self.assertEqual((target.calls, target.observed), (Counter(), Counter()), "nothing was started or observed")
        state = self.state("cancelled")
        self.assertEqual(state.status, Status.CANCELLED)
        self.assertFalse(any(sid.startswith("e/") for sid in state.effects), "no effect was even planned")
        self.assertEqual(later.run("cancelled", 16).status, Status.CANCELLED)
        self.assertEqual(target.calls, Counter())

    def test_a_run_cancelled_from_outside_leaves_its_starts_to_be_observed_and_applies_each_once(self) -> None:
        """The caller cancels ``fn.arun(...)`` while 8 applies are awaited: they are cancelled, the
        lease is let go, and the next run observes each and applies it once."""

        class Awaited(AsyncTarget):
            async def apply(self, request: EffectRequest) -> Receipt:
                if self.delay and self.in_flight == 7:
                    all_in.set()  # this is the 8th
                return await super().apply(request)

        all_in = asyncio.Event()
        target = Awaited(delay=30.0)
        fan_out = self.gatherer(target)

        async def impatient() -> None:
            running = asyncio.ensure_future(fan_out.arun("outer", 8))
            await asyncio.wait({running, asyncio.ensure_future(all_in.wait())}, return_when=asyncio.FIRST_COMPLETED)
            running.cancel()
            await running

        with self.assertRaises(asyncio.CancelledError):
            asyncio.run(impatient())
        self.assertEqual(target.total(), 0)
        self.assertEqual(len(target.calls), 8, "every apply had begun")
        started = [sid for sid, record in self.state("outer").effects.items() if record.state is EffectState.STARTED]
        self.assertEqual(len(started), 8, "their starts are durable")
        target.delay = 0.0
        outcome = fan_out.run("outer", 8)  # not already-running: the lease was released
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(target.applied, Counter({key: 1 for key in self.keys("outer", 8)}))
        self.assertTrue(all(target.observed[key] >= 1 for key in self.keys("outer", 8)))

    def test_a_permanent_failure_beside_an_approval_blocks_the_run_and_starts_nothing_more(self) -> None:
        """A stop that ends the run outranks one that waits; the steps not yet started never start."""

        class Refusing(AsyncTarget):
            async def apply(self, request: EffectRequest) -> Receipt:
                if request.payload["n"] == 1:
                    self._enter(request)
                    self._leave()
                    raise PermanentError(f"{request.key} is refused for good")
                return await super().apply(request)

        target = Refusing(delay=0.02)

        @self.durable({"t": target}, max_parallel=2)
        async def fan_out(run: longrun.AsyncRun, count: int) -> list[Any]:
            return list(
                await asyncio.gather(*(run.effect(f"e/{i}", "t", {"n": i}, approval=(i == 0)) for i in range(count)))
            )

        outcome = fan_out.run("refused", 8)
        self.assertEqual(outcome.status, Status.BLOCKED, outcome.next_action)
        self.assertIn("'e/1'", outcome.next_action)
        state = self.state("refused")
        self.assertEqual(state.status, Status.BLOCKED)
        self.assertEqual(state.effects["e/1"].state, EffectState.FAILED)
        self.assertFalse(any(record.in_flight for record in state.effects.values()), "nothing left in flight")
        applied_before = Counter(target.calls)
        self.assertLess(len(applied_before), 8, "the steps after the failure did not start")
        self.assertEqual(fan_out.run("refused", 8).status, Status.BLOCKED)
        self.assertEqual(target.calls, applied_before, "a blocked run starts nothing again")
        self.assertTrue(all(n == 1 for n in target.applied.values()))

    def test_max_parallel_bounds_the_effects_in_flight(self) -> None:
        for limit, target in ((3, AsyncTarget(delay=0.02)), (4, ThreadTarget(delay=0.02, meet=2))):
            with self.subTest(limit=limit, target=type(target).__name__):
                outcome = self.gatherer(target, max_parallel=limit).run(f"bounded-{limit}", 20)
                self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
                self.assertEqual(target.total(), 20)
                self.assertLessEqual(target.peak, limit)
                self.assertGreater(target.peak, 1)

    def test_await_run_call_with_an_async_and_a_sync_callable_is_recorded_once(self) -> None:
        calls: Counter[str] = Counter()

        async def ask_async(prompt: str) -> str:
            calls["async"] += 1
            await asyncio.sleep(0)
            return f"async answer to {prompt}"

        def ask_sync(prompt: str) -> str:
            calls["sync"] += 1
            return f"sync answer to {prompt}"

        target = AsyncTarget()

        @self.durable({"t": target})
        async def agent(run: longrun.AsyncRun, goal: str) -> list[Any]:
            first, second = await asyncio.gather(run.call("a", ask_async, goal), run.call("s", ask_sync, goal))
            await run.effect("tell", "t", {"n": 0, "answers": [first, second]})
            return [first, second]

        outcome = agent.run("calls", "tidy")
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(outcome.result, ["async answer to tidy", "sync answer to tidy"])
        self.assertEqual(calls, Counter({"async": 1, "sync": 1}))
        self.assertEqual(agent.run("calls", "tidy").result, outcome.result)
        self.assertEqual(calls, Counter({"async": 1, "sync": 1}), "replayed, not called again")
        self.assertEqual(target.total(), 1)

    def test_await_run_child_runs_async_and_sync_children_once(self) -> None:
        target = AsyncTarget()
        sync_target = ThreadTarget()

        @self.durable({"t": target})
        async def async_child(run: longrun.AsyncRun, n: int) -> int:
            await run.effect("report", "t", {"n": n})
            return n * 10

        @self.durable({"s": sync_target})
        def sync_child(run: longrun.Run, n: int) -> int:
            run.effect("report", "s", {"n": n})
            return n * 100

        @self.durable({"t": target})
        async def parent(run: longrun.AsyncRun) -> list[Any]:
            return list(await asyncio.gather(run.child("kid-a", async_child, 1), run.child("kid-s", sync_child, 2)))

        outcome = parent.run("parent")
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(outcome.result, [10, 200])
        self.assertEqual(self.state("kid-a").status, Status.DONE)
        self.assertEqual(self.state("kid-s").status, Status.DONE)
        self.assertEqual(parent.run("parent").result, [10, 200])
        self.assertEqual((target.applied, sync_target.applied), (Counter({"kid-a/report": 1}), Counter({"kid-s/report": 1})))

    def test_recovery_observes_every_effect_left_in_flight_by_a_crash(self) -> None:
        """The run dies with 12 effects started (one group commit) and half of them at the target:
        the next run observes every one, verifies those applied, applies the others once."""
        target = CrashingTarget(expected=12)
        fan_out = self.gatherer(target)
        with self.assertRaises(Crash):
            fan_out.run("crash", 12)
        state = self.state("crash")
        started = sorted(sid for sid, record in state.effects.items() if record.state is EffectState.STARTED)
        self.assertEqual(started, sorted(f"e/{i}" for i in range(12)), "every start was durable before any apply")
        self.assertEqual(target.total(), 6)
        before = Counter(target.observed)
        target.armed = False
        outcome = fan_out.run("crash", 12)
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(target.applied, Counter({key: 1 for key in self.keys("crash", 12)}), "none twice, none lost")
        observed = target.observed - before
        self.assertEqual(set(observed), set(self.keys("crash", 12)), "every effect in flight was observed")
        recovered = [item.detail for item in outcome.observations if item.source == "target:t"]
        for key in self.keys("crash", 12):
            self.assertTrue(any(detail.startswith(f"{key}: ") for detail in recovered), key)
        self.assertEqual(outcome.result, [{"n": i} for i in range(12)])


class HungTarget(Target):
    """A synchronous target whose first apply of a ``hang`` payload blocks (up to 20 s, until
    ``release`` is set) and then reaches the target anyway: a late attempt."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.returned = threading.Event()

    def apply(self, request: EffectRequest) -> Receipt:
        self._enter(request)
        try:
            if request.payload.get("hang") and request.attempt == 1:
                self.release.wait(20)
            return self._record(request)
        finally:
            self._leave()
            self.returned.set()

    def observe(self, request: EffectRequest) -> Observation:
        return self._look(request)


class SilentTarget(Target):
    """A synchronous target whose apply fails with an unknown outcome and whose observe then hangs
    (up to 20 s, until ``release`` is set): a target that does not answer."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def apply(self, request: EffectRequest) -> Receipt:
        self._enter(request)
        self._leave()
        raise ConnectionResetError("the connection dropped before an answer")

    def observe(self, request: EffectRequest) -> Observation:
        self.observed[request.key] += 1
        self.release.wait(20)
        return Observation.absent("nothing there")


class SlowFirstAttempt(AsyncTarget):
    """An async target whose first attempt of a ``slow`` payload would take 20 s; it counts the
    applies that were cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled: Counter[str] = Counter()

    async def apply(self, request: EffectRequest) -> Receipt:
        if not (request.payload.get("slow") and request.attempt == 1):
            return await super().apply(request)
        self._enter(request)
        try:
            await asyncio.sleep(20)
            return self._record(request)
        except asyncio.CancelledError:
            self.cancelled[request.key] += 1
            raise
        finally:
            self._leave()


class CancelledMidway(Target):
    """An operator cancels the task while a 10 s apply runs (the apply writes the cancellation
    itself, as the operator would from elsewhere). The async apply is cancelled at its ``await``;
    the synchronous one polls ``request.cancelled()`` and gives up, raising."""

    def __init__(self, store: Store):
        super().__init__()
        self.store = store
        self.cancelled: Counter[str] = Counter()
        self.saw_cancelled: Counter[str] = Counter()

    def _cancel(self, request: EffectRequest) -> None:
        self.store.write_cancellation(Cancellation(request.task_id, time.time(), "operator", "stop it now"))

    async def apply(self, request: EffectRequest) -> Receipt:
        self._enter(request)
        try:
            self._cancel(request)
            await asyncio.sleep(10)
            return self._record(request)
        except asyncio.CancelledError:
            self.cancelled[request.key] += 1
            raise
        finally:
            self._leave()

    async def observe(self, request: EffectRequest) -> Observation:
        return self._look(request)


class PollingCancelled(CancelledMidway):
    """``CancelledMidway`` with a synchronous apply that checks ``request.cancelled()``."""

    def apply(self, request: EffectRequest) -> Receipt:  # type: ignore[override]
        self._enter(request)
        try:
            self._cancel(request)
            give_up = time.monotonic() + 10
            while time.monotonic() < give_up:
                if request.cancelled():
                    self.saw_cancelled[request.key] += 1
                    raise ConnectionAbortedError(f"{request.key}: gave up, the task was cancelled")
                time.sleep(0.01)
            return self._record(request)
        finally:
            self._leave()

    def observe(self, request: EffectRequest) -> Observation:  # type: ignore[override]
        return self._look(request)


class DeadlineCases(AsyncCase):
    """Timeouts and cancellation that reach a running effect (real time; each wait is short)."""

    def hung_function(self, target: HungTarget, asynchronous: bool, max_parallel: int) -> Any:
        decorate = self.durable({"t": target}, timeout_s=1, max_parallel=max_parallel)
        if asynchronous:

            async def agent(run: longrun.AsyncRun) -> list[Any]:
                return list(await asyncio.gather(*(run.effect(f"e/{i}", "t", {"n": i, "hang": i == 0}) for i in range(3))))

            return decorate(agent)

        def sync_agent(run: longrun.Run) -> list[Any]:
            return [run.effect(f"e/{i}", "t", {"n": i, "hang": i == 0}) for i in range(3)]

        return decorate(sync_agent)

    def test_an_observe_that_does_not_answer_within_the_timeout_is_unknown_not_waited_for(self) -> None:
        for asynchronous in (False, True):
            with self.subTest(face="async" if asynchronous else "sync"):
                target = SilentTarget()
                self.addCleanup(target.release.set)
                decorate = self.durable({"t": target}, timeout_s=0.5)  # the observe never answers: any timeout is passed
                if asynchronous:

                    async def agent(run: longrun.AsyncRun) -> Any:
                        return await run.effect("e", "t", {"n": 1})

                else:

                    def agent(run: longrun.Run) -> Any:  # type: ignore[misc]
                        return run.effect("e", "t", {"n": 1})

                task = f"silent-{asynchronous}"
                with self.assertLogs("longrun", "WARNING") as logs:
                    outcome = decorate(agent).run(task)
                # Had the run waited for the observe, it would have seen "absent" and applied again.
                self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE, outcome.next_action)
                self.assertFalse(target.release.is_set())
                self.assertTrue(any("did not answer within 0.5 s" in item.detail for item in outcome.unknowns), outcome.unknowns)
                self.assertTrue(any("did not answer" in line for line in logs.output))
                self.assertEqual(target.calls[f"{task}/e"], 1)
                self.assertEqual(self.state(task).effects["e"].state, EffectState.UNCERTAIN)
                target.release.set()  # the observe thread ends; the lease it kept is released after it
                deadline = time.monotonic() + 30
                while not self.store.read_lease(task).released and time.monotonic() < deadline:  # type: ignore[union-attr]
                    time.sleep(0.02)
                self.assertTrue(self.store.read_lease(task).released)  # type: ignore[union-attr]

    def test_a_hung_sync_adapter_past_its_timeout_stops_the_run_and_is_never_applied_twice(self) -> None:
        # With max_parallel=1 the hung thread holds the async driver's only worker: the observe
        # after the timeout, and the steps after it, must not wait for that thread.
        for asynchronous, max_parallel in ((False, 16), (True, 16), (True, 1)):
            with self.subTest(face="async" if asynchronous else "sync", max_parallel=max_parallel):
                target = HungTarget()
                self.addCleanup(target.release.set)
                agent = self.hung_function(target, asynchronous, max_parallel)
                task = f"hung-{asynchronous}-{max_parallel}"
                key = f"{task}/e/0"
                outcome = agent.run(task)
                # The run stops instead of waiting 20 s; the attempt may still be running, so the
                # effect is uncertain, was observed, and is not applied again by this run.
                self.assertEqual(outcome.status, Status.RETRY_SCHEDULED, outcome.next_action)
                self.assertIn("may still be running", outcome.next_action)
                self.assertFalse(target.returned.is_set() and target.applied[key], "the hung apply had not returned")
                record = self.state(task).effects["e/0"]
                self.assertEqual((record.state, record.attempts), (EffectState.UNCERTAIN, 1))
                self.assertGreaterEqual(target.observed[key], 1, "the timed-out effect was observed")
                self.assertEqual(target.calls[key], 1)
                # While that thread runs, the lease is kept: no other run can apply the effect again.
                self.assertEqual(agent.run(task).status, Status.ALREADY_RUNNING)
                self.assertEqual(target.calls[key], 1)
                target.release.set()  # the late attempt now reaches the target
                final = self.run_until_not_running(agent, task)
                self.assertEqual(final.status, Status.DONE, final.next_action)
                self.assertEqual(target.calls[key], 1, "never applied twice")
                self.assertEqual(target.applied[key], 1)
                self.assertEqual(self.state(task).effects["e/0"].attempts, 1, "verified by observation, not retried")
                self.assertEqual(target.total(), 3)

    def test_a_hung_sync_call_past_its_timeout_is_retried_without_waiting_for_its_thread(self) -> None:
        """A call has no effect to observe: past its timeout it is a transient failure and is called
        again. At ``max_parallel=1`` the hung call holds the only worker; the retry must not wait for it."""
        release = threading.Event()
        self.addCleanup(release.set)
        first_returned = threading.Event()
        calls: Counter[str] = Counter()

        def lookup(query: str) -> str:
            calls[query] += 1
            if calls[query] == 1:
                release.wait(20)
                first_returned.set()
            return f"found {query}"

        @self.durable({}, max_parallel=1)
        async def agent(run: longrun.AsyncRun) -> Any:
            return await run.call("lookup", lookup, "x", timeout_s=0.5)

        outcome = agent.run("hung-call")
        self.assertEqual((outcome.status, outcome.result), (Status.DONE, "found x"), outcome.next_action)
        self.assertFalse(first_returned.is_set(), "the run went on without the hung call")
        self.assertEqual(calls["x"], 2)
        self.assertEqual(self.state("hung-call").effects["lookup"].attempts, 2)

    def run_until_not_running(self, agent: Any, task: str) -> longrun.RunOutcome:
        """Run ``task`` until its lease is free (the kept lease goes when the late attempt ends)."""
        give_up = time.monotonic() + 30
        while True:
            outcome: longrun.RunOutcome = agent.run(task)
            if outcome.status is not Status.ALREADY_RUNNING or time.monotonic() > give_up:
                return outcome
            time.sleep(0.05)

    def test_an_async_apply_past_its_timeout_is_cancelled_observed_and_retried_per_its_policy(self) -> None:
        target = SlowFirstAttempt()

        @self.durable({"t": target})
        async def agent(run: longrun.AsyncRun) -> list[Any]:
            slow = run.effect("slow", "t", {"n": 0, "slow": True}, timeout_s=0.3, retry=RetryPolicy(base_delay_s=100, max_delay_s=100, jitter=0.0)
            )
            return list(await asyncio.gather(slow, *(run.effect(f"e/{i}", "t", {"n": i}) for i in range(1, 4))))

        started = self.clock.now()
        outcome = agent.run("slow")
        self.assertEqual(outcome.status, Status.RETRY_SCHEDULED, outcome.next_action)
        self.assertEqual(outcome.wake_at, started + 100, "the effect's own retry policy, not the run's")
        self.assertEqual(target.cancelled, Counter({"slow/slow": 1}), "the awaitable was cancelled")
        self.assertEqual(target.applied, Counter({f"slow/e/{i}": 1 for i in range(1, 4)}), "the others settled")
        self.assertGreaterEqual(target.observed["slow/slow"], 1, "observed before any retry")
        record = self.state("slow").effects["slow"]
        self.assertEqual((record.state, record.attempts), (EffectState.PLANNED, 1))
        self.assertIn("timeout", record.last_error or "")
        self.clock.advance(100)
        done = agent.run("slow")
        self.assertEqual(done.status, Status.DONE, done.next_action)
        self.assertEqual(done.result, [{"n": i} for i in range(4)])
        self.assertEqual(target.applied, Counter({f"slow/e/{i}": 1 for i in range(1, 4)} | {"slow/slow": 1}))
        self.assertEqual(self.state("slow").effects["slow"].attempts, 2)

    def test_an_adapters_own_timeout_error_is_its_outcome_not_the_runs_timeout(self) -> None:
        class RaisesTimeout(Target):
            """Its first apply takes the effect and then raises the builtin ``TimeoutError`` at once."""

            def apply_once(self, request: EffectRequest) -> Receipt:
                self._enter(request)
                try:
                    receipt = self._record(request)
                    if self.calls[request.key] == 1:
                        raise TimeoutError("the target's own client timed out")
                    return receipt
                finally:
                    self._leave()

        class AsyncRaises(RaisesTimeout):
            async def apply(self, request: EffectRequest) -> Receipt:
                return self.apply_once(request)

            async def observe(self, request: EffectRequest) -> Observation:
                return self._look(request)

        class PlainRaises(RaisesTimeout):
            def apply(self, request: EffectRequest) -> Receipt:
                return self.apply_once(request)

            def observe(self, request: EffectRequest) -> Observation:
                return self._look(request)

        for target in (AsyncRaises(), PlainRaises()):
            with self.subTest(adapter=type(target).__name__):

                @self.durable({"t": target}, timeout_s=30)
                async def agent(run: longrun.AsyncRun) -> Any:
                    return await run.effect("e", "t", {"n": 1})

                task = f"own-timeout-{type(target).__name__}"
                with self.assertLogs("longrun", "WARNING") as logs:
                    outcome = agent.run(task)
                self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
                self.assertIn("raised TimeoutError", "\n".join(logs.output))  # the adapter's exception, observed
                self.assertEqual(target.calls[f"{task}/e"], 1, "found applied by observation, never applied again")
                record = self.state(task).effects["e"]
                self.assertNotIn("timeout:", record.last_error or "", "not the run's timeout of 30 s")

    def test_a_cancellation_while_an_async_effect_runs_cancels_it_and_reconciles_it(self) -> None:
        target = CancelledMidway(self.store)

        @self.durable({"t": target}, clock=longrun.SystemClock(), lease_ttl_s=0.6)
        async def agent(run: longrun.AsyncRun) -> list[Any]:
            return list(await asyncio.gather(*(run.effect(f"e/{i}", "t", {"n": i}) for i in range(2))))

        with self.assertLogs("longrun", "WARNING") as logs:
            outcome = agent.run("cancel-async")
        self.assertTrue(all("observing" in line for line in logs.output), logs.output)
        self.check_cancelled(outcome, target, "cancel-async", agent)
        self.assertEqual(target.cancelled, target.calls, "every apply that had begun was cancelled")

    def test_a_cancellation_while_a_sync_effect_runs_is_seen_by_request_cancelled(self) -> None:
        for asynchronous in (False, True):
            with self.subTest(face="async" if asynchronous else "sync"):
                target = PollingCancelled(self.store)
                decorate = self.durable({"t": target}, clock=longrun.SystemClock(), lease_ttl_s=0.6)
                if asynchronous:

                    async def agent(run: longrun.AsyncRun) -> Any:
                        return await run.effect("e/0", "t", {"n": 0})

                    fn = decorate(agent)
                else:

                    def sync_agent(run: longrun.Run) -> Any:
                        return run.effect("e/0", "t", {"n": 0})

                    fn = decorate(sync_agent)
                task = f"cancel-{asynchronous}"
                with self.assertLogs("longrun", "WARNING") as logs:
                    outcome = fn.run(task)
                self.assertTrue(all("gave up" in line for line in logs.output), logs.output)
                self.check_cancelled(outcome, target, task, fn)
                self.assertEqual(target.saw_cancelled, Counter({f"{task}/e/0": 1}))

    def check_cancelled(self, outcome: longrun.RunOutcome, target: Target, task: str, fn: Any) -> None:
        self.assertEqual(outcome.status, Status.CANCELLED, outcome.next_action)
        self.assertEqual(target.total(), 0)
        state = self.state(task)
        self.assertEqual(state.status, Status.CANCELLED)
        self.assertTrue(target.calls, "an apply was running when the cancellation came")
        for key, calls in target.calls.items():
            self.assertEqual(calls, 1, f"{key} was not applied again")
            self.assertGreaterEqual(target.observed[key], 1, f"{key} was reconciled by observation")
        for step_id, record in state.effects.items():
            self.assertFalse(record.in_flight, f"{step_id} is settled, not left in flight: {record.state}")
        self.assertEqual(fn.run(task).status, Status.CANCELLED)
        self.assertEqual(target.total(), 0, "a cancelled run starts nothing again")


class SqliteStoreMixin:
    def make_store(self) -> Store:
        store = SqliteStore(self.path("longrun.sqlite"), create=True)  # type: ignore[attr-defined]
        self.addCleanup(store.close)  # type: ignore[attr-defined]
        return store


class PostgresStoreMixin:
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()  # type: ignore[misc]
        pg_support.check()

    def make_store(self) -> Store:
        schema = pg_support.Schema()
        self.addCleanup(schema.drop)  # type: ignore[attr-defined]
        store = PostgresStore(schema.factory())
        self.addCleanup(store.close)  # type: ignore[attr-defined]
        return store


class JsonFileStoreTests(StoreCases):
    pass


class SqliteStoreTests(SqliteStoreMixin, StoreCases):
    pass


class PostgresStoreTests(PostgresStoreMixin, StoreCases):
    pass


class JsonFileDeadlineTests(DeadlineCases):
    pass


class SqliteDeadlineTests(SqliteStoreMixin, DeadlineCases):
    pass


class PostgresDeadlineTests(PostgresStoreMixin, DeadlineCases):
    pass


del StoreCases, DeadlineCases  # only their subclasses run


class FaceTests(AsyncCase):
    """Which face accepts what; these do not depend on the store."""

    def test_the_sync_face_refuses_an_async_adapter_at_decoration(self) -> None:
        decorate = self.durable({"t": AsyncTarget()})

        def agent(run: longrun.Run) -> None:
            run.effect("e", "t", {"n": 0})

        with self.assertRaises(InvalidInputError) as caught:
            decorate(agent)
        self.assertIn("async", str(caught.exception))

        async def async_agent(run: longrun.AsyncRun) -> None:
            await run.effect("e", "t", {"n": 0})

        self.assertTrue(decorate(async_agent).is_async, "the async face takes it")

    def test_run_on_an_async_function_works_from_sync_code_and_refuses_a_running_loop(self) -> None:
        target = AsyncTarget()
        fan_out = self.gatherer(target)
        self.assertEqual(fan_out.run("sync-caller", 3).status, Status.DONE)

        async def inside_a_loop() -> None:
            with self.assertRaises(InvalidInputError) as caught:
                fan_out.run("loop-caller", 3)
            self.assertIn("arun", str(caught.exception))
            outcome = await fan_out.arun("loop-caller", 3)
            self.assertEqual(outcome.status, Status.DONE)

        gc.collect()  # what earlier tests left for the collector is not this test's to judge
        with warnings.catch_warnings(record=True) as caught_warnings:
            warnings.simplefilter("always")
            asyncio.run(inside_a_loop())
            gc.collect()
        self.assertEqual([str(w.message) for w in caught_warnings], [], "no coroutine was left unawaited, nothing left open")
        self.assertEqual(target.total(), 6)

    def test_a_sync_function_that_returns_a_coroutine_is_refused_with_nothing_left_unawaited(self) -> None:
        target = ThreadTarget()

        async def later() -> int:
            return 1

        @self.durable({"t": target})
        def confused(run: longrun.Run) -> Any:
            run.effect("e", "t", {"n": 0})
            return later()

        with warnings.catch_warnings(record=True) as caught_warnings:
            warnings.simplefilter("always")
            with self.assertRaises(InvalidInputError) as caught:
                confused.run("confused")
            gc.collect()
        self.assertIn("awaitable", str(caught.exception))
        self.assertEqual([str(w.message) for w in caught_warnings], [], "the coroutine was closed, not left unawaited")
        self.assertEqual(target.total(), 1)
        self.assertEqual(self.state("confused").effects["e"].state, EffectState.VERIFIED, "what was settled is kept")

    def test_run_map_refuses_a_running_event_loop_and_works_from_a_thread(self) -> None:
        target = ThreadTarget()

        @self.durable({"t": target})
        def mapper(run: longrun.Run) -> Any:
            return run.map("m", "t", [{"n": 0}, {"n": 1}])

        async def inside_a_loop() -> None:
            with self.assertRaises(InvalidInputError):
                mapper.run("in-loop")
            outcome = await asyncio.to_thread(mapper.run, "mapped")  # its own thread: no loop there
            self.assertEqual((outcome.status, outcome.result), (Status.DONE, [{"n": 0}, {"n": 1}]))

        asyncio.run(inside_a_loop())
        self.assertEqual(target.applied, Counter({"mapped/m/0": 1, "mapped/m/1": 1}))

if __name__ == "__main__":
    unittest.main()
