"""Fault groups 6, 7 and 8: racing runner processes killed and frozen past their lease, every
mutating operation under a stale epoch, and wall-clock faults on the lease holder and on the
contender. ``LONGRUN_FAULTS_FULL=1`` runs the full counts."""

from __future__ import annotations

import unittest

import support  # noqa: F401
from test_faults_processes import FaultGroupCase


class LeaseFaultTests(FaultGroupCase):
    def test_group6_racing_runners_killed_and_frozen_keep_epochs_revisions_and_effects_straight(self) -> None:
        self.run_group(6)

    def test_group7_every_mutating_operation_with_a_stale_epoch_is_fenced_and_changes_nothing(self) -> None:
        self.run_group(7)

    def test_group8_clock_faults_neither_hand_over_a_live_lease_nor_let_a_stale_write_land(self) -> None:
        result = self.run_group(8)
        self.assertTrue(any("taken over 10.00 s after the last renewal" in note for note in result.notes), result.notes)


if __name__ == "__main__":
    unittest.main()
