"""Fault groups 1, 2 and 9: runner processes that SIGKILL themselves at named crash points, are
SIGKILLed from outside at random moments, and are killed during every attempt of a bounded retry;
each under both faces, a declared plan (``Runner``) and the same task as a durable function.

Each test runs one group of ``longrun.testing.faults`` (groups 1 and 2 below the quick counts by
default, every point still, see ``fault_case.small_scale``; ``LONGRUN_TEST_SCALE=full`` runs the quick counts, ``LONGRUN_FAULTS_FULL=1``
the full ones) and asserts its figures: faults were injected, and no effect was applied twice,
no verified effect was lost, no state was silently reset, nothing else broke (under the durable
face also: no call ran again once its value was committed, the function's result was recorded).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import unittest

from helpers import support
from helpers.fault_case import FaultGroupCase, small_scale
from longrun import JsonFileStore
from longrun.functions import FUNCTION_STEP
from longrun.testing import faults, read_outbox
from longrun.testing.faults import children
from longrun.testing.faults.points import read_trace


def mid_run_kills(result: faults.GroupResult) -> int:
    """How many of group 2's kills landed after the killed process's first commit (from its note)."""
    note = next(note for note in result.notes if "kills landed after" in note)
    return int(note.split(" ", 1)[0])


class KillPointTests(FaultGroupCase):
    def test_group1_every_named_point_killed_then_recovered_without_duplicates_or_loss(self) -> None:
        result = self.run_group(1)
        self.assertGreaterEqual(len(faults.points_for("runner")), 16)
        points = len(faults.points_for("runner"))
        if small_scale():
            self.assertGreaterEqual(result.faults, points, "every point, at its first or its last occurrence")
        else:
            self.assertGreaterEqual(result.faults, 2 * points - 4, "every point at its first and last occurrence")

    def test_group2_random_outside_kills_then_resumed_until_done(self) -> None:
        result = self.run_group(2)
        self.assertGreaterEqual(result.faults, 200 if faults.full_scale() else 7 if small_scale() else 15)
        self.assertGreaterEqual(mid_run_kills(result), result.faults // 2, "kills that land before a process starts test nothing")

    def test_group9_killed_during_every_attempt_never_gets_a_fourth(self) -> None:
        self.run_group(9)


class DurableKillPointTests(FaultGroupCase):
    """The same groups with the task as a durable function: a recorded call before each effect."""

    def test_group1_durable_every_named_point_including_the_call_points_killed_then_recovered(self) -> None:
        result = self.run_group(1, "durable")
        points = faults.points_for("durable")
        self.assertTrue(faults.CALL_POINTS <= set(points))
        self.assertIn(f"{len(points)} points", result.notes[0])
        self.assertGreaterEqual(result.faults, len(points), "every point, the call points among them, at least once")

    def test_group2_durable_random_outside_kills_then_resumed_until_done(self) -> None:
        result = self.run_group(2, "durable")
        self.assertGreaterEqual(result.faults, 200 if faults.full_scale() else 4 if small_scale() else 8)
        self.assertGreaterEqual(mid_run_kills(result), result.faults // 2, "kills that land before a process starts test nothing")

    def test_group9_durable_killed_during_every_attempt_of_a_call_or_an_effect_never_gets_a_fourth(self) -> None:
        result = self.run_group(9, "durable")
        self.assertGreaterEqual(result.faults, 12, "an effect schedule of 6 kills and two call schedules of 3")


class SeamTests(support.TempDirTest):
    def test_crash_points_cost_nothing_unless_armed(self) -> None:
        from longrun import _crashpoints

        self.assertFalse(_crashpoints.ARMED, "the test process was not started with LONGRUN_CRASH_AT or LONGRUN_CRASH_TRACE")

    def test_check_revisions_finds_a_gap_and_a_step_back(self) -> None:
        committed = [("recovery.loaded", 1, "0"), ("state.committed", 1, "1"), ("state.committed", 2, "2")]
        self.assertEqual(faults.check_revisions([committed, [("recovery.loaded", 1, "2"), ("state.committed", 1, "3")]]), [])
        self.assertTrue(faults.check_revisions([committed, [("recovery.loaded", 1, "1")]]), "went backwards")
        self.assertTrue(faults.check_revisions([committed, [("recovery.loaded", 1, "2"), ("state.committed", 1, "4")]]), "skipped")

    def test_the_call_points_are_the_durable_face_s_alone_and_only_faced_groups_take_a_face(self) -> None:
        self.assertEqual(set(faults.points_for("durable")) - set(faults.points_for("runner")), faults.CALL_POINTS)
        self.assertEqual(faults.points_for("durable"), faults.POINTS)
        with self.assertRaises(ValueError):
            faults.run_group(3, full=False, face="durable")

    def test_the_call_checker_counts_a_call_run_after_its_value_was_committed(self) -> None:
        log = self.path("calls")
        with open(log, "w") as handle:
            handle.write("call-000 1\ncall-001 1\ncall-001 2\ncall-000 3\ncall-0")  # the last line cut by a kill
        counts = faults.call_counts(log)
        self.assertEqual(counts, {"call-000": 2, "call-001": 2})
        clean = faults.GroupResult(1, "")
        faults.check_calls(clean, counts, None, 2, "here", settled={"call-000": 2}, interruptions=2)
        self.assertEqual((clean.duplicates, clean.failures), (0, []), "each extra run follows an interruption")
        again = faults.GroupResult(1, "")
        faults.check_calls(again, counts, None, 2, "here", settled={"call-000": 1}, interruptions=2)
        self.assertEqual(again.duplicates, 1, again.failures)
        over = faults.GroupResult(1, "")
        faults.check_calls(over, counts, None, 2, "here", settled={}, interruptions=1)
        self.assertEqual(over.duplicates, 1, over.failures)

    def test_a_child_forked_from_the_server_is_armed_killed_and_resumed_like_a_started_one(self) -> None:
        """Groups 1 and 9 fork their children from a server (``fork_servers``): a forked child must
        crash where a started one does, trace the same points, and be resumed the same way."""
        seen = {}
        for forked in (False, True):
            with children.fork_servers(1) if forked else contextlib.nullcontext():
                work = children.Workdir(self.tmp, f"forked-{forked}")
                killed, _, _ = children.spawn(work, "--steps", "2", crash_at="effect.applied:1")
                code, outcome, err = children.spawn(work, "--steps", "2")
            assert outcome is not None, err
            trace = [name for name, _, _ in read_trace(work.trace(0))]
            seen[forked] = (killed, trace[-1], code, outcome["status"], faults.call_counts(work.calls), read_outbox(work.outbox))
        self.assertEqual(seen[True][:4], (-signal.SIGKILL, "effect.applied", 0, "done"))
        self.assertEqual(len(seen[True][5]), 2, "each of the two effects applied once")
        self.assertEqual(seen[True], seen[False])

    def test_a_durable_child_records_the_function_by_its_module_name_and_its_result(self) -> None:
        root, outbox = self.path("store"), self.path("outbox.jsonl")
        completed = support.run_python(["-m", "longrun.testing.faults", "child", root, outbox, "--face", "durable", "--steps", "2"])
        self.assertEqual(completed.returncode, 0, completed.stderr)
        self.assertEqual(json.loads(completed.stdout.splitlines()[-1])["result"], faults.function_result(2))
        state = JsonFileStore(root).load("fault-task").state
        assert state is not None
        record = state.effects[FUNCTION_STEP]
        self.assertEqual(record.payload["function"], "longrun.testing.faults.task:fault_function", "not __main__: the parent pre-approves by it")
        self.assertEqual(record.result, faults.function_result(2))
        self.assertEqual(faults.call_counts(faults.call_log_of(outbox)), {"call-000": 1, "call-001": 1})
        self.assertTrue(os.path.exists(outbox))

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
