"""The Runner in one process: lifecycle, completion, retry, budgets, cancellation, approval, plan pinning."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import threading
import unittest
import unittest.mock
from typing import Any

from helpers.runner_case import RecordingAdapter, RunnerCase, SpyStore
from longrun import (
    Approval,
    Cancellation,
    InvalidInputError,
    JsonFileStore,
    Limits,
    Observation,
    Receipt,
    RetryPolicy,
    RunContract,
    Runner,
    RunState,
    Status,
    Step,
    TransientError,
    UnknownActionError,
)
from longrun.engine import procedures
from longrun.canonical import digest_of
from longrun.adapters import EffectRequest
from longrun.ledger import EffectState
from longrun.testing import FakeClock, OutboxAdapter, copy_keeping_links


class LifecycleTests(RunnerCase):
    def test_effect_moves_planned_started_acknowledged_verified_with_started_durable_before_apply(self) -> None:
        seen_on_disk: list[str] = []

        def check_disk(request: EffectRequest) -> None:
            state = self.store.load("task-1").state
            assert state is not None
            seen_on_disk.append(state.effects[request.step_id].state.value)

        adapter = RecordingAdapter()
        adapter.on_apply = check_disk
        outcome = self.runner([Step("s0", "write", {"n": 0})], adapter=adapter).run()
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(seen_on_disk, ["started"])
        states = [effect["state"] for snap in self.store.commits for effect in snap["effects"]]
        self.assertEqual(states, ["started", "verified"])  # acknowledged lives between commits
        final = self.store.load("task-1").state
        assert final is not None
        record = final.effects["s0"]
        self.assertEqual(record.receipt, "recorded")
        self.assertEqual(record.attempts, 1)
        self.assertEqual(record.evidence, "in the record")

    def test_the_evidence_noted_on_every_effect_reads_as_written_and_a_long_trail_keeps_its_head_and_tail(self) -> None:
        from longrun.engine._invocation import Trail

        plan = [Step(f"s{i}", "write", {"n": i}) for i in range(8)]
        with unittest.mock.patch.object(Trail, "HEAD", 3), unittest.mock.patch.object(Trail, "TAIL", 4):
            outcome = self.runner(plan).run()
        self.assertEqual(outcome.status, Status.DONE)
        receipts = [item.detail for item in outcome.observations if item.detail.startswith("receipt for ")]
        self.assertIn("receipt for task-1/s7 attempt 1: outbox line 7", receipts)  # made from its values when read
        self.assertEqual(len(outcome.observations), 3 + 1 + 4)
        self.assertRegex(outcome.observations[3].detail, r"^\d+ more items of this kind are left out here$")
        self.assertIn("task-1/s7 verified by observation; it will not be applied again", [item.detail for item in outcome.inferences])

    def test_uncertain_apply_is_observed_and_verified_without_a_second_apply(self) -> None:
        outbox = OutboxAdapter(self.path("outbox.jsonl"), raise_after_apply={"s1"})
        with self.assertLogs("longrun", "WARNING") as logged:
            outcome = self.runner(adapter=outbox).run()
        self.assertIn("apply of task-1/s1 raised ConnectionError", "\n".join(logged.output))
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(outbox.calls["task-1/s1"], 1)
        self.assertEqual(outbox.counts()["task-1/s1"], 1)
        self.assertEqual(self.store.states_of("s1"), ["started", "verified"])
        self.assertTrue(any("ConnectionError" in item.detail for item in outcome.observations))

    def test_done_only_when_completion_evidence_is_verified_and_results_come_from_verified_effects(self) -> None:
        adapter = RecordingAdapter()
        adapter.observe_as["task-1/s2"] = Observation.unknown("target unreachable")
        outcome = self.runner(adapter=adapter).run()
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertNotIn("s2", outcome.results)
        self.assertEqual(set(outcome.results), {"s0", "s1"})
        self.assertTrue(any("task-1/s2" in item.detail for item in outcome.unknowns))
        # The target becomes observable again: the next run verifies s2 without applying it again.
        del adapter.observe_as["task-1/s2"]
        outcome = self.runner(adapter=adapter).run()
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(adapter.applied.count("task-1/s2"), 1)

    def test_repeat_run_of_a_finished_task_applies_nothing(self) -> None:
        self.assertEqual(self.runner().run().status, Status.DONE)
        before = self.outbox.counts()
        outcome = self.runner().run()
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(self.outbox.counts(), before)
        self.assertEqual(sum(self.outbox.calls.values()), 3)
        self.assertEqual(set(outcome.results), {"s0", "s1", "s2"})

    def test_a_resume_passes_over_the_verified_steps_and_makes_each_other_one_in_order(self) -> None:
        steps = [Step(f"s{i}", "write", {"n": i}) for i in range(6)]
        self.assertEqual(self.runner(steps).run().status, Status.DONE)
        # A state in which s3 is planned again between verified steps (as a restored copy may be).
        lease = self.store.acquire_lease("task-1", "editor", 30.0, self.clock.now())
        state = self.store.load("task-1", lease=lease).state
        assert state is not None
        state.effects["s3"] = dataclasses.replace(state.effects["s3"], state=EffectState.PLANNED, attempts=0, receipt=None, evidence=None, result=None)
        state.status, state.lease_owner, state.lease_epoch = Status.RUNNING, "editor", lease.epoch
        self.store.commit(lease, state)
        self.store.release_lease(lease, self.clock.now())
        adapter = RecordingAdapter()
        runner = self.runner(steps, adapter=adapter)
        made: list[str] = []
        drive = runner.engine.drive

        def counted(procedure: Any, *args: Any, **options: Any) -> Any:
            if procedure is procedures.effect:
                made.append(args[0].step_id)
            return drive(procedure, *args, **options)

        runner.engine.drive = counted  # type: ignore[method-assign]
        outcome = runner.run()
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(adapter.applied, ["task-1/s3"])
        self.assertEqual(adapter.events, [("observe", "task-1/s3"), ("apply", "task-1/s3"), ("observe", "task-1/s3")])
        self.assertEqual(made, ["s3", "s4", "s5"], "the verified steps before the first other one are passed over in one go")
        self.assertEqual(set(outcome.results), {step.step_id for step in steps})

    def test_a_done_run_names_the_verified_steps_it_required_only_while_they_are_few(self) -> None:
        few = self.runner().run()
        self.assertIn("every required effect is verified: ['s0', 's1', 's2']", [item.detail for item in few.inferences])
        steps = [Step(f"s{i}", "write", {"n": i}) for i in range(25)]
        many = self.runner(steps, contract=RunContract("task-2", "write lines")).run()
        self.assertEqual(many.status, Status.DONE)
        self.assertEqual(set(many.results), {step.step_id for step in steps})
        detail = next(item.detail for item in many.inferences if item.detail.startswith("every required effect is verified"))
        self.assertTrue(detail.startswith("every required effect is verified: 25 steps, ['s0', 's1', "), detail)
        self.assertNotIn("'s20'", detail)

    def test_one_commit_per_effect_in_a_sequential_run(self) -> None:
        steps = [Step(f"s{i}", "write", {"n": i}) for i in range(10)]
        self.runner(steps).run()
        # one initial revision, one per effect start (carrying the previous verification), one final
        self.assertEqual(len(self.store.commits), 1 + 10 + 1)

    def test_dynamic_payload_is_evaluated_once_and_persisted(self) -> None:
        calls = []

        def factory(results):
            calls.append(dict(results))
            return {"from": results["s0"]["line"], "call": len(calls)}

        steps = [Step("s0", "write", {"n": 0}), Step("s1", "write", factory, approval=True)]
        first = self.runner(steps).run()
        self.assertEqual(first.status, Status.AWAITING_APPROVAL)
        self.assertEqual(calls, [{"s0": {"line": 0}}])
        state = self.store.load("task-1").state
        assert state is not None
        self.store.write_approval(self.approve(state, "s1"))
        second = self.runner(steps).run()
        self.assertEqual(second.status, Status.DONE)
        self.assertEqual(len(calls), 1, "the factory must not be called again on resume")
        lines = [line for line in self.outbox._lines() if line["key"] == "task-1/s1"]
        self.assertEqual(lines[0]["payload"], {"from": 0, "call": 1})


class ContractTests(RunnerCase):
    def test_resuming_with_a_different_plan_stops_plan_mismatch_and_changes_nothing(self) -> None:
        failing = OutboxAdapter(self.path("outbox.jsonl"), fail_permanent=False, raise_after_apply=())
        self.runner([Step("s0", "write", {"n": 0}), Step("s1", "write", {"n": 1}, approval=True)], adapter=failing).run()
        state_path = os.path.join(self.store.task_dir("task-1"), "state.json")
        with open(state_path, "rb") as handle:
            before = handle.read()
        outcome = self.runner([Step("s0", "write", {"n": 0}), Step("s1", "write", {"n": 2}, approval=True)]).run()
        self.assertEqual(outcome.status, Status.PLAN_MISMATCH)
        self.assertIn(f"step 's1': recorded payload digest {digest_of({'n': 1})}, this plan {digest_of({'n': 2})}", outcome.next_action)
        reordered = self.runner([Step("s1", "write", {"n": 1}, approval=True), Step("s0", "write", {"n": 0}), Step("s2", "write", {})]).run()
        self.assertEqual(reordered.status, Status.PLAN_MISMATCH)
        self.assertIn("the order of the steps (recorded ['s0', 's1'])", reordered.next_action)
        self.assertIn("steps that are not in the recorded plan: ['s2']", reordered.next_action)
        other_contract = self.runner(
            [Step("s0", "write", {"n": 0}), Step("s1", "write", {"n": 1}, approval=True)], contract=RunContract("task-1", "another goal")
        ).run()
        self.assertEqual(other_contract.status, Status.PLAN_MISMATCH)
        self.assertIn("the run contract", other_contract.next_action)
        with open(state_path, "rb") as handle:
            self.assertEqual(handle.read(), before)
        self.assertEqual(self.outbox.counts()["task-1/s1"], 0)

    def test_forbidden_or_unlisted_action_is_refused_before_any_effect(self) -> None:
        contract = RunContract("task-1", "goal", forbidden_actions=("write",))
        outcome = self.runner(contract=contract).run()
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertEqual(self.outbox.counts(), {})
        self.assertFalse(os.path.exists(self.store.task_dir("task-1")))
        contract = RunContract("task-1", "goal", allowed_actions=("read",))
        self.assertEqual(self.runner(contract=contract).run().status, Status.UNSAFE_TO_CONTINUE)
        self.assertEqual(self.outbox.counts(), {})

    def test_unknown_action_and_bad_plans_are_typed_errors(self) -> None:
        with self.assertRaises(UnknownActionError):
            self.runner([Step("s0", "email", {})])
        with self.assertRaises(InvalidInputError):
            self.runner([Step("s0", "write", {}), Step("s0", "write", {})])
        with self.assertRaises(InvalidInputError):
            self.runner([])
        with self.assertRaises(InvalidInputError):
            Runner(RunContract("t", "g"), [Step("s", "write")], store=self.store, adapters={"write": self.outbox}, lease_ttl_s=-1)

    def test_non_json_dynamic_payload_is_a_typed_error_and_nothing_is_applied(self) -> None:
        steps = [Step("s0", "write", lambda results: {"when": object()})]
        with self.assertRaises(InvalidInputError):
            self.runner(steps).run()
        self.assertEqual(self.outbox.counts(), {})
        # the lease was released: a second attempt is not "already-running"
        with self.assertRaises(InvalidInputError):
            self.runner(steps).run()

    def test_a_payload_factory_that_raises_is_a_typed_error_with_its_cause(self) -> None:
        from longrun import PayloadError

        steps = [Step("s0", "write", {}), Step("s1", "write", lambda results: {"x": 1 / 0})]
        with self.assertRaises(PayloadError) as caught:
            self.runner(steps).run()
        self.assertIsInstance(caught.exception.__cause__, ZeroDivisionError)
        self.assertEqual(self.outbox.counts(), {"task-1/s0": 1})
        state = self.store.load("task-1").state
        self.assertNotIn("s1", state.effects, "nothing was planned for the failing step")
        with self.assertRaises(PayloadError):  # the lease was released: not already-running
            self.runner(steps).run()


class ObserveBeforeApplyTests(RunnerCase):
    """The first apply of every run is preceded by an observe; ``Step.observe_first`` observes a
    step before its first apply ever (effects an earlier system or task id may have made)."""

    def test_each_run_observes_once_before_its_first_apply_and_no_more(self) -> None:
        outcome = self.runner().run()
        self.assertEqual(outcome.status, Status.DONE)
        # s0: once before its apply (the run's first), once after; s1 and s2 only after theirs.
        self.assertEqual(dict(self.outbox.observe_calls), {"task-1/s0": 2, "task-1/s1": 1, "task-1/s2": 1})

    def test_a_state_restored_from_an_older_copy_verifies_its_applied_effects_instead_of_repeating_them(self) -> None:
        steps = [Step(f"s{i}", "write", {"n": i}) for i in range(5)]
        task_dir = self.store.task_dir("task-1")
        copies = []

        def keep_a_copy(request: EffectRequest) -> None:
            if request.step_id == "s1":  # the state as it was while s1 was in flight: s0 verified
                copies.append(self.path("copy"))
                copy_keeping_links(task_dir, copies[0])

        adapter = RecordingAdapter()
        adapter.on_apply = keep_a_copy
        self.assertEqual(self.runner(steps, adapter=adapter).run().status, Status.DONE)
        self.assertEqual(adapter.applied, [f"task-1/s{i}" for i in range(5)])
        # Someone puts the older copy back, lease and all: nothing on disk says it was rolled back.
        shutil.rmtree(task_dir)
        copy_keeping_links(copies[0], task_dir)
        self.clock.advance(60.0)  # the copied lease was live when it was taken
        outcome = self.runner(steps, adapter=adapter, store=SpyStore(self.path("store"))).run()
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(adapter.applied, [f"task-1/s{i}" for i in range(5)], "an effect was applied twice")
        self.assertEqual(set(outcome.results), {f"s{i}" for i in range(5)})

    def test_a_new_task_id_with_observe_first_and_the_old_keys_repeats_nothing(self) -> None:
        old = [Step(f"s{i}", "write", {"n": i}) for i in range(3)]
        self.assertEqual(self.runner(old).run().status, Status.DONE)
        # The plan changes (a step inserted before s1): the old task id refuses it, and says how to move.
        changed = [old[0], Step("inserted", "write", {"n": 9}), old[1], old[2]]
        refused = self.runner(changed).run()
        self.assertEqual(refused.status, Status.PLAN_MISMATCH)
        self.assertIn("observe_first=True", refused.next_action)
        self.assertIn("key='task-1/<step id>'", refused.next_action)
        moved = [
            Step(step.step_id, step.action, step.payload, key=f"task-1/{step.step_id}", observe_first=True) for step in changed
        ]
        outcome = self.runner(moved, contract=RunContract("task-2", "write three lines")).run()
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(self.outbox.counts(), {"task-1/s0": 1, "task-1/s1": 1, "task-1/s2": 1, "task-1/inserted": 1})
        self.assertEqual(self.outbox.calls["task-1/inserted"], 1)

    def test_observe_first_stops_unsafe_when_the_target_cannot_say_and_applies_once_it_can(self) -> None:
        adapter = RecordingAdapter()
        adapter.observe_as["task-1/s1"] = Observation.unknown("target unreachable")
        steps = [Step("s0", "write", {"n": 0}), Step("s1", "write", {"n": 1}, observe_first=True)]
        outcome = self.runner(steps, adapter=adapter).run()
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertEqual(adapter.applied, ["task-1/s0"])
        self.assertTrue(any("observe_first" in item.detail for item in outcome.unknowns))
        state = self.store.load("task-1").state
        assert state is not None
        self.assertEqual(state.effects["s1"].state.value, "uncertain")
        del adapter.observe_as["task-1/s1"]
        self.assertEqual(self.runner(steps, adapter=adapter).run().status, Status.DONE)
        self.assertEqual(adapter.applied, ["task-1/s0", "task-1/s1"])

    def test_without_observe_first_an_unknown_before_the_first_apply_does_not_stop_the_run(self) -> None:
        adapter = RecordingAdapter()
        adapter.observe_as["task-1/s0"] = Observation.unknown("target unreachable")
        outcome = self.runner([Step("s0", "write", {"n": 0})], adapter=adapter).run()
        # The ledger says s0 never started, and the target cannot be read: it is applied (then
        # cannot be verified, which stops the run as before this observation existed).
        self.assertEqual(adapter.applied, ["task-1/s0"])
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE)


class RetryTests(RunnerCase):
    def test_transient_failures_back_off_exponentially_and_then_succeed(self) -> None:
        outbox = OutboxAdapter(self.path("outbox.jsonl"), fail_transient=2)
        outcome = self.runner([Step("s0", "write", {})], adapter=outbox).run()
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(self.clock.sleeps, [1.0, 2.0])
        self.assertEqual(outbox.calls["task-1/s0"], 3)
        self.assertEqual(outbox.counts()["task-1/s0"], 1)

    def test_attempts_are_bounded_and_exhaustion_is_terminal(self) -> None:
        outbox = OutboxAdapter(self.path("outbox.jsonl"), fail_transient=100)
        limits = Limits(max_attempts=3)
        outcome = self.runner([Step("s0", "write", {})], adapter=outbox, limits=limits).run()
        self.assertEqual(outcome.status, Status.LIMITS_EXHAUSTED)
        self.assertEqual(outbox.calls["task-1/s0"], 3)
        again = self.runner([Step("s0", "write", {})], adapter=OutboxAdapter(self.path("outbox.jsonl")), limits=limits).run()
        self.assertEqual(again.status, Status.LIMITS_EXHAUSTED)
        self.assertEqual(outbox.counts(), {})

    def test_backoff_longer_than_the_runner_may_block_returns_retry_scheduled_with_time_persisted(self) -> None:
        outbox = OutboxAdapter(self.path("outbox.jsonl"), fail_transient=1)
        limits = Limits(max_block_s=0.5)
        outcome = self.runner([Step("s0", "write", {})], adapter=outbox, limits=limits).run()
        self.assertEqual(outcome.status, Status.RETRY_SCHEDULED)
        state = self.store.load("task-1").state
        assert state is not None
        self.assertEqual(state.effects["s0"].not_before, self.clock.now() + 1.0)
        # too early: nothing is applied
        again = self.runner([Step("s0", "write", {})], adapter=outbox, limits=limits).run()
        self.assertEqual(again.status, Status.RETRY_SCHEDULED)
        self.assertEqual(outbox.calls["task-1/s0"], 1)
        self.clock.advance(1.0)
        self.assertEqual(self.runner([Step("s0", "write", {})], adapter=outbox, limits=limits).run().status, Status.DONE)

    def test_permanent_error_stops_blocked_and_is_terminal(self) -> None:
        outbox = OutboxAdapter(self.path("outbox.jsonl"), fail_permanent=True)
        self.assertEqual(self.runner(adapter=outbox).run().status, Status.BLOCKED)
        self.assertEqual(outbox.calls["task-1/s0"], 1)
        self.assertEqual(self.runner().run().status, Status.BLOCKED)
        self.assertEqual(self.outbox.counts(), {})

    def test_unknown_outcome_is_not_retried_unless_the_target_deduplicates(self) -> None:
        outbox = OutboxAdapter(self.path("outbox.jsonl"), raise_after_apply={"s0"}, unobservable={"s0"})
        with self.assertLogs("longrun", "WARNING") as logged:
            outcome = self.runner(adapter=outbox).run()
        self.assertIn("apply of task-1/s0 raised ConnectionError", "\n".join(logged.output))
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertEqual(outbox.calls["task-1/s0"], 1)
        self.assertTrue(any("task-1/s0" in item.detail for item in outcome.unknowns))
        state = self.store.load("task-1").state
        assert state is not None
        self.assertEqual(state.effects["s0"].state.value, "uncertain")
        dedup = OutboxAdapter(self.path("outbox.jsonl"), deduplicates=True, unknown_observations=1)
        outcome = self.runner(adapter=dedup).run()
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(dedup.calls["task-1/s0"], 1, "sent again because the target deduplicates")
        self.assertEqual(dedup.counts()["task-1/s0"], 1, "the deduplicating target kept one line")

    def test_an_acknowledged_effect_that_observation_calls_absent_is_not_applied_again(self) -> None:
        adapter = RecordingAdapter()
        adapter.observe_as["task-1/s1"] = Observation.absent("the read replica has not seen it")
        outcome = self.runner(adapter=adapter).run()
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertEqual(adapter.applied, ["task-1/s0", "task-1/s1"])
        cause = "RecordingAdapter.observe answered absent after a successful apply of step 's1'"
        self.assertTrue(any(cause in item.detail for item in outcome.unknowns))
        self.assertIn(cause, outcome.next_action)
        outcome = self.runner(adapter=adapter).run()
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE, "still contradictory: still not re-applied")
        self.assertEqual(adapter.applied.count("task-1/s1"), 1)

    def test_an_observe_that_keeps_answering_absent_after_a_successful_apply_is_named_when_attempts_run_out(self) -> None:
        # A step with nothing to observe, written as an adapter whose observe always says absent: a
        # deduplicating target may be sent again, until the attempts are spent. The stop names why.
        class Renderer(RecordingAdapter):
            deduplicates = True

        adapter = Renderer()
        adapter.observe_as["task-1/s0"] = Observation.absent("renders are not kept")
        outcome = self.runner([Step("s0", "write", {})], adapter=adapter, limits=Limits(max_attempts=3)).run()
        self.assertEqual(outcome.status, Status.LIMITS_EXHAUSTED)
        self.assertEqual(adapter.applied, ["task-1/s0"] * 3)
        self.assertIn("used all 3 attempts (last error: Renderer.observe answered absent after a successful apply of "
                      "step 's0' (apply returned a receipt: recorded; observe said: renders are not kept); an observe "
                      "must confirm an apply that succeeded)", outcome.next_action)
        self.assertNotIn("None", outcome.next_action)

    def test_a_deduplicating_target_that_never_becomes_observable_is_not_declared_done(self) -> None:
        dedup = OutboxAdapter(self.path("outbox.jsonl"), deduplicates=True, unobservable={"s0"})
        outcome = self.runner(adapter=dedup).run()
        self.assertEqual(outcome.status, Status.LIMITS_EXHAUSTED)
        self.assertNotIn("s0", outcome.results)
        self.assertEqual(dedup.counts()["task-1/s0"], 1)

    def test_retry_jitter_is_bounded_and_delay_capped(self) -> None:
        policy = RetryPolicy(base_delay_s=1.0, max_delay_s=10.0, jitter=0.5)
        for attempt in range(1, 40):
            delay = policy.delay("k", attempt)
            ceiling = min(10.0, 2.0 ** (attempt - 1))
            self.assertGreaterEqual(delay, ceiling * 0.5)
            self.assertLessEqual(delay, ceiling)


class BudgetTests(RunnerCase):
    def test_cost_budget_stops_before_the_next_effect(self) -> None:
        adapter = RecordingAdapter()
        outcome = self.runner(adapter=adapter, limits=Limits(max_cost=2.0)).run()
        self.assertEqual(outcome.status, Status.LIMITS_EXHAUSTED)
        self.assertEqual(adapter.applied, ["task-1/s0", "task-1/s1"])

    def test_an_invalid_receipt_cost_is_an_adapter_bug_observed_and_not_charged(self) -> None:
        for index, bad in enumerate((float("nan"), -5.0, float("inf"), "3", True, 10**400)):
            with self.subTest(cost=type(bad).__name__ + str(bad)[:8]):
                with self.assertRaises(InvalidInputError):
                    Receipt(cost=bad)  # refused where it is built, inside the adapter's call
                adapter = RecordingAdapter()
                # The effect takes place, then the adapter builds a receipt the state could not hold.
                adapter.apply = lambda request, bad=bad: (adapter.applied.append(request.key), Receipt(cost=bad))[1]  # type: ignore[method-assign]
                task = RunContract(f"cost-{index}", "g")
                with self.assertLogs("longrun", "WARNING") as logs:
                    outcome = self.runner([Step("s0", "write", {})], contract=task, adapter=adapter).run()
                self.assertIn("raised InvalidInputError", "\n".join(logs.output))
                self.assertEqual(outcome.status, Status.DONE)  # the outcome was unknown, so it was observed
                self.assertEqual(adapter.applied, [f"{task.task_id}/s0"])
                self.assertTrue(any("InvalidInputError" in item.detail and "cost" in item.detail for item in outcome.observations))
                state = self.store.load(task.task_id).state
                self.assertEqual(state.budget.cost_spent, 0.0)
                self.assertIn("Receipt: field 'cost'", state.effects["s0"].last_error)

    def test_costs_that_would_add_up_to_infinity_are_recorded_not_charged(self) -> None:
        adapter = RecordingAdapter()
        adapter.apply = lambda request: (adapter.applied.append(request.key), Receipt(cost=1e308))[1]  # type: ignore[method-assign]
        with self.assertLogs("longrun", "WARNING") as logged:
            outcome = self.runner([Step("s0", "write", {}), Step("s1", "write", {})], adapter=adapter).run()
        self.assertIn("invalid cost", "\n".join(logged.output))
        self.assertEqual(outcome.status, Status.DONE)
        self.assertTrue(any("invalid cost" in item.detail for item in outcome.unknowns))
        self.assertEqual(self.store.load("task-1").state.budget.cost_spent, 1e308)  # the first is charged, the sum is not

    def test_step_budget_counts_across_runs(self) -> None:
        adapter = RecordingAdapter()
        steps = [Step(f"s{i}", "write", {"n": i}, approval=(i == 1)) for i in range(3)]
        self.assertEqual(self.runner(steps, adapter=adapter, limits=Limits(max_steps=2)).run().status, Status.AWAITING_APPROVAL)
        state = self.store.load("task-1").state
        assert state is not None
        self.assertEqual(state.budget.attempts_total, 1)
        self.store.write_approval(self.approve(state, "s1"))
        outcome = self.runner(steps, adapter=adapter, limits=Limits(max_steps=2)).run()
        self.assertEqual(outcome.status, Status.LIMITS_EXHAUSTED)
        self.assertEqual(adapter.applied, ["task-1/s0", "task-1/s1"])

    def test_negative_or_malformed_limits_are_typed_errors(self) -> None:
        for bad in (dict(max_attempts=0), dict(max_steps=-1), dict(max_cost=-0.5), dict(max_elapsed_s=float("nan")), dict(max_attempts=True)):
            with self.subTest(bad=bad), self.assertRaises(InvalidInputError):
                Limits(**bad)
        for bad in (dict(base_delay_s=-1), dict(jitter=1.5), dict(multiplier=0.5)):
            with self.subTest(bad=bad), self.assertRaises(InvalidInputError):
                RetryPolicy(**bad)


class WorkedTimeTests(RunnerCase):
    """Elapsed and no-progress budgets charge the time the run was worked on, measured on the
    monotonic clock; time between runs (waiting for a person, a timer, anything) is never charged."""

    steps = [Step("s0", "write", {"n": 0}), Step("s1", "write", {"n": 1}, approval=True), Step("s2", "write", {"n": 2})]

    def working(self, seconds: float) -> RecordingAdapter:
        """An adapter whose every apply takes ``seconds`` of (fake) time."""
        adapter = RecordingAdapter()
        adapter.on_apply = lambda request: self.clock.advance(seconds)
        return adapter

    def pause_then_approve(self, adapter, limits: Limits, *, wall_step: float = 0.0, time_passing: float = 0.0) -> None:
        """Run to the approval gate; then the wall clock is stepped, time passes, and a person approves."""
        self.assertEqual(self.runner(self.steps, adapter=adapter, limits=limits).run().status, Status.AWAITING_APPROVAL)
        self.clock.step(wall_step)
        self.clock.advance(time_passing)
        state = self.store.load("task-1").state
        assert state is not None
        self.store.write_approval(self.approve(state, "s1"))

    def test_a_wall_clock_stepped_two_hours_forward_between_runs_does_not_exhaust_the_elapsed_budget(self) -> None:
        limits = Limits(max_elapsed_s=3600)
        self.pause_then_approve(RecordingAdapter(), limits, wall_step=7200)
        outcome = self.runner(self.steps, adapter=RecordingAdapter(), limits=limits).run()
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertTrue(any("7200.0s of wall time since the last commit" in item.detail for item in outcome.observations))

    def test_hours_that_really_pass_between_runs_are_not_charged(self) -> None:
        limits = Limits(max_elapsed_s=3600, max_no_progress_s=600)
        self.pause_then_approve(RecordingAdapter(), limits, time_passing=7200)
        self.assertEqual(self.runner(self.steps, adapter=RecordingAdapter(), limits=limits).run().status, Status.DONE)
        final = self.store.load("task-1").state
        assert final is not None
        self.assertEqual(final.budget.worked_s, 0.0)

    def test_an_approval_given_an_hour_later_does_not_exhaust_the_no_progress_budget(self) -> None:
        limits = Limits(max_no_progress_s=600)
        self.pause_then_approve(RecordingAdapter(), limits, time_passing=3600)
        outcome = self.runner(self.steps, adapter=RecordingAdapter(), limits=limits).run()
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)

    def test_long_worked_time_still_exhausts_the_elapsed_budget_across_runs(self) -> None:
        adapter = self.working(2000)
        limits = Limits(max_elapsed_s=3600)
        self.pause_then_approve(adapter, limits, time_passing=36_000)  # a night waiting for the approval: not charged
        outcome = self.runner(self.steps, adapter=adapter, limits=limits).run()
        self.assertEqual(outcome.status, Status.LIMITS_EXHAUSTED)
        self.assertIn("elapsed budget spent: 4000.0s of work", outcome.next_action)
        self.assertEqual(adapter.applied, ["task-1/s0", "task-1/s1"])
        final = self.store.load("task-1").state
        assert final is not None
        self.assertEqual(final.budget.worked_s, 4000.0)

    def test_worked_time_without_a_verified_effect_exhausts_the_no_progress_budget(self) -> None:
        attempts = []

        def slow_failure(request: EffectRequest) -> None:
            attempts.append(request.attempt)
            self.clock.advance(1000)
            raise TransientError("the target timed out")

        adapter = RecordingAdapter()
        adapter.on_apply = slow_failure
        limits = Limits(max_attempts=10, max_no_progress_s=2500, max_block_s=100)
        outcome = self.runner([Step("s0", "write", {})], adapter=adapter, limits=limits).run()
        self.assertEqual(outcome.status, Status.LIMITS_EXHAUSTED)
        self.assertIn("no progress for 3000.0s of work", outcome.next_action)
        self.assertEqual(attempts, [1, 2, 3])

    def test_waiting_for_a_backoff_is_not_worked_time(self) -> None:
        outbox = OutboxAdapter(self.path("outbox.jsonl"), fail_transient=3)
        limits = Limits(max_attempts=10, max_elapsed_s=5.0, max_no_progress_s=5.0, max_block_s=100)
        outcome = self.runner([Step("s0", "write", {})], adapter=outbox, limits=limits).run()
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(self.clock.sleeps, [1.0, 2.0, 4.0])

    def test_runs_that_only_find_they_must_wait_charge_nothing(self) -> None:
        class SlowLoads(SpyStore):
            """Every load takes a second of the runner's time."""

            def load(inner, task_id, *, lease=None):  # type: ignore[no-untyped-def]
                self.clock.advance(1.0)
                return super().load(task_id, lease=lease)

        self.store = SlowLoads(self.path("slow"))
        limits = Limits(max_no_progress_s=50)
        self.assertEqual(self.runner(self.steps, limits=limits).run().status, Status.AWAITING_APPROVAL)
        worked = self.store.load("task-1").state.budget.worked_s
        self.assertEqual(worked, 1.0, "the first run planned and applied: its load was part of that work")
        for _ in range(100):  # a trigger polls the waiting task every minute for 100 minutes
            self.assertEqual(self.runner(self.steps, limits=limits).run().status, Status.AWAITING_APPROVAL)
            self.clock.advance(60)
        state = self.store.load("task-1").state
        self.assertEqual(state.budget.worked_s, worked, "a hundred polls, a second each, charged nothing")
        self.store.write_approval(self.approve(state, "s1"))
        self.assertEqual(self.runner(self.steps, limits=limits).run().status, Status.DONE)

    def test_quick_work_is_charged_in_steps_and_in_full_when_the_run_stops(self) -> None:
        outcome = self.runner(adapter=self.working(0.03)).run()  # below WORK_CHARGE_STEP_S each
        self.assertEqual(outcome.status, Status.DONE)
        charged = [snapshot["budget"]["worked_s"] for snapshot in self.store.commits]
        self.assertEqual(charged[:-1], [0.0] * (len(charged) - 1), "commits of quick effects leave the counters alone")
        self.assertAlmostEqual(charged[-1], 0.09, places=5)  # the fake clock reads ~1.7e9: float ulps

    def test_a_wall_clock_stepped_during_an_apply_is_not_worked_time(self) -> None:
        adapter = RecordingAdapter()
        adapter.on_apply = lambda request: self.clock.step(7200)
        outcome = self.runner(adapter=adapter, limits=Limits(max_elapsed_s=3600, max_no_progress_s=3600)).run()
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)


