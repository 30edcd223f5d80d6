"""Budget counters and backoffs: worked time, not wall time, is charged; a stepped clock moves nothing."""

from __future__ import annotations

import unittest

import helpers  # noqa: F401  (puts src on sys.path)
from longrun import Backoff, BudgetCounters, CorruptStateError, InvalidInputError, Limits, RetryPolicy
from longrun.budget import IMPLAUSIBLE_GAP_S, describe_wall_gap
from longrun.lease import MonotonicReading

BOOT = "boot:this"


class WorkedTimeTests(unittest.TestCase):
    def test_elapsed_compares_worked_time_whatever_the_wall_clock_says(self) -> None:
        limits = Limits(max_elapsed_s=3600)
        counters = BudgetCounters(created_at=0.0, first_started_at=0.0).worked(3599.0)
        self.assertIsNone(counters.exhausted(limits))
        reason = counters.exhausted(limits, pending_s=1.0)
        assert reason is not None
        self.assertIn("3600.0s of work", reason)
        self.assertEqual(counters.worked(1.0).exhausted(limits), reason)

    def test_no_progress_counts_worked_time_since_the_last_progress(self) -> None:
        limits = Limits(max_no_progress_s=600)
        counters = BudgetCounters(created_at=0.0).worked(1000.0)
        self.assertIsNotNone(counters.exhausted(limits))
        progressed = counters.progressed(5000.0, pending_s=50.0)
        self.assertEqual((progressed.worked_s, progressed.worked_at_progress_s, progressed.last_progress_at), (1050.0, 1050.0, 5000.0))
        self.assertIsNone(progressed.exhausted(limits))
        self.assertIsNone(progressed.worked(599.0).exhausted(limits))
        reason = progressed.worked(599.0).exhausted(limits, pending_s=1.0)
        assert reason is not None
        self.assertIn("no progress for 600.0s of work", reason)

    def test_the_other_counters_keep_the_work_recorded(self) -> None:
        counters = BudgetCounters(created_at=0.0).worked(10.0).started(1.0).spent(2.5).progressed(3.0)
        self.assertEqual((counters.worked_s, counters.worked_at_progress_s, counters.attempts_total, counters.cost_spent), (10.0, 10.0, 1, 2.5))
        self.assertIs(counters.worked(0.0), counters)

    def test_counters_round_trip_and_old_counters_load_with_no_work_recorded(self) -> None:
        counters = BudgetCounters(created_at=1.0, first_started_at=2.0, attempts_total=3, cost_spent=0.5, last_progress_at=4.0)
        counters = counters.worked(7.0).progressed(5.0).worked(2.0)
        self.assertEqual(BudgetCounters.from_json(counters.to_json()), counters)
        old = {"created_at": 1.0, "first_started_at": 2.0, "attempts_total": 3, "cost_spent": 0.5, "last_progress_at": 4.0}
        loaded = BudgetCounters.from_json(old)
        self.assertEqual((loaded.worked_s, loaded.worked_at_progress_s, loaded.last_progress_at), (0.0, 0.0, 4.0))
        self.assertIsNone(loaded.exhausted(Limits(max_elapsed_s=1.0, max_no_progress_s=1.0)))

    def test_impossible_worked_times_are_corrupt_state(self) -> None:
        good = BudgetCounters(created_at=1.0).worked(5.0).to_json()
        for change in ({"worked_s": -1.0}, {"worked_at_progress_s": -1.0}, {"worked_at_progress_s": 6.0}, {"worked_s": "5"}, {"idle_s": 1.0}):
            with self.subTest(change=change), self.assertRaises(CorruptStateError):
                BudgetCounters.from_json({**good, **change})


