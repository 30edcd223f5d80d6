"""Fault groups 3, 4, 5 and 10 on the stores: power loss (a model replayed from a recorded trace,
with a mutation check that removes each flush of the write protocol in turn), truncation and bit
flips at every byte, I/O errors at every I/O call, and a finished task's blobs and records damaged
(its recorded calls and answers must never change).

Group 4 damages every 11th byte by default (``fault_case.small_scale``), every 5th under
``LONGRUN_TEST_SCALE=full``; ``LONGRUN_FAULTS_FULL=1`` runs the full counts (every byte, every mode)."""

from __future__ import annotations

import errno
import os
import unittest

from helpers import support
from helpers.fault_case import FaultGroupCase
from longrun import JsonFileStore, StorageError
from longrun.testing import faults


class StorageFaultTests(FaultGroupCase):
    def test_group3_power_loss_gives_the_before_or_the_after_state_and_every_flush_is_needed(self) -> None:
        result = self.run_group(3)
        sites = [note for note in result.notes if note.startswith("without the flush at")]
        self.assertGreaterEqual(len(sites), 4, "journal fdatasync, temp-file fsync, directory fsyncs: each one matters")

    def test_group4_truncation_and_bit_flips_are_refused_or_recovered_never_reset(self) -> None:
        self.run_group(4)

    def test_group5_io_errors_at_every_call_leave_the_before_or_the_after_state(self) -> None:
        self.run_group(5)

    def test_group10_damaged_blobs_and_lost_records_never_change_a_recorded_answer(self) -> None:
        result = self.run_group(10)
        [ends] = [note for note in result.notes if note.startswith("cases by how they ended")]
        for end in ("json done", "json plan done", "json stopped", "sqlite stopped"):
            self.assertIn(f"'{end}'", ends, "each way a case may end was reached")


class FaultyIOTests(support.TempDirTest):
    def test_the_nth_call_fails_with_the_chosen_errno_and_the_store_says_so_with_the_cause(self) -> None:
        store = JsonFileStore(self.path("root"), io=faults.FaultyIO(1, errno.ENOSPC), create=True)
        with self.assertRaises(StorageError) as caught:
            store.acquire_lease("t", "me", 30.0, 0.0)
        self.assertIsInstance(caught.exception.__cause__, OSError)
        self.assertEqual(caught.exception.__cause__.errno, errno.ENOSPC)
        self.assertEqual(store.io.injected, 1)
        self.assertFalse(os.path.exists(self.path("root")))


if __name__ == "__main__":
    unittest.main()
