"""Metrics (``longrun.metrics``): collected from a store built for the test, rendered in the
Prometheus text format and read back with ``prometheus_client``'s parser (test-only; the parser
tests skip without it, or fail with ``LONGRUN_REQUIRE_PROMETHEUS=1``); served by ``longrun
metrics``, the console's ``/metrics`` and ``longrun worker --metrics-port``.

Every store-dependent case runs on the JSON-file store, SQLite and PostgreSQL (when
``LONGRUN_TEST_POSTGRES_DSN`` is set).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any
from unittest import mock

from helpers import pg_support, support
from helpers.fleet_support import TASKS_DIR, fleet_env
from helpers.optional import installed, skip_or_fail

import longrun
from longrun import EffectRequest, JsonFileStore, PermanentError, PostgresStore, Receipt, RetryPolicy, SqliteStore, Status, Store
from longrun.cli import main
from longrun.metrics import DURATION_BOUNDS, FAILED_STATUSES, LEDGER_FAMILIES, MetricsSnapshot, collect, failure_of, render
from longrun.stores.queue import open_queue
from longrun.telemetry import LATENCY_BOUNDS
from longrun.testing import FakeClock, OutboxAdapter

NOW_OFFSET_S = 100.0
"""How long after the last run the test collects (the pending requests' age)."""


def parse(text: str) -> dict[str, Any]:
    """The families ``prometheus_client``'s parser reads from ``text``, by name."""
    if not installed("prometheus_client"):
        skip_or_fail("LONGRUN_REQUIRE_PROMETHEUS", "prometheus_client is not installed (pip install prometheus_client)")
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(families: dict[str, Any], family: str, name: str, **labels: str) -> float | None:
    for item in families[family].samples:
        if item.name == name and item.labels == labels:
            return float(item.value)
    return None


class SlowOutbox(OutboxAdapter):
    """An outbox whose apply takes ``apply_s`` by the test's clock (the effect latency)."""

    def __init__(self, path: str, clock: FakeClock, apply_s: float, **options: Any):
        super().__init__(path, **options)
        self.clock = clock
        self.apply_s = apply_s

    def apply(self, request: EffectRequest) -> Receipt:
        self.clock.advance(self.apply_s)
        return super().apply(request)


class Broken(OutboxAdapter):
    """Applies, then raises as a flaky client does: the outcome is known only by observing."""

    def apply(self, request: EffectRequest) -> Receipt:
        super().apply(request)
        raise ConnectionError("connection reset after the request was sent")


class MetricsCase(support.TempDirTest):
    """A store with one task of each kind the metrics count (``build``), and what they must say."""

    def make_store(self) -> Store:
        return JsonFileStore(self.path("store"), create=True)

    def setUp(self) -> None:
        super().setUp()
        self.clock = FakeClock()
        self.store = self.make_store()

    def durable(self, **options: Any) -> Any:
        settings: dict[str, Any] = dict(
            store=self.store, clock=self.clock, allowed_actions=("mail.send", "note.write"),
            retry=RetryPolicy(base_delay_s=0.0, max_delay_s=0.0, jitter=0.0),
        )  # fmt: skip
        settings.update(options)
        return longrun.durable(**settings)

    def build(self) -> None:
        """Five tasks: done (3 mails, each apply 2 s, the first tried twice, the run 12 s), awaiting approval with reported
        progress, awaiting an answer, blocked on a PermanentError, done after an apply that raised."""
        clock = self.clock
        slow = SlowOutbox(self.path("slow.jsonl"), clock, 2.0, fail_transient=1)

        @self.durable(adapters={"mail.send": slow})
        def deliver(run: longrun.Run, n: int) -> int:
            for i in range(n):
                run.effect(f"mail-{i}", "mail.send", {"i": i})
            clock.advance(4.0)
            return n

        self.assertIs(deliver.run("done-1", 3).status, Status.DONE)

        @self.durable(adapters={"mail.send": OutboxAdapter(self.path("gated.jsonl"))})
        def gated(run: longrun.Run) -> None:
            run.progress(10, 40, "importing")
            clock.advance(2.0)
            run.effect("first", "mail.send", {"n": 1})
            run.progress(20, 40, "importing")
            run.effect("second", "mail.send", {"n": 2}, approval=True)

        self.assertIs(gated.run("gated-1").status, Status.AWAITING_APPROVAL)
        self.asked_at = clock.now()

        @self.durable()
        def ask(run: longrun.Run) -> Any:
            return run.ask("which", "which one?", choices=["a", "b"])

        clock.advance(10.0)
        self.assertIs(ask.run("ask-1").status, Status.AWAITING_INPUT)

        @self.durable(adapters={"note.write": OutboxAdapter(self.path("permanent.jsonl"), fail_permanent=True)})
        def refused(run: longrun.Run) -> None:
            run.effect("note", "note.write", {"text": "x"})

        self.assertIs(refused.run("blocked-1").status, Status.BLOCKED)

        @self.durable(adapters={"mail.send": Broken(self.path("broken.jsonl"))})
        def flaky(run: longrun.Run) -> None:
            run.effect("mail", "mail.send", {"to": "a"})

        with self.assertLogs("longrun", "WARNING"):  # the apply that raised is logged
            self.assertIs(flaky.run("flaky-1").status, Status.DONE)
        self.names = {
            "deliver": deliver.name, "gated": gated.name, "ask": ask.name, "refused": refused.name, "flaky": flaky.name,
        }  # fmt: skip
        self.now = clock.now() + NOW_OFFSET_S

    def check(self, families: dict[str, Any]) -> None:
        """What the store built by ``build`` must show, as parsed from the text."""
        names = self.names
        for name, family in families.items():
            self.assertTrue(family.documentation, f"{name} has HELP")
            self.assertIn(family.type, ("gauge", "counter", "histogram"), name)
        self.assertEqual(sample(families, "longrun_tasks", "longrun_tasks", status="done", function=names["deliver"]), 1)
        self.assertEqual(sample(families, "longrun_tasks", "longrun_tasks", status="done", function=names["flaky"]), 1)
        self.assertEqual(sample(families, "longrun_tasks", "longrun_tasks", status="awaiting-approval", function=names["gated"]), 1)
        self.assertEqual(sample(families, "longrun_tasks", "longrun_tasks", status="awaiting-input", function=names["ask"]), 1)
        self.assertEqual(sample(families, "longrun_tasks", "longrun_tasks", status="blocked", function=names["refused"]), 1)
        self.assertEqual(sum(item.value for item in families["longrun_tasks"].samples), 5)
        failed = families["longrun_tasks_failed"].samples
        self.assertEqual([(item.labels, item.value) for item in failed], [({"function": names["refused"], "error_type": "PermanentError"}, 1.0)])
        steps = families["longrun_step_failures"]
        self.assertEqual(steps.type, "counter")
        self.assertEqual([(item.labels, item.value) for item in steps.samples], [({"function": names["refused"], "error_type": "PermanentError"}, 1.0)])
        # Counters, from the ledgers: 3 + 1 (gated) + 1 (flaky) mails verified, one more attempt
        # (a transient failure, retried); the flaky one known by observation only; the permanent
        # failure applied once, verified never.
        self.assertEqual(families["longrun_effects_applied"].type, "counter")
        self.assertEqual(sample(families, "longrun_effects_applied", "longrun_effects_applied_total", action="mail.send"), 6)
        self.assertEqual(sample(families, "longrun_effects_verified", "longrun_effects_verified_total", action="mail.send"), 5)
        self.assertEqual(sample(families, "longrun_effects_uncertain", "longrun_effects_uncertain_total", action="mail.send"), 1)
        self.assertEqual(sample(families, "longrun_effects_retried", "longrun_effects_retried_total", action="mail.send"), 1)
        self.assertEqual(sample(families, "longrun_effects_applied", "longrun_effects_applied_total", action="note.write"), 1)
        self.assertEqual(sample(families, "longrun_effects_verified", "longrun_effects_verified_total", action="note.write"), 0)
        self.assertEqual(sample(families, "longrun_effects", "longrun_effects", action="note.write", state="failed"), 1)
        self.assertEqual(sample(families, "longrun_effects", "longrun_effects", action="mail.send", state="planned"), 1)
        # Pending: one approval (asked at asked_at), one question (asked 10 s later).
        pending = "longrun_pending_requests"
        self.assertEqual(sample(families, pending, pending, kind="approval"), 1)
        self.assertEqual(sample(families, pending, pending, kind="question"), 1)
        oldest = "longrun_pending_request_oldest_age_seconds"
        approval_age = sample(families, oldest, oldest, kind="approval")
        assert approval_age is not None
        self.assertAlmostEqual(approval_age, self.now - self.asked_at, places=3)
        question_age = sample(families, oldest, oldest, kind="question")
        assert question_age is not None
        self.assertAlmostEqual(approval_age - question_age, 10.0, places=3)
        # Reported progress of the unfinished task: 10 -> 20 of 40 over 2 s: 5/s, 4 s left.
        labels = {"task": "gated-1", "function": names["gated"]}
        self.assertEqual(sample(families, "longrun_task_progress_done", "longrun_task_progress_done", **labels), 20)
        self.assertEqual(sample(families, "longrun_task_progress_total", "longrun_task_progress_total", **labels), 40)
        rate = sample(families, "longrun_task_progress_rate", "longrun_task_progress_rate", **labels)
        assert rate is not None
        self.assertAlmostEqual(rate, 5.0, places=6)
        left = sample(families, "longrun_task_progress_remaining_seconds", "longrun_task_progress_remaining_seconds", **labels)
        assert left is not None
        self.assertAlmostEqual(left, 4.0, places=6)
        # Latency: the three slow mails took 2 s each (bucket le=2.5, not le=1).
        latency = "longrun_effect_latency_seconds"
        self.assertEqual(families[latency].type, "histogram")
        self.assertEqual(sample(families, latency, latency + "_bucket", action="mail.send", le="1"), 2)  # gated's, flaky's: 0 s
        self.assertEqual(sample(families, latency, latency + "_bucket", action="mail.send", le="2.5"), 5)
        self.assertEqual(sample(families, latency, latency + "_bucket", action="mail.send", le="+Inf"), 5)
        self.assertEqual(sample(families, latency, latency + "_count", action="mail.send"), 5)
        total = sample(families, latency, latency + "_sum", action="mail.send")
        assert total is not None
        self.assertAlmostEqual(total, 6.0, places=3)
        # Run duration: deliver took 4 x 2 s + 4 s; refused (blocked) ended at once.
        duration = "longrun_run_duration_seconds"
        self.assertEqual(sample(families, duration, duration + "_bucket", function=names["deliver"], le="5"), 0)
        self.assertEqual(sample(families, duration, duration + "_bucket", function=names["deliver"], le="15"), 1)
        deliver_total = sample(families, duration, duration + "_sum", function=names["deliver"])
        assert deliver_total is not None
        self.assertAlmostEqual(deliver_total, 12.0, places=3)
        self.assertEqual(sample(families, duration, duration + "_count", function=names["refused"]), 1)
        self.assertIsNone(sample(families, duration, duration + "_count", function=names["gated"]))  # not ended
        self.assertEqual(sample(families, "longrun_collect_errors", "longrun_collect_errors"), 0)


class StoreCases(MetricsCase):
    def test_the_text_parses_and_says_what_the_store_holds(self) -> None:
        self.build()
        snapshot = collect(self.store, now=self.now)
        text = render(snapshot)
        self.check(parse(text))
        for name in ("longrun_tasks", "longrun_effects_applied_total", "longrun_effect_latency_seconds"):
            self.assertIn(f"# HELP {name} ", text)
        self.assertIn("# TYPE longrun_effects_applied_total counter", text)
        self.assertEqual(snapshot.value("longrun_effects_applied_total", action="mail.send"), 6)

    def test_from_the_summaries_the_same_families_without_the_ledgers_loading_only_what_they_need(self) -> None:
        self.build()
        full = collect(self.store, now=self.now)
        store_type = type(self.store)
        real_load = store_type.load
        loaded: list[str] = []

        def load(store: Any, task_id: str, *args: Any, **kwargs: Any) -> Any:
            loaded.append(task_id)
            return real_load(store, task_id, *args, **kwargs)

        with mock.patch.object(store_type, "load", load):
            brief = collect(self.store, now=self.now, ledgers=False)
        self.assertEqual(sorted(loaded), ["ask-1", "blocked-1", "gated-1"], "the ended tasks are read from their summaries")
        kept = [family for family in full.families if family.name not in LEDGER_FAMILIES]
        self.assertEqual([family.name for family in brief.families], [family.name for family in kept])
        for ours, theirs in zip(brief.families, kept):
            self.assertEqual(sorted(map(repr, ours.samples)), sorted(map(repr, theirs.samples)), ours.name)
        self.assertIsNone(brief.value("longrun_effects_applied_total", action="mail.send"))

    def test_the_counters_are_the_same_from_another_process_and_after_a_restart(self) -> None:
        self.build()
        here = render(collect(self.store, now=self.now))
        reopened = self.reopen()
        again = render(collect(reopened, now=self.now))
        self.assertEqual(here, again)

    def test_the_fleet_queue_depth_lag_and_workers(self) -> None:
        self.build()
        queue = open_queue(self.store)
        self.addCleanup(queue.close)
        queue.enqueue("queued-1", "jobs:one")
        queue.enqueue("queued-2", "jobs:one")
        queue.heartbeat("w-1", host="h", pid=1, state="running", concurrency=4, running=3, functions=["jobs:one"], heartbeat_s=60.0)
        queue.heartbeat("w-2", host="h", pid=2, state="stopped", concurrency=4, running=0, functions=["jobs:one"], heartbeat_s=60.0)
        time.sleep(0.05)  # a due time in the past, by the database's clock
        families = parse(render(collect(self.store, queue, now=self.now)))
        self.assertEqual(sample(families, "longrun_queue_depth", "longrun_queue_depth", function="jobs:one"), 2)
        lag = sample(families, "longrun_queue_lag_seconds", "longrun_queue_lag_seconds", function="jobs:one")
        assert lag is not None
        self.assertGreater(lag, 0.0)
        self.assertEqual(sample(families, "longrun_workers_alive", "longrun_workers_alive"), 1)
        self.assertEqual(sample(families, "longrun_workers_known", "longrun_workers_known"), 2)
        self.assertEqual(sample(families, "longrun_worker_tasks_held", "longrun_worker_tasks_held", worker="w-1"), 3)
        self.assertIsNone(sample(families, "longrun_worker_tasks_held", "longrun_worker_tasks_held", worker="w-2"))
        claims = queue.claim("w-1", ["jobs:one"], 1, 60.0)
        self.assertEqual(len(claims), 1)
        families = parse(render(collect(self.store, queue, now=self.now)))
        self.assertEqual(sample(families, "longrun_queue_depth", "longrun_queue_depth", function="jobs:one"), 1)

    def reopen(self) -> Store:
        return JsonFileStore(self.path("store"))


class JsonFileStoreMetricsTests(StoreCases):
    def test_longrun_metrics_prints_the_same_text_and_json(self) -> None:
        self.build()
        out, err = io.StringIO(), io.StringIO()
        with contextlib_redirect(out, err):
            code = main(["metrics", self.path("store")])
        self.assertEqual(code, 0, err.getvalue())
        families = parse(out.getvalue())
        self.assertEqual(sample(families, "longrun_effects_applied", "longrun_effects_applied_total", action="mail.send"), 6)
        self.assertEqual(sample(families, "longrun_tasks", "longrun_tasks", status="blocked", function=self.names["refused"]), 1)
        out = io.StringIO()
        with contextlib_redirect(out, io.StringIO()):
            self.assertEqual(main(["metrics", "--json", self.path("store")]), 0)
        document = json.loads(out.getvalue())
        [tasks] = [family for family in document["families"] if family["name"] == "longrun_tasks"]
        self.assertEqual(sum(item["value"] for item in tasks["samples"]), 5)
        out = io.StringIO()
        with contextlib_redirect(out, io.StringIO()):
            self.assertEqual(main(["metrics", "--summaries", self.path("store")]), 0)
        families = parse(out.getvalue())
        self.assertEqual(sample(families, "longrun_tasks", "longrun_tasks", status="blocked", function=self.names["refused"]), 1)
        self.assertNotIn("longrun_effects_applied", families, "only every ledger says it")
        with contextlib_redirect(io.StringIO(), err := io.StringIO()):
            self.assertEqual(main(["metrics", self.path("no-such-store")]), 2)
        self.assertIn("longrun metrics: error:", err.getvalue())

    def test_the_console_serves_metrics_behind_its_token(self) -> None:
        from longrun.cli._console import start_console

        self.build()
        server = start_console(self.store, self.path("store"), approver="tester", read_only=True)
        self.addCleanup(server.server_close)
        import threading

        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.addCleanup(server.shutdown)
        port, token = server.server_address[1], server.console.token
        base = f"http://127.0.0.1:{port}/metrics"
        with self.assertRaises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base, timeout=30)
        self.assertEqual(refused.exception.code, 403)
        for request in (
            urllib.request.Request(f"{base}?token={token}"),
            urllib.request.Request(base, headers={"Authorization": f"Bearer {token}"}),
        ):
            with urllib.request.urlopen(request, timeout=30) as response:
                self.assertEqual(response.status, 200)
                self.assertTrue(response.headers["Content-Type"].startswith("text/plain; version=0.0.4"))
                families = parse(response.read().decode("utf-8"))
            self.assertEqual(sample(families, "longrun_effects_verified", "longrun_effects_verified_total", action="mail.send"), 5)
        with self.assertRaises(urllib.error.HTTPError) as wrong:
            urllib.request.urlopen(urllib.request.Request(base, headers={"Authorization": "Bearer nope"}), timeout=30)
        self.assertEqual(wrong.exception.code, 403)

    def test_a_damaged_task_is_counted_not_fatal(self) -> None:
        self.build()
        state_dir = self.path("store", "ask-1")
        for name in os.listdir(state_dir):
            if name.startswith(("state", "journal", "snapshot")):
                with open(os.path.join(state_dir, name), "r+b") as handle:
                    handle.seek(5)
                    handle.write(b"\x00garbage\x00")
        families = parse(render(collect(JsonFileStore(self.path("store")), now=self.now)))
        self.assertEqual(sample(families, "longrun_collect_errors", "longrun_collect_errors"), 1)
        damaged = [item for item in families["longrun_tasks"].samples if item.labels["status"] in ("DAMAGED", "UNREADABLE")]
        self.assertEqual(sum(item.value for item in damaged), 1)


