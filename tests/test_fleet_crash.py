"""A worker fleet under fire: real ``longrun worker`` processes SIGKILLed and SIGSTOPped at random.

PostgreSQL: 4 workers (two with wall clocks an hour ahead and an hour behind) run durable tasks of
several effects each, while workers are killed (and replaced) and frozen at random; afterwards
every task is ``done``, every effect was applied once at the target, no task was leased to two
runners at once in the database's order, and every worker still running drains on SIGTERM and
exits 0. SQLite: the same with 4 workers on one file, at a smaller size; the JSON-file store
likewise (no lease log there: no trigger sees its files). Sizes are small by default, larger under
``LONGRUN_TEST_SCALE=full`` (CI); ``LONGRUN_FLEET_FULL=1`` runs the full size (1,000 tasks of 10 effects, 20 kills, 10 stops).
"""

from __future__ import annotations

import os
import random
import time
import unittest
from typing import Any

from helpers import pg_support, scale, support
from helpers.fleet_support import Database, Fleet, helper, overlapping_leases, tasks_module

FULL = os.environ.get("LONGRUN_FLEET_FULL", "") not in ("", "0")
DEADLINE_S = 1800.0 if FULL else 300.0
"""A liveness guard, not a timing assertion: the fleet must finish; this says when to give up."""


class FleetCrashCases:
    tasks = 60
    effects = 5
    kills = 6
    stops = 3
    check_overlap = True

    def fleet_store(self) -> tuple[str, Database]:
        raise NotImplementedError

    def test_killed_frozen_and_skewed_workers_finish_every_task_with_every_effect_once(self) -> None:
        spec, database = self.fleet_store()
        work = self.tmp  # type: ignore[attr-defined]
        helper(spec, work, "prepare")
        helper(spec, work, "enqueue", "effects", str(self.tasks), f"[{self.effects}]")
        fleet = Fleet(spec, work)
        self.addCleanup(fleet.close)  # type: ignore[attr-defined]
        fleet.start(4, offsets=self.offsets())
        started = time.monotonic()
        rng = random.Random(int(os.environ.get("LONGRUN_FLEET_SEED", "15")))
        finished = lambda: database.done() >= self.tasks  # noqa: E731
        fleet.chaos(rng, self.kills, self.stops, finished)
        deadline = time.monotonic() + DEADLINE_S
        while not finished():
            if time.monotonic() > deadline:
                self.fail(f"not every task finished: {database.statuses()}\n{fleet.logs()}")  # type: ignore[attr-defined]
            time.sleep(0.1)
        elapsed = time.monotonic() - started
        fleet.wait_ready(database)
        reports = fleet.drain()
        self.assertEqual([code for _, code in fleet.finished], [0] * 4, fleet.logs())  # type: ignore[attr-defined]
        self.assertEqual(len(reports), 4)  # type: ignore[attr-defined]
        self.assertEqual(database.statuses(), {"done": self.tasks})  # type: ignore[attr-defined]
        fleet_tasks = tasks_module()

        os.environ["LONGRUN_FLEET_WORK"] = work
        counts = fleet_tasks.outbox_counts()
        expected = {f"t{i}/e{j}" for i in range(self.tasks) for j in range(self.effects)}
        self.assertEqual(set(counts), expected)  # type: ignore[attr-defined]
        self.assertEqual({key: n for key, n in counts.items() if n != 1}, {})  # type: ignore[attr-defined]
        log = database.lease_log()
        if log is not None:
            self.assertGreater(len(log), 2 * self.tasks)  # type: ignore[attr-defined]
            self.assertEqual(overlapping_leases(log, by_time=self.check_overlap)[:5], [])  # type: ignore[attr-defined]
        self.assertEqual((fleet.kills, fleet.stops), (self.kills, self.stops))  # type: ignore[attr-defined]
        if FULL:
            checked = f"{len(log)} lease writes checked" if log is not None else "no lease log (files)"
            print(f"\n{type(self).__name__}: {self.tasks} tasks x {self.effects} effects, {fleet.kills} kills, "
                  f"{fleet.stops} stops, every task done in {elapsed:.1f}s; {checked}")  # fmt: skip

    def offsets(self) -> dict[int, float]:
        return {}


