"""Following a run from the terminal: ``watch``, ``ls`` filters and progress, payloads shown by
``approve`` and ``status``."""

from __future__ import annotations

from helpers import support

import contextlib
import datetime
import io
import json
import subprocess
import sys
import threading
from typing import Any

from helpers.cli_case import CliCase, OpsCase, cli

from longrun import JsonFileStore, Run, RunEvent, Status, Step, durable
from longrun.adapters import EffectRequest, Observation, Receipt
from longrun.cli import main
from longrun.cli._payload import payload_lines, safe_text
from longrun.cli._watch import cmd_watch, render_frame
from longrun.envelope import PlanOutline
from longrun.progress import progress_of
from longrun.testing import OutboxAdapter

WAIT_S = 60.0
"""How long a test waits for another thread or process at most (never a timed assertion)."""


class GatedAdapter:
    """A target whose applies wait, one by one, for the test to let them through."""

    deduplicates = False

    def __init__(self, outbox: str):
        self.outbox = OutboxAdapter(outbox)
        self.gate = threading.Semaphore(0)
        self.waiting = threading.Semaphore(0)

    def apply(self, request: EffectRequest) -> Receipt:
        self.waiting.release()
        if not self.gate.acquire(timeout=WAIT_S):
            raise TimeoutError("the test never let the apply through")
        return self.outbox.apply(request)

    def observe(self, request: EffectRequest) -> Observation:
        return self.outbox.observe(request)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class PayloadTests(CliCase):
    def test_control_and_reordering_characters_are_escaped_and_long_values_elided(self) -> None:
        lines = payload_lines({"evil": "\x1b[2J\u202eabc\u200b\x7f", "long": "x" * 500, "list": list(range(100)), "ok": "é ✓"})
        text = "\n".join(lines)
        for raw in ("\x1b", "\u202e", "\u200b", "\x7f"):
            self.assertNotIn(raw, text)
        self.assertIn("\\u001b[2J\\u202eabc\\u200b\\u007f", text)
        self.assertIn("(500 characters in all)", text)
        self.assertIn("… 80 more items", text)
        self.assertIn('"é ✓"', text)
        self.assertEqual(safe_text("plain text"), "plain text")

    def test_approve_shows_the_pending_payload_in_full_before_asking(self) -> None:
        steps = [Step("publish", "send", {"channel": "everyone", "body": "Dear all,\nthe meeting moved.", "n": 3}, approval=True)]
        self.assertIs(self.runner("gated", steps).run().status, Status.AWAITING_APPROVAL)
        result = cli("approve", self.store_dir, "gated", input="n\n")
        self.assertEqual(result.returncode, 1, result.stderr)
        for fragment in ("task            gated", "step            publish", "action          send",
                         '"channel": "everyone"', '"body": "Dear all,\\nthe meeting moved."', "payload digest  sha256:",
                         "expires"):  # fmt: skip
            self.assertIn(fragment, result.stdout)
        self.assertLess(result.stdout.index('"channel"'), result.stdout.index("payload digest"))
        self.assertIn("approve this request?", result.stderr)
        self.assertEqual(JsonFileStore(self.store_dir).read_approvals("gated"), ())
        shown = cli("approve", self.store_dir, "gated", "--yes", "--json")
        body = json.loads(shown.stdout)
        self.assertEqual(body["payload"]["channel"], "everyone")
        self.assertEqual(body["approval"]["payload_digest"], body["request"]["payload_digest"])

    def test_status_shows_the_payload_of_a_pending_request(self) -> None:
        self.awaiting_task()
        result = cli("status", self.store_dir, "gated")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn('"channel": "everyone"', result.stdout)
        self.assertIn("progress     1/2 verified (50%), 0 in flight, 1 waiting, 0 ready, 0 not yet planned", result.stdout)
        body = json.loads(cli("status", self.store_dir, "gated", "--json").stdout)
        self.assertEqual((body["progress"]["verified"], body["progress"]["total"]), (1, 2))