class BackoffClockTests(RunnerCase):
    """A scheduled backoff is a duration: a wall clock stepped between runs neither lengthens it nor,
    on the same boot, shortens it."""

    one = [Step("s0", "write", {})]

    def runner(self, steps=None, **options):  # type: ignore[override]
        # One owner throughout: a lease released and then judged by a wall clock stepped back
        # would look live to another owner, which is the lease's concern, not the backoff's.
        return super().runner(steps, owner="one-runner", **options)

    def schedule(self, name: str = "outbox") -> OutboxAdapter:
        """Attempt 1 fails transiently; its 1 s backoff is longer than the runner may block."""
        outbox = OutboxAdapter(self.path(f"{name}.jsonl"), fail_transient=1)
        outcome = self.runner(self.one, adapter=outbox, limits=Limits(max_block_s=0.5)).run()
        self.assertEqual(outcome.status, Status.RETRY_SCHEDULED)
        return outbox

    def test_a_wall_clock_stepped_an_hour_back_does_not_lengthen_a_scheduled_backoff(self) -> None:
        for timeline in (None, "boot:test"):
            with self.subTest(timeline=timeline):
                self.clock = FakeClock(timeline=timeline)
                self.store = SpyStore(self.path(f"store-{timeline}"))
                outbox = self.schedule(f"outbox-{timeline}")  # a target per store: each run observes it first
                self.clock.step(-3600)
                again = self.runner(self.one, adapter=outbox, limits=Limits(max_block_s=0.5)).run()
                self.assertEqual(again.status, Status.RETRY_SCHEDULED)
                self.assertIn(datetime_of(self.clock.now() + 1.0), again.next_action)
                self.clock.advance(1.0)
                self.assertEqual(self.runner(self.one, adapter=outbox, limits=Limits(max_block_s=0.5)).run().status, Status.DONE)
                self.assertEqual(outbox.calls["task-1/s0"], 2)

    def test_a_runner_that_may_block_sleeps_the_backoff_not_the_step(self) -> None:
        outbox = self.schedule()
        self.clock.step(-3600)
        outcome = self.runner(self.one, adapter=outbox).run()
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(self.clock.sleeps, [1.0])
        self.assertTrue(any("stepped back" in item.detail for item in outcome.observations))

    def test_on_the_same_boot_a_wall_clock_stepped_forward_does_not_end_a_backoff_early(self) -> None:
        self.clock = FakeClock(timeline="boot:test")
        outbox = self.schedule()
        self.clock.step(7200)
        again = self.runner(self.one, adapter=outbox, limits=Limits(max_block_s=0.5)).run()
        self.assertEqual(again.status, Status.RETRY_SCHEDULED)
        self.assertEqual(outbox.calls["task-1/s0"], 1)
        self.clock.advance(1.0)
        self.assertEqual(self.runner(self.one, adapter=outbox, limits=Limits(max_block_s=0.5)).run().status, Status.DONE)

    def test_without_a_shared_timeline_a_wall_clock_stepped_forward_may_end_a_backoff_early(self) -> None:
        outbox = self.schedule()  # not guaranteed (see the README): only the wall clock can tell
        self.clock.step(7200)
        self.assertEqual(self.runner(self.one, adapter=outbox, limits=Limits(max_block_s=0.5)).run().status, Status.DONE)

    def test_a_backoff_recorded_without_its_duration_waits_no_longer_than_the_policy_delay(self) -> None:
        self.schedule()
        lease = self.store.acquire_lease("task-1", "editor", 30.0, self.clock.now())
        state = self.store.load("task-1", lease=lease).state
        assert state is not None
        record = state.effects["s0"]
        state.effects["s0"] = record.with_changes(not_before=self.clock.now() + 3600, backoff=None)  # as an older version wrote it
        self.store.commit(lease, state, None)
        self.store.release_lease(lease, self.clock.now())
        outbox = OutboxAdapter(self.path("outbox.jsonl"))
        again = self.runner(self.one, adapter=outbox, limits=Limits(max_block_s=0.5)).run()
        self.assertEqual(again.status, Status.RETRY_SCHEDULED)
        self.assertIn(datetime_of(self.clock.now() + 1.0), again.next_action)
        self.clock.advance(1.0)
        self.assertEqual(self.runner(self.one, adapter=outbox, limits=Limits(max_block_s=0.5)).run().status, Status.DONE)