class BackoffTests(unittest.TestCase):
    def test_on_its_own_timeline_a_backoff_ignores_wall_clock_steps(self) -> None:
        backoff = Backoff.begin(10.0, now=1000.0, monotonic=MonotonicReading(BOOT, 50.0))
        self.assertEqual(backoff.until, 1010.0)
        for wall in (1000.0 + 7200, 1000.0 - 3600, 1000.0):
            with self.subTest(wall=wall):
                self.assertEqual(backoff.remaining(wall, MonotonicReading(BOOT, 54.0)), 6.0)
                self.assertTrue(backoff.measured_on(MonotonicReading(BOOT, 54.0)))
        self.assertEqual(backoff.remaining(0.0, MonotonicReading(BOOT, 70.0)), 0.0)

    def test_elsewhere_by_wall_clock_never_longer_than_its_duration(self) -> None:
        backoff = Backoff.begin(10.0, now=1000.0, monotonic=MonotonicReading(BOOT, 50.0))
        for reading in (None, MonotonicReading("boot:other", 1.0)):
            with self.subTest(reading=reading):
                self.assertFalse(backoff.measured_on(reading))
                self.assertEqual(backoff.remaining(1004.0, reading), 6.0)
                self.assertEqual(backoff.remaining(1000.0 - 3600, reading), 10.0, "a clock stepped back does not lengthen it")
                self.assertEqual(backoff.remaining(1000.0 + 7200, reading), 0.0, "not guaranteed: a clock stepped forward ends it early")

    def test_resumed_anchors_the_rest_on_the_resuming_clocks(self) -> None:
        backoff = Backoff.begin(10.0, now=1000.0)
        rest = backoff.resumed(1000.0 - 3600, MonotonicReading(BOOT, 7.0))
        self.assertEqual((rest.duration_s, rest.scheduled_at, rest.monotonic_clock, rest.monotonic_at), (10.0, 1000.0 - 3600, BOOT, 7.0))
        self.assertEqual(rest.remaining(1000.0 + 9999, MonotonicReading(BOOT, 9.0)), 8.0)

    def test_json_round_trip_and_validation(self) -> None:
        for backoff in (Backoff.begin(2.5, now=10.0), Backoff.begin(2.5, now=10.0, monotonic=MonotonicReading(BOOT, 3.0))):
            self.assertEqual(Backoff.from_json(backoff.to_json()), backoff)
        good = Backoff.begin(2.5, now=10.0, monotonic=MonotonicReading(BOOT, 3.0)).to_json()
        for change in ({"duration_s": -1.0}, {"monotonic_at": None}, {"monotonic_clock": None}, {"scheduled_at": None}, {"extra": 1}):
            with self.subTest(change=change), self.assertRaises(CorruptStateError):
                Backoff.from_json({**good, **change})


class RetryPolicyTests(unittest.TestCase):
    def test_the_delay_doubles_from_the_base_up_to_the_cap_without_jitter(self) -> None:
        policy = RetryPolicy(base_delay_s=0.5, max_delay_s=5.0, multiplier=2.0, jitter=0.0)
        self.assertEqual([policy.delay("t/a", attempt) for attempt in range(1, 7)], [0.5, 1.0, 2.0, 4.0, 5.0, 5.0])
        self.assertEqual(policy.delay("t/a", 0), 0.5, "before the first attempt: the base")
        # 3 * 2 = 6 passes the cap (5) by less than the base: capped all the same.
        self.assertEqual([RetryPolicy(base_delay_s=3.0, max_delay_s=5.0, jitter=0.0).delay("t/a", n) for n in (1, 2, 3)], [3.0, 5.0, 5.0])

    def test_jitter_is_a_fixed_function_of_key_and_attempt_that_spreads_keys_apart(self) -> None:
        policy = RetryPolicy(base_delay_s=10.0, max_delay_s=10.0, jitter=0.5)
        delays = {key: policy.delay(key, 3) for key in (f"t/step-{n}" for n in range(20))}
        self.assertEqual(delays, {key: RetryPolicy(base_delay_s=10.0, max_delay_s=10.0, jitter=0.5).delay(key, 3) for key in delays},
                         "the same attempt of the same effect always waits the same time")  # fmt: skip
        self.assertTrue(all(5.0 <= delay <= 10.0 for delay in delays.values()), delays)
        self.assertGreater(len(set(delays.values())), 15, "different effects retry at different moments")
        self.assertNotEqual(policy.delay("t/a", 3), policy.delay("t/a", 4))

    def test_a_huge_attempt_number_gives_the_cap_and_a_zero_base_gives_no_wait(self) -> None:
        policy = RetryPolicy(base_delay_s=1.0, max_delay_s=60.0, multiplier=10.0, jitter=0.0)
        self.assertEqual(policy.delay("t/a", 10**6), 60.0)
        self.assertEqual(RetryPolicy(base_delay_s=0.0, jitter=0.5).delay("t/a", 5), 0.0)

    def test_impossible_policies_are_refused(self) -> None:
        for bad in (dict(max_delay_s=float("inf")), dict(jitter=-0.1), dict(multiplier=True), dict(deadline_s="5")):
            with self.subTest(bad=bad), self.assertRaises(InvalidInputError):
                RetryPolicy(**bad)  # type: ignore[arg-type]


