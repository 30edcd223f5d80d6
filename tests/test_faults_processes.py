"""Fault groups 1, 2 and 9: runner processes that SIGKILL themselves at named crash points, are
SIGKILLed from outside at random moments, and are killed during every attempt of a bounded retry.

Each test runs one group of ``longrun.testing.faults`` (the quick counts; ``LONGRUN_FAULTS_FULL=1``
runs the full ones) and asserts its figures: faults were injected, and no effect was applied twice,
no verified effect was lost, no state was silently reset, nothing else broke.
"""

from __future__ import annotations

import unittest

import support  # noqa: F401 - puts src on sys.path
from longrun.testing import faults


class FaultGroupCase(unittest.TestCase):
    def run_group(self, number: int) -> faults.GroupResult:
        result = faults.run_group(number, full=faults.full_scale())
        details = "\n".join(result.failures + result.notes)
        self.assertGreater(result.cases, 0, details)
        self.assertGreater(result.faults, 0, details)
        self.assertEqual((result.duplicates, result.lost, result.resets), (0, 0, 0), details)
        self.assertEqual(result.failures, [], details)
        return result


def mid_run_kills(result: faults.GroupResult) -> int:
    """How many of group 2's kills landed after the killed process's first commit (from its note)."""
    note = next(note for note in result.notes if "kills landed after" in note)
    return int(note.split(" ", 1)[0])


class KillPointTests(FaultGroupCase):
    def test_group1_every_named_point_killed_then_recovered_without_duplicates_or_loss(self) -> None:
        result = self.run_group(1)
        self.assertGreaterEqual(len(faults.POINTS), 16)
        self.assertGreaterEqual(result.faults, 2 * len(faults.POINTS) - 4, "every point at its first and last occurrence")

    def test_group2_random_outside_kills_then_resumed_until_done(self) -> None:
        result = self.run_group(2)
        self.assertGreaterEqual(result.faults, 200 if faults.full_scale() else 15)
        self.assertGreaterEqual(mid_run_kills(result), result.faults // 2, "kills that land before a process starts test nothing")

    def test_group9_killed_during_every_attempt_never_gets_a_fourth(self) -> None:
        self.run_group(9)


class SeamTests(unittest.TestCase):
    def test_crash_points_cost_nothing_unless_armed(self) -> None:
        from longrun import _crashpoints

        self.assertFalse(_crashpoints.ARMED, "the test process was not started with LONGRUN_CRASH_AT or LONGRUN_CRASH_TRACE")

    def test_check_revisions_finds_a_gap_and_a_step_back(self) -> None:
        committed = [("recovery.loaded", 1, "0"), ("state.committed", 1, "1"), ("state.committed", 2, "2")]
        self.assertEqual(faults.check_revisions([committed, [("recovery.loaded", 1, "2"), ("state.committed", 1, "3")]]), [])
        self.assertTrue(faults.check_revisions([committed, [("recovery.loaded", 1, "1")]]), "went backwards")
        self.assertTrue(faults.check_revisions([committed, [("recovery.loaded", 1, "2"), ("state.committed", 1, "4")]]), "skipped")

    def test_the_race_checker_refuses_a_reissued_epoch_and_a_stale_write(self) -> None:
        lease = lambda epoch, owner, pid=1: {"event": "lease", "epoch": epoch, "owner": owner, "pid": pid}  # noqa: E731
        commit = lambda rev, epoch, pid=1: {"event": "commit", "rev": rev, "epoch": epoch, "pid": pid}  # noqa: E731
        good = [lease(1, "a"), commit(1, 1), lease(2, "b", 2), commit(2, 2, 2)]
        self.assertEqual(faults.check_race_log(good, set()), ([], 2))
        self.assertTrue(faults.check_race_log([lease(1, "a"), lease(1, "b", 2)], set())[0], "an epoch issued twice")
        self.assertTrue(faults.check_race_log([lease(1, "a"), lease(2, "b", 2), commit(1, 1)], set())[0], "a write under an old epoch")
        # A killed process's last line may announce a write that never landed; the next one reissues it.
        self.assertEqual(faults.check_race_log([lease(1, "a"), commit(1, 1), commit(2, 1), lease(2, "b", 2), commit(2, 2, 2)], {1})[0], [])


if __name__ == "__main__":
    unittest.main()