class LsTests(CliCase):
    def make_tasks(self) -> None:
        self.finished_task("old-done")
        self.clock.advance(3600)
        self.awaiting_task("gated")
        self.clock.advance(60)
        self.finished_task("new-done")

    def ls(self, *args: str) -> list[dict[str, Any]]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(main(["ls", self.store_dir, "--json", *args]), 0)
        return json.loads(out.getvalue())

    def test_sorted_by_last_update_with_progress(self) -> None:
        self.make_tasks()
        entries = self.ls()
        self.assertEqual([entry["task_id"] for entry in entries], ["new-done", "gated", "old-done"])
        self.assertEqual([entry["progress"]["label"] for entry in entries], ["2/2", "1/2", "2/2"])
        text = cli("ls", self.store_dir)
        self.assertEqual(text.returncode, 0, text.stderr)
        header, first = text.stdout.splitlines()[:2]
        self.assertIn("PROGRESS", header)
        self.assertTrue(first.startswith("new-done"), first)
        self.assertIn("2/2", first)

    def test_status_since_and_limit_filter(self) -> None:
        self.make_tasks()
        self.assertEqual([e["task_id"] for e in self.ls("--status", "done")], ["new-done", "old-done"])
        self.assertEqual([e["task_id"] for e in self.ls("--status", "awaiting-approval", "--status", "done", "--limit", "2")],
                         ["new-done", "gated"])  # fmt: skip
        # The fake clock started in 2023: a window back from now keeps nothing, a time before it everything.
        self.assertEqual(self.ls("--since", "2h"), [])
        self.assertEqual(len(self.ls("--since", "2023-11-14T00:00Z")), 3)
        after_first = self.clock.now() - 30  # between gated and new-done
        moment = datetime.datetime.fromtimestamp(after_first, datetime.timezone.utc).isoformat()
        self.assertEqual([e["task_id"] for e in self.ls("--since", moment)], ["new-done"])
        for bad in (["--status", "finished"], ["--since", "yesterday"], ["--limit", "0"]):
            with self.subTest(bad=bad):
                result = cli("ls", self.store_dir, *bad)
                self.assert_fails(result, 2)