class LimitTests(unittest.TestCase):
    def test_the_attempt_limit_counts_the_first_attempt(self) -> None:
        limits = Limits(max_attempts=1)
        reason = limits.attempts_exhausted("t/a", 1, "transient: busy")
        assert reason is not None
        self.assertIn("all 1 attempts", reason)
        self.assertIn("transient: busy", reason)
        self.assertIsNone(Limits(max_attempts=2).attempts_exhausted("t/a", 1, None))

    def test_unlimited_is_none_and_a_limit_is_reached_when_met(self) -> None:
        counters = BudgetCounters(created_at=0.0, attempts_total=10**6, cost_spent=1e12).worked(1e9)
        self.assertIsNone(counters.exhausted(Limits()))
        self.assertIsNotNone(BudgetCounters(created_at=0.0, attempts_total=2).exhausted(Limits(max_steps=2)))
        self.assertIsNone(BudgetCounters(created_at=0.0, attempts_total=1).exhausted(Limits(max_steps=2)))
        self.assertIsNotNone(BudgetCounters(created_at=0.0, cost_spent=2.0).exhausted(Limits(max_cost=2.0)))
        self.assertIsNone(BudgetCounters(created_at=0.0, cost_spent=1.99).exhausted(Limits(max_cost=2.0)))

    def test_the_first_exhausted_limit_is_the_one_reported(self) -> None:
        counters = BudgetCounters(created_at=0.0, attempts_total=5, cost_spent=9.0).worked(100.0)
        order = [("max_steps", 5, "step budget spent"), ("max_cost", 9.0, "cost budget spent"),
                 ("max_elapsed_s", 100.0, "elapsed budget spent"), ("max_no_progress_s", 100.0, "no progress for")]  # fmt: skip
        for index, (_, _, expected) in enumerate(order):
            limits = Limits(**{name: value for name, value, _ in order[index:]})  # type: ignore[arg-type]
            with self.subTest(limits=limits):
                self.assertTrue((counters.exhausted(limits) or "").startswith(expected), counters.exhausted(limits))


class CounterTests(unittest.TestCase):
    def test_starting_and_spending_count_without_touching_the_rest(self) -> None:
        counters = BudgetCounters(created_at=5.0).started(10.0).started(20.0).spent(1.5).spent(0.25)
        self.assertEqual((counters.created_at, counters.first_started_at, counters.attempts_total, counters.cost_spent), (5.0, 10.0, 2, 1.75))
        self.assertEqual((counters.worked_s, counters.last_progress_at), (0.0, 0.0))
        self.assertIs(counters.worked(-1.0), counters, "negative work is no work")


class WallGapTests(unittest.TestCase):
    def test_the_gap_between_runs_is_described_never_charged(self) -> None:
        self.assertTrue(describe_wall_gap(100.0, 160.0).startswith("60.0s of wall time since the last commit"))
        self.assertIn("stepped back", describe_wall_gap(100.0, 40.0))
        self.assertIn("implausible", describe_wall_gap(0.0, IMPLAUSIBLE_GAP_S + 1))
        self.assertNotIn("implausible", describe_wall_gap(0.0, IMPLAUSIBLE_GAP_S))
        for gap in (describe_wall_gap(100.0, 40.0), describe_wall_gap(0.0, 1e10), describe_wall_gap(0.0, 1.0)):
            self.assertTrue(gap.endswith("not charged to any budget"), gap)


if __name__ == "__main__":
    unittest.main()
