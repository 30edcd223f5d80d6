"""Tasks that talk, in one process: messages (run.send, run.recv, fn.send), events (run.set_event,
fn.get_event) and compensation (run.effect(..., on_exhausted="raise")).

The store-dependent cases run against every store (``JsonFileStore``, ``SqliteStore``, and
``PostgresStore`` when ``LONGRUN_TEST_POSTGRES_DSN`` is set). The kill tests are in
``tests/test_talk_crash.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import os
import threading
import time
from typing import Any

from helpers import pg_support, support
import longrun
from longrun import (
    EffectFailed,
    InvalidInputError,
    JsonFileStore,
    Limits,
    LongrunError,
    PostgresStore,
    RetryPolicy,
    SignatureRequiredError,
    SizeLimitError,
    SqliteStore,
    Status,
    Store,
    TransientError,
    UnknownTaskError,
)
from longrun.authority import FileControlSource, SignedApprovals, sign_approval
from longrun.cli import main as cli_main
from longrun.engine import RECEIVE_POLL_S
from longrun.ledger import EffectState
from longrun.messages import MAX_MESSAGE_BYTES, RECV_ACTION, SEND_ACTION, Message
from longrun.outside_messages import pending_messages
from longrun.signing import generate_key_file
from longrun.task_events import EVENT_ACTION
from longrun.testing import FakeClock, OutboxAdapter


class Flaky:
    """A target that fails transiently ``failures`` times, then applies; counts every call."""

    deduplicates = True

    def __init__(self, failures: int):
        self.failures = failures
        self.applied: list[Any] = []
        self.calls = 0

    def apply(self, request: longrun.EffectRequest) -> longrun.Receipt:
        self.calls += 1
        if self.calls <= self.failures:
            raise TransientError(f"busy (call {self.calls})")
        self.applied.append(request.payload)
        return longrun.Receipt(result={"ok": True}, evidence="applied")

    def observe(self, request: longrun.EffectRequest) -> longrun.Observation:
        if request.payload in self.applied:
            return longrun.Observation.applied("found")
        return longrun.Observation.absent("not found")


class TalkCase(support.TempDirTest):
    def make_store(self) -> Store:
        return JsonFileStore(self.path("store"), create=True)

    def setUp(self) -> None:
        super().setUp()
        self.clock = FakeClock(1_700_000_000.0)
        self.store = self.make_store()
        self.outbox = OutboxAdapter(self.path("outbox.jsonl"))

    def durable(self, **options: Any) -> Any:
        settings: dict[str, Any] = dict(store=self.store, clock=self.clock, adapters={"ship": self.outbox}, allowed_actions=("ship",))
        settings.update(options)
        return longrun.durable(**settings)

    def messages(self, task: str) -> list[Any]:
        return [message.value for message in self.store.read_messages(task)]


class StoreCases(TalkCase):
    # -- messages -------------------------------------------------------------------------------

    def test_messages_are_received_oldest_first_once_each_and_kept_until_received(self) -> None:
        @self.durable()
        def consumer(run: longrun.Run, n: int) -> list[Any]:
            return [run.recv("orders") for _ in range(n)]

        first = consumer.run("c", 3)
        self.assertEqual(first.status, Status.AWAITING_INPUT)
        self.assertIn("longrun send", first.next_action)
        self.assertIn("'orders'", first.next_action)
        for i in range(2):  # sent before the receives that take them: kept
            consumer.send("c", "orders", {"n": i})
        consumer.send("c", "other", "not mine")
        second = consumer.run("c", 3)
        self.assertEqual(second.status, Status.AWAITING_INPUT, "two of three received, the third waits")
        consumer.send("c", "orders", {"n": 2})
        done = consumer.run("c", 3)
        self.assertEqual((done.status, done.result), (Status.DONE, [{"n": 0}, {"n": 1}, {"n": 2}]))
        self.assertEqual(consumer.run("c", 3).result, done.result, "replay returns what was received")
        state = self.store.load("c").state
        received = sorted(record.result["seq"] for record in state.effects.values() if record.action == RECV_ACTION)
        self.assertEqual(received, [1, 2, 3], "numbered as received: a message from outside enters the mailbox then")
        self.assertEqual(self.messages("c"), [{"n": 0}, {"n": 1}, {"n": 2}])
        pending, _ = pending_messages(self.store.read_approvals("c"), "c", state.plan_digest, state.consumed_approvals)
        self.assertEqual([(message.topic, message.value) for _, message in pending], [("other", "not mine")], "kept, not consumed")

    def test_a_fork_keeps_the_receives_it_copied_and_receives_its_own_mailbox_from_its_first_message(self) -> None:
        @self.durable()
        def consumer(run: longrun.Run) -> list[Any]:
            first = run.recv("t")
            second = run.recv("t")
            return [first, second]

        consumer.run("c")
        consumer.send("c", "t", "origin's first")
        self.assertEqual(consumer.run("c").status, Status.AWAITING_INPUT)
        consumer.fork("c", "c2", from_step="longrun.recv:t@2")
        consumer.send("c2", "t", "fork's first")  # number 1 in the fork's own mailbox
        self.assertEqual(consumer.resume("c2").result, ["origin's first", "fork's first"])

    def test_fifo_merges_the_tasks_messages_in_commit_order_with_those_from_outside_in_send_order(self) -> None:
        @self.durable()
        def consumer(run: longrun.Run) -> list[Any]:
            return [run.recv("t") for _ in range(4)]

        @self.durable()
        def producer(run: longrun.Run, to: str, values: list[int]) -> None:
            for value in values:
                run.send(to, "t", value)

        consumer.run("c")
        producer.run("p1", "c", [1])
        self.clock.advance(1.0)
        consumer.send("c", "t", 2)  # from outside: a control record, in the order it was sent
        self.clock.advance(1.0)
        producer.run("p2", "c", [3, 4])
        self.assertEqual(consumer.run("c").result, [1, 2, 3, 4])

    def test_a_send_is_recorded_once_and_replay_sends_nothing(self) -> None:
        @self.durable()
        def receiver(run: longrun.Run) -> Any:
            return run.recv("t")

        @self.durable()
        def sender(run: longrun.Run) -> list[int]:
            first = run.send("r", "t", {"a": 1})
            second = run.send("r", "t", {"a": 2})
            run.ask("wait", "go on?")  # stops the run after the sends: the next run replays them
            return [first, second]

        receiver.run("r")
        self.assertEqual(sender.run("s").status, Status.AWAITING_INPUT)
        self.assertEqual(sender.run("s").status, Status.AWAITING_INPUT)
        self.assertEqual(self.messages("r"), [{"a": 1}, {"a": 2}])
        state = self.store.load("s").state
        sends = [record for record in state.effects.values() if record.action == SEND_ACTION]
        self.assertEqual([record.result for record in sends], [{"seq": 1, "duplicate": False}, {"seq": 2, "duplicate": False}])
        self.assertEqual([record.payload["key"] for record in sends], ["s:longrun.send:r/t@1", "s:longrun.send:r/t@2"])

    def test_a_key_deduplicates_at_the_receiver_whoever_sends(self) -> None:
        @self.durable()
        def receiver(run: longrun.Run) -> Any:
            return [run.recv("t"), run.recv("t", timeout_s=0)]

        @self.durable()
        def sender(run: longrun.Run) -> list[int]:
            return [run.send("r", "t", "first", key="order-7"), run.send("r", "t", "again", key="order-7")]

        self.assertEqual(receiver.run("r").status, Status.AWAITING_INPUT)
        first = receiver.send("r", "t", "from outside", key="order-7")
        self.assertEqual((first.duplicate, first.seq, first.key, first.written_to), (False, 0, "order-7", None))
        self.assertIsNotNone(first.record_id)
        again = receiver.send("r", "t", "from outside, again", key="order-7")  # not in the mailbox yet: written
        self.assertNotEqual(again.record_id, first.record_id)
        self.assertEqual(receiver.run("r").result, ["from outside", None], "two records with one key: received once")
        self.assertEqual(sender.run("s").result, [1, 1])
        self.assertEqual(self.messages("r"), ["from outside"])
        self.assertEqual(receiver.send("r", "t", "from outside", key="order-7"), longrun.Posted("r", "t", "order-7", None, duplicate=True, seq=1))
        state = self.store.load("r").state
        self.assertEqual(sorted(state.consumed_approvals), sorted([first.record_id, again.record_id]))

    def test_a_message_from_outside_goes_through_a_strict_control_root_and_not_the_store(self) -> None:
        control = self.path("control")
        os.makedirs(control)
        source = FileControlSource(control, approver_uid=os.geteuid())

        @self.durable(approvals=source)
        def consumer(run: longrun.Run) -> list[Any]:
            return [run.recv("orders"), run.recv("orders")]

        self.assertEqual(consumer.run("c").status, Status.AWAITING_INPUT)
        consumer.send("c", "orders", "in the store")  # not where this function reads: not delivered
        self.assertEqual(consumer.run("c").status, Status.AWAITING_INPUT)
        writer = FileControlSource(control, strict=False)
        posted = consumer.send("c", "orders", "through the root", write_to=writer)
        assert posted.written_to is not None and posted.record_id is not None
        self.assertTrue(posted.written_to.startswith(control))
        # A record the strict source refuses (writable by others) is not used, and stays where it is.
        os.chmod(posted.written_to, 0o666)
        outcome = consumer.run("c")
        self.assertEqual(outcome.status, Status.AWAITING_INPUT)
        self.assertIn("1 control record not used", outcome.next_action)
        self.assertTrue(any("writable" in item.detail for item in outcome.unknowns), outcome.unknowns)
        os.chmod(posted.written_to, 0o600)
        self.assertEqual(consumer.run("c").status, Status.AWAITING_INPUT, "one received, the second receive waits")
        spec = getattr(self.store, "spec", None)
        if isinstance(spec, str):
            code, out = self.cli("send", spec, "c", "orders", '"from the shell"', "--control-root", control, "--json")
            self.assertEqual((code, json.loads(out)["written_to"].startswith(control)), (0, True))
        else:
            consumer.send("c", "orders", "from the shell", write_to=writer)
        done = consumer.run("c")
        self.assertEqual((done.status, done.result), (Status.DONE, ["through the root", "from the shell"]))
        self.assertEqual(self.messages("c"), ["through the root", "from the shell"], "each put in the mailbox once, as received")
        state = self.store.load("c").state
        pending, _ = pending_messages(self.store.read_approvals("c"), "c", state.plan_digest, state.consumed_approvals)
        self.assertEqual([message.value for _, message in pending], ["in the store"], "the store's record is kept, not used")

    def test_signed_only_a_message_is_received_when_signed_and_refused_unsigned_nothing_lost(self) -> None:
        key_file = self.path("ops.key")
        key = generate_key_file(key_file)
        signed_only = SignedApprovals(self.store, key)

        @self.durable(approvals=signed_only)
        def consumer(run: longrun.Run) -> Any:
            return run.recv("orders")

        self.assertEqual(consumer.run("c").status, Status.AWAITING_INPUT)
        with self.assertRaises(SignatureRequiredError):
            consumer.send("c", "orders", "unsigned")
        self.assertEqual(self.store.read_approvals("c"), (), "refused before anything was written")
        # Written unsigned by a writer that does not know (the shell, another function): not delivered.
        plain = consumer.with_options(approvals=self.store)
        unsigned = plain.send("c", "orders", "unsigned")
        outcome = consumer.run("c")
        self.assertEqual(outcome.status, Status.AWAITING_INPUT)
        self.assertIn("--sign-key", outcome.next_action)
        self.assertIn("1 control record not used", outcome.next_action)
        self.assertTrue(any("not signed" in item.detail for item in outcome.unknowns), outcome.unknowns)
        self.assertEqual(self.messages("c"), [], "nothing delivered")
        spec = getattr(self.store, "spec", None)
        if isinstance(spec, str):
            code, out = self.cli("send", spec, "c", "orders", '"signed"', "--sign-key", key_file)
            self.assertEqual(code, 0, out)
            self.assertIn("signed  hmac-sha256 with key", out)
        else:
            consumer.send("c", "orders", "signed", sign=functools.partial(sign_approval, key=key))
        done = consumer.run("c")
        self.assertEqual((done.status, done.result), (Status.DONE, "signed"))
        state = self.store.load("c").state
        self.assertNotIn(unsigned.record_id, state.consumed_approvals, "the unsigned record is kept, never used")
        pending, _ = pending_messages(self.store.read_approvals("c"), "c", state.plan_digest, state.consumed_approvals)
        self.assertEqual([approval.approval_id for approval, _ in pending], [unsigned.record_id], "it is still there: sign it and send again")

    def test_a_message_from_outside_is_refused_with_typed_errors_and_nothing_is_written(self) -> None:
        @self.durable()
        def consumer(run: longrun.Run) -> Any:
            return run.recv("orders")

        consumer.run("c")
        for value, error in ((float("nan"), InvalidInputError), ("x" * (MAX_MESSAGE_BYTES - 100), SizeLimitError)):
            with self.subTest(error=error.__name__), self.assertRaises(error):
                consumer.send("c", "orders", value)
        with self.assertRaises(InvalidInputError):
            consumer.send("c", "no spaces", 1)
        with self.assertRaises(UnknownTaskError):
            consumer.send("nobody", "orders", 1)
        self.assertEqual(self.store.read_approvals("c"), ())

    def test_a_timeout_returns_none_and_replay_returns_none_again(self) -> None:
        @self.durable(limits=Limits(max_block_s=30.0))
        def waiter(run: longrun.Run) -> list[Any]:
            late = run.recv("late", timeout_s=5.0)  # within max_block_s: waited for in the process
            later = run.recv("late", timeout_s=3600.0)
            return [late, later]

        started = self.clock.now()
        outcome = waiter.run("w")
        self.assertEqual(outcome.status, Status.AWAITING_INPUT)
        self.assertGreaterEqual(self.clock.now() - started, 5.0)
        self.assertLess(self.clock.now() - started, 5.0 + 2 * RECEIVE_POLL_S)
        self.assertIsNotNone(outcome.wake_at)
        self.assertIn("times out", outcome.next_action)
        waiter.send("w", "late", "too late for the first")
        self.clock.advance(3600.0)
        done = waiter.run("w")
        self.assertEqual((done.status, done.result), (Status.DONE, [None, "too late for the first"]))
        # The timed-out receive replays as None although a message now waits: it stays for others.
        self.assertEqual(waiter.run("w").result, [None, "too late for the first"])

    def test_a_long_timeout_stops_awaiting_input_until_its_end_recorded_at_the_first_reach(self) -> None:
        @self.durable()
        def waiter(run: longrun.Run) -> Any:
            return run.recv("t", timeout_s=1000.0)

        first = waiter.run("w")
        self.assertEqual(first.status, Status.AWAITING_INPUT)
        self.assertEqual(first.wake_at, 1_700_000_000.0 + 1000.0)
        self.clock.advance(600.0)
        self.assertEqual(waiter.run("w").wake_at, first.wake_at, "the end was recorded when the step was first reached")
        self.clock.advance(400.0)
        self.assertEqual(waiter.run("w").result, None)

    def test_bad_messages_are_refused_with_typed_errors_and_nothing_is_recorded(self) -> None:
        calls: list[str] = []

        @self.durable()
        def sender(run: longrun.Run, what: str) -> Any:
            calls.append(what)
            if what == "not-json":
                return run.send("r", "t", {"a": {1, 2}})
            if what == "too-big":
                return run.send("r", "t", "x" * MAX_MESSAGE_BYTES)
            if what == "bad-topic":
                return run.send("r", "no spaces", 1)
            return run.send("nobody", "t", 1)

        @self.durable()
        def receiver(run: longrun.Run) -> Any:
            return run.recv("t")

        receiver.run("r")
        for what, error in (("not-json", InvalidInputError), ("too-big", SizeLimitError), ("bad-topic", InvalidInputError)):
            with self.subTest(what), self.assertRaises(error):
                sender.run(f"s-{what}", what)
            state = self.store.load(f"s-{what}").state
            self.assertFalse([record for record in state.effects.values() if record.action == SEND_ACTION])
        with self.assertRaises(UnknownTaskError) as caught:
            sender.run("s-unknown", "unknown")
        self.assertIn("nobody", str(caught.exception))
        with self.assertRaises(UnknownTaskError):  # recorded: raised again, the send not tried again
            sender.run("s-unknown", "unknown")
        self.assertEqual(self.messages("r"), [])
        with self.assertRaises(UnknownTaskError):
            receiver.send("nobody", "t", 1)
        with self.assertRaises(SizeLimitError):
            receiver.send("r", "t", "x" * MAX_MESSAGE_BYTES)
        with self.assertRaises(InvalidInputError):
            receiver.send("r", "t", float("nan"))
        self.assertEqual(self.messages("r"), [])

    def test_a_changed_send_stops_plan_mismatch(self) -> None:
        @self.durable()
        def receiver(run: longrun.Run) -> Any:
            return run.recv("t")

        value = {"v": 1}

        @self.durable()
        def sender(run: longrun.Run) -> None:
            run.send("r", "t", dict(value))
            run.ask("hold", "hold?")

        receiver.run("r")
        sender.run("s")
        value["v"] = 2
        outcome = sender.run("s")
        self.assertEqual(outcome.status, Status.PLAN_MISMATCH)
        self.assertIn("longrun.send:r/t@1", outcome.next_action)
        self.assertEqual(self.messages("r"), [{"v": 1}])

    def test_the_async_face_sends_and_receives_and_parallel_receives_take_distinct_messages(self) -> None:
        @self.durable()
        async def consumer(run: longrun.AsyncRun) -> list[Any]:
            pair = await asyncio.gather(run.recv("t"), run.recv("t"))
            await run.set_event("got", sorted(pair))
            return sorted(pair)

        @self.durable()
        async def producer(run: longrun.AsyncRun) -> int:
            await run.send("c", "t", 1)
            return await run.send("c", "t", 2)

        self.assertEqual(consumer.run("c").status, Status.AWAITING_INPUT)
        self.assertEqual(producer.run("p").result, 2)
        done = consumer.run("c")
        self.assertEqual((done.status, done.result), (Status.DONE, [1, 2]))
        self.assertEqual(consumer.get_event("c", "got"), [1, 2])

    # -- events ---------------------------------------------------------------------------------

    def test_events_latest_value_wins_each_set_is_recorded_once(self) -> None:
        @self.durable()
        def publisher(run: longrun.Run) -> None:
            run.set_event("phase", "start")
            run.set_event("count", 1)
            run.set_event("phase", {"at": "middle"})
            run.ask("hold", "hold?")
            run.set_event("phase", "end")

        self.assertEqual(publisher.run("e").status, Status.AWAITING_INPUT)
        self.assertEqual(publisher.get_event("e", "phase"), {"at": "middle"})
        self.assertEqual(publisher.get_event("e", "count"), 1)
        self.assertIsNone(publisher.get_event("e", "never"))
        publisher.run("e")
        state = self.store.load("e").state
        events = sorted(record.result["seq"] for record in state.effects.values() if record.action == EVENT_ACTION)
        self.assertEqual(events, [1, 2, 3], "replay set nothing again")
        with self.assertRaises(UnknownTaskError):
            publisher.get_event("nobody", "phase")
        with self.assertRaises(InvalidInputError):
            publisher.get_event("e", "no spaces")

    def test_get_event_waits_for_a_key_to_be_set(self) -> None:
        @longrun.durable(store=self.store)
        def publisher(run: longrun.Run) -> None:
            run.recv("go")
            run.set_event("ready", True)

        publisher.run("p")  # the task exists, the key is not set yet
        self.assertIsNone(publisher.get_event("p", "ready", timeout_s=0.2))

        def go() -> None:
            publisher.send("p", "go", 1)
            publisher.run("p")

        later = threading.Timer(0.3, go)
        later.start()
        self.addCleanup(later.join)
        self.assertIs(publisher.get_event("p", "ready", timeout_s=60.0), True)

    def test_bad_events_are_refused_and_nothing_is_recorded(self) -> None:
        @self.durable()
        def publisher(run: longrun.Run, what: str) -> None:
            if what == "big":
                run.set_event("k", "x" * MAX_MESSAGE_BYTES)
            elif what == "json":
                run.set_event("k", object())
            else:
                run.set_event("bad key", 1)

        for what, error in (("big", SizeLimitError), ("json", InvalidInputError), ("key", InvalidInputError)):
            with self.subTest(what), self.assertRaises(error):
                publisher.run(f"e-{what}", what)
            self.assertEqual(longrun.task_events.events_of(self.store.load(f"e-{what}").state), {})

    # -- compensation ----------------------------------------------------------------------------

    def saga(self, target: Flaky, **options: Any) -> Any:
        @self.durable(
            adapters={"charge": target, "ship": self.outbox}, allowed_actions=("charge", "ship"),
            limits=Limits(max_attempts=3), retry=RetryPolicy(base_delay_s=0.01, max_delay_s=0.01, jitter=0.0), **options,
        )  # fmt: skip
        def order(run: longrun.Run) -> dict[str, Any]:
            run.effect("reserve", "ship", {"reserve": 1})
            try:
                run.effect("charge", "charge", {"amount": 5}, on_exhausted="raise")
            except EffectFailed as failed:
                run.effect("release", "ship", {"release": 1, "because": failed.last_error})
                return {"compensated": failed.step_id, "attempts": failed.attempts}
            return {"charged": True}

        return order

    def test_an_exhausted_effect_raises_effect_failed_into_the_function_and_replays_it(self) -> None:
        target = Flaky(failures=100)
        order = self.saga(target)
        done = order.run("o")
        self.assertEqual((done.status, done.result), (Status.DONE, {"compensated": "charge", "attempts": 3}))
        self.assertEqual(target.calls, 3)
        self.assertEqual(self.outbox.counts(), {"o/reserve": 1, "o/release": 1})
        record = self.store.load("o").state.effects["charge"]
        self.assertEqual(record.state, EffectState.FAILED)
        self.assertEqual(record.result, {"type": "EffectFailed", "attempts": 3, "last_error": "transient: busy (call 3)"})
        code, out = self.cli("verify", self.store.spec, "o") if isinstance(getattr(self.store, "spec", None), str) else (0, "ok ledger")
        self.assertEqual(code, 0, out)  # a failure raised into the function and handled is no damage
        again = order.run("o")
        self.assertEqual(again.result, done.result)
        self.assertEqual(target.calls, 3, "replay raised the recorded failure without trying again")
        self.assertEqual(self.outbox.counts(), {"o/reserve": 1, "o/release": 1})

    def test_a_reopen_tries_again_what_stopped_the_run_never_an_effect_failed_the_function_handled(self) -> None:
        card, courier = Flaky(failures=100), Flaky(failures=3)

        @self.durable(
            adapters={"charge": card, "ship": courier}, allowed_actions=("charge", "ship"),
            limits=Limits(max_attempts=3), retry=RetryPolicy(base_delay_s=0.01, max_delay_s=0.01, jitter=0.0),
        )  # fmt: skip
        def order(run: longrun.Run) -> str:
            try:
                run.effect("charge", "charge", {"amount": 5}, on_exhausted="raise")
            except EffectFailed:
                run.effect("notify", "ship", {"note": "not charged"})  # stops limits-exhausted: the courier is down
                return "compensated"
            return "charged"

        self.assertEqual(order.run("o").status, Status.LIMITS_EXHAUSTED)
        self.assertEqual((card.calls, courier.calls), (3, 3))
        done = order.reopen("o", "the courier is back", by="ops", add_attempts=1)
        self.assertEqual((done.status, done.result), (Status.DONE, "compensated"))
        self.assertEqual(card.calls, 3, "the handled EffectFailed replays as recorded: the charge is not tried again")
        self.assertEqual(courier.applied, [{"note": "not charged"}])

    def test_an_effect_that_succeeds_within_its_attempts_raises_nothing(self) -> None:
        target = Flaky(failures=2)
        self.assertEqual(self.saga(target).run("o").result, {"charged": True})
        self.assertEqual(self.outbox.counts(), {"o/reserve": 1})

    def test_without_on_exhausted_raise_the_run_stops_limits_exhausted(self) -> None:
        target = Flaky(failures=100)

        @self.durable(adapters={"charge": target}, allowed_actions=("charge",), limits=Limits(max_attempts=2), retry=RetryPolicy(base_delay_s=0.01, max_delay_s=0.01, jitter=0.0))
        def plain(run: longrun.Run) -> None:
            run.effect("charge", "charge", {"amount": 5})

        self.assertEqual(plain.run("p").status, Status.LIMITS_EXHAUSTED)

    def test_effect_failed_is_a_longrun_error_that_names_the_step_attempts_and_error(self) -> None:
        failed = EffectFailed("charge", 3, "transient: busy")
        self.assertIsInstance(failed, LongrunError)
        self.assertEqual((failed.step_id, failed.attempts, failed.last_error), ("charge", 3, "transient: busy"))
        self.assertIn("charge", str(failed))

        @self.durable()
        def bad(run: longrun.Run) -> None:
            run.effect("x", "ship", {}, on_exhausted="ignore")

        with self.assertRaises(InvalidInputError):
            bad.run("b")

    # -- the command line ------------------------------------------------------------------------

    def test_status_shows_events_and_the_mailbox_and_the_cli_sends_and_reads(self) -> None:
        spec = getattr(self.store, "spec", None)
        if not isinstance(spec, str):
            self.skipTest("a store the command line cannot name")

        @self.durable()
        def task(run: longrun.Run) -> Any:
            run.set_event("phase", {"step": 1})
            return run.recv("orders")

        task.run("t")
        code, out = self.cli("send", spec, "t", "orders", '{"n": 1}', "--key", "k1", "--json")
        sent = json.loads(out)
        self.assertEqual((code, sent["seq"], sent["duplicate"], sent["key"], sent["written_to"]), (0, None, False, "k1", None))
        self.assertTrue(sent["record_id"])
        code, out = self.cli("status", spec, "t")
        self.assertIn('phase = {"step": 1}', out)
        self.assertIn("messages     0 in the mailbox, 0 received; from outside, not yet received: orders 1", out)
        code, out = self.cli("status", spec, "t", "--json")
        self.assertEqual(json.loads(out)["mailbox"], {"messages": 0, "received": 0, "waiting": {}, "outside": {"orders": 1}})
        code, out = self.cli("event", spec, "t", "phase")
        self.assertEqual((code, json.loads(out)), (0, {"step": 1}))
        code, _ = self.cli("event", spec, "t", "missing", "--wait", "0.1")
        self.assertEqual(code, 1)
        code, _ = self.cli("send", spec, "nobody", "orders", "1")
        self.assertEqual(code, 2)
        self.assertEqual(task.run("t").result, {"n": 1})
        code, out = self.cli("send", spec, "t", "orders", '{"n": 1}', "--key", "k1")
        self.assertEqual(code, 0)
        self.assertIn("not sent again: task t already holds message 1 with key 'k1'", out)
        code, out = self.cli("status", spec, "t")
        self.assertIn("messages     1 in the mailbox, 1 received\n", out)

    def test_status_of_a_task_with_a_damaged_message_still_shows_the_state_and_names_the_damage(self) -> None:
        if not isinstance(self.store, JsonFileStore):
            self.skipTest("damaged on the JSON-file store's files (the store contract damages every store)")

        @self.durable()
        def task(run: longrun.Run) -> Any:
            return run.recv("orders")

        task.run("t")
        self.store.send_message(Message.of("t", "orders", 1, key="k", sender="a test", sent_at=self.clock.now()))
        directory = self.path("store", "t", "messages")
        [name] = os.listdir(directory)
        with open(os.path.join(directory, name), "r+b") as handle:
            handle.write(b"#")
        code, out = self.cli("status", self.store.spec, "t")
        self.assertEqual(code, 0)
        self.assertIn("status       awaiting-input", out)
        self.assertIn("the mailbox cannot be read", out)
        outcome = task.run("t")  # the receive refuses to guess: a person looks
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertIn("mailbox", outcome.next_action)

    def test_the_console_task_page_shows_each_events_latest_value_escaped(self) -> None:
        from longrun.cli._console_pages import Console

        @self.durable()
        def task(run: longrun.Run) -> None:
            run.set_event("phase", "<b>one</b>")
            run.set_event("phase", "<b>two</b>")

        console = Console(self.store, "store", read_only=True, approver="a", sign_key=None, control_root=None)
        task.run("t")
        page = console.task_page("t", {})
        self.assertIn("<h2>Events</h2>", page)
        self.assertIn("&lt;b&gt;two&lt;/b&gt;", page)
        self.assertNotIn("one</b>", page.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"'))

    def cli(self, *argv: str) -> tuple[int, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(list(argv))
        return code, out.getvalue()


    # -- a worker fleet -------------------------------------------------------------------------

    def serve(self, functions: list[Any], until: Any) -> None:
        """Run a worker in a thread until ``until()`` holds (a liveness guard of 60 s), then stop it."""
        from longrun.worker import Worker

        worker = Worker(self.store, functions, poll_s=0.05, rescan_s=0.05, claim_ttl_s=5.0)
        thread = threading.Thread(target=lambda: asyncio.run(worker.serve()))
        thread.start()
        try:
            deadline = time.monotonic() + 60.0
            while not until():
                if time.monotonic() > deadline or not thread.is_alive():
                    self.fail("the worker did not get there")
                time.sleep(0.02)
        finally:
            worker.stop()
            thread.join(60.0)

    def status(self, task_id: str) -> str:
        try:
            state = self.store.load(task_id).state
        except UnknownTaskError:
            return "unknown"
        return "none" if state is None else state.status.value

    def test_a_worker_runs_a_receiver_again_when_a_message_is_sent_to_it_or_its_receive_times_out(self) -> None:
        @longrun.durable(store=self.store, lease_ttl_s=5.0)
        def consumer(run: longrun.Run) -> list[Any]:
            first = run.recv("orders")
            late = run.recv("late", timeout_s=0.5)  # past Limits.max_block_s below: the run stops until then
            return [first, late]

        consumer = consumer.with_options(limits=Limits(max_block_s=0.05))
        consumer.start("c")
        self.serve([consumer], lambda: self.status("c") == "awaiting-input")
        consumer.send("c", "orders", {"n": 1})
        self.serve([consumer], lambda: self.status("c") == "done")
        self.assertEqual(self.store.load("c").state.effects["longrun.function"].result, [{"n": 1}, None])


    def test_a_worker_runs_a_receiver_again_when_a_message_arrives_through_a_strict_control_root(self) -> None:
        control = self.path("control")
        os.makedirs(control)
        source = FileControlSource(control, approver_uid=os.geteuid())

        @longrun.durable(store=self.store, lease_ttl_s=5.0, approvals=source)
        def consumer(run: longrun.Run) -> Any:
            return run.recv("orders")

        consumer.start("c")
        self.serve([consumer], lambda: self.status("c") == "awaiting-input")
        consumer.send("c", "orders", {"n": 1}, write_to=FileControlSource(control, strict=False))
        self.serve([consumer], lambda: self.status("c") == "done")
        self.assertEqual(self.store.load("c").state.effects["longrun.function"].result, {"n": 1})


class JsonFileStoreTests(StoreCases):
    pass


class SqliteStoreTests(StoreCases):
    def make_store(self) -> Store:
        store = SqliteStore(self.path("longrun.sqlite"), create=True)
        self.addCleanup(store.close)
        return store


class PostgresStoreTests(StoreCases):
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


del StoreCases