def datetime_of(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat(timespec="milliseconds")


class CancellationTests(RunnerCase):
    def test_cancellation_is_read_before_every_new_effect(self) -> None:
        adapter = RecordingAdapter()

        def cancel_after_first(request: EffectRequest) -> None:
            if request.step_id == "s0":
                self.store.write_cancellation(Cancellation("task-1", self.clock.now(), "ops", "wrong week"))

        adapter.on_apply = cancel_after_first
        outcome = self.runner(adapter=adapter).run()
        self.assertEqual(outcome.status, Status.CANCELLED)
        self.assertEqual(adapter.applied, ["task-1/s0"])
        self.assertIn("s0", outcome.results, "the in-flight effect was still verified")
        self.assertEqual(self.runner(adapter=adapter).run().status, Status.CANCELLED)
        self.assertEqual(adapter.applied, ["task-1/s0"])

    def test_damaged_or_foreign_cancellation_starts_nothing_but_does_not_end_the_run(self) -> None:
        steps = [Step("s0", "write", {}, approval=True)]
        self.runner(steps).run()
        path = os.path.join(self.store.task_dir("task-1"), "control", "cancel.json")
        for body, word in (("{not json", "damaged"), ('{"task_id": "task-1"}', "malformed"), (json.dumps(Cancellation("other", 0.0, "x", "y").to_json()), "names task")):
            with self.subTest(word=word):
                with open(path, "w") as handle:
                    handle.write(body)
                outcome = self.runner(steps).run()
                self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE)
                self.assertTrue(any(word in item.detail for item in outcome.unknowns), outcome.unknowns)
                self.assertEqual(self.outbox.counts(), {})
        os.unlink(path)
        self.assertEqual(self.runner(steps).run().status, Status.AWAITING_APPROVAL, "the run was not ended")