def contextlib_redirect(out: io.StringIO, err: io.StringIO) -> Any:
    import contextlib

    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(out))
    stack.enter_context(contextlib.redirect_stderr(err))
    return stack


class SqliteStoreMetricsTests(StoreCases):
    def make_store(self) -> Store:
        store = SqliteStore(self.path("longrun.sqlite"), create=True)
        self.addCleanup(store.close)
        return store

    def reopen(self) -> Store:
        store = SqliteStore(self.path("longrun.sqlite"))
        self.addCleanup(store.close)
        return store


class PostgresStoreMetricsTests(StoreCases):
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

    def reopen(self) -> Store:
        store = PostgresStore(self.schema.factory())
        self.addCleanup(store.close)
        return store


del StoreCases  # only its subclasses run


class RenderTests(support.TempDirTest):
    """The text format itself: escaping, numbers, HELP and TYPE, failures by error type."""

    def test_label_values_and_help_are_escaped_and_read_back_intact(self) -> None:
        from longrun.metrics import MetricFamily, Sample

        odd = 'a "quoted" back\\slash and a\nnewline'
        snapshot = MetricsSnapshot(
            (MetricFamily("longrun_test", "gauge", "help with a \\ and a\nnewline", (Sample("longrun_test", (("function", odd),), 1.5),)),),
            0.0,
        )
        text = render(snapshot)
        self.assertEqual(text.count("\n"), 3, text)  # HELP, TYPE, one sample: the newlines are escaped
        families = parse(text)
        [item] = families["longrun_test"].samples
        self.assertEqual((item.labels, item.value), ({"function": odd}, 1.5))
        self.assertEqual(families["longrun_test"].documentation, "help with a \\ and a\nnewline")

    def test_numbers_are_written_as_the_format_says(self) -> None:
        from longrun.metrics import MetricFamily, Sample

        samples = tuple(Sample("longrun_n", (("v", str(index)),), value) for index, value in enumerate((3.0, 0.25, math.inf, 1e20)))
        text = render(MetricsSnapshot((MetricFamily("longrun_n", "gauge", "numbers", samples),), 0.0))
        self.assertIn('longrun_n{v="0"} 3\n', text)
        self.assertIn('longrun_n{v="1"} 0.25\n', text)
        self.assertIn('longrun_n{v="2"} +Inf\n', text)
        self.assertIn('longrun_n{v="3"} 1e+20\n', text)

    def test_failure_of_reads_the_stopping_record_and_else_the_status(self) -> None:
        clock = FakeClock()
        store = JsonFileStore(self.path("store"), create=True)

        @longrun.durable(store=store, clock=clock, allowed_actions=("note.write",),
                         adapters={"note.write": OutboxAdapter(self.path("o.jsonl"), fail_permanent=True)})  # fmt: skip
        def refused(run: longrun.Run) -> None:
            run.effect("note", "note.write", {"text": "x"})

        refused.run("r-1")
        state = store.load("r-1").state
        assert state is not None
        self.assertEqual(failure_of(state), "PermanentError")
        state.effects = {}
        self.assertEqual(failure_of(state), "blocked")
        for status in Status:
            state.status = status
            self.assertEqual(failure_of(state) is not None, status in FAILED_STATUSES, status)

        def broken() -> None:
            raise ValueError("bad row")

        @longrun.durable(store=store, clock=clock)
        def tolerant(run: longrun.Run) -> str:
            try:
                run.call("parse", broken)
            except longrun.CallFailed:
                return "skipped"  # a failure the function handled: the task is done, the step failed
            return "parsed"

        self.assertIs(tolerant.run("c-1").status, Status.DONE)
        snapshot = collect(store, tasks=["c-1"], now=0.0)
        self.assertEqual(snapshot.value("longrun_step_failures_total", function=tolerant.name, error_type="ValueError"), 1)
        self.assertEqual(snapshot.family("longrun_tasks_failed").samples, ())

    def test_the_bucket_bounds_are_increasing_and_end_in_inf(self) -> None:
        for bounds in (LATENCY_BOUNDS, DURATION_BOUNDS):
            self.assertEqual(list(bounds), sorted(set(bounds)))
        snapshot = collect(JsonFileStore(self.path("empty"), create=True), now=0.0)
        families = parse(render(snapshot))
        self.assertEqual(sample(families, "longrun_pending_requests", "longrun_pending_requests", kind="approval"), 0)
        self.assertEqual(dataclasses.asdict(snapshot)["collected_at"], 0.0)


