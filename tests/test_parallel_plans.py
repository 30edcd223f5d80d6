"""Declared plans with dependencies (``Step(after=...)``): order, parallelism, stops, digests."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest
from collections import Counter

from helpers import support
from longrun import (
    Approval,
    InvalidInputError,
    JsonFileStore,
    Observation,
    Receipt,
    RetryPolicy,
    RunContract,
    Runner,
    Status,
    Step,
    TransientError,
)
from longrun.adapters import EffectRequest
from longrun.contract import plan_digest
from longrun.ledger import EffectState


class GatedTarget:
    """A thread-safe target that counts applies per key, remembers the order of applies, and
    notes the peak number of applies running at once. Each apply waits on ``gate`` (set by
    default), so a test can hold applies in flight."""

    deduplicates = False

    def __init__(self, *, hold_s: float = 0.0, transient: dict[str, int] | None = None):
        self.applied: Counter[str] = Counter()
        self.order: list[str] = []
        self.running = 0
        self.peak = 0
        self.hold_s = hold_s
        self.transient = dict(transient or {})
        self.lock = threading.Lock()

    def apply(self, request: EffectRequest) -> Receipt:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            if self.transient.get(request.step_id, 0) > 0:
                self.transient[request.step_id] -= 1
                self.running -= 1
                raise TransientError("try again")
        time.sleep(self.hold_s)
        with self.lock:
            self.running -= 1
            self.applied[request.key] += 1
            self.order.append(request.step_id)
        return Receipt(result={"step": request.step_id})

    def observe(self, request: EffectRequest) -> Observation:
        with self.lock:
            seen = self.applied[request.key] > 0
        return Observation.applied("seen", {"step": request.step_id}) if seen else Observation.absent("not seen")


class ParallelPlanTests(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.store = JsonFileStore(self.path("store"), create=True)

    def runner(self, task_id: str, steps: list[Step], target: GatedTarget, **options: object) -> Runner:
        return Runner(RunContract(task_id, "parallel plan"), steps, store=self.store, adapters={"t": target}, **options)  # type: ignore[arg-type]

    def test_steps_run_after_what_they_name_and_side_by_side_otherwise(self) -> None:
        target = GatedTarget(hold_s=0.05)
        steps = [
            Step("fetch", "t", {"n": 0}, after=()),
            *(Step(f"work{i}", "t", {"n": i}, after=("fetch",)) for i in range(6)),
            Step("join", "t", {"n": 99}, after=tuple(f"work{i}" for i in range(6))),
        ]
        outcome = self.runner("dag", steps, target, max_parallel=3).run()
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(target.order[0], "fetch")
        self.assertEqual(target.order[-1], "join")
        self.assertEqual(set(target.applied.values()), {1})
        self.assertGreater(target.peak, 1, "independent steps ran one at a time")
        self.assertLessEqual(target.peak, 3, "max_parallel was exceeded")
        self.assertEqual(self.runner("dag", steps, target, max_parallel=3).run().status, Status.DONE)
        self.assertEqual(sum(target.applied.values()), len(steps), "a second run applied something again")

    def test_starts_that_become_ready_together_share_a_commit(self) -> None:
        target = GatedTarget()
        steps = [Step(f"s{i}", "t", {"n": i}, after=()) for i in range(32)]
        self.assertEqual(self.runner("group", steps, target, max_parallel=32).run().status, Status.DONE)
        state = self.store.load("group").state
        assert state is not None
        self.assertLess(state.revision, 16, f"32 parallel effects took {state.revision} commits")

    def test_a_step_awaiting_approval_holds_back_only_what_comes_after_it(self) -> None:
        target = GatedTarget()
        steps = [
            Step("a", "t", {"n": 1}, after=()),
            Step("b", "t", {"n": 2}, after=(), approval=True),
            Step("c", "t", {"n": 3}, after=()),
            Step("after-b", "t", {"n": 4}, after=("b",)),
        ]
        runner = self.runner("gate", steps, target)
        outcome = runner.run()
        self.assertEqual(outcome.status, Status.AWAITING_APPROVAL)
        state = self.store.load("gate").state
        assert state is not None
        self.assertEqual(state.status, Status.AWAITING_APPROVAL)
        self.assertEqual({sid: r.state for sid, r in state.effects.items()}, {
            "a": EffectState.VERIFIED, "b": EffectState.PLANNED, "c": EffectState.VERIFIED,
        })  # fmt: skip
        request = state.approval_requests["b"]
        self.store.write_approval(
            Approval(
                approval_id="ap-1", task_id="gate", plan_digest=request.plan_digest, step_id="b",
                payload_digest=request.payload_digest, action="t", approver="tester", expires_at=time.time() + 600,
                granted_at=time.time(),
            )
        )  # fmt: skip
        self.assertEqual(runner.run().status, Status.DONE)
        self.assertEqual(target.order[-1], "after-b")
        self.assertEqual(set(target.applied.values()), {1})

    def test_per_step_retry_policy_and_async_run(self) -> None:
        target = GatedTarget(transient={"flaky": 1})
        quick = RetryPolicy(base_delay_s=0.0, jitter=0.0)
        steps = [Step("flaky", "t", {"n": 1}, after=(), retry=quick), Step("other", "t", {"n": 2}, after=())]
        outcome = asyncio.run(self.runner("retry", steps, target).arun())
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        state = self.store.load("retry").state
        assert state is not None
        self.assertEqual(state.effects["flaky"].attempts, 2)

    def test_after_must_name_earlier_steps(self) -> None:
        with self.assertRaisesRegex(InvalidInputError, "earlier in the plan"):
            self.runner("bad", [Step("a", "t", {}, after=("b",)), Step("b", "t", {})], GatedTarget())
        with self.assertRaisesRegex(InvalidInputError, "tuple of step ids"):
            Step("a", "t", {}, after="b")  # type: ignore[arg-type]
        with self.assertRaisesRegex(InvalidInputError, "timeout_s"):
            Step("a", "t", {}, timeout_s=0)

    def test_the_digest_pins_dependencies_only_when_declared(self) -> None:
        contract = RunContract("d", "g")
        plain = [Step("a", "t", {}), Step("b", "t", {})]
        chained = [Step("a", "t", {}), Step("b", "t", {}, after=("a",))]
        at_once = [Step("a", "t", {}), Step("b", "t", {}, after=())]
        timed = [Step("a", "t", {}, timeout_s=5, retry=RetryPolicy()), Step("b", "t", {})]
        self.assertEqual(plan_digest(contract, plain), plan_digest(contract, timed))
        self.assertEqual(len({plan_digest(contract, p) for p in (plain, chained, at_once)}), 3)

    def test_a_static_payload_is_captured_when_the_step_is_built(self) -> None:
        payload = {"to": "a@example.com"}
        step = Step("a", "t", payload)
        payload["to"] = "changed@example.com"
        static = step.static_payload
        assert static is not None
        self.assertEqual(static[0], {"to": "a@example.com"})
        self.assertEqual(step.evaluate_payload({}), {"to": "a@example.com"})
        self.assertIsNone(Step("b", "t", lambda results: {}).static_payload)


if __name__ == "__main__":
    unittest.main()
