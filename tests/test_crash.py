"""Crashes and races with real processes: SIGKILL, SIGSTOP, two live runners, damaged state on disk."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import unittest

from helpers import scale, support
from helpers.cli_process import run_script
from longrun import JsonFileStore, SqliteStore, Status
from longrun.testing import copy_keeping_links, read_outbox
from longrun.testing.faults import BLOB_POINTS


class ChildRunnerCase(support.TempDirTest):

    task = "crash-task"
    sqlite = False
    """Whether the children run on a SQLite store (ROOT is then its database file)."""

    def setUp(self) -> None:
        super().setUp()
        self.root = self.path("store.db" if self.sqlite else "store")
        self.outbox = self.path("outbox.jsonl")
        self.children: list[subprocess.Popen[str]] = []
        self.later = 0.0
        self.addCleanup(self._reap)

    def _reap(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
            child.communicate()

    def spawn(self, *options: str, later: float | None = None, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """Start a child runner. Each child's clock runs 100 s past the previous one's (unless
        ``later`` is given), so a crashed child's 30 s lease has expired for the next, without a wait."""
        if later is None:
            self.later += 100.0
            later = self.later
        child = subprocess.Popen(
            [
                sys.executable, support.CHILD, self.root, self.outbox, "--task", self.task, "--later", str(later),
                *(("--sqlite",) if self.sqlite else ()), *options,
            ],  # fmt: skip
            env={**support.child_env(), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.children.append(child)
        return child

    def run_child(
        self, *options: str, timeout: float = 60, later: float | None = None, env: dict[str, str] | None = None
    ) -> tuple[int, dict | None]:
        """Run a child runner to its end (or its SIGKILL): a process of its own, forked from the
        fork server (``cli_process.run_script``), which has imported longrun once for all of them."""
        if later is None:
            self.later += 100.0
            later = self.later
        arguments = [self.root, self.outbox, "--task", self.task, "--later", str(later), *(("--sqlite",) if self.sqlite else ()), *options]
        child = run_script(support.CHILD, arguments, env={**support.child_env(), **(env or {})}, cwd=None, timeout=timeout)
        out = child.stdout
        outcome = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
        return child.returncode, outcome

    def wait_for(self, path: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                self.fail(f"{path} never appeared")
            time.sleep(0.01)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for line in read_outbox(self.outbox):
            counts[line["key"]] = counts.get(line["key"], 0) + 1
        return counts

    def assert_exactly_once(self, steps: int) -> None:
        expected = {f"{self.task}/step-{i:03d}": 1 for i in range(steps)}
        self.assertEqual(self.counts(), expected)

    def open_store(self):
        return SqliteStore(self.root, create=True) if self.sqlite else JsonFileStore(self.root, create=True)

    def state(self):
        store = self.open_store()
        try:
            return store.load(self.task).state
        finally:
            getattr(store, "close", lambda: None)()


class InterruptionTests(ChildRunnerCase):
    def test_sigkill_after_apply_before_checkpoint_then_resume_applies_each_effect_once(self) -> None:
        code, _ = self.run_child("--kill-after", "step-002")
        self.assertEqual(code, -signal.SIGKILL)
        state = self.state()
        self.assertEqual(state.effects["step-002"].state.value, "started", "applied but not checkpointed")
        self.assertEqual(self.counts()[f"{self.task}/step-002"], 1)
        code, outcome = self.run_child()
        self.assertEqual(code, 0)
        self.assertEqual(outcome["status"], "done")
        self.assert_exactly_once(5)
        details = " ".join(item["detail"] for item in outcome["observations"])
        self.assertIn(f"{self.task}/step-002: applied", details)
        self.assertEqual(self.state().effects["step-002"].attempts, 1, "verified by observation, not re-applied")

    def test_sigkill_from_outside_before_the_effect_reaches_the_target_is_retried_once(self) -> None:
        signal_path = self.path("in-apply")
        child = self.spawn("--slow", "step-001:30", "--signal", signal_path)
        self.wait_for(signal_path)
        child.kill()
        child.communicate()
        self.assertEqual(self.state().effects["step-001"].state.value, "started")
        code, outcome = self.run_child()
        self.assertEqual(outcome["status"], "done")
        self.assert_exactly_once(5)
        self.assertEqual(self.state().effects["step-001"].attempts, 2, "observed absent, then applied again")

    def test_unknown_outcome_after_a_crash_stops_unsafe_without_reapplying(self) -> None:
        code, _ = self.run_child("--kill-after", "step-001")
        self.assertEqual(code, -signal.SIGKILL)
        code, outcome = self.run_child("--unobservable", "step-001")
        self.assertEqual(outcome["status"], "unsafe-to-continue")
        self.assertTrue(any("step-001" in item["detail"] for item in outcome["unknowns"]))
        self.assertEqual(self.counts()[f"{self.task}/step-001"], 1)
        self.assertNotIn(f"{self.task}/step-002", self.counts())
        code, outcome = self.run_child()
        self.assertEqual(outcome["status"], "done")
        self.assert_exactly_once(5)

    def test_many_kills_at_every_step_still_apply_each_effect_once(self) -> None:
        for step in range(6):
            code, _ = self.run_child("--steps", "6", "--kill-after", f"step-{step:03d}")
            self.assertEqual(code, -signal.SIGKILL)
        code, outcome = self.run_child("--steps", "6")
        self.assertEqual(outcome["status"], "done")
        self.assert_exactly_once(6)


class LeaseProcessTests(ChildRunnerCase):
    def test_two_live_runners_only_one_performs_effects(self) -> None:
        signal_path = self.path("in-apply")
        release = self.path("release")  # the first holds its lease inside the apply until the second has tried
        first = self.spawn("--slow", "step-001:60", "--signal", signal_path, "--release", release, "--owner", "first", later=0)
        self.wait_for(signal_path)
        code, second = self.run_child("--owner", "second", later=0)
        open(release, "w").close()
        self.assertEqual(code, 0)
        self.assertEqual(second["status"], "already-running")
        out, _ = first.communicate(timeout=60)
        self.assertEqual(json.loads(out)["status"], "done")
        self.assert_exactly_once(5)
        epochs = {line["epoch"] for line in read_outbox(self.outbox)}
        self.assertEqual(epochs, {1})

    def test_expired_lease_taken_over_by_a_newer_epoch_and_the_paused_owner_is_fenced(self) -> None:
        signal_path = self.path("in-apply")
        stale = self.spawn("--slow", "step-001:0.2", "--signal", signal_path, "--ttl", "1.0", "--owner", "stale", later=0)
        self.wait_for(signal_path)
        os.kill(stale.pid, signal.SIGSTOP)  # paused mid-apply; it cannot renew its 1 s lease
        try:
            time.sleep(1.2)  # real time past the stale owner's expiry
            code, taker = self.run_child("--owner", "taker", "--ttl", "1.0", later=0)
            self.assertEqual(taker["status"], "done")
            self.assertEqual(taker["epoch"], 2)
            revision = self.state().revision
        finally:
            os.kill(stale.pid, signal.SIGCONT)
        out, err = stale.communicate(timeout=60)
        self.assertEqual(json.loads(out)["status"], "lease-lost", err)
        self.assertEqual(self.state().revision, revision, "the stale owner's later writes were rejected")
        self.assert_exactly_once(5)


    def test_two_overlapping_runs_with_the_same_owner_string_apply_each_effect_once(self) -> None:
        # A stable owner such as the host name is a natural choice; it is a label, not a key.
        signal_path = self.path("in-apply")
        release = self.path("release")  # the first holds its lease inside the apply until the second has tried
        first = self.spawn("--slow", "step-001:60", "--signal", signal_path, "--release", release, "--owner", "build-host", later=0)
        self.wait_for(signal_path)
        code, second = self.run_child("--owner", "build-host", later=0)
        open(release, "w").close()
        self.assertEqual(code, 0)
        self.assertEqual(second["status"], "already-running", second["next_action"])
        out, err = first.communicate(timeout=60)
        self.assertEqual(json.loads(out)["status"], "done", err)
        self.assert_exactly_once(5)
        self.assertEqual({line["epoch"] for line in read_outbox(self.outbox)}, {1})

    def test_a_holder_killed_mid_run_is_taken_over_at_once_and_nothing_is_applied_twice(self) -> None:
        signal_path = self.path("in-apply")
        holder = self.spawn("--slow", "step-001:60", "--signal", signal_path, later=0)
        self.wait_for(signal_path)
        holder.kill()  # SIGKILL inside the adapter, its 30 s lease unexpired on the shared clock
        holder.communicate()
        code, outcome = self.run_child(later=0)  # at once, on the same clock
        self.assertEqual(outcome["status"], "done", outcome["next_action"])
        self.assertEqual(outcome["epoch"], 2)
        self.assert_exactly_once(5)
        state = self.state()
        self.assertEqual(state.effects["step-001"].attempts, 2, "observed absent, then applied under the newer epoch")
        self.assertEqual({line["epoch"] for line in read_outbox(self.outbox)}, {1, 2})

    def test_a_paused_holder_is_respected_and_already_running_reports_the_real_progress(self) -> None:
        signal_path = self.path("in-apply")
        holder = self.spawn("--slow", "step-002:1.0", "--signal", signal_path, later=0)
        self.wait_for(signal_path)
        os.kill(holder.pid, signal.SIGSTOP)  # alive, holding its lease, doing nothing
        try:
            code, outcome = self.run_child(later=0)
            revision = self.state().revision
        finally:
            os.kill(holder.pid, signal.SIGCONT)
        self.assertEqual(outcome["status"], "already-running")
        self.assertGreater(revision, 0)
        self.assertEqual(outcome["revision"], revision)
        self.assertEqual(sorted(outcome["results"]), ["step-000", "step-001"])
        self.assertIn(f"revision {revision}", outcome["next_action"])
        self.assertIn("2 of 5 effects verified", outcome["next_action"])
        out, err = holder.communicate(timeout=60)
        self.assertEqual(json.loads(out)["status"], "done", err)
        self.assert_exactly_once(5)


class SqliteLeaseProcessTests(LeaseProcessTests):
    sqlite = True


class BoundedRetryAcrossProcessesTests(ChildRunnerCase):
    def test_attempt_counter_survives_restarts_and_stops_at_the_maximum(self) -> None:
        statuses = []
        for _ in range(5):
            # each child's clock is 100 s later than the last, past the 1 s backoff
            code, outcome = self.run_child("--steps", "1", "--fail-transient", "100", "--base-delay", "1")
            statuses.append(outcome["status"])
        self.assertEqual(statuses, ["retry-scheduled", "retry-scheduled", "limits-exhausted", "limits-exhausted", "limits-exhausted"])
        self.assertEqual(self.state().effects["step-000"].attempts, 3)
        self.assertEqual(self.state().status, Status.LIMITS_EXHAUSTED)

    def test_killed_during_every_attempt_never_gets_a_fourth(self) -> None:
        for attempt in range(1, 4):
            signal_path = self.path(f"in-apply-{attempt}")
            child = self.spawn("--steps", "1", "--slow", "step-000:30", "--signal", signal_path)
            self.wait_for(signal_path)
            self.assertEqual(self.state().effects["step-000"].attempts, attempt, "counter durable before the attempt")
            child.kill()
            child.communicate()
        code, outcome = self.run_child("--steps", "1", "--slow", "step-000:30", "--signal", self.path("fourth"))
        self.assertEqual(outcome["status"], "limits-exhausted")
        self.assertFalse(os.path.exists(self.path("fourth")), "no fourth attempt was started")
        self.assertEqual(self.counts(), {})


class LargeValueKillTests(ChildRunnerCase):
    """Effects whose payloads and results are large (kept as blobs, ``stores.blobs``), SIGKILLed at
    random moments (a random crash point's N-th pass, a blob's write among them, or a signal from
    outside after a random delay) and run again until done, over several tasks: every effect is at
    the target exactly once, and the state loads with every payload and result as written."""

    steps = 6
    kills = int(os.environ.get("LONGRUN_BLOB_KILLS", scale.scaled(4, 12)))
    points: tuple[str, ...] = (
        *BLOB_POINTS, "journal.half-written", "journal.synced", "effect.intent-persisted", "effect.applied",
        "state.committed", "snapshot.temp-written", "snapshot.replaced", "new-journal.dir-fsynced",
    )  # fmt: skip

    def run_blob_child(self, task: str, *, crash_at: str | None, kill_after_s: float | None) -> tuple[int, dict | None]:
        self.later += 100.0
        arguments = [
            self.root, self.outbox, "--task", task, "--steps", str(self.steps), "--later", str(self.later), "--compact-early",
            *(("--sqlite",) if self.sqlite else ()),
        ]  # fmt: skip
        env = support.child_env()
        if crash_at is not None:
            env["LONGRUN_CRASH_AT"] = crash_at
        # Forked from the fork server (longrun imported once): a kill from outside after
        # ``kill_after_s`` is the SIGKILL the server sends when that timeout passes.
        try:
            child = run_script(os.path.join(support.HELPERS, "blob_child.py"), arguments, env=env, cwd=None, timeout=kill_after_s or 120)
            code, out, err = child.returncode, child.stdout, child.stderr
        except subprocess.TimeoutExpired as expired:
            if kill_after_s is None:
                raise
            code, out, err = -signal.SIGKILL, "", str(expired.stderr or "")
        if code not in (0, -signal.SIGKILL):
            self.fail(f"the child exited {code}: {err[-2000:]}")
        return code, (json.loads(out.strip().splitlines()[-1]) if code == 0 else None)

    def check(self, task: str) -> None:
        sys.path.insert(0, support.HELPERS)
        import blob_child  # noqa: PLC0415  (the child's own values, to compare with)

        lines = read_outbox(self.outbox)
        applied = [line["key"] for line in lines if line["task_id"] == task]
        self.assertEqual(sorted(applied), [f"{task}/step-{i:03d}" for i in range(self.steps)], "each effect exactly once")
        store = self.open_store()
        try:
            state = store.load(task).state
        finally:
            close = getattr(store, "close", None)
            if close is not None:
                close()
        assert state is not None
        for i in range(self.steps):
            record = state.effects[f"step-{i:03d}"]
            self.assertEqual(record.state.value, "verified")
            self.assertEqual(record.payload, blob_child.payload(i))
            line = record.result["line"]  # type: ignore[index]
            self.assertEqual(lines[line]["key"], f"{task}/step-{i:03d}")
            if i % 2 and "echo" in record.result:  # type: ignore[operator]
                self.assertEqual(record.result, blob_child.result(line))  # acknowledged (not observed): kept whole

    def test_large_values_killed_at_random_apply_each_effect_once_and_load(self) -> None:
        rng = random.Random(f"blob-kills-{self.sqlite}")
        points = [point for point in self.points if not (self.sqlite and point.startswith(("blob.", "snapshot.", "journal.", "new-")))]
        killed = tasks = 0
        while killed < self.kills:
            tasks += 1
            task = f"blob-{tasks}"
            armed = rng.randint(2, 5)
            for _ in range(armed + 10):
                crash_at = kill_after_s = None
                if armed > 0:
                    armed -= 1
                    if rng.random() < 0.7:
                        crash_at = f"{rng.choice(points)}:{rng.randint(1, self.steps)}"
                    else:
                        kill_after_s = rng.uniform(0.1, 1.5)
                code, outcome = self.run_blob_child(task, crash_at=crash_at, kill_after_s=kill_after_s)
                if code == -signal.SIGKILL:
                    killed += 1
                    continue
                assert outcome is not None
                self.assertEqual(outcome["status"], "done", outcome)
                break
            else:
                self.fail(f"{task} did not finish")
            self.check(task)
        if not self.sqlite:
            directory = os.path.join(self.root, f"blob-{tasks}", "blobs")
            self.assertTrue(os.listdir(directory), "the large values were kept as blobs")


class SqliteLargeValueKillTests(LargeValueKillTests):
    sqlite = True
    kills = int(os.environ.get("LONGRUN_BLOB_KILLS", scale.scaled(3, 6)))


class DamagedStateTests(ChildRunnerCase):
    def task_file(self, name: str) -> str:
        return os.path.join(self.root, self.task, name)

    def test_truncated_state_after_a_crash_recovers_from_the_backup_and_observes_first(self) -> None:
        code, _ = self.run_child("--kill-after", "step-002")
        self.assertEqual(code, -signal.SIGKILL)
        with open(self.task_file("state.json"), "r+b") as handle:
            handle.truncate(os.path.getsize(self.task_file("state.json")) // 2)
        code, outcome = self.run_child()
        self.assertEqual(outcome["status"], "done")
        self.assert_exactly_once(5)
        quarantined = os.listdir(self.task_file("quarantine"))
        self.assertEqual(len(quarantined), 1)
        self.assertTrue(quarantined[0].startswith("state.json."))
        details = " ".join(item["detail"] for item in outcome["observations"])
        self.assertIn("recovered from state.json.bak", details)

    def test_state_and_backup_both_damaged_stops_unrecoverable_and_applies_nothing(self) -> None:
        code, _ = self.run_child("--kill-after", "step-002")
        before = self.counts()
        for name in ("state.json", "state.json.bak"):
            with open(self.task_file(name), "r+b") as handle:
                handle.truncate(10)
        code, outcome = self.run_child()
        self.assertEqual(outcome["status"], "state-unrecoverable")
        self.assertEqual(self.counts(), before)
        self.assertEqual(len(os.listdir(self.task_file("quarantine"))), 2)
        code, outcome = self.run_child()
        self.assertEqual(outcome["status"], "state-unrecoverable", "never silently restarted as a fresh run")
        self.assertEqual(self.counts(), before)


class RolledBackStateTests(ChildRunnerCase):
    """State that lost more than the one record whose sync never returned: never a silent restart,
    never an effect applied twice."""

    steps = 6

    def task_file(self, name: str) -> str:
        return os.path.join(self.root, self.task, name)

    def newest_journal(self) -> str:
        names = [name for name in os.listdir(os.path.join(self.root, self.task)) if name.startswith("journal.")]
        return self.task_file(max(names, key=lambda name: int(name.split(".")[1])))

    def finished(self) -> str:
        """Run the task to done in a child killed once on the way; return a pristine copy of the store."""
        code, _ = self.run_child("--steps", str(self.steps), "--kill-after", "step-002")
        self.assertEqual(code, -signal.SIGKILL)
        _, outcome = self.run_child("--steps", str(self.steps))
        self.assertEqual(outcome["status"], "done")
        self.assert_exactly_once(self.steps)
        pristine = self.path("pristine")
        copy_keeping_links(self.root, pristine)
        return pristine

    def rerun_repeats_nothing(self, why: str) -> str:
        statuses = []
        for _ in range(2):  # and again: a refusal is not a one-off that a second run gets past
            _, outcome = self.run_child("--steps", str(self.steps))
            statuses.append(outcome["status"])
            self.assertIn(outcome["status"], ("done", "state-unrecoverable"), why)
            self.assert_exactly_once(self.steps)
        self.assertEqual(statuses[0], statuses[1], why)
        return statuses[0]

    def test_a_finished_task_whose_newest_journal_is_cut_repeats_nothing(self) -> None:
        pristine = self.finished()
        with open(self.newest_journal(), "rb") as handle:
            content = handle.read().split(b"\0")[0]
        boundaries = [index + 1 for index, byte in enumerate(content) if byte == ord("\n")][:-1]
        self.assertGreaterEqual(len(boundaries), 2, "the newest journal should hold records to lose")
        for cut in [0, *boundaries]:
            with self.subTest(cut=cut):
                shutil.rmtree(self.root)
                copy_keeping_links(pristine, self.root)
                with open(self.newest_journal(), "r+b") as handle:
                    handle.truncate(cut)
                status = self.rerun_repeats_nothing(f"journal cut at byte {cut}")
                # The release after the last commit recorded it in lease.json: the loss is seen.
                self.assertEqual(status, "state-unrecoverable")

    def test_state_and_journals_deleted_with_the_lease_left_is_state_unrecoverable(self) -> None:
        self.finished()
        for name in os.listdir(os.path.join(self.root, self.task)):
            if name.startswith(("state.json", "journal.")):
                os.unlink(self.task_file(name))
        self.assertTrue(os.path.exists(self.task_file("lease.json")))
        self.assertEqual(self.rerun_repeats_nothing("state deleted"), "state-unrecoverable")
        _, outcome = self.run_child("--steps", str(self.steps))
        self.assertIn("observe_first=True", outcome["next_action"])
        self.assertTrue(any("lease record shows that revision" in item["detail"] for item in outcome["observations"]))

    def test_an_older_copy_put_back_lease_and_all_verifies_the_lost_effects_instead_of_repeating_them(self) -> None:
        code, _ = self.run_child("--steps", str(self.steps), "--kill-after", "step-001")
        self.assertEqual(code, -signal.SIGKILL)
        older = self.path("older")
        copy_keeping_links(self.root, older)  # its lease record witnessed no commit: no check can see the loss
        code, _ = self.run_child("--steps", str(self.steps), "--kill-after", "step-004")
        self.assertEqual(code, -signal.SIGKILL)
        shutil.rmtree(self.root)
        copy_keeping_links(older, self.root)
        _, outcome = self.run_child("--steps", str(self.steps))
        self.assertEqual(outcome["status"], "done")
        self.assert_exactly_once(self.steps)
        verified = [item["detail"] for item in outcome["inferences"] if "was already applied" in item["detail"]]
        self.assertEqual(len(verified), 3, "steps 2-4 are verified by observation, in order, until step 5 is absent")

    def test_a_crash_between_acquiring_the_lease_and_the_first_commit_is_not_taken_for_a_loss(self) -> None:
        code, _ = self.run_child("--steps", str(self.steps), "--kill-after", "step-002")
        self.assertEqual(code, -signal.SIGKILL)
        _, outcome = self.run_child("--steps", str(self.steps), "--kill-after", "step-003")  # commits, then dies
        for _ in range(2):  # the lease record is written at the next epoch, then the process dies
            code, _ = self.run_child("--steps", str(self.steps), env={"LONGRUN_CRASH_AT": "lease.acquired:1"})
            self.assertEqual(code, -signal.SIGKILL)
        _, outcome = self.run_child("--steps", str(self.steps))
        self.assertEqual(outcome["status"], "done")
        self.assert_exactly_once(self.steps)


if __name__ == "__main__":
    unittest.main()
