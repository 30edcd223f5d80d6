"""A task's wall-clock deadline: recorded at its first run, kept across restarts, inherited by children.

``Limits(deadline_s=...)`` or ``fn.run(..., deadline=datetime)`` bounds the whole task in wall-clock
time; a sleep or a receive that would pass it ends at it; when it passes the task stops
``deadline-exceeded`` (an effect already running is settled first), and its unfinished children
are cancelled. Time is the injected ``FakeClock``'s (no test sleeps). On every store (PostgreSQL
when ``LONGRUN_TEST_POSTGRES_DSN`` is set); the restart test SIGKILLs a real process.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import unittest
from typing import Any

from helpers import pg_support, support
from helpers.cli_process import run_script
import longrun
from longrun import InvalidInputError, JsonFileStore, Limits, PostgresStore, SqliteStore, Status, Store
from longrun.deadline import TaskDeadline
from longrun.envelope import RunState
from longrun.errors import CorruptStateError, ReopenRefusedError
from longrun.ledger import EffectState
from longrun.outcome import ENDED_UNFINISHED, TERMINAL
from longrun.testing import FakeClock

CHILD = os.path.join(support.HELPERS, "deadline_child.py")
FAMILY = os.path.join(support.HELPERS, "deadline_family.py")


class DeadlineCases(support.TempDirTest):
    """In one process, with a fake clock; a subclass says which store."""

    def make_store(self) -> Store:
        return JsonFileStore(self.path("store"), create=True)

    def setUp(self) -> None:
        super().setUp()
        self.clock = FakeClock()
        self.store = self.make_store()
        self.calls: list[str] = []

    def durable(self, **limits: Any) -> Any:
        return longrun.durable(store=self.store, clock=self.clock, limits=Limits(**limits))

    def state(self, task_id: str) -> RunState:
        state = self.store.load(task_id).state
        assert state is not None
        return state

    def note(self, what: str) -> str:
        self.calls.append(what)
        return what

    def test_a_sleep_past_the_deadline_waits_until_it_then_the_task_stops_deadline_exceeded(self) -> None:
        @self.durable(deadline_s=100.0)
        def agent(run: longrun.Run) -> str:
            run.sleep("nap", 500.0)
            return str(run.call("after", self.note, "after"))

        start = self.clock.now()
        outcome = agent.run("t")
        self.assertEqual(outcome.status, Status.SLEEPING)
        self.assertEqual(outcome.wake_at, start + 100.0, "the wait ends at the deadline, not at the sleep's end")
        deadline = self.state("t").deadline
        self.assertEqual(deadline, TaskDeadline(start + 100.0, "limits", start))
        self.clock.advance(100.0)
        outcome = agent.run("t")
        self.assertEqual(outcome.status, Status.DEADLINE_EXCEEDED)
        self.assertIn("--add-time S", outcome.next_action)
        self.assertEqual(self.calls, [], "nothing after the sleep ran")
        state = self.state("t")
        self.assertEqual(state.status, Status.DEADLINE_EXCEEDED)
        self.assertNotEqual(state.effects["nap"].state, EffectState.VERIFIED, "the sleep did not end as if it had been slept")
        self.assertEqual(agent.run("t").status, Status.DEADLINE_EXCEEDED, "final: running it again changes nothing")
        self.assertEqual(self.calls, [])

    def test_a_short_sleep_waited_in_the_process_ends_at_the_deadline(self) -> None:
        @self.durable(deadline_s=30.0, max_block_s=1000.0)
        def agent(run: longrun.Run) -> str:
            run.sleep("nap", 500.0)
            return str(run.call("after", self.note, "after"))

        start = self.clock.now()
        outcome = agent.run("t")
        self.assertEqual(outcome.status, Status.DEADLINE_EXCEEDED)
        self.assertEqual(self.clock.sleeps, [30.0], "slept to the deadline, not the 500 s asked")
        self.assertEqual(self.clock.now(), start + 30.0)
        self.assertEqual(self.calls, [])

    def test_a_receive_with_a_timeout_past_the_deadline_ends_at_it(self) -> None:
        @self.durable(deadline_s=500.0)
        def agent(run: longrun.Run) -> Any:
            return run.recv("orders", timeout_s=3600.0)

        start = self.clock.now()
        outcome = agent.run("t")
        self.assertEqual(outcome.status, Status.AWAITING_INPUT)
        self.assertEqual(outcome.wake_at, start + 500.0)
        self.clock.advance(500.0)
        self.assertEqual(agent.run("t").status, Status.DEADLINE_EXCEEDED)

    def test_a_question_waits_until_the_deadline_at_most(self) -> None:
        @self.durable(deadline_s=70.0)
        def agent(run: longrun.Run) -> Any:
            return run.ask("ok", "go on?")

        start = self.clock.now()
        outcome = agent.run("t")
        self.assertEqual((outcome.status, outcome.wake_at), (Status.AWAITING_INPUT, start + 70.0))
        self.clock.advance(70.0)
        self.assertEqual(agent.run("t").status, Status.DEADLINE_EXCEEDED)

    def test_the_deadline_reached_between_effects_settles_the_effect_in_flight_and_starts_no_other(self) -> None:
        def slow(what: str) -> str:
            self.clock.advance(120.0)  # the deadline passes while this effect runs
            return self.note(what)

        @self.durable(deadline_s=100.0)
        def agent(run: longrun.Run) -> str:
            run.call("first", self.note, "first")
            run.call("slow", slow, "slow")
            return str(run.call("third", self.note, "third"))

        outcome = agent.run("t")
        self.assertEqual(outcome.status, Status.DEADLINE_EXCEEDED)
        self.assertEqual(self.calls, ["first", "slow"])
        state = self.state("t")
        self.assertEqual(state.effects["slow"].state, EffectState.VERIFIED, "the effect in flight was settled, not abandoned")
        self.assertEqual(state.effects["slow"].result, "slow")
        self.assertNotIn("third", state.effects)

    def test_a_callers_deadline_is_recorded_and_the_earlier_of_it_and_the_limits_wins(self) -> None:
        @self.durable(deadline_s=1000.0)
        def agent(run: longrun.Run) -> str:
            run.sleep("nap", 5000.0)
            return "done"

        start = self.clock.now()
        when = dt.datetime.fromtimestamp(start + 400.0, tz=dt.timezone.utc)
        self.assertEqual(agent.run("t", deadline=when).wake_at, start + 400.0)
        self.assertEqual(self.state("t").deadline, TaskDeadline(start + 400.0, "caller", start))
        later = dt.datetime.fromtimestamp(start + 5000.0, tz=dt.timezone.utc)
        self.assertEqual(agent.run("u", deadline=later).wake_at, start + 1000.0, "the limits' is earlier")
        self.assertEqual(self.state("u").deadline, TaskDeadline(start + 1000.0, "limits", start))
        # Recorded once: a later run that asks for another deadline keeps the recorded one.
        self.clock.advance(10.0)
        agent.run("t", deadline=later)
        self.assertEqual(self.state("t").deadline, TaskDeadline(start + 400.0, "caller", start))

    def test_start_and_enqueue_record_the_deadline_with_the_task_and_its_first_run_keeps_it(self) -> None:
        @self.durable()
        def agent(run: longrun.Run) -> str:
            run.sleep("nap", 5000.0)
            return "done"

        start = self.clock.now()
        when = dt.datetime.fromtimestamp(start + 400.0, tz=dt.timezone.utc)
        self.assertTrue(agent.start("s", deadline=when))
        queued = self.state("s")
        self.assertEqual((queued.status, queued.deadline), (Status.QUEUED, TaskDeadline(start + 400.0, "caller", start)))
        self.assertTrue(agent.enqueue("e", deadline=when, delay_s=10.0, priority=1))
        self.assertEqual(self.state("e").deadline, TaskDeadline(start + 400.0, "caller", start))
        self.assertFalse(agent.start("s", deadline=dt.datetime.fromtimestamp(start + 9000.0, tz=dt.timezone.utc)), "recorded before")
        self.assertEqual(self.state("s").deadline, TaskDeadline(start + 400.0, "caller", start), "one recorded before keeps its own")
        self.clock.advance(100.0)
        outcome = agent.run("s")  # its first run: the recorded deadline bounds the sleep
        self.assertEqual((outcome.status, outcome.wake_at), (Status.SLEEPING, start + 400.0))
        self.assertEqual(self.state("s").deadline, TaskDeadline(start + 400.0, "caller", start + 100.0))
        self.clock.advance(300.0)
        self.assertEqual(agent.run("s").status, Status.DEADLINE_EXCEEDED)
        self.assertEqual(agent.run("e").status, Status.DEADLINE_EXCEEDED, "its deadline passed while it was queued")

    def test_a_queued_tasks_deadline_and_the_limits_from_its_first_run_the_earlier_wins(self) -> None:
        @self.durable(deadline_s=100.0)
        def agent(run: longrun.Run) -> str:
            run.sleep("nap", 5000.0)
            return "done"

        start = self.clock.now()
        agent.start("late", deadline=dt.datetime.fromtimestamp(start + 500.0, tz=dt.timezone.utc))
        agent.start("soon", deadline=dt.datetime.fromtimestamp(start + 120.0, tz=dt.timezone.utc))
        agent.start("none")
        self.assertIsNone(self.state("none").deadline, "the limits' counts from the first run, not from the start")
        self.clock.advance(50.0)
        self.assertEqual(agent.run("late").wake_at, start + 150.0)
        self.assertEqual(self.state("late").deadline, TaskDeadline(start + 150.0, "limits", start + 50.0))
        self.assertEqual(agent.run("soon").wake_at, start + 120.0)
        self.assertEqual(self.state("soon").deadline, TaskDeadline(start + 120.0, "caller", start + 50.0))
        self.assertEqual(agent.run("none").wake_at, start + 150.0)

    def test_start_and_enqueue_refuse_a_naive_past_or_unreachable_deadline_and_record_nothing(self) -> None:
        @self.durable()
        def agent(run: longrun.Run) -> str:
            return "done"

        now = self.clock.now()
        for what, call in (
            ("no time zone", lambda: agent.start("t", deadline=dt.datetime(2030, 1, 1))),
            ("already passed", lambda: agent.start("t", deadline=dt.datetime.fromtimestamp(now - 1.0, tz=dt.timezone.utc))),
            ("already passed", lambda: agent.enqueue("t", deadline=dt.datetime.fromtimestamp(now, tz=dt.timezone.utc))),
            ("before delay_s", lambda: agent.enqueue("t", delay_s=60.0, deadline=dt.datetime.fromtimestamp(now + 30.0, tz=dt.timezone.utc))),
            ("timezone-aware", lambda: agent.enqueue("t", deadline="tomorrow")),
        ):
            with self.subTest(what), self.assertRaisesRegex(InvalidInputError, what):
                call()
        self.assertFalse(self._exists("t"), "nothing was recorded")

    def test_a_child_inherits_the_parents_deadline_and_a_later_one_of_its_own_is_clamped(self) -> None:
        @self.durable(deadline_s=5000.0)
        def late(run: longrun.Run) -> str:
            run.sleep("nap", 10_000.0)
            return "late"

        @self.durable(deadline_s=1000.0)
        def parent(run: longrun.Run) -> Any:
            return run.child("late-child", late)

        start = self.clock.now()
        outcome = parent.run("p")
        self.assertEqual(outcome.status, Status.WAITING_ON_CHILD)
        self.assertEqual(self.state("late-child").deadline, TaskDeadline(start + 1000.0, "parent", start), "clamped to the parent's")
        self.assertEqual(outcome.wake_at, start + 1000.0)
        self.assertEqual(self.state("late-child").status, Status.SLEEPING)
        self.clock.advance(1000.0)
        self.assertEqual(late.run("late-child").status, Status.DEADLINE_EXCEEDED, "the child stops at the inherited deadline")

    def _exists(self, task_id: str) -> bool:
        try:
            self.store.load(task_id)
        except longrun.UnknownTaskError:
            return False
        return True

    def test_a_childs_own_earlier_deadline_stands(self) -> None:
        @self.durable(deadline_s=200.0)
        def early(run: longrun.Run) -> str:
            run.sleep("nap", 10_000.0)
            return "early"

        @self.durable(deadline_s=1000.0)
        def parent(run: longrun.Run) -> Any:
            return run.child("early-child", early)

        start = self.clock.now()
        self.assertEqual(parent.run("p").status, Status.WAITING_ON_CHILD)
        self.assertEqual(self.state("early-child").deadline, TaskDeadline(start + 200.0, "limits", start))

    def test_a_child_still_running_is_cancelled_when_the_parents_deadline_passes(self) -> None:
        @self.durable()
        def worker(run: longrun.Run) -> str:
            run.sleep("nap", 10_000.0)
            return str(run.call("after", self.note, "child after"))

        @self.durable(deadline_s=100.0)
        def parent(run: longrun.Run) -> Any:
            return run.child("kid", worker)

        outcome = parent.run("p")
        self.assertEqual(outcome.status, Status.WAITING_ON_CHILD)
        self.assertEqual(self.state("kid").status, Status.SLEEPING)
        self.clock.advance(100.0)
        outcome = parent.run("p")
        self.assertEqual(outcome.status, Status.DEADLINE_EXCEEDED)
        self.assertTrue(any("children are cancelled" in item.detail and "kid" in item.detail for item in outcome.inferences))
        self.assertIsNotNone(self.store.read_cancellation("kid"), "the child's cancellation is written")
        self.clock.advance(20_000.0)
        self.assertIn(worker.run("kid").status, (Status.CANCELLED, Status.DEADLINE_EXCEEDED))
        self.assertEqual(self.calls, [], "the child started nothing after its parent's deadline")

    def test_bad_deadlines_are_refused_with_a_typed_error_and_record_nothing(self) -> None:
        with self.assertRaises(InvalidInputError):
            Limits(deadline_s=-1.0)
        with self.assertRaises(InvalidInputError):
            Limits(deadline_s=float("nan"))

        @self.durable()
        def agent(run: longrun.Run) -> str:
            return "done"

        with self.assertRaisesRegex(InvalidInputError, "no time zone"):
            agent.run("t", deadline=dt.datetime(2030, 1, 1))
        with self.assertRaises(InvalidInputError):
            agent.run("t", deadline="tomorrow")
        self.assertFalse(self._exists("t"), "nothing was recorded")

    def test_reopen_needs_more_time_and_moves_the_deadline_on_by_it(self) -> None:
        @self.durable(deadline_s=100.0)
        def agent(run: longrun.Run) -> str:
            run.sleep("nap", 300.0)
            return str(run.call("after", self.note, "after"))

        start = self.clock.now()
        self.assertEqual(agent.run("t").status, Status.SLEEPING)
        self.clock.advance(150.0)
        self.assertEqual(agent.run("t").status, Status.DEADLINE_EXCEEDED)
        with self.assertRaisesRegex(ReopenRefusedError, "needs a new deadline"):
            agent.reopen("t", "more time", by="ops")
        self.assertEqual(self.state("t").status, Status.DEADLINE_EXCEEDED, "nothing was written")
        outcome = agent.reopen("t", "more time", by="ops", add_time_s=500.0)
        state = self.state("t")
        assert state.deadline is not None
        self.assertEqual((state.deadline.at, state.deadline.source), (start + 150.0 + 500.0, "reopen"), "after the later of the old one and the reopen")
        self.assertEqual((outcome.status, outcome.wake_at), (Status.SLEEPING, start + 300.0))
        self.clock.advance(150.0)
        outcome = agent.run("t")
        self.assertEqual((outcome.status, outcome.result), (Status.DONE, "after"))
        self.assertEqual(self.calls, ["after"])

    def test_status_and_the_console_word_the_deadline_and_json_includes_it(self) -> None:
        from longrun.cli._console_pages import Console
        from longrun.cli._common import format_time
        from longrun.cli._inspect import cmd_status, render_status

        @self.durable()
        def agent(run: longrun.Run) -> str:
            run.sleep("nap", 5000.0)
            return "done"

        start = self.clock.now()
        agent.start("q", deadline=dt.datetime.fromtimestamp(start + 600.0, tz=dt.timezone.utc))
        agent.run("r", deadline=dt.datetime.fromtimestamp(start + 600.0, tz=dt.timezone.utc))
        agent.run("none")

        def status(task_id: str, now: float) -> str:
            lines = render_status(task_id, self.store.load(task_id), self.store.read_lease(task_id), now)
            return "\n".join(line for line in lines if line.startswith("  deadline"))

        queued = status("q", start + 60.0)
        self.assertIn("(asked by the caller): 9m left", queued)
        self.assertIn("(asked by the caller): passed 40m ago; the task stops deadline-exceeded when it next runs", status("r", start + 3000.0))
        self.assertEqual(status("none", start), "", "no deadline, no line")
        self.assertIn(format_time(start + 600.0), queued)
        self.clock.advance(700.0)
        self.assertEqual(agent.run("r").status, Status.DEADLINE_EXCEEDED)
        self.assertIn(": exceeded 2m ago; the task stopped deadline-exceeded", status("r", start + 720.0))
        out = io.StringIO()
        cmd_status(self.store, "STORE", "q", True, out)
        shown = json.loads(out.getvalue())["deadline_status"]
        self.assertEqual((shown["at"], shown["source"], shown["exceeded"]), (start + 600.0, "caller", False))
        self.assertIsInstance(shown["left_s"], float)
        self.assertEqual(shown["passed"], shown["left_s"] <= 0)
        out = io.StringIO()
        cmd_status(self.store, "STORE", "none", True, out)
        self.assertIsNone(json.loads(out.getvalue())["deadline_status"])
        console = Console(self.store, "store", read_only=True, approver="a", sign_key=None, control_root=None, clock=lambda: start + 60.0)
        self.assertIn("<dt>deadline</dt><dd>", console.task_page("q", {}))
        self.assertIn("9m left", console.task_page("q", {}))
        self.assertNotIn("<dt>deadline</dt>", console.task_page("none", {}))

    def test_the_status_is_terminal_and_reopenable_and_old_states_load(self) -> None:
        self.assertIn(Status.DEADLINE_EXCEEDED, TERMINAL)
        self.assertIn(Status.DEADLINE_EXCEEDED, ENDED_UNFINISHED)

        @self.durable()
        def agent(run: longrun.Run) -> str:
            return "done"

        agent.run("t")
        state = self.state("t")
        self.assertIsNone(state.deadline)
        self.assertNotIn("deadline", state.to_json(), "a state without one encodes as before")
        for bad in ({"at": "soon", "source": "limits", "recorded_at": 1.0}, {"at": 1.0, "source": "whim", "recorded_at": 1.0}, {"at": 1.0}):
            with self.assertRaises(CorruptStateError, msg=bad):
                TaskDeadline.from_json(bad)
        with self.assertRaises(InvalidInputError):
            TaskDeadline(1.0, "whim", 1.0)


class JsonFileDeadlineTests(DeadlineCases):
    pass


class SqliteDeadlineTests(DeadlineCases):
    def make_store(self) -> Store:
        store = SqliteStore(self.path("longrun.sqlite"), create=True)
        self.addCleanup(store.close)
        return store


class PostgresDeadlineTests(DeadlineCases):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        pg_support.check()

    def make_store(self) -> Store:
        schema = pg_support.Schema()
        self.addCleanup(schema.drop)
        store = PostgresStore(schema.factory())
        self.addCleanup(store.close)
        return store


class RestartCases(support.TempDirTest):
    """Each run in a process of its own (tests/helpers/deadline_child.py), the first SIGKILLed in a step."""

    def spec(self) -> str:
        return self.path("store")

    def open(self) -> Store:
        from longrun.stores import open_store

        store = open_store(self.spec())
        self.addCleanup(lambda: getattr(store, "close", lambda: None)())
        return store

    def run_child(self, later: float, deadline_s: float) -> tuple[int, Any]:
        # A process of its own, forked from the fork server (longrun imported once for all runs).
        process = run_script(CHILD, [self.spec(), "t", str(later), str(deadline_s), self.path("calls")], cwd=None, timeout=120)
        if process.returncode not in (0, -9):
            self.fail(f"the child exited {process.returncode}: {process.stderr}")
        return process.returncode, json.loads(process.stdout) if process.stdout.strip() else None

    def test_the_deadline_recorded_by_a_run_killed_in_a_step_is_kept_by_the_restart(self) -> None:
        code, _ = self.run_child(0.0, 1000.0)
        self.assertEqual(code, -9, "killed inside step 'work'")
        state = self.open().load("t").state
        assert state is not None and state.deadline is not None
        recorded = state.deadline
        self.assertEqual(recorded.source, "limits")
        # The restart (its clock 100 s on, its code asking for 5000 s) keeps the recorded deadline.
        code, outcome = self.run_child(100.0, 5000.0)
        self.assertEqual((code, outcome), (0, {"status": "sleeping", "wake_at": recorded.at}))
        state = self.open().load("t").state
        assert state is not None
        self.assertEqual(state.deadline, recorded)
        self.assertEqual(state.effects["work"].state, EffectState.VERIFIED)
        code, outcome = self.run_child(2000.0, 5000.0)
        self.assertEqual((code, outcome), (0, {"status": "deadline-exceeded", "wake_at": None}))
        with open(self.path("calls"), encoding="ascii") as handle:
            self.assertEqual(handle.read().count("work"), 2, "the killed attempt and the one that returned")


class FamilyRestartCases(support.TempDirTest):
    """A parent (``deadline_s`` 1000) and its child, each run in a process of its own
    (tests/helpers/deadline_family.py): the first process is SIGKILLed inside the child's step, the
    parent's deadline passes, and the parent stops ``deadline-exceeded`` and cancels the child."""

    spec = RestartCases.spec
    open = RestartCases.open

    def run_family(self, which: str, later: float, crash_at: str | None = None) -> tuple[int, Any]:
        base = support.child_env()
        env = {**base, "LONGRUN_CRASH_AT": crash_at} if crash_at else {k: v for k, v in base.items() if k != "LONGRUN_CRASH_AT"}
        # A process of its own, forked from the fork server (longrun imported once for all runs).
        process = run_script(FAMILY, [self.spec(), which, str(later), "1000", self.path("calls")], env=env, cwd=None, timeout=120)
        if process.returncode not in (0, -9):
            self.fail(f"the {which} process exited {process.returncode}: {process.stderr}")
        return process.returncode, json.loads(process.stdout) if process.stdout.strip() else None

    def calls(self) -> int:
        with open(self.path("calls"), encoding="ascii") as handle:
            return handle.read().count("work")

    def killed_while_the_child_runs(self) -> None:
        code, _ = self.run_family("parent", 0.0)
        self.assertEqual(code, -9, "killed inside the child's step 'work'")
        store = self.open()
        parent, kid = store.load("parent").state, store.load("kid").state
        assert parent is not None and kid is not None and parent.deadline is not None
        self.assertEqual((parent.status, kid.status), (Status.RUNNING, Status.RUNNING))
        assert kid.deadline is not None
        self.assertEqual((kid.deadline.at, kid.deadline.source), (parent.deadline.at, "parent"), "the child inherited the parent's deadline")

    def check_the_child_is_cancelled_and_starts_nothing(self) -> None:
        self.assertIsNotNone(self.open().read_cancellation("kid"), "the child's cancellation is written")
        code, outcome = self.run_family("kid", 4000.0)  # as a worker would run it: it stops, starts nothing
        self.assertEqual(code, 0)
        self.assertIn(outcome["status"], ("cancelled", "deadline-exceeded"))
        self.assertEqual(self.calls(), 1, "the killed attempt only: nothing of the child ran after the deadline")
        kid = self.open().load("kid").state
        assert kid is not None
        self.assertNotIn("after", kid.effects, "the child's next step never started")

    def test_a_deadline_reached_while_a_child_runs_stops_the_parent_and_cancels_the_child(self) -> None:
        self.killed_while_the_child_runs()
        code, outcome = self.run_family("parent", 2000.0)  # its deadline (1000 s after its start) has passed
        self.assertEqual((code, outcome["status"]), (0, "deadline-exceeded"))
        self.assertTrue(any("children are cancelled" in detail and "kid" in detail for detail in outcome["inferences"]), outcome)
        self.check_the_child_is_cancelled_and_starts_nothing()

    def test_killed_after_the_parents_stop_before_its_children_are_cancelled_the_next_run_cancels_them(self) -> None:
        self.killed_while_the_child_runs()
        code, _ = self.run_family("parent", 2000.0, crash_at="deadline.children:1")
        self.assertEqual(code, -9, "killed at deadline.children")
        store = self.open()
        parent = store.load("parent").state
        assert parent is not None
        self.assertEqual(parent.status, Status.DEADLINE_EXCEEDED, "the stop was committed")
        self.assertIsNone(store.read_cancellation("kid"), "not cancelled yet")
        code, outcome = self.run_family("parent", 3000.0)
        self.assertEqual((code, outcome["status"]), (0, "deadline-exceeded"))
        self.check_the_child_is_cancelled_and_starts_nothing()


class JsonFileFamilyRestartTests(FamilyRestartCases):
    pass


class SqliteFamilyRestartTests(FamilyRestartCases):
    def spec(self) -> str:
        return "sqlite:" + self.path("longrun.sqlite")


class PostgresFamilyRestartTests(FamilyRestartCases):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        pg_support.check()

    def setUp(self) -> None:
        super().setUp()
        self.schema = pg_support.Schema()
        self.addCleanup(self.schema.drop)

    def spec(self) -> str:
        separator = "&" if "?" in self.schema.url else "?"
        return f"{self.schema.url}{separator}options=-csearch_path%3D{self.schema.name}"


class JsonFileRestartTests(RestartCases):
    pass


class SqliteRestartTests(RestartCases):
    def spec(self) -> str:
        return "sqlite:" + self.path("longrun.sqlite")


class PostgresRestartTests(RestartCases):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        pg_support.check()

    def setUp(self) -> None:
        super().setUp()
        self.schema = pg_support.Schema()
        self.addCleanup(self.schema.drop)

    def spec(self) -> str:
        return self.schema.spec


del DeadlineCases, RestartCases, FamilyRestartCases  # only their subclasses run

if __name__ == "__main__":
    unittest.main()
