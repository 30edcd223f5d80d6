"""What a run records about itself (``longrun.telemetry``): ``run.progress`` and the effect latency.

Progress is state, not a step: it rides on the next commit or commits at most once a second, it
survives a restart, and replay is the same with or without it. The store-dependent cases run on the
JSON-file store, SQLite and PostgreSQL (when ``LONGRUN_TEST_POSTGRES_DSN`` is set).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from typing import Any

from helpers import pg_support, support

import longrun
from longrun import EffectRequest, JsonFileStore, PostgresStore, Receipt, SqliteStore, Status, Store
from longrun.cli import main
from longrun.envelope import RunState, decode, encode
from longrun.errors import CorruptStateError, InvalidInputError
from longrun.progress import progress_of
from longrun.telemetry import LATENCY_BOUNDS, MAX_NOTE_CHARS, RATE_SPAN_S, EffectLatency, ProgressReport
from longrun.testing import FakeClock, OutboxAdapter


class CountingStore:
    """A store wrapper that counts commits (and passes everything else through)."""

    def __init__(self, store: Store):
        self.inner = store
        self.commits = 0

    def commit(self, *args: Any, **kwargs: Any) -> int:
        self.commits += 1
        return self.inner.commit(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class ProgressCase(support.TempDirTest):
    def make_store(self) -> Store:
        return JsonFileStore(self.path("store"), create=True)

    def setUp(self) -> None:
        super().setUp()
        self.clock = FakeClock()
        self.store = self.make_store()
        self.outbox = OutboxAdapter(self.path("outbox.jsonl"))

    def durable(self, store: Any = None, **options: Any) -> Any:
        settings: dict[str, Any] = dict(
            store=store if store is not None else self.store, clock=self.clock, adapters={"mail.send": self.outbox},
            allowed_actions=("mail.send",),
        )  # fmt: skip
        settings.update(options)
        return longrun.durable(**settings)

    def state(self, task_id: str, store: Store | None = None) -> RunState:
        state = (store or self.store).load(task_id).state
        assert state is not None
        return state


class StoreCases(ProgressCase):
    def test_progress_rides_on_the_next_commit_and_commits_by_itself_at_most_once_a_second(self) -> None:
        counting = CountingStore(self.store)
        clock = self.clock
        seen: list[tuple[int, int]] = []

        @self.durable(store=counting)
        def work(run: longrun.Run, n: int) -> int:
            run.effect("first", "mail.send", {"n": 0})
            before = counting.commits
            for i in range(1, 6):
                run.progress(i, n, f"item {i}")  # no time passes: no commit of its own
            seen.append((before, counting.commits))
            clock.advance(1.0)
            run.progress(6, n, "item 6")  # the last commit is a second old: this one commits
            seen.append((before, counting.commits))
            run.progress(7, n)  # right after a commit: rides on the next one
            seen.append((before, counting.commits))
            return n

        self.assertIs(work.run("w-1", 10).status, Status.DONE)
        self.assertEqual(seen, [(seen[0][0], seen[0][0]), (seen[0][0], seen[0][0] + 1), (seen[0][0], seen[0][0] + 1)])
        report = self.state("w-1").progress
        assert report is not None
        self.assertEqual((report.done, report.total, report.note), (7, 10, None))  # the stop carried the last one

    def test_progress_survives_a_restart_and_leaves_replay_as_it_was(self) -> None:
        calls: list[str] = []

        def make(report: bool) -> Any:
            @self.durable()  # the same qualified name both times: the same function, as a restarted process has
            def job(run: longrun.Run, n: int) -> int:
                for i in range(n):
                    if report:
                        run.progress(i, n, "sending")
                    calls.append(f"step {i}")
                    run.effect(f"mail-{i}", "mail.send", {"i": i}, approval=(i == 2))
                return n

            return job

        first = make(True)
        self.assertIs(first.run("job-1", 4).status, Status.AWAITING_APPROVAL)
        stopped = self.state("job-1")
        report = stopped.progress
        assert report is not None
        self.assertEqual((report.done, report.total, report.note), (2, 4, "sending"))
        digest, records = stopped.plan_digest, {step: record.payload_digest for step, record in stopped.effects.items()}
        self.assertEqual(self.state("job-1", self.reload()).progress, report)  # a new handle: what another process reads
        request = stopped.approval_requests["mail-2"]
        approval = longrun.Approval.for_request(request, approval_id="ap-1", approver="t", granted_at=self.clock.now(), expires_at=self.clock.now() + 60)
        self.store.write_approval(approval)
        second = make(False)  # the same function without progress: the same plan, the same records
        outcome = second.run("job-1", 4)
        self.assertIs(outcome.status, Status.DONE, outcome.next_action)
        done = self.state("job-1")
        self.assertEqual(done.plan_digest, digest)
        self.assertEqual({step: done.effects[step].payload_digest for step in records}, records)
        self.assertEqual(done.progress, report)  # kept as last reported
        self.assertEqual([record.attempts for step, record in done.effects.items() if step.startswith("mail-")], [1, 1, 1, 1])

    def test_an_async_function_awaits_its_progress(self) -> None:
        @self.durable()
        async def job(run: longrun.AsyncRun, n: int) -> int:
            for i in range(n):
                await run.progress(i + 1, n)
                self.clock.advance(1.0)
                await run.effect(f"mail-{i}", "mail.send", {"i": i})
            return n

        outcome = asyncio.run(job.arun("a-1", 3))
        self.assertIs(outcome.status, Status.DONE)
        report = self.state("a-1").progress
        assert report is not None
        self.assertEqual((report.done, report.total), (3, 3))
        self.assertAlmostEqual(report.rate or 0.0, 1.0)

    def test_the_effect_latency_is_measured_from_the_start_even_across_a_restart(self) -> None:
        clock = self.clock
        outbox = self.outbox

        class Slow(OutboxAdapter):
            crash = True

            def apply(self, request: EffectRequest) -> Receipt:
                clock.advance(3.0)
                receipt = outbox.apply(request)
                if Slow.crash:
                    Slow.crash = False
                    raise KeyboardInterrupt  # the process dies after the target took it: recovered by the next run
                return receipt

            def observe(self, request: EffectRequest) -> Any:
                return outbox.observe(request)

        @self.durable(adapters={"mail.send": Slow(self.path("unused.jsonl"))})
        def job(run: longrun.Run) -> None:
            run.effect("slow", "mail.send", {"n": 1})

        with self.assertRaises(KeyboardInterrupt):
            job.run("l-1")
        self.assertEqual(self.state("l-1").effects["slow"].state.value, "started")
        clock.advance(60.0)  # the restart comes a minute later; observing finds it applied
        self.assertIs(job.run("l-1").status, Status.DONE)
        latency = self.state("l-1").effect_latency
        assert latency is not None
        self.assertEqual(latency.count("mail.send"), 1)
        self.assertAlmostEqual(latency.sums["mail.send"], 63.0, places=3)  # from the recorded start
        self.assertEqual(latency.counts["mail.send"][LATENCY_BOUNDS.index(300.0)], 1)

    def test_latencies_reach_the_state_at_most_once_a_second_and_all_of_them_with_the_stop(self) -> None:
        clock = self.clock
        seen: list[int] = []

        def committed() -> int:
            latency = self.state("f-1").effect_latency
            return latency.count("mail.send") if latency is not None else 0

        @self.durable()
        def job(run: longrun.Run) -> None:
            run.effect("a", "mail.send", {"n": 1})
            run.effect("b", "mail.send", {"n": 2})
            seen.append(committed())  # two verified, no time passed: noted, not yet in the state
            clock.advance(1.0)
            run.effect("c", "mail.send", {"n": 3})  # its verification is a second later: all three taken in
            run.effect("d", "mail.send", {"n": 4})  # its start's commit carries them
            seen.append(committed())
            run.effect("e", "mail.send", {"n": 5})

        self.assertIs(job.run("f-1").status, Status.DONE)
        self.assertEqual(seen, [0, 3])
        self.assertEqual(committed(), 5)  # the stop's commit carries the last ones

    def test_watch_ls_and_status_show_the_reported_progress_with_rate_and_time_left(self) -> None:
        @self.durable()
        def job(run: longrun.Run) -> None:
            run.progress(100, 1000, "importing rows")
            self.clock.advance(10.0)
            run.progress(300, 1000, "importing rows")
            run.effect("gate", "mail.send", {"n": 1}, approval=True)

        job.run("p-1")
        spec = self.spec()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(main(["ls", spec]), 0)
        self.assertIn("300/1000 (30%), 20/s, about 35.0s left", out.getvalue())
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(main(["ls", spec, "--json"]), 0)
        [entry] = json.loads(out.getvalue())
        reported = entry["progress"]["reported"]
        self.assertEqual((reported["done"], reported["total"], reported["rate"], reported["eta_s"]), (300, 1000, 20.0, 35.0))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["status", spec, "p-1"])
        self.assertIn("reported     300/1000 (30%), 20/s, about 35.0s left: importing rows", out.getvalue())
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["watch", spec, "p-1"])
        self.assertIn("reported 300/1000 (30%), 20/s, about 35.0s left: importing rows", out.getvalue())

    def reload(self) -> Store:
        return JsonFileStore(self.path("store"))

    def spec(self) -> str:
        return self.path("store")


class JsonFileStoreTests(StoreCases):
    pass


class SqliteStoreTests(StoreCases):
    def make_store(self) -> Store:
        store = SqliteStore(self.path("longrun.sqlite"), create=True)
        self.addCleanup(store.close)
        return store

    def reload(self) -> Store:
        store = SqliteStore(self.path("longrun.sqlite"))
        self.addCleanup(store.close)
        return store

    def spec(self) -> str:
        return "sqlite:" + self.path("longrun.sqlite")


class PostgresStoreTests(StoreCases):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        pg_support.check()

    def make_store(self) -> Store:
        self.schema = pg_support.Schema()
        self.addCleanup(self.schema.drop)
        store = PostgresStore(self.schema.factory())
        self.addCleanup(store.close)
        return store

    def reload(self) -> Store:
        store = PostgresStore(self.schema.factory())
        self.addCleanup(store.close)
        return store

    def spec(self) -> str:
        self.skipTest("the command line opens a PostgreSQL store by URL, without the test's schema")


del StoreCases  # only its subclasses run


class RecordTests(ProgressCase):
    """The records themselves: the rate, the schema both ways, old states."""

    def test_the_rate_is_measured_between_two_points_the_earlier_moving_up_after_a_span(self) -> None:
        report = ProgressReport.first(0, 100, None, 1000.0)
        self.assertIsNone(report.rate)
        self.assertIsNone(report.eta_s)
        report = report.then(10, 100, None, 1001.0)
        self.assertEqual((report.since_done, report.since_at), (0, 1000.0))
        self.assertAlmostEqual(report.rate or 0.0, 10.0)
        self.assertAlmostEqual(report.eta_s or 0.0, 9.0)
        report = report.then(20, 100, None, 1001.0 + RATE_SPAN_S)  # the latest point is now old enough
        self.assertEqual((report.since_done, report.since_at), (10, 1001.0))
        self.assertAlmostEqual(report.rate or 0.0, 10.0 / RATE_SPAN_S)
        restarted = report.then(5, 100, "second pass", 2000.0)  # counting down: a new measure
        self.assertIsNone(restarted.rate)
        self.assertEqual(restarted.label(), "5/100")
        self.assertEqual(ProgressReport.first(2.5, None, None, 0.0).label(), "2.5")
        self.assertEqual(ProgressReport.first(3, 0, None, 0.0).fraction, 1.0)

    def test_bad_progress_is_refused_with_a_typed_error_and_nothing_recorded(self) -> None:
        for done, total, note in ((-1, None, None), (True, None, None), (1, -5, None), (float("nan"), None, None), (1, None, "x" * (MAX_NOTE_CHARS + 1)), ("3", None, None), (1, None, 5)):
            clock = self.clock

            @self.durable()
            def job(run: longrun.Run) -> None:
                run.effect("first", "mail.send", {"n": 1})
                clock.advance(5.0)
                run.progress(done, total, note)  # type: ignore[arg-type]

            task = f"bad-{abs(hash((done, total, note))) % 10**8}"
            with self.assertRaises(InvalidInputError, msg=(done, total, note)):
                job.run(task)
            self.assertIsNone(self.state(task).progress)

    def test_a_state_without_them_encodes_as_before_and_bad_ones_do_not_load(self) -> None:
        @self.durable()
        def job(run: longrun.Run) -> None:
            run.progress(1, 2, "half")
            run.effect("first", "mail.send", {"n": 1})

        job.run("s-1")
        state = self.state("s-1")
        assert state.progress is not None and state.effect_latency is not None
        self.assertEqual(decode(encode(state)).progress, state.progress)
        self.assertEqual(decode(encode(state)).effect_latency, state.effect_latency)
        state.progress = state.effect_latency = None
        body = state.to_json()
        self.assertNotIn("progress", body)
        self.assertNotIn("effect_latency", body)
        for bad in ({"done": -1, "total": None, "note": None, "at": 0}, {"done": 1, "at": 0, "since_done": 1}, {"done": 1, "at": 0, "extra": 1}, []):
            with self.assertRaises(CorruptStateError, msg=bad):
                ProgressReport.from_json(bad)
        for bad_latency in (
            {"bounds": [1, 0.5], "actions": {}},
            {"bounds": [1], "actions": {"a": {"counts": [1], "sum": 0}}},
            {"bounds": [1], "actions": {"a": {"counts": [1, -1], "sum": 0}}},
            {"bounds": [1], "actions": {"a": {"counts": [1, 1], "sum": -2}}},
        ):
            with self.assertRaises(CorruptStateError, msg=bad_latency):
                EffectLatency.from_json(bad_latency)
        latency = EffectLatency().observed("a", 0.2).observed("a", 7200.0)
        self.assertEqual(EffectLatency.from_json(json.loads(json.dumps(latency.to_json()))), latency)
        self.assertEqual(latency.counts["a"][-1], 1)  # above the largest bound
        self.assertEqual(progress_of(self.state("s-1")).to_json()["reported"]["note"], "half")  # type: ignore[index]