class WorkerEndpointTests(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        store = SqliteStore(self.path("tasks.db"), create=True)
        store.list_tasks()  # the file and its tables, made on first use
        store.close()

    def test_a_worker_serves_metrics_on_its_port_until_it_stops(self) -> None:
        spec = "sqlite:" + self.path("tasks.db")
        worker = subprocess.Popen(
            [sys.executable, "-m", "longrun", "worker", spec, "--import", "fleet_tasks", "--name", "w-m", "--poll", "0.2",
             "--metrics-port", "0"],
            env=fleet_env(spec, self.tmp), cwd=TASKS_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.addCleanup(lambda: worker.poll() is None and worker.kill() or worker.communicate())
        assert worker.stderr is not None
        line = worker.stderr.readline()
        found = re.search(r"metrics at (http://127\.0\.0\.1:\d+/metrics)", line)
        self.assertIsNotNone(found, line)
        assert found is not None
        url = found.group(1)
        deadline = time.monotonic() + 60
        while True:
            with urllib.request.urlopen(url, timeout=30) as response:
                self.assertTrue(response.headers["Content-Type"].startswith("text/plain; version=0.0.4"))
                families = parse(response.read().decode("utf-8"))
            if sample(families, "longrun_workers_alive", "longrun_workers_alive") == 1:
                break
            self.assertLess(time.monotonic(), deadline, "the worker's heartbeat never showed in its metrics")
            time.sleep(0.2)
        self.assertEqual(sample(families, "longrun_workers_known", "longrun_workers_known"), 1)
        with self.assertRaises(urllib.error.HTTPError) as other:
            urllib.request.urlopen(url.replace("/metrics", "/"), timeout=30)
        self.assertEqual(other.exception.code, 404)
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
        self.assertEqual(worker.returncode, 0, err)
        with self.assertRaises(OSError):
            urllib.request.urlopen(url, timeout=5)

    def test_a_port_in_use_is_a_usage_error(self) -> None:
        import socket

        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        self.addCleanup(taken.close)
        spec = "sqlite:" + self.path("tasks.db")
        result = subprocess.run(
            [sys.executable, "-m", "longrun", "worker", spec, "--import", "fleet_tasks", "--metrics-port", str(taken.getsockname()[1])],
            env=fleet_env(spec, self.tmp), cwd=TASKS_DIR, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("--metrics-port", result.stderr)
