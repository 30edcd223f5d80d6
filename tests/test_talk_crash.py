"""Tasks that talk, SIGKILLed at every named crash point: each message is stored once, each is
received once, each event is set once.

A message is sent to a consumer from outside (a control record, sent again by every run with one
key), then a producer sends it three messages; the consumer receives the four one by one, ships
each through an effect and publishes its progress as an event (tests/helpers/talk_child.py). A clean run is
traced first to learn every named point it passes (``message.sent``, ``message.imported``,
``message.received`` and ``event.set`` among them) and how often; then, for each point and occurrence, a fresh store is run
with ``LONGRUN_CRASH_AT=point:N``, the process dies there, and the tasks are run again until the
consumer is done, on the JSON-file, SQLite and PostgreSQL stores, and with the tasks written
``async def`` (the async driver). Afterwards:

- the consumer's mailbox holds exactly the four messages: the producer's in send order, each with
  the key its send step derives (a send repeated after a kill is a duplicate, never a second
  message), and the one from outside once, however often it was sent or taken in;
- its receives record the messages 1-4 once each, and it returns their values in the order sent
  (FIFO across both kinds, consumed once), each control record consumed at most once;
- each shipment was applied exactly once at the target, with the value received;
- each task's event records are numbered 1..k with no gap or repeat (one per set step), and the
  latest value is the last one set.
"""

from __future__ import annotations

import itertools
import os
import time
import unittest
from typing import Any

from helpers import forked, pg_support, scale, support
from longrun import JsonFileStore, SqliteStore, Store
from longrun.messages import RECV_ACTION
from longrun.outside_messages import MESSAGE_ACTION
from longrun.stores import PostgresStore
from longrun.task_events import EVENT_ACTION, events_of
from longrun.testing import read_outbox
from longrun.testing.faults.points import TALK_POINTS, read_trace

CHILD = os.path.join(support.HELPERS, "talk_child.py")
NEW_POINTS = TALK_POINTS
KILLED = forked.KILLED


