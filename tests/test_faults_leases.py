"""Fault groups 6, 7 and 8: racing runner processes killed and frozen past their lease, every
mutating operation under a stale epoch, and wall-clock faults on the lease holder and on the
contender; the parts that drive a task, also with the task as a durable function.
Group 6 races one seed by default (``fault_case.small_scale``), three under ``LONGRUN_TEST_SCALE=full``;
``LONGRUN_FAULTS_FULL=1`` runs the full counts."""

from __future__ import annotations

import unittest

from helpers.fault_case import FaultGroupCase


class LeaseFaultTests(FaultGroupCase):
    def test_group6_racing_runners_killed_and_frozen_keep_epochs_revisions_and_effects_straight(self) -> None:
        self.run_group(6)

    def test_group7_every_mutating_operation_with_a_stale_epoch_is_fenced_and_changes_nothing(self) -> None:
        self.run_group(7)

    def test_group8_clock_faults_neither_hand_over_a_live_lease_nor_let_a_stale_write_land(self) -> None:
        result = self.run_group(8)
        self.assertTrue(any("taken over 10.00 s after the last renewal" in note for note in result.notes), result.notes)


class DurableLeaseFaultTests(FaultGroupCase):
    def test_group6_durable_racing_processes_run_each_effect_once_and_each_call_once_per_lost_lease(self) -> None:
        result = self.run_group(6, "durable")
        self.assertTrue(any("call runs for 50 calls" in note for note in result.notes), result.notes)

    def test_group7_durable_a_process_frozen_in_a_call_past_its_lease_is_fenced_when_it_thaws(self) -> None:
        self.run_group(7, "durable")

    def test_group8_durable_a_function_whose_clock_is_an_hour_ahead_waits_out_the_lease(self) -> None:
        self.run_group(8, "durable")


if __name__ == "__main__":
    unittest.main()
