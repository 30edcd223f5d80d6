"""A declared plan may grow by appending steps; any other change to a recorded plan is a mismatch."""

from __future__ import annotations

import unittest

from helpers.runner_case import RunnerCase
from longrun import RunContract, Status, Step
from longrun.contract import plan_digest, plan_prefix_digests


class PrefixDigestTests(unittest.TestCase):
    def test_every_prefix_digest_equals_the_digest_of_that_prefix(self) -> None:
        contract = RunContract("t", "goal", allowed_actions=("a", "b"))
        steps = [Step(f"s{i}", "a" if i % 2 else "b", {"n": i, "text": "é" * i}) for i in range(12)]
        prefixes = plan_prefix_digests(contract, steps)
        self.assertEqual(len(prefixes), len(steps))
        for length in range(1, len(steps) + 1):
            self.assertEqual(prefixes[plan_digest(contract, steps[:length])], length)


class PlanGrowthTests(RunnerCase):
    def steps(self, count: int) -> list[Step]:
        return [Step(f"s{i}", "write", {"n": i}) for i in range(count)]

    def test_appending_steps_to_a_running_task_is_accepted_and_recorded(self) -> None:
        gated = self.steps(2) + [Step("s2", "write", {"n": 2}, approval=True)]
        self.assertEqual(self.runner(gated).run().status, Status.AWAITING_APPROVAL)
        grown = gated + [Step("s3", "write", {"n": 3})]
        runner = self.runner(grown)
        outcome = runner.run()
        self.assertEqual(outcome.status, Status.AWAITING_APPROVAL)
        state = self.store.load("task-1").state
        assert state is not None
        self.assertEqual(state.plan_digest, runner.plan_digest, "the grown plan's digest is recorded")
        self.assertEqual(state.approval_requests["s2"].plan_digest, runner.plan_digest, "the request is issued again")
        self.store.write_approval(self.approve(state, "s2"))
        self.assertEqual(self.runner(grown).run().status, Status.DONE)
        self.assertEqual(self.outbox.counts(), {f"task-1/s{i}": 1 for i in range(4)})

    def test_the_outline_is_recorded_with_the_first_revision_and_again_when_the_plan_grows(self) -> None:
        gated = self.steps(2) + [Step("s2", "write", {"n": 2}, approval=True)]
        self.assertEqual(self.runner(gated).run().status, Status.AWAITING_APPROVAL)
        outline = self.store.load("task-1").state.plan_outline
        self.assertEqual((outline.steps, outline.actions), (("s0", "s1", "s2"), ("write",) * 3))
        self.runner(gated + [Step("s3", "write", {"n": 3})]).run()
        self.assertEqual(self.store.load("task-1").state.plan_outline.steps, ("s0", "s1", "s2", "s3"))

    def test_a_state_written_without_an_outline_gets_one_on_its_next_run(self) -> None:
        gated = self.steps(2) + [Step("s2", "write", {"n": 2}, approval=True)]
        self.assertEqual(self.runner(gated).run().status, Status.AWAITING_APPROVAL)
        lease = self.store.acquire_lease("task-1", "old-code", 30.0, self.clock.now() + 60)
        state = self.store.load("task-1", lease=lease).state
        state.plan_outline = None  # as code before outlines left it
        self.store.commit(lease, state, ())
        self.store.release_lease(lease, self.clock.now() + 60)
        self.assertIsNone(self.store.load("task-1").state.plan_outline)
        self.clock.advance(120)
        self.assertEqual(self.runner(gated).run().status, Status.AWAITING_APPROVAL)
        self.assertEqual(self.store.load("task-1").state.plan_outline.steps, ("s0", "s1", "s2"))

    def test_changing_removing_or_reordering_a_recorded_step_is_a_mismatch_that_applies_nothing(self) -> None:
        first = self.steps(2) + [Step("s2", "write", {"n": 2}, approval=True)]
        self.assertEqual(self.runner(first).run().status, Status.AWAITING_APPROVAL)
        variants = {
            "changed": [Step("s0", "write", {"n": 99})] + first[1:],
            "removed": first[:2],
            "reordered": [first[1], first[0], first[2]],
            "inserted": [first[0], Step("new", "write", {}), *first[1:]],
        }
        for name, steps in variants.items():
            with self.subTest(name):
                outcome = self.runner(steps).run()
                self.assertEqual(outcome.status, Status.PLAN_MISMATCH)
                self.assertNotIn("new task id", outcome.next_action.split(";")[0])
        self.assertEqual(self.outbox.counts(), {"task-1/s0": 1, "task-1/s1": 1})

    def test_a_finished_task_does_not_grow(self) -> None:
        self.assertEqual(self.runner(self.steps(2)).run().status, Status.DONE)
        self.assertEqual(self.runner(self.steps(3)).run().status, Status.PLAN_MISMATCH)
        self.assertEqual(self.outbox.counts(), {"task-1/s0": 1, "task-1/s1": 1})


if __name__ == "__main__":
    unittest.main()
