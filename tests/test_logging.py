"""Logs (``longrun.logging``): JSON and text formatters with ISO-8601 UTC times, the command line's
``--log-format`` and ``--log-level``, and the fields every record of a run carries (its task, step,
key, action, epoch and function, filled in from the run under way where the caller gave none)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

from helpers import support
from helpers.fleet_support import TASKS_DIR, fleet_env, helper

from longrun import SqliteStore
from longrun.events import LOG_FIELDS
from longrun.logging import JsonFormatter, TextFormatter, configure, iso_utc
from longrun.errors import InvalidInputError

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")

JOB = textwrap.dedent(
    """
    import os

    import longrun
    from longrun.testing import OutboxAdapter


    class Flaky(OutboxAdapter):
        def apply(self, request):
            super().apply(request)
            raise ConnectionError("connection reset after the request was sent")


    STORE = longrun.JsonFileStore(os.environ["OBS_STORE"], create=True)


    @longrun.durable(store=STORE, adapters={"send": Flaky(os.environ["OBS_OUTBOX"])}, allowed_actions=("send",))
    def job(run, n):
        run.progress(1, n, "halfway")
        run.effect("mail", "send", {"n": n})
        run.sleep("nap", 3600)
        return n
    """
)


class CommandLineTests(support.TempDirTest):
    def run_job(self, *options: str) -> subprocess.CompletedProcess[str]:
        with open(self.path("obs_logjob.py"), "w") as handle:
            handle.write(JOB)
        env = support.child_env()
        env.update(OBS_STORE=self.path("store"), OBS_OUTBOX=self.path("outbox.jsonl"))
        return subprocess.run(
            [sys.executable, "-m", "longrun", *options, "start", "obs_logjob:job", "t-1", "--args", "[2]", "--run", "--path", self.tmp],
            env=env, capture_output=True, text=True, timeout=120, cwd=self.tmp,
        )  # fmt: skip

    def test_json_logs_parse_line_by_line_with_a_time_and_the_run_s_fields(self) -> None:
        result = self.run_job("--log-format", "json", "--log-level", "info")
        self.assertEqual(result.returncode, 1, result.stderr)  # the run stops sleeping
        lines = [json.loads(line) for line in result.stderr.splitlines()]  # every line is JSON
        self.assertGreater(len(lines), 5)
        for line in lines:
            self.assertRegex(line["time"], ISO_UTC)
            self.assertIn(line["level"], ("INFO", "WARNING"))
            self.assertEqual((line["logger"], line["task"]), ("longrun", "t-1"), line)
            self.assertNotIn(None, line.values(), line)  # a field that does not apply is absent, never null
        [warning] = [line for line in lines if line["level"] == "WARNING"]
        self.assertEqual(
            {name: warning.get(name) for name in ("task", "step", "key", "action", "epoch", "function", "attempt")},
            {"task": "t-1", "step": "mail", "key": "t-1/mail", "action": "send", "epoch": 1, "function": "obs_logjob:job", "attempt": 1},
        )
        self.assertIn("apply of t-1/mail raised ConnectionError: connection reset after the request was sent; observing", warning["message"])
        moves = [line for line in lines if line.get("step") == "mail" and line["level"] == "INFO"]
        self.assertEqual([line["state"] for line in moves], ["planned", "started", "uncertain", "verified"])
        self.assertTrue(all(line["function"] == "obs_logjob:job" and line["epoch"] == 1 for line in moves))
        [nap] = [line for line in lines if line.get("step") == "nap" and line.get("state") == "sleeping"]
        self.assertRegex(nap["message"], r"^task t-1: timer nap sleeps until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertFalse(any("None" in line["message"] or "attempt 0" in line["message"] for line in lines), lines)
        stopped = lines[-1]
        self.assertEqual((stopped["state"], stopped["function"]), ("sleeping", "obs_logjob:job"))

    def test_text_logs_have_the_time_and_the_fields_and_the_level_filters(self) -> None:
        result = self.run_job("-v")
        lines = result.stderr.splitlines()
        self.assertTrue(lines)
        for line in lines:
            self.assertRegex(line, r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING) longrun: task t-1: ")
        self.assertTrue(any(line.endswith("function=obs_logjob:job]") for line in lines))
        quiet = self.run_job("--log-level", "error")  # the same task again: it is sleeping, nothing to log above error
        self.assertEqual(quiet.stderr, "")
        refused = subprocess.run([sys.executable, "-m", "longrun", "ls", self.tmp, "--log-format", "xml"], env=support.child_env(), capture_output=True, text=True, timeout=60)
        self.assertEqual(refused.returncode, 2)
        self.assertIn("--log-format", refused.stderr)

    def test_a_worker_logs_json_with_its_name_and_the_runs_fields(self) -> None:
        spec = "sqlite:" + self.path("tasks.db")
        helper(spec, self.tmp, "enqueue", "effects", "1", "[2]")  # one task for the worker to run
        worker = subprocess.Popen(
            [sys.executable, "-m", "longrun", "worker", spec, "--import", "fleet_tasks", "--name", "w-log", "--poll", "0.2",
             "--log-format", "json", "--log-level", "info"],
            env=fleet_env(spec, self.tmp), cwd=TASKS_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.addCleanup(lambda: worker.poll() is None and worker.kill() or worker.communicate())
        store = SqliteStore(self.path("tasks.db"))
        self.addCleanup(store.close)
        deadline = time.monotonic() + 60
        while [store.load(task).state.status.value for task in store.list_tasks() if store.load(task).state] != ["done"]:  # type: ignore[union-attr]
            self.assertLess(time.monotonic(), deadline, "the worker never finished its task")
            time.sleep(0.2)
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
        self.assertEqual(worker.returncode, 0, err)
        lines = [json.loads(line) for line in err.splitlines()]
        for line in lines:
            self.assertRegex(line["time"], ISO_UTC)
        self.assertTrue(any(line.get("worker") == "w-log" and "stopped" in line["message"] for line in lines), lines)
        run = [line for line in lines if line.get("step") is not None]
        self.assertTrue(run, lines)
        self.assertTrue(all(line["function"] == "fleet_tasks:effects" and line["epoch"] >= 1 and line["task"] for line in run), run)


class FormatterTests(support.TempDirTest):
    def record(self, **extra: object) -> logging.LogRecord:
        logger = logging.getLogger("longrun")
        record = logger.makeRecord("longrun", logging.WARNING, __file__, 1, "task %s: %s", ("t", "boom"), None, extra=extra)
        for item in logger.filters:
            item.filter(record)  # what the logger does before its handlers see the record
        return record

    def test_the_json_formatter_writes_the_set_fields_static_ones_and_the_exception(self) -> None:
        formatter = JsonFormatter(static={"service": "billing"})
        record = self.record(task="t", step="s", epoch=3)
        line = json.loads(formatter.format(record))
        self.assertEqual(
            line, {"time": iso_utc(record.created), "level": "WARNING", "logger": "longrun", "message": "task t: boom",
                   "task": "t", "step": "s", "epoch": 3, "service": "billing"},
        )  # fmt: skip
        try:
            raise ValueError("bad \u00e9\n value")
        except ValueError:
            record = logging.getLogger("longrun").makeRecord("longrun", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
        line = json.loads(formatter.format(record))
        self.assertIn("ValueError: bad \u00e9", line["exception"])
        self.assertEqual(len(formatter.format(record).splitlines()), 1)  # one line, however many the traceback has
        self.assertEqual(json.loads(formatter.format(self.record(task=object())))["task"][:8], "<object ")  # never unencodable

    def test_the_text_formatter_and_iso_times(self) -> None:
        record = self.record(task="t", key="t/s")
        text = TextFormatter().format(record)
        self.assertEqual(text, f"{iso_utc(record.created)} WARNING longrun: task t: boom [task=t key=t/s]")
        self.assertEqual(iso_utc(0.5), "1970-01-01T00:00:00.500Z")
        self.assertEqual(set(LOG_FIELDS) >= {"task", "step", "key", "action", "epoch", "function"}, True)

    def test_configure_refuses_what_it_does_not_know_and_routes_records(self) -> None:
        for options in ({"log_format": "xml"}, {"level": "loud"}):
            with self.assertRaises(InvalidInputError):
                configure(io.StringIO(), **options)  # type: ignore[arg-type]
        stream = io.StringIO()
        logger = logging.getLogger("longrun")
        level = logger.level
        handler = configure(stream, log_format="json", level="info")
        try:
            logger.info("hello", extra={"task": "x"})
            logger.debug("not shown")
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        [line] = [json.loads(text) for text in stream.getvalue().splitlines()]
        self.assertEqual((line["message"], line["task"]), ("hello", "x"))
        self.assertFalse(os.path.exists(self.path("nothing")))