class ApprovalTests(RunnerCase):
    steps = [Step("s0", "write", {"n": 0}), Step("s1", "write", {"n": 1}, approval=True)]

    def pending(self) -> RunState:
        self.assertEqual(self.runner(self.steps).run().status, Status.AWAITING_APPROVAL)
        state = self.store.load("task-1").state
        assert state is not None
        return state

    def test_exact_unexpired_approval_authorizes_that_one_effect_once(self) -> None:
        state = self.pending()
        request = state.approval_requests["s1"]
        self.assertEqual(request.payload_digest, state.effects["s1"].payload_digest)
        self.assertEqual(request.plan_digest, self.runner(self.steps).plan_digest)
        self.store.write_approval(self.approve(state, "s1"))
        outcome = self.runner(self.steps).run()
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(self.outbox.counts()["task-1/s1"], 1)
        final = self.store.load("task-1").state
        assert final is not None
        self.assertEqual(final.consumed_approvals, ["ap-s1"])
        self.assertEqual(final.effects["s1"].approval_id, "ap-s1")

    def test_mismatched_or_expired_approvals_do_not_authorize(self) -> None:
        state = self.pending()
        cases = {
            "plan": dict(plan_digest="sha256:" + "0" * 64),
            "step": dict(step_id="s0"),
            "payload": dict(payload_digest="sha256:" + "1" * 64),
            "action": dict(action="delete"),
            "task": dict(task_id="task-2"),
            "expired": dict(expires_at=self.clock.now() - 1),
        }
        for name, change in cases.items():
            with self.subTest(name=name):
                approval = self.approve(state, "s1", approval_id=f"ap-{name}")
                fields = approval.to_json()
                fields.update(change)
                path = os.path.join(self.store.task_dir("task-1"), "control", "approvals", f"ap-{name}.json")
                with open(path, "w") as handle:
                    json.dump(fields, handle)
                outcome = self.runner(self.steps).run()
                self.assertEqual(outcome.status, Status.AWAITING_APPROVAL)
                self.assertEqual(self.outbox.counts()["task-1/s1"], 0)

    def test_broader_than_requested_approval_is_refused_unsafe(self) -> None:
        state = self.pending()
        approval = self.approve(state, "s1", approval_id="ap-wide").to_json()
        approval["payload_digest"] = "*"
        path = os.path.join(self.store.task_dir("task-1"), "control", "approvals", "ap-wide.json")
        with open(path, "w") as handle:
            json.dump(approval, handle)
        outcome = self.runner(self.steps).run()
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertTrue(any("broader" in item.detail for item in outcome.unknowns))
        self.assertEqual(self.outbox.counts()["task-1/s1"], 0)

    def test_a_consumed_approval_is_not_replayed_for_another_task_run(self) -> None:
        state = self.pending()
        approval = self.approve(state, "s1")
        self.store.write_approval(approval)
        self.assertEqual(self.runner(self.steps).run().status, Status.DONE)
        # Same plan under another task id: the old approval names another task and plan.
        other = RunContract("task-2", "write three lines")
        other_store_dir = self.store.task_dir("task-2")
        outcome = self.runner(self.steps, contract=other).run()
        self.assertEqual(outcome.status, Status.AWAITING_APPROVAL)
        os.makedirs(os.path.join(other_store_dir, "control", "approvals"), exist_ok=True)
        self.store.write_approval(Approval.from_json({**approval.to_json(), "task_id": "task-2"}))
        self.assertEqual(self.runner(self.steps, contract=other).run().status, Status.AWAITING_APPROVAL)
        self.assertEqual(self.outbox.counts()["task-2/s1"], 0)

    def test_an_expired_request_is_renewed_with_a_new_expiry(self) -> None:
        state = self.pending()
        old = state.approval_requests["s1"]
        self.clock.advance(Limits().approval_ttl_s + 1)
        self.runner(self.steps).run()
        renewed = self.store.load("task-1").state
        assert renewed is not None
        self.assertGreater(renewed.approval_requests["s1"].expires_at, old.expires_at)


