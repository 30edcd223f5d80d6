"""Events and logs: ``on_event`` after each durable transition, and the ``longrun`` logger's records."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

from helpers.support import TempDirTest

import longrun
from longrun import JsonFileStore, Limits, RunContract, RunEvent, Runner, Status, Step
from longrun.events import EVENT_KINDS
from longrun.errors import InvalidInputError
from longrun.events import LOG_FIELDS
from longrun.testing import FakeClock, OutboxAdapter, read_outbox


class JsonFormatter(logging.Formatter):
    """What an application's JSON log formatter does: the message plus the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {"level": record.levelname, "message": record.getMessage()}
        body.update({name: getattr(record, name) for name in LOG_FIELDS})
        return json.dumps(body)


class EventCase(TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.store_dir = self.path("store")
        self.outbox = self.path("outbox.jsonl")
        self.clock = FakeClock()
        self.events: list[RunEvent] = []

    def runner(self, steps: list[Step], adapter: OutboxAdapter | None = None, task_id: str = "t", **options: Any) -> Runner:
        options.setdefault("on_event", self.events.append)
        return Runner(
            RunContract(task_id, goal="report what happens"),
            steps,
            store=JsonFileStore(self.store_dir, create=True),
            adapters={"send": adapter or OutboxAdapter(self.outbox)},
            clock=self.clock,
            **options,
        )


class OnEventTests(EventCase):
    def test_each_event_comes_after_the_commit_that_made_it_durable(self) -> None:
        seen: list[tuple[RunEvent, int, str | None]] = []

        def hook(event: RunEvent) -> None:
            # A fresh store object, as another process would read it: the transition is already there.
            state = JsonFileStore(self.store_dir).load("t").state
            assert state is not None
            record = state.effects.get(event.step) if event.step is not None else None
            seen.append((event, state.revision, record.state.value if record is not None else state.status.value))

        steps = [Step("a", "send", {"n": 1}), Step("b", "send", {"n": 2}), Step("c", "send", {"n": 3})]
        self.assertIs(self.runner(steps, on_event=hook).run().status, Status.DONE)
        self.assertTrue(seen)
        for event, revision, stored in seen:
            self.assertEqual(revision, event.revision, event)
            self.assertEqual(stored, event.state, event)
        effects = [(event.step, event.state, event.attempt) for event, _, _ in seen if event.kind == "effect"]
        self.assertEqual(
            effects,
            [("a", "started", 1), ("a", "verified", 1), ("b", "started", 1), ("b", "verified", 1), ("c", "started", 1),
             ("c", "verified", 1)],
        )  # fmt: skip
        runs = [event.state for event, _, _ in seen if event.kind == "run"]
        self.assertEqual(runs, ["running", "done"])
        revisions = [event.revision for event, _, _ in seen]
        self.assertEqual(revisions, sorted(revisions))
        first = seen[0][0]
        self.assertEqual((first.task, first.time, first.epoch), ("t", self.clock.now(), 1))
        with self.assertRaises(AttributeError):
            first.state = "x"  # type: ignore[misc]

    def test_a_hook_that_raises_is_logged_and_the_run_goes_on(self) -> None:
        calls: list[RunEvent] = []

        def hook(event: RunEvent) -> None:
            calls.append(event)
            raise RuntimeError("the application's exporter is down")

        steps = [Step("a", "send", {"n": 1}), Step("b", "send", {"n": 2})]
        with self.assertLogs("longrun", logging.WARNING) as logs:
            outcome = self.runner(steps, on_event=hook).run()
        self.assertIs(outcome.status, Status.DONE)
        self.assertEqual([line["key"] for line in read_outbox(self.outbox)], ["t/a", "t/b"])
        failures = [record for record in logs.records if "on_event hook raised" in record.getMessage()]
        self.assertEqual(len(failures), len(calls))
        self.assertGreaterEqual(len(calls), 5)
        self.assertIsNotNone(failures[0].exc_info)
        self.assertIn("exporter is down", logs.output[0])

    def test_waiting_retry_and_approval_are_events(self) -> None:
        steps = [Step("a", "send", {"n": 1}), Step("b", "send", {"n": 2}, approval=True)]
        adapter = OutboxAdapter(self.outbox, fail_transient=1)
        outcome = self.runner(steps, adapter, limits=Limits(max_block_s=0.0)).run()
        self.assertIs(outcome.status, Status.RETRY_SCHEDULED)
        self.assertEqual([(e.step, e.state) for e in self.events if e.kind == "effect"], [("a", "started"), ("a", "planned")])
        self.assertIn("transient", self.events[-3].detail or "")
        self.assertEqual([(e.kind, e.state) for e in self.events[-2:]], [("run", "retry-scheduled"), ("run-end", "retry-scheduled")])
        first_epoch = self.events[0].epoch
        self.events.clear()
        self.clock.advance(3600)
        outcome = self.runner(steps, adapter).run()
        self.assertIs(outcome.status, Status.AWAITING_APPROVAL)
        self.assertEqual(
            [(e.kind, e.step, e.state) for e in self.events],
            [("run-start", None, "running"), ("effect", "a", "started"), ("run", None, "running"), ("effect", "a", "verified"),
             ("effect", "b", "planned"), ("run", None, "awaiting-approval"), ("run-end", None, "awaiting-approval")],
        )  # fmt: skip
        self.assertGreater(self.events[0].epoch, first_epoch)  # a resumed run: a later invocation

    def test_a_durable_function_reports_calls_and_effects(self) -> None:
        events: list[RunEvent] = []
        store = JsonFileStore(self.store_dir, create=True)

        @longrun.durable(store=store, adapters={"send": OutboxAdapter(self.outbox)}, clock=self.clock, on_event=events.append)
        def agent(run: longrun.Run, n: int) -> int:
            total = run.call("count", lambda: n * 2)
            run.effect("post", "send", {"total": total})
            return int(total)

        outcome = agent.run("fn-1", 21)
        self.assertIs(outcome.status, Status.DONE)
        kinds = [(event.kind, event.step, event.state) for event in events if not event.kind.startswith("run")]
        self.assertIn(("call", "count", "started"), kinds)
        self.assertIn(("call", "count", "verified"), kinds)
        self.assertIn(("effect", "post", "verified"), kinds)
        self.assertEqual(kinds[-1], ("function", "longrun.function", "verified"))
        self.assertEqual((events[-1].kind, events[-1].state), ("run-end", "done"))
        self.assertEqual(events[0].kind, "run-start")
        self.assertTrue(events[0].detail, "a run-start names who runs it")
        self.assertTrue(set(event.kind for event in events) <= set(EVENT_KINDS))

    def test_each_invocation_that_commits_is_bracketed_by_run_start_and_run_end(self) -> None:
        steps = [Step("a", "send", {"n": 1}), Step("b", "send", {"n": 2}, approval=True)]
        self.assertIs(self.runner(steps).run().status, Status.AWAITING_APPROVAL)
        self.assertIs(self.runner(steps).run().status, Status.AWAITING_APPROVAL)
        brackets = [(e.kind, e.epoch) for e in self.events if e.kind in ("run-start", "run-end")]
        self.assertEqual([kind for kind, _ in brackets], ["run-start", "run-end", "run-start", "run-end"])
        self.assertEqual(brackets[0][1], brackets[1][1])
        self.assertEqual(brackets[2][1], brackets[3][1])
        self.assertLess(brackets[0][1], brackets[2][1])
        end = self.events[-1]
        self.assertEqual((end.kind, end.time, end.detail is not None), ("run-end", self.clock.now(), True))
        # Every other event of an invocation lies between its brackets.
        starts = [i for i, e in enumerate(self.events) if e.kind == "run-start"]
        ends = [i for i, e in enumerate(self.events) if e.kind == "run-end"]
        self.assertEqual(starts[0], 0)
        self.assertEqual(ends[0] + 1, starts[1])

    def test_an_invocation_that_commits_nothing_sends_no_event(self) -> None:
        steps = [Step("a", "send", {"n": 1})]
        store = JsonFileStore(self.store_dir, create=True)
        self.assertIs(self.runner(steps).run().status, Status.DONE)
        self.events.clear()
        lease = store.acquire_lease("t", "someone else", 3600.0, self.clock.now())
        self.assertIsNotNone(lease)
        self.assertIs(self.runner(steps).run().status, Status.ALREADY_RUNNING)
        self.assertEqual(self.events, [])

    def test_on_event_must_be_callable(self) -> None:
        with self.assertRaises(InvalidInputError):
            self.runner([Step("a", "send", {})], on_event="print")  # type: ignore[arg-type]
        with self.assertRaises(InvalidInputError):
            longrun.durable(store=JsonFileStore(self.store_dir), on_event=42)(lambda run: None)  # type: ignore[arg-type]

    def test_an_event_is_json(self) -> None:
        self.runner([Step("a", "send", {"n": 1})]).run()
        for event in self.events:
            self.assertEqual(json.loads(json.dumps(event.to_json()))["revision"], event.revision)


class LoggingTests(EventCase):
    def test_a_complete_run_logs_every_transition_with_fields(self) -> None:
        steps = [Step("a", "send", {"n": 1}), Step("b", "send", {"n": 2})]
        with self.assertLogs("longrun", logging.DEBUG) as logs:
            self.runner(steps).run()
        info = [record for record in logs.records if record.levelno == logging.INFO]
        moves = [(record.step, record.state) for record in info if record.step is not None]  # type: ignore[attr-defined]
        self.assertEqual(
            moves,
            [(step, state) for step in "ab" for state in ("planned", "started", "acknowledged", "verified")],
        )
        self.assertIn("run started", info[0].getMessage())
        self.assertIn("run stopped done", info[-1].getMessage())
        self.assertEqual(info[-1].state, "done")  # type: ignore[attr-defined]
        started = next(record for record in info if record.state == "started")  # type: ignore[attr-defined]
        self.assertEqual((started.task, started.key, started.attempt, started.epoch), ("t", "t/a", 1, 1))  # type: ignore[attr-defined]
        debug = [record for record in logs.records if record.levelno == logging.DEBUG]
        self.assertTrue(any("lease on t acquired" in record.getMessage() for record in debug))
        commits = [record.revision for record in debug if "committed" in record.getMessage()]  # type: ignore[attr-defined]
        self.assertEqual(commits, list(range(1, len(commits) + 1)))
        for record in logs.records:  # every record, whichever module logged it, has every field
            for name in LOG_FIELDS:
                self.assertTrue(hasattr(record, name), (name, record.getMessage()))

    def test_a_json_formatter_gets_the_fields(self) -> None:
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        handler.setFormatter(JsonFormatter())
        logger = logging.getLogger("longrun")
        logger.addHandler(handler)
        level = logger.level
        logger.setLevel(logging.DEBUG)
        try:
            self.runner([Step("a", "send", {"n": 1})]).run()
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
        verified = [line for line in lines if line["state"] == "verified"]
        self.assertEqual(len(verified), 1)
        self.assertEqual((verified[0]["task"], verified[0]["step"], verified[0]["attempt"]), ("t", "a", 1))
        self.assertTrue(all(set(LOG_FIELDS) <= line.keys() for line in lines))

    def test_a_retry_with_no_error_recorded_says_what_was_observed_not_none(self) -> None:
        # Acknowledged, then observed unknown at a deduplicating target: sent again, with no error to name.
        adapter = OutboxAdapter(self.outbox, deduplicates=True, unknown_observations=2)  # before and after the apply
        with self.assertLogs("longrun", logging.INFO) as logs:
            self.runner([Step("a", "send", {"n": 1})], adapter, limits=Limits(max_block_s=0.0)).run()
        retry = [record.getMessage() for record in logs.records if record.step == "a" and record.state == "retry-scheduled"]  # type: ignore[attr-defined]
        self.assertEqual(len(retry), 1)
        self.assertIn("retry scheduled (attempt 1 observed: outbox briefly unreadable for t/a; next attempt at 2023-11-14T22:13:20Z)", retry[0])
        self.assertNotIn("None", retry[0])

    def test_a_retry_and_an_unsafe_stop(self) -> None:
        with self.assertLogs("longrun", logging.INFO) as logs:
            self.runner([Step("a", "send", {"n": 1})], OutboxAdapter(self.outbox, fail_transient=1), limits=Limits(max_block_s=0.0)).run()
        retry = [record for record in logs.records if record.step == "a" and record.state == "retry-scheduled"]  # type: ignore[attr-defined]
        self.assertEqual(len(retry), 1)
        self.assertIn("retry scheduled (attempt 1 failed: transient", retry[0].getMessage())
        adapter = OutboxAdapter(self.path("other.jsonl"), raise_after_apply={"b"}, unobservable={"b"})
        with self.assertLogs("longrun", logging.INFO) as logs:
            outcome = self.runner([Step("b", "send", {"n": 2})], adapter, task_id="u").run()
        self.assertIs(outcome.status, Status.UNSAFE_TO_CONTINUE)
        stop = logs.records[-1]
        self.assertEqual((stop.levelno, stop.state), (logging.INFO, "unsafe-to-continue"))  # type: ignore[attr-defined]
        self.assertTrue(any(record.state == "uncertain" for record in logs.records))  # type: ignore[attr-defined]