class WatchTests(CliCase):
    def run_in_thread(self, task_id: str, steps: list[Step], adapter: Any) -> threading.Event:
        """Start the run in a thread; the event is set once the run's ``done`` is durable."""
        done = threading.Event()

        def hook(event: RunEvent) -> None:
            if event.kind == "run" and event.state == "done":
                done.set()

        runner = self.runner(task_id, steps, adapter, on_event=hook)
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        self.addCleanup(thread.join, WAIT_S)
        return done

    def test_a_live_run_is_followed_step_by_step_until_it_stops(self) -> None:
        adapter = GatedAdapter(self.outbox)
        steps = [Step(f"s{i}", "send", {"n": i}) for i in range(3)]
        done = self.run_in_thread("live", steps, adapter)
        self.assertTrue(adapter.waiting.acquire(timeout=WAIT_S))  # s0 is in flight
        frames: list[str] = []
        out = Terminal()

        def next_poll(seconds: float) -> None:
            frames.append(out.getvalue())
            self.assertEqual(seconds, 0.5)
            adapter.gate.release()  # let the effect in flight through, and wait for the next one (or the end)
            if len(frames) < len(steps):
                self.assertTrue(adapter.waiting.acquire(timeout=WAIT_S))
            else:
                self.assertTrue(done.wait(WAIT_S))

        code = cmd_watch(JsonFileStore(self.store_dir), "live", interval=0.5, out=out, sleep=next_poll, clock=self.clock.now)
        self.assertEqual(code, 0)
        screen = out.getvalue()
        self.assertIn("0/3 verified", frames[0])
        self.assertIn("current  effect s0 (send), started, attempt 1", frames[0])
        self.assertIn("1/3 verified", frames[1])
        self.assertIn("\x1b[", screen[len(frames[0]) :])  # later frames redraw in place
        self.assertIn("3/3 verified (100%)", screen)
        self.assertIn("stopped  done", screen)

    def test_plain_lines_when_not_a_terminal_and_the_exit_code_says_how_it_stopped(self) -> None:
        self.awaiting_task("gated")
        out = io.StringIO()
        code = cmd_watch(JsonFileStore(self.store_dir), "gated", interval=1.0, out=out, sleep=self.fail)
        self.assertEqual(code, 1)
        lines = out.getvalue().splitlines()
        self.assertNotIn("\x1b", out.getvalue())
        self.assertIn("awaiting-approval at revision", lines[0])
        self.assertTrue(any("effect publish planned" in line for line in lines))
        self.assertIn("stopped awaiting-approval", lines[-1])
        self.finished_task("finished")
        out = io.StringIO()
        self.assertEqual(cmd_watch(JsonFileStore(self.store_dir), "finished", interval=1.0, out=out, as_json=True, sleep=self.fail), 0)
        records = [json.loads(line) for line in out.getvalue().splitlines()]
        self.assertEqual(records[-1]["kind"], "stopped")
        self.assertEqual(records[-1]["progress"]["verified"], 2)

    def test_watch_follows_a_run_in_another_process(self) -> None:
        adapter = GatedAdapter(self.outbox)
        steps = [Step(f"s{i}", "send", {"n": i}) for i in range(3)]
        done = self.run_in_thread("other", steps, adapter)
        self.assertTrue(adapter.waiting.acquire(timeout=WAIT_S))
        watcher = subprocess.Popen(
            [sys.executable, "-m", "longrun", "watch", self.store_dir, "other", "--interval", "0.05"],
            env=support.child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=support.ROOT,
        )  # fmt: skip
        self.addCleanup(lambda: watcher.poll() is None and watcher.kill())
        first = watcher.stdout.readline() if watcher.stdout else ""
        self.assertIn("running at revision", first)  # it saw the run live, not after the fact
        for index in range(len(steps)):
            adapter.gate.release()
            if index < len(steps) - 1:
                self.assertTrue(adapter.waiting.acquire(timeout=WAIT_S))
        self.assertTrue(done.wait(WAIT_S))
        rest, errors = watcher.communicate(timeout=WAIT_S)
        self.assertEqual(watcher.returncode, 0, errors)
        self.assertIn("effect s2 verified (attempt 1)  [3/3]", rest)
        self.assertIn("stopped done at revision", rest.splitlines()[-1])

    def test_an_unknown_task_is_a_usage_error(self) -> None:
        self.finished_task()
        self.assert_fails(cli("watch", self.store_dir, "nope"), 2, "nope")

    def test_the_view_shows_the_rate_and_time_left_of_a_plan_and_counts_for_a_durable_function(self) -> None:
        steps = [Step(f"s{i}", "send", {"n": i}) for i in range(4)] + [Step("gate", "send", {}, approval=True), Step("last", "send", {})]
        runner = self.runner("plan", steps)
        original = runner.engine.config.adapters["send"].apply

        def slow_apply(request: EffectRequest) -> Receipt:
            self.clock.advance(2.0)
            return original(request)

        runner.engine.config.adapters["send"].apply = slow_apply  # type: ignore[method-assign]
        self.assertIs(runner.run().status, Status.AWAITING_APPROVAL)
        store = JsonFileStore(self.store_dir)
        state = store.load("plan").state
        assert state is not None
        state.current_step = "gate"  # as while the gate's record is being worked on
        frame = "\n".join(render_frame("plan", state, store.read_lease("plan"), self.clock.now() + 3.0))
        self.assertIn("4/6 verified (67%)  0.50/s  about 4.0s left", frame)
        self.assertIn("current  effect gate (send), planned, attempt 0, for 3.0s", frame)
        self.assertIn("1 waiting", frame)

        @durable(store=JsonFileStore(self.store_dir), adapters={"send": OutboxAdapter(self.outbox)}, clock=self.clock)
        def agent(run: Run) -> int:
            run.effect("a", "send", {"n": 1})
            run.effect("b", "send", {"n": 2})
            return run.call("pick", lambda: 7)

        self.assertIs(agent.run("fn").status, Status.DONE)
        state = store.load("fn").state
        assert state is not None
        self.assertIsNone(state.plan_outline)  # the plan of a durable function is not known ahead
        frame = "\n".join(render_frame("fn", state, None, self.clock.now()))
        self.assertIn("3 verified of 3 recorded (2 effects, 1 call)", frame)
        self.assertNotIn("/3 verified", frame)