class LeaseTests(RunnerCase):
    def test_a_second_live_owner_gets_already_running_and_applies_nothing(self) -> None:
        adapter = RecordingAdapter()
        results = {}

        def contend(request: EffectRequest) -> None:
            if request.step_id == "s1":
                results["second"] = self.runner(adapter=adapter, owner="second").run()

        adapter.on_apply = contend
        first = self.runner(adapter=adapter, owner="first").run()
        self.assertEqual(first.status, Status.DONE)
        self.assertEqual(results["second"].status, Status.ALREADY_RUNNING)
        self.assertEqual(adapter.applied, ["task-1/s0", "task-1/s1", "task-1/s2"])

    def test_epoch_increases_on_every_acquisition_and_reaches_the_adapter(self) -> None:
        epochs = []
        adapter = RecordingAdapter()
        adapter.on_apply = lambda request: epochs.append(request.epoch)
        steps = [Step("s0", "write", {}), Step("s1", "write", {}, approval=True)]
        first = self.runner(steps, adapter=adapter).run()
        second = self.runner(steps, adapter=adapter).run()
        self.assertEqual((first.epoch, second.epoch), (1, 2))
        self.assertEqual(epochs, [1])

    def test_expired_lease_is_taken_over_with_a_newer_epoch_and_the_stale_writer_is_fenced(self) -> None:
        stale = self.store.acquire_lease("task-1", "stale-owner", 30.0, self.clock.now())
        self.clock.advance(31)
        outcome = self.runner().run()
        self.assertEqual(outcome.status, Status.DONE)
        self.assertGreater(outcome.epoch, stale.epoch)
        state = self.store.load("task-1").state
        assert state is not None
        from longrun import FencedError

        path = os.path.join(self.store.task_dir("task-1"), "state.json")
        with open(path, "rb") as handle:
            before = handle.read()
        with self.assertRaises(FencedError):
            self.store.commit(stale, state)
        with open(path, "rb") as handle:
            self.assertEqual(handle.read(), before)

    def test_a_damaged_lease_record_stops_state_unrecoverable_until_repaired_above_every_recorded_epoch(self) -> None:
        steps = [Step("s0", "write", {"n": 0}), Step("s1", "write", {"n": 1}, approval=True)]
        damages = {
            "truncated": lambda data: data[: len(data) // 2],
            "bit-flipped": lambda data: data[:20] + bytes([data[20] ^ 0x04]) + data[21:],
        }
        for name, damage in damages.items():
            with self.subTest(damage=name):
                contract = RunContract(f"task-{name}", "write two lines, the second approved")
                first = self.runner(steps, contract=contract).run()
                self.assertEqual(first.status, Status.AWAITING_APPROVAL)
                path = os.path.join(self.store.task_dir(contract.task_id), "lease.json")
                with open(path, "rb") as handle:
                    data = handle.read()
                with open(path, "wb") as handle:
                    handle.write(damage(data))
                for _ in range(2):  # every later run, not only the first
                    outcome = self.runner(steps, contract=contract).run()
                    self.assertEqual(outcome.status, Status.STATE_UNRECOVERABLE)
                    self.assertIn(f"longrun repair {self.store.root} {contract.task_id} --lease", outcome.next_action, "names the store")
                    self.assertTrue(any("lease" in item.detail for item in outcome.observations))
                applied = {key: count for key, count in self.outbox.counts().items() if key.startswith(contract.task_id + "/")}
                self.assertEqual(applied, {f"{contract.task_id}/s0": 1}, "nothing applied while the lease was damaged")
                recorded = self.store.load(contract.task_id).state
                assert recorded is not None
                highest = max([recorded.lease_epoch] + [record.epoch for record in recorded.effects.values()])
                with self.assertLogs("longrun", "WARNING") as logged:  # the move is logged
                    repair = JsonFileStore(self.path("store")).repair_lease(contract.task_id, self.clock.now())
                self.assertIn(repair.quarantined, "\n".join(logged.output))
                self.assertTrue(os.path.exists(os.path.join(self.store.task_dir(contract.task_id), repair.quarantined)))
                with open(os.path.join(self.store.task_dir(contract.task_id), repair.quarantined), "rb") as handle:
                    self.assertEqual(handle.read(), damage(data), "the damaged record is kept as it was")
                again = self.runner(steps, contract=contract).run()
                self.assertEqual(again.status, Status.AWAITING_APPROVAL, again.next_action)
                self.assertGreater(again.epoch, highest)

    def test_failed_renewal_during_a_long_apply_stops_lease_lost_before_any_write(self) -> None:
        adapter = RecordingAdapter()
        taken = threading.Event()
        state_path = os.path.join(self.store.task_dir("task-1"), "state.json")
        snapshot = {}

        def steal(request: EffectRequest) -> None:
            if request.step_id != "s1":
                return
            with open(state_path, "rb") as handle:
                snapshot["before"] = handle.read()
            # A contender whose clock is past the expiry takes the task over.
            self.store.acquire_lease("task-1", "contender", 30.0, self.clock.now() + 1000)
            for _ in range(200):
                if runner.engine._io.keeper is not None and runner.engine._io.keeper.failure is not None:
                    taken.set()
                    return
                threading.Event().wait(0.01)

        adapter.on_apply = steal
        runner = Runner(
            RunContract("task-1", "g"),
            [Step(f"s{i}", "write", {}) for i in range(3)],
            store=self.store,
            adapters={"write": adapter},
            clock=self.clock,
            lease_ttl_s=0.09,  # the background keeper renews every 30 ms of real time
        )
        with self.assertLogs("longrun", "WARNING") as logged:
            outcome = runner.run()
        self.assertIn("lease renewal for task-1 failed", "\n".join(logged.output))
        self.assertTrue(taken.is_set(), "the background renewal noticed the takeover")
        self.assertEqual(outcome.status, Status.LEASE_LOST)
        with open(state_path, "rb") as handle:
            self.assertEqual(handle.read(), snapshot["before"], "no write after the lease was lost")
        self.assertEqual(adapter.applied, ["task-1/s0", "task-1/s1"])

    def test_a_renewal_that_fails_on_io_stops_lease_lost_even_though_no_one_took_over(self) -> None:
        from longrun import StorageError

        class FlakyRenewals(SpyStore):
            broken = threading.Event()

            def renew_lease(self, lease, ttl_s, now, *, monotonic=None):
                if self.broken.is_set():
                    raise StorageError("disk unavailable")
                return super().renew_lease(lease, ttl_s, now, monotonic=monotonic)

        store = FlakyRenewals(self.path("flaky"))
        adapter = RecordingAdapter()
        runner_box = {}

        def break_renewals(request: EffectRequest) -> None:
            if request.step_id != "s1":
                return
            store.broken.set()
            for _ in range(200):
                if runner_box["runner"].engine._io.keeper.failure is not None:
                    return
                threading.Event().wait(0.01)

        adapter.on_apply = break_renewals
        runner = Runner(
            RunContract("task-1", "g"),
            [Step(f"s{i}", "write", {}) for i in range(3)],
            store=store,
            adapters={"write": adapter},
            clock=self.clock,
            lease_ttl_s=0.09,
        )
        runner_box["runner"] = runner
        commits_before_apply = []
        adapter.on_apply = lambda request: (commits_before_apply.append(len(store.commits)), break_renewals(request))
        with self.assertLogs("longrun", "WARNING") as logged:
            outcome = runner.run()
        self.assertIn("disk unavailable", "\n".join(logged.output))
        self.assertEqual(outcome.status, Status.LEASE_LOST)
        self.assertEqual(len(store.commits), commits_before_apply[-1], "no write after the renewal failed")
        self.assertEqual(adapter.applied, ["task-1/s0", "task-1/s1"])


class AdapterRecordTests(RunnerCase):
    """What an adapter hands back is checked where it is built, so nothing unreadable is ever written."""

    def assert_consistent(self, task_id: str, status: Status, code: int) -> None:
        """What a fresh store reads is what the run said; ``verify`` agrees; nothing was quarantined."""
        from longrun.cli._verify import verify

        loaded = JsonFileStore(self.path("store")).load(task_id)
        self.assertEqual(loaded.source, "primary", "the state was read from its primary copy, not a backup")
        self.assertIs(loaded.state.status, status)
        report, exit_code = verify(JsonFileStore(self.path("store")), task_id, self.clock.now())
        self.assertEqual(int(exit_code), code, report)
        self.assertEqual(os.listdir(self.path("store", task_id, "quarantine")), [], "nothing was damaged")

    def adapter_returning(self, make_receipt) -> RecordingAdapter:
        adapter = RecordingAdapter()

        def apply(request: EffectRequest) -> Receipt:
            adapter.applied.append(request.key)  # the effect takes place...
            return make_receipt()  # ...then the adapter builds a receipt the state could not hold

        adapter.apply = apply  # type: ignore[method-assign]
        return adapter

    def test_a_receipt_the_loader_would_refuse_is_an_adapter_bug_observed_not_written(self) -> None:
        receipts = {
            "evidence-int": lambda: Receipt(evidence=123),
            "evidence-bytes": lambda: Receipt(evidence=b"queued 7"),
            "cost-huge": lambda: Receipt(cost=10**400),
            "result-object": lambda: Receipt(result={"handle": object()}),
            "result-surrogate": lambda: Receipt(result={"file": "caf\udce9.txt"}),
        }
        for task_id, make in receipts.items():
            with self.subTest(receipt=task_id):
                adapter = self.adapter_returning(make)
                runner = self.runner([Step("s0", "write", {}), Step("s1", "write", {})], contract=RunContract(task_id, "g"), adapter=adapter)
                with self.assertLogs("longrun", "WARNING") as logs:
                    outcome = runner.run()
                self.assertIn("raised InvalidInputError", "\n".join(logs.output))
                self.assertIs(outcome.status, Status.DONE)  # the outcome was unknown, so both were observed: applied
                self.assertEqual(adapter.applied, [f"{task_id}/s0", f"{task_id}/s1"], "each effect applied once")
                self.assertTrue(any("InvalidInputError: Receipt" in item.detail for item in outcome.observations))
                self.assert_consistent(task_id, Status.DONE, 0)
                events = len(adapter.events)
                self.assertIs(runner.run().status, Status.DONE)
                self.assertEqual(len(adapter.events), events, "a later run recovers nothing: it reads done")

    def test_an_observation_the_loader_would_refuse_is_unknown_and_stops_the_run_consistently(self) -> None:
        adapter = RecordingAdapter()
        adapter.observe = lambda request: Observation.applied({"http": 200})  # type: ignore[method-assign, arg-type]
        with self.assertLogs("longrun", "WARNING") as logs:
            outcome = self.runner([Step("s0", "write", {})], adapter=adapter).run()
        self.assertIn("observe of task-1/s0 failed: InvalidInputError", "\n".join(logs.output))
        self.assertIs(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertTrue(any("Observation: field 'evidence' must be a string, got dict" in item.detail for item in outcome.unknowns))
        self.assert_consistent("task-1", Status.UNSAFE_TO_CONTINUE, 1)

    def test_a_payload_the_loader_would_refuse_is_refused_naming_the_step_and_the_path(self) -> None:
        listing = ["notes.txt", "caf\udce9.txt"]  # what os.listdir gives for a name that is not UTF-8
        with self.assertRaises(InvalidInputError) as caught:
            Step("files", "write", {"files": listing})
        self.assertIn("step 'files' payload.files[1] holds a lone surrogate", str(caught.exception))
        factories = {
            "step 'late' payload.files[1] holds a lone surrogate": lambda results: {"files": listing},
            "step 'late' payload.total is an integer of more than 4300 digits": lambda results: {"total": 10**5000},
            "step 'late' payload.blob is not JSON-able: bytes": lambda results: {"blob": b"\x00"},
        }
        for index, (message, factory) in enumerate(factories.items()):
            with self.subTest(message=message):
                task = RunContract(f"payload-{index}", "g")
                adapter = RecordingAdapter()
                runner = self.runner([Step("first", "write", {"n": 1}), Step("late", "write", factory)], contract=task, adapter=adapter)
                with self.assertRaises(InvalidInputError) as caught:
                    runner.run()
                self.assertIn(message, str(caught.exception))
                self.assertEqual(adapter.applied, [f"{task.task_id}/first"], "nothing of the refused step was applied")
                state = JsonFileStore(self.path("store")).load(task.task_id).state
                self.assertNotIn("late", state.effects, "nothing of the refused step was committed")
                self.assertEqual(JsonFileStore(self.path("store")).load(task.task_id).source, "primary")

    def test_error_text_from_a_target_with_a_lone_surrogate_is_kept_as_its_escape(self) -> None:
        adapter = RecordingAdapter()

        def apply(request: EffectRequest) -> Receipt:
            raise OSError(2, "No such file or directory", "/srv/caf\udce9.txt")

        adapter.apply = apply  # type: ignore[method-assign]
        with self.assertLogs("longrun", "WARNING"):
            outcome = self.runner([Step("s0", "write", {})], adapter=adapter, limits=Limits(max_attempts=1)).run()
        self.assertIs(outcome.status, Status.LIMITS_EXHAUSTED)
        record = JsonFileStore(self.path("store")).load("task-1").state.effects["s0"]
        self.assertIn("caf\\udce9.txt", record.last_error)


if __name__ == "__main__":
    unittest.main()
