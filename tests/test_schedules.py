"""Cron schedules: the grammar against known sequences, the daylight-saving rules, the stored
schedules on each store, a slot started once however many workers start it, backfill and skip, and
the ``longrun schedule`` commands. The fleet under SIGKILL is in test_fleet_crash.py."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import threading
import time
import unittest
import zoneinfo
from typing import Any

from helpers import pg_support, support
from helpers.cli_process import run_longrun
from helpers.fleet_support import TASKS_DIR, fleet_env
from longrun import JsonFileStore, Limits, SqliteStore, durable, scheduled
from longrun.cron import Cron, CronError, ZoneNotFoundError, zone
from longrun.errors import CorruptStateError, InvalidInputError
from longrun.functions import start_due_slots
from longrun.schedules import Schedule, ScheduleError, slot_task_id, takes_slot
from longrun.stores import PostgresStore
from longrun.stores.queue import open_queue
from longrun.worker import Worker

UTC = datetime.timezone.utc
DEADLINE_S = 60.0
"""A liveness guard, not a timing assertion."""


def at(*parts: int, tz: datetime.tzinfo = UTC, fold: int = 0) -> float:
    return datetime.datetime(*parts, tzinfo=tz, fold=fold).timestamp()  # type: ignore[misc]


def local(stamps: list[float], tz: datetime.tzinfo = UTC) -> list[str]:
    return [datetime.datetime.fromtimestamp(stamp, tz).strftime("%Y-%m-%d %a %H:%M%z") for stamp in stamps]


def known_zone(test: unittest.TestCase, name: str) -> datetime.tzinfo:
    try:
        return zoneinfo.ZoneInfo(name)
    except zoneinfo.ZoneInfoNotFoundError:
        test.skipTest(f"time zone {name} is not installed on this machine (install tzdata)")
        raise AssertionError("unreachable")


class CronTests(unittest.TestCase):
    def sequence(self, expression: str, start: float, count: int, tz: datetime.tzinfo = UTC) -> list[str]:
        cron, moment, found = Cron.parse(expression), start, []
        for _ in range(count):
            moment = cron.next_after(moment, tz)
            found.append(moment)
        return local(found, tz)

    def test_steps_ranges_lists_and_names_give_the_known_sequences(self) -> None:
        start = at(2026, 12, 1, 10, 7)  # a Tuesday
        self.assertEqual(
            self.sequence("*/15 * * * *", start, 4),
            ["2026-12-01 Tue 10:15+0000", "2026-12-01 Tue 10:30+0000", "2026-12-01 Tue 10:45+0000", "2026-12-01 Tue 11:00+0000"],
        )
        self.assertEqual(
            self.sequence("0 9 * * mon-fri", at(2026, 12, 3, 12, 0), 3),
            ["2026-12-04 Fri 09:00+0000", "2026-12-07 Mon 09:00+0000", "2026-12-08 Tue 09:00+0000"],
        )
        self.assertEqual(self.sequence("5,35 8-10/2 * * *", start, 3), ["2026-12-01 Tue 10:35+0000", "2026-12-02 Wed 08:05+0000", "2026-12-02 Wed 08:35+0000"])
        self.assertEqual(self.sequence("0 0 1 jan,JUL *", start, 2), ["2027-01-01 Fri 00:00+0000", "2027-07-01 Thu 00:00+0000"])
        self.assertEqual(self.sequence("0 12 * * 7", start, 1), self.sequence("0 12 * * sun", start, 1))
        self.assertEqual(self.sequence("50/5 * * * *", start, 3), ["2026-12-01 Tue 10:50+0000", "2026-12-01 Tue 10:55+0000", "2026-12-01 Tue 11:50+0000"])
        self.assertEqual(self.sequence("@daily", start, 1), ["2026-12-02 Wed 00:00+0000"])
        self.assertEqual(self.sequence("@hourly", start, 1), ["2026-12-01 Tue 11:00+0000"])
        self.assertEqual(self.sequence("0 0 29 2 *", start, 1), ["2028-02-29 Tue 00:00+0000"])

    def test_day_of_month_and_day_of_week_both_restricted_match_either(self) -> None:
        days = [line[:14] for line in self.sequence("0 0 1,15 * fri", at(2025, 12, 31, 23, 0), 7)]
        self.assertEqual(
            days, ["2026-01-01 Thu", "2026-01-02 Fri", "2026-01-09 Fri", "2026-01-15 Thu", "2026-01-16 Fri", "2026-01-23 Fri", "2026-01-30 Fri"]
        )
        # One of them a star: both must match (the 13th only when it is a Friday).
        self.assertEqual([line[:14] for line in self.sequence("0 0 13 * *", at(2026, 1, 1), 2)], ["2026-01-13 Tue", "2026-02-13 Fri"])
        self.assertEqual([line[:14] for line in self.sequence("0 0 */13 * fri", at(2026, 1, 1), 2)], ["2026-02-27 Fri", "2026-03-27 Fri"])

    def test_a_bad_expression_is_refused_naming_the_field(self) -> None:
        for expression, words in [
            ("* * * *", "has 4 fields"), ("60 * * * *", "minute field: 60 is outside 0-59"), ("* 5-2 * * *", "runs backwards"),
            ("* * * foo *", "month field"), ("*/0 * * * *", "step"), ("0 0 30 2 *", "no time that exists"), ("1,,2 * * * *", "empty"),
        ]:  # fmt: skip
            with self.subTest(expression=expression):
                with self.assertRaises(CronError) as caught:
                    Cron.parse(expression)
                self.assertIn(words, str(caught.exception))
                self.assertIsInstance(caught.exception, InvalidInputError)

    def test_utc_needs_no_time_zone_database_and_an_unknown_zone_is_a_typed_error(self) -> None:
        self.assertIs(zone("UTC"), UTC)
        with self.assertRaises(ZoneNotFoundError) as caught:
            zone("Mars/Olympus_Mons")
        self.assertIn("tzdata", str(caught.exception))

    def test_a_slot_in_the_hour_clocks_skip_is_skipped(self) -> None:
        berlin = known_zone(self, "Europe/Berlin")
        self.assertEqual(
            self.sequence("30 2 * * *", at(2026, 3, 28, 12, 0, tz=berlin), 2, berlin),
            ["2026-03-30 Mon 02:30+0200", "2026-03-31 Tue 02:30+0200"],  # no 02:30 on Sunday the 29th
        )
        self.assertEqual(self.sequence("0 * * * *", at(2026, 3, 29, 1, 30, tz=berlin), 2, berlin), ["2026-03-29 Sun 03:00+0200", "2026-03-29 Sun 04:00+0200"])

    def test_a_slot_in_the_hour_clocks_repeat_runs_once_at_its_first_occurrence(self) -> None:
        new_york = known_zone(self, "America/New_York")
        self.assertEqual(
            self.sequence("30 1 * * *", at(2026, 10, 31, 12, 0, tz=new_york), 3, new_york),
            ["2026-11-01 Sun 01:30-0400", "2026-11-02 Mon 01:30-0500", "2026-11-03 Tue 01:30-0500"],
        )
        # From inside the repeated hour (its second pass), the slots of that hour already passed.
        self.assertEqual(
            self.sequence("*/20 * * * *", at(2026, 11, 1, 1, 10, tz=new_york, fold=1), 2, new_york),
            ["2026-11-01 Sun 02:00-0500", "2026-11-01 Sun 02:20-0500"],
        )


class ScheduleRecordTests(unittest.TestCase):
    def test_the_record_round_trips_and_a_damaged_one_is_a_typed_error(self) -> None:
        schedule = Schedule("nightly", "reports:nightly", "0 2 * * *", "UTC", "backfill")
        self.assertEqual(Schedule.from_json(json.loads(json.dumps(schedule.to_json()))), schedule)
        for damage in ({"cron": "0 2 * *"}, {"catchup": "sometimes"}, {"schema_version": 9}, {"extra": 1}):
            with self.subTest(damage=damage):
                with self.assertRaises(CorruptStateError):
                    Schedule.from_json({**schedule.to_json(), **damage})
        with self.assertRaises(InvalidInputError):
            Schedule("../x", "reports:nightly", "0 2 * * *")

    def test_the_task_id_names_the_schedule_and_the_slot(self) -> None:
        self.assertEqual(slot_task_id("nightly", at(2026, 12, 1, 2, 0)), "nightly.20261201T0200Z")

    def test_skip_starts_the_latest_missed_slot_and_backfill_every_one(self) -> None:
        skip = Schedule("s", "m:f", "*/10 * * * *", catchup="skip")
        backfill = Schedule("b", "m:f", "*/10 * * * *", catchup="backfill")
        first, now = at(2026, 12, 1, 10, 0), at(2026, 12, 1, 10, 35)
        self.assertEqual(skip.due_slots(first, now), ([at(2026, 12, 1, 10, 30)], at(2026, 12, 1, 10, 40)))
        self.assertEqual(backfill.due_slots(first, now), ([at(2026, 12, 1, 10, m) for m in (0, 10, 20, 30)], at(2026, 12, 1, 10, 40)))
        self.assertEqual(backfill.due_slots(now + 60, now), ([], now + 60))

    def test_a_function_takes_the_slot_or_nothing(self) -> None:
        self.assertTrue(takes_slot(lambda run, slot: None))
        self.assertFalse(takes_slot(lambda run: None))
        with self.assertRaises(InvalidInputError):
            takes_slot(lambda run, a, b: None)


class Target:
    deduplicates = False

    def __init__(self) -> None:
        self.applied: dict[str, int] = {}

    def apply(self, request: Any) -> Any:
        from longrun import Receipt

        self.applied[request.key] = self.applied.get(request.key, 0) + 1
        return Receipt(result={"ok": True}, evidence="counted")

    def observe(self, request: Any) -> Any:
        from longrun import Observation

        return Observation.applied("found") if request.key in self.applied else Observation.absent("none")


class ScheduleStoreCases:
    """The same cases on every store; a subclass says how to make one."""

    def make_store(self) -> Any:
        raise NotImplementedError

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.store = self.make_store()
        self.addCleanup(lambda: getattr(self.store, "close", lambda: None)())  # type: ignore[attr-defined]
        self.queue = open_queue(self.store)
        self.addCleanup(self.queue.close)  # type: ignore[attr-defined]
        self.target = Target()

        @durable(store=self.store, adapters={"send": self.target}, allowed_actions=("send",), limits=Limits(max_block_s=0.05))
        def report(run: Any, slot: str) -> str:
            run.effect("tick", "send", {"slot": slot})
            return slot

        self.report = report

    def test_a_schedule_is_stored_listed_paused_resumed_and_removed(self) -> None:
        t: Any = self
        schedule = Schedule("reports", self.report.name, "*/5 * * * *", "UTC", "backfill")
        state = self.queue.add_schedule(schedule)
        now = self.queue.clock()
        t.assertTrue(now < state.next_slot <= now + 300)
        t.assertEqual(self.queue.add_schedule(schedule), state)  # the same again changes nothing
        with t.assertRaises(ScheduleError) as caught:
            self.queue.add_schedule(Schedule("reports", self.report.name, "0 * * * *"))
        t.assertIn("another definition", str(caught.exception))
        t.assertEqual([s.schedule for s in self.queue.schedules()], [schedule])
        paused = self.queue.pause_schedule("reports", True)
        t.assertTrue(paused.schedule.paused)
        # A definition added again (a worker starting) keeps the operator's pause.
        t.assertTrue(self.queue.add_schedule(Schedule("reports", self.report.name, "*/10 * * * *"), replace=True).schedule.paused)
        t.assertEqual(start_due_slots(self.queue, self.store, {self.report.name: self.report}).started, [])
        t.assertFalse(self.queue.pause_schedule("reports", False).schedule.paused)
        self.queue.remove_schedule("reports")
        t.assertEqual(self.queue.schedules(), [])
        with t.assertRaises(ScheduleError):
            self.queue.remove_schedule("reports")
        with t.assertRaises(ScheduleError):
            self.queue.schedule("reports")

    def test_a_damaged_schedule_row_is_a_typed_error_naming_it_and_the_worker_goes_on(self) -> None:
        t: Any = self
        self.queue.add_schedule(Schedule("reports", self.report.name, "*/5 * * * *"))
        with self.queue._tables.session("damage a schedule"):  # a test reaches past the API to damage the row
            self.queue._tables.run("UPDATE longrun_schedules SET record = ? WHERE name = ?", ('{"schema_version": 1, "name": "reports"}', "reports"))
        with t.assertRaises(CorruptStateError) as caught:
            self.queue.schedules()
        t.assertIn("stored schedule 'reports'", str(caught.exception))
        self.report.start("plain-task", "no slot")
        worker = Worker(self.store, [self.report], poll_s=0.05, rescan_s=0.05)
        thread = threading.Thread(target=worker.run)
        with t.assertLogs("longrun", "WARNING") as logs:
            thread.start()
            try:
                deadline = time.monotonic() + DEADLINE_S
                while (state := self.store.load("plain-task").state) is None or state.status.value != "done":
                    t.assertLess(time.monotonic(), deadline, "the worker stopped claiming tasks")
                    time.sleep(0.05)
            finally:
                worker.stop()
                thread.join(DEADLINE_S)
        t.assertIn("the schedules could not be served", "\n".join(logs.output))

    def test_backfill_starts_every_missed_slot_once_however_many_passes_start_them(self) -> None:
        t: Any = self
        now = self.queue.clock()
        since = now - 3 * 60 - 1
        self.queue.add_schedule(Schedule("ticks", self.report.name, "* * * * *", "UTC", "backfill"), since=since)
        functions = {self.report.name: self.report}
        state = self.queue.schedule("ticks")
        first = start_due_slots(self.queue, self.store, functions)
        # A second worker that read the schedule before the first moved it starts the same slots: nothing new.
        second = start_due_slots(self.queue, self.store, functions, states=[state])
        expected = [slot_task_id("ticks", state.next_slot + 60 * i) for i in range(len(first.started))]
        t.assertGreaterEqual(len(first.started), 3)
        t.assertEqual(first.started, expected)
        t.assertEqual(second.started, [])
        t.assertEqual(sorted(task for task in self.store.list_tasks() if task.startswith("ticks.")), expected)
        after = self.queue.schedule("ticks")
        t.assertEqual(after.last_task, expected[-1])
        t.assertGreater(after.next_slot, self.queue.clock() - 60)

    def test_skip_starts_only_the_latest_missed_slot(self) -> None:
        t: Any = self
        now = self.queue.clock()
        self.queue.add_schedule(Schedule("ticks", self.report.name, "* * * * *", "UTC", "skip"), since=now - 5 * 60)
        with t.assertLogs("longrun", "INFO") as logs:
            done = start_due_slots(self.queue, self.store, {self.report.name: self.report})
        t.assertEqual(len(done.started), 1)
        t.assertGreaterEqual(done.skipped, 4)
        t.assertIn("missed slots skipped", "\n".join(logs.output))
        t.assertEqual([task for task in self.store.list_tasks() if task.startswith("ticks.")], done.started)

    def test_a_worker_stores_its_functions_schedules_and_runs_each_slot_to_done(self) -> None:
        t: Any = self
        # The worker was away for two minutes: the slots since then are missed ones, started by backfill.
        self.queue.add_schedule(Schedule("minutely", self.report.name, "* * * * *", "UTC", "backfill"), since=self.queue.clock() - 121)
        report = scheduled("* * * * *", catchup="backfill", name="minutely")(self.report)  # the same definition: kept
        t.assertEqual(report.schedule.name, "minutely")
        worker = Worker(self.store, [report], concurrency=2, poll_s=0.05, rescan_s=0.05, claim_ttl_s=5.0)
        thread = threading.Thread(target=worker.run)
        with t.assertLogs("longrun", "INFO"):
            thread.start()
            try:
                deadline = time.monotonic() + DEADLINE_S
                while True:
                    tasks = [task for task in self.store.list_tasks() if task.startswith("minutely.")]
                    states = [self.store.load(task).state for task in tasks]
                    if len(tasks) >= 2 and all(state is not None and state.status.value == "done" for state in states):
                        break
                    t.assertLess(time.monotonic(), deadline, f"slots not run: {tasks} {[s.status if s else None for s in states]}")
                    time.sleep(0.05)
            finally:
                worker.stop()
                thread.join(DEADLINE_S)
        t.assertEqual(set(self.target.applied.values()), {1})
        t.assertGreaterEqual(len(self.target.applied), 2)


class SqliteScheduleTests(ScheduleStoreCases, support.TempDirTest):
    def make_store(self) -> Any:
        return SqliteStore(os.path.join(self.tmp, "tasks.db"), create=True)


class JsonScheduleTests(ScheduleStoreCases, support.TempDirTest):
    def make_store(self) -> Any:
        return JsonFileStore(os.path.join(self.tmp, "store"), create=True)


class PostgresScheduleTests(ScheduleStoreCases, pg_support.SchemaPerTest, support.TempDirTest):
    def make_store(self) -> Any:
        return PostgresStore(self.schema.factory())


class ScheduleCliTests(support.TempDirTest):
    """``longrun schedule ...`` in a process of its own, on a SQLite store and a JSON-file store."""

    def longrun(self, spec: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = fleet_env(spec, self.tmp)
        return run_longrun(["schedule", *args], env=env, cwd=TASKS_DIR, timeout=120)  # forked from the fork server

    def check_commands(self, spec: str) -> None:
        add = self.longrun(spec, "add", spec, "ticks", "--function", "fleet_tasks:ticker", "--cron", "*/30 * * * *", "--catchup", "backfill", "--json")
        self.assertEqual(add.returncode, 0, add.stderr)
        self.assertEqual(json.loads(add.stdout)["cron"], "*/30 * * * *")
        again = self.longrun(spec, "add", spec, "ticks", "--function", "fleet_tasks:ticker", "--cron", "0 * * * *")
        self.assertEqual(again.returncode, 2, again.stderr)
        self.assertIn("another definition", again.stderr)
        bad = self.longrun(spec, "add", spec, "other", "--function", "fleet_tasks:ticker", "--cron", "61 * * * *")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("minute field: 61 is outside 0-59", bad.stderr)
        backfill = self.longrun(spec, "backfill", spec, "ticks", "--since", "2026-01-01T00:00", "--until", "2026-01-01T01:00", "--json")
        self.assertEqual(backfill.returncode, 0, backfill.stderr)
        self.assertEqual(
            json.loads(backfill.stdout),
            [{"task_id": f"ticks.20260101T{hm}Z", "created": True} for hm in ("0000", "0030", "0100")],
        )
        twice = self.longrun(spec, "backfill", spec, "ticks", "--since", "2026-01-01T00:00", "--until", "2026-01-01T00:30", "--json")
        self.assertEqual([entry["created"] for entry in json.loads(twice.stdout)], [False, False])
        trigger = self.longrun(spec, "trigger", spec, "ticks", "--json")
        self.assertEqual(trigger.returncode, 0, trigger.stderr)
        self.assertRegex(json.loads(trigger.stdout)[0]["task_id"], r"^ticks\.manual\.\d{8}T\d{6}Z$")
        self.assertEqual(self.longrun(spec, "pause", spec, "ticks").returncode, 0)
        listing = self.longrun(spec, "ls", spec, "--json")
        self.assertEqual([(entry["name"], entry["paused"]) for entry in json.loads(listing.stdout)], [("ticks", True)])
        text = self.longrun(spec, "ls", spec)
        self.assertIn("ticks  fleet_tasks:ticker  '*/30 * * * *' UTC  catchup=backfill  paused", text.stdout)
        self.assertEqual(self.longrun(spec, "resume", spec, "ticks").returncode, 0)
        self.assertEqual(self.longrun(spec, "rm", spec, "ticks").returncode, 0)
        missing = self.longrun(spec, "rm", spec, "ticks")
        self.assertEqual(missing.returncode, 2)
        self.assertIn("no schedule named 'ticks'", missing.stderr)

    def test_the_commands_on_a_sqlite_store(self) -> None:
        created = SqliteStore(os.path.join(self.tmp, "tasks.db"), create=True)
        created.list_tasks()
        created.close()
        self.check_commands("sqlite:" + os.path.join(self.tmp, "tasks.db"))

    def test_the_commands_on_a_json_file_store(self) -> None:
        spec = os.path.join(self.tmp, "store")
        os.makedirs(spec)
        self.check_commands(spec)


if __name__ == "__main__":
    unittest.main()