class ProgressTests(CliCase):
    def test_counts_for_a_declared_plan_and_a_rate_once_two_are_verified(self) -> None:
        steps = [Step(f"s{i}", "send", {"n": i}) for i in range(4)] + [Step("gate", "send", {}, approval=True), Step("last", "send", {})]
        runner = self.runner("p", steps)
        original = runner.engine.config.adapters["send"].apply
        clock = self.clock

        def slow_apply(request: EffectRequest) -> Receipt:
            clock.advance(2.0)
            return original(request)

        runner.engine.config.adapters["send"].apply = slow_apply  # type: ignore[method-assign]
        self.assertIs(runner.run().status, Status.AWAITING_APPROVAL)
        state = JsonFileStore(self.store_dir).load("p").state
        assert state is not None
        progress = progress_of(state)
        self.assertEqual((progress.verified, progress.waiting, progress.remaining, progress.total), (4, 1, 1, 6))
        self.assertEqual(progress.label(), "4/6")
        self.assertAlmostEqual(progress.rate or 0.0, 0.5)
        self.assertAlmostEqual(progress.eta_s or 0.0, 4.0)
        state.plan_outline = None
        self.assertEqual(progress_of(state).label(), "4 steps")
        self.assertIsNone(progress_of(state).total)
        self.assertEqual(len(PlanOutline.of(steps)), 6)


class VerboseLogTests(OpsCase):
    def test_a_complete_run_under_v_logs_every_step_on_stderr(self) -> None:
        result = cli("-v", "resume", "--path", support.HELPERS, "cli_tasks:finished")
        self.assertEqual(result.returncode, 0, result.stderr)
        for step in ("one", "two", "three"):
            for state in ("planned", "attempt 1 started", "acknowledged", "verified"):
                self.assertRegex(result.stderr, rf"\dZ INFO longrun: task nightly: effect {step} {state}")
        self.assertIn("task nightly: run stopped done", result.stderr)
        self.assertNotIn("DEBUG", result.stderr)
        debug = cli("-vv", "resume", "--path", support.HELPERS, "cli_tasks:gated")  # a new task: it commits
        self.assertIn("DEBUG longrun: lease on gated acquired", debug.stderr)
        self.assertIn("DEBUG longrun: task gated: revision 1 committed", debug.stderr)


def _ls_job(run: Run, n: int) -> int:
    return n


class LsPageLoadTests(support.TempDirTest):
    """``ls --limit`` takes its page from the summary index and loads the page's tasks together
    (``load_many``: one read transaction on SQLite), never each task on its own."""

    def test_a_page_of_ls_is_loaded_in_one_read(self) -> None:
        from unittest import mock

        from longrun import SqliteStore
        from longrun.cli._inspect import cmd_ls

        store = SqliteStore(self.path("tasks.sqlite"), create=True)
        self.addCleanup(store.close)
        job = durable(store=store)(_ls_job)
        job.start_many([(f"job-{n:03d}", (n,)) for n in range(80)])
        out = io.StringIO()
        with mock.patch.object(SqliteStore, "load", autospec=True, side_effect=SqliteStore.load) as loads, \
                mock.patch.object(SqliteStore, "load_many", autospec=True, side_effect=SqliteStore.load_many) as together:  # fmt: skip
            self.assertEqual(cmd_ls(store, "sqlite:tasks", False, out, limit=50), 0)
        self.assertEqual(sum(line.startswith("job-") for line in out.getvalue().splitlines()), 50)
        self.assertEqual(loads.call_count, 0)
        self.assertEqual([len(call.args[1]) for call in together.call_args_list], [50])
        self.assertIn("queued", out.getvalue())