class ScheduleFleetCases:
    """A schedule's slots started by a fleet of three workers, two of them SIGKILLed while the slots
    are started and run: every slot has one task, done, whose effect was applied once."""

    minutes = 6

    def fleet_store(self) -> tuple[str, Database]:
        raise NotImplementedError

    def test_each_slot_of_a_schedule_runs_once_in_a_fleet_of_three_with_two_killed(self) -> None:
        from longrun.schedules import slot_task_id

        t: Any = self
        spec, database = self.fleet_store()
        work = t.tmp
        helper(spec, work, "prepare")
        helper(spec, work, "schedule", "ticks", str(self.minutes))
        fleet = Fleet(spec, work, concurrency=2)
        t.addCleanup(fleet.close)
        fleet.start(3)
        for slot in (0, 1):  # two of the three, while the backfilled slots are being started and run
            time.sleep(0.8)
            fleet.kill(slot)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            statuses = database.statuses()
            if set(statuses) == {"done"} and statuses["done"] >= self.minutes:
                break
            if time.monotonic() > deadline:
                t.fail(f"not every slot finished: {statuses}\n{fleet.logs()}")
            time.sleep(0.1)
        fleet.wait_ready(database)
        fleet.drain()
        os.environ["LONGRUN_FLEET_WORK"] = work
        counts = tasks_module().outbox_counts()
        tasks = sorted(key.rpartition("/")[0] for key in counts)
        first = min(tasks)
        start = time.mktime(time.strptime(first, "ticks.%Y%m%dT%H%MZ")) - time.timezone
        t.assertEqual(tasks, [slot_task_id("ticks", start + 60 * i) for i in range(len(tasks))], "one task per slot, none missing")
        t.assertGreaterEqual(len(tasks), self.minutes)
        t.assertEqual({key: n for key, n in counts.items() if n != 1}, {}, "each slot's effect applied once")
        t.assertEqual(fleet.kills, 2)


class RateFleetCases:
    """A named queue's rate limit held by a fleet of three worker processes, one SIGKILLed: every
    task done with its effect applied once, and no window of the period holding more starts than N."""

    tasks = 16

    def fleet_store(self) -> tuple[str, Database]:
        raise NotImplementedError

    def test_a_rate_limit_is_never_exceeded_in_a_fleet(self) -> None:
        t: Any = self
        spec, database = self.fleet_store()
        work = t.tmp
        helper(spec, work, "prepare")
        helper(spec, work, "enqueue-rated", str(self.tasks))
        fleet = Fleet(spec, work, concurrency=4)
        t.addCleanup(fleet.close)
        fleet.start(3)
        time.sleep(1.5)
        fleet.kill(0)
        deadline = time.monotonic() + DEADLINE_S
        while database.statuses() != {"done": self.tasks}:
            if time.monotonic() > deadline:
                t.fail(f"not every task finished: {database.statuses()}\n{fleet.logs()}")
            time.sleep(0.1)
        fleet.wait_ready(database)
        fleet.drain()
        starts = sorted(float(at) for (at,) in database.rows("SELECT started_at FROM fleet_start_log WHERE queue_name = 'rated'"))
        t.assertGreaterEqual(len(starts), self.tasks)
        count, period = 4, 2.0
        crowded = [(starts[i], starts[i + count]) for i in range(len(starts) - count) if starts[i + count] - starts[i] < period - 1e-6]
        t.assertEqual(crowded, [], f"more than {count} starts within {period}s")
        os.environ["LONGRUN_FLEET_WORK"] = work
        counts = tasks_module().outbox_counts()
        t.assertEqual(counts, {f"r{i}/once": 1 for i in range(self.tasks)})


class PostgresRateFleetTests(RateFleetCases, pg_support.SchemaPerTest, support.TempDirTest):
    def fleet_store(self) -> tuple[str, Database]:
        return self.schema.spec, Database("", self.schema)


class SqliteRateFleetTests(RateFleetCases, support.TempDirTest):
    def fleet_store(self) -> tuple[str, Database]:
        spec = "sqlite:" + os.path.join(self.tmp, "tasks.db")
        return spec, Database(spec)


class JsonRateFleetTests(RateFleetCases, support.TempDirTest):
    def fleet_store(self) -> tuple[str, Database]:
        spec = os.path.join(self.tmp, "store")
        os.makedirs(spec)
        return spec, Database(spec)


