"""The operator's interventions, on every store: ``resolve`` (an uncertain effect's outcome as a person
saw it), ``resume --reopen`` (a task that ended unfinished goes on) and ``fork`` (a new task from a step).

The durable functions are in ``helpers/ops_tasks.py``, decorated with an empty ``MemoryStore``: every
run here names the test's store (``with_options``), and ``longrun resume STORE TASK`` must run them on
STORE. Their one target counts applies per key (``calls``) and what it really received (``sent``).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import time
import unittest
from unittest import mock
from typing import Any

from helpers import ops_tasks, pg_support, support
from longrun import Approval, JsonFileStore, SqliteStore, Status, Store
from longrun.authority import FileControlSource, SignedApprovals, sign_approval
from longrun.cli import main
from longrun.errors import (
    ForkRefusedError, InvalidInputError, ReopenRefusedError, ResolveRefusedError, TaskExistsError, UnknownStepError, UnknownTaskError,
)  # fmt: skip
from longrun.intervention import RESOLVE_ACTION, Resolution, reopen, resolve
from longrun.ledger import EffectState
from longrun.signing import generate_key_file
from longrun.stores import PostgresStore


def run_cli(*args: str) -> tuple[int, str, str]:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(list(args))
    return int(code), out.getvalue(), err.getvalue()


class OperatorCases(support.TempDirTest):
    """The same cases on every store; a subclass makes the store and names its spec for the CLI."""

    def make_store(self) -> tuple[Store, str]:
        raise NotImplementedError

    def setUp(self) -> None:
        super().setUp()
        self.store, self.spec = self.make_store()
        self.target = ops_tasks.TARGET

    def fn(self, function: Any, **options: Any) -> Any:
        return function.with_options(store=self.store, **options)

    def run_quietly(self, function: Any, task_id: str, *args: Any) -> Any:
        """Run a task whose apply raises on purpose: the warning it logs is asserted, not printed."""
        with self.assertLogs("longrun", level="WARNING") as logs:
            outcome = function.run(task_id, *args)
        self.assertTrue(any("raised ConnectionError" in line for line in logs.output), logs.output)
        return outcome

    def unsafe_charge(self, task_id: str, *, lose: str, **options: Any) -> Any:
        """``order`` stopped unsafe-to-continue at 'charge', whose answer was lost (before or after sending)."""
        self.target.reset(self.path(f"outbox-{task_id}.jsonl"), **{lose: {"charge"}}, blind={"charge"} if lose == "lose_after" else ())
        function = self.fn(ops_tasks.order, **options)
        outcome = self.run_quietly(function, task_id, 1)
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertIn(f"longrun resolve", outcome.next_action)
        self.assertEqual(function.run(task_id, 1).status, Status.UNSAFE_TO_CONTINUE, "without a resolution it stays unsafe")
        return function

    def state(self, task_id: str) -> Any:
        state = self.store.load(task_id).state
        assert state is not None
        return state

    # -- resolve ---------------------------------------------------------------------------------

    def test_resolve_applied_then_the_run_completes_without_applying_it_again_and_records_the_person(self) -> None:
        self.unsafe_charge("t1", lose="lose_after")
        code, out, err = run_cli(
            "resolve", self.spec, "t1", "charge", "--applied", "--evidence", "payment 991 in the gateway log",
            "--result", '{"payment": 991}', "--by", "ann",
        )  # fmt: skip
        self.assertEqual(code, 0, err)
        self.assertIn("resolved step charge of task t1 as applied", out)
        # resume STORE TASK runs on STORE (the function was decorated with an empty MemoryStore).
        code, out, err = run_cli("resume", self.spec, "t1")
        self.assertEqual(code, 0, out + err)
        self.assertEqual(self.state("t1").status, Status.DONE)
        self.assertEqual(ops_tasks.PLACEHOLDER.list_tasks(), [], "nothing ran on the decorated store")
        self.assertEqual(self.target.calls["t1/charge"], 1, "applied once, never again")
        self.assertEqual(self.target.sent(), {"t1/reserve": 1, "t1/charge": 1, "t1/ship": 1})
        charge = self.state("t1").effects["charge"]
        self.assertEqual((charge.state, charge.result), (EffectState.VERIFIED, {"payment": 991}))
        self.assertIn("ann checked the target", charge.evidence or "")
        people = [item for item in self.state("t1").control_observations if item.source == "person:ann"]
        self.assertEqual(len(people), 1)
        self.assertIn("payment 991 in the gateway log", people[0].detail)
        code, out, _ = run_cli("history", self.spec, "t1")
        self.assertIn("recorded effect 't1/charge' as applied", out)

    def test_resolve_absent_then_the_run_applies_it_again_exactly_once(self) -> None:
        function = self.unsafe_charge("t2", lose="lose_before")
        approval = resolve(self.store, "t2", "charge", applied=False, evidence="no payment for order 1", by="bob")
        self.assertEqual(Resolution.from_json(approval.answer).outcome, "absent")
        outcome = function.run("t2", 1)
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(self.target.calls["t2/charge"], 2, "the lost attempt and one more")
        self.assertEqual(self.target.sent(), {"t2/reserve": 1, "t2/charge": 1, "t2/ship": 1}, "the target got it once")
        self.assertTrue(any(item.source == "person:bob" for item in outcome.observations))

    def test_a_resolution_is_used_once_and_a_replayed_one_is_not_used(self) -> None:
        function = self.unsafe_charge("t3", lose="lose_before")
        first = resolve(self.store, "t3", "charge", applied=False, evidence="not there", by="bob")
        self.target.lose_before.add("charge")  # the next attempt loses its answer too
        self.assertEqual(self.run_quietly(function, "t3", 1).status, Status.UNSAFE_TO_CONTINUE)
        self.assertIn(first.approval_id, self.state("t3").consumed_approvals)
        self.store.write_approval(first)  # the same record again: it was used
        outcome = function.run("t3", 1)
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertTrue(any("already used" in item.detail for item in outcome.unknowns), outcome.unknowns)
        self.assertEqual(self.target.calls["t3/charge"], 2)
        code, _, err = run_cli("resolve", self.spec, "t3", "charge", "--absent", "--evidence", "still not there")
        self.assertEqual(code, 0, err)
        self.assertEqual(function.run("t3", 1).status, Status.DONE)
        self.assertEqual(self.target.sent()["t3/charge"], 1)

    def test_a_resolution_bound_to_another_payload_key_or_plan_is_not_used(self) -> None:
        function = self.unsafe_charge("t4", lose="lose_after")
        good = resolve(self.store, "t4", "charge", applied=True, evidence="seen", by="ann", write_to=_Discard())
        wrong_payload = Approval.from_json({**good.to_json(), "approval_id": "p" * 32, "payload_digest": "sha256:" + "0" * 64})
        wrong_plan = Approval.from_json({**good.to_json(), "approval_id": "q" * 32, "plan_digest": "sha256:" + "1" * 64})
        other_key = {**Resolution.from_json(good.answer).to_json(), "key": "t4/other"}
        wrong_key = Approval.from_json({**good.to_json(), "approval_id": "k" * 32, "answer": other_key})
        for approval in (wrong_payload, wrong_plan, wrong_key):
            self.store.write_approval(approval)
        outcome = function.run("t4", 1)
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE)
        reasons = " | ".join(item.detail for item in outcome.unknowns)
        self.assertIn("binds payload sha256:000", reasons)
        self.assertIn("does not match the task in plan digest", reasons)
        self.assertIn("names effect key 't4/other'", reasons)
        self.assertEqual(self.state("t4").effects["charge"].state, EffectState.UNCERTAIN)

    def test_resolve_refuses_bad_input_with_typed_errors_and_exit_2_writing_nothing(self) -> None:
        self.unsafe_charge("t5", lose="lose_after")
        record = self.state("t5").effects["charge"]
        with self.assertRaises(UnknownTaskError):
            resolve(self.store, "nosuch", "charge", applied=True, evidence="x", by="ann")
        with self.assertRaises(UnknownStepError):
            resolve(self.store, "t5", "nosuch", applied=True, evidence="x", by="ann")
        with self.assertRaises(ResolveRefusedError):
            resolve(self.store, "t5", "reserve", applied=True, evidence="x", by="ann")  # verified: not in flight
        with self.assertRaises(ResolveRefusedError):
            resolve(self.store, "t5", "charge", applied=True, evidence="x", by="ann", payload_digest="sha256:" + "2" * 64)
        with self.assertRaises(ResolveRefusedError):
            resolve(self.store, "t5", "charge", applied=True, evidence="x", by="ann", key="t5/other")
        cases = [
            ("nosuch", "charge", "--applied", "--evidence", "x"),
            ("t5", "nosuch", "--applied", "--evidence", "x"),
            ("t5", "reserve", "--applied", "--evidence", "x"),
            ("t5", "charge", "--applied", "--evidence", "x", "--key", "t5/other"),
            ("t5", "charge", "--applied", "--evidence", "x", "--payload-digest", "sha256:" + "3" * 64),
            ("t5", "charge", "--absent", "--evidence", "x", "--result", "1"),
            ("t5", "charge", "--applied", "--evidence", "x", "--result", "{not json"),
            ("t5", "charge", "--applied"),
            ("t5", "charge", "--applied", "--absent", "--evidence", "x"),
            ("t5", "charge", "--evidence", "x"),
        ]
        for case in cases:
            with self.subTest(case=case):
                code, out, err = run_cli("resolve", self.spec, *case)
                self.assertEqual(code, 2, out + err)
                self.assertIn("error:", err)
                self.assertEqual(out, "", "nothing is said to have been written")
        self.assertEqual([r for r in self.store.read_approvals("t5") if isinstance(r.body, dict) and r.body.get("action") == RESOLVE_ACTION], [])
        code, _, err = run_cli(
            "resolve", self.spec, "t5", "charge", "--applied", "--evidence", "seen", "--key", record.key, "--payload-digest", record.payload_digest,
            "--json",
        )  # fmt: skip
        self.assertEqual(code, 0, err)

    def test_resolve_through_a_strict_control_root_and_not_from_the_store(self) -> None:
        control = self.path("control")
        os.makedirs(control)
        source = FileControlSource(control, approver_uid=os.geteuid())
        function = self.unsafe_charge("s1", lose="lose_after", approvals=source)
        self.assertEqual(run_cli("resolve", self.spec, "s1", "charge", "--applied", "--evidence", "in the store: not read")[0], 0)
        self.assertEqual(function.run("s1", 1).status, Status.UNSAFE_TO_CONTINUE, "the store is not where this run reads")
        code, out, err = run_cli("resolve", self.spec, "s1", "charge", "--applied", "--evidence", "seen", "--control-root", control)
        self.assertEqual(code, 0, err)
        self.assertIn(f"written under   {control}", out)
        self.assertEqual(function.run("s1", 1).status, Status.DONE)
        self.assertEqual(self.target.calls["s1/charge"], 1)
        # The other way: found absent, applied again exactly once.
        function = self.unsafe_charge("s2", lose="lose_before", approvals=source)
        code, _, err = run_cli("resolve", self.spec, "s2", "charge", "--absent", "--evidence", "not there", "--control-root", control)
        self.assertEqual(code, 0, err)
        self.assertEqual(function.run("s2", 1).status, Status.DONE)
        self.assertEqual((self.target.calls["s2/charge"], self.target.sent()["s2/charge"]), (2, 1))

    def test_resolve_and_reopen_with_signed_records_only(self) -> None:
        key_file = self.path("ops.key")
        key = generate_key_file(key_file)
        source = SignedApprovals(self.store, key)
        function = self.unsafe_charge("g1", lose="lose_before", approvals=source)
        self.assertEqual(run_cli("resolve", self.spec, "g1", "charge", "--absent", "--evidence", "unsigned")[0], 0)
        outcome = function.run("g1", 1)
        self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE, "an unsigned resolution is refused")
        self.assertIn("--sign-key", outcome.next_action)
        self.assertEqual(run_cli("resolve", self.spec, "g1", "charge", "--absent", "--evidence", "signed", "--sign-key", key_file)[0], 0)
        self.assertEqual(function.run("g1", 1).status, Status.DONE)
        self.assertEqual((self.target.calls["g1/charge"], self.target.sent()["g1/charge"]), (2, 1))
        # The other way: found applied, never applied again.
        function = self.unsafe_charge("g3", lose="lose_after", approvals=source)
        self.assertEqual(run_cli("resolve", self.spec, "g3", "charge", "--applied", "--evidence", "seen", "--sign-key", key_file)[0], 0)
        self.assertEqual(function.run("g3", 1).status, Status.DONE)
        self.assertEqual((self.target.calls["g3/charge"], self.target.sent()["g3/charge"]), (1, 1))
        # A reopen is signed the same way.
        self.target.reset(self.path("outbox2.jsonl"), transient={"charge": 1})
        limited = self.fn(ops_tasks.one_try_order, approvals=source)
        self.assertEqual(limited.run("g2", 1).status, Status.LIMITS_EXHAUSTED)
        self.assertEqual(limited.reopen("g2", "unsigned", by="eve", add_attempts=1).status, Status.LIMITS_EXHAUSTED)
        self.assertEqual(limited.reopen("g2", "signed", by="eve", add_attempts=1, sign=functools.partial(sign_approval, key=key)).status, Status.DONE)

    # -- reopen ----------------------------------------------------------------------------------

    def test_a_reopened_cancelled_task_finishes_and_its_old_cancellation_does_not_cancel_it_again(self) -> None:
        self.target.reset(self.path("outbox.jsonl"))
        function = self.fn(ops_tasks.gated_order)
        self.assertEqual(function.run("c1", 1).status, Status.AWAITING_APPROVAL)
        self.assertEqual(run_cli("cancel", self.spec, "c1", "--reason", "wrong customer")[0], 0)
        self.assertEqual(function.run("c1", 1).status, Status.CANCELLED)
        code, out, _ = run_cli("resume", self.spec, "c1")
        self.assertEqual((code, self.state("c1").status), (4, Status.CANCELLED), "without --reopen it stays cancelled")
        self.assertEqual(run_cli("resume", self.spec, "c1", "--reopen")[0], 2, "--reopen needs --reason")
        code, out, err = run_cli("resume", self.spec, "c1", "--reopen", "--reason", "right customer after all", "--by", "cat")
        self.assertEqual(code, 1, out + err)
        self.assertIn("reopened task c1 (it ended cancelled", err)
        self.assertEqual(self.state("c1").status, Status.AWAITING_APPROVAL)
        self.assertEqual(function.run("c1", 1).status, Status.AWAITING_APPROVAL, "the old cancellation does not cancel it again")
        history = run_cli("history", self.spec, "c1")[1]
        self.assertIn("cat reopened the task", history)
        self.assertIn("is superseded", history)
        time.sleep(0.01)  # a new cancellation (another time, so other bytes) cancels as always
        self.assertEqual(run_cli("cancel", self.spec, "c1", "--reason", "no, really")[0], 0)
        self.assertEqual(function.run("c1", 1).status, Status.CANCELLED)
        self.assertEqual(run_cli("resume", self.spec, "c1", "--reopen", "--reason", "go")[0], 1)
        self.assertEqual(run_cli("approve", self.spec, "c1", "--yes")[0], 0)
        self.assertEqual(function.run("c1", 1).status, Status.DONE)
        self.assertEqual(self.target.sent(), {"c1/reserve": 1, "c1/ship": 1})

    def test_a_reopened_limits_exhausted_task_gets_more_attempts_and_finishes(self) -> None:
        self.target.reset(self.path("outbox.jsonl"), transient={"charge": 1})
        function = self.fn(ops_tasks.one_try_order)
        self.assertEqual(function.run("l1", 1).status, Status.LIMITS_EXHAUSTED)
        with self.assertRaises(InvalidInputError):
            reopen(self.store, "l1", "again", by="dan", add_attempts=-1)
        outcome = function.reopen("l1", "the gateway is back", by="dan", add_attempts=1)
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual((self.target.calls["l1/charge"], self.target.sent()["l1/charge"]), (2, 1))
        self.assertEqual(self.target.calls["l1/reserve"], 1)
        with self.assertRaises(ReopenRefusedError):
            function.reopen("l1", "once more", by="dan")
        code, _, err = run_cli("resume", self.spec, "l1", "--reopen", "--reason", "once more")
        self.assertEqual(code, 2, err)
        self.assertIn("is done", err)
        self.assertEqual(run_cli("resume", self.spec, "l1", "--add-attempts", "2")[0], 2, "--add-attempts goes with --reopen")

    def test_a_reopen_with_more_time_lets_a_task_past_its_time_budget_finish(self) -> None:
        self.target.reset(self.path("outbox.jsonl"))
        function = self.fn(ops_tasks.slow_order)
        outcome = function.run("w1", 1)
        self.assertEqual(outcome.status, Status.LIMITS_EXHAUSTED, outcome.next_action)
        self.assertIn("--reopen", outcome.next_action)
        code, out, err = run_cli("resume", self.spec, "w1", "--reopen", "--reason", "it may think longer", "--add-time", "5")
        self.assertEqual((code, self.state("w1").status), (4, Status.LIMITS_EXHAUSTED), "5 s more is not enough")
        self.assertEqual(run_cli("resume", self.spec, "w1", "--reopen", "--reason", "longer still", "--add-time", "60")[0], 0)
        self.assertEqual(self.target.sent(), {"w1/charge": 1})

    # -- fork ------------------------------------------------------------------------------------

    def test_a_fork_after_a_fix_applies_only_from_its_step_and_both_tasks_record_it(self) -> None:
        self.target.reset(self.path("outbox.jsonl"), broken={"ship"})
        function = self.fn(ops_tasks.order)
        self.assertEqual(function.run("f1", 1).status, Status.BLOCKED)
        self.target.broken.clear()  # the fix
        code, out, err = run_cli("fork", self.spec, "f1", "f1b", "--from", "charge")
        self.assertEqual(code, 0, err)
        self.assertIn("new keys   f1b/<step id> from charge on", out)
        self.assertEqual(run_cli("resume", self.spec, "f1b")[0], 0)
        self.assertEqual(
            self.target.sent(), {"f1/reserve": 1, "f1/charge": 1, "f1b/charge": 1, "f1b/ship": 1},
            "reserve copied as recorded, never applied again; charge and ship under the fork's keys",
        )  # fmt: skip
        self.assertEqual(self.target.calls["f1/reserve"], 1)
        self.assertNotIn("f1b/reserve", self.target.calls)
        origin = json.loads(run_cli("status", self.spec, "f1", "--json")[1])
        self.assertEqual(origin["forks"], [{"task": "f1b", "step": "charge"}])
        self.assertIn("forks        f1b (from step charge)", run_cli("status", self.spec, "f1")[1])
        fork = json.loads(run_cli("status", self.spec, "f1b", "--json")[1])
        self.assertEqual((fork["status"], fork["forked_from"]), ("done", {"task": "f1", "step": "charge"}))
        # From Python, by default from the first step not verified: reserve and charge copied.
        self.assertEqual(function.fork("f1", "f1c"), "ship")
        self.assertEqual(function.resume("f1c").status, Status.DONE)
        self.assertEqual(self.target.sent()["f1c/ship"], 1)
        self.assertNotIn("f1c/charge", self.target.calls)

    def test_fork_refuses_unknown_tasks_and_steps_an_existing_new_task_and_an_effect_in_flight(self) -> None:
        self.unsafe_charge("f2", lose="lose_after")
        function = self.fn(ops_tasks.order)
        with self.assertRaises(UnknownTaskError):
            function.fork("nosuch", "f2b")
        with self.assertRaises(UnknownStepError):
            function.fork("f2", "f2b", from_step="nosuch")
        with self.assertRaises(ForkRefusedError):
            function.fork("f2", "f2b", from_step="charge")  # charge is uncertain: made again, it could be a duplicate
        with self.assertRaises(TaskExistsError):
            function.fork("f2", "f2", from_step="charge")
        for case in (("nosuch", "x"), ("f2", "f2b", "--from", "nosuch"), ("f2", "f2b", "--from", "charge"), ("f2", "f2b"), ("f2", "f2", "--from", "reserve"), ("f2", "bad/id")):
            with self.subTest(case=case):
                code, out, err = run_cli("fork", self.spec, *case)
                self.assertEqual(code, 2, out + err)
        self.assertEqual(self.state("f2").effects.keys() & {"longrun.fork/f2b"}, set(), "nothing was written")
        resolve(self.store, "f2", "charge", applied=True, evidence="seen", by="ann")
        self.assertEqual(function.run("f2", 1).status, Status.DONE)
        self.assertEqual(function.fork("f2", "f2c", from_step="charge"), "charge")

    def test_a_fork_that_fails_before_it_exists_leaves_the_origin_unchanged(self) -> None:
        self.target.reset(self.path("outbox.jsonl"), broken={"ship"})
        function = self.fn(ops_tasks.order)
        self.assertEqual(function.run("f3", 1).status, Status.BLOCKED)
        before = self.state("f3").revision
        with mock.patch("longrun.functions._fork.Forking.initial", side_effect=OSError("disk gone")):
            with self.assertRaises(OSError):
                function.fork("f3", "f3b", from_step="charge")
        self.assertEqual((self.state("f3").revision, self.state("f3").effects.keys() & {"longrun.fork/f3b"}), (before, set()))
        self.assertEqual(function.fork("f3", "f3b", from_step="charge"), "charge", "the fork can be made afterwards")
        self.assertIn("longrun.fork/f3b", self.state("f3").effects)

    def test_a_fork_stopped_before_the_origin_recorded_it_is_completed_by_running_it_again(self) -> None:
        self.target.reset(self.path("outbox.jsonl"), broken={"ship"})
        function = self.fn(ops_tasks.order)
        self.assertEqual(function.run("f4", 1).status, Status.BLOCKED)
        with mock.patch("longrun.functions._durable.record_fork_in_origin", side_effect=RuntimeError("stopped")):
            with self.assertRaises(RuntimeError):
                function.fork("f4", "f4b", from_step="charge")
        self.assertNotIn("longrun.fork/f4b", self.state("f4").effects)
        self.assertEqual(self.state("f4b").effects["longrun.function"].payload["forked_from"], {"task": "f4", "step": "charge"})
        self.assertEqual(function.fork("f4", "f4b", from_step="charge"), "charge")
        self.assertEqual(self.state("f4").effects["longrun.fork/f4b"].payload, {"task": "f4b", "step": "charge"})
        with self.assertRaises(TaskExistsError):
            function.fork("f4", "f4b", from_step="reserve")  # the same new task from another step
        with self.assertRaises(TaskExistsError):
            function.fork("f4", "f4", from_step="charge")


class _Discard:
    """A writer that keeps nothing: to build a record without writing it."""

    def write_approval(self, approval: Approval) -> None:
        del approval


class JsonStoreTests(OperatorCases):
    def make_store(self) -> tuple[Store, str]:
        root = self.path("store")
        return JsonFileStore(root, create=True), root

class SqliteStoreTests(OperatorCases):
    def make_store(self) -> tuple[Store, str]:
        path = self.path("tasks.sqlite")
        store = SqliteStore(path, create=True)
        self.addCleanup(store.close)
        return store, f"sqlite:{path}"


class PostgresStoreTests(OperatorCases):
    def make_store(self) -> tuple[Store, str]:
        pg_support.check("psycopg")  # the URL carries the schema as a libpq option, which pg8000 cannot take
        schema = pg_support.Schema("psycopg", prefix="lr_ops")
        self.addCleanup(schema.drop)
        store = PostgresStore(schema.factory())
        self.addCleanup(store.close)
        url = schema.spec
        return store, url


del OperatorCases  # only its subclasses run

if __name__ == "__main__":
    unittest.main()