class TalkCrashCase(support.TempDirTest):
    kind = "json"
    in_memory = True
    ttl = 30.0
    thorough = True
    """Kill at every occurrence of every point (else: every occurrence of the new points, the first of the others)."""

    def setUp(self) -> None:
        super().setUp()
        self.servers = forked.Servers(self, CHILD, self.path("server.err"))
        self.cases = itertools.count(1)
        """Case numbers: the cases run a few at once (``forked.concurrently``), each in its own directory."""

    # -- one case: a fresh store and work directory ---------------------------------------------

    def fresh(self) -> dict[str, Any]:
        work = self.path(f"case-{next(self.cases)}")
        os.makedirs(work)
        root = os.path.join(work, "store")
        os.makedirs(root)
        return {"kind": self.kind, "root": root, "work": work, "later": 0.0, "ttl": self.ttl}

    def store(self, case: dict[str, Any]) -> Store:
        store: Store = JsonFileStore(case["root"]) if self.kind == "json" else SqliteStore(os.path.join(case["root"], "longrun.sqlite"))
        self.addCleanup(getattr(store, "close"))
        return store

    asynchronous = False
    """Whether the tasks are ``async def`` (``AsyncRun``, the async driver)."""

    def run_child(self, case: dict[str, Any], **extra: Any) -> dict[str, Any]:
        case["later"] += 100.0  # a killed run's lease has expired for the next run
        return self.servers.run({**case, "async": self.asynchronous, **extra}, f"run {case['work']} {extra}")

    def after_kill(self, case: dict[str, Any]) -> None:
        """Whatever the next run needs after a kill (the store's lease clock may be the server's)."""

    def finish(self, case: dict[str, Any], what: str = "") -> dict[str, Any]:
        for _ in range(8):
            reply = self.run_child(case)
            self.assertEqual(reply["exit"], 0, what)
            if reply["outcome"]["status"] == "done":
                return reply["outcome"]
        self.fail(f"{what}: the consumer did not finish: {reply['outcome']}")

    # -- what must hold however the runs were killed ----------------------------------------------

    def check(self, case: dict[str, Any], outcome: dict[str, Any], what: str) -> None:
        store = self.store(case)
        sent = [{"n": i} for i in range(3)]
        expected = [{"n": "outside"}, *sent]
        messages = store.read_messages("consumer")
        produced = [message for message in messages if message.key != "outside-1"]
        self.assertEqual([message.value for message in produced], sent, f"{what}: each message stored once, in send order")
        self.assertEqual([message.key for message in produced], [f"producer:longrun.send:consumer/orders@{i}" for i in (1, 2, 3)], what)
        self.assertEqual([message.value for message in messages if message.key == "outside-1"], [{"n": "outside"}], f"{what}: sent twice or more, one message")
        self.assertEqual([message.seq for message in messages], [1, 2, 3, 4], what)
        self.assertEqual(outcome["result"], expected, f"{what}: received in the order sent, once each")
        consumer = store.load("consumer").state
        assert consumer is not None
        received = [record.result["seq"] for record in consumer.effects.values() if record.action == RECV_ACTION]
        self.assertEqual(sorted(received), [1, 2, 3, 4], f"{what}: each message consumed by exactly one receive")
        records = [raw for raw in store.read_approvals("consumer") if isinstance(raw.body, dict) and raw.body.get("action") == MESSAGE_ACTION]
        self.assertGreaterEqual(len(records), 1, what)
        self.assertLessEqual(set(consumer.consumed_approvals), {raw.body["approval_id"] for raw in records}, what)
        self.assertEqual(len(consumer.consumed_approvals), len(set(consumer.consumed_approvals)), f"{what}: each record consumed once")
        shipped = read_outbox(os.path.join(case["work"], "outbox.jsonl"))
        self.assertEqual(sorted(line["key"] for line in shipped), [f"consumer/ship/{i}" for i in range(4)], f"{what}: each shipment once")
        self.assertEqual(
            sorted((line["key"], str(line["payload"]["order"]["n"])) for line in shipped),
            [(f"consumer/ship/{i}", str(value["n"])) for i, value in enumerate(expected)], what,
        )  # fmt: skip
        for task, count, latest in (("consumer", 4, {"progress": {"received": 4}}), ("producer", 1, {"sent": 3})):
            state = store.load(task).state
            assert state is not None
            numbers = sorted(record.result["seq"] for record in state.effects.values() if record.action == EVENT_ACTION)
            self.assertEqual(numbers, list(range(1, count + 1)), f"{what}: {task}'s events set once each")
            self.assertEqual(events_of(state), latest, what)

    # -- the tests ------------------------------------------------------------------------------

    def traced(self) -> dict[str, int]:
        case = self.fresh()
        trace = os.path.join(case["work"], "trace")
        reply = self.run_child(case, trace=trace)
        self.assertEqual((reply["exit"], reply["outcome"]["status"]), (0, "done"))
        self.check(case, reply["outcome"], "a run without kills")
        counts: dict[str, int] = {}
        for point, occurrence, _ in read_trace(trace):
            counts[point] = max(counts.get(point, 0), occurrence)
        return counts

    def test_a_run_passes_every_new_point_as_often_as_it_sends_receives_and_sets(self) -> None:
        counts = self.traced()
        points = ("message.sent", "message.imported", "message.received", "event.set")
        self.assertEqual(tuple(counts.get(point) for point in points), (3, 1, 4, 5))

    def test_killed_at_every_named_point_each_message_is_stored_once_received_once_and_each_event_set_once(self) -> None:
        counts = self.traced()
        targets = []
        for point, count in sorted(counts.items()):
            if point in NEW_POINTS or self.thorough:
                occurrences = range(1, count + 1) if count <= 4 or point in NEW_POINTS else sorted({1, 2, count // 2, count - 1, count})
            else:
                occurrences = range(1, 2)
            targets += [f"{point}:{occurrence}" for occurrence in occurrences]

        def killed_then_finished(target: str) -> None:
            """One case, in its own store: killed at ``target``, then run until done; each failure names the target."""
            case = self.fresh()
            reply = self.run_child(case, crash_at=target)
            self.assertEqual(reply["exit"], KILLED, f"{target} was not reached")
            self.after_kill(case)
            self.check(case, self.finish(case, f"killed at {target}"), f"killed at {target}")

        kills = sum(1 for _ in forked.concurrently(killed_then_finished, targets))
        self.assertGreaterEqual(kills, len(counts))


class SqliteTalkCrashTests(TalkCrashCase):
    kind = "sqlite"


class PostgresTalkCrashTests(TalkCrashCase):
    """The lease is judged by the server's clock: after a kill the next run waits for it to expire."""

    kind = "postgres"
    ttl = 1.0
    thorough = scale.FULL

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        pg_support.check()

    def fresh(self) -> dict[str, Any]:
        case = super().fresh()
        schema = pg_support.Schema()
        self.addCleanup(schema.drop)
        with open(os.path.join(case["work"], "schema"), "w") as handle:
            handle.write(f"{schema.driver} {schema.name}")
        dsn = pg_support.dsn()
        assert dsn is not None
        case["root"] = dsn
        case["schema"] = schema
        return case

    def run_child(self, case: dict[str, Any], **extra: Any) -> dict[str, Any]:
        request = {key: value for key, value in case.items() if key != "schema"}
        request["later"] += 100.0
        case["later"] = request["later"]
        return self.servers.run({**request, **extra}, f"run {case['work']} {extra}")

    def after_kill(self, case: dict[str, Any]) -> None:
        time.sleep(self.ttl + 0.3)

    def store(self, case: dict[str, Any]) -> Store:
        store = PostgresStore(case["schema"].factory())
        self.addCleanup(store.close)
        return store


class JsonTalkCrashTests(TalkCrashCase):
    pass


class AsyncJsonTalkCrashTests(TalkCrashCase):
    """The same tasks written ``async def``: the async driver performs the sends, reads and commits."""

    asynchronous = True
    thorough = scale.FULL


del TalkCrashCase


if __name__ == "__main__":
    unittest.main()