class PostgresScheduleFleetTests(ScheduleFleetCases, pg_support.SchemaPerTest, support.TempDirTest):
    def fleet_store(self) -> tuple[str, Database]:
        return self.schema.spec, Database("", self.schema)


class SqliteScheduleFleetTests(ScheduleFleetCases, support.TempDirTest):
    def fleet_store(self) -> tuple[str, Database]:
        spec = "sqlite:" + os.path.join(self.tmp, "tasks.db")
        return spec, Database(spec)


class JsonScheduleFleetTests(ScheduleFleetCases, support.TempDirTest):
    def fleet_store(self) -> tuple[str, Database]:
        spec = os.path.join(self.tmp, "store")
        os.makedirs(spec)
        return spec, Database(spec)


class PostgresFleetCrashTests(FleetCrashCases, pg_support.SchemaPerTest, support.TempDirTest):
    tasks = 1000 if FULL else scale.scaled(24, 60)
    effects = 10 if FULL else 5
    kills = 20 if FULL else scale.scaled(3, 6)
    stops = 10 if FULL else scale.scaled(2, 3)

    def fleet_store(self) -> tuple[str, Database]:
        return self.schema.spec, Database("", self.schema)

    def offsets(self) -> dict[int, float]:
        return {1: 3600.0, 2: -3600.0}


class SqliteFleetCrashTests(FleetCrashCases, support.TempDirTest):
    tasks = 200 if FULL else scale.scaled(12, 30)
    effects = 5 if FULL else 4
    kills = 10 if FULL else scale.scaled(2, 4)
    stops = 4 if FULL else scale.scaled(1, 2)
    check_overlap = False
    """One machine: a contender that finds the holder's lock free knows it died and takes over at
    once, before the expiry; the lease log cannot tell that from an overlap (epochs are still checked)."""

    def fleet_store(self) -> tuple[str, Database]:
        spec = "sqlite:" + os.path.join(self.tmp, "tasks.db")
        return spec, Database(spec)


class JsonFleetCrashTests(FleetCrashCases, support.TempDirTest):
    tasks = 100 if FULL else scale.scaled(10, 24)
    effects = 5 if FULL else 4
    kills = 6 if FULL else scale.scaled(2, 3)
    stops = 2 if FULL else 1
    check_overlap = False

    def fleet_store(self) -> tuple[str, Database]:
        spec = os.path.join(self.tmp, "store")
        os.makedirs(spec)
        return spec, Database(spec)


class LeaseLogCheckTests(unittest.TestCase):
    """The overlap check judges as the store does: on a shared monotonic timeline when the grants have one."""

    def test_a_renewal_stamped_late_on_the_wall_clock_is_not_an_overlap(self) -> None:
        # Epoch 1 renewed at monotonic 100 (wall expiry stamped 0.5 s later, after a lock wait);
        # epoch 2 acquired at monotonic 130.1, after epoch 1's monotonic expiry of 130.
        rows = [
            ("t", 1, "a", 1000.0, 1030.0, "boot:x", 100.0),
            ("t", 1, "a", 1000.0, 1060.5, "boot:x", 130.0),
            ("t", 2, "b", 1060.2, 1090.2, "boot:x", 160.1),
        ]
        self.assertEqual(overlapping_leases(rows), [])
        self.assertEqual(len(overlapping_leases([row[:5] + (None, None) for row in rows])), 1)

    def test_an_acquisition_before_the_monotonic_expiry_is_an_overlap(self) -> None:
        rows = [("t", 1, "a", 1000.0, 1030.0, "boot:x", 130.0), ("t", 2, "b", 1031.0, 1061.0, "boot:x", 159.0)]
        self.assertIn("monotonic boot:x", overlapping_leases(rows)[0])

    def test_a_released_lease_and_a_shrinking_epoch(self) -> None:
        released = [("t", 1, "a", 1000.0, 1030.0, "boot:x", 130.0), ("t", 1, "a", 1000.0, 0.0, None, None)]
        self.assertEqual(overlapping_leases(released + [("t", 2, "b", 1001.0, 1031.0, "boot:x", 101.0)]), [])
        self.assertIn("epoch 1 after 2", overlapping_leases([("t", 2, "a", 1, 2, None, None), ("t", 1, "b", 3, 4, None, None)])[0])


if __name__ == "__main__":
    unittest.main()
