"""Budget counters and backoffs: worked time, not wall time, is charged; a stepped clock moves nothing."""

from __future__ import annotations

import unittest

import helpers  # noqa: F401  (puts src on sys.path)
from longrun import Backoff, BudgetCounters, CorruptStateError, Limits

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
        backoff = Backoff.begin(10.0, now=1000.0, monotonic=(BOOT, 50.0))
        self.assertEqual(backoff.until, 1010.0)
        for wall in (1000.0 + 7200, 1000.0 - 3600, 1000.0):
            with self.subTest(wall=wall):
                self.assertEqual(backoff.remaining(wall, (BOOT, 54.0)), 6.0)
                self.assertTrue(backoff.measured_on((BOOT, 54.0)))
        self.assertEqual(backoff.remaining(0.0, (BOOT, 70.0)), 0.0)

    def test_elsewhere_by_wall_clock_never_longer_than_its_duration(self) -> None:
        backoff = Backoff.begin(10.0, now=1000.0, monotonic=(BOOT, 50.0))
        for reading in (None, ("boot:other", 1.0)):
            with self.subTest(reading=reading):
                self.assertFalse(backoff.measured_on(reading))
                self.assertEqual(backoff.remaining(1004.0, reading), 6.0)
                self.assertEqual(backoff.remaining(1000.0 - 3600, reading), 10.0, "a clock stepped back does not lengthen it")
                self.assertEqual(backoff.remaining(1000.0 + 7200, reading), 0.0, "not guaranteed: a clock stepped forward ends it early")

    def test_resumed_anchors_the_rest_on_the_resuming_clocks(self) -> None:
        backoff = Backoff.begin(10.0, now=1000.0)
        rest = backoff.resumed(1000.0 - 3600, (BOOT, 7.0))
        self.assertEqual((rest.duration_s, rest.scheduled_at, rest.monotonic_clock, rest.monotonic_at), (10.0, 1000.0 - 3600, BOOT, 7.0))
        self.assertEqual(rest.remaining(1000.0 + 9999, (BOOT, 9.0)), 8.0)

    def test_json_round_trip_and_validation(self) -> None:
        for backoff in (Backoff.begin(2.5, now=10.0), Backoff.begin(2.5, now=10.0, monotonic=(BOOT, 3.0))):
            self.assertEqual(Backoff.from_json(backoff.to_json()), backoff)
        good = Backoff.begin(2.5, now=10.0, monotonic=(BOOT, 3.0)).to_json()
        for change in ({"duration_s": -1.0}, {"monotonic_at": None}, {"monotonic_clock": None}, {"scheduled_at": None}, {"extra": 1}):
            with self.subTest(change=change), self.assertRaises(CorruptStateError):
                Backoff.from_json({**good, **change})


if __name__ == "__main__":
    unittest.main()
